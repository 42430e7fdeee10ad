"""The MuJoCo Playground adapter (envs/playground.py) against Playground's own task, stepped with
the same keys under jit and vmap through the `EpisodeWrapper` its `wrap_for_brax_training` uses:
observations, rewards, `done`, the terminated/truncated split at the time limit (checked by hand
too), `action_repeat`, a NaN state's termination; a stand-in task for what the DM Control suite does
not show (dict observations, a task that ends itself at its own step count); spaces, params, the
errors for unknown names, missing Menagerie files and the missing extra; rendering; one SAC update
from the packaged config.

MJX compiles slowly on the CPU (tens of seconds per task): each compiled rollout is built once per
module (module-scoped fixtures) and is small (3 envs, 8 steps)."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs

if importlib.util.find_spec("mujoco_playground") is None:
    pytest.skip(
        'needs the playground extra: pip install "fusedrl[playground]"', allow_module_level=True
    )
from envs.playground import MissingAssetsError, Playground, PlaygroundParams  # noqa: E402

NAME = "CartpoleBalance"  # 1 actuator, 1 substep: the cheapest MJX task to compile
EPISODE_LENGTH, ACTION_REPEAT = 6, 2  # truncation after 3 agent steps
NUM_ENVS, NUM_STEPS = 3, 8


def random_inputs(num_actions, seed=0):
    """Reset keys [N], step keys [T, N] and uniform actions [T, N, A] a little beyond [-1, 1] (to
    check the clipping)."""
    k_reset, k_step, k_action = jax.random.split(jax.random.key(seed), 3)
    actions = jax.random.uniform(
        k_action, (NUM_STEPS, NUM_ENVS, num_actions), minval=-1.2, maxval=1.2
    )
    return (
        jax.random.split(k_reset, NUM_ENVS),
        jax.random.split(k_step, (NUM_STEPS, NUM_ENVS)),
        actions,
    )


def our_functions(env, params):
    """Our vmapped env, jitted: `reset(keys) -> state` and `rollout(state, step_keys, actions)`, a
    scan giving per step (obs, final_obs, reward, terminated, truncated, qpos), and the state after
    each step's auto-reset."""
    reset = jax.jit(lambda keys: jax.vmap(env.reset, in_axes=(0, None))(keys, params)[1])

    @jax.jit
    def run(state, step_keys, actions):
        def body(state, inputs):
            keys, action = inputs
            obs, state, reward, terminated, truncated, info = jax.vmap(
                env.step, in_axes=(0, 0, 0, None)
            )(keys, state, action, params)
            out = (obs, info["final_obs"], reward, terminated, truncated)
            return state, out + (state.env_state.data.qpos, state.time)

        return jax.lax.scan(body, state, (step_keys, actions))[1]

    rollout = lambda state, step_keys, actions: jax.tree.map(
        np.asarray, run(state, step_keys, actions)
    )
    return reset, rollout


def playground_own(task, params, reset_keys, step_keys, actions):
    """Playground's task in Brax's `EpisodeWrapper` (what `wrap_for_brax_training` puts around it),
    actions clipped to [-1, 1]; on `done`, `task.reset` with the reset half of the step key (the Env
    contract's auto-reset). terminated = done and not `info["truncation"]`."""
    from brax.envs.wrappers import training

    wrapped = training.EpisodeWrapper(task, params.episode_length, params.action_repeat)

    def one_step(state, key, action):
        state = wrapped.step(state, jnp.clip(action, -1.0, 1.0))
        done, cut = state.done > 0, state.info["truncation"] > 0
        final_obs, reward = state.obs, state.reward
        restart = wrapped.reset(jax.random.split(key)[1])
        state = jax.tree.map(lambda r, s: jnp.where(done, r, s), restart, state)
        return state, (state.obs, final_obs, reward, done & ~cut, cut)

    @jax.jit
    def run(reset_keys, step_keys, actions):
        state = jax.vmap(wrapped.reset)(reset_keys)

        def body(state, inputs):
            keys, action = inputs
            state, out = jax.vmap(one_step)(state, keys, action)
            return state, out + (state.data.qpos,)

        return jax.lax.scan(body, state, (step_keys, actions))[1]

    return jax.tree.map(np.asarray, run(reset_keys, step_keys, actions))


