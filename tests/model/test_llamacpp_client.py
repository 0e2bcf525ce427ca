"""The bench suite's llama-server client reading a /completion stream: a stub server, the
exported default model's tokenizer (hence this tier; the real server is exercised by
``make bench-aiperf`` and ``make bench-large``)."""

import http.server
import json
import threading

import pytest


class _Stream(http.server.BaseHTTPRequestHandler):
    """llama-server's /completion stream, as it answers with ``return_tokens``."""

    events = []
    bodies = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for e in self.events:
            self.wfile.write(b"data: " + json.dumps(e).encode() + b"\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def llama_stub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def test_llama_client_streams_text_and_keeps_the_conversation(llama_stub, artifacts):
    from perf.llamacpp import LlamaChatClient
    from perf.peer_model import PromptSessions
    from switchboard.client import ChatStats

    sessions = PromptSessions(artifacts)
    hello = sessions.tokenizer.encode("Hello there")
    _Stream.events = [
        {"content": "x", "tokens": hello[:1], "stop": False},
        {"content": "y", "tokens": hello[1:], "stop": False},
        {"content": "", "tokens": [], "stop": True, "timings": {"cache_n": 7}},
    ]
    client = LlamaChatClient(llama_stub.server_address[1], sessions)
    events = list(client.chat("Where is my order?", session_id="s1", max_new_tokens=8))
    assert "".join(e for e in events if isinstance(e, str)) == "Hello there"
    stats = events[-1]
    assert isinstance(stats, ChatStats) and stats.reused_tokens == 7 and stats.generated_tokens == len(hello)
    first = _Stream.bodies[-1]
    assert first["cache_prompt"] and first["n_predict"] == 8 and first["prompt"][-1] != hello[-1]
    list(client.chat("And the refund?", session_id="s1", max_new_tokens=8))
    second = _Stream.bodies[-1]["prompt"]
    assert second[: len(first["prompt"])] == first["prompt"]  # the next turn extends the last prompt
    assert sessions.tokenizer.decode(second).count("Hello there") == 1
