"""Recurrent IPPO (JaxMARL's ippo_rnn baselines), compiled end to end: IPPO (rl/agents/ippo.py)
whose agents remember, on recurrent PPO's GRU or LSTM torso (rl/agents/ppo_rnn.py). Agent i's
carry is reset where its previous step ended its episode; the critic reads the same inputs through
a torso of its own, or the actor's (`agent.shared_network`); minibatches are whole env sequences
(`update`). Unlike JaxMARL's: GAE per agent with truncation bootstrapped (JaxMARL's team done:
`agent.team_returns`, which the SMAX configs set), minibatches of envs (JaxMARL's: of agents).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from rl.agents import ippo, ppo, ppo_rnn
from rl.agents.ippo import Observation
from rl.agents.trainer import RecurrentPolicy, Trainer, train_from_trainer
from rl.config.parsing import ConfigError, hp
from rl.config.unrolling import unroll_of
from rl.core import environment, episodes, minibatches
from rl.core.collection import rollout_keys, scan_packed_outputs
from rl.core.log_points import log_point_metrics, scan_log_points, scan_updates
from rl.core.optimizers import annealed_clipped_adam
from rl.core.rollout import greedy_episodes
from rl.core.state import Envs, OnPolicyState
from rl.nn import multi_agent, networks
from rl.nn.layers import Network, build, mlp
from rl.nn.network_config import NetworkConfig, network_config
from rl.nn.networks import Categorical

MULTI_AGENT = True
RECURRENT = True  # takes a recurrent torso (rl.config.check_recurrence)


@dataclass(frozen=True)
class Config(ippo.Config, ppo_rnn.Config):
    """IPPO's settings (the team's) with recurrent PPO's torso and whole-sequence minibatches
    (`num_minibatches` divides `num_envs`); the network's defaults are JaxMARL's ippo_rnn's."""

    name: str = "ippo_rnn"
    network: NetworkConfig = network_config(
        torso="gru", hidden=(128,), recurrent_hidden=128, activation="relu"
    )
    head_hidden: tuple[int, ...] = hp(
        (128,),
        doc="widths of the dense layers after the cell in the policy head and in the value head "
        "(empty: linear heads)",
    )

    def validate(self):
        if any(width < 1 for width in self.head_hidden):
            raise ConfigError(
                f"agent.head_hidden must list positive widths, got {list(self.head_hidden)}"
            )
        super().validate()


check_env = multi_agent.check_team_env  # IPPO's checks; the actor and the critic may share a torso


# ---------------------------------------------------------------- the network


class Setup(NamedTuple):
    """The team's network and what it reads, the env (its vmapped reset and step) and the kernel
    choices (`environment.kernel_backend`, kernels.deterministic): what the program is built
    from."""

    agent: Config
    net: Network  # (params, carry, actor_in, critic_in or None, reset) -> (carry, (logits, values))
    initial_carry: Callable  # initial_carry(batch=()) -> fresh episodes' carry [*batch, A, ...]
    actor_input: Callable  # Observation [...] -> what the actor reads, [..., A, ...]
    critic_input: Callable  # Observation [...] -> what the critic reads, [..., A, ...]
    global_state: bool  # whether Observations carry the env's global state
    env: Any
    env_params: Any
    reset: Any
    step: Any
    backend: str
    deterministic: bool = False


def make_setup(config) -> Setup:
    """Recurrent IPPO's Setup of `config`: its env, the critic reading what the actor reads."""
    env, env_params = environment.make_env(config)
    return setup(config, env, env_params, actor_view(config.agent, env, env_params))


def actor_view(agent: Config, env, env_params):
    """(space, input) of what the actor reads: every agent's observation, with its id under
    `agent.agent_id_input`."""
    space = env.observation_space(env_params)
    if agent.agent_id_input:
        space = multi_agent.id_space(space, env.num_agents)
    return space, lambda seen: ippo.actor_input(agent)(seen.obs)


