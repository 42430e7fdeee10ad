"""`run.matmul_precision` reaches the compiled training program (and nothing else changes), and
network initialisers trace their dots at full float32 precision whatever the run's setting.

The precision shows in the lowered StableHLO as each dot_general's `precision = [...]`; on the CPU
the values are the same either way, so the text is what can be checked here."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from rl.config import build_config
from rl.config.parsing import ConfigError
from rl.core.precision import at_matmul_precision
from rl.nn import layers
from rl.run.programs import make_programs, run_mesh

DQN = dict(
    name="dqn",
    total_steps=256,
    buffer_size=128,
    learning_starts=64,
    batch_size=8,
    train_freq=64,
    gradient_steps=2,
    target_update_interval=16,
    network={"hidden": [8, 8]},
    log_interval=128,
    eval_episodes=1,
    epsilon_decay_steps=128,
)
DOT = re.compile(r"stablehlo\.dot_general .*?precision = \[(\w+), (\w+)\]")


def dot_precisions(hlo: str) -> set[str]:
    """The operand precisions of every dot_general in a lowered program's text."""
    found = DOT.findall(hlo)
    assert found, "the program has no dot_general"
    return {p for pair in found for p in pair}


def make_config(**run):
    return build_config({"env": {"id": "CartPole-v1"}, "agent": DQN, "run": run})


def test_the_key_defaults_to_default_and_names_itself_when_wrong():
    assert make_config().run.matmul_precision == "default"
    assert make_config(matmul_precision="highest").run.matmul_precision == "highest"
    with pytest.raises(ConfigError, match=r"run\.matmul_precision"):
        make_config(matmul_precision="tf32")


def lowered_chunk(config) -> str:
    _, init, chunk, keys, hparams = make_programs(config, [{}], run_mesh(config, None, "seeds"))
    state = jax.eval_shape(init, keys, hparams)
    return chunk(1).lower(state, hparams).as_text()


@pytest.mark.parametrize(
    "precision, expected", [("default", {"DEFAULT"}), ("high", {"HIGH"}), ("highest", {"HIGHEST"})]
)
def test_the_training_program_is_traced_at_the_configured_precision(precision, expected):
    assert dot_precisions(lowered_chunk(make_config(matmul_precision=precision))) == expected


def test_at_matmul_precision_leaves_the_process_setting_alone():
    before = jax.config.jax_default_matmul_precision
    f = at_matmul_precision(lambda a: a @ a, "highest")
    assert dot_precisions(jax.jit(f).lower(jnp.ones((2, 2))).as_text()) == {"HIGHEST"}
    assert jax.config.jax_default_matmul_precision == before
    assert dot_precisions(jax.jit(lambda a: a @ a).lower(jnp.ones((2, 2))).as_text()) == {"DEFAULT"}
    plain = lambda a: a
    assert at_matmul_precision(plain, "default") is plain


def squared_normal(key, shape, dtype=jnp.float32):
    """An initialiser that multiplies: N N^T for a normal N (so its dot shows in the program)."""
    n = jax.random.normal(key, shape, dtype)
    return n @ n.T


@pytest.mark.parametrize("backend", layers.BACKENDS)
def test_network_init_traces_at_full_precision_and_apply_at_the_callers(backend):
    def fn(layers, x):
        w = layers.param("w", (5, 5), squared_normal)
        return layers.dense(x @ w, 3, scale=1.0)

    net = layers.build(fn, backend)
    obs, key = jnp.ones((2, 5)), jax.random.PRNGKey(0)
    assert dot_precisions(jax.jit(net.init).lower(key, obs).as_text()) == {"HIGHEST"}
    params = net.init(key, obs)
    assert dot_precisions(jax.jit(net.apply).lower(params, obs).as_text()) == {"DEFAULT"}
    # inside a program traced at "high", init stays at "highest"
    high_init = at_matmul_precision(net.init, "high")
    assert dot_precisions(jax.jit(high_init).lower(key, obs).as_text()) == {"HIGHEST"}
