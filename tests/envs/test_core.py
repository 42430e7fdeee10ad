"""The Env contract: auto-reset, final_obs, truncation vs termination, make() errors, action checks,
jit/vmap over keys and params, and spaces converting to gymnasium."""

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.spaces import Box, Discrete, check_action, from_gymnasium

ALL_IDS = sorted(
    envs.REGISTRY
)  # fusedrl's own envs; the adapters' ids ("gymnax:...") have their own tests
CLASSIC_IDS = [
    "CartPole-v1",
    "Pendulum-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Acrobot-v1",
]


def test_all_classic_control_ids_are_registered():
    assert set(CLASSIC_IDS) | {"GridWorld"} <= set(ALL_IDS)


# --- auto-reset and final_obs --------------------------------------------------------------------


def test_terminating_step_auto_resets_and_keeps_final_obs():
    env, params = envs.make("GridWorld", size=3)  # start (2, 2) = cell 8, goal (0, 0) = cell 0
    obs, state = env.reset(jax.random.key(0), params)
    assert int(obs) == 8
    path = [1, 1, 2, 2]  # up, up, left, left
    for i, action in enumerate(path):
        obs, state, reward, terminated, truncated, info = env.step(
            jax.random.key(i), state, jnp.int32(action), params
        )
        last = i == len(path) - 1
        assert bool(terminated) == last and not bool(truncated)
        assert float(reward) == float(last)
        if last:
            assert int(info["final_obs"]) == 0  # the goal the transition reached
            assert (
                int(obs) == 8 and int(state.cell) == 8 and int(state.time) == 0
            )  # a fresh episode
        else:
            assert int(info["final_obs"]) == int(
                obs
            )  # present on every step, equal to obs mid-episode
            assert int(state.time) == i + 1


def test_final_obs_is_the_pre_reset_observation_for_continuous_obs():
    env, params = envs.make("CartPole-v1")
    from envs.cartpole import CartPoleState

    state = CartPoleState(
        x=jnp.float32(2.39),
        x_dot=jnp.float32(1.0),
        theta=jnp.float32(0.0),
        theta_dot=jnp.float32(0.0),
        time=jnp.int32(7),
    )
    obs, new_state, _, terminated, _, info = env.step(
        jax.random.key(0), state, jnp.int32(1), params
    )
    assert bool(terminated)
    # Euler: x' = x + tau x_dot, theta' = theta + tau theta_dot (from the pre-step velocities)
    np.testing.assert_allclose(
        np.asarray(info["final_obs"])[[0, 2]], [2.39 + 0.02 * 1.0, 0.0], rtol=1e-6
    )
    assert float(info["final_obs"][0]) > 2.4
    assert np.all(np.abs(np.asarray(obs)) <= 0.05)  # the reset observation
    assert int(new_state.time) == 0


def test_truncation_is_not_termination_and_termination_wins_on_the_last_step():
    # 4 steps to the goal on a 3x3 grid: with a limit of 4 the 4th step terminates,
    # it is not truncated
    env, params = envs.make("GridWorld", size=3, max_steps_in_episode=4)
    _, state = env.reset(jax.random.key(0), params)
    for i, action in enumerate([1, 1, 2, 2]):
        _, state, _, terminated, truncated, _ = env.step(
            jax.random.key(i), state, jnp.int32(action), params
        )
    assert bool(terminated) and not bool(truncated)
    # wandering (right into the wall) until the limit: truncated, not terminated
    _, state = env.reset(jax.random.key(0), params)
    flags = []
    for i in range(5):
        _, state, _, terminated, truncated, _ = env.step(
            jax.random.key(i), state, jnp.int32(0), params
        )
        flags.append((bool(terminated), bool(truncated)))
    assert flags == [(False, False)] * 3 + [(False, True), (False, False)]


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_step_outputs_have_the_contract_dtypes(env_id):
    env, params = envs.make(env_id)
    obs, state = env.reset(jax.random.key(0), params)
    action = env.action_space(params).sample(jax.random.key(1))
    obs2, state2, reward, terminated, truncated, info = jax.jit(env.step)(
        jax.random.key(2), state, action, params
    )
    assert (
        obs2.shape == obs.shape == env.observation_space(params).shape and obs2.dtype == obs.dtype
    )
    assert reward.dtype == jnp.float32 and reward.shape == ()
    assert terminated.dtype == jnp.bool_ and truncated.dtype == jnp.bool_
    assert info["final_obs"].shape == obs.shape
    assert jax.tree.structure(state2) == jax.tree.structure(state)
    assert all(a.dtype == b.dtype for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(state2)))


