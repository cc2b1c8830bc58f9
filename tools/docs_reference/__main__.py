"""`python -m tools.docs_reference [--check]`: write docs/reference/*.md, or verify them."""

from __future__ import annotations

import argparse
import sys

from . import REFERENCE, stale, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docs_reference", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a committed page differs from the code")
    args = parser.parse_args(argv)
    if args.check:
        diffs = stale()
        for diff in diffs:
            print(diff, file=sys.stderr)
        if diffs:
            print(
                f"{len(diffs)} page(s) under {REFERENCE} are stale: run `python -m tools.docs_reference` and commit",
                file=sys.stderr,
            )
            return 1
        return 0
    for path in write():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
