"""PQN-VDN / PQN-QMIX (rl/agents/pqn_vdn.py, rl/nn/mixers.py, masked epsilon-greedy in
rl/core/exploration.py): masked epsilon-greedy never picks a masked action and has the stated
distribution; VDN is the sum; QMIX is monotonic in every agent's value and matches a NumPy forward
pass; the team Q(lambda) targets and loss by hand (a per-agent termination, a truncation, a team
termination, masked bootstraps); VDN learns MPE simple_spread beyond a uniformly random policy on
most of 4 seeds (the random policy's return measured by the same program at epsilon 1); the same
seed gives the same run; a QMIX run with greedy evaluation and the policy; bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.config import build_config, hyperparams
from rl.config.parsing import ConfigError
from rl.core import environment, exploration
from rl.nn import mixers, param_layout

pytest.importorskip("jaxmarl")

from rl.agents import pqn_vdn  # noqa: E402

SPREAD = "jaxmarl:MPE_simple_spread_v3"
SMALL = dict(
    name="pqn_vdn",
    num_envs=64,
    num_steps=16,
    num_epochs=4,
    num_minibatches=8,
    log_interval=8,
    lr=5e-4,
    anneal_lr=False,
    gamma=0.9,
    q_lambda=0.3,
    reward_scale=1.0,
    epsilon_end=0.1,
    epsilon_decay_fraction=0.1,
    max_grad_norm=1.0,
    network={"hidden": [64, 64]},
)


def make_config(env=SPREAD, env_params=None, **agent):
    return build_config(
        {
            "env": {"id": env, "params": env_params or {}},
            "agent": {**SMALL, **agent},
            "kernels": {"backend": "reference"},
        }
    )


# ---------------------------------------------------------------- masked epsilon-greedy


def test_masked_epsilon_greedy_never_picks_a_masked_action_and_has_the_stated_distribution():
    """P(a) = [mask_a] (epsilon / m + (1 - epsilon) [a = argmax over the available]), counted."""
    q = jnp.array([[0.0, 9.0, 1.0, 3.0, 2.0]])  # the unmasked argmax (1) is masked out below
    mask = jnp.array([[True, False, True, True, False]])
    n, epsilon = 40_000, 0.3
    choose = jax.jit(exploration.masked_epsilon_greedy)
    actions = np.asarray(
        choose(jax.random.PRNGKey(0), jnp.tile(q, (n, 1)), jnp.tile(mask, (n, 1)), epsilon)
    )
    assert actions.dtype == np.int32 and actions.shape == (n,)
    freq = np.bincount(actions, minlength=5) / n
    expected = np.array([epsilon / 3, 0.0, epsilon / 3, epsilon / 3 + 1 - epsilon, 0.0])
    np.testing.assert_allclose(freq, expected, atol=0.01)
    assert freq[1] == 0.0 and freq[4] == 0.0

    # random masks (at least one action each), any epsilon: never a masked action; greedy at 0
    rng, key_a = np.random.default_rng(1), jax.random.PRNGKey(1)
    q = rng.normal(size=(4096, 6)).astype(np.float32)
    mask = rng.random((4096, 6)) < 0.4
    mask[:, 5] = True
    for epsilon in (0.0, 0.5, 1.0):
        actions = np.asarray(choose(key_a, q, mask, epsilon))
        assert mask[np.arange(4096), actions].all()
    greedy = np.asarray(exploration.masked_argmax(q, mask))
    expected = np.argmax(np.where(mask, q, -np.inf), axis=-1)
    np.testing.assert_array_equal(greedy, expected)
    np.testing.assert_array_equal(choose(key_a, q, mask, 0.0), greedy)


def test_masked_epsilon_greedy_with_every_action_available_is_epsilon_greedy():
    q = np.random.default_rng(2).normal(size=(3, 100, 7)).astype(np.float32)
    key = jax.random.PRNGKey(3)
    masked = jax.jit(exploration.masked_epsilon_greedy)(key, q, jnp.ones(q.shape, bool), 0.4)
    np.testing.assert_array_equal(masked, jax.jit(exploration.epsilon_greedy)(key, q, 0.4))


# ---------------------------------------------------------------- mixers


def test_vdn_is_the_sum():
    vdn = mixers.make_mixer("vdn")
    q = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    assert vdn.init(jax.random.PRNGKey(1), q) == {}
    np.testing.assert_allclose(vdn.apply({}, q, None), q.sum(-1), rtol=1e-6)


def numpy_qmix(params, agent_q, state, embedding):
    """QMIX's mixer in NumPy from the dense layers in creation order (rl/nn/mixers.py, qmix_fn)."""
    (w1a, b1a), (w1b, b1b), (wb1, bb1), (w2a, b2a), (w2b, b2b), (wva, bva), (wvb, bvb) = [
        (np.asarray(w, np.float64), np.asarray(b, np.float64))
        for w, b in param_layout.dense_layers(params)
    ]
    relu = lambda x: np.maximum(x, 0.0)
    elu = lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0)))
    s, q = np.asarray(state, np.float64), np.asarray(agent_q, np.float64)
    w1 = np.abs(relu(s @ w1a + b1a) @ w1b + b1b).reshape(len(s), q.shape[-1], embedding)
    b1 = s @ wb1 + bb1
    w2 = np.abs(relu(s @ w2a + b2a) @ w2b + b2b)
    v = (relu(s @ wva + bva) @ wvb + bvb)[:, 0]
    hidden = elu(np.einsum("ba,bae->be", q, w1) + b1)
    return (hidden * w2).sum(-1) + v


