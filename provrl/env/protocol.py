"""Tool-call protocols: how a model's turn text becomes a tool call (or an error).

Tag protocol (default; Search-R1 style)::

    <search>query</search>    <open>doc id</open>    <answer>final answer</answer>

Hermes protocol (Qwen family)::

    <tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>
    <tool_call>{"name": "open", "arguments": {"doc_id": "..."}}</tool_call>
    <tool_call>{"name": "answer", "arguments": {"answer": "..."}}</tool_call>   (or <answer>…</answer>)

Generation stops at the closing tag (the engine's stop strings), so a well-formed turn ends
with exactly one call. Parsing never raises: any text yields either a :class:`Call` or a
:class:`Malformed` whose ``error`` is shown to the model as the tool observation.

Parsing is linear in the length of the text (model output is untrusted input): the first
complete ``<name>…</name>`` is found with one scan for opening tags and one ``str.find``
per tag name — a name whose closing tag is missing after one opening tag is missing after
every later one too — instead of a lazy regex that rescans the rest of the text from each
unclosed tag (1 MB of ``<search>`` took 705 s that way).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

ToolName = Literal["search", "open", "answer"]
TOOLS: tuple[ToolName, ...] = ("search", "open", "answer")
MAX_ARGUMENT_CHARS = 512


@dataclass(frozen=True)
class Call:
    name: ToolName
    argument: str


@dataclass(frozen=True)
class Malformed:
    error: str
    """Human-readable reason, shown to the model."""
    raw: str = ""


Parsed = Call | Malformed

_OPEN_TAG = re.compile(r"<(search|open|answer)>")
_ARG_KEYS: dict[str, tuple[str, ...]] = {
    "search": ("query", "q"),
    "open": ("doc_id", "id"),
    "answer": ("answer", "text"),
}


def stop_strings(protocol: str) -> tuple[str, ...]:
    """Strings that end a turn (passed to the engine as SamplingParams.stop)."""
    if protocol == "tag":
        return ("</search>", "</open>", "</answer>")
    return ("</tool_call>", "</answer>")


def _check_argument(name: ToolName, arg: str, raw: str) -> Parsed:
    arg = " ".join(arg.split())
    if not arg:
        return Malformed(f"empty <{name}> argument", raw)
    if len(arg) > MAX_ARGUMENT_CHARS:
        return Malformed(f"<{name}> argument longer than {MAX_ARGUMENT_CHARS} characters", raw)
    return Call(name, arg)


@dataclass(frozen=True)
class TagMatch:
    """A complete ``<name>body</name>`` at ``text[start:end]``."""

    name: ToolName
    start: int
    end: int
    body: str


def first_tag(text: str) -> TagMatch | None:
    """The first complete ``<search|open|answer>…</…>`` in ``text`` — what the regex
    ``<(search|open|answer)>(.*?)</\\1>`` finds (the leftmost opening tag that is closed
    later, with the shortest body) — in O(len(text))."""
    unclosed: set[str] = set()
    for m in _OPEN_TAG.finditer(text):
        name = m.group(1)
        if name in unclosed:
            continue
        close = text.find(f"</{name}>", m.end())
        if close < 0:
            unclosed.add(name)  # no later <name> can be closed either
            if len(unclosed) == len(TOOLS):
                return None
            continue
        end = close + len(name) + 3
        return TagMatch(name, m.start(), end, text[m.end() : close])  # type: ignore[arg-type]
    return None


def _tool_call(text: str) -> tuple[int, int, str] | None:
    """(start, end, body) of the first ``<tool_call>…</tool_call>``, in O(len(text))."""
    start = text.find("<tool_call>")
    if start < 0:
        return None
    close = text.find("</tool_call>", start + len("<tool_call>"))
    if close < 0:
        return None
    return start, close + len("</tool_call>"), text[start + len("<tool_call>") : close]


def parse_tag(text: str) -> Parsed:
    """First complete ``<search|open|answer>…</…>`` in ``text``."""
    t = first_tag(text)
    if t is not None:
        return _check_argument(t.name, t.body, text[t.start : t.end])
    m2 = _OPEN_TAG.search(text)
    if m2:
        return Malformed(f"<{m2.group(1)}> was not closed with </{m2.group(1)}>", text[-200:])
    return Malformed(
        "no tool call found: write <search>query</search> or <answer>answer</answer>",
        text[-200:],
    )


def parse_hermes(text: str) -> Parsed:
    """First ``<tool_call>{json}</tool_call>`` (or a bare ``<answer>…</answer>``)."""
    m = _tool_call(text)
    a = first_tag(text)
    if a is not None and a.name == "answer" and (m is None or a.start < m[0]):
        return _check_argument("answer", a.body, text[a.start : a.end])
    if m is None:
        if "<tool_call>" in text:
            return Malformed("<tool_call> was not closed with </tool_call>", text[-200:])
        return Malformed(
            'no tool call found: write <tool_call>{"name": "search", "arguments": '
            '{"query": "..."}}</tool_call>',
            text[-200:],
        )
    raw = text[m[0] : m[1]]
    try:
        obj = json.loads(m[2])
    except (json.JSONDecodeError, RecursionError) as e:
        return Malformed(f"tool call is not valid JSON ({type(e).__name__})", raw)
    if not isinstance(obj, dict):
        return Malformed("tool call must be a JSON object with name and arguments", raw)
    name = obj.get("name")
    if name not in TOOLS:
        return Malformed(f"unknown tool {name!r}; tools: search, open, answer", raw)
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            args = {_ARG_KEYS[name][0]: args}
    if not isinstance(args, dict):
        return Malformed("tool call arguments must be a JSON object", raw)
    for key in _ARG_KEYS[name]:
        v = args.get(key)
        if isinstance(v, str | int | float) and not isinstance(v, bool):
            return _check_argument(name, str(v), raw)
    return Malformed(f"tool {name!r} needs argument {_ARG_KEYS[name][0]!r}", raw)


def parse(text: str, protocol: str) -> Parsed:
    """Parse one turn's text with the named protocol (``tag`` or ``hermes``)."""
    try:
        return parse_tag(text) if protocol == "tag" else parse_hermes(text)
    except Exception as e:  # a parser bug must not kill a rollout
        return Malformed(f"unparseable tool call ({type(e).__name__})", text[-200:])


def render_call(call: Call, protocol: str) -> str:
    """The text a model writes for ``call`` (used for worked examples and teacher traces)."""
    if protocol == "tag" or call.name == "answer":
        return f"<{call.name}>{call.argument}</{call.name}>"
    key = _ARG_KEYS[call.name][0]
    body = json.dumps({"name": call.name, "arguments": {key: call.argument}}, ensure_ascii=False)
    return f"<tool_call>{body}</tool_call>"
