"""`python -m tools.chart_docs [--check]`: write the chart README's values reference, or verify it."""

from __future__ import annotations

import argparse
import sys

from . import CHART, stale, undocumented, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.chart_docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the README differs from values.yaml")
    args = parser.parse_args(argv)
    missing = undocumented((CHART / "values.yaml").read_text())
    for key in missing:
        print(f"values.yaml: {key} has no `# {key} -- ...` comment", file=sys.stderr)
    if args.check:
        if stale():
            print(f"{CHART / 'README.md'} is not what `python -m tools.chart_docs` generates", file=sys.stderr)
            return 1
        return 1 if missing else 0
    print(f"wrote {write()}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
