"""IPPO: the masked categorical policy against NumPy, per-agent GAE against NumPy's GAE run agent by
agent, shared and per-agent parameters, the masks of a rollout (a toy env whose masks change every
step and whose agents leave the episode at different times), the greedy policy, reproducibility,
bad configs, and (`-m slow`) a learning run: IPPO on JaxMARL's MPE simple_spread beats a random
policy's team return on most of 4 vmapped seeds."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from envs.multi_agent import MultiAgentEnv, TeamEpisodeStatistics
from envs.spaces import Box, Discrete
from rl.agents import ippo
from rl.config import build_config, hyperparams
from rl.config.parsing import ConfigError
from rl.nn import layers, multi_agent, networks

pytest.importorskip("jaxmarl")  # the jaxmarl extra (the test extra installs it)

MPE = "jaxmarl:MPE_simple_spread_v3"
# The team return (sum_t mean_i r_ti over an episode's 26 steps) of uniformly random actions on
# MPE simple_spread, measured over 4000 episodes: -27.6 (standing still: -25.1).
RANDOM_SPREAD_RETURN = -27.6


def make_config(env_id=MPE, env_params=None, **agent):
    base = dict(
        name="ippo",
        total_steps=64,
        num_envs=4,
        num_steps=8,
        num_epochs=2,
        num_minibatches=2,
        log_interval=1,
        network={"hidden": [16, 16]},
    )
    base.update(agent)
    return build_config({"env": {"id": env_id, "params": env_params or {}}, "agent": base})


# ---------------------------------------------------------------- the masked distribution

RNG = np.random.default_rng(0)
LOGITS = RNG.normal(size=(64, 6)) * 3.0
MASK = RNG.random((64, 6)) < 0.5
MASK[np.arange(64), RNG.integers(0, 6, 64)] = True  # at least one action allowed per row
LOGITS[~MASK] += 10.0  # the masked actions would otherwise be the likeliest


def masked_log_softmax(logits, mask):
    """log pi over the allowed actions (float64), -inf elsewhere."""
    z = np.where(mask, logits, -np.inf)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def test_masked_categorical_never_samples_a_masked_action_and_samples_the_renormalised_policy():
    pi = networks.Categorical(jnp.asarray(LOGITS, jnp.float32)).masked(jnp.asarray(MASK))
    draws = np.asarray(jax.jit(jax.vmap(pi.sample))(jax.random.split(jax.random.PRNGKey(0), 4000)))
    assert MASK[np.arange(64), draws].all()
    frequencies = (draws[..., None] == np.arange(6)).mean(axis=0)
    np.testing.assert_allclose(frequencies, np.exp(masked_log_softmax(LOGITS, MASK)), atol=0.04)
    assert MASK[np.arange(64), np.asarray(pi.mode())].all()
    np.testing.assert_array_equal(pi.mode(), np.argmax(np.where(MASK, LOGITS, -np.inf), axis=-1))


@pytest.mark.parametrize("backend", [None, "reference"])
def test_masked_log_prob_and_entropy_are_those_over_the_allowed_actions(backend):
    pi = networks.Categorical(jnp.asarray(LOGITS, jnp.float32)).masked(jnp.asarray(MASK))
    reference = masked_log_softmax(LOGITS, MASK)
    entropy = -np.sum(np.where(MASK, np.exp(reference) * np.where(MASK, reference, 0.0), 0.0), -1)
    log_prob_entropy = jax.jit(lambda action: pi.log_prob_entropy(action, backend))
    for action in range(6):
        allowed = MASK[:, action]
        log_prob, ent = log_prob_entropy(jnp.full(64, action, jnp.int32))
        np.testing.assert_allclose(log_prob[allowed], reference[allowed, action], atol=1e-5)
        np.testing.assert_allclose(ent, entropy, atol=1e-5)
        assert np.all(np.isfinite(log_prob)) and np.all(np.asarray(log_prob)[~allowed] < -1e8)

    def objective(logits):  # what the loss differentiates: log pi(a) of allowed actions, entropy
        log_prob, ent = (
            networks.Categorical(logits)
            .masked(MASK)
            .log_prob_entropy(jnp.asarray(np.argmax(MASK, axis=-1), jnp.int32), backend)
        )
        return jnp.sum(log_prob) + jnp.sum(ent)

    grads = jax.jit(jax.grad(objective))(jnp.asarray(LOGITS, jnp.float32))
    assert np.all(np.isfinite(grads)) and np.all(np.asarray(grads)[~MASK] == 0.0)


def test_a_row_with_every_action_masked_is_uniform_not_nan():
    pi = networks.Categorical(jnp.array([[1.0, 5.0, -2.0]])).masked(jnp.zeros((1, 3), bool))
    log_prob, entropy = pi.log_prob_entropy(jnp.array([1]), "reference")
    np.testing.assert_allclose(log_prob, [np.log(1 / 3)], rtol=1e-6)
    np.testing.assert_allclose(entropy, [np.log(3)], rtol=1e-6)


# ---------------------------------------------------------------- a toy team with masks


@struct.dataclass
class GuessState:
    target: jax.Array  # [A] the action each agent is rewarded for
    mask: jax.Array  # [A, n] the actions each agent may take
    time: jax.Array


@struct.dataclass
class GuessParams:
    max_steps_in_episode: int = struct.field(pytree_node=False, default=4)


class MaskedGuess(MultiAgentEnv):
    """Two agents; each sees a one-hot target action and gets reward 1 for taking it. Every step
    about half of the other actions are masked out at random. Agent "a" leaves the episode
    (terminated) on its second step and then may only take action 0; the episode is truncated
    after 4 steps. The global state is both targets' one-hots and the time."""

    name = "MaskedGuess"
    agent_ids = ("a", "b")
    default_params = GuessParams()
    has_global_state = True
    n = 4

    def observation_space(self, params):
        return Box(0.0, 1.0, (self.n,), np.float32)

    def action_space(self, params):
        return Discrete(self.n)

    def draw(self, key, time):
        target_key, mask_key = jax.random.split(key)
        target = jax.random.randint(target_key, (2,), 0, self.n)
        mask = jax.random.bernoulli(mask_key, 0.5, (2, self.n)) | (
            jnp.arange(self.n) == target[:, None]
        )
        out = (jnp.arange(2) == 0) & (time >= 2)
        mask = jnp.where(out[:, None], jnp.arange(self.n) == 0, mask)
        state = GuessState(target, mask, time)
        return jax.nn.one_hot(target, self.n), state

    def reset_env(self, key, params):
        return self.draw(key, jnp.int32(0))

    def step_env(self, key, state, actions, params):
        reward = (actions == state.target).astype(jnp.float32)
        obs, next_state = self.draw(key, state.time + 1)
        terminated = (jnp.arange(2) == 0) & (next_state.time >= 2)
        return obs, next_state, reward, terminated, {}

    def truncation(self, state, params):
        return state.time >= params.max_steps_in_episode

    def action_mask(self, state, params):
        return state.mask

    def global_state(self, state, params):
        targets = jax.nn.one_hot(state.target, self.n).ravel()
        return jnp.concatenate([targets, state.time[None].astype(jnp.float32)])

    def global_state_space(self, params):
        return Box(0.0, np.inf, (2 * self.n + 1,), np.float32)


