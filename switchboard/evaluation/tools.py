"""Tool use of an exported model: does it call the right tool, with the right arguments, on
held-out questions it never saw (corpus/tools.jsonl's ``heldout``), stay in text for questions
the FAQ answers, and answer from the tool's result?

Served as chat serves it: the prompt through the chat template with the demo's tools
(switchboard/serving/order_demo.py), the answer held by the same grammar (``tool_choice`` auto,
and required), greedy, its calls read by the same parser. ``python -m switchboard.evaluation.tools``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from switchboard.data import corpus as corpus_mod
from switchboard.evaluation.answers import generate, load


@dataclass
class Case:
    lang: str
    question: str
    tool: str | None  # the tool that answers it (None: a question the FAQ answers)
    arguments: dict | None
    called: dict[str, list[dict]] = field(default_factory=dict)  # mode -> the calls made
    answer: str = ""  # to the tool's result (auto's first call)


def tool_accuracy(artifacts, precision: str = "fp32", seed: int = 0, negatives: int = 42) -> list[Case]:
    from switchboard.artifact.grammar import Grammars
    from switchboard.artifact.tools import ToolCallParser, ToolFormat
    from switchboard.serving import order_demo

    manifest, tok, engine = load(artifacts, precision)
    fmt = ToolFormat.of(tok.template)
    grammars = Grammars(artifacts / "tokenizer.json", manifest.vocab_size, manifest.end_of_turn_id)
    data = corpus_mod.load()
    rng = random.Random(seed)
    cases = []
    for entry in data.tools:
        for q in entry.heldout:
            slots = corpus_mod.sample_slots(rng, entry.lang)
            call = entry.call(slots)
            cases.append(Case(entry.lang, corpus_mod.fill_slots(slots, q), entry.tool, call["arguments"]))
    faq = [e for e in data.faq if e.heldout and e.topic not in corpus_mod.TOOL_TOPICS]
    for e in rng.sample(faq, min(negatives, len(faq))):
        slots = corpus_mod.sample_slots(rng, e.lang)
        cases.append(Case(e.lang, corpus_mod.fill_slots(slots, rng.choice(e.heldout)), None, None))

    system = [{"role": "system", "content": manifest.system_prompt}] if manifest.system_prompt else []
    schemas = [{"name": t["function"]["name"], "parameters": t["function"]["parameters"]} for t in order_demo.TOOLS]

    def prompt(messages):
        return tok.encode(tok.template.render(system + messages, tools=order_demo.TOOLS))

    def calls(ids) -> list[dict]:
        parser = ToolCallParser(fmt, set(order_demo.NAMES))
        parser.feed(tok.decode(ids))
        parser.flush()
        return parser.calls

    for mode in ("auto", "required"):
        spec = {"type": "tool_calls", "mode": mode, "tools": schemas, "format": fmt.to_dict(), "parallel": True}
        todo = [c for c in cases if mode == "auto" or c.tool]
        asked = [(prompt([{"role": "user", "content": c.question}]), 96, grammars.matcher(spec)) for c in todo]
        for case, ids in zip(todo, generate(engine, asked)):
            case.called[mode] = calls(ids)

    # the answer to the first call's result (the fake order service's), as the web demo gets it
    follow = [c for c in cases if c.called.get("auto")]
    asked = []
    for c in follow:
        call = c.called["auto"][0]
        result = order_demo.call(call["function"]["name"], json.loads(call["function"]["arguments"]))
        messages = [
            {"role": "user", "content": c.question},
            {"role": "assistant", "content": "", "tool_calls": [_parsed(call)]},
            {"role": "tool", "content": json.dumps(result, ensure_ascii=False, separators=(",", ":"))},
        ]
        asked.append((prompt(messages), 96, None))
    for case, ids in zip(follow, generate(engine, asked)):
        case.answer = tok.decode(ids)
    return cases


def _parsed(call: dict) -> dict:
    fn = call["function"]
    return {**call, "function": {"name": fn["name"], "arguments": json.loads(fn["arguments"])}}


def summary(cases: list[Case]) -> dict:
    """Rates per language, per expected tool and overall: the right tool (auto, required), the
    right arguments, calls made for FAQ questions, answers that restate the order from the
    tool's result."""

    def first(c: Case, mode: str) -> dict | None:
        made = c.called.get(mode) or []
        return made[0]["function"] if made else None

    def rate(hits: list[bool]) -> float | None:
        return round(sum(hits) / len(hits), 3) if hits else None

    out = {}
    tools = sorted({c.tool for c in cases if c.tool})
    for lang in ("en", "zh", *tools, "all"):
        mine = [c for c in cases if lang in ("all", c.lang, c.tool)]
        tools = [c for c in mine if c.tool]
        row = {"tool_questions": len(tools), "faq_questions": len(mine) - len(tools)}
        for mode in ("auto", "required"):
            picked = [first(c, mode) for c in tools]
            row[f"{mode}_right_tool"] = rate([p is not None and p["name"] == c.tool for p, c in zip(picked, tools)])
            row[f"{mode}_right_arguments"] = rate(
                [p is not None and p["name"] == c.tool and json.loads(p["arguments"]) == c.arguments
                 for p, c in zip(picked, tools)]
            )  # fmt: skip
        row["faq_called_a_tool"] = rate([bool(c.called.get("auto")) for c in mine if not c.tool])
        with_order = [c for c in mine if c.answer and c.arguments and "order_id" in c.arguments]
        row["answer_restates_order"] = rate([c.arguments["order_id"] in c.answer for c in with_order])
        out[lang] = row
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    from pathlib import Path

    p = argparse.ArgumentParser(
        prog="python -m switchboard.evaluation.tools",
        description="Tool use of an exported default model on held-out questions: the right tool and "
        "arguments with tool_choice auto and required, no call for FAQ questions, the answer to the result.",
    )
    p.add_argument("--artifacts", type=Path, default=Path("build/artifacts/default"), help="exported model")
    p.add_argument("--precision", default="fp32", help="exported variant")
    p.add_argument("--seed", type=int, default=0, help="seed of the slot values and the FAQ questions")
    p.add_argument("--json", type=Path, help="also write the cases and the summary here")
    p.add_argument("--samples", type=int, default=6, help="cases to print")
    args = p.parse_args(argv)
    cases = tool_accuracy(args.artifacts, args.precision, args.seed)
    table = summary(cases)
    keys = list(table["all"])
    print(f"{args.artifacts} {args.precision}")
    width = max(len(k) for k in table) + 2
    print(f"{'':24}" + "".join(f"{k:>{width}}" for k in table))
    for k in keys:
        print(f"{k:24}" + "".join(f"{'-' if table[c][k] is None else table[c][k]:>{width}}" for c in table))
    for c in cases[: args.samples] + [c for c in cases if not c.tool][:2]:
        made = [f"{x['function']['name']}({x['function']['arguments']})" for x in c.called.get("auto", [])]
        print(
            f"  {c.question}\n      auto -> {', '.join(made) or 'text'}"
            + (f"\n      then: {c.answer[:90]}" if c.answer else "")
        )
    if args.json:
        rows = [{"lang": c.lang, "question": c.question, "tool": c.tool, "arguments": c.arguments,
                 "called": c.called, "answer": c.answer} for c in cases]  # fmt: skip
        args.json.write_text(json.dumps({"summary": table, "cases": rows}, ensure_ascii=False, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
