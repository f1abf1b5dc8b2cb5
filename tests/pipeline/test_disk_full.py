"""A full disk, a read-only file system or a refused permission during the RL stage: one line
naming the file, exit 2, and a run that resumes once the disk is writable again — checked by
the independent checker. The fault is injected at the write layer of each writer
(safetensors, torch.save, provrl's logs) with the error that writer gave on a real full or
read-only tmpfs; the slow test uses a real 20 MB tmpfs where the machine allows one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from crashrun import FAST, RUN, copy_of, finish, killed, provrl_run
from runcheck import check_run

SAFETENSORS = """
import transformers.modeling_utils as mu
from safetensors import SafetensorError
real = mu.safe_save_file
def full(tensors, filename, *a, **k):
    if "ckpt-v2" in str(filename):
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)")
    return real(tensors, filename, *a, **k)
mu.safe_save_file = full
"""
TORCH = """
import torch
real = torch.save
def read_only(obj, f, *a, **k):
    if "ckpt-v2" in str(f):
        raise RuntimeError("[enforce fail at inline_container.cc:747] . open file failed with "
                           "strerror: Read-only file system")
    return real(obj, f, *a, **k)
torch.save = read_only
"""
TOKENIZER = """
import transformers.tokenization_utils_base as tb
real = tb.PreTrainedTokenizerBase.save_pretrained
def full(self, save_directory, *a, **k):
    if "ckpt-v2" in str(save_directory):  # the tokenizers library's own error type
        raise Exception("No space left on device (os error 28)")
    return real(self, save_directory, *a, **k)
tb.PreTrainedTokenizerBase.save_pretrained = full
"""
LOG = """
import errno, os
real, calls = os.write, [0]
def full(fd, data):
    if os.readlink(f"/proc/self/fd/{fd}").endswith("rl/trajectories.jsonl"):
        calls[0] += 1
        if calls[0] > 20:
            raise OSError(errno.ENOSPC, "No space left on device")
    return real(fd, data)
os.write = full
"""
ACCESS = """
import errno, os
real, seen = os.open, [0]
def refused(path, *a, **k):
    if str(path).endswith("rl/steps.jsonl"):
        seen[0] += 1
        if seen[0] > 3:  # the resume's own checks, then the first steps' records
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
    return real(path, *a, **k)
os.open = refused
"""
FAULTS = {
    "safetensors-enospc": (
        SAFETENSORS,
        "run/rl/ckpt-v2: cannot write: No space left on device (ENOSPC)",
    ),
    "torch-erofs": (TORCH, "run/rl/ckpt-v2: cannot write: Read-only file system (EROFS)"),
    "tokenizer-enospc": (
        TOKENIZER,
        "run/rl/ckpt-v2: cannot write: No space left on device (ENOSPC)",
    ),
    "log-enospc": (
        LOG,
        "run/rl/trajectories.jsonl: cannot write: No space left on device (ENOSPC)",
    ),
    "log-eacces": (ACCESS, "run/rl/steps.jsonl: cannot write: Permission denied (EACCES)"),
}


def one_error_line(stderr: str) -> str:
    errors = [x for x in stderr.splitlines() if x.startswith("provrl: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return errors[0].removeprefix("provrl: error: ")


@pytest.mark.parametrize(
    "fault",
    [
        "safetensors-enospc",
        pytest.param("torch-erofs", marks=pytest.mark.slow),
        pytest.param("tokenizer-enospc", marks=pytest.mark.slow),
        pytest.param("log-enospc", marks=pytest.mark.slow),
        pytest.param("log-eacces", marks=pytest.mark.slow),
    ],
)
def test_a_failed_write_is_one_line_and_the_run_resumes(crash_base, tmp_path, fault):
    prelude, expected = FAULTS[fault]
    d = copy_of(crash_base, tmp_path)
    p = provrl_run(d, None, resume=True, prelude=prelude)
    assert p.returncode == 2, p.stderr[-3000:]
    assert one_error_line(p.stderr) == expected
    check_run(d / RUN, finished=False)
    assert not list((d / RUN / "rl").glob("ckpt-v2.tmp-*"))  # its space given back
    if "ckpt-v2" in expected:  # nor an incomplete ckpt-v2/ (weights saved, optimizer not)
        assert not (d / RUN / "rl" / "ckpt-v2").exists()
    finish(d)  # the disk is writable again


@pytest.mark.ci
def test_every_other_failed_write_is_one_line_and_the_run_resumes_past_it(crash_base, tmp_path):
    """The faults the test above leaves to ``make test-all``, in ``make test``'s budget: each
    fails with its one line, then a resume commits past the failed write (killed once it has
    hot-loaded a step it committed — the finished run is the slow test's), two at a time."""

    def one(fault: str) -> None:
        prelude, expected = FAULTS[fault]
        d = copy_of(crash_base, tmp_path / fault)
        p = provrl_run(d, None, resume=True, prelude=prelude)
        assert p.returncode == 2, p.stderr[-3000:]
        assert one_error_line(p.stderr) == expected, fault
        before = check_run(d / RUN, finished=False)["n"]
        assert not list((d / RUN / "rl").glob("ckpt-v2.tmp-*")), fault
        killed(d, "rl.hotloaded:1")  # the disk is writable again
        assert check_run(d / RUN, finished=False)["n"] > before, fault

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, ["torch-erofs", "log-enospc", "log-eacces"]))


def _tmpfs_allowed() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = "d=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs $d && umount $d"
    return (
        subprocess.run(["unshare", "-rm", "sh", "-c", probe], capture_output=True).returncode == 0
    )


@pytest.mark.slow
@pytest.mark.skipif(not _tmpfs_allowed(), reason="no user namespace to mount a tmpfs in")
def test_a_20_mb_tmpfs_fails_with_one_line_and_resumes_with_space(tmp_path):
    """Issue 28's case for real: the run directory on a 20 MB tmpfs (a 75-line traceback from
    safetensors before), then the same tmpfs grown to 400 MB and ``--resume``."""
    sets = " ".join(f"--set '{kv}'" for kv in FAST)
    run = f"{sys.executable} -m provrl.cli run --no-progress"
    script = f"""
        mount -t tmpfs -o size=20m tmpfs {tmp_path} || exit 1
        cd {tmp_path}
        {run} --preset quick --set logging.run_dir={RUN} {sets} 2> err1.txt > /dev/null
        echo $? > rc1.txt
        mount -o remount,size=400m {tmp_path}
        {run} --resume {RUN} 2> err2.txt > /dev/null
        echo $? > rc2.txt
        tar -C {tmp_path} -cf {tmp_path}.tar .
    """  # the mount lives in the namespace only: its files come out as a tar
    subprocess.run(["unshare", "-rm", "sh", "-c", script], check=True, timeout=1800)
    out = tmp_path.parent / "unpacked"
    out.mkdir()
    subprocess.run(["tar", "-C", str(out), "-xf", f"{tmp_path}.tar"], check=True)
    assert (out / "rc1.txt").read_text().strip() == "2"
    line = one_error_line((out / "err1.txt").read_text())
    assert line.startswith(f"{RUN}/") and "No space left on device (ENOSPC)" in line, line
    assert (out / "rc2.txt").read_text().strip() == "0", (out / "err2.txt").read_text()[-3000:]
    check_run(out / RUN, finished=True, steps=7, max_lag=1)
