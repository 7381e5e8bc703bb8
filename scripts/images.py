#!/usr/bin/env python3
"""Builds the container images the test cluster's real nodes run, as OCI image-layout tarballs,
without a registry or a Docker daemon (scripts/cluster.sh imports them into each node's
containerd, in scripts/lib/nodes.sh).

  scripts/images.py --release-dir target/release --plugin PATH --out DIR [--tag TAG]

Writes DIR/<name>.tar for three images and prints one line per image: `<file> <reference>`.

  localhost/ipkeep/ipkeep:TAG   what the repository's Dockerfile builds: the release binaries it
                                names and the static plugin (scripts/build-plugin.sh; read from
                                the Dockerfile, so the two cannot drift apart) in /usr/local/bin, the C library they link against, /bin/sh and
                                the tools the manifests' commands use (busybox), the user 65532
                                and the Dockerfile's USER and CMD.
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
    static plugin (scripts/build-plugin.sh) as /usr/local/bin/ipkeep, its USER and CMD."""
    text = open(os.path.join(REPO, "Dockerfile")).read()
    m = re.search(r"for bin in ([\w\s-]+?); do", text)
    plugin = '"$(scripts/build-plugin.sh)" /out/ipkeep' in text
    user = re.search(r"^USER\s+(\S+)", text, re.M)
    cmd = re.search(r"^CMD\s+(\[.*\])", text, re.M)
    if not (m and user and cmd):
        die("the Dockerfile no longer has the `for bin in ...; do`, USER and CMD lines read here")
    return m.group(1).split(), plugin, user.group(1), json.loads(cmd.group(1))


def ipkeep_image(release_dir, plugin_path):
    binaries, static_plugin, user, cmd = dockerfile()
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
    return layer, {"User": user, "Cmd": cmd, "Env": [PATH_ENV]}


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
    p.add_argument("--release-dir", required=True, help="where the release binaries are")
    p.add_argument("--plugin", help="the static ipkeep plugin (scripts/build-plugin.sh prints its path)")
    p.add_argument("--out", required=True, help="directory for the tarballs")
    p.add_argument("--tag", default="dev", help="the images' tag (default: dev)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        images = [("ipkeep", ipkeep_image(a.release_dir, a.plugin)), ("busybox", busybox_image()),
                  ("pause", pause_image(work))]
        for name, (layer, config) in images:
            ref = f"localhost/ipkeep/{name}:{a.tag}"
            path = os.path.join(a.out, f"{name}.tar")
            write_image(path, ref, layer, config)
            print(f"{path} {ref}")


if __name__ == "__main__":
    main()