def test_qmix_is_monotonic_and_matches_numpy():
    """On random states and agent values. (The forward pass is the same whatever the init and
    network backend: the lecun_uniform init compiles faster than the orthogonal one's QR, and
    test_networks checks the flax and haiku backends against each other.)"""
    mixer = mixers.make_mixer("qmix", embedding=8, hypernet_hidden=16, init="lecun_uniform")
    rng = np.random.default_rng(0)
    agent_q = (3.0 * rng.normal(size=(64, 3))).astype(np.float32)
    state = rng.normal(size=(64, 10)).astype(np.float32)
    params = jax.jit(mixer.init)(jax.random.PRNGKey(0), agent_q[0], state[0])

    @jax.jit
    def forward_and_grads(params, agent_q, state):
        grads = jax.vmap(jax.grad(lambda q, s: mixer.apply(params, q, s)))(agent_q, state)
        return mixer.apply(params, agent_q, state), grads

    with jax.default_matmul_precision("highest"):
        q_tot, grads = forward_and_grads(params, agent_q, state)
    assert q_tot.shape == (64,) and grads.shape == (64, 3)
    assert np.all(np.asarray(grads) >= 0.0) and np.any(np.asarray(grads) > 0.0)
    np.testing.assert_allclose(q_tot, numpy_qmix(params, agent_q, state, 8), rtol=1e-4, atol=1e-5)


def test_unknown_mixer():
    with pytest.raises(ValueError, match="unknown mixer 'qtran'"):
        mixers.make_mixer("qtran")


# ---------------------------------------------------------------- targets and loss by hand

# Q_i(o, .) looked up by the id in o[..., 0]; 3 actions
Q_TABLE = jnp.array(
    [[1.0, 2.0, 0.0], [4.0, 3.0, 0.0], [10.0, 0.0, 0.0], [6.0, 8.0, 0.0], [1.0, 5.0, 0.0]]
    + [[7.0, 7.0, 7.0], [2.0, 0.0, 0.0], [0.0, 3.0, 0.0]]
)
FAKE_Q = lambda params, obs: Q_TABLE[obs[..., 0].astype(jnp.int32)]
VDN_MIX = lambda params, values, state: values.sum(-1)


