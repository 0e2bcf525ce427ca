"""JSON that always parses, and repetition control, on an exported model:
``python -m perf.json_finish [parse|loop|cost]``.

``parse``: the json_schema case of issue 66 (an object of two free-text strings, which the small
default model never closes) for three questions at max_tokens 64 and 200, greedy, through the
engine as a pool runs it (the chat template's prompt, the grammar, the budget): how many answers
parse, finished by the engine (the default) and cut where the budget ends them (``--no-finish``,
as before finishing existed).

``loop``: the same json_schema answers and one free-text answer the default model writes in
loops, at max_tokens 200, greedy, with presence and frequency penalties: the share of each
answer's 4-token windows that repeat an earlier one.

``cost``: what this adds per token, in process, one thread: a constrained row's finishing check
far from the end of its budget (following the text) and near it (closings tokenized and checked
against the grammar), against the grammar's own mask and accept; the penalties at 4,096 and
262,144 logits (Gemma 3's vocabulary), against a greedy pick.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "topic": {"type": "string"}},
    "required": ["answer", "topic"],
}
QUESTIONS = ["How do I delete my account?", "Where is my order SB12345678?", "Can I change the delivery address?"]
LOOPING = "订单" * 100  # a question the default model answers at length, in loops (tests/integration)


def _engine(artifacts: Path):
    from switchboard.evaluation.answers import load

    manifest, tok, engine = load(artifacts)
    engine.stop_ids = frozenset(manifest.eos_token_ids)
    system = [{"role": "system", "content": manifest.system_prompt}] if manifest.system_prompt else []

    def prompt(question: str) -> list[int]:
        return tok.encode(tok.template.render(system + [{"role": "user", "content": question}]))

    return manifest, tok, engine, prompt


def _run(engine, requests) -> list[tuple[list[int], str]]:
    """Each GenerationRequest through ``engine`` together: (tokens, finish reason)."""

    class Sink:
        def __init__(self):
            self.tokens, self.reason = [], None

        def emit(self, ids, logprobs=None):
            self.tokens += ids

        def finish(self, result):
            self.reason = str(result.reason)

        def fail(self, error):
            raise error

        def cancelled(self):
            return False

    sinks = [Sink() for _ in requests]
    for r, s in zip(requests, sinks):
        engine.submit(r, s)
    while any(s.reason is None for s in sinks):
        engine.step()
    return [(s.tokens, s.reason) for s in sinks]


def parse(args) -> int:
    from switchboard.artifact.grammar import Grammars
    from switchboard.engine.scheduler import GenerationRequest

    manifest, tok, engine, prompt = _engine(args.artifacts)
    grammars = Grammars(args.artifacts / "tokenizer.json", manifest.vocab_size, manifest.end_of_turn_id)
    spec = {"type": "json_schema", "schema": SCHEMA}
    print(f"{args.artifacts}: schema {json.dumps(SCHEMA)}; finishing {'off' if args.no_finish else 'on'}")
    for budget in args.max_tokens:
        asked = [
            GenerationRequest(prompt(q), budget, constraint=grammars.matcher(spec, finish=not args.no_finish))
            for q in QUESTIONS
        ]
        parsed = 0
        for ids, reason in _run(engine, asked):
            text = tok.decode([t for t in ids if t not in manifest.eos_token_ids])
            ok = _parses(text)
            parsed += ok
            shown = text if len(text) <= 110 else text[:60] + " ... " + text[-45:]
            print(
                f"  max_tokens {budget:4d}  {'parses' if ok else 'BROKEN'}  {reason:6s} {len(ids):4d} tokens  {shown!r}"
            )
        print(f"max_tokens {budget}: {parsed} of {len(QUESTIONS)} parse")
    return 0


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def repeated(ids: list[int], n: int = 4) -> float:
    """The share of the n-token windows of ``ids`` that repeat an earlier window."""
    seen, again = set(), 0
    windows = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    for w in windows:
        again += w in seen
        seen.add(w)
    return again / len(windows) if windows else 0.0


def loop(args) -> int:
    from switchboard.artifact.grammar import Grammars
    from switchboard.engine.scheduler import GenerationRequest

    manifest, tok, engine, prompt = _engine(args.artifacts)
    grammars = Grammars(args.artifacts / "tokenizer.json", manifest.vocab_size, manifest.end_of_turn_id)
    spec = {"type": "json_schema", "schema": SCHEMA}
    cases = [(q, spec) for q in QUESTIONS] + [(LOOPING, None)]
    print(f"{args.artifacts}: greedy, max_tokens {args.loop_tokens}; the json_schema case and a free-text answer")
    for presence, frequency in ((0.0, 0.0), (0.5, 0.0), (0.0, 0.5), (1.0, 1.0)):
        asked = [
            GenerationRequest(
                prompt(q),
                args.loop_tokens,
                constraint=None if fmt is None else grammars.matcher(fmt),
                presence_penalty=presence,
                frequency_penalty=frequency,
            )
            for q, fmt in cases
        ]
        shares = []
        for (_, fmt), (ids, reason) in zip(cases, _run(engine, asked)):
            text = tok.decode([t for t in ids if t not in manifest.eos_token_ids])
            shares.append(repeated(ids))
            kind = "text" if fmt is None else "json" if _parses(text) else "BROKEN"
            print(
                f"  presence {presence:.1f} frequency {frequency:.1f}  {kind:6s} {reason:6s} "
                f"{len(ids):4d} tokens, {shares[-1]:.2f} of 4-token windows repeat  {text[-60:]!r}"
            )
        print(f"presence {presence:.1f} frequency {frequency:.1f}: mean share repeated {statistics.mean(shares):.2f}")
    return 0


def _per_call_us(fn, repeat: int) -> float:
    """Median over ``repeat`` runs of ``fn()`` (which returns the calls it made) per call, in microseconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        calls = fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def cost(args) -> int:
    from switchboard.artifact.grammar import NEAR, Grammars
    from switchboard.engine.sampling import Counts, penalize, sample

    manifest = json.loads((args.artifacts / "manifest.json").read_text())
    grammars = Grammars(args.artifacts / "tokenizer.json", manifest["vocab_size"], manifest["end_of_turn_id"])
    spec = {"type": "json_schema", "schema": SCHEMA}
    tok = grammars.tokenizer
    text = '{"answer":"' + "Go to Account Settings > Privacy > Delete account. " * 8
    ids = tok.tokenize_str(text)  # an answer still in its free text: every step has a closing to find
    width = grammars.width

    def masked(choose: int | None):
        def run() -> int:
            row = grammars.matcher(spec, finish=choose is not None)
            logits = np.zeros(width, np.float32)
            for i, t in enumerate(ids):
                row.mask(logits)
                if choose is not None:
                    t = row.choose(t, choose if choose else len(ids) + 10**6 - i)
                row.accept(t)
            return len(ids)

        return run

    def near() -> int:
        row = grammars.matcher(spec)
        for t in ids[:40]:
            row.accept(t)
        n = 0
        for t in ids[40:]:
            row.finishing([t], None)  # what choose does each step within NEAR tokens of the end
            row.accept(t)
            n += 1
        return n

    print(f"{args.artifacts}: {len(ids)} tokens of a free-text answer, vocabulary {grammars.vocab}")
    base = _per_call_us(masked(None), args.repeat)
    far = _per_call_us(masked(0), args.repeat)
    print(f"  grammar mask + accept, per token:                  {base:7.1f} us")
    print(f"  ... + finishing check far from the budget's end:   {far:7.1f} us (+{far - base:.1f})")
    print(f"  finishing check within {NEAR} tokens of the end (each): {_per_call_us(near, args.repeat):7.1f} us")
    rng = np.random.default_rng(0)
    for vocab in (4096, 262144):
        logits = rng.normal(size=vocab).astype(np.float32)
        for distinct in (50, 200):
            written = zip(rng.choice(vocab, distinct, replace=False), rng.integers(1, 5, distinct))
            counts = Counts.of({int(t): int(c) for t, c in written})

            def pen(counts=counts, logits=logits) -> int:
                for _ in range(200):
                    penalize(logits, counts, 0.5, 0.5)
                return 200

            us = _per_call_us(pen, args.repeat)
            print(f"  penalties, {vocab:6d} logits, {distinct:3d} distinct tokens written: {us:6.1f} us per token")

        def greedy(logits=logits) -> int:
            for _ in range(200):
                sample(logits, 0.0, 1.0, rng)
            return 200

        print(
            f"  greedy pick (argmax), {vocab:6d} logits:                    {_per_call_us(greedy, args.repeat):6.1f} us"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.json_finish", description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", choices=("parse", "loop", "cost"), default="parse")
    p.add_argument("--artifacts", type=Path, default=Path("build/artifacts/default"), help="exported model")
    p.add_argument("--max-tokens", type=int, nargs="+", default=[64, 200], help="budgets (parse)")
    p.add_argument("--no-finish", action="store_true", help="cut answers where the budget ends them (parse)")
    p.add_argument("--loop-tokens", type=int, default=200, help="budget of the free-text answers (loop)")
    p.add_argument("--repeat", type=int, default=5, help="runs per figure, median (cost)")
    args = p.parse_args(argv)
    return {"parse": parse, "loop": loop, "cost": cost}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
