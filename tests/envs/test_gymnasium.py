"""Gymnasium interop: to_gymnasium passes gymnasium's env checker and drives gymnasium's own vector
wrappers; from_gymnasium reproduces gymnasium's trajectories, gives each vmapped element its own
env instance, and fails clearly on its documented limits."""

import warnings

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

import envs
from envs.gymnasium import from_gymnasium, to_gymnasium
from envs.wrappers import EpisodeStatistics, NormalizeReward, vectorize

# gymnasium's vector NormalizeReward and RecordEpisodeStatistics follow same-step autoreset (our
# envs' mode) from 1.4 on; 1.3 (the newest gymnax 1.0.1 allows, so what the test extra installs)
# treats the step after every episode end as a reset step (skips its reward). Our wrappers are
# checked against references either way (tests/envs/test_wrappers.py).
VECTOR_WRAPPERS_SAME_STEP = tuple(int(x) for x in gymnasium.__version__.split(".")[:2]) >= (1, 4)

# --- ours -> gymnasium ---------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", sorted(envs.REGISTRY))
def test_to_gymnasium_passes_the_env_checker(env_id):
    env, params = envs.make(env_id)
    gym_env = to_gymnasium(env, params, render_mode="rgb_array")
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # advisory warnings (infinite bounds, asymmetric Box) as for gymnasium's own envs
        check_env(gym_env)
    gym_env.reset(seed=0)
    frame = gym_env.render()
    assert frame.dtype == np.uint8 and frame.ndim == 3


def test_to_gymnasium_episode_semantics_and_seeding():
    env, params = envs.make("CartPole-v1")
    gym_env = to_gymnasium(env, params)
    obs, _ = gym_env.reset(seed=7)
    assert obs.dtype == np.float32 and gym_env.observation_space.contains(obs)
    trajectory = []
    for t in range(200):
        obs, reward, terminated, truncated, _ = gym_env.step(t % 2 if t < 5 else 1)
        trajectory.append(obs)
        assert reward == 1.0
        if terminated:
            break
    assert terminated and not truncated
    assert (
        abs(obs[0]) > 2.4 or abs(obs[2]) > 12 * np.pi / 180
    )  # the terminal observation, not a reset one
    again, _ = gym_env.reset(seed=7)
    np.testing.assert_array_equal(again, gym_env.reset(seed=7)[0])
    with pytest.raises(ValueError, match="outside"):
        gym_env.step(2)


def test_to_gymnasium_time_limit_is_truncation():
    env, params = envs.make("Pendulum-v1")
    gym_env = to_gymnasium(env, params.replace(max_steps_in_episode=10))
    gym_env.reset(seed=0)
    flags = [gym_env.step(np.zeros(1, np.float32))[2:4] for _ in range(10)]
    assert flags == [(False, False)] * 9 + [(False, True)]


def test_vector_env_info_layout_matches_gymnasiums_sync_vector_env():
    ours = to_gymnasium(*envs.make("CartPole-v1"), num_envs=3)
    theirs = gymnasium.make_vec(
        "CartPole-v1",
        num_envs=3,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
    )
    assert (
        ours.metadata["autoreset_mode"]
        == theirs.metadata["autoreset_mode"]
        == AutoresetMode.SAME_STEP
    )
    assert ours.single_observation_space == theirs.single_observation_space
    assert (
        ours.action_space == theirs.action_space
        and ours.observation_space == theirs.observation_space
    )
    for vec in (ours, theirs):
        obs, _ = vec.reset(seed=0)
        assert obs.shape == (3, 4) and obs.dtype == np.float32
        for _ in range(100):
            obs, reward, terminated, truncated, info = vec.step(np.ones(3, np.int64))
            if terminated.any():
                break
        assert terminated.any() and reward.shape == (3,) and terminated.dtype == bool
        assert info["final_obs"].dtype == object and info["_final_obs"].dtype == bool
        np.testing.assert_array_equal(info["_final_obs"], terminated | truncated)
        for i in range(3):
            if info["_final_obs"][i]:
                assert info["final_obs"][i].shape == (4,) and abs(info["final_obs"][i][2]) > 0.2
                assert not np.array_equal(
                    info["final_obs"][i], obs[i]
                )  # obs is already the next episode's
            else:
                assert info["final_obs"][i] is None


