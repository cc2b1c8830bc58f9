#!/usr/bin/env bash
# Build the Kubernetes control-plane binaries the cluster test tier needs, from the Go
# module proxy, and cache them by version outside the work tree.
#
# Why: this machine kind has no Docker, kind or download site, only the Go module proxy.
# The binaries are built once (tens of minutes cold on 2 cores) and reused; a warm run is a
# no-op. Layout (FTJOB_CACHE_DIR defaults to ~/.cache/finetune-operator):
#   kube/<k8s-version>/bin/{kube-apiserver,kube-controller-manager,kube-scheduler,kubectl}
#   etcd/<etcd-version>/bin/etcd
#   kwok/<kwok-version>/bin/kwok  and  kwok/<kwok-version>/stage/  (its Stage examples)
#   helm/<helm-version>/bin/helm
#   kueue/<kueue-version>/bin/kueue, kueue/<kueue-version>/crd/ (its CRD yamls) and
#   kueue/<kueue-version>/webhook/manifests.yaml (its webhook configurations)
# Environment: FTJOB_CACHE_DIR, FTJOB_BUILD_JOBS (default 2), and the usual GOCACHE /
# GOMODCACHE / GOPROXY, which are reused between runs.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
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

die() { echo "build-kube-binaries: ERROR: $*" >&2; exit 1; }
log() { echo "build-kube-binaries: $*"; }

command -v go >/dev/null 2>&1 || die "'go' is not on PATH. Install Go >= 1.26 (kwok ${KWOK_VERSION} needs it) and retry."

have_all() { local d="$1"; shift; for b in "$@"; do [[ -x "$d/$b" ]] || return 1; done; }

kube_dir="$CACHE_DIR/kube/$K8S_VERSION"
etcd_dir="$CACHE_DIR/etcd/$ETCD_VERSION"
kwok_dir="$CACHE_DIR/kwok/$KWOK_VERSION"
helm_dir="$CACHE_DIR/helm/$HELM_VERSION"
kueue_dir="$CACHE_DIR/kueue/$KUEUE_VERSION"

all_cached() {
  have_all "$kube_dir/bin" $KUBE_BINS && have_all "$etcd_dir/bin" etcd \
    && have_all "$kwok_dir/bin" kwok && [[ -d "$kwok_dir/stage" ]] && have_all "$helm_dir/bin" helm \
    && have_all "$kueue_dir/bin" kueue && [[ -d "$kueue_dir/crd" && -f "$kueue_dir/webhook/manifests.yaml" ]]
}
if all_cached; then log "cache is warm: $CACHE_DIR (nothing to build)"; exit 0; fi

# One build at a time per cache (bootstrap, tests and a developer may all call this).
mkdir -p "$CACHE_DIR"
exec 9>"$CACHE_DIR/.build.lock"
if ! flock -n 9; then
  log "another build holds $CACHE_DIR/.build.lock; waiting for it ..."
  flock 9
fi
if all_cached; then log "cache is warm: $CACHE_DIR (built by the other run)"; exit 0; fi

log "go: $(go version); GOPROXY=$(go env GOPROXY)"
log "checking the Go module proxy ..."
if ! timeout 120 go list -m "k8s.io/kubernetes@$K8S_VERSION" >/dev/null 2>/tmp/ftjob-proxy-check.$$; then
  cat /tmp/ftjob-proxy-check.$$ >&2; rm -f /tmp/ftjob-proxy-check.$$
  die "the Go module proxy ($(go env GOPROXY)) does not answer for k8s.io/kubernetes@$K8S_VERSION; set GOPROXY to a reachable proxy."
fi
rm -f /tmp/ftjob-proxy-check.$$

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ftjob-kube-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
TOTAL_START=$SECONDS

# timed NAME CMD...: run CMD and print how long it took.
timed() {
  local name="$1"; shift; local t0=$SECONDS
  log "building $name ..."
  "$@" || die "building $name failed (see the go output above)"
  log "built $name in $((SECONDS - t0))s"
}

# new_module DIR GO_LINE: a throwaway module to build dependencies' main packages from.
new_module() {
  mkdir -p "$1"; (cd "$1" && go mod init ftjob.local/build >/dev/null 2>&1 && go mod edit -go="$2")
}

