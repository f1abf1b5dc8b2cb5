"""docs/config.md is generated from the pydantic fields and must match them."""

from __future__ import annotations

from typer.testing import CliRunner

from provrl.cli.config_docs import DOC, is_current, render


def test_config_doc_is_current():
    assert is_current(), f"{DOC} is out of date: run `provrl config-docs` and commit it"


def test_the_table_names_the_peers_of_each_field():
    page = render()
    row = next(ln for ln in page.splitlines() if ln.startswith("| `rl.objective.kl_coef`"))
    assert "`beta`" in row and "`actor_rollout_ref.actor.kl_loss_coef`" in row and "`0.0`" in row
    assert "| `pipeline.rl.k` |" in page  # every section is there, the lead's too


def test_cli_check_fails_on_a_stale_doc(tmp_path, monkeypatch):
    import provrl.cli.config_docs as cd
    from provrl.cli import app

    stale = tmp_path / "config.md"
    stale.write_text("old\n")
    monkeypatch.setattr(cd, "DOC", stale)
    r = CliRunner().invoke(app, ["config-docs", "--check"])
    assert r.exit_code == 1 and "out of date" in r.output
