#!/usr/bin/env bash
# Builds the operator and trainer images for real, with buildah (chroot isolation: no daemon,
# no user namespaces needed) on a Debian bookworm base made by debootstrap (no registry needed),
# then checks each image from the inside (`ftjob --help` and an import check, via buildah run
# as the image's non-root user; for the trainer also trainer_image/imagebuild/check_image.py: the
# prebuilt DeepSpeed ops, no compiler, the RDMA libraries) and prints sizes and build times.
#
#   scripts/build-images.sh [operator] [trainer]      (default: both)
#   scripts/build-images.sh --print-trainer-deps-key  (the hash below, nothing built)
#
# The trainer's dependency stage (`deps` in trainer_image/Dockerfile: system packages, the venv
# with torch, the prebuilt ops; ~8 GB and 7-15 minutes) is kept in buildah's store as
# localhost/finetune-trainer-deps:<hash of its inputs> and built only when that image is missing:
# its inputs are the Dockerfile up to the `trainer` stage, trainer_image/imagebuild/deps/, the
# requirements read from pyproject.toml, the torch spec and index, and the base image's recipe.
# The `trainer` stage (the project's source) is built every time on top of it, in seconds.
# Building a new dependency image removes the older ones.
#
# Environment:
#   FTJOB_CACHE_DIR      cache root (default ~/.cache/finetune-operator); the debootstrap rootfs
#                        is kept there as images/debian-bookworm-python3-v2.tar
#   FTJOB_IMAGE_TAG      tag of the built images (default dev)
#   FTJOB_DEBIAN_MIRROR  Debian mirror for debootstrap (default http://deb.debian.org/debian)
#   FTJOB_CA_BUNDLE      CA bundle for pip inside the build, passed as a build secret (default:
#                        the host's bundle, which covers a TLS-intercepting proxy the host trusts)
#   FTJOB_TRAINER_TORCH  pip spec of torch for the trainer image (default: the Dockerfile's CUDA 12 pin)
#   FTJOB_TRAINER_TORCH_INDEX  index of that torch (default: PyPI)
#   FTJOB_SUMMARY_FILE   also write the summary lines (name, size, seconds) to this file
#   FTJOB_IMAGE_MIN_FREE_GB  free disk a build of the trainer's dependency image needs (default 32:
#                        measured peak 30 GB above the start: its rootfs, the layer blob being
#                        committed and the image); on top of a kept one the trainer needs 4 GB
#   FTJOB_TRAINER_DEPS   'rebuild' builds the trainer's dependency image even when one with the
#                        same inputs is kept (default: reuse it)
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE_DIR=${FTJOB_CACHE_DIR:-$HOME/.cache/finetune-operator}
TAG=${FTJOB_IMAGE_TAG:-dev}
MIRROR=${FTJOB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${FTJOB_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
TORCH_SPEC=${FTJOB_TRAINER_TORCH:-torch>=2.6,<2.10}
TORCH_INDEX=${FTJOB_TRAINER_TORCH_INDEX:-}
SUITE=bookworm
ROOTFS_TAR="$CACHE_DIR/images/debian-$SUITE-python3-v2.tar"  # bump vN when the recipe changes
BASE_IMAGE="localhost/finetune-base:$SUITE-python3-v2"
OPERATOR_IMAGE="localhost/finetune-operator:$TAG"
TRAINER_IMAGE="localhost/finetune-trainer:$TAG"
TRAINER_FILE=trainer_image/Dockerfile
TRAINER_DEPS_REPO=localhost/finetune-trainer-deps
TRAINER_DEPS_DIR=trainer_image/imagebuild/deps
TRAINER_STAGE='FROM deps AS trainer'  # the line that ends the dependency part of TRAINER_FILE
export BUILDAH_ISOLATION=chroot
# buildah stages each layer blob (~8 GB for the trainer) under TMPDIR and leaves it behind when
# the build is killed; a private directory, emptied at start and at exit, never accumulates them.
BUILD_TMP="$CACHE_DIR/images/tmp"

log() { printf '\033[1m[build-images]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[build-images]\033[0m %s\n' "$*" >&2; exit 1; }

trainer_build_args=("TORCH_SPEC=$TORCH_SPEC" "TORCH_INDEX_URL=$TORCH_INDEX")

# The hash of every input of the trainer's dependency stage (see the header).
trainer_deps_key() {
  grep -qxF "$TRAINER_STAGE" "$TRAINER_FILE" || die "$TRAINER_FILE has no line '$TRAINER_STAGE'"
  command -v python3 >/dev/null || die "python3 (>= 3.11) is needed to read the requirements from pyproject.toml"
  local requirements
  requirements=$(python3 "$TRAINER_DEPS_DIR/requirements.py" pyproject.toml trainer) \
    || die "reading the trainer's requirements from pyproject.toml failed"
  {
    printf '%s\n' "BASE_IMAGE=$BASE_IMAGE" "${trainer_build_args[@]}"
    sed "/^$TRAINER_STAGE\$/q" "$TRAINER_FILE"
    find "$TRAINER_DEPS_DIR" -type f ! -path '*/__pycache__/*' | LC_ALL=C sort | while read -r f; do
      printf '== %s\n' "$f"; cat "$f"
    done
    printf '%s\n' "$requirements"
  } | sha256sum | cut -c1-16
}

if [[ ${1:-} == --print-trainer-deps-key ]]; then
  trainer_deps_key
  exit 0
fi

targets=("$@")
((${#targets[@]})) || targets=(operator trainer)
for t in "${targets[@]}"; do
  [[ $t == operator || $t == trainer ]] || die "unknown image '$t' (operator, trainer)"
done

free_gb() {  # free GB on the filesystem holding $1 (its nearest existing parent)
  local dir=$1
  while [[ ! -e $dir ]]; do dir=$(dirname "$dir"); done
  df -P -k "$dir" | awk 'NR == 2 { printf "%d", $4 / 1048576 }'
}

# 1. Tools: buildah and debootstrap from Debian when missing.
missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if ((${#missing[@]})); then
  [[ $(id -u) == 0 ]] || die "need ${missing[*]}: install them (apt-get install ${missing[*]}) or run as root"
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. The base: a minimal Debian with python3 and venv, made once by debootstrap and cached.
if [[ ! -s $ROOTFS_TAR ]]; then
  log "debootstrap $SUITE (minbase + python3) from $MIRROR; cached in $ROOTFS_TAR"
  start=$SECONDS
  work=$(mktemp -d "${TMPDIR:-/tmp}/ftjob-rootfs.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
  # Caches, logs and documentation are dead weight in an image (~20 MB).
  rm -rf "$work/rootfs"/var/cache/apt/archives/*.deb "$work/rootfs"/var/lib/apt/lists/* "$work/rootfs"/var/log/* \
    "$work/rootfs"/usr/share/doc/* "$work/rootfs"/usr/share/man/* "$work/rootfs"/usr/share/info/*
  mkdir -p "$(dirname "$ROOTFS_TAR")"
  tar --numeric-owner -C "$work/rootfs" -cf "$ROOTFS_TAR.tmp" .
  mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
  rm -rf "$work"
  trap - EXIT
  log "debootstrap took $((SECONDS - start)) s"
fi
if ! buildah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
  log "importing the rootfs as $BASE_IMAGE"
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$ROOTFS_TAR" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd /bin/bash "$ctr"
  buildah commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
fi

secret=()
[[ -s $CA_BUNDLE ]] && secret=(--secret "id=ca-bundle,src=$CA_BUNDLE")

summary=()
build_args=()  # --build-arg pairs of the image being built
set_build_args() {
  build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
  for a in "$@"; do build_args+=(--build-arg "$a"); done
}

build() {  # name image dockerfile [build-arg...]
  local name=$1 image=$2 file=$3; shift 3
  local start
  set_build_args "$@"
  log "building $image from $file"
  start=$SECONDS
  buildah build --isolation chroot --layers=false -f "$file" -t "$image" "${build_args[@]}" "${secret[@]}" . \
    || die "building $image failed"
  finish "$name" "$image" $((SECONDS - start)) ""
}

finish() {  # name image seconds note: check the image, then add its summary line
  local name=$1 image=$2 seconds=$3 note=$4 size
  check "$name" "$image"
  size=$(buildah images --noheading --format '{{.Size}}' "$image" | head -n1)
  summary+=("$(printf '%-9s %-40s size %-10s build %4d s%s' "$name" "$image" "$size" "$seconds" "$note")")
}

TRAINER_DEPS_IMAGE=""
TRAINER_DEPS_REUSED=false
plan_trainer_deps() {  # sets TRAINER_DEPS_IMAGE and TRAINER_DEPS_REUSED
  TRAINER_DEPS_IMAGE="$TRAINER_DEPS_REPO:$(trainer_deps_key)"
  if [[ ${FTJOB_TRAINER_DEPS:-} != rebuild ]] && buildah inspect --type image "$TRAINER_DEPS_IMAGE" >/dev/null 2>&1; then
    TRAINER_DEPS_REUSED=true
  fi
}

# Dependency images of other inputs: only the newest is worth its ~8 GB.
drop_old_trainer_deps() {
  local old kept
  kept=$(buildah images --noheading --format '{{.Name}}:{{.Tag}}' "$TRAINER_DEPS_REPO" 2>/dev/null || true)
  for old in $(sort -u <<<"$kept"); do
    [[ $old != "$TRAINER_DEPS_IMAGE" ]] || continue
    log "removing the dependency image $old (other inputs)"
    buildah rmi --force "$old" >/dev/null 2>&1 || true
  done
}

build_trainer() {
  local start=$SECONDS deps_note final_file
  set_build_args "${trainer_build_args[@]}"
  if $TRAINER_DEPS_REUSED; then
    log "dependency image $TRAINER_DEPS_IMAGE reused: its inputs are unchanged"
    deps_note="  deps reused $TRAINER_DEPS_IMAGE"
  else
    buildah rmi --force "$TRAINER_DEPS_IMAGE" >/dev/null 2>&1 || true
    log "building the dependency image $TRAINER_DEPS_IMAGE (stage deps of $TRAINER_FILE)"
    buildah build --isolation chroot --layers=false -f "$TRAINER_FILE" --target deps -t "$TRAINER_DEPS_IMAGE" \
      "${build_args[@]}" "${secret[@]}" . || die "building $TRAINER_DEPS_IMAGE failed"
    log "dependency image $TRAINER_DEPS_IMAGE built in $((SECONDS - start)) s"
    deps_note="  deps built in $((SECONDS - start)) s as $TRAINER_DEPS_IMAGE"
  fi
  # The `trainer` stage of the same file, on the kept dependency image.
  final_file="$BUILD_TMP/trainer.Containerfile"
  { echo "FROM $TRAINER_DEPS_IMAGE"; sed "1,/^$TRAINER_STAGE\$/d" "$TRAINER_FILE"; } >"$final_file"
  log "building $TRAINER_IMAGE: stage trainer of $TRAINER_FILE on $TRAINER_DEPS_IMAGE"
  local final_start=$SECONDS
  buildah build --isolation chroot --layers=false -f "$final_file" -t "$TRAINER_IMAGE" "${secret[@]}" . \
    || die "building $TRAINER_IMAGE failed"
  log "$TRAINER_IMAGE: source layer built in $((SECONDS - final_start)) s"
  finish trainer "$TRAINER_IMAGE" $((SECONDS - start)) "$deps_note"
}

check() {  # name image: run as the image's own (non-root) user, chroot isolation
  local name=$1 image=$2 ctr user
  user=$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$image")
  [[ $user == 1000:1000 ]] || die "$image runs as '$user', expected 1000:1000"
  ctr=$(buildah from --quiet "$image")
  run_checks "$name" "$image" "$ctr" || { buildah rm "$ctr" >/dev/null; die "$image: checks failed"; }
  buildah rm "$ctr" >/dev/null
  log "$image: ftjob --help and imports ok as user $user"
}

run_checks() {  # name image container
  local name=$1 image=$2 ctr=$3
  buildah run --isolation chroot "$ctr" -- ftjob --help >/dev/null || { log "$image: ftjob --help failed"; return 1; }
  if [[ $name == operator ]]; then
    buildah run --isolation chroot "$ctr" -- python3 -c '
import importlib.util, sys
import kopf, kubernetes.client, kubernetes.config, kubernetes.watch, pydantic, prometheus_client
from finetune_operator.handlers.registry import build_registry
from finetune_operator.reconcile.cluster_io import ClusterIO
for heavy in ("torch", "deepspeed", "transformers"):
    if importlib.util.find_spec(heavy):
        sys.exit(f"{heavy} must not be in the operator image")
print("operator imports ok, torch-free")' || { log "$image: import check failed"; return 1; }
  else
    buildah run --isolation chroot --env DS_ACCELERATOR=cpu "$ctr" -- python3 -c '
import torch, deepspeed, peft, transformers, bitsandbytes, datasets, finetune_trainer
print("trainer imports ok: torch", torch.__version__, "deepspeed", deepspeed.__version__)' \
      || { log "$image: import check failed"; return 1; }
    buildah run --isolation chroot --env DS_ACCELERATOR=cuda "$ctr" -- python3 -c "$(cat trainer_image/imagebuild/check_image.py)" \
      || { log "$image: trainer_image/imagebuild/check_image.py failed"; return 1; }
  fi
}

# Keep buildah's store from growing run after run (a trainer image is ~7 GB): drop working
# containers left by interrupted builds, and images that lost their tag to a newer build.
prune() {
  buildah rm --all >/dev/null 2>&1 || true
  buildah rmi --prune >/dev/null 2>&1 || true
  rm -rf "$BUILD_TMP"
}
prune
trap prune EXIT
mkdir -p "$BUILD_TMP"
export TMPDIR=$BUILD_TMP

# The store keeps the last build of each tag until the new one is committed: drop it first, so
# the peak is one trainer image, not two. Then say plainly when the disk is too small, instead of
# failing with ENOSPC in the middle of a commit.
for t in "${targets[@]}"; do
  image=$OPERATOR_IMAGE
  [[ $t == trainer ]] && image=$TRAINER_IMAGE
  buildah rmi --force "$image" >/dev/null 2>&1 || true
done
if [[ " ${targets[*]} " == *" trainer "* ]]; then
  plan_trainer_deps
  if $TRAINER_DEPS_REUSED; then
    need=4
  else
    drop_old_trainer_deps
    need=${FTJOB_IMAGE_MIN_FREE_GB:-32}
  fi
  store=$(buildah info --format '{{.store.GraphRoot}}' 2>/dev/null || echo /var/lib/containers/storage)
  for dir in "$store" "$BUILD_TMP"; do
    have=$(free_gb "$dir")
    ((have >= need)) || die "the trainer image needs ~$need GB free for $dir; the disk has $have GB (free space, or set FTJOB_IMAGE_MIN_FREE_GB)"
  done
fi

for t in "${targets[@]}"; do
  case $t in
    operator) build operator "$OPERATOR_IMAGE" Dockerfile ;;
    trainer) build_trainer ;;
  esac
done

prune
log "summary"
printf '  %s\n' "${summary[@]}"
[[ -z ${FTJOB_SUMMARY_FILE:-} ]] || printf '%s\n' "${summary[@]}" >"$FTJOB_SUMMARY_FILE"
