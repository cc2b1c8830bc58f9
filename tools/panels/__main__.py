"""`python -m tools.panels --prometheus URL --out docs/images`: draw the key panels of a run to PNG."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import render_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.panels", description=__doc__)
    parser.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    parser.add_argument("--namespace", default=".*", help="regex, as the dashboard's variable")
    parser.add_argument("--job", default=".*", help="FineTuneJob name regex")
    parser.add_argument("--lookback", type=int, default=3600, help="seconds of history to search for the run")
    args = parser.parse_args(argv)
    for path in render_all(args.prometheus, args.out, args.namespace, args.job, args.lookback):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
