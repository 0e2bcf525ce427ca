"""The metric names a PromQL expression reads, for checking a dashboard against what a server
exports (tests/integration/test_dashboard_queries.py).

A tokenizer, not a regular expression over the text: label matchers (``{...}``), range and
subquery selectors (``[...]``), strings, numbers, durations, Grafana's variables
(``$__rate_interval``, ``${datasource}``), function and aggregation names, keywords and the
label lists after ``by``/``without``/``on``/``ignoring``/``group_left``/``group_right`` are
not metric names; ``{__name__="x"}`` is. Histogram series are named as written
(``..._bucket``), which is how the exposition format names them too.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<var>\$\{[^}]*\}|\$\w+|\[\[\w+(?::\w+)?\]\])
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+\b)
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[(){}\[\],=<>+\-*/%^@:])
    """,
    re.VERBOSE,
)
# Followed by a parenthesised list of label names, which are not metrics.
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = _LABEL_LISTS | {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
_AGGREGATIONS = {
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
}
_CLOSE = {"(": ")", "{": "}", "[": "]"}


def tokens(expr: str) -> list[tuple[str, str]]:
    """(kind, text) for every token of ``expr`` but white space and comments."""
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read {expr[pos : pos + 20]!r} at {pos} in {expr!r}")
        if m.lastgroup not in ("ws", "comment"):
            out.append((m.lastgroup, m.group()))
        pos = m.end()
    return out


def _check_brackets(toks: list[tuple[str, str]], expr: str) -> None:
    stack = []
    for kind, text in toks:
        if kind == "op" and text in _CLOSE:
            stack.append(_CLOSE[text])
        elif kind == "op" and text in _CLOSE.values():
            if not stack or stack.pop() != text:
                raise ValueError(f"unbalanced {text!r} in {expr!r}")
    if stack:
        raise ValueError(f"{stack[-1]!r} missing in {expr!r}")


def _closing(toks: list[tuple[str, str]], i: int, expr: str) -> int:
    """The index of the bracket closing the one at ``i``."""
    depth, opening = 0, toks[i][1]
    for j in range(i, len(toks)):
        if toks[j] == ("op", opening):
            depth += 1
        elif toks[j] == ("op", _CLOSE[opening]):
            depth -= 1
            if depth == 0:
                return j
    raise ValueError(f"unbalanced {opening!r} in {expr!r}")


def _names_in_matchers(toks: list[tuple[str, str]], expr: str) -> list[str]:
    out = []
    for k in range(len(toks) - 2):
        if toks[k] == ("ident", "__name__") and toks[k + 1][0] == "op":
            if toks[k + 1][1] != "=" or toks[k + 2][0] != "string":
                raise ValueError(f"a metric name matched by pattern cannot be checked: {expr!r}")
            out.append(toks[k + 2][1][1:-1])
    return out


def metric_names(expr: str) -> list[str]:
    """The metric names ``expr`` selects, in order of first appearance."""
    toks = tokens(expr)
    _check_brackets(toks, expr)
    names: list[str] = []
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        after = toks[i + 1] if i + 1 < len(toks) else None
        if kind == "op" and text in ("{", "["):
            end = _closing(toks, i, expr)
            if text == "{":
                names += _names_in_matchers(toks[i + 1 : end], expr)
            i = end + 1
            continue
        if kind == "ident":
            word = text.lower()
            if word in _LABEL_LISTS and after == ("op", "("):
                i = _closing(toks, i + 1, expr) + 1
                continue
            is_call = after == ("op", "(")
            is_aggregation = word in _AGGREGATIONS and after is not None and after[1].lower() in ("by", "without")
            if not (is_call or is_aggregation or word in _KEYWORDS):
                names.append(text)
        i += 1
    return list(dict.fromkeys(names))


def exported_names(exposition: str) -> set[str]:
    """The series names in a Prometheus text exposition (``/metrics``): histograms as their
    ``_bucket``, ``_sum`` and ``_count`` series, counters with ``_total``, as a query names them."""
    from prometheus_client.parser import text_string_to_metric_families

    return {sample.name for family in text_string_to_metric_families(exposition) for sample in family.samples}