def hand_rollout():
    """One env, two agents, T = 5: step 1 agent 1 terminates (the episode goes on), step 2 the
    time limit truncates agent 0 (agent 1 stays terminated), step 3 both terminate (a new episode
    that ends at once), step 4 is the rollout's last; rewards (1, 2) every step."""
    t, f = True, False
    mask = jnp.ones((5, 1, 2, 3), bool)  # [T, E, A, n]
    mask = mask.at[2, 0, 0, 1].set(False)  # step 2: agent 0's best action (1) unavailable
    mask = mask.at[4, 0, 1, 1:].set(False)  # step 4: agent 1 may only take action 0
    return pqn_vdn.Transition(
        obs=None,
        action=None,
        reward=jnp.tile(jnp.array([1.0, 2.0]), (5, 1, 1)),
        terminated=jnp.array([[f, f], [f, t], [f, t], [t, t], [f, f]])[:, None],
        episode_end=jnp.array([f, f, t, t, f])[:, None],
        alive=None,
        global_state=None,
        final_obs=jnp.array([[0, 1], [2, 3], [4, 5], [5, 5], [6, 7]], jnp.float32)[
            :, None, :, None
        ],
        final_action_mask=mask,
        final_global_state=jnp.arange(5.0)[:, None, None],
        episode=None,
    )


def test_team_q_lambda_targets_by_hand():
    """gamma .5, lambda .5, team reward 1 + 2 = 3. Bootstraps (VDN, sum over agents not
    terminated of the max over available actions): step 0 2 + 4; step 1 10 (agent 1 terminated:
    out); step 2 1 (masked max; agent 1 out); step 3 none (team terminated); step 4 2 + 0 (masked
    max)."""
    config = make_config(gamma=0.5, q_lambda=0.5)
    hp = hyperparams(config.agent)
    traj = hand_rollout()
    targets = pqn_vdn.team_q_lambda_targets(FAKE_Q, VDN_MIX, None, traj, hp, "sum", "reference")
    g4 = 3 + 0.5 * 2.0
    g3 = 3.0  # every agent terminated: no bootstrap
    g2 = 3 + 0.5 * 1.0  # truncated: bootstraps, the chain stops
    g1 = 3 + 0.5 * (0.5 * 10.0 + 0.5 * g2)  # agent 1's end stops neither the chain nor the team
    g0 = 3 + 0.5 * (0.5 * 6.0 + 0.5 * g1)
    np.testing.assert_allclose(targets[:, 0], [g0, g1, g2, g3, g4], rtol=1e-6)

    # mean team reward; a mixer that reads the final global state (V_t + 100 s_t)
    state_mix = lambda params, values, state: values.sum(-1) + 100.0 * state[..., 0]
    targets = pqn_vdn.team_q_lambda_targets(FAKE_Q, state_mix, None, traj, hp, "mean", "reference")
    g4 = 1.5 + 0.5 * (2.0 + 400.0)
    g3 = 1.5
    g2 = 1.5 + 0.5 * (1.0 + 200.0)
    g1 = 1.5 + 0.5 * (0.5 * (10.0 + 100.0) + 0.5 * g2)
    g0 = 1.5 + 0.5 * (0.5 * 6.0 + 0.5 * g1)
    np.testing.assert_allclose(targets[:, 0], [g0, g1, g2, g3, g4], rtol=1e-6)


def test_team_q_loss_by_hand():
    """Q_tot = sum over agents in the team of Q_i(o_i, a_i); an agent out of the team adds 0."""
    obs = jnp.array([[0, 1], [2, 3]], jnp.float32)[..., None]
    action = jnp.array([[1, 0], [0, 1]])
    alive = jnp.array([[True, True], [True, False]])
    target = jnp.array([5.0, 4.0])
    loss, q_mean = pqn_vdn.team_q_loss(FAKE_Q, VDN_MIX, None, (obs, action, alive, (), target))
    q_tot = np.array([2.0 + 4.0, 10.0])  # row 1: agent 1 (Q = 8) is out
    np.testing.assert_allclose(loss, 0.5 * np.mean((q_tot - [5.0, 4.0]) ** 2), rtol=1e-6)
    np.testing.assert_allclose(q_mean, q_tot.mean(), rtol=1e-6)


