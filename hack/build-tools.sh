#!/usr/bin/env bash
# Build (only when missing) the binaries the e2e and chart suites need, from Go
# module sources fetched through the Go module proxy:
#
#   kube-apiserver, kubectl,  k8s.io/kubernetes   (cmd/kube-apiserver, cmd/kubectl,
#   kube-scheduler                                 cmd/kube-scheduler)
#   etcd                      go.etcd.io/etcd/server/v3
#   helm                      helm.sh/helm/v4/cmd/helm
#   kwok                      sigs.k8s.io/kwok/cmd/kwok (fake nodes for the scheduling lab)
#   kueue                     sigs.k8s.io/kueue/cmd/kueue (tenant queues in the lab)
#   promtool, prometheus      github.com/prometheus/prometheus (cmd/promtool: the chart's rules
#                             checked and unit-tested; cmd/prometheus: the `gpuwarden usage` e2e)
#   training-operator         github.com/kubeflow/training-operator/cmd/training-operator.v1
#                             (the Training Operator v1 whose jobs the e2e suite submits)
#
# Binaries land in a cache outside the repository:
#   ${GPUWARDEN_CACHE_DIR:-$HOME/.cache/gpuwarden-e2e}/<tool>-<version>/<binary>
# and ${cache}/tools.env is rewritten on every run with KUBE_APISERVER=, ETCD=,
# KUBECTL=, HELM=, KUBE_SCHEDULER=, KUBE_CONTROLLER_MANAGER=, KWOK=, KUEUE=, PROMTOOL=, PROMETHEUS= and TRAINING_OPERATOR=
# lines (absolute paths). Go's module
# and build caches stay in their defaults (~/go/pkg/mod, ~/.cache/go-build), so rebuilds are
# warm; the lab reads Kueue's CRDs and webhook manifests from its module there.
#
# `go install pkg@version` refuses k8s.io/kubernetes (and etcd's server module)
# because their go.mod files carry replace directives pointing into their own
# source trees. Instead this script generates a throwaway build module under
# ${cache}/.build/ that requires the module and, for Kubernetes, replaces each
# staging module (required there as v0.0.0) with its published v0.<minor>.<patch>.
# kwok's, kueue's, prometheus's and the Training Operator's go.mod have no replace directives,
# so they build with plain `go install`. Prometheus is built with the tag remove_all_sd (no
# service-discovery plugins: the e2e scrapes static targets, and the build is far shorter) and
# without builtinassets (whose web UI bundle is not in the module: the HTTP API, all the tests
# use, works without it).
#
# Versions can be overridden with KUBERNETES_VERSION, ETCD_VERSION, HELM_VERSION,
# KWOK_VERSION, KUEUE_VERSION, PROMETHEUS_VERSION, TRAINING_OPERATOR_VERSION; the Go
# toolchain with GO.
set -euo pipefail
shopt -s inherit_errexit

KUBERNETES_VERSION="${KUBERNETES_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v4.3.2}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
TRAINING_OPERATOR_VERSION="${TRAINING_OPERATOR_VERSION:-v1.8.1}"

LOG_NAME=build-tools
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

kube_apiserver="$cache/kube-apiserver-$KUBERNETES_VERSION/kube-apiserver"
kubectl="$cache/kubectl-$KUBERNETES_VERSION/kubectl"
etcd="$cache/etcd-$ETCD_VERSION/etcd"
helm="$cache/helm-$HELM_VERSION/helm"
kube_scheduler="$cache/kube-scheduler-$KUBERNETES_VERSION/kube-scheduler"
kube_controller_manager="$cache/kube-controller-manager-$KUBERNETES_VERSION/kube-controller-manager"
kwok="$cache/kwok-$KWOK_VERSION/kwok"
kueue="$cache/kueue-$KUEUE_VERSION/kueue"
promtool="$cache/promtool-$PROMETHEUS_VERSION/promtool"
prometheus="$cache/prometheus-$PROMETHEUS_VERSION/prometheus"
training_operator="$cache/training-operator-$TRAINING_OPERATOR_VERSION/training-operator"

