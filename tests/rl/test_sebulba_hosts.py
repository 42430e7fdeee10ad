"""The actor-learner architecture (rl.sebulba) over several processes joined by
jax.distributed, as on several hosts: two local CPU processes of one device each, each stepping its
own block of the envs in its actor threads and holding a shard of the learner, whose update is one
program over both processes' devices. Both end with the same params, and with those of one process
that steps every env in twice the threads and splits its learner over two devices (max_lag 0 makes
both runs deterministic). Envs that do not split over the processes are refused before anything
starts. An actor that raises or stalls in process 1 stops both processes before the next update,
process 0 with an error naming process 1; so do a checkpoint that cannot be written on process 1
and a greedy evaluation that raises on process 0. Under `-m slow`: Ctrl-C reaching one process
stops both at one checkpoint and `--resume` finishes the run; the shipped CartPole config learns
on two processes. Every run is a subprocess (jax.distributed and the forced device count are set
before JAX starts); the processes are started as tests/rl/test_sharding.py starts its two."""

from __future__ import annotations

import json
import re
import textwrap

import jax
import numpy as np
import pytest
from run_helpers import final_params, metric_rows, write_config
from test_sharding import free_port, result_of, run_script

# `rl train CONFIG ARGS...` in this process; prints its exit code, its params as this process holds
# them, and the env axis of every batch its learner took (this process's envs, the global batch's,
# and the shard on this process's device)
TRAIN = textwrap.dedent(
    """
    import json, sys
    import jax
    import numpy as np
    from rl.sebulba import learner as sebulba
    from rl.cli.main import main

    batches, states, global_batch = [], [], sebulba.Learner.global_batch
    run = sebulba.Learner.run

    def recorded(self, sharding, x):
        out = global_batch(self, sharding, x)
        batches.append([x.shape[1], out.shape[1], out.addressable_shards[0].data.shape[1]])
        return out

    def kept(self, *args, **kwargs):
        state, rows = run(self, *args, **kwargs)
        states.append(state)
        return state, rows

    sebulba.Learner.global_batch, sebulba.Learner.run = recorded, kept
    code = main(["train", *sys.argv[1:]])
    params = jax.tree.leaves(sebulba.local_copy(states[-1].params))
    params = [np.asarray(x).tolist() for x in params]
    print("RESULT " + json.dumps({
        "code": code, "process": jax.process_index(), "processes": jax.process_count(),
        "batches": sorted(set(map(tuple, batches))), "params": params,
    }))
    """
)

ARGS = ["--no-progress", "arch.max_lag=0"]
AGENT = {
    "name": "ppo",
    "total_steps": 512,  # 8 updates of 4 envs x 16 steps
    "num_envs": 4,
    "num_steps": 16,
    "num_epochs": 2,
    "num_minibatches": 2,
    "network": {"hidden": [16]},
    "log_interval": 2,
}


def sebulba_config(tmp_path, env="gymnasium:CartPole-v1", **agent):
    data = {
        "env": {"id": env},
        "agent": {**AGENT, **agent},
        "arch": {"name": "sebulba", "actor_threads": 1},
        "run": {"seed": 3, "seeds": 1, "checkpoint_every": 2},
    }
    return write_config(tmp_path, data)


def two_processes(script, *args):
    """Both processes of a run through jax.distributed on a fresh port, one CPU device each."""
    port = free_port()
    distributed = ["--coordinator", f"localhost:{port}", "--num-processes", 2]
    return [run_script(script, *args, *distributed, "--process-id", i, devices=1) for i in range(2)]


