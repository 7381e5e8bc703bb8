# Real nodes for scripts/cluster.sh (sourced after lib/controlplane.sh; uses dualstack.sh's dual_*,
# node_ips, host_local_ipam and pod_cidrs, and flannel.sh's flannel_enabled and
# flannel_node_start).
#
# A node is what a machine would be, built from this machine's kernel, the node runtime and
# Kubernetes' node components:
# - its own network namespace `ipkeep-<node>`, with eth0 = 10.200.0.(10+i)/24 on the host bridge
#   ipkeep-br0 (10.200.0.1, where kube-apiserver listens), a default route to the host, and the
#   host routing each node's pod CIDR to it (host-gw style), so pods on different nodes reach
#   each other;
# - its own mount namespace, held by a `sleep` process (the node's "holder"), with a fresh tmpfs
#   on /run (gone when the node powers off, as on a real machine) and its own /var/lib/kubelet,
#   /var/lib/containerd, /var/lib/cni, /var/log, /etc/cni/net.d and /opt/cni/bin (and with the
#   k3s layout /var/lib/rancher), bound from $state/nodes/<node>/root (kept across node stops and
#   power-offs, like a disk). Everything else (/usr, /etc, /proc, /sys) is the host's. The
#   container runtime's CNI plugin directory starts with the runtime's reference plugins, as a
#   node image would ship them; ipkeep's agent DaemonSet installs `ipkeep` there and writes the
#   CNI configuration, as on any cluster. Where those two directories are is the node layout
#   (node_layout_use: kubeadm's, k3s's or kind's);
# - its own cgroup /ipkeep-nodes/<node> in every cgroup v1 hierarchy: the holder, the node's
#   daemons and (kubelet's cgroupRoot) every pod, so powering the node off is killing the cgroup;
# - containerd with runc, kubelet and kube-proxy from the cluster's build, all inside the node's
#   namespaces, with the images of scripts/images.py imported (there is no registry). The node
#   runtime (runtime_use) is by default the one scripts/runtime-build.sh builds from modules
#   (containerd 2.3, a current runc, the CNI plugins 1.10: CNI configurations at cniVersion
#   1.1.0); `debian` is Debian's containerd 1.6, runc 1.1 and plugins 1.1 (cniVersion 1.0.0).
# Only one cluster with real nodes can run on a machine (the bridge, the routes and the host's
# kube-proxy rules are machine-wide).
# shellcheck source=scripts/lib/require.sh
. "${BASH_SOURCE[0]%/*}/require.sh"
require_vars state bin say die start alive stop_one wait_for cert kubeconfig kubectl lease_seconds cni_data_size image_tag p_proxy_health p_proxy_metrics

underlay=ipkeep-br0
underlay_ip=10.200.0.1
cgroup_base=ipkeep-nodes

# node_layout_use LAYOUT: where the nodes' container runtime keeps its CNI configuration
# (cni_conf_dir) and plugins (cni_bin_dir), and which reference plugins a node starts with
# (node_plugins), as each distribution lays a node out (docs/distributions.md):
# - kubeadm: /etc/cni/net.d and /opt/cni/bin, every reference plugin there;
# - k3s: k3s's own directories, /var/lib/rancher/k3s/agent/etc/cni/net.d and
#   /var/lib/rancher/k3s/data/cni (k3s 1.28.15 and later), every reference plugin (k3s ships
#   them); nothing in /etc/cni/net.d or /opt/cni/bin, which must stay empty;
# - kind: kubeadm's directories, but without the bridge plugin (kind's node image ships
#   host-local, loopback, portmap and ptp: kind#1575), which the chart's cni.installPlugins brings.
node_layout_use() {
  node_layout=$1
  case $node_layout in
    kubeadm) cni_conf_dir=/etc/cni/net.d cni_bin_dir=/opt/cni/bin node_plugins=all ;;
    k3s) cni_conf_dir=/var/lib/rancher/k3s/agent/etc/cni/net.d cni_bin_dir=/var/lib/rancher/k3s/data/cni node_plugins=all ;;
    kind) cni_conf_dir=/etc/cni/net.d cni_bin_dir=/opt/cni/bin node_plugins="host-local loopback portmap" ;;
    *) die "unknown node layout '$node_layout' (kubeadm, k3s or kind)" ;;
  esac
}

