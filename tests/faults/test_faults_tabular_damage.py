"""Damaged checkpoints and metrics, an edited config, two resumes, a full disk and NaN params on
the tabular family (Q-learning on GridWorld: 20 log points of 1000 env steps, a checkpoint every
4), each at points drawn by a seeded generator.

The invariant of each case: either the run, resumed after the fault, ends bit-identical to the
uninterrupted reference run ("identical"), or it stops with one clear line and everything it wrote
before the fault is whole and readable by `rl eval` and `rl plot` ("stopped cleanly"). Cases marked
slow (REPEATED) repeat a fault kind that a default case injects, here or in another module; `-m
slow` and benchmarks/faults.py run them."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
import yaml
from fault_runs import (
    TABULAR_BEFORE_LAST_CHUNK,
    checkpoint_steps,
    copy_run,
    identical,
    inject,
    injection_steps,
    intact,
    largest_file,
    one_line,
    record,
    resume_identical,
    rl,
    run_injected,
)

FAMILY = "tabular"
BEFORE_LAST_CHUNK = TABULAR_BEFORE_LAST_CHUNK
REPEATED = pytest.mark.slow


# (truncated: also the replay-based family's truncated replay buffer, test_faults_agents.py)
@pytest.mark.parametrize(
    "damage", [pytest.param("truncated", marks=REPEATED), "flipped byte", "file deleted"]
)
def test_damaged_newest_checkpoint_is_skipped_in_one_line(
    damage, stopped, reference, env, tmp_path
):
    """The newest checkpoint's largest file cut in half, one byte of it flipped, or removed: resume
    says in one line which checkpoint was set aside and why, takes the one before, and ends
    identical."""
    run_dir = copy_run(stopped, tmp_path / "run")
    *_, previous, newest = checkpoint_steps(run_dir)
    target = largest_file(run_dir / "checkpoints" / str(newest))
    data = bytearray(target.read_bytes())
    if damage == "truncated":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "flipped byte":
        offset = random.Random(f"{FAMILY}-flip").randrange(len(data))
        data[offset] ^= 0xFF
        target.write_bytes(bytes(data))
    else:
        target.unlink()
    err = resume_identical(run_dir, reference, env)
    warning, resuming = err.strip().splitlines()
    name = target.relative_to(run_dir / "checkpoints" / str(newest))
    assert warning.startswith(f"rl: warning: checkpoint {run_dir}/checkpoints/{newest} is damaged")
    assert f"({name} " in warning and "moved to" in warning
    assert resuming.startswith(f"rl: resuming from checkpoint {run_dir}/checkpoints/{previous}")
    assert (run_dir / "damaged_checkpoints" / str(newest)).is_dir()
    record(f"checkpoint {damage}", FAMILY, "identical")


# (a deleted line: the same rewrite by --resume as a corrupted one, without the reader's warning)
@pytest.mark.parametrize("damage", [pytest.param("line deleted", marks=REPEATED), "line corrupted"])
def test_damaged_metrics_file_is_rewritten_by_resume(damage, stopped, reference, env, tmp_path):
    """A metrics.jsonl line removed or garbled: `rl plot`'s reader skips a garbled line with one
    warning; --resume rewrites the file from the checkpoint's history, identical to the
    reference."""
    from rl.cli.plot import read_metrics

    run_dir = copy_run(stopped, tmp_path / "run")
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    index = random.Random(f"{FAMILY}-{damage}").randrange(len(lines))
    if damage == "line deleted":
        del lines[index]
    else:
        lines[index] = lines[index][: len(lines[index]) // 2]
    path.write_text("\n".join(lines) + "\n")
    warnings = []
    rows = read_metrics(run_dir, warnings.append)
    assert len(rows) == len(lines) - (damage == "line corrupted")
    assert len(warnings) == (damage == "line corrupted")
    resume_identical(run_dir, reference, env)
    record(f"metrics.jsonl {damage}", FAMILY, "identical")


def kept_files(run_dir: Path) -> dict:
    """{path: bytes} of every file in a run directory."""
    return {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}


def test_edited_config_stops_resume_in_one_line_and_moves_nothing(
    stopped, reference, env, tmp_path
):
    """config.yaml changed after the checkpoints were written: --resume refuses in one line naming
    the key and both values (exit 2) before anything compiles, and no file changes; with the file
    put back it ends identical."""
    run_dir = copy_run(stopped, tmp_path / "run")
    path = run_dir / "config.yaml"
    original = path.read_text()
    data = yaml.safe_load(original)
    data["agent"]["epsilon_decay_steps"] = 5000
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    before = kept_files(run_dir)
    refused = rl(["train", "--resume", run_dir], env)
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    newest = checkpoint_steps(run_dir)[-1]
    assert line.startswith(f"rl: error: checkpoint {run_dir}/checkpoints/{newest}: ")
    assert "agent.epsilon_decay_steps is 5000 in config.yaml, 10000 when the checkpoint" in line
    assert kept_files(run_dir) == before
    path.write_text(original)
    resume_identical(run_dir, reference, env)
    record("config.yaml edited", FAMILY, "stopped cleanly")


def _stopped_by_sigstop(process, timeout: float = 120) -> None:
    """Wait until `process` has stopped itself with SIGSTOP (AssertionError if it ends first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        state = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        time.sleep(0.1)
    raise AssertionError(f"process {process.pid} did not stop")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_second_resume_of_one_run_is_refused_by_the_lock(stopped, reference, env, tmp_path):
    """Two --resume processes on one run directory: the second is refused at once (exit 2, one line
    naming the first's process id) and writes nothing; the first ends identical."""
    run_dir = copy_run(stopped, tmp_path / "run")
    first = inject(["train", "--resume", run_dir], 13_000, "SIGSTOP", env)
    try:
        _stopped_by_sigstop(first)
        second = rl(["train", "--resume", run_dir], env)
        assert second.returncode == 2
        (line,) = second.stderr.strip().splitlines()
        assert f"is in use by another rl train (process {first.pid})" in line
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    identical(run_dir, reference)
    record("two --resume at once", FAMILY, "stopped cleanly")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /proc and /dev/full (Linux)")
# (full_disk, ENOSPC: also tests/rl/test_failures.py's full-disk test, metrics.jsonl on /dev/full)
@pytest.mark.parametrize("fault", ["file_size_limit", pytest.param("full_disk", marks=REPEATED)])
def test_full_disk_stops_in_one_line_keeping_what_was_written(fault, config, reference, env):
    """Writes start failing mid-run (EFBIG from a file-size limit, ENOSPC from a full disk): the run
    stops with one line naming the error (exit 1); its checkpoints are whole and readable, and once
    there is room --resume ends identical."""
    name = f"disk-{fault}"
    at_step = injection_steps(f"{FAMILY}-{fault}", BEFORE_LAST_CHUNK, 1)[0]
    status, err = run_injected(["train", config, "--name", name], at_step, fault, env)
    assert status == 1, err
    line = one_line(err)
    assert line.startswith("rl: error: cannot write the run directory")
    assert ("File too large" if fault == "file_size_limit" else "No space left on device") in line
    run_dir = config.parent / "runs" / name
    assert all(step < at_step for step in checkpoint_steps(run_dir))
    intact(run_dir)
    resume_identical(run_dir, reference, env)
    record(
        "disk full mid-run" if fault == "full_disk" else "file size limit mid-run",
        FAMILY,
        "stopped cleanly",
    )


def test_nan_params_stop_the_run_keeping_the_last_good_checkpoint(config, env):
    """Params that become NaN mid-run: one line naming where (exit 1); the chunk holding them is not
    checkpointed and what came before stays readable."""
    at_step = injection_steps(f"{FAMILY}-nan", BEFORE_LAST_CHUNK, 1)[0]
    status, err = run_injected(["train", config, "--name", "nan"], at_step, "nan_params", env)
    assert status == 1, err
    line = one_line(err)
    assert (
        line.startswith("rl: error: ") and "non-finite" in line and "last good checkpoint" in line
    )
    run_dir = config.parent / "runs" / "nan"
    assert all(step < at_step for step in checkpoint_steps(run_dir))
    intact(run_dir)
    record("NaN in the params mid-run", FAMILY, "stopped cleanly")
