import pytest

from switchboard.wire import tag, untag


def test_a_tagged_message_gives_back_the_grpc_name_and_the_plain_message():
    assert untag(tag("INVALID_ARG", "text: empty message")) == ("INVALID_ARGUMENT", "text: empty message")
    assert untag(tag("UNAVAILABLE", "engine_short: stalled")) == ("UNAVAILABLE", "engine_short: stalled")


@pytest.mark.parametrize(
    "message",
    [
        "[request id: <id_unknown>] inference input 'text' data-type is 'INT32', but model 'chat' expects 'BYTES'",
        "text: empty message",
        "[NOT_A_CODE] x",
        " [INVALID_ARG] not at the head",
    ],
)
def test_messages_without_a_known_tag_at_the_head_have_no_code(message):
    assert untag(message) == (None, message)


def test_only_triton_code_names_can_tag():
    with pytest.raises(ValueError, match="unknown Triton error code"):
        tag("INVALID_ARGUMENT", "x")
