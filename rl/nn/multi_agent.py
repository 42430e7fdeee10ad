"""The agents axis of a team's inputs and networks, for agents that train on multi-agent envs
(`envs.multi_agent`: observations [..., A, *shape], agents in the order of `env.agent_ids`; an
input's agents axis sits just before its own shape): agent ids (`with_agent_ids`), the global
state for each agent (`for_each_agent`), one network acting for the team with shared or per-agent
parameters (`per_agent`, `per_agent_recurrent`, `recurrent_team`), the team's env checks
(`check_team_env`) and Overcooked's annealed shaped reward (`learning_reward`).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from envs.spaces import Box, Discrete
from rl.config.parsing import ConfigError
from rl.nn.layers import Network


def with_agent_ids(x):
    """[..., A, d] -> [..., A, d + A]: agent i's vector input with the one-hot e_i appended."""
    num_agents = x.shape[-2]
    ids = jnp.broadcast_to(jnp.eye(num_agents, dtype=x.dtype), x.shape[:-1] + (num_agents,))
    return jnp.concatenate([x, ids], axis=-1)


def for_each_agent(global_state, num_agents: int):
    """[..., G] -> [..., A, G]: the team's (vector) global state, once for each agent."""
    shape = global_state.shape[:-1] + (num_agents, global_state.shape[-1])
    return jnp.broadcast_to(global_state[..., None, :], shape)


def id_space(space: Box, num_agents: int) -> Box:
    """The Box of `with_agent_ids`'s output for vector inputs of `space` ([d] -> [d + A])."""
    low = np.concatenate([np.broadcast_to(space.low, space.shape), np.zeros(num_agents)])
    high = np.concatenate([np.broadcast_to(space.high, space.shape), np.ones(num_agents)])
    return Box(low, high, (space.shape[0] + num_agents,), np.float32)


def per_agent(net: Network, rank: int, shared: bool) -> Network:
    """`net` acting for a team on inputs x [..., A, *shape] (len(shape) = `rank`), outputs
    [..., A, ...].

    shared: one set of parameters, `net.init(key, x[A, ...])`, the agents axis one more batch axis.
    Separate: one set per agent, every leaf stacked on a leading agents axis (agent i's from
    `net.init(key_i, x_i)`, one agent at a time: `lax.map`), and `net.apply` vmapped over the
    agents axis of the parameters and of the inputs: out_i = net(params_i, x_i)."""
    if shared:
        return net

    def init(key, x):
        keys = jax.random.split(key, x.shape[0])
        return jax.lax.map(lambda pair: net.init(*pair), (keys, x))

    def apply(params, x, rng=None):
        axis = x.ndim - rank - 1
        one_agent = lambda params, x: net.apply(params, x, rng=rng)
        return jax.vmap(one_agent, in_axes=(0, axis), out_axes=axis)(params, x)

    return Network(init=init, apply=apply)


def reading(net: Network, transform) -> Network:
    """`net` on `transform(x)`: init(key, x) = net.init(key, transform(x)), and so apply."""
    return Network(
        init=lambda key, x: net.init(key, transform(x)),
        apply=lambda params, x, rng=None: net.apply(params, transform(x), rng=rng),
    )


def per_agent_recurrent(net: Network, shared: bool) -> Network:
    """`per_agent` for a recurrent `net`, `apply(params, carry, *xs, reset) -> (carry, outputs)`
    over time-major inputs: reset [T, ..., A] (the agents axis its last), every x [T, ..., A, ...]
    (or None), every carry leaf [..., A, ...] -> (carry [..., A, ...], outputs [T, ..., A, ...]).

    shared: `net` itself, the agents axis one more batch axis. Separate: one set of parameters per
    agent, every leaf stacked on a leading agents axis (agent i's from `net.init(key_i, carry_i,
    *xs_i)`, one agent at a time: `lax.map`), and `net.apply` vmapped over the agents axis of the
    parameters, the carry and the inputs."""
    if shared:
        return net

    def init(key, carry, *inputs):
        axis = jnp.ndim(inputs[-1]) - 1
        to_front = lambda tree, axis: jax.tree.map(lambda x: jnp.moveaxis(x, axis, 0), tree)
        keys = jax.random.split(key, jnp.shape(inputs[-1])[-1])
        agents = (keys, to_front(carry, axis - 1), to_front(inputs, axis))
        return jax.lax.map(lambda one: net.init(one[0], one[1], *one[2]), agents)

    def apply(params, carry, *inputs, rng=None):
        axis = jnp.ndim(inputs[-1]) - 1
        one_agent = lambda params, carry, *inputs: net.apply(params, carry, *inputs, rng=rng)
        in_axes = (0, axis - 1) + (axis,) * len(inputs)
        team = jax.vmap(one_agent, in_axes=in_axes, out_axes=(axis - 1, axis))
        return team(params, carry, *inputs)

    return Network(init=init, apply=apply)


