"""DQN: TD targets by hand (truncation bootstraps, termination does not, double-Q), the stored
transitions hold info["final_obs"], a short run minimises its loss with finite Q-values, vmap over
seeds equals per-seed runs, chunked runs equal one run, both network backends, config errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import FUSION_EMITTERS, XLA_DEFAULT_OPTIMIZATION

from envs.cartpole import CartPoleState
from rl.agents import dqn
from rl.config import build_config, hyperparams
from rl.config.parsing import ConfigError
from rl.replay import loop as replay

SMALL = dict(
    name="dqn",
    total_steps=1024,
    buffer_size=512,
    learning_starts=128,
    batch_size=16,
    train_freq=64,
    gradient_steps=8,
    target_update_interval=16,
    network={"hidden": [16, 16]},
    log_interval=256,
    eval_episodes=2,
    epsilon_decay_steps=512,
    lr=1e-3,
)


def make_config(env_params=None, **agent):
    return build_config(
        {"env": {"id": "CartPole-v1", "params": env_params or {}}, "agent": {**SMALL, **agent}}
    )


# ---------------------------------------------------------------- the TD target by hand


def linear_q(params, obs):
    return obs @ params  # [B, 2] @ [2, A]


def test_td_target_bootstraps_on_truncation_and_not_on_termination():
    online = jnp.array([[1.0, 0.0], [0.0, 2.0]])
    target = jnp.array([[3.0, 1.0], [0.0, 1.0]])
    batch = {
        "obs": jnp.array([[1.0, 0.0], [1.0, 0.0]]),
        "action": jnp.array([0, 0]),
        "reward": jnp.array([1.0, 1.0]),
        "next_obs": jnp.array(
            [[1.0, 1.0], [1.0, 1.0]]
        ),  # Q_target(s') = [3, 2], Q_online(s') = [1, 2]
        "terminated": jnp.array(
            [False, True]
        ),  # the first was truncated (terminated False): bootstrap
    }
    _, (td, q_taken) = dqn.q_loss(linear_q, online, target, batch, 0.9, double_q=False, kind="mse")
    np.testing.assert_allclose(q_taken, [1.0, 1.0])
    np.testing.assert_allclose(td, [1.0 - (1.0 + 0.9 * 3.0), 1.0 - 1.0], rtol=1e-6)
    _, (td, _) = dqn.q_loss(linear_q, online, target, batch, 0.9, double_q=True, kind="mse")
    np.testing.assert_allclose(
        td, [1.0 - (1.0 + 0.9 * 2.0), 0.0], rtol=1e-6
    )  # online picks action 1


def test_huber_and_mse_losses():
    params = jnp.zeros((2, 2))
    batch = {
        "obs": jnp.ones((2, 2)),
        "action": jnp.array([0, 1]),
        "reward": jnp.array([3.0, 0.5]),
        "next_obs": jnp.ones((2, 2)),
        "terminated": jnp.array([True, True]),
    }
    mse, _ = dqn.q_loss(linear_q, params, params, batch, 0.99, False, "mse")
    huber, _ = dqn.q_loss(linear_q, params, params, batch, 0.99, False, "huber")
    np.testing.assert_allclose(mse, (9.0 + 0.25) / 2, rtol=1e-6)
    np.testing.assert_allclose(huber, ((3.0 - 0.5) + 0.5 * 0.25) / 2, rtol=1e-6)


def test_stored_transitions_hold_the_final_obs_and_truncation_is_not_termination():
    """Episodes truncated every 5 steps: each stored next_obs is the dynamics' successor of obs
    (never the reset obs) and no transition is marked terminated."""
    config = make_config(
        {"max_steps_in_episode": 5},
        total_steps=256,
        log_interval=256,
        train_freq=64,
        num_envs=4,
        learning_starts=10_000,
    )
    trainer = dqn.make_trainer(config)
    hp = hyperparams(config.agent)
    state, metrics = jax.jit(trainer.run, static_argnums=2)(
        trainer.init(jax.random.PRNGKey(0), hp), hp, 1
    )
    assert int(state.buffer.size) == 256
    data = jax.tree.map(lambda x: np.asarray(x)[:256], state.buffer.data)
    assert not data["terminated"].any()
    assert int(metrics["episodes"][0]) == 4 * (64 // 5)  # 64 steps per env, truncated every 5
    from envs.cartpole import CartPole

    env = CartPole()
    params = env.default_params

    def successor(obs, action):
        state = CartPoleState(*obs, time=jnp.int32(0))
        return env.step_env(jax.random.PRNGKey(0), state, action, params)[0]

    expected = jax.vmap(successor)(jnp.asarray(data["obs"]), jnp.asarray(data["action"]))
    np.testing.assert_allclose(data["next_obs"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["episode_length"][0], 5.0)


# ---------------------------------------------------------------- training runs


def test_short_run_minimises_its_loss_and_q_stays_finite():
    """With gamma = 0 the target is the reward (1 on every CartPole step): the loss must fall and
    Q(s, a) must approach 1."""
    config = make_config(total_steps=2048, gamma=0.0, gradient_steps=32, lr=3e-3)
    state, metrics = jax.jit(dqn.make_train(config))(jax.random.PRNGKey(1))
    loss, q = np.asarray(metrics["loss"]), np.asarray(metrics["q_mean"])
    assert np.all(np.isfinite(loss)) and np.all(np.isfinite(q))
    assert loss[-1] < 0.1 * loss[0], loss
    assert abs(q[-1] - 1.0) < 0.05, q
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(state.params))
    assert np.all(np.asarray(metrics["step"]) == np.arange(256, 2049, 256))
    assert np.all(np.asarray(metrics["eval_return"]) >= 8)


@pytest.fixture(scope="module")
def small_run():
    config = make_config(double_q=True, tau=0.5)
    train = dqn.make_train(config)
    keys = jnp.stack([jax.random.PRNGKey(i) for i in (3, 4)])
    # with the CPU fusion emitters, which round one expression alike in the batched and unbatched
    # programs (tests/conftest.py turns them off elsewhere); so do the runs that compare with it
    return config, train, keys, jax.jit(jax.vmap(train), compiler_options=FUSION_EMITTERS)(keys)


def test_vmap_over_seeds_equals_per_seed_runs(small_run):
    config, train, keys, (states, metrics) = small_run
    single = jax.jit(train, compiler_options=FUSION_EMITTERS)
    for i in range(len(keys)):
        state_i, metrics_i = single(keys[i])
        for name in ("eval_return", "episode_return", "step", "gradient_steps"):
            np.testing.assert_allclose(metrics[name][i], metrics_i[name], rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(metrics["loss"][i], metrics_i["loss"], rtol=1e-3)
        for a, b in zip(jax.tree.leaves(states.params), jax.tree.leaves(state_i.params)):
            np.testing.assert_allclose(a[i], b, rtol=1e-4, atol=1e-5)


def test_chunked_runs_equal_one_run(small_run):
    config, train, keys, (states, metrics) = small_run
    trainer = dqn.make_trainer(config)
    hp = hyperparams(config.agent)
    run = jax.jit(trainer.run, static_argnums=2, compiler_options=FUSION_EMITTERS)
    state = trainer.init(keys[0], hp)
    state, first = run(state, hp, 1)
    state, rest = run(state, hp, 3)
    whole = jax.jit(train, compiler_options=FUSION_EMITTERS)(keys[0])[1]
    for name in ("eval_return", "loss", "q_mean"):
        np.testing.assert_array_equal(
            np.concatenate([first[name], rest[name]]), whole[name], err_msg=name
        )


def test_no_eval_episodes_trains_the_same_and_logs_no_eval_return(small_run):
    """eval_episodes=0 (PureJaxRL's DQN evaluates nothing) drops the greedy episodes and their
    metric only: evaluation draws its own key, so training is bit for bit that of the run with
    it."""
    config, train, keys, _ = small_run
    states, metrics = jax.jit(train)(keys[0])
    state, bare = jax.jit(dqn.make_train(make_config(double_q=True, tau=0.5, eval_episodes=0)))(
        keys[0]
    )
    assert "eval_return" not in bare and "eval_return" in metrics
    for name in ("loss", "q_mean", "episode_return", "step"):
        np.testing.assert_array_equal(bare[name], metrics[name], err_msg=name)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(states.params)):
        np.testing.assert_array_equal(a, b)


def test_unrolled_loops_compute_the_same_run(small_run):
    """agent.unroll changes loop trips only: the same metrics and params as the rolled run (here the
    phase's 64 env iterations and its 8 gradient steps unroll 2 a trip; test_sac.py covers
    unrolling the loop over phases). 2, not more: each unrolled iteration is one more copy of the
    loop body for XLA to compile, at its default level here."""
    _, train, keys, _ = small_run
    # both at XLA's default optimisation level (tests/conftest.py's level 0 rounds the rolled and
    # the unrolled loop differently in the last bit, which the run's episodes then grow)
    state, metrics = jax.jit(train, compiler_options=XLA_DEFAULT_OPTIMIZATION)(keys[0])
    unrolled_state, unrolled = jax.jit(
        dqn.make_train(make_config(double_q=True, tau=0.5, unroll=2)),
        compiler_options=XLA_DEFAULT_OPTIMIZATION,
    )(keys[0])
    for name in ("eval_return", "loss", "q_mean", "episode_return", "step"):
        np.testing.assert_allclose(
            unrolled[name], metrics[name], rtol=1e-5, atol=1e-6, err_msg=name
        )
    for a, b in zip(jax.tree.leaves(unrolled_state.params), jax.tree.leaves(state.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_haiku_backend_trains_like_flax():
    config = make_config(
        network={"backend": "haiku", "hidden": [16, 16]}, total_steps=512, gradient_steps=4
    )
    state, metrics = jax.jit(dqn.make_train(config))(jax.random.PRNGKey(0))
    assert np.all(np.isfinite(np.asarray(metrics["loss"])[1:]))
    flax_params = jax.jit(dqn.make_trainer(make_config()).init)(
        jax.random.PRNGKey(0), hyperparams(config.agent)
    ).params
    size = lambda p: sum(x.size for x in jax.tree.leaves(p))
    assert size(state.params) == size(flax_params) == 4 * 16 + 16 + 16 * 16 + 16 + 16 * 2 + 2


def test_policy_is_greedy_in_the_q_network():
    config = make_config()
    params = dqn.make_trainer(config).init(jax.random.PRNGKey(0), hyperparams(config.agent)).params
    policy = dqn.make_policy(config)
    obs = jnp.array([0.01, -0.02, 0.03, 0.04])
    from rl.fused import q as fused_q
    from rl.nn import layers, networks
    from rl.nn.network_config import NetworkConfig

    torso = networks.make_torso(NetworkConfig(hidden=(16, 16)))
    net = layers.build(networks.with_head(torso, networks.q_head(2)), "flax")
    tree = fused_q.as_tree(net, obs, params)  # a flat vector where the fused kernels run (a GPU)
    assert int(policy(params, obs, None)) == int(jnp.argmax(net.apply(tree, obs)))


# ---------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    "agent, env, message",
    [
        (
            {"train_freq": 60, "num_envs": 8},
            "CartPole-v1",
            "agent.train_freq \\(60\\) must be a multiple of agent.num_envs \\(8\\)",
        ),
        (
            {"log_interval": 100},
            "CartPole-v1",
            "agent.log_interval \\(100\\) must be a multiple of agent.train_freq",
        ),
        (
            {"total_steps": 1000},
            "CartPole-v1",
            "agent.total_steps \\(1000\\) must be a multiple of agent.log_interval",
        ),
        ({"loss": "l1"}, "CartPole-v1", "agent.loss: 'l1' is not one of"),
        ({"batch_size": 0}, "CartPole-v1", "agent.batch_size: 0 is out of range"),
        ({"gamma": 1.5}, "CartPole-v1", "agent.gamma: 1.5 is out of range"),
        ({"network": {"backend": "torch"}}, "CartPole-v1", "agent.network.backend"),
        (
            {"network": {"hidden": [16, 0]}},
            "CartPole-v1",
            "agent.network.hidden must list positive widths",
        ),
        (
            {"double": True},
            "CartPole-v1",
            "unknown key 'agent.double'.*did you mean 'agent.double_q'",
        ),
        ({}, "Pendulum-v1", "env.id: dqn needs discrete actions"),
    ],
)
def test_config_errors_name_the_key(agent, env, message):
    with pytest.raises(ConfigError, match=message):
        build_config({"env": {"id": env}, "agent": {**SMALL, **agent}})


def test_shipped_config_loads():
    from rl.config import load_config

    config = load_config("configs/dqn_cartpole.yaml")
    assert config.agent.name == "dqn" and config.env.id == "CartPole-v1"


@pytest.mark.parametrize("acting_keys, learn_keys", [(1, None), (2, 4)])
def test_period_keys_are_the_keys_each_phase_would_split(acting_keys, learn_keys):
    """`replay.period_keys` splits a log period's keys at once; they are the keys that the phases
    split one at a time: the period key into phases (`scan_phases`), each phase's into its env
    iterations and gradient steps (`phase_keys`), each env iteration's into (acting keys..., env
    step), the env step's into one per env (`step_envs`) and, with `learn_keys`, each gradient
    step's into `learn_keys`."""
    loop = replay.Loop(env_iterations=3, gradient_steps=2, num_phases=4, act_unroll=1,
                       learn_unroll=1, phase_unroll=1)  # fmt: skip
    key, num_envs = jax.random.PRNGKey(7), 5
    got = replay.period_keys(key, loop, num_envs, acting_keys, learn_keys)
    assert got["act"].shape[:3] == (loop.num_phases, loop.env_iterations, acting_keys)
    for p, phase_key in enumerate(jax.random.split(key, loop.num_phases)):
        act_keys, learn_keys_of_phase = replay.phase_keys(phase_key, loop)
        for g, learn_key in enumerate(learn_keys_of_phase):
            want = learn_key if learn_keys is None else jax.random.split(learn_key, learn_keys)
            np.testing.assert_array_equal(got["learn"][p, g], want)
        for i, act_key in enumerate(act_keys):
            *acting, env_step = jax.random.split(act_key, acting_keys + 1)
            np.testing.assert_array_equal(got["act"][p, i], np.stack(acting))
            np.testing.assert_array_equal(got["env"][p, i], jax.random.split(env_step, num_envs))
