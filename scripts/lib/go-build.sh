# Building real components from their published Go modules into a cache outside the repository
# (sourced by k8s-build.sh, helm-build.sh, promtool-build.sh, flannel-build.sh, runtime-build.sh
# and e2e-build.sh): the wrapper modules' versions, `go build` with progress, and the prologue
# and ending the scripts of one tool each share (go_tool_start, go_tool_cache, go_tool_ready).
# shellcheck source=scripts/lib/require.sh
. "${BASH_SOURCE[0]%/*}/require.sh"
require_vars repo say die

tools=$repo/tests/k8s/tools

# go_tool_start WHAT CACHE-VARIABLE DEFAULT-CACHE ARGS...: the options every such script takes,
# then Go. --cache DIR sets cache (default: the variable CACHE-VARIABLE names, else
# DEFAULT-CACHE); --print-dir sets print_dir; --help prints the usage comment at the top of the
# script. A script with options of its own defines tool_option FLAG VALUE, which takes FLAG or
# returns non-zero. Fails without Go (WHAT: what the script builds, for the message); sets gover.
# shellcheck disable=SC2034 # cache is the calling script's
go_tool_start() {
  local what=$1
  cache_variable=$2 cache=${!2:-$3} print_dir=0
  shift 3
  while [ $# -gt 0 ]; do
    case $1 in
      --cache) cache=${2:?--cache needs a directory}; shift 2 ;;
      --print-dir) print_dir=1; shift ;;
      -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      *)
        # shellcheck disable=SC2015 # either failing is an unknown argument
        declare -F tool_option >/dev/null && tool_option "$1" "${2-}" ||
          die "unknown argument '$1' (see --help)"
        shift 2 ;;
    esac
  done
  go_require "$what"
}

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

# go_tool_cache DIR [SUBDIR...]: the build's directory in the cache, made with its
# subdirectories; sets dir, log (the build log in it) and started.
go_tool_cache() {
  dir=$1
  shift
  [ $# -gt 0 ] || set -- .
  mkdir -p "${@/#/$dir/}" || die "cannot create the cache directory $dir (set $cache_variable or --cache)"
  log=$dir/build.log
  started=$(date +%s)
}

# go_tool_ready SUMMARY: the build is ready (SUMMARY says what is where); with --print-dir, its
# directory is the last line of the output.
go_tool_ready() {
  say "ready in $(( $(date +%s) - started )) s: $1"
  if [ "$print_dir" = 1 ]; then
    echo "$dir"
  fi
}

# go_run NAME WRAPPER ENV GO-ARGS...: `go GO-ARGS...` in tests/k8s/tools/WRAPPER with ENV (a
# list of VAR=value words), a line every 30 s saying how far it got (lines of `-v` output: the
# packages compiled so far); the output goes to $log, and its last lines to stderr if it fails.
go_run() {
  local name=$1 wrapper=$2 env=$3; shift 3
  say "building $name (log: $log)"
  local t0 pid next
  t0=$(date +%s)
  next=$((t0 + 30))
  : >"$log.pkgs"
  # shellcheck disable=SC2086 # env is a list of VAR=value words
  (cd "$tools/$wrapper" && env $env go "$@" 2>"$log.pkgs") &
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