def recurrent_team(torso, policy_head, value_head, critic_torso=None) -> Callable:
    """A recurrent actor-critic whose critic may read an input of its own: `fn(layers, carry, obs,
    critic_obs, reset) -> (carry, (policy, value))` over time-major sequences (as
    `rl.nn.recurrent.RecurrentTorso`), with `fn.initial_carry(batch)`.

    The policy head reads the features of `torso` on obs; the value head reads the same features
    (no `critic_torso`: one cell, the carry its state; critic_obs is not read) or those of
    `critic_torso` on critic_obs (the carry the pair (actor's, critic's)). critic_obs None runs the
    actor alone (value None, the critic's carry as it was): the actor's layers are made first, so
    its parameters are the same either way."""

    def fn(layers, carry, obs, critic_obs, reset):
        if critic_torso is None:
            carry, features = torso(layers, carry, obs, reset)
            return carry, (policy_head(layers, features), value_head(layers, features))
        actor_carry, features = torso(layers, carry[0], obs, reset)
        policy = policy_head(layers, features)
        if critic_obs is None:
            return (actor_carry, carry[1]), (policy, None)
        critic_carry, critic_features = critic_torso(layers, carry[1], critic_obs, reset)
        return (actor_carry, critic_carry), (policy, value_head(layers, critic_features))

    def initial_carry(batch=()):
        if critic_torso is None:
            return torso.initial_carry(batch)
        return torso.initial_carry(batch), critic_torso.initial_carry(batch)

    fn.initial_carry = initial_carry
    return fn


def team_carry(initial_carry: Callable, num_agents: int, batch=()):
    """`initial_carry` for every agent of a team: the carry for the batch shape [*batch, A]
    (`batch` an int or a shape)."""
    batch = (batch,) if isinstance(batch, int) else tuple(batch)
    return initial_carry(batch + (num_agents,))


def step_info(env, env_params) -> dict:
    """The shapes (`jax.ShapeDtypeStruct`) of a multi-agent `env.step`'s info, traced: nothing
    runs."""
    key = jax.random.key(0)
    state = jax.eval_shape(lambda: env.reset(key, env_params)[1])
    actions = jnp.zeros((env.num_agents,), jnp.int32)
    return jax.eval_shape(lambda state: env.step(key, state, actions, env_params)[-1], state)


# ---------------------------------------------------------------- what a team needs of its env


def check_team_env(config, env, env_params) -> None:
    """What a team of policy-gradient agents (IPPO, MAPPO and their recurrent forms) needs of its
    env: Discrete actions, vector observations for `agent.agent_id_input`, and
    info["shaped_reward"] for `agent.shaped_reward_anneal_steps`; ConfigError naming the key."""
    agent, env_id = config.agent, config.env.id
    space = env.action_space(env_params)
    if not isinstance(space, Discrete):
        raise ConfigError(
            f"env.id: {agent.name} supports Discrete actions; {env_id} has {space} (continuous "
            "actions are not supported)"
        )
    obs_shape = env.observation_space(env_params).shape
    if agent.agent_id_input and len(obs_shape) != 1:
        raise ConfigError(
            f"agent.agent_id_input: agent ids are appended to vector observations; {env_id}'s "
            f"have shape {obs_shape}"
        )
    if agent.shaped_reward_anneal_steps and "shaped_reward" not in step_info(env, env_params):
        raise ConfigError(
            f"agent.shaped_reward_anneal_steps: {env_id} reports no info['shaped_reward'] to "
            "shape the reward with; set it to 0"
        )


def shaping_weight(agent, step):
    """w = max(0, 1 - step / agent.shaped_reward_anneal_steps) at `step` env steps (0: off)."""
    if not agent.shaped_reward_anneal_steps:
        return 0.0
    return jnp.maximum(0.0, 1.0 - step / agent.shaped_reward_anneal_steps)


def learning_reward(agent, reward, info, weight):
    """r_i + w info["shaped_reward"]_i with `agent.shaped_reward_anneal_steps` (Overcooked's shaped
    reward, annealed out over that many env steps with weight w = `shaping_weight`), else r_i."""
    if not agent.shaped_reward_anneal_steps:
        return reward
    return reward + weight * info["shaped_reward"]
