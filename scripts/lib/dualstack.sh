# The cluster's IP families for scripts/cluster.sh (sourced; uses nodes.sh's underlay, node_ip,
# node_ns and node_dir).
#
# --ip-family ipv4 (the default): IPv4 pod and Service ranges only.
# --ip-family dual: IPv4 first (kube-apiserver, kubelet and the nodes' underlay keep IPv4 as the
# primary family) and IPv6 second:
# - Services from 10.96.0.0/16 and fd00:10:96::/112 (kube-apiserver --service-cluster-ip-range);
# - pod CIDRs from 10.244.0.0/16 (/24 a node) and fd00:10:244::/56 (/64 a node)
#   (kube-controller-manager --cluster-cidr, --node-cidr-mask-size-ipv4/-ipv6), kube-proxy's
#   clusterCIDR both;
# - the underlay bridge gets fd00:200::1/64, each node fd00:200::(10+i)/64 on its eth0 and a
#   default IPv6 route to the host, IPv6 forwarding in the host and in every node, and the host
#   routes each node's IPv6 pod CIDR to it (host-gw style, as for IPv4);
# - kubelet --node-ip with both addresses;
# - the CNI configuration gets a second range set [{"subnet": "usePodCidrIPv6"}] and a "::/0"
#   route, exactly as deploy/cni/kustomization.yaml and docs/install.md tell users; the baseline
#   (--without-ipkeep) gets host-local with both ranges.
# The ULA prefixes are fd00:10:244::/56 and fd00:10:96::/112 (pods, Services) and fd00:200::/64
# (the underlay), chosen apart from fd00::/64, which some machines (this CI's) use for their own
# network.
# shellcheck source=scripts/lib/require.sh
. "${BASH_SOURCE[0]%/*}/require.sh"
require_vars state say die kubectl

underlay_ip6=fd00:200::1

# ip_family_use FAMILY: sets the ranges the control plane gets.
ip_family_use() {
  ip_family=$1
  case $ip_family in
    ipv4)
      service_cidrs=10.96.0.0/16 pod_cidrs=10.244.0.0/16
      kcm_cidr_args=(--node-cidr-mask-size=24) ;;
    dual)
      service_cidrs=10.96.0.0/16,fd00:10:96::/112 pod_cidrs=10.244.0.0/16,fd00:10:244::/56
      # With two families kube-controller-manager refuses --node-cidr-mask-size.
      kcm_cidr_args=(--node-cidr-mask-size-ipv4=24 --node-cidr-mask-size-ipv6=64) ;;
    *) die "--ip-family takes ipv4 or dual, got '$1'" ;;
  esac
}

# ip_family_load: the family of the cluster in DIR (for the commands after `up`).
ip_family_load() {
  local f=ipv4
  [ -f "$state/ip-family" ] && f=$(cat "$state/ip-family")
  ip_family_use "$f"
}

dual() { [ "$ip_family" = dual ]; }

# dual_preflight: what IPv6 on the nodes needs from this machine.
dual_preflight() {
  dual || return 0
  [ "$(sysctl -n net.ipv6.conf.all.disable_ipv6 2>/dev/null)" = 0 ] ||
    die "--ip-family dual needs IPv6 in the kernel (sysctl net.ipv6.conf.all.disable_ipv6=0)"
  command -v ip6tables >/dev/null ||
    die "--ip-family dual needs ip6tables (kube-proxy, the bridge plugin's ipMasq): apt-get install iptables"
}

node_ip6() { echo "fd00:200::$((10 + ${1#node-}))"; }

# kubelet's --node-ip: the node's underlay address(es), IPv4 first.
node_ips() {
  if dual; then echo "$(node_ip "$1"),$(node_ip6 "$1")"; else node_ip "$1"; fi
}

