"""Export-time checks of the ONNX graph against PyTorch, through the engine's own batch layout.

Left-padded batches from an empty past, prefill on top of a cached prefix (the multi-turn
case, with masked holes between prefix and new tokens), several greedy decode steps, and a
decode step that verifies a draft (the reference's next tokens, each row's draft one shorter
than the row before: masked columns on the left of a shorter one); the reference is each
sequence run alone and unpadded in PyTorch.
"""

from __future__ import annotations

import numpy as np
import torch

from switchboard.engine.batch import KVBatch, prefill_inputs


def torch_greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    ids = torch.tensor([prompt])
    tokens, logits_seen = [], []
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        for _ in range(steps):
            last = out.logits[0, -1].float().numpy()
            logits_seen.append(last)
            tok = int(last.argmax())
            tokens.append(tok)
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, logits_seen


def onnx_greedy(
    decoder, prompts: list[list[int]], steps: int, reused: list[int] | None = None, pasts: list | None = None
) -> tuple[list[list[int]], list[np.ndarray], KVBatch]:
    m = decoder.manifest
    reused = reused or [0] * len(prompts)
    pasts = pasts or [None] * len(prompts)
    ids, mask, pos, past, next_pos = prefill_inputs(
        prompts, reused, pasts, m.num_layers, m.num_kv_heads, m.head_dim, decoder.dtype
    )
    logits, present = decoder.forward(ids, mask, pos, past)
    batch = KVBatch(present, mask, next_pos)
    last = logits[:, -1]
    tokens = [[] for _ in prompts]
    seen = []
    for step in range(steps):
        seen.append(last)
        for i in range(len(prompts)):
            tokens[i].append(int(last[i].argmax()))
        if step == steps - 1:
            break
        feed = np.asarray([[t[-1]] for t in tokens], np.int64)
        mask = np.concatenate([batch.mask, np.ones((batch.size, 1), np.int64)], axis=1)
        logits, present = decoder.forward(feed, mask, batch.next_pos[:, None], batch.kv)
        batch = KVBatch(present, mask, batch.next_pos + 1)
        last = logits[:, -1]
    return tokens, seen, batch


def check(model, decoder, prompts: list[list[int]], steps: int = 6) -> dict:
    """Returns the figures; ``ok`` is False when greedy tokens differ or logits drift."""
    refs = [torch_greedy(model, p, steps) for p in prompts]
    tokens, seen, _ = onnx_greedy(decoder, prompts, steps)
    max_diff = max(float(np.abs(seen[s][i] - refs[i][1][s]).max()) for i in range(len(prompts)) for s in range(steps))
    same = sum(tokens[i] == refs[i][0] for i in range(len(prompts)))

    # Multi-turn: cache the first half of each prompt, then prefill the rest on top of it.
    halves = [max(1, len(p) // 2) for p in prompts]
    _, _, first = onnx_greedy(decoder, [p[:h] for p, h in zip(prompts, halves)], 1)
    caches = [first.row_cache(i) for i in range(len(prompts))]
    t2, seen2, _ = onnx_greedy(decoder, prompts, steps, reused=halves, pasts=caches)
    max_diff_reuse = max(
        float(np.abs(seen2[s][i] - refs[i][1][s]).max()) for i in range(len(prompts)) for s in range(steps)
    )
    same_reuse = sum(t2[i] == refs[i][0] for i in range(len(prompts)))
    max_diff_verify = _verify_diff(decoder, prompts, refs) if getattr(decoder, "verifies", False) else None
    worst = max(max_diff, max_diff_reuse, max_diff_verify or 0.0)
    ok = same == len(prompts) and same_reuse == len(prompts) and worst < 1e-3
    return {
        "ok": ok,
        "sequences": len(prompts),
        "decode_steps": steps,
        "greedy_identical": same,
        "max_abs_logit_diff": max_diff,
        "greedy_identical_with_cached_prefix": same_reuse,
        "max_abs_logit_diff_with_cached_prefix": max_diff_reuse,
        "max_abs_logit_diff_verifying_drafts": max_diff_verify,  # None: the graph returns one position
    }


def _verify_diff(decoder, prompts: list[list[int]], refs: list[tuple[list[int], list[np.ndarray]]]) -> float:
    """One pass over each row's first token and a draft of the tokens the reference chose next:
    every position's logits against the reference's at that step."""
    m = decoder.manifest
    ids, mask, pos, past, next_pos = prefill_inputs(
        prompts, [0] * len(prompts), [None] * len(prompts), m.num_layers, m.num_kv_heads, m.head_dim, decoder.dtype
    )
    _, present = decoder.forward(ids, mask, pos, past)
    steps = len(refs[0][0])
    drafts = [max(1, steps - 1 - i % steps) for i in range(len(prompts))]  # rows of different lengths
    n = max(drafts)
    feed = np.zeros((len(prompts), n), np.int64)
    new = np.zeros((len(prompts), n), np.int64)
    positions = np.repeat(next_pos[:, None], n, axis=1)
    for i, k in enumerate(drafts):
        feed[i, n - k :] = refs[i][0][:k]
        new[i, n - k :] = 1
        positions[i, n - k :] += np.arange(k)
    logits, _ = decoder.forward(feed, np.concatenate([mask, new], axis=1), positions, present, keep=n)
    return max(
        float(np.abs(logits[i, n - k + j] - refs[i][1][j + 1]).max()) for i, k in enumerate(drafts) for j in range(k)
    )