def compare(name, episode_length, action_repeat):
    """(env, params, inputs, our reset and rollout, our rollout's output, Playground's) for task
    `name` with the given time limit: each compiled once."""
    env, params = envs.make(
        f"playground:{name}", episode_length=episode_length, action_repeat=action_repeat
    )
    inputs = random_inputs(env.action_space(params).shape[0])
    reset, rollout = our_functions(env, params)
    reset_keys, step_keys, actions = inputs
    mine = rollout(reset(reset_keys), step_keys, actions)
    theirs = playground_own(env.playground_env, params, *inputs)
    return env, params, inputs, (reset, rollout), mine, theirs


@pytest.fixture(scope="module")
def cartpole():
    """CartpoleBalance with a time limit of 3 agent steps of 2 physics steps (`compare`)."""
    return compare(NAME, EPISODE_LENGTH, ACTION_REPEAT)


@pytest.fixture(scope="module")
def pendulum():
    """PendulumSwingup (two MJX substeps per control step) with a time limit of 4 steps."""
    return compare("PendulumSwingup", 4, 1)


@pytest.mark.parametrize("task", ["cartpole", "pendulum"])
def test_stepping_equals_playground_with_the_same_keys(task, request):
    *_, mine, theirs = request.getfixturevalue(task)
    names = ("obs", "final_obs", "reward", "terminated", "truncated", "qpos")
    for name, a, b in zip(names, mine, theirs):
        if a.dtype == bool:
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.all(mine[2] >= 0)  # the DM Control suite's rewards lie in [0, 1]


@pytest.mark.parametrize("task, limit", [("cartpole", 3), ("pendulum", 4)])
def test_the_time_limit_truncates_and_never_terminates(task, limit, request):
    _, params, _, _, mine, _ = request.getfixturevalue(task)
    obs, final_obs, _, terminated, truncated, _, time = mine
    # cartpole: ceil(6 / 2), episode_length counts physics steps; pendulum: 4
    assert params.max_steps_in_episode == limit
    assert not terminated.any()  # these tasks' only end is the time limit
    # truncated exactly every `limit` agent steps in every env (each started at step 0)
    expected = np.zeros((NUM_STEPS, NUM_ENVS), bool)
    expected[limit - 1 :: limit] = True
    np.testing.assert_array_equal(truncated, expected)
    # auto-reset: the reached observation is kept in final_obs, the returned one starts anew
    assert not np.allclose(obs[truncated], final_obs[truncated])
    np.testing.assert_array_equal(obs[~truncated], final_obs[~truncated])
    np.testing.assert_array_equal(time[:, 0], (np.arange(NUM_STEPS) + 1) % limit)


def test_a_nan_state_terminates_even_at_the_time_limit(cartpole):
    """Playground's `done` (NaN in the physics, for the DM Control suite) is a termination, also on
    the time limit's last step (a termination wins)."""
    _, _, (reset_keys, step_keys, actions), (reset, rollout), _, _ = cartpole
    state = reset(reset_keys)
    qpos = state.env_state.data.qpos.at[0].set(jnp.nan)  # env 0 breaks
    state = state.replace(
        env_state=state.env_state.replace(data=state.env_state.data.replace(qpos=qpos)),
        time=jnp.array([2, 0, 2]),  # envs 0 and 2 reach the time limit with their next step
    )
    obs, final_obs, _, terminated, truncated, _, time = rollout(state, step_keys, actions)
    np.testing.assert_array_equal(terminated[0], [True, False, False])
    np.testing.assert_array_equal(truncated[0], [False, False, True])
    assert np.isnan(final_obs[0, 0]).any() and np.isfinite(obs[0, 0]).all()
    np.testing.assert_array_equal(time[0], [0, 1, 0])  # the ended episodes restarted
    assert not terminated[1:].any()  # and go on as new episodes


