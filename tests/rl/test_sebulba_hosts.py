"""The actor-learner architecture (rl.sebulba) over several processes joined by jax.distributed, as
on several hosts: two local CPU processes of one device each, each stepping its own block of the
envs in its actor threads and holding a shard of the learner, whose update is one program over
both processes' devices. Both end with the same params, and with those of one process that steps
every env in twice the threads and splits its learner over two devices (max_lag 0 makes both
runs deterministic). Envs that do not split over the processes are refused before anything
starts. Every run is a subprocess (jax.distributed and the forced device count are set before JAX
starts); the processes are started as tests/rl/test_sharding.py starts its two."""

from __future__ import annotations

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
    from rl import sebulba
    from rl.cli import main

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


def sebulba_config(tmp_path, **agent):
    data = {
        "env": {"id": "gymnasium:CartPole-v1"},
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
    script = "import sys; from rl.cli import main; print('RESULT', main(['train', *sys.argv[1:]]))"
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
