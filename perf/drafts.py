"""Speculative decoding's drafts, measured without a model: how many tokens a pass would take.

The exported model's corpus answers are indexed (as a pool starts with them), then the answers
of held-out conversations are decoded as if the model wrote them: each pass drafts from the
row's conversation and the answers, takes the draft's agreeing prefix and one more token, and
the served answer joins the index. Tokens per pass is the ceiling speculation can reach on
these answers (the engine's own figures, with the model choosing, are in the export's manifest).

``--arctic`` runs arctic-inference's C++ suffix tree (``SuffixDecodingCache``, the anchor the
issue names) on the same work. PyPI ships it as an sdist only, so its ``csrc/suffix_decoding``
is built once into ``build/arctic-suffix`` (nanobind, CMake, Ninja, a C++20 compiler).

``--engine`` runs the export's own measurement again on an exported model (the engine with and
without drafts, what the manifest's ``speculation`` records), e.g. after a change to the engine.
``--packing CHECKPOINT`` runs the engine on ``runtime: torch`` (which packs passes) with no
drafts, with drafts verified in padded passes, and in packed passes (each draft whole).

    python -m perf drafts [--artifacts build/artifacts/default] [--arctic | --engine | --packing build/default-model]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

ARCTIC = "arctic-inference==0.3.0"
ARCTIC_SHA256 = "7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36"
NANOBIND = "nanobind==2.9.2"
ROOT = Path(__file__).resolve().parent.parent


def workload(artifacts: Path, conversations: int, seed: int, limit: int):
    """(corpus answers, [(conversation before the answer, the answer)]) in the model's tokens."""
    from switchboard.artifact.manifest import Manifest
    from switchboard.artifact.tokenizer import TextTokenizer
    from switchboard.data import corpus
    from switchboard.export.speculation import corpus_answers

    tok, manifest = TextTokenizer(artifacts), Manifest.load(artifacts)
    end = manifest.end_of_turn_id
    answers = corpus_answers(tok, end)
    held_out = []
    for conv in corpus.training_conversations(corpus.load(), conversations, seed=seed):
        before: list[int] = []
        for m in conv:
            text = m.get("content")
            if not isinstance(text, str):
                continue
            ids = tok.encode(text) + ([end] if m["role"] == "assistant" else [])
            if m["role"] == "assistant":
                held_out.append((list(before), ids))
            before += ids
    return answers, held_out[:limit]


def simulate(drafter_for, held_out, k: int) -> dict:
    """``drafter_for(prompt)`` -> (propose(max_tokens) -> tokens, accept(tokens), finish())."""
    passes = tokens = drafts = 0
    spent = 0.0
    for prompt, answer in held_out:
        propose, accept, finish = drafter_for(prompt)
        i = 0
        while i < len(answer):
            room = min(k, len(answer) - i - 1)
            t0 = time.perf_counter()
            draft = propose(room) if room > 0 else ()
            spent += time.perf_counter() - t0
            drafts += 1
            n = 0
            while n < len(draft) and draft[n] == answer[i + n]:
                n += 1
            got = answer[i : i + n + 1]
            accept(got)
            i += len(got)
            passes += 1
        tokens += len(answer)
        finish()
    return {"tokens_per_pass": round(tokens / passes, 3), "us_per_draft": round(spent / drafts * 1e6, 1)}


def ours(answers, depth: int):
    from switchboard.engine.draft import Drafter, SuffixIndex

    corpus = SuffixIndex(max_depth=depth)
    for a in answers:
        corpus.add(a)
    drafter = Drafter(SuffixIndex(max_depth=depth, capacity=4096), corpus, max_depth=depth)

    def start(prompt):
        row = drafter.start(prompt)
        return (lambda k: row.propose(k).tokens), row.accept, row.finish

    return start


