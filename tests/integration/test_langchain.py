"""LangChain's ``ChatOpenAI`` against the gateway on the real stack: what an agent framework
sends (``with_structured_output`` in json_schema mode: a strict schema from a pydantic model)
comes back parsed into that model."""

from __future__ import annotations

from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tests.integration.gatewaytools import STANDARD_KEY, Gateway

langchain_openai = pytest.importorskip("langchain_openai")


class OrderQuery(BaseModel):
    """What the customer asks about, and which order."""

    intent: Literal["order_status", "return", "refund", "other"]
    order_id: str = Field(pattern=r"^SB[0-9]{6}$", description="the order number, SB and six digits")
    urgent: bool


@pytest.fixture(scope="module")
def llm(stack, tmp_path_factory):
    g = Gateway(stack.grpc_url, tmp_path_factory.mktemp("gateway"))
    yield langchain_openai.ChatOpenAI(
        model="switchboard", base_url=f"{g.url}/v1", api_key=STANDARD_KEY, temperature=0, max_tokens=96, max_retries=0
    )
    g.stop()
    assert "Traceback" not in g.logs(), g.logs()[-3000:]


@pytest.mark.parametrize("question", ["Where is my order SB123456?", "我要退货，订单号 SB654321"])
def test_structured_output_in_json_schema_mode_parses_into_the_model(llm, question):
    answer = llm.with_structured_output(OrderQuery, method="json_schema", strict=True).invoke(question)
    assert isinstance(answer, OrderQuery) and answer.order_id.startswith("SB") and len(answer.order_id) == 8


@pytest.mark.parametrize("question", ["Where is my order?", "我要退货"])
def test_json_mode_parses_into_a_dict_unless_cut_at_max_tokens(llm, question):
    # json_object bounds no string: the small model may still be inside one at max_tokens, which
    # OpenAI's parser reports as such; anything else it returns must parse
    try:
        answer = llm.with_structured_output(method="json_mode").invoke(question)
    except openai.LengthFinishReasonError:
        return
    assert isinstance(answer, dict)
