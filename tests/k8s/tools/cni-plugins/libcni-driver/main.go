// libcni-driver runs one CNI operation through libcni, the library container runtimes link
// (containerd 2.x through go-cni, CRI-O through ocicni), so that ipkeep's tests see a plugin
// chain called exactly as a runtime calls it: the result cache, GC's DELs of stale cached
// attachments and its cni.dev/valid-attachments, STATUS. cnitool cannot pass valid attachments
// (its gc passes none), hence this program.
//
//	libcni-driver add|del|check NETWORK NETNS CONTAINER-ID [IFNAME]
//	libcni-driver gc NETWORK [CONTAINER-ID/IFNAME ...]   (the valid attachments)
//	libcni-driver status NETWORK
//
// Environment: NETCONFPATH (configuration directory, default /etc/cni/net.d), CNI_PATH (plugin
// directories, ':'-separated), CNI_CACHE_DIR (libcni's cache, default its own), CNI_ARGS
// (K=V;K=V), CAP_ARGS (JSON object of capability arguments). ADD prints the result; a failed
// operation prints libcni's error on stderr and exits 1.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "libcni-driver:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("usage: libcni-driver add|del|check|gc|status NETWORK ...")
	}
	op, network := args[0], args[1]
	confDir := envOr("NETCONFPATH", "/etc/cni/net.d")
	list, err := libcni.LoadNetworkConf(confDir, network)
	if err != nil {
		return fmt.Errorf("network %q in %s: %w", network, confDir, err)
	}
	cni := libcni.NewCNIConfigWithCacheDir(filepath.SplitList(os.Getenv("CNI_PATH")), os.Getenv("CNI_CACHE_DIR"), nil)
	ctx := context.Background()
	switch op {
	case "status":
		return cni.GetStatusNetworkList(ctx, list)
	case "gc":
		valid := []types.GCAttachment{}
		for _, a := range args[2:] {
			id, ifname, ok := strings.Cut(a, "/")
			if !ok {
				return fmt.Errorf("a valid attachment is CONTAINER-ID/IFNAME, got %q", a)
			}
			valid = append(valid, types.GCAttachment{ContainerID: id, IfName: ifname})
		}
		return cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: valid})
	case "add", "del", "check":
		if len(args) < 4 {
			return fmt.Errorf("usage: libcni-driver %s NETWORK NETNS CONTAINER-ID [IFNAME]", op)
		}
		rt, err := runtimeConf(args[2], args[3], args[4:])
		if err != nil {
			return err
		}
		switch op {
		case "add":
			result, err := cni.AddNetworkList(ctx, list, rt)
			if err != nil {
				return err
			}
			return result.Print()
		case "del":
			return cni.DelNetworkList(ctx, list, rt)
		default:
			return cni.CheckNetworkList(ctx, list, rt)
		}
	}
	return fmt.Errorf("unknown operation %q (add, del, check, gc, status)", op)
}

func runtimeConf(netns, id string, rest []string) (*libcni.RuntimeConf, error) {
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: netns, IfName: "eth0"}
	if len(rest) > 0 {
		rt.IfName = rest[0]
	}
	if s := os.Getenv("CNI_ARGS"); s != "" {
		for _, pair := range strings.Split(s, ";") {
			k, v, ok := strings.Cut(pair, "=")
			if !ok {
				return nil, fmt.Errorf("CNI_ARGS: %q is not K=V", pair)
			}
			rt.Args = append(rt.Args, [2]string{k, v})
		}
	}
	if s := os.Getenv("CAP_ARGS"); s != "" {
		if err := json.Unmarshal([]byte(s), &rt.CapabilityArgs); err != nil {
			return nil, fmt.Errorf("CAP_ARGS is not a JSON object: %w", err)
		}
	}
	return rt, nil
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
