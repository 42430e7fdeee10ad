"""Rainbow's acting through one kernel launch (`kernels.rainbow_epsilon_greedy`): the MLP torso, the
noisy dueling C51 head, the softmax expectation and the epsilon-greedy choice for all seeds and
envs at once (`epsilon_greedy`), on the network `rl.agents.rainbow.make_network` builds, read by
name (either layer backend). `unfit_reason` says when a config's network is another one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import kernels
from envs.spaces import Box, Discrete
from kernels.rainbow_act import NoisyLinear
from kernels.rainbow_act import unfit_reason as kernel_unfit_reason
from rl.nn import layers, param_layout

NOISY_FIELDS = ("w_mu", "w_sigma", "b_mu", "b_sigma")


def unfit_reason(agent, obs_space, action_space, precision: str = "tf32") -> str | None:
    """Why the fused acting kernel cannot run this Rainbow network (`agent`: the agent config) at
    matmul `precision` (`dot_precision`'s), or None: it needs Discrete actions, a flat Box
    observation, an MLP torso of two tanh, relu or silu hidden layers without LayerNorm, the noisy
    dueling distributional head without head hidden layers, and sizes within
    `kernels.rainbow_act.LIMITS` (and its shared memory with "ieee" products)."""
    network = agent.network
    if not isinstance(action_space, Discrete):
        return "fused Rainbow acting needs Discrete actions"
    if not isinstance(obs_space, Box) or len(obs_space.shape) != 1:
        return f"fused Rainbow acting needs a flat Box observation, got {obs_space}"
    if (
        network.torso != "mlp"
        or network.layer_norm
        or len(network.hidden) != 2
        or network.activation not in ("tanh", "relu", "silu")
    ):
        return "fused Rainbow acting needs an MLP of two tanh, relu or silu layers, no LayerNorm"
    if not (agent.noisy and agent.dueling and agent.distributional) or agent.head_hidden:
        return "fused Rainbow acting needs the noisy dueling distributional head, no head_hidden"
    return kernel_unfit_reason(
        obs_space.shape[0], tuple(network.hidden), agent.num_atoms, action_space.n, precision
    )


def runs_fused(agent, obs_space, action_space, backend: str, precision: str = "tf32") -> bool:
    """Whether Rainbow acts through the kernel: `agent.fused_acting` on, a kernel backend that runs
    the Triton source (triton, interpret) and a network that fits at matmul `precision`
    (`unfit_reason`)."""
    return (
        agent.fused_acting
        and kernels.resolve_backend(backend) in ("triton", "interpret")
        and unfit_reason(agent, obs_space, action_space, precision) is None
    )


def _named(params) -> dict:
    """Each leaf by its path joined with '/' (Flax 'params/noisy_0_w_mu', Haiku 'noisy_0/w_mu')."""
    return {
        "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }


def noisy_arrays(params, index: int) -> tuple:
    """(w_mu, w_sigma, b_mu, b_sigma) of noisy layer `index` (`noisy_<index>`, either backend):
    0 the value stream, 1 the advantage stream. Noisy layer i gets the noise of index i, the order
    the network applies them in (`rainbow_head` names none)."""
    named = _named(params)
    found = []
    for field in NOISY_FIELDS:
        hits = [
            v
            for k, v in named.items()
            if k.endswith((f"noisy_{index}_{field}", f"noisy_{index}/{field}"))
        ]
        if len(hits) != 1:
            raise ValueError(f"params: no single noisy_{index} {field} in {sorted(named)}")
        found.append(hits[0])
    return tuple(found)


def torso_arrays(params) -> tuple:
    """(w1, b1, w2, b2) of the torso's two dense layers."""
    named = _named(params)
    dense = param_layout.dense_layers(
        _unflatten({k: v for k, v in named.items() if "noisy_" not in k})
    )
    if len(dense) != 2:
        raise ValueError(f"params: the torso needs 2 dense layers, found {len(dense)}")
    (w1, b1), (w2, b2) = dense
    return w1, b1, w2, b2


def _unflatten(named: dict) -> dict:
    """The nested dict of '/'-joined paths (what `param_layout.dense_layers` reads)."""
    tree: dict = {}
    for path, leaf in named.items():
        node = tree
        *parents, last = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = leaf
    return tree


def epsilon_greedy(
    params, obs, epsilon, support, *, noise_key, act_key, activation, backend, precision="tf32"
):
    """Rainbow's epsilon-greedy actions [N] int32 for obs [N, D]: the network's Q-values with the
    noise `apply(params, obs, rng=noise_key)` draws, `rl.core.exploration.epsilon_greedy(act_key, Q,
    epsilon)`'s uniforms, in one launch (`precision`: `dot_precision`'s). The noise is the network's
    own (`rl.nn.layers.noisy_layer_noise`): the actions are the network's up to float rounding."""
    value, advantage = noisy_arrays(params, 0), noisy_arrays(params, 1)
    hidden = value[0].shape[0]
    noisy = lambda arrays, index: NoisyLinear(
        *arrays, *layers.noisy_layer_noise(noise_key, index, hidden, arrays[0].shape[1])
    )
    uniforms = jax.random.uniform(act_key, obs.shape[:-1] + (2,))
    return kernels.rainbow_epsilon_greedy(
        obs.astype(jnp.float32), torso_arrays(params), noisy(value, 0), noisy(advantage, 1),
        support, uniforms, epsilon, activation=activation, backend=backend,
        dot_precision=precision,
    )  # fmt: skip
