"""The session store against real redis-servers that require an ACL user and password, or TLS."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from switchboard.kv.remote import RedisBlocks
from switchboard.ops.launch import free_port, port_open
from switchboard.redis_conn import connect, tls_arguments
from switchboard.serving.prompt import Conversation
from switchboard.serving.session import SessionStore, StoreConfig


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory):
    port = free_port()
    proc = subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--user",
            "default",
            "off",
            "--user",
            "switchboard",
            "on",
            ">s3cret-pw",
            "~sb:*",
            "+get",
            "+getex",
            "+exists",
            "+set",
            "+del",
            "+ping",
        ],
        stdout=open(tmp_path_factory.mktemp("acl") / "redis.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while not port_open(port):
        assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
        time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(10)


def store(url):
    return SessionStore(StoreConfig(url=url, secret=b"k"), "fp")


def blocks(url, **tls):
    return RedisBlocks(connect(url, 0.5, **tls), retry_after_s=0.0)


def test_acl_user_with_password_reads_and_writes(acl_redis):
    s = store(f"redis://switchboard:s3cret-pw@127.0.0.1:{acl_redis}/0")
    assert s.save("alice", Conversation([{"role": "user", "content": "hi"}], [1, 2]))
    got = s.load("alice")
    assert got.status == "hit" and got.conversation.tokens == [1, 2]
    s.close()
    kv = blocks(f"redis://switchboard:s3cret-pw@127.0.0.1:{acl_redis}/0")
    assert kv.put([(b"k" * 16, b"block")]) and kv.get([b"k" * 16]) == [b"block"]


@pytest.mark.parametrize("url", ["redis://127.0.0.1:{port}/0", "redis://switchboard:wrong@127.0.0.1:{port}/0"])
def test_without_the_right_credentials_the_store_is_unavailable_not_fatal(acl_redis, url):
    s = store(url.format(port=acl_redis))
    assert s.load("alice").status == "unavailable"
    s.close()
    kv = blocks(url.format(port=acl_redis))
    assert kv.put([(b"k" * 16, b"block")]) is False and kv.get([b"k" * 16]) is None


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    """redis-server serving only TLS, with a self-signed certificate for 127.0.0.1."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            str(cert),
            "--tls-key-file",
            str(key),
            "--tls-ca-cert-file",
            str(cert),
            "--tls-auth-clients",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ],
        stdout=open(d / "redis.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while not port_open(port):
        assert time.monotonic() < deadline and proc.poll() is None, "redis-server (TLS) did not start"
        time.sleep(0.05)
    yield port, cert
    proc.terminate()
    proc.wait(10)


def test_tls_with_the_servers_ca_reads_and_writes(tls_redis):
    port, cert = tls_redis
    s = SessionStore(StoreConfig(url=f"rediss://127.0.0.1:{port}/0", secret=b"k", tls_ca_file=str(cert)), "fp")
    assert s.save("alice", Conversation([{"role": "user", "content": "hi"}], [1, 2]))
    assert s.load("alice").status == "hit"
    s.close()
    url = f"rediss://127.0.0.1:{port}/0"
    kv = blocks(url, **tls_arguments(url, ca_file=str(cert)))
    assert kv.put([(b"k" * 16, b"block")]) and kv.get([b"k" * 16]) == [b"block"]


@pytest.mark.parametrize("scheme", ["rediss", "redis"])
def test_tls_without_trust_or_without_tls_is_unavailable_not_fatal(tls_redis, scheme):
    port, _ = tls_redis
    s = store(f"{scheme}://127.0.0.1:{port}/0")  # unknown CA, or plain text to a TLS port
    assert s.load("alice").status == "unavailable"
    s.close()


def test_tls_files_without_a_rediss_url_are_refused():
    with pytest.raises(ValueError, match="rediss://"):
        StoreConfig(url="redis://127.0.0.1:6379/0", tls_ca_file="ca.pem").connection_kwargs()
