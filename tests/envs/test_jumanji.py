"""The Jumanji adapter (envs/jumanji.py) against Jumanji's own TimeStep API, stepped with the same
keys under jit and vmap: flattened observations, rewards, LAST with discount 0 as termination and
with discount 1 as truncation, the auto-reset state; spaces (the flattening rule, MultiDiscrete
actions), rendering and the missing-extra error."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs

if importlib.util.find_spec("jumanji") is None:
    pytest.skip('needs the jumanji extra: pip install "fusedrl[jumanji]"', allow_module_level=True)
import jumanji  # noqa: E402
import jumanji.wrappers  # noqa: E402

NUM_ENVS, NUM_STEPS = 8, 40
SNAKE = {
    "num_rows": 7,
    "num_cols": 7,
    "time_limit": 6,
}  # a small board: random snakes die, the rest hit the time limit


class TimeLimitAsTruncation(jumanji.wrappers.Wrapper):
    """Snake whose own time limit ends the episode with discount 1 (Snake itself says 0), so both
    kinds of LAST step occur."""

    def step(self, state, action):
        state, timestep = self._env.step(state, action)
        cut = (
            timestep.last() & (state.step_count >= self._env.time_limit) & (timestep.discount == 0)
        )
        died = timestep.last() & ~cut
        return state, timestep.replace(
            discount=jnp.where(died, 0.0, 1.0).astype(timestep.discount.dtype)
        )


def flat(observation):
    """The documented rule, written out: the leaves of the observation in pytree order, raveled,
    float32."""
    return jnp.concatenate(
        [jnp.ravel(jnp.asarray(x, jnp.float32)) for x in jax.tree.leaves(observation)]
    )


def host(tree):
    """NumPy leaves (typed PRNG keys, which Jumanji's states hold, as their key data)."""
    return jax.tree.map(
        lambda x: np.asarray(
            jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
        ),
        tree,
    )


def test_stepping_equals_jumanji_with_the_same_keys():
    from envs.jumanji import Jumanji

    theirs = TimeLimitAsTruncation(jumanji.make("Snake-v1", **SNAKE))
    env = Jumanji(theirs)
    params = env.make_params(max_steps_in_episode=100)  # Jumanji's own ends only
    k_reset, k_steps, k_actions = jax.random.split(jax.random.key(0), 3)
    reset_keys = jax.random.split(k_reset, NUM_ENVS)
    step_keys = jax.random.split(k_steps, (NUM_STEPS, NUM_ENVS))
    actions = jax.random.randint(k_actions, (NUM_STEPS, NUM_ENVS), 0, 4)

    def lib_step(state, key, action):
        """Jumanji's step; on LAST, `reset` with the reset half of the step key
        (the Env contract)."""
        state, timestep = theirs.step(state, action)
        restart, first = theirs.reset(jax.random.split(key)[1])
        last = timestep.last()
        new_state = jax.tree.map(lambda r, s: jnp.where(last, r, s), restart, state)
        obs = jnp.where(last, flat(first.observation), flat(timestep.observation))
        return new_state, (
            obs,
            flat(timestep.observation),
            timestep.reward,
            last & (timestep.discount == 0),
            last & (timestep.discount > 0),
        )

    @jax.jit
    def run(reset_keys, step_keys, actions):
        _, state = jax.vmap(env.reset, in_axes=(0, None))(reset_keys, params)
        lib_state, _ = jax.vmap(theirs.reset)(reset_keys)

        def body(carry, inputs):
            state, lib_state = carry
            keys, action = inputs
            obs, state, reward, terminated, truncated, info = jax.vmap(
                env.step, in_axes=(0, 0, 0, None)
            )(keys, state, action, params)
            lib_state, lib_out = jax.vmap(lib_step)(lib_state, keys, action)
            return (state, lib_state), (
                (obs, info["final_obs"], reward, terminated, truncated),
                lib_out,
                state.env_state,
                lib_state,
            )

        return jax.lax.scan(body, (state, lib_state), (step_keys, actions))[1]

    mine, lib, states, lib_states = host(run(reset_keys, step_keys, actions))
    for name, a, b in zip(("obs", "final_obs", "reward", "terminated", "truncated"), mine, lib):
        np.testing.assert_array_equal(a, b, err_msg=name)
    jax.tree.map(np.testing.assert_array_equal, states, lib_states)  # the auto-reset states too
    _, _, _, terminated, truncated = mine
    assert terminated.any() and truncated.any() and not (terminated & truncated).any()


def test_our_time_limit_truncates_and_snakes_own_limit_is_a_termination():
    env, params = envs.make("jumanji:Snake-v1", **SNAKE)
    assert (
        params.max_steps_in_episode == 6
    )  # the env's own time_limit, which Snake ends with discount 0
    _, state = env.reset(jax.random.key(0), params)
    step = jax.jit(env.step)
    for t in range(6):
        _, state, _, terminated, truncated, _ = step(
            jax.random.key(t), state, jnp.int32(t % 4), params
        )
    assert bool(terminated) and not bool(truncated)
    params = params.replace(max_steps_in_episode=3)
    _, state = env.reset(jax.random.key(0), params)
    flags = []
    for t, action in enumerate(
        [0, 1, 2, 3]
    ):  # up, right, down, left: a loop, no death, no fruit needed
        _, state, _, terminated, truncated, _ = step(
            jax.random.key(t), state, jnp.int32(action), params
        )
        flags.append((bool(terminated), bool(truncated), int(state.time)))
    assert flags == [(False, False, 1), (False, False, 2), (False, True, 0), (False, False, 1)]


def test_spaces_follow_the_flattening_rule():
    env, params = envs.make("jumanji:Snake-v1")
    space = env.observation_space(params)
    assert space.shape == (12 * 12 * 5 + 1 + 4,)  # grid [12, 12, 5], step_count, action_mask [4]
    np.testing.assert_array_equal(space._low, 0.0)
    np.testing.assert_array_equal(space._high[:720], 1.0)
    assert space._high[720] == 3999 and np.all(
        space._high[721:] == 1.0
    )  # DiscreteArray(4000); booleans in [0, 1]
    assert env.action_space(params).n == 4
    obs, state = env.reset(jax.random.key(0), params)
    _, timestep = env.jumanji_env.reset(jax.random.key(0))
    np.testing.assert_array_equal(obs, flat(timestep.observation))
    assert bool(space.contains(obs))
    tree = env.unflatten_observation(jnp.stack([obs, obs]))  # any batch shape
    assert tree.grid.shape == (2, 12, 12, 5) and tree.action_mask.shape == (2, 4)
    np.testing.assert_array_equal(tree.grid[0], timestep.observation.grid)
    np.testing.assert_array_equal(tree.action_mask[1], timestep.observation.action_mask)


def test_multidiscrete_actions_are_one_joint_discrete_action():
    env, params = envs.make("jumanji:RubiksCube-v0")  # (face 6, depth 1, direction 3)
    assert env.action_space(params).n == 18 and params.max_steps_in_episode == 200
    for index in (0, 5, 17):
        np.testing.assert_array_equal(
            env.jumanji_action(jnp.int32(index)), np.unravel_index(index, (6, 1, 3))
        )
    obs, state = env.reset(jax.random.key(0), params)
    obs, state, reward, *_ = jax.jit(env.step)(jax.random.key(1), state, jnp.int32(17), params)
    lib_state, _ = env.jumanji_env.reset(jax.random.key(0))
    lib_state, timestep = env.jumanji_env.step(lib_state, jnp.array([5, 0, 2], jnp.int32))
    np.testing.assert_array_equal(obs, flat(timestep.observation))


def test_unsupported_envs_and_ids_are_refused():
    with pytest.raises(ValueError, match="only single-agent envs"):
        envs.make("jumanji:Connector-v3")
    with pytest.raises(ValueError, match="unknown Jumanji id 'Snake-v9'"):
        envs.make("jumanji:Snake-v9")
    with pytest.raises(ValueError, match="jumanji:Snake-v1: .*no_such_keyword"):
        envs.make("jumanji:Snake-v1", no_such_keyword=1)
    assert {"jumanji:Snake-v1", "jumanji:Game2048-v1"} <= set(envs.registered_ids())


def test_render():
    env, params = envs.make("jumanji:Snake-v1", num_rows=6, num_cols=6)
    _, state = env.reset(jax.random.key(0), params)
    frame = envs.render(env, state, params)
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3 and frame.std() > 1


def test_missing_extra_names_it(hide_package):
    hide_package("jumanji")
    with pytest.raises(
        ImportError,
        match=(
            r"jumanji:Snake-v1 needs the \'jumanji\' package, which does not import: "
            r'pip install -e "\.\[jumanji\]" in the fusedrl clone'
        ),
    ):
        envs.make("jumanji:Snake-v1")
    assert not any(i.startswith("jumanji:") for i in envs.registered_ids())


def test_rl_train_takes_the_id_and_its_params(tmp_path, capsys):
    """`rl train` with a Jumanji id in env.id and its keywords (Jumanji's and ours) under
    env.params."""
    import json

    import yaml

    from rl.cli.main import main

    config = {
        "env": {
            "id": "jumanji:Snake-v1",
            "params": {"num_rows": 6, "num_cols": 6, "time_limit": 50, "max_steps_in_episode": 40},
        },
        "agent": {
            "name": "ppo",
            "total_steps": 64,
            "num_envs": 2,
            "num_steps": 16,
            "num_minibatches": 2,
            "log_interval": 2,
            "network": {"hidden": [16]},
        },
        "run": {"seeds": 1, "progress": False, "output_dir": str(tmp_path), "name": "snake"},
    }
    (tmp_path / "snake.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", str(tmp_path / "snake.yaml")]) == 0
    summary = json.loads((tmp_path / "snake" / "summary.json").read_text())
    assert summary["env"] == "jumanji:Snake-v1"
    assert main(["train", str(tmp_path / "snake.yaml"), "env.params.num_rowz=6"]) == 2
    assert "num_rowz" in capsys.readouterr().err