def toy_setup(critic=ippo.own_critic, global_state=False, **agent) -> ippo.Setup:
    """The Setup of `agent`'s settings on MaskedGuess, with IPPO's critic or `critic`'s."""
    config = make_config(**agent)
    env = TeamEpisodeStatistics(MaskedGuess())
    params = env.default_params
    pieces = critic(config.agent, env, params)
    return ippo.setup(config, env, params, *pieces, global_state=global_state)


@pytest.fixture(scope="module")
def toy_run():
    """(Setup, initial state, a 16-step rollout of 4 envs) on MaskedGuess, one set of parameters
    per agent."""
    s = toy_setup(num_steps=16, share_parameters=False, gamma=0.9, gae_lambda=0.8)

    @jax.jit
    def run(key):
        state = ippo.init_state(s, key, hyperparams(s.agent))
        envs, traj, ended = ippo.rollout(s, state.params, state.envs, state.key, 0.0)
        return state, traj

    return s, *run(jax.random.PRNGKey(0))


def test_the_rollout_acts_within_each_steps_mask_and_stores_the_masked_log_probs(toy_run):
    s, state, traj = toy_run
    mask, action = np.asarray(traj.obs.action_mask), np.asarray(traj.action)
    assert mask.shape == (16, 4, 2, 4) and action.shape == (16, 4, 2)
    assert np.take_along_axis(mask, action[..., None], -1).all()
    assert 0.2 < mask[..., 1, :].mean() < 0.9  # agent b's masks do rule actions out
    # agent a is terminated on steps 2 to 4 of each 4-step episode, b truncated on step 4
    np.testing.assert_array_equal(traj.terminated[:, 0, 0], np.tile([0, 1, 1, 1], 4))
    np.testing.assert_array_equal(traj.truncated[:, 0, 1], np.tile([0, 0, 0, 1], 4))
    logits = s.actor.apply(state.params["actor"], traj.obs.obs)
    reference = masked_log_softmax(np.asarray(logits, np.float64), mask)
    np.testing.assert_allclose(
        traj.log_prob, np.take_along_axis(reference, action[..., None], -1)[..., 0], atol=1e-5
    )


