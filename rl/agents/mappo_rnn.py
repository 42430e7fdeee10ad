"""Recurrent MAPPO (JaxMARL's mappo_rnn baselines), compiled end to end: recurrent IPPO
(rl/agents/ippo_rnn.py) with a centralised recurrent critic on `mappo.world_view` of the global
state, so each agent has its own critic state, reset where its actor's is. The actor and the
critic read different inputs, so they cannot share a torso (`agent.shared_network` is refused).
"""

from __future__ import annotations

from dataclasses import dataclass

from rl.agents import ippo_rnn, mappo
from rl.agents.trainer import RecurrentPolicy, Trainer, train_from_trainer
from rl.core import environment

MULTI_AGENT = True
RECURRENT = True  # takes a recurrent torso (rl.config.check_recurrence)


@dataclass(frozen=True)
class Config(ippo_rnn.Config):
    """Recurrent MAPPO's settings: recurrent IPPO's."""

    name: str = "mappo_rnn"


check_env = mappo.check_env  # a global state, separate actor and critic, IPPO's checks


def make_setup(config) -> ippo_rnn.Setup:
    """Recurrent IPPO's Setup with the critic's torso on `mappo.world_view` of the global state:
    h^c_ti = cell(h^c_(t-1)i, [s_t, e_i]), bootstrapping from V(cell(h^c_ti, [s'_t, e_i])) with
    s'_t = info["final_global_state"]. Actor and critic take one Adam step on one flat vector,
    clipped to one global norm (JaxMARL clips and steps each network apart)."""
    env, env_params = environment.make_env(config)
    critic_view = mappo.world_input(env, env_params)
    return ippo_rnn.setup(config, env, env_params, critic_view, global_state=True)


def make_trainer(config) -> Trainer:
    return ippo_rnn.trainer(make_setup(config))


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config) -> RecurrentPolicy:
    return ippo_rnn.greedy_policy(make_setup(config))
