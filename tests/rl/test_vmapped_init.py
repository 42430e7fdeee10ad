"""Vmapped init on the CPU runs one instance at a time (rl.agents.trainer.vmap_sequentially_on_cpu).

Orthogonal init draws weights with a LAPACK QR. Batched by the sweep x seed vmap, XLA:CPU's LAPACK
kernel parks a worker thread until the pieces of the batch are done; with as many such QRs running
at once as there are worker threads, the program hangs forever (every thread idle). These tests
check the programs rl builds hold no batched LAPACK call, that looping gives the same values as
batching, and (`-m slow`) that a SAC sweep x seed program (a reliable hang on a 2-core machine
before the fix) runs to the end under XLA's default scheduler.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from run_helpers import REPO, subprocess_env

from rl.agents.trainer import vmap_sequentially_on_cpu
from rl.config import build_config, parse_sweep
from rl.run.programs import build_program, make_programs, stacked_hyperparams


@pytest.fixture(autouse=True)
def on_the_cpu():
    """The property under test is XLA:CPU's: build and run every program here on the CPU, also on
    a GPU machine."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


TINY_AGENTS = {
    "sac": (
        "Pendulum-v1",
        dict(
            total_steps=8,
            log_interval=8,
            learning_starts=8,
            buffer_size=64,
            batch_size=8,
            eval_episodes=0,
            network={"hidden": [16, 16]},
        ),
    ),
    "ppo": (
        "CartPole-v1",
        dict(
            total_steps=64,
            num_envs=2,
            num_steps=16,
            num_epochs=1,
            num_minibatches=2,
            log_interval=2,
            network={"hidden": [16, 16]},
        ),
    ),
    "dqn": (
        "CartPole-v1",
        dict(
            total_steps=64,
            num_envs=2,
            train_freq=32,
            learning_starts=32,
            buffer_size=64,
            batch_size=8,
            log_interval=32,
            eval_episodes=1,
            network={"hidden": [16, 16]},
        ),
    ),
    "rainbow": (
        "CartPole-v1",
        dict(
            total_steps=64,
            num_envs=2,
            train_freq=32,
            learning_starts=32,
            buffer_size=64,
            batch_size=8,
            log_interval=32,
            eval_episodes=1,
            network={"hidden": [16, 16]},
        ),
    ),
}


def tiny_config(agent: str, seeds: int = 2):
    env, params = TINY_AGENTS[agent]
    run = {"seeds": seeds, "progress": False}
    return build_config(
        {
            "env": {"id": env},
            "agent": {"name": agent, **params},
            "run": run,
            "kernels": {"backend": "reference"},
        }
    )


def lapack_batch_dims(hlo_text: str) -> list[int]:
    """The number of batch dimensions of every LAPACK custom call in a lowered program."""
    return [
        int(n) for n in re.findall(r'custom_call @lapack_\w+\(.*num_batch_dims = "(\d+)"', hlo_text)
    ]


@pytest.mark.parametrize("agent", sorted(TINY_AGENTS))
def test_sweep_program_has_no_batched_lapack_call(agent):
    """The one-program sweep x seed run (rl.run.programs.build_program, i.e.
    jax.jit(vmap(vmap(train))))."""
    config = tiny_config(agent)
    program, keys, hparams = build_program(config, [{}, {}])
    batch_dims = lapack_batch_dims(program.lower(keys, hparams).as_text())
    assert batch_dims, "expected the orthogonal init's QR in the program"
    assert set(batch_dims) == {0}, (
        f"batched LAPACK call in {agent}'s program: batch dims {batch_dims}"
    )


def test_chunked_init_program_has_no_batched_lapack_call():
    """The init program of `rl train` (rl.run.programs.make_programs), also vmapped over settings x
    seeds."""
    from rl.run.distributed import seed_mesh

    config = tiny_config("sac")
    _, init, _, keys, hparams = make_programs(config, [{}, {}], seed_mesh(jax.devices("cpu")[:1]))
    batch_dims = lapack_batch_dims(init.lower(keys, hparams).as_text())
    assert batch_dims and set(batch_dims) == {0}, batch_dims


