"""The markdown the suite's summaries are written in: figures, tables and the summary file.

Every report formats its figures here, so a missing one reads the same everywhere: ``MISSING``,
never ``nan``.
"""

from __future__ import annotations

from pathlib import Path

MISSING = "–"


def number(x, digits: int, unit: str = "") -> str:
    """``x`` with ``digits`` decimals and ``unit``; ``MISSING`` for None or NaN."""
    if x is None or x != x:
        return MISSING
    return f"{x:.{digits}f}{unit}"


def ms(seconds) -> str:
    """Seconds as whole milliseconds."""
    return number(None if seconds is None else seconds * 1000, 0, " ms")


def times(x) -> str:
    """A ratio, as ``3.50x``."""
    return number(x, 2, "x")


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_summary(path: Path, title: str, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {title}\n\n{body}\n")
    print(f"\n{body}\n\nwritten to {path}", flush=True)
