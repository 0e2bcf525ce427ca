"""The Gemma agent's training pieces (switchboard/training/gemma.py) on a tiny Gemma 3 model and
a small SentencePiece vocabulary written here: the template's labels, the output vocabulary,
and the shared prefix, whose loss and gradients are those of each row computing it."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from switchboard.artifact.tokenizer import ChatTemplate
from switchboard.artifact.tools import ToolFormat
from switchboard.data import corpus, extraction
from switchboard.serving import order_demo
from switchboard.training import gemma
from tests.export import gguf_writer
from tests.export.test_gguf import GEMMA_SPECIALS


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A Gemma-style vocabulary (the GGUF import's tokenizer of a tiny file)."""
    from switchboard.export import gguf

    texts = [m["content"] for c in corpus.training_conversations(corpus.load(), 300) for m in c]
    tokens, types = gguf_writer.spm_vocab(texts, 600, GEMMA_SPECIALS)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        Gemma3TextConfig(vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=512)
    )  # fmt: skip
    tmp = tmp_path_factory.mktemp("gemma")
    special = {"bos": tokens.index("<bos>"), "eos": tokens.index("<eos>"), "unk": tokens.index("<unk>")}
    path = gguf_writer.write(model, tmp / "tiny.gguf", "gemma3", tokens, types, special=special)
    out = gguf.ensure(path, tmp / "ckpt", say=lambda _: None)
    return out, Tokenizer.from_file(str(out / "tokenizer.json"))


def test_labels_are_the_answers_and_their_end_of_turn(tokenizer):
    _, tok = tokenizer
    template = ChatTemplate(gemma.AGENT_TEMPLATE, "<bos>", "<eos>")
    call = {"type": "function", "function": {"name": "get_order_status", "arguments": {"order_id": "SB12345678"}}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "where is SB12345678"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"status":"shipped"}'},
        {"role": "assistant", "content": "It has shipped."},
    ]
    ids, labels = gemma.encode(tok, template, messages, order_demo.TOOLS)
    trained = tok.decode([i for i, y in zip(ids, labels) if y != gemma.IGNORE], skip_special_tokens=False)
    want = '<tool_call>{"name":"get_order_status","arguments":{"order_id":"SB12345678"}}</tool_call><end_of_turn>'
    assert trained.replace(" ", "") == (want + "It has shipped.<end_of_turn>").replace(" ", "")
    fmt = ToolFormat.of(template)  # the serving side reads the same format off the template
    assert fmt.begin == '<tool_call>{"name":"' and fmt.end == "}</tool_call>"


def test_output_vocabulary_keeps_bytes_controls_and_every_trained_token(tokenizer):
    _, tok = tokenizer
    cfg = gemma.AgentConfig(conversations=40, vocab_head=10)
    template = ChatTemplate(gemma.AGENT_TEMPLATE, "<bos>", "<eos>")
    examples = [gemma.encode(tok, template, m, t) for m, t in gemma.conversations(corpus.load(), cfg)]
    vocab = set(gemma.output_vocabulary(tok, examples, cfg))
    assert {i for ids, _ in examples for i in ids} <= vocab
    assert {tok.token_to_id(f"<0x{b:02X}>") for b in range(256)} <= vocab
    assert {tok.token_to_id(t) for t in ("<eos>", "<end_of_turn>", "<start_of_turn>")} <= vocab
    assert set(range(10)) <= vocab and len(vocab) < tok.get_vocab_size()


def test_the_shared_prefix_gives_each_rows_loss_and_gradients(tokenizer):
    checkpoint, tok = tokenizer
    cfg = gemma.AgentConfig(conversations=24, batch_size=4, lead_weight=2.0)
    template = ChatTemplate(gemma.AGENT_TEMPLATE, "<bos>", "<eos>")
    examples = [gemma.encode(tok, template, m, t) for m, t in gemma.conversations(corpus.load(), cfg)]
    skip = gemma.prefix_length(examples)
    assert skip > 5, "every conversation opens with the system prompt"
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    vocab = gemma.output_vocabulary(tok, examples, cfg)
    index = torch.tensor(vocab)
    head = model.model.embed_tokens.weight.detach()[index]
    slot_of = torch.full((model.config.vocab_size,), -1, dtype=torch.long)
    slot_of[index] = torch.arange(len(vocab))
    pad = tok.token_to_id("<pad>")
    prefix = torch.tensor(examples[0][0][:skip])
    x, y, mask = next(gemma._batches(examples, cfg, pad, skip))
    xf, yf, maskf = next(gemma._batches(examples, cfg, pad, 0))  # the same rows, whole
    grads = []
    for p_, x_, y_, m_ in ((prefix, x, y, mask), (prefix[:0], xf, yf, maskf)):
        model.zero_grad()
        loss, _ = gemma.step_loss(model, head, slot_of, p_, x_, y_, m_, cfg)
        loss.backward()
        grads.append((loss.item(), model.model.layers[-1].self_attn.k_proj.weight.grad.clone()))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-5)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-4, atol=1e-6)


def test_json_extraction_names_the_order_only_when_the_message_does():
    import random

    rng = random.Random(0)
    for _ in range(200):
        messages, answer = extraction.json_conversation(rng, corpus.load())
        assert extraction.JSON_INSTRUCTION in messages[0]["content"]
        assert (answer["order_id"] != "") == (answer["order_id"] in messages[1]["content"] and answer["order_id"] != "")
        assert set(answer) == set(extraction.JSON_SCHEMA["properties"])
        json.dumps(answer)
