"""Next-step resets under the actor-learner architecture (`arch.autoreset`): envs that reset in the
step after an episode's end (envpool's own reset, gymnasium's AutoresetMode.NEXT_STEP) record that
step as a reset step, and the losses leave it out. Checked here: the masked means and the masked
advantage normalisation against the unmasked ones over the kept rows (hand cases and hypothesis),
PPO's and PQN's learning from a rollout unchanged by whatever its reset steps hold (and changed
without the mask: the test can fail), an actor's reset steps on gymnasium's next-step vector env,
games' lengths without reset steps, and the config key."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sebulba import COUNTDOWN, SMALL

from rl.agents import ppo_variants
from rl.config import build_config, hyperparams
from rl.config.arch import autoreset_mode
from rl.config.parsing import ConfigError
from rl.core import losses, observation_norm
from rl.sebulba import learner as sebulba
from rl.sebulba.host_envs import Scores
from rl.sebulba.pieces import make_pieces


def config(env=COUNTDOWN, arch=None, agent=None, name="ppo"):
    data = {"env": {"id": env}, "agent": {"name": name, **SMALL, **(agent or {})}}
    return build_config({**data, "arch": {"name": "sebulba", **(arch or {})}})


# ---------------------------------------------------------------- masked means


def test_masked_mean_and_normalize_by_hand():
    x = jnp.array([1.0, 100.0, 3.0, -50.0])
    mask = jnp.array([True, False, True, False])
    assert float(losses.masked_mean(x, mask)) == 2.0
    assert float(losses.masked_mean(x, jnp.zeros(4, bool))) == 0.0  # no row kept: 0, not NaN
    np.testing.assert_allclose(losses.normalize(x, mask=mask)[::2], [-1.0, 1.0], rtol=1e-6)
    np.testing.assert_array_equal(losses.normalize(x, mask=None), losses.normalize(x))


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(2, 40),
    seed=st.integers(0, 2**16),
    coefficients=st.tuples(
        st.floats(0.05, 0.3), st.floats(0.05, 0.5), st.floats(0.0, 0.1), st.floats(0.1, 1.0)
    ),
    clip_value_loss=st.booleans(),
)
def test_masked_ppo_loss_is_the_loss_of_the_kept_rows(m, seed, coefficients, clip_value_loss):
    """ppo_loss with a mask, garbage in the masked rows, equals ppo_loss of the kept rows alone
    (float64 NumPy picks the rows); so does the masked advantage normalisation."""
    rng = np.random.default_rng(seed)
    rows = [rng.normal(size=m) for _ in range(7)]
    rows[1] = np.abs(rows[1])  # entropies
    keep = rng.random(m) < 0.7
    keep[rng.integers(m)] = True
    garbage = [np.where(keep, r, rng.normal(size=m) * 1e3) for r in rows]
    args = (*coefficients, clip_value_loss)
    kept = [jnp.asarray(r[keep], jnp.float32) for r in rows]
    want_total, want_stats = losses.ppo_loss(*kept, *args)
    got_total, got_stats = losses.ppo_loss(
        *(jnp.asarray(r, jnp.float32) for r in garbage), *args, mask=jnp.asarray(keep)
    )
    np.testing.assert_allclose(got_total, want_total, rtol=2e-5, atol=1e-5)
    for name in want_stats:
        np.testing.assert_allclose(got_stats[name], want_stats[name], rtol=2e-5, atol=1e-5)
    advantages = jnp.asarray(garbage[5], jnp.float32)
    np.testing.assert_allclose(
        np.asarray(losses.normalize(advantages, mask=jnp.asarray(keep)))[keep],
        losses.normalize(kept[5]),
        rtol=1e-4,
        atol=1e-5,
    )


# ---------------------------------------------------------------- learning ignores reset steps


def rollout_with_reset_steps(name, pieces, key, steps=16, envs=4):
    """A random rollout [steps, envs] of CartPole-shaped steps in which episodes end at random and
    every end is followed by a reset step (also where the end is the rollout's last step: the
    next rollout's first step resets; here none starts with one)."""
    k_obs, k_final, k_act, k_rew, k_end, k_trunc = jax.random.split(key, 6)
    shape = (steps, envs)
    obs = jax.random.normal(k_obs, (*shape, 4))
    final_obs = jnp.concatenate([obs[1:], jax.random.normal(k_final, (1, envs, 4))])
    ends_here = np.asarray(jax.random.uniform(k_end, shape) < 0.2)
    ended, reset_step = np.zeros(shape, bool), np.zeros(shape, bool)
    for t in range(steps):  # a reset step follows every end and ends nothing itself
        reset_step[t] = ended[t - 1] if t else False
        ended[t] = ends_here[t] & ~reset_step[t]
    truncated = ended & np.asarray(jax.random.uniform(k_trunc, shape) < 0.5)
    action = jax.random.randint(k_act, shape, 0, 2)
    reward = jnp.where(reset_step, 0.0, jax.random.uniform(k_rew, shape))
    columns = [obs, action]
    if name == "ppo":  # PPO records log pi(a|s)
        columns.append(jnp.full(shape, -0.69))
    ends = (reward, ended & ~truncated, truncated, final_obs)
    return pieces.transition(*columns, *ends, reset_step=reset_step)


def garbled(traj, key):
    """`traj` with its reset steps' obs, action, reward, final obs (and log-prob) replaced by
    other values: what a reset step holds must not matter."""
    mask = traj.reset_step
    changed = {}
    for name in ("obs", "final_obs", "action", "reward", "log_prob"):
        if name not in traj._fields:
            continue
        x = getattr(traj, name)
        key, sub = jax.random.split(key)
        if jnp.issubdtype(x.dtype, jnp.integer):
            other = 1 - x
        else:
            other = x + 3.0 * jax.random.normal(sub, x.shape)
        where = mask.reshape(mask.shape + (1,) * (x.ndim - 2))
        changed[name] = jnp.where(where, other, x)
    return traj._replace(**changed)


@pytest.mark.parametrize(
    "name, agent",
    [
        ("ppo", {}),
        ("ppo", {"recompute_advantages": True}),
        ("ppo", {"minibatch_advantages": True, "gae_horizon": 8, "clip_value_loss": False}),
        ("ppo", {"normalize_obs": True}),
        ("pqn", {}),
    ],
    ids=["ppo", "ppo-recompute", "ppo-segments", "ppo-normalize-obs", "pqn"],
)
def test_learning_ignores_what_reset_steps_hold(name, agent):
    cfg = config("gymnasium:CartPole-v1", {"autoreset": "next_step"}, agent, name)
    pieces = make_pieces(cfg)
    hparams = hyperparams(cfg.agent)
    params, opt_state, stored = pieces.init(jax.random.PRNGKey(0), hparams, np.zeros(4, np.float32))
    traj = rollout_with_reset_steps(name, pieces, jax.random.PRNGKey(1))
    assert 0 < int(traj.reset_step.sum()) < traj.reset_step.size
    other = garbled(traj, jax.random.PRNGKey(2))
    learn = jax.jit(pieces.learn)
    key = jax.random.PRNGKey(3)
    want, got = (
        learn(hparams, params, opt_state, stored, traj, key),
        learn(hparams, params, opt_state, stored, other, key),
    )
    for a, b in zip(jax.tree.leaves(want[:2]), jax.tree.leaves(got[:2])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    unmasked = lambda t: t._replace(reset_step=None)
    learned = learn(hparams, params, opt_state, stored, unmasked(traj), key)
    changed = learn(hparams, params, opt_state, stored, unmasked(other), key)
    differences = [
        float(jnp.abs(a - b).max())
        for a, b in zip(jax.tree.leaves(learned[0]), jax.tree.leaves(changed[0]))
    ]
    assert max(differences) > 1e-4  # without the mask the reset steps' contents are learned


@pytest.mark.parametrize("obs_shape", [(3,), (2, 2, 3)], ids=["flat", "image"])
def test_masked_observation_stats_are_those_of_the_kept_observations(obs_shape):
    """update_observation_stats with a mask equals the update with the kept observations alone
    (images: every pixel of a kept observation a sample of its channel); all left out: no
    change."""
    rng = np.random.default_rng(0)
    obs = rng.normal(2.0, 3.0, (5, 4, *obs_shape)).astype(np.float32)
    keep = rng.random((5, 4)) < 0.6
    obs_garbled = np.where(keep.reshape(keep.shape + (1,) * len(obs_shape)), obs, 1e6)
    stats = observation_norm.update_observation_stats(
        observation_norm.initial_observation_stats(obs_shape), obs[:2], obs_shape
    )
    want = observation_norm.update_observation_stats(stats, obs[keep], obs_shape)
    got = observation_norm.update_observation_stats(stats, obs_garbled, obs_shape, keep)
    for name in ("mean", "var", "count"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    none = observation_norm.update_observation_stats(stats, obs, obs_shape, np.zeros((5, 4), bool))
    for name in ("mean", "var", "count"):
        np.testing.assert_allclose(none[name], stats[name], rtol=1e-6)


def test_learners_of_both_reset_modes_share_a_process():
    """The learning programs are cached per setup, the reset mode part of it: a next-step learner
    after a same-step one (and back) compiles its own update for its rollout's columns."""
    for autoreset in ("same_step", "next_step", "same_step"):
        learner = sebulba.Learner(config(arch={"autoreset": autoreset}))
        state, rows = learner.run(learner.init(), num_updates=1)
        assert int(state.updates) == 1


# ---------------------------------------------------------------- an actor's reset steps


def test_an_actor_on_a_next_step_vector_env_records_its_reset_steps():
    """Countdown (tests/rl/test_sebulba.py: terminations at t = 3, time limits at t = 5) in
    gymnasium's next-step vector env: the step after every end is a reset step (reward 0, acting
    on the final obs), what a step reached is the next step's obs, and episodes are 3 and 5 steps
    long, reset steps not counted."""
    cfg = config(arch={"autoreset": "next_step", "actor_threads": 1}, agent={"num_steps": 13})
    assert autoreset_mode(cfg) == "next_step"
    pieces = make_pieces(cfg)
    key, device = jax.random.PRNGKey(0), jax.devices()[0]
    actor = sebulba.Actor(pieces, cfg, jax.jit(pieces.act), [0, 1, 2, 3], key, device)
    try:
        rollouts = [actor.rollout(pieces_params(cfg), k * 52) for k in range(3)]
    finally:
        actor.close()
    column = lambda name: np.concatenate([getattr(traj, name) for traj, _, _ in rollouts])
    obs, final_obs, reward = column("obs")[..., 0], column("final_obs")[..., 0], column("reward")
    terminated, truncated, reset = column("terminated"), column("truncated"), column("reset_step")
    ended = terminated | truncated
    np.testing.assert_array_equal(reset[1:], ended[:-1])
    assert ended[12::13][:2].any()  # an end in a rollout's last step, its reset in the next one
    np.testing.assert_array_equal(final_obs[:-1], obs[1:])
    np.testing.assert_array_equal(reward, np.where(reset, 0.0, 1.0))
    np.testing.assert_array_equal(final_obs[terminated], 3.0)
    np.testing.assert_array_equal(final_obs[truncated], 5.0)
    assert set(np.unique(obs[reset])) == {3.0, 5.0}  # a reset step acts on the final obs
    np.testing.assert_array_equal(final_obs[reset], 0.0)  # the next episode's first obs
    lengths = sorted({n for _, _, ls in rollouts for n in ls})
    assert lengths == [3, 5]


def pieces_params(cfg):
    pieces = make_pieces(cfg)
    hparams = hyperparams(cfg.agent)
    return pieces.init(jax.random.PRNGKey(0), hparams, np.zeros(1, np.float32))[0]


def test_scores_count_a_games_agent_steps_not_its_reset_steps():
    scores = Scores(2)
    no = np.zeros(2, bool)
    scores.add(np.array([1.0, 2.0]), np.array([True, False]), no, {})
    scores.add(np.array([0.0, 1.0]), no, no, {}, reset_step=np.array([True, False]))
    scores.add(np.array([5.0, 1.0]), np.array([True, True]), no, {}, reset_step=no)
    assert scores.take() == ([1.0, 5.0, 4.0], [1, 1, 3])


# ---------------------------------------------------------------- the config key


def test_autoreset_resolves_by_env_and_is_a_sebulba_setting():
    assert autoreset_mode(config("gymnasium:CartPole-v1")) == "same_step"
    assert autoreset_mode(config("gymnasium:CartPole-v1", {"autoreset": "next_step"})) == (
        "next_step"
    )
    anakin = build_config({"env": {"id": "CartPole-v1"}, "agent": {"name": "ppo"}})
    assert autoreset_mode(anakin) == "same_step"
    with pytest.raises(ConfigError, match=r"arch.autoreset is a setting of the actor-learner"):
        build_config(
            {
                "env": {"id": "CartPole-v1"},
                "agent": {"name": "ppo"},
                "arch": {"autoreset": "next_step"},
            }
        )
    with pytest.raises(ConfigError, match=r"arch.autoreset: 'next' is not one of"):
        config(arch={"autoreset": "next"})


def test_the_fused_ppo_gradient_is_not_used_with_reset_steps():
    cfg = config(
        "gymnasium:CartPole-v1", {"autoreset": "next_step"}, {"network": {"hidden": [16, 16]}}
    )
    reason = ppo_variants.fused_update_unfit_reason(cfg)
    assert reason is not None and "arch.autoreset: next_step" in reason
    same = config(
        "gymnasium:CartPole-v1", {"autoreset": "same_step"}, {"network": {"hidden": [16, 16]}}
    )
    assert ppo_variants.fused_update_unfit_reason(same) is None
