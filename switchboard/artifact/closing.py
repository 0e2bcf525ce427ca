"""The shortest texts that finish a constrained answer the budget is about to cut.

A JSON answer (``json_schema``, ``json_object``) or a tool call cut by ``max_tokens`` does not
parse. For each constrained row the engine keeps where the text stands (``JsonCursor``,
``ToolCursor``: the open objects and arrays, the string, number or literal under way, fed each
token's bytes) and asks here for the ways to finish it (``JsonFinish.closings``,
``ToolFinish.closings``): an escape or a character cut in two completed, the string closed (an
enum's value completed, a ``minLength`` filled), the required properties not yet written added
with the shortest value their schema allows, the items a ``minItems`` still lacks, the brackets
closed; for a tool call then its end tag.

llguidance has no "shortest completion" of a grammar state (its matcher masks, consumes, rolls
back and fast-forwards forced bytes), so these texts come from the schema; the caller
(``switchboard.artifact.grammar.RowConstraint``) tokenizes them and keeps one only if the
grammar accepts it to the end. Where the text does not say which way the schema goes (a key
half written that begins several property names, an ``anyOf`` whose branch is not known yet)
each way is a candidate, shortest first. The rules follow llguidance's JSON grammar: properties
in the schema's order, each optional one skippable, then the required names the properties do
not list, then other keys where ``additionalProperties`` allows them; compact separators unless
a tool format says otherwise. What has no rule here (a ``pattern`` or ``format`` string already
begun, ``multipleOf``, ``not``, ``if``) gives candidates the grammar refuses, and the caller
falls back (docs/chat-contract.md, "Answers the budget cuts").

Pure: no llguidance, no numpy.
"""

from __future__ import annotations

import json
import math
import re
import threading

from switchboard.artifact.tools import ToolFormat

MAX_CANDIDATES = 8  # per container: the shortest, the rest are dropped
MAX_DEPTH = 24  # schema nesting followed for a shortest value (a recursive schema stops here)
FILLS = (b"a", b" ")  # what fills a string up to its minLength (the tokenizer decides which is shorter)

ANY: dict = {}  # the schema of any value (one object: the caches below key schemas by id)
# container states
START, COMMA, COLON, VALUE, AFTER, DONE = range(6)
_STR_STOP = re.compile(rb'["\\]')
_WS = frozenset(b" \t\n\r")
_NUM = frozenset(b"0123456789+-.eE")
_LITERALS = (b"true", b"false", b"null")
# examples of the string formats llguidance checks (a string in another format is plain)
FORMATS = {
    "date-time": "2000-01-01T00:00:00Z",
    "date": "2000-01-01",
    "time": "00:00:00Z",
    "duration": "P0D",
    "email": "a@a.aa",
    "hostname": "a",
    "ipv4": "0.0.0.0",
    "ipv6": "::",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "uri": "a:",
}


