#!/usr/bin/env python3
"""Validate the customer-service corpus (faq.jsonl, heldout.jsonl, dialogs.jsonl,
and tools.jsonl when it exists).

Usage: python3 corpus/check_corpus.py [corpus_dir]
Exits 0 when everything passes, 1 otherwise. Standard library only.
"""

from __future__ import annotations

import json
import re
import sys
import unicodedata
from collections import Counter
from pathlib import Path

ALLOWED_SLOTS = {"order_id", "sku", "price", "product", "tracking", "phone", "days"}
LANGS = {"en", "zh"}
EN_MAX_WORDS = 60
ZH_MAX_CHARS = 90
EN_SOFT_WORDS = 45
ZH_SOFT_CHARS = 70
MIN_Q, MAX_Q = 6, 8
MIN_HELD, MAX_HELD = 1, 2
MIN_USER_TURNS, MAX_USER_TURNS = 2, 4
TOOLS = {"get_order_status", "start_return", "transfer_to_human"}
MIN_TOOL_Q, MAX_TOOL_Q = 6, 10
MIN_TOOL_HELD, MAX_TOOL_HELD = 2, 4
# Placeholders allowed in tools.jsonl, with the value used to test-parse results.
TOOL_SLOT_VALUES = {"order_id": "SB12345678", "days": "3"}
TOOL_FIELDS = ("id", "lang", "tool", "arguments", "questions", "heldout", "results")

SLOT_RE = re.compile(r"\{([^{}]*)\}")
# In tool results (JSON text) only word-like names count as placeholders.
RESULT_SLOT_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
CJK_RE = re.compile(r"[\u4e00-\u9fff]")

errors: list[str] = []
warnings: list[str] = []


def err(where: str, msg: str) -> None:
    errors.append(f"{where}: {msg}")


def warn(where: str, msg: str) -> None:
    warnings.append(f"{where}: {msg}")


def slots_in(text: str) -> set[str]:
    return set(SLOT_RE.findall(text))


def check_slots(where: str, text: str) -> None:
    """Only allowed {slot} names, and no stray braces outside placeholders."""
    for name in SLOT_RE.findall(text):
        if name not in ALLOWED_SLOTS:
            err(where, f"unknown slot {{{name}}} in {text!r}")
    leftover = SLOT_RE.sub("", text)
    if "{" in leftover or "}" in leftover:
        err(where, f"stray brace in {text!r}")


def normalize(q: str) -> str:
    """Case/punctuation/whitespace-insensitive key for duplicate detection."""
    q = unicodedata.normalize("NFKC", q).lower()
    return "".join(ch for ch in q if ch.isalnum() or ch in "{}_")


def text_length(text: str, lang: str) -> int:
    """English: whitespace words. Chinese: non-space characters, a slot counts as 1."""
    if lang == "en":
        return len(text.split())
    return len(re.sub(r"\s", "", SLOT_RE.sub("X", text)))


def check_reply(where: str, text: str, lang: str) -> None:
    n = text_length(text, lang)
    hard, soft, unit = (
        (EN_MAX_WORDS, EN_SOFT_WORDS, "words") if lang == "en" else (ZH_MAX_CHARS, ZH_SOFT_CHARS, "chars")
    )
    if n > hard:
        err(where, f"reply too long ({n} {unit} > {hard})")
    elif n > soft:
        warn(where, f"reply longer than target ({n} {unit} > {soft})")


def is_str_list(x) -> bool:
    return isinstance(x, list) and all(isinstance(s, str) and s.strip() for s in x)


def load_jsonl(path: Path) -> list[tuple[int, dict]]:
    rows = []
    if not path.exists():
        err(path.name, "file missing")
        return rows
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                err(f"{path.name}:{i}", "blank line")
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                err(f"{path.name}:{i}", f"invalid JSON ({e})")
                continue
            if not isinstance(obj, dict):
                err(f"{path.name}:{i}", "line is not a JSON object")
                continue
            rows.append((i, obj))
    return rows


def check_lang(where: str, lang, text_id: str | None, texts: list[str]) -> bool:
    if lang not in LANGS:
        err(where, f"bad lang {lang!r}")
        return False
    if text_id is not None and not text_id.startswith(lang + "-"):
        err(where, f"id {text_id!r} does not start with '{lang}-'")
    if lang == "zh" and not any(CJK_RE.search(t) for t in texts):
        err(where, "zh entry without Chinese characters")
    return True


