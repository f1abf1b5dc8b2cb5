"""Stop strings matched on the incrementally decoded text of the current turn.

Token ids are never re-encoded: after each sampled token the matcher decodes a short tail
window of the turn's sampled ids and looks for a stop string in it. A stop string of b
UTF-8 bytes is covered by the last b + 3 tokens (every token decodes to at least one byte;
the spare tokens cover a multi-byte character split across tokens). Because the check runs
after every token, the first time a stop string is found is the token that completed it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class StopMatcher:
    """Finds the first stop string completed by the latest token of a turn."""

    def __init__(self, tokenizer: Any, stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        self.window = max((len(s.encode()) for s in self.stops), default=0) + 3

    def match(self, turn_ids: Sequence[int]) -> str | None:
        """The stop string found in the decoded tail of ``turn_ids`` (sampled ids of this
        turn, the newest last), or None."""
        if not self.stops or not turn_ids:
            return None
        tail = list(turn_ids[-self.window :])
        text = self.tokenizer.decode(
            tail, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        for s in self.stops:
            if s in text:
                return s
        return None