write_env() {
	local tmp="$cache/tools.env.tmp.$$"
	{
		echo "KUBE_APISERVER=$kube_apiserver"
		echo "ETCD=$etcd"
		echo "KUBECTL=$kubectl"
		echo "HELM=$helm"
		echo "KUBE_SCHEDULER=$kube_scheduler"
		echo "KUBE_CONTROLLER_MANAGER=$kube_controller_manager"
		echo "KWOK=$kwok"
		echo "KUEUE=$kueue"
		echo "PROMTOOL=$promtool"
		echo "PROMETHEUS=$prometheus"
		echo "TRAINING_OPERATOR=$training_operator"
	} >"$tmp"
	mv -f "$tmp" "$cache/tools.env"
}

# Throwaway module that builds k8s.io/kubernetes commands.
kubernetes_module() {
	local dir="$cache/.build/kubernetes-$KUBERNETES_VERSION"
	if [[ -f "$dir/go.mod" ]]; then
		echo "$dir"
		return
	fi
	local staging_version="v0.${KUBERNETES_VERSION#v1.}"
	local gomod
	gomod="$("$GO" mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
	[[ -f "$gomod" ]] || {
		log "could not locate go.mod of k8s.io/kubernetes@$KUBERNETES_VERSION"
		exit 1
	}
	local go_directive
	go_directive="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")"
	rm -rf "$dir.tmp"
	mkdir -p "$dir.tmp"
	{
		echo "module gpuwarden.local/build/kubernetes"
		echo
		echo "go ${go_directive:-1.26.0}"
		echo
		echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
		echo
		echo "replace ("
		# Staging modules are required as "k8s.io/<name> v0.0.0" and replaced
		# with ./staging/src/k8s.io/<name> in the kubernetes go.mod.
		sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) v0\.0\.0$#\1#p' "$gomod" |
			sort -u | while read -r m; do
			echo "	$m => $m $staging_version"
		done
		echo ")"
	} >"$dir.tmp/go.mod"
	mv "$dir.tmp" "$dir"
	echo "$dir"
}

etcd_module() {
	local dir="$cache/.build/etcd-$ETCD_VERSION"
	if [[ ! -f "$dir/go.mod" ]]; then
		rm -rf "$dir.tmp"
		mkdir -p "$dir.tmp"
		# etcd's server go.mod pins its sibling modules at the same version, so
		# requiring it is enough; its own replace directives do not apply here.
		printf 'module gpuwarden.local/build/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
			"$ETCD_VERSION" >"$dir.tmp/go.mod"
		mv "$dir.tmp" "$dir"
	fi
	echo "$dir"
}

kube_ldflags() {
	local v="$KUBERNETES_VERSION" major minor flags="-s -w"
	major="${v#v}"
	major="${major%%.*}"
	minor="${v#v*.}"
	minor="${minor%%.*}"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
		flags+=" -X $pkg.gitTreeState=clean"
	done
	echo "$flags"
}

build_etcd() {
	local dir
	dir="$(etcd_module)"
	go_build "$dir" "$etcd" go.etcd.io/etcd/server/v3 "-s -w"
}

build_kube() {
	local out="$1" pkg="$2" dir
	dir="$(kubernetes_module)"
	go_build "$dir" "$out" "$pkg" "$(kube_ldflags)"
}

build_helm() {
	local bindir
	bindir="$(dirname "$helm")"
	mkdir -p "$bindir"
	GOBIN="$bindir" "$GO" install -trimpath \
		-ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
		"helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
}

build_kwok() {
	local bindir
	bindir="$(dirname "$kwok")"
	mkdir -p "$bindir"
	# Into a temporary GOBIN, then moved: a half-written binary never counts as present.
	rm -rf "$bindir/.gobin"
	GOBIN="$bindir/.gobin" "$GO" install -trimpath \
		-ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
		"sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
	mv -f "$bindir/.gobin/kwok" "$kwok"
	rm -rf "$bindir/.gobin"
}

build_kueue() {
	local bindir
	bindir="$(dirname "$kueue")"
	mkdir -p "$bindir"
	rm -rf "$bindir/.gobin"
	GOBIN="$bindir/.gobin" "$GO" install -trimpath \
		-ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
		"sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
	mv -f "$bindir/.gobin/kueue" "$kueue"
	rm -rf "$bindir/.gobin"
}

