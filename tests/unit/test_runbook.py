"""docs/runbook.md has a section for every alert in monitoring/alerts.yml, each alert's
``runbook_url`` annotation points at its section, and each section says what to do: what the
alert means, the dashboard panels to open (real ones), the per-request view, the three levels of
causes with commands, the remedy and when to escalate."""

from __future__ import annotations

import re

import pytest
import yaml

from switchboard.ops.dashboard import ROWS
from switchboard.paths import ROOT
from tests.unit.test_docs_paths import anchors, slug

RUNBOOK = ROOT / "docs" / "runbook.md"
ALERTS = ROOT / "monitoring" / "alerts.yml"
# What every section says, in this order.
PARTS = ("**Meaning.**", "**First look.**", "**Trace view.**", "**Tell the causes apart.**", "**Remedy.**")
LEVELS = ("1. Level 1", "2. Level 2", "3. Level 3")
PANEL = re.compile(r'panels? "([^"]+)"(?:,? (?:and )?"([^"]+)")?')
ROW = re.compile(r'row "([^"]+)"')


def alerts(path=ALERTS) -> dict[str, dict]:
    """Every alerting rule of ``path``: name -> its annotations."""
    rules = [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]
    return {r["alert"]: r.get("annotations", {}) for r in rules if "alert" in r}


def sections(text: str) -> dict[str, str]:
    """The runbook's level-2 sections: heading -> its text (code blocks included)."""
    out, name, body, in_code = {}, None, [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith("## "):
            if name is not None:
                out[name] = "\n".join(body)
            name, body = line[3:].strip(), []
        elif name is not None:
            body.append(line)
    if name is not None:
        out[name] = "\n".join(body)
    return out


def problems(rules: dict[str, dict], runbook: str) -> list[str]:
    """What is wrong between the alert rules and the runbook's text (empty: nothing)."""
    found = sections(runbook)
    names = {slug(h): h for h in found}
    titles = {spec.title for _, specs in ROWS for spec in specs}
    rows = {title for title, _ in ROWS}
    out = []
    for alert, notes in rules.items():
        anchor = slug(alert)
        if anchor not in names:
            out.append(f"{alert}: no section `## {alert}` in docs/runbook.md")
            continue
        link = notes.get("runbook_url")
        if link != f"docs/runbook.md#{anchor}":
            out.append(f"{alert}: runbook_url is {link!r}, not 'docs/runbook.md#{anchor}'")
        text = found[names[anchor]]
        missing = [p for p in (*PARTS, *LEVELS) if p not in text] + ([] if "**Escalate" in text else ["**Escalate"])
        if missing:
            out.append(f"{alert}: its section lacks {missing}")
        flat = " ".join(text.split())  # a title may wrap across lines
        named = {t for m in PANEL.finditer(flat) for t in m.groups() if t}
        if not named:
            out.append(f'{alert}: its section names no dashboard panel (panel "<title>")')
        unknown = sorted(named - titles) + sorted(set(ROW.findall(flat)) - rows)
        if unknown:
            out.append(f"{alert}: its section names panels or rows the dashboard does not have: {unknown}")
    stale = [h for h in found if h.startswith("Switchboard") and h not in rules]
    out += [f"docs/runbook.md: section {h!r} is for no alert in monitoring/alerts.yml" for h in stale]
    return out


def test_every_alert_has_its_section_and_links_to_it():
    assert alerts(), "no alert rules read from monitoring/alerts.yml"
    found = problems(alerts(), RUNBOOK.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


def test_the_links_resolve_as_anchors_of_the_runbook():
    for alert, notes in alerts().items():
        file, _, anchor = notes["runbook_url"].partition("#")
        assert (ROOT / file).resolve() == RUNBOOK and anchor in anchors(RUNBOOK), alert


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda rules, text: (rules, text.replace("## SwitchboardPoolDown", "## Pool down")), "no section"),
        (
            lambda rules, text: ({**rules, "SwitchboardPoolDown": {"summary": "x"}}, text),
            "runbook_url is None",
        ),
        (
            lambda rules, text: ({**rules, "SwitchboardNew": {"runbook_url": "docs/runbook.md#switchboardnew"}}, text),
            "no section `## SwitchboardNew`",
        ),
        (lambda rules, text: (rules, text.replace('panel "Pools up"', 'panel "Pool health"')), "does not have"),
        (lambda rules, text: (rules, text.replace("**Remedy.** Reload", "Reload")), "lacks ['**Remedy.**']"),
        (
            lambda rules, text: ({k: v for k, v in rules.items() if k != "SwitchboardRestarted"}, text),
            "is for no alert",
        ),
    ],
    ids=["section removed", "link removed", "new alert", "unknown panel", "part missing", "stale section"],
)
def test_a_gap_is_caught(edit, expected):
    rules, text = edit(alerts(), RUNBOOK.read_text(encoding="utf-8"))
    found = problems(rules, text)
    assert any(expected in p for p in found), found
