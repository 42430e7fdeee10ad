"""The Brax adapter (envs/brax.py) against Brax's own env and wrappers, stepped with the same keys
under jit and vmap: observations, rewards, the terminated/truncated split of `episode_length`,
`action_repeat`, both auto-reset modes; spaces, backends, rendering, the missing-extra error, and a
short training run from each Brax config."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import subprocess_env

import envs

if importlib.util.find_spec("brax") is None:
    pytest.skip('needs the brax extra: pip install "fusedrl[brax]"', allow_module_level=True)
from envs.brax import _brax_envs  # noqa: E402

brax_envs = (
    _brax_envs()
)  # Brax, imported as the adapter does: MuJoCo's OpenGL set to EGL before MuJoCo loads

NAME, BACKEND = (
    "inverted_pendulum",
    "spring",
)  # terminates often under random actions; cheap to compile
EPISODE_LENGTH, ACTION_REPEAT = 16, 2  # truncation after 8 agent steps
NUM_ENVS, NUM_STEPS = 4, 24


def random_inputs(env, params, seed=0):
    """Reset keys [N], step keys [T, N] and uniformly random actions [T, N, A] (a little beyond the
    bounds, to check the clipping)."""
    k_reset, k_step, k_action = jax.random.split(jax.random.key(seed), 3)
    space = env.action_space(params)
    actions = (
        jax.random.uniform(k_action, (NUM_STEPS, NUM_ENVS) + space.shape, minval=-1.2, maxval=1.2)
        * space._high
    )
    return (
        jax.random.split(k_reset, NUM_ENVS),
        jax.random.split(k_step, (NUM_STEPS, NUM_ENVS)),
        actions,
    )


def ours(env, params, reset_keys, step_keys, actions):
    """Our vmapped env in a jitted scan: per step
    (obs, final_obs, reward, terminated, truncated, q)."""

    @jax.jit
    def run(reset_keys, step_keys, actions):
        _, state = jax.vmap(env.reset, in_axes=(0, None))(reset_keys, params)

        def body(state, inputs):
            keys, action = inputs
            obs, state, reward, terminated, truncated, info = jax.vmap(
                env.step, in_axes=(0, 0, 0, None)
            )(keys, state, action, params)
            return state, (
                obs,
                info["final_obs"],
                reward,
                terminated,
                truncated,
                state.env_state.pipeline_state.q,
            )

        return jax.lax.scan(body, state, (step_keys, actions))[1]

    return jax.tree.map(np.asarray, run(reset_keys, step_keys, actions))


def brax_own(brax_env, reset_keys, step_keys, actions, low, high, fresh: bool):
    """Brax's own wrapped env, the same way. fresh: `EpisodeWrapper`, then on done `reset` with the
    reset half of the step key (the Env contract's auto-reset). first: `EpisodeWrapper` and Brax's
    `AutoResetWrapper`, which returns the restart's obs at once (the reached obs is gone: NaN)."""

    def one_step(state, key, action):
        state = brax_env.step(state, jnp.clip(action, low, high))
        done, cut = state.done > 0, state.info["truncation"] > 0
        final_obs = state.obs if fresh else jnp.where(done, jnp.nan, state.obs)
        reward = state.reward
        if fresh:
            restart = brax_env.reset(jax.random.split(key)[1])
            state = jax.tree.map(lambda r, s: jnp.where(done, r, s), restart, state)
        return state, (state.obs, final_obs, reward, done & ~cut, cut)

    @jax.jit
    def run(reset_keys, step_keys, actions):
        state = jax.vmap(brax_env.reset)(reset_keys)

        def body(state, inputs):
            keys, action = inputs
            state, out = jax.vmap(one_step)(state, keys, action)
            return state, out + (state.pipeline_state.q,)

        return jax.lax.scan(body, state, (step_keys, actions))[1]

    return jax.tree.map(np.asarray, run(reset_keys, step_keys, actions))


def assert_same(mine, theirs):
    names = ("obs", "final_obs", "reward", "terminated", "truncated", "q")
    for name, a, b in zip(names, mine, theirs):
        if a.dtype == bool:
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            known = ~np.isnan(b)
            np.testing.assert_allclose(a[known], b[known], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("auto_reset", ["fresh", "first"])
def test_stepping_equals_brax_with_the_same_keys(auto_reset):
    env, params = envs.make(
        f"brax:{NAME}",
        backend=BACKEND,
        episode_length=EPISODE_LENGTH,
        action_repeat=ACTION_REPEAT,
        auto_reset=auto_reset,
    )
    reset_keys, step_keys, actions = random_inputs(env, params)
    mine = ours(env, params, reset_keys, step_keys, actions)
    wrapped = brax_envs.create(
        NAME,
        backend=BACKEND,
        episode_length=EPISODE_LENGTH,
        action_repeat=ACTION_REPEAT,
        auto_reset=auto_reset == "first",
    )
    space = env.action_space(params)
    theirs = brax_own(
        wrapped,
        reset_keys,
        step_keys,
        actions,
        space._low,
        space._high,
        fresh=auto_reset == "fresh",
    )
    assert_same(mine, theirs)
    _, _, _, terminated, truncated, _ = mine
    assert terminated.any() and truncated.any()  # both kinds of episode end were compared
    assert not (terminated & truncated).any()
    # truncation is the time limit: ceil(16 / 2) = 8 agent steps after a reset, counted per env
    steps_since_reset = np.zeros(NUM_ENVS, int)
    for t in range(NUM_STEPS):
        steps_since_reset += 1
        np.testing.assert_array_equal(
            truncated[t], (steps_since_reset >= params.max_steps_in_episode) & ~terminated[t]
        )
        steps_since_reset[terminated[t] | truncated[t]] = 0


def test_spaces_params_and_every_backend():
    for backend in ("mjx", "generalized", "positional", "spring"):
        env, params = envs.make("brax:ant", backend=backend)
        assert env.backend == backend
        assert env.observation_space(params).shape == (27,)
        space = env.action_space(params)
        assert space.shape == (8,)
        np.testing.assert_array_equal(space._low, -np.ones(8))
        np.testing.assert_array_equal(space._high, np.ones(8))
    assert space.to_gymnasium().shape == (8,)
    assert (params.episode_length, params.action_repeat, params.max_steps_in_episode) == (
        1000,
        1,
        1000,
    )
    _, params = envs.make("brax:ant", episode_length=1000, action_repeat=3)
    assert (
        params.max_steps_in_episode == 334
    )  # ceil(1000 / 3): Brax's EpisodeWrapper counts physics steps
    with pytest.raises(ValueError, match="unknown Brax env 'antt'"):
        envs.make("brax:antt")
    with pytest.raises(ValueError, match="action_repeat must be an integer >= 1"):
        envs.make("brax:ant", action_repeat=0)
    with pytest.raises(ValueError, match="auto_reset must be one of"):
        envs.make("brax:ant", auto_reset="never")
    with pytest.raises(ValueError, match="brax:ant: .*no_such_keyword"):
        envs.make("brax:ant", no_such_keyword=1)
    assert {"brax:ant", "brax:halfcheetah", "brax:humanoid"} <= set(envs.registered_ids())


def test_render_draws_the_state_without_a_display():
    if (
        os.environ.get("MUJOCO_GL") == "disable"
    ):  # set by envs.brax without a display, libEGL or libOSMesa (the GPU machine)
        pytest.skip(
            "MUJOCO_GL=disable: no OpenGL platform here "
            "(test_steps_on_a_machine_without_gl_libraries checks render's error)"
        )
    env, params = envs.make(f"brax:{NAME}", backend=BACKEND)
    _, state = env.reset(jax.random.key(0), params)
    frame = envs.render(env, state, params)
    assert frame.dtype == np.uint8 and frame.shape == (240, 320, 3)
    assert frame.std() > 5  # a scene, not a blank image


def test_headless_gl_platform_is_one_that_can_load():
    from envs.brax import headless_mujoco_gl

    assert headless_mujoco_gl(lambda name: "libEGL.so.1" if name == "EGL" else None) == "egl"
    assert headless_mujoco_gl(lambda name: "libOSMesa.so" if name == "OSMesa" else None) == "osmesa"
    assert headless_mujoco_gl(lambda name: None) == "disable"


def test_steps_on_a_machine_without_gl_libraries():
    # what headless_mujoco_gl picks where neither libEGL nor libOSMesa loads: brax imports and
    # steps, and render raises one RuntimeError naming MUJOCO_GL
    import subprocess
    import sys

    script = (
        "import jax, envs\n"
        f"env, params = envs.make('brax:{NAME}', backend='{BACKEND}')\n"
        "obs, state = env.reset(jax.random.key(0), params)\n"
        "obs, state, reward, terminated, truncated, info = env.step(jax.random.key(1), state, "
        "env.action_space(params).sample(jax.random.key(2)), params)\n"
        "print('RESULT', obs.shape, float(reward) == float(reward))\n"
        "try:\n"
        "    envs.render(env, state, params)\n"
        "except RuntimeError as error:\n"
        "    print('RENDER', 'OpenGL context' in str(error) and 'MUJOCO_GL' in str(error))\n"
    )
    env = subprocess_env(MUJOCO_GL="disable", JAX_PLATFORMS="cpu")
    env.pop("DISPLAY", None)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "RESULT" in proc.stdout and "True" in proc.stdout, proc.stderr[
        -2000:
    ]
    assert "RENDER True" in proc.stdout  # render says why it cannot draw


def test_missing_extra_names_it(hide_package):
    hide_package("brax")
    with pytest.raises(
        ImportError,
        match=(
            r"brax:ant needs the \'brax.envs\' package, which does not import: "
            r'pip install -e "\.\[brax\]" in the fusedrl clone'
        ),
    ):
        envs.make("brax:ant", backend="mjx")
    assert not any(i.startswith("brax:") for i in envs.registered_ids())
    from rl.config import build_config
    from rl.config.parsing import ConfigError

    with pytest.raises(ConfigError, match=r'env.id: .*pip install -e "\.\[brax\]"'):
        build_config({"env": {"id": "brax:ant"}, "agent": {"name": "ppo"}})


@pytest.mark.parametrize(
    "config, overrides",
    [
        (
            "configs/ppo_brax_ant.yaml",
            [
                "agent.total_steps=40",
                "agent.num_envs=4",
                "agent.num_steps=10",
                "agent.num_minibatches=2",
                "agent.log_interval=1",
                # its greedy evaluation (a second copy of the env in the program) doubles the
                # compile; evaluation is tested on the built-in envs (tests/rl/test_ppo.py)
                "agent.eval_envs=0",
            ],
        ),
        (
            "configs/sac_brax_halfcheetah.yaml",
            [
                "agent.total_steps=64",
                "agent.num_envs=4",
                "agent.log_interval=32",
                "agent.learning_starts=32",
                "agent.batch_size=8",
                "agent.utd_ratio=0.5",
                "agent.buffer_size=64",
                "agent.eval_episodes=0",
            ],
        ),
        (
            "configs/fasttd3_brax_humanoid.yaml",
            [
                "agent.total_steps=64",
                "agent.num_envs=4",
                "agent.log_interval=32",
                "agent.learning_starts=32",
                "agent.batch_size=8",
                "agent.utd_ratio=0.5",
                "agent.buffer_size=64",
                "agent.eval_episodes=0",
                "agent.network.critic_hidden=[16,16]",
            ],
        ),
    ],
)
def test_one_update_from_the_config(config, overrides, tmp_path):
    """The shipped config trains for one update on the CPU
    (tiny sizes; the spring backend to compile fast)."""
    from rl.config import load_config
    from rl.run.train import train_many

    config = load_config(
        config,
        overrides
        + [
            "env.params.backend=spring",
            "agent.network.hidden=[16,16]",
            "run.seeds=1",
            f"run.output_dir={tmp_path}",
        ],
    )
    assert config.env.id.startswith("brax:")
    _, metrics = train_many(config)
    assert int(np.asarray(metrics["step"])[0, 0, -1]) == config.agent.total_steps
    assert np.isfinite(
        np.asarray(metrics["episode_return"])[np.isfinite(np.asarray(metrics["episode_return"]))]
    ).all()