@pytest.mark.skipif(
    not VECTOR_WRAPPERS_SAME_STEP,
    reason=(
        f"gymnasium {gymnasium.__version__}'s vector wrappers assume next-step autoreset "
        "(same-step from 1.4)"
    ),
)
def test_gymnasiums_vector_wrappers_agree_with_ours():
    """gymnasium's NormalizeReward and RecordEpisodeStatistics on to_gymnasium(...) vs our wrappers.

    to_gymnasium's vector env draws keys exactly as `vectorize` does (reset: split(key(seed))[1];
    each step: the next split of the carried key), so both see the same trajectory.
    """
    env, params = envs.make("CartPole-v1", max_steps_in_episode=25)
    n, steps, gamma = 4, 120, 0.95
    vec = gymnasium.wrappers.vector.RecordEpisodeStatistics(to_gymnasium(env, params, num_envs=n))
    vec = gymnasium.wrappers.vector.NormalizeReward(vec, gamma=gamma)
    ours = NormalizeReward(EpisodeStatistics(vectorize(env, n)), gamma=gamma)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, (steps, n))

    vec.reset(seed=3)
    key, reset_key = jax.random.split(jax.random.key(3))
    _, state = ours.reset(reset_key, params)
    step = jax.jit(ours.step)
    episodes = 0
    for t in range(steps):
        obs, reward, terminated, truncated, info = vec.step(actions[t])
        key, step_key = jax.random.split(key)
        our_obs, state, our_reward, our_term, our_trunc, our_info = step(
            step_key, state, jnp.asarray(actions[t]), params
        )
        np.testing.assert_allclose(our_obs, obs, rtol=1e-6)
        np.testing.assert_array_equal(our_term, terminated)
        np.testing.assert_array_equal(our_trunc, truncated)
        np.testing.assert_allclose(our_reward, reward, rtol=1e-4)
        if "episode" in info:
            done = info["_episode"]
            np.testing.assert_array_equal(np.asarray(our_info["episode_done"]), done)
            np.testing.assert_allclose(
                np.asarray(our_info["episode_return"])[done], info["episode"]["r"][done]
            )
            np.testing.assert_array_equal(
                np.asarray(our_info["episode_length"])[done], info["episode"]["l"][done]
            )
            episodes += done.sum()
    assert episodes > 10


def test_vector_env_renders_every_env():
    vec = to_gymnasium(*envs.make("Acrobot-v1"), num_envs=2, render_mode="rgb_array")
    vec.reset(seed=0)
    frames = vec.render()
    assert (
        len(frames) == 2
        and frames[0].shape == (500, 500, 3)
        and not np.array_equal(frames[0], frames[1])
    )


def test_to_gymnasium_bad_input():
    env, params = envs.make("CartPole-v1")
    with pytest.raises(ValueError, match="num_envs must be >= 1"):
        to_gymnasium(env, params, num_envs=0)
    with pytest.raises(ValueError, match="render_mode"):
        to_gymnasium(env, params, render_mode="human")
    vec = to_gymnasium(env, params, num_envs=2)
    with pytest.raises(RuntimeError, match="reset"):
        vec.step(np.zeros(2, np.int64))
    vec.reset(seed=0)
    with pytest.raises(ValueError, match="leading axis of 2"):
        vec.step(np.zeros(3, np.int64))


# --- gymnasium -> ours ---------------------------------------------------------------------------


def seeds_of(keys):
    """The gymnasium seeds our from_gymnasium env draws from JAX keys."""
    return [
        int(s)
        for s in np.asarray(
            jax.vmap(lambda k: jax.random.randint(k, (), 0, 2**31 - 1, dtype=jnp.int32))(keys)
        )
    ]


