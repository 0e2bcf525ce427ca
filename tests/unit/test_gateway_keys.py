"""API keys from a file and the environment, each with its tier; the caller a header names."""

from __future__ import annotations

import pytest

from switchboard.gateway.keys import ENV, KeysError, KeyTable

LIVE, STD = "sk-live-0123456789abcdef", "sk-std-0123456789abcdef"


def test_keys_from_a_file_and_the_environment(tmp_path):
    f = tmp_path / "keys"
    f.write_text(f"# agents\n{LIVE} live\n\n{STD}   standard  # shop front\n")
    table = KeyTable.load(f, env={ENV: "sk-env-0123456789abcdef:live"})
    assert len(table) == 3 and not table.open
    assert table.caller(f"Bearer {LIVE}").best_priority == 1
    assert table.caller(f"bearer {STD}").best_priority == 2
    assert table.caller("Bearer sk-env-0123456789abcdef").tier == "live"
    for header in (None, "", "Bearer", f"Basic {LIVE}", "Bearer sk-unknown-0123456789", LIVE):
        assert table.caller(header) is None, header
    assert LIVE not in repr(table.__dict__) and LIVE not in table.caller(f"Bearer {LIVE}").name


def test_without_keys_everyone_is_the_open_tier():
    assert KeyTable.load(env={}).caller(None).best_priority == 2
    assert KeyTable.load(env={}, open_tier="live").caller(None).best_priority == 1


@pytest.mark.parametrize(
    "text, env, needle",
    [
        (f"{LIVE} gold\n", "", ":1: tier 'gold' is not one of live, standard"),
        (f"{LIVE}\n", "", ":1: expected '<key> <tier>'"),
        ("short live\n", "", ":1: a key must be at least 16"),
        ("", f"{LIVE}", f"{ENV}: entry 1: expected '<key>:<tier>'"),
        ("", f"{LIVE}:live,x:standard", f"{ENV}: entry 2: a key must be"),
    ],
)
def test_bad_keys_fail_at_start_naming_the_line(tmp_path, text, env, needle):
    f = tmp_path / "keys"
    f.write_text(text)
    with pytest.raises(KeysError) as e:
        KeyTable.load(f, env={ENV: env})
    assert needle in str(e.value)


def test_an_unreadable_keys_file_is_named(tmp_path):
    with pytest.raises(KeysError, match="cannot read the keys file"):
        KeyTable.load(tmp_path / "missing", env={})
