# A script that builds one pinned tool into a cache outside the repository and skips the build
# when it is already there (sourced by lib/go-build.sh for the Go-built tools, and by
# cargo-deny-build.sh): its options, the build's directory, its last line.
# shellcheck source=scripts/lib/require.sh
. "${BASH_SOURCE[0]%/*}/require.sh"
require_vars say die

# cached_build_args CACHE-VARIABLE DEFAULT-CACHE ARGS...: the options every such script takes.
# --cache DIR sets cache (default: the variable CACHE-VARIABLE names, else DEFAULT-CACHE);
# --print-dir sets print_dir; --help prints the usage comment at the top of the script. A script
# with options of its own defines tool_option FLAG VALUE, which takes FLAG or returns non-zero.
# shellcheck disable=SC2034 # cache is the calling script's
cached_build_args() {
  cache_variable=$1 cache=${!1:-$2} print_dir=0
  shift 2
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
}

# cached_build_dir DIR [SUBDIR...]: the build's directory in the cache, made with its
# subdirectories; sets dir, log (the build log in it) and started.
# shellcheck disable=SC2034 # log is the calling script's
cached_build_dir() {
  dir=$1
  shift
  [ $# -gt 0 ] || set -- .
  mkdir -p "${@/#/$dir/}" || die "cannot create the cache directory $dir (set $cache_variable or --cache)"
  log=$dir/build.log
  started=$(date +%s)
}

# cached_build_ready SUMMARY: the build is ready (SUMMARY says what is where); with --print-dir,
# its directory is the last line of the output.
cached_build_ready() {
  say "ready in $(( $(date +%s) - started )) s: $1"
  if [ "$print_dir" = 1 ]; then
    echo "$dir"
  fi
}
