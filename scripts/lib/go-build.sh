# `go build` (or `go test -c`) of a wrapper module under tests/k8s/tools, for the scripts that
# build real components into a cache (k8s-build.sh, e2e-build.sh, runtime-build.sh,
# flannel-build.sh; sourced). Uses their `say` and `die`, `tools` (tests/k8s/tools) and `log`
# (the build log in the cache).

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
