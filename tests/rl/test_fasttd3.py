"""FastTD3's recipe in TD3 and SAC (`rl.nn.distributional`, `rl.agents.fast_recipe`): the
distributional critics' target projection and loss against a float64 NumPy reference, FastSAC's
entropy bonus before the projection, the actor on min of the expected values, n-step returns that
stop at termination and bootstrap at truncation (by hand, and through the loop against its one-step
buffer), observation statistics against NumPy, config errors naming the key, the same seed giving
the same run, and short Pendulum runs that learn (`-m slow`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.agents import fast_recipe, sac, td3
from rl.config import build_config, hyperparams, load_config
from rl.config.parsing import ConfigError
from rl.core import environment, observation_norm
from rl.nn import distributional

SMALL = dict(
    total_steps=2000,
    learning_starts=500,
    batch_size=64,
    log_interval=1000,
    eval_episodes=2,
    gamma=0.98,
    network={"hidden": [32, 32]},
)
FAST = dict(distributional=True, num_atoms=21, v_min=-100.0, v_max=10.0, n_step=3)


def make_config(name="td3", env="Pendulum-v1", extra=None, **agent):
    return build_config(
        {"env": {"id": env}, "agent": {"name": name, **SMALL, **agent}, **(extra or {})}
    )


# ---------------------------------------------------------------- the float64 NumPy reference


def softmax64(logits):
    x = np.asarray(logits, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def project64(atoms, probs, z):
    """C51's projection, one row at a time: each atom clipped to [z_0, z_K-1], its mass split
    between the two neighbouring support points in proportion to its closeness."""
    z = np.asarray(z, np.float64)
    dz = z[1] - z[0]
    out = np.zeros(np.shape(probs), np.float64)
    for row, (a_row, p_row) in enumerate(zip(np.asarray(atoms, np.float64), probs)):
        for a, p in zip(np.clip(a_row, z[0], z[-1]), p_row):
            b = min((a - z[0]) / dz, len(z) - 1.0)  # (z_K-1 - z_0) / dz may round above K-1
            lo, hi = int(np.floor(b)), int(np.ceil(b))
            if lo == hi:
                out[row, lo] += p
            else:
                out[row, lo] += p * (hi - b)
                out[row, hi] += p * (b - lo)
    return out


def target64(reward, discount, bonus, next_1, next_2, z):
    """The clipped double-Q target: both projections of R + d b + d z, per row the one of the
    smaller expected value (FastTD3: the second on ties)."""
    atoms = (reward + discount * bonus)[:, None] + discount[:, None] * np.asarray(z)[None, :]
    m1 = project64(atoms, softmax64(next_1), z)
    m2 = project64(atoms, softmax64(next_2), z)
    return np.where((m1 @ z < m2 @ z)[:, None], m1, m2)


def cross_entropy64(logits, m):
    x = np.asarray(logits, np.float64)
    log_p = x - x.max(-1, keepdims=True)
    log_p = log_p - np.log(np.exp(log_p).sum(-1, keepdims=True))
    return -(m * log_p).sum(-1)


def random_case(seed=0, batch=6, atoms=11):
    rng = np.random.default_rng(seed)
    z = np.linspace(-3.0, 5.0, atoms)
    logits = [rng.normal(size=(batch, atoms)) * 2 for _ in range(4)]
    reward = rng.normal(size=batch) * 2
    terminated = np.array([False, True, False, False, True, False][:batch])
    discount = 0.9 ** np.array([1, 2, 3, 1, 1, 2][:batch]) * (1 - terminated)
    bonus = rng.normal(size=batch)
    return z, logits, reward, discount, bonus


def test_target_distribution_is_the_projection_of_the_twin_with_the_smaller_value():
    z, (n1, n2, _, _), reward, discount, _ = random_case()
    got = distributional.twin_target_distribution(
        jnp.float32(reward), jnp.float32(discount), jnp.float32(n1), jnp.float32(n2),
        jnp.float32(z), backend="reference",
    )  # fmt: skip
    want = target64(reward, discount, 0.0, n1, n2, z)
    np.testing.assert_allclose(got, want, atol=2e-6)
    np.testing.assert_allclose(np.asarray(got).sum(-1), 1.0, rtol=1e-5)
    m1 = project64(reward[:, None] + discount[:, None] * z, softmax64(n1), z)
    m2 = project64(reward[:, None] + discount[:, None] * z, softmax64(n2), z)
    assert 0 < np.sum(m1 @ z < m2 @ z) < len(z)  # the case picks from both critics


def test_critic_loss_against_numpy_with_a_bonus_before_the_projection():
    """L_Q = mean CE(m, l_1) + mean CE(m, l_2), m the projection of R + d b + d z (SAC's bonus b:
    the atoms shift before they are clipped to the support), mean Q_1 its first output."""
    z, (n1, n2, l1, l2), reward, discount, bonus = random_case(seed=1)
    tables = {"online": (l1, l2), "target": (n1, n2)}
    critic = lambda params, obs, action: tuple(jnp.float32(x) for x in tables[params])
    batch = {
        "obs": jnp.zeros((6, 1)), "action": jnp.zeros((6, 1)), "next_obs": jnp.ones((6, 1)),
        "reward": jnp.float32(reward),
    }  # fmt: skip
    loss, q_mean = distributional.critic_loss(
        critic, jnp.float32(z), "online", "target", batch, jnp.zeros((6, 1)),
        jnp.float32(bonus), jnp.float32(discount), backend="reference",
    )  # fmt: skip
    m = target64(reward, discount, bonus, n1, n2, z)
    want = cross_entropy64(l1, m).mean() + cross_entropy64(l2, m).mean()
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(q_mean, (softmax64(l1) @ z).mean(), rtol=1e-5)
    grads = jax.grad(
        lambda l: distributional.twin_cross_entropy(l, jnp.float32(l2), jnp.float32(m))
    )(jnp.float32(l1))  # d CE / d logits = (softmax - m) / B
    np.testing.assert_allclose(grads, (softmax64(l1) - m) / 6, atol=1e-6)


def test_td3_actor_reads_the_min_of_the_expected_values():
    z = jnp.linspace(0.0, 4.0, 5)
    logits = (jnp.log(jnp.array([[0.0, 0, 1, 0, 0]]) + 1e-30), jnp.log(jnp.eye(5)[3][None] + 1e-30))
    values = distributional.twin_values(lambda p, o, a: logits, z)
    actor = lambda params, obs: jnp.zeros((1, 1))
    batch = {"obs": jnp.zeros((1, 1))}
    loss = td3.actor_loss(actor, values, None, None, batch, jnp.minimum)
    np.testing.assert_allclose(loss, -2.0, rtol=1e-5)  # -min(E1 = 2, E2 = 3)


# ---------------------------------------------------------------- n-step returns


def test_n_step_transitions_stop_at_termination_and_bootstrap_at_truncation():
    """A window of n = 3 steps of three envs, gamma 0.5, rewards (1, 2, 4): env 0 runs on
    (R = 1 + 1 + 1 = 3, bootstrap from final_obs of step 2, d = 0.125); env 1 terminates at step 1
    (R = 2, no bootstrap); env 2 is truncated at step 0 (R = 1, bootstraps from its pre-reset
    final_obs with d = 0.5)."""
    flags = lambda *rows: jnp.array(rows, bool).T  # [envs, n] from rows of steps
    final_obs = jnp.arange(9, dtype=jnp.float32).reshape(3, 3, 1) + 100  # env e, step t: 100+3e+t
    window = {
        "obs": jnp.zeros((3, 3, 1)),
        "action": jnp.ones((3, 3, 1)),
        "reward": jnp.tile(jnp.array([1.0, 2.0, 4.0]), (3, 1)),
        "final_obs": final_obs,
        "terminated": flags([False, False, False], [False, True, False], [False, False, False]),
        "truncated": flags([False, False, True], [False, False, False], [False, False, False]),
    }
    out = fast_recipe.n_step_transitions(window, 0.5, backend="reference")
    np.testing.assert_allclose(out["reward"], [3.0, 2.0, 1.0])
    np.testing.assert_array_equal(out["bootstrap_steps"], [3, 2, 1])
    np.testing.assert_array_equal(out["terminated"], [False, True, False])
    np.testing.assert_allclose(out["next_obs"][:, 0], [102.0, 104.0, 106.0])
    np.testing.assert_allclose(fast_recipe.bootstrap_discount(0.5, out), [0.125, 0.0, 0.5])
    one_step = {"terminated": jnp.array([False, True])}
    np.testing.assert_allclose(fast_recipe.bootstrap_discount(0.5, one_step), [0.5, 0.0])


def buffer_after(config, steps):
    trainer = td3.make_trainer(config)
    hp = hyperparams(config.agent)
    state, _ = jax.jit(trainer.run, static_argnums=2)(
        jax.jit(trainer.init)(jax.random.PRNGKey(3), hp), hp, steps // config.agent.log_interval
    )
    return state


def test_n_step_buffer_of_the_loop_sums_its_one_step_buffer_and_stops_at_truncation():
    """Before learning_starts both runs take the same random actions: the n = 3 buffer's item t is
    the discounted sum of the one-step items t..t+2, cut at Pendulum's time limit (step 199 of
    each episode), where it bootstraps from that step's final_obs."""
    common = dict(total_steps=210, log_interval=210, learning_starts=10_000, eval_episodes=0)
    one = buffer_after(make_config(**common), 210).buffer.data
    three = buffer_after(make_config(n_step=3, **common), 210)
    assert int(three.buffer.size) == 208
    data, gamma = three.buffer.data, 0.98
    r = np.asarray(one["reward"], np.float64)
    for t in (0, 150, 196, 197, 198, 199, 200):
        steps = min(3, 200 - t) if t < 200 else 3  # the episode ends after step 199
        np.testing.assert_allclose(
            data["reward"][t], sum(gamma**k * r[t + k] for k in range(steps)), rtol=1e-5
        )
        assert int(data["bootstrap_steps"][t]) == steps and not bool(data["terminated"][t])
        np.testing.assert_array_equal(data["next_obs"][t], one["next_obs"][t + steps - 1])
        np.testing.assert_array_equal(data["obs"][t], one["obs"][t])
        np.testing.assert_array_equal(data["action"][t], one["action"][t])


