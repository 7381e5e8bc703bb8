# flannel on the real nodes of scripts/cluster.sh (`up --network flannel`; sourced after
# lib/controlplane.sh; uses nodes.sh's node_dir, node_exec and start_in_node).
#
# What kube-flannel's manifest does on a cluster, done by hand on each node:
# - flanneld (scripts/flannel-build.sh) runs on every node in the node's namespaces and cgroup,
#   as a node process beside kubelet, with the kube subnet manager (each node's subnet is its
#   Node's pod CIDR; flanneld finds its Node by NODE_NAME, as it does outside a pod) and the vxlan
#   backend on eth0; it writes /run/flannel/subnet.env (the node's /run) and routes the other
#   nodes' pod CIDRs through flannel.1. The host keeps its own routes to each node's pod CIDR:
#   it runs the control plane but is no flannel node (no Node object), and kube-apiserver must
#   reach the webhook's pods; node-to-node traffic never goes through it.
# - the flannel CNI plugin goes into the node's /opt/cni/bin and the CNI configuration
#   (deploy/cni/10-ipkeep-flannel.conflist, as docs/install.md tells users to write it) into
#   /etc/cni/net.d/10-flannel.conflist, as kube-flannel's init containers copy them at every
#   start; ipkeep is installed without the deploy/cni component (the agent writes no CNI
#   configuration) and its agent installs the ipkeep plugin.
# - flanneld's user gets the ClusterRole kube-flannel's manifest gives it.
# Its state: DIR/flannel/{dir,net-conf.json,kubeconfig}.
# shellcheck source=scripts/lib/require.sh
. "${BASH_SOURCE[0]%/*}/require.sh"
require_vars repo state say die alive wait_for cert kubeconfig kubectl

flannel_conflist=$repo/deploy/cni/10-ipkeep-flannel.conflist

# flannel_enabled: this cluster runs flannel (its state says so).
flannel_enabled() { [ -f "$state/flannel/dir" ]; }

# flannel_build: flanneld and the flannel CNI plugin built or reused; sets flannel_dir.
flannel_build() {
  say "building or reusing flannel (scripts/flannel-build.sh)"
  flannel_dir=$("$repo/scripts/flannel-build.sh" --print-dir | tail -1) || die "building flannel failed"
}

# flannel_setup: flanneld's configuration, credentials and RBAC (kube-apiserver is up).
flannel_setup() {
  local d=$state/flannel
  mkdir -p "$d"
  echo "$flannel_dir" >"$d/dir"
  # kube-flannel's net-conf.json: the cluster CIDR kube-controller-manager splits into the
  # nodes' pod CIDRs, and vxlan.
  echo '{"Network": "10.244.0.0/16", "EnableNFTables": false, "Backend": {"Type": "vxlan"}}' >"$d/net-conf.json"
  cert flanneld "/CN=flanneld"
  kubeconfig "$d/kubeconfig" cert flanneld
  "${kubectl[@]}" apply -f - >/dev/null <<'YAML' || die "could not create flanneld's RBAC"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: flannel}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get]}
- {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}
- {apiGroups: [""], resources: [nodes/status], verbs: [patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: flannel}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: flannel}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: flanneld}
YAML
}

# flannel_node_start NODE: the CNI plugin and configuration in place, flanneld started (once the
# Node has a pod CIDR: flanneld exits without one), and its subnet.env written.
flannel_node_start() {
  local node=$1 dir root
  dir=$(cat "$state/flannel/dir") root=$(node_dir "$node")/root
  ln -sfn "$dir/cni/flannel" "$root/opt/cni/bin/flannel"
  cp "$flannel_conflist" "$root/etc/cni/net.d/10-flannel.conflist"
  alive "$node-flanneld" || start_in_node "$node-flanneld" "$node" env NODE_NAME="$node" \
    "$dir/bin/flanneld" --kube-subnet-mgr --kubeconfig-file="$state/flannel/kubeconfig" \
    --net-config-path="$state/flannel/net-conf.json" --iface=eth0 --ip-masq
  wait_for "$node: flanneld's subnet.env" 60 "$node-flanneld" node_exec "$node" test -s /run/flannel/subnet.env
}
