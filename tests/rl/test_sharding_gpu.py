"""Sharding on real GPUs (two or more visible): the seed axis and the env axis split over 2 GPUs
give the per-seed results of one GPU, with the triton kernels and with the reference kernels.

These run only where `jax.devices("gpu")` has at least two devices (the device tool's
`nvidia-h200-x2`: `CUDA_VISIBLE_DEVICES=0,1 python -m pytest tests/rl/test_sharding_gpu.py`); the
forced-CPU-device versions in tests/rl/test_sharding.py run everywhere.

What is promised here, and why not bitwise: a GPU holding 1 seed runs the program vectorised over 1
instead of 2, so XLA may pick other kernels and reduction orders for the same maths. Training is at
`run.matmul_precision: highest`, so the only difference is float32 round-off in reductions: after
4 PPO updates of a 16-unit network the parameters agree to rtol 1e-4 (relative error of a float32
sum of n terms grows like n * 2^-24 ~ 1e-5 for the few hundred terms of a minibatch gradient, and
Adam's normalisation keeps it from compounding over 4 updates), and the episode counts, which depend
on sampled actions only, are equal."""

from __future__ import annotations

import jax
import pytest
from run_helpers import assert_runs_close, metric_rows, run_cli, write_config


def _gpus() -> int:
    """How many GPUs JAX sees (0 without a GPU backend)."""
    try:
        return len(jax.devices("gpu"))
    except RuntimeError:
        return 0


pytestmark = pytest.mark.skipif(_gpus() < 2, reason="needs two GPUs (device kind nvidia-h200-x2)")

PPO = {
    "env": {"id": "CartPole-v1"},
    "agent": {
        "name": "ppo",
        "total_steps": 2048,
        "num_envs": 4,
        "num_steps": 128,
        "num_epochs": 2,
        "num_minibatches": 2,
        "network": {"hidden": [16]},
        "log_interval": 2,
    },
    "run": {"seeds": 2, "checkpoint_every": 1, "progress": False, "matmul_precision": "highest"},
}


def assert_close_runs(a, b):
    """Parameters to rtol 1e-4 (see the module docstring); integer metrics equal, floats to 1e-4."""
    assert metric_rows(a)
    assert_runs_close(a, b, rtol=1e-4, params_atol=1e-6, metric_atol=1e-5)


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_seed_axis_on_two_gpus_equals_one_gpu(tmp_path, backend):
    from rl.config import load_config
    from rl.run.distributed import seed_mesh, select_devices
    from rl.run.programs import make_programs

    data = {**PPO, "kernels": {"backend": backend}}
    config_path = write_config(tmp_path, data)
    assert run_cli(["train", config_path, "--name", "two", "--devices", "2"]) == 0
    assert run_cli(["train", config_path, "--name", "one"]) == 0
    assert_close_runs(tmp_path / "runs" / "two", tmp_path / "runs" / "one")
    # each GPU holds the state of one seed
    config = load_config(config_path)
    _, init, _, keys, hparams = make_programs(config, [{}], seed_mesh(select_devices(2, None)))
    params = init(keys, hparams)["params"]
    leaf = jax.tree.leaves(params)[0]
    assert {s.device.platform for s in leaf.addressable_shards} == {"gpu"}
    assert len({s.device for s in leaf.addressable_shards}) == 2
    assert {s.data.shape[1] for s in leaf.addressable_shards} == {
        1
    }  # [settings, seeds per device, ...]


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_env_axis_on_two_gpus_equals_one_gpu(tmp_path, backend):
    data = {**PPO, "kernels": {"backend": backend}, "run": {**PPO["run"], "seeds": 1}}
    config_path = write_config(tmp_path, data)
    assert (
        run_cli(["train", config_path, "--name", "two", "--devices", "2", "--shard", "envs"]) == 0
    )
    assert run_cli(["train", config_path, "--name", "one"]) == 0
    assert_close_runs(tmp_path / "runs" / "two", tmp_path / "runs" / "one")
