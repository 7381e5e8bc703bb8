#!/usr/bin/env python3
"""Builds the container images the test cluster's real nodes run, as OCI image-layout tarballs,
without a registry or a Docker daemon (scripts/cluster.sh imports them into each node's
containerd, in scripts/lib/nodes.sh).

  scripts/images.py --release-dir target/release --plugin PATH --cni-plugins DIR --out DIR
                    [--tag TAG] [--only NAME,...] [--ipkeep-ref REF] [--label KEY=VALUE ...]

Writes DIR/<name>.tar for three images (or those --only names) and prints one line per image:
`<file> <reference> <manifest digest>`.

  localhost/ipkeep/ipkeep:TAG   what the repository's Dockerfile builds: the release binaries it
                                names and the static plugin (scripts/build-plugin.sh) in
                                /usr/local/bin, the reference CNI plugins of its plugin stage
                                (bridge, portmap, loopback: --cni-plugins, the directory
                                scripts/runtime-build.sh builds them into, at the version the
                                Dockerfile names) in /opt/cni/bin, all read from the
                                Dockerfile, so the two cannot drift apart; the C library the
                                binaries link against, /bin/sh and the tools the manifests'
                                commands use (busybox), the user 65532 and the Dockerfile's
                                USER and CMD. --ipkeep-ref names it otherwise
                                (scripts/release-bundle.sh: ghcr.io/ipkeep/ipkeep:VERSION, the
                                chart's default); --label adds OCI labels to its config.
  localhost/ipkeep/busybox:TAG  a workload image: busybox with every applet (sh, sleep, ping, ip,
                                nc, wget, ...).
  localhost/ipkeep/pause:TAG    the pod sandbox image: tests/images/pause.c, statically linked.

Each image is one deterministic layer (sorted entries, owner root, mtime 0), so the same inputs
give the same digest. Only the standard library is used.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUSYBOX = "/bin/busybox"


def die(msg):
    sys.exit(f"images: error: {msg}")


class Layer:
    """The files of one image layer, by path inside the image."""

    def __init__(self):
        self.entries = {}  # path -> (kind, data, mode)

    def _parents(self, path):
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.entries.setdefault("/".join(parts[:i]), ("dir", None, 0o755))

    def dir(self, path, mode=0o755):
        self._parents(path)
        self.entries[path.strip("/")] = ("dir", None, mode)

    def file(self, path, data, mode=0o644):
        self._parents(path)
        self.entries[path.strip("/")] = ("file", data, mode)

    def copy(self, src, path, mode=None):
        with open(src, "rb") as f:
            data = f.read()
        self.file(path, data, mode if mode is not None else os.stat(src).st_mode & 0o777)

    def symlink(self, target, path):
        self._parents(path)
        self.entries[path.strip("/")] = ("symlink", target, 0o777)

    def tar(self):
        """The layer as an uncompressed tar, entries sorted, owner root, mtime 0."""
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
            for path in sorted(self.entries):
                kind, data, mode = self.entries[path]
                info = tarfile.TarInfo(path)
                info.mode, info.mtime, info.uid, info.gid = mode, 0, 0, 0
                info.uname = info.gname = "root"
                if kind == "dir":
                    info.type = tarfile.DIRTYPE
                    t.addfile(info)
                elif kind == "symlink":
                    info.type, info.linkname = tarfile.SYMTYPE, data
                    t.addfile(info)
                else:
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
        return out.getvalue()


def blob(blobs, data):
    digest = hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return f"sha256:{digest}", len(data)


def write_image(path, ref, layer, config):
    """Writes an OCI image-layout tarball holding one image named `ref`."""
    raw = layer.tar()
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=6) as g:
        g.write(raw)
    blobs = {}
    layer_digest, layer_size = blob(blobs, gz.getvalue())
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
        "history": [{"created_by": "scripts/images.py"}],
    }
    config_digest, config_size = blob(blobs, json.dumps(image_config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest, "size": layer_size}],
    }
    manifest_digest, manifest_size = blob(blobs, json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_size,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": ref,
                            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]},
        }],
    }
    top = Layer()
    top.file("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
    top.file("index.json", json.dumps(index, sort_keys=True).encode())
    for digest, data in blobs.items():
        top.file(f"blobs/sha256/{digest}", data)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(top.tar())
    os.replace(tmp, path)
    return manifest_digest


def add_busybox(layer, applets=None):
    """/bin/busybox and a symlink per applet (all of them, or those named)."""
    if not os.access(BUSYBOX, os.X_OK):
        die(f"{BUSYBOX} is missing (apt-get install busybox-static)")
    out = subprocess.run([BUSYBOX, "--list-full"], capture_output=True, text=True, check=True)
    layer.copy(BUSYBOX, BUSYBOX, 0o755)
    for full in out.stdout.split():
        if applets is None or os.path.basename(full) in applets:
            if "/" + full != BUSYBOX:
                layer.symlink(BUSYBOX, "/" + full)


def shared_libraries(binaries):
    """The shared libraries (and the dynamic loader) the binaries load, as absolute paths."""
    libs = set()
    for b in binaries:
        out = subprocess.run(["ldd", b], capture_output=True, text=True)
        if out.returncode != 0:
            continue  # statically linked
        for line in out.stdout.splitlines():
            m = re.search(r"(/\S+)", line.split("=>")[-1])
            if m and os.path.exists(m.group(1)):
                libs.add(m.group(1))
    return sorted(libs)


def dockerfile():
    """What the Dockerfile's image holds: its binaries from target/release, whether it adds the
    static plugin (scripts/build-plugin.sh) as /usr/local/bin/ipkeep, the reference CNI plugins
    of its plugin stage and their version, its USER and CMD."""
    text = open(os.path.join(REPO, "Dockerfile")).read()
    m = re.search(r"for bin in ([\w\s-]+?); do", text)
    plugin = '"$(scripts/build-plugin.sh)" /out/ipkeep' in text
    user = re.search(r"^USER\s+(\S+)", text, re.M)
    cmd = re.search(r"^CMD\s+(\[.*\])", text, re.M)
    if not (m and user and cmd):
        die("the Dockerfile no longer has the `for bin in ...; do`, USER and CMD lines read here")
    cni = re.findall(r"containernetworking/plugins/plugins/\w+/(\w+)@\$\{CNI_PLUGINS_VERSION\}", text)
    version = re.search(r"^ARG CNI_PLUGINS_VERSION=(\S+)", text, re.M)
    if cni and not (version and "COPY --from=cni-plugins /out/ /opt/cni/bin/" in text):
        die("the Dockerfile's plugin stage no longer has the ARG CNI_PLUGINS_VERSION and COPY lines read here")
    return (m.group(1).split(), plugin, cni, version.group(1) if version else None,
            user.group(1), json.loads(cmd.group(1)))


def cni_plugin_version(path):
    """The version a reference CNI plugin prints when run without CNI_COMMAND."""
    out = subprocess.run([path], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    m = re.search(r"\bv\d+\.\d+\.\d+\S*", out.stdout + out.stderr)
    return m.group(0) if m else None


def ipkeep_image(release_dir, plugin_path, cni_dir, labels):
    binaries, static_plugin, cni, cni_version, user, cmd = dockerfile()
    layer = Layer()
    paths = []
    sources = [(name, os.path.join(release_dir, name)) for name in binaries]
    if static_plugin:
        if not plugin_path:
            die("the Dockerfile adds the static plugin: pass --plugin (scripts/build-plugin.sh prints it)")
        sources.append(("ipkeep", plugin_path))
    for name, src in sources:
        if not os.access(src, os.X_OK):
            die(f"{src} is missing: build it first (cargo build --release; scripts/build-plugin.sh)")
        layer.copy(src, f"/usr/local/bin/{name}", 0o755)
        paths.append(src)
    if cni and not cni_dir:
        die("the Dockerfile adds the reference CNI plugins: pass --cni-plugins (scripts/runtime-build.sh --print-dir, then /cni)")
    for name in cni:
        src = os.path.join(cni_dir, name)
        if not os.access(src, os.X_OK):
            die(f"{src} is missing: scripts/runtime-build.sh builds the reference CNI plugins")
        got = cni_plugin_version(src)
        if got != cni_version:
            die(f"{src} is {got or 'of no version it tells'}; the Dockerfile's plugin stage builds {cni_version} "
                "(tests/k8s/tools/cni-plugins/go.mod and the Dockerfile's CNI_PLUGINS_VERSION must agree)")
        layer.copy(src, f"/opt/cni/bin/{name}", 0o755)
    # The chart's `helm test` pod runs bash (its /dev/tcp), as the Dockerfile's Debian base has it.
    bash = shutil.which("bash") or die("bash is missing")
    layer.copy(bash, "/bin/bash", 0o755)
    for lib in shared_libraries(paths + [bash]):
        layer.copy(os.path.realpath(lib), lib, 0o755)
    # The agent's init container runs sh, cp, chmod and mv; the scheduler extension's preStop
    # hook runs sleep; the `helm test` pod seq and timeout (coreutils in the Debian base).
    add_busybox(layer, {"sh", "cp", "chmod", "mv", "sleep", "cat", "ls", "rm", "mkdir", "seq",
                        "timeout"})
    layer.file("/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"
               b"nonroot:x:65532:65532:nonroot:/nonexistent:/usr/sbin/nologin\n")
    layer.file("/etc/group", b"root:x:0:\nnonroot:x:65532:\n")
    certs = "/etc/ssl/certs/ca-certificates.crt"
    if os.path.exists(certs):
        layer.copy(certs, certs, 0o644)
    layer.dir("/tmp", 0o1777)
    config = {"User": user, "Cmd": cmd, "Env": [PATH_ENV]}
    if labels:
        config["Labels"] = labels
    return layer, config


def busybox_image():
    layer = Layer()
    add_busybox(layer)
    layer.file("/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    layer.file("/etc/group", b"root:x:0:\n")
    layer.dir("/tmp", 0o1777)
    for d in ("/root", "/proc", "/sys", "/dev", "/etc"):
        layer.dir(d)
    return layer, {"Cmd": ["sh"], "Env": [PATH_ENV]}


def pause_image(work):
    if shutil.which("gcc") is None:
        die("gcc is not installed (apt-get install gcc): it builds the pause program")
    out = os.path.join(work, "pause")
    src = os.path.join(REPO, "tests/images/pause.c")
    subprocess.run(["gcc", "-static", "-Os", "-s", "-o", out, src], check=True)
    layer = Layer()
    layer.copy(out, "/pause", 0o755)
    return layer, {"Entrypoint": ["/pause"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--release-dir", help="where the release binaries are (for the ipkeep image)")
    p.add_argument("--plugin", help="the static ipkeep plugin (scripts/build-plugin.sh prints its path)")
    p.add_argument("--cni-plugins", help="the reference CNI plugins' directory (scripts/runtime-build.sh's DIR/cni)")
    p.add_argument("--out", required=True, help="directory for the tarballs")
    p.add_argument("--tag", default="dev", help="the images' tag (default: dev)")
    p.add_argument("--only", default="ipkeep,busybox,pause", help="the images to build (comma-separated)")
    p.add_argument("--ipkeep-ref", help="the ipkeep image's reference (default: localhost/ipkeep/ipkeep:TAG)")
    p.add_argument("--label", action="append", default=[], help="KEY=VALUE, an OCI label of the ipkeep image")
    a = p.parse_args()
    only = [n for n in a.only.split(",") if n]
    unknown = sorted(set(only) - {"ipkeep", "busybox", "pause"})
    if unknown:
        die(f"--only: no image {', '.join(unknown)} (ipkeep, busybox, pause)")
    if "ipkeep" in only and not a.release_dir:
        die("the ipkeep image needs --release-dir (where cargo build --release put the binaries)")
    labels = dict(kv.split("=", 1) for kv in a.label if "=" in kv)
    if len(labels) != len(a.label):
        die("--label takes KEY=VALUE")
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        build = {"ipkeep": lambda: ipkeep_image(a.release_dir, a.plugin, a.cni_plugins, labels),
                 "busybox": busybox_image, "pause": lambda: pause_image(work)}
        images = [(name, build[name]()) for name in ("ipkeep", "busybox", "pause") if name in only]
        for name, (layer, config) in images:
            ref = f"localhost/ipkeep/{name}:{a.tag}"
            if name == "ipkeep" and a.ipkeep_ref:
                ref = a.ipkeep_ref
            path = os.path.join(a.out, f"{name}.tar")
            digest = write_image(path, ref, layer, config)
            print(f"{path} {ref} {digest}")


if __name__ == "__main__":
    main()
