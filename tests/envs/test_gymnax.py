"""The gymnax adapter (envs/gymnax.py): stepping through `envs.make("gymnax:<id>")` equals stepping
gymnax's own env with the same keys (observations, rewards, the terminated/truncated split, the
auto-reset state) under jit and vmap; params stay a vmappable pytree; spaces; make's keywords and
errors; MinAtar rendering; the error naming the extra when gymnax is missing."""

from __future__ import annotations

import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

gymnax = pytest.importorskip("gymnax")  # the gymnax extra (the test extra installs it)

import envs  # noqa: E402
from envs.core import MissingExtraError  # noqa: E402
from envs.gymnax import GymnaxEnv  # noqa: E402
from envs.spaces import Box, Discrete  # noqa: E402

# gymnax ids whose construction downloads data (MNIST): not made offline.
DOWNLOADS = {"MNISTBandit-bsuite"}

# Small time limits so that the rollouts below see terminations, truncations and auto-resets.
# MemoryChain terminates at step memory_length + 1: with max_steps_in_episode = memory_length + 1
# gymnax reports terminated and truncated together there (fusedrl: terminated only).
PARITY = {
    "Breakout-MinAtar": dict(max_steps_in_episode=12),
    "MemoryChain-bsuite": dict(memory_length=3, max_steps_in_episode=4),
    "CartPole-v1": dict(max_steps_in_episode=15),
}
NUM_ENVS, NUM_STEPS = 8, 40


def rollouts(step, reset, sample_action, params, key):
    """NUM_ENVS envs x NUM_STEPS random steps of `step` (fusedrl's or gymnax's signature, the same
    6 outputs), jitted and vmapped over the envs; each env's keys are split the same way for
    both."""

    def one_env(key):
        reset_key, scan_key = jax.random.split(key)
        obs, state = reset(reset_key, params)

        def body(state, key):
            action_key, step_key = jax.random.split(key)
            obs, next_state, reward, terminated, truncated, info = step(
                step_key, state, sample_action(action_key), params
            )
            return next_state, (obs, next_state, reward, terminated, truncated, info)

        return obs, state, jax.lax.scan(body, state, jax.random.split(scan_key, NUM_STEPS))[1]

    return jax.tree.map(np.asarray, jax.jit(jax.vmap(one_env))(jax.random.split(key, NUM_ENVS)))


@pytest.mark.parametrize("env_id", sorted(PARITY))
def test_stepping_through_fusedrl_equals_gymnax_under_jit_and_vmap(env_id):
    env, params = envs.make(f"gymnax:{env_id}", **PARITY[env_id])
    gx_env, gx_params = gymnax.make(env_id)
    gx_params = gx_params.replace(**PARITY[env_id])
    assert params == gx_params
    sample = env.action_space(params).sample
    ours = rollouts(env.step, env.reset, sample, params, jax.random.key(0))
    theirs = rollouts(
        gx_env.step, gx_env.reset, sample, gx_params, jax.random.key(0)
    )  # a separate program

    (obs0, state0, (obs, state, reward, terminated, truncated, info)) = ours
    (gx_obs0, gx_state0, (gx_obs, gx_state, gx_reward, gx_terminated, gx_truncated, gx_info)) = (
        theirs
    )
    np.testing.assert_array_equal(obs0, gx_obs0)
    for a, b in zip(jax.tree.leaves(state0), jax.tree.leaves(gx_state0)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(obs, gx_obs)  # after auto-resets too
    np.testing.assert_array_equal(info["final_obs"], gx_info["final_observation"])
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(gx_state)):  # the auto-reset state
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(reward, gx_reward.astype(np.float32))
    np.testing.assert_array_equal(terminated, gx_terminated)
    np.testing.assert_array_equal(
        truncated, gx_truncated & ~gx_terminated
    )  # truncation is never termination
    assert reward.dtype == np.float32 and terminated.dtype == truncated.dtype == np.bool_
    assert set(info) == {"final_obs"} | (
        set(gx_info) - {"terminated", "truncated", "final_observation"}
    )
    # the rollouts cover episode ends of both kinds, and auto-resets (time back to 0)
    assert terminated.any() and (state.time[terminated | truncated] == 0).all()
    if (
        env_id == "MemoryChain-bsuite"
    ):  # every episode ends on its last allowed step: gymnax reports both there
        assert (gx_terminated & gx_truncated).any() and not truncated.any()
    else:
        assert truncated.any()