# --- make() errors -------------------------------------------------------------------------------


def test_make_unknown_id_lists_the_known_ones_and_suggests():
    # (an id no library has: where envpool is installed "Pendulum-v0" is its classic-control id,
    # and the suggestion is rightly "envpool:Pendulum-v0")
    with pytest.raises(ValueError) as error:
        envs.make("Pendulum-v9")
    message = str(error.value)
    assert "unknown env id 'Pendulum-v9'" in message and "Did you mean 'Pendulum-v1'" in message
    for env_id in ALL_IDS:
        assert env_id in message


def test_make_unknown_param_names_it_and_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown env param\(s\) \['gravty'\].*gravity"):
        envs.make("CartPole-v1", gravty=9.0)
    env, params = envs.make("Pendulum-v1", g=9.81)
    assert params.g == 9.81


# --- action validation ---------------------------------------------------------------------------


def test_wrong_action_shape_or_dtype_fails_at_trace_time():
    env, params = envs.make("CartPole-v1")
    _, state = env.reset(jax.random.key(0), params)
    step = jax.jit(env.step)
    with pytest.raises(
        ValueError, match=r"CartPole-v1.step: action must be a scalar integer.*shape \(2,\)"
    ):
        step(jax.random.key(0), state, jnp.zeros(2, jnp.int32), params)
    with pytest.raises(ValueError, match="must be an integer.*float32"):
        step(jax.random.key(0), state, jnp.float32(1.0), params)
    env, params = envs.make("Pendulum-v1")
    _, state = env.reset(jax.random.key(0), params)
    with pytest.raises(
        ValueError, match=r"Pendulum-v1.step: action must have shape \(1,\), got shape \(\)"
    ):
        jax.jit(env.step)(jax.random.key(0), state, jnp.float32(1.0), params)
    with pytest.raises(ValueError, match="must be a float array"):
        jax.jit(env.step)(jax.random.key(0), state, jnp.ones(1, jnp.int32), params)


def test_concrete_out_of_range_actions():
    env, params = envs.make("MountainCar-v0")
    _, state = env.reset(jax.random.key(0), params)
    with pytest.raises(ValueError, match=r"action 3 is outside Discrete\(3\)"):
        env.step(jax.random.key(0), state, jnp.int32(3), params)
    with pytest.raises(ValueError, match="outside"):
        env.step(jax.random.key(0), state, -1, params)
    # continuous: finite out-of-range values are clipped (concrete and traced alike), NaN/inf raise
    env, params = envs.make("Pendulum-v1")
    _, state = env.reset(jax.random.key(0), params)
    eager = env.step(jax.random.key(0), state, jnp.array([5.0]), params)
    at_bound = env.step(jax.random.key(0), state, jnp.array([2.0]), params)
    jitted = jax.jit(env.step)(jax.random.key(0), state, jnp.array([5.0]), params)
    np.testing.assert_allclose(eager[0], at_bound[0])
    np.testing.assert_allclose(eager[0], jitted[0], rtol=1e-6)
    with pytest.raises(ValueError, match="must be finite"):
        env.step(jax.random.key(0), state, jnp.array([np.nan]), params)


def test_check_action_accepts_python_and_numpy_values():
    assert int(check_action(Discrete(3), 2, "X")) == 2
    assert int(check_action(Discrete(3), np.int64(1), "X")) == 1
    assert check_action(Box(-1, 1, (2,)), np.zeros(2), "X").dtype == jnp.float32


# --- jit / vmap over keys and over params ---------------------------------------------------------


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_vmap_over_keys_equals_one_by_one(env_id):
    env, params = envs.make(env_id)
    keys = jax.random.split(jax.random.key(0), 4)
    space = env.action_space(params)

    def reset_and_step(key):
        reset_key, action_key, step_key = jax.random.split(key, 3)
        _, state = env.reset(reset_key, params)
        return env.step(step_key, state, space.sample(action_key), params)

    batched = jax.jit(jax.vmap(reset_and_step))(keys)
    for i in range(4):
        single = reset_and_step(keys[i])
        for b, s in zip(jax.tree.leaves(batched), jax.tree.leaves(single)):
            np.testing.assert_allclose(b[i], s, rtol=1e-6, atol=1e-6)