# node_layout_save / node_layout_load: the layout of the cluster in DIR (DIR/node-layout, which
# the tests read too: the layout's name and its two directories).
node_layout_save() {
  printf 'layout=%s\ncni_conf_dir=%s\ncni_bin_dir=%s\n' "$node_layout" "$cni_conf_dir" "$cni_bin_dir" >"$state/node-layout"
  # The nodes' mount points are made on the host's file system; nodes_down removes this one if
  # it made it (and it is still empty).
  if [ "$node_layout" = k3s ] && [ ! -e /var/lib/rancher ]; then
    echo /var/lib/rancher >"$state/host-dirs-made"
  fi
}
node_layout_load() {
  local layout=kubeadm
  [ -f "$state/node-layout" ] && layout=$(sed -n 's/^layout=//p' "$state/node-layout")
  node_layout_use "$layout"
}

# node_mounts: the node's own directories, bound from its disk (relative to /).
node_mounts() {
  echo "var/lib/kubelet var/lib/containerd var/lib/cni var/log etc/cni/net.d opt/cni/bin"
  [ "$node_layout" = k3s ] && echo "var/lib/rancher"
  return 0
}

node_ip() { echo "10.200.0.$((10 + ${1#node-}))"; }
node_ns() { echo "ipkeep-$1"; }
node_dir() { echo "$state/nodes/$1"; }
node_names() { local d; for d in "$state"/nodes/*/; do [ -d "$d" ] && basename "$d"; done; }

# The cgroup v1 hierarchies the node's cgroup is made in.
cgroup_hierarchies() {
  local h
  for h in /sys/fs/cgroup/*/; do
    h=$(basename "$h")
    case $h in unified) continue ;; esac
    [ -f "/sys/fs/cgroup/$h/cgroup.procs" ] && echo "$h"
  done
}

# runtime_use KIND [DIR]: the node runtime the nodes run. `built`: scripts/runtime-build.sh's
# build in DIR (containerd 2.x, its shim, ctr, runc in DIR/bin; the CNI plugins in DIR/cni);
# `debian`: Debian's containerd, runc and /usr/lib/cni. Sets rt_* and cni_version, the
# cniVersion of the CNI configurations the nodes get (libcni in containerd 1.6 and the plugins
# 1.1 know no 1.1.0).
runtime_use() {
  rt_kind=$1
  case $rt_kind in
    built)
      rt_dir=$2 rt_path=$2/bin: rt_containerd=$2/bin/containerd rt_ctr=$2/bin/ctr rt_runc=$2/bin/runc
      rt_cni=$2/cni cni_version=1.1.0 ;;
    debian)
      rt_dir='' rt_path='' rt_containerd=containerd rt_ctr=ctr rt_runc=runc rt_cni=/usr/lib/cni cni_version=1.0.0 ;;
    *) die "unknown node runtime '$rt_kind' (built or debian)" ;;
  esac
}

# runtime_save / runtime_load: the runtime of the cluster in DIR, for the commands after `up`.
runtime_save() { echo "$rt_kind $rt_dir" >"$state/runtime"; }
runtime_load() {
  local kind=debian dir=''
  [ -f "$state/runtime" ] && read -r kind dir <"$state/runtime"
  runtime_use "$kind" "$dir"
}

