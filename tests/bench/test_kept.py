"""A long benchmark's finished pieces kept in a committed folder (provrl.bench.kept): read back
on a machine that lost runs/, only for the same build of the shared stages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provrl.bench.kept import Kept, pools_digest, restore_dirs, settings_digest, shared_identity


def _shared(root, weights=b"w0", pools=b'{"id": "t1"}\n'):
    """A run directory with the files :func:`shared_identity` reads (a filter already there,
    put back from a kept archive, is left as it is)."""
    ckpt = root / "warmstart" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(weights)
    (root / "warmstart" / "done.json").write_text(json.dumps({"checkpoint": str(ckpt)}))
    (root / "world").mkdir()
    (root / "world" / "done.json").write_text(json.dumps({"world_dir": "/c/seed0-d5000-abc"}))
    if not (root / "filter").exists():
        (root / "filter").mkdir()
        (root / "filter" / "kept.jsonl").write_bytes(pools)
    return root


def test_the_identity_is_the_world_and_the_warm_start_weights(tmp_path):
    a = shared_identity(_shared(tmp_path / "a"))
    assert a["world"] == "seed0-d5000-abc" and a["warmstart"].startswith("sha256:")
    assert a == shared_identity(_shared(tmp_path / "a2"))  # the same bytes: the same build
    assert a["warmstart"] != shared_identity(_shared(tmp_path / "b", weights=b"w1"))["warmstart"]
    # another probe draw of the same warm start is the same build; its pools have their digest
    assert a == shared_identity(_shared(tmp_path / "c", pools=b"{}\n"))
    assert pools_digest(tmp_path / "a") == pools_digest(tmp_path / "a2")
    assert pools_digest(tmp_path / "a") != pools_digest(tmp_path / "c")


def test_a_kept_piece_is_read_back_for_the_same_build_only(tmp_path):
    ident = {"world": "w", "warmstart": "sha256:1", "pools": "sha256:2"}
    Kept(tmp_path / "keep", ident).put("seed-0", {"accuracy_gain_points": 12.5})
    piece = json.loads((tmp_path / "keep" / "seed-0.json").read_text())
    assert piece["identity"] == ident and "commit" in piece and "date" in piece

    again = Kept(tmp_path / "keep", dict(ident))
    assert again.get("seed-0") == {"accuracy_gain_points": 12.5}
    assert again.get("seed-1") is None
    assert again.summary()["read"] == ["seed-0"]

    other = Kept(tmp_path / "keep", ident | {"warmstart": "sha256:9"})
    with pytest.raises(ValueError, match=r"seed-0\.json: measured from another build.*warmstart"):
        other.get("seed-0")


def test_a_corrupt_piece_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "seed-0.json").write_text('{"value": 1')
    with pytest.raises(ValueError, match=r"seed-0\.json: not a kept piece"):
        Kept(tmp_path, {}).get("seed-0")


def test_kept_directories_are_put_back_only_where_they_are_missing(tmp_path):
    """The probe and filter kept as an archive: put back into a fresh run directory (the
    stage markers with them), never over directories a run already has."""
    src = _shared(tmp_path / "src")
    (src / "filter" / "done.json").write_text('{"sizes": {"kept": 1}}')
    k = Kept(tmp_path / "keep", shared_identity(src))
    k.put_dirs("shared-probe", src, ("filter",))
    assert k.get("shared-probe") == {"dirs": ["filter"]}
    fresh = tmp_path / "fresh"
    assert restore_dirs(tmp_path / "keep", "shared-probe", fresh) == ["filter"]
    assert (fresh / "filter" / "done.json").read_text() == '{"sizes": {"kept": 1}}'
    assert pools_digest(fresh) == pools_digest(src)
    (fresh / "filter" / "kept.jsonl").write_text("mine\n")
    assert restore_dirs(tmp_path / "keep", "shared-probe", fresh) == []  # it has its own
    assert (fresh / "filter" / "kept.jsonl").read_text() == "mine\n"
    assert restore_dirs(tmp_path / "keep", "other", tmp_path / "x") == []  # nothing kept
    assert restore_dirs(None, "shared-probe", tmp_path / "x") == []
    (tmp_path / "keep" / "bad.tar.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"bad\.tar\.gz: not a kept archive"):
        restore_dirs(tmp_path / "keep", "bad", tmp_path / "y")


def test_without_a_folder_nothing_is_kept(tmp_path):
    k = Kept(None, {"world": "w"})
    k.put("seed-0", {"x": 1})
    assert k.get("seed-0") is None and list(tmp_path.iterdir()) == []


def test_a_benchmark_whose_pieces_are_all_kept_only_rebuilds_the_shared_stages(
    tmp_path, monkeypatch
):
    """On a machine that lost runs/, `provrl bench learning --keep` runs the shared stages
    (to check their identity) and nothing else when every piece is kept; the record is the
    kept rows', with which pieces were read back."""
    import provrl.bench.learning as learning

    runs = tmp_path / "runs"
    calls = []

    def fake_run(args, log, watch=None, label=""):
        calls.append(args)
        (shared,) = [Path(a.split("=", 1)[1]) for a in args if a.startswith("logging.run_dir=")]
        if not (shared / "world").exists():  # what the shared stages build
            _shared(shared)
            (shared / "config.yaml").write_text("pipeline: {tasks: {tiers: [1, 2]}}\n")
        return {"wall_s": 1.0, "peak_rss_gb": 0.5}

    monkeypatch.setattr(learning, "_run", fake_run)
    _shared(tmp_path / "build")
    keep = Kept(tmp_path / "keep", shared_identity(tmp_path / "build"))
    warm = {"task_accuracy": {"a": 0.5}, "accuracy": 0.5, "tool_calls_solved": 3.0}
    keep.put("warmstart", warm)
    keep.put("world2-warmstart", {"seed": 77, "eval": warm})
    keep.put_dirs("shared-probe", tmp_path / "build", ("filter",))
    for s in range(2):
        keep.put(f"seed-{s}", {"seed": s, "accuracy_gain_points": 10.0 + s,
                               "tool_calls_solved_cut_frac": 0.3, "mixed_version_frac": 0.25,
                               "second_world_gain_points": 9.0, "wall_s": 5.0, "peak_rss_gb": 6.0})  # fmt: skip

    rec = learning.run_learning_benchmark(
        "quick", seeds=2, out=runs, keep=tmp_path / "keep", world2_seed=None
    )
    assert len(calls) == 1 and "pipeline.eval.policies=[]" in calls[0]
    assert (runs / "shared" / "filter" / "kept.jsonl").is_file()  # put back before the run
    assert [r["seed"] for r in rec["seeds"]] == [0, 1]
    assert rec["mean"]["accuracy_gain_points"] == pytest.approx(10.5)
    assert rec["world2_seed"] == 77
    assert rec["kept"]["read"] == [
        "shared-probe",
        "warmstart",
        "world2-warmstart",
        "seed-0",
        "seed-1",
    ]
    with pytest.raises(ValueError, match="second world is seed 77, not 78"):
        learning.run_learning_benchmark(
            "quick", seeds=2, out=tmp_path / "runs2", keep=tmp_path / "keep", world2_seed=78
        )


def test_the_settings_digest_is_the_flags_not_their_order():
    a = settings_digest({"steps": 6, "overrides": ["x=1"], "time_scale": None})
    assert a == settings_digest({"time_scale": None, "overrides": ["x=1"], "steps": 6})
    assert a != settings_digest({"steps": 6, "overrides": ["x=2"], "time_scale": None})
