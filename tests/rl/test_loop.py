"""The shared training-loop pieces of rl/loop.py: the training env, schedules and exploration,
target-network updates, episode totals, the act-then-train phase and the scan over log points."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
import kernels
from envs.spaces import Box, Discrete
from envs.wrappers import EpisodeStatistics, RescaleAction
from rl import (
    collection,
    environment,
    episodes,
    exploration,
    log_points,
    loop,
    minibatches,
    optimizers,
)
from rl import logging as rl_logging
from rl.agents import ppo
from rl.config import EnvConfig, KernelsConfig, build_config


def env_config(env_id, **params):
    """The part of a Config that make_env reads (no agent needed)."""
    return SimpleNamespace(env=EnvConfig(id=env_id, params=params))


# ---------------------------------------------------------------- make_env


def test_make_env_rescales_box_actions_and_adds_episode_statistics():
    config = env_config("Pendulum-v1", max_steps_in_episode=3)
    env, params = environment.make_env(config)
    assert isinstance(env, EpisodeStatistics) and isinstance(env.env, RescaleAction)
    assert int(params.max_steps_in_episode) == 3  # env.params reach the env
    space = env.action_space(params)
    assert isinstance(space, Box) and float(space.low) == -1.0 and float(space.high) == 1.0
    raw, raw_params = envs.make("Pendulum-v1", max_steps_in_episode=3)
    key = jax.random.PRNGKey(0)
    obs, state = env.reset(key, params)
    raw_obs, raw_state = raw.reset(key, raw_params)
    np.testing.assert_array_equal(obs, raw_obs)
    # the agent's [-1, 1] maps affinely onto the env's [-2, 2]: 0.5 -> 1.0, and 3 is clipped to 1 -> 2.0
    for agent_action, env_action in ((0.5, 1.0), (-1.0, -2.0), (3.0, 2.0)):
        wrapped = env.step(key, state, jnp.array([agent_action]), params)
        direct = raw.step(key, raw_state, jnp.array([env_action]), raw_params)
        np.testing.assert_array_equal(wrapped[0], direct[0])
        assert float(wrapped[2]) == float(direct[2])
    # episode statistics in info: an episode of 3 steps ends on the third
    returns, infos = 0.0, []
    for _ in range(3):
        obs, state, reward, terminated, truncated, info = env.step(
            key, state, jnp.array([0.0]), params
        )
        returns += float(reward)
        infos.append(info)
    assert [bool(i["episode_done"]) for i in infos] == [False, False, True]
    assert float(infos[-1]["episode_return"]) == pytest.approx(returns, rel=1e-5)
    assert int(infos[-1]["episode_length"]) == 3


def test_make_env_keeps_discrete_actions_and_always_adds_episode_statistics():
    config = env_config("CartPole-v1")
    env, params = environment.make_env(config)
    assert isinstance(env, EpisodeStatistics) and not isinstance(env.env, RescaleAction)
    assert isinstance(env.action_space(params), Discrete)
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    info = env.step(jax.random.PRNGKey(1), state, jnp.int32(0), params)[-1]
    assert {"episode_done", "episode_return", "episode_length", "final_obs"} <= set(info)


def test_batched_steps_every_env_with_its_own_key():
    config = env_config("CartPole-v1")
    env, params = environment.make_env(config)
    reset, step = environment.batched(env)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    obs, states = reset(keys, params)
    assert obs.shape == (3, 4)
    for i in range(3):
        np.testing.assert_array_equal(obs[i], env.reset(keys[i], params)[0])
    next_obs, _, reward, *_ = step(keys, states, jnp.array([0, 1, 0], jnp.int32), params)
    assert next_obs.shape == (3, 4) and reward.shape == (3,)
    np.testing.assert_array_equal(
        next_obs[1],
        env.step(keys[1], jax.tree.map(lambda x: x[1], states), jnp.int32(1), params)[0],
    )


# ---------------------------------------------------------------- schedules and exploration


@settings(max_examples=30, deadline=None)
@given(
    start=st.floats(0, 1),
    end=st.floats(0, 1),
    duration=st.integers(1, 10_000),
    step=st.integers(0, 30_000),
)
def test_linear_schedule(start, end, duration, step):
    value = float(
        exploration.linear_schedule(jnp.float32(start), jnp.float32(end), duration, jnp.int32(step))
    )
    expected = start + (end - start) * min(step / duration, 1.0)
    assert value == pytest.approx(expected, abs=1e-6)
    assert min(start, end) - 1e-6 <= value <= max(start, end) + 1e-6


def test_linear_schedule_hand_computed():
    values = [float(exploration.linear_schedule(1.0, 0.1, 100, s)) for s in (0, 50, 100, 1000)]
    np.testing.assert_allclose(values, [1.0, 0.55, 0.1, 0.1], rtol=1e-6)


def test_epsilon_greedy_is_greedy_with_first_index_ties_at_epsilon_zero():
    q = jnp.array([[0.0, 2.0, 2.0], [5.0, -1.0, 5.0], [0.0, 0.0, 0.0]])
    actions = exploration.epsilon_greedy(jax.random.PRNGKey(0), q, 0.0)
    assert actions.dtype == jnp.int32 and actions.shape == (3,)
    np.testing.assert_array_equal(actions, [1, 0, 0])


def test_epsilon_greedy_explores_uniformly_with_probability_epsilon():
    q = jnp.tile(jnp.array([0.0, 2.0, 1.0, 0.5]), (20000, 1))
    actions = np.asarray(exploration.epsilon_greedy(jax.random.PRNGKey(2), q, 0.4))
    # greedy with prob 1 - eps + eps / 4, each other action eps / 4
    freq = np.bincount(actions, minlength=4) / actions.size
    np.testing.assert_allclose(freq, [0.1, 0.7, 0.1, 0.1], atol=0.015)
    # epsilon 1: uniform
    freq = (
        np.bincount(
            np.asarray(exploration.epsilon_greedy(jax.random.PRNGKey(3), q, 1.0)), minlength=4
        )
        / q.shape[0]
    )
    np.testing.assert_allclose(freq, 0.25, atol=0.015)


def _noise(key):
    explore_u, choice_u = jax.random.uniform(key, (2,))
    return explore_u, choice_u


def test_random_tie_breaking_from_a_zero_table_picks_every_action():
    q = jnp.zeros(4)
    draw = jax.jit(
        jax.vmap(lambda key: exploration.epsilon_greedy_random_ties(q, 0.0, *_noise(key)))
    )
    actions = np.asarray(draw(jax.random.split(jax.random.PRNGKey(0), 400)))
    counts = np.bincount(actions, minlength=4)
    assert (counts > 60).all(), counts  # ~100 each


def test_random_ties_are_broken_only_among_maximal_values():
    q = jnp.array([1.0, 0.0, 1.0, -3.0])
    draw = jax.jit(
        jax.vmap(lambda key: exploration.epsilon_greedy_random_ties(q, 0.0, *_noise(key)))
    )
    actions = np.asarray(draw(jax.random.split(jax.random.PRNGKey(1), 400)))
    assert set(actions.tolist()) == {0, 2}


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.integers(-2, 2), min_size=4, max_size=4),
    epsilon=st.floats(0, 1),
    explore_u=st.floats(0, 0.999),
)
def test_random_ties_pick_each_candidate_for_an_equal_share_of_choice_u(values, epsilon, explore_u):
    """Over an even grid of choice_u, each candidate (every action when exploring, else each
    maximiser) is picked equally often, and nothing else is ever picked."""
    q = jnp.asarray(values, jnp.float32)
    explore = np.float32(explore_u) < np.float32(
        epsilon
    )  # compared in float32, as the function does
    candidates = set(range(4)) if explore else {i for i, v in enumerate(values) if v == max(values)}
    grid = (jnp.arange(120) + 0.5) / 120  # 120 is divisible by 1, 2, 3 and 4 candidates
    pick = jax.jit(
        jax.vmap(
            lambda u: exploration.epsilon_greedy_random_ties(
                q, jnp.float32(epsilon), jnp.float32(explore_u), u
            )
        )
    )
    counts = np.bincount(np.asarray(pick(grid)), minlength=4)
    expected = [120 // len(candidates) if a in candidates else 0 for a in range(4)]
    np.testing.assert_array_equal(counts, expected)


def test_random_ties_explore_with_probability_epsilon():
    q = jnp.array([0.0, 2.0, 1.0, 0.5])
    draw = jax.jit(
        jax.vmap(lambda key: exploration.epsilon_greedy_random_ties(q, 0.4, *_noise(key)))
    )
    actions = np.asarray(draw(jax.random.split(jax.random.PRNGKey(2), 20000)))
    freq = np.bincount(actions, minlength=4) / actions.size
    np.testing.assert_allclose(freq, [0.1, 0.7, 0.1, 0.1], atol=0.015)


# ---------------------------------------------------------------- target networks


TARGET = {"w": jnp.array([0.0, 4.0]), "b": {"c": jnp.array(8.0)}}
ONLINE = {"w": jnp.array([1.0, 0.0]), "b": {"c": jnp.array(0.0)}}


def test_polyak_averages_leaf_by_leaf():
    new = optimizers.polyak(TARGET, ONLINE, 0.25)
    np.testing.assert_allclose(new["w"], [0.25, 3.0])
    np.testing.assert_allclose(new["b"]["c"], 6.0)
    copy = optimizers.polyak(TARGET, ONLINE, 1.0)
    jax.tree.map(np.testing.assert_array_equal, copy, ONLINE)


def test_periodic_polyak_updates_only_when_asked():
    update = jax.jit(lambda flag: optimizers.periodic_polyak(TARGET, ONLINE, 0.5, flag))
    jax.tree.map(np.testing.assert_array_equal, update(jnp.bool_(False)), TARGET)
    jax.tree.map(
        np.testing.assert_allclose, update(jnp.bool_(True)), optimizers.polyak(TARGET, ONLINE, 0.5)
    )
    np.testing.assert_allclose(update(jnp.bool_(True))["w"], [0.5, 2.0])


# ---------------------------------------------------------------- episode statistics


def test_add_episodes_and_episode_metrics_on_a_hand_made_batch():
    # two steps of three envs: episodes end in env 0 (return 5, length 4) and env 2 (return 1,
    # length 2) on the first step, in env 1 (return 9, length 10) on the second. The returns of
    # envs that did not end (stale values of earlier episodes) must not count.
    info = {
        "episode_done": jnp.array([[True, False, True], [False, True, False]]),
        "episode_return": jnp.array([[5.0, 100.0, 1.0], [5.0, 9.0, 1.0]]),
        "episode_length": jnp.array([[4, 70, 2], [4, 10, 2]], jnp.int32),
    }
    totals = episodes.add_episodes(episodes.no_episodes(), info)
    assert float(totals.returns) == 15.0 and int(totals.lengths) == 16 and int(totals.count) == 3
    metrics = episodes.episode_metrics(totals)
    assert float(metrics["episode_return"]) == pytest.approx(5.0)
    assert float(metrics["episode_length"]) == pytest.approx(16 / 3)
    assert int(metrics["episodes"]) == 3
    # adding step by step gives the same totals
    stepwise = episodes.no_episodes()
    for t in range(2):
        stepwise = episodes.add_episodes(stepwise, jax.tree.map(lambda x: x[t], info))
    assert stepwise == totals


def test_episode_metrics_are_nan_when_no_episode_ended():
    info = {
        "episode_done": jnp.zeros(4, bool),
        "episode_return": jnp.full(4, 7.0),
        "episode_length": jnp.full(4, 3, jnp.int32),
    }
    metrics = episodes.episode_metrics(episodes.add_episodes(episodes.no_episodes(), info))
    assert np.isnan(metrics["episode_return"]) and np.isnan(metrics["episode_length"])
    assert int(metrics["episodes"]) == 0


# ---------------------------------------------------------------- act then train, log points


def _toy_steps():
    """An env step that counts steps and ends an episode of return 1 and length 1 every step, and a
    gradient step that counts updates and returns (loss = updates so far, a uniform of its key)."""

    def env_step(carry, key):
        state, totals = carry
        info = {
            "episode_done": jnp.bool_(True),
            "episode_return": jnp.float32(1.0),
            "episode_length": jnp.int32(1),
        }
        return ({**state, "step": state["step"] + 1}, episodes.add_episodes(totals, info)), None

    def gradient_step(state, key):
        updates = state["updates"] + 1
        return {**state, "updates": updates}, {
            "loss": updates.astype(jnp.float32),
            "draw": jax.random.uniform(key),
        }

    return env_step, gradient_step


def _toy_phase(learning_starts, env_iterations=2, gradient_steps=3):
    """`act_then_train` of `_toy_steps`, jitted."""
    return jax.jit(
        loop.act_then_train(*_toy_steps(), env_iterations, gradient_steps, learning_starts)
    )


def test_act_then_train_returns_nan_aux_before_learning_starts_then_trains():
    phase = _toy_phase(learning_starts=4)
    carry = ({"step": jnp.int32(0), "updates": jnp.int32(0)}, episodes.no_episodes())
    # phase 1: 2 env steps (step 2 < 4): no gradient step, aux NaN with the gradient steps' shape
    carry, aux = phase(carry, jax.random.PRNGKey(0))
    assert int(carry[0]["step"]) == 2 and int(carry[0]["updates"]) == 0
    assert aux["loss"].shape == (3,) and np.isnan(aux["loss"]).all() and np.isnan(aux["draw"]).all()
    # phase 2: step 4 >= learning_starts: 3 gradient steps after the env steps, each with its own key
    carry, aux = phase(carry, jax.random.PRNGKey(1))
    assert int(carry[0]["step"]) == 4 and int(carry[0]["updates"]) == 3
    np.testing.assert_array_equal(aux["loss"], [1.0, 2.0, 3.0])
    assert len(set(np.asarray(aux["draw"]).tolist())) == 3
    # phase 3: trains again, and the episode totals ran through every env step
    carry, aux = phase(carry, jax.random.PRNGKey(2))
    assert int(carry[0]["updates"]) == 6
    np.testing.assert_array_equal(aux["loss"], [4.0, 5.0, 6.0])
    assert int(carry[1].count) == 6 and float(carry[1].returns) == 6.0


def test_act_then_train_with_learning_starts_zero_trains_from_the_first_phase():
    phase = _toy_phase(learning_starts=0, env_iterations=1, gradient_steps=2)
    carry, aux = phase(
        ({"step": jnp.int32(0), "updates": jnp.int32(0)}, episodes.no_episodes()),
        jax.random.PRNGKey(0),
    )
    assert int(carry[0]["updates"]) == 2
    np.testing.assert_array_equal(aux["loss"], [1.0, 2.0])


def test_minibatch_epochs_refresh_gives_each_later_epoch_a_batch_from_its_carry():
    """Epoch 1 passes over `batch`; epochs 2 and 3 over refresh(carry at their start, batch). The toy
    step adds each minibatch's sum to the carry, so the carry after the epochs is known by hand."""
    batch = jnp.arange(8.0)
    step = lambda carry, minibatch: (carry + minibatch.sum(), minibatch.sum())
    refresh = lambda carry, batch: batch + carry
    carry, stats = minibatches.minibatch_epochs(
        step, jnp.float32(0), batch, jax.random.PRNGKey(0), 3, 2, refresh=refresh
    )
    # epoch 1: 28; epoch 2 over batch + 28: 28 + 8 * 28 = 252, carry 280; epoch 3 over batch + 280: 28 + 8 * 280, carry 2548
    assert float(carry) == 2548.0 and stats.shape == (3, 2)
    np.testing.assert_allclose(stats.sum(axis=1), [28.0, 252.0, 2268.0])
    plain, _ = minibatches.minibatch_epochs(
        step, jnp.float32(0), batch, jax.random.PRNGKey(0), 3, 2
    )
    assert float(plain) == 84.0


