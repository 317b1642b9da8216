#!/usr/bin/env bash
# Build the Kubernetes test environment from Go modules, once: kube-apiserver, kube-controller-manager,
# kube-scheduler (k8s.io/kubernetes through a wrapper module with replace directives for its staging modules),
# etcd, kwok, kustomize (to render deploy/), Karpenter's kwok provider (the node provisioner) with its CRDs,
# and KEDA's operator and metrics adapter with theirs.
# The binaries are cached outside the repository and rebuilt only when missing. Prints the binary folder on
# its last line.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-0.8.0}"
KUSTOMIZE_VERSION="${KUSTOMIZE_VERSION:-5.7.1}"
KARPENTER_VERSION="${KARPENTER_VERSION:-1.14.0}"  # 1.14.3 and later need a newer Go than 1.26.8
KEDA_VERSION="${KEDA_VERSION:-2.21.0}"
CACHE="${KUBE_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/inference-autoscaler/k8s-v${K8S_VERSION}}"
BIN="$CACHE/bin"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
export GOPATH="${GOPATH:-$HOME/go}"

need() { [ -x "$BIN/$1" ] || return 0; return 1; }
mkdir -p "$BIN"

if ! command -v go >/dev/null 2>&1; then
  echo "go is required to build the Kubernetes test binaries" >&2
  exit 1
fi

if need kube-apiserver || need kube-controller-manager || need kube-scheduler; then
  work="$CACHE/kubernetes"
  mkdir -p "$work"
  minor="${K8S_VERSION#*.}"; minor="${minor%%.*}"
  staging="v0.${K8S_VERSION#*.}"
  {
    echo "module testenv/kubernetes"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes v${K8S_VERSION}"
    echo
    for m in api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider \
             cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api \
             cri-client cri-streaming csi-translation-lib dynamic-resource-allocation endpointslice externaljwt \
             kms kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics \
             mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller streaming; do
      echo "replace k8s.io/$m => k8s.io/$m $staging"
    done
  } > "$work/go.mod"
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  cd "$work"
  go mod tidy -e >/dev/null 2>&1 || go mod tidy
  ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags="$ldflags -X $pkg.gitVersion=v${K8S_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor}"
  done
  for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
    if need "$cmd"; then
      echo "building $cmd v${K8S_VERSION} (first time only)..." >&2
      go build -tags tools -trimpath -ldflags "$ldflags" -o "$BIN/$cmd" "k8s.io/kubernetes/cmd/$cmd"
    fi
  done
fi

if need etcd; then
  work="$CACHE/etcd"
  mkdir -p "$work"
  printf 'module testenv/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' "$ETCD_VERSION" > "$work/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$work/tools.go"
  cd "$work"
  go mod tidy -e >/dev/null 2>&1 || go mod tidy
  echo "building etcd v${ETCD_VERSION} (first time only)..." >&2
  go build -tags tools -trimpath -o "$BIN/etcd" go.etcd.io/etcd/server/v3
fi

if need kwok; then
  echo "building kwok v${KWOK_VERSION} (first time only)..." >&2
  GOBIN="$BIN" go install "sigs.k8s.io/kwok/cmd/kwok@v${KWOK_VERSION}"
fi

if need kustomize; then
  echo "building kustomize v${KUSTOMIZE_VERSION} (first time only)..." >&2
  GOBIN="$BIN" go install "sigs.k8s.io/kustomize/kustomize/v5@v${KUSTOMIZE_VERSION}"
fi

if need karpenter-kwok || [ ! -d "$BIN/karpenter-crds" ]; then
  echo "building karpenter-kwok v${KARPENTER_VERSION} (first time only)..." >&2
  work="$CACHE/karpenter"
  mkdir -p "$work"
  GOBIN="$work" go install "sigs.k8s.io/karpenter/kwok@v${KARPENTER_VERSION}"
  mv "$work/kwok" "$BIN/karpenter-kwok"
  src="$(go env GOMODCACHE)/sigs.k8s.io/karpenter@v${KARPENTER_VERSION}/kwok"
  mkdir -p "$BIN/karpenter-crds.tmp"
  cp "$src"/charts/crds/*.yaml "$src"/apis/crds/*.yaml "$BIN/karpenter-crds.tmp/"
  chmod u+w "$BIN"/karpenter-crds.tmp/*.yaml
  rm -rf "$BIN/karpenter-crds" && mv "$BIN/karpenter-crds.tmp" "$BIN/karpenter-crds"
fi

if need keda-operator || need keda-adapter || [ ! -d "$BIN/keda-crds" ]; then
  # KEDA's go.mod has replace and exclude directives, which `go install pkg@version` refuses: a wrapper
  # module repeats them.
  work="$CACHE/keda"
  mkdir -p "$work"
  src="$(go mod download -json "github.com/kedacore/keda/v2@v${KEDA_VERSION}" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')"
  {
    printf 'module testenv/keda\n\ngo 1.26.0\n\nrequire github.com/kedacore/keda/v2 v%s\n\n' "$KEDA_VERSION"
    awk '/^(replace|exclude) *\($/ {block=1} block {print} /^\)/ {block=0} /^(replace|exclude) [^(]/ {print}' "$src/go.mod"
  } > "$work/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "github.com/kedacore/keda/v2/cmd/adapter"\n\t_ "github.com/kedacore/keda/v2/cmd/operator"\n)\n' > "$work/tools.go"
  cd "$work"
  go mod tidy -e >/dev/null 2>&1 || go mod tidy
  for cmd in operator adapter; do
    if need "keda-$cmd"; then
      echo "building keda-$cmd v${KEDA_VERSION} (first time only, the longest build)..." >&2
      go build -tags tools -trimpath -o "$BIN/keda-$cmd" "github.com/kedacore/keda/v2/cmd/$cmd"
    fi
  done
  mkdir -p "$BIN/keda-crds.tmp"
  cp "$src"/config/crd/bases/*.yaml "$BIN/keda-crds.tmp/"
  chmod u+w "$BIN"/keda-crds.tmp/*.yaml
  rm -rf "$BIN/keda-crds" && mv "$BIN/keda-crds.tmp" "$BIN/keda-crds"
fi

echo "$BIN"