def test_agent_inputs_append_the_one_hot_id():
    obs = jnp.arange(2 * 3 * 4, dtype=jnp.float32).reshape(2, 3, 2, 2)  # [E, A, 2, 2]
    x = pqn_vdn.agent_inputs(obs, 2, True)
    assert x.shape == (2, 3, 4 + 3)
    np.testing.assert_array_equal(x[1, 2], [20, 21, 22, 23, 0, 0, 1])
    assert pqn_vdn.agent_inputs(obs, 2, False) is obs


# ---------------------------------------------------------------- learning (one compiled program)

# 32 updates, 32768 env steps per seed; at lr 5e-4 one seed in eight still lost to a random policy
# after them, at 2e-3 all eight of another seed set beat it by 4.8 to 6.2
LEARN = dict(total_steps=64 * 16 * 32, eval_envs=0, lr=2e-3)
SEEDS = 4


@pytest.fixture(scope="module")
def learning_runs():
    """VDN on simple_spread: 4 seeds, then one at epsilon 1 (a uniformly random policy, through
    the same compiled program: epsilon is a traced hyperparameter), then seed 0 again."""
    config = make_config(**LEARN)
    hp = hyperparams(config.agent)
    random = {**hp, "epsilon_start": jnp.float32(1.0), "epsilon_end": jnp.float32(1.0)}
    settings = [hp] * SEEDS + [random, hp]
    hparams = {name: jnp.stack([s[name] for s in settings]) for name in hp}
    seeds = jax.random.split(jax.random.PRNGKey(0), SEEDS + 1)
    keys = jnp.concatenate([seeds, seeds[:1]])
    with jax.default_device(jax.devices("cpu")[0]):
        state, metrics = jax.jit(jax.vmap(pqn_vdn.make_train(config)))(keys, hparams)
    return config, state, jax.tree.map(np.asarray, metrics)


def test_vdn_learns_simple_spread_beyond_a_random_policy(learning_runs):
    """Over the last two log points (exploring at epsilon 0.1), the team return beats the uniformly
    random policy's mean by a margin on at least 3 of 4 seeds (measured here: random about -27.8,
    learned about -22 to -23 after 32k env steps)."""
    _, _, metrics = learning_runs
    returns = metrics["episode_return"]
    random = returns[SEEDS].mean()
    learned = returns[:SEEDS, -2:].mean(axis=1)
    assert -32.0 < random < -24.0, random
    assert np.sum(learned > random + 1.5) >= 3, (learned, random)
    assert np.all(np.isfinite(metrics["loss"][:SEEDS]))
    np.testing.assert_allclose(metrics["epsilon"][:SEEDS, -1], 0.1, rtol=1e-6)
    assert np.all(metrics["step"][:, -1] == 32 * 64 * 16)


def test_same_seed_same_run(learning_runs):
    _, state, metrics = learning_runs
    for name, values in metrics.items():
        np.testing.assert_array_equal(values[-1], values[0], err_msg=name)
    jax.tree.map(lambda x: np.testing.assert_array_equal(x[-1], x[0]), state.params)


def test_state_is_typed_with_alive_agents_and_mixer_params(learning_runs):
    config, state, _ = learning_runs
    assert state.envs.obs.shape == (SEEDS + 2, config.agent.num_envs, 3, 18)
    assert state.envs.memory.shape == (SEEDS + 2, config.agent.num_envs, 3)
    assert state.envs.memory.dtype == jnp.bool_ and bool(state.envs.memory.all())  # MPE: no deaths
    assert state.params["mixer"] == {} and "LayerNorm_0" in state.params["agent"]["params"]


def test_policy_is_the_masked_greedy_choice(learning_runs):
    config, state, _ = learning_runs
    params = jax.tree.map(lambda x: x[0], state.params)
    policy = pqn_vdn.make_policy(config)
    obs = jax.random.normal(jax.random.PRNGKey(0), (3, 18))
    mask = jnp.array([[True] * 5, [False, True, False, True, False], [False] * 4 + [True]])
    actions = policy(params, obs, None, mask)
    q = pqn_vdn.make_q_network(config.agent, *environment.make_env(config)).apply(
        params["agent"], pqn_vdn.agent_inputs(obs, 1, True)
    )
    assert actions.shape == (3,) and int(actions[2]) == 4 and int(actions[1]) in (1, 3)
    np.testing.assert_array_equal(actions, jnp.argmax(jnp.where(mask, q, -jnp.inf), axis=-1))


