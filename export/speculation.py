"""Whether drafts pay for this model: measured at export, recorded in the manifest.

Speculative decoding (switchboard/engine/draft.py) pays where the drafts are often right and a
pass over a few more positions costs little more than a pass over one. Both depend on the
model: a model trained on the corpus writes its answers' sentences again, one with random
weights does not; a small model's pass is bound by Python and memory, a large one's by
arithmetic. So the export measures instead of guessing:

- ``cost_per_token``: a decode pass over ``1 + k`` positions against one over 1, at batch 1 and
  8, on a cache of the held-out prompts (``DraftLength`` sizes drafts with it);
- the engine on held-out questions, greedy, with drafts and without, one conversation at a time
  and eight together: generated tokens per second, the drafted and accepted tokens, and whether
  every answer came out the same, token for token.

``enabled`` is true when drafting was faster at both batch sizes, by at least ``MARGIN``, with
identical answers; a pool's ``speculation: auto`` follows it. The corpus's answers, in the
model's tokens, are written beside the graph (``answers.npz``) for the pools to draft from.
"""

from __future__ import annotations

import time

import numpy as np

from switchboard.data import corpus as corpus_mod
from switchboard.engine.batch import prefill_inputs
from switchboard.engine.draft import ANSWERS, Drafter, DraftLength, Speculation, SuffixIndex, save_answers
from switchboard.engine.scheduler import Engine
from switchboard.evaluation.answers import generate

MARGIN = 1.05  # drafting must be this much faster to be on by default: less is within the spread
DRAFT = 4  # tokens of the verifying pass the cost is measured with


def corpus_answers(tok, end_of_turn: int, conversations: int = 2000, seed: int = 0) -> list[list[int]]:
    """The distinct assistant answers of the training conversations, each ending as a served
    answer ends (with the end-of-turn token)."""
    seen: set[str] = set()
    out = []
    for conv in corpus_mod.training_conversations(corpus_mod.load(), conversations, seed=seed):
        for m in conv:
            text = m.get("content")
            if m["role"] == "assistant" and isinstance(text, str) and text and text not in seen:
                seen.add(text)
                out.append(tok.encode(text) + [end_of_turn])
    return out


def heldout_prompts(tok, system_prompt: str | None, limit: int, n: int = 16) -> list[list[int]]:
    """The prompts drafting is measured on: the accuracy gate's held-out conversations, as the
    chat template renders them (the last ``limit`` tokens)."""
    from switchboard.export import accuracy

    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [tok.encode(tok.template.render(system + c.messages))[-limit:] for c in accuracy.heldout_cases(3)[:n]]


def pass_cost(decoder, prompts: list[list[int]], batch: int, repeats: int = 5) -> float:
    """A verifying pass's extra cost per drafted token, relative to a one-token decode pass
    (the median of ``repeats`` interleaved pairs)."""
    m = decoder.manifest
    rows = (prompts * batch)[:batch]
    ids, mask, pos, past, next_pos = prefill_inputs(
        rows, [0] * batch, [None] * batch, m.num_layers, m.num_kv_heads, m.head_dim, decoder.dtype
    )
    _, cache = decoder.forward(ids, mask, pos, past)

    def timed(n: int) -> float:
        feed = np.ones((batch, n), np.int64)
        grown = np.concatenate([mask, np.ones((batch, n), mask.dtype)], axis=1)
        positions = next_pos[:, None] + np.arange(n)[None, :]
        t0 = time.perf_counter()
        decoder.forward(feed, grown, positions, cache, keep=n)
        return time.perf_counter() - t0

    timed(1), timed(1 + DRAFT)  # warm both shapes
    ratios = []
    for _ in range(repeats):
        one, more = timed(1), timed(1 + DRAFT)
        ratios.append((more / one - 1) / DRAFT)
    return max(0.0, float(np.median(ratios)))


def _generate(
    decoder, manifest, prompts, max_new, batch, speculation, pack: bool = True
) -> tuple[float, list[list[int]], dict]:
    engine = Engine(
        decoder,
        max_batch=batch,
        max_waiting=len(prompts),
        stop_ids=set(manifest.eos_token_ids),
        speculation=speculation,
        pack=pack,
    )
    t0 = time.perf_counter()
    results = generate(engine, [(prompt, max_new, None) for prompt in prompts])
    return time.perf_counter() - t0, results, engine.snapshot()[0]


def measure(
    decoder, manifest, prompts: list[list[int]], answers: list[list[int]], max_new: int = 48, rounds: int = 2
) -> dict:
    """The manifest's ``speculation``: costs, throughput with and without drafts, the decision."""
    if not getattr(decoder, "verifies", False):
        return {"enabled": False, "reason": "the graph returns the last position's logits only"}
    cost = {b: pass_cost(decoder, prompts, b) for b in (1, 8)}

    def speculation() -> Speculation:
        corpus = SuffixIndex()
        for a in answers:
            corpus.add(a)
        return Speculation(Drafter(None, corpus), DraftLength(cost=cost[8], cost_batch_1=cost[1]))

    out: dict = {"cost_per_token": round(cost[8], 4), "cost_per_token_batch_1": round(cost[1], 4)}
    identical, faster = True, True
    for batch, share in ((1, prompts[: max(1, len(prompts) // 4)]), (8, prompts)):
        plain_s = drafted_s = 0.0
        for _ in range(rounds):  # interleaved: a slower moment of the machine costs both alike
            s, plain, _ = _generate(decoder, manifest, share, max_new, batch, None)
            plain_s += s
            s, drafted, stats = _generate(decoder, manifest, share, max_new, batch, speculation())
            drafted_s += s
            identical = identical and drafted == plain
        tokens = sum(len(t) for t in plain) * rounds
        speedup = plain_s / drafted_s
        faster = faster and speedup >= MARGIN
        out[f"batch_{batch}"] = {
            "tokens_per_s": round(tokens / plain_s, 1),
            "tokens_per_s_drafting": round(tokens / drafted_s, 1),
            "speedup": round(speedup, 3),
            "drafted_tokens": stats["drafted_tokens"],
            "accepted_tokens": stats["accepted_tokens"],
            "verify_steps": stats["verify_steps"],
        }
    out["identical"] = identical
    out["enabled"] = identical and faster
    out["answers"] = len(answers)
    return out


def write_answers(out_dir, answers: list[list[int]]) -> None:
    save_answers(out_dir / ANSWERS, answers)