def test_from_gymnasium_reproduces_gymnasiums_trajectory_with_auto_reset():
    env, params = from_gymnasium("Pendulum-v1")  # 200-step TimeLimit from gymnasium's spec
    assert params.max_steps_in_episode == 200 and jax.tree.leaves(params) == []
    steps = 450
    rng = np.random.default_rng(0)
    actions = rng.uniform(-2, 2, (steps, 1)).astype(np.float32)
    step_keys = jax.random.split(jax.random.key(1), steps)

    @jax.jit
    def run(actions):
        obs, state = env.reset(jax.random.key(0), params)

        def body(state, inputs):
            key, action = inputs
            obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)
            return state, (obs, info["final_obs"], reward, terminated, truncated, state.time)

        return obs, jax.lax.scan(body, state, (step_keys, actions))[1]

    first, (obs, final_obs, reward, terminated, truncated, time) = jax.tree.map(
        np.asarray, run(jnp.asarray(actions))
    )
    reference = gymnasium.make("Pendulum-v1")
    ref_obs, _ = reference.reset(seed=seeds_of(jax.random.key(0)[None])[0])
    np.testing.assert_array_equal(first, ref_obs)
    reset_seeds = seeds_of(step_keys)
    for t in range(steps):
        o, r, term, trunc, _ = reference.step(actions[t])
        np.testing.assert_array_equal(final_obs[t], o)
        assert reward[t] == np.float32(r) and terminated[t] == term and truncated[t] == trunc
        if term or trunc:
            o, _ = reference.reset(seed=reset_seeds[t])
        np.testing.assert_array_equal(obs[t], o)
    np.testing.assert_array_equal(np.flatnonzero(truncated), [199, 399])
    assert time[199] == 0 and time[200] == 1


def test_from_gymnasium_vmap_gives_each_element_its_own_instance():
    env, params = from_gymnasium("CartPole-v1")
    keys = jax.random.split(jax.random.key(0), 3)
    rng = np.random.default_rng(1)
    actions = jnp.asarray(rng.integers(0, 2, (60, 3)), jnp.int32)
    step_keys = jax.random.split(jax.random.key(1), 60 * 3).reshape(60, 3)

    def run(env, params, keys, actions, step_keys):
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)

        def body(state, inputs):
            k, a = inputs
            obs, state, reward, terminated, truncated, info = jax.vmap(
                env.step, in_axes=(0, 0, 0, None)
            )(k, state, a, params)
            return state, (obs, reward, terminated)

        return state, jax.lax.scan(body, state, (step_keys, actions))[1]

    state, (obs, reward, terminated) = jax.jit(run, static_argnums=(0,))(
        env, params, keys, actions, step_keys
    )
    np.testing.assert_array_equal(state.handle, [0, 1, 2])
    assert len(env._host.instances) == 3
    assert np.asarray(terminated).sum() >= 3
    # each element equals a run of its own, unbatched, with a fresh from_gymnasium env
    for i in range(3):
        single, single_params = from_gymnasium("CartPole-v1")
        o, s = single.reset(keys[i], single_params)
        for t in range(60):
            o, s, r, *_ = single.step(step_keys[t, i], s, actions[t, i], single_params)
            np.testing.assert_array_equal(o, obs[t, i])


