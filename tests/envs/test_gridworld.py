"""GridWorld dynamics: moves, borders, walls, goal, time limit, auto-reset, params,
vmap over params."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs.gridworld import GridWorld, make_gridworld_params

RIGHT, UP, LEFT, DOWN = 0, 1, 2, 3
KEY = jax.random.PRNGKey(0)


def step_from(env, params, cell, action, time=0):
    """One env.step from `cell` (with `time` steps already taken)."""
    from envs.gridworld import GridWorldState

    state = GridWorldState(cell=jnp.int32(cell), time=jnp.int32(time))
    return env.step(KEY, state, jnp.int32(action), params)


def reference_move(row, col, action, size, walls=frozenset()):
    """Independent reference: the (row, col) reached, clipped at the border, blocked by walls."""
    dr, dc = {RIGHT: (0, 1), UP: (-1, 0), LEFT: (0, -1), DOWN: (1, 0)}[action]
    r, c = min(max(row + dr, 0), size - 1), min(max(col + dc, 0), size - 1)
    return (row, col) if (r, c) in walls else (r, c)


def test_defaults():
    env, params = envs.make("GridWorld")
    obs, state = env.reset(KEY, params)
    assert int(obs) == 24 and int(state.time) == 0  # bottom-right of 5x5
    assert int(params.goal) == 0 and params.size == 5
    assert env.observation_space(params).n == 25 and env.action_space(params).n == 4
    assert GridWorld.shortest_path_length(params) == 8


@pytest.mark.parametrize(
    "action, expected", [(RIGHT, (2, 3)), (UP, (1, 2)), (LEFT, (2, 1)), (DOWN, (3, 2))]
)
def test_each_action_moves_one_cell(action, expected):
    env, params = envs.make("GridWorld")
    obs, state, reward, terminated, truncated, info = step_from(env, params, 2 * 5 + 2, action)
    assert divmod(int(obs), 5) == expected
    assert int(state.time) == 1 and float(reward) == 0.0
    assert not bool(terminated) and not bool(truncated)
    assert int(info["final_obs"]) == int(obs)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(2, 7), data=st.data())
def test_moves_match_reference_with_border_clipping_and_walls(size, data):
    cells = st.tuples(st.integers(0, size - 1), st.integers(0, size - 1))
    start = data.draw(cells, "start")
    goal = data.draw(cells.filter(lambda c: c != start), "goal")
    walls = data.draw(
        st.frozensets(cells.filter(lambda c: c not in (start, goal)), max_size=size), "walls"
    )
    cell = data.draw(cells.filter(lambda c: c not in walls and c != goal), "cell")
    action = data.draw(st.integers(0, 3), "action")
    env = GridWorld()
    params = make_gridworld_params(size=size, start=start, goal=goal, walls=sorted(walls))
    obs, state, reward, terminated, truncated, info = step_from(
        env, params, cell[0] * size + cell[1], action
    )
    reached = reference_move(*cell, action, size, walls)
    assert divmod(int(info["final_obs"]), size) == reached
    assert bool(terminated) == (reached == goal)
    assert float(reward) == float(reached == goal)
    if reached == goal:  # auto-reset to the start
        assert int(obs) == start[0] * size + start[1] and int(state.time) == 0
    else:
        assert int(obs) == int(info["final_obs"]) and int(state.time) == 1


def test_corners_clip_at_border():
    env, params = envs.make("GridWorld")
    for cell, blocked in [(24, (RIGHT, DOWN)), (4, (RIGHT, UP)), (20, (LEFT, DOWN))]:
        for action in blocked:
            obs, *_ = step_from(env, params, cell, action)
            assert int(obs) == cell


def test_wall_cells_block_moves():
    env, params = envs.make("GridWorld", walls=[(3, 4), (4, 3)])
    for action in range(4):  # boxed in at the start: no action leaves the corner
        obs, state, *_ = step_from(env, params, 24, action)
        assert int(obs) == 24
    assert GridWorld.shortest_path_length(params) == -1


def test_goal_gives_reward_one_and_terminates_then_resets():
    env, params = envs.make("GridWorld")
    obs, state, reward, terminated, truncated, info = step_from(env, params, 1, LEFT, time=7)
    assert float(reward) == 1.0 and bool(terminated) and not bool(truncated)
    assert int(info["final_obs"]) == 0
    assert int(obs) == 24 and int(state.time) == 0


def test_truncation_at_step_limit_is_not_termination():
    env, params = envs.make("GridWorld", max_steps_in_episode=10)

    @jax.jit
    def rollout(key):
        _, state = env.reset(key, params)

        def body(state, _):  # always RIGHT from the bottom-right corner: never reaches the goal
            obs, state, reward, terminated, truncated, info = env.step(
                key, state, jnp.int32(RIGHT), params
            )
            return state, (state.time, reward, terminated, truncated, info["final_obs"], obs)

        return jax.lax.scan(body, state, None, length=25)[1]

    time, reward, terminated, truncated, final_obs, obs = map(np.asarray, rollout(KEY))
    assert not terminated.any() and not reward.any()
    np.testing.assert_array_equal(np.flatnonzero(truncated), [9, 19])
    np.testing.assert_array_equal(time[:12], [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2])
    assert (final_obs == 24).all() and (obs == 24).all()


def test_truncation_reports_the_pre_reset_obs():
    env, params = envs.make("GridWorld", max_steps_in_episode=3)
    obs, state, reward, terminated, truncated, info = step_from(env, params, 12, UP, time=2)
    assert bool(truncated) and not bool(terminated)
    assert int(info["final_obs"]) == 7  # where the transition went
    assert int(obs) == 24 and int(state.time) == 0  # the fresh episode


def test_goal_on_the_last_step_is_termination_only():
    env, params = envs.make("GridWorld", max_steps_in_episode=3)
    _, _, reward, terminated, truncated, _ = step_from(env, params, 5, UP, time=2)
    assert bool(terminated) and not bool(truncated) and float(reward) == 1.0


def test_optimal_path_reaches_goal_in_shortest_path_length_steps():
    env, params = envs.make("GridWorld")
    _, state = env.reset(KEY, params)
    total = 0.0
    for t, action in enumerate([UP] * 4 + [LEFT] * 4):
        obs, state, reward, terminated, truncated, _ = env.step(
            KEY, state, jnp.int32(action), params
        )
        total += float(reward)
        assert bool(terminated) == (t == 7)
    assert total == 1.0


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(size=1), "size"),
        (dict(start=(5, 0)), "start"),
        (dict(start=25), "start"),
        (dict(goal=(0, -1)), "goal"),
        (dict(walls=[(7, 7)]), "wall"),
        (dict(walls=[(4, 4)]), "start and goal"),
        (dict(walls=[(0, 0)]), "start and goal"),
        (dict(max_steps_in_episode=0), "max_steps_in_episode"),
        (dict(start=(0, 0)), "start and goal must be different"),
    ],
)
def test_bad_params_raise_naming_the_field(kwargs, words):
    with pytest.raises(ValueError, match=words):
        make_gridworld_params(**kwargs)


def test_make_rejects_unknown_param():
    with pytest.raises(ValueError, match="unknown env param.*colour"):
        envs.make("GridWorld", colour="red")


def test_concrete_out_of_range_action_raises():
    env, params = envs.make("GridWorld")
    _, state = env.reset(KEY, params)
    with pytest.raises(ValueError, match="outside Discrete"):
        env.step(KEY, state, jnp.int32(4), params)
    with pytest.raises(ValueError, match="dtype"):
        env.step(KEY, state, jnp.float32(1.0), params)


@pytest.mark.parametrize(
    "kwargs, length",
    [
        (dict(), 8),
        (dict(size=3), 4),
        (dict(start=(0, 1)), 1),
        (dict(size=3, start=(2, 0), goal=(0, 0), walls=[(1, 0), (1, 1)]), 6),
        (dict(size=3, start=(2, 0), goal=(0, 0), walls=[(1, 0), (1, 1), (1, 2)]), -1),
    ],
)
def test_shortest_path_length(kwargs, length):
    assert GridWorld.shortest_path_length(make_gridworld_params(**kwargs)) == length


def test_vmap_over_params_with_different_goals():
    env = GridWorld()
    goals = [(0, 0), (3, 4), (3, 3), (2, 2)]
    batch = [make_gridworld_params(goal=g) for g in goals]
    params = jax.tree.map(lambda *xs: jnp.stack(xs), *batch)

    @jax.jit
    @jax.vmap
    def first_two_steps(params):
        _, state = env.reset(KEY, params)
        _, state, r1, t1, _, _ = env.step(KEY, state, jnp.int32(UP), params)
        _, state, r2, t2, _, i2 = env.step(KEY, state, jnp.int32(LEFT), params)
        return jnp.stack([r1, r2]), jnp.stack([t1, t2]), i2["final_obs"]

    rewards, terminated, final_obs = map(np.asarray, first_two_steps(params))
    # from (4, 4): UP reaches (3, 4); then LEFT from the start (after reset) or from (3, 4).
    np.testing.assert_array_equal(rewards, [[0, 0], [1, 0], [0, 1], [0, 0]])
    np.testing.assert_array_equal(terminated, rewards.astype(bool))
    np.testing.assert_array_equal(final_obs, [18, 23, 18, 18])