def test_unrolled_phase_computes_the_same_as_the_rolled_one():
    carry = ({"step": jnp.int32(0), "updates": jnp.int32(0)}, episodes.no_episodes())
    rolled = _toy_phase(learning_starts=4, env_iterations=3, gradient_steps=4)
    unrolled_phase = loop.act_then_train(*_toy_steps(), 3, 4, 4, unroll=8)
    a, b = carry, carry
    for i in range(3):
        a, aux_a = rolled(a, jax.random.PRNGKey(i))
        b, aux_b = jax.jit(unrolled_phase)(b, jax.random.PRNGKey(i))
        for x, y in zip(jax.tree.leaves((a, aux_a)), jax.tree.leaves((b, aux_b))):
            np.testing.assert_array_equal(x, y)  # NaN aux before learning equals NaN
    assert (
        int(b[0]["updates"]) == 8
    )  # phase 1 (step 3 < 4) skipped learning, phases 2 and 3 trained


@pytest.mark.parametrize(
    "unroll, env_iterations, gradient_steps, expected",
    [(1, 1, 1, 1), (16, 1, 1, 16), (16, 4, 1, 4), (16, 1, 8, 2), (16, 32, 1, 1), (3, 2, 2, 1)],
)
def test_phase_unroll_spends_what_the_phase_loops_leave(
    unroll, env_iterations, gradient_steps, expected
):
    assert loop.phase_unroll(unroll, env_iterations, gradient_steps) == expected


