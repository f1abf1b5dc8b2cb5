"""Prompt text: instructions, observations, and worked examples (few-shot from the oracle).

Small models have small contexts: observations are short (``k`` snippets of at most
``snippet_words`` words, then cut to ``max_observation_tokens`` tokens by the agent loop).
"""

from __future__ import annotations

from collections.abc import Sequence

from provrl.env.search import Hit

Message = dict[str, str]

TAG_INSTRUCTIONS = (
    "Answer the question using the search tool. The documents are about a fictional world, "
    "so you cannot know the answer without searching.\n"
    "To search, write <search>query</search> and wait for the results. "
    "To read a whole document, write <open>document id</open>. "
    "When you know the answer, write <answer>answer</answer> with only the answer inside."
)
HERMES_INSTRUCTIONS = (
    "Answer the question using the search tool. The documents are about a fictional world, "
    "so you cannot know the answer without searching.\n"
    "Tools: search(query), open(doc_id), answer(answer). Call one tool per turn as "
    '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>. '
    'Finish with <tool_call>{"name": "answer", "arguments": {"answer": "..."}}</tool_call>.'
)


def instructions(protocol: str) -> str:
    return TAG_INSTRUCTIONS if protocol == "tag" else HERMES_INSTRUCTIONS


def question_message(question: str) -> str:
    """The user turn that poses a question."""
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


def build_messages(
    question: str, protocol: str, shots: Sequence[Sequence[Message]] = ()
) -> list[Message]:
    """Chat messages for an episode: the instructions (system turn), the worked examples
    (complete dialogues), then the question.

    Each shot is the oracle's transcript of a train task: ``[user question, assistant call,
    user observation, ..., assistant answer]``."""
    messages: list[Message] = [{"role": "system", "content": instructions(protocol)}]
    for shot in shots:
        messages.extend(shot)
    messages.append({"role": "user", "content": question_message(question)})
    return messages
