#!/usr/bin/env bash
# The test command of the README, and what CI runs: install what is missing, then the static
# checks (ruff, mypy strict, import-linter, CRD freshness) and every test tier, one pytest run
# per tier, each with its 25 slowest tests listed. It ends with a table of each step's time and
# exits non-zero if any step failed (every step runs, so one failure does not hide another).
#
#   bash scripts/test.sh                 everything (CI)
#   bash scripts/test.sh unit trainer    only these tiers (static checks still run first)
#
# Tiers: unit, trainer, cluster, robustness, prometheus, images, bench (see the README's
# Contributing section). FTJOB_TEST_ARGS passes extra pytest arguments split on spaces
# (e.g. "-x --maxfail=1"); for marker expressions call .venv/bin/pytest directly.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh || exit 1
export DS_ACCELERATOR=cpu PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1

ALL_TIERS=(unit trainer cluster robustness prometheus images bench)
# Every folder of tests must be a tier here, or CI would silently not run it.
for dir in tests/*/; do
  dir=${dir%/}; dir=${dir#tests/}
  compgen -G "tests/$dir/test_*.py" >/dev/null || continue
  [[ " ${ALL_TIERS[*]} " == *" $dir "* ]] || { echo "tests/$dir is not a tier of scripts/test.sh: add it to ALL_TIERS" >&2; exit 2; }
done
tiers=("$@")
if ((${#tiers[@]} == 0)); then
  for tier in "${ALL_TIERS[@]}"; do [[ -d tests/$tier ]] && tiers+=("$tier"); done
fi

names=(); seconds=(); results=()
failed=0
START=$SECONDS
step() {  # step NAME CMD...: run, time and record one step
  local name=$1; shift
  printf '\n\033[1m== %s\033[0m\n' "$name"
  local t0=$SECONDS rc=0
  "$@" || rc=$?
  names+=("$name"); seconds+=($((SECONDS - t0)))
  if ((rc == 0)); then results+=(ok); else results+=("FAILED (exit $rc)"); failed=1; fi
}

step "ruff" .venv/bin/ruff check .
step "mypy --strict" .venv/bin/mypy
step "import-linter" .venv/bin/lint-imports
step "CRD is generated from the models" .venv/bin/python -m finetune_operator.api.crdgen --check

for tier in "${tiers[@]}"; do
  [[ -d tests/$tier ]] || { echo "unknown tier '$tier' (${ALL_TIERS[*]})" >&2; exit 2; }
  # shellcheck disable=SC2086
  step "pytest tests/$tier" .venv/bin/pytest --durations=25 ${FTJOB_TEST_ARGS:-} "tests/$tier"
done

printf '\n\033[1m== time per step\033[0m\n'
for i in "${!names[@]}"; do
  printf '  %-40s %4dm%02ds  %s\n' "${names[i]}" $((seconds[i] / 60)) $((seconds[i] % 60)) "${results[i]}"
done
total=$((SECONDS - START))
printf '  %-40s %4dm%02ds\n' "total (after bootstrap)" $((total / 60)) $((total % 60))
exit $failed
