#!/usr/bin/env bash
# The test command of the README, and what CI runs: install what is missing (exactly uv.lock),
# then the static checks (the lock agrees with pyproject.toml, ruff, mypy strict, import-linter,
# CRD freshness) and every test tier, one pytest run
# per tier, each with its 25 slowest tests listed. It ends with a table of each step's time and
# exits non-zero if any step failed (every step runs, so one failure does not hide another).
#
#   bash scripts/test.sh                 everything (CI)
#   bash scripts/test.sh unit trainer    only these tiers (static checks still run first)
#
# Tiers: unit, trainer, cluster, robustness, prometheus, images, bench (see CONTRIBUTING.md's
# test tiers). FTJOB_TEST_ARGS passes extra pytest arguments split on spaces
# (e.g. "-x --maxfail=1"); for marker expressions call .venv/bin/pytest directly.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh || exit 1
export DS_ACCELERATOR=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
# Bytecode is written (into __pycache__, which git ignores): every rank, launcher and operator
# process the tests start imports this project's modules, and compiling them from source each
# time costs ~0.4 s of CPU per process, hundreds of times.
unset PYTHONDONTWRITEBYTECODE
# mypy's incremental cache outside the work tree: a fresh clone then re-checks only what changed
# (cold, the whole tree takes minutes of CPU that the training lane needs).
export MYPY_CACHE_DIR=${MYPY_CACHE_DIR:-$HOME/.cache/finetune-operator/mypy}

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

# Lanes run side by side, so that on 2 cores one lane's waiting overlaps another's work. Four
# by default (FTJOB_TEST_LANES=4): the training lane (the trainer tier: real ranks on the CPU
# throughout), the main lane (the static checks, then the cluster tier), the side lane (unit,
# bench) and the wait lane (robustness, prometheus and images: 15 min of waiting on a control
# plane, an operator and scrapes, for 5 min of CPU, then image builds that mostly copy files;
# behind the side lane's tiers they made that lane the last to end, with the cores half idle;
# run N of 2026-12-04 ended the side lane 8 min after the wait lane, with images in the side
# lane). The load reaches 12; the local cluster is made
# for that (see NODE_MONITOR_GRACE in finetune_localcluster/cluster.py). FTJOB_TEST_LANES=3 runs
# the wait lane's tiers in the side lane, 2 both in the main lane, 1 everything in one lane.
declare -A LANE=([trainer]=train [unit]=side [images]=wait [bench]=side [robustness]=wait [prometheus]=wait)
# The trainer and cluster tiers run in two workers each, taking whole files (a file's runs share
# its fixtures; each cluster worker starts its own local cluster, on a pod CIDR of its own): when
# the other lanes end first, they still use both cores.
declare -A TIER_ARGS=([unit]="-n 2" [trainer]="-n 2 --dist loadfile" [cluster]="-n 2 --dist loadfile")
RESULTS=$(mktemp -d)
trap 'rm -rf "$RESULTS"' EXIT
START=$SECONDS
exec 3>&1
cpu_so_far() {  # cpu_so_far FILE: CPU seconds (user + system) of this shell's reaped children, into FILE
  times >"$1.times"  # a builtin, in this shell: inside $(...) it would count the subshell's children
  awk 'function s(x) { sub(/s$/, "", x); split(x, a, "m"); return a[1] * 60 + a[2] }
       NR == 2 { printf "%d", s($1) + s($2) }' "$1.times" >"$1"
}
step() {  # step LANE NAME CMD...: run, time and record one step (wall and CPU)
  local lane=$1 name=$2; shift 2
  printf '\n\033[1m== %s\033[0m\n' "$name"
  printf '[%s] %-40s started at %dm%02ds\n' "$lane" "$name" $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)) >&3
  local t0=$SECONDS rc=0 cpu0
  cpu_so_far "$RESULTS/$lane.cpu"
  cpu0=$(<"$RESULTS/$lane.cpu")
  "$@" || rc=$?
  local result=ok
  ((rc == 0)) || result="FAILED (exit $rc)"
  cpu_so_far "$RESULTS/$lane.cpu"
  printf '%s|%d|%d|%s\n' "$name" $((SECONDS - t0)) $(($(<"$RESULTS/$lane.cpu") - cpu0)) "$result" >>"$RESULTS/$lane"
  printf '[%s] %-40s %s after %ds\n' "$lane" "$name" "$result" $((SECONDS - t0)) >&3
}
tier_step() {  # tier_step LANE TIER
  # shellcheck disable=SC2086
  step "$1" "pytest tests/$2" .venv/bin/pytest --durations=25 --cpu-durations=25 ${TIER_ARGS[$2]:-} ${FTJOB_TEST_ARGS:-} "tests/$2"
}

for tier in "${tiers[@]}"; do
  [[ -d tests/$tier ]] || { echo "unknown tier '$tier' (${ALL_TIERS[*]})" >&2; exit 2; }