def test_scan_log_points_emits_every_log_point_and_stacks_metrics():
    def log_period(state):
        state = state + 10
        return state, {"step": state, "half": state / 2}

    received = []
    with rl_logging.sink(received.append):
        state, metrics = jax.jit(lambda s: log_points.scan_log_points(log_period, s, 3))(
            jnp.int32(0)
        )
    assert int(state) == 30
    np.testing.assert_array_equal(metrics["step"], [10, 20, 30])
    np.testing.assert_allclose(metrics["half"], [5.0, 10.0, 15.0])
    assert [int(r["step"]) for r in received] == [10, 20, 30]
    assert [float(r["half"]) for r in received] == [5.0, 10.0, 15.0]


# ---------------------------------------------------------------- the kernel backend as a value


def test_kernel_backend_is_the_configs_choice_and_sets_nothing_process_wide(monkeypatch):
    monkeypatch.delenv(kernels.launch.ENV_VAR, raising=False)
    before = kernels.resolve_backend(None)
    assert (
        environment.kernel_backend(SimpleNamespace(kernels=KernelsConfig(backend="interpret")))
        == "interpret"
    )
    assert kernels.resolve_backend(None) == before
    # the automatic choice reaches the ops as "auto", so that their measured small-shape crossovers apply
    assert environment.kernel_backend(SimpleNamespace(kernels=KernelsConfig())) == "auto"
    assert kernels.resolve_backend("auto") == before
    # a choice made outside the config is fixed by name when the agent is built
    monkeypatch.setenv(kernels.launch.ENV_VAR, "reference")
    assert environment.kernel_backend(SimpleNamespace(kernels=KernelsConfig())) == "reference"
    with kernels.use_backend("interpret"):
        assert environment.kernel_backend(SimpleNamespace(kernels=KernelsConfig())) == "interpret"


