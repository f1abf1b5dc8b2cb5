"""Every figure README and docs quote resolves to a results file (``results/``, written by
the command that measured it), and no measured figure goes unlinked
(:mod:`provrl.bench.results` has the convention)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from provrl.bench.results import (
    RECORD_MARK,
    _record_sections,
    bad_record_marks,
    check_figure_links,
    check_record,
    matches,
    resolve,
    run_record,
    unlinked_figures,
    write_result,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GENERATED = {"config.md"}  # written by `provrl config-docs`: defaults, not measurements


@pytest.mark.parametrize("path", sorted((ROOT / "results").glob("*.json")), ids=lambda p: p.name)
def test_every_results_file_says_how_it_was_measured(path):
    assert check_record(path.name, json.loads(path.read_text())) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_quoted_figure_is_its_results_files_value(doc):
    assert check_figure_links(doc, doc.read_text(), ROOT) == []


CHECKED = [d for d in DOCS if d.name not in GENERATED]


@pytest.mark.parametrize("doc", CHECKED, ids=lambda p: p.name)
def test_no_measured_figure_is_unlinked(doc):
    """In every section a number with a unit — and in measured-results sections (all of
    README) a decimal too — is a link to its results file, or its section says it is a
    record (RECORD_MARK) with its date and reason."""
    found = unlinked_figures(doc, doc.read_text(), whole=doc.name == "README.md")
    assert found == [], "\n".join(found[:40])


@pytest.mark.parametrize("doc", CHECKED, ids=lambda p: p.name)
def test_every_record_mark_says_when_and_why(doc):
    assert bad_record_marks(doc, doc.read_text()) == []


@pytest.mark.parametrize("doc", CHECKED, ids=lambda p: p.name)
def test_a_planted_figure_is_found_in_every_section(doc):
    """An unlinked figure planted under each heading of each page is reported at its line,
    unless the section is marked as a record: the check reads every section."""
    lines = doc.read_text().splitlines()
    marked = _record_sections("\n".join(lines))
    in_code, headings = False, []
    for i, line in enumerate(lines, 1):
        in_code ^= line.lstrip().startswith("```")
        if not in_code and re.match(r"#+\s", line) and i not in marked:
            headings.append(i)
    assert headings
    for h in headings:
        planted = [*lines[:h], "", "A step took 12.5 s here.", *lines[h:]]
        found = unlinked_figures(doc, "\n".join(planted), whole=doc.name == "README.md")
        assert f"{doc}:{h + 2}: 12.5 s" in found, (doc.name, lines[h - 1])


# ----------------------------------------------------------------------------- the checker
def test_a_figure_matches_its_value_at_the_decimals_shown():
    assert matches("0.812", 0.8117) and not matches("0.812", 0.8126)
    assert matches("**+9.4**", 9.43) and matches("−0.0857", -0.08571)
    assert matches("×21.5", 21.46) and matches("1,234 tok/s", 1234.4)
    assert not matches("1,234", 1235.0) and not matches("fast", 1.0)
    assert matches("3.3e-16", 3.31e-16) and not matches("3.3e-16", 4e-16)


def test_an_anchor_is_a_path_of_keys_and_indices():
    rec = {"a": {"b": [1.5, {"c": 2}]}, "x.y": 3}
    assert resolve(rec, "a.b.0") == 1.5 and resolve(rec, "a.b.1.c") == 2
    with pytest.raises(KeyError):
        resolve(rec, "a.b.2")


def test_links_are_checked_against_the_file(tmp_path):
    (tmp_path / "results").mkdir()
    rec = run_record("demo", {"acc": 0.8117, "runs": [0.8, 0.82]}, config={"k": 8}, seeds=[0, 1])
    write_result(tmp_path / "results" / "demo.json", rec)
    assert check_record("demo.json", rec) == []
    assert rec["commit"] and rec["machine"]["cpus"] and rec["command"]
    doc = tmp_path / "docs" / "x.md"
    doc.parent.mkdir()
    good = "acc [0.812](../results/demo.json#acc), [+81.2](../results/demo.json#acc*100) %"
    assert check_figure_links(doc, good, tmp_path) == []
    bad = "[0.9](../results/demo.json#acc) [1](../results/demo.json#nope) [2](../results/no.json#a)"
    errors = check_figure_links(doc, bad, tmp_path)
    assert len(errors) == 3 and all(e.startswith(f"{doc}:1: [") for e in errors)
    assert "demo.json#acc is 0.8117" in errors[0] and "no 'nope'" in errors[1]
    assert "not a file in results/" in errors[2]


def test_a_results_file_without_its_provenance_is_refused():
    problems = check_record("x.json", {"benchmark": "b", "date": "d", "machine": {}})
    assert "x.json: no 'commit'" in problems and "x.json: 'machine' has no 'cpus'" in problems
    assert "x.json: no 'config' (nor a '*_config')" in problems
    # the trainer benchmark's own shape: rl_config holds the seed
    trainer = {"benchmark": "trainer", "commit": "c", "date": "d", "machine": {"cpus": 2},
               "rl_config": {"seed": 0}}  # fmt: skip
    assert check_record("t.json", trainer) == []


DOC = f"""# A page

Settings: lr 0.001 and 8 samples — not a measured section.

## Measured

Throughput 512 tok/s, ratio 1.19×, accuracy [0.812](results/r.json#a), 64 tasks,
`speed 3.5 s` in code, vLLM 0.32.1.

```
23.4 s inside a code block
```

### Old runs

{RECORD_MARK.capitalize()}: they ran on 2026-11-30, before results/ existed.
It took 37 min and reached 0.91.

## Next

Back to 2.5 s outside, a `timeout 30 s` setting, a target of ≤ 25 s, and 0.5 plain.
"""


def test_unlinked_figures_are_the_measured_numbers_no_link_backs():
    found = unlinked_figures(Path("p.md"), DOC)
    assert found == ["p.md:7: 512 tok/s", "p.md:7: 1.19×", "p.md:21: 2.5 s"]
    assert "p.md:3: 0.001" in unlinked_figures(Path("p.md"), DOC, whole=True)
    assert bad_record_marks(Path("p.md"), DOC) == []


def test_a_record_mark_needs_its_date_and_reason():
    bare = f"## Old\n\n{RECORD_MARK}.\n\nIt took 37 min.\n"
    assert bad_record_marks(Path("p.md"), bare) == [
        "p.md:3: record mark without the measurement's date (YYYY-MM-DD)",
        "p.md:3: record mark without a reason",
    ]
    dated = f"## Old\n\nMeasured on 2026-11-30 before results/ existed, on code since changed,\nso {RECORD_MARK}.\n"
    assert bad_record_marks(Path("p.md"), dated) == []


def test_bench_log_out_writes_a_complete_record(tmp_path):
    from typer.testing import CliRunner

    from provrl.cli import app

    out = tmp_path / "log.json"
    res = CliRunner().invoke(app, ["bench", "log", "--trajectories", "20", "--tokens", "64",
                                   "--repeats", "1", "--out", str(out), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text())
    assert check_record("log.json", rec) == [] and rec["benchmark"] == "log"
    assert rec["config"] == {"trajectories": 20, "tokens": 64, "repeats": 1}
    assert rec["command"][-4:] == ["--repeats", "1", "--out", str(out)][-4:] or rec["command"]
