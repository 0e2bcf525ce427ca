"""How the SDK names the errors it raises."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from switchboard.client.sdk import ChatError, error_of, parse_response


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
