"""Fictional names: pronounceable syllable words that no model can know.

A word is 2 syllables ``onset + vowel + coda`` (≈ 2,600 distinct syllables, so millions of
words); a :class:`NameSpace` hands out words that are unique across every kind of entity, so
a search for one name never matches another entity by accident. Near-identical
distractors are made on purpose by :func:`variant` (one vowel changed).
"""

from __future__ import annotations

import numpy as np


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


ONSETS = _words("b br c d dr f g gr h k l m n p r s st t tr v w z")
VOWELS = _words("a e i o u a e o ai ou")
CODAS = ["", "", "", "n", "r", "l", "s", "th", "nd", "rk", "m", "x"]
_SIMPLE_VOWELS = "aeiou"

PLACE_SUFFIXES = _words(
    "mere ford holt wick stead burgh haven crest dale port field moor gate ley bridge"
)


def _syllables() -> np.ndarray:
    return np.array([o + v + c for o in ONSETS for v in VOWELS for c in CODAS])


class NameSpace:
    """Unique words across all calls (one instance per world)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.used: set[str] = set()
        self._syl = _syllables()

    def words(self, n: int, syllables: int = 2, suffixes: tuple[str, ...] = ()) -> list[str]:
        """``n`` new capitalised words (vectorised draw, rejection of duplicates)."""
        out: list[str] = []
        while len(out) < n:
            m = int((n - len(out)) * 1.2) + 16
            parts = self._syl[self.rng.integers(0, len(self._syl), size=(m, syllables))]
            words = parts[:, 0]
            for j in range(1, syllables):
                words = np.char.add(words, parts[:, j])
            if suffixes:
                words = np.char.add(
                    words, np.array(suffixes)[self.rng.integers(0, len(suffixes), size=m)]
                )
            for w in words.tolist():
                if len(w) < 4:
                    continue
                w = w.capitalize()
                if w in self.used:
                    continue
                self.used.add(w)
                out.append(w)
                if len(out) == n:
                    break
        return out

    def claim(self, word: str) -> bool:
        """Reserve ``word`` if it is free; return whether it was."""
        if word in self.used:
            return False
        self.used.add(word)
        return True


def variant(word: str, rng: np.random.Generator) -> str:
    """``word`` with one simple vowel replaced by another (``Castamar`` → ``Castamor``)."""
    pos = [i for i, ch in enumerate(word) if ch.lower() in _SIMPLE_VOWELS]
    if not pos:
        return word + "e"
    i = pos[int(rng.integers(len(pos)))]
    old = word[i].lower()
    choices = [v for v in _SIMPLE_VOWELS if v != old]
    new = choices[int(rng.integers(len(choices)))]
    if word[i].isupper():
        new = new.upper()
    return word[:i] + new + word[i + 1 :]
