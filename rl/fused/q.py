"""The fused Q-network: an MLP Q-network kept as one flat parameter vector, which the fused kernels
read directly, for the value-based agents: acting (`epsilon_greedy`) and a DQN gradient step
(`q_learning_grads`) are one launch each, the optimiser one fused step on the vector. Everything
else reads the network through `q_values` (`jax.flatten_util.ravel_pytree`'s layout);
`unfit_reason` says when a config's network cannot go through the kernels (the agent then keeps
its params as a tree and runs the network's `apply` and autodiff).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

import kernels
from envs.spaces import Box, Discrete
from kernels.q_grads import QLayout
from kernels.q_grads import unfit_reason as kernel_unfit_reason
from rl.nn import param_layout
from rl.nn.layers import Network


class FusedQ(NamedTuple):
    """A Q-network as the fused kernels see it (static: built once per agent)."""

    network: Network
    unravel: Callable  # flat vector [size] -> the network's params
    layout: QLayout
    activation: str
    backend: str
    precision: str = "tf32"  # the kernels' dot_precision (`rl.core.environment.kernel_precision`)


def unfit_reason(network_config, obs_space, action_space) -> str | None:
    """Why the fused kernels cannot run this Q-network, or None: they need Discrete actions, a
    flat Box observation, an MLP torso of two tanh, relu or silu hidden layers without
    LayerNorm, and sizes within `kernels.q_grads.LIMITS`."""
    if not isinstance(action_space, Discrete):
        return "the fused Q-network needs Discrete actions"
    if not isinstance(obs_space, Box) or len(obs_space.shape) != 1:
        return f"the fused Q-network needs a flat Box observation, got {obs_space}"
    if (
        network_config.torso != "mlp"
        or network_config.layer_norm
        or len(network_config.hidden) != 2
        or network_config.activation not in ("tanh", "relu", "silu")
    ):
        return (
            "the fused Q-network needs an MLP of two tanh, relu or silu hidden layers, no LayerNorm"
        )
    layout = kernels.q_grads.q_layout(
        obs_space.shape[0], tuple(network_config.hidden), action_space.n
    )
    return kernel_unfit_reason(layout)


def runs_fused(network_config, obs_space, action_space, backend: str, wanted: bool) -> bool:
    """Whether an agent asking for the fused network (`wanted`) gets it: a kernel backend that runs
    the Triton source (triton, interpret) and a network that fits (`unfit_reason`)."""
    return (
        wanted
        and kernels.resolve_backend(backend) in ("triton", "interpret")
        and unfit_reason(network_config, obs_space, action_space) is None
    )


def _zero_params(network: Network, example_obs):
    shapes = jax.eval_shape(network.init, jax.random.key(0), example_obs)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def as_tree(network: Network, example_obs, params):
    """The network's params as its own tree, whether `params` is that tree or the flat vector a
    fused run keeps (a run trained on a GPU, evaluated where the kernels do not run)."""
    if isinstance(params, jax.Array) and params.ndim == 1:
        return ravel_pytree(_zero_params(network, example_obs))[1](params)
    return params


def make(
    network: Network, network_config, example_obs, backend: str, precision: str = "tf32"
) -> FusedQ:
    """The fused view of `network` (a two-hidden-layer MLP with a linear head of one Q-value per
    action, as `unfit_reason` checks): its flat layout, taken from the shapes of its params; the
    kernels run on `backend` with matmuls at `precision` (their `dot_precision`)."""
    tree = _zero_params(network, example_obs)
    _, unravel = ravel_pytree(tree)
    (w1, _), (w2, _), (w3, _) = param_layout.dense_layers(tree)
    offsets = param_layout.dense_layers(param_layout.leaf_offsets(tree))
    layout = QLayout(
        tuple(int(o) for pair in offsets for o in pair),
        w1.shape[0],
        (w1.shape[1], w2.shape[1]),
        w3.shape[1],
        sum(x.size for x in jax.tree.leaves(tree)),
    )
    return FusedQ(network, unravel, layout, network_config.activation, backend, precision)


def init(fused: FusedQ, key, obs):
    """The network's initial params, raveled into one vector [size]."""
    return ravel_pytree(fused.network.init(key, obs))[0]


def q_values(fused: FusedQ, flat_params, obs):
    """Q(obs) [..., A] through the network's own apply on the unraveled params."""
    return fused.network.apply(fused.unravel(flat_params), obs)


def epsilon_greedy(fused: FusedQ, flat_params, obs, key, epsilon):
    """`rl.core.exploration.epsilon_greedy(key, Q(obs), epsilon)` (the same uniforms, the same
    actions up to float rounding of Q) in one kernel launch. obs [N, D]."""
    uniforms = jax.random.uniform(key, obs.shape[:-1] + (2,))
    return kernels.q_epsilon_greedy(
        obs, flat_params, uniforms, epsilon, fused.layout,
        activation=fused.activation, dot_precision=fused.precision, backend=fused.backend,
    )  # fmt: skip


def q_learning_grads(fused: FusedQ, flat_params, target_params, batch, discounts, **options):
    """(grads [size], ||grads||^2, {"loss", "q_mean"}) of the Q-learning loss of a batch of
    transitions ({"obs", "action", "reward", "next_obs"}; `discounts` gamma (1 - terminated)) from
    `kernels.q_learning_grads_flat`; `options`: loss, double_q."""
    return kernels.q_learning_grads_flat(
        batch["obs"], batch["action"], batch["reward"], discounts, batch["next_obs"],
        flat_params, target_params, fused.layout, activation=fused.activation,
        dot_precision=fused.precision, backend=fused.backend, **options,
    )  # fmt: skip
