"""The fused twin critics: TD3's and SAC's clipped double-Q critics (`networks.twin_q` over
concat(obs, action)) kept as one flat parameter vector, which the fused kernel reads directly: a
critic step's forward passes, squared errors and backward passes are one launch (`critic_grads`),
the optimiser and the Polyak target one fused step each. Everything else reads the critics through
`twin_q_values`; `unfit_reason` says when a config's critics cannot go through the kernel (the
agent then keeps a tree and runs `apply` and autodiff). Also the fused actors' views.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

import kernels
from envs.spaces import Box
from kernels.q_grads import QLayout
from kernels.sac_actor_grads import SacActorLayout
from kernels.twin_q_grads import TwinQLayout
from kernels.twin_q_grads import unfit_reason as kernel_unfit_reason
from rl.core import environment
from rl.nn import param_layout
from rl.nn.layers import Network


class FusedTwinQ(NamedTuple):
    """Twin critics as the fused kernel sees them (static: built once per agent)."""

    network: Network
    unravel: Callable  # flat vector [size] -> the network's params
    layout: TwinQLayout
    activation: str
    backend: str
    precision: str = "tf32"  # the kernels' dot_precision (`rl.core.environment.kernel_precision`)


def unfit_reason(network_config, obs_space, action_space) -> str | None:
    """Why the fused kernel cannot run these critics, or None: it needs a flat Box observation,
    Box actions, an MLP torso of two tanh, relu or silu hidden layers without LayerNorm, and sizes
    within `kernels.twin_q_grads.LIMITS`."""
    network_config = getattr(network_config, "critic", network_config)  # the critics' widths
    if not isinstance(action_space, Box):
        return "the fused twin critics need Box actions"
    if getattr(network_config, "batch_renorm", False):
        return "the fused twin critics hold plain MLPs, not batch renormalisation (CrossQ)"
    if not isinstance(obs_space, Box) or len(obs_space.shape) != 1:
        return f"the fused twin critics need a flat Box observation, got {obs_space}"
    if (
        network_config.torso != "mlp"
        or network_config.layer_norm
        or len(network_config.hidden) != 2
        or network_config.activation not in ("tanh", "relu", "silu")
    ):
        return (
            "the fused twin critics need an MLP of two tanh, relu or silu hidden layers, "
            "no LayerNorm"
        )
    action_dim = int(jnp.prod(jnp.asarray(action_space.shape)))
    layout = kernels.twin_q_grads.twin_q_layout(
        obs_space.shape[0], action_dim, tuple(network_config.hidden)
    )
    return kernel_unfit_reason(layout)


def runs_fused(network_config, obs_space, action_space, backend: str, wanted: bool) -> bool:
    """Whether an agent asking for the fused critics (`wanted`) gets them: a kernel backend that
    runs the Triton source (triton, interpret) and critics that fit (`unfit_reason`)."""
    return (
        wanted
        and kernels.resolve_backend(backend) in ("triton", "interpret")
        and unfit_reason(network_config, obs_space, action_space) is None
    )


def _zero_params(network: Network, example_obs, example_action):
    shapes = jax.eval_shape(network.init, jax.random.key(0), example_obs, example_action)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def make(
    network: Network, network_config, example_obs, example_action, backend: str,
    precision: str = "tf32",
):  # fmt: skip
    """The fused view of the twin critics `network` (two MLPs of two hidden layers and one output,
    as `unfit_reason` checks): its flat layout, taken from the shapes of its params (the six dense
    layers in creation order: critic 1's torso and head, then critic 2's); the kernels run on
    `backend` with matmuls at `precision` (their `dot_precision`)."""
    tree = _zero_params(network, example_obs, example_action)
    _, unravel = ravel_pytree(tree)
    dense = param_layout.dense_layers(tree)
    offsets = param_layout.dense_layers(param_layout.leaf_offsets(tree))
    (w1, _), (w2, _) = dense[0], dense[1]
    layout = TwinQLayout(
        tuple(int(o) for pair in offsets for o in pair),
        int(example_obs.shape[-1]),
        int(example_action.shape[-1]),
        (w1.shape[1], w2.shape[1]),
        sum(x.size for x in jax.tree.leaves(tree)),
    )
    kernels.twin_q_grads.check_layout(layout)
    return FusedTwinQ(network, unravel, layout, network_config.activation, backend, precision)


def init(fused: FusedTwinQ, key, obs, action):
    """The critics' initial params, raveled into one vector [size]."""
    return ravel_pytree(fused.network.init(key, obs, action))[0]


def twin_q_values(fused: FusedTwinQ, flat_params, obs, action):
    """(Q1, Q2)(obs, action) through the network's own apply on the unraveled params."""
    return fused.network.apply(fused.unravel(flat_params), obs, action)


def critic_grads(fused: FusedTwinQ, flat_params, target_params, batch, discounts, next_action,
                 next_bonus):  # fmt: skip
    """(grads [size], ||grads||^2, {"loss", "q_mean"}) of the twin critics' loss on a batch of
    transitions ({"obs", "action", "reward", "next_obs"}; `discounts` gamma (1 - terminated)), the
    target y = r + discounts (min(Q1', Q2')(s', next_action) + next_bonus), from
    `kernels.twin_q_grads_flat`."""
    return kernels.twin_q_grads_flat(
        batch["obs"], batch["action"], batch["reward"], discounts, batch["next_obs"],
        next_action, next_bonus, flat_params, target_params, fused.layout,
        activation=fused.activation, dot_precision=fused.precision, backend=fused.backend,
    )  # fmt: skip


