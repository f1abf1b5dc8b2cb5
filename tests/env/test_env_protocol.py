"""Tool-call parsers: arbitrary model output never raises; well-formed calls round-trip."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provrl.env.protocol import Call, Malformed, first_tag, parse, render_call, stop_strings

# text with lots of protocol fragments in it
FRAGMENTS = st.sampled_from(
    [
        "<search>",
        "</search>",
        "<open>",
        "</open>",
        "<answer>",
        "</answer>",
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        '"name"',
        '"arguments"',
        ":",
        ",",
        '"search"',
        '"query"',
        '"answer"',
        '"open"',
        '"doc_id"',
        "[",
        "]",
        "null",
        "1e999",
        "\\u0000",
        "\n",
        " ",
        "x",
        "Orlan Vesk",
        '"',
    ]
)
MODEL_TEXT = st.one_of(
    st.text(max_size=300),
    st.lists(st.one_of(FRAGMENTS, st.text(max_size=8)), max_size=60).map("".join),
)


@settings(max_examples=400, deadline=None)
@given(MODEL_TEXT, st.sampled_from(["tag", "hermes"]))
def test_parse_never_raises(text, protocol):
    r = parse(text, protocol)
    assert isinstance(r, Call | Malformed)
    if isinstance(r, Call):
        assert r.name in ("search", "open", "answer") and r.argument.strip()
    else:
        assert r.error


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["search", "open", "answer"]),
    st.text(
        alphabet=st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)),
        min_size=1,
        max_size=80,
    ).filter(lambda s: s.strip()),
    st.sampled_from(["tag", "hermes"]),
    st.text(
        alphabet=st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)), max_size=40
    ),
)
def test_rendered_calls_parse_back(name, arg, protocol, prefix):
    text = prefix + render_call(Call(name, arg), protocol)
    r = parse(text, protocol)
    assert r == Call(name, " ".join(arg.split()))


def test_tag_examples():
    assert parse("I will look. <search>Orlan Vesk</search>", "tag") == Call("search", "Orlan Vesk")
    assert parse("<answer> 1971 </answer>", "tag") == Call("answer", "1971")
    assert parse("<open>d0000012</open>", "tag") == Call("open", "d0000012")
    assert isinstance(parse("The answer is 1971.", "tag"), Malformed)
    assert "not closed" in parse("<search>Orlan", "tag").error  # type: ignore[union-attr]
    assert "empty" in parse("<search>  </search>", "tag").error  # type: ignore[union-attr]
    # the first complete call wins
    assert parse("<search>a</search><answer>b</answer>", "tag") == Call("search", "a")
    assert stop_strings("tag") == ("</search>", "</open>", "</answer>")


def test_hermes_examples():
    call = '<tool_call>{"name": "search", "arguments": {"query": "Orlan Vesk"}}</tool_call>'
    assert parse(call, "hermes") == Call("search", "Orlan Vesk")
    double = json.dumps({"name": "open", "arguments": json.dumps({"doc_id": "d1"})})
    assert parse(f"<tool_call>{double}</tool_call>", "hermes") == Call("open", "d1")
    assert parse("<answer>1971</answer>", "hermes") == Call("answer", "1971")
    for bad, why in [
        ("<tool_call>{oops}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "fly", "arguments": {}}</tool_call>', "unknown tool"),
        ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "needs argument"),
        ('<tool_call>["search"]</tool_call>', "JSON object"),
        ('<tool_call>{"name": "search"', "not closed"),
        ("just text", "no tool call"),
    ]:
        r = parse(bad, "hermes")
        assert isinstance(r, Malformed) and why in r.error, (bad, r)


# the regex parse_tag used before it became linear: the reference semantics
_OLD_TAG = re.compile(r"<(search|open|answer)>(.*?)</\1>", re.DOTALL)


@settings(max_examples=400, deadline=None)
@given(MODEL_TEXT)
def test_first_tag_finds_what_the_lazy_regex_found(text):
    m, t = _OLD_TAG.search(text), first_tag(text)
    if m is None:
        assert t is None
    else:
        assert t is not None
        assert (t.name, t.start, t.end, t.body) == (m.group(1), m.start(), m.end(), m.group(2))


@pytest.mark.parametrize("protocol", ["tag", "hermes"])
def test_a_megabyte_of_unclosed_tags_parses_in_linear_time(protocol):
    """1 MB of unclosed <search> took 705 s with the lazy regex (quadratic)."""
    import time

    for text in (
        "<search>" * 131_072,
        "<tool_call>" * 95_000,
        "<search><open><answer>" * 47_000 + "</answer>",
    ):
        t0 = time.perf_counter()
        r = parse(text, protocol)
        assert time.perf_counter() - t0 < 2.0  # milliseconds; quadratic was minutes
        assert isinstance(r, Malformed | Call)