def build_arctic(out: Path) -> Path:
    """arctic-inference's suffix tree extension, built from its sdist (once)."""
    package = out / "arctic_inference" / "suffix_decoding"
    if list(package.glob("_C*.so")):
        return out
    work = out / "src"
    work.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "-q"]
    # without build isolation: pip would otherwise install the sdist's build requirements (torch)
    # just to read its metadata
    subprocess.run([*pip, "download", "--no-deps", "--no-build-isolation", ARCTIC, "-d", str(work)], check=True)
    subprocess.run([*pip, "install", "--target", str(work / "nanobind"), NANOBIND], check=True)
    [sdist] = work.glob("arctic_inference-*.tar.gz")
    if hashlib.sha256(sdist.read_bytes()).hexdigest() != ARCTIC_SHA256:
        raise SystemExit(f"{sdist}: not the sdist this benchmark was written against ({ARCTIC_SHA256})")
    subprocess.run(["tar", "xzf", str(sdist), "-C", str(work)], check=True)
    source = next(work.glob("arctic_inference-*/"))
    tree = source / "csrc" / "suffix_decoding"
    env = {"PYTHONPATH": str(work / "nanobind"), "PATH": "/usr/bin:/bin"}
    build = work / "build"
    subprocess.run(
        ["cmake", "-S", str(tree), "-B", str(build), "-G", "Ninja", f"-DPython_EXECUTABLE={sys.executable}"],
        check=True,
        env=env,
    )
    subprocess.run(["cmake", "--build", str(build)], check=True, env=env)
    package.mkdir(parents=True, exist_ok=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "cache.py").write_text((source / "arctic_inference" / "suffix_decoding" / "cache.py").read_text())
    for so in build.glob("_C*.so"):
        (package / so.name).write_bytes(so.read_bytes())
    return out


def arctic(answers, depth: int, where: Path):
    sys.path.insert(0, str(where))
    from arctic_inference.suffix_decoding.cache import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=100000)
    for i, a in enumerate(answers):
        cache.start_request(f"corpus-{i}", [])
        cache.add_active_response(f"corpus-{i}", a)
        cache.stop_request(f"corpus-{i}")
    count = iter(range(1 << 30))

    def start(prompt):
        rid, text = f"row-{next(count)}", list(prompt)
        cache.start_request(rid, prompt)

        def propose(k):
            draft = cache.speculate(
                rid, text[-depth:] or [0], max_spec_tokens=k, max_spec_factor=1.0, min_token_prob=0.1
            )
            return draft.token_ids

        def accept(tokens):
            text.extend(tokens)
            cache.add_active_response(rid, tokens)

        return propose, accept, lambda: cache.stop_request(rid)

    return start


def engine(artifacts: Path) -> dict:
    """export/speculation.py's measurement on an exported model as it is now: the engine on the
    export's 16 held-out questions with and without drafts, at batch 1 and 8 (FP32)."""
    from switchboard.artifact.manifest import Manifest
    from switchboard.artifact.tokenizer import TextTokenizer
    from switchboard.engine.runtime import OnnxDecoder
    from switchboard.export import speculation

    manifest, tok = Manifest.load(artifacts), TextTokenizer(artifacts)
    decoder = OnnxDecoder(artifacts, manifest, "fp32", threads=0)
    answers = speculation.corpus_answers(tok, manifest.end_of_turn_id)
    prompts = speculation.heldout_prompts(tok, manifest.system_prompt, min(manifest.context_window - 1, 512))
    return speculation.measure(decoder, manifest, prompts, answers)


