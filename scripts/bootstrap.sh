#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine: Debian packages, the Python
# virtual environment (.venv) with the trainer and dev extras, and the Go-built Kubernetes
# binaries the local cluster starts (cached outside the work tree; Kueue is built later, by the
# first Kueue test). Safe to run again: each step is a no-op when done.
#
#   bash scripts/bootstrap.sh [--demo]
#
# The Kubernetes build needs only Go, so it runs in the background from the start, beside the
# Debian and Python steps. With --demo (scripts/demo.sh), the demo's once-per-machine work
# (python -m tools.demo.prepare) also runs while that build finishes.
# One line per step with the elapsed time and an estimate of what is left; the output of apt,
# uv (or pip) and go goes to .work/bootstrap/<step>.log (go's to ~/.cache/finetune-operator/logs/),
# named with its tail when the step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
LOGS=.work/bootstrap
mkdir -p "$LOGS"
START=$SECONDS
demo=0
[[ ${1:-} == --demo ]] && demo=1

log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*"; }
mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
elapsed() { mmss $((SECONDS - START)); }
# run STEP CMD...: CMD's output to $LOGS/STEP.log; on failure its tail and the log's name.
run() {
  local name=$1; shift
  if ! "$@" >"$LOGS/$name.log" 2>&1; then
    tail -n 30 "$LOGS/$name.log" >&2
    log "FAILED: $name; full output in $LOGS/$name.log"
    exit 1
  fi
}

# 1. Kubernetes binaries built from Go modules (cached by version outside the work tree), in the
#    background; the build script prints its own numbered steps.
kube_pid=""
if [ "${FTJOB_SKIP_KUBE:-0}" != 1 ]; then
  log "[1/3] Kubernetes binaries: building in the background (a fresh machine needs 8 to 19 minutes)"
  bash tools/build-kube-binaries.sh core &
  kube_pid=$!
  trap '[[ -n $kube_pid ]] && kill "$kube_pid" 2>/dev/null; true' EXIT
fi

# 2. Debian packages (prometheus for the observability tests; buildah/debootstrap are installed
#    by the image tier).
need_pkgs=()
for spec in prometheus:prometheus promtool:prometheus unshare:util-linux setpriv:util-linux; do
  bin=${spec%%:*}; pkg=${spec##*:}
  command -v "$bin" >/dev/null 2>&1 || need_pkgs+=("$pkg")
done
if [ "${FTJOB_SKIP_APT:-0}" != 1 ] && ((${#need_pkgs[@]})); then
  mapfile -t need_pkgs < <(printf '%s\n' "${need_pkgs[@]}" | sort -u)
  log "[2/3] Debian packages: ${need_pkgs[*]} (elapsed $(elapsed))"
  export DEBIAN_FRONTEND=noninteractive
  run apt-update apt-get update -qq
  run apt-install apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"
else
  log "[2/3] Debian packages: present"
fi

# 3. Python environment: exactly the lock (uv.lock), through uv (it links the files from its cache
#    outside the work tree: ~4 s warm, ~30 s cold; pip downloaded and unpacked ~7 GB on every fresh
#    clone). `--locked` refuses a lock that pyproject.toml no longer matches: re-lock with `uv lock`
#    or scripts/upgrade-deps.sh, never by installing by hand. uv reads no pip configuration: the
#    index and find-links settings of pip's environment variables are passed on.
stamp=.venv/.ftjob-deps-$(cat pyproject.toml uv.lock | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  log "[3/3] Python dependencies into .venv from uv.lock: torch, DeepSpeed, transformers, ... (~7 GB; a cold" \
    "machine needs about 1 minute with a fast mirror, later clones seconds; elapsed $(elapsed))"
  [ -x .venv/bin/python ] || run venv "$PY" -m venv .venv
  # The first uv comes from PyPI within the range pyproject.toml gives ([tool.uv] required-version);
  # the sync then replaces it with the locked one.
  [ -x .venv/bin/uv ] || run uv .venv/bin/python -m pip install -q "uv>=0.13,<0.14"
  [[ -n ${PIP_INDEX_URL:-} ]] && export UV_DEFAULT_INDEX=$PIP_INDEX_URL
  [[ -n ${PIP_EXTRA_INDEX_URL:-} ]] && export UV_INDEX=$PIP_EXTRA_INDEX_URL
  [[ -n ${PIP_FIND_LINKS:-} ]] && export UV_FIND_LINKS=$PIP_FIND_LINKS
  [[ -n ${PIP_CERT:-} && -z ${SSL_CERT_FILE:-} ]] && export SSL_CERT_FILE=$PIP_CERT
  run deps-install env UV_PROJECT_ENVIRONMENT=.venv .venv/bin/uv sync --locked --extra trainer --group dev \
    --python .venv/bin/python
  rm -f .venv/.ftjob-deps-*
  touch "$stamp"
  log "[3/3] Python dependencies installed (elapsed $(elapsed))"
else
  log "[3/3] Python dependencies: up to date with uv.lock"
fi

if ((demo)); then
  log "demo preparation: the SmolLM2 conversion (elapsed $(elapsed))"
  DS_ACCELERATOR=cpu run demo-prepare .venv/bin/python -m tools.demo.prepare
  log "demo preparation done (elapsed $(elapsed)); $(grep -h 'ready in' "$LOGS/demo-prepare.log" | tr '\n' ' ')"
fi

if [[ -n $kube_pid ]]; then
  log "waiting for the Kubernetes binaries (elapsed $(elapsed))"
  wait "$kube_pid" || { kube_pid=""; log "FAILED: the Kubernetes binaries (see the lines above)"; exit 1; }
  kube_pid=""
fi
log "done in $(elapsed)"