def setup(config, env, env_params, critic_view, global_state: bool = False) -> Setup:
    """The Setup of `config` on its env with the critic reading `critic_view` = (the space of its
    input, Observation -> input); `global_state`: Observations carry the env's global state."""
    agent = config.agent
    actor_space, actor_input = actor_view(agent, env, env_params)
    critic_space, critic_input = critic_view
    with_hidden = partial(networks.with_head, partial(hidden_layers, agent))
    num_actions = int(env.action_space(env_params).n)
    torso = networks.make_torso(agent.network, actor_space)
    critic_torso = networks.make_torso(agent.network, critic_space)
    if agent.shared_network:  # one torso: the critic reads the actor's features
        critic_torso = None
    fn = multi_agent.recurrent_team(
        torso,
        with_hidden(networks.categorical_policy_head(num_actions)),
        with_hidden(networks.value_head()),
        critic_torso,
    )
    net = multi_agent.per_agent_recurrent(
        build(fn, agent.network.backend, agent.network.init), agent.share_parameters
    )
    initial_carry = partial(multi_agent.team_carry, fn.initial_carry, env.num_agents)
    team = (agent, net, initial_carry, actor_input, critic_input, global_state)
    kernel_choices = (environment.kernel_backend(config), config.kernels.deterministic)
    return Setup(*team, env, env_params, *environment.batched(env), *kernel_choices)


def hidden_layers(agent: Config, layers, features):
    """The `agent.head_hidden` dense layers a head puts on the torso's features."""
    return mlp(layers, features, agent.head_hidden, agent.network.activation)


def one_step(s: Setup, params, carry, seen: Observation, reset, critic: bool = True):
    """The network's step (T = 1) on Observations [*batch] from `carry`, reset where `reset`
    [*batch, A]: (carry, (logits [*batch, A, n], values [*batch, A])); `critic` False: the actor
    alone (values None)."""
    seen = jax.tree.map(lambda x: x[None], seen)
    critic_in = s.critic_input(seen) if critic else None
    carry, outputs = s.net.apply(params, carry, s.actor_input(seen), critic_in, reset[None])
    return carry, ppo_rnn.first_step(outputs)


# ---------------------------------------------------------------- init


def init_state(s: Setup, key, hparams) -> OnPolicyState:
    """Fresh params, optimiser state and `num_envs` reset envs (their Observations, the initial
    carry, every agent beginning an episode), the PRNG key and the counters."""
    key, net_key, reset_key = jax.random.split(key, 3)
    num_envs, agents = s.agent.num_envs, s.env.num_agents
    obs, env_state = s.reset(jax.random.split(reset_key, num_envs), s.env_params)
    seen = ippo.observe(s, obs, ippo.state_info(s, env_state))
    first = jax.tree.map(lambda x: x[:1], seen)  # env 0's, as a sequence of one step
    inputs = (s.actor_input(first), s.critic_input(first), jnp.ones((1, agents), jnp.bool_))
    params = s.net.init(net_key, s.initial_carry(), *inputs)
    agent = s.agent
    adam = annealed_clipped_adam(agent, hparams["lr"], hparams["max_grad_norm"], eps=agent.adam_eps)
    memory = ppo_rnn.Memory(s.initial_carry(num_envs), jnp.ones((num_envs, agents), jnp.bool_))
    envs, zero = Envs(seen, env_state, memory), jnp.int32(0)
    return OnPolicyState(params, adam.init(ravel_pytree(params)[0]), envs, key, zero, zero)


# ---------------------------------------------------------------- collect


class Transition(NamedTuple):
    """One rollout step of every agent, [E, A, ...] (stacked: [T, E, A, ...]): `ippo.Transition`'s
    fields, with the reset flags, the value and the carry."""

    obs: Observation
    reset: jax.Array  # obs begins the agent's episode: its carry was reset before the cell read it
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: Observation
    carry: Any  # h_t, the state after reading obs (the pre-reset state for final_obs)


