"""One real redis-server and one real tritonserver (the repository in model_repository/) on
free ports for the whole integration session."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient

from switchboard.client import ChatClient
from switchboard.client.sync import close_stream
from switchboard.ops.launch import Ports, Stack
from tests.integration.gatewaytools import STANDARD_KEY, Gateway


@pytest.fixture(scope="session")
def stack(artifacts, tmp_path_factory):
    s = Stack(Ports.free(), run_dir=tmp_path_factory.mktemp("run"))
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def replica(stack, tmp_path_factory):
    """A second Switchboard server sharing the first one's Redis (its own pools, its own local
    KV blocks): what a session sees when it moves to another replica."""
    ports = Ports.free()
    ports.redis = stack.ports.redis
    s = Stack(ports, run_dir=tmp_path_factory.mktemp("replica"))
    s.start_triton()
    yield s
    s.stop_triton()


@pytest.fixture(scope="session")
def client(stack) -> ChatClient:
    return ChatClient(stack.grpc_url, timeout_s=120)


@pytest.fixture(scope="module")
def gateway(stack, tmp_path_factory):
    """The HTTP gateway in front of the stack, its log free of tracebacks at the end."""
    g = Gateway(stack.grpc_url, tmp_path_factory.mktemp("gateway"))
    yield g
    g.stop()
    assert "Traceback" not in g.logs(), g.logs()[-3000:]


@pytest.fixture(scope="module")
def oai(gateway):
    """The official openai client on ``gateway`` (a module may bring its own gateway)."""
    import openai

    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=STANDARD_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def redis_client(stack):
    r = redis.Redis(port=stack.ports.redis)
    yield r
    r.close()


@pytest.fixture(scope="session")
def raw(stack):
    """raw(inputs, parameters=None): a hand-made request to chat; returns (responses, error)."""
    return lambda inputs, parameters=None: raw_chat(stack.grpc_url, inputs, parameters)


def raw_chat(url: str, inputs: dict[str, tuple[np.ndarray, str]], parameters: dict | None = None, timeout=60):
    """Send a hand-made request to chat; returns (responses, error)."""
    responses: queue.Queue = queue.Queue()
    tensors = []
    for name, (array, triton_type) in inputs.items():
        t = grpcclient.InferInput(name, list(array.shape), triton_type)
        t.set_data_from_numpy(array)
        tensors.append(t)
    c = grpcclient.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        c.async_stream_infer("chat", tensors, parameters=parameters)
        out = []
        while True:
            result, error = responses.get(timeout=timeout)
            if error is not None:
                return out, error
            out.append(result)
            if result.as_numpy("stats") is not None:
                return out, None
    finally:
        close_stream(c)
