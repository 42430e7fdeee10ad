"""Training state as types: one name for one thing across every agent. An agent's state is a
NamedTuple of the common fields (`OnPolicyState` says what each holds) and its own (such as
`target_params` or `buffer`). The runner reads `state.params`, and shards every leaf under an
`Envs` over devices on its env axis (`--shard envs`): the rule reads the type, not field names.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax


class Envs(NamedTuple):
    """What each training env carries between steps, every leaf with the env axis first: the
    observation, the env's state and the policy's memory (a recurrent carry; () without one)."""

    obs: Any
    state: Any
    memory: Any = ()


class OnPolicyState(NamedTuple):
    """The state of an agent that learns from its own rollouts (PPO, recurrent PPO, PQN), and the
    common fields of every agent's:

        params      what the agent's policy reads (`make_policy`): a Q-table, a network's params,
                    an actor's params, with observation statistics where the agent keeps them
        opt_state   the optimiser's state
        envs        `Envs`: each training env's observation, env state and policy memory
        key         the PRNG key the next log period splits
        step        env steps so far, all envs counted
        updates     updates so far (gradient steps for replay agents, rollout-and-learn updates
                    for on-policy agents)
    """

    params: Any
    opt_state: Any
    envs: Envs
    key: jax.Array
    step: jax.Array
    updates: jax.Array


class ReplayState(NamedTuple):
    """The state of a value-based replay agent (DQN, Rainbow): online and target params, the
    optimiser state and the replay buffer besides the common fields."""

    params: Any
    target_params: Any
    opt_state: Any
    buffer: Any
    envs: Envs
    key: jax.Array
    step: jax.Array
    updates: jax.Array


def is_envs(node) -> bool:
    """Whether `node` is an `Envs` (the `is_leaf` of tree maps that stop at the per-env state)."""
    return isinstance(node, Envs)
