"""`kernels.precision` (float32 | tf32 | bf16): validated with one error naming the key, mapped to
the fused MLP kernels' `dot_precision` by `rl.core.environment.kernel_precision`, carried as a value
into every agent's fused path (DQN, SAC, TD3, PPO, Rainbow acting), and reported in the run's
summary. A fused DQN gradient at bf16 on the interpreter is the float32 one to bf16's bound. The
kernels' numerics themselves: tests/kernels/test_precision.py."""

from __future__ import annotations

import numpy as np
import pytest

from rl.config import build_config
from rl.config.parsing import ConfigError
from rl.core import environment

DQN = dict(
    name="dqn",
    total_steps=1024,
    num_envs=8,
    buffer_size=512,
    learning_starts=128,
    batch_size=32,
    train_freq=64,
    gradient_steps=4,
    target_update_interval=8,
    network={"hidden": [16, 16]},
    log_interval=256,
    eval_episodes=2,
    epsilon_decay_steps=512,
    fused_network=True,
)


def make_config(precision=None, matmul_precision=None, agent=DQN, env="CartPole-v1", **kernels):
    data = {"env": {"id": env}, "agent": agent, "kernels": dict(kernels)}
    if precision is not None:
        data["kernels"]["precision"] = precision
    if matmul_precision is not None:
        data["run"] = {"matmul_precision": matmul_precision}
    return build_config(data)


def test_the_key_defaults_to_float32_and_a_bad_value_names_it():
    assert make_config().kernels.precision == "float32"
    assert make_config("bf16").kernels.precision == "bf16"
    with pytest.raises(ConfigError, match=r"kernels\.precision: 'fp16' is not one of"):
        make_config("fp16")


@pytest.mark.parametrize(
    "precision, matmul_precision, dot_precision",
    [
        ("float32", None, "tf32"),  # XLA's float32 default on the GPU: TF32 products
        ("float32", "high", "tf32"),
        ("float32", "highest", "ieee"),
        ("tf32", "highest", "tf32"),
        ("bf16", None, "bf16"),
        ("bf16", "highest", "bf16"),
    ],
)
def test_kernel_precision_maps_the_key_and_the_run_s_matmul_precision(
    precision, matmul_precision, dot_precision
):
    assert environment.kernel_precision(make_config(precision, matmul_precision)) == dot_precision


def test_the_automatic_backend_never_changes_the_precision():
    """backend auto (the default) with no precision named: float32 operands, never bf16."""
    config = make_config(backend="auto")
    assert config.kernels.precision == "float32"
    assert environment.kernel_precision(config) in ("tf32", "ieee")


# ---------------------------------------------------------------- carried into the agents


def test_each_agent_s_fused_path_carries_the_precision():
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    from rl.agents import dqn, ppo, rainbow, sac, td3
    from rl.fused import critic as fused_critic

    config = make_config("bf16", backend="interpret")
    env, env_params = environment.make_env(config)
    fused = dqn.make_fused(config, env, env_params, dqn.make_q_network(config, env, env_params))
    assert fused is not None and fused.precision == "bf16"

    small = dict(total_steps=48, buffer_size=64, learning_starts=24, batch_size=16,
                 network={"hidden": [16, 8]}, log_interval=16, eval_episodes=0)  # fmt: skip
    for name, module in (("td3", td3), ("sac", sac)):
        config = make_config(
            "bf16", agent={"name": name, **small}, env="Pendulum-v1", backend="interpret"
        )
        env, env_params = environment.make_env(config)
        if module is td3:
            critic = td3.make_networks(config.agent, env, env_params)[1]
        else:
            critic = sac.make_variant(config.agent, env, env_params).critic
        critics = fused_critic.for_agent(config, env, env_params, critic)
        assert critics is not None and critics.precision == "bf16", name

    ppo_config = make_config("tf32", agent={"name": "ppo"}, backend="interpret")
    assert ppo.make_setup(ppo_config).dot_precision == "tf32"
    rainbow_config = make_config("bf16", agent={"name": "rainbow"}, backend="interpret")
    assert rainbow.make_setup(rainbow_config).dot_precision == "bf16"


def test_a_fused_dqn_gradient_at_bf16_is_the_float32_one_within_bf16_s_bound():
    """The agent's own fused view (rl.fused.q) at bf16 against the same view at full float32, on
    one minibatch through the interpreter: relative error below tests/kernels' bf16 bound (3e-2)
    and above float32 rounding (the bf16 path really ran)."""
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    import jax
    import jax.numpy as jnp

    from rl.agents import dqn
    from rl.fused import q as fused_q

    def fused(precision):
        config = make_config(precision, "highest", backend="interpret")
        env, env_params = environment.make_env(config)
        q_network = dqn.make_q_network(config, env, env_params)
        return dqn.make_fused(config, env, env_params, q_network), env, env_params

    full, env, env_params = fused("float32")
    half, _, _ = fused("bf16")
    assert (full.precision, half.precision) == ("ieee", "bf16")
    params = fused_q.init(full, jax.random.key(0), jnp.zeros((4,)))
    target = fused_q.init(full, jax.random.key(1), jnp.zeros((4,)))
    rng = np.random.default_rng(0)
    batch = {
        "obs": jnp.asarray(rng.normal(size=(32, 4)), jnp.float32),
        "action": jnp.asarray(rng.integers(0, 2, 32), jnp.int32),
        "reward": jnp.ones((32,), jnp.float32),
        "next_obs": jnp.asarray(rng.normal(size=(32, 4)), jnp.float32),
    }
    discounts = jnp.full((32,), 0.99, jnp.float32)
    want = fused_q.q_learning_grads(full, params, target, batch, discounts)[0]
    got = fused_q.q_learning_grads(half, params, target, batch, discounts)[0]
    error = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
    assert 1e-6 < error < 3e-2


# ---------------------------------------------------------------- the summary


def test_the_summary_reports_the_precision_and_prints_it_when_not_float32():
    from rl.cli.output import summary_lines
    from rl.run.summary import summarise

    metrics = {"step": np.asarray([[[256.0]]]), "episode_return": np.asarray([[[9.0]]])}
    plain = summarise(make_config(), [{}], metrics, 1.0, 2.0)
    assert plain["kernels_precision"] == "float32" and plain["kernels_dot_precision"] == "tf32"
    assert not any("kernels.precision" in line for line in summary_lines(plain))
    bf16 = summarise(make_config("bf16"), [{}], metrics, 1.0, 2.0)
    assert bf16["kernels_precision"] == "bf16" and bf16["kernels_dot_precision"] == "bf16"
    assert (
        summary_lines(bf16)[1] == "kernels.precision bf16: the fused MLP kernels' matmuls at bf16"
    )
