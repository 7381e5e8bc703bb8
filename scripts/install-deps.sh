#!/usr/bin/env bash
# Installs what the demonstration and the tests need on a Debian machine: the reference CNI
# plugins (bridge, host-local) the tests run beside ipkeep, iproute2 for network namespaces,
# ping and arping for traffic, strace for the durability test, Python's venv for
# scripts/validate-deploy.sh (which puts its pinned validators in a virtualenv), and as root
# what real nodes need (busybox, gcc, iptables, conntrack, netcat-openbsd for the conformance
# images, and libseccomp's headers and pkg-config for building runc). Skips apt entirely when
# everything is already there. First the Rust toolchain rust-toolchain.toml pins (rust_pinned).
set -euo pipefail

# rust_pinned: rustc is the release rust-toolchain.toml names. rustup installs a missing release
# only by downloading it, which CI's network does not allow; a machine whose stable toolchain is
# that release gets it registered under the pinned name, as a hard-linked copy (rustup offers no
# command for that: `rustup toolchain link` refuses release names), which a later update of
# stable leaves as it is. Anything else fails, naming the release.
rust_pinned() {
  local repo pinned sysroot host have
  repo=$(cd "$(dirname "$0")/.." && pwd)
  pinned=$(sed -n 's/^channel = "\(.*\)"$/\1/p' "$repo/rust-toolchain.toml")
  if command -v rustup >/dev/null && ! rustup toolchain list | grep -q "^$pinned-" &&
    [[ $(rustc +stable --version 2>/dev/null) == "rustc $pinned "* ]]; then
    sysroot=$(rustc +stable --print sysroot)
    host=$(rustc +stable -vV | sed -n 's/^host: //p')
    echo "install-deps: the stable toolchain is Rust $pinned: registering it as $pinned-$host" >&2
    cp -al "$(realpath "$sysroot")" "${sysroot%/*}/$pinned-$host"
  fi
  have=$(cd "$repo" && rustc --version 2>&1 | head -1) || true
  [[ $have == "rustc $pinned "* ]] && return 0
  echo "install-deps: this workspace is built with Rust $pinned (rust-toolchain.toml), but rustc says: $have" >&2
  echo "install-deps: install it (rustup toolchain install $pinned --profile minimal -c clippy,rustfmt) or change rust-toolchain.toml" >&2
  exit 1
}
rust_pinned

need=()
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || need+=(containernetworking-plugins)
command -v ip >/dev/null || need+=(iproute2)
command -v ping >/dev/null || need+=(iputils-ping)
command -v arping >/dev/null || need+=(iputils-arping)
# strace: the durability test checks that a commit is fsynced before it is acknowledged.
command -v strace >/dev/null || need+=(strace)
# openssl and curl: scripts/cluster.sh makes the test cluster's certificates and probes it.
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
# The real nodes of scripts/cluster.sh (root only): busybox for the workload image, gcc for the
# pause program (and the cgo builds of kubelet and runc), libseccomp-dev and pkg-config for runc
# (scripts/runtime-build.sh builds the node runtime), iptables and conntrack for kube-proxy.
# Debian's containerd and runc are only for `scripts/cluster.sh --node-runtime debian`, which
# says to install them.
if [ "$(id -u)" -eq 0 ]; then
  command -v pkg-config >/dev/null || need+=(pkg-config)
  [ -f /usr/include/seccomp.h ] || need+=(libseccomp-dev)
  [ -x /bin/busybox ] || need+=(busybox-static)
  command -v gcc >/dev/null || need+=(gcc libc6-dev)
  command -v iptables >/dev/null || need+=(iptables)
  command -v conntrack >/dev/null || need+=(conntrack)
  # netcat-openbsd: the conformance tests' agnhost image runs `nc -u` (scripts/e2e-images.py).
  [ -x /usr/bin/nc.openbsd ] || need+=(netcat-openbsd)
fi
# Debian's python3 creates virtualenvs only with python3-venv (ensurepip); other Pythons (pyenv)
# have it built in.
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing ${need[*]}; run as root (or: sudo apt-get install -y ${need[*]})" >&2
  exit 1
fi
echo "install-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