def packing(checkpoint: Path, artifacts: Path, rounds: int = 5, batch: int = 8) -> dict:
    """The engine on ``runtime: torch`` (which packs) at ``batch``: the export's held-out questions
    decoded a token a pass, with drafts in padded passes (each pass's drafts cut to one width),
    and with drafts in packed passes (each verified whole), interleaved ``rounds`` times."""
    from switchboard.artifact.manifest import Manifest
    from switchboard.artifact.tokenizer import TextTokenizer
    from switchboard.engine.draft import Drafter, DraftLength, Speculation, SuffixIndex
    from switchboard.engine.torch_runtime import TorchDecoder
    from switchboard.export import speculation

    manifest, tok = Manifest.load(artifacts), TextTokenizer(artifacts)
    decoder = TorchDecoder(checkpoint, manifest, "cpu", threads=0)
    answers = speculation.corpus_answers(tok, manifest.end_of_turn_id)
    prompts = speculation.heldout_prompts(tok, manifest.system_prompt, min(manifest.context_window - 1, 512))
    corpus = SuffixIndex()
    for a in answers:
        corpus.add(a)
    cost = manifest.speculation.get("cost_per_token", 0.16)
    arms = {"plain": (None, False), "drafts, padded": (True, False), "drafts, packed": (True, True)}
    seconds = dict.fromkeys(arms, 0.0)
    stats, tokens = {}, {}
    for _ in range(rounds):
        for name, (drafting, pack) in arms.items():
            spec = Speculation(Drafter(None, corpus), DraftLength(cost=cost)) if drafting else None
            s, out, stats[name] = speculation._generate(decoder, manifest, prompts, 48, batch, spec, pack)
            seconds[name] += s
            tokens[name] = out
    assert all(t == tokens["plain"] for t in tokens.values()), "an arm answered differently"
    n = sum(len(t) for t in tokens["plain"]) * rounds
    return {
        name: {
            "tokens_per_s": round(n / seconds[name], 1),
            "speedup": round(seconds["plain"] / seconds[name], 3),
            "verify_steps": stats[name]["verify_steps"],
            "drafted_tokens": stats[name]["drafted_tokens"],
            "accepted_tokens": stats[name]["accepted_tokens"],
            "packed_passes": stats[name]["packed_passes"],
        }
        for name in arms
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf drafts", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifacts", type=Path, default=ROOT / "build" / "artifacts" / "default", help="exported model")
    p.add_argument("--conversations", type=int, default=300, help="held-out conversations")
    p.add_argument("--seed", type=int, default=12345, help="their seed (the corpus trains on seed 0)")
    p.add_argument("--answers", type=int, default=400, help="held-out answers decoded")
    p.add_argument("--draft", type=int, default=8, help="the most tokens a draft may have")
    p.add_argument("--depth", type=int, default=24, help="the longest match counted (tree depth)")
    p.add_argument("--arctic", action="store_true", help="also arctic-inference's C++ suffix tree (built once)")
    p.add_argument(
        "--engine",
        action="store_true",
        help="instead: the export's measurement again (the engine with and without drafts: the manifest's)",
    )
    p.add_argument(
        "--packing",
        type=Path,
        metavar="CHECKPOINT",
        help="instead: on runtime torch with this checkpoint, drafts verified in padded passes against packed ones",
    )
    p.add_argument("--out", type=Path, help="write results.json here")
    args = p.parse_args(argv)
    if args.engine or args.packing:
        results = packing(args.packing, args.artifacts) if args.packing else engine(args.artifacts)
        print(json.dumps(results, indent=2))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        return 0
    answers, held_out = workload(args.artifacts, args.conversations, args.seed, args.answers)
    print(
        f"{len(answers)} corpus answers; {len(held_out)} held-out answers, "
        f"{sum(len(a) for _, a in held_out)} tokens; drafts up to {args.draft}, depth {args.depth}"
    )
    results = {"switchboard": simulate(ours(answers, args.depth), held_out, args.draft)}
    if args.arctic:
        where = build_arctic(ROOT / "build" / "arctic-suffix")
        results[ARCTIC] = simulate(arctic(answers, args.depth, where), held_out, args.draft)
    print("| index | tokens per pass | µs per draft |\n|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['tokens_per_pass']:.2f} | {r['us_per_draft']:.1f} |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