class StandInTask:
    """A Playground-shaped task without physics: the observation {"state": [x], "privileged_state":
    [x, 2x]}, x += action; done when x >= 3, and (like PandaPickCubeCartesian) also when its own
    `info["_steps"]` reaches the config's episode_length."""

    action_size = 1

    def __init__(self, episode_length=4, action_repeat=1):
        from ml_collections import config_dict

        self._config = config_dict.create(
            episode_length=episode_length, action_repeat=action_repeat
        )

    def _state(self, x, steps, done):
        from mujoco_playground import State

        obs = {"state": x[None], "privileged_state": jnp.stack([x, 2 * x])}
        return State(data=x, obs=obs, reward=x, done=done, metrics={"x": x}, info={"_steps": steps})

    def reset(self, rng):
        return self._state(jnp.float32(0), jnp.int32(0), jnp.float32(0))

    def step(self, state, action):
        x = state.data + action[0]
        steps = state.info["_steps"] + self._config.action_repeat
        done = (x >= 3) | (steps >= self._config.episode_length)
        steps = jnp.where(done, 0, steps)
        return self._state(x, steps, done.astype(jnp.float32))


def stand_in_rollout(action_value, num_steps=6):
    # our time limit (10) beyond the task's own (4): only the task ends its episodes at its count
    env = Playground("StandIn", StandInTask(episode_length=4), PlaygroundParams(episode_length=10))
    params = env.default_params
    obs, state = env.reset(jax.random.key(0), params)
    out = []
    for t in range(num_steps):
        obs, state, reward, terminated, truncated, info = env.step(
            jax.random.key(t), state, jnp.array([action_value]), params
        )
        out.append((float(info["final_obs"][0]), bool(terminated), bool(truncated)))
    return env, obs, out


def test_dict_observations_give_the_state_entry_and_the_tasks_own_limit_truncates():
    env, obs, out = stand_in_rollout(0.5)  # x reaches 2 at the limit: only the time limit ends it
    assert env.observation_space(None).shape == (1,) and obs.shape == (1,)
    assert [o[0] for o in out[:4]] == [0.5, 1.0, 1.5, 2.0]
    # the task's own `done` at its step count is a truncation, never a termination
    assert [o[1:] for o in out[:5]] == [(False, False)] * 3 + [(False, True), (False, False)]
    _, _, out = stand_in_rollout(1.0)  # x reaches 3 at step 3, before the limit: a termination
    assert [o[1:] for o in out[:4]] == [(False, False)] * 2 + [(True, False), (False, False)]


def test_a_dict_observation_without_state_is_refused():
    task = StandInTask()
    reset = task.reset
    task.reset = lambda rng: reset(rng).replace(obs={"pixels/view_0": jnp.zeros((8, 8, 3))})
    with pytest.raises(ValueError, match=r"observation is a dict without a 'state' entry"):
        Playground("StandIn", task, PlaygroundParams())


def test_spaces_params_and_errors():
    env, params = envs.make("playground:CheetahRun")
    assert env.observation_space(params).shape == (17,)
    space = env.action_space(params)
    assert space.shape == (6,)
    np.testing.assert_array_equal(space._low, -np.ones(6))
    np.testing.assert_array_equal(space._high, np.ones(6))
    assert (params.episode_length, params.action_repeat, params.max_steps_in_episode) == (
        1000,
        1,
        1000,
    )
    assert env.playground_env.mjx_model.impl.value == "jax"  # not Playground's default, warp
    _, params = envs.make("playground:CheetahRun", episode_length=1000, action_repeat=3)
    assert params.max_steps_in_episode == 334
    assert env.make_params(episode_length=50).episode_length == 50
    with pytest.raises(ValueError, match="Did you mean 'playground:CheetahRun'"):
        envs.make("playground:CheetahRn")
    with pytest.raises(ValueError, match="Did you mean 'playground:CartpoleBalance'"):
        envs.make("CartpoleBalance")  # without the prefix
    with pytest.raises(ValueError, match=r"unknown keyword\(s\) \['no_such_key'\]"):
        envs.make("playground:CheetahRun", no_such_key=1)
    with pytest.raises(ValueError, match=r"unknown keyword\(s\) \['vision_config.nope'\]"):
        envs.make("playground:CartpoleBalance", config_overrides={"vision_config.nope": 1})
    with pytest.raises(ValueError, match="playground:CheetahRun: .*ctrl_dt"):
        envs.make("playground:CheetahRun", ctrl_dt="fast")  # a float key
    with pytest.raises(ValueError, match="action_repeat must be an integer >= 1"):
        envs.make("playground:CheetahRun", action_repeat=0)
    with pytest.raises(ValueError, match=r"vision=True \(pixel observations"):
        envs.make("playground:CartpoleBalance", vision=True)
    assert {"playground:CheetahRun", "playground:G1JoystickFlatTerrain"} <= set(
        envs.registered_ids()
    )


