"""Tabular Q-learning: learns the 5x5 GridWorld (its greedy evaluation walks the shortest path),
vmap == per seed, tie-breaking and the epsilon schedule in the trainer, TD update, truncation
bootstrapping, chunked runs, sweeps, the evaluation leaving the training stream alone. The
exploration pieces themselves (exploration.epsilon_greedy_random_ties, exploration.linear_schedule)
are tested in test_exploration.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs.gridworld import GridWorld, make_gridworld_params, move
from rl.agents import qlearning
from rl.config import build_config, hyperparams, load_config
from rl.run.programs import seed_keys
from rl.run.train import train_many


def make_config(env_params=None, seeds=1, **agent):
    agent = {"name": "qlearning", "total_steps": 2000, "log_interval": 500, **agent}
    return build_config(
        {
            "env": {"id": "GridWorld", "params": env_params or {}},
            "agent": agent,
            "run": {"seeds": seeds},
        }
    )


def assert_trees_equal(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_default_config_trains_all_30_seeds_to_the_optimal_path():
    config = load_config("configs/qlearning_gridworld.yaml")
    assert config.run.seeds == 30
    optimal = GridWorld.shortest_path_length(make_gridworld_params(**config.env.params))
    assert optimal == 8
    final_state, metrics = train_many(config)
    greedy = np.asarray(metrics["greedy_episode_length"])
    assert greedy.shape == (1, 30, config.agent.total_steps // config.agent.log_interval)
    np.testing.assert_array_equal(greedy[0, :, -1], np.full(30, optimal))
    # the greedy evaluation on fresh envs: every seed's return is the optimal 1 (reward 1 at the
    # goal, 0 elsewhere, undiscounted), reached in the optimal 8 steps
    np.testing.assert_array_equal(np.asarray(metrics["eval_return"])[0, :, -1], np.ones(30))
    np.testing.assert_array_equal(
        np.asarray(metrics["eval_length"])[0, :, -1], np.full(30, optimal)
    )
    # the greedy policy of every final table, rolled out independently of the agent, walks 8 steps
    params = make_gridworld_params(**config.env.params)
    policy = qlearning.make_policy(config)
    for q in np.asarray(final_state.params)[0]:
        cell, steps = int(params.start), 0
        while cell != int(params.goal) and steps < 100:
            cell, steps = int(move(jnp.int32(cell), policy(q, cell, None), params)), steps + 1
        assert steps == optimal
    # behaviour episodes got short too (epsilon_end = 0.05 keeps some exploration)
    assert np.all(np.asarray(metrics["episode_length"])[0, :, -1] < 10)
    np.testing.assert_array_equal(np.asarray(metrics["step"])[0, 0], np.arange(1000, 20001, 1000))


def test_vmap_over_seeds_equals_each_seed_alone():
    """Bitwise: q_update keeps XLA from rounding the batched and unbatched programs differently."""
    config = make_config(seeds=4)
    train = qlearning.make_train(config)
    keys = seed_keys(config)
    batched = jax.jit(jax.vmap(train))(keys)
    single = jax.jit(train)
    for i in range(len(keys)):
        alone = single(keys[i])
        assert_trees_equal(jax.tree.map(lambda x: x[i], batched), alone)
    # train_many (settings x seeds) is the same program: seed i there is seed i here
    from_cli_path = train_many(config)
    assert_trees_equal(jax.tree.map(lambda x: x[0], from_cli_path), batched)
    # and different seeds really differ
    assert not np.array_equal(np.asarray(batched[0].params[0]), np.asarray(batched[0].params[1]))


def test_same_seed_same_result():
    config = make_config()
    train = jax.jit(qlearning.make_train(config))
    assert_trees_equal(train(jax.random.PRNGKey(3)), train(jax.random.PRNGKey(3)))


def test_first_greedy_step_from_a_zero_table_takes_every_action():
    """In the trainer: epsilon 0, all-zero table, one step from the corner (4, 4) over many seeds.
    RIGHT and DOWN stay in cell 24, UP reaches 19, LEFT reaches 23."""
    config = make_config(total_steps=1, log_interval=1, epsilon_start=0.0, epsilon_end=0.0)
    trainer = qlearning.make_trainer(config)
    hp = hyperparams(config.agent)
    step = jax.jit(jax.vmap(lambda key: trainer.run(trainer.init(key, hp), hp, 1)[0].envs.obs))
    cells = np.asarray(step(jax.random.split(jax.random.PRNGKey(0), 400)))
    share = {cell: np.mean(cells == cell) for cell in (24, 19, 23)}
    assert set(np.unique(cells)) == {19, 23, 24}
    assert (
        abs(share[24] - 0.5) < 0.08
        and abs(share[19] - 0.25) < 0.07
        and abs(share[23] - 0.25) < 0.07
    )


def test_epsilon_schedule_in_training_explores_then_exploits():
    # epsilon 1 -> 0 over the first half: the first log period is random walk (long episodes), the
    # last one greedy on a learned table (optimal episodes).
    config = make_config(
        total_steps=6000,
        log_interval=1000,
        epsilon_start=1.0,
        epsilon_end=0.0,
        epsilon_decay_steps=3000,
    )
    _, metrics = jax.jit(qlearning.make_train(config))(jax.random.PRNGKey(0))
    lengths = np.asarray(metrics["episode_length"])
    assert lengths[0] > 20
    assert lengths[-1] == 8.0


def test_td_update_hand_computed():
    q = jnp.zeros((3, 2)).at[2].set(jnp.array([0.5, 2.0])).at[0, 1].set(1.0)
    # target = 0.5 + 0.9 * 2.0 = 2.3; Q(0, 1) = 1 + 0.25 * (2.3 - 1) = 1.325
    new = qlearning.q_update(q, 0, 1, 0.5, 2, False, 0.25, 0.9)
    expected = np.asarray(q).copy()
    expected[0, 1] = 1.325
    np.testing.assert_allclose(np.asarray(new), expected, rtol=1e-6)
    # terminated: no bootstrap, target = 0.5; Q(0, 1) = 1 + 0.25 * (0.5 - 1) = 0.875
    new = qlearning.q_update(q, 0, 1, 0.5, 2, True, 0.25, 0.9)
    assert float(new[0, 1]) == pytest.approx(0.875)
    assert float(new[2, 1]) == 2.0 and float(new[1, 0]) == 0.0


def test_q_update_rounds_the_same_batched_and_alone():
    """XLA:CPU may fuse a multiply-add in one program and not the other; q_update must not let
    it."""
    rng = np.random.default_rng(0)
    n = 64
    q = jnp.asarray(rng.random((n, 25, 4), dtype=np.float32))
    obs, action, next_obs = (jnp.asarray(rng.integers(0, hi, n), jnp.int32) for hi in (25, 4, 25))
    reward, terminated = (
        jnp.asarray(rng.random(n, dtype=np.float32)),
        jnp.asarray(rng.random(n) < 0.3),
    )
    update = lambda *args: qlearning.q_update(*args, jnp.float32(0.1), jnp.float32(0.99))
    batched = np.asarray(jax.jit(jax.vmap(update))(q, obs, action, reward, next_obs, terminated))
    alone = jax.jit(update)
    for i in range(n):
        np.testing.assert_array_equal(
            batched[i],
            np.asarray(alone(q[i], obs[i], action[i], reward[i], next_obs[i], terminated[i])),
        )
    # and it is the TD update, in float64
    i = 0
    target = float(reward[i]) + (
        0.0
        if bool(terminated[i])
        else 0.99 * float(np.max(np.asarray(q[i, int(next_obs[i])], np.float64)))
    )
    old = float(q[i, int(obs[i]), int(action[i])])
    assert batched[i, int(obs[i]), int(action[i])] == pytest.approx(
        old + 0.1 * (target - old), rel=1e-6
    )


def test_one_training_step_matches_hand_computed_update_with_truncation_bootstrap():
    """Episodes of one step from cell 1 (goal 0): LEFT terminates (target 1), every other action is
    truncated and must bootstrap from the cell reached (info["final_obs"]), not the reset cell."""
    lr, gamma = 0.5, 0.9
    config = make_config(
        env_params={"start": 1, "goal": 0, "max_steps_in_episode": 1},
        total_steps=1,
        log_interval=1,
        lr=lr,
        gamma=gamma,
        epsilon_start=1.0,
        epsilon_end=1.0,
    )
    trainer = qlearning.make_trainer(config)
    hp = hyperparams(config.agent)
    q0 = jnp.tile(jnp.arange(25, dtype=jnp.float32)[:, None] / 10.0, (1, 4))  # Q(s, .) = s / 10

    def one_step(key):
        state = trainer.init(key, hp)
        state = state._replace(params=q0)
        return trainer.run(state, hp, 1)

    final_state, metrics = jax.jit(jax.vmap(one_step))(jax.random.split(jax.random.PRNGKey(0), 64))
    seen = set()
    params = make_gridworld_params(start=1, goal=0, max_steps_in_episode=1)
    for q in np.asarray(final_state.params):
        changed = np.argwhere(q != np.asarray(q0))
        assert len(changed) == 1 and changed[0][0] == 1
        action = int(changed[0][1])
        reached = int(move(jnp.int32(1), jnp.int32(action), params))
        if reached == 0:  # terminated: target = reward 1
            target = 1.0
        else:  # truncated: bootstrap from the reached cell's value reached / 10, not the reset
            # cell's 0.1
            target = gamma * reached / 10.0
        assert q[1, action] == pytest.approx(0.1 + lr * (target - 0.1), abs=1e-6), (action, reached)
        seen.add(action)
    assert seen == {0, 1, 2, 3}
    np.testing.assert_array_equal(np.asarray(metrics["episode_length"])[:, 0], 1.0)


def test_chunked_runs_equal_one_run():
    config = make_config(total_steps=2000, log_interval=250)
    trainer = qlearning.make_trainer(config)
    hp = hyperparams(config.agent)
    run = jax.jit(trainer.run, static_argnums=2)
    state = trainer.init(jax.random.PRNGKey(5), hp)
    whole_state, whole_metrics = run(state, hp, 8)
    chunk_state, first = run(state, hp, 3)
    chunk_state, second = run(chunk_state, hp, 5)
    assert_trees_equal(chunk_state, whole_state)
    assert_trees_equal(
        jax.tree.map(lambda a, b: jnp.concatenate([a, b]), first, second), whole_metrics
    )
    # and train(key) is the same as the trainer run in one go
    assert_trees_equal(
        jax.jit(qlearning.make_train(config))(jax.random.PRNGKey(5)), (whole_state, whole_metrics)
    )


def test_sweep_gives_one_result_per_setting_matching_single_runs():
    config = make_config(seeds=2)
    grid = [{"lr": 0.1, "gamma": 0.9}, {"lr": 0.5, "gamma": 0.9}, {"lr": 0.1, "gamma": 0.99}]
    final_state, metrics = train_many(config, grid)
    assert final_state.params.shape == (3, 2, 25, 4)
    assert metrics["step"].shape == (3, 2, 4)
    single = jax.jit(jax.vmap(qlearning.make_train(config), in_axes=(0, None)))
    for s, setting in enumerate(grid):
        hp = {**hyperparams(config.agent), **{k: jnp.float32(v) for k, v in setting.items()}}
        single_state, single_metrics = single(seed_keys(config), hp)
        assert_trees_equal(
            jax.tree.map(lambda x: x[s], (final_state, metrics)), (single_state, single_metrics)
        )
    assert not np.array_equal(np.asarray(final_state.params[0]), np.asarray(final_state.params[1]))


def test_metrics_layout_and_nan_when_no_episode_ended():
    config = make_config(
        env_params={"goal": (0, 0), "walls": [(0, 1), (1, 0)]}, total_steps=200, log_interval=50
    )
    _, metrics = jax.jit(qlearning.make_train(config))(jax.random.PRNGKey(0))
    names = {"step", "episode_return", "episode_length", "episodes", "greedy_episode_length"}
    assert names | {"eval_return", "eval_length"} <= set(metrics)
    np.testing.assert_array_equal(np.asarray(metrics["step"]), [50, 100, 150, 200])
    ret, length, episodes = (
        np.asarray(metrics[k]) for k in ("episode_return", "episode_length", "episodes")
    )
    # unreachable goal, 100-step limit: episodes end only by truncation, at steps 100 and 200
    np.testing.assert_array_equal(episodes, [0, 1, 0, 1])
    assert np.isnan(ret[[0, 2]]).all() and np.isnan(length[[0, 2]]).all()
    np.testing.assert_array_equal(ret[[1, 3]], [0.0, 0.0])
    np.testing.assert_array_equal(length[[1, 3]], [100.0, 100.0])
    np.testing.assert_array_equal(np.asarray(metrics["greedy_episode_length"]), 100)
    np.testing.assert_array_equal(np.asarray(metrics["eval_return"]), 0.0)
    np.testing.assert_array_equal(np.asarray(metrics["eval_length"]), 100.0)


def test_make_policy_is_greedy():
    policy = qlearning.make_policy(make_config())
    q = jnp.zeros((25, 4)).at[7, 2].set(1.0).at[3, 3].set(-1.0)
    assert int(policy(q, 7, None)) == 2
    assert int(policy(q, 3, None)) == 0


def test_rejects_continuous_observation_env():
    from rl.config.parsing import ConfigError

    with pytest.raises(ConfigError, match="env.id: qlearning needs discrete"):
        build_config({"env": {"id": "CartPole-v1"}, "agent": {"name": "qlearning"}})


def test_total_steps_must_be_a_multiple_of_log_interval():
    from rl.config.parsing import ConfigError

    with pytest.raises(ConfigError, match="agent.total_steps"):
        make_config(total_steps=1000, log_interval=300)


def test_evaluation_leaves_the_training_stream_alone():
    """eval_episodes=0 drops eval_return and eval_length and changes nothing else: the evaluation's
    key is the fourth of a split whose first three keys train."""
    config = make_config(total_steps=1000, log_interval=250)
    quiet = make_config(total_steps=1000, log_interval=250, eval_episodes=0)
    state, metrics = jax.jit(qlearning.make_train(config))(jax.random.PRNGKey(7))
    quiet_state, quiet_metrics = jax.jit(qlearning.make_train(quiet))(jax.random.PRNGKey(7))
    assert set(metrics) - set(quiet_metrics) == {"eval_return", "eval_length"}
    assert_trees_equal(
        (state, {k: metrics[k] for k in quiet_metrics}), (quiet_state, quiet_metrics)
    )
