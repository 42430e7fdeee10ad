"""Wrappers: vectorize, episode statistics across auto-resets, observation/reward normalisation over
the right axes under a batch of envs, action clipping/rescaling, observation masking,
and their composition."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnasium.wrappers.utils import RunningMeanStd
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs.core import Env
from envs.spaces import Box, Discrete
from envs.wrappers import (
    ClipAction,
    EpisodeStatistics,
    MaskObservation,
    NormalizeObservation,
    NormalizeReward,
    RescaleAction,
    RunningMeanVar,
    unwrap_state,
    vectorize,
)


def run(env, params, key, num_steps, policy):
    """reset + `num_steps` steps of `policy(key, obs)` in one jitted scan; returns
    (first obs, per-step outputs)."""

    @jax.jit
    def go(key):
        reset_key, scan_key = jax.random.split(key)
        obs, state = env.reset(reset_key, params)

        def body(carry, key):
            obs, state = carry
            action_key, step_key = jax.random.split(key)
            obs, state, reward, terminated, truncated, info = env.step(
                step_key, state, policy(action_key, obs), params
            )
            return (obs, state), (obs, state, reward, terminated, truncated, info)

        return obs, jax.lax.scan(body, (obs, state), jax.random.split(scan_key, num_steps))[1]

    return jax.tree.map(np.asarray, go(key))


def uniform_policy(space, num_envs=None):
    def policy(key, obs):
        if num_envs is None:
            return space.sample(key)
        return jax.vmap(space.sample)(jax.random.split(key, num_envs))

    return policy


# --- vectorize -----------------------------------------------------------------------------------


def test_vectorize_shapes_and_independent_keys():
    env, params = envs.make("CartPole-v1")
    venv = vectorize(env, 5)
    obs, state = venv.reset(jax.random.key(0), params)
    assert obs.shape == (5, 4) and state.x.shape == (5,) and venv.num_envs == 5
    assert len({tuple(np.asarray(o)) for o in obs}) == 5  # every env drew its own initial state
    keys = jax.random.split(jax.random.key(0), 5)
    np.testing.assert_array_equal(obs, jax.vmap(env.reset, in_axes=(0, None))(keys, params)[0])
    actions = jnp.array([0, 1, 0, 1, 1])
    out = jax.jit(venv.step)(jax.random.key(1), state, actions, params)
    assert (
        out[0].shape == (5, 4)
        and out[2].shape == (5,)
        and out[3].shape == (5,)
        and out[5]["final_obs"].shape == (5, 4)
    )
    for i in range(5):
        single = env.step(
            jax.random.split(jax.random.key(1), 5)[i],
            jax.tree.map(lambda x: x[i], state),
            actions[i],
            params,
        )
        np.testing.assert_allclose(out[0][i], single[0], rtol=1e-6)


def test_vectorize_checks_the_action_batch():
    env, params = envs.make("MountainCar-v0")
    venv = vectorize(env, 3)
    _, state = venv.reset(jax.random.key(0), params)
    with pytest.raises(ValueError, match=r"actions must have shape \(3,\).*got shape \(4,\)"):
        venv.step(jax.random.key(0), state, jnp.zeros(4, jnp.int32), params)
    with pytest.raises(ValueError, match=r"actions \[5\] are outside Discrete\(3\)"):
        venv.step(jax.random.key(0), state, jnp.array([0, 5, 1]), params)
    with pytest.raises(
        ValueError, match="must be an integer"
    ):  # the per-env check still runs under vmap
        jax.jit(venv.step)(jax.random.key(0), state, jnp.zeros(3, jnp.float32), params)
    with pytest.raises(ValueError, match="num_envs must be >= 1"):
        vectorize(env, 0)


# --- episode statistics --------------------------------------------------------------------------


def reference_episode_stats(rewards, dones):
    """NumPy: per step, the return/length of the last episode that ended (0 before any ended)."""
    ret, length = np.zeros(rewards.shape[1:]), np.zeros(rewards.shape[1:], int)
    last_ret, last_len = np.zeros_like(ret), np.zeros_like(length)
    out_ret, out_len = [], []
    for r, d in zip(rewards, dones):
        ret, length = ret + r, length + 1
        last_ret, last_len = np.where(d, ret, last_ret), np.where(d, length, last_len)
        ret, length = np.where(d, 0, ret), np.where(d, 0, length)
        out_ret.append(last_ret.copy())
        out_len.append(last_len.copy())
    return np.array(out_ret), np.array(out_len)


@pytest.mark.parametrize("order", ["stats_outside", "stats_inside"])
def test_episode_statistics_match_a_reference_across_auto_resets(order):
    env, params = envs.make(
        "CartPole-v1", max_steps_in_episode=30
    )  # both terminations and truncations
    n = 6
    stacked = (
        EpisodeStatistics(vectorize(env, n))
        if order == "stats_outside"
        else vectorize(EpisodeStatistics(env), n)
    )
    _, (obs, state, reward, terminated, truncated, info) = run(
        stacked, params, jax.random.key(0), 400, uniform_policy(env.action_space(params), n)
    )
    done = terminated | truncated
    assert terminated.sum() > 20 and truncated.sum() > 0
    np.testing.assert_array_equal(info["episode_done"], done)
    ref_ret, ref_len = reference_episode_stats(reward, done)
    np.testing.assert_allclose(info["episode_return"], ref_ret)
    np.testing.assert_array_equal(info["episode_length"], ref_len)
    # CartPole pays 1 per step: every finished episode's return equals its length, at most 30
    np.testing.assert_array_equal(info["episode_return"][done], info["episode_length"][done])
    assert info["episode_length"][done].max() == 30
    # the lengths of the ended episodes add up to the steps taken before each env's last episode end
    for i in range(n):
        ends = np.flatnonzero(done[:, i])
        assert info["episode_length"][ends, i].sum() == ends[-1] + 1


def test_episode_statistics_known_episode_lengths():
    env, params = envs.make("GridWorld", size=3, max_steps_in_episode=5)
    stats_env = EpisodeStatistics(env)
    _, state = stats_env.reset(jax.random.key(0), params)
    # episode 1: 4 steps to the goal (return 1); episode 2: 5 steps right into the wall
    # (truncated, return 0)
    actions = [1, 1, 2, 2] + [0] * 5 + [1]
    seen = []
    for t, a in enumerate(actions):
        _, state, _, _, _, info = stats_env.step(jax.random.key(t), state, jnp.int32(a), params)
        seen.append(
            (bool(info["episode_done"]), float(info["episode_return"]), int(info["episode_length"]))
        )
    assert seen == [(False, 0.0, 0)] * 3 + [(True, 1.0, 4)] + [(False, 1.0, 4)] * 4 + [
        (True, 0.0, 5),
        (False, 0.0, 5),
    ]


# --- running statistics --------------------------------------------------------------------------


def test_running_mean_var_matches_gymnasium_running_mean_std():
    rng = np.random.default_rng(0)
    ours, theirs = RunningMeanVar.create((3,)), RunningMeanStd(shape=(3,))
    for _ in range(20):
        batch = rng.normal([1.0, -5.0, 100.0], [0.1, 2.0, 30.0], (16, 3))
        ours = ours.update(jnp.asarray(batch), 1)
        theirs.update(batch)
    np.testing.assert_allclose(ours.mean, theirs.mean, rtol=1e-5)
    np.testing.assert_allclose(ours.var, theirs.var, rtol=1e-4)
    np.testing.assert_allclose(ours.count, theirs.count, rtol=1e-6)
    single = RunningMeanVar.create(()).update(jnp.float32(2.0), 0)  # one sample, no batch axis
    np.testing.assert_allclose([single.mean, single.count], [2.0 / (1 + 1e-4), 1 + 1e-4], rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    scale=st.floats(1e-2, 1e2),
    offset=st.floats(-1e2, 1e2),
)
def test_running_mean_var_is_independent_of_how_the_data_is_batched(sizes, scale, offset):
    """Merging batches one by one gives the statistics of all the data at once
    (up to the 1e-4 prior)."""
    rng = np.random.default_rng(len(sizes))
    data = rng.normal(offset, scale, (sum(sizes), 2))
    stats = RunningMeanVar.create((2,))
    start = 0
    for size in sizes:
        stats = stats.update(jnp.asarray(data[start : start + size]), 1)
        start += size
    n = len(data)
    prior = 1e-4  # the initial (mean 0, var 1) pseudo-sample's weight
    mean = data.sum(0) / (n + prior)
    var = (((data - mean) ** 2).sum(0) + prior * (1.0 + mean**2)) / (n + prior)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-4, atol=1e-4 * scale)
    np.testing.assert_allclose(stats.var, var, rtol=2e-3, atol=1e-5 * scale**2)
    assert float(stats.count) == pytest.approx(n + prior)


# --- observation normalisation -------------------------------------------------------------------


def test_normalize_observation_statistics_are_over_the_batch_of_envs():
    env, params = envs.make(
        "MountainCar-v0"
    )  # features on very different scales (position ~0.5, velocity ~0.01)
    n, steps = 8, 60
    wrapped = NormalizeObservation(EpisodeStatistics(vectorize(env, n)), clip=None)
    raw = EpisodeStatistics(vectorize(env, n))
    policy = uniform_policy(env.action_space(params), n)
    first, (obs, state, *_rest) = run(wrapped, params, jax.random.key(0), steps, policy)
    raw_first, (raw_obs, *_raw_rest) = run(raw, params, jax.random.key(0), steps, policy)
    stats = state.obs_stats
    assert stats.mean.shape == (steps, 2) and stats.var.shape == (
        steps,
        2,
    )  # per step of the scan: (2,) each
    # gymnasium's RunningMeanStd fed the same batches (reset batch, then each step's batch of 8)
    reference = RunningMeanStd(shape=(2,))
    reference.update(raw_first)
    for t in range(steps):
        reference.update(raw_obs[t])
        np.testing.assert_allclose(stats.mean[t], reference.mean, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(stats.var[t], reference.var, rtol=1e-3, atol=1e-9)
        expected = (raw_obs[t] - reference.mean) / np.sqrt(reference.var + 1e-8)
        np.testing.assert_allclose(obs[t], expected, rtol=1e-3, atol=2e-3)
    assert stats.count[-1] == pytest.approx(n * (steps + 1) + 1e-4)
    # each feature is standardised separately: over all envs and steps,
    # mean ~0 and std ~1 per feature
    all_raw = np.concatenate([raw_first[None], raw_obs]).reshape(-1, 2)
    standardised = (all_raw - stats.mean[-1]) / np.sqrt(stats.var[-1] + 1e-8)
    np.testing.assert_allclose(standardised.mean(0), 0.0, atol=1e-3)
    # (the prior's weight 1e-4 at var 1 is visible on the velocity, whose variance is ~3e-5: ~0.4%)
    np.testing.assert_allclose(standardised.std(0), 1.0, atol=1e-2)
    assert abs(stats.mean[-1][0]) > 100 * abs(stats.mean[-1][1])  # not one mean across the features


def test_normalize_observation_shares_one_statistic_across_envs():
    env, params = envs.make("CartPole-v1")
    wrapped = NormalizeObservation(vectorize(env, 4))
    obs, state = wrapped.reset(jax.random.key(0), params)
    assert (
        obs.shape == (4, 4)
        and state.obs_stats.mean.shape == (4,)
        and state.obs_stats.count.shape == ()
    )
    raw_obs = vectorize(env, 4).reset(jax.random.key(0), params)[0]
    np.testing.assert_allclose(
        state.obs_stats.mean, np.asarray(raw_obs).mean(0) * 4 / (4 + 1e-4), rtol=1e-4
    )
    obs, state, _, _, _, info = wrapped.step(
        jax.random.key(1), state, jnp.array([0, 1, 1, 0]), params
    )
    assert float(state.obs_stats.count) == pytest.approx(8 + 1e-4)
    assert unwrap_state(wrapped, state)[1].x.shape == (
        4,
    )  # the vectorised CartPole state, batch axis kept
    # each env wrapped before vectorising: per-env statistics instead
    per_env = vectorize(NormalizeObservation(env), 4)
    _, per_state = per_env.reset(jax.random.key(0), params)
    assert per_state.obs_stats.mean.shape == (4, 4)
    np.testing.assert_allclose(
        per_state.obs_stats.mean, np.asarray(raw_obs) / (1 + 1e-4), rtol=1e-4
    )


def test_normalize_observation_final_obs_uses_the_same_statistics():
    env, params = envs.make("CartPole-v1", max_steps_in_episode=3)
    raw, wrapped = vectorize(env, 2), NormalizeObservation(vectorize(env, 2), clip=None)
    _, raw_state = raw.reset(jax.random.key(0), params)
    _, state = wrapped.reset(jax.random.key(0), params)
    for t in range(3):
        action = jnp.array([t % 2, 1])
        raw_out = raw.step(jax.random.key(t), raw_state, action, params)
        out = wrapped.step(jax.random.key(t), state, action, params)
        raw_state, state = raw_out[1], out[1]
        stats = state.obs_stats
        expected = (np.asarray(raw_out[5]["final_obs"]) - stats.mean) / np.sqrt(stats.var + 1e-8)
        np.testing.assert_allclose(out[5]["final_obs"], expected, rtol=1e-5, atol=1e-5)
    assert bool(out[4].all())  # truncated on the third step: final_obs differs from the reset obs
    assert not np.allclose(out[5]["final_obs"], out[0])


def test_normalize_observation_frozen_and_clipped():
    env, params = envs.make("Pendulum-v1")
    frozen = NormalizeObservation(vectorize(env, 3), update=False, clip=0.5)
    obs, state = frozen.reset(jax.random.key(0), params)
    state = state.replace(
        obs_stats=RunningMeanVar(mean=jnp.zeros(3), var=jnp.full(3, 4.0), count=jnp.float32(10.0))
    )
    obs, state, *_ = frozen.step(jax.random.key(1), state, jnp.zeros((3, 1)), params)
    raw_obs = unwrap_state(frozen, state)[1]
    assert float(state.obs_stats.count) == 10.0
    np.testing.assert_allclose(
        obs[:, 2], np.clip(np.asarray(raw_obs.theta_dot) / 2.0, -0.5, 0.5), rtol=1e-5
    )
    with pytest.raises(ValueError, match="Box observation space"):
        NormalizeObservation(envs.make("GridWorld")[0])


@struct.dataclass
class NoiseState:
    time: jax.Array


@struct.dataclass
class NoiseParams:
    max_steps_in_episode: int = 1000


class ImageNoise(Env):
    """Images [6, 5, 3] of independent pixels, channel c ~ N(MEANS[c], STDS[c]^2):
    per-channel statistics."""

    name = "ImageNoise"
    default_params = NoiseParams()
    MEANS, STDS = np.array([1.0, -2.0, 10.0]), np.array([0.5, 2.0, 0.1])

    def image(self, key):
        return jnp.asarray(self.MEANS, jnp.float32) + jnp.asarray(
            self.STDS, jnp.float32
        ) * jax.random.normal(key, (6, 5, 3))

    def reset_env(self, key, params):
        return self.image(key), NoiseState(jnp.int32(0))

    def step_env(self, key, state, action, params):
        return self.image(key), NoiseState(state.time + 1), jnp.float32(0.0), jnp.bool_(False), {}

    def observation_space(self, params):
        return Box(-np.inf, np.inf, (6, 5, 3))

    def action_space(self, params):
        return Discrete(2)


def test_normalize_observation_is_per_channel_for_images():
    env, params, n, steps = ImageNoise(), NoiseParams(), 4, 30
    wrapped = NormalizeObservation(vectorize(env, n), clip=None)
    assert wrapped.per_channel  # the default for rank-3 (image) observations
    raw = vectorize(env, n)
    policy = uniform_policy(env.action_space(params), n)
    first, (obs, state, *_rest) = run(wrapped, params, jax.random.key(0), steps, policy)
    raw_first, (raw_obs, *_raw_rest) = run(raw, params, jax.random.key(0), steps, policy)
    stats = state.obs_stats
    assert stats.mean.shape == (
        steps,
        3,
    )  # one mean and variance per channel (per step of the scan)
    # gymnasium's RunningMeanStd fed every pixel of each batch as a sample of its channel
    reference = RunningMeanStd(shape=(3,))
    reference.update(raw_first.reshape(-1, 3))
    for t in range(steps):
        reference.update(raw_obs[t].reshape(-1, 3))
        np.testing.assert_allclose(stats.mean[t], reference.mean, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(stats.var[t], reference.var, rtol=1e-3, atol=1e-6)
        np.testing.assert_allclose(
            obs[t],
            (raw_obs[t] - reference.mean) / np.sqrt(reference.var + 1e-8),
            rtol=1e-3,
            atol=2e-3,
        )
    assert stats.count[-1] == pytest.approx(n * 6 * 5 * (steps + 1) + 1e-4)
    np.testing.assert_allclose(stats.mean[-1], ImageNoise.MEANS, atol=0.05)
    np.testing.assert_allclose(np.sqrt(stats.var[-1]), ImageNoise.STDS, rtol=0.05)
    standardised = obs[-1].reshape(-1, 3)
    np.testing.assert_allclose(standardised.mean(0), 0.0, atol=0.3)
    np.testing.assert_allclose(standardised.std(0), 1.0, atol=0.2)
    # per feature on request: statistics of the image's shape
    _, per_pixel = NormalizeObservation(vectorize(env, n), per_channel=False).reset(
        jax.random.key(0), params
    )
    assert per_pixel.obs_stats.mean.shape == (6, 5, 3)
    assert not NormalizeObservation(envs.make("CartPole-v1")[0]).per_channel
    with pytest.raises(ValueError, match=r"per_channel=True\) needs observations of rank >= 2"):
        NormalizeObservation(envs.make("CartPole-v1")[0], per_channel=True)


# --- reward scaling ------------------------------------------------------------------------------


def reference_normalized_rewards(rewards, terminated, truncated, gamma, epsilon=1e-8):
    """gymnasium's vector NormalizeReward (same-step autoreset) in NumPy, float64."""
    rms = RunningMeanStd(shape=())
    g = np.zeros(rewards.shape[1])
    out = []
    for r, term, trunc in zip(rewards, terminated, truncated):
        g = g * gamma * (1 - term) + r
        rms.update(g)
        out.append(r / np.sqrt(rms.var + epsilon))
        g[term | trunc] = 0.0
    return np.array(out)


