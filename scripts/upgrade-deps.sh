#!/usr/bin/env bash
# Upgrades dependencies as a reviewed change, never as a side effect of a fresh clone: re-locks
# (uv.lock), re-exports the images' requirements (scripts/lock.sh), syncs the venv, runs the suite
# and prints what moved. Commit uv.lock and requirements/ with the change that needs them.
#
#   bash scripts/upgrade-deps.sh              upgrade everything pyproject.toml allows
#   bash scripts/upgrade-deps.sh PKG [PKG...] upgrade only these (e.g. transformers peft)
#   FTJOB_UPGRADE_TIERS="unit trainer" ...    run only these test tiers (default: all, as CI)
#   FTJOB_UPGRADE_NO_TESTS=1 ...              re-lock and print what moved, run nothing
#
# After editing pyproject.toml (a new dependency, a changed range), run it with no package to
# re-lock within the new ranges.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=.venv/bin/uv
[[ -x $UV ]] || { echo "upgrade-deps.sh: run scripts/bootstrap.sh first (it installs uv into .venv)" >&2; exit 1; }

versions() {  # "name version[,version...]" of every package in uv.lock (all forks, groups and extras)
  .venv/bin/python -c '
import collections, tomllib
seen = collections.defaultdict(set)
for package in tomllib.load(open("uv.lock", "rb"))["package"]:
    seen[package["name"]].add(package.get("version", "(source)"))
for name in sorted(seen):
    print(name, ",".join(sorted(seen[name])))'
}

before=$(mktemp) after=$(mktemp)
trap 'rm -f "$before" "$after"' EXIT
versions >"$before"
if (($#)); then
  args=()
  for pkg in "$@"; do args+=(--upgrade-package "$pkg"); done
  "$UV" lock "${args[@]}"
else
  "$UV" lock --upgrade
fi
bash scripts/lock.sh
versions >"$after"

echo
echo "== what moved (package: before -> after)"
LC_ALL=C join -a1 -a2 -e '-' -o 0,1.2,2.2 "$before" "$after" | awk '$2 != $3 { printf "  %-32s %s -> %s\n", $1, $2, $3 }'

[[ ${FTJOB_UPGRADE_NO_TESTS:-0} == 1 ]] && exit 0
echo
echo "== the suite on the new lock (scripts/test.sh syncs the venv to it first)"
# shellcheck disable=SC2086  # the tiers are words
bash scripts/test.sh ${FTJOB_UPGRADE_TIERS:-}
