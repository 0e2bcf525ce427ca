"""deploy/k8s's Deployments on one machine with ``podman kube play``: ``python -m switchboard.ops.kube_play``.

``podman kube play`` runs Pods and Deployments but has no Services, DNS names, scheduler, HPA
or metrics adapter. ``render`` therefore writes the Redis, Switchboard and gateway Deployments
as they are, except what needs a cluster: one replica each (on the host network two would take
the same ports), free ports in place of the fixed ones, 127.0.0.1 in place of the Service names
(``redis``, ``switchboard``: the gateway reaches the Switchboard pod directly, as the balancer
Deployment resolves the headless Service's DNS, which is not here), and a local stand-in for
the Redis image (deploy/podman/redis.Containerfile), and the probes' named ports as numbers with
no ``ports`` lists (kube play maps them, which the host network refuses). Everything else (arguments, env, probes,
securityContext, volumes, resources) is the manifests'. ``up`` plays it with ``--network host``;
``check`` asks the probes' endpoints and a chat through the gateway; ``kill`` SIGKILLs the
Switchboard container and waits until it is back (its restart count up, ready, answering);
``down`` stops it all. docs/kubernetes.md, "On one machine".
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from switchboard import paths
from switchboard.ops import image

REDIS_IMAGE = "localhost/switchboard-redis:7.0.15"
RENDERED = paths.BUILD / "kube-play" / "switchboard.yaml"
PORTS_FILE = paths.BUILD / "kube-play" / "ports.json"
PLAYED = ("redis.yaml", "switchboard.yaml", "gateway.yaml")
# A Deployment's pod is <deployment>-pod-0, its container <deployment>-pod-0-<container>.
SERVER_CONTAINER = "switchboard-pod-0-switchboard"


def deployments(k8s: Path = paths.K8S) -> list[dict]:
    docs = []
    for name in PLAYED:
        docs += [d for d in yaml.safe_load_all((k8s / name).read_text()) if d and d.get("kind") == "Deployment"]
    return docs


def _set_ports(container: dict, by_name: dict[str, int]) -> None:
    """The probes' named ports as numbers, and no ``ports`` list: on the host network kube play
    refuses a container's ports (it turns them into port mappings, which need a pod network)."""
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        for kind in ("httpGet", "tcpSocket"):
            target = container.get(probe, {}).get(kind)
            if target and isinstance(target["port"], str):
                target["port"] = by_name[target["port"]]
    container.pop("ports", None)


def _replace_flags(args: list[str], values: dict[str, str]) -> list[str]:
    """Each ``--flag=value`` or ``--flag value`` in ``args`` given its new value, in the same form."""
    out = list(args)
    for i, a in enumerate(args):
        flag = a.split("=", 1)[0]
        if flag not in values:
            continue
        if "=" in a:
            out[i] = f"{flag}={values[flag]}"
        elif i + 1 < len(args):
            out[i + 1] = values[flag]
    return out


def memory_volumes(docs: list[dict]) -> list[tuple[str, int, int]]:
    """Each emptyDir as a pod-private name, with the pod's user: kube play (4.3) makes an emptyDir
    a named volume on disk, owned by root and shared by every pod that names it the same, so a
    non-root pod cannot write its /dev/shm. ``up`` creates these as tmpfs volumes owned by the
    pod's user first. (name, uid, gid) of each; the docs are changed in place."""
    made = []
    for d in docs:
        pod = d["spec"]["template"]["spec"]
        ctx = pod.get("securityContext", {})
        renamed = {}
        for v in pod.get("volumes", []):
            if "emptyDir" in v:
                renamed[v["name"]] = f"{d['metadata']['name']}-{v['name']}"
                v["name"] = renamed[v["name"]]
                v.pop("emptyDir")
                v["persistentVolumeClaim"] = {"claimName": v["name"]}
                made.append((v["name"], ctx.get("runAsUser", 0), ctx.get("runAsGroup", 0)))
        for c in pod["containers"]:
            for m in c.get("volumeMounts", []):
                m["name"] = renamed.get(m["name"], m["name"])
    return made


def render(ports: dict[str, int], k8s: Path = paths.K8S) -> str:
    """The played YAML: the three Deployments with the changes the module's docstring lists."""
    out = []
    for d in deployments(k8s):
        d["spec"]["replicas"] = 1
        pod = d["spec"]["template"]["spec"]
        for c in pod["containers"]:
            name = d["metadata"]["name"]
            if name == "redis":
                c["image"] = REDIS_IMAGE
                c["args"] = _replace_flags(c["args"], {"--port": str(ports["redis"]), "--bind": "127.0.0.1"})
                _set_ports(c, {"redis": ports["redis"]})
                # the probe's redis-cli asks the default port; options go before the command
                probe = c["readinessProbe"]["exec"]["command"]
                probe[1:1] = ["-p", str(ports["redis"])]
            elif name == "switchboard":
                c["args"] = _replace_flags(
                    c["args"],
                    {
                        "--redis-url": f"redis://127.0.0.1:{ports['redis']}/0",
                        "--http-port": str(ports["http"]),
                        "--grpc-port": str(ports["grpc"]),
                        "--metrics-port": str(ports["metrics"]),
                        "--probe-port": str(ports["probe"]),
                    },
                )
                _set_ports(c, ports)
            elif name == "switchboard-gateway":
                c["args"] = _replace_flags(
                    c["args"], {"--port": str(ports["gateway"]), "--grpc-url": f"127.0.0.1:{ports['grpc']}"}
                )
                _set_ports(c, {"http": ports["gateway"]})
        out.append(d)
    memory_volumes(out)
    return yaml.safe_dump_all(out, sort_keys=False)


