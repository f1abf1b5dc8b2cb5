"""docs/pipeline.md's knob table ("Which split chose each knob") names, for every knob chosen
on the dev split, the results file of the dev runs that chose it — a knob "chosen on dev"
with no recorded run behind it is a claim nobody can check."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADING = "## Which split chose each knob"
LINK = re.compile(r"\]\(\.\./(results/[\w./-]+\.json)(#[^)]*)?\)")


def knob_rows(text: str) -> list[list[str]]:
    """The knob table's body rows (cells stripped), from the section's first table."""
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]


def missing_dev_records(text: str, root: Path) -> list[str]:
    """Knobs whose 'chosen on' cell says dev but whose row links no existing results file."""
    out = []
    for cells in knob_rows(text):
        knob, chosen = cells[0], cells[2].lower()
        if re.search(r"\bdev\b", chosen):
            files = [m.group(1) for m in LINK.finditer(" ".join(cells))]
            if not files or not all((root / f).is_file() for f in files):
                out.append(knob)
    return out


def test_every_knob_chosen_on_dev_links_its_dev_runs():
    text = (ROOT / "docs" / "pipeline.md").read_text()
    rows = knob_rows(text)
    assert rows and all(len(r) >= 4 and r[2] for r in rows)  # every knob says what chose it
    assert missing_dev_records(text, ROOT) == []


def test_the_check_catches_a_dev_knob_without_its_runs(tmp_path):
    table = (
        f"{HEADING}\n\n| knob | value | chosen on | by |\n| --- | --- | --- | --- |\n"
        "| `a` | 1 | dev | [runs](../results/a.json#x) |\n| `b` | 2 | **dev** | run d9 |\n"
        "| `c` | 3 | none | design |\n| `d` | 4 | dev | [runs](../results/gone.json) |\n"
    )
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.json").write_text("{}")
    assert missing_dev_records(table, tmp_path) == ["`b`", "`d`"]
