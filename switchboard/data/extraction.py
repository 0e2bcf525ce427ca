"""JSON extraction conversations: a customer message, the instruction a client puts in the
system message with a json_schema response format, and the object that answers it.

The Gemma agent is trained on them (``switchboard.training.gemma``) and judged on held-out ones
(``switchboard.evaluation.agent``).
"""

from __future__ import annotations

import random

from switchboard.data import corpus as corpus_mod
from switchboard.serving.prompt import DEFAULT_SYSTEM_PROMPT

JSON_INSTRUCTION = (
    "Reply with JSON only: order_id (the order number in the message, or an empty string), "
    "topic, lang and question (the customer's request, rephrased)."
)
# What the answers follow (the json_schema response format's schema).
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "topic": {"type": "string"},
        "lang": {"type": "string", "enum": ["en", "zh"]},
        "question": {"type": "string"},
    },
    "required": ["order_id", "topic", "lang", "question"],
    "additionalProperties": False,
}


def json_conversation(rng: random.Random, data: corpus_mod.Corpus, heldout: bool = False) -> tuple[list[dict], dict]:
    """A customer message with the JSON extraction instruction, and the object to answer."""
    pairs = [(e, q) for e in data.faq for q in (e.heldout if heldout else e.questions)]
    if rng.random() < 0.5:  # half name an order (few FAQ questions do): it must be copied, or left empty
        pairs = [(e, q) for e, q in pairs if "{order_id}" in q]
    entry, template = rng.choice(pairs)
    slots = corpus_mod.sample_slots(rng, entry.lang)
    question = corpus_mod.fill_slots(slots, template)
    answer = {
        "order_id": slots["order_id"] if "{order_id}" in template else "",  # only what the message says
        "topic": entry.topic,
        "lang": entry.lang,
        "question": corpus_mod.fill_slots(slots, entry.questions[0]),
    }
    system = DEFAULT_SYSTEM_PROMPT + " " + JSON_INSTRUCTION
    return [{"role": "system", "content": system}, {"role": "user", "content": question}], answer
