#!/usr/bin/env bash
# The one lock, uv.lock, and the files exported from it for the images. Every environment installs
# from uv.lock: the project venv (scripts/bootstrap.sh: uv sync --locked), CI, the operator and
# trainer images (requirements/*-image.txt below, with hashes: pip installs exactly them), the GPU
# bundle (scripts/gpu-bundle.sh packs the venv) and the MLflow server's venv (its own group).
#
#   bash scripts/lock.sh            write requirements/*-image.txt from uv.lock (after `uv lock`)
#   bash scripts/lock.sh --check    fail when pyproject.toml, uv.lock and requirements/ disagree
#
# To add or upgrade a dependency: edit pyproject.toml, then `bash scripts/upgrade-deps.sh [PKG...]`
# (re-locks, exports, syncs the venv, runs the suite and prints what moved).
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-.venv/bin/uv}
[[ -x $UV ]] || UV=uv
command -v "$UV" >/dev/null || { echo "lock.sh: uv not found (run scripts/bootstrap.sh first)" >&2; exit 1; }

# image -> the extras and groups its dependency layer installs (the build backend too: the images
# install the project's own source offline, without build isolation).
declare -A IMAGE_ARGS=(
  [operator]="--group image-build"
  [trainer]="--extra trainer --group image-build"
)

export_image() {  # image: the requirements file of its dependency layer, on stdout
  # shellcheck disable=SC2086  # the arguments are words
  "$UV" export --frozen --no-dev --no-emit-project --no-header --quiet ${IMAGE_ARGS[$1]}
}

header() {  # image
  printf '# Generated from uv.lock by `bash scripts/lock.sh`: the %s image installs exactly these\n' "$1"
  printf '# (pip --require-hashes). Do not edit; change pyproject.toml and re-lock.\n'
}

if [[ ${1:-} == --check ]]; then
  stale=()
  if ! "$UV" lock --check --offline --quiet 2>/tmp/lock-check.$$; then
    cat /tmp/lock-check.$$ >&2
    stale+=("uv.lock (it no longer matches pyproject.toml)")
  fi
  rm -f /tmp/lock-check.$$
  for image in "${!IMAGE_ARGS[@]}"; do
    file=requirements/$image-image.txt
    if ! diff -q <(header "$image"; export_image "$image") "$file" >/dev/null 2>&1; then
      stale+=("$file")
    fi
  done
  if ((${#stale[@]})); then
    echo "out of date: ${stale[*]}; run \`uv lock\` (or scripts/upgrade-deps.sh), then \`bash scripts/lock.sh\`" >&2
    exit 1
  fi
  echo "uv.lock agrees with pyproject.toml; requirements/ agrees with uv.lock"
  exit 0
fi

[[ $# == 0 ]] || { sed -n '2,12p' "$0" >&2; exit 2; }
mkdir -p requirements
for image in "${!IMAGE_ARGS[@]}"; do
  { header "$image"; export_image "$image"; } >"requirements/$image-image.txt"
  echo "requirements/$image-image.txt: $(grep -c '==' "requirements/$image-image.txt") packages"
done
