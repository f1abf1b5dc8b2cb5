"""``results/``: the JSON behind every figure README and docs quote, and the check that ties
each quoted figure to one.

**Writing.** A benchmark command given ``--out results/NAME.json`` writes its result through
:func:`write_result`: the result's own keys plus what makes it reproducible — ``benchmark``,
``commit`` (and ``dirty``: uncommitted changes in the tree), ``date``, ``machine`` (CPUs, the
1-minute load average, platform, Python, torch), ``command`` (the argv that ran),
``config`` (every setting), ``seeds``. The raw per-seed / per-repeat values are the
benchmark's own (``*_all``, ``runs``, ``raw``, per-seed lists): summaries alone are not kept.
``provrl bench trainer --out`` files have this shape too (their config is ``rl_config``).

**Quoting.** A figure in README.md or docs/*.md is a link to the value it quotes::

    [0.812](results/pipeline_default.json#eval.rl.accuracy)          README (repository root)
    [×21.5](../results/search.json#ratios.bm25s_over_sqlite.questions.p50)     from docs/
    [+9.4](results/pipeline_default.json#delta.accuracy*100) points  a scale after ``*``

The anchor is a path of keys (list indices as numbers) separated by dots; ``*k`` scales the
value. The link's text is the figure: its first number must equal the value, scaled, to
the number of decimals shown (``0.812`` matches 0.8117; ``1,234`` and ``−0.5`` parse).
:func:`check_figure_links` checks every link; :func:`unlinked_figures` lists the numbers
not inside such a link: in **every** section, a number with a unit (``25 s``, ``1.8×``,
``512 tok/s``, ``3 %``, ``96 MiB`` …); in measured-results sections (headings naming a
measurement, a benchmark, a result or performance) and all of README, every decimal too.
Integers without a unit (counts, settings) are not figures; nor is what inline code holds
(a setting or a limit is written as code: ```timeout 30 s```), a bound after ≤ ≥ < > (a
target, a threshold), a confidence level, a version number or a link target.

A section that keeps an earlier measurement for the record says so in one paragraph
containing :data:`RECORD_MARK`, with the date of the measurement (``YYYY-MM-DD``, or the
date it predates) and the reason no results file backs it (:func:`bad_record_marks` checks
both); its figures are not claims and are not checked. The mark covers its section and the
subsections below it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# what ran it, as run directories record it (re-exported: their home is provrl._sys)
from provrl._sys import CODE_PATHS as CODE_PATHS
from provrl._sys import git_state as git_state
from provrl._sys import machine as machine

REQUIRED = ("benchmark", "commit", "date", "machine")
"""Keys every results file holds (besides its config and seeds, see :func:`check_record`)."""
RECORD_MARK = "no results file backs these figures"
"""The phrase that marks a section's figures as a record, not claims."""
MEASURED_HEADING = re.compile(r"measur|benchmark|\bresults?\b|held-out run", re.I)
"""Headings of measured-results sections (their subsections too)."""

LINK = re.compile(r"\[([^\]]+)\]\(((?:\.\./)*results/[\w.\-]+\.json)#([^)\s]+)\)")
NUMBER = re.compile(r"[+−\-]?\d[\d,]*(?:\.\d+)?(?:[eE][+−\-]?\d+)?")
FIGURE = re.compile(
    r"(?<![\w.\-/])[+−\-]?\d[\d,]*(?:\.\d+)?(?:[eE][+−\-]?\d+)?"
    r"(?:(?:\.\d+)+(?![\w]))?"  # a version number (2.13.0) is skipped below
    r"(?:\s?(?:%|×(?!\d)|x\b|s\b|ms\b|min\b|h\b|µs|tok/s|tokens/s|MB\b|MiB|GB\b|GiB|GFLOP/s|"
    r"points?\b|req/s|QPS|nats\b|minutes?\b|hours?\b|seconds?\b))?"
)
LEVEL = re.compile(r"\d+ ?% (?=BCa|CI\b|confidence|bootstrap|interval)")
"""A confidence level (95 % BCa, 90 % CI) is a setting, not a figure."""
BOUND = re.compile(r"[≤≥<>]\s?[+−\-]?\d[\d,]*(?:\.\d+)?")
"""A number after a comparison (≤ 25 s, ≥ 1.5×) is a bound — a target or a threshold."""
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
"""The date a record mark carries."""
REASON_WORDS = 6
"""Words a record paragraph holds besides the mark and its date (its reason), at least."""
UNIT = re.compile(r"(?:%|×|x|s|ms|min|h|µs|tok/s|tokens/s|MB|MiB|GB|GiB|GFLOP/s|points?|req/s|QPS|nats|minutes?|hours?|seconds?)$")  # fmt: skip