# ---------------------------------------------------------------- observation normalisation


def test_observation_statistics_are_those_of_every_collected_observation():
    """state.obs_stats after 40 steps of 4 envs: the mean and variance of the 160 observations the
    envs presented (the buffer's obs), merged with the prior (mean 0, var 1, count 1e-4)."""
    config = make_config(
        normalize_obs=True, num_envs=4, total_steps=160, log_interval=160, eval_episodes=0,
        learning_starts=10_000, utd_ratio=0.25,
    )  # fmt: skip
    state = buffer_after(config, 160)
    x = np.asarray(state.buffer.data["obs"][:160], np.float64)
    n, prior = len(x), 1e-4
    mean = x.sum(0) / (n + prior)
    var = (prior + ((x - x.mean(0)) ** 2).sum(0) + x.mean(0) ** 2 * prior * n / (n + prior)) / (
        n + prior
    )
    np.testing.assert_allclose(state.obs_stats["count"], n + prior, rtol=1e-6)
    np.testing.assert_allclose(state.obs_stats["mean"], mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(state.obs_stats["var"], var, rtol=1e-4)
    batch = fast_recipe.normalized_batch(
        {"obs": x[:5], "next_obs": x[5:10], "reward": np.ones(5)}, state.obs_stats, 10.0
    )
    np.testing.assert_allclose(batch["obs"], (x[:5] - mean) / np.sqrt(var + 1e-8), rtol=1e-4)
    assert batch["reward"] is not None and fast_recipe.normalized_batch(batch, None, 1.0) is batch
    assert fast_recipe.initial_obs_stats(make_config().agent, x[0]) is None
    np.testing.assert_allclose(
        observation_norm.normalize_observation(jnp.float32([50.0]), state.obs_stats, 10.0)[0]
        <= 10.0,
        True,
    )


# ---------------------------------------------------------------- config errors


@pytest.mark.parametrize("name", ["td3", "sac"])
@pytest.mark.parametrize(
    "agent, extra, message",
    [
        ({"v_min": 5.0, "v_max": 5.0}, None, r"agent.v_min \(5.0\) must be below agent.v_max"),
        ({"num_atoms": 1}, None, "agent.num_atoms: 1 is out of range"),
        ({"n_step": 0}, None, "agent.n_step: 0 is out of range"),
        ({"obs_clip": 0.0}, None, "agent.obs_clip: 0.0 is out of range"),
        (
            {"distributional": True, "target_networks": False,
             "network": {"hidden": [32, 32], "batch_renorm": True}},
            None,
            "agent.distributional: the distributional critics bootstrap from target critics",
        ),
    ],
)  # fmt: skip
def test_config_errors_name_the_key(name, agent, extra, message):
    with pytest.raises(ConfigError, match=message):
        make_config(name, extra=extra, **agent)


@pytest.mark.parametrize("name", ["td3", "sac"])
def test_forcing_the_fused_critics_with_a_distributional_critic_is_an_error(name):
    """A kernel backend named in the config with agent.fused_network on asks for the fused critics,
    which hold scalar heads; the automatic backend (or fused_network off) takes XLA."""
    interpret = {"kernels": {"backend": "interpret"}}
    with pytest.raises(ConfigError, match="agent.fused_network: the fused twin-critic kernels"):
        make_config(name, extra=interpret, distributional=True)
    make_config(name, extra=interpret, distributional=True, fused_network=False)
    auto = make_config(name, distributional=True)
    learning = {"td3": td3, "sac": sac}[name].make_learning(auto, *environment.make_env(auto))
    assert (learning.fused if name == "td3" else learning[1]) is None


def test_distributional_sac_needs_box_actions_and_policies_need_their_statistics():
    with pytest.raises(ConfigError, match="agent.distributional needs Box actions"):
        make_config("sac", env="CartPole-v1", distributional=True)
    make_config("sac", env="CartPole-v1", n_step=3)  # n-step returns take discrete actions too
    with pytest.raises(ConfigError, match="agent.normalize_obs: the saved policy params"):
        td3.make_policy(make_config(normalize_obs=True))
    with pytest.raises(ConfigError, match="agent.n_step runs in the one-program loop only"):
        load_config("configs/td3_sebulba_pendulum.yaml", ["agent.n_step=3"])


# ---------------------------------------------------------------- whole runs


@pytest.mark.parametrize("name", ["td3", "sac"])
def test_the_same_seed_gives_the_same_run(name):
    config = make_config(name, num_envs=2, normalize_obs=True, **FAST)
    train = jax.jit(({"td3": td3, "sac": sac}[name]).make_train(config))
    (state_a, metrics_a), (state_b, metrics_b) = (train(jax.random.PRNGKey(5)) for _ in range(2))
    for a, b in zip(jax.tree.leaves((state_a, metrics_a)), jax.tree.leaves((state_b, metrics_b))):
        np.testing.assert_array_equal(a, b)
    assert np.all(np.isfinite(np.asarray(metrics_a["critic_loss"])[1:]))
    assert int(state_a.buffer.size) == 2000 - 2 * 2  # n - 1 steps of each env not yet stored


@pytest.mark.slow
@pytest.mark.parametrize("name", ["td3", "sac"])
def test_fast_recipe_learns_pendulum(name):
    """configs/fasttd3_pendulum.yaml's recipe (distributional critics, 3-step returns, observation
    normalisation, 4 envs, 2 gradient steps per step of all envs) for 6k env steps on 2 seeds, in
    TD3 and in SAC (FastSAC): the greedy return ends far above a random policy's (about -1200).
    About 3 CPU minutes each (5 min wall on the loaded 2-core machine)."""
    shipped = load_config("configs/fasttd3_pendulum.yaml").agent
    recipe = {key: getattr(shipped, key) for key in (
        "num_envs", "utd_ratio", "batch_size", "lr", "gamma", "tau", "distributional", "num_atoms",
        "v_min", "v_max", "n_step", "normalize_obs",
    )}  # fmt: skip
    config = make_config(
        name, **{**recipe, "total_steps": 6000, "learning_starts": 1000, "eval_episodes": 4,
                 "network": {"hidden": [128, 128]}},
    )  # fmt: skip
    keys = jnp.stack([jax.random.PRNGKey(1), jax.random.PRNGKey(2)])
    module = {"td3": td3, "sac": sac}[name]
    _, metrics = jax.jit(jax.vmap(module.make_train(config)))(keys)
    eval_return = np.asarray(metrics["eval_return"])
    assert np.all(eval_return[:, -1] > -400), eval_return