def numpy_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    """GAE of one agent in one env, [T], step by step in float64."""
    advantages, next_advantage = np.zeros(len(rewards)), 0.0
    for t in reversed(range(len(rewards))):
        discount = gamma * (1.0 - terminated[t])
        delta = rewards[t] + discount * next_values[t] - values[t]
        next_advantage = delta + discount * lam * (1.0 - (terminated[t] or truncated[t])) * (
            next_advantage
        )
        advantages[t] = next_advantage
    return advantages


def test_per_agent_gae_is_single_agent_gae_run_agent_by_agent(toy_run):
    s, state, traj = toy_run
    batch, advantages, targets = jax.jit(partial(ippo.learn_batch, s))(
        hyperparams(s.agent), state.params, traj
    )
    assert advantages.shape == (16 * 4, 2) and batch.obs.obs.shape == (16 * 4, 2, 4)
    values = np.asarray(s.critic.apply(state.params["critic"], traj.obs.obs), np.float64)
    next_values = np.asarray(s.critic.apply(state.params["critic"], traj.final_obs.obs))
    reward, term, trunc = (np.asarray(x, np.float64) for x in traj[3:6])
    for env in range(4):
        for agent in range(2):
            expected = numpy_gae(
                reward[:, env, agent],
                values[:, env, agent],
                next_values[:, env, agent],
                term[:, env, agent],
                trunc[:, env, agent],
                0.9,
                0.8,
            )
            rows = np.arange(16) * 4 + env
            np.testing.assert_allclose(advantages[rows, agent], expected, atol=1e-5)
            np.testing.assert_allclose(
                targets[rows, agent], expected + values[:, env, agent], atol=1e-5
            )


def test_the_loss_scores_the_masked_policy_that_acted(toy_run):
    """At the behaviour parameters the loss's log-probabilities are the stored ones: the ratio is
    1 on every agent step (without the stored masks it would not be where masks rule actions
    out)."""
    s, state, traj = toy_run
    hparams = hyperparams(s.agent)
    batch = ippo.learn_batch(s, hparams, state.params, traj)
    _, stats = jax.jit(partial(ippo.minibatch_loss, s))(hparams, state.params, batch)
    assert abs(float(stats["approx_kl"])) < 1e-6 and float(stats["clip_fraction"]) == 0.0
    unmasked = batch[0]._replace(obs=batch[0].obs._replace(action_mask=True))
    _, stats = jax.jit(partial(ippo.minibatch_loss, s))(
        hparams, state.params, (unmasked, *batch[1:])
    )
    assert float(stats["approx_kl"]) > 1e-3


# ---------------------------------------------------------------- parameters


