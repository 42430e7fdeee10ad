"""Value decomposition with PQN (PQN-VDN and PQN-QMIX, as JaxMARL's PQN-VDN baselines train them),
compiled end to end; a multi-agent agent (`MULTI_AGENT`). One Q-network shared by every agent
(`make_q_network`), a mixer that makes the team's value of the agents' (`make_mixer`: vdn or
qmix, rl.nn.mixers), trained PQN-style: epsilon-greedy over each agent's available actions,
Q(lambda) targets on the team reward (`team_q_lambda_targets`), minibatch epochs on
`team_q_loss`, no replay buffer, no target network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from envs.spaces import Box
from rl.agents import pqn
from rl.agents.trainer import Trainer, train_from_trainer
from rl.config.parsing import ConfigError, hp
from rl.config.unrolling import unroll_of
from rl.core import environment, episodes, exploration, losses
from rl.core.collection import rollout_keys
from rl.core.log_points import scan_log_points
from rl.core.state import Envs, OnPolicyState
from rl.nn import layers, mixers, networks

MULTI_AGENT = True
TEAM_REWARDS = ("sum", "mean")


@dataclass(frozen=True)
class Config(pqn.Config):
    name: str = "pqn_vdn"
    mixer: str = hp(
        "vdn",
        choices=mixers.MIXERS,
        doc="vdn: Q_tot = sum_i Q_i; qmix: QMIX's monotonic mixer on the global state",
    )
    team_reward: str = hp(
        "sum",
        choices=TEAM_REWARDS,
        doc="the team's reward: sum or mean of the agents' rewards (JaxMARL: sum; SMAX's agents "
        "share one reward, so mean is it)",
    )
    agent_id: bool = hp(True, doc="append a one-hot of the agent's index to its observation")
    mixer_embedding: int = hp(32, low=1, doc="qmix: width E of the mixing layer")
    mixer_hypernet_hidden: int = hp(64, low=1, doc="qmix: hidden width of the hypernetworks")
    mixer_init_scale: float = hp(
        0.01,
        doc="qmix: gain of the hypernetworks' output layers (small: Q_tot starts near V(s); at 1, "
        "MPE runs swung far below a random policy before they learned)",
        low=0.0,
        low_open=True,
    )


def check_env(config, env, env_params) -> None:
    """ConfigError before anything compiles: discrete actions, a global state for qmix, flat
    observations for the agent-id one-hot."""
    agent = config.agent
    environment.check_discrete_actions(config, env, env_params)
    if agent.mixer == "qmix" and not env.has_global_state:
        raise ConfigError(
            f"agent.mixer: qmix mixes on the global state and env.id {config.env.id!r} has none; "
            "use agent.mixer=vdn"
        )
    if agent.agent_id and agent.network.torso != "mlp":
        raise ConfigError(
            f"agent.agent_id: the agent-id one-hot is appended to flattened observations (the mlp "
            f"torso); set agent.agent_id=false for the {agent.network.torso} torso"
        )


class Transition(NamedTuple):
    obs: jax.Array  # [..., A, *obs_shape]
    action: jax.Array  # [..., A]
    reward: jax.Array  # [..., A]
    terminated: jax.Array  # [..., A]
    episode_end: jax.Array  # [...]: every agent terminated or truncated
    alive: jax.Array  # [..., A]: agent i is in the team at obs
    global_state: Any  # [..., S] (qmix) or ()
    final_obs: jax.Array
    final_action_mask: jax.Array  # [..., A, n]
    final_global_state: Any
    episode: dict  # TeamEpisodeStatistics' info: episode_done, episode_return, episode_length


def agent_inputs(obs, obs_rank: int, agent_id: bool):
    """What the shared Q-network reads of obs [..., A, *obs_shape] (obs_rank = len(obs_shape)):
    with `agent_id`, each agent's observation flattened with the one-hot of its index appended,
    [..., A, prod(obs_shape) + A]; else obs itself."""
    if not agent_id:
        return obs
    flat = jnp.asarray(obs, jnp.float32).reshape(obs.shape[: obs.ndim - obs_rank] + (-1,))
    num_agents = flat.shape[-2]
    ids = jnp.broadcast_to(jnp.eye(num_agents, dtype=jnp.float32), flat.shape[:-1] + (num_agents,))
    return jnp.concatenate([flat, ids], axis=-1)


def make_q_network(agent: Config, env, env_params) -> layers.Network:
    """The shared per-agent Q-network: `agent.network`'s torso and one linear Q-value per action,
    on the observation space (with `agent_id`, a flat Box of the observation and the one-hot)."""
    obs_space = env.observation_space(env_params)
    if agent.agent_id:
        size = int(np.prod(obs_space.shape)) + env.num_agents
        obs_space = Box(-np.inf, np.inf, (size,), np.float32)
    return networks.q_network(agent.network, obs_space, env.action_space(env_params).n)


def make_mixer(agent: Config) -> layers.Network:
    """`agent.mixer`: the sum (vdn) or QMIX's mixer of `agent.mixer_*` widths and gain on
    `agent.network`'s backend and init."""
    if agent.mixer == "vdn":
        return mixers.vdn()
    return mixers.qmix(
        agent.mixer_embedding,
        agent.mixer_hypernet_hidden,
        agent.mixer_init_scale,
        agent.network.backend,
        agent.network.init,
    )


