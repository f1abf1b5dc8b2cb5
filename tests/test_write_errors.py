"""A write that finds no space, a read-only file system or no permission is one line naming
the file, whichever library wrote (``provrl._sys.writing``); the messages injected here are
the ones safetensors 0.8, torch 2.13 and Python gave on a real full or read-only tmpfs."""

from __future__ import annotations

import errno
import os

import pytest

from provrl._sys import WriteError, resource_errno, write_atomic, writing

SAFETENSORS_ENOSPC = "Error while serializing: I/O error: No space left on device (os error 28)"
SAFETENSORS_EROFS = (
    'Error while serializing: I/O error: Read-only file system (os error 30) at path "/m/.tmpF"'
)
TORCH_EROFS = (
    "[enforce fail at inline_container.cc:747] . open file failed with strerror: Read-only file"
    " system"
)
TORCH_ENOSPC = "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"


def safetensor_error(msg: str) -> Exception:
    from safetensors import SafetensorError

    return SafetensorError(msg)


def test_each_writer_s_resource_error_is_recognised(tmp_path, monkeypatch):
    assert resource_errno(OSError(errno.ENOSPC, "No space left on device"), tmp_path) == 28
    assert resource_errno(PermissionError(errno.EACCES, "Permission denied"), tmp_path) == 13
    assert resource_errno(FileNotFoundError(errno.ENOENT, "x"), tmp_path) is None
    assert resource_errno(safetensor_error(SAFETENSORS_ENOSPC), tmp_path) == errno.ENOSPC
    assert resource_errno(safetensor_error(SAFETENSORS_EROFS), tmp_path) == errno.EROFS
    assert resource_errno(RuntimeError(TORCH_EROFS), tmp_path) == errno.EROFS
    assert resource_errno(RuntimeError("CUDA out of memory"), tmp_path) is None
    assert resource_errno(ValueError("no"), tmp_path) is None
    # torch's zip writer says only "unexpected pos": the file system is asked why
    full = os.statvfs_result((4096, 4096, 100, 0, 0, 10, 0, 0, 0, 255))
    monkeypatch.setattr(os, "statvfs", lambda _: full)
    assert resource_errno(RuntimeError(TORCH_ENOSPC), tmp_path / "ckpt" / "x.pt") == errno.ENOSPC


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        safetensor_error(SAFETENSORS_ENOSPC),
        RuntimeError(TORCH_EROFS),
    ],
    ids=["python", "safetensors", "torch"],
)
def test_writing_names_the_path_in_one_line(tmp_path, error):
    target = tmp_path / "rl" / "ckpt-v2"
    with pytest.raises(WriteError) as e, writing(target):
        raise error
    msg = str(e.value)
    assert msg.startswith(f"{target}: cannot write: ") and "\n" not in msg
    assert msg.endswith(("(ENOSPC)", "(EROFS)")) and e.value.__cause__ is error


def test_writing_prefers_python_s_own_filename_and_maps_a_staging_name(tmp_path):
    final, tmp = tmp_path / "ckpt", tmp_path / "ckpt.tmp-ab"
    with (
        pytest.raises(WriteError, match=r"ckpt/model\.safetensors: cannot write"),
        writing(final, tmp),
    ):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "model.safetensors"))
    with pytest.raises(KeyError), writing(final):  # not a resource error: unchanged
        raise KeyError("x")


def test_write_atomic_on_a_full_disk_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    p = tmp_path / "state.json"
    write_atomic(p, b"old")

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(WriteError, match=r"state\.json: cannot write: No space left"):
        write_atomic(p, b"new" * 100_000)
    monkeypatch.undo()
    assert p.read_bytes() == b"old" and [x.name for x in tmp_path.iterdir()] == ["state.json"]


def test_a_failed_checkpoint_save_names_it_and_gives_its_space_back(tmp_path, tiny, monkeypatch):
    import transformers.modeling_utils as mu

    from provrl.models.checkpoint import save_checkpoint

    def full(*a, **k):
        raise safetensor_error(SAFETENSORS_ENOSPC)

    monkeypatch.setattr(mu, "safe_save_file", full)
    with pytest.raises(WriteError, match=r"ckpt-v2: cannot write: No space left on device"):
        save_checkpoint(tiny.model, tiny.tokenizer, tmp_path / "ckpt-v2")
    assert list(tmp_path.iterdir()) == []  # neither the checkpoint nor its temporary


TOKENIZERS_ENOSPC = "No space left on device (os error 28)"
"""What the tokenizers library (Rust) raises, as a plain ``Exception``, when saving the
tokenizer finds the disk full (issue 38: a traceback before)."""


def test_an_errno_in_any_exception_s_message_is_recognised(tmp_path):
    assert resource_errno(Exception(TOKENIZERS_ENOSPC), tmp_path) == errno.ENOSPC
    assert resource_errno(ValueError("[Errno 28] No space left on device"), tmp_path) == 28
    assert resource_errno(Exception("bad input (os error 2)"), tmp_path) is None  # ENOENT


def test_disk_full_while_saving_the_tokenizer_is_one_line_and_leaves_nothing(
    tmp_path, tiny, monkeypatch
):
    from provrl.models.checkpoint import save_checkpoint

    def full(*a, **k):
        raise Exception(TOKENIZERS_ENOSPC)

    monkeypatch.setattr(tiny.tokenizer, "save_pretrained", full)
    with pytest.raises(WriteError) as e:
        save_checkpoint(tiny.model, tiny.tokenizer, tmp_path / "ckpt-v2")
    assert str(e.value) == f"{tmp_path / 'ckpt-v2'}: cannot write: No space left on device (ENOSPC)"
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_filled_in_place_is_removed_when_a_write_fails(tmp_path):
    """Weights saved, then the optimizer state finds the disk full: no incomplete
    ``ckpt-v2/`` is left on the full disk."""
    from provrl.models.checkpoint import removed_unless_complete

    ckpt = tmp_path / "rl" / "ckpt-v2"
    with pytest.raises(WriteError), writing(ckpt), removed_unless_complete(ckpt):
        ckpt.mkdir(parents=True)
        (ckpt / "model.safetensors").write_bytes(b"x" * 100)
        raise RuntimeError(TORCH_EROFS)
    assert not ckpt.exists() and list((tmp_path / "rl").iterdir()) == []
