"""`python -m tools.dashboards [--check] [--queries]`: write the chart's dashboards, verify them, or list queries."""

from __future__ import annotations

import argparse
import sys

from . import OUTPUT_DIR, panel_queries, stale, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.dashboards", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed files differ from the generator")
    parser.add_argument("--queries", action="store_true", help="print every panel query (variables substituted)")
    args = parser.parse_args(argv)
    if args.queries:
        for q in panel_queries():
            print(f"{q.dashboard}\t{q.panel}\t{q.ref_id}\t{q.needs}\t{q.expr}")
        return 0
    if args.check:
        differ = stale()
        for path in differ:
            print(f"{path} is not what `python -m tools.dashboards` generates", file=sys.stderr)
        return 1 if differ else 0
    for path in write(OUTPUT_DIR):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