def smax_state(state):
    """JaxMARL's SMAX state inside the training env's state (through `env_state` / `state`)."""
    while not hasattr(state, "unit_alive"):
        state = state.env_state if hasattr(state, "env_state") else state.state
    return state


@pytest.mark.slow
def test_qmix_on_smax_tracks_the_team_and_evaluates():
    """QMIX on HeuristicEnemySMAX 3m (mixing on SMAX's world state), acting at random: after each
    log point the team flags the rollout carries (`envs.memory`) are the allies' `unit_alive` (a
    dead marine leaves the team until its episode ends), some have died, losses are finite, the
    mixer has its 7 layers and greedy evaluation gives team returns."""
    config = make_config(
        "jaxmarl:HeuristicEnemySMAX",
        {"scenario": "3m"},
        mixer="qmix",
        team_reward="mean",
        total_steps=16 * 32 * 3,
        num_envs=16,
        num_steps=32,
        num_minibatches=2,
        num_epochs=1,
        log_interval=1,
        eval_envs=2,
        network={"hidden": [16]},
    )
    trainer = pqn_vdn.make_trainer(config)
    hp = {**hyperparams(config.agent), "epsilon_start": 1.0, "epsilon_end": 1.0}
    hp = jax.tree.map(jnp.float32, hp)
    run = jax.jit(trainer.run, static_argnums=2)
    with jax.default_device(jax.devices("cpu")[0]):
        state = jax.jit(trainer.init)(jax.random.PRNGKey(0), hp)
        deaths = 0
        for _ in range(3):
            state, metrics = run(state, hp, 1)
            alive = np.asarray(smax_state(state.envs.state).unit_alive)[:, :3]
            np.testing.assert_array_equal(np.asarray(state.envs.memory), alive)
            deaths += int((~alive).sum())
            assert np.isfinite(metrics["loss"]).all() and np.isfinite(metrics["eval_return"]).all()
    assert deaths > 0
    assert set(state.params["mixer"]["params"]) == {f"Dense_{i}" for i in range(7)}


# ---------------------------------------------------------------- bad input


def test_qmix_needs_a_global_state(monkeypatch):
    import envs
    from envs.multi_agent import MultiAgentWrapper

    class NoGlobalState(MultiAgentWrapper):
        has_global_state = False

    make = envs.make

    def make_without_state(env_id, **kwargs):
        env, params = make(env_id, **kwargs)
        return NoGlobalState(env), params

    monkeypatch.setattr(envs, "make", make_without_state)
    with pytest.raises(ConfigError, match=r"agent.mixer: qmix .* env.id 'jaxmarl:MPE_simple_spr"):
        make_config(mixer="qmix")
    make_config(mixer="vdn")  # VDN needs none


@pytest.mark.parametrize(
    "agent, env, message",
    [
        ({"mixer": "qtran"}, SPREAD, r"agent.mixer: .*qtran"),
        ({"team_reward": "max"}, SPREAD, r"agent.team_reward: .*max"),
        ({}, "CartPole-v1", "env.id: agent 'pqn_vdn' trains teams of agents"),
        ({"network": {"torso": "cnn_minatar"}}, SPREAD, "agent.agent_id"),
        ({"num_minibatches": 3}, SPREAD, r"agent.num_minibatches \(3\) must divide"),
    ],
)
def test_config_errors_name_the_key(agent, env, message):
    with pytest.raises(ConfigError, match=message):
        make_config(env, **agent)


def test_shipped_configs_load():
    from rl.config import load_config

    for name, mixer in (("pqn_vdn_mpe_spread", "vdn"), ("pqn_qmix_smax_3m", "qmix")):
        config = load_config(f"configs/{name}.yaml")
        assert config.agent.name == "pqn_vdn" and config.agent.mixer == mixer
        assert config.agent.network.layer_norm
