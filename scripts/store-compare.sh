#!/usr/bin/env bash
# store-compare.sh — a MEASUREMENT TOOL, NOT PART OF CI. Neither .ci/run nor scripts/test.sh
# calls it, and nothing fails a build on its numbers.
#
# Runs one harness for the ipam Store trait (crates/store-compare, its own cargo workspace) on
# every node-store backend and prints one markdown table (rows = checks, columns = backends)
# followed by the raw numbers. The backends:
#   sled        sled 0.34.7 exactly as pre-release ipkeep used it (layout version 1)
#   sled-fixed  the same, plus removal of stale snap.*.generating files before open and an
#               fdatasync after every flush (see crates/store-compare/src/sled_store.rs)
#   redb        today's store, crates/ipam/src/disk/db.rs (redb 4.6.0, layout version 2)
# The checks (every command is a real process running the real allocator under the network lock):
#   torture     thousands of SIGKILLs at random moments (lock, open, creation, commit, close);
#               after every kill the next command must succeed; each store is checked against
#               every acknowledgement; then the same with 60,000 held leases in the store
#   enospc      a tmpfs in a private mount namespace, ENOSPC at every page a command writes
#   durability  strace: fsync/fdatasync of the written file before the acknowledgement
#   damage      one random byte of a clean store changed, then a command (plugin and agent opens)
#   measure     per-process open time at 1k and 60k leases, open after a crash, file size, peak
#               RSS of one long-lived opener (the node agent) with 60k held leases
# The results are what docs/store.md reports.
#
# Needs root (unshare + mount for enospc; it says SKIPPED otherwise) and strace (installed with
# apt-get when missing). Takes about 20 minutes on 2 cores; --quick takes about 3.
#
# Usage: scripts/store-compare.sh [--quick] [--only torture,torture-60k,enospc,durability,damage,measure]
# Environment: STORE_COMPARE_WORK (scratch, default /tmp/ipkeep-store-compare; wiped),
#              STORE_COMPARE_RESULTS (default crates/store-compare/target/results).
set -euo pipefail

cd "$(dirname "$0")/.."
crate=crates/store-compare
work=${STORE_COMPARE_WORK:-/tmp/ipkeep-store-compare}
results=${STORE_COMPARE_RESULTS:-$crate/target/results}
quick=0
only=torture,torture-60k,enospc,durability,damage,measure
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --only) only=$2; shift ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
wants() { [[ ",$only," == *",$1,"* ]]; }

echo "== store-compare: a measurement tool, not part of CI"
echo "   machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr); $(date -u +%Y-%m-%dT%H:%MZ)"

step() { # name, command…
    local name=$1; shift
    local started=$SECONDS
    echo "== $name: $*"
    # Children report their phases on stderr as `@name µs`; keep only the rest.
    "$@" 2>&1 | { grep --line-buffered -v '^@' || true; }
    echo "== $name took $((SECONDS - started)) s"
}

step build cargo build --release --locked --manifest-path "$crate/Cargo.toml"
bin=$crate/target/release/store-compare

rm -rf "$work" "$results"
mkdir -p "$work" "$results"

if [ "$quick" = 1 ]; then
    torture=(--steady-kills 150 --create-kills 30 --epoch-kills 75)
    torture60k=(--steady-kills 30 --create-kills 0 --epoch-kills 30)
    measure=(--opens 20 --crash-opens 3 --agent-runs 1)
    damage=(--trials 30)
else
    torture=(--steady-kills 1800 --create-kills 300 --epoch-kills 150)
    torture60k=(--steady-kills 300 --create-kills 0 --epoch-kills 100)
    measure=(--opens 100 --crash-opens 10 --agent-runs 3)
    damage=(--trials 200)
fi

if wants torture; then
    step torture "$bin" torture --work "$work" --results "$results" "${torture[@]}"
fi
if wants torture-60k; then
    step torture-60k "$bin" torture --work "$work" --results "$results" --label=-60k --prefill 60000 "${torture60k[@]}"
fi
if wants enospc; then
    if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
        step enospc "$bin" enospc --work "$work" --results "$results"
    else
        echo "== enospc: SKIPPED (needs root and unshare for a tmpfs in a private mount namespace)"
    fi
fi
if wants durability; then
    if ! command -v strace >/dev/null; then
        if [ "$(id -u)" = 0 ]; then
            apt-get install -y -qq strace >/dev/null || { apt-get update -qq && apt-get install -y -qq strace >/dev/null; }
        fi
    fi
    if command -v strace >/dev/null; then
        step durability "$bin" durability --work "$work" --results "$results"
    else
        echo "== durability: SKIPPED (strace is missing; apt-get install strace as root)"
    fi
fi
if wants damage; then
    step damage "$bin" damage --work "$work" --results "$results" "${damage[@]}"
fi
if wants measure; then
    step measure "$bin" measure --work "$work" --results "$results" "${measure[@]}"
fi

echo
"$bin" report --results "$results"