def test_vmap_over_envs_equals_each_env_alone():
    env, params = envs.make("gymnax:Breakout-MinAtar", max_steps_in_episode=12)
    key = jax.random.key(1)
    batched = rollouts(env.step, env.reset, env.action_space(params).sample, params, key)
    keys = jax.random.split(key, NUM_ENVS)
    step = jax.jit(env.step)
    obs, state = env.reset(jax.random.split(keys[3])[0], params)
    for t, step_key in enumerate(jax.random.split(jax.random.split(keys[3])[1], NUM_STEPS)[:15]):
        action_key, step_key = jax.random.split(step_key)
        obs, state, reward, terminated, truncated, _ = step(
            step_key, state, env.action_space(params).sample(action_key), params
        )
        np.testing.assert_array_equal(obs, batched[2][0][3, t])
        assert (
            float(reward) == batched[2][2][3, t]
            and bool(terminated) == batched[2][3][3, t]
            and bool(truncated) == batched[2][4][3, t]
        )


def test_params_are_a_vmappable_pytree():
    env, params = envs.make("gymnax:MemoryChain-bsuite")
    gx_env, _ = gymnax.make("MemoryChain-bsuite")
    lengths = jnp.array([2, 3, 5])
    batch = params.replace(memory_length=lengths, max_steps_in_episode=jnp.array([50, 50, 50]))
    axes = jax.tree.map(lambda _: 0, batch)

    def episode(step, params):  # one episode of action 0: reward and flags per step
        _, state = env.reset(jax.random.key(0), params)

        def body(state, key):
            _, state, reward, terminated, truncated, _ = step(key, state, jnp.int32(0), params)
            return state, (reward, terminated, truncated)

        return jax.lax.scan(body, state, jax.random.split(jax.random.key(1), 8))[1]

    ours = jax.jit(jax.vmap(lambda p: episode(env.step, p), in_axes=(axes,)))(batch)
    theirs = jax.jit(jax.vmap(lambda p: episode(gx_env.step, p), in_axes=(axes,)))(batch)
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])
    # each variant terminates at its own step memory_length + 1
    np.testing.assert_array_equal(np.argmax(np.asarray(ours[1]), axis=1), np.asarray(lengths))


# --- spaces ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", sorted(set(gymnax.registered_envs) - DOWNLOADS))
def test_spaces_map_gymnaxs_own(env_id):
    env, params = envs.make(f"gymnax:{env_id}")
    gx_env, gx_params = gymnax.make(env_id)
    for ours, theirs in (
        (env.observation_space(params), gx_env.observation_space(gx_params)),
        (env.action_space(params), gx_env.action_space(gx_params)),
    ):
        if isinstance(ours, Discrete):
            assert ours.n == theirs.n and ours.dtype == theirs.dtype
        else:
            assert isinstance(ours, Box)
            assert ours.shape == tuple(theirs.shape) and ours.dtype == theirs.dtype
            np.testing.assert_array_equal(
                ours._low, np.broadcast_to(np.asarray(theirs.low, np.float32), ours.shape)
            )
            np.testing.assert_array_equal(
                ours._high, np.broadcast_to(np.asarray(theirs.high, np.float32), ours.shape)
            )
    obs, _ = gx_env.reset(
        jax.random.key(0), gx_params
    )  # (some lie outside gymnax's own bounds: MemoryChain, GaussianBandit)
    assert obs.shape == env.observation_space(params).shape
    action = gx_env.action_space(gx_params).sample(jax.random.key(1))
    assert not np.all(np.isfinite(action)) or bool(
        env.action_space(params).contains(action)
    )  # gymnax samples inf from +-float32 max