# dual_underlay_up: the host's side of the underlay (after underlay_up). Forwarding is what the
# host does for IPv4 too (it routes between the nodes' pod CIDRs); the value it had is restored
# by dual_underlay_down.
dual_underlay_up() {
  dual || return 0
  sysctl -qw "net.ipv6.conf.$underlay.disable_ipv6=0"
  ip addr add "$underlay_ip6/64" dev "$underlay" nodad
  sysctl -n net.ipv6.conf.all.forwarding >/run/ipkeep-nodes.ipv6-forwarding
  sysctl -qw net.ipv6.conf.all.forwarding=1
}

dual_underlay_down() {
  local was
  was=$(cat /run/ipkeep-nodes.ipv6-forwarding 2>/dev/null) || return 0
  sysctl -qw "net.ipv6.conf.all.forwarding=$was" || true
  rm -f /run/ipkeep-nodes.ipv6-forwarding
}

# dual_node_net NODE: the node's IPv6 on its eth0, its default route, forwarding (the bridge
# plugin's gateway routes for its pods) and bridged IPv6 through ip6tables (kube-proxy).
dual_node_net() {
  dual || return 0
  local node=$1 ns
  ns=$(node_ns "$node")
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=0 net.ipv6.conf.default.disable_ipv6=0
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.forwarding=1
  ip -n "$ns" addr add "$(node_ip6 "$node")/64" dev eth0 nodad
  ip -n "$ns" -6 route add default via "$underlay_ip6"
  ip netns exec "$ns" sysctl -qw net.bridge.bridge-nf-call-ip6tables=1 2>/dev/null ||
    say "  $node: net.bridge.bridge-nf-call-ip6tables unavailable (IPv6 Services to a pod on the same node may fail)"
}

# dual_node_route NODE: routes NODE's IPv6 pod CIDR (the second of .spec.podCIDRs) to it; fails
# until the Node has one. A node registered again may have another: the old route goes.
dual_node_route() {
  dual || return 0
  local node=$1 cidr old
  cidr=$("${kubectl[@]}" get node "$node" -o jsonpath='{.spec.podCIDRs[1]}' 2>/dev/null) || return 1
  [[ $cidr == *:* ]] || return 1
  old=$(cat "$(node_dir "$node")/pod-cidr6" 2>/dev/null || true)
  [ -n "$old" ] && [ "$old" != "$cidr" ] && ip -6 route del "$old" 2>/dev/null
  ip -6 route replace "$cidr" via "$(node_ip6 "$node")"
  echo "$cidr" >"$(node_dir "$node")/pod-cidr6"
}

# dual_node_route_del NODE: at down.
dual_node_route_del() {
  local cidr
  cidr=$(cat "$(node_dir "$1")/pod-cidr6" 2>/dev/null) && ip -6 route del "$cidr" 2>/dev/null
  return 0
}

# host_local_ipam NODE: the baseline's host-local ipam object: the node's pod CIDR(s) and
# default route(s).
host_local_ipam() {
  local v4 v6
  v4=$(cat "$(node_dir "$1")/pod-cidr")
  if dual; then
    v6=$(cat "$(node_dir "$1")/pod-cidr6")
    printf '{"type": "host-local", "ranges": [[{"subnet": "%s"}], [{"subnet": "%s"}]], "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}' "$v4" "$v6"
  else
    printf '{"type": "host-local", "ranges": [[{"subnet": "%s"}]], "routes": [{"dst": "0.0.0.0/0"}]}' "$v4"
  fi
}

# cni_values_for_cluster CNI-VERSION: the chart's `cni` values as this cluster sets them (YAML):
# the agent writes the node configuration at the cniVersion the nodes' runtime runs, and for
# dual-stack with what docs/install.md tells users to add (a range set
# [{"subnet": "usePodCidrIPv6"}] and a "::/0" route).
cni_values_for_cluster() {
  printf 'cni:\n  enabled: true\n  cniVersion: "%s"\n' "$1"
  if [ "$ip_family" = dual ]; then
    printf '  ranges:\n    - - subnet: usePodCidr\n    - - subnet: usePodCidrIPv6\n'
    printf '  routes:\n    - dst: 0.0.0.0/0\n    - dst: "::/0"\n'
  fi
}