@pytest.mark.skipif(
    kernels.launch.triton_unavailable_reason() is None, reason="triton can run on this machine"
)
def test_an_agent_with_a_backend_that_cannot_run_fails_when_it_is_built():
    config = build_config(
        {
            "env": {"id": "CartPole-v1"},
            "agent": {"name": "ppo", "total_steps": 1024, "log_interval": 1},
            "kernels": {"backend": "triton"},
        }
    )
    with pytest.raises(kernels.BackendUnavailableError, match="'triton' cannot run here"):
        ppo.make_train(config)


def test_to_env_action_is_what_the_training_env_sends():
    """environment.to_env_action(u) (what make_policy returns) equals what make_env's env does with u:
    stepping the raw Pendulum with it and the training env with u gives the same next state."""
    config = build_config({"env": {"id": "Pendulum-v1"}, "agent": {"name": "ppo"}})
    env, params = environment.make_env(config)
    raw, raw_params = envs.make("Pendulum-v1")
    u = jnp.array([[-3.0], [-0.5], [0.25], [1.5]])
    np.testing.assert_allclose(
        environment.to_env_action(env, params, u)[:, 0], [-2.0, -1.0, 0.5, 2.0]
    )
    key = jax.random.PRNGKey(0)
    _, state = env.reset(key, params)
    _, raw_state = raw.reset(key, raw_params)
    for action in u:
        wrapped_obs = env.step(key, state, action, params)[0]
        raw_obs = raw.step(
            key, raw_state, environment.to_env_action(env, params, action), raw_params
        )[0]
        np.testing.assert_array_equal(np.asarray(wrapped_obs), np.asarray(raw_obs))
    cartpole, cartpole_params = environment.make_env(
        build_config({"env": {"id": "CartPole-v1"}, "agent": {"name": "ppo"}})
    )
    assert int(environment.to_env_action(cartpole, cartpole_params, jnp.int32(1))) == 1


