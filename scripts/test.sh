#!/usr/bin/env bash
# The test command of the README, and what CI runs: install what is missing, then
# static checks (ruff, mypy strict, import-linter, CRD freshness) and every test tier.
# FTJOB_TEST_ARGS passes extra pytest arguments split on spaces (e.g. "-x --maxfail=1");
# for marker expressions call .venv/bin/pytest directly.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export DS_ACCELERATOR=cpu PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
step "ruff";          .venv/bin/ruff check .
step "mypy --strict"; .venv/bin/mypy
step "import-linter"; .venv/bin/lint-imports
step "CRD is generated from the models"; .venv/bin/python -m finetune_operator.api.crdgen --check
step "pytest (all tiers)"
# shellcheck disable=SC2086
.venv/bin/pytest ${FTJOB_TEST_ARGS:-} tests