# ----------------------------------------------------------------------------- writing
def run_record(
    benchmark: str,
    result: Mapping[str, Any],
    *,
    config: Mapping[str, Any],
    seeds: Sequence[int] | Mapping[str, Any],
    command: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``result`` with the provenance keys of the module docstring; keys the result already
    has (a benchmark that records its own ``machine``, say) are kept as the result has them."""
    commit, dirty = git_state()
    meta: dict[str, Any] = {
        "benchmark": benchmark,
        "commit": commit,
        "dirty": dirty,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "command": list(command if command is not None else sys.argv),
        "config": dict(config),
        "seeds": seeds if isinstance(seeds, Mapping) else list(seeds),
    }
    return meta | dict(result)


def write_result(path: str | os.PathLike[str], record: Mapping[str, Any]) -> Path:
    """Write a :func:`run_record` to ``path`` (atomically; indented, one key per line)."""
    from provrl._sys import write_json

    p = Path(path)
    write_json(p, dict(record))
    return p


def write_script_result(
    path: str | os.PathLike[str], benchmark: str, result: Mapping[str, Any], args: Any
) -> Path:
    """A ``benchmarks/*.py`` script's ``--results`` file: :func:`run_record` with the script's
    parsed arguments as its config and ``range(args.seeds)`` (when it has seeds) as its seeds."""
    config = {k: str(v) if isinstance(v, os.PathLike) else v for k, v in vars(args).items()}
    seeds = list(range(int(getattr(args, "seeds", 0) or 0)))
    return write_result(path, run_record(benchmark, result, config=config, seeds=seeds))


# ----------------------------------------------------------------------------- checking
def check_record(name: str, record: Any) -> list[str]:
    """What a results file lacks: the :data:`REQUIRED` keys, ``machine.cpus``, a config
    (``config`` or a key ending in ``_config``) and its seeds (``seeds``, or a ``seed`` in the
    config). One message per problem, naming the file."""
    if not isinstance(record, dict):
        return [f"{name}: not a JSON object"]
    bad = [f"{name}: no {k!r}" for k in REQUIRED if k not in record]
    if not isinstance(record.get("machine"), dict) or "cpus" not in record["machine"]:
        bad.append(f"{name}: 'machine' has no 'cpus'")
    configs = [v for k, v in record.items() if k == "config" or k.endswith("_config")]
    if not configs:
        bad.append(f"{name}: no 'config' (nor a '*_config')")
    elif "seeds" not in record and not any(isinstance(c, dict) and "seed" in c for c in configs):
        bad.append(f"{name}: no 'seeds' (nor a 'seed' in its config)")
    return bad


def resolve(record: Any, path: str) -> Any:
    """The value at ``path`` (keys separated by dots, list indices as numbers)."""
    node = record
    for key in path.split("."):
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise KeyError(key)
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            raise KeyError(key)
    return node


def parse_number(text: str) -> tuple[float, int] | None:
    """The first number in ``text`` and its decimals (``−1,234.50`` → (−1234.5, 2))."""
    m = NUMBER.search(text)
    if m is None:
        return None
    s = m.group().replace("−", "-").replace(",", "")
    mantissa = re.split(r"[eE]", s)[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return float(s), decimals


def matches(shown: str, value: float) -> bool:
    """Does the figure ``shown`` equal ``value`` to the decimals it shows (rounding half a
    unit of its last digit either way; scientific notation: 1 % of the value)?"""
    parsed = parse_number(shown)
    if parsed is None:
        return False
    x, decimals = parsed
    if re.search(r"\d[eE][+−\-]?\d", shown):
        return abs(x - value) <= 0.01 * abs(value) + 1e-300
    return abs(x - value) <= 0.5 * 10.0**-decimals * (1 + 1e-9)


@dataclass(frozen=True)
class FigureLink:
    doc: str
    line: int
    text: str
    file: str
    anchor: str


def figure_links(doc: Path, text: str) -> Iterator[FigureLink]:
    for i, line in enumerate(text.splitlines(), 1):
        for m in LINK.finditer(line):
            yield FigureLink(str(doc), i, m.group(1), m.group(2), m.group(3))


def check_figure_links(doc: Path, text: str, root: Path) -> list[str]:
    """Every figure link of ``doc`` (``text``): the results file exists and is complete,
    the anchor resolves to a number and the shown figure equals it. One message each,
    ``doc:line: …``."""
    bad = []
    for f in figure_links(doc, text):
        where = f"{f.doc}:{f.line}: [{f.text}]"
        target = (doc.parent / f.file).resolve()
        if target.parent != (root / "results").resolve() or not target.is_file():
            bad.append(f"{where}: {f.file} is not a file in results/")
            continue
        record = json.loads(target.read_text())
        bad += [f"{where}: {p}" for p in check_record(target.name, record)]
        path, _, scale = f.anchor.partition("*")
        try:
            value = resolve(record, path)
        except KeyError as e:
            bad.append(f"{where}: {target.name} has no {path!r} (missing key {e.args[0]!r})")
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            bad.append(f"{where}: {target.name}#{path} is {value!r}, not a number")
            continue
        scaled = float(value) * (float(scale) if scale else 1.0)
        if not matches(f.text, scaled):
            bad.append(f"{where}: {target.name}#{f.anchor} is {scaled:.6g}")
    return bad


def _sections(text: str, whole: bool) -> Iterator[tuple[int, str]]:
    """(line number, line) of the lines outside code blocks that lie in measured-results
    sections (``whole``: in any section)."""
    in_code, measured_level = False, 0
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        h = re.match(r"(#+)\s", line)
        if h:
            level = len(h.group(1))
            if measured_level and level <= measured_level:
                measured_level = 0
            if not measured_level and MEASURED_HEADING.search(line):
                measured_level = level
            continue
        if whole or measured_level:
            yield i, line


def unlinked_figures(doc: Path, text: str, *, whole: bool = False) -> list[str]:
    """The figures of ``doc`` that are not the text of a figure link (module docstring):
    numbers with a unit (%, ×, s, ms, tok/s, MiB, points …) in every section, and decimals
    in measured-results sections (``whole``: in every section). Sections marked as a record
    are skipped. ``doc:line: figure``."""
    marked = _record_sections(text)
    measured = {i for i, _ in _sections(text, whole)}
    out = []
    for i, line in _sections(text, True):
        if i in marked:
            continue
        plain = re.sub(r"`[^`]*`", " ", line)
        plain = LINK.sub(" ", plain)
        plain = re.sub(r"\]\([^)]*\)", "]", plain)  # other links: their text stays
        plain = LEVEL.sub(" ", plain)
        plain = BOUND.sub(" ", plain)
        for m in FIGURE.finditer(plain):
            fig = m.group().strip()
            if not fig or fig.count(".") > 1:
                continue  # a version
            number = NUMBER.match(fig)
            assert number is not None
            rest = fig[number.end() :].strip()
            decimal = "." in number.group() or "e" in number.group().lower()
            if UNIT.match(rest) or (decimal and i in measured):
                out.append(f"{doc}:{i}: {fig}")
    return out


def bad_record_marks(doc: Path, text: str) -> list[str]:
    """Record marks (:data:`RECORD_MARK`) whose paragraph lacks the measurement's date
    (``YYYY-MM-DD``) or a reason (:data:`REASON_WORDS` words besides the mark and date).
    ``doc:line: …``."""
    lines = text.splitlines()
    out = []
    for n, line in enumerate(lines, 1):
        if RECORD_MARK not in line.lower():
            continue
        start = n
        while start > 1 and lines[start - 2].strip():
            start -= 1
        end = n
        while end < len(lines) and lines[end].strip():
            end += 1
        para = " ".join(lines[start - 1 : end])
        if not DATE.search(para):
            out.append(f"{doc}:{n}: record mark without the measurement's date (YYYY-MM-DD)")
        words = DATE.sub(" ", para.lower().replace(RECORD_MARK, " ")).split()
        if len(words) < REASON_WORDS:
            out.append(f"{doc}:{n}: record mark without a reason")
    return out


def _record_sections(text: str) -> set[int]:
    """Lines of the sections that hold a :data:`RECORD_MARK` line: the mark covers the
    section of the nearest heading above it (to the next heading of the same or a higher
    level, its subsections included), before and after the mark."""
    lines = text.splitlines()
    starts = [(i, len(m.group(1))) for i, line in enumerate(lines, 1)
              if (m := re.match(r"(#+)\s", line))]  # fmt: skip
    out: set[int] = set()
    for n, line in enumerate(lines, 1):
        if RECORD_MARK not in line.lower():
            continue
        above = [(i, lv) for i, lv in starts if i < n]
        start, level = above[-1] if above else (1, 0)
        end = next((i for i, lv in starts if i > start and lv <= level), len(lines) + 1)
        out.update(range(start, end))
    return out
