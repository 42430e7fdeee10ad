"""Independent PPO (IPPO; de Witt et al. 2020, JaxMARL's ippo_ff baselines), compiled end to end:
every agent of a team learns PPO on its own observations and rewards. Agent i acts with a
categorical policy restricted to the actions its mask allows (`policy`) and a critic V(o_i) scores
it; one update is a rollout (`rollout`), truncation-aware GAE per agent (`team_gae`) and PPO's
clipped objective over the agent steps (`minibatch_loss`). The critic is a piece of `Setup`: MAPPO
(rl/agents/mappo.py) is this loop with a critic on the global state.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from rl.agents import ppo
from rl.agents.trainer import Trainer, train_from_trainer
from rl.config.loops import PPOLoopConfig
from rl.config.parsing import ConfigError, hp
from rl.config.unrolling import unroll_of
from rl.core import environment, episodes, losses
from rl.core.collection import rollout_keys, scan_packed_outputs
from rl.core.log_points import log_point_metrics, scan_log_points, scan_updates
from rl.core.minibatches import adam_epochs
from rl.core.optimizers import annealed_clipped_adam
from rl.core.rollout import greedy_episodes
from rl.core.state import Envs, OnPolicyState
from rl.nn import layers, multi_agent, networks
from rl.nn.multi_agent import learning_reward, shaping_weight
from rl.nn.network_config import NetworkConfig, network_config

MULTI_AGENT = True


@dataclass(frozen=True)
class Config(PPOLoopConfig):
    """IPPO's settings: PPOLoopConfig's (defaults: JaxMARL's ippo_ff_mpe) and the team's."""

    name: str = "ippo"
    network: NetworkConfig = network_config(hidden=(64, 64), activation="tanh")
    num_envs: int = hp(16, low=1, doc="parallel envs (each steps every agent)")
    share_parameters: bool = hp(
        True,
        doc="one set of actor and critic parameters for every agent; false: one set per agent",
    )
    agent_id_input: bool = hp(
        False, doc="append the agent's one-hot index to its observation (vector observations)"
    )
    shaped_reward_anneal_steps: int = hp(
        0,
        low=0,
        doc="env steps over which the weight of info['shaped_reward'] (Overcooked) in the "
        "learning reward falls linearly from 1 to 0; 0: no shaping",
    )
    team_returns: bool = hp(
        False,
        doc="every agent's return runs to the team's episode end (JaxMARL's baselines: GAE on the "
        "team's done), so a SMAX unit that dies keeps the team reward it still gets; false: "
        "each agent's return ends where it is terminated",
    )


def check_env(config, env, env_params) -> None:
    """IPPO needs separate actor and critic networks, and what `multi_agent.check_team_env` checks
    (Discrete actions, vector observations for agent ids, a shaped reward to anneal)."""
    if config.agent.shared_network:
        raise ConfigError(
            f"agent.shared_network: {config.agent.name}'s actor and critic are separate networks"
        )
    multi_agent.check_team_env(config, env, env_params)


# ---------------------------------------------------------------- the networks and the policy


def make_actor(agent: Config, env, env_params) -> layers.Network:
    """The team's actor: observations [..., A, *obs_shape] -> logits [..., A, n]."""
    obs_space, num_agents = env.observation_space(env_params), env.num_agents
    head = networks.categorical_policy_head(int(env.action_space(env_params).n))
    if agent.agent_id_input:
        obs_space = multi_agent.id_space(obs_space, num_agents)
    torso = networks.make_torso(agent.network, obs_space)
    net = layers.build(networks.with_head(torso, head), agent.network.backend, agent.network.init)
    net = multi_agent.per_agent(net, len(obs_space.shape), agent.share_parameters)
    return multi_agent.reading(net, actor_input(agent))


def actor_input(agent: Config) -> Callable:
    """What the networks read of observations [..., A, d]: themselves, or with agent ids."""
    return multi_agent.with_agent_ids if agent.agent_id_input else (lambda obs: obs)


def make_critic(agent: Config, input_space) -> layers.Network:
    """The team's critic: inputs [..., A, *input_space.shape] -> values [..., A]."""
    torso = networks.make_torso(agent.network, input_space)
    head = networks.value_head()
    net = layers.build(networks.with_head(torso, head), agent.network.backend, agent.network.init)
    return multi_agent.per_agent(net, len(input_space.shape), agent.share_parameters)


class Observation(NamedTuple):
    """What the agents see of an env at a step: their observations [..., A, *obs_shape], their
    action masks (bool [..., A, n]) and, for a critic that reads it, the global state [..., G]
    (else ())."""

    obs: jax.Array
    action_mask: jax.Array
    global_state: Any = ()


class Setup(NamedTuple):
    """The team's networks, its env and the kernel choices: what the program is built from."""

    agent: Config
    actor: layers.Network  # observations [..., A, ...] -> logits [..., A, n]
    critic: layers.Network  # critic_input(Observation) -> values [..., A]
    critic_input: Callable  # Observation [...] -> what the critic reads, [..., A, ...]
    global_state: bool  # whether Observations carry the env's global state
    env: Any
    env_params: Any
    reset: Any  # vmapped env.reset
    step: Any  # vmapped env.step
    backend: str  # kernel backend (`environment.kernel_backend`), or "auto"
    deterministic: bool = False  # kernels.deterministic: fixed-order GAE scan


def make_setup(config) -> Setup:
    """IPPO's Setup of `config`: its env, with the critic on each agent's observation."""
    env, env_params = environment.make_env(config)
    return setup(config, env, env_params, *own_critic(config.agent, env, env_params))


def own_critic(agent: Config, env, env_params):
    """(critic, critic_input) of V(o_i): the critic reads what the actor reads."""
    obs_space = env.observation_space(env_params)
    if agent.agent_id_input:
        obs_space = multi_agent.id_space(obs_space, env.num_agents)
    return make_critic(agent, obs_space), lambda seen: actor_input(agent)(seen.obs)


def setup(config, env, env_params, critic, critic_input, global_state: bool = False) -> Setup:
    """The Setup of `config` on its env with the critic given: `critic` reads
    `critic_input(Observation)`; `global_state`: Observations carry the env's global state."""
    actor = make_actor(config.agent, env, env_params)
    reset, step = environment.batched(env)
    kernel_choices = (environment.kernel_backend(config), config.kernels.deterministic)
    team = (actor, critic, critic_input, global_state)
    return Setup(config.agent, *team, env, env_params, reset, step, *kernel_choices)


def policy(actor: layers.Network, params, obs, action_mask) -> networks.Categorical:
    """Every agent's pi(.|o_i, m_i): the actor's logits, masked."""
    return networks.Categorical(actor.apply(params["actor"], obs)).masked(action_mask)


def observe(s: Setup, obs, info, prefix: str = "") -> Observation:
    """The agents' Observation of `obs`: info[prefix + "action_mask"] and, when the critic reads it,
    info[prefix + "global_state"]; prefix "final_" for info["final_obs"], what a step reached."""
    world = info[prefix + "global_state"] if s.global_state else ()
    return Observation(obs, info[prefix + "action_mask"], world)


def state_info(s: Setup, env_state) -> dict:
    """info["action_mask"] (and ["global_state"]) of a batch of envs, read off their states."""
    of_states = lambda fn: jax.vmap(fn, in_axes=(0, None))(env_state, s.env_params)
    info = {"action_mask": of_states(s.env.action_mask)}
    if s.global_state:
        info["global_state"] = of_states(s.env.global_state)
    return info


# ---------------------------------------------------------------- init


def init_state(s: Setup, key, hparams) -> OnPolicyState:
    """Fresh actor and critic params ({"actor", "critic"}), optimiser state, `num_envs` reset envs
    (their Observations), the PRNG key and the counters."""
    key, actor_key, critic_key, reset_key = jax.random.split(key, 4)
    obs, env_state = s.reset(jax.random.split(reset_key, s.agent.num_envs), s.env_params)
    seen = observe(s, obs, state_info(s, env_state))
    params = {
        "actor": s.actor.init(actor_key, obs[0]),
        "critic": s.critic.init(critic_key, s.critic_input(seen)[0]),
    }
    adam = annealed_clipped_adam(
        s.agent, hparams["lr"], hparams["max_grad_norm"], eps=s.agent.adam_eps
    )
    opt_state = adam.init(ravel_pytree(params)[0])
    return OnPolicyState(params, opt_state, Envs(seen, env_state), key, jnp.int32(0), jnp.int32(0))


# ---------------------------------------------------------------- collect


class Transition(NamedTuple):
    """One rollout step of every agent, [E, A, ...] (values come afterwards, in one batch)."""

    obs: Observation  # what the agents acted on, masks included
    action: jax.Array
    log_prob: jax.Array
    reward: jax.Array  # what is learned from (shaped with agent.shaped_reward_anneal_steps)
    terminated: jax.Array
    truncated: jax.Array
    final_obs: Observation  # what the step reached (info["final_obs"])


def step_envs(s: Setup, keys, env_state, action, ended, shaping):
    """Every env's step under the agents' actions: (the next Observations, the env states, (the
    reward learned from, terminated, truncated, the Observations reached), the per-env
    `episodes.EpisodeTotals` `ended` with the episodes that ended added); `shaping` is the weight
    of the shaped reward (`multi_agent.learning_reward`)."""
    next_obs, env_state, reward, terminated, truncated, info = s.step(
        keys, env_state, action, s.env_params
    )
    ended = episodes.count_episodes(ended, info)
    reward = learning_reward(s.agent, reward, info, shaping)
    reached = observe(s, info["final_obs"], info, "final_")
    return observe(s, next_obs, info), env_state, (reward, terminated, truncated, reached), ended


def rollout(s: Setup, params, envs: Envs, key, shaping):
    """num_steps steps of every env, each agent acting on its masked policy: (envs, Transitions
    [T, E, A, ...], the episodes that ended as `episodes.EpisodeTotals` per env [E]); `shaping` is
    the weight of the shaped reward."""

    def env_step(carry, keys):
        params, seen, env_state, ended = carry
        act_key, env_keys = keys
        pi = policy(s.actor, params, seen.obs, seen.action_mask)
        action = pi.sample(act_key)
        log_prob, _ = pi.log_prob_entropy(action, backend="reference")
        next_seen, env_state, outcome, ended = step_envs(
            s, env_keys, env_state, action, ended, shaping
        )
        trans = Transition(seen, action, log_prob, *outcome)
        return (params, next_seen, env_state, ended), trans

    keys = rollout_keys(key, s.agent.num_steps, s.agent.num_envs)
    carry = (params, envs.obs, envs.state, episodes.no_episodes((s.agent.num_envs,)))
    (_, seen, env_state, ended), traj = scan_packed_outputs(
        env_step, carry, keys, unroll=min(unroll_of(s.agent), s.agent.num_steps)
    )
    return Envs(seen, env_state), traj, ended


# ---------------------------------------------------------------- values and advantages


class LearnBatch(NamedTuple):
    """What the loss reads of an env step: the Observation, every agent's action, behaviour
    log-prob and value."""

    obs: Observation
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array


def learn_batch(s: Setup, hparams, params, traj: Transition):
    """(LearnBatch, advantages, targets), flattened to [num_steps * num_envs, A, ...]: V(o_ti) and
    V(final_obs_ti) in a critic pass each, then truncation-aware GAE of every agent (the agents axis
    a batch axis of the time-major scan)."""
    critic = lambda seen: s.critic.apply(params["critic"], s.critic_input(seen))
    values, final_values = critic(traj.obs), critic(traj.final_obs)
    advantages, targets = team_gae(s, hparams, traj, values, final_values)
    data = (LearnBatch(traj.obs, traj.action, traj.log_prob, values), advantages, targets)
    return jax.tree.map(lambda x: x.reshape((s.agent.batch_size,) + x.shape[2:]), data)


def team_gae(s: Setup, hparams, traj: Transition, values, final_values):
    """(advantages, targets) [T, E, A]: `losses.truncation_aware_gae` of every agent (the agents
    axis a batch axis of the time-major scan) on the scaled rewards of `traj`, from its values
    V(o_ti) and V(final_obs_ti). With `agent.team_returns` the episode ends are the team's: every
    agent is terminated where all are, else truncated where the episode ended (`team_episode_ends`).
    """
    gae = partial(losses.truncation_aware_gae, backend=s.backend, deterministic=s.deterministic)
    rewards, episode_ends = traj.reward * hparams["reward_scale"], (traj.terminated, traj.truncated)
    if s.agent.team_returns:
        episode_ends = team_episode_ends(*episode_ends)
    rates = (hparams["gamma"], hparams["gae_lambda"])
    return gae(rewards, values, final_values, *episode_ends, *rates)


def team_episode_ends(terminated, truncated):
    """(terminated, truncated) [..., A] of the team's episode for every agent: terminated where
    every agent is, truncated where every agent is out (terminated or truncated), not all
    terminated."""
    team_terminated = jnp.all(terminated, axis=-1, keepdims=True)
    ended = jnp.all(terminated | truncated, axis=-1, keepdims=True)
    team_truncated = ended & ~team_terminated
    shape = jnp.shape(terminated)
    return jnp.broadcast_to(team_terminated, shape), jnp.broadcast_to(team_truncated, shape)


def minibatch_loss(s: Setup, hparams, params, minibatch):
    """`ppo.ppo_objective` of a minibatch (LearnBatch, advantages, targets) under `params`, over
    every agent step in it."""
    batch, advantages, targets = minibatch
    pi = policy(s.actor, params, batch.obs.obs, batch.obs.action_mask)
    values = s.critic.apply(params["critic"], s.critic_input(batch.obs))
    return ppo.ppo_objective(s, hparams, pi, values, batch, advantages, targets)


# ---------------------------------------------------------------- one update


def update(s: Setup, hparams, state: OnPolicyState, totals):
    """One IPPO update: collect a rollout, compute every agent's advantages, then epochs of
    minibatch Adam steps on the flat parameter vector. Returns (state, totals, mean loss stats)."""
    agent = s.agent
    key, rollout_key, shuffle_key = jax.random.split(state.key, 3)
    # collect
    shaping = shaping_weight(agent, state.step)
    envs, traj, ended = rollout(s, state.params, state.envs, rollout_key, shaping)
    totals = episodes.add_totals(totals, ended)
    # values and advantages, per agent
    batch = learn_batch(s, hparams, state.params, traj)
    # update epochs: Adam steps on the flat parameter vector
    loss = partial(minibatch_loss, s, hparams)
    params, opt_state, stats = adam_epochs(
        agent, hparams, loss, state.params, state.opt_state, batch, shuffle_key
    )
    step, updates = state.step + agent.batch_size, state.updates + 1
    state = OnPolicyState(params, opt_state, envs, key, step, updates)
    stats = jax.tree.map(jnp.mean, stats)
    if agent.shaped_reward_anneal_steps:
        stats["shaping_weight"] = shaping
    return state, totals, stats


# ---------------------------------------------------------------- the program


def greedy_actions(actor: layers.Network, params, obs, action_mask):
    """Every agent's most probable allowed action (argmax of the masked logits)."""
    return policy(actor, params, obs, action_mask).mode()


def greedy_evaluation(s: Setup, params, key) -> dict:
    """The mean greedy team return and length of `agent.eval_envs` fresh envs' first episodes."""
    act = partial(greedy_actions, s.actor, params)
    returns, lengths = greedy_episodes(s.env, s.env_params, act, key, s.agent.eval_envs)
    return {"eval_return": returns.mean(), "eval_length": lengths.mean()}


def trainer(s: Setup) -> Trainer:
    """init, and run = log points of `agent.log_interval` updates each (their team episodes and
    mean loss stats, and the greedy team return of `agent.eval_envs` fresh envs). Returns are
    logged unshaped, as the team's: sum_t mean_i r_ti."""
    agent = s.agent

    def log_period(hparams, state: OnPolicyState):
        state, totals, stats = scan_updates(partial(update, s, hparams), state, agent.log_interval)
        metrics = log_point_metrics(state.step, totals, stats)
        if agent.eval_envs:
            key, eval_key = jax.random.split(state.key)
            metrics.update(greedy_evaluation(s, state.params, eval_key))
            state = state._replace(key=key)
        return state, metrics

    def run(state, hparams, num_log_points):
        return scan_log_points(partial(log_period, hparams), state, num_log_points)

    return Trainer(partial(init_state, s), run, agent.num_updates // agent.log_interval)


def make_trainer(config) -> Trainer:
    return trainer(make_setup(config))


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs[A, ...], key, action_mask[A, n]) -> actions[A]`: every agent's argmax
    of its masked logits (the key is unused)."""
    actor = make_actor(config.agent, *environment.make_env(config))
    return lambda params, obs, key, action_mask: greedy_actions(actor, params, obs, action_mask)
