"""The Craftax adapter (envs/craftax.py) against Craftax's own auto-resetting env, stepped with the
same keys under jit and vmap (observations, rewards, info, the whole auto-reset state), the
terminated/truncated split of Craftax's `done`; spaces of every id, rendering, the missing-extra
error, and a short training run from configs/ppo_craftax_symbolic.yaml."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import subprocess_env

import envs

if importlib.util.find_spec("craftax") is None:
    pytest.skip('needs the craftax extra: pip install "fusedrl[craftax]"', allow_module_level=True)
from craftax.craftax_env import make_craftax_env_from_name  # noqa: E402

ENV_ID = (
    "Craftax-Classic-Symbolic-v1"  # the cheapest to compile; the full game runs in the config test
)
NUM_ENVS, NUM_STEPS, MAX_TIMESTEPS = 3, 12, 5


def same(a, b):
    """Equal: exactly for integers and booleans, to float32 round-off for floats (XLA fuses the two
    programs' arithmetic differently, e.g. the light level differs in the last bit)."""
    if np.issubdtype(np.asarray(a).dtype, np.floating):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def env_params():
    return envs.make(f"craftax:{ENV_ID}", max_timesteps=MAX_TIMESTEPS)


def test_stepping_equals_craftax_with_the_same_keys(env_params):
    """Our env and Craftax's own `auto_reset=True` env, in one jitted vmapped scan from the same
    states with the same keys and actions; one env starts with no health left one step before the
    time limit (it terminates), and the time limit of 5 steps truncates the others."""
    env, params = env_params
    theirs = make_craftax_env_from_name(ENV_ID, auto_reset=True)
    k_reset, k_steps, k_actions = jax.random.split(jax.random.PRNGKey(0), 3)
    reset_keys = jax.random.split(k_reset, NUM_ENVS)
    step_keys = jax.random.split(k_steps, NUM_STEPS * NUM_ENVS).reshape(NUM_STEPS, NUM_ENVS, -1)
    actions = jax.random.randint(k_actions, (NUM_STEPS, NUM_ENVS), 0, env.action_space(params).n)
    dying = jnp.array(
        [True, False, False]
    )  # env 0 starts at 0 health on the last step before the time limit

    @jax.jit
    def run(reset_keys, step_keys, actions):
        _, state = jax.vmap(env.reset, in_axes=(0, None))(reset_keys, params)
        health = jnp.where(dying, 0, state.env_state.player_health).astype(
            state.env_state.player_health.dtype
        )
        timestep = jnp.where(dying, MAX_TIMESTEPS - 1, state.env_state.timestep)
        state = state.replace(
            env_state=state.env_state.replace(player_health=health, timestep=timestep)
        )
        lib_state = state.env_state

        def body(carry, inputs):
            state, lib_state = carry
            keys, action = inputs
            obs, state, reward, terminated, truncated, info = jax.vmap(
                env.step, in_axes=(0, 0, 0, None)
            )(keys, state, action, params)
            lib_obs, lib_state, lib_reward, lib_done, lib_info = jax.vmap(
                theirs.step, in_axes=(0, 0, 0, None)
            )(keys, lib_state, action, params)
            return (state, lib_state), (
                (obs, reward, terminated, truncated, info, state.env_state),
                (lib_obs, lib_reward, lib_done, lib_info, lib_state),
            )

        return jax.lax.scan(body, (state, lib_state), (step_keys, actions))[1]

    mine, lib = jax.tree.map(np.asarray, run(reset_keys, step_keys, actions))
    obs, reward, terminated, truncated, info, states = mine
    lib_obs, lib_reward, lib_done, lib_info, lib_states = lib
    same(obs, lib_obs)
    same(reward, lib_reward)
    np.testing.assert_array_equal(terminated | truncated, lib_done)
    final_obs = info.pop("final_obs")
    jax.tree.map(same, info, lib_info)
    going_on = ~(terminated | truncated)
    same(
        final_obs[going_on], obs[going_on]
    )  # final_obs is the observation reached: obs unless the episode ended
    assert not np.allclose(final_obs[~going_on], obs[~going_on])
    jax.tree.map(same, states, lib_states)  # auto-reset states included
    assert not (terminated & truncated).any()
    assert (
        terminated[0, 0] and not truncated[0, 0]
    )  # a death at the time limit is a termination, not a truncation
    # the time limit is truncation: every MAX_TIMESTEPS steps in the envs that do not die
    expected = np.zeros_like(truncated)
    expected[MAX_TIMESTEPS - 1 :: MAX_TIMESTEPS, 1:] = True
    np.testing.assert_array_equal(truncated[:, 1:], expected[:, 1:])
    assert not terminated[:, 1:].any()


SPACES = [
    ("Craftax-Classic-Symbolic-v1", (1345,), 17),
    ("Craftax-Symbolic-v1", (8268,), 43),
    ("Craftax-Classic-Pixels-v1", (63, 63, 3), 17),
    pytest.param(
        "Craftax-Pixels-v1", (130, 110, 3), 43, marks=pytest.mark.slow
    ),  # its textures take minutes to process the first time
]


@pytest.mark.parametrize("env_id, obs_shape, actions", SPACES)
def test_spaces_of_every_id(env_id, obs_shape, actions):
    env, params = envs.make(f"craftax:{env_id}")
    assert (
        env.observation_space(params).shape == obs_shape and env.action_space(params).n == actions
    )
    assert env.observation_space(params).to_gymnasium().shape == obs_shape
    obs, _ = jax.eval_shape(env.reset, jax.random.PRNGKey(0), params)
    assert obs.shape == obs_shape and obs.dtype == jnp.float32
    assert (
        params.max_steps_in_episode
        == params.max_timesteps
        == (10_000 if "Classic" in env_id else 100_000)
    )


def test_params_and_ids():
    _, params = envs.make("craftax:Craftax-Symbolic-v1", max_timesteps=50, day_length=20)
    assert (params.max_steps_in_episode, params.day_length) == (50, 20)
    assert jax.tree.leaves(params)  # a pytree (vmappable)
    with pytest.raises(ValueError, match="unknown env param"):
        envs.make("craftax:Craftax-Symbolic-v1", max_steps=50)
    with pytest.raises(ValueError, match="unknown Craftax id 'Craftax-Symbolic-v2'"):
        envs.make("craftax:Craftax-Symbolic-v2")
    assert {
        f"craftax:{i}"
        for i in (
            "Craftax-Symbolic-v1",
            "Craftax-Pixels-v1",
            "Craftax-Classic-Symbolic-v1",
            "Craftax-Classic-Pixels-v1",
        )
    } <= set(envs.registered_ids())


def test_render(env_params):
    env, params = env_params
    _, state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(jax.random.PRNGKey(0), 2), params
    )
    frame = envs.render(env, state, params, index=1)
    assert frame.dtype == np.uint8 and frame.shape == (144, 144, 3) and frame.std() > 10