def masked_max(q_values, mask):
    """max_{a: mask[..., a]} Q[..., a] per row [...] (0 for a row with no available action)."""
    best = jnp.max(jnp.where(mask, q_values, -jnp.inf), axis=-1)
    return jnp.where(mask.any(axis=-1), best, 0.0)


def team_reward(reward, how: str):
    """The team's reward [...] from the agents' [..., A]: their sum or mean (`TEAM_REWARDS`)."""
    return reward.sum(axis=-1) if how == "sum" else reward.mean(axis=-1)


def team_q_lambda_targets(
    q_values, mix, params, traj: Transition, hparams, how: str, backend: str, deterministic=False
):
    """G [T, E]: the Q(lambda) targets of the rollout `traj` on the team reward r_t (`team_reward`:
    sum_i r_ti, JaxMARL's for MPE, or the mean, SMAX's shared reward), computed with the network of
    the rollout: G = truncation_aware_q_lambda(r * reward_scale, V, team terminated, truncated),

        V_t = Mix((1 - terminated_ti) max_{a available at final_obs} Q_i(final_obs_ti, a),
                  final_global_state_t).

    The team terminates when every agent has, is truncated when the episode ends otherwise (a time
    limit bootstraps); an agent's own end stops neither the lambda chain nor the team's
    bootstrap: only its own value drops out. `q_values(params, obs [..., A, ...]) -> [..., A, n]`,
    `mix(params, agent_values [..., A], global_state) -> [...]`; `how` is `agent.team_reward`."""
    best = masked_max(q_values(params, traj.final_obs), traj.final_action_mask)
    next_values = mix(params, jnp.where(traj.terminated, 0.0, best), traj.final_global_state)
    terminated = jnp.all(traj.terminated, axis=-1)
    return losses.truncation_aware_q_lambda(
        team_reward(traj.reward, how) * hparams["reward_scale"],
        next_values,
        terminated,
        traj.episode_end & ~terminated,
        hparams["gamma"],
        hparams["q_lambda"],
        backend=backend,
        deterministic=deterministic,
    )


def team_q_loss(q_values, mix, params, minibatch):
    """(0.5 mean (Q_tot(s, a) - G)^2, mean Q_tot(s, a)) of a minibatch (obs, action, alive,
    global_state, target G held fixed), Q_tot(s_t, a_t) = Mix(alive_ti Q_i(o_ti, a_ti),
    global_state_t): agent i is alive from its episode's start until the step it terminates on;
    agents out of the team add nothing to Q_tot."""
    obs, action, alive, global_state, target = minibatch
    q_taken = losses.action_value(q_values(params, obs), action)
    q_tot = mix(params, jnp.where(alive, q_taken, 0.0), global_state)
    return 0.5 * jnp.mean(jnp.square(q_tot - target)), q_tot.mean()


def greedy_policy(q_values, params):
    """(obs [..., A, ...], mask [..., A, n]) -> each agent's argmax of Q_i over its available
    actions [..., A] (`exploration.masked_argmax`): the argmax of Q_tot for both mixers."""
    return lambda obs, mask: exploration.masked_argmax(q_values(params, obs), mask)


