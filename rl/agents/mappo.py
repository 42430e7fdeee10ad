"""Multi-agent PPO (MAPPO; Yu et al. 2022, JaxMARL's mappo baselines), compiled end to end: IPPO
(rl/agents/ippo.py) with a centralised critic V(s, e_i) on the team's global state s
(`env.global_state`) with agent i's one-hot id appended (`world_view`: MAPPO's agent-specific
global state), so that advantages stay per agent. The env must have a global state.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from envs.spaces import Box
from rl.agents import ippo
from rl.agents.trainer import Trainer, train_from_trainer
from rl.config.parsing import ConfigError
from rl.core import environment
from rl.nn import multi_agent

MULTI_AGENT = True


@dataclass(frozen=True)
class Config(ippo.Config):
    """MAPPO's settings: IPPO's."""

    name: str = "mappo"


def check_env(config, env, env_params) -> None:
    """IPPO's checks, and a global state for the critic."""
    if not env.has_global_state:
        raise ConfigError(
            f"env.id: {config.agent.name}'s centralised critic reads the env's global state and "
            f"{config.env.id} has none; use ippo, or an env with a global state"
        )
    ippo.check_env(config, env, env_params)


def world_view(num_agents: int, state_rank: int, seen: ippo.Observation):
    """[..., A, G + A]: the global state [..., *S] (rank `state_rank`) flattened to G = prod(S),
    for each agent with its one-hot id appended."""
    state = seen.global_state
    flat = state.reshape(state.shape[: state.ndim - state_rank] + (-1,))
    return multi_agent.with_agent_ids(multi_agent.for_each_agent(flat, num_agents))


def make_setup(config) -> ippo.Setup:
    """IPPO's Setup with the critic V(s, e_i) on the global state: GAE's delta_ti = r_ti +
    gamma (1 - term_ti) V(s'_t, e_i) - V(s_t, e_i), s'_t the global state the step reached
    (info["final_global_state"]). The critic's params are shared or per agent as the actor's
    (`agent.share_parameters`); actor and critic take one Adam step on one flat vector, clipped to
    one global norm (JaxMARL clips and steps each network apart)."""
    env, env_params = environment.make_env(config)
    critic = central_critic(config.agent, env, env_params)
    return ippo.setup(config, env, env_params, *critic, global_state=True)


def central_critic(agent: Config, env, env_params):
    """(critic, critic_input) of V(s, e_i): the critic reads `world_view` of the global state."""
    space, view = world_input(env, env_params)
    return ippo.make_critic(agent, space), view


def world_input(env, env_params):
    """(space, input) of `world_view`, what a critic of the global state reads: [..., A, G + A]
    from an Observation [...]."""
    shape = env.global_state_space(env_params).shape
    flat = Box(-np.inf, np.inf, (int(np.prod(shape)),), np.float32)
    space = multi_agent.id_space(flat, env.num_agents)
    return space, partial(world_view, env.num_agents, len(shape))


def make_trainer(config) -> Trainer:
    return ippo.trainer(make_setup(config))


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


make_policy = ippo.make_policy
