"""What `make image-smoke` and `make kube-play` run, read without podman: the manifests'
arguments with only ports and addresses replaced, and containers that see no host path."""

from __future__ import annotations

import pytest
import yaml

from perf.cold_start import container_args
from switchboard.ops import image, kube_play

PORTS = image.SmokePorts(http=1001, grpc=1002, metrics=1003, probe=1004, gateway=1005, redis=1006)
KUBE_PORTS = {"redis": 2001, "http": 2002, "grpc": 2003, "metrics": 2004, "probe": 2005, "gateway": 2006}


def test_server_args_are_the_deployments_with_ports_and_redis_replaced():
    args = image.server_args(PORTS)
    assert "--redis-url=redis://127.0.0.1:1006/0" in args and "--probe-port=1004" in args
    kept = [
        a
        for a in container_args()
        if not a.startswith(("--redis-url", "--http-port", "--grpc-port", "--metrics", "--probe-port"))
    ]
    assert kept and all(a in args for a in kept)
    assert len(args) == len(container_args())


def test_smoke_containers_see_no_host_path_and_keep_the_images_user():
    entrypoint, args = image.gateway_args(PORTS)
    for cmd in (
        image.run_command("s", "switchboard", None, None, image.server_args(PORTS)),
        image.run_command("g", "switchboard", None, entrypoint, args),
    ):
        assert "-v" not in cmd and "--user" not in cmd and "--privileged" not in cmd
        assert "--read-only" in cmd and cmd[cmd.index("--cap-drop") + 1] == "ALL"
    with_cache = image.run_command("s", "switchboard", "sb-cache", None, [])
    assert with_cache[with_cache.index("-v") + 1] == f"sb-cache:{image.WEIGHTS_VOLUME}:U"  # a named volume


def test_a_smoke_passes_only_with_an_answer_and_with_speech_heard_where_the_image_has_a_recognizer():
    def result(**kw):
        base = {"answer": "9 am", "exit_codes": {"gateway": 0, "server": 0}, "uid": "10001"}
        return image.SmokeResult("switchboard", 1.0, None, **{**base, **kw})

    assert result().ok and result(speech=True, heard="What time does the library open?").ok
    assert not result(speech=True).ok and not result(speech=True, heard=" ").ok
    assert not result(answer="").ok and not result(uid="0").ok and not result(bind_mounts=["/etc"]).ok
    assert not result(exit_codes={"gateway": 0, "server": 137}).ok and not result(left_over=["x"]).ok


def test_gateway_is_pointed_at_the_smokes_server():
    entrypoint, args = image.gateway_args(PORTS)
    assert entrypoint[-2:] == ["-m", "switchboard.gateway"]
    assert "--grpc-url=127.0.0.1:1002" in args and "--port=1005" in args


def test_replace_flags_keeps_each_flags_form():
    args = ["--port", "6379", "--bind", "0.0.0.0", "--grpc-url=switchboard:8001", "--save", ""]
    out = kube_play._replace_flags(args, {"--port": "7", "--grpc-url": "127.0.0.1:9"})
    assert out == ["--port", "7", "--bind", "0.0.0.0", "--grpc-url=127.0.0.1:9", "--save", ""]


def test_kube_play_rendering_changes_only_what_needs_a_cluster():
    docs = list(yaml.safe_load_all(kube_play.render(KUBE_PORTS)))
    assert [d["metadata"]["name"] for d in docs] == ["redis", "switchboard", "switchboard-gateway"]
    assert all(d["spec"]["replicas"] == 1 for d in docs)
    originals = {d["metadata"]["name"]: d for d in kube_play.deployments()}
    for d in docs:
        pod, original = d["spec"]["template"]["spec"], originals[d["metadata"]["name"]]["spec"]["template"]["spec"]
        assert pod["securityContext"] == original["securityContext"]
        # emptyDirs become pod-private volumes (tmpfs, the pod's user) that `up` creates first
        named = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
        assert sorted(named) == sorted(f"{d['metadata']['name']}-{v['name']}" for v in original["volumes"])
        for c, o in zip(pod["containers"], original["containers"], strict=True):
            assert c["securityContext"] == o["securityContext"] and c.get("resources") == o.get("resources")
            assert c["livenessProbe"]["periodSeconds"] == o["livenessProbe"]["periodSeconds"]
    redis, server, gateway = (d["spec"]["template"]["spec"]["containers"][0] for d in docs)
    assert redis["image"] == kube_play.REDIS_IMAGE and redis["readinessProbe"]["exec"]["command"] == [
        "redis-cli",
        "-p",
        "2001",
        "ping",
    ]
    assert "--redis-url=redis://127.0.0.1:2001/0" in server["args"]
    assert server["readinessProbe"]["httpGet"]["port"] == 2005 and "ports" not in server
    assert "--grpc-url=127.0.0.1:2003" in gateway["args"] and gateway["livenessProbe"]["httpGet"]["port"] == 2006


def test_a_build_without_room_to_finish_is_refused_before_it_starts(tmp_path, monkeypatch, capsys):
    """The disk the build would fill is checked first: short of it, a clear refusal naming what
    is free and what to do, not a failure at the last commit half an hour later."""
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(image.shutil, "disk_usage", lambda path: usage(100e9, 95e9, 5e9))
    why = image.short_of_space([tmp_path / "storage"], 12.0)
    assert "5.0 GB free" in why and "12 GB" in why and "podman image prune" in why
    assert image.short_of_space([tmp_path], 4.0) is None
    monkeypatch.setattr(image, "storage_paths", lambda: [tmp_path])
    monkeypatch.setattr(image, "make_base", lambda: pytest.fail("a refused build starts nothing"))
    assert image.build("t", [], min_free_gb=12.0) == 2
    assert "not building: 5.0 GB free" in capsys.readouterr().err