def test_from_gymnasium_stale_state_raises_but_reset_states_are_restorable():
    env, params = from_gymnasium("CartPole-v1")
    obs0, reset_state = env.reset(jax.random.key(0), params)
    first = env.step(jax.random.key(1), reset_state, jnp.int32(0), params)
    later = env.step(jax.random.key(2), first[1], jnp.int32(1), params)
    # a reset state is restored (reset again with its seed) and can be stepped again,
    # with the same result
    again = env.step(jax.random.key(1), reset_state, jnp.int32(0), params)
    np.testing.assert_array_equal(again[0], first[0])
    # a stepped state that the instance has moved past is stale
    with pytest.raises(
        Exception, match="stale state for env instance"
    ):  # raised when the result is ready (async on a GPU)
        jax.block_until_ready(env.step(jax.random.key(3), first[1], jnp.int32(0), params))
    # repeating the last transition exactly returns the memoised result without stepping
    repeat = env.step(jax.random.key(4), again[1], jnp.int32(1), params)
    np.testing.assert_array_equal(
        env.step(jax.random.key(4), again[1], jnp.int32(1), params)[0], repeat[0]
    )
    assert later[1].token != repeat[1].token


def test_from_gymnasium_vmapped_while_loop_stops_at_episode_end():
    """A vmapped evaluation loop: finished elements re-run the body with the same inputs
    (memoised)."""
    env, params = from_gymnasium("CartPole-v1")

    def episode_length(key, push):
        obs, state = env.reset(key, params)

        def not_done(carry):
            return ~carry[2]

        def body(carry):
            obs, state, _, length = carry
            obs, state, _, terminated, truncated, _ = env.step(
                jax.random.key(0), state, push, params
            )
            return obs, state, terminated | truncated, length + 1

        return jax.lax.while_loop(not_done, body, (obs, state, jnp.bool_(False), jnp.int32(0)))[3]

    keys = jax.random.split(jax.random.key(0), 3)
    pushes = jnp.array([0, 1, 1], jnp.int32)
    lengths = jax.jit(jax.vmap(episode_length))(keys, pushes)
    reference = []
    for key, push in zip(keys, pushes):
        gym_env = gymnasium.make("CartPole-v1")
        gym_env.reset(seed=seeds_of(key[None])[0])
        length, done = 0, False
        while not done:
            _, _, term, trunc, _ = gym_env.step(int(push))
            length, done = length + 1, term or trunc
        reference.append(length)
    np.testing.assert_array_equal(lengths, reference)
    assert len(set(reference)) > 1  # the elements finished at different steps


def test_from_gymnasium_reset_sites_own_their_instances():
    """A training stream and an evaluation reset elsewhere in the same program do not collide."""
    env, params = from_gymnasium("CartPole-v1")

    @jax.jit
    def train_with_eval(key):
        _, state = env.reset(key, params)

        def period(state, key):
            def body(state, key):
                _, state, reward, *_ = env.step(key, state, jnp.int32(1), params)
                return state, reward

            state, rewards = jax.lax.scan(body, state, jax.random.split(key, 5))
            # an evaluation episode start from its own reset site, inside the loop
            eval_obs, eval_state = env.reset(jax.random.key(0), params)
            eval_obs, *_ = env.step(jax.random.key(0), eval_state, jnp.int32(0), params)
            return state, (rewards.sum(), eval_obs)

        return jax.lax.scan(period, state, jax.random.split(key, 4))

    state, (rewards, eval_obs) = train_with_eval(jax.random.key(1))
    np.testing.assert_array_equal(rewards, 5.0)
    np.testing.assert_array_equal(
        eval_obs, np.broadcast_to(eval_obs[0], eval_obs.shape)
    )  # same eval episode each time
    assert len(env._host.instances) == 2  # one per reset site, reused across iterations


def test_from_gymnasium_params_are_fixed():
    env, params = from_gymnasium("CartPole-v1")
    _, state = env.reset(jax.random.key(0), params)
    with pytest.raises(ValueError, match="params are fixed at construction"):
        env.step(jax.random.key(0), state, jnp.int32(0), params.replace(max_steps_in_episode=10))
    with pytest.raises(ValueError, match="params are fixed at construction"):
        env.reset(jax.random.key(0), envs.make("CartPole-v1")[1])