@settings(max_examples=30, deadline=None)
@given(st.floats(1e-3, 1e3), st.integers(0, 2**31 - 1))
def test_clip_by_global_norm_matches_optax(max_norm, seed):
    import optax

    rng = np.random.default_rng(seed)
    grads = {
        "w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
        "b": (jnp.asarray(rng.normal(size=3), jnp.float32),),
    }
    ours, state = optimizers.clip_by_global_norm(max_norm).update(
        grads, optimizers.clip_by_global_norm(max_norm).init(grads)
    )
    theirs, their_state = optax.clip_by_global_norm(max_norm).update(
        grads, optax.clip_by_global_norm(max_norm).init(grads)
    )
    assert jax.tree.structure(state) == jax.tree.structure(their_state)
    np.testing.assert_allclose(optimizers.global_norm(grads), optax.global_norm(grads), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)


def test_global_norm_by_hand():
    assert float(optimizers.global_norm({})) == 0.0  # as optax.global_norm
    np.testing.assert_allclose(
        optimizers.global_norm({"a": jnp.array([3.0]), "b": jnp.array([[4.0, 0.0]])}), 5.0
    )
    clip = optimizers.clip_by_global_norm(1.0)
    grads = {"a": jnp.array([3.0]), "b": jnp.array([[4.0, 0.0]])}
    clipped, _ = clip.update(grads, clip.init(grads))
    np.testing.assert_allclose(clipped["a"], [0.6], rtol=1e-6)
    np.testing.assert_allclose(clipped["b"], [[0.8, 0.0]], rtol=1e-6)