def test_looped_init_equals_batched_and_single_calls():
    """Same values bit for bit: vmapped as a loop, vmapped as a batch, and one instance at a time,
    under the sweep x seed nesting (keys vary along the inner axis, hparams along the outer)."""
    from rl.agents import sac

    config = tiny_config("sac", seeds=3)
    trainer = sac.make_trainer(config)
    hparams = stacked_hyperparams(config, parse_sweep(["agent.lr=1e-3,3e-4"], config.agent))
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    many = lambda init: jax.jit(jax.vmap(jax.vmap(init, in_axes=(0, None)), in_axes=(None, 0)))(
        keys, hparams
    )
    looped, batched = many(vmap_sequentially_on_cpu(trainer.init)), many(trainer.init)
    assert jax.tree.structure(looped) == jax.tree.structure(batched)
    for a, b in zip(jax.tree.leaves(looped), jax.tree.leaves(batched)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    single = jax.jit(trainer.init)(keys[2], {k: v[1] for k, v in hparams.items()})
    for a, b in zip(jax.tree.leaves(looped), jax.tree.leaves(single)):
        np.testing.assert_array_equal(np.asarray(a)[1, 2], np.asarray(b))
    # called directly (no vmap) it is the init itself
    direct = vmap_sequentially_on_cpu(trainer.init)(keys[2], {k: v[1] for k, v in hparams.items()})
    for a, b in zip(jax.tree.leaves(direct), jax.tree.leaves(single)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_outputs_that_depend_on_no_batched_input_stay_unbatched():
    """As under a plain vmap: the step counter and the empty replay buffer do not depend on the key,
    so they stay unbatched (out_axes=None accepts them), which keeps SAC's and DQN's `lax.cond` on
    `step >= learning_starts` a branch; params and env states depend on the key and are batched."""
    from rl.agents import sac
    from rl.config import hyperparams

    config = tiny_config("sac")
    trainer = sac.make_trainer(config)
    hparams = hyperparams(config.agent)
    init = vmap_sequentially_on_cpu(trainer.init)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    unbatched = jax.jit(
        jax.vmap(lambda key: (init(key, hparams).step, init(key, hparams).buffer), out_axes=None)
    )(keys)
    assert int(unbatched[0]) == 0 and int(unbatched[1].size) == 0
    obs = jax.jit(jax.vmap(lambda key: init(key, hparams).envs.obs))(keys)
    assert obs.shape[0] == 3 and not np.allclose(obs[0], obs[1])
    with pytest.raises(ValueError):  # the obs are batched: they cannot leave with out_axes=None
        jax.vmap(lambda key: init(key, hparams).envs.obs, out_axes=None)(keys)


SAC_SWEEP = textwrap.dedent(
    """
    import jax
    from rl.config import build_config, parse_sweep
    from rl.run.programs import build_program
    agent = dict(name="sac", total_steps=8, log_interval=8, learning_starts=8, buffer_size=64,
                 batch_size=8, eval_episodes=0, network={"hidden": [128, 128]})
    config = build_config({"env": {"id": "Pendulum-v1"}, "agent": agent,
                           "run": {"seeds": 2, "progress": False}})
    grid = parse_sweep(["agent.lr=1e-3,3e-4"], config.agent)
    program, keys, hparams = build_program(config, grid)
    compiled = program.lower(keys, hparams).compile()
    for i in range(20):
        jax.block_until_ready(compiled(jax.random.split(jax.random.PRNGKey(i), 2), hparams))
    print("DONE")
    """
)


@pytest.mark.slow
def test_sac_sweep_program_does_not_hang_under_the_default_scheduler():
    """2 settings x 2 seeds of SAC with 128-wide networks, run 20 times in a subprocess under XLA's
    default (concurrency-optimized) CPU scheduler. With batched QRs this hung within a few runs on
    a 2-core machine; a hang fails here on the timeout. (A stress run, `-m slow`: the default suite
    checks the cause, a batched LAPACK call, is absent from every agent's sweep and init programs,
    test_sweep_program_has_no_batched_lapack_call.)"""
    env = subprocess_env(XLA_FLAGS="--xla_cpu_enable_concurrency_optimized_scheduler=true")
    try:
        done = subprocess.run(
            [sys.executable, "-c", SAC_SWEEP],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the SAC sweep x seed program hung (no result after 300 s)")
    assert done.returncode == 0 and "DONE" in done.stdout, done.stderr[-3000:]
