"""The session store against a real redis-server that requires an ACL user and password."""

from __future__ import annotations

import shutil
import subprocess
import time

import numpy as np
import pytest

from switchboard.launch import free_port, port_open
from switchboard.prompt import Conversation
from switchboard.session import SessionStore, StoreConfig


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory):
    port = free_port()
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--daemonize", "no", "--user", "default", "off",
                             "--user", "switchboard", "on", ">s3cret-pw", "~sb:*", "+get", "+mget", "+set", "+del",
                             "+multi", "+exec", "+ping"],
                            stdout=open(tmp_path_factory.mktemp('acl') / 'redis.log', 'wb'), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while not port_open(port):
        assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
        time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(10)


def store(url):
    return SessionStore(StoreConfig(url=url, secret=b"k"), "fp", (1, 2, 1, 4), np.float32)


def test_acl_user_with_password_reads_and_writes(acl_redis):
    s = store(f"redis://switchboard:s3cret-pw@127.0.0.1:{acl_redis}/0")
    assert s.save("alice", Conversation([{"role": "user", "content": "hi"}], [1, 2]), None)
    got = s.load("alice")
    assert got.status == "hit" and got.conversation.tokens == [1, 2]
    s.close()


@pytest.mark.parametrize("url", ["redis://127.0.0.1:{port}/0", "redis://switchboard:wrong@127.0.0.1:{port}/0"])
def test_without_the_right_credentials_the_store_is_unavailable_not_fatal(acl_redis, url):
    s = store(url.format(port=acl_redis))
    assert s.load("alice").status == "unavailable"
    s.close()
