"""The bilingual customer-service corpus shipped in ``corpus/``.

FAQ entries carry slot placeholders (``{order_id}``, ``{sku}``, ...) that are filled with
seeded random values, so the model sees many order numbers and SKU codes but the corpus stays
small and reviewable. The same loader feeds training, calibration, perf workloads and the
fallback FAQ retrieval; ``heldout.jsonl`` is never used for training.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from switchboard import paths

CORPUS_DIR = paths.CORPUS
SLOT_RE = re.compile(r"\{(order_id|sku|price|product|tracking|phone|days)\}")

_PRODUCTS = {
    "en": [
        "wireless earbuds",
        "running shoes",
        "coffee maker",
        "desk lamp",
        "phone case",
        "backpack",
        "smart watch",
        "air fryer",
        "yoga mat",
        "bluetooth speaker",
        "winter jacket",
        "water bottle",
        "mechanical keyboard",
        "baby stroller",
    ],
    "zh": [
        "蓝牙耳机",
        "跑步鞋",
        "咖啡机",
        "台灯",
        "手机壳",
        "双肩包",
        "智能手表",
        "空气炸锅",
        "瑜伽垫",
        "蓝牙音箱",
        "羽绒服",
        "保温杯",
        "机械键盘",
        "婴儿推车",
    ],
}


def _sku(rng: random.Random) -> str:
    u, d = string.ascii_uppercase, string.digits
    return "SKU-" + rng.choice(u) + rng.choice(d) + rng.choice(u) + rng.choice(d) + rng.choice(d)


def _price(rng: random.Random, lang: str) -> str:
    if lang == "zh":
        return f"{rng.choice([39, 59, 99, 129, 199, 299, 399, 599, 1299])}元"
    return f"${rng.choice([9, 19, 24, 39, 49, 79, 99, 149, 249])}.{rng.choice(['99', '50', '00'])}"


def _phone(rng: random.Random, lang: str) -> str:
    if lang == "zh":
        return f"1{rng.choice('3589')}{rng.randint(0, 9)} {rng.randint(1000, 9999)} {rng.randint(1000, 9999)}"
    return f"+1 {rng.randint(201, 989)}-555-{rng.randint(1000, 9999):04d}"


def _tracking(rng: random.Random) -> str:
    return rng.choice(["SF", "YT", "1Z", "JD"]) + "".join(rng.choice(string.digits) for _ in range(10))


def fill_slots(values: dict[str, str], text: str) -> str:
    return SLOT_RE.sub(lambda m: values[m.group(1)], text)


def sample_slots(rng: random.Random, lang: str) -> dict[str, str]:
    """One consistent set of slot values for a whole conversation."""
    return {
        "order_id": "SB" + "".join(rng.choice(string.digits) for _ in range(8)),
        "sku": _sku(rng),
        "price": _price(rng, lang),
        "product": rng.choice(_PRODUCTS["zh" if lang == "zh" else "en"]),
        "tracking": _tracking(rng),
        "phone": _phone(rng, lang),
        "days": str(rng.randint(2, 14)),
    }


@dataclass(frozen=True)
class FaqEntry:
    id: str
    lang: str
    topic: str
    questions: tuple[str, ...]
    answer: str
    heldout: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Dialog:
    id: str
    lang: str
    turns: tuple[dict, ...]


@dataclass(frozen=True)
class ToolEntry:
    """A question answered by calling a tool (corpus/tools.jsonl): the call's arguments (slots
    filled like the question's), and the tool's possible results, each with the answer to it."""

    id: str
    lang: str
    tool: str
    arguments: dict
    questions: tuple[str, ...]
    heldout: tuple[str, ...]
    results: tuple[dict, ...]  # {"result": JSON text, "answer": text}

    def call(self, slots: dict[str, str]) -> dict:
        """The call with its arguments' slots filled: {"name", "arguments"}."""
        filled = fill_slots(slots, json.dumps(self.arguments, ensure_ascii=False))
        return {"name": self.tool, "arguments": json.loads(filled)}


@dataclass(frozen=True)
class Corpus:
    faq: tuple[FaqEntry, ...]
    dialogs: tuple[Dialog, ...]
    tools: tuple[ToolEntry, ...] = ()

    def files(self) -> list[Path]:
        return sorted(CORPUS_DIR.glob("*.jsonl"))


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: {e}") from None
    return rows


def load(directory: Path = CORPUS_DIR) -> Corpus:
    heldout: dict[str, list[str]] = {}
    if (directory / "heldout.jsonl").exists():
        for row in _read_jsonl(directory / "heldout.jsonl"):
            heldout.setdefault(row["id"], []).extend(row["questions"])
    faq = tuple(
        FaqEntry(
            r["id"], r["lang"], r.get("topic", ""), tuple(r["questions"]), r["answer"], tuple(heldout.get(r["id"], ()))
        )
        for r in _read_jsonl(directory / "faq.jsonl")
    )
    dialogs = ()
    if (directory / "dialogs.jsonl").exists():
        dialogs = tuple(Dialog(r["id"], r["lang"], tuple(r["turns"])) for r in _read_jsonl(directory / "dialogs.jsonl"))
    tools = ()
    if (directory / "tools.jsonl").exists():
        tools = tuple(
            ToolEntry(
                r["id"],
                r["lang"],
                r["tool"],
                r["arguments"],
                tuple(r["questions"]),
                tuple(r.get("heldout", ())),
                tuple(r["results"]),
            )
            for r in _read_jsonl(directory / "tools.jsonl")
        )
    return Corpus(faq, dialogs, tools)


