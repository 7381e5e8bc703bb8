#!/usr/bin/env bash
# A randomized chaos soak of ipkeep on a real-node cluster on this machine (docs/soak.md): it
# builds ipkeep-soak and ipkeep's release binaries, and ipkeep-soak brings up
# `scripts/cluster.sh up --nodes N --cni-data-size 64m`, runs a workload of StatefulSets that
# scale, roll and lose pods while a nemesis injects faults on a seeded schedule, checks the
# invariants every second and after settling, prints a table (and writes JSON), and takes the
# cluster down (its logs are kept when an invariant failed or the soak stopped short). Needs
# root, and Go the first time (the Kubernetes components are built from their modules).
#
#   scripts/soak.sh [--seed N] [--duration 10m] [--faults all|KIND,...] [--nodes 3]
#                   [--ip-family ipv4|dual] [--json FILE] [--state DIR [--attach]]
#
# The exit status is 0 when every invariant held; a failure prints the seed and the faults in
# order, which reproduce the schedule: `scripts/soak.sh --seed N --duration D` again. Every
# flag is ipkeep-soak's (--help lists them with what each fault and invariant is).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/lib/cargo-env.sh
. scripts/lib/cargo-env.sh
release_dir() {
  echo "$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release"
}
packages=(-p ipkeep-e2e -p ipkeep-agent -p ipkeep-controller -p ipkeep-scheduler-ext)
bins=(--bin ipkeep-soak --bin ipkeep-agent --bin ipkeep-controller --bin ipkeep-scheduler-ext)

case " $* " in
  *" --help "*|*" -h "*)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    echo
    if [ -x "$(release_dir)/ipkeep-soak" ]; then
      "$(release_dir)/ipkeep-soak" --help
    else
      echo "ipkeep-soak's own flags: build it (cargo build --release -p ipkeep-e2e --bin ipkeep-soak), then --help again."
    fi
    exit 0 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "soak: real nodes need root (network and mount namespaces, cgroups, containerd)" >&2; exit 1; }
scripts/install-deps.sh
# One cargo build for everything: scripts/cluster.sh uses these binaries (IPKEEP_RELEASE_DIR,
# IPKEEP_PLUGIN) rather than building its own set.
echo "soak: building ipkeep-soak and ipkeep's release binaries" >&2
cargo_build "soak: cargo build" --release --locked "${packages[@]}" "${bins[@]}"
IPKEEP_RELEASE_DIR=$(release_dir)
IPKEEP_PLUGIN=$(scripts/build-plugin.sh | tail -1)
export IPKEEP_RELEASE_DIR IPKEEP_PLUGIN
exec "$IPKEEP_RELEASE_DIR/ipkeep-soak" "$@"