def for_agent(config, env, env_params, critic: Network):
    """The fused view of an agent's twin critics when `agent.fused_network` is on, the kernel
    backend runs Triton, the agent bootstraps from target critics and the critics fit
    (`runs_fused`); else None (SimbaV2's and CrossQ's critics: the network's apply and autodiff).
    """
    agent = config.agent
    obs_space, action_space = env.observation_space(env_params), env.action_space(env_params)
    backend = environment.kernel_backend(config)
    if not agent.target_networks:  # the kernel bootstraps from target critics; CrossQ has none
        return None
    if not runs_fused(agent.network, obs_space, action_space, backend, agent.fused_network):
        return None
    example_obs = jnp.zeros(obs_space.shape, jnp.float32)
    example_action = jnp.zeros(action_space.shape, jnp.float32)
    precision = environment.kernel_precision(config)
    return make(critic, agent.network, example_obs, example_action, backend, precision)


class FusedActor(NamedTuple):
    """An actor as a fused policy-gradient kernel sees it: where its arrays lie in
    `ravel_pytree`'s vector of its params (static: built once per agent)."""

    unravel: Callable  # flat vector [size] -> the actor's params
    layout: QLayout | SacActorLayout


def _actor_dense_layers(actor: Network, example_obs):
    """(unravel, [(w, b) shapes of its dense layers], their offsets, size), or None for an actor
    that is not plain dense layers."""
    tree = jax.tree.map(
        lambda s: jnp.zeros(s.shape, s.dtype),
        jax.eval_shape(actor.init, jax.random.key(0), example_obs),
    )
    try:
        dense = param_layout.dense_layers(tree)
    except ValueError:
        return None
    offsets = param_layout.dense_layers(param_layout.leaf_offsets(tree))
    size = sum(x.size for x in jax.tree.leaves(tree))
    return ravel_pytree(tree)[1], dense, [int(o) for pair in offsets for o in pair], size


def deterministic_actor(fused: FusedTwinQ, actor: Network, example_obs) -> FusedActor | None:
    """The fused view of a deterministic actor (two hidden layers and a tanh head, the critics'
    widths) that goes with the fused critics `fused`, or None where the kernel cannot run it
    (`kernels.deterministic_policy_grads.unfit_reason`)."""
    found = _actor_dense_layers(actor, example_obs)
    if found is None or len(found[1]) != 3:
        return None
    unravel, ((w1, _), (w2, _), (w3, _)), offsets, size = found
    hidden = (int(w1.shape[1]), int(w2.shape[1]))
    layout = QLayout(tuple(offsets), int(w1.shape[0]), hidden, int(w3.shape[1]), size)
    if kernels.deterministic_policy_grads.unfit_reason(layout, fused.layout) is not None:
        return None
    return FusedActor(unravel, layout)


def squashed_gaussian_actor(fused: FusedTwinQ, actor: Network, example_obs) -> FusedActor | None:
    """The fused view of SAC's squashed-Gaussian actor (two hidden layers, then the mean head and
    the raw log-std head, the critics' widths) that goes with the fused critics `fused`, or None
    where the kernel cannot run it (`kernels.sac_actor_grads.unfit_reason`)."""
    found = _actor_dense_layers(actor, example_obs)
    if found is None or len(found[1]) != 4:
        return None
    unravel, ((w1, _), (w2, _), (wm, _), (wr, _)), offsets, size = found
    if wm.shape != wr.shape:
        return None
    hidden = (int(w1.shape[1]), int(w2.shape[1]))
    layout = SacActorLayout(tuple(offsets), int(w1.shape[0]), hidden, int(wm.shape[1]), size)
    if kernels.sac_actor_grads.unfit_reason(layout, fused.layout) is not None:
        return None
    return FusedActor(unravel, layout)


def deterministic_policy_grads(fused: FusedTwinQ, actor: FusedActor, actor_params, critic_params,
                               obs):  # fmt: skip
    """(grads in the actor's tree, ||grads||^2, {"loss"}) of L = -mean Q1(s, mu(s)) from
    `kernels.deterministic_policy_grads_flat` on the raveled actor params and the critics' flat
    vector."""
    grads, sq_norm, stats = kernels.deterministic_policy_grads_flat(
        obs, ravel_pytree(actor_params)[0], critic_params, actor.layout, fused.layout,
        activation=fused.activation, dot_precision=fused.precision, backend=fused.backend,
    )  # fmt: skip
    return actor.unravel(grads), sq_norm, stats


def sac_actor_grads(fused: FusedTwinQ, actor: FusedActor, actor_params, critic_params, obs, eps,
                    alpha, log_std_bounds):  # fmt: skip
    """(grads in the actor's tree, ||grads||^2, {"loss", "entropy"}) of SAC's actor loss
    mean(alpha log pi(a|s) - min(Q1, Q2)(s, a)), a = tanh(mu + sigma eps), from
    `kernels.sac_actor_grads_flat` on the raveled actor params and the critics' flat vector."""
    grads, sq_norm, stats = kernels.sac_actor_grads_flat(
        obs, eps, alpha, ravel_pytree(actor_params)[0], critic_params, actor.layout, fused.layout,
        log_std_bounds=log_std_bounds, activation=fused.activation,
        dot_precision=fused.precision, backend=fused.backend,
    )  # fmt: skip
    return actor.unravel(grads), sq_norm, stats
