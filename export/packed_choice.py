"""The packed pass beside the padded one: which of the two graphs a variant serves from.

A packed graph (``onnx_export.export_packed``) feeds only the rows' real tokens; the padded graph
feeds every row as wide as the widest, or the engine runs each group of rows that take as many
new tokens in a pass of its own. Which costs less depends on the model and the runtime's kernels
(the packed graph gathers and scatters its tokens around attention), so the export times both on
the passes serving makes, interleaved, and records the choice per variant in the manifest:

- a prompt's chunk of ``prefill_budget`` tokens beside the running rows' decode tokens (a mixed
  pass; padded: the chunk's pass, then the decode rows' pass),
- the running rows' decode tokens alone,
- rows verifying drafts of different lengths.

The packed graph serves where it costs no more than the padded graph's best way to run the same
rows on every one of them. ``python -m perf packed-cost`` shows the same passes at more chunk sizes.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

DRAFTS = (0, 0, 0, 0, 2, 4, 7, 1)  # rows verifying drafts of these lengths (plus each row's next token)


def cases(chunks: list[int], rows: int, seed: int = 0, vocab: int = 4000) -> dict[str, list[list[int]]]:
    """The passes to time, by name: each row's new token ids (random, below ``vocab``: the cost
    does not depend on them)."""
    rng = np.random.default_rng(seed)

    def tokens(n: int) -> list[int]:
        return [int(t) for t in rng.integers(10, min(vocab, 4000), n)]

    out = {
        f"a {c}-token chunk + {rows - 1} decode rows": [tokens(c)] + [tokens(1) for _ in range(rows - 1)]
        for c in chunks
    }
    out[f"{rows} decode rows"] = [tokens(1) for _ in range(rows)]
    drafts = [DRAFTS[i % len(DRAFTS)] for i in range(rows)]
    out[f"{rows} rows verifying drafts of {','.join(map(str, drafts))}"] = [tokens(d + 1) for d in drafts]
    return out


def padded_feed(rows: list[list[int]], past: dict, mask: np.ndarray, next_pos: np.ndarray, idx: list[int]) -> dict:
    """The padded graph's inputs for rows ``idx``: [b, S], each row right-aligned."""
    from switchboard.engine.packing import pack

    p = pack([rows[i] for i in idx], next_pos[idx], mask[idx])
    b, s = len(idx), p.width
    ids, pos = np.zeros(b * s, np.int64), np.zeros(b * s, np.int64)
    ids[p.token_index], pos[p.token_index] = p.input_ids[0], p.position_ids[0]
    feed = {"input_ids": ids.reshape(b, s), "attention_mask": p.attention_mask, "position_ids": pos.reshape(b, s)}
    feed["logits_index"] = np.array([-1], np.int64)
    return feed | {name: a[idx] for name, a in past.items()}


def packed_feed(rows: list[list[int]], past: dict, mask: np.ndarray, next_pos: np.ndarray) -> tuple[dict, object]:
    from switchboard.engine.packing import pack

    p = pack(rows, next_pos, mask)
    return p.inputs() | past, p


def cache(session, rows: int, context: int, seed: int = 0) -> tuple[dict, np.ndarray, np.ndarray]:
    """A cache of ``context`` random columns for ``rows`` rows, in ``session``'s past inputs:
    (past by input name, attention mask, each row's next position)."""
    inputs = {i.name: i for i in session.get_inputs()}
    pasts = [n for n in inputs if n.startswith("past_key_values")]
    _, heads, _, dim = inputs[pasts[0]].shape
    rng = np.random.default_rng(seed)
    past = {n: rng.standard_normal((rows, heads, context, dim)).astype(np.float32) for n in pasts}
    return past, np.ones((rows, context), np.int64), np.full(rows, context, np.int64)


def time_passes(
    padded, packed, chunks: list[int], rows: int, context: int, repeats: int, say=None, vocab: int = 4000
) -> dict:
    """Milliseconds of each case's pass on the ``padded`` and ``packed`` sessions, and as a
    padded pass per new length, interleaved (median of ``repeats`` after one to warm each shape):
    ``{case: {"tokens", "padded_tokens", "ms": {"padded", "packed", "per_length"}}}``."""
    past, mask, next_pos = cache(padded, rows, context)
    results = {}
    for name, new in cases(chunks, rows, vocab=vocab).items():
        feed, p = packed_feed(new, past, mask, next_pos)
        full = padded_feed(new, past, mask, next_pos, list(range(rows)))
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(new):
            groups.setdefault(len(r), []).append(i)
        per_length = [padded_feed(new, past, mask, next_pos, idx) for idx in groups.values()]
        runs = {
            "padded": lambda full=full: padded.run(["logits"], full),
            "packed": lambda feed=feed: packed.run(["logits"], feed),
            "per_length": lambda feeds=per_length: [padded.run(["logits"], f) for f in feeds],
        }
        for run in runs.values():
            run()  # the shape warmed
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(repeats):
            for k, run in runs.items():
                t0 = time.perf_counter()
                run()
                times[k].append(time.perf_counter() - t0)
        ms = {k: statistics.median(v) * 1000 for k, v in times.items()}
        results[name] = {"tokens": p.tokens, "padded_tokens": p.padded_tokens(), "ms": ms}
        if say:
            say(f"{name}: padded {ms['padded']:.1f} ms, packed {ms['packed']:.1f}, per length {ms['per_length']:.1f}")
    return results


def choose(passes: dict) -> dict:
    """The graph to serve from, given ``time_passes``'s results: packed only where it costs no more
    than the padded graph's cheaper way (one padded pass or a pass per length) on every case. A
    packed graph that wins some passes and loses others, even by 2% on the decode rows alone, served
    fewer tokens where it was measured (docs/decisions/2026-11-29-packed-passes.md)."""
    ratios = {name: r["ms"]["packed"] / min(r["ms"]["padded"], r["ms"]["per_length"]) for name, r in passes.items()}
    packed = sum(r["ms"]["packed"] for r in passes.values())
    padded = sum(min(r["ms"]["padded"], r["ms"]["per_length"]) for r in passes.values())
    worst = max(ratios.values())
    return {
        "chosen": "packed" if worst <= 1 else "padded",
        "packed_ms": round(packed, 3),
        "padded_ms": round(padded, 3),
        "ratio": round(packed / padded, 3) if padded else None,
        "worst_ratio": round(worst, 3),
    }


def measure(
    padded,
    packed,
    chunk: int = 64,
    rows: int = 8,
    context: int = 128,
    repeats: int = 5,
    vocab: int = 4000,
) -> dict:
    """One variant's padded and packed graphs (ONNX Runtime sessions, the pools' settings) timed
    on the serving passes, and the choice (``choose``), as the manifest's ``packing[variant]``
    records it."""
    passes = time_passes(padded, packed, [chunk], rows, context, repeats, vocab=vocab)
    setup = {"rows": rows, "context": context, "chunk": chunk, "repeats": repeats}
    return choose(passes) | {"setup": setup, "passes": passes}
