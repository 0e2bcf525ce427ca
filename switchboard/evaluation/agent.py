"""Exported models side by side as agents: ``python -m switchboard.evaluation.agent A [B ...]``.

On the same held-out sets, greedy, through the engine and the grammars chat uses:

- **FAQ**: every held-out paraphrase in corpus/heldout.jsonl; right when the answer starts as
  the FAQ entry's (``answers._same``: the first 24 characters);
- **order numbers copied**: held-out questions that name an order, whose FAQ answer restates
  it: the exact number in the answer;
- **tools** (``switchboard.evaluation.tools``): the right tool with ``tool_choice`` auto and required, the order
  number in its arguments exactly, and in the answer to the tool's result;
- **JSON**: a json_schema answer (``extraction.JSON_SCHEMA``, the instruction in the system
  message) at ``max_tokens`` 64 and 200: parses, the order number exactly, the right topic.

Writes a table (markdown) and the cases (JSON) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from switchboard import paths
from switchboard.data import corpus as corpus_mod
from switchboard.evaluation.answers import _same, generate, load


def faq(artifacts: Path, seed: int = 0) -> dict:
    manifest, tok, engine = load(artifacts)
    rng = random.Random(seed)
    system = [{"role": "system", "content": manifest.system_prompt}] if manifest.system_prompt else []
    cases = []
    for e in corpus_mod.load().faq:
        for q in e.heldout:
            slots = corpus_mod.sample_slots(rng, e.lang)
            cases.append((corpus_mod.fill_slots(slots, q), corpus_mod.fill_slots(slots, e.answer), slots, e))
    prompts = [tok.encode(tok.template.render(system + [{"role": "user", "content": q}])) for q, *_ in cases]
    answers = [tok.decode(ids) for ids in generate(engine, [(p, 64, None) for p in prompts])]
    right = [_same(a, expected) for a, (_, expected, _, _) in zip(answers, cases)]
    orders = [
        slots["order_id"] in a
        for a, (q, _, slots, e) in zip(answers, cases)
        if slots["order_id"] in q and "{order_id}" in e.answer
    ]
    return {
        "faq_heldout": round(sum(right) / len(right), 3),
        "faq_questions": len(right),
        "order_copied_in_answer": round(sum(orders) / len(orders), 3) if orders else None,
        "order_questions": len(orders),
        "samples": [
            {"question": q, "expected": x, "answer": a, "right": r} for (q, x, _, _), a, r in zip(cases, answers, right)
        ][:40],
    }


def tools(artifacts: Path, seed: int = 0) -> dict:
    from switchboard.evaluation.tools import summary, tool_accuracy

    cases = tool_accuracy(artifacts, "fp32", seed)
    table = summary(cases)["all"]
    ordered = [c for c in cases if c.arguments and "order_id" in c.arguments]

    def copied(c, mode: str) -> bool:
        made = c.called.get(mode) or []
        try:
            return (
                bool(made) and json.loads(made[0]["function"]["arguments"]).get("order_id") == c.arguments["order_id"]
            )
        except (ValueError, AttributeError):
            return False

    return {
        "right_tool_auto": table["auto_right_tool"],
        "right_tool_required": table["required_right_tool"],
        "order_copied_in_call_auto": round(sum(copied(c, "auto") for c in ordered) / len(ordered), 3),
        "order_copied_in_call_required": round(sum(copied(c, "required") for c in ordered) / len(ordered), 3),
        "answer_restates_order": table["answer_restates_order"],
        "faq_called_a_tool": table["faq_called_a_tool"],
        "tool_questions": table["tool_questions"],
    }


def json_answers(artifacts: Path, n: int = 40, seed: int = 0) -> dict:
    from switchboard.artifact.grammar import Grammars
    from switchboard.data.extraction import JSON_SCHEMA, json_conversation

    manifest, tok, engine = load(artifacts)
    grammars = Grammars(artifacts / "tokenizer.json", manifest.vocab_size, manifest.end_of_turn_id)
    rng = random.Random(seed)
    data = corpus_mod.load()
    cases = [json_conversation(rng, data, heldout=True) for _ in range(n)]
    out = {}
    spec = {"type": "json_schema", "schema": JSON_SCHEMA}
    for budget in (64, 200):
        asked = [(tok.encode(tok.template.render(m)), budget, grammars.matcher(spec)) for m, _ in cases]
        parsed, orders, topics = [], [], []
        for (_, want), ids in zip(cases, generate(engine, asked)):
            try:
                got = json.loads(tok.decode(ids))
            except ValueError:
                got = None
            parsed.append(isinstance(got, dict))
            got = got if isinstance(got, dict) else {}
            if want["order_id"]:
                orders.append(got.get("order_id") == want["order_id"])
            topics.append(got.get("topic") == want["topic"])
        out[f"json_parses_{budget}"] = round(sum(parsed) / n, 3)
        out[f"json_order_id_{budget}"] = round(sum(orders) / len(orders), 3) if orders else None
        out[f"json_topic_{budget}"] = round(sum(topics) / n, 3)
    out["json_cases"] = n
    return out


ROWS = (
    ("faq_heldout", "FAQ answers right, held-out paraphrases"),
    ("order_copied_in_answer", "order number copied into the FAQ answer"),
    ("right_tool_auto", "right tool, tool_choice auto"),
    ("right_tool_required", "right tool, tool_choice required"),
    ("order_copied_in_call_auto", "order number copied into the call (auto)"),
    ("order_copied_in_call_required", "order number copied into the call (required)"),
    ("answer_restates_order", "answer to the tool's result restates the order"),
    ("faq_called_a_tool", "FAQ questions answered with a call (lower is better)"),
    ("json_parses_64", "json_schema answer parses, max_tokens 64"),
    ("json_parses_200", "json_schema answer parses, max_tokens 200"),
    ("json_order_id_200", "JSON order_id exact (200)"),
    ("json_topic_200", "JSON topic right (200)"),
)


def table(results: dict[str, dict]) -> str:
    names = list(results)
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key, label in ROWS:
        cells = [results[n].get(key) for n in names]
        lines.append(f"| {label} | " + " | ".join("-" if c is None else f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.evaluation.agent", description=__doc__.split("\n\n")[0])
    p.add_argument("artifacts", type=Path, nargs="+", help="exported model directories (build/artifacts/...)")
    p.add_argument("--only", choices=("faq", "tools", "json"), action="append", help="run only these parts")
    p.add_argument("--out", type=Path, default=paths.BUILD / "bench" / "agent-eval")
    args = p.parse_args(argv)
    parts = args.only or ["faq", "tools", "json"]
    results, cases = {}, {}
    for artifacts in args.artifacts:
        row: dict = {}
        if "faq" in parts:
            found = faq(artifacts)
            cases[str(artifacts)] = found.pop("samples")
            row.update(found)
        if "tools" in parts:
            row.update(tools(artifacts))
        if "json" in parts:
            row.update(json_answers(artifacts))
        results[artifacts.name] = row
        print(f"{artifacts}: {json.dumps(row)}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    md = table(results)
    (args.out / "summary.md").write_text(md + "\n")
    (args.out / "results.json").write_text(
        json.dumps({"results": results, "faq_samples": cases}, ensure_ascii=False, indent=1) + "\n"
    )
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
