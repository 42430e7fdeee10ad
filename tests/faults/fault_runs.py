"""Fault injection for the fault suite: `rl` in a subprocess that injects one fault when a log point
reaches a chosen env step, damage done to a run directory between two runs, the checks that a run
came back identical or stopped cleanly, and the record of each case's outcome (the reliability table
in benchmarks/RESULTS.md: `FUSEDRL_FAULT_TABLE=FILE` appends one line per case)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from run_helpers import REPO, metric_rows, subprocess_env

from rl.run.checkpoint_integrity import FILES_MANIFEST

# The exit status of a run each signal stops (-9: killed).
EXIT_STATUS = {"SIGKILL": -9, "SIGINT": 130, "SIGTERM": 143}
# The tabular family's log points (tests/run_helpers.py's TINY: 20 of 1000 env steps, a checkpoint
# every 4); a signal at or before step 17000 leaves later log points to stop before.
TABULAR_LOG_POINTS = list(range(1000, 20_001, 1000))
TABULAR_BEFORE_LAST_CHUNK = TABULAR_LOG_POINTS[:17]

# Runs `rl ARGS` and injects FAULT once a log point reaches env step AT_STEP:
#   SIGKILL, SIGINT, SIGTERM, SIGSTOP  the signal, sent by the process to itself
#   file_size_limit   RLIMIT_FSIZE of one byte from then on: every file write fails (EFBIG)
#   full_disk         metrics.jsonl's descriptor pointed at /dev/full: its writes fail (ENOSPC)
#   nan_params        the params of the chunk holding that log point become NaN
INJECT = textwrap.dedent(
    """
    import os, resource, signal, sys
    import jax, jax.numpy as jnp, numpy as np
    from rl.run import logging as rl_logging
    from rl.run import train as rl_train
    from rl.cli.main import run_command
    from rl.cli.output import command_output

    at_step, fault, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    fired = []

    def fill_disk():
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.endswith("metrics.jsonl"):
                full = os.open("/dev/full", os.O_WRONLY)
                os.dup2(full, int(fd))
                os.close(full)

    def fire():
        if fault.startswith("SIG"):
            os.kill(os.getpid(), getattr(signal, fault))
        elif fault == "file_size_limit":
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))
        elif fault == "full_disk":
            fill_disk()

    def watch(values):
        if not fired and int(np.max(values["step"])) >= at_step:
            fired.append(True)
            fire()

    if fault == "file_size_limit":  # a write past the limit fails with EFBIG instead
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if fault == "nan_params":
        run_chunk = rl_train._ChunkedRun.run_chunk

        def poisoned(self, size):
            state, metrics = run_chunk(self, size)
            if fired:
                state = state._replace(params=jax.tree.map(lambda x: x + jnp.nan, state.params))
            return state, metrics

        rl_train._ChunkedRun.run_chunk = poisoned

    with rl_logging.sink(watch), command_output(restore=False):  # as the `rl` executable runs
        code = run_command(args)
    sys.exit(code)
    """
)


def fault_env(cache: Path | None = None) -> dict:
    """The subprocesses' environment: the repo on the path, and JAX's persistent compilation cache
    in `cache` (the suite compiles the same tiny programs many times)."""
    extra = {}
    if cache is not None:
        extra = {
            "FUSEDRL_COMPILATION_CACHE": str(cache),
            "JAX_COMPILATION_CACHE_DIR": str(cache),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
            # no size limit: with one, every cache hit writes the entry's access time, and after
            # a file_size_limit fault that write fails with a warning of JAX's on stderr
            "JAX_COMPILATION_CACHE_MAX_SIZE": "-1",
        }
    return subprocess_env(**extra)


def rl(args, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """`rl ARGS` in a subprocess, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "rl.cli.main", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def inject(args, at_step: int, fault: str, env: dict, **popen) -> subprocess.Popen:
    """Start `rl ARGS` with FAULT injected at env step AT_STEP (see INJECT); output piped unless
    `popen` says otherwise."""
    options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
    return subprocess.Popen(
        [sys.executable, "-c", INJECT, str(at_step), fault, *map(str, args)],
        cwd=REPO,
        env=env,
        **options,
    )


def run_injected(args, at_step: int, fault: str, env: dict, timeout: float = 300):
    """(exit status, stderr) of `rl ARGS` with FAULT injected at AT_STEP."""
    process = inject(args, at_step, fault, env)
    _, err = process.communicate(timeout=timeout)
    return process.returncode, err


def one_line(err: str) -> str:
    """The only line of a run's stderr; fails showing all of it otherwise."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    return lines[0]


def injection_steps(case: str, log_points: list[int], count: int) -> list[int]:
    """`count` distinct env steps among the run's log points but its last, drawn by a generator
    seeded with the case's name: the same points on every run of the suite."""
    return sorted(random.Random(case).sample(log_points[:-1], count))


def identical(run_dir: Path, reference: Path) -> None:
    """A resumed run ended exactly as the uninterrupted one: the same final params (byte for byte)
    and the same metrics rows (timing columns aside)."""
    assert (run_dir / "final_params.msgpack").read_bytes() == (
        reference / "final_params.msgpack"
    ).read_bytes()
    assert metric_rows(run_dir) == metric_rows(reference)


def resume_identical(run_dir: Path, reference: Path, env: dict) -> str:
    """`rl train --resume RUN_DIR` ends identical to `reference`; returns its stderr."""
    resumed = rl(["train", "--resume", run_dir], env)
    assert resumed.returncode == 0, resumed.stderr
    identical(run_dir, reference)
    return resumed.stderr


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of a run's finished checkpoints (not orbax's temporary folders), oldest first."""
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def intact(run_dir: Path, killed: bool = False) -> None:
    """What a stopped run wrote is whole and readable: every checkpoint's files match its manifest
    (the newest one may lack its manifest after a kill -9 that came between orbax finishing it and
    the manifest being written: `killed`), the newest checkpoint restores through `rl eval`'s
    loader, and `rl plot`'s reader reads metrics.jsonl without a warning."""
    from rl.cli.plot import read_metrics
    from rl.run.checkpoint_integrity import verify_files
    from rl.run.run_dir import load_params, load_run_config

    steps = checkpoint_steps(run_dir)
    for step in steps:
        verified = verify_files(run_dir / "checkpoints" / str(step))
        assert verified or (killed and step == steps[-1]), f"checkpoint {step} has no manifest"
    if steps:
        config, grid = load_run_config(run_dir)
        _, where = load_params(run_dir, config, grid, checkpoint=steps[-1])
        assert where.endswith(str(steps[-1]))
    warnings = []
    read_metrics(run_dir, warnings.append)
    assert not warnings


def copy_run(source: Path, target: Path) -> Path:
    """A copy of a run directory, to damage without touching the original."""
    shutil.copytree(source, target)
    return target


def record(fault: str, family: str, outcome: str) -> None:
    """One case's outcome ("identical" or "stopped cleanly") for the reliability table; called last
    in a test, once every check passed."""
    path = os.environ.get("FUSEDRL_FAULT_TABLE")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"fault": fault, "family": family, "outcome": outcome}) + "\n")


def largest_file(folder: Path) -> Path:
    """The largest file orbax wrote in a checkpoint (array data, not the files manifest)."""
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != FILES_MANIFEST]
    return max(files, key=lambda p: p.stat().st_size)
