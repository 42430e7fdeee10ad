"""`kernels: {deterministic: true}` reaches the agents, and on a GPU makes a Rainbow run bitwise
reproducible (the test marked `gpu`; skipped without a GPU and jax-triton).

What each platform promises: on the CPU every run of one compiled program gives the same bits
(no atomics), with or without the mode. On the GPU, two things vary from run to run unless chosen
otherwise: fusedrl's order-dependent kernels (the C51 projection's atomic-add scatter, the chained
scans' look-back), which `kernels.deterministic` replaces by fixed-order ones, and XLA's own
scatters and atomics, which the process-wide flag `XLA_FLAGS=--xla_gpu_deterministic_ops=true`
makes deterministic (set by the user before JAX starts; library code sets no process state).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import pytest
from run_helpers import REPO, subprocess_env

from kernels import launch
from rl.agents import ppo, pqn, rainbow
from rl.config import build_config, hyperparams, load_config
from rl.config.parsing import ConfigError
from rl.core import losses

TINY_RAINBOW = dict(
    name="rainbow",
    total_steps=512,
    buffer_size=256,
    learning_starts=128,
    batch_size=16,
    train_freq=64,
    gradient_steps=4,
    target_update_interval=16,
    network={"hidden": [16, 16]},
    log_interval=256,
    eval_episodes=1,
    num_atoms=11,
    v_min=0.0,
    v_max=10.0,
)


def test_the_config_key_validates_and_defaults_off():
    base = {"env": {"id": "CartPole-v1"}, "agent": TINY_RAINBOW}
    assert build_config(base).kernels.deterministic is False
    assert build_config({**base, "kernels": {"deterministic": True}}).kernels.deterministic is True
    with pytest.raises(ConfigError, match="kernels.deterministic"):
        build_config({**base, "kernels": {"deterministic": "sometimes"}})


@pytest.mark.parametrize(
    "module, config_file",
    [(rainbow, "rainbow_cartpole"), (ppo, "ppo_cartpole"), (pqn, "pqn_cartpole")],
)
def test_agents_carry_the_mode_to_their_kernel_calls(module, config_file, monkeypatch):
    """Each agent passes deterministic=True to the order-dependent op it calls (recorded at
    trace)."""
    seen = []
    for name in (
        "categorical_td_target",
        "truncation_aware_gae",
        "truncation_aware_q_lambda",
        "n_step_transition",
    ):
        real = getattr(losses, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            seen.append((_name, kwargs.get("deterministic")))
            return _real(*args, **kwargs)

        monkeypatch.setattr(losses, name, spy)
    config = load_config(
        REPO / "configs" / f"{config_file}.yaml",
        ["kernels.backend=reference", "kernels.deterministic=true"],
    )
    trainer, hparams = module.make_trainer(config), hyperparams(config.agent)
    state = jax.eval_shape(trainer.init, jax.random.PRNGKey(0), hparams)
    jax.eval_shape(lambda s, h: trainer.run(s, h, 1), state, hparams)
    assert seen and all(flag is True for _, flag in seen), seen


GPU_RUN_TWICE = textwrap.dedent(
    """
    import jax, numpy as np
    from rl.config import build_config
    from rl.run.programs import build_program

    agent = dict(name="rainbow", total_steps=4096, num_envs=4, buffer_size=2048,
                 learning_starts=512, batch_size=256, train_freq=256, gradient_steps=16,
                 target_update_interval=64, log_interval=1024, eval_episodes=2, num_atoms=51,
                 v_min=0.0, v_max=100.0, network={"hidden": [64, 64]})
    config = build_config({"env": {"id": "CartPole-v1"}, "agent": agent, "run": {"seeds": 16},
                           "kernels": {"backend": "triton", "deterministic": True}})
    program, keys, hparams = build_program(config)
    runs = [jax.device_get(program(keys, hparams)) for _ in range(2)]
    (state_a, metrics_a), (state_b, metrics_b) = runs
    leaves_a, leaves_b = jax.tree.leaves(state_a.params), jax.tree.leaves(state_b.params)
    differ = [i for i, (a, b) in enumerate(zip(leaves_a, leaves_b)) if not np.array_equal(a, b)]
    assert not differ, f"params leaves {differ} of {len(leaves_a)} differ between two runs"
    for name in ("loss", "eval_return"):
        np.testing.assert_array_equal(metrics_a[name], metrics_b[name], err_msg=name)
    loss = float(np.nanmean(metrics_a["loss"][..., -1]))
    print("bitwise equal", len(leaves_a), "leaves; loss", loss)
    """
)


def gpu_unavailable_reason() -> str | None:
    if jax.default_backend() != "gpu":
        return f"needs a CUDA GPU (the default JAX backend here is {jax.default_backend()!r})"
    return launch.triton_unavailable_reason()


@pytest.mark.gpu
def test_rainbow_with_deterministic_kernels_is_bitwise_reproducible_on_the_gpu():
    """16 seeds of Rainbow (C51 projection on 4096 rows per step: many atomic adds in the default
    mode) trained twice by one compiled program in one process: identical params and metrics."""
    reason = gpu_unavailable_reason()
    if reason:
        pytest.skip(reason)
    env = subprocess_env()
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_gpu_deterministic_ops=true").strip()
    result = subprocess.run(
        [sys.executable, "-c", GPU_RUN_TWICE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "bitwise equal" in result.stdout
