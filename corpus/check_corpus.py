#!/usr/bin/env python3
"""Validate the customer-service corpus (faq.jsonl, heldout.jsonl, dialogs.jsonl).

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

SLOT_RE = re.compile(r"\{([^{}]*)\}")
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


def check_heldout(path: Path, faq: dict[str, dict], faq_q: dict[str, str]) -> int:
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
    return total


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


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    faq, faq_q = check_faq(root / "faq.jsonl")
    held_total = check_heldout(root / "heldout.jsonl", faq, faq_q)
    dialogs = check_dialogs(root / "dialogs.jsonl")

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