def make_trainer(config) -> Trainer:
    agent = config.agent
    env, env_params = environment.make_env(config)
    reset_envs, step_envs = environment.batched(env)
    action_masks = jax.vmap(env.action_mask, in_axes=(0, None))
    uses_state = agent.mixer == "qmix"
    global_states = jax.vmap(env.global_state, in_axes=(0, None))
    q_network, mixer = make_q_network(agent, env, env_params), make_mixer(agent)
    obs_rank = len(env.observation_space(env_params).shape)
    backend, deterministic = environment.kernel_backend(config), config.kernels.deterministic

    def q_values(params, obs):
        """Q_i(o_i, .) [..., A, n] of obs [..., A, *obs_shape]."""
        return q_network.apply(params["agent"], agent_inputs(obs, obs_rank, agent.agent_id))

    def mix(params, agent_values, global_state):
        return mixer.apply(params["mixer"], agent_values, global_state)

    # ---------------------------------------------------------------- init

    def init(key, hparams) -> OnPolicyState:
        """Fresh params {"agent", "mixer"}, optimiser state and envs (`num_envs` resets, every
        agent alive), the PRNG key, the counters."""
        key, net_key, mixer_key, reset_key = jax.random.split(key, 4)
        obs, env_state = reset_envs(jax.random.split(reset_key, agent.num_envs), env_params)
        world = global_states(env_state, env_params)[0] if uses_state else None
        params = {
            "agent": q_network.init(net_key, agent_inputs(obs[0], obs_rank, agent.agent_id)),
            "mixer": mixer.init(mixer_key, jnp.zeros(env.num_agents), world),
        }
        opt_state = pqn.init_opt_state(agent, hparams, params)
        alive = jnp.ones((agent.num_envs, env.num_agents), jnp.bool_)
        return OnPolicyState(
            params, opt_state, Envs(obs, env_state, alive), key, jnp.int32(0), jnp.int32(0)
        )

    # ---------------------------------------------------------------- rollout

    def rollout(params, envs: Envs, eps, key):
        """num_steps masked epsilon-greedy steps of every env; (envs, Transition [T, E, ...]).
        `envs.memory` is which agents are in the team (alive [E, A])."""

        def env_step(envs: Envs, keys):
            act_key, env_keys = keys
            mask = action_masks(envs.state, env_params)
            action = exploration.masked_epsilon_greedy(
                act_key, q_values(params, envs.obs), mask, eps
            )
            world = global_states(envs.state, env_params) if uses_state else ()
            next_obs, env_state, reward, terminated, truncated, info = step_envs(
                env_keys, envs.state, action, env_params
            )
            end = info["episode_end"]
            alive = (envs.memory & ~terminated) | end[:, None]
            episode = {
                name: info[name] for name in ("episode_done", "episode_return", "episode_length")
            }
            final_world = info["final_global_state"] if uses_state else ()
            return Envs(next_obs, env_state, alive), Transition(
                envs.obs,
                action,
                reward,
                terminated,
                end,
                envs.memory,
                world,
                info["final_obs"],
                info["final_action_mask"],
                final_world,
                episode,
            )

        keys = rollout_keys(key, agent.num_steps, agent.num_envs)
        return jax.lax.scan(env_step, envs, keys, unroll=min(unroll_of(agent), agent.num_steps))

    # ---------------------------------------------------------------- one update

    def update(hparams, state: OnPolicyState, totals: episodes.EpisodeTotals):
        """Rollout, team Q(lambda) targets, learning. Returns (state, totals, mean stats)."""
        key, rollout_key, shuffle_key = jax.random.split(state.key, 3)
        eps = pqn.epsilon(agent, hparams, state.step)
        envs, traj = rollout(state.params, state.envs, eps, rollout_key)
        totals = episodes.add_episodes(totals, traj.episode)
        targets = jax.lax.stop_gradient(
            team_q_lambda_targets(
                q_values,
                mix,
                state.params,
                traj,
                hparams,
                agent.team_reward,
                backend,
                deterministic,
            )
        )
        flat = lambda x: x.reshape((agent.batch_size,) + x.shape[2:])
        batch = jax.tree.map(flat, (traj.obs, traj.action, traj.alive, traj.global_state, targets))
        loss = lambda params, minibatch: team_q_loss(q_values, mix, params, minibatch)
        params, opt_state, stats = pqn.learn(
            agent, hparams, loss, state.params, state.opt_state, batch, shuffle_key
        )
        step, updates = state.step + agent.batch_size, state.updates + 1
        state = OnPolicyState(params, opt_state, envs, key, step, updates)
        return state, totals, {**jax.tree.map(jnp.mean, stats), "epsilon": eps}

    # ---------------------------------------------------------------- log periods

    def run(state, hparams, num_log_points):
        """num_log_points of `pqn.log_period` (log_interval updates, their metrics, greedy
        episodes: team returns)."""
        one_update = lambda state, totals: update(hparams, state, totals)
        greedy = lambda params: greedy_policy(q_values, params)
        period = lambda state: pqn.log_period(agent, env, env_params, one_update, greedy, state)
        return scan_log_points(period, state, num_log_points)

    return Trainer(init=init, run=run, num_log_points=agent.num_updates // agent.log_interval)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs [A, ...], key, action_mask [A, n]) -> actions [A]`: each agent's argmax
    of Q_i over its available actions (first index on ties)."""
    agent = config.agent
    env, env_params = environment.make_env(config)
    q_network = make_q_network(agent, env, env_params)
    obs_rank = len(env.observation_space(env_params).shape)

    def policy(params, obs, key, action_mask):
        q = q_network.apply(params["agent"], agent_inputs(obs, obs_rank, agent.agent_id))
        return exploration.masked_argmax(q, action_mask)

    return policy
