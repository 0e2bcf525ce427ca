"""Accuracy of every exported variant against FP32 on held-out conversations, and the gate.

The held-out set is built from ``corpus/heldout.jsonl`` questions, which neither training nor
calibration ever sees, in the same long-tail classes as calibration (codes, prices, phone
numbers, mixed Chinese/English, long multi-turn prompts). Metrics, per variant:

- greedy sequences identical: free-running greedy continuations equal to FP32's;
- greedy token agreement: tokens before the first divergence, over all tokens;
- teacher-forced top-1: on FP32's continuation, the share of positions where the variant's
  argmax equals FP32's; logits cosine on the same positions;
- perplexity of the reference FAQ answers, and its change relative to FP32;
- answer accuracy (default model only): the greedy answer starts like the FAQ answer.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from switchboard.data import corpus as corpus_mod
from switchboard.engine.batch import KVBatch, prefill_inputs
from switchboard.export.calibration import CLASSES
from switchboard.export.parity import onnx_greedy


@dataclass
class Case:
    kind: str
    messages: list[dict]
    reference: str | None  # the FAQ answer to the last question, when there is one


def heldout_cases(per_class: int, seed: int = 0) -> list[Case]:
    data = corpus_mod.load()
    rng = random.Random(f"heldout:{seed}")
    faq = [e for e in data.faq if e.heldout]
    slot_of = {"codes": ("{sku}", "{order_id}", "{tracking}"), "prices": ("{price}",), "phones": ("{phone}",)}
    cases: list[Case] = []
    for kind in CLASSES:
        if kind in slot_of:
            pool = [(e, q) for e in faq for q in e.heldout if any(s in q for s in slot_of[kind])]
        elif kind == "mixed":
            pool = [(e, q) for e in faq if e.lang == "zh" for q in e.heldout]
        else:
            pool = [(e, q) for e in faq for q in e.heldout if not corpus_mod.SLOT_RE.search(q)]
        for _ in range(per_class):
            e, q = rng.choice(pool)
            slots = corpus_mod.sample_slots(rng, e.lang)
            question = corpus_mod.fill_slots(slots, q)
            if kind == "mixed":
                question += f" ({corpus_mod.sample_slots(rng, 'en')['product']})"
            history: list[dict] = []
            if kind == "long":
                for _ in range(rng.randint(5, 7)):
                    h = rng.choice(faq)
                    s = corpus_mod.sample_slots(rng, h.lang)
                    history += [
                        {"role": "user", "content": corpus_mod.fill_slots(s, rng.choice(h.heldout))},
                        {"role": "assistant", "content": corpus_mod.fill_slots(s, h.answer)},
                    ]
            cases.append(
                Case(kind, history + [{"role": "user", "content": question}], corpus_mod.fill_slots(slots, e.answer))
            )
    return cases


@dataclass
class VariantAccuracy:
    variant: str
    greedy_sequences_identical: float = 1.0
    greedy_token_agreement: float = 1.0
    teacher_forced_top1: float = 1.0
    logits_cosine: float = 1.0
    perplexity: float = float("nan")
    perplexity_delta: float = 0.0
    answer_accuracy: float | None = None
    by_class_top1: dict[str, float] = field(default_factory=dict)
    divergent: int = 0  # greedy continuations that differ from FP32's...
    divergent_at_near_tie: int = 0  # ...first where FP32's two best logits were within NEAR_TIE


@dataclass(frozen=True)
class Gate:
    min_greedy_sequences: float = 0.80
    min_teacher_forced_top1: float = 0.97
    min_logits_cosine: float = 0.99
    max_perplexity_increase: float = 0.10  # relative

    def describe(self) -> str:
        return (
            f"greedy >= {self.min_greedy_sequences}, top-1 >= {self.min_teacher_forced_top1}, "
            f"cosine >= {self.min_logits_cosine}, perplexity <= +{100 * self.max_perplexity_increase:.0f}%"
        )

    def failures(self, a: VariantAccuracy) -> list[str]:
        out = []
        if a.greedy_sequences_identical < self.min_greedy_sequences:
            out.append(f"greedy sequences identical {a.greedy_sequences_identical:.3f} < {self.min_greedy_sequences}")
        if a.teacher_forced_top1 < self.min_teacher_forced_top1:
            out.append(f"teacher-forced top-1 {a.teacher_forced_top1:.3f} < {self.min_teacher_forced_top1}")
        if a.logits_cosine < self.min_logits_cosine:
            out.append(f"logits cosine {a.logits_cosine:.4f} < {self.min_logits_cosine}")
        if a.perplexity_delta > self.max_perplexity_increase:
            out.append(f"perplexity +{100 * a.perplexity_delta:.1f}% > +{100 * self.max_perplexity_increase:.0f}%")
        return out


# A logit gap this small is a coin flip for FP32 itself: INT8's logit error (~0.1 here) flips
# it without changing what the model knows. Counted to read the greedy figure, not gated.
NEAR_TIE = 0.25


def _forced(decoder, prompts: list[list[int]], continuations: list[list[int]], batch: int = 16, columns=None):
    """Teacher-forced logits, one array [len(cont), V] per sequence: row j is the distribution of
    ``cont[j]`` after ``prompt + cont[:j]``. The graph returns the last position's logits only,
    so the continuation is fed one token per step on the KV cache, as the engine decodes.
    ``columns``: keep only these logits (a restricted head's live tokens: at Gemma's 262,144
    the full rows of 144 conversations are gigabytes)."""
    m = decoder.manifest
    pick = (lambda row: row[columns]) if columns is not None else (lambda row: row.copy())
    out = []
    for i in range(0, len(prompts), batch):
        ps, cs = prompts[i : i + batch], continuations[i : i + batch]
        ids, mask, pos, past, next_pos = prefill_inputs(
            ps, [0] * len(ps), [None] * len(ps), m.num_layers, m.num_kv_heads, m.head_dim, decoder.dtype
        )
        logits, present = decoder.forward(ids, mask, pos, past)
        kv = KVBatch(present, mask, next_pos)
        rows = [[pick(logits[r, -1])] for r in range(len(ps))]
        for j in range(max(len(c) for c in cs) - 1):
            feed = np.asarray([[c[j] if j < len(c) else 0] for c in cs], np.int64)
            mask = np.concatenate([kv.mask, np.ones((kv.size, 1), np.int64)], axis=1)
            logits, present = decoder.forward(feed, mask, kv.next_pos[:, None], kv.kv)
            kv = KVBatch(present, mask, kv.next_pos + 1)
            for r in range(len(cs)):
                rows[r].append(pick(logits[r, -1]))
        out += [np.stack(r)[: len(c)] for r, c in zip(rows, cs)]
    return out


def _greedy(decoder, prompts: list[list[int]], steps: int, batch: int = 16) -> list[list[int]]:
    out = []
    for i in range(0, len(prompts), batch):
        tokens, _, _ = onnx_greedy(decoder, prompts[i : i + batch], steps)
        out += tokens
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def evaluate(
    artifacts: Path,
    variants: list[str],
    cases: list[Case],
    steps: int = 16,
    answer_accuracy: bool = False,
    progress=None,
) -> dict[str, VariantAccuracy]:
    """Every variant against FP32 on ``cases``; ``progress()`` is called after each variant
    (FP32 first), then after each answer-accuracy run."""
    progress = progress or (lambda: None)
    from switchboard.artifact.manifest import Manifest
    from switchboard.artifact.tokenizer import TextTokenizer
    from switchboard.engine import heads
    from switchboard.engine.runtime import OnnxDecoder

    manifest = Manifest.load(artifacts)
    tok = TextTokenizer(artifacts)
    system = [{"role": "system", "content": manifest.system_prompt}] if manifest.system_prompt else []
    limit = manifest.context_window - steps - 1
    prompts = [tok.encode(tok.template.render(system + c.messages))[-limit:] for c in cases]
    refs = [(p, tok.encode(c.reference)[: limit - len(p)]) if c.reference else None for p, c in zip(prompts, cases)]

    decoders = {v: OnnxDecoder(artifacts, manifest, v) for v in ["fp32", *variants]}
    base_greedy = _greedy(decoders["fp32"], prompts, steps)
    scored = [r for r in refs if r]
    # A restricted head (engine/heads.py): only its tokens carry logits, the rest are the same
    # floor in every variant; compared on the live columns alone.
    live = heads.read(artifacts)
    columns = np.asarray(live, np.int64) if live is not None else None

    def continuation_logits(decoder):
        return _forced(decoder, prompts, base_greedy, columns=columns)

    def perplexity(decoder, batch: int = 16) -> float:
        """Over the full rows, a batch at a time (a token outside a restricted head scores the floor)."""
        nll, count = 0.0, 0
        for i in range(0, len(scored), batch):
            part = scored[i : i + batch]
            for row, (_, a) in zip(_forced(decoder, [p for p, _ in part], [a for _, a in part], batch), part):
                lp = _log_softmax(row)
                nll -= float(lp[np.arange(len(a)), a].sum())
                count += len(a)
        return math.exp(nll / max(count, 1))

    base_logits = continuation_logits(decoders["fp32"])
    base_ppl = perplexity(decoders["fp32"])
    results = {"fp32": VariantAccuracy("fp32", perplexity=base_ppl)}
    progress()
    for v in variants:
        d = decoders[v]
        greedy = _greedy(d, prompts, steps)
        same_seq = np.mean([g == b for g, b in zip(greedy, base_greedy)])
        agree, divergent, near_tie = [], 0, 0
        for g, b, base in zip(greedy, base_greedy, base_logits):
            k = next((i for i, (x, y) in enumerate(zip(g, b)) if x != y), len(b))
            agree.append(k / len(b))
            if k < len(b):
                divergent += 1
                top2 = np.sort(base[k])[-2:]
                near_tie += bool(top2[1] - top2[0] < NEAR_TIE)
        logits = continuation_logits(d)
        top1, cos, by_class = [], [], {}
        for case, x, y in zip(cases, logits, base_logits):
            hits = x.argmax(-1) == y.argmax(-1)
            top1 += hits.tolist()
            by_class.setdefault(case.kind, []).extend(hits.tolist())
            # A restricted head's floor (engine/heads.py) is the same in both and no logit: left out,
            # and in float64, where its square would otherwise overflow.
            live = y > np.finfo(np.float32).min
            x, y = np.where(live, x, 0.0).astype(np.float64), np.where(live, y, 0.0).astype(np.float64)
            num = (x * y).sum(-1)
            cos += (num / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1) + 1e-12)).tolist()
        ppl = perplexity(d)
        results[v] = VariantAccuracy(
            v,
            float(same_seq),
            float(np.mean(agree)),
            float(np.mean(top1)),
            float(np.mean(cos)),
            ppl,
            ppl / base_ppl - 1.0,
            by_class_top1={k: float(np.mean(h)) for k, h in by_class.items()},
            divergent=divergent,
            divergent_at_near_tie=near_tie,
        )
        progress()
    if answer_accuracy:
        from switchboard.evaluation.answers import answer_accuracy as measure

        for v, r in results.items():
            r.answer_accuracy = measure(artifacts, v).heldout
            progress()
    return results


def table(
    results: dict[str, VariantAccuracy], gate: Gate, left_out: dict[str, list[str]], failed: dict[str, list[str]]
) -> list[str]:
    """The gate's figures as aligned text rows, one per variant, with its verdict."""
    answers = any(r.answer_accuracy is not None for r in results.values())
    rows = [
        f"{'variant':<16} {'greedy':>6} {'differ':>11} {'top-1':>6} {'cosine':>7} {'ppl':>9}"
        + (f" {'answers':>7}" if answers else "")
    ]
    for v, r in results.items():
        verdict = (
            ""
            if v == "fp32"
            else "FAILS: " + "; ".join(failed[v])
            if v in failed
            else "left out"
            if v in left_out
            else "passes"
        )
        differ = "" if v == "fp32" else f"{r.divergent} ({r.divergent_at_near_tie} tie)"
        ppl = f"{r.perplexity:.3f}" if v == "fp32" else f"{100 * r.perplexity_delta:+.1f}%"
        rows.append(
            f"{v:<16} {r.greedy_sequences_identical:>6.3f} {differ:>11} {r.teacher_forced_top1:>6.3f} "
            f"{r.logits_cosine:>7.4f} {ppl:>9}" + (f" {r.answer_accuracy:>7.3f}" if answers else "") + f"  {verdict}"
        )
    rows.append(
        "differ: greedy continuations unlike FP32's (tie: first differing where FP32's two best "
        f"logits were within {NEAR_TIE})"
    )
    return rows


def as_dict(results: dict[str, VariantAccuracy]) -> dict[str, dict]:
    return {k: asdict(v) for k, v in results.items()}
