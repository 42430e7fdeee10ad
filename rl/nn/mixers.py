"""Mixers of value decomposition: the team's value Q_tot from the agents' values Q_i and the global
state s (`vdn`: the sum; `qmix`: QMIX's monotonic mixer), as `Network` pairs `init(key, agent_q,
state) -> params`, `apply(params, agent_q, state) -> q_tot` (agent_q [..., A], state [..., S]).

    mixer = mixers.make_mixer("qmix", embedding=32, hypernet_hidden=64)
    q_tot = mixer.apply(mixer.init(key, agent_q, state), agent_q, state)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl.nn.layers import Network, build

MIXERS = ("vdn", "qmix")


def vdn() -> Network:
    """VDN's mixer (Sunehag et al. 2018): Q_tot = sum_i Q_i (no parameters, the state unread)."""
    return Network(
        init=lambda key, agent_q, state=None: {},
        apply=lambda params, agent_q, state=None: jnp.sum(agent_q, axis=-1),
    )


def qmix_fn(embedding: int, hypernet_hidden: int, init_scale: float = 0.01):
    """`fn(layers, agent_q [..., A], state [..., S]) -> q_tot [...]`: QMIX's monotonic mixer
    (Rashid et al. 2018), a one-hidden-layer network on the agents' values whose weights
    hypernetworks make from the state, non-negative through an absolute value, so Q_tot is
    monotonic in every Q_i and the argmax of Q_tot is each agent's own argmax:

        W_1 = |hyper_1(s)| [A, E],   b_1 = Linear(s) [E],
        W_2 = |hyper_2(s)| [E],      b_2 = Linear(ReLU(Linear_E(s))) (a scalar, V(s)),
        h = ELU(Q W_1 + b_1),        Q_tot = h . W_2 + b_2,   hyper_k(s) = Linear(ReLU(Linear_H(s)))

    with E = `embedding`, H = `hypernet_hidden`; the hypernetworks' hidden layers are initialised
    as hidden layers (gain sqrt 2), their outputs with gain `init_scale` (small: Q_tot starts near
    V(s)). Layers are created in the order W_1's hypernetwork (2), b_1 (1), W_2's hypernetwork
    (2), b_2's network (2)."""

    def hyper(layers, state, out):
        hidden = jax.nn.relu(layers.dense(state, hypernet_hidden))
        return layers.dense(hidden, out, scale=init_scale)

    def fn(layers, agent_q, state):
        agent_q = jnp.asarray(agent_q, jnp.float32)
        state = jnp.asarray(state, jnp.float32)
        num_agents = agent_q.shape[-1]
        w1 = jnp.abs(hyper(layers, state, num_agents * embedding))
        w1 = w1.reshape(w1.shape[:-1] + (num_agents, embedding))
        b1 = layers.dense(state, embedding, scale=init_scale)
        w2 = jnp.abs(hyper(layers, state, embedding))
        b2 = layers.dense(jax.nn.relu(layers.dense(state, embedding)), 1, scale=init_scale)
        hidden = jax.nn.elu(jnp.einsum("...a,...ae->...e", agent_q, w1) + b1)
        return jnp.sum(hidden * w2, axis=-1) + b2[..., 0]

    return fn


def qmix(
    embedding: int = 32,
    hypernet_hidden: int = 64,
    init_scale: float = 0.01,
    backend: str = "flax",
    init: str = "orthogonal",
) -> Network:
    """QMIX's mixer as a `Network` on `backend` (`rl.nn.layers.build`)."""
    return build(qmix_fn(embedding, hypernet_hidden, init_scale), backend, init)


def make_mixer(name: str, **settings) -> Network:
    """The mixer `name` (one of `MIXERS`); `settings` go to `qmix`. ValueError for another name."""
    if name == "vdn":
        return vdn()
    if name == "qmix":
        return qmix(**settings)
    raise ValueError(f"unknown mixer {name!r}; known: {', '.join(MIXERS)}")
