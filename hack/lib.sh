# Helpers shared by hack/build-tools.sh and hack/build-kyverno.sh (sourced, not run).
# The sourcing script sets LOG_NAME first; `cache` is set to the absolute cache directory,
# ${GPUWARDEN_CACHE_DIR:-$HOME/.cache/gpuwarden-e2e}, created when missing.

cache="${GPUWARDEN_CACHE_DIR:-$HOME/.cache/gpuwarden-e2e}"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd -P)"

log() { printf '%s: %s\n' "$LOG_NAME" "$*" >&2; }

# The Go toolchain: $GO if set, else go on PATH, else /usr/local/go/bin/go.
go_bin() {
	if [[ -n "${GO:-}" ]]; then
		echo "$GO"
	elif command -v go >/dev/null 2>&1; then
		command -v go
	elif [[ -x /usr/local/go/bin/go ]]; then
		echo /usr/local/go/bin/go
	else
		log "no Go toolchain found (need go on PATH or /usr/local/go/bin/go)"
		exit 1
	fi
}

# Elapsed wall-clock time of the last build, printed after each tool.
timed() {
	local name="$1"
	shift
	local start=$SECONDS
	log "building $name ..."
	"$@"
	log "built $name in $((SECONDS - start))s"
}

# Build package $3 of the module in build dir $1 into $2 with ldflags $4 (atomically: a
# half-written binary never counts as present). Needs $GO.
go_build() {
	local dir="$1" out="$2" pkg="$3" ldflags="$4"
	mkdir -p "$(dirname "$out")"
	(cd "$dir" && GOFLAGS="${GOFLAGS:-} -mod=mod" "$GO" build -trimpath -ldflags "$ldflags" -o "$out.tmp" "$pkg")
	mv -f "$out.tmp" "$out"
}
