"""The switchboard-chat CLI, as the README shows it, against the real server."""

import json
import re
import subprocess
import sys
from pathlib import Path

CLI = Path(sys.executable).parent / "switchboard-chat"


def test_one_shot_question_streams_an_answer_and_stats(stack):
    proc = subprocess.run(
        [str(CLI), "--url", stack.grpc_url, "我的订单什么时候发货？"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "short pool" in proc.stderr and "generated" in proc.stderr


def test_interactive_session_reuses_the_cache_on_the_second_turn(stack):
    proc = subprocess.run(
        [str(CLI), "--url", stack.grpc_url, "--session", "cli-test"],
        input="Where is my order?\nCan I change the address?\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    stats = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    assert len(stats) == 2
    reused = [int(re.search(r"reused (\d+),", line).group(1)) for line in stats]
    assert reused[1] > reused[0]  # turn 1 may reuse the shared system prompt's blocks, turn 2 also turn 1


def test_bad_input_is_reported_not_crashed(stack):
    proc = subprocess.run(
        [str(CLI), "--url", stack.grpc_url, "--max-new-tokens", "-3", "hello"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "INVALID_ARGUMENT" in proc.stderr and "max_new_tokens" in proc.stderr


def test_json_schema_answers_parse_and_logprobs_are_printed(stack, tmp_path):
    schema = {
        "type": "object",
        "properties": {"intent": {"enum": ["order_status", "return", "other"]}, "urgent": {"type": "boolean"}},
        "required": ["intent", "urgent"],
        "additionalProperties": False,
    }
    (tmp_path / "s.json").write_text(json.dumps(schema))
    cmd = [str(CLI), "--url", stack.grpc_url, "--json-schema", str(tmp_path / "s.json"), "--logprobs", "1"]
    proc = subprocess.run([*cmd, "Where is my order?"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["intent"] in ("order_status", "return", "other") and isinstance(answer["urgent"], bool)
    assert re.search(r"\[.+ -?\d+\.\d\d; .+ -?\d+\.\d\d\]", proc.stderr), proc.stderr
    missing = [*cmd[:3], "--json-schema", str(tmp_path / "nope.json"), "hi"]
    proc = subprocess.run(missing, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--json-schema" in proc.stderr