def check_faq(path: Path) -> dict[str, dict]:
    faq: dict[str, dict] = {}
    seen_q: dict[str, str] = {}
    for ln, obj in load_jsonl(path):
        where = f"{path.name}:{ln}"
        missing = [k for k in ("id", "lang", "topic", "questions", "answer") if k not in obj]
        if missing:
            err(where, f"missing fields {missing}")
            continue
        extra = set(obj) - {"id", "lang", "topic", "questions", "answer"}
        if extra:
            err(where, f"unexpected fields {sorted(extra)}")
        fid, lang, topic, qs, ans = obj["id"], obj["lang"], obj["topic"], obj["questions"], obj["answer"]
        if not isinstance(fid, str) or not fid:
            err(where, "id must be a non-empty string")
            continue
        where = f"{path.name}:{ln} ({fid})"
        if fid in faq:
            err(where, "duplicate id")
            continue
        if not isinstance(topic, str) or not topic:
            err(where, "topic must be a non-empty string")
        if not is_str_list(qs):
            err(where, "questions must be a list of non-empty strings")
            continue
        if not isinstance(ans, str) or not ans.strip():
            err(where, "answer must be a non-empty string")
            continue
        if not check_lang(where, lang, fid, qs + [ans]):
            continue
        if not MIN_Q <= len(qs) <= MAX_Q:
            err(where, f"{len(qs)} questions (need {MIN_Q}-{MAX_Q})")
        for q in qs + [ans]:
            check_slots(where, q)
        ans_slots = slots_in(ans)
        for q in qs:
            lacking = ans_slots - slots_in(q)
            if lacking:
                err(where, f"question {q!r} lacks answer slot(s) {sorted(lacking)}")
            key = normalize(q)
            if key in seen_q:
                err(where, f"duplicate question {q!r} (also in {seen_q[key]})")
            else:
                seen_q[key] = fid
        check_reply(where, ans, lang)
        faq[fid] = {"lang": lang, "questions": qs, "answer": ans, "slots": ans_slots}
    return faq, seen_q


def check_heldout(path: Path, faq: dict[str, dict], faq_q: dict[str, str]) -> tuple[int, set[str]]:
    covered: Counter[str] = Counter()
    seen: set[str] = set()
    total = 0
    for ln, obj in load_jsonl(path):
        where = f"{path.name}:{ln}"
        missing = [k for k in ("id", "lang", "questions") if k not in obj]
        if missing:
            err(where, f"missing fields {missing}")
            continue
        fid, lang, qs = obj["id"], obj["lang"], obj["questions"]
        where = f"{path.name}:{ln} ({fid})"
        if fid not in faq:
            err(where, "id not in faq.jsonl")
            continue
        covered[fid] += 1
        if lang != faq[fid]["lang"]:
            err(where, f"lang {lang!r} differs from faq lang {faq[fid]['lang']!r}")
        if not is_str_list(qs) or not MIN_HELD <= len(qs) <= MAX_HELD:
            err(where, f"questions must be a list of {MIN_HELD}-{MAX_HELD} non-empty strings")
            continue
        for q in qs:
            total += 1
            check_slots(where, q)
            lacking = faq[fid]["slots"] - slots_in(q)
            if lacking:
                err(where, f"question {q!r} lacks answer slot(s) {sorted(lacking)}")
            key = normalize(q)
            if key in faq_q:
                err(where, f"heldout question {q!r} also in faq.jsonl ({faq_q[key]})")
            if key in seen:
                err(where, f"duplicate heldout question {q!r}")
            seen.add(key)
    for fid in faq:
        if covered[fid] == 0:
            err(path.name, f"no heldout questions for faq id {fid}")
        elif covered[fid] > 1:
            err(path.name, f"faq id {fid} has {covered[fid]} heldout lines (expected 1)")
    return total, seen