def test_per_agent_networks_apply_agent_i_parameters_to_agent_i_inputs():
    net = layers.Network(
        init=lambda key, x: {"w": jax.random.normal(key, (x.shape[-1], 3))},
        apply=lambda params, x, rng=None: x @ params["w"],
    )
    x = jax.random.normal(jax.random.PRNGKey(0), (5, 2, 4))  # [batch, A, d]
    shared = multi_agent.per_agent(net, rank=1, shared=True)
    separate = multi_agent.per_agent(net, rank=1, shared=False)
    one, per_agent = (
        shared.init(jax.random.PRNGKey(1), x[0]),
        separate.init(jax.random.PRNGKey(1), x[0]),
    )
    assert one["w"].shape == (4, 3) and per_agent["w"].shape == (2, 4, 3)
    assert not np.allclose(per_agent["w"][0], per_agent["w"][1])
    np.testing.assert_allclose(
        shared.apply(one, x), np.einsum("bad,dk->bak", x, one["w"]), rtol=1e-5
    )
    np.testing.assert_allclose(
        separate.apply(per_agent, x),
        np.einsum("bad,adk->bak", x, per_agent["w"]),
        rtol=1e-5,
    )


def test_shared_and_separate_parameters_and_agent_ids_in_the_networks():
    def shapes(s):
        state = jax.eval_shape(
            lambda key: ippo.init_state(s, key, hyperparams(s.agent)), jax.random.PRNGKey(0)
        )
        return jax.tree.map(lambda x: x.shape, state.params)

    shared = shapes(toy_setup())
    separate = shapes(toy_setup(share_parameters=False))
    with_ids = shapes(toy_setup(agent_id_input=True))
    assert shared["actor"]["params"]["Dense_0"]["kernel"] == (4, 16)
    assert shared["critic"]["params"]["Dense_2"]["kernel"] == (16, 1)
    is_shape = lambda x: isinstance(x, tuple)
    flat = lambda tree: jax.tree.leaves(tree, is_leaf=is_shape)
    assert flat(separate) == [(2, *shape) for shape in flat(shared)]
    assert with_ids["actor"]["params"]["Dense_0"]["kernel"] == (4 + 2, 16)
    x = jnp.arange(12.0).reshape(2, 3, 2)  # [batch, A = 3, d = 2]
    np.testing.assert_array_equal(
        multi_agent.with_agent_ids(x)[..., 2:], np.broadcast_to(np.eye(3), (2, 3, 3))
    )


def test_make_policy_takes_each_agents_likeliest_allowed_action():
    config = make_config()
    policy = ippo.make_policy(config)
    s = ippo.make_setup(config)
    params = jax.jit(lambda key: ippo.init_state(s, key, hyperparams(config.agent)).params)(
        jax.random.PRNGKey(0)
    )
    obs = jax.random.normal(jax.random.PRNGKey(1), (3, 18)) * 5.0
    logits = np.asarray(s.actor.apply(params["actor"], obs))
    np.testing.assert_array_equal(
        policy(params, obs, None, jnp.ones((3, 5), bool)), logits.argmax(-1)
    )
    only = jnp.array([2, 0, 4])
    mask = jax.nn.one_hot(only, 5).astype(bool)
    np.testing.assert_array_equal(policy(params, obs, None, mask), only)


# ---------------------------------------------------------------- training


def test_the_shaped_reward_weight_falls_linearly_from_1_to_0_over_the_anneal_steps():
    agent = make_config(shaped_reward_anneal_steps=0).agent
    reward, info = jnp.array([1.0, -1.0]), {"shaped_reward": jnp.array([3.0, 0.5])}
    assert ippo.shaping_weight(agent, 500) == 0.0
    np.testing.assert_array_equal(ippo.learning_reward(agent, reward, info, 0.0), reward)
    # Overcooked reports info["shaped_reward"]: the key is accepted there
    agent = make_config("jaxmarl:overcooked", shaped_reward_anneal_steps=1000).agent
    weights = [float(ippo.shaping_weight(agent, step)) for step in (0, 250, 1000, 5000)]
    np.testing.assert_allclose(weights, [1.0, 0.75, 0.0, 0.0])
    np.testing.assert_allclose(
        ippo.learning_reward(agent, reward, info, 0.75), [1.0 + 2.25, -1.0 + 0.375]
    )


# ---------------------------------------------------------------- bad configs


@pytest.mark.parametrize(
    "env_id, env_params, agent, key",
    [
        ("CartPole-v1", {}, {}, "env.id: agent 'ippo' trains teams"),
        (MPE, {"action_type": "Continuous"}, {}, "env.id: ippo supports Discrete actions"),
        (MPE, {}, {"shared_network": True}, "agent.shared_network"),
        (MPE, {}, {"shaped_reward_anneal_steps": 1000}, "agent.shaped_reward_anneal_steps"),
        ("jaxmarl:overcooked", {}, {"agent_id_input": True}, "agent.agent_id_input"),
    ],
)
def test_bad_configs_name_the_key(env_id, env_params, agent, key):
    with pytest.raises(ConfigError, match=key):
        make_config(env_id, env_params, **agent)