class JsonCursor:
    """Where a JSON text stands, fed its bytes: a stack of open containers, each a tuple
    (``("root", state, tail)``, ``("obj", state, keys written, key, tail)``, ``("arr", state,
    items written, tail)``; ``tail``: the separator and white space since the last member) and
    the scalar under way (``("str", bytes, is_key, escape)``, ``("num", bytes)``, ``("lit",
    bytes)``). Schema-agnostic and not a validator: it is fed text a grammar accepted."""

    __slots__ = ("stack", "scalar", "error")

    def __init__(self):
        self.stack: list[tuple] = [("root", VALUE, b"")]
        self.scalar: tuple | None = None
        self.error = False  # not a JSON prefix (nothing can finish it)

    def copy(self) -> JsonCursor:
        c = JsonCursor.__new__(JsonCursor)
        c.stack, c.scalar, c.error = list(self.stack), self.scalar, self.error
        return c

    @property
    def done(self) -> bool:
        """The top-level value is complete."""
        return self.stack[0][1] == DONE

    def feed(self, data: bytes) -> int:
        """Read ``data``; the bytes read, fewer than ``len(data)`` once the top-level value ended
        (a number ends at the byte after it, which is not read)."""
        i, n = 0, len(data)
        while i < n and not self.error and self.stack[0][1] != DONE:
            s = self.scalar
            if s is None:
                self._structure(data[i])
                i += 1
            elif s[0] == "str":
                i = self._string(s, data, i)
            elif s[0] == "num":
                if data[i] in _NUM:
                    self.scalar = ("num", s[1] + data[i : i + 1])
                    i += 1
                else:  # the byte after a number belongs to what holds it
                    self.scalar = None
                    self._value_ended()
            else:
                raw = s[1] + data[i : i + 1]
                i += 1
                if raw in _LITERALS:
                    self.scalar = None
                    self._value_ended()
                else:
                    self.scalar = ("lit", raw)
        return i

    def _string(self, s: tuple, data: bytes, i: int) -> int:
        _, raw, is_key, esc = s
        if esc:
            c = data[i]
            if esc == 1:
                esc = 2 if c == 0x75 else 0  # \u: four hex digits follow
            else:
                esc = esc + 1 if esc < 5 else 0
            self.scalar = ("str", raw + data[i : i + 1], is_key, esc)
            return i + 1
        m = _STR_STOP.search(data, i)
        if m is None:
            self.scalar = ("str", raw + data[i:], is_key, 0)
            return len(data)
        j = m.start()
        raw += data[i:j]
        if data[j] == 0x5C:
            self.scalar = ("str", raw + b"\\", is_key, 1)
            return j + 1
        self.scalar = None
        if is_key:
            top = self.stack[-1]
            self.stack[-1] = ("obj", COLON, top[2], _decode(raw), b"")
        else:
            self._value_ended()
        return j + 1

    def _structure(self, c: int) -> None:
        top = self.stack[-1]
        kind, state = top[0], top[1]
        if c in _WS:
            self.stack[-1] = top[:-1] + (top[-1] + bytes((c,)),)
            return
        if kind == "obj":
            if state in (START, COMMA) and c == 0x22:
                self.scalar = ("str", b"", True, 0)
            elif state == START and c == 0x7D:
                self._close()
            elif state == COLON and c == 0x3A:
                self.stack[-1] = ("obj", VALUE, top[2], top[3], top[4] + b":")
            elif state == VALUE:
                self._open(c)
            elif state == AFTER and c == 0x2C:
                self.stack[-1] = ("obj", COMMA, top[2], None, top[4] + b",")
            elif state == AFTER and c == 0x7D:
                self._close()
            else:
                self.error = True
        elif kind == "arr":
            if state == START and c == 0x5D:
                self._close()
            elif state in (START, COMMA):
                self._open(c)
            elif state == AFTER and c == 0x2C:
                self.stack[-1] = ("arr", COMMA, top[2], top[3] + b",")
            elif state == AFTER and c == 0x5D:
                self._close()
            else:
                self.error = True
        elif state == VALUE:
            self._open(c)
        else:
            self.error = True

    def _open(self, c: int) -> None:
        if c == 0x7B:
            self.stack.append(("obj", START, (), None, b""))
        elif c == 0x5B:
            self.stack.append(("arr", START, 0, b""))
        elif c == 0x22:
            self.scalar = ("str", b"", False, 0)
        elif c == 0x2D or 0x30 <= c <= 0x39:
            self.scalar = ("num", bytes((c,)))
        elif c in b"tfn":
            self.scalar = ("lit", bytes((c,)))
        else:
            self.error = True

    def _close(self) -> None:
        self.stack.pop()
        self._value_ended()

    def _value_ended(self) -> None:
        top = self.stack[-1]
        if top[0] == "obj":
            self.stack[-1] = ("obj", AFTER, top[2] + (top[3],), None, b"")
        elif top[0] == "arr":
            self.stack[-1] = ("arr", AFTER, top[2] + 1, b"")
        else:
            self.stack[-1] = ("root", DONE, b"")


def _decode(raw: bytes) -> str:
    try:
        return json.loads(b'"' + raw + b'"')
    except ValueError:
        return raw.decode("utf-8", "replace")


def _utf8_rest(raw: bytes) -> bytes:
    """The continuation bytes that complete a character ``raw`` ends in the middle of."""
    for back in range(1, min(4, len(raw)) + 1):
        b = raw[-back]
        if b < 0x80:
            return b""
        if b >= 0xC0:  # the lead byte: how long its character is
            size = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            missing = size - back
            if missing <= 0:
                return b""
            second = {0xE0: 0xA0, 0xF0: 0x90}.get(b, 0x80) if back == 1 else 0x80
            return bytes([second] + [0x80] * (missing - 1))
    return b""