def test_normalize_reward_matches_gymnasiums_rule():
    env, params = envs.make("Pendulum-v1", max_steps_in_episode=40)
    n = 5
    stacked = NormalizeReward(EpisodeStatistics(vectorize(env, n)), gamma=0.9)
    raw = EpisodeStatistics(vectorize(env, n))
    policy = uniform_policy(env.action_space(params), n)
    _, (_, state, scaled, terminated, truncated, info) = run(
        stacked, params, jax.random.key(0), 120, policy
    )
    _, (_, _, raw_reward, *_r) = run(raw, params, jax.random.key(0), 120, policy)
    assert truncated.sum() == 3 * n
    expected = reference_normalized_rewards(raw_reward, terminated, truncated, gamma=0.9)
    np.testing.assert_allclose(scaled, expected, rtol=2e-4)
    # episode statistics inside still report the env's own (raw) returns
    done = truncated
    np.testing.assert_allclose(
        info["episode_return"][done], raw_reward.reshape(3, 40, n).sum(1).reshape(-1), rtol=1e-5
    )
    assert state.return_stats.var.shape == (120,) and state.discounted_return.shape == (120, n)
    assert not np.allclose(scaled, raw_reward)


def test_normalize_reward_rejects_bad_gamma():
    with pytest.raises(ValueError, match="gamma must be in"):
        NormalizeReward(envs.make("Pendulum-v1")[0], gamma=1.5)