# ---------------------------------------------------------------- reproducibility, learning on MPE


def test_a_seed_trained_twice_in_one_vmapped_program_gives_the_same_run_and_seeds_differ():
    train = jax.jit(jax.vmap(ippo.make_train(make_config(total_steps=256))))
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    _, metrics = train(jnp.concatenate([keys, keys[:1]]))  # a third run: seed 0 again
    assert metrics["step"][0, -1] == 256
    jax.tree.map(lambda x: np.testing.assert_array_equal(x[0], x[2]), metrics)
    assert not np.array_equal(metrics["policy_loss"][0], metrics["policy_loss"][1])


@pytest.mark.slow
def test_ippo_beats_a_random_policy_on_mpe_simple_spread_on_most_of_4_seeds_reproducibly():
    """A learning run (`-m slow`; the test above checks reproducibility in the default suite):
    `python benchmarks/marl.py --config configs/ippo_mpe_spread.yaml` measures IPPO's team return
    on MPE simple_spread beside JaxMARL's baseline."""
    config = make_config(
        total_steps=65536,
        num_envs=32,
        num_steps=32,
        num_epochs=4,
        num_minibatches=2,
        lr=0.003,
        anneal_lr=False,
        clip_value_loss=False,
        log_interval=16,
        network={"hidden": [64, 64], "activation": "tanh"},
    )
    train = jax.jit(jax.vmap(ippo.make_train(config)))
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    _, metrics = train(jnp.concatenate([keys, keys[:1]]))  # a fifth run: seed 0 again
    final = np.asarray(metrics["episode_return"][:4, -1])
    assert metrics["step"][0, -1] == 65536
    assert np.sum(final > RANDOM_SPREAD_RETURN + 3.0) >= 3, final
    jax.tree.map(lambda x: np.testing.assert_array_equal(x[0], x[4]), metrics)
    assert not np.array_equal(metrics["episode_return"][0], metrics["episode_return"][1])


def test_team_returns_run_every_agents_gae_to_the_teams_episode_end():
    """Agent 0 dies at t = 0 and keeps getting the team reward; the team's episode ends at t = 2
    (everyone terminated), then agent 1 alone is truncated at t = 4, agent 0 dead (a time limit):
    per agent, agent 0's return stops at its death; with `agent.team_returns` it runs to the
    team's episode end, and the time limit bootstraps every agent."""
    from types import SimpleNamespace

    terminated = np.array([[1, 0], [1, 0], [1, 1], [1, 0], [1, 0]], bool)[:, None]  # [T, E, A]
    truncated = np.array([[0, 0], [0, 0], [0, 0], [0, 0], [0, 1]], bool)[:, None]
    traj = SimpleNamespace(
        reward=jnp.ones((5, 1, 2)),
        terminated=jnp.asarray(terminated),
        truncated=jnp.asarray(truncated),
    )
    hparams = {"reward_scale": 1.0, "gamma": 0.5, "gae_lambda": 1.0}
    values, final_values = jnp.zeros((5, 1, 2)), jnp.full((5, 1, 2), 2.0)

    def gae(team_returns):
        agent = SimpleNamespace(team_returns=team_returns)
        s = SimpleNamespace(agent=agent, backend="reference", deterministic=False)
        return np.asarray(ippo.team_gae(s, hparams, traj, values, final_values)[0][:, 0])

    np.testing.assert_allclose(gae(False)[:, 0], [1, 1, 1, 1, 1])
    # delta = 1 + 0.5 * 2 going on or truncated, 1 terminated; A_t = delta_t + 0.5 A_(t+1)
    np.testing.assert_allclose(gae(True)[:, 0], [3.25, 2.5, 1, 3, 2])
    np.testing.assert_allclose(gae(True)[:, 1], gae(False)[:, 1])
    np.testing.assert_allclose(gae(True)[:, 1], [3.25, 2.5, 1, 3, 2])
