# Building real components from their published Go modules into a cache outside the repository
# (sourced by k8s-build.sh, helm-build.sh, promtool-build.sh, flannel-build.sh, runtime-build.sh,
# e2e-build.sh and kruise-build.sh): Go, the wrapper modules' versions and `go build` with progress; the options,
# directory and last line such scripts share are lib/cached-build.sh's.
# shellcheck source=scripts/lib/cached-build.sh
. "${BASH_SOURCE[0]%/*}/cached-build.sh"
require_vars repo say die

tools=$repo/tests/k8s/tools

# go_require WHAT: fails without Go; sets gover, the Go version each build directory is named by.
# shellcheck disable=SC2034 # gover is the calling script's
go_require() {
  command -v go >/dev/null || die "Go is not installed (needed to build $1; https://go.dev/dl, >= 1.26)"
  gover=$(go env GOVERSION)
}

# version_of MODULE WRAPPER: the version of MODULE that tests/k8s/tools/WRAPPER/go.mod requires.
version_of() {
  (cd "$tools/$2" && go list -m -f '{{.Version}}' "$1")
}

# go_run NAME WRAPPER ENV GO-ARGS...: `go GO-ARGS...` in tests/k8s/tools/WRAPPER (or in WRAPPER
# itself when it is an absolute path: a main module unpacked from a source archive) with ENV (a
# list of VAR=value words), a line every 30 s saying how far it got (lines of `-v` output: the
# packages compiled so far); the output goes to $log, and its last lines to stderr if it fails.
go_run() {
  local name=$1 wrapper=$2 env=$3; shift 3
  [[ $wrapper == /* ]] || wrapper=$tools/$wrapper
  say "building $name (log: $log)"
  local t0 pid next
  t0=$(date +%s)
  next=$((t0 + 30))
  : >"$log.pkgs"
  # shellcheck disable=SC2086 # env is a list of VAR=value words
  (cd "$wrapper" && env $env go "$@" 2>"$log.pkgs") &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ "$(date +%s)" -ge "$next" ]; then
      say "  $name: $(wc -l <"$log.pkgs") packages compiled, $(( $(date +%s) - t0 )) s"
      next=$((next + 30))
    fi
  done
  if ! wait "$pid"; then
    cat "$log.pkgs" >>"$log"
    tail -20 "$log.pkgs" >&2
    die "building $name failed (full output in $log)"
  fi
  cat "$log.pkgs" >>"$log"
  rm -f "$log.pkgs"
  say "  $name built in $(( $(date +%s) - t0 )) s"
}

# go_build NAME WRAPPER ENV GO-BUILD-ARGS...: go_run of `go build -v -trimpath -buildvcs=false`.
go_build() {
  local name=$1 wrapper=$2 env=$3; shift 3
  go_run "$name" "$wrapper" "$env" build -v -trimpath -buildvcs=false "$@"
}