def test_registered_ids_list_the_installed_gymnax_ids():
    ids = envs.registered_ids()
    assert {f"gymnax:{i}" for i in gymnax.registered_envs} <= set(ids)
    assert {"gymnax:Breakout-MinAtar", "gymnax:MemoryChain-bsuite", "gymnax:CartPole-v1"} <= set(
        ids
    )
    assert ids[: len(envs.REGISTRY)] == sorted(envs.REGISTRY)


def test_space_bounds_fall_back_to_the_default_params_under_a_vmap_over_params():
    env, params = envs.make("gymnax:Pendulum-v1")
    axes = jax.tree.map(lambda _: None, params).replace(max_torque=0)
    _, state = env.reset(jax.random.key(0), params)
    step = jax.vmap(env.step, in_axes=(None, None, None, axes))
    out = step(
        jax.random.key(1), state, jnp.array([2.0]), params.replace(max_torque=jnp.array([1.0, 2.0]))
    )
    assert out[0].shape == (2, 3)
    assert env.action_space(params).to_gymnasium().high.tolist() == [2.0]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Breakout-MinAtar"])
def test_wrappers_read_the_spaces_inside_jit(env_id):
    """gymnax computes CartPole's bounds with jnp ops (traced inside jit): the space falls back to
    the default params' one, so the wrappers that read it inside a trace work (Breakout: per
    channel)."""
    env, params = envs.make(f"gymnax:{env_id}")
    assert (
        jax.jit(lambda p: jnp.zeros(env.observation_space(p).shape))(params).shape
        == env.observation_space(params).shape
    )
    venv = envs.NormalizeObservation(envs.EpisodeStatistics(envs.vectorize(env, 4)))
    assert venv.per_channel == (env_id == "Breakout-MinAtar")
    obs, state = jax.jit(venv.reset)(jax.random.key(0), params)
    obs, state, reward, terminated, truncated, info = jax.jit(venv.step)(
        jax.random.key(1), state, jnp.zeros(4, jnp.int32), params
    )
    assert obs.shape == (4,) + env.observation_space(params).shape and info[
        "episode_done"
    ].shape == (4,)
    assert state.obs_stats.mean.shape == (
        4,
    )  # Breakout: one per channel (not [10, 10, 4]); CartPole: one per feature


# --- make's keywords and errors -------------------------------------------------------------------


def test_make_takes_params_fields_and_constructor_keywords():
    env, params = envs.make("gymnax:MemoryChain-bsuite", num_bits=3, memory_length=7)
    assert env.observation_space(params).shape == (5,) and params.memory_length == 7
    assert env.gymnax_env.num_bits == 3
    env, _ = envs.make("gymnax:Breakout-MinAtar", use_minimal_action_set=False)
    assert env.num_actions == 6
    assert isinstance(env, GymnaxEnv) and env.name == "gymnax:Breakout-MinAtar"


def test_make_errors_name_the_problem():
    with pytest.raises(
        ValueError,
        match=(
            r"unknown env param\(s\) \['gravty'\].*constructor keywords: "
            r"\['use_minimal_action_set'\]"
        ),
    ):
        envs.make("gymnax:Breakout-MinAtar", gravty=1)
    with pytest.raises(
        ValueError,
        match=r"unknown gymnax id 'Breakot-MinAtar'. Did you mean 'gymnax:Breakout-MinAtar'",
    ):
        envs.make("gymnax:Breakot-MinAtar")
    with pytest.raises(
        ValueError,
        match=(
            r"unknown env id 'Breakout-MinAtar'. Did you mean "
            r"'gymnax:Breakout-MinAtar'.*'gymnax:<id>'"
        ),
    ):
        envs.make("Breakout-MinAtar")
    env, params = envs.make("gymnax:CartPole-v1")
    _, state = env.reset(jax.random.key(0), params)
    with pytest.raises(
        ValueError, match=r"gymnax:CartPole-v1.step: action 2 is outside Discrete\(2\)"
    ):
        env.step(jax.random.key(0), state, 2, params)


