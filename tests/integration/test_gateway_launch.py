"""`make serve`'s path (`python -m switchboard.ops.launch up --gateway-port P`) on free ports:
the gateway comes up in front of the stack and answers, and `down` stops it with the rest."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import openai

from switchboard.ops.launch import Ports, free_port, port_open


def test_launch_up_starts_the_gateway_and_down_stops_it(artifacts, tmp_path):
    ports, gateway_port = Ports.free(), free_port()
    args = ["--http-port", str(ports.http), "--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics)]
    args += ["--redis-port", str(ports.redis), "--run-dir", str(tmp_path)]
    launch = [sys.executable, "-m", "switchboard.ops.launch"]
    # no recognizer joining: it would convert and export Whisper base in the background and,
    # with its export cached, install it over the tests' tiny.en in model_repository
    up = subprocess.run(
        launch + ["up", *args, "--gateway-port", str(gateway_port), "--asr-model", "off"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"http://127.0.0.1:{gateway_port}/v1" in up.stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{gateway_port}/readyz", timeout=10) as r:
            assert r.status == 200
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model="switchboard", messages=[{"role": "user", "content": "Hi"}], max_tokens=8
        )
        assert reply.choices[0].message.content
    finally:
        down = subprocess.run(launch + ["down", *args], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0 and "gateway" in down.stdout, down.stdout + down.stderr
    deadline = time.monotonic() + 10
    while port_open(gateway_port):
        assert time.monotonic() < deadline, "down left the gateway running"
        time.sleep(0.2)