def test_clip_takes_a_given_squared_norm_through_the_chain():
    """`grad_sq_norm` passed to a chain that starts with the clip replaces the clip's own norm: the
    true one gives the same step as none; a larger one scales the gradient by max_norm / sqrt(given)
    (here 1 / 10, then through plain SGD); a smaller one leaves it unclipped."""
    import optax

    optimizer = optax.chain(optimizers.clip_by_global_norm(1.0), optax.sgd(1.0))
    grads = jnp.array([3.0, 4.0, 0.0])  # ||g|| = 5
    state = optimizer.init(grads)
    plain, _ = optimizer.update(grads, state, grads)
    np.testing.assert_allclose(np.asarray(plain), [-0.6, -0.8, 0.0], rtol=1e-6)
    given, _ = optimizer.update(grads, state, grads, grad_sq_norm=jnp.float32(25.0))
    np.testing.assert_allclose(np.asarray(given), np.asarray(plain), rtol=1e-6)
    larger, _ = optimizer.update(grads, state, grads, grad_sq_norm=jnp.float32(100.0))
    np.testing.assert_allclose(np.asarray(larger), [-0.3, -0.4, 0.0], rtol=1e-6)
    smaller, _ = optimizer.update(grads, state, grads, grad_sq_norm=jnp.float32(0.25))
    np.testing.assert_allclose(np.asarray(smaller), -np.asarray(grads))