def _kind(v) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if v is None:
        return "null"
    return "object" if isinstance(v, dict) else "array"


def _values(a: dict) -> list | None:
    """The values an ``enum`` or ``const`` allows (None: no such list)."""
    if "const" in a:
        return [a["const"]]
    v = a.get("enum")
    return list(v) if isinstance(v, list) else None


def _allows(a: dict, kind: str) -> bool:
    """Alternative ``a`` may be a value of ``kind`` (a JSON type; integers are numbers)."""
    t = a.get("type")
    if t is None:
        values = _values(a)
        return values is None or any(_kind(v) == kind for v in values)
    return t == kind or (kind == "number" and t == "integer")


_SCALAR_KIND = {"str": "string", "num": "number"}


def _scalar_kind(s: tuple) -> str:
    if s[0] == "lit":
        return "null" if s[1][:1] == b"n" else "boolean"
    return _SCALAR_KIND[s[0]]


def _shortest(texts) -> list[bytes]:
    return sorted({t for t in texts if t is not None}, key=lambda t: (len(t), t))[:MAX_CANDIDATES]


class JsonFinish:
    """Closings of a JSON answer held to ``schema`` (a JSON Schema; ``{"type": "object"}`` for
    ``json_object``), written with ``key_separator`` and ``item_separator`` (llguidance's
    compact ``:`` and ``,`` unless a tool format sets others)."""

    def __init__(self, schema, key_separator: str = ":", item_separator: str = ","):
        self.schema = schema
        self.key_sep, self.item_sep = key_separator.encode(), item_separator.encode()
        self._alts: dict[int, tuple] = {}  # id(schema) -> (schema, its alternatives): keeps ids alive
        self._min: dict[int, bytes | None] = {}
        self._busy: set[int] = set()  # schemas whose shortest value is being worked out (recursion)
        self._memo: dict[tuple, object] = {}  # per alternative (by id): slots, members, closing texts
        self._lock = threading.RLock()

    def start(self) -> JsonCursor:
        return JsonCursor()

    @staticmethod
    def feed(cur: JsonCursor, data: bytes) -> None:
        cur.feed(data)

    @staticmethod
    def in_string(cur: JsonCursor) -> bool:
        """A string value (not a key) is under way."""
        s = cur.scalar
        return s is not None and s[0] == "str" and not s[2]

    def patterned(self, cur: JsonCursor) -> bool:
        """A string value under way is held to a ``pattern`` or ``format``: its closing is not
        a text rule's, and finishing it may take more than its closing's bytes."""
        if not self.in_string(cur):
            return False
        alts = self.alts(self.schema)
        for frame in cur.stack[1:]:
            kind = "object" if frame[0] == "obj" else "array"
            inner = []
            for a in alts:
                if _allows(a, kind):
                    inner += self.alts(self._property(a, frame[3]) if kind == "object" else self._item(a, frame[2]))
            alts = inner
        return any("pattern" in a or "format" in a for a in alts)

    # -- closings ----------------------------------------------------------------------------
    def closings(self, cur: JsonCursor) -> list[bytes]:
        """Texts that finish the answer ``cur`` stands at, shortest first (at most
        ``MAX_CANDIDATES``; none where no rule here finishes it)."""
        if cur.error:
            return []
        if cur.done:
            return [b""]
        return self._value(cur, 0, self.schema)

    def _value(self, cur: JsonCursor, i: int, schema) -> list[bytes]:
        """The value held by frame ``i`` (a container under way, the scalar, or none yet)."""
        if i + 1 < len(cur.stack):
            child = cur.stack[i + 1]
            kind = "object" if child[0] == "obj" else "array"
            return _shortest(t for a in self.alts(schema) if _allows(a, kind) for t in self._container(cur, i + 1, a))
        s = cur.scalar
        if s is not None and not (s[0] == "str" and s[2]):
            kind = _scalar_kind(s)
            return self._scalar(s, [a for a in self.alts(schema) if _allows(a, kind)])
        return _shortest([self.shortest(schema)])

    def _started(self, cur: JsonCursor, j: int) -> bool:
        """A value (not a key) is under way in frame ``j``."""
        if j + 1 < len(cur.stack):
            return True
        s = cur.scalar
        return s is not None and not (s[0] == "str" and s[2])

    def _container(self, cur: JsonCursor, j: int, a: dict) -> list[bytes]:
        frame = cur.stack[j]
        if frame[0] == "obj":
            return self._object(cur, j, frame, a)
        _, state, count, tail = frame
        if self._started(cur, j):
            rest = self._end_array(a, count + 1)
            inner = self._value(cur, j, self._item(a, count))
            return [] if rest is None else [t + rest for t in inner]
        if state == COMMA:
            item, rest = self.shortest(self._item(a, count)), self._end_array(a, count + 1)
            if item is None or rest is None:
                return []
            return [_rest_of(self.item_sep, tail) + item + rest]
        return _shortest([self._end_array(a, count)])

    def _object(self, cur: JsonCursor, j: int, frame: tuple, a: dict) -> list[bytes]:
        _, state, keys, key, tail = frame
        last = keys[-1] if keys else None
        if state == COLON or (state == VALUE and not self._started(cur, j)):
            value, rest = self.shortest(self._property(a, key)), self._end_object(a, key, first=False)
            if value is None or rest is None:
                return []
            return [_rest_of(self.key_sep, tail) + value + rest]
        if state == VALUE:
            rest = self._end_object(a, key, first=False)
            return [] if rest is None else [t + rest for t in self._value(cur, j, self._property(a, key))]
        if state == AFTER:
            return _shortest([self._end_object(a, last, first=False)])
        s = cur.scalar
        if j == len(cur.stack) - 1 and s is not None and s[0] == "str" and s[2]:
            return self._key(a, last, s)
        if state == START:
            return _shortest([self._end_object(a, None, first=True)])
        # after a comma: one more member at least
        lead = _rest_of(self.item_sep, tail)
        rest = self._required_after(a, last)
        if rest is None:
            return []
        if rest:
            members = [self._member(a, k) for k in rest]
            return [] if None in members else [lead + self.item_sep.join(members) + b"}"]
        out = [lead + m + b"}" for k in self._slots(a)[0][self._index(a, last) + 1 :] if (m := self._member(a, k))]
        extra = self._additional(a)
        if extra is not None:
            props = a.get("properties") or {}
            name = next(n for n in ("", "_", "__") if n not in props)
            value = self.shortest(extra)
            if value is not None:
                out.append(lead + json.dumps(name).encode() + self.key_sep + value + b"}")
        return _shortest(out)

    def _key(self, a: dict, last: str | None, s: tuple) -> list[bytes]:
        """Closings of an object whose member's key is under way (``s``)."""
        _, raw, _, esc = s
        slots, required = self._slots(a)
        out = []
        for k in slots[self._index(a, last) + 1 :]:
            enc = _enc(k)
            if enc.startswith(raw):
                value, rest = self.shortest(self._property(a, k)), self._end_object(a, k, first=False)
                if value is not None and rest is not None:
                    out.append(enc[len(raw) :] + b'"' + self.key_sep + value + rest)
            if k in required:
                break  # a required name cannot be skipped
        else:
            extra = self._additional(a)
            fix = _escape_rest(raw, esc)
            if extra is not None and _decode(raw + fix) not in (a.get("properties") or {}):
                value = self.shortest(extra)
                if value is not None:
                    out.append(fix + b'"' + self.key_sep + value + b"}")
        return _shortest(out)

    def _scalar(self, s: tuple, alts: list[dict]) -> list[bytes]:
        text = b'"' + s[1] if s[0] == "str" else s[1]
        out = []
        for a in alts:
            values = _values(a)
            if values is not None:
                for v in values:
                    enc = self._dumps(v)
                    if enc.startswith(text):
                        out.append(enc[len(text) :])
            elif s[0] == "num":  # one more digit where a minimum wants a longer number
                out += [b"0"] if s[1][-1:] in b"-+.eE" else [b"", b"0"]
            elif s[0] == "lit":
                out += [lit[len(s[1]) :] for lit in _LITERALS if lit.startswith(s[1])]
            else:
                fix = _escape_rest(s[1], s[3])
                least = int(a.get("minLength", 0))
                missing = max(0, least - len(_decode(s[1] + fix))) if least else 0
                out += [fix + fill * missing + b'"' for fill in (FILLS if missing else FILLS[:1])]
        return _shortest(out)

    # -- objects and arrays ------------------------------------------------------------------
    def _slots(self, a: dict) -> tuple[list[str], set[str]]:
        """The names an object's members take in order (its properties, then the required
        names they do not list) and the required ones."""
        key = ("slots", id(a))
        if key not in self._memo:
            props = list(a.get("properties") or {})
            required = [r for r in a.get("required") or () if isinstance(r, str)]
            self._memo[key] = (props + [r for r in required if r not in props], set(required))
        return self._memo[key]

    def _index(self, a: dict, last: str | None) -> int:
        """Where member ``last`` stands among the slots (-1: none written; past them: another key)."""
        if last is None:
            return -1
        slots = self._slots(a)[0]
        return slots.index(last) if last in slots else len(slots)

    def _required_after(self, a: dict, last: str | None) -> list[str] | None:
        slots, required = self._slots(a)
        return [k for k in slots[self._index(a, last) + 1 :] if k in required]

    def _member(self, a: dict, k: str) -> bytes | None:
        key = ("member", id(a), k)
        if key not in self._memo:
            value = self.shortest(self._property(a, k))
            self._memo[key] = None if value is None else b'"' + _enc(k) + b'"' + self.key_sep + value
        return self._memo[key]

    def _end_object(self, a: dict, last: str | None, first: bool) -> bytes | None:
        """What closes the object after member ``last``: the required members after it, ``}``."""
        key = ("end", id(a), self._index(a, last), first)  # by position: a model's own key names are not kept
        if key not in self._memo:
            members = [self._member(a, k) for k in self._required_after(a, last)]
            if None in members:
                out = None
            elif not members:
                out = b"}"
            else:
                out = (b"" if first else self.item_sep) + self.item_sep.join(members) + b"}"
            self._memo[key] = out
        return self._memo[key]

    def _property(self, a: dict, k: str):
        props = a.get("properties") or {}
        if k in props:
            return props[k]
        for pattern, schema in (a.get("patternProperties") or {}).items():
            try:
                if re.search(pattern, k):
                    return schema
            except re.error:
                continue
        return self._additional(a)

    @staticmethod
    def _additional(a: dict):
        extra = a.get("additionalProperties", True)
        return None if extra is False else ANY if extra is True else extra

    def _item(self, a: dict, i: int):
        prefix = a.get("prefixItems")
        if prefix is None and isinstance(a.get("items"), list):
            prefix = a["items"]
        if isinstance(prefix, list) and i < len(prefix):
            return prefix[i]
        items = a.get("items", True)
        if isinstance(items, list):
            items = a.get("additionalItems", True)
        return None if items is False else ANY if items is True else items

    def _end_array(self, a: dict, count: int) -> bytes | None:
        """What closes the array after ``count`` items: the items its ``minItems`` still wants, ``]``."""
        need = int(a.get("minItems", 0))
        if count >= need:
            return b"]"
        key = ("end[]", id(a), count)
        if key not in self._memo:
            more = [self.shortest(self._item(a, i)) for i in range(count, need)]
            if None in more:
                out = None
            else:
                out = (self.item_sep if count else b"") + self.item_sep.join(more) + b"]"
            self._memo[key] = out
        return self._memo[key]

    # -- shortest values ---------------------------------------------------------------------
    def shortest(self, schema) -> bytes | None:
        """The shortest JSON text ``schema`` allows (None: no rule here gives one)."""
        if schema is None:
            return None
        key = id(schema)
        if key in self._min:
            return self._min[key]
        with self._lock:  # one finisher serves every row of its schema, on either lane's thread
            if key in self._min:
                return self._min[key]
            if key in self._busy or len(self._busy) > MAX_DEPTH:
                return None  # recursion: this branch gives no finite shortest value
            self._busy.add(key)
            try:
                texts = [self._shortest_of(a) for a in self.alts(schema)]
            finally:
                self._busy.discard(key)
            best = _shortest(texts)
            self._min[key] = best[0] if best else None
            return self._min[key]

    def _shortest_of(self, a: dict) -> bytes | None:
        values = _values(a)
        if values is not None:
            return _shortest(self._dumps(v) for v in values)[0] if values else None
        t = a.get("type")
        if t is None:
            t = _implied_type(a)
        if t == "object":
            members = [self._member(a, k) for k in self._required_after(a, None)]
            return None if None in members else b"{" + self.item_sep.join(members) + b"}"
        if t == "array":
            return self._end_array_from_open(a)
        if t == "string":
            return _shortest_string(a)
        if t in ("integer", "number"):
            return _shortest_number(a, t == "integer")
        if t == "boolean":
            return b"true"
        if t == "null":
            return b"null"
        return b"0"  # any JSON value

    def _end_array_from_open(self, a: dict) -> bytes | None:
        rest = self._end_array(a, 0)
        return None if rest is None else b"[" + rest

    def _dumps(self, v) -> bytes:
        seps = (self.item_sep.decode(), self.key_sep.decode())
        return json.dumps(v, ensure_ascii=False, separators=seps).encode()

    # -- schemas -----------------------------------------------------------------------------
    def alts(self, schema) -> list[dict]:
        """``schema`` as the alternatives it allows: references followed, ``anyOf``/``oneOf``
        as one alternative per branch, ``allOf`` merged, a list of types one per type."""
        if schema is None or schema is False:
            return []
        key = id(schema)
        if key not in self._alts:
            self._alts[key] = (schema, self._resolve(schema, 0))
        return self._alts[key][1]

    def _resolve(self, s, depth: int) -> list[dict]:
        if s is True:
            return [ANY]
        if not isinstance(s, dict) or depth > MAX_DEPTH:
            return [] if s is False or depth > MAX_DEPTH else [ANY]
        if "$ref" in s:
            target = self._ref(s["$ref"])
            if target is None:
                return []
            rest = {k: v for k, v in s.items() if k != "$ref"}
            return self._resolve(_merge(target, rest) if rest and isinstance(target, dict) else target, depth + 1)
        if "allOf" in s:
            merged = {k: v for k, v in s.items() if k != "allOf"}
            for sub in s["allOf"] or ():
                alts = self._resolve(sub, depth + 1)
                if not alts:
                    return []
                merged = _merge(merged, alts[0])
            return self._resolve(merged, depth + 1)
        for key in ("anyOf", "oneOf"):
            if key in s:
                base = {k: v for k, v in s.items() if k != key}
                return [a for b in s[key] or () for a in self._resolve(_merge(base, b) if base else b, depth + 1)]
        t = s.get("type")
        if isinstance(t, list):
            return [dict(s, type=x) for x in t]
        return [s]

    def _ref(self, ref):
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        node = self.schema
        for part in ref[1:].split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node