build_kube() {
  local m="$WORK/kube" minor="${K8S_VERSION#v1.}" pkg
  local staging_version="v0.${minor}"
  new_module "$m" 1.25.0
  (cd "$m"
   printf 'godebug default=go1.25\n' >> go.mod
   go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
   for s in $STAGING; do go mod edit -replace="k8s.io/$s=k8s.io/$s@$staging_version"; done
   for b in $KUBE_BINS; do go get "k8s.io/kubernetes/cmd/$b@$K8S_VERSION" >/dev/null; done)
  local major="${K8S_VERSION#v}"; major="${major%%.*}"
  local gminor="${minor%%.*}"
  local x="" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    x+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$gminor"
    x+=" -X $p.gitTreeState=clean -X $p.buildDate=$BUILD_DATE"
  done
  mkdir -p "$m/out"
  for b in $KUBE_BINS; do
    pkg="k8s.io/kubernetes/cmd/$b"
    timed "$b $K8S_VERSION" bash -c "cd '$m' && go build -mod=mod -p '$JOBS' -trimpath -tags selinux,notest -ldflags '-s -w $x' -o 'out/$b' '$pkg'"
  done
  mkdir -p "$kube_dir"; rm -rf "$kube_dir/bin"; mv "$m/out" "$kube_dir/bin"
}

build_etcd() {
  local m="$WORK/etcd"
  new_module "$m" 1.25.0
  (cd "$m" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null)
  mkdir -p "$m/out"
  timed "etcd $ETCD_VERSION" bash -c "cd '$m' && go build -mod=mod -p '$JOBS' -trimpath -ldflags '-s -w' -o out/etcd go.etcd.io/etcd/server/v3"
  mkdir -p "$etcd_dir"; rm -rf "$etcd_dir/bin"; mv "$m/out" "$etcd_dir/bin"
}

build_kwok() {
  mkdir -p "$WORK/kwok/bin"
  timed "kwok $KWOK_VERSION" env GOBIN="$WORK/kwok/bin" go install -p "$JOBS" -trimpath -ldflags '-s -w' "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
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
  timed "helm $HELM_VERSION" env GOBIN="$WORK/helm/bin" go install -p "$JOBS" -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mkdir -p "$helm_dir"; rm -rf "$helm_dir/bin"; mv "$WORK/helm/bin" "$helm_dir/bin"
}

build_kueue() {
  # sigs.k8s.io/kueue has no replace lines: a plain `go install` of its manager builds it. The
  # CRDs (config/components/crd/bases) come from the same module version, so they match.
  mkdir -p "$WORK/kueue/bin"
  timed "kueue $KUEUE_VERSION" env GOBIN="$WORK/kueue/bin" go install -p "$JOBS" -trimpath -ldflags '-s -w' "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  local src; src="$(go env GOMODCACHE)/sigs.k8s.io/kueue@$KUEUE_VERSION/config/components"
  [[ -d "$src/crd/bases" && -f "$src/webhook/manifests.yaml" ]] || die "kueue CRDs or webhooks not found under $src"
  mkdir -p "$kueue_dir"; rm -rf "$kueue_dir/bin" "$kueue_dir/crd" "$kueue_dir/webhook"
  mv "$WORK/kueue/bin" "$kueue_dir/bin"
  cp -r "$src/crd/bases" "$kueue_dir/crd"; mkdir -p "$kueue_dir/webhook"
  cp "$src/webhook/manifests.yaml" "$kueue_dir/webhook/"; chmod -R u+w "$kueue_dir/crd" "$kueue_dir/webhook"
}

have_all "$etcd_dir/bin" etcd || build_etcd
have_all "$kwok_dir/bin" kwok && [[ -d "$kwok_dir/stage" ]] || build_kwok
have_all "$helm_dir/bin" helm || build_helm
have_all "$kube_dir/bin" $KUBE_BINS || build_kube
have_all "$kueue_dir/bin" kueue && [[ -d "$kueue_dir/crd" && -f "$kueue_dir/webhook/manifests.yaml" ]] || build_kueue

log "total build time: $((SECONDS - TOTAL_START))s"
log "cache: $CACHE_DIR ($(du -sh "$CACHE_DIR" | cut -f1))"
for d in "$kube_dir" "$etcd_dir" "$kwok_dir" "$helm_dir" "$kueue_dir"; do ls -l "$d/bin"; done