def rollout(s: Setup, params, envs: Envs, key, shaping):
    """num_steps steps of every env, each agent acting on its masked policy and carrying its
    hidden state: (envs, Transitions [T, E, A, ...], the episodes that ended as
    `episodes.EpisodeTotals` per env [E]); `shaping` is the weight of the shaped reward."""

    def env_step(carry, keys):
        seen, memory, env_state, ended = carry
        act_key, env_keys = keys
        h, (logits, value) = one_step(s, params, memory.carry, seen, memory.reset)
        pi = Categorical(logits).masked(seen.action_mask)
        action = pi.sample(act_key)
        log_prob, _ = pi.log_prob_entropy(action, backend="reference")
        stepped = ippo.step_envs(s, env_keys, env_state, action, ended, shaping)
        next_seen, env_state, (reward, terminated, truncated, reached), ended = stepped
        ends = (terminated, truncated)
        trans = Transition(seen, memory.reset, action, log_prob, value, reward, *ends, reached, h)
        return (next_seen, ppo_rnn.Memory(h, terminated | truncated), env_state, ended), trans

    keys = rollout_keys(key, s.agent.num_steps, s.agent.num_envs)
    carry = (envs.obs, envs.memory, envs.state, episodes.no_episodes((s.agent.num_envs,)))
    (seen, memory, env_state, ended), traj = scan_packed_outputs(
        env_step, carry, keys, unroll=min(unroll_of(s.agent), s.agent.num_steps)
    )
    return Envs(seen, env_state, memory), traj, ended


# ---------------------------------------------------------------- values and advantages


def bootstrap_values(s: Setup, params, traj: Transition):
    """V(final_obs_ti) [T, E, A], read from the pre-reset state h_ti where agent i goes on or is
    truncated, from the initial state where it is terminated (as the rollout reads its next step:
    a dead SMAX unit's, which `agent.team_returns` bootstraps through): one step of the network
    from every step's carry, all T x E steps in one pass."""
    _, (_, values) = one_step(s, params, traj.carry, traj.final_obs, traj.terminated)
    return values


class Sequences(NamedTuple):
    """What the loss reads, env-major [E, T, A, ...]: each env's sequences and their initial
    state."""

    initial_carry: Any  # [E, A, ...]: h_(-1), the carry at the start of the rollout
    obs: Observation
    reset: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array


def learn_batch(s: Setup, hparams, params, traj: Transition, initial_carry):
    """(Sequences, advantages, targets), env-major [E, T, A, ...]: truncation-aware GAE of every
    agent (`ippo.team_gae`) from the rollout's values and `bootstrap_values`."""
    final_values = bootstrap_values(s, params, traj)
    advantages, targets = ippo.team_gae(s, hparams, traj, traj.value, final_values)
    steps = Sequences(None, traj.obs, traj.reset, traj.action, traj.log_prob, traj.value)
    seqs, advantages, targets = jax.tree.map(env_time_swap, (steps, advantages, targets))
    return seqs._replace(initial_carry=initial_carry), advantages, targets


def env_time_swap(x):
    """[T, E, ...] <-> [E, T, ...]."""
    return jnp.swapaxes(x, 0, 1)


def minibatch_loss(s: Setup, hparams, params, minibatch):
    """`ppo.ppo_objective` of a minibatch of whole env sequences (Sequences, advantages, targets;
    env-major) over every agent step in it: the network re-run over each from its initial state
    with the stored resets, its policy masked with the stored masks."""
    seqs, advantages, targets = minibatch
    seen, reset = jax.tree.map(env_time_swap, (seqs.obs, seqs.reset))
    inputs = (s.actor_input(seen), s.critic_input(seen), reset)
    _, (logits, values) = s.net.apply(params, seqs.initial_carry, *inputs)
    pi = Categorical(logits).masked(seen.action_mask)
    pi, values = jax.tree.map(env_time_swap, (pi, values))
    return ppo.ppo_objective(s, hparams, pi, values, seqs, advantages, targets)


# ---------------------------------------------------------------- one update