def test_flat_minibatch_epochs_steps_along_a_flat_gradient_and_its_norm():
    """`flat_grads` replaces `grads`: with a clip-then-SGD optimiser, one epoch of one minibatch moves
    the flat parameters by -lr g max_norm / sqrt(given squared norm) (the given norm, not g's own),
    and the params come back in their tree."""
    from types import SimpleNamespace

    import optax

    agent = SimpleNamespace(num_epochs=1, num_minibatches=1, unroll=1)
    params = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([[3.0]])}
    optimizer = optax.chain(optimizers.clip_by_global_norm(1.0), optax.sgd(0.5))
    opt_state = optimizer.init(jnp.zeros(3))
    g = jnp.array([1.0, 0.0, 2.0])
    never = lambda params, minibatch: (_ for _ in ()).throw(AssertionError("grads called"))
    flat_grads = lambda flat, minibatch: (g, jnp.float32(16.0), {"seen": jnp.sum(minibatch)})
    new, _, stats = loop.flat_minibatch_epochs(
        agent,
        optimizer,
        never,
        params,
        opt_state,
        jnp.arange(4.0),
        jax.random.PRNGKey(0),
        flat_grads=flat_grads,
    )
    # ravel order: a (2 entries), then b (1): g / 4 (clip at norm 4), times lr 0.5
    np.testing.assert_allclose(np.asarray(new["a"]), [1.0 - 0.125, 2.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(new["b"]), [[3.0 - 0.25]], rtol=1e-6)
    assert float(stats["seen"][0, 0]) == 6.0


def test_per_env_episode_counts_sum_to_the_batch_totals():
    """`count_episodes` step by step per env, then `add_totals`, gives `add_episodes` of the whole
    [T, E] batch: the same lengths and counts, the same return sum up to float rounding."""
    rng = np.random.default_rng(0)
    info = {
        "episode_done": jnp.asarray(rng.random((7, 3)) < 0.4),
        "episode_return": jnp.asarray(rng.normal(size=(7, 3)), jnp.float32),
        "episode_length": jnp.asarray(rng.integers(1, 50, (7, 3)), jnp.int32),
    }
    per_env = episodes.no_episodes((3,))
    for t in range(7):
        per_env = episodes.count_episodes(per_env, {k: v[t] for k, v in info.items()})
    start = episodes.EpisodeTotals(jnp.float32(1.5), jnp.int32(4), jnp.int32(2))
    got, want = episodes.add_totals(start, per_env), episodes.add_episodes(start, info)
    assert int(got.count) == int(want.count) == 2 + int(np.sum(np.asarray(info["episode_done"])))
    assert int(got.lengths) == int(want.lengths)
    np.testing.assert_allclose(float(got.returns), float(want.returns), rtol=1e-6)


def _mixed_step(carry, x):
    """A step whose outputs mix float32 (NaN and -0.0 included), int32, bool, uint8 and a leaf above
    PACKED_OUTPUT_MAX elements, so every packing path of `scan_packed_outputs` is taken."""
    total, count = carry
    out = {
        "obs": jnp.stack([x, -x, x * 0.0 - 0.0, jnp.where(x > 1.5, jnp.nan, x)]),
        "action": (x * 7).astype(jnp.int32) - 3,
        "done": x > 2.0,
        "flags": jnp.full((20,), x > 1.0),  # a narrow leaf too large for the uint32 block
        "byte": (x * 11).astype(jnp.uint8),
        "image": jnp.full((collection.PACKED_OUTPUT_MAX + 1,), x, jnp.float32),  # stacked as it is
        "nested": (x.astype(jnp.float16), {"int": jnp.arange(3) + count}),
    }
    return (total + x, count + 1), out


@pytest.mark.parametrize("unroll", [1, 3])
def test_scan_packed_outputs_equals_lax_scan_bit_for_bit(unroll):
    xs = jnp.asarray([0.5, 1.25, 2.5, -1.0, 3.0], jnp.float32)
    carry = (jnp.float32(0.0), jnp.int32(0))
    want_carry, want = jax.lax.scan(_mixed_step, carry, xs, unroll=unroll)
    got_carry, got = jax.jit(
        lambda c, x: collection.scan_packed_outputs(_mixed_step, c, x, unroll=unroll)
    )(carry, xs)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves((got_carry, got)), jax.tree.leaves((want_carry, want))):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(
            np.atleast_1d(np.asarray(g)).view(np.uint8), np.atleast_1d(np.asarray(w)).view(np.uint8)
        )  # bits: NaN, -0.0


def test_scan_packed_outputs_under_vmap_and_with_no_small_outputs():
    xs = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)  # [batch 3, steps 4]
    step = lambda c, x: (c + x, {"image": jnp.full((collection.PACKED_OUTPUT_MAX + 1,), x), "x": x})
    want = jax.vmap(lambda x: jax.lax.scan(step, 0.0, x))(xs)
    got = jax.vmap(lambda x: collection.scan_packed_outputs(step, 0.0, x))(xs)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(g, w)
    only_large = lambda c, x: (c, jnp.full((collection.PACKED_OUTPUT_MAX + 1,), x))
    got, want = (
        collection.scan_packed_outputs(only_large, 0.0, xs[0]),
        jax.lax.scan(only_large, 0.0, xs[0]),
    )
    np.testing.assert_array_equal(got[1], want[1])
    counter = lambda c, _: (c + 1, {"c": c, "twice": 2 * c})  # no xs: `length` steps
    got, want = (
        collection.scan_packed_outputs(counter, 0, None, length=5),
        jax.lax.scan(counter, 0, None, length=5),
    )
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(g, w)