def _merge(a: dict, b) -> dict:
    if not isinstance(b, dict):
        return a
    out = dict(a)
    for k, v in b.items():
        if k == "properties" and isinstance(out.get(k), dict) and isinstance(v, dict):
            out[k] = {**out[k], **v}
        elif k == "required" and isinstance(out.get(k), list) and isinstance(v, list):
            out[k] = out[k] + [r for r in v if r not in out[k]]
        else:
            out[k] = v
    return out


def _implied_type(a: dict) -> str | None:
    if any(k in a for k in ("properties", "required", "additionalProperties", "patternProperties")):
        return "object"
    if any(k in a for k in ("items", "prefixItems", "minItems")):
        return "array"
    if any(k in a for k in ("minLength", "maxLength", "pattern", "format")):
        return "string"
    if any(k in a for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "number"
    return None


def _enc(key: str) -> bytes:
    """A name as the inside of a JSON string."""
    return json.dumps(key, ensure_ascii=False)[1:-1].encode()


def _escape_rest(raw: bytes, esc: int) -> bytes:
    """What completes an escape or a character ``raw`` (a string's inside) stops in."""
    if esc == 1:
        return b"n"
    if esc >= 2:
        return b"0" * (6 - esc)
    return _utf8_rest(raw)


def _rest_of(sep: bytes, tail: bytes) -> bytes:
    """What is left of separator ``sep`` once ``tail`` of it was written."""
    return sep[len(tail) :] if sep.startswith(tail) else b""


def _shortest_string(a: dict) -> bytes | None:
    if "pattern" in a:
        example = regex_example(a["pattern"])
        return None if example is None else json.dumps(example, ensure_ascii=False).encode()
    if a.get("format") in FORMATS:
        return json.dumps(FORMATS[a["format"]]).encode()
    return b'"' + FILLS[0] * int(a.get("minLength", 0)) + b'"'


def _shortest_number(a: dict, integer: bool) -> bytes:
    v = 0
    lo, hi = a.get("minimum"), a.get("maximum")
    xlo, xhi = a.get("exclusiveMinimum"), a.get("exclusiveMaximum")
    if isinstance(lo, (int, float)) and v < lo:
        v = lo
    if isinstance(xlo, (int, float)) and not isinstance(xlo, bool) and v <= xlo:
        v = xlo + 1
    if isinstance(hi, (int, float)) and v > hi:
        v = hi
    if isinstance(xhi, (int, float)) and not isinstance(xhi, bool) and v >= xhi:
        v = xhi - 1
    if integer or float(v).is_integer():
        return str(math.ceil(v) if v >= 0 else math.floor(v)).encode()
    return repr(float(v)).encode()


def regex_example(pattern: str) -> str | None:
    """A short string matching ``pattern`` (each repeat at its minimum, the first character of
    each class, the shortest branch); None for what it cannot follow (look-arounds, back
    references). Checked against the pattern: None where the example does not match."""
    import re._parser as sre  # the standard library's parser of regular expressions

    try:
        parsed = sre.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return None
    out = _example(list(parsed), 0)
    if out is None:
        return None
    try:
        return out if re.search(pattern, out) else None
    except re.error:
        return None


_CATEGORY = {"CATEGORY_DIGIT": "0", "CATEGORY_WORD": "a", "CATEGORY_SPACE": " ", "CATEGORY_NOT_DIGIT": "a",
             "CATEGORY_NOT_WORD": " ", "CATEGORY_NOT_SPACE": "a"}  # fmt: skip


def _example(items, depth: int) -> str | None:
    if depth > 32:
        return None
    out = []
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(av))
        elif name in ("NOT_LITERAL", "ANY"):
            out.append("b" if name == "NOT_LITERAL" and av == ord("a") else "a")
        elif name == "IN":
            c = _class_example(av)
            if c is None:
                return None
            out.append(c)
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, _, sub = av
            part = _example(list(sub), depth + 1)
            if part is None:
                return None
            out.append(part * lo)
        elif name in ("SUBPATTERN", "ATOMIC_GROUP"):
            part = _example(list(av[-1]), depth + 1)
            if part is None:
                return None
            out.append(part)
        elif name == "BRANCH":
            parts = [p for p in (_example(list(b), depth + 1) for b in av[1]) if p is not None]
            if not parts:
                return None
            out.append(min(parts, key=len))
        elif name == "AT":
            continue
        elif name == "CATEGORY":
            out.append(_CATEGORY.get(str(av), "a"))
        else:
            return None
    return "".join(out)


