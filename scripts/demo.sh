#!/usr/bin/env bash
# The README's first command: install what is needed, then show a FineTuneJob being
# validated, planned and trained on this machine's CPU (the embedded tiny model and task).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export DS_ACCELERATOR=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
FTJOB=.venv/bin/ftjob
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

say "ftjob validate examples/*.yaml"
$FTJOB validate examples/*.yaml 2>&1 || true   # examples/invalid.yaml is meant to fail, naming each field

if [ -f operator/finetune_operator/cli/plan_cmd.py ]; then
  say "ftjob plan examples/lora-70b-4x8x80gi.yaml"
  $FTJOB plan examples/lora-70b-4x8x80gi.yaml
fi
if [ -f examples/tiny-cpu.yaml ] && [ -f operator/finetune_operator/cli/run_cmd.py ]; then
  out=${FTJOB_DEMO_OUTPUT:-$PWD/.work/demo-output}
  say "ftjob run examples/tiny-cpu.yaml --output $out"
  $FTJOB run examples/tiny-cpu.yaml --output "$out"
fi
