#!/usr/bin/env bash
# Build the Kubernetes control-plane binaries the local cluster needs, from the Go module
# proxy, and cache them by version outside the work tree.
#
#   tools/build-kube-binaries.sh [core] [kueue] [s3]      (default: core)
#
#   core   etcd, kwok (+ its Stage examples), helm, kube-apiserver, kube-controller-manager,
#          kube-scheduler, kubectl: what the demo and the cluster tests start
#   kueue  Kueue's manager with its CRDs and webhook configurations: only the Kueue tests use
#          it, so it is built on their first run (finetune_localcluster.binaries.ensure_binaries)
#   s3     SeaweedFS's `weed` (Apache-2.0): an S3-compatible server for the object-storage tests
#          and demo, built on the first run of a test that needs it
#
# Why: this machine kind has no Docker, kind or download site, only the Go module proxy.
# The binaries are built once (8 to 19 minutes cold on 2 cores beside the Python install, Kueue another ~5) and reused;
# a warm run is a no-op. It prints one line per step with the elapsed time and an estimate of
# what is left; the go command's own output goes to a log file under the cache, named on failure.
# Layout (FTJOB_CACHE_DIR defaults to ~/.cache/finetune-operator):
#   kube/<k8s-version>/bin/{kube-apiserver,kube-controller-manager,kube-scheduler,kubectl}
#   etcd/<etcd-version>/bin/etcd
#   kwok/<kwok-version>/bin/kwok  and  kwok/<kwok-version>/stage/  (its Stage examples)
#   helm/<helm-version>/bin/helm
#   kueue/<kueue-version>/bin/kueue, kueue/<kueue-version>/crd/ (its CRD yamls) and
#   kueue/<kueue-version>/webhook/manifests.yaml (its webhook configurations)
#   seaweedfs/<seaweedfs-version>/bin/weed
#   logs/<step>.log (the go output of the last build of each step)
# Environment: FTJOB_CACHE_DIR, FTJOB_BUILD_JOBS (default 2), and the usual GOCACHE /
# GOMODCACHE / GOPROXY, which are reused between runs.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
# SeaweedFS publishes no module-proxy tags; this pseudo-version is the pinned commit.
SEAWEEDFS_VERSION="${SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}"
CACHE_DIR="${FTJOB_CACHE_DIR:-$HOME/.cache/finetune-operator}"
JOBS="${FTJOB_BUILD_JOBS:-2}"
BUILD_DATE="2026-01-01T00:00:00Z"

# Staging modules of k8s.io/kubernetes 1.35; the release's go.mod replaces them with local
# paths, which a consumer must redirect to the published v0.<minor>.<patch> tags.
STAGING="api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
cloud-provider cluster-bootstrap code-generator component-base component-helpers
controller-manager cri-api cri-client csi-translation-lib dynamic-resource-allocation
endpointslice externaljwt kms kube-aggregator kube-controller-manager kube-proxy
kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission sample-apiserver
sample-cli-plugin sample-controller"
KUBE_BINS="kube-apiserver kube-controller-manager kube-scheduler kubectl"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -buildvcs=false"

LOG_DIR="$CACHE_DIR/logs"
die() { echo "build-kube-binaries: ERROR: $*" >&2; exit 1; }
log() { echo "build-kube-binaries: $*"; }

targets=("$@")
((${#targets[@]})) || targets=(core)
want_core=0; want_kueue=0; want_s3=0
for t in "${targets[@]}"; do
  case $t in
    core) want_core=1 ;;
    kueue) want_kueue=1 ;;
    s3) want_s3=1 ;;
    all) want_core=1; want_kueue=1; want_s3=1 ;;
    *) die "unknown target '$t' (core, kueue, s3, all)" ;;
  esac
done

command -v go >/dev/null 2>&1 || die "'go' is not on PATH. Install Go >= 1.26 (kwok ${KWOK_VERSION} needs it) and retry."

have_all() { local d="$1"; shift; for b in "$@"; do [[ -x "$d/$b" ]] || return 1; done; }

