"""The serving image with podman: ``python -m switchboard.ops.image {base,build,smoke}``.

``base`` makes the Dockerfile's ``FROM debian:12-slim`` from Debian's own packages (debootstrap,
imported as ``localhost/debian:12-slim``) when no registry can be pulled from; ``build`` builds
deploy/Dockerfile into ``switchboard`` (RUN steps in a chroot: the default isolation cannot set
cgroups on every host); ``smoke`` starts the image as deploy/k8s starts it (the supervisor with
the Deployment's arguments, the gateway as a second container of the same image), waits for
``/readyz``, asks one chat through the gateway and, when the image holds a recognizer, one
transcription, then stops both with SIGTERM as the kubelet does and checks they exited 0 and left
no container behind. The containers see no host path: a read-only root, ``/tmp`` in memory, and
at most a named volume for ONNX Runtime's prepared weights (``--cache-volume``). Redis is the
host's redis-server on a free port (in a cluster it is its own pod). docs/kubernetes.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from switchboard import paths

IMAGE = "switchboard"
BASE = "localhost/debian:12-slim"
# runc with the cgroupfs manager and limits no higher than the host's: what podman needs on hosts
# with hybrid cgroups and a capped RLIMIT_NOFILE (crun and the defaults refuse both there).
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000"]
# Where the pools keep ONNX Runtime's prepared weights (switchboard.runtime.onnx.weights_cache).
WEIGHTS_CACHE = "/tmp/weights"  # deploy/k8s/switchboard.yaml's SWITCHBOARD_WEIGHTS_CACHE: the root is read-only
WEIGHTS_VOLUME = "/var/cache/switchboard/weights"  # where --cache-volume mounts
SMOKE_LABEL = "switchboard.smoke"
SPOKEN = "What time does the library open?"  # the smoke's chat, and its spoken question


def podman(*args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([*PODMAN, *args], check=check, text=True, capture_output=capture)


def image_exists(name: str) -> bool:
    return shutil.which("podman") is not None and podman("image", "exists", name, check=False).returncode == 0


def image_size_mb(name: str) -> float:
    size = podman("image", "inspect", "--format", "{{.Size}}", name).stdout.strip()
    return int(size) / 1e6


def make_base(name: str = BASE) -> None:
    """``name`` from a minimal Debian 12 root filesystem, unless it exists (kept: a cache)."""
    if image_exists(name):
        print(f"[image] base {name}: present")
        return
    if shutil.which("debootstrap") is None:
        raise SystemExit(
            "[image] no base image and no debootstrap: apt-get install -y debootstrap (or pull debian:12-slim)"
        )
    with tempfile.TemporaryDirectory(prefix="switchboard-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        print(f"[image] base {name}: debootstrap --variant=minbase bookworm ({root})")
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(root)], check=True, capture_output=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run([*PODMAN, "import", "-", name], stdin=tar.stdout, check=True, capture_output=True)
        if tar.wait() != 0:
            raise SystemExit(f"[image] tar of {root} failed")


PIP_CONFIGS = ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", "~/.config/pip/pip.conf", "~/.pip/pip.conf")


def host_pip_mounts(
    pip_conf: Path = Path("/etc/pip.conf"), out: Path = paths.BUILD / "image" / "pip.conf"
) -> list[str]:
    """``-v`` options giving the build's RUN steps this host's pip setup: its CA bundle (for a
    TLS-inspecting proxy), and the local directories and file:// indexes its pip.conf names. The
    mounts are not part of any layer: the image is what a plain build makes."""
    import configparser
    import os

    cfg = configparser.ConfigParser()
    cfg.read([Path(c).expanduser() for c in PIP_CONFIGS])  # later files win, as in pip
    g = dict(cfg["global"]) if cfg.has_section("global") else {}
    g.update({k[4:].lower().replace("_", "-"): v for k, v in os.environ.items() if k.startswith("PIP_")})
    ca = Path(os.environ.get("PIP_CERT") or g.get("cert") or "/etc/ssl/certs/ca-certificates.crt")
    mounts = ["-v", f"{ca}:/run/host-pip/ca.crt:ro"]
    lines = ["[global]", "cert = /run/host-pip/ca.crt"]
    for key in ("find-links", "extra-index-url", "index-url"):
        if key in g:
            lines.append(f"{key} = {g[key]}")
            for word in g[key].split():
                local = Path(word.removeprefix("file://"))
                if word.startswith(("/", "file://")) and local.exists():
                    top = Path("/", *local.parts[1:3])  # /opt/pypi/simple -> /opt/pypi
                    if f"{top}:{top}:ro" not in mounts:
                        mounts += ["-v", f"{top}:{top}:ro"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return mounts + ["-v", f"{out}:/etc/pip.conf:ro"]


def build_command(tag: str, build_args: list[str], mounts: list[str] = (), context: Path = paths.ROOT) -> list[str]:
    """podman build of deploy/Dockerfile from ``context`` (``build_args``: KEY=VALUE)."""
    cmd = [*PODMAN, "build", "--isolation", "chroot", "--shm-size", "256m", *mounts, "-t", tag]
    for a in build_args:
        cmd += ["--build-arg", a]
    return cmd + ["-f", str(context / "deploy" / "Dockerfile"), str(context)]


def context_with_model(model: Path, into: Path) -> Path:
    """The checkout's files (tracked, and untracked ones not ignored) plus an already trained
    default model as build/default-model: ``make model`` in the build finds its stamp current
    (same corpus, code and settings) and skips training, which takes long on a loaded machine."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=paths.ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in names)):
        if (paths.ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(paths.ROOT / name, into / name)
    shutil.copytree(model, into / "build" / "default-model")
    ignore = into / "deploy" / "Dockerfile.dockerignore"  # what podman and BuildKit read for it
    ignore.write_text("".join(line for line in ignore.read_text().splitlines(True) if line.strip() != "build"))
    return into


# The default image's build holds its build stage (~4.3 GB), the runtime stage (~4.1 GB) and the
# layer being committed (in /var/tmp) at once: the full build needed ~11 GB free here.
MIN_FREE_GB = 12.0


def storage_paths() -> list[Path]:
    """Where a build writes: podman's image store (its graphRoot) and /var/tmp (a layer being
    committed)."""
    root = podman("info", "--format", "{{.Store.GraphRoot}}", check=False).stdout.strip()
    return [Path(root or "/var/lib/containers/storage"), Path("/var/tmp")]


def short_of_space(paths: list[Path], min_free_gb: float) -> str | None:
    """Why a build would run out of disk before it is done (None: room enough): a build that
    fails at its last commit has cost half an hour."""
    for path in paths:
        at = next((p for p in [path, *path.parents] if p.exists()), Path("/"))
        free = shutil.disk_usage(at).free / 1e9
        if free < min_free_gb:
            return (
                f"{free:.1f} GB free where {path} is, the build needs about {min_free_gb:.0f} GB "
                "(podman image prune removes the dangling images of earlier builds; --min-free-gb 0 skips this check)"
            )
    return None


def build(
    tag: str, build_args: list[str], host_pip: bool = False, model: Path | None = None, min_free_gb: float = MIN_FREE_GB
) -> int:
    if min_free_gb > 0 and (why := short_of_space(storage_paths(), min_free_gb)):
        print(f"[image] not building: {why}", file=sys.stderr)
        return 2
    make_base()
    with tempfile.TemporaryDirectory(prefix="switchboard-context-") as tmp:
        context = context_with_model(model, Path(tmp)) if model else paths.ROOT
        cmd = build_command(tag, build_args, host_pip_mounts() if host_pip else [], context)
        print("[image] " + " ".join(cmd))
        t0 = time.monotonic()
        rc = subprocess.run(cmd).returncode
    if rc == 0:
        print(f"[image] {tag}: built in {time.monotonic() - t0:.0f} s, {image_size_mb(tag):.0f} MB")
    return rc


# ---- smoke ----------------------------------------------------------------------------------


@dataclass
class SmokePorts:
    http: int
    grpc: int
    metrics: int
    probe: int
    gateway: int
    redis: int

    @classmethod
    def free(cls) -> SmokePorts:
        from switchboard.ops.launch import free_ports

        return cls(*free_ports(6))


def manifest_container(manifest: Path) -> dict:
    """The first container of the Deployment in ``manifest`` (deploy/k8s)."""
    import yaml

    for doc in yaml.safe_load_all(manifest.read_text()):
        if doc and doc.get("kind") == "Deployment":
            return doc["spec"]["template"]["spec"]["containers"][0]
    raise SystemExit(f"{manifest}: no Deployment")


def server_args(ports: SmokePorts, manifest: Path = paths.K8S / "switchboard.yaml") -> list[str]:
    """The Deployment's arguments to the entrypoint, its ports and Redis replaced by ``ports``."""
    replaced = {
        "--redis-url": f"redis://127.0.0.1:{ports.redis}/0",
        "--http-port": str(ports.http),
        "--grpc-port": str(ports.grpc),
        "--metrics-port": str(ports.metrics),
        "--probe-port": str(ports.probe),
    }
    args = [str(a) for a in manifest_container(manifest)["args"] if a.split("=", 1)[0] not in replaced]
    return args + [f"{k}={v}" for k, v in replaced.items()]


def gateway_args(ports: SmokePorts, manifest: Path = paths.K8S / "gateway.yaml") -> tuple[list[str], list[str]]:
    """The gateway Deployment's command and arguments, pointed at the smoke's server."""
    c = manifest_container(manifest)
    args = [a for a in c["args"] if not a.startswith(("--host=", "--port=", "--grpc-url="))]
    return c["command"], args + ["--host=127.0.0.1", f"--port={ports.gateway}", f"--grpc-url=127.0.0.1:{ports.grpc}"]


def run_command(
    name: str, image: str, cache_volume: str | None, entrypoint: list[str] | None, args: list[str]
) -> list[str]:
    """``podman run``'s arguments as the manifests' securityContext has it: the image's non-root user, a
    read-only root, no capabilities, /tmp and /dev/shm in memory, no host path."""
    cmd = ["run", "-d", "--name", name, "--label", f"{SMOKE_LABEL}=1", "--network", "host", *ULIMITS]
    cmd += ["--read-only", "--tmpfs", "/tmp:rw,size=1g", "--shm-size", "512m"]
    cmd += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    cache = WEIGHTS_VOLUME if cache_volume else WEIGHTS_CACHE
    cmd += ["-e", f"SWITCHBOARD_WEIGHTS_CACHE={cache}"]
    if cache_volume:
        cmd += ["-v", f"{cache_volume}:{WEIGHTS_VOLUME}:U"]
    if entrypoint:
        cmd += ["--entrypoint", entrypoint[0]]
        args = entrypoint[1:] + args
    return cmd + [image, *args]


def _get(url: str, timeout: float = 2.0) -> int | None:
    import httpx

    try:
        return httpx.get(url, timeout=timeout).status_code
    except httpx.HTTPError:
        return None


def _running(name: str) -> bool:
    out = podman("inspect", "--format", "{{.State.Running}}", name, check=False)
    return out.returncode == 0 and out.stdout.strip() == "true"


def wait_ready(url: str, containers: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _get(url) == 200:
            return
        for c in containers:
            if not _running(c):
                raise RuntimeError(f"container {c} exited before {url} was ready:\n{logs(c)}")
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s:\n" + "\n".join(logs(c) for c in containers))


def logs(name: str, tail: int = 40) -> str:
    out = podman("logs", "--tail", str(tail), name, check=False)
    return f"--- {name}\n{out.stdout}{out.stderr}"


def bind_mounts(name: str) -> list[str]:
    mounts = json.loads(podman("inspect", "--format", "{{json .Mounts}}", name).stdout or "[]")
    return [m.get("Source", "") for m in mounts if m.get("Type") == "bind"]


def has_recognizer(image: str) -> bool:
    probe = [*PODMAN, "run", "--rm", "--network", "none", *ULIMITS, "--entrypoint", "/bin/sh", image]
    out = subprocess.run([*probe, "-c", "ls /app/model_repository/asr/1"], capture_output=True, text=True)
    return out.returncode == 0 and any(f.endswith(".onnx") or f == "manifest.json" for f in out.stdout.split())


@dataclass
class SmokeResult:
    image: str
    size_mb: float
    cache_volume: str | None
    ready_s: float = 0.0
    first_answer_s: float = 0.0
    answer: str = ""
    speech: bool = False  # the image holds a recognizer (model_repository/asr/1)
    heard: str | None = None
    heard_s: float = 0.0  # start to the transcription answered (after the chat)
    exit_codes: dict = field(default_factory=dict)
    stop_s: float = 0.0
    left_over: list = field(default_factory=list)
    uid: str = ""  # the server's processes' user, as `id -u` says inside the container
    bind_mounts: list = field(default_factory=list)  # host paths the containers see (none expected)

    @property
    def ok(self) -> bool:
        clean = all(c == 0 for c in self.exit_codes.values()) and not self.left_over
        heard = bool(self.heard and self.heard.strip()) or not self.speech
        return bool(self.answer) and heard and clean and self.uid not in ("", "0") and not self.bind_mounts


def chat(gateway: str, text: str) -> str:
    import httpx

    body = {"model": "switchboard", "messages": [{"role": "user", "content": text}], "max_tokens": 24}
    r = httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def transcribe(gateway: str, text: str) -> str:
    """What the gateway's recognizer heard of ``text`` spoken by espeak-ng."""
    import httpx

    if shutil.which("espeak-ng") is None:
        raise RuntimeError("the image has a recognizer but espeak-ng is not here to speak to it (make setup)")
    # espeak-ng's WAV as it writes it (22 kHz): the gateway decodes and resamples uploads itself
    wav = subprocess.run(["espeak-ng", "--stdout", text], check=True, capture_output=True).stdout
    files = {"file": ("question.wav", wav, "audio/wav")}
    r = httpx.post(f"{gateway}/v1/audio/transcriptions", data={"model": "whisper-1"}, files=files, timeout=120)
    r.raise_for_status()
    return r.json()["text"]


@contextlib.contextmanager
def redis_server(port: int):
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def stop(name: str, timeout_s: int) -> int:
    """SIGTERM, up to ``timeout_s`` before SIGKILL (the pod's grace period); the exit code."""
    podman("stop", "-t", str(timeout_s), name, check=False)
    code = podman("inspect", "--format", "{{.State.ExitCode}}", name, check=False).stdout.strip()
    podman("rm", "-f", name, check=False)
    return int(code) if code.lstrip("-").isdigit() else -1


def smoke(image: str = IMAGE, cache_volume: str | None = None, timeout_s: float = 600.0) -> SmokeResult:
    result = SmokeResult(image, image_size_mb(image), cache_volume)
    ports = SmokePorts.free()
    tag = uuid.uuid4().hex[:8]
    server, gateway = f"switchboard-smoke-{tag}", f"switchboard-smoke-{tag}-gateway"
    gw_url = f"http://127.0.0.1:{ports.gateway}"
    result.speech = has_recognizer(image)
    with redis_server(ports.redis):
        try:
            t0 = time.monotonic()
            podman(*run_command(server, image, cache_volume, None, server_args(ports)))
            podman(*run_command(gateway, image, None, *gateway_args(ports)))
            wait_ready(f"http://127.0.0.1:{ports.probe}/readyz", [server, gateway], timeout_s)
            result.ready_s = time.monotonic() - t0
            result.uid = podman("exec", server, "id", "-u", check=False).stdout.strip()
            result.bind_mounts = bind_mounts(server) + bind_mounts(gateway)
            wait_ready(f"{gw_url}/readyz", [server, gateway], 60)
            result.answer = chat(gw_url, SPOKEN)
            result.first_answer_s = time.monotonic() - t0
            if result.speech:
                result.heard = transcribe(gw_url, SPOKEN)
                result.heard_s = time.monotonic() - t0
        finally:
            t1 = time.monotonic()
            result.exit_codes = {"gateway": stop(gateway, 30), "server": stop(server, 60)}
            result.stop_s = time.monotonic() - t1
            listed = podman("ps", "-a", "--filter", f"name={server}", "--format", "{{.Names}}", check=False)
            result.left_over = listed.stdout.split()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.ops.image", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("base", help=f"make {BASE} with debootstrap unless present")
    b = sub.add_parser("build", help="podman build of deploy/Dockerfile")
    b.add_argument("--tag", default=IMAGE)
    b.add_argument(
        "--build-arg", action="append", default=[], help="KEY=VALUE (PRECISION, ASR, SMOKE: deploy/Dockerfile)"
    )
    b.add_argument(
        "--host-pip",
        action="store_true",
        help="give the RUN steps this host's pip setup (CA bundle, local wheels and indexes; not kept in the image)",
    )
    b.add_argument(
        "--with-model",
        type=Path,
        help="an already trained default model (build/default-model) put in the build context: no training",
    )
    b.add_argument(
        "--min-free-gb",
        type=float,
        default=MIN_FREE_GB,
        help=f"refuse to start with less disk free where podman stores images (default {MIN_FREE_GB:g}; 0: no check)",
    )
    s = sub.add_parser("smoke", help="start the image, /readyz, a chat (and a transcription) via the gateway, stop")
    s.add_argument("--image", default=IMAGE)
    s.add_argument("--cache-volume", help="a named volume for the prepared weights (made on first use)")
    s.add_argument("--timeout-s", type=float, default=600.0, help="how long the start may take (default 600)")
    s.add_argument("--json", type=Path, help="write the result here too")
    args = p.parse_args(argv)
    if args.cmd == "base":
        make_base()
        return 0
    if args.cmd == "build":
        return build(args.tag, args.build_arg, args.host_pip, args.with_model, args.min_free_gb)
    if not image_exists(args.image):
        print(f"[image] no image {args.image!r}: make image")
        return 2
    r = smoke(args.image, args.cache_volume, args.timeout_s)
    figures = {**r.__dict__, "ok": r.ok}
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if r.ok else 1


if __name__ == "__main__":
    sys.exit(main())
