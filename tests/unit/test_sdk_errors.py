"""How the SDK names the errors it raises."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from switchboard.client import ChatError
from switchboard.client.sync import error_of, parse_response


@pytest.mark.parametrize(
    "message",
    [
        "Exceeds maximum queue size",
        "Request timeout expired",
        # seen from 2.51 while the supervisor restarts it
        "[request id: 22174-97] Server is stopping, scheduler for model has stopped accepting new inference requests",
        "Request for unknown model: 'chat' has no available versions",
    ],
)
def test_a_refusal_by_tritons_queue_or_a_restarting_server_is_unavailable(message):
    assert error_of(InferenceServerException(message)) == ("UNAVAILABLE", message)


def test_the_models_tag_names_the_code_and_an_untagged_unknown_error_has_none():
    with pytest.raises(ChatError) as e:
        parse_response(None, InferenceServerException("[INVALID_ARG] text: required"))
    assert e.value.code == "INVALID_ARGUMENT" and "text: required" in str(e.value)
    assert error_of(InferenceServerException("inference input 'text' data-type is 'INT32'"))[0] is None


def test_only_a_call_that_failed_on_its_way_is_worth_sending_to_another_replica():
    from switchboard.client.sync import transport_unavailable

    assert transport_unavailable(InferenceServerException("Socket closed", status="StatusCode.UNAVAILABLE"))
    # the server answered: overloaded is its word, not a lost connection
    assert not transport_unavailable(
        InferenceServerException("[UNAVAILABLE] overloaded", status="StatusCode.UNAVAILABLE")
    )
    assert not transport_unavailable(InferenceServerException("boom", status="StatusCode.INTERNAL"))


def test_a_session_travels_as_the_header_the_balancer_hashes():
    from switchboard.client.request import session_headers
    from switchboard.wire import SESSION_HEADER

    assert session_headers(None) is None
    values = [session_headers(sid)[SESSION_HEADER] for sid in ("用户-1", "line\nbreak", "x" * 1000, "a", b"a")]
    assert all(len(v) == 32 and all(c in "0123456789abcdef" for c in v) for v in values)  # valid in any HTTP/2 header
    assert values[3] == values[4] and len(set(values[:4])) == 4