# --- action clipping and rescaling ---------------------------------------------------------------


def test_clip_action():
    env, params = envs.make("MountainCarContinuous-v0")
    clipped = ClipAction(env)
    assert np.isinf(clipped.action_space(params).to_gymnasium().high).all()
    _, state = env.reset(jax.random.key(0), params)
    reward_clipped = clipped.step(jax.random.key(1), state, jnp.array([3.0]), params)[2]
    reward_raw = env.step(jax.random.key(1), state, jnp.array([3.0]), params)[2]
    np.testing.assert_allclose(
        [reward_clipped, reward_raw], [-0.1, -0.9], rtol=1e-6
    )  # the penalty of the clipped action
    with pytest.raises(ValueError, match="Box \\(continuous\\) action space"):
        ClipAction(envs.make("CartPole-v1")[0])


def test_rescale_action_maps_the_unit_box_onto_the_env_bounds():
    env, params = envs.make("Pendulum-v1")  # torque in [-2, 2]
    rescaled = RescaleAction(env, low=0.0, high=1.0)
    assert rescaled.action_space(params).to_gymnasium().low[0] == 0.0
    _, state = env.reset(jax.random.key(0), params)
    for agent_action, torque in [(0.0, -2.0), (0.25, -1.0), (1.0, 2.0), (7.0, 2.0)]:
        out = rescaled.step(jax.random.key(1), state, jnp.array([agent_action]), params)
        assert float(out[1].last_u) == pytest.approx(torque)
    # vectorised and jitted: elementwise over the batch
    venv = RescaleAction(vectorize(env, 3))
    _, vstate = venv.reset(jax.random.key(0), params)
    out = jax.jit(venv.step)(jax.random.key(1), vstate, jnp.array([[-1.0], [0.0], [0.5]]), params)
    np.testing.assert_allclose(out[1].last_u, [-2.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="low < high"):
        RescaleAction(env, low=1.0, high=1.0)


# --- observation masking -------------------------------------------------------------------------


@pytest.mark.parametrize("env_id, keep", [("CartPole-v1", [0, 2]), ("Pendulum-v1", [0, 1])])
def test_mask_observation_positions_hide_the_velocities(env_id, keep):
    """'positions' keeps CartPole's [x, theta] and Pendulum's [cos, sin]: every observation, reset
    and final_obs included, is the unmasked env's at those indices under the same keys (to float32
    round-off); rewards and episode ends are the same; the space is cut alike."""
    env, params = envs.make(env_id)
    masked = MaskObservation(env, "positions")
    assert masked.keep == tuple(keep)
    full_space, space = env.observation_space(params), masked.observation_space(params)
    assert space.shape == (len(keep),)
    np.testing.assert_array_equal(space._low, full_space._low[keep])
    np.testing.assert_array_equal(space._high, full_space._high[keep])
    policy = uniform_policy(env.action_space(params), 3)
    first, (obs, _, reward, terminated, truncated, info) = run(
        vectorize(env, 3), params, jax.random.key(0), 250, policy
    )
    m_first, (m_obs, _, m_reward, m_terminated, m_truncated, m_info) = run(
        vectorize(masked, 3), params, jax.random.key(0), 250, policy
    )
    # to float32 round-off: XLA may fuse the masked env's dynamics differently (on one 16-core CPU
    # 18 of 1,500 values differed in the last bit)
    close = dict(rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(m_first, first[..., keep], **close)
    np.testing.assert_allclose(m_obs, obs[..., keep], **close)
    np.testing.assert_allclose(m_info["final_obs"], info["final_obs"][..., keep], **close)
    np.testing.assert_array_equal(m_reward, reward)
    np.testing.assert_array_equal(m_terminated | m_truncated, terminated | truncated)
    assert (terminated | truncated).any()  # final_obs differs from obs somewhere
    assert not np.array_equal(m_info["final_obs"], m_obs)


def test_mask_observation_index_list_step_env_and_render():
    env, params = envs.make("CartPole-v1")
    masked = MaskObservation(env, [3, 1])  # any order, any subset
    obs, state = masked.reset_env(jax.random.key(0), params)
    full_obs, full_state = env.reset_env(jax.random.key(0), params)
    np.testing.assert_array_equal(obs, full_obs[jnp.array([3, 1])])
    obs, state, reward, terminated, info = masked.step_env(jax.random.key(1), state, 1, params)
    np.testing.assert_array_equal(
        obs, env.step_env(jax.random.key(1), full_state, 1, params)[0][jnp.array([3, 1])]
    )
    assert masked.render(state, params).shape == env.render(state, params).shape
    assert "keep=[3, 1]" in repr(masked)


@pytest.mark.parametrize(
    "env_id, keep, message",
    [
        ("CartPole-v1", [0, 4], "distinct indices in \\[0, 4\\)"),
        ("CartPole-v1", [0, 0], "distinct"),
        ("CartPole-v1", [], "distinct"),
        ("CartPole-v1", [True], "distinct"),
        ("CartPole-v1", "velocities", "'positions'"),
        ("GridWorld", "positions", "flat Box"),
    ],
)
def test_mask_observation_rejects_bad_choices(env_id, keep, message):
    with pytest.raises(ValueError, match=message):
        MaskObservation(envs.make(env_id)[0], keep)


def test_mask_observation_under_the_training_stack():
    """Masking composes with the other wrappers and batches (obs and final_obs stay masked)."""
    env, params = envs.make("Pendulum-v1")
    stacked = EpisodeStatistics(vectorize(RescaleAction(MaskObservation(env)), 2))
    obs, state = stacked.reset(jax.random.key(0), params)
    obs, state, *_, info = jax.jit(stacked.step)(
        jax.random.key(1), state, jnp.zeros((2, 1)), params
    )
    assert obs.shape == (2, 2) and info["final_obs"].shape == (2, 2)
    np.testing.assert_allclose(
        np.sum(np.asarray(obs) ** 2, axis=-1), 1.0, rtol=1e-5
    )  # cos^2 + sin^2


# --- composition ---------------------------------------------------------------------------------


def test_full_stack_vmaps_over_seeds():
    env, params = envs.make("Pendulum-v1")
    n = 4
    stacked = NormalizeReward(
        NormalizeObservation(EpisodeStatistics(vectorize(ClipAction(env), n))), gamma=0.99
    )
    policy = uniform_policy(envs.spaces.Box(-3.0, 3.0, (1,)), n)

    seeds = jax.random.split(jax.random.key(0), 3)

    @jax.jit
    def many(keys):
        def one(key):
            obs, state = stacked.reset(key, params)

            def body(state, key):
                obs, state, reward, terminated, truncated, info = stacked.step(
                    key, state, policy(key, None), params
                )
                return state, (obs, reward, info["episode_return"], info["episode_done"])

            return jax.lax.scan(body, state, jax.random.split(key, 210))

        return jax.vmap(one)(keys)

    final_state, (obs, reward, episode_return, episode_done) = many(seeds)
    assert obs.shape == (3, 210, n, 3) and reward.shape == (3, 210, n)
    # each seed has its own statistics over its own n envs
    assert final_state.env_state.obs_stats.mean.shape == (3, 3)
    assert final_state.return_stats.var.shape == (3,)
    assert np.asarray(episode_done)[:, 199].all()  # every env truncated at 200 steps
    returns = np.asarray(episode_return)[:, 199]
    assert np.all(returns < 0) and np.all(returns > -16.3 * 200)