def _class_example(av) -> str | None:
    if av and str(av[0][0]) == "NEGATE":
        return None  # [^...]: not worth a search; the grammar check refuses a wrong pick
    for op, v in av:
        name = str(op)
        if name == "LITERAL":
            return chr(v)
        if name == "RANGE":
            return chr(v[0])
        if name == "CATEGORY":
            return _CATEGORY.get(str(v), "a")
    return None


# -- tool calls --------------------------------------------------------------------------------
TEXT, HEAD, ARGS, END, SEP = "text", "head", "args", "end", "sep"


class ToolCursor:
    """Where an answer held to a tool-call grammar stands: free text (``auto``, watching for the
    format's trigger), a call's head (``begin``, a name, ``middle``), its JSON arguments, its
    end, the separator before another call; ``calls``: the calls completed."""

    __slots__ = ("state", "buf", "args", "tool", "calls", "error")

    def __init__(self, state: str):
        self.state, self.buf, self.args, self.tool, self.calls, self.error = state, b"", None, None, 0, False

    def copy(self) -> ToolCursor:
        c = ToolCursor.__new__(ToolCursor)
        c.state, c.buf, c.tool, c.calls, c.error = self.state, self.buf, self.tool, self.calls, self.error
        c.args = None if self.args is None else self.args.copy()
        return c