# nodes_preflight KIND: what real nodes with that runtime need, before anything is built.
nodes_preflight() {
  [ "$(id -u)" -eq 0 ] || die "real nodes need root (network and mount namespaces, cgroups); use --nodes 0 for a control plane with kwok nodes only"
  local c missing=()
  for c in ip nsenter unshare iptables conntrack busybox gcc; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
  [ ${#missing[@]} -eq 0 ] || die "missing for real nodes: ${missing[*]} (scripts/install-deps.sh installs them)"
  if [ "$1" = debian ]; then
    for c in containerd runc ctr; do
      command -v "$c" >/dev/null || missing+=("$c")
    done
    [ ${#missing[@]} -eq 0 ] || die "--node-runtime debian needs Debian's ${missing[*]}: apt-get install containerd runc"
    for c in bridge host-local loopback portmap; do
      [ -x "/usr/lib/cni/$c" ] || die "/usr/lib/cni/$c is missing (apt-get install containernetworking-plugins)"
    done
  else
    command -v go >/dev/null || die "the node runtime (containerd, runc, CNI plugins) is built from its Go modules: install Go >= 1.26 (https://go.dev/dl), or run Debian's with --node-runtime debian"
    pkg-config --exists libseccomp 2>/dev/null ||
      die "runc's build needs libseccomp's headers and pkg-config: apt-get install libseccomp-dev pkg-config (scripts/install-deps.sh installs them)"
  fi
  [ "$(stat -fc %T /sys/fs/cgroup)" = tmpfs ] || die "real nodes need cgroup v1 (kubelet here runs with failCgroupV1: false and the cgroupfs driver)"
  if ip link show "$underlay" >/dev/null 2>&1; then
    die "another cluster with real nodes is up on this machine (bridge $underlay exists; its state: $(cat /run/ipkeep-nodes.owner 2>/dev/null || echo unknown)); stop it with scripts/cluster.sh down --state DIR"
  fi
}

underlay_up() {
  ip link add "$underlay" type bridge
  ip addr add "$underlay_ip/24" dev "$underlay"
  ip link set "$underlay" up
  sysctl -qw net.ipv4.ip_forward=1
  echo "$state" >/run/ipkeep-nodes.owner
}

# start_in_node NAME NODE CMD...: `start`s CMD (as process NAME) inside NODE's cgroup and
# namespaces.
start_in_node() {
  local name=$1 node=$2; shift 2
  # shellcheck disable=SC2016
  start "$name" bash -c 'for h in $2; do echo $$ >"/sys/fs/cgroup/$h/$3/cgroup.procs"; done; exec nsenter -t "$1" -m -n -- "${@:4}"' \
    _ "$(cat "$state/pids/$node-holder")" "$(cgroup_hierarchies | tr '\n' ' ')" "$cgroup_base/$node" "$@"
}

# node_exec NODE CMD...: runs CMD in NODE's namespaces now (not in its cgroup: for short tools).
node_exec() {
  local node=$1; shift
  nsenter -t "$(cat "$state/pids/$node-holder")" -m -n -- "$@"
}

node_create() {
  local i=$1 node=node-$1 dir ip ns h
  dir=$(node_dir "$node") ip=$(node_ip "$node") ns=$(node_ns "$node")
  say "  $node: namespaces, $ip, cgroup /$cgroup_base/$node"
  mkdir -p "$dir/manifests" "$dir"/root/{var/lib/kubelet,var/lib/containerd,var/lib/cni,var/log,etc/cni/net.d,opt/cni/bin}
  mkdir -p "$dir/root$cni_conf_dir" "$dir/root$cni_bin_dir"
  for c in "$rt_cni"/*; do
    if [ "$node_plugins" = all ] || [[ " $node_plugins " == *" $(basename "$c") "* ]]; then
      ln -sfn "$c" "$dir/root$cni_bin_dir/"
    fi
  done
  ip netns add "$ns"
  ip link add "ipkv-$node" type veth peer name eth0 netns "$ns"
  ip link set "ipkv-$node" master "$underlay" up
  ip -n "$ns" addr add "$ip/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" route add default via "$underlay_ip"
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
  dual_node_net "$node"
  # kube-proxy's Service rules must see bridged pod-to-pod packets (br_netfilter).
  ip netns exec "$ns" sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null ||
    say "  $node: net.bridge.bridge-nf-call-iptables unavailable (Services to a pod on the same node may fail)"
  for h in $(cgroup_hierarchies); do
    mkdir -p "/sys/fs/cgroup/$h/$cgroup_base/$node"
    if [ "$h" = cpuset ]; then
      for f in cpuset.cpus cpuset.mems; do
        cat "/sys/fs/cgroup/cpuset/$f" >"/sys/fs/cgroup/cpuset/$cgroup_base/$f"
        cat "/sys/fs/cgroup/cpuset/$f" >"/sys/fs/cgroup/cpuset/$cgroup_base/$node/$f"
      done
    fi
  done
  node_data_disk "$node"
  node_power_on "$node"
  node_config "$node"
  node_daemons_start "$node"
}

# node_data_disk NODE: with --cni-data-size, the node's /var/lib/cni/ipkeep (ipkeep's stores)
# is a file system of its own of that size, as a dedicated volume would be: a tmpfs mounted in
# the host's namespace, so it outlives node power-offs (like the rest of the node's disk) and a
# test can fill it from the host. Unmounted by nodes_down.
node_data_disk() {
  [ -n "$cni_data_size" ] || return 0
  local d
  d=$(node_dir "$1")/root/var/lib/cni/ipkeep
  mkdir -p "$d"
  mountpoint -q "$d" || mount -t tmpfs -o "size=$cni_data_size,mode=0755" ipkeep-data "$d"
}

# The holder: the node's mount namespace (tmpfs /run, the node's own directories), in its
# network namespace and cgroup. Everything else of the node joins it.
node_power_on() {
  local node=$1 dir ns root
  dir=$(node_dir "$node") ns=$(node_ns "$node") root=$(node_dir "$node")/root
  # shellcheck disable=SC2016
  start "$node-holder" bash -c '
    for h in '"$(cgroup_hierarchies | tr '\n' ' ')"'; do echo $$ >/sys/fs/cgroup/$h/'"$cgroup_base/$node"'/cgroup.procs; done
    exec nsenter --net=/run/netns/'"$ns"' unshare --mount --propagation private bash -c "
      set -e
      mount -t tmpfs -o mode=0755 tmpfs /run
      for d in '"$(node_mounts | tr '\n' ' ')"'; do
        mkdir -p /\$d; mount --rbind '"$root"'/\$d /\$d
      done
      mount --make-rshared /
      echo mounted
      exec sleep infinity"'
  local t=0
  until grep -q mounted "$state/logs/$node-holder.log" 2>/dev/null; do
    alive "$node-holder" || die "$node: could not make its namespaces (log: $state/logs/$node-holder.log)"
    sleep 0.1; t=$((t + 1)); [ $t -lt 100 ] || die "$node: namespaces not ready after 10 s"
  done
  : >"$state/logs/$node-holder.log"
}

node_config() {
  local node=$1 dir ip
  dir=$(node_dir "$node") ip=$(node_ip "$node")
  if [ "$rt_kind" = built ]; then
    containerd_config_v4 >"$dir/containerd.toml"
  else
    containerd_config_v2 >"$dir/containerd.toml"
  fi
  cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 with the cgroupfs driver (containerd 1.6 cannot tell kubelet its driver; 2.x says
# cgroupfs too, through the CRI RuntimeConfig call); the pods'
# cgroups (kubepods/...) under this node's cgroup, so that powering the node off finds them.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cgroupRoot: /$cgroup_base/$node
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $state/pki/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
failSwapOn: false
oomScoreAdj: 0
serializeImagePulls: false
# There is no registry: never collect images (the pause image could not be pulled again).
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
nodeLeaseDurationSeconds: $lease_seconds
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
# Static pods (tests): manifests dropped here run as pods with a mirror Pod in the API.
staticPodPath: $dir/manifests
fileCheckFrequency: 2s
EOF
  kube_proxy_config "$node" "$ip" 127.0.0.1:10256 127.0.0.1:10249 >"$dir/kube-proxy.yaml"
  node_cert "$node"
}

# containerd 2.3's configuration, version 4 (containerd 2.3 migrates version 3 to it at every
# start): the CRI plugin split into cri.v1.images and cri.v1.runtime, the sandbox image among the
# pinned images, bin_dirs, the socket under the grpc server plugin. (containerd 2.3 always
# imports /etc/containerd/conf.d/*.toml too: the host's, none here.) With the built runc. Without CAP_SYS_RESOURCE no
# process may lower oom_score_adj; containerd would ask runc to.
containerd_config_v4() {
  cat <<EOF
version = 4
root = "/var/lib/containerd"
state = "/run/containerd"
[plugins.'io.containerd.server.v1.grpc']
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "/run/containerd/containerd.sock.ttrpc"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "localhost/ipkeep/pause:$image_tag"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$rt_runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$cni_bin_dir"]
    conf_dir = "$cni_conf_dir"
    max_conf_num = 1
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
}

# Debian's containerd 1.6: configuration version 2, Debian's runc.
containerd_config_v2() {
  cat <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/ipkeep/pause:$image_tag"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # Without CAP_SYS_RESOURCE no process may lower oom_score_adj; containerd would ask runc to.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$cni_bin_dir"
    conf_dir = "$cni_conf_dir"
    max_conf_num = 1
EOF
}

node_cert() {
  local node=$1 d=$state/pki
  cert "kubelet-$node" "/O=system:nodes/CN=system:node:$node"
  kubeconfig "$(node_dir "$node")/kubelet.kubeconfig" cert "kubelet-$node"
}

node_daemons_start() {
  local node=$1 dir ip zone
  dir=$(node_dir "$node") ip=$(node_ip "$node") zone=zone-${node#node-}
  # PATH: containerd starts the first shim on it, the one built with it.
  alive "$node-containerd" || start_in_node "$node-containerd" "$node" env PATH="$rt_path$PATH" \
    "$rt_containerd" --config "$dir/containerd.toml"
  wait_for "$node: containerd" 30 "$node-containerd" node_exec "$node" "$rt_ctr" -a /run/containerd/containerd.sock version
  local f
  for f in "$state"/images/*.tar; do
    node_exec "$node" "$rt_ctr" -a /run/containerd/containerd.sock -n k8s.io images import "$f" >/dev/null ||
      die "$node: importing $f into containerd failed"
  done
  # IPKEEP_KUBELET_V=4 logs every pod worker sync (tracing what a pod change costs the kubelet).
  alive "$node-kubelet" || start_in_node "$node-kubelet" "$node" "$bin/kubelet" --config="$dir/kubelet.yaml" \
    --kubeconfig="$dir/kubelet.kubeconfig" --hostname-override="$node" --node-ip="$(node_ips "$node")" \
    --node-labels="topology.kubernetes.io/zone=$zone,ipkeep.dev/test-node=real" \
    ${IPKEEP_KUBELET_V:+"--v=$IPKEEP_KUBELET_V"}
  if ! alive "$node-kube-proxy"; then
    start_in_node "$node-kube-proxy" "$node" "$bin/kube-proxy" --config="$dir/kube-proxy.yaml"
  fi
}

nodes_up() {
  local n=$1 i
  say "starting $n real nodes (containerd, kubelet, kube-proxy each)"
  for ((i = 0; i < n; i++)); do
    node_create "$i"
  done
  for ((i = 0; i < n; i++)); do
    wait_for "node-$i registered with a pod CIDR" 90 "node-$i-kubelet" node_route "node-$i"
    if flannel_enabled; then flannel_node_start "node-$i"; fi
  done
}

# The host runs kube-proxy too (as a control-plane node would), so that kube-apiserver and
# kube-scheduler reach Services (the webhook, the extender) by their cluster IPs. It waits 30 s
# for a Node of its name, which the host is not, before it writes any rule: start it early, and
# wait for its first sync (host_proxy_synced) only when a Service is needed.
host_proxy_start() {
  cert kube-proxy "/CN=system:kube-proxy"
  kubeconfig "$state/kube-proxy.kubeconfig" cert kube-proxy
  kube_proxy_config control-plane "$underlay_ip" "127.0.0.1:$p_proxy_health" "127.0.0.1:$p_proxy_metrics" >"$state/kube-proxy-host.yaml"
  start kube-proxy-host "$bin/kube-proxy" --config="$state/kube-proxy-host.yaml"
}

host_proxy_synced() {
  curl -fsS "http://127.0.0.1:$p_proxy_metrics/metrics" |
    grep -Eq '^kubeproxy_sync_proxy_rules_last_timestamp_seconds\{ip_family="IPv4"\} [1-9]'
}

# kube_proxy_config HOSTNAME IP HEALTHZ METRICS: iptables mode; conntrack sysctls left alone
# (they are not all writable inside a network namespace). The IP is the machine's own: without
# it kube-proxy waits 30 s for a Node to read it from (the host has none).
kube_proxy_config() {
  cat <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $state/kube-proxy.kubeconfig}
hostnameOverride: $1
bindAddress: $2
mode: iptables
clusterCIDR: $pod_cidrs
healthzBindAddress: $3
metricsBindAddress: $4
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

# node_route NODE: routes NODE's pod CIDR to it once kube-controller-manager assigned one.
# A node registered again may have another CIDR: the route to its old one goes.
node_route() {
  local cidr old
  cidr=$("${kubectl[@]}" get node "$1" -o jsonpath='{.spec.podCIDR}' 2>/dev/null) || return 1
  [ -n "$cidr" ] || return 1
  old=$(cat "$(node_dir "$1")/pod-cidr" 2>/dev/null || true)
  [ -n "$old" ] && [ "$old" != "$cidr" ] && ip route del "$old" 2>/dev/null
  ip route replace "$cidr" via "$(node_ip "$1")"
  echo "$cidr" >"$(node_dir "$1")/pod-cidr"
  dual_node_route "$1"
}

# The CNI configuration of the baseline (--without-ipkeep): the runtime's bridge with host-local,
# the node's pod CIDR, what a cluster without ipkeep would run.
nodes_host_local_conf() {
  local node
  for node in $(node_names); do
    cat >"$(node_dir "$node")/root$cni_conf_dir/10-host-local.conflist" <<EOF
{"cniVersion": "$cni_version", "name": "k8s-pod-network", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": $(host_local_ipam "$node")},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  done
}

real_nodes_ready() {
  local want=$1 n
  n=$("${kubectl[@]}" get nodes -l ipkeep.dev/test-node=real -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True || true)
  [ "$n" -ge "$want" ]
}

# node_stop NODE: stops its kubelet and containerd; pods (and their shims) keep running.
node_stop() {
  local node=$1 p
  for p in kubelet containerd; do
    stop_one "$node-$p"
  done
  say "$node: kubelet and containerd stopped (pods keep running)"
}

# node_start NODE: starts its containerd and kubelet; a node that was powered off is powered on
# first (a fresh /run, as after a reboot: the runtime's state is gone, its disk is not).
node_start() {
  local node=$1
  if ! alive "$node-holder"; then
    node_power_on "$node"
    say "$node: powered on"
  fi
  node_daemons_start "$node"
  wait_for "$node registered with a pod CIDR" 120 "$node-kubelet" node_route "$node"
  if flannel_enabled; then flannel_node_start "$node"; fi
  say "$node: containerd and kubelet started"
}

# node_kill NODE: powers the node off: every process in its cgroup (daemons, shims, pods, the
# holder) is killed, its /run goes with its mount namespace; its disk directories stay.
node_kill() {
  local node=$1 h=/sys/fs/cgroup/pids/$cgroup_base/$1 round pids
  [ -d "$h" ] || return 0
  for round in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(find "$h" -name cgroup.procs -exec cat {} + 2>/dev/null)
    [ -n "$pids" ] || break
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  done
  rm -f "$state/pids/$node-"{holder,containerd,kubelet,kube-proxy,flanneld}
}

# nodes_down: powers every node off and removes what the nodes added to the machine.
nodes_down() {
  local node h cidr
  for node in $(node_names); do
    node_kill "$node"
    mountpoint -q "$(node_dir "$node")/root/var/lib/cni/ipkeep" &&
      umount "$(node_dir "$node")/root/var/lib/cni/ipkeep"
    cidr=$(cat "$(node_dir "$node")/pod-cidr" 2>/dev/null) && ip route del "$cidr" 2>/dev/null
    dual_node_route_del "$node"
    ip netns del "$(node_ns "$node")" 2>/dev/null || true
    # The namespace can outlive its processes for a while; its end of the link must go now.
    ip link del "ipkv-$node" 2>/dev/null || true
    for h in $(cgroup_hierarchies); do
      [ -d "/sys/fs/cgroup/$h/$cgroup_base/$node" ] &&
        find "/sys/fs/cgroup/$h/$cgroup_base/$node" -depth -type d -exec rmdir {} + 2>/dev/null
    done
  done
  for h in $(cgroup_hierarchies); do rmdir "/sys/fs/cgroup/$h/$cgroup_base" 2>/dev/null || true; done
  if [ -f "$state/host-dirs-made" ]; then
    xargs -r rmdir <"$state/host-dirs-made" 2>/dev/null || true
  fi
  if [ -f "$state/pids/kube-proxy-host" ]; then
    stop_one kube-proxy-host
    [ -x "$bin/kube-proxy" ] && "$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
    # kube-proxy's --cleanup leaves the chain that blocks martian loopback traffic.
    while iptables -D INPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    while iptables -D OUTPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    iptables -F KUBE-FIREWALL 2>/dev/null && iptables -X KUBE-FIREWALL 2>/dev/null || true
  fi
  if [ "$(cat /run/ipkeep-nodes.owner 2>/dev/null)" = "$state" ]; then
    ip link del "$underlay" 2>/dev/null || true
    dual_underlay_down
    rm -f /run/ipkeep-nodes.owner
  fi
}
