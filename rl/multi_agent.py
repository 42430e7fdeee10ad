"""The agents axis of a team's inputs and networks, for agents that train on multi-agent envs
(`envs.multi_agent`: observations [..., A, *shape], agents in the order of `env.agent_ids`).

    x [..., A, *shape]        an input of every agent: the agents axis sits just before the input's
                              own shape, whose rank r = len(shape) says where it is

`with_agent_ids` appends each agent's one-hot index to its vector input, `for_each_agent` gives
every agent the team's global state, and `per_agent` makes one `rl.layers.Network` act for the
whole team, with one set of parameters that every agent shares or one set per agent.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envs.spaces import Box
from rl.layers import Network


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


def step_info(env, env_params) -> dict:
    """The shapes (`jax.ShapeDtypeStruct`) of a multi-agent `env.step`'s info, traced: nothing
    runs."""
    key = jax.random.key(0)
    state = jax.eval_shape(lambda: env.reset(key, env_params)[1])
    actions = jnp.zeros((env.num_agents,), jnp.int32)
    return jax.eval_shape(lambda state: env.step(key, state, actions, env_params)[-1], state)