def test_vmap_over_params_gives_each_variant_its_own_dynamics():
    env, params = envs.make("CartPole-v1")
    gravities = jnp.array([1.0, 9.8, 30.0])
    batch_params = params.replace(gravity=gravities)
    axes = params.replace(**{f: None for f in params.__dataclass_fields__}).replace(gravity=0)
    _, state = env.reset(jax.random.key(0), params)
    state = state.replace(theta=jnp.float32(0.1))
    step = jax.jit(jax.vmap(env.step, in_axes=(None, None, None, axes)))
    obs = step(jax.random.key(1), state, jnp.int32(0), batch_params)[0]
    for i, g in enumerate([1.0, 9.8, 30.0]):
        np.testing.assert_allclose(
            obs[i],
            env.step(jax.random.key(1), state, jnp.int32(0), params.replace(gravity=g))[0],
            rtol=1e-6,
        )
    assert len({float(x) for x in obs[:, 3]}) == 3


def test_vmap_over_params_of_a_continuous_env_keeps_the_default_space():
    env, params = envs.make("Pendulum-v1")
    torques = jnp.array([1.0, 2.0])
    _, state = env.reset(jax.random.key(0), params)
    axes = params.replace(**{f: None for f in params.__dataclass_fields__}).replace(max_torque=0)
    step = jax.vmap(env.step, in_axes=(None, None, None, axes))
    _, new_state, *_ = step(
        jax.random.key(1), state, jnp.array([2.0]), params.replace(max_torque=torques)
    )
    np.testing.assert_allclose(new_state.last_u, [1.0, 2.0])  # each variant clips at its own bound


# --- spaces ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", CLASSIC_IDS)
def test_spaces_convert_to_gymnasiums_own(env_id):
    env, params = envs.make(env_id)
    gym_env = gymnasium.make(env_id)
    assert env.observation_space(params).to_gymnasium() == gym_env.observation_space
    assert env.action_space(params).to_gymnasium() == gym_env.action_space


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_samples_lie_in_the_spaces(env_id):
    env, params = envs.make(env_id)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(0), 64), params
    )
    obs_space, action_space = (
        env.observation_space(params).to_gymnasium(),
        env.action_space(params).to_gymnasium(),
    )
    for o in np.asarray(obs):
        assert obs_space.contains(o.astype(obs_space.dtype) if o.shape else int(o))
    for k in jax.random.split(jax.random.key(1), 16):
        a = np.asarray(env.action_space(params).sample(k))
        assert action_space.contains(a if a.shape else int(a))
        assert bool(env.action_space(params).contains(a))


def test_space_round_trip_through_gymnasium():
    box = Box(low=np.array([-1.0, 0.0]), high=np.array([1.0, np.inf]), shape=(2,))
    gym_box = box.to_gymnasium()
    assert isinstance(gym_box, gymnasium.spaces.Box) and gym_box.shape == (2,)
    back = from_gymnasium(gym_box)
    np.testing.assert_array_equal(back._low, box._low)
    np.testing.assert_array_equal(back._high, box._high)
    assert from_gymnasium(Discrete(5).to_gymnasium()) == Discrete(5)
    with pytest.raises(ValueError, match="start"):
        from_gymnasium(gymnasium.spaces.Discrete(3, start=1))
    with pytest.raises(ValueError, match="only Discrete and Box"):
        from_gymnasium(gymnasium.spaces.MultiBinary(3))


def test_import_envs_loads_no_outside_env_library():
    """The adapters (envs/brax.py, craftax.py, jumanji.py, playground.py) import their libraries
    only when used."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, envs, envs.brax, envs.craftax, envs.jumanji, envs.playground, rl.run.train; "
        "print(sorted({'brax', 'craftax', 'jumanji', 'mujoco', 'mujoco_playground', 'warp'} "
        "& set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.stdout.strip() == "[]"
