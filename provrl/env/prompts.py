"""Prompt text: instructions (a template), observations, and worked examples (few-shot from the
oracle).

The instructions are a *template* (``env.agent.prompt`` names one, ``prompt_file`` /
``prompt_template`` give your own) with three placeholders, each replaced as written, nothing
else in the text touched (JSON braces are safe):

====================  ================================================================
``{tools}``           how to call the tools in the agent's protocol (:data:`TOOLS`)
``{reasoning}``       :data:`REASONING` when ``env.agent.reasoning`` is on, else nothing
``{question}``        the question; a template that has it is the *user* turn (no system
                      turn, as Search-R1 writes it); one without it is the system turn,
                      and the question follows as ``Question: …``
====================  ================================================================

``auto`` (the default) is the world's wording on the built-in world's tasks and the neutral
one on yours (a plain question/answer task, or your own index): "The documents are about a
fictional world" is true of one of them only. The world's prompt is byte-identical to the
one every earlier run used (tests/env/test_prompts.py pins it): its tokens do not change.

Small models have small contexts: observations are short (``k`` snippets of at most
``snippet_words`` words, then cut to ``max_observation_tokens`` tokens by the agent loop).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from provrl.env.search import Hit

Message = dict[str, str]

TOOLS = {
    "tag": (
        "To search, write <search>query</search> and wait for the results. "
        "To read a whole document, write <open>document id</open>. "
        "When you know the answer, write <answer>answer</answer> with only the answer inside."
    ),
    "hermes": (
        "Tools: search(query), open(doc_id), answer(answer). Call one tool per turn as "
        '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>. '
        'Finish with <tool_call>{"name": "answer", "arguments": {"answer": "..."}}</tool_call>.'
    ),
}
"""``{tools}``: how to call search, open and answer in each protocol."""

REASONING = (
    "\nBefore each tool call and before the answer, think step by step inside <think> and </think>."
)
"""``{reasoning}`` when ``env.agent.reasoning`` is on (it starts a new line)."""

TEMPLATES = {
    "world": (
        "Answer the question using the search tool. The documents are about a fictional world, "
        "so you cannot know the answer without searching.\n{tools}{reasoning}"
    ),
    "neutral": (
        "Answer the question using the search tool. Look the answer up in the documents "
        "rather than answering from memory.\n{tools}{reasoning}"
    ),
    # Search-R1's `base` template (scripts/data_process/nq_search.py, make_prefix), the whole
    # user turn; it asks for <think> itself, so {reasoning} is not in it
    "search-r1": (
        "Answer the given question. You must conduct reasoning inside <think> and </think> "
        "first every time you get new information. After reasoning, if you find you lack some "
        "knowledge, you can call a search engine by <search> query </search> and it will "
        "return the top searched results between <information> and </information>. You can "
        "search as many times as your want. If you find no further external knowledge needed, "
        "you can directly provide the answer inside <answer> and </answer>, without detailed "
        "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
    ),
}
"""The named templates (``env.agent.prompt``; ``auto`` picks world or neutral)."""

PLACEHOLDERS = ("tools", "reasoning", "question")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class PromptError(ValueError):
    """A prompt template that cannot be used; the message names the template."""


@dataclass(frozen=True)
class Prompt:
    """Resolved instructions: the system turn (None: none) and the user turn, whose
    ``{question}`` is the episode's question."""

    system: str | None
    user: str

    def messages(self, question: str, shots: Sequence[Sequence[Message]] = ()) -> list[Message]:
        """Chat messages for an episode: the system turn, the worked examples (complete
        dialogues), then the question."""
        out: list[Message] = [] if self.system is None else [{"role": "system", "content": self.system}]  # fmt: skip
        for shot in shots:
            out.extend(shot)
        out.append({"role": "user", "content": self.user.replace("{question}", question)})
        return out


def check_template(text: str, where: str) -> None:
    """Refuse a template with a placeholder other than :data:`PLACEHOLDERS` (one line naming
    ``where`` and the placeholder), or with nothing in it."""
    if not text.strip():
        raise PromptError(f"{where}: the prompt template is empty")
    for m in _PLACEHOLDER.finditer(text):
        if m.group(1) not in PLACEHOLDERS:
            raise PromptError(
                f"{where}: unknown placeholder {{{m.group(1)}}} in the prompt template "
                f"(known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})"
            )


def read_template(path: str | Path) -> str:
    """A template file's text (UTF-8), checked; an unreadable file is one line naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PromptError(f"{path}: cannot read the prompt template ({e})") from None
    check_template(text, str(path))
    return text


def render(template: str, protocol: str, reasoning: bool) -> Prompt:
    """The :class:`Prompt` of ``template`` for the agent's ``protocol`` (tag or hermes)."""
    text = template.replace("{tools}", TOOLS[protocol]).replace(
        "{reasoning}", REASONING if reasoning else ""
    )
    if "{question}" in text:
        return Prompt(None, text)
    return Prompt(text, question_message("{question}"))


def resolve_template(name: str, *, world: bool) -> str:
    """The text of a named template; ``auto`` is ``world`` when ``world`` (the built-in world's
    tasks and index) else ``neutral``."""
    if name == "auto":
        name = "world" if world else "neutral"
    return TEMPLATES[name]


def instructions(protocol: str) -> str:
    """The world's system turn for ``protocol`` (the default prompt of the built-in world)."""
    system = render(TEMPLATES["world"], protocol, reasoning=False).system
    assert system is not None
    return system


def question_message(question: str) -> str:
    """The user turn that poses a question (after a system turn)."""
    return f"Question: {question}"


def format_hits(hits: Sequence[Hit]) -> str:
    """Search results as the model sees them."""
    if not hits:
        return "<information>\nNo results.\n</information>"
    lines = [f"[{j + 1}] {h.title} ({h.doc_id}): {h.snippet}" for j, h in enumerate(hits)]
    return "<information>\n" + "\n".join(lines) + "\n</information>"


def format_document(doc_id: str, text: str | None) -> str:
    if text is None:
        return f"<information>\nNo document with id {doc_id!r}.\n</information>"
    return f"<information>\n{text}\n</information>"


def format_error(message: str) -> str:
    return f"<information>\nError: {message}\n</information>"


def format_repeat(name: str, argument: str) -> str:
    """What a repeated call sees under ``env.agent.repeat_calls: note``: it was not run, and
    its results are already in the context."""
    did = f'searched for "{argument}"' if name == "search" else f"opened {argument}"
    return (
        f"<information>\nAlready {did}: the results are above. "
        "Search for something else, or give your <answer>.\n</information>"
    )


def build_messages(
    question: str,
    protocol: str,
    shots: Sequence[Sequence[Message]] = (),
    prompt: Prompt | None = None,
) -> list[Message]:
    """Chat messages for an episode: the instructions (``prompt``; the world's for
    ``protocol`` by default), the worked examples, then the question.

    Each shot is the oracle's transcript of a train task: ``[user question, assistant call,
    user observation, ..., assistant answer]``."""
    p = prompt or render(TEMPLATES["world"], protocol, reasoning=False)
    return p.messages(question, shots)
