"""Seed-axis sharding with jax.sharding: `--devices 4` on 4 forced CPU devices gives the same
per-seed results as one device, and so do two processes joined by jax.distributed (2 devices each).

XLA_FLAGS=--xla_force_host_platform_device_count must be set before JAX starts, so every run here
is a subprocess."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from run_helpers import (
    REPO,
    assert_runs_close,
    final_params,
    metric_rows,
    subprocess_env,
    write_config,
)

SHARDED = textwrap.dedent(
    """
    import json, sys
    import jax
    from rl.cli.main import main
    from rl.config import load_config
    from rl.run.distributed import seed_mesh, select_devices
    from rl.run.programs import make_programs

    config_path, out = sys.argv[1], {}
    out["devices"] = len(jax.devices())
    out["sharded"] = main(["train", config_path, "--name", "sharded", "--devices", "4"])
    out["all"] = main(["train", config_path, "--name", "all", "--devices", "all"])
    out["single"] = main(["train", config_path, "--name", "single"])
    out["uneven"] = main(["train", config_path, "--name", "uneven", "--devices", "3"])
    out["too_many"] = main(["train", config_path, "--name", "many", "--devices", "8"])
    # where the state lives: each of the 4 devices holds one seed
    config = load_config(config_path)
    _, init, _, keys, hparams = make_programs(config, [{}], seed_mesh(select_devices("all", 4)))
    params = init(keys, hparams).params
    out["shard_shapes"] = sorted({tuple(s.data.shape) for s in params.addressable_shards})
    out["shard_devices"] = len({s.device for s in params.addressable_shards})
    print("RESULT " + json.dumps(out))
    """
)


def run_script(script, *args, devices=4, **env):
    flags = f"--xla_force_host_platform_device_count={devices}"
    env = {"JAX_PLATFORMS": "cpu", **env}  # CPU devices, also on a GPU machine
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=REPO,
        env=subprocess_env(XLA_FLAGS=flags, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result_of(process, timeout=400):
    out, err = process.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert process.returncode == 0 and lines, err[-3000:]
    return json.loads(lines[-1][len("RESULT ") :]), err


def assert_same_run(a, b):
    """Per seed: integer metrics (steps, episode counts, greedy path lengths) identical, floats to
    float32 round-off. A device holding 1 seed runs a program vectorised over 1 instead of 4, and
    XLA may then contract multiply-adds differently (see tests/rl/test_qlearning.py)."""
    assert_runs_close(a, b, rtol=1e-5, params_atol=1e-6, metric_atol=1e-6)


def test_sharded_seeds_equal_unsharded_on_4_cpu_devices(tmp_path):
    config = write_config(tmp_path, seeds=4)
    result, err = result_of(run_script(SHARDED, config))
    assert result["devices"] == 4
    assert result["sharded"] == result["all"] == result["single"] == 0
    assert result["uneven"] == 2 and "must be a multiple of the number of devices (3)" in err
    assert result["too_many"] == 2 and "only 4 cpu device(s)" in err
    assert result["shard_devices"] == 4 and result["shard_shapes"] == [
        [1, 1, 25, 4]
    ]  # [settings, seeds per device, states, actions]
    runs = tmp_path / "runs"
    assert_same_run(runs / "sharded", runs / "single")
    assert_same_run(runs / "all", runs / "single")


MULTI_PROCESS = textwrap.dedent(
    """
    import json, sys
    from rl.cli.main import main

    config_path, port, process_id = sys.argv[1], sys.argv[2], sys.argv[3]
    code = main([
        "train", config_path, "--name", "two-processes", "--coordinator", f"localhost:{port}",
        "--num-processes", "2", "--process-id", process_id,
    ])
    import jax
    print("RESULT " + json.dumps({
        "code": code,
        "processes": jax.process_count(),
        "devices": len(jax.devices()),
        "local": len(jax.local_devices()),
    }))
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # the killed-and-resumed two-process run below trains the same by default
def test_two_processes_through_jax_distributed_equal_one_process(tmp_path):
    """Two processes (2 CPU devices each) equal one process on one device. (`-m slow`: the default
    suite's two-process run is test_two_process_run_killed_mid_chunk_and_resumed_..., equal to one
    process on 4 devices, which test_sharded_seeds_equal_unsharded_on_4_cpu_devices checks against
    one device.)"""
    config = write_config(tmp_path, seeds=4)
    single = run_script(
        "import sys; from rl.cli.main import main; "
        "print('RESULT', main(['train', sys.argv[1], '--name', 'single']))",
        config,
        devices=1,
    )
    port = free_port()
    processes = [run_script(MULTI_PROCESS, config, port, i, devices=2) for i in range(2)]
    results = [result_of(p)[0] for p in processes]
    assert result_of(single)[0] == 0
    for result in results:
        assert result == {"code": 0, "processes": 2, "devices": 4, "local": 2}
    runs = tmp_path / "runs"
    assert_same_run(runs / "two-processes", runs / "single")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--devices", "abc"], "--devices: expected a positive integer or 'all'"),
        (["--devices", "0"], "--devices: expected a positive integer or 'all'"),
        (["--devices", "4096"], "device(s) are visible"),
        (["--num-processes", "2"], "need --coordinator"),
        (["--coordinator", "localhost:1"], "needs --num-processes and --process-id"),
        (
            ["--coordinator", "localhost:1", "--num-processes", "2", "--process-id", "2"],
            "--process-id: expected 0 <= id < 2",
        ),
    ],
)
def test_bad_device_arguments_are_one_line_and_write_nothing(tmp_path, capsys, args, message):
    from run_helpers import run_cli

    config = write_config(tmp_path)
    assert run_cli(["train", config, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rl: error:") and message in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


ENV_SHARDED = textwrap.dedent(
    """
    import json, sys
    import jax
    from rl.cli.main import main
    from rl.config import load_config
    from rl.run.distributed import seed_mesh, select_devices
    from rl.run.programs import make_programs

    config_path, out = sys.argv[1], {}
    out["sharded"] = main(
        ["train", config_path, "--name", "envs4", "--devices", "4", "--shard", "envs"]
    )
    out["single"] = main(["train", config_path, "--name", "envs1"])
    out["uneven"] = main(
        ["train", config_path, "--name", "uneven", "--devices", "3", "--shard", "envs"]
    )
    config = load_config(config_path)
    mesh = seed_mesh(select_devices(4, None), axis="envs")
    trainer, init, _, keys, hparams = make_programs(config, [{}], mesh, shard="envs")
    state = init(keys, hparams)
    split = lambda x: x.addressable_shards[0].data.shape != x.shape
    leaves = jax.tree_util.tree_leaves_with_path(state)
    out["per_env"] = ["envs"]  # the state's rl.core.state.Envs field
    out["split"] = sorted({path[0].name for path, x in leaves if split(x)})
    out["split_shapes"] = sorted({
        (tuple(x.shape), tuple(x.addressable_shards[0].data.shape))
        for path, x in leaves
        if split(x)
    })
    out["per_env_leaves_all_split"] = all(
        split(x) for path, x in leaves if path[0].name == "envs"
    )
    # a qlearning run has no env axis: --shard envs is refused before anything is written
    out["no_envs"] = main(
        ["train", sys.argv[2], "--name", "qlearning-envs", "--devices", "2", "--shard", "envs"]
    )
    print("RESULT " + json.dumps(out))
    """
)


def test_env_axis_of_one_large_agent_sharded_equals_one_device(tmp_path):
    data = {
        "env": {"id": "CartPole-v1"},
        "agent": {
            "name": "ppo",
            "total_steps": 512,
            "num_envs": 4,
            "num_steps": 32,
            "num_epochs": 1,
            "num_minibatches": 2,
            "network": {"hidden": [8]},
            "log_interval": 2,
        },
        "run": {"seeds": 1, "checkpoint_every": 1, "progress": False},
    }
    config = write_config(tmp_path, data)
    (tmp_path / "tabular").mkdir()
    tabular = write_config(tmp_path / "tabular")
    result, err = result_of(run_script(ENV_SHARDED, config, tabular))
    assert result["sharded"] == result["single"] == 0
    assert (
        result["uneven"] == 2
        and "agent.num_envs (4) must be a multiple of the number of devices (3)" in err
    )
    # exactly the leaves under the state's Envs are split, each on its env axis (4 envs, 1 per
    # device)
    assert (
        result["split"] == result["per_env"]
        and result["per_env"]
        and result["per_env_leaves_all_split"]
    )
    assert all(
        full[2] == 4 and shard[2] == 1 and full[:2] == shard[:2] and full[3:] == shard[3:]
        for full, shard in result["split_shapes"]
    )
    assert result["no_envs"] == 2 and "agent qlearning has no agent.num_envs" in err
    assert not (tmp_path / "tabular" / "runs").exists()
    runs = tmp_path / "runs"
    assert_same_run(runs / "envs4", runs / "envs1")


# `rl ARGS` in a subprocess that SIGKILLs itself when a log point it receives reaches step KILL_AT
# (0: never); prints its exit code when it survives.
KILLABLE = textwrap.dedent(
    """
    import json, os, signal, sys
    import numpy as np
    from rl.run import logging as rl_logging
    from rl.cli.main import main

    kill_at, args = int(sys.argv[1]), sys.argv[2:]

    def send(values):
        if kill_at and int(np.max(values["step"])) >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    with rl_logging.sink(send):
        code = main(args)
    print("RESULT " + json.dumps({"code": code}))
    """
)


def two_processes(kill_at: int, *args):
    """Both processes of a 2 x 2-device run through jax.distributed on a fresh port."""
    port = free_port()
    return [
        run_script(
            KILLABLE,
            kill_at,
            *args,
            "--coordinator",
            f"localhost:{port}",
            "--num-processes",
            2,
            "--process-id",
            i,
            devices=2,
        )
        for i in range(2)
    ]


def test_two_process_run_killed_mid_chunk_and_resumed_equals_uninterrupted_run(tmp_path):
    """A two-process run (2 CPU devices each, one seed per device) loses both processes to SIGKILL
    in the middle of a chunk: process 0 kills itself at step 13000 (checkpoints at 4000, 8000 and
    12000 exist by then), and process 1, which cannot pass the next collective without it, is
    killed from outside. `rl train --resume` on both processes then ends with exactly the params and
    metrics of a one-process run on 4 devices (the same one-seed-per-device program) that never
    stopped."""
    from rl.run.checkpoint import Checkpoints

    config = write_config(tmp_path, seeds=4)
    uninterrupted = run_script(
        "import sys; from rl.cli.main import main; "
        "print('RESULT', main(['train', sys.argv[1], '--name', 'whole', '--devices', '4']))",
        config,
    )
    killed = two_processes(13_000, "train", config, "--name", "killed")
    _, err0 = killed[0].communicate(timeout=300)
    assert killed[0].returncode == -9, err0[-3000:]
    killed[1].kill()
    killed[1].communicate(timeout=60)
    run_dir = tmp_path / "runs" / "killed"
    steps = Checkpoints(run_dir, read_only=True).steps()
    assert not (run_dir / "final_params.msgpack").exists()
    assert steps and max(steps) <= 12_000 and set(steps) <= {4000, 8000, 12_000}, steps

    resumed = two_processes(0, "train", "--resume", run_dir)
    results = [result_of(p) for p in resumed]
    assert [r for r, _ in results] == [{"code": 0}, {"code": 0}]
    assert f"resuming from checkpoint {run_dir / 'checkpoints' / str(max(steps))}" in results[0][1]
    assert result_of(uninterrupted)[0] == 0
    whole = tmp_path / "runs" / "whole"
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
        final_params(run_dir),
        final_params(whole),
    )
    assert metric_rows(run_dir) == metric_rows(whole)
