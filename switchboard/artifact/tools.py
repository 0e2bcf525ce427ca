"""Tool calls: how a model writes them, the grammar that holds it to that, and the parser that
turns what it wrote back into OpenAI's ``tool_calls``.

A checkpoint's chat template is the only place its tool-call format is written down (Qwen2 and
Hermes: ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``; the default model: the
same, compact). ``ToolFormat.of`` renders a probe conversation through the template and reads
the format off the text, so any template that renders ``tool_calls`` works, without a list of
known families. The grammar (``ToolFormat.grammar``) forces that format with each tool's
parameters schema for ``required`` and a named function, and for ``auto`` lets the model write
free text until it writes the call's opening tag (llguidance's lazy trigger). The parser
(``ToolCallParser``) then reads calls out of the streamed text; the grammar guarantees what
it reads, so it only has to find the boundaries.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import asdict, dataclass

from switchboard.artifact.tokenizer import ChatTemplate

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
MAX_TOOLS = 128
_PROBE_NAME, _PROBE_NAME2 = "zzprobe_first", "zzprobe_second"
_PROBE_ARGS = {"zzkey": "zzval", "zzkey2": 7}
_PROBE_TEXT = "zzcontent"


class ToolFormatError(ValueError):
    """The template renders no tool calls, or not in a form a grammar can hold."""


@dataclass(frozen=True)
class ToolFormat:
    """One call is ``begin + name + middle + arguments + end``; calls in a row are joined by
    ``sep`` (None: the template takes one call per answer). The arguments are JSON written with
    ``key_separator`` and ``item_separator`` as the template writes them."""

    begin: str
    middle: str
    end: str
    sep: str | None
    key_separator: str = ":"
    item_separator: str = ","

    @property
    def trigger(self) -> str:
        """What the model writes freely before a call is forced on it (``auto``): the opening
        tag (``<tool_call>``), or the whole ``begin`` when it has none."""
        m = re.match(r"\s*<[^<>\s]{1,32}>", self.begin)
        return m.group(0) if m else self.begin

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ToolFormat:
        try:
            fmt = cls(**d)
        except TypeError:
            raise ToolFormatError("tool format: unexpected fields") from None
        if not all(isinstance(getattr(fmt, k), str) for k in ("begin", "middle", "end")) or not fmt.begin:
            raise ToolFormatError("tool format: begin, middle and end must be strings")
        return fmt

    @classmethod
    def of(cls, template: ChatTemplate) -> ToolFormat:
        """The format ``template`` writes tool calls in; ToolFormatError when it writes none."""
        tools = [_tool_def(_PROBE_NAME), _tool_def(_PROBE_NAME2)]
        user = {"role": "user", "content": "zzquestion"}

        def assistant(*names: str, content: str = "") -> dict:
            calls = [
                {"id": f"call_{n}", "type": "function", "function": {"name": n, "arguments": _PROBE_ARGS}}
                for n in names
            ]
            return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}

        try:
            head = template.render([user], add_generation_prompt=True, tools=tools)
            one = template.render([user, assistant(_PROBE_NAME)], add_generation_prompt=False, tools=tools)
            plain = template.render([user, assistant(content=_PROBE_TEXT)], add_generation_prompt=False, tools=tools)
        except Exception as e:  # noqa: BLE001 - a template's own raise_exception or a jinja error
            raise ToolFormatError(f"the chat template renders no tool calls ({e})") from None
        if not one.startswith(head) or not plain.startswith(head) or _PROBE_NAME not in one:
            raise ToolFormatError("the chat template renders no tool calls")
        text = one[len(head) :]
        closing = plain[len(head) :].split(_PROBE_TEXT, 1)[-1]  # what ends an answer
        i = text.find(_PROBE_NAME)
        a0 = text.rfind("{", 0, text.find('"zzkey"'))
        a1 = text.find("}", text.find("7", text.find('"zzkey2"'))) + 1
        if not 0 < i < a0 < a1 or not text.endswith(closing):
            raise ToolFormatError("the chat template's tool calls are not name then JSON arguments")
        args = text[a0:a1]
        key_sep = args[len('{"zzkey"') : args.index('"zzval"')]
        item_sep = args[args.index('"zzval"') + len('"zzval"') : args.index('"zzkey2"')]
        if json.loads(args) != _PROBE_ARGS:
            raise ToolFormatError("the chat template writes tool arguments as something other than JSON")
        begin, middle = text[:i], text[i + len(_PROBE_NAME) : a0]
        end = text[a1 : len(text) - len(closing)]
        sep = None
        try:
            two = template.render(
                [user, assistant(_PROBE_NAME, _PROBE_NAME2)], add_generation_prompt=False, tools=tools
            )[len(head) :]
            first = begin + _PROBE_NAME + middle + args + end
            second = begin + _PROBE_NAME2 + middle + args + end + closing
            if two.startswith(first) and two.endswith(second):
                sep = two[len(first) : len(two) - len(second)]
        except Exception:  # noqa: BLE001 - one call per answer (Llama 3.1's template raises)
            sep = None
        return cls(begin, middle, end, sep, key_sep, item_sep)

    def call_text(self, name: str, arguments: str) -> str:
        return self.begin + name + self.middle + arguments + self.end

    def grammar(self, tools: list[dict], mode: str, parallel: bool = True, special_trigger: bool = False) -> str:
        """A Lark grammar (llguidance's) for an answer that calls ``tools`` (``{"name",
        "parameters"}``): ``required``: one call or more (one when not ``parallel`` or the format
        takes one), nothing else; ``auto``: free text, and whatever follows the trigger is a call."""
        options = {
            "whitespace_flexible": False,
            "key_separator": self.key_separator,
            "item_separator": self.item_separator,
        }

        def args(tool: dict) -> str:
            schema = dict(tool.get("parameters") or {"type": "object"})
            schema["x-guidance"] = options
            return "%json " + json.dumps(schema, ensure_ascii=False)

        lines = ["%llguidance {}"]
        if mode == "required":
            many = parallel and self.sep is not None
            lines.append(
                "start: call" + (f" ({_lit(self.sep)} call)*" if many and self.sep else " call*" if many else "")
            )
            lines.append("call: " + " | ".join(f"tool_{i}" for i in range(len(tools))))
            for i, tool in enumerate(tools):
                head = _lit(self.begin + tool["name"] + self.middle)
                lines.append(f"tool_{i}: {head} args_{i} {_lit(self.end)}")
                lines.append(f"args_{i}: {args(tool)}")
            return "\n".join(lines)
        if mode != "auto":
            raise ToolFormatError(f"tool choice: {mode!r} is not auto or required")
        trig = self.trigger
        lines.append("start: (" + " | ".join(f"tag_{i}" for i in range(len(tools))) + ")* TAG_TEXT")
        lines.append(r"TAG_TEXT: /(.|\n)*/")
        lines.append(f"trig[lazy]: TAG_TEXT {trig if special_trigger else _lit(trig)}")
        for i, tool in enumerate(tools):
            rest = (self.begin + tool["name"] + self.middle)[len(trig) :]
            lines.append(f"tag_{i}: trig {_lit(rest)} args_{i} {_lit(self.end)}")
            lines.append(f"args_{i}: {args(tool)}")
        return "\n".join(lines)


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False) if s else '""'


def _tool_def(name: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": "zzdescription",
            "parameters": {"type": "object", "properties": {"zzkey": {"type": "string"}}},
        },
    }


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallParser:
    """Streamed answer text in, content and tool-call deltas out (OpenAI's stream shape).

    ``feed(delta)`` returns ``(content, calls)``: the text that is the answer's content, and a
    list of ``{"index", "id"?, "type"?, "function": {"name"?, "arguments"}}`` deltas, the first
    of each call with its id and name. Text that could be the start of a call is held until the
    next delta tells."""

    def __init__(self, fmt: ToolFormat, names: set[str], id_factory=new_call_id):
        self.fmt, self.names, self.new_id = fmt, names, id_factory
        self.trigger = fmt.trigger.lstrip()
        self.pending = ""  # text not yet classified
        self.in_call = False
        self.args_sent = 0  # of the current call's arguments
        self.calls: list[dict] = []  # {"id", "type", "function": {"name", "arguments"}}
        self.content = ""

    def feed(self, delta: str) -> tuple[str, list[dict]]:
        self.pending += delta
        out_text, out_calls = "", []
        while True:
            if not self.in_call:
                k = self.pending.find(self.trigger)
                if k < 0:
                    keep = _partial_suffix(self.pending, self.trigger)
                    out_text += self.pending[: len(self.pending) - keep]
                    self.pending = self.pending[len(self.pending) - keep :]
                    break
                head = self.pending[k:]
                name = self._name(head)
                if name is None:  # the call's head is still arriving (or is not a call)
                    if not _could_begin(head, self.fmt):
                        out_text += self.pending[: k + len(self.trigger)]
                        self.pending = self.pending[k + len(self.trigger) :]
                        continue
                    out_text += self.pending[:k]
                    self.pending = head
                    break
                out_text += self.pending[:k]
                call = {"id": self.new_id(), "type": "function", "function": {"name": name, "arguments": ""}}
                self.calls.append(call)
                out_calls.append({"index": len(self.calls) - 1, **json.loads(json.dumps(call))})
                self.pending = head[len(self._head(name)) :]
                self.in_call, self.args_sent = True, 0
            args, done = _arguments(self.pending)
            new = args[self.args_sent :]
            if new:
                self.calls[-1]["function"]["arguments"] += new
                _add_args(out_calls, len(self.calls) - 1, new)
                self.args_sent = len(args)
            if not done:
                break
            rest = self.pending[len(args) :]
            end = self.fmt.end
            if len(rest) < len(end) and end.startswith(rest):
                break  # the end is arriving
            self.pending = rest[len(end) :] if rest.startswith(end) else rest
            if self.fmt.sep and self.pending.startswith(self.fmt.sep):
                self.pending = self.pending[len(self.fmt.sep) :]
            self.in_call = False
        self.content += out_text
        return out_text, out_calls

    def flush(self) -> tuple[str, list[dict]]:
        """What is left once the answer ended: held text is content; an unfinished call keeps
        the arguments it had (the answer was cut by its length)."""
        if self.in_call:
            return "", []
        out, self.pending = self.pending, ""
        self.content += out
        return out, []

    def _head(self, name: str) -> str:
        return (self.fmt.begin + name + self.fmt.middle).lstrip()

    def _name(self, head: str) -> str | None:
        begin = self.fmt.begin.lstrip()
        if not head.startswith(begin):
            return None
        rest = head[len(begin) :]
        for name in sorted(self.names, key=len, reverse=True):
            if rest.startswith(name + self.fmt.middle):
                return name
        return None


def _could_begin(head: str, fmt: ToolFormat) -> bool:
    """``head`` (from the trigger on) may still become a call's head: ``begin``, a name, ``middle``."""
    begin = fmt.begin.lstrip()
    if len(head) <= len(begin):
        return begin.startswith(head)
    if not head.startswith(begin):
        return False
    rest = head[len(begin) :]
    name = re.match(r"[A-Za-z0-9_-]*", rest)
    return fmt.middle.startswith(rest[name.end() :])


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


_decoder = json.JSONDecoder()


def _arguments(text: str) -> tuple[str, bool]:
    """The arguments' JSON at the start of ``text`` and whether it is complete."""
    try:
        _, n = _decoder.raw_decode(text)
        return text[:n], True
    except ValueError:
        return text, False


def _add_args(out: list[dict], index: int, new: str) -> None:
    if out and out[-1]["index"] == index:
        out[-1]["function"]["arguments"] += new
    else:
        out.append({"index": index, "function": {"arguments": new}})
