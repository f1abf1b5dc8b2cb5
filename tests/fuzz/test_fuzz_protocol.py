"""Fuzz: the tool-call parsers on model output shaped like tool calls with hostile JSON."""

from __future__ import annotations

import json

from fuzz_json import JSON
from hypothesis import given, settings
from hypothesis import strategies as st

from provrl.env.protocol import MAX_ARGUMENT_CHARS, Call, Malformed, parse

NOISE = st.text(max_size=40)


@st.composite
def hermes_turns(draw):
    body = draw(
        st.one_of(
            JSON.map(json.dumps),
            st.fixed_dictionaries({"name": JSON | st.sampled_from(["search", "open", "answer"]),
                                   "arguments": JSON | JSON.map(json.dumps)}).map(json.dumps),
            st.text(max_size=60),
        )
    )  # fmt: skip
    return draw(NOISE) + "<tool_call>" + body + draw(st.sampled_from(["</tool_call>", ""]))


@settings(max_examples=400, deadline=None)
@given(hermes_turns() | NOISE, st.sampled_from(["tag", "hermes"]))
def test_parsers_return_a_call_or_a_reason(text, protocol):
    r = parse(text, protocol)
    if isinstance(r, Call):
        assert r.name in ("search", "open", "answer")
        assert r.argument.strip() and len(r.argument) <= MAX_ARGUMENT_CHARS
    else:
        assert isinstance(r, Malformed) and r.error and len(r.raw) <= max(200, len(text))


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(["<search>", "<open>", "<answer>", "<tool_call>", "</search>", "{"]),
       st.integers(1000, 20000), st.sampled_from(["tag", "hermes"]))  # fmt: skip
def test_repeated_fragments_parse_in_linear_time(fragment, n, protocol):
    assert isinstance(parse(fragment * n, protocol), Call | Malformed)