# A conversation whose first message is {"role": TOOLS_ROLE, "content": "a,b,c"} is one where
# the client offered those tools (the template lists them in the system message).
TOOLS_ROLE = "tools"
# FAQ topics a tool answers when tools are offered (not trained as text then)
TOOL_TOPICS = {"order_status", "tracking", "returns", "contact"}


def tool_exchange(
    rng: random.Random, entry: ToolEntry, slots: dict[str, str], rewrite=None, heldout: bool = False
) -> list[dict]:
    """A question, the call that answers it, the tool's result and the answer to that."""
    question = rng.choice(entry.heldout if heldout else entry.questions)
    if rewrite is not None:
        question = rewrite(rng, question, entry.lang)
    outcome = rng.choice(entry.results)
    return [
        {"role": "user", "content": fill_slots(slots, question)},
        {"role": "assistant", "content": "", "tool_calls": [entry.call(slots)]},
        {"role": "tool", "content": fill_slots(slots, outcome["result"])},
        {"role": "assistant", "content": fill_slots(slots, outcome["answer"])},
    ]


def training_conversations(
    corpus: Corpus,
    n: int,
    seed: int = 0,
    max_exchanges: int = 4,
    rewrite: Callable[[random.Random, str, str], str] | None = None,
    tool_share: float = 0.25,
    tools_listed_share: float = 0.06,
) -> list[list[dict]]:
    """Seeded conversations (lists of user/assistant messages) for supervised training.

    With tools in the corpus, some conversations offer the demo's tools (a first ``TOOLS_ROLE``
    message): most of those ask what a tool answers (the call, the tool's result, the answer
    to it; ``tool_exchange``), the rest what the FAQ answers, in text, tools or not.

    Single-turn FAQ pairs dominate; the rest chain several FAQ pairs or replay a dialog so
    the model learns to answer the latest question with earlier turns in its context.
    ``tool_share`` of them go through a tool call, ``tools_listed_share`` offer the tools and are
    answered in text.
    ``rewrite(rng, question, lang)``, if given, may change each FAQ question template before
    its slots are filled (augmentation).
    """
    rng = random.Random(seed)
    by_lang: dict[str, list[FaqEntry]] = {}
    for e in corpus.faq:
        by_lang.setdefault(e.lang, []).append(e)
    out: list[list[dict]] = []
    from switchboard.serving.order_demo import NAMES

    for _ in range(n):
        if corpus.tools and (share := rng.random()) < tool_share + tools_listed_share:
            lang = rng.choice(sorted(by_lang))
            slots = sample_slots(rng, lang)
            conv = [{"role": TOOLS_ROLE, "content": ",".join(NAMES)}]
            if share >= tool_share or rng.random() < 0.3:  # a question the FAQ answers, tools or not
                e = rng.choice([e for e in by_lang[lang] if e.topic not in TOOL_TOPICS])
                question = rng.choice(e.questions)
                if rewrite is not None:
                    question = rewrite(rng, question, e.lang)
                conv += [
                    {"role": "user", "content": fill_slots(slots, question)},
                    {"role": "assistant", "content": fill_slots(slots, e.answer)},
                ]
            if share < tool_share:
                mine = [t for t in corpus.tools if t.lang == lang] or list(corpus.tools)
                tool = rng.choice(sorted({t.tool for t in mine}))  # each tool as often, whatever its intents
                entry = rng.choice([t for t in mine if t.tool == tool])
                conv += tool_exchange(rng, entry, slots, rewrite)
            out.append(conv)
            continue
        kind = rng.random()
        if kind < 0.12 and corpus.dialogs:
            d = rng.choice(corpus.dialogs)
            slots = sample_slots(rng, d.lang)
            out.append([{"role": t["role"], "content": fill_slots(slots, t["content"])} for t in d.turns])
            continue
        lang = rng.choice(sorted(by_lang))
        exchanges = 1 if kind < 0.6 else rng.randint(2, max_exchanges)
        slots = sample_slots(rng, lang)
        conv: list[dict] = []
        for _ in range(exchanges):
            # Mixed-language conversations happen in this domain; let some turns switch.
            pool = by_lang[rng.choice(sorted(by_lang))] if rng.random() < 0.1 else by_lang[lang]
            e = rng.choice(pool)
            question = rng.choice(e.questions)
            if rewrite is not None:
                question = rewrite(rng, question, e.lang)
            conv.append({"role": "user", "content": fill_slots(slots, question)})
            conv.append({"role": "assistant", "content": fill_slots(slots, e.answer)})
        out.append(conv)
    return out


def sample_questions(corpus: Corpus, n: int, seed: int = 0, heldout: bool = False) -> list[str]:
    """Filled-in customer questions, e.g. for perf input data or calibration."""
    rng = random.Random(seed)
    entries = [e for e in corpus.faq if e.heldout] if heldout else list(corpus.faq)
    out = []
    for _ in range(n):
        e = rng.choice(entries)
        q = rng.choice(e.heldout if heldout else e.questions)
        out.append(fill_slots(sample_slots(rng, e.lang), q))
    return out


def spoken_questions(lang: str, seed: int = 0) -> list[str]:
    """The corpus's FAQ questions in ``lang``, in a seeded order: what the speech benchmark
    speaks and the recognizer's INT8 calibration hears. Those with slots (order numbers,
    prices) are left out: a recognizer writing "SB 55,179,467" for "SB55779467" is right, and
    the error rates would say otherwise."""
    # The seed's name is the speech benchmark's, where this began: the same order as before.
    rng = random.Random(f"asr-bench:{lang}:{seed}")
    out = [q for entry in load().faq if entry.lang == lang for q in entry.questions if "{" not in q]
    rng.shuffle(out)
    return out