def test_from_gymnasium_action_checks_and_spaces():
    env, params = from_gymnasium("MountainCarContinuous-v0")
    assert (
        env.action_space(params).to_gymnasium()
        == gymnasium.make("MountainCarContinuous-v0").action_space
    )
    _, state = env.reset(jax.random.key(0), params)
    with pytest.raises(ValueError, match=r"action must have shape \(1,\)"):
        env.step(jax.random.key(0), state, jnp.float32(0.0), params)
    env, params = from_gymnasium("FrozenLake-v1", is_slippery=False)  # discrete observations
    obs, state = env.reset(jax.random.key(0), params)
    assert obs.dtype == jnp.int32 and int(obs) == 0
    obs, *_ = env.step(jax.random.key(1), state, jnp.int32(2), params)  # right
    assert int(obs) == 1
    with pytest.raises(ValueError, match="outside Discrete"):
        env.step(jax.random.key(1), state, jnp.int32(4), params)
    with pytest.raises(ValueError, match="only Discrete and Box"):
        from_gymnasium("Blackjack-v1")


def test_from_gymnasium_accepts_an_instance_or_factory_and_composes_with_wrappers():
    instance = gymnasium.make("CartPole-v1")
    env, params = from_gymnasium(instance)
    assert env.name == "CartPole-v1"
    stacked = EpisodeStatistics(vectorize(env, 2))  # the second instance is a deep copy
    _, state = stacked.reset(jax.random.key(0), params)

    @jax.jit
    def run(state):
        def body(state, key):
            _, state, reward, terminated, truncated, info = stacked.step(
                key, state, jnp.ones(2, jnp.int32), params
            )
            return state, (info["episode_done"], info["episode_return"])

        return jax.lax.scan(body, state, jax.random.split(jax.random.key(1), 40))

    _, (done, returns) = run(state)
    assert np.asarray(done).any() and np.all(np.asarray(returns)[np.asarray(done)] >= 8)
    env2, _ = from_gymnasium(lambda: gymnasium.make("Acrobot-v1"))
    assert env2.observation_space(env2.default_params).shape == (6,)
    with pytest.raises(ValueError, match="only apply to an env id"):
        from_gymnasium(instance, render_mode="rgb_array")


def test_round_trip_through_both_directions_passes_the_env_checker():
    env, params = from_gymnasium("CartPole-v1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(to_gymnasium(env, params), skip_render_check=True)


def test_make_with_the_gymnasium_prefix():
    env, params = envs.make("gymnasium:CartPole-v1", max_episode_steps=20)
    assert params.max_steps_in_episode == 20 and env.name == "CartPole-v1"
    with pytest.raises(ValueError, match="NoSuchEnv"):
        envs.make("gymnasium:NoSuchEnv-v0")
    with pytest.raises(ValueError, match="gymnasium:<id>"):
        envs.make("NoSuchEnv-v0")


def test_exported_from_the_package():
    import envs.gymnasium as interop

    assert (
        envs.to_gymnasium is interop.to_gymnasium and envs.from_gymnasium is interop.from_gymnasium
    )


def test_an_agent_trains_on_a_from_gymnasium_env():
    """Tabular Q-learning (rl.agents.qlearning, vmapped over 2 seeds, its greedy evaluation inside
    the compiled loop) on gymnasium's own FrozenLake through
    `envs.make("gymnasium:FrozenLake-v1")`."""
    from rl.config import build_config
    from rl.run.train import train_many

    config = build_config(
        {
            "env": {"id": "gymnasium:FrozenLake-v1", "params": {"is_slippery": False}},
            "agent": {
                "name": "qlearning",
                "total_steps": 4000,
                "log_interval": 500,
                "epsilon_decay_steps": 2000,
                "lr": 0.5,
            },
            "run": {"seeds": 2},
        }
    )
    _, metrics = train_many(config)
    greedy = np.asarray(metrics["greedy_episode_length"])[0]
    np.testing.assert_array_equal(greedy[:, -1], [6, 6])  # the shortest path on the 4x4 map
    assert np.all(np.asarray(metrics["episode_return"])[0, :, -1] > 0.8)  # the goal pays 1