def update(s: Setup, hparams, state: OnPolicyState, totals):
    """One recurrent IPPO update: collect a rollout (every agent sampling its masked policy and
    carrying its state; the carry it began with, h_(-1), kept as each sequence's initial state),
    V(final_obs_ti) read from the pre-reset state h_ti (`bootstrap_values`), every agent's
    truncation-aware GAE, then num_epochs passes over num_minibatches groups of whole env
    sequences (each env's agents together), the network re-run from h_(-1) with the stored resets
    and masks, one Adam step each on the flat parameters along `ppo.ppo_objective`. Returns
    (state, totals, mean loss stats)."""
    agent = s.agent
    key, rollout_key, shuffle_key = jax.random.split(state.key, 3)
    # collect, from the carry the envs hold
    shaping = multi_agent.shaping_weight(agent, state.step)
    envs, traj, ended = rollout(s, state.params, state.envs, rollout_key, shaping)
    # values and advantages, per agent; the sequences start from the carry the rollout began with
    batch = learn_batch(s, hparams, state.params, traj, state.envs.memory.carry)
    # update epochs over minibatches of whole env sequences
    loss = partial(minibatch_loss, s, hparams)
    params, opt_state, stats = minibatches.adam_epochs(
        agent, hparams, loss, state.params, state.opt_state, batch, shuffle_key
    )
    progress = (state.step + agent.batch_size, state.updates + 1)
    state = OnPolicyState(params, opt_state, envs, key, *progress)
    stats = jax.tree.map(jnp.mean, stats)
    if agent.shaped_reward_anneal_steps:
        stats["shaping_weight"] = shaping
    return state, episodes.add_totals(totals, ended), stats


# ---------------------------------------------------------------- the program


def greedy_step(s: Setup, params, carry, obs, action_mask):
    """One step of the team's greedy policy with memory (the actor alone, no reset) on
    observations [*batch, A, ...]: (carry, every agent's likeliest allowed action)."""
    no_reset = jnp.zeros(jnp.shape(action_mask)[:-1], jnp.bool_)
    seen = Observation(obs, action_mask)
    carry, (logits, _) = one_step(s, params, carry, seen, no_reset, critic=False)
    return carry, Categorical(logits).masked(action_mask).mode()


def greedy_evaluation(s: Setup, params, key) -> dict:
    """The mean greedy team return and length of `agent.eval_envs` fresh envs' first episodes,
    every agent from the initial carry ({} without `agent.eval_envs`)."""
    if not s.agent.eval_envs:
        return {}
    act, carry = partial(greedy_step, s, params), s.initial_carry(s.agent.eval_envs)
    num_envs = s.agent.eval_envs
    returns, lengths = greedy_episodes(s.env, s.env_params, act, key, num_envs, carry=carry)
    return {"eval_return": returns.mean(), "eval_length": lengths.mean()}


def trainer(s: Setup) -> Trainer:
    """init, and run = log points of `agent.log_interval` updates each (their team episodes and
    mean loss stats, and `greedy_evaluation`)."""

    def log_period(hparams, state: OnPolicyState):
        one_update = partial(update, s, hparams)
        state, totals, stats = scan_updates(one_update, state, s.agent.log_interval)
        key, eval_key = jax.random.split(state.key)
        metrics = log_point_metrics(state.step, totals, stats)
        return state._replace(key=key), {**metrics, **greedy_evaluation(s, state.params, eval_key)}

    def run(state, hparams, num_log_points):
        return scan_log_points(partial(log_period, hparams), state, num_log_points)

    return Trainer(partial(init_state, s), run, s.agent.num_updates // s.agent.log_interval)


def greedy_policy(s: Setup) -> RecurrentPolicy:
    """The team's greedy policy with memory: `initial_carry(batch=())` [*batch, A, ...], and
    `step(params, carry, obs [A, ...], key, action_mask [A, n]) -> (carry, actions [A])`, every
    agent's likeliest allowed action (the key is unused)."""
    step = lambda params, carry, obs, key, mask: greedy_step(s, params, carry, obs, mask)
    return RecurrentPolicy(initial_carry=s.initial_carry, step=step)


def make_trainer(config) -> Trainer:
    return trainer(make_setup(config))


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config) -> RecurrentPolicy:
    return greedy_policy(make_setup(config))
