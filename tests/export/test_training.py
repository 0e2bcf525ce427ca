"""The default model's training: the shared system-prompt prefix changes nothing but the cost,
and question augmentation never touches the slot placeholders."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from switchboard.data import corpus
from switchboard.data.augment import noisy
from switchboard.training.chat.train import IGNORE, TrainConfig, answer_loss, batches, loss_weights, shared_prefix


def _examples(prefix: list[int], rng: random.Random, n: int = 6) -> list[tuple[list[int], list[int]]]:
    out = []
    for _ in range(n):
        question = [rng.randrange(10, 60) for _ in range(rng.randint(2, 6))]
        answer = [rng.randrange(10, 60) for _ in range(rng.randint(2, 8))]
        ids = prefix + [3] + question + [4] + answer
        out.append((ids, [IGNORE] * (len(prefix) + 2 + len(question)) + answer))
    return out


def test_shared_prefix_gives_the_loss_and_gradients_of_the_full_sequences():
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    )
    examples = _examples([1, 2, 7, 8, 9, 5], random.Random(0))
    assert shared_prefix(examples) == 7  # the prefix and the user-role token
    cfg = TrainConfig(batch_size=len(examples))

    def loss_and_grads(skip: int):
        x, y, mask, _ = next(batches(examples, cfg, pad_id=0, skip=skip))
        prefix = torch.tensor(examples[0][0][:skip], dtype=torch.long)
        model.zero_grad()
        loss, plain = answer_loss(model, prefix, x, mask, y)
        loss.backward()
        assert plain == loss.item()
        return plain, [p.grad.clone() for p in model.parameters()]

    full_loss, full_grads = loss_and_grads(0)
    loss, grads = loss_and_grads(7)
    assert loss == pytest.approx(full_loss, rel=1e-5)
    for a, b in zip(grads, full_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_lead_tokens_of_every_answer_weigh_more():
    labels = [IGNORE, IGNORE, 5, 6, 7, 8, IGNORE, 9, 10]
    assert loss_weights(labels, TrainConfig(lead_tokens=2, lead_weight=3.0)) == [0, 0, 3, 3, 1, 1, 0, 3, 3]


def test_shared_prefix_stops_where_examples_differ_or_a_label_starts():
    assert shared_prefix([([1, 2, 3], [IGNORE, IGNORE, 3]), ([1, 2, 4], [IGNORE, IGNORE, 4])]) == 2
    assert shared_prefix([([1, 2, 3], [IGNORE, 2, 3]), ([1, 2, 3], [IGNORE, 2, 3])]) == 1


@pytest.mark.parametrize(
    "question,lang",
    [
        ("Can you check order {order_id} for me?", "en"),
        ("订单{order_id}到哪了？", "zh"),
        ("{tracking} has been stuck for a while, what's going on?", "en"),
    ],
)
def test_noisy_questions_keep_their_placeholders(question, lang):
    rng = random.Random(0)
    slots = corpus.SLOT_RE.findall(question)
    rewrites = {noisy(rng, question, lang, p_drop=0.5) for _ in range(50)}
    assert len(rewrites) > 5
    for r in rewrites:
        assert corpus.SLOT_RE.findall(r) == slots and corpus.SLOT_RE.sub("", r).strip()


def test_training_conversations_rewrite_questions_before_filling_slots():
    data = corpus.load()
    seen = []

    def rewrite(rng, question, lang):
        seen.append(question)
        return question.upper().replace("{ORDER_ID}", "{order_id}") if "{" not in question else question

    convs = corpus.training_conversations(data, 50, rewrite=rewrite)
    assert seen and not any(corpus.SLOT_RE.search(m["content"]) for c in convs for m in c)
    questions = {q for e in data.faq for q in e.questions} | {q for t in data.tools for q in t.questions}
    assert all(q in questions for q in seen)
    assert any(c[0]["role"] == corpus.TOOLS_ROLE for c in convs), "tool conversations are rewritten too"


def test_set_overrides_take_the_settings_type_and_name_what_is_wrong():
    from switchboard.training.settings import override

    assert override(TrainConfig(), "lr=0.003").lr == 0.003
    assert override(TrainConfig(), "lead_tokens=5").lead_tokens == 5
    with pytest.raises(ValueError, match="lead_tokens must be int"):
        override(TrainConfig(), "lead_tokens=1.5")
    with pytest.raises(ValueError, match="KEY one of"):
        override(TrainConfig(), "learning_rate=1")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        override(TrainConfig(), "lr")
