"""Signals and closed output pipes on the tabular family (Q-learning on GridWorld: 20 log points
of 1000 env steps, a checkpoint every 4), each at points drawn by a seeded generator.

The invariant of each case: either the run, resumed after the fault, ends bit-identical to the
uninterrupted reference run ("identical"), or it stops with one clear line and everything it wrote
before the fault is whole and readable by `rl eval` and `rl plot` ("stopped cleanly"). Cases marked
slow repeat a fault kind that a default case injects (`-m slow`, benchmarks/faults.py)."""

from __future__ import annotations

import pytest
from fault_runs import (
    EXIT_STATUS,
    TABULAR_BEFORE_LAST_CHUNK,
    checkpoint_steps,
    identical,
    inject,
    injection_steps,
    intact,
    record,
    resume_identical,
    run_injected,
)

FAMILY = "tabular"
BEFORE_LAST_CHUNK = TABULAR_BEFORE_LAST_CHUNK


# One case per fault kind runs by default; the others repeat a kind that a default test injects too,
# on this family or another, and run with `-m slow` (benchmarks/faults.py runs every case).
REPEATED = pytest.mark.slow


@pytest.mark.parametrize(
    "fault,at_step",
    [
        pytest.param(fault, step, marks=REPEATED)
        # kill -9: the recurrent family (test_faults_agents.py) and, on this family,
        # tests/rl/test_checkpoint.py's killed-mid-chunk test (with a damaged newer checkpoint);
        # SIGINT: tests/rl/test_failures.py's Ctrl-C test (this family, the same checks), the
        # replay-based family and the closed pipes below; SIGTERM: the on-policy family
        for fault in ("SIGKILL", "SIGINT", "SIGTERM")
        for step in injection_steps(f"{FAMILY}-{fault}", BEFORE_LAST_CHUNK, 1)
    ],
)
def test_signal_then_resume_is_identical(fault, at_step, config, reference, env):
    """kill -9 loses the chunk in flight; Ctrl-C and SIGTERM finish and save it, name the
    checkpoint and exit 130 and 143. Either way --resume ends as if nothing happened."""
    name = f"{fault}-{at_step}"
    status, err = run_injected(["train", config, "--name", name], at_step, fault, env)
    run_dir = config.parent / "runs" / name
    assert status == EXIT_STATUS[fault], err
    steps = checkpoint_steps(run_dir)
    if fault != "SIGKILL":
        assert steps[-1] >= at_step  # the chunk in flight was saved
        last = err.strip().splitlines()[-1]
        assert f"checkpoint saved in {run_dir}/checkpoints/{steps[-1]}" in last
        assert last.endswith(f"continue with: rl train --resume {run_dir}")
    intact(run_dir, killed=fault == "SIGKILL")
    resume_identical(run_dir, reference, env)
    record(fault, FAMILY, "identical")


# (without Ctrl-C: the recurrent family's closed pipes, tests/faults/test_faults_agents.py)
@pytest.mark.parametrize("interrupt", [pytest.param(False, marks=REPEATED), True])
def test_closed_output_pipes_do_not_stop_the_run(interrupt, config, reference, env):
    """`rl train ... | head -1`, or `| tee log` ended by the same Ctrl-C: the reader is gone before
    the first line. The run goes on as in a terminal: it finishes (exit 0), or Ctrl-C saves the
    chunk in flight and exits 130; nothing depends on whether the output is read."""
    name = f"piped-{interrupt}"
    at_step = injection_steps(f"{FAMILY}-pipe", BEFORE_LAST_CHUNK, 1)[0] if interrupt else 10**9
    process = inject(
        ["train", config, "--name", name, "run.progress=true"],
        at_step,
        "SIGINT" if interrupt else "none",
        env,
    )
    process.stdout.close()
    process.stderr.close()
    status = process.wait(timeout=300)
    run_dir = config.parent / "runs" / name
    if interrupt:
        assert status == 130 and checkpoint_steps(run_dir)[-1] >= at_step
        intact(run_dir)
        resume_identical(run_dir, reference, env)
    else:
        assert status == 0
        identical(run_dir, reference)
    record(
        "SIGINT, output pipe closed" if interrupt else "SIGPIPE (output pipe closed)",
        FAMILY,
        "identical",
    )
