"""Variants of PPO's update (`rl.agents.ppo`), pieces its `make_trainer` picks once, and their
settings (`VariantsConfig`, a base of PPO's `Config`): the fused minibatch gradient
(`kernels.ppo_actor_critic_grads_flat` on the flat parameter vector: `fused_update_fits`,
`fused_layout`, `fused_flat_grads`), and segment minibatches (`agent.minibatch_advantages`, Brax's
PPO: whole `agent.gae_horizon`-step segments whose loss computes their advantages with the
network being trained: `segments`, `segment_batch`, `segment_outputs`).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

import kernels
from envs.spaces import Box, Discrete
from rl.config import arch as arch_config
from rl.config.parsing import ConfigError, hp
from rl.core import collection, environment, losses
from rl.nn import param_layout

OBS_CLIP = 10.0  # agent.obs_clip's default
LAG_WEIGHT_MAX = 100.0  # agent.lag_weight_max's default


@dataclass(frozen=True)
class VariantsConfig:
    """The settings of PPO's variants, a base of `rl.agents.ppo.Config` before
    `rl.config.loops.PPOLoopConfig` (its `validate` calls that one's first)."""

    normalize_obs: bool = hp(
        False,
        doc="the networks read observations normalised by their running mean and variance over "
        "all rollouts (per channel for images), kept in the params",
    )
    obs_clip: typing.Optional[float] = hp(
        OBS_CLIP,
        low=0.0,
        low_open=True,
        doc="with agent.normalize_obs, normalised observations are clipped to [-obs_clip, "
        "obs_clip]; null: not clipped (Brax's PPO)",
    )
    fused_update: bool = hp(
        True,
        doc="minibatch gradient from the fused kernel (kernels.ppo_actor_critic_grads_flat) when "
        "the kernel backend is triton/interpret and the network fits it (and "
        "agent.minibatch_advantages is off); else autodiff (with the automatic backend the op "
        "itself takes autodiff for one seed's minibatch of under 32768 rows, measured faster)",
    )
    gae_horizon: int = hp(
        0,
        low=0,
        doc="GAE within segments of this many rollout steps, each bootstrapping from V at its end "
        "(Brax's PPO: its 5-step unrolls); 0: over the whole rollout",
    )
    recompute_advantages: bool = hp(
        False,
        doc="V, advantages and value targets recomputed with the current network at the start of "
        "every epoch (Andrychowicz et al. 2021); else once per update",
    )
    minibatch_advantages: bool = hp(
        False,
        doc="minibatches of whole agent.gae_horizon-step segments, whose V, advantages and value "
        "targets each minibatch's loss computes with the current network (Brax's PPO; autodiff, "
        "not the fused kernel); else computed before learning (or each epoch: "
        "agent.recompute_advantages)",
    )
    lag_correction: bool = hp(
        False,
        doc="decoupled PPO (Hilton et al. 2022) for rollouts collected with params up to "
        "arch.max_lag updates old (arch sebulba): the ratio is clipped around the learner's "
        "policy at the update's start (the proximal policy) instead of the behaviour policy, and "
        "each row's surrogate is weighted by min(agent.lag_weight_max, pi_prox(a|s) / "
        "pi_behaviour(a|s)); approx_kl and clip_fraction then measure against pi_prox",
    )
    lag_weight_max: float = hp(
        LAG_WEIGHT_MAX,
        low=0.0,
        low_open=True,
        doc="with agent.lag_correction, the cap on each row's weight pi_prox / pi_behaviour (the "
        "paper's objective has none; the cap guards against actions the behaviour policy rarely "
        "took; 1 truncates as V-trace does, which biases the weights below 1)",
    )

    def validate(self):
        super().validate()
        if self.gae_horizon > self.num_steps:
            raise ConfigError(
                f"agent.gae_horizon ({self.gae_horizon}) exceeds agent.num_steps "
                f"({self.num_steps}), so it would cut nothing; use 0 for GAE over the whole rollout"
            )
        if self.minibatch_advantages:
            check_segment_minibatches(self)
        if not self.lag_correction and self.lag_weight_max != LAG_WEIGHT_MAX:
            raise ConfigError(
                f"agent.lag_weight_max ({self.lag_weight_max}) caps decoupled PPO's weights: it "
                "needs agent.lag_correction: true"
            )
        if not self.normalize_obs and self.obs_clip != OBS_CLIP:
            raise ConfigError(
                f"agent.obs_clip ({self.obs_clip}) clips normalised observations: it needs "
                "agent.normalize_obs: true"
            )


# ---------------------------------------------------------------- the fused minibatch gradient


def fused_update_unfit_reason(config, env=None, env_params=None) -> str | None:
    """Why `kernels.ppo_actor_critic_grads_flat` cannot compute this config's gradient, or None if
    it can: it needs Discrete actions, a flat Box observation, separate actor and critic mlp torsos
    with two hidden layers, tanh or relu, and sizes within `kernels.ppo_grads.LIMITS` whose tf32
    kernel fits one program's shared memory (`kernels.ppo_grads.too_big_for_shared_memory`). The
    env is `environment.make_env(config)` unless given."""
    if env is None:
        env, env_params = environment.make_env(config)
    agent, network = config.agent, config.agent.network
    action_space, obs_space = env.action_space(env_params), env.observation_space(env_params)
    limits = kernels.ppo_grads.LIMITS
    if agent.minibatch_advantages:
        return (
            "agent.minibatch_advantages computes the advantages inside the loss (the kernel takes "
            "them as inputs)"
        )
    if agent.lag_correction:
        return (
            "agent.lag_correction weights each row by pi_prox / pi_behaviour: the kernel takes "
            "no weights"
        )
    if arch_config.autoreset_mode(config) == "next_step":
        return (
            "the envs reset in the step after an episode's end (arch.autoreset: next_step), which "
            "the loss leaves out: the kernel has no mask"
        )
    if not isinstance(action_space, Discrete):
        return "continuous actions (the kernel is for categorical policies)"
    if not isinstance(obs_space, Box) or len(obs_space.shape) != 1:
        return f"observation space {obs_space} is not a flat Box"
    if agent.critic_hidden is not None and tuple(agent.critic_hidden) != tuple(network.hidden):
        return "the kernel needs the critic's hidden widths to be the actor's (agent.critic_hidden)"
    if (
        agent.shared_network
        or network.torso != "mlp"
        or network.layer_norm
        or len(network.hidden) != 2
        or network.activation not in ("tanh", "relu")
    ):
        return "the kernel needs separate actor and critic MLPs with two tanh or relu hidden layers"
    if (
        max(network.hidden) > limits["hidden"]
        or obs_space.shape[0] > limits["obs_dim"]
        or action_space.n > limits["actions"]
    ):
        return f"sizes beyond the kernel's limits {limits}"
    return kernels.ppo_grads.too_big_for_shared_memory(
        obs_space.shape[0], tuple(network.hidden), action_space.n
    )


def fused_update_fits(config, env, env_params, backend: str) -> bool:
    """Whether the minibatch gradient comes from the fused kernel: `agent.fused_update`, a kernel
    `backend` that runs the Triton source (triton, interpret) and a config that fits it."""
    return (
        config.agent.fused_update
        and kernels.resolve_backend(backend) in ("triton", "interpret")
        and fused_update_unfit_reason(config, env, env_params) is None
    )


def fused_layout(params) -> kernels.ppo_grads.FlatLayout:
    """Where `ravel_pytree(params)` holds the two-torso actor-critic's twelve arrays, for the fused
    kernel. Dense layers in creation order: actor hidden 1-2, critic hidden 1-2, actor head, critic
    head."""
    (w1, _), (w2, _), _, _, (head, _), _ = param_layout.dense_layers(params)
    a1, a2, c1, c2, a3, c3 = param_layout.dense_layers(param_layout.leaf_offsets(params))
    size = sum(x.size for x in jax.tree.leaves(params))
    return kernels.ppo_grads.FlatLayout(
        (*a1, *a2, *a3),
        (*c1, *c2, *c3),
        w1.shape[0],
        (w1.shape[1], w2.shape[1]),
        head.shape[1],
        size,
    )


def fused_flat_grads(
    hparams, flat_params, unravel, minibatch, *, agent, backend: str, dot_precision: str = "tf32"
):
    """(gradient, ||gradient||^2, stats) of PPO's minibatch loss with respect to the flat parameter
    vector `flat_params` (`unravel` gives its tree: the categorical actor-critic of two separate
    two-layer torsos, laid out as `fused_layout` says) from the fused kernel on `backend`, its
    matmuls at `dot_precision` (`rl.core.environment.kernel_precision`): the
    numbers of jax.grad (up to float rounding), computed on the vector itself. `minibatch` is
    (`rl.agents.ppo.LearnBatch`, advantages, targets); the advantages are normalised first with
    `agent.normalize_advantages`."""
    trans, advantages, targets = minibatch
    assert trans.mask is None, "no mask in the fused kernel: fused_update_unfit_reason"
    assert trans.proximal_log_prob is None, "no weights in the fused kernel: the same"
    if agent.normalize_advantages:
        advantages = losses.normalize(advantages)
    return kernels.ppo_actor_critic_grads_flat(
        trans.obs,
        trans.action,
        trans.log_prob,
        trans.value,
        advantages,
        targets,
        flat_params,
        fused_layout(unravel(flat_params)),
        hparams["clip_eps"],
        hparams["vf_clip_eps"],
        hparams["ent_coef"],
        hparams["vf_coef"],
        activation=agent.network.activation,
        clip_value_loss=agent.clip_value_loss,
        dot_precision=dot_precision,
        backend=backend,
    )


# ---------------------------------------------------------------- segment minibatches


def check_segment_minibatches(agent) -> None:
    """`agent.minibatch_advantages` splits the rollout into whole `gae_horizon`-step segments,
    dealt out evenly to the minibatches, and already recomputes what `recompute_advantages`
    would: ConfigError otherwise."""
    if not agent.gae_horizon:
        raise ConfigError(
            "agent.minibatch_advantages needs agent.gae_horizon > 0: its minibatches hold whole "
            "segments of that many steps"
        )
    if agent.num_steps % agent.gae_horizon:
        raise ConfigError(
            f"agent.minibatch_advantages needs agent.gae_horizon ({agent.gae_horizon}) to divide "
            f"agent.num_steps ({agent.num_steps}) into whole segments"
        )
    segments = agent.batch_size // agent.gae_horizon
    if segments % agent.num_minibatches:
        raise ConfigError(
            f"agent.minibatch_advantages: agent.num_minibatches ({agent.num_minibatches}) must "
            f"divide the {segments} segments of agent.gae_horizon ({agent.gae_horizon}) steps "
            f"(agent.num_envs * agent.num_steps / agent.gae_horizon)"
        )
    if agent.recompute_advantages:
        raise ConfigError(
            "agent.recompute_advantages and agent.minibatch_advantages: choose one (minibatch "
            "advantages are already recomputed in every minibatch)"
        )


class SegmentBatch(NamedTuple):
    """What the minibatch loss of segment minibatches reads of a step: the network's inputs at s_t
    and final_obs_t, the action, the behaviour policy's log-prob and value (None where the value
    loss is unclipped), the scaled reward, the episode-end flags and the mask of the steps the
    loss counts (None: all; `rl.core.collection.step_mask`) and with `agent.lag_correction` the
    log-prob under the network at the update's start (None without); [segments, H, ...]."""

    obs: jax.Array
    final_obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array | None
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    mask: jax.Array | None = None
    proximal_log_prob: jax.Array | None = None


def segments(x, horizon: int):
    """[T, N, ...] -> [(T / H) N, H, ...]: row k N + n holds steps k H, ..., k H + H - 1 of
    env n."""
    t, n = x.shape[:2]
    x = x.reshape((t // horizon, horizon, n) + x.shape[2:])
    return jnp.swapaxes(x, 1, 2).reshape((t // horizon * n, horizon) + x.shape[3:])


def segment_batch(s, hparams, net_params, traj) -> SegmentBatch:
    """The rollout `traj` [T, N, ...] (its observations what the network reads) as whole
    `agent.gae_horizon`-step segments of `SegmentBatch`, advantages left to the loss; `s` is PPO's
    `Setup` (agent, net)."""
    value = proximal_log_prob = None
    if s.agent.clip_value_loss or s.agent.lag_correction:
        head, value = s.net.apply(net_params, traj.obs)
        value = value if s.agent.clip_value_loss else None
        if s.agent.lag_correction:
            proximal_log_prob = proximal_log_probs(s, head, traj.action)
    reward = traj.reward * hparams["reward_scale"]
    data = SegmentBatch(
        traj.obs,
        traj.final_obs,
        traj.action,
        traj.log_prob,
        value,
        reward,
        traj.terminated,
        traj.truncated,
        collection.step_mask(traj),
        proximal_log_prob,
    )
    return jax.tree.map(lambda x: segments(x, s.agent.gae_horizon), data)


def proximal_log_probs(s, head, action):
    """log pi_prox(a|s) of the taken actions under the policy head's output `head` of the network
    at the update's start (decoupled PPO's proximal policy, `agent.lag_correction`); `s` is PPO's
    `Setup`."""
    log_prob, _ = s.distribution.from_head(head).log_prob_entropy(action, s.backend)
    return log_prob


def segment_outputs(s, hparams, net_params, minibatch: SegmentBatch):
    """What PPO's objective reads of a minibatch of whole segments [m, H]: (pi, V, the minibatch
    with V_old, advantages, targets). V(s_t) and V(final_obs_t) under the network's params give
    truncation-aware GAE within each segment (held fixed: no gradient flows through the advantages
    or the targets); V_old = V (held fixed) where the value loss is unclipped. `s` is PPO's
    `Setup` (net, distribution, backend, deterministic)."""
    head, values = s.net.apply(net_params, minibatch.obs)
    _, final_values = s.net.apply(net_params, minibatch.final_obs)
    time_major = lambda x: jnp.swapaxes(x, 0, 1)
    advantages, targets = losses.truncation_aware_gae(
        time_major(minibatch.reward),
        time_major(jax.lax.stop_gradient(values)),
        time_major(jax.lax.stop_gradient(final_values)),
        time_major(minibatch.terminated),
        time_major(minibatch.truncated),
        hparams["gamma"],
        hparams["gae_lambda"],
        backend=s.backend,
        deterministic=s.deterministic,
    )
    advantages, targets = (jax.lax.stop_gradient(time_major(x)) for x in (advantages, targets))
    if minibatch.value is None:
        minibatch = minibatch._replace(value=jax.lax.stop_gradient(values))
    return s.distribution.from_head(head), values, minibatch, advantages, targets
