"""Answer accuracy of an exported model on the corpus: does greedy decoding give the FAQ
answer for training questions and for held-out paraphrases it never saw?"""

from __future__ import annotations

import random
from dataclasses import dataclass

from switchboard.data import corpus as corpus_mod


@dataclass(frozen=True)
class Accuracy:
    train: float
    heldout: float
    n_train: int
    n_heldout: int
    samples: list[tuple[str, str, str, str]]  # split ("train" or "heldout"), question, expected, answer


def _same(answer: str, expected: str, chars: int = 24) -> bool:
    a, e = answer.strip(), expected.strip()
    return a[:chars] == e[:chars]


def load(artifacts, precision: str = "fp32"):
    """(manifest, tokenizer, an engine of up to 32 rows) of an exported model."""
    from switchboard.artifact.manifest import Manifest
    from switchboard.artifact.tokenizer import TextTokenizer
    from switchboard.engine.runtime import OnnxDecoder
    from switchboard.engine.scheduler import Engine

    manifest = Manifest.load(artifacts)
    engine = Engine(
        OnnxDecoder(artifacts, manifest, precision),
        max_batch=32,
        max_waiting=1 << 16,
        stop_ids=set(manifest.eos_token_ids),
    )
    return manifest, TextTokenizer(artifacts), engine


def generate(engine, requests) -> list[list[int]]:
    """Each (prompt ids, max new tokens, constraint or None) through ``engine`` at once, greedy:
    the generated ids of each."""
    from switchboard.engine.scheduler import GenerationRequest

    class Sink:
        def __init__(self):
            self.tokens, self.done = [], False

        def emit(self, ids, logprobs=None):
            self.tokens += ids

        def finish(self, result):
            self.done = True

        def fail(self, error):
            raise error

        def cancelled(self):
            return False

    sinks = []
    for prompt, max_new, constraint in requests:
        sinks.append(Sink())
        engine.submit(GenerationRequest(prompt, max_new, constraint=constraint), sinks[-1])
    while not all(s.done for s in sinks):
        engine.step()
    return [s.tokens for s in sinks]


def answer_accuracy(
    artifacts, precision: str = "fp32", per_entry: int = 1, seed: int = 0, max_new_tokens: int = 24
) -> Accuracy:
    manifest, tok, engine = load(artifacts, precision)
    rng = random.Random(seed)
    system = [{"role": "system", "content": manifest.system_prompt}] if manifest.system_prompt else []
    cases = []  # (split, question, expected)
    for e in corpus_mod.load().faq:
        for split, pool in (("train", e.questions), ("heldout", e.heldout)):
            for q in rng.sample(list(pool), min(per_entry, len(pool))):
                slots = corpus_mod.sample_slots(rng, e.lang)
                cases.append((split, corpus_mod.fill_slots(slots, q), corpus_mod.fill_slots(slots, e.answer)))

    prompts = [tok.encode(tok.template.render(system + [{"role": "user", "content": q}])) for _, q, _ in cases]
    answers = generate(engine, [(ids, max_new_tokens, None) for ids in prompts])
    hits = {"train": [], "heldout": []}
    samples = []
    for (split, q, expected), tokens in zip(cases, answers):
        answer = tok.decode(tokens)
        hits[split].append(_same(answer, expected))
        samples.append((split, q, expected, answer))
    rate = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    return Accuracy(rate(hits["train"]), rate(hits["heldout"]), len(hits["train"]), len(hits["heldout"]), samples)


def main(argv: list[str] | None = None) -> int:
    import argparse
    from pathlib import Path

    p = argparse.ArgumentParser(
        prog="python -m switchboard.evaluation.answers",
        description="Answer accuracy of an exported default model: greedy answers to FAQ "
        "questions it was trained on and to held-out paraphrases.",
    )
    p.add_argument("--artifacts", type=Path, default=Path("build/artifacts/default"), help="exported model")
    p.add_argument("--precision", default="fp32", help="exported variant")
    p.add_argument(
        "--per-entry", type=int, default=1, help="questions per FAQ entry and split (10 takes every held-out question)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the question and slot choice")
    p.add_argument("--samples", type=int, default=6, help="held-out answers to print")
    args = p.parse_args(argv)
    a = answer_accuracy(args.artifacts, args.precision, per_entry=args.per_entry, seed=args.seed)
    print(
        f"{args.artifacts} {args.precision}: training questions {a.train:.3f} ({a.n_train}), "
        f"held-out paraphrases {a.heldout:.3f} ({a.n_heldout})"
    )
    for _, question, expected, answer in [x for x in a.samples if x[0] == "heldout"][: args.samples]:
        mark = "ok " if _same(answer, expected) else "BAD"
        print(f"  {mark} {question}\n      -> {answer.strip()[:100]}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