done
LANE_COUNT=${FTJOB_TEST_LANES:-4}
[[ $LANE_COUNT == [1234] ]] || { echo "FTJOB_TEST_LANES=$LANE_COUNT: use 1, 2, 3 or 4" >&2; exit 2; }
# Side by side the lanes hold the load at 12-20 on 2 cores, where a process gets a tenth of a core:
# every test's timeout and every wait of the local tooling is multiplied by FTJOB_TEST_TIMEOUT_SCALE
# (3 then; finetune_localcluster.kube.wait_scale). The bounds guard against hangs, they measure no
# speed; in a CI run of 2026-12-05 a 6.6 CPU-s unit test ran out of its 120 s, a 17 CPU-s one of 300 s.
if ((LANE_COUNT > 1)); then export FTJOB_TEST_TIMEOUT_SCALE=${FTJOB_TEST_TIMEOUT_SCALE:-3}; fi
lane_of() {  # lane_of TIER: the lane it runs in
  local lane=${LANE[$1]:-main}
  ((LANE_COUNT <= 3)) && [[ $lane == wait ]] && lane=side
  ((LANE_COUNT <= 2)) && [[ $lane == side ]] && lane=main
  ((LANE_COUNT == 1)) && lane=main
  echo "$lane"
}
build_docs() {  # the docs site into a temporary folder, removed afterwards: a broken link fails (never -q: it hides them)
  local site rc=0
  site=$(mktemp -d)
  NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -d "$site" || rc=$?
  rm -rf "$site"
  return "$rc"
}
run_lane() {  # run_lane LANE: its steps, in the order of ALL_TIERS
  local lane=$1 tier
  if [[ $lane == main ]]; then
    step main "one lock: pyproject.toml, uv.lock, requirements/" bash scripts/lock.sh --check
    step main "ruff" .venv/bin/ruff check .
    step main "mypy --strict" .venv/bin/mypy
    step main "import-linter" .venv/bin/lint-imports
    step main "CRD is generated from the models" .venv/bin/python -m finetune_operator.api.crdgen --check
    step main "docs reference is generated" .venv/bin/python -m tools.docs_reference --check
    step main "mkdocs build --strict" build_docs
  fi
  for tier in "${tiers[@]}"; do
    if [[ $(lane_of "$tier") == "$lane" ]]; then tier_step "$lane" "$tier"; fi
  done
}
# Kueue, the S3 server (SeaweedFS) and MLflow's server venv are built before the lanes too, when a
# tier that starts them runs (a no-op once cached): on a cold machine a trainer test met the
# SeaweedFS build (~15 min) inside its setup and ran past its 600 s timeout.
for tier in "${tiers[@]}"; do
  if [[ $tier == cluster || $tier == trainer ]]; then
    step setup "Kueue, SeaweedFS and MLflow's server" .venv/bin/python -m finetune_localcluster prebuild
    break
  fi
done
LANES=(main train side wait)
LANES=("${LANES[@]:0:LANE_COUNT}")
# Every lane runs in a subshell of its own, the main lane too (its output shown as it comes): a
# lane's CPU column counts its own steps only (this shell reaps the lanes whenever they end).
lane_pids=()
for lane in "${LANES[@]:1}"; do
  run_lane "$lane" >"$RESULTS/$lane.log" 2>&1 &
  lane_pids+=($!)
done
run_lane main &
lane_pids+=($!)
for pid in "${lane_pids[@]}"; do wait "$pid"; done
for lane in "${LANES[@]:1}"; do
  if [[ -s $RESULTS/$lane.log ]]; then
    printf '\n\033[1m== the %s lane, run beside the above\033[0m\n' "$lane"
    cat "$RESULTS/$lane.log"
  fi
done

# Wall time, and the CPU time (user + system) of everything the step started and waited for: on
# 2 cores the lanes share the CPU, so a run's length is about the sum of the CPU column over 2.
printf '\n\033[1m== time per step\033[0m\n'
printf '  %-6s %-40s %7s  %7s\n' lane step wall CPU
failed=0 total_cpu=0
for lane in setup "${LANES[@]}"; do
  [[ -f $RESULTS/$lane ]] || continue
  while IFS='|' read -r name secs cpu result; do
    printf '  %-6s %-40s %4dm%02ds  %4dm%02ds  %s\n' "$lane" "$name" $((secs / 60)) $((secs % 60)) $((cpu / 60)) $((cpu % 60)) "$result"
    total_cpu=$((total_cpu + cpu))
    [[ $result == ok ]] || failed=1
  done <"$RESULTS/$lane"
done
total=$((SECONDS - START))
printf '  %-47s %4dm%02ds  %4dm%02ds\n' "total (after bootstrap, lanes side by side)" $((total / 60)) $((total % 60)) $((total_cpu / 60)) $((total_cpu % 60))
exit $failed