@pytest.mark.parametrize("name", ["G1JoystickFlatTerrain", "PandaPickCube"])
def test_missing_menagerie_files_give_one_error_naming_the_path(name, tmp_path, monkeypatch):
    from mujoco_playground._src import mjx_env

    absent = tmp_path / "mujoco_menagerie"
    monkeypatch.setattr(mjx_env, "MENAGERIE_PATH", absent)  # never cloned: no network here
    with pytest.raises(MissingAssetsError, match="the folder does not exist") as error:
        envs.make(f"playground:{name}")
    message = str(error.value)
    assert f"playground:{name} needs MuJoCo Menagerie" in message
    assert str(absent) in message and mjx_env.MENAGERIE_COMMIT_SHA in message
    assert "git clone https://github.com/google-deepmind/mujoco_menagerie" in message
    absent.mkdir()  # there, but without the robot's files
    with pytest.raises(MissingAssetsError, match="a file is missing there"):
        envs.make(f"playground:{name}")
    assert not any(absent.iterdir())  # nothing was downloaded


def test_render_draws_the_state(cartpole):
    if os.environ.get("MUJOCO_GL") == "disable":
        pytest.skip("MUJOCO_GL=disable: no OpenGL platform here")
    env, params, (reset_keys, _, _), (reset, _), _, _ = cartpole
    frame = envs.render(env, reset(reset_keys), params, index=0)
    assert frame.dtype == np.uint8 and frame.shape == (240, 320, 3)
    assert frame.std() > 5  # a scene, not a blank image


def test_missing_extra_names_it(hide_package):
    hide_package("mujoco_playground")
    with pytest.raises(
        ImportError,
        match=(
            r"playground:CheetahRun needs the \'mujoco_playground\' package, which does not "
            r'import: pip install -e "\.\[playground\]" in the fusedrl clone'
        ),
    ):
        envs.make("playground:CheetahRun")
    assert not any(i.startswith("playground:") for i in envs.registered_ids())


def test_the_packaged_config_loads_and_sac_trains_one_update_on_playground(tmp_path):
    """configs/sac_playground_cheetah_run.yaml loads (CheetahRun made and checked); SAC trains for
    one update at tiny sizes on CartpoleBalance (CheetahRun's contacts take minutes of CPU to
    compile)."""
    from rl.config import load_config
    from rl.run.train import train_many

    path = "configs/sac_playground_cheetah_run.yaml"
    assert load_config(path).env.id == "playground:CheetahRun"
    config = load_config(
        path,
        [
            f"env.id=playground:{NAME}",
            "env.params.episode_length=8",  # episodes end (truncated) within the run
            "agent.total_steps=64",
            "agent.num_envs=4",
            "agent.log_interval=32",
            "agent.learning_starts=32",
            "agent.batch_size=8",
            "agent.utd_ratio=0.5",
            "agent.buffer_size=64",
            "agent.eval_episodes=0",
            "agent.network.hidden=[16,16]",
            "run.seeds=1",
            f"run.output_dir={tmp_path}",
        ],
    )
    _, metrics = train_many(config)
    assert int(np.asarray(metrics["step"])[0, 0, -1]) == config.agent.total_steps
    returns = np.asarray(metrics["episode_return"])
    assert np.isfinite(returns).any()  # episodes ended: 16 steps of each of 4 envs, 8 steps each
