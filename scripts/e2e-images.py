#!/usr/bin/env python3
"""Builds the images Kubernetes' conformance tests run (scripts/conformance.sh), as OCI image-layout
tarballs under the exact names the tests pull, since the test cluster's nodes have no registry.

  scripts/e2e-images.py --agnhost PATH --agnhost-src DIR --out DIR REFERENCE...

Writes DIR/<n>.tar per reference and prints `<file> <reference>` per image. A reference is what
`e2e.test --list-images` names; which image is built depends on its repository name:

  .../agnhost:TAG  agnhost built from k8s.io/kubernetes of the cluster's release (scripts/e2e-build.sh;
                   statically linked) with what its upstream Dockerfile adds that the chosen tests
                   use: the porter's localhost.crt and localhost.key in / (the StatefulSet tests'
                   readiness probe fetches /localhost.crt), /agnhost-2, /uploads, the user 1000 and
                   group 50000, ENTRYPOINT /agnhost and CMD pause. Upstream's base is Alpine with
                   curl, netcat-openbsd and more; here the coreutils the tests exec (mv,
                   test, dd, ...) are busybox, and /bin/sh (dash), curl and nc (netcat-openbsd: the
                   node-pod UDP checks run `nc -w 1 -u`) are the host's Debian binaries with their
                   libraries.
                   Every agnhost tag gets this same build (the tests' previous agnhost, 2.55 in
                   v1.37, is a name the rolling-update tests switch from, not a different program).
  .../busybox:TAG  busybox with every applet (scripts/images.py's workload image).
  .../pause:TAG    tests/images/pause.c, statically linked (scripts/images.py's pause image).

Any other reference is an error naming it: add a builder here before running a test that needs it.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import images  # noqa: E402  (scripts/images.py: the layer and OCI writers)

NC = "/usr/bin/nc.openbsd"
CURL = "/usr/bin/curl"
DASH = "/bin/dash"


def agnhost_image(agnhost, src):
    layer = images.Layer()
    layer.copy(agnhost, "/agnhost", 0o755)
    layer.symlink("agnhost", "/agnhost-2")
    for name in ("localhost.crt", "localhost.key"):
        layer.copy(os.path.join(src, "porter", name), "/" + name, 0o644)
    images.add_busybox(layer)
    tools = [CURL, NC, DASH]
    for path in tools:
        if not os.access(path, os.X_OK):
            images.die(f"{path} is missing (apt-get install curl netcat-openbsd dash; scripts/install-deps.sh)")
    # busybox's own nc has no -u; netcat-openbsd replaces it wherever busybox put it.
    for entry in [p for p in layer.entries if os.path.basename(p) == "nc"]:
        del layer.entries[entry]
    layer.copy(CURL, "/usr/bin/curl", 0o755)
    layer.copy(NC, "/usr/bin/nc", 0o755)
    # Debian's busybox runs its own applet for a command it has one for, whatever PATH says
    # (FEATURE_SH_STANDALONE, through /proc/self/exe), so under busybox's sh `nc` would still be
    # busybox's: /bin/sh is dash, which looks commands up in PATH.
    layer.copy(DASH, "/bin/sh", 0o755)
    for lib in images.shared_libraries(tools):
        layer.copy(os.path.realpath(lib), lib, 0o755)
    certs = "/etc/ssl/certs/ca-certificates.crt"
    if os.path.exists(certs):
        layer.copy(certs, certs, 0o644)
    layer.file("/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"
               b"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n")
    layer.file("/etc/group", b"root:x:0:\nuser-defined-in-image:x:1000:\n"
               b"group-defined-in-image:x:50000:user-defined-in-image\n")
    for d in ("/uploads", "/root", "/proc", "/sys", "/dev"):
        layer.dir(d)
    layer.dir("/tmp", 0o1777)
    return layer, {"Entrypoint": ["/agnhost"], "Cmd": ["pause"], "Env": [images.PATH_ENV],
                   "ExposedPorts": {f"{p}/tcp": {} for p in (80, 8080, 8081, 9376, 5000)}}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agnhost", required=True, help="the agnhost binary (scripts/e2e-build.sh)")
    p.add_argument("--agnhost-src", required=True,
                   help="k8s.io/kubernetes/test/images/agnhost in the module cache (its porter certificates)")
    p.add_argument("--out", required=True, help="directory for the tarballs")
    p.add_argument("refs", nargs="+", help="image references, as e2e.test --list-images prints them")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for i, ref in enumerate(a.refs):
            repo = ref.rsplit(":", 1)[0].rsplit("/", 1)[-1]
            if repo == "agnhost":
                layer, config = agnhost_image(a.agnhost, a.agnhost_src)
            elif repo == "busybox":
                layer, config = images.busybox_image()
            elif repo == "pause":
                layer, config = images.pause_image(work)
            else:
                images.die(f"no builder for {ref} (scripts/e2e-images.py builds agnhost, busybox and pause)")
            path = os.path.join(a.out, f"{i}-{repo}.tar")
            images.write_image(path, ref, layer, config)
            print(f"{path} {ref}")


if __name__ == "__main__":
    main()