def check_dialogs(path: Path) -> Counter:
    ids: set[str] = set()
    per_lang: Counter[str] = Counter()
    for ln, obj in load_jsonl(path):
        where = f"{path.name}:{ln}"
        missing = [k for k in ("id", "lang", "turns") if k not in obj]
        if missing:
            err(where, f"missing fields {missing}")
            continue
        did, lang, turns = obj["id"], obj["lang"], obj["turns"]
        where = f"{path.name}:{ln} ({did})"
        if did in ids:
            err(where, "duplicate dialog id")
        ids.add(did)
        if not isinstance(turns, list) or not turns:
            err(where, "turns must be a non-empty list")
            continue
        ok = True
        for i, t in enumerate(turns):
            if not isinstance(t, dict) or set(t) != {"role", "content"}:
                err(where, f"turn {i} must have exactly role and content")
                ok = False
                continue
            if not isinstance(t["content"], str) or not t["content"].strip():
                err(where, f"turn {i} has empty content")
                ok = False
                continue
            want = "user" if i % 2 == 0 else "assistant"
            if t["role"] != want:
                err(where, f"turn {i} role {t['role']!r}, expected {want!r}")
                ok = False
            check_slots(f"{where} turn {i}", t["content"])
        if not ok:
            continue
        if not check_lang(where, lang, did, [t["content"] for t in turns]):
            continue
        if turns[-1]["role"] != "assistant":
            err(where, "dialog must end with an assistant turn")
        n_user = sum(t["role"] == "user" for t in turns)
        if not MIN_USER_TURNS <= n_user <= MAX_USER_TURNS:
            err(where, f"{n_user} user turns (need {MIN_USER_TURNS}-{MAX_USER_TURNS})")
        seen_slots: set[str] = set()
        for i, t in enumerate(turns):
            if t["role"] == "user":
                seen_slots |= slots_in(t["content"])
            else:
                check_reply(f"{where} turn {i}", t["content"], lang)
                unseen = slots_in(t["content"]) - seen_slots
                if unseen:
                    err(where, f"assistant turn {i} uses slot(s) {sorted(unseen)} no user turn gave")
        per_lang[lang] += 1
    return per_lang


def check_tool_slots(where: str, text: str) -> None:
    """Like check_slots, but only the tools.jsonl placeholders are allowed."""
    check_slots(where, text)
    for name in slots_in(text):
        if name in ALLOWED_SLOTS and name not in TOOL_SLOT_VALUES:
            err(where, f"slot {{{name}}} not allowed in tools.jsonl (only {sorted(TOOL_SLOT_VALUES)}) in {text!r}")