# Craftax's own cache logic with its image processing (tens of CPU seconds; the Pixels and render
# tests above run it) replaced by textures of the right shapes: what is under test is the lock and
# the rebuild of a damaged cache file.
LOAD_TEXTURES = """
import sys
import numpy as np
import craftax.craftax_classic.constants as constants
from envs.craftax import load_textures

def placeholder_textures(size):
    blocks = (len(constants.BlockType), constants.OBS_DIM[0] * size, constants.OBS_DIM[1] * size, 3)
    return {"full_map_block_textures": np.zeros(blocks, np.uint8)}

constants.load_all_textures_given_size = placeholder_textures
constants.TEXTURE_CACHE_FILE = sys.argv[1]
load_textures(constants)
print("textures", len(constants.load_all_textures()))
"""


def test_texture_cache_is_built_once_and_a_truncated_one_is_rebuilt(tmp_path):
    """Two processes load Craftax-Classic's textures at once through `envs.craftax.load_textures`,
    with the cache path pointing at a truncated file (what a killed writer leaves, and what a reader
    sees while another process writes): Craftax alone fails to read it (EOFError); through the lock
    both processes load the textures and the rebuilt cache file reads back whole. (The textures
    are placeholders of the right shapes: LOAD_TEXTURES.)"""
    from craftax.craftax_classic import constants
    from craftax.environment_base.util import load_compressed_pickle

    cache = tmp_path / "textures.pbz2"
    whole = Path(constants.TEXTURE_CACHE_FILE)
    cache.write_bytes(whole.read_bytes()[:1000] if whole.exists() else b"BZh91AY&SY")
    with pytest.raises(EOFError):
        load_compressed_pickle(str(cache))
    env = subprocess_env(JAX_PLATFORMS="cpu")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LOAD_TEXTURES, str(cache)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-2000:]
        assert "textures 3" in out
    textures = load_compressed_pickle(str(cache))
    assert set(textures) == {
        constants.BLOCK_PIXEL_SIZE_AGENT,
        constants.BLOCK_PIXEL_SIZE_IMG,
        constants.BLOCK_PIXEL_SIZE_HUMAN,
    }


def test_missing_extra_names_it(hide_package):
    hide_package("craftax")
    with pytest.raises(ImportError, match=r'pip install -e "\.\[craftax\]"'):
        envs.make("craftax:Craftax-Symbolic-v1")
    assert not any(i.startswith("craftax:") for i in envs.registered_ids())


@pytest.mark.parametrize(
    "env_id",
    [
        # the classic game compiles in a fraction of the full game's time
        "craftax:Craftax-Classic-Symbolic-v1",
        # as configured: about 4 minutes on 2 CPU cores
        pytest.param("craftax:Craftax-Symbolic-v1", marks=pytest.mark.slow),
    ],
)
def test_one_update_from_the_config(env_id, tmp_path):
    """configs/ppo_craftax_symbolic.yaml trains for one update on the CPU (tiny sizes)."""
    from rl.config import load_config
    from rl.run.train import train_many

    overrides = [
        "agent.total_steps=32",
        "agent.num_envs=2",
        "agent.num_steps=16",
        "agent.num_minibatches=2",
        "agent.log_interval=1",
        "agent.network.hidden=[16]",
        "run.seeds=1",
        f"run.output_dir={tmp_path}",
        f"env.id={env_id}",
    ]
    config = load_config("configs/ppo_craftax_symbolic.yaml", overrides)
    assert config.env.id == env_id and config.agent.num_envs == 2
    _, metrics = train_many(config)
    assert int(np.asarray(metrics["step"])[0, 0, -1]) == 32
    assert np.isfinite(np.asarray(metrics["value_loss"])).all()