def test_two_processes_learn_as_one_process_with_both_processes_envs(tmp_path):
    """Two processes of 1 actor thread and 2 envs each (agent.num_envs 4 is the run's total)
    against one process of 2 threads x 2 envs with its learner over 2 devices: the same env
    seeds, the same actors' keys, the same rollouts, the same update."""
    config = sebulba_config(tmp_path)
    runs = tmp_path / "runs"
    single = run_script(
        TRAIN,
        config,
        "--name",
        "one",
        *ARGS,
        "arch.actor_threads=2",
        "arch.learner_devices=[0,1]",
        devices=2,
    )
    processes = two_processes(TRAIN, config, "--name", "two", *ARGS)
    results = [result_of(p)[0] for p in processes]
    one = result_of(single)[0]
    assert [r["code"] for r in results] == [0, 0] and one["code"] == 0
    assert [(r["process"], r["processes"]) for r in results] == [(0, 2), (1, 2)]
    # each process steps 2 envs; its learner takes the batch of all 4, holding its 2 of them
    assert results[0]["batches"] == results[1]["batches"] == [[2, 4, 2]]
    assert one["batches"] == [[4, 4, 2]]
    # both processes hold the same params, those of the one-process run
    for a, b in zip(results[0]["params"], results[1]["params"]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(results[0]["params"], one["params"]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # process 0 wrote the run directory: the same metrics (episodes of both processes' envs)
    written = final_params(runs / "two")
    for a, b in zip(
        [np.asarray(x).ravel() for x in jax.tree.leaves(written)], results[0]["params"], strict=True
    ):
        np.testing.assert_array_equal(a, np.asarray(b).ravel())
    rows, reference = metric_rows(runs / "two"), metric_rows(runs / "one")
    assert [r["step"] for r in rows] == [r["step"] for r in reference] == [128, 256, 384, 512]
    for row, ref in zip(rows, reference):
        assert row["episodes"] == ref["episodes"] and row["param_lag_max"] == 0
        assert row["episode_return"] == pytest.approx(ref["episode_return"], rel=1e-6, nan_ok=True)
    steps = sorted(
        int(p.name) for p in (runs / "two" / "checkpoints").iterdir() if p.name.isdigit()
    )
    assert steps[-1] == 512


def test_envs_that_do_not_split_over_the_processes_are_refused_before_anything_starts(tmp_path):
    """6 envs split over 2 actor threads in one process, not over 2 processes x 2 threads: both
    processes stop with one line naming the key, and no run directory is made."""
    config = sebulba_config(tmp_path, num_envs=6, total_steps=576)
    script = (
        "import sys; from rl.cli.main import main; print('RESULT', main(['train', *sys.argv[1:]]))"
    )
    processes = two_processes(script, config, "--name", "bad", "arch.actor_threads=2")
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert "RESULT 2" in out, err[-3000:]
        assert err.count("rl: error:") == 1
        assert (
            "arch.actor_threads: agent.num_envs (6) must split evenly over 2 processes x 2 actor "
            "threads" in err
        )
    assert not (tmp_path / "runs").exists()


# `rl train ARGS...` where process 1's envs fail as test_sebulba.py's Countdown envs do (its FAULT:
# at their AT-th step they raise, or with SLEEP > 0 sleep that long once and then write the file
# WOKE), process 1 alone adding ONLY_1's override (if any); prints its exit code if `rl` returns one
FAULTY = textwrap.dedent(
    """
    import json, sys
    sys.path += ["tests", "tests/rl"]
    import test_sebulba  # registers FusedrlTest/Countdown-v0
    from rl.cli.main import main

    at, sleep, woke, only_1 = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
    args = sys.argv[5:]
    if args[args.index("--process-id") + 1] == "1":
        test_sebulba.FAULT.update(at=at, sleep=sleep, woke=woke)
        args += [only_1] if only_1 else []
    print("RESULT " + json.dumps({"code": main(["train", *args])}))
    """
)


@pytest.mark.parametrize(
    "sleep, only_1, error",
    [
        (0.0, "", "RuntimeError: boom at step 40"),
        # process 1 alone waits at most 8 s (arch.queue_timeout_s; process 0 keeps 300 s): room for
        # the processes' start on a loaded machine, where its actor waits for process 0 too
        (120.0, "arch.queue_timeout_s=8", r"StallError: the learner waited 8 s .* of actor 0: the"),
    ],
    ids=["raises", "stalls"],
)
def test_an_actor_that_fails_on_one_process_stops_both_before_the_update(
    tmp_path, sleep, only_1, error
):
    """Process 1's actor raises (or stalls) in its third rollout: process 1 stops with the actor's
    error (or its learner's StallError, while the env still sleeps: the 120 s step has not
    ended), process 0 with one naming process 1 (were process 0 left in the update, JAX's
    distributed service would end both only at its 300 s shutdown timeout, with its own error),
    and neither writes a checkpoint or final params."""
    from test_sebulba import COUNTDOWN

    config = sebulba_config(tmp_path, env=COUNTDOWN)
    woke = tmp_path / "woke"  # written if the stalled env's step ends
    processes = two_processes(FAULTY, 40, sleep, woke, only_1, config, "--name", "failed", *ARGS)
    (out0, err0), (out1, err1) = [p.communicate(timeout=300) for p in processes]
    assert not woke.exists()
    assert [p.returncode for p in processes] == [1, 1] and "RESULT" not in out0 + out1
    assert re.search(error, err1), err1[-3000:]
    assert "sebulba: process 1 failed" in err0.splitlines()[-1], err0[-3000:]
    assert "boom" not in err0 and "StallError" not in err0
    run_dir = tmp_path / "runs" / "failed"
    assert not (run_dir / "final_params.msgpack").exists()
    assert not list((run_dir / "checkpoints").glob("[0-9]*"))


# `rl train ARGS...` where process WHO's learner side fails: "checkpoint" makes its first
# checkpoint's background write fail as a full disk does (raised as the next checkpoint starts),
# "evaluation" its second greedy evaluation raise; prints its exit code if `rl` returns one
LEARNER_FAULT = textwrap.dedent(
    """
    import json, sys
    from rl.run import checkpoint
    from rl.sebulba import learner as sebulba
    from rl.cli.main import main

    what, who, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    finish, evaluate, evaluations = checkpoint.Checkpoints._finish, sebulba.Learner.evaluate, []

    def full_disk(self, step):
        finish(self, step)
        self._write_failure = OSError(28, "No space left on device (test)")

    def failing_evaluation(self, params):
        evaluations.append(1)
        if len(evaluations) == 2:
            raise ValueError("evaluation boom (test)")
        return evaluate(self, params)

    if args[args.index("--process-id") + 1] == who:
        if what == "checkpoint":
            checkpoint.Checkpoints._finish = full_disk
        else:
            sebulba.Learner.evaluate = failing_evaluation
    print("RESULT " + json.dumps({"code": main(["train", *args])}))
    """
)


@pytest.mark.parametrize(
    "what, who, error, named",
    [
        ("checkpoint", 1, "No space left on device", "sebulba: process 1 failed"),
        ("evaluation", 0, "evaluation boom", "sebulba: process 0's greedy evaluation"),
    ],
)
def test_a_learner_side_failure_on_one_process_stops_both(tmp_path, what, who, error, named):
    """Process 1's second checkpoint cannot be written (its disk is full), or process 0's second
    greedy evaluation raises: the failing process stops with its error, the other with one naming
    it (neither waits in a collective for the other: every process votes before a checkpoint's
    write, and process 0 sends its evaluation's failure with its result; one left waiting would
    end only at the distributed service's 300 s shutdown timeout, with its own error), and
    no final params are written."""
    config = sebulba_config(tmp_path, eval_envs=1)
    processes = two_processes(LEARNER_FAULT, what, who, config, "--name", what, *ARGS)
    outputs = [p.communicate(timeout=300) for p in processes]
    # `rl` ends on a full disk with one line and code 1 (an OSError), on anything else by raising
    codes = [
        json.loads(out.split("RESULT ")[1])["code"] if "RESULT" in out else p.returncode
        for p, (out, _) in zip(processes, outputs)
    ]
    assert codes == [1, 1], [err[-3000:] for _, err in outputs]
    failing, other = outputs[who][1], outputs[1 - who][1]
    assert error in failing, failing[-3000:]
    assert named in other.splitlines()[-1], other[-3000:]
    assert error not in other
    assert not (tmp_path / "runs" / what / "final_params.msgpack").exists()


# `rl ARGS` that sends itself SIGINT (Ctrl-C) once a log point it receives reaches step STOP_AT
# (0: never); prints its exit code
INTERRUPTIBLE = textwrap.dedent(
    """
    import json, os, signal, sys
    import numpy as np
    from rl.run import logging as rl_logging
    from rl.cli.main import main

    stop_at, args, sent = int(sys.argv[1]), sys.argv[2:], []

    def send(values):
        if stop_at and not sent and int(np.max(values["step"])) >= stop_at:
            sent.append(os.kill(os.getpid(), signal.SIGINT))

    with rl_logging.sink(send):
        code = main(args)
    print("RESULT " + json.dumps({"code": code}))
    """
)


@pytest.mark.slow
def test_ctrl_c_on_one_process_stops_both_at_one_checkpoint_and_both_resume(tmp_path):
    """Ctrl-C reaches process 0 only: both processes agree to stop after the same update, save
    one checkpoint and exit 130; `rl train --resume` on both finishes the run, here on processes
    of 4 devices each. (`-m slow`: two two-process runs, about a minute on 2 cores.)"""
    config = sebulba_config(tmp_path, total_steps=2048)  # 32 updates, 16 log points
    run_dir = tmp_path / "runs" / "stopped"
    port = free_port()
    distributed = ["--coordinator", f"localhost:{port}", "--num-processes", 2]
    args = ["train", config, "--name", "stopped", "--no-progress", *distributed]
    stopped = [
        run_script(INTERRUPTIBLE, 768 if i == 0 else 0, *args, "--process-id", i, devices=1)
        for i in range(2)
    ]
    results = [result_of(p) for p in stopped]
    assert [r for r, _ in results] == [{"code": 130}, {"code": 130}]
    (saved,) = {err.splitlines()[-1] for _, err in results}
    assert "rl: interrupted at step" in saved and "--resume" in saved
    step = int(saved.split("interrupted at step ")[1].split(";")[0])
    assert 768 <= step < 2048
    port = free_port()
    distributed = ["--coordinator", f"localhost:{port}", "--num-processes", 2]
    resume = ["train", "--resume", run_dir, *distributed]
    # on processes of 4 CPU devices each, the learner on the first: the learner's update and the
    # log points' gathers run over different device sets, one after the other
    resumed = [
        run_script(INTERRUPTIBLE, 0, *resume, "--process-id", i, devices=4) for i in range(2)
    ]
    results = [result_of(p) for p in resumed]
    assert [r for r, _ in results] == [{"code": 0}, {"code": 0}]
    assert f"resuming from checkpoint {run_dir / 'checkpoints' / str(step)}" in results[0][1]
    rows = metric_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(128, 2049, 128))
    assert (run_dir / "final_params.msgpack").exists()


@pytest.mark.slow
def test_two_processes_learn_cartpole_with_the_shipped_config(tmp_path):
    """configs/ppo_sebulba_cartpole.yaml on two processes (each 2 actor threads x 2 envs and a
    learner shard) reaches a training return >= 475, as one process does (test_sebulba.py's
    check, which asks it of 3 seeds of 4). (`-m slow`: a few CPU minutes.)"""
    output = ["--output-dir", tmp_path / "runs", "--no-progress"]
    processes = two_processes(
        "import sys; from rl.cli.main import main; print('RESULT', main(['train', *sys.argv[1:]]))",
        "configs/ppo_sebulba_cartpole.yaml",
        "--name",
        "learn",
        *output,
    )
    for process in processes:
        out, err = process.communicate(timeout=900)
        assert "RESULT 0" in out, err[-3000:]
    rows = metric_rows(tmp_path / "runs" / "learn")
    assert max(r["episode_return"] for r in rows[-4:]) >= 475, [r["episode_return"] for r in rows]