# One command of github.com/prometheus/prometheus: $1 the binary's path, $2 the command.
build_prometheus_cmd() {
	local out="$1" cmd="$2" bindir
	bindir="$(dirname "$out")"
	mkdir -p "$bindir"
	rm -rf "$bindir/.gobin"
	GOBIN="$bindir/.gobin" "$GO" install -trimpath -tags remove_all_sd \
		-ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}" \
		"github.com/prometheus/prometheus/cmd/$cmd@$PROMETHEUS_VERSION"
	mv -f "$bindir/.gobin/$cmd" "$out"
	rm -rf "$bindir/.gobin"
}

build_training_operator() {
	local bindir
	bindir="$(dirname "$training_operator")"
	mkdir -p "$bindir"
	rm -rf "$bindir/.gobin"
	GOBIN="$bindir/.gobin" "$GO" install -trimpath -ldflags "-s -w" \
		"github.com/kubeflow/training-operator/cmd/training-operator.v1@$TRAINING_OPERATOR_VERSION"
	mv -f "$bindir/.gobin/training-operator.v1" "$training_operator"
	rm -rf "$bindir/.gobin"
}

# Everything runs inside main, which bash parses whole before running, so editing this file
# while a (long) build is in progress cannot derail that build.
main() {
	# Serialise concurrent runs (e.g. `make test` and the pytest fixture) on one cache.
	exec 9>"$cache/.lock"
	flock 9

	# Fast path: everything cached, nothing to build, no Go invocation at all.
	if [[ -x "$kube_apiserver" && -x "$kubectl" && -x "$etcd" && -x "$helm" &&
		-x "$kube_scheduler" && -x "$kwok" && -x "$kueue" && -x "$promtool" &&
		-x "$prometheus" && -x "$training_operator" && -x "$kube_controller_manager" ]]; then
		write_env
		log "all tools cached in $cache"
		cat "$cache/tools.env"
		return 0
	fi

	GO="$(go_bin)"
	export CGO_ENABLED=0

	# Sequential on purpose: the Go compiler already uses every core.
	local total=$SECONDS
	if [[ ! -x "$etcd" ]]; then
		timed "etcd $ETCD_VERSION" build_etcd
	fi
	if [[ ! -x "$kube_apiserver" ]]; then
		timed "kube-apiserver $KUBERNETES_VERSION" build_kube "$kube_apiserver" k8s.io/kubernetes/cmd/kube-apiserver
	fi
	if [[ ! -x "$kubectl" ]]; then
		timed "kubectl $KUBERNETES_VERSION" build_kube "$kubectl" k8s.io/kubernetes/cmd/kubectl
	fi
	if [[ ! -x "$helm" ]]; then
		timed "helm $HELM_VERSION" build_helm
	fi
	if [[ ! -x "$kube_scheduler" ]]; then
		timed "kube-scheduler $KUBERNETES_VERSION" build_kube "$kube_scheduler" k8s.io/kubernetes/cmd/kube-scheduler
	fi
	# The Job controller, for Katib trials as batch Jobs in the lab (tests/e2e/test_katib_kueue.py).
	if [[ ! -x "$kube_controller_manager" ]]; then
		timed "kube-controller-manager $KUBERNETES_VERSION" build_kube "$kube_controller_manager" \
			k8s.io/kubernetes/cmd/kube-controller-manager
	fi
	if [[ ! -x "$kwok" ]]; then
		timed "kwok $KWOK_VERSION" build_kwok
	fi
	if [[ ! -x "$kueue" ]]; then
		timed "kueue $KUEUE_VERSION" build_kueue
	fi
	if [[ ! -x "$promtool" ]]; then
		timed "promtool $PROMETHEUS_VERSION" build_prometheus_cmd "$promtool" promtool
	fi
	if [[ ! -x "$prometheus" ]]; then
		timed "prometheus $PROMETHEUS_VERSION" build_prometheus_cmd "$prometheus" prometheus
	fi
	if [[ ! -x "$training_operator" ]]; then
		timed "training-operator $TRAINING_OPERATOR_VERSION" build_training_operator
	fi
	log "done in $((SECONDS - total))s"

	write_env
	cat "$cache/tools.env"
}

main "$@"
exit