kube_dir="$CACHE_DIR/kube/$K8S_VERSION"
etcd_dir="$CACHE_DIR/etcd/$ETCD_VERSION"
kwok_dir="$CACHE_DIR/kwok/$KWOK_VERSION"
helm_dir="$CACHE_DIR/helm/$HELM_VERSION"
kueue_dir="$CACHE_DIR/kueue/$KUEUE_VERSION"
seaweedfs_dir="$CACHE_DIR/seaweedfs/$SEAWEEDFS_VERSION"

have_etcd() { have_all "$etcd_dir/bin" etcd; }
have_kwok() { have_all "$kwok_dir/bin" kwok && [[ -d "$kwok_dir/stage" ]]; }
have_helm() { have_all "$helm_dir/bin" helm; }
have_kube() { have_all "$kube_dir/bin" $KUBE_BINS; }
have_kueue() { have_all "$kueue_dir/bin" kueue && [[ -d "$kueue_dir/crd" && -f "$kueue_dir/webhook/manifests.yaml" ]]; }
have_s3() { have_all "$seaweedfs_dir/bin" weed; }
all_cached() {
  if ((want_core)); then have_etcd && have_kwok && have_helm && have_kube || return 1; fi
  if ((want_kueue)); then have_kueue || return 1; fi
  if ((want_s3)); then have_s3 || return 1; fi
}
if all_cached; then log "cache is warm: $CACHE_DIR (${targets[*]}: nothing to build)"; exit 0; fi

# One build at a time per cache (bootstrap, tests and a developer may all call this).
mkdir -p "$CACHE_DIR" "$LOG_DIR"
exec 9>"$CACHE_DIR/.build.lock"
if ! flock -n 9; then
  log "another build holds $CACHE_DIR/.build.lock; waiting for it ..."
  flock 9
fi
if all_cached; then log "cache is warm: $CACHE_DIR (built by the other run)"; exit 0; fi

# The steps still to do, each with its typical cold time on 2 cores (seconds, measured on a
# fresh machine on 2026-12-04 while the bootstrap's uv install and demo preparation ran beside
# it: 9 min in all), from which the progress lines estimate what is left. Another fresh machine
# (2026-12-02, pip beside it) took about twice as long; step() rescales the estimate by the pace
# seen so far. The scheduler and kubectl are quick: they reuse the packages the apiserver's
# build compiled.
steps=(); estimates=()
plan() { steps+=("$1"); estimates+=("$2"); }
if ((want_core)); then
  have_etcd || plan etcd 95
  have_kwok || plan kwok 110
  have_helm || plan helm 65
  if ! have_kube; then
    plan "kubernetes modules" 25
    plan kube-apiserver 180
    plan kube-controller-manager 55
    plan kube-scheduler 5
    plan kubectl 20
  fi
fi
((want_kueue)) && ! have_kueue && plan kueue 300
((want_s3)) && ! have_s3 && plan "seaweedfs modules" 120 && plan seaweedfs 900

log "go: $(go version); GOPROXY=$(go env GOPROXY); go output goes to $LOG_DIR/<step>.log"
if ! timeout 120 go list -m "k8s.io/kubernetes@$K8S_VERSION" >"$LOG_DIR/proxy-check.log" 2>&1; then
  cat "$LOG_DIR/proxy-check.log" >&2
  die "the Go module proxy ($(go env GOPROXY)) does not answer for k8s.io/kubernetes@$K8S_VERSION; set GOPROXY to a reachable proxy."
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ftjob-kube-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
TOTAL_START=$SECONDS
step_no=0; done_estimate=0

mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# step NAME CMD...: run CMD with its output in $LOG_DIR/NAME.log, one line before and after,
# with the elapsed time and an estimate of what is left (the remaining steps' typical times).
step() {
  local name="$1"; shift
  local logfile="$LOG_DIR/${name// /-}.log" t0=$SECONDS elapsed left=0 i
  for ((i = step_no; i < ${#steps[@]}; i++)); do left=$((left + estimates[i])); done
  elapsed=$((SECONDS - TOTAL_START))
  # scaled by this machine's pace so far, within half to twice the typical times (one slow
  # download early on must not make the estimate for the whole build jump)
  if ((done_estimate > 0 && elapsed > 0)); then
    local pct=$((100 * elapsed / done_estimate))
    ((pct < 50)) && pct=50
    ((pct > 200)) && pct=200
    left=$((left * pct / 100))
  fi
  step_no=$((step_no + 1))
  log "[$step_no/${#steps[@]}] $name ... (elapsed $(mmss "$elapsed"), about $(mmss "$left") left)"
  if ! "$@" >"$logfile" 2>&1; then
    tail -n 30 "$logfile" >&2
    die "$name failed; its full go output is in $logfile"
  fi
  done_estimate=$((done_estimate + estimates[step_no - 1]))
  log "[$step_no/${#steps[@]}] $name done in $((SECONDS - t0))s"
}

# new_module DIR GO_LINE: a throwaway module to build dependencies' main packages from.
new_module() {
  mkdir -p "$1"; (cd "$1" && go mod init ftjob.local/build >/dev/null 2>&1 && go mod edit -go="$2")
}

kube_modules() (  # the throwaway module with k8s.io/kubernetes and its staging modules pinned
  # A subshell with explicit checks: `set -e` does not apply inside the `if` that `step` runs it in.
  m="$1" staging_version="v0.${K8S_VERSION#v1.}"
  new_module "$m" 1.25.0 && cd "$m" || exit 1
  printf 'godebug default=go1.25\n' >> go.mod
  go mod edit -require="k8s.io/kubernetes@$K8S_VERSION" || exit 1
  for s in $STAGING; do go mod edit -replace="k8s.io/$s=k8s.io/$s@$staging_version" || exit 1; done
  for b in $KUBE_BINS; do go get "k8s.io/kubernetes/cmd/$b@$K8S_VERSION" || exit 1; done
)

build_kube() {
  local m="$WORK/kube" minor="${K8S_VERSION#v1.}"
  step "kubernetes modules" kube_modules "$m"
  local major="${K8S_VERSION#v}"; major="${major%%.*}"
  local gminor="${minor%%.*}"
  local x="" p b
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    x+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$gminor"
    x+=" -X $p.gitTreeState=clean -X $p.buildDate=$BUILD_DATE"
  done
  mkdir -p "$m/out"
  for b in $KUBE_BINS; do
    step "$b" bash -c "cd '$m' && go build -mod=mod -p '$JOBS' -trimpath -tags selinux,notest -ldflags '-s -w $x' -o 'out/$b' 'k8s.io/kubernetes/cmd/$b'"
  done
  mkdir -p "$kube_dir"; rm -rf "$kube_dir/bin"; mv "$m/out" "$kube_dir/bin"
}

build_etcd() {
  local m="$WORK/etcd"
  new_module "$m" 1.25.0
  mkdir -p "$m/out"
  step etcd bash -c "cd '$m' && go get 'go.etcd.io/etcd/server/v3@$ETCD_VERSION' && go build -mod=mod -p '$JOBS' -trimpath -ldflags '-s -w' -o out/etcd go.etcd.io/etcd/server/v3"
  mkdir -p "$etcd_dir"; rm -rf "$etcd_dir/bin"; mv "$m/out" "$etcd_dir/bin"
}

build_kwok() {
  mkdir -p "$WORK/kwok/bin"
  step kwok env GOBIN="$WORK/kwok/bin" go install -p "$JOBS" -trimpath -ldflags '-s -w' "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  local src; src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
  [[ -d "$src" ]] || die "kwok stage definitions not found at $src"
  mkdir -p "$kwok_dir"; rm -rf "$kwok_dir/bin" "$kwok_dir/stage"
  mv "$WORK/kwok/bin" "$kwok_dir/bin"
  cp -r "$src" "$kwok_dir/stage"; chmod -R u+w "$kwok_dir/stage"
}

build_helm() {
  mkdir -p "$WORK/helm/bin"
  # Stamp as helm's Makefile does: its version, and the Kubernetes version `helm template`
  # assumes without a cluster (from its client-go requirement, v0.N -> 1.N).
  local gomod client_go minor v="helm.sh/helm/v3/internal/version"
  gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  client_go="$(awk '$1 == "k8s.io/client-go" {print $2; exit}' "$gomod")"
  minor="$(echo "$client_go" | cut -d. -f2)"
  [[ -n "$minor" ]] || die "cannot read helm's k8s.io/client-go version from $gomod"
  local ld="-s -w -X $v.version=$HELM_VERSION -X $v.gitTreeState=clean"
  ld+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  ld+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  step helm env GOBIN="$WORK/helm/bin" go install -p "$JOBS" -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mkdir -p "$helm_dir"; rm -rf "$helm_dir/bin"; mv "$WORK/helm/bin" "$helm_dir/bin"
}

build_kueue() {
  # sigs.k8s.io/kueue has no replace lines: a plain `go install` of its manager builds it. The
  # CRDs (config/components/crd/bases) come from the same module version, so they match.
  mkdir -p "$WORK/kueue/bin"
  step kueue env GOBIN="$WORK/kueue/bin" go install -p "$JOBS" -trimpath -ldflags '-s -w' "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  local src; src="$(go env GOMODCACHE)/sigs.k8s.io/kueue@$KUEUE_VERSION/config/components"
  [[ -d "$src/crd/bases" && -f "$src/webhook/manifests.yaml" ]] || die "kueue CRDs or webhooks not found under $src"
  mkdir -p "$kueue_dir"; rm -rf "$kueue_dir/bin" "$kueue_dir/crd" "$kueue_dir/webhook"
  mv "$WORK/kueue/bin" "$kueue_dir/bin"
  cp -r "$src/crd/bases" "$kueue_dir/crd"; mkdir -p "$kueue_dir/webhook"
  cp "$src/webhook/manifests.yaml" "$kueue_dir/webhook/"; chmod -R u+w "$kueue_dir/crd" "$kueue_dir/webhook"
}

build_s3() {
  # SeaweedFS's go.mod has a replace line (go-bip39 -> its maintained fork), so `go install
  # pkg@version` refuses it: a throwaway module requires it and repeats the replace. The default
  # build tags leave out its optional backends (rclone, tikv, ydb, ...), which the tests never use.
  local m="$WORK/seaweedfs"
  step "seaweedfs modules" bash -c "
    set -e
    mkdir -p '$m' && cd '$m'
    go mod init ftjob.local/build >/dev/null 2>&1
    go mod edit -go=1.26.6
    go mod edit -require='github.com/seaweedfs/seaweedfs@$SEAWEEDFS_VERSION'
    go mod edit -replace=github.com/tyler-smith/go-bip39=github.com/cosmos/go-bip39@v1.0.0
    go get 'github.com/seaweedfs/seaweedfs/weed@$SEAWEEDFS_VERSION'"
  mkdir -p "$m/out"
  step seaweedfs bash -c "cd '$m' && go build -mod=mod -p '$JOBS' -trimpath -ldflags '-s -w' -o out/weed github.com/seaweedfs/seaweedfs/weed"
  mkdir -p "$seaweedfs_dir"; rm -rf "$seaweedfs_dir/bin"; mv "$m/out" "$seaweedfs_dir/bin"
}

if ((want_core)); then
  have_etcd || build_etcd
  have_kwok || build_kwok
  have_helm || build_helm
  have_kube || build_kube
fi
if ((want_kueue)); then have_kueue || build_kueue; fi
if ((want_s3)); then have_s3 || build_s3; fi

log "built ${targets[*]} in $(mmss $((SECONDS - TOTAL_START))); cache $CACHE_DIR ($(du -sh "$CACHE_DIR" | cut -f1))"