class ToolFinish:
    """Closings of an answer held to ``ToolFormat.grammar``: ``mode`` ``required`` (calls only)
    or ``auto`` (free text, and a call from the trigger on)."""

    def __init__(self, fmt: ToolFormat, tools: list[dict], mode: str, parallel: bool = True):
        self.fmt, self.mode = fmt, mode
        self.many = mode == "auto" or (parallel and fmt.sep is not None)
        self.trigger = fmt.trigger.encode()
        skip = len(fmt.trigger) if mode == "auto" else 0
        self.heads = {t["name"]: (fmt.begin + t["name"] + fmt.middle)[skip:].encode() for t in tools}
        self.args = {
            t["name"]: JsonFinish(
                dict(t.get("parameters") or {"type": "object"}), fmt.key_separator, fmt.item_separator
            )
            for t in tools
        }  # fmt: skip
        self.end, self.sep = fmt.end.encode(), (fmt.sep or "").encode()

    def start(self) -> ToolCursor:
        return ToolCursor(TEXT if self.mode == "auto" else HEAD)

    @staticmethod
    def in_string(cur: ToolCursor) -> bool:
        return cur.state == ARGS and JsonFinish.in_string(cur.args)

    def patterned(self, cur: ToolCursor) -> bool:
        return cur.state == ARGS and self.args[cur.tool].patterned(cur.args)

    def feed(self, cur: ToolCursor, data: bytes) -> None:
        i = 0
        while i < len(data) and not cur.error:
            if cur.state == ARGS:
                i += cur.args.feed(data[i:])
                if cur.args.error:
                    cur.error = True
                elif cur.args.done:
                    cur.state, cur.buf, cur.args = END, b"", None
                continue
            cur.buf += data[i : i + 1]
            i += 1
            self._advance(cur)

    def _advance(self, cur: ToolCursor) -> None:
        buf = cur.buf
        if cur.state == TEXT:
            if buf.endswith(self.trigger):
                cur.state, cur.buf = HEAD, b""
            elif len(buf) >= len(self.trigger):
                cur.buf = buf[len(buf) - len(self.trigger) + 1 :]
        elif cur.state == HEAD:
            whole = [n for n, h in self.heads.items() if h == buf]
            if whole:
                cur.state, cur.buf, cur.tool, cur.args = ARGS, b"", whole[0], self.args[whole[0]].start()
            elif not any(h.startswith(buf) for h in self.heads.values()):
                cur.error = True
        elif cur.state == END:
            if buf == self.end:
                cur.calls += 1
                cur.buf = b""
                cur.state = TEXT if self.mode == "auto" else (SEP if self.many else "done")
            elif not self.end.startswith(buf):
                cur.error = True
        elif cur.state == SEP:  # held until the next call's head begins: after a separator one must follow
            if len(buf) > len(self.sep) and buf.startswith(self.sep):
                cur.state, cur.buf = HEAD, buf[len(self.sep) :]
                self._advance(cur)
            elif not self.sep.startswith(buf):
                cur.error = True
        else:
            cur.error = True  # nothing may follow

    def closings(self, cur: ToolCursor) -> list[bytes]:
        if cur.error:
            return []
        if cur.state in (TEXT, "done") or (cur.state == SEP and not cur.buf):
            return [b""]
        if cur.state == ARGS:
            return [t + self.end for t in self.args[cur.tool].closings(cur.args)]
        if cur.state == END:
            return [self.end[len(cur.buf) :]]
        lead = self.sep[len(cur.buf) :] if cur.state == SEP else b""
        head = b"" if cur.state == SEP else cur.buf
        out = []
        for name, h in self.heads.items():
            args = self.args[name].shortest(self.args[name].schema)
            if h.startswith(head) and args is not None:
                out.append(lead + (h if cur.state == SEP else h[len(head) :]) + args + self.end)
        return _shortest(out)


def finisher(spec: dict) -> JsonFinish | ToolFinish:
    """The closer for a constraint (``parse_spec``'s dict; a json_schema's ``schema`` as the
    grammar was compiled from it, so the properties come in the same order)."""
    if spec["type"] == "tool_calls":
        fmt = ToolFormat.from_dict(spec["format"])
        return ToolFinish(fmt, spec["tools"], spec["mode"], spec.get("parallel", True))
    return JsonFinish({"type": "object"} if spec["type"] == "json_object" else spec["schema"])