def free_ports() -> dict[str, int]:
    from switchboard.ops.launch import free_ports as pick

    return dict(zip(("redis", "http", "grpc", "metrics", "probe", "gateway"), pick(6), strict=True))


def kube(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return image.podman("kube", *args, check=check)


def up() -> dict[str, int]:
    if not image.image_exists(image.IMAGE):
        raise SystemExit(f"[kube-play] no image {image.IMAGE!r}: make image")
    if not image.image_exists(REDIS_IMAGE):
        print(f"[kube-play] building {REDIS_IMAGE} (deploy/podman/redis.Containerfile)")
        image.make_base()
        containerfile = paths.ROOT / "deploy" / "podman" / "redis.Containerfile"
        image.podman(
            "build", "--isolation", "chroot", "-t", REDIS_IMAGE, "-f", str(containerfile), str(containerfile.parent)
        )
    ports = free_ports()
    RENDERED.parent.mkdir(parents=True, exist_ok=True)
    RENDERED.write_text(render(ports))
    PORTS_FILE.write_text(json.dumps(ports) + "\n")
    for name, uid, gid in memory_volumes(deployments()):
        image.podman("volume", "rm", "-f", name, check=False)
        opts = f"o=uid={uid},gid={gid}"
        image.podman("volume", "create", "--opt", "type=tmpfs", "--opt", "device=tmpfs", "--opt", opts, name)
    out = kube("play", "--network", "host", str(RENDERED), check=False)
    print(out.stdout + out.stderr)
    if out.returncode != 0:
        raise SystemExit(f"[kube-play] podman kube play {RENDERED} failed ({out.returncode})")
    return ports


def _status(url: str) -> int | None:
    return image._get(url)


def wait(url: str, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if _status(url) == 200:
            return time.monotonic() - t0
        time.sleep(1)
    raise SystemExit(f"[kube-play] {url} not ready after {timeout_s:.0f} s")


def check(ports: dict[str, int], timeout_s: float) -> dict:
    """The readiness probes' endpoints (Switchboard's /readyz, the gateway's /readyz, Redis' ping)
    and a chat through the gateway."""
    got: dict = {"switchboard_ready_s": wait(f"http://127.0.0.1:{ports['probe']}/readyz", timeout_s)}
    got["gateway_ready_s"] = wait(f"http://127.0.0.1:{ports['gateway']}/readyz", 120)
    ping = image.podman("exec", "redis-pod-0-redis", "redis-cli", "-p", str(ports["redis"]), "ping", check=False)
    got["redis_ping"] = ping.stdout.strip()
    got["answer"] = image.chat(f"http://127.0.0.1:{ports['gateway']}", "What time does the library open?")
    return got


def restarts(container: str) -> int:
    out = image.podman("inspect", "--format", "{{.RestartCount}}", container, check=False).stdout.strip()
    return int(out) if out.isdigit() else -1


def kill(ports: dict[str, int], timeout_s: float) -> dict:
    """SIGKILL the Switchboard container's main process from the host, as a crash or the OOM killer
    would (``podman kill`` counts as a stop by the user, which the restart policy leaves stopped);
    back when its restart count rose and it is ready again."""
    before = restarts(SERVER_CONTAINER)
    pid = int(image.podman("inspect", "--format", "{{.State.Pid}}", SERVER_CONTAINER).stdout)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    while restarts(SERVER_CONTAINER) <= before:
        if time.monotonic() - t0 > 60:
            raise SystemExit(f"[kube-play] {SERVER_CONTAINER} not restarted after 60 s")
        time.sleep(1)
    ready = wait(f"http://127.0.0.1:{ports['probe']}/readyz", timeout_s)
    answer = image.chat(f"http://127.0.0.1:{ports['gateway']}", "What time does the library open?")
    return {"restarts": restarts(SERVER_CONTAINER), "back_ready_s": ready, "answer": answer}


def down() -> None:
    if RENDERED.exists():
        out = kube("down", str(RENDERED), check=False)
        print(out.stdout + out.stderr)
        for name, _, _ in memory_volumes(deployments()):
            image.podman("volume", "rm", "-f", name, check=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.ops.kube_play", description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=["render", "up", "check", "kill", "down", "all"], help="all: up, check, kill, down")
    p.add_argument("--timeout-s", type=float, default=600.0, help="how long a start may take (default 600)")
    args = p.parse_args(argv)
    if args.step == "render":
        print(render(free_ports()))
        return 0
    if args.step == "down":
        down()
        return 0
    if args.step in ("up", "all"):
        ports = up()
    else:
        ports = json.loads(PORTS_FILE.read_text())
    try:
        if args.step in ("check", "all"):
            print(json.dumps(check(ports, args.timeout_s), indent=2))
        if args.step in ("kill", "all"):
            print(json.dumps(kill(ports, args.timeout_s), indent=2))
    finally:
        if args.step == "all":
            down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
