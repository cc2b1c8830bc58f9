#!/usr/bin/env bash
# Builds the operator and trainer images for real, with buildah (chroot isolation: no daemon,
# no user namespaces needed) on a Debian bookworm base made by debootstrap (no registry needed),
# then checks each image from the inside (`ftjob --help` and an import check, via buildah run
# as the image's non-root user; for the trainer also trainer_image/imagebuild/check_image.py: the
# prebuilt DeepSpeed ops, no compiler, the RDMA libraries) and prints sizes and build times.
#
#   scripts/build-images.sh [operator] [trainer]     (default: both)
#   scripts/build-images.sh --print-deps-key IMAGE   (the hash below, nothing built)
#
# Each Dockerfile has a `deps` stage (the trainer's: system packages, the venv with torch, the
# prebuilt DeepSpeed ops, ~8 GB and 7-15 minutes; the operator's: a venv with its requirements)
# that reads only the Dockerfile up to the line `FROM deps AS ...`, the helper files in
# trainer_image/imagebuild/deps/, the image's locked requirements (requirements/<image>-image.txt,
# exported from uv.lock by scripts/lock.sh) and the base image (its recipe version is in its name). That stage is kept in buildah's store as
# localhost/finetune-<image>-deps:<hash of those inputs> and built only when that image is
# missing; building one removes the older ones of that name. The stages after it (the project's
# source) are built every time, on top of the kept image, in seconds.
#
# Environment:
#   FTJOB_CACHE_DIR      cache root (default ~/.cache/finetune-operator); the debootstrap rootfs
#                        is kept there as images/debian-bookworm-python3-v2.tar
#   FTJOB_IMAGE_TAG      tag of the built images (default dev)
#   FTJOB_DEBIAN_MIRROR  Debian mirror for debootstrap (default http://deb.debian.org/debian)
#   FTJOB_CA_BUNDLE      CA bundle for pip inside the build, passed as a build secret (default:
#                        the host's bundle, which covers a TLS-intercepting proxy the host trusts)
#   FTJOB_SUMMARY_FILE   also write the summary lines (name, size, seconds, deps) to this file
#   FTJOB_IMAGE_MIN_FREE_GB  free disk a build of the trainer's dependency image needs (default 32:
#                        measured peak 30 GB above the start: its rootfs, the layer blob being
#                        committed and the image); on top of a kept one the trainer needs 4 GB
#   FTJOB_REBUILD_DEPS   1: build the dependency images even when ones with the same inputs are kept
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE_DIR=${FTJOB_CACHE_DIR:-$HOME/.cache/finetune-operator}
TAG=${FTJOB_IMAGE_TAG:-dev}
MIRROR=${FTJOB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${FTJOB_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
SUITE=bookworm
ROOTFS_TAR="$CACHE_DIR/images/debian-$SUITE-python3-v2.tar"  # bump vN when the recipe changes
BASE_IMAGE="localhost/finetune-base:$SUITE-python3-v2"
DEPS_HELPERS=trainer_image/imagebuild/deps
export BUILDAH_ISOLATION=chroot
# buildah stages each layer blob (~8 GB for the trainer) under TMPDIR and leaves it behind when
# the build is killed; a private directory, emptied at start and at exit, never accumulates them.
BUILD_TMP="$CACHE_DIR/images/tmp"

log() { printf '\033[1m[build-images]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[build-images]\033[0m %s\n' "$*" >&2; exit 1; }

# Per image: its Dockerfile, the line that starts the stages after `deps`, the files its deps
# stage reads (the locked requirements among them) and its build arguments.
declare -A FILE=([operator]=Dockerfile [trainer]=trainer_image/Dockerfile)
declare -A SOURCE_STAGE=([operator]='FROM deps AS build' [trainer]='FROM deps AS trainer')
declare -A HELPERS=([operator]="requirements/operator-image.txt" [trainer]="$DEPS_HELPERS requirements/trainer-image.txt")
declare -A ARGS=([operator]='' [trainer]='')

image_of() { echo "localhost/finetune-$1:$TAG"; }
deps_repo_of() { echo "localhost/finetune-$1-deps"; }

# The hash of every input of an image's deps stage (see the header).
deps_key() {  # image
  local name=$1 file=${FILE[$1]} stage=${SOURCE_STAGE[$1]}
  grep -qxF "$stage" "$file" || die "$file has no line '$stage'"
  {
    printf '%s\n' "BASE_IMAGE=$BASE_IMAGE" "${ARGS[$name]}"
    sed "/^$stage\$/q" "$file"
    # shellcheck disable=SC2086  # the helpers are words
    find ${HELPERS[$name]} -type f ! -path '*/__pycache__/*' | LC_ALL=C sort | while read -r f; do
      printf '== %s\n' "$f"; cat "$f"
    done
  } | sha256sum | cut -c1-16
}

if [[ ${1:-} == --print-deps-key ]]; then
  [[ -n ${FILE[${2:-}]:-} ]] || die "--print-deps-key needs an image: operator or trainer"
  deps_key "$2"
  exit 0
fi

targets=("$@")
((${#targets[@]})) || targets=(operator trainer)
for t in "${targets[@]}"; do
  [[ -n ${FILE[$t]:-} ]] || die "unknown image '$t' (operator, trainer)"
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

declare -A DEPS_IMAGE DEPS_REUSED
plan_deps() {  # image: sets DEPS_IMAGE and DEPS_REUSED for it
  DEPS_IMAGE[$1]="$(deps_repo_of "$1"):$(deps_key "$1")"
  DEPS_REUSED[$1]=false
  if [[ ${FTJOB_REBUILD_DEPS:-} != 1 ]] && buildah inspect --type image "${DEPS_IMAGE[$1]}" >/dev/null 2>&1; then
    DEPS_REUSED[$1]=true
  fi
}

drop_old_deps() {  # image: its dependency images of other inputs (the trainer's are ~8 GB each)
  local old kept
  kept=$(buildah images --noheading --format '{{.Name}}:{{.Tag}}' "$(deps_repo_of "$1")" 2>/dev/null || true)
  for old in $(sort -u <<<"$kept"); do
    [[ $old != "${DEPS_IMAGE[$1]}" ]] || continue
    log "removing the dependency image $old (other inputs)"
    buildah rmi --force "$old" >/dev/null 2>&1 || true
  done
}

summary=()
build() {  # image: the kept or a new deps stage, then the stages after it
  local name=$1 file=${FILE[$1]} stage=${SOURCE_STAGE[$1]} image deps=${DEPS_IMAGE[$1]}
  local start=$SECONDS source_start note rest args=(--build-arg "BASE_IMAGE=$BASE_IMAGE") a
  image=$(image_of "$name")
  while read -r a; do [[ -z $a ]] || args+=(--build-arg "$a"); done <<<"${ARGS[$name]}"
  if ${DEPS_REUSED[$name]}; then
    log "dependency image $deps reused: its inputs are unchanged"
    note="deps reused $deps"
  else
    buildah rmi --force "$deps" >/dev/null 2>&1 || true
    log "building the dependency image $deps (stage deps of $file)"
    buildah build --isolation chroot --layers=false -f "$file" --target deps -t "$deps" \
      "${args[@]}" "${secret[@]}" . || die "building $deps failed"
    log "dependency image $deps built in $((SECONDS - start)) s"
    note="deps built in $((SECONDS - start)) s as $deps"
  fi
  # The same file from the line `FROM deps AS ...` on, with `deps` the kept image: the global
  # ARGs before the first FROM, then that stage starting from the kept image, then the rest.
  rest="$BUILD_TMP/$name.Containerfile"
  {
    sed -n '/^FROM /q; /^ARG /p' "$file"
    echo "FROM $deps AS ${stage##* }"
    sed "1,/^$stage\$/d" "$file"
  } >"$rest"
  log "building $image: the stages after deps in $file, on $deps"
  source_start=$SECONDS
  buildah build --isolation chroot --layers=false -f "$rest" -t "$image" "${args[@]}" "${secret[@]}" . \
    || die "building $image failed"
  log "$image: source layer built in $((SECONDS - source_start)) s"
  check "$name" "$image"
  local size
  size=$(buildah images --noheading --format '{{.Size}}' "$image" | head -n1)
  summary+=("$(printf '%-9s %-40s size %-10s build %4d s  %s' "$name" "$image" "$size" $((SECONDS - start)) "$note")")
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

# Keep buildah's store from growing run after run (a trainer image is ~8 GB): drop working
# containers left by interrupted builds, and images that lost their tag to a newer build. The
# dependency images keep their tags: they are the cache, and drop_old_deps bounds them.
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
  buildah rmi --force "$(image_of "$t")" >/dev/null 2>&1 || true
  plan_deps "$t"
  ${DEPS_REUSED[$t]} || drop_old_deps "$t"
done
if [[ " ${targets[*]} " == *" trainer "* ]]; then
  need=4
  ${DEPS_REUSED[trainer]} || need=${FTJOB_IMAGE_MIN_FREE_GB:-32}
  store=$(buildah info --format '{{.store.GraphRoot}}' 2>/dev/null || echo /var/lib/containers/storage)
  for dir in "$store" "$BUILD_TMP"; do
    have=$(free_gb "$dir")
    ((have >= need)) || die "the trainer image needs ~$need GB free for $dir; the disk has $have GB (free space, or set FTJOB_IMAGE_MIN_FREE_GB)"
  done
fi

for t in "${targets[@]}"; do
  build "$t"
done

prune
log "summary"
printf '  %s\n' "${summary[@]}"
[[ -z ${FTJOB_SUMMARY_FILE:-} ]] || printf '%s\n' "${summary[@]}" >"$FTJOB_SUMMARY_FILE"
