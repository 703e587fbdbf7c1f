#!/usr/bin/env bash
# Build (only when missing) Kyverno's admission controller and CLI for the peer comparison of
# bench/apiserver.py, from the Go module proxy:
#
#   kyverno           github.com/kyverno/kyverno/cmd/kyverno
#   kubectl-kyverno   github.com/kyverno/kyverno/cmd/cli/kubectl-kyverno
#
# Binaries land in the same cache as hack/build-tools.sh's:
#   ${GPUWARDEN_CACHE_DIR:-$HOME/.cache/gpuwarden-e2e}/kyverno-<version>/{kyverno,kubectl-kyverno}
# and ${cache}/kyverno.env is rewritten on every run with KYVERNO=, KYVERNO_CLI= and
# KYVERNO_MODULE= (the module's source directory, whose config/crds the benchmark installs).
#
# `go install pkg@version` refuses github.com/kyverno/kyverno because its go.mod carries a
# replace directive (k8s.io/pod-security-admission => Kyverno's fork). As build-tools.sh does
# for Kubernetes, this script generates a throwaway build module under ${cache}/.build/ that
# requires Kyverno and copies that replace directive, so the build resolves exactly the
# versions Kyverno's own go.mod selects.
#
# Not part of `make test`: only `make bench` (bench-peers) calls it. The version can be
# overridden with KYVERNO_VERSION, the Go toolchain with GO.
set -euo pipefail
shopt -s inherit_errexit

KYVERNO_VERSION="${KYVERNO_VERSION:-v1.19.1}"

LOG_NAME=build-kyverno
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bindir="$cache/kyverno-$KYVERNO_VERSION"
kyverno="$bindir/kyverno"
kyverno_cli="$bindir/kubectl-kyverno"

# The module's source directory in Go's module cache (downloads it when missing).
module_dir() {
	"$GO" mod download -json "github.com/kyverno/kyverno@$KYVERNO_VERSION" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p'
}

write_env() {
	local src="$1" tmp="$cache/kyverno.env.tmp.$$"
	{
		echo "KYVERNO=$kyverno"
		echo "KYVERNO_CLI=$kyverno_cli"
		echo "KYVERNO_MODULE=$src"
	} >"$tmp"
	mv -f "$tmp" "$cache/kyverno.env"
}

# Throwaway module requiring Kyverno, with the replace directives of Kyverno's go.mod.
kyverno_module() {
	local src="$1" dir="$cache/.build/kyverno-$KYVERNO_VERSION"
	if [[ -f "$dir/go.mod" ]]; then
		echo "$dir"
		return
	fi
	local gomod="$src/go.mod" go_directive
	[[ -f "$gomod" ]] || {
		log "could not locate go.mod of github.com/kyverno/kyverno@$KYVERNO_VERSION"
		exit 1
	}
	go_directive="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")"
	rm -rf "$dir.tmp"
	mkdir -p "$dir.tmp"
	{
		echo "module gpuwarden.local/build/kyverno"
		echo
		echo "go ${go_directive:-1.26.0}"
		echo
		echo "require github.com/kyverno/kyverno $KYVERNO_VERSION"
		echo
		# Single-line replace directives (the form Kyverno's go.mod uses) and those inside a
		# replace ( ... ) block, both copied as they are.
		sed -n 's/^replace \([^(].*=>.*\)$/replace \1/p' "$gomod"
		sed -n '/^replace ($/,/^)$/{/=>/s/^[[:space:]]*\(.*\)$/replace \1/p}' "$gomod"
	} >"$dir.tmp/go.mod"
	mv "$dir.tmp" "$dir"
	echo "$dir"
}

KYVERNO_LDFLAGS="-s -w -X github.com/kyverno/kyverno/pkg/version.BuildVersion=$KYVERNO_VERSION"

main() {
	exec 9>"$cache/.kyverno.lock"
	flock 9

	GO="$(go_bin)"
	export CGO_ENABLED=0

	# Fast path: both binaries cached and the module source (for its CRDs) still on disk.
	local cached_src=""
	if [[ -f "$cache/kyverno.env" ]]; then
		cached_src="$(sed -n 's/^KYVERNO_MODULE=//p' "$cache/kyverno.env")"
	fi
	if [[ -x "$kyverno" && -x "$kyverno_cli" && -n "$cached_src" && -d "$cached_src/config/crds" ]]; then
		log "kyverno $KYVERNO_VERSION cached in $bindir"
		cat "$cache/kyverno.env"
		return 0
	fi

	local src dir total=$SECONDS
	src="$(module_dir)"
	[[ -d "$src" ]] || {
		log "could not download github.com/kyverno/kyverno@$KYVERNO_VERSION"
		exit 1
	}
	dir="$(kyverno_module "$src")"
	if [[ ! -x "$kyverno" ]]; then
		timed "kyverno $KYVERNO_VERSION" go_build "$dir" "$kyverno" github.com/kyverno/kyverno/cmd/kyverno "$KYVERNO_LDFLAGS"
	fi
	if [[ ! -x "$kyverno_cli" ]]; then
		timed "kubectl-kyverno $KYVERNO_VERSION" go_build "$dir" "$kyverno_cli" \
			github.com/kyverno/kyverno/cmd/cli/kubectl-kyverno "$KYVERNO_LDFLAGS"
	fi
	log "done in $((SECONDS - total))s"
	write_env "$src"
	cat "$cache/kyverno.env"
}

main "$@"
exit