def test_rl_config_takes_gymnax_ids_and_params():
    from rl.config import build_config
    from rl.config.parsing import ConfigError

    config = build_config(
        {
            "env": {
                "id": "gymnax:MemoryChain-bsuite",
                "params": {"memory_length": 4, "num_bits": 2},
            },
            "agent": {"name": "ppo"},
        }
    )
    assert config.env.params == {"memory_length": 4, "num_bits": 2}
    with pytest.raises(
        ConfigError,
        match=r"^env.params: gymnax:MemoryChain-bsuite: unknown env param\(s\) \['memory'\]",
    ):
        build_config(
            {
                "env": {"id": "gymnax:MemoryChain-bsuite", "params": {"memory": 4}},
                "agent": {"name": "ppo"},
            }
        )
    with pytest.raises(ConfigError, match=r"^env.id: unknown gymnax id"):
        build_config({"env": {"id": "gymnax:Nope"}, "agent": {"name": "ppo"}})


# --- a missing extra ------------------------------------------------------------------------------


def test_a_missing_gymnax_gives_one_error_naming_the_extra(monkeypatch):
    from rl.config import build_config
    from rl.config.parsing import ConfigError

    monkeypatch.setitem(
        sys.modules, "gymnax", None
    )  # `import gymnax` now fails as if not installed
    with pytest.raises(
        MissingExtraError, match=r'pip install -e "\.\[gymnax\]" in the fusedrl clone'
    ):
        envs.make("gymnax:Breakout-MinAtar")
    assert isinstance(MissingExtraError("x"), ImportError)
    assert not any(i.startswith("gymnax:") for i in envs.registered_ids())
    with pytest.raises(
        ConfigError,
        match=r'^env.id: gymnax:<id> needs the .gymnax. package, .*pip install -e "\.\[gymnax\]"',
    ):
        build_config({"env": {"id": "gymnax:Breakout-MinAtar"}, "agent": {"name": "ppo"}})


def test_import_envs_does_not_import_gymnax():
    code = (
        "import sys, envs; envs.make('CartPole-v1'); "
        "assert 'gymnax' not in sys.modules, 'gymnax imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- rendering ------------------------------------------------------------------------------------


def test_minatar_frames_are_gymnaxs_viewer_colours():
    import seaborn

    env, params = envs.make("gymnax:Breakout-MinAtar")
    _, state = env.reset(jax.random.key(0), params)
    frame = envs.render(env, state, params)
    assert frame.shape == (160, 160, 3) and frame.dtype == np.uint8
    # gymnax's viewer (gymnax.visualize.vis_minatar): cell value = highest set channel + 1, coloured
    # by [black] + seaborn's cubehelix palette of the channels
    obs = np.asarray(env.gymnax_env.get_obs(state))
    index = np.amax(obs * np.arange(1, 5).reshape(1, 1, -1), axis=2).astype(int)
    colours = np.round(
        np.asarray([(0.0, 0.0, 0.0)] + list(seaborn.color_palette("cubehelix", 4))) * 255
    ).astype(np.uint8)
    np.testing.assert_array_equal(frame[::16, ::16], colours[index])
    np.testing.assert_array_equal(
        frame[16 * 9 : 16 * 10, 16 * 4 : 16 * 5], np.broadcast_to(colours[1], (16, 16, 3))
    )  # the paddle
    assert (index[1:4] == 4).all()  # three rows of bricks
    # a batch of envs: pick one with index=; frames follow the state
    venv = envs.vectorize(env, 3)
    _, states = venv.reset(jax.random.key(1), params)
    for t in range(4):
        _, states, *_ = venv.step(jax.random.key(t), states, jnp.array([1, 2, 0]), params)
    assert not np.array_equal(envs.render(venv, states, params, index=0), frame)


def test_other_gymnax_ids_do_not_render():
    env, params = envs.make("gymnax:CartPole-v1")
    _, state = env.reset(jax.random.key(0), params)
    with pytest.raises(ValueError, match="has no render method"):
        envs.render(env, state, params)


def test_to_gymnasium_passes_the_env_checker():
    from gymnasium.utils.env_checker import check_env

    gym_env = envs.to_gymnasium(*envs.make("gymnax:Breakout-MinAtar"), render_mode="rgb_array")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(gym_env)
    gym_env.reset(seed=0)
    assert gym_env.render().shape == (160, 160, 3)