def check_tools(path: Path, faq_q: dict[str, str], held_q: set[str]) -> dict:
    """tools.jsonl: tool-calling intents with questions, heldout questions and results."""
    stats = {"entries": Counter(), "questions": Counter(), "heldout": 0, "results": 0}
    ids: set[str] = set()
    entries = []
    train_q: dict[str, str] = {}
    for ln, obj in load_jsonl(path):
        where = f"{path.name}:{ln}"
        missing = [k for k in TOOL_FIELDS if k not in obj]
        if missing:
            err(where, f"missing fields {missing}")
            continue
        extra = set(obj) - set(TOOL_FIELDS)
        if extra:
            err(where, f"unexpected fields {sorted(extra)}")
        tid, lang, tool, args = obj["id"], obj["lang"], obj["tool"], obj["arguments"]
        qs, held, results = obj["questions"], obj["heldout"], obj["results"]
        if not isinstance(tid, str) or not tid:
            err(where, "id must be a non-empty string")
            continue
        where = f"{path.name}:{ln} ({tid})"
        if tid in ids:
            err(where, "duplicate id")
            continue
        ids.add(tid)
        if tool not in TOOLS:
            err(where, f"unknown tool {tool!r} (expected one of {sorted(TOOLS)})")
        if not isinstance(args, dict):
            err(where, "arguments must be a JSON object")
            continue
        arg_slots: set[str] = set()
        for k, v in args.items():
            if "{" in k or "}" in k:
                err(where, f"placeholder or brace in argument name {k!r}")
            if isinstance(v, str):
                check_tool_slots(where, v)
                arg_slots |= slots_in(v)
            elif isinstance(v, (dict, list)) and "{" in json.dumps(v, ensure_ascii=False):
                err(where, f"argument {k!r}: placeholders may only appear in string values")
        if not is_str_list(qs):
            err(where, "questions must be a list of non-empty strings")
            continue
        if not is_str_list(held):
            err(where, "heldout must be a list of non-empty strings")
            continue
        if (
            not isinstance(results, list)
            or not results
            or not all(
                isinstance(r, dict)
                and set(r) == {"result", "answer"}
                and all(isinstance(r[k], str) and r[k].strip() for k in ("result", "answer"))
                for r in results
            )
        ):
            err(where, "results must be a non-empty list of {result, answer} objects with non-empty strings")
            continue
        if not check_lang(where, lang, tid, qs + held + [r["answer"] for r in results]):
            continue
        if not MIN_TOOL_Q <= len(qs) <= MAX_TOOL_Q:
            err(where, f"{len(qs)} questions (need {MIN_TOOL_Q}-{MAX_TOOL_Q})")
        if not MIN_TOOL_HELD <= len(held) <= MAX_TOOL_HELD:
            err(where, f"{len(held)} heldout questions (need {MIN_TOOL_HELD}-{MAX_TOOL_HELD})")
        for q in qs + held:
            check_tool_slots(where, q)
            lacking = arg_slots - slots_in(q)
            if lacking:
                err(where, f"question {q!r} lacks argument slot(s) {sorted(lacking)}")
            for name in arg_slots & slots_in(q):
                if q.count("{" + name + "}") > 1:
                    warn(where, f"question {q!r} uses {{{name}}} more than once")
        for q in qs:
            key = normalize(q)
            if key in train_q:
                err(where, f"duplicate question {q!r} (also in {train_q[key]})")
                continue
            train_q[key] = tid
            if key in held_q:
                err(where, f"question {q!r} is a heldout.jsonl question (evaluation data)")
            if key in faq_q:
                warn(where, f"question {q!r} is also a faq.jsonl question ({faq_q[key]})")
        for i, r in enumerate(results):
            rwhere = f"{where} result {i}"
            res, ans = r["result"], r["answer"]
            res_slots = set(RESULT_SLOT_RE.findall(res))
            for name in sorted(res_slots - set(TOOL_SLOT_VALUES)):
                err(rwhere, f"unknown slot {{{name}}} in result {res!r}")
            filled = res
            for name, value in TOOL_SLOT_VALUES.items():
                filled = filled.replace("{" + name + "}", value)
            try:
                parsed = json.loads(filled)
            except json.JSONDecodeError as e:
                err(rwhere, f"result is not valid JSON after filling slots ({e}): {res!r}")
            else:
                if not isinstance(parsed, dict):
                    err(rwhere, f"result is not a JSON object: {res!r}")
            check_tool_slots(rwhere, ans)
            unseen = slots_in(ans) - res_slots - arg_slots
            if unseen:
                err(rwhere, f"answer uses slot(s) {sorted(unseen)} not in the result or arguments")
            check_reply(rwhere, ans, lang)
        entries.append((where, held))
        stats["entries"][lang] += 1
        stats["questions"][lang] += len(qs)
        stats["results"] += len(results)
    held_seen: dict[str, str] = {}
    for where, held in entries:
        for q in held:
            stats["heldout"] += 1
            key = normalize(q)
            if key in train_q:
                err(where, f"heldout question {q!r} is a training question in tools.jsonl ({train_q[key]})")
            if key in faq_q:
                err(where, f"heldout question {q!r} is a training question in faq.jsonl ({faq_q[key]})")
            if key in held_seen:
                err(where, f"duplicate heldout question {q!r} (also in {held_seen[key]})")
            held_seen[key] = where
    return stats


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    faq, faq_q = check_faq(root / "faq.jsonl")
    held_total, held_q = check_heldout(root / "heldout.jsonl", faq, faq_q)
    dialogs = check_dialogs(root / "dialogs.jsonl")
    tools_path = root / "tools.jsonl"
    tools = check_tools(tools_path, faq_q, held_q) if tools_path.exists() else None

    by_lang = Counter(e["lang"] for e in faq.values())
    q_by_lang = Counter()
    slot_entries = 0
    for e in faq.values():
        q_by_lang[e["lang"]] += len(e["questions"])
        if e["slots"] or any(slots_in(q) for q in e["questions"]):
            slot_entries += 1
    print(f"faq entries: {len(faq)} ({', '.join(f'{k}={v}' for k, v in sorted(by_lang.items()))})")
    print(f"faq questions: {sum(q_by_lang.values())} ({', '.join(f'{k}={v}' for k, v in sorted(q_by_lang.items()))})")
    print(f"faq entries using slots: {slot_entries}")
    print(f"heldout questions: {held_total}")
    print(f"dialogs: {sum(dialogs.values())} ({', '.join(f'{k}={v}' for k, v in sorted(dialogs.items()))})")
    if tools is not None:
        te, tq = tools["entries"], tools["questions"]
        print(f"tools entries: {sum(te.values())} ({', '.join(f'{k}={v}' for k, v in sorted(te.items()))})")
        print(f"tools questions: {sum(tq.values())} ({', '.join(f'{k}={v}' for k, v in sorted(tq.items()))})")
        print(f"tools heldout questions: {tools['heldout']}")
        print(f"tools results: {tools['results']}")
    for w in warnings:
        print("WARNING", w)
    for e in errors:
        print("ERROR", e)
    if errors:
        print(f"FAILED with {len(errors)} error(s)")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
