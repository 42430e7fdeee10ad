"""Proximal Policy Optimisation (PPO, clipped objective; Schulman et al. 2017) with truncation-aware
GAE, discrete and continuous actions, compiled end to end (PureJaxRL's make_train is the model).

One update:

    rollout      num_envs envs step num_steps times with the current policy (the actor only)
    values       V(s_t) and V(final_obs_t): a critic pass over each (the rollout's arrays, never a
                 stacked copy of both: rollout memory is what limits seeds on image-sized observations)
    advantages   A, R = truncation_aware_gae(r * reward_scale, V(s), V(final_obs), terminated, truncated)
    learn        num_epochs passes over the batch in num_minibatches shuffled minibatches, each an Adam
                 step (gradients clipped to max_grad_norm) on rl.losses.ppo_loss (with
                 `agent.recompute_advantages`, values and advantages recomputed before each epoch;
                 with `agent.minibatch_advantages`, in each minibatch's loss):

    L = -mean(min(rho A, clip(rho, 1 - eps, 1 + eps) A))
        + vf_coef 0.5 mean(max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2))
        - ent_coef mean(H[pi])

with rho = pi(a|s) / pi_old(a|s) and A normalised per minibatch (optional). Adam's step size decays
linearly to 0 over the updates (optional). The minibatch gradient is jax.grad of that loss, or, for a
categorical policy on two separate two-layer MLPs with a triton/interpret kernel backend and
precomputed advantages, the fused kernel `kernels.ppo_actor_critic_grads_flat` of the same function
(`fused_update`), which reads the weights from the optimiser's flat parameter vector and writes the
gradient and its squared norm for the clip.

Truncation: with d_t = gamma (1 - terminated_t) and lambda_t = lambda (1 - (terminated_t | truncated_t)),

    delta_t = r_t + d_t V(final_obs_t) - V(s_t),     A_t = delta_t + d_t lambda_t A_{t+1},

so a time-limit end still bootstraps and no advantage chain crosses an episode boundary. With
`agent.gae_horizon` H > 0 the rollout is also cut every H steps: lambda_t = 0 where (t + 1) mod H = 0
(the step still bootstraps from V(final_obs_t), there the next observation), so each advantage looks
at most H steps ahead, as Brax's PPO computes GAE within each of its unrolls. With
`agent.minibatch_advantages` the minibatches are drawn from those whole segments, and each
minibatch's loss computes its segments' V, advantages and targets with the network being trained
(as Brax's PPO does in every minibatch); else they are computed once per update (or per epoch).

Policies: categorical over logits; for Box actions (`agent.continuous_policy`) a diagonal Gaussian
with a state-independent learned log-std (`gaussian`) or a tanh-squashed diagonal Gaussian with a
state-dependent scale softplus(x) + 0.001 (`tanh_gaussian`, Brax's PPO policy). Both live in the
agent's action space [-1, 1]^d of `environment.make_env`: a sample u is stored and scored before any
squashing or clipping (log-probabilities stay exact), and the env receives
L + (clip(a, -1, 1) + 1) (H - L) / 2 with a = u (clipped to the bounds) or a = tanh(u). The tanh
Gaussian's entropy bonus is the one-sample estimate of `losses.tanh_gaussian_log_prob_entropy`. The
greedy policy (evaluation, `make_policy`) takes the argmax / the (squashed) mean.

Observation normalisation (`agent.normalize_obs`): the networks read
clip((obs - mean) / sqrt(var + 1e-8), -c, c), c = `agent.obs_clip` (10; null: unclipped, as Brax's
PPO), with the running mean and variance of every
observation of every rollout so far (per feature; per channel for images), merged after each
rollout and before learning from it (as Brax's PPO does); the statistics live in the policy's
params, `{"network": ..., "obs_stats": {"mean", "var", "count"}}`, so evaluation and checkpoints carry them.

Networks: `agent.network` is the torso; separate actor and critic torsos unless `shared_network`
(the critic's hidden widths `agent.critic_hidden` when set); orthogonal init, gain 0.01 for the
policy head and 1 for the value head.

The sweepable hyperparameters (lr, gamma, gae_lambda, clip_eps, vf_clip_eps, ent_coef, vf_coef,
max_grad_norm, reward_scale) are read from `hparams` inside the compiled program.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

import kernels
from envs.spaces import Box, Discrete
from rl import (
    agent_configs,
    collection,
    environment,
    episodes,
    loop,
    losses,
    networks,
    observation_norm,
)
from rl.config_parsing import ConfigError, hp
from rl.rollout import greedy_episodes
from rl.trainer import Trainer, train_from_trainer

OBS_CLIP = 10.0  # agent.obs_clip's default


@dataclass(frozen=True)
class Config(agent_configs.PPOLoopConfig):
    name: str = "ppo"
    network: networks.NetworkConfig = networks.network_config(hidden=(64, 64), activation="tanh")
    normalize_obs: bool = hp(
        False,
        doc="the networks read observations normalised by their running mean and variance over all rollouts (per channel for images), kept in the params",
    )
    obs_clip: typing.Optional[float] = hp(
        OBS_CLIP,
        low=0.0,
        low_open=True,
        doc="with agent.normalize_obs, normalised observations are clipped to [-obs_clip, obs_clip]; null: not clipped (Brax's PPO)",
    )
    critic_hidden: typing.Optional[tuple[int, ...]] = hp(
        None,
        doc="hidden widths of the critic's torso when they differ from agent.network.hidden (separate torsos only)",
    )
    fused_update: bool = hp(
        True,
        doc="minibatch gradient from the fused kernel (kernels.ppo_actor_critic_grads_flat) when the kernel backend is triton/interpret and the network fits it (and agent.minibatch_advantages is off); else autodiff (with the automatic backend the op itself takes autodiff for one seed's minibatch of under 32768 rows, measured faster)",
    )
    gae_horizon: int = hp(
        0,
        low=0,
        doc="GAE within segments of this many rollout steps, each bootstrapping from V at its end (Brax's PPO: its 5-step unrolls); 0: over the whole rollout",
    )
    recompute_advantages: bool = hp(
        False,
        doc="V, advantages and value targets recomputed with the current network at the start of every epoch (Andrychowicz et al. 2021); else once per update",
    )
    minibatch_advantages: bool = hp(
        False,
        doc="minibatches of whole agent.gae_horizon-step segments, whose V, advantages and value targets each minibatch's loss computes with the current network (Brax's PPO; autodiff, not the fused kernel); else computed before learning (or each epoch: agent.recompute_advantages)",
    )

    def validate(self):
        super().validate()
        if self.gae_horizon > self.num_steps:
            raise ConfigError(
                f"agent.gae_horizon ({self.gae_horizon}) exceeds agent.num_steps ({self.num_steps}), so it would cut "
                f"nothing; use 0 for GAE over the whole rollout"
            )
        if self.minibatch_advantages:
            self.check_segment_minibatches()
        if not self.normalize_obs and self.obs_clip != OBS_CLIP:
            raise ConfigError(
                f"agent.obs_clip ({self.obs_clip}) clips normalised observations: it needs agent.normalize_obs: true"
            )

    def check_segment_minibatches(self):
        """`minibatch_advantages` splits the rollout into whole `gae_horizon`-step segments, dealt out
        evenly to the minibatches, and already recomputes what `recompute_advantages` would."""
        if not self.gae_horizon:
            raise ConfigError(
                "agent.minibatch_advantages needs agent.gae_horizon > 0: its minibatches hold whole segments of that many steps"
            )
        if self.num_steps % self.gae_horizon:
            raise ConfigError(
                f"agent.minibatch_advantages needs agent.gae_horizon ({self.gae_horizon}) to divide agent.num_steps ({self.num_steps}) "
                f"into whole segments"
            )
        segments = self.batch_size // self.gae_horizon
        if segments % self.num_minibatches:
            raise ConfigError(
                f"agent.minibatch_advantages: agent.num_minibatches ({self.num_minibatches}) must divide the "
                f"{segments} segments of agent.gae_horizon ({self.gae_horizon}) steps "
                f"(agent.num_envs * agent.num_steps / agent.gae_horizon)"
            )
        if self.recompute_advantages:
            raise ConfigError(
                "agent.recompute_advantages and agent.minibatch_advantages: choose one (minibatch advantages are "
                "already recomputed in every minibatch)"
            )


def check_env(config, env, env_params) -> None:
    """PPO needs Discrete or bounded Box actions; `agent.critic_hidden` needs separate torsos."""
    environment.check_policy_env(config, env, env_params)
    agent = config.agent
    if agent.critic_hidden is not None:
        if agent.shared_network:
            raise ConfigError(
                "agent.critic_hidden: a shared torso (agent.shared_network: true) has no separate critic widths"
            )
        if not agent.critic_hidden or any(width < 1 for width in agent.critic_hidden):
            raise ConfigError(
                f"agent.critic_hidden must list positive widths, got {list(agent.critic_hidden)}"
            )


# ---------------------------------------------------------------- the network


def make_network(agent: Config, env, env_params):
    """(network obs -> (policy, value), distribution) for the agent's env: `agent.network`'s torso
    (the critic's with `agent.critic_hidden` if set), a Gaussian or categorical policy head
    (`loop.policy_head`) and a value head (`networks.actor_critic`)."""
    head, distribution = loop.policy_head(agent, env, env_params)
    obs_space = env.observation_space(env_params)
    critic = (
        None
        if agent.critic_hidden is None
        else networks.make_torso(
            dataclasses.replace(agent.network, hidden=tuple(agent.critic_hidden)), obs_space
        )
    )
    fn = networks.actor_critic(
        networks.make_torso(agent.network, obs_space),
        head,
        shared=agent.shared_network,
        critic_torso=critic,
    )
    return networks.build(fn, agent.network.backend, agent.network.init), distribution


# ---------------------------------------------------------------- observation normalisation


def network_params(agent: Config, params):
    """The network's own params within the policy's params (`{"network", "obs_stats"}` with
    `agent.normalize_obs`, else the network's params themselves)."""
    return params["network"] if agent.normalize_obs else params


def network_input(agent: Config, params, obs):
    """What the network reads:
    `observation_norm.normalize_observation(obs, params["obs_stats"], agent.obs_clip)` with `agent.normalize_obs`, else obs."""
    return (
        observation_norm.normalize_observation(obs, params["obs_stats"], agent.obs_clip)
        if agent.normalize_obs
        else obs
    )


def policy_params(agent: Config, net_params, obs_stats):
    """The policy's params from the network's and the observation statistics (inverse of `network_params`)."""
    return {"network": net_params, "obs_stats": obs_stats} if agent.normalize_obs else net_params


def apply_policy(s, params, obs):
    """(policy, value) of the policy's params on raw observations."""
    return s.net.apply(network_params(s.agent, params), network_input(s.agent, params, obs))


# ---------------------------------------------------------------- the minibatch gradient


class LearnBatch(NamedTuple):
    """What the loss reads of a step: observation, action, and the behaviour policy's log-prob and value."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array


def minibatch_loss(net, params, batch, hparams, agent: Config, distribution: str, backend: str):
    """(L, stats) = `loop.ppo_minibatch_loss` of a minibatch (LearnBatch, advantages, targets) under `params`."""
    trans, advantages, targets = batch
    policy, values = net.apply(params, trans.obs)
    return loop.ppo_minibatch_loss(
        policy,
        values,
        trans.action,
        trans.log_prob,
        trans.value,
        advantages,
        targets,
        hparams,
        agent,
        distribution,
        backend,
    )


def fused_update_unfit_reason(config, env=None, env_params=None) -> str | None:
    """Why `kernels.ppo_actor_critic_grads_flat` cannot compute this config's gradient, or None if it can:
    it needs Discrete actions, a flat Box observation, separate actor and critic mlp torsos with two
    hidden layers, tanh or relu, and sizes within `kernels.ppo_grads.LIMITS` whose tf32 kernel fits
    one program's shared memory (`kernels.ppo_grads.too_big_for_shared_memory`). The env is
    `environment.make_env(config)` unless given."""
    if env is None:
        env, env_params = environment.make_env(config)
    agent, network = config.agent, config.agent.network
    action_space, obs_space = env.action_space(env_params), env.observation_space(env_params)
    limits = kernels.ppo_grads.LIMITS
    if agent.minibatch_advantages:
        return "agent.minibatch_advantages computes the advantages inside the loss (the kernel takes them as inputs)"
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


def fused_layout(params) -> kernels.ppo_grads.FlatLayout:
    """Where `ravel_pytree(params)` holds the two-torso actor-critic's twelve arrays, for the fused
    kernel. Dense layers in creation order: actor hidden 1-2, critic hidden 1-2, actor head, critic head."""
    (w1, _), (w2, _), _, _, (head, _), _ = networks.dense_layers(params)
    a1, a2, c1, c2, a3, c3 = networks.dense_layers(networks.leaf_offsets(params))
    size = sum(x.size for x in jax.tree.leaves(params))
    return kernels.ppo_grads.FlatLayout(
        (*a1, *a2, *a3),
        (*c1, *c2, *c3),
        w1.shape[0],
        (w1.shape[1], w2.shape[1]),
        head.shape[1],
        size,
    )


def fused_flat_grads(flat_params, batch, *, layout, hparams, agent: Config, backend: str):
    """(grads, ||grads||^2, stats) of `minibatch_loss` with respect to the flat parameter vector
    (`ravel_pytree` of the categorical actor-critic of two separate two-layer torsos, laid out as
    `fused_layout` says), from the fused kernel on `backend`: the same numbers as jax.grad (up to
    float rounding), computed on the vector itself."""
    trans, advantages, targets = batch
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
        layout,
        hparams["clip_eps"],
        hparams["vf_clip_eps"],
        hparams["ent_coef"],
        hparams["vf_coef"],
        activation=agent.network.activation,
        clip_value_loss=agent.clip_value_loss,
        backend=backend,
    )


# ---------------------------------------------------------------- the training program


class Setup(NamedTuple):
    """What the compiled program is built from, fixed per make_trainer."""

    agent: Config
    env: Any
    env_params: Any
    reset: Any  # vmapped env.reset
    step: Any  # vmapped env.step
    net: networks.Network
    distribution: str  # losses.DISTRIBUTIONS
    backend: str  # kernel backend (`environment.kernel_backend`): a name, or "auto" for each op's own choice
    fused: bool  # minibatch gradient from the fused kernel
    deterministic: bool = False  # kernels.deterministic: fixed-order GAE scan


class Transition(NamedTuple):
    """One rollout step as acting records it (values come afterwards, in one batch)."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array


def init_state(s: Setup, key, hparams):
    """Fresh params, optimiser state and envs (`num_envs` resets), the PRNG key and the counters."""
    key, net_key, reset_key = jax.random.split(key, 3)
    obs, env_state = s.reset(jax.random.split(reset_key, s.agent.num_envs), s.env_params)
    net_params = s.net.init(net_key, obs[0])
    obs_stats = (
        observation_norm.initial_observation_stats(obs.shape[1:]) if s.agent.normalize_obs else None
    )
    return {
        "params": policy_params(s.agent, net_params, obs_stats),
        "opt_state": loop.ppo_optimizer(s.agent, hparams).init(ravel_pytree(net_params)[0]),
        "obs": obs,
        "env_state": env_state,
        "key": key,
        "step": jnp.int32(0),
        "update": jnp.int32(0),
    }


def rollout(s: Setup, params, obs, env_state, key):
    """num_steps steps of every env under the policy; (obs, env_state, Transition [T, E, ...], the
    episodes that ended as `episodes.EpisodeTotals` per env [E], counted as the rollout goes rather than
    stacked per step). Acting needs log pi(a|s) alone, in plain JAX: XLA fuses it into the policy's
    last layer, where a kernel launch per env step would cost more than it saves (the kernels serve
    the loss). Each step's Transition is stored as one packed row (`collection.scan_packed_outputs`: one
    write per step instead of one per field; the same arrays)."""

    def env_step(carry, keys):
        params, obs, env_state, ended = carry
        act_key, env_keys = keys
        policy, _ = apply_policy(s, params, obs)
        action = loop.sample_action(policy, act_key, s.distribution)
        log_prob, _ = losses.policy_log_prob_entropy(
            policy, action, s.distribution, backend="reference"
        )
        next_obs, env_state, reward, terminated, truncated, info = s.step(
            env_keys, env_state, loop.env_action(action, s.distribution), s.env_params
        )
        ended = episodes.count_episodes(ended, info)
        return (params, next_obs, env_state, ended), Transition(
            obs, action, log_prob, reward, terminated, truncated, info["final_obs"]
        )

    keys = collection.rollout_keys(key, s.agent.num_steps, s.agent.num_envs)
    carry = (params, obs, env_state, episodes.no_episodes((s.agent.num_envs,)))
    (_, obs, env_state, ended), traj = collection.scan_packed_outputs(
        env_step, carry, keys, unroll=min(s.agent.unroll, s.agent.num_steps)
    )
    return obs, env_state, traj, ended


def gae_cuts(agent: Config, truncated):
    """Where GAE's advantage chain stops besides episode ends: `truncated` [num_steps, num_envs], or'd
    with the last step of every `agent.gae_horizon`-step segment when that is set."""
    if not agent.gae_horizon:
        return truncated
    segment_end = (jnp.arange(truncated.shape[0]) + 1) % agent.gae_horizon == 0
    return truncated | segment_end[:, None]


def learn_batch(s: Setup, hparams, params, traj: Transition):
    """(LearnBatch, advantages, targets), flattened to [num_envs * num_steps, ...]: V(s_t) and
    V(final_obs_t) in a critic pass each, then truncation-aware GAE on the scaled rewards. The batch's
    observations are what the network reads (normalised with `agent.normalize_obs`)."""
    net_params = network_params(s.agent, params)
    obs = network_input(s.agent, params, traj.obs)
    _, values = s.net.apply(net_params, obs)
    _, final_values = s.net.apply(net_params, network_input(s.agent, params, traj.final_obs))
    traj = traj._replace(obs=obs)
    advantages, targets = losses.truncation_aware_gae(
        traj.reward * hparams["reward_scale"],
        values,
        final_values,
        traj.terminated,
        gae_cuts(s.agent, traj.truncated),
        hparams["gamma"],
        hparams["gae_lambda"],
        backend=s.backend,
        deterministic=s.deterministic,
    )
    data = (LearnBatch(traj.obs, traj.action, traj.log_prob, values), advantages, targets)
    return jax.tree.map(lambda x: x.reshape((s.agent.batch_size,) + x.shape[2:]), data)


class SegmentBatch(NamedTuple):
    """What the minibatch loss of `agent.minibatch_advantages` reads of a step: the network's inputs
    at s_t and final_obs_t, the action, the behaviour policy's log-prob and value (only with
    `agent.clip_value_loss`, else None), the scaled reward and the episode-end flags."""

    obs: jax.Array
    final_obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array | None
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array


def segments(x, horizon: int):
    """[T, N, ...] -> [(T / H) N, H, ...]: row k N + n holds steps k H, ..., k H + H - 1 of env n."""
    t, n = x.shape[:2]
    x = x.reshape((t // horizon, horizon, n) + x.shape[2:])
    return jnp.swapaxes(x, 1, 2).reshape((t // horizon * n, horizon) + x.shape[3:])


def segment_batch(s: Setup, hparams, params, traj: Transition) -> SegmentBatch:
    """The rollout as `agent.gae_horizon`-step segments (`segments`) of `SegmentBatch`, for minibatches
    that compute their own advantages; the observations are what the network reads."""
    obs = network_input(s.agent, params, traj.obs)
    value = (
        s.net.apply(network_params(s.agent, params), obs)[1] if s.agent.clip_value_loss else None
    )
    data = SegmentBatch(
        obs,
        network_input(s.agent, params, traj.final_obs),
        traj.action,
        traj.log_prob,
        value,
        traj.reward * hparams["reward_scale"],
        traj.terminated,
        traj.truncated,
    )
    return jax.tree.map(lambda x: segments(x, s.agent.gae_horizon), data)


def segment_minibatch_loss(s: Setup, params, minibatch: SegmentBatch, hparams):
    """(L, stats) of a minibatch of whole segments [m, H]: V(s_t) and V(final_obs_t) under `params`,
    truncation-aware GAE within each segment from them (held fixed: no gradient flows through the
    advantages or targets), then `loop.ppo_minibatch_loss` (V_old = V where the value loss is unclipped)."""
    policy, values = s.net.apply(params, minibatch.obs)
    _, final_values = s.net.apply(params, minibatch.final_obs)
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
    old_values = jax.lax.stop_gradient(values) if minibatch.value is None else minibatch.value
    return loop.ppo_minibatch_loss(
        policy,
        values,
        minibatch.action,
        minibatch.log_prob,
        old_values,
        advantages,
        targets,
        hparams,
        s.agent,
        s.distribution,
        s.backend,
    )


def learn(s: Setup, hparams, params, opt_state, batch, key, refresh=None):
    """num_epochs passes of shuffled minibatch Adam steps over the batch (`loop.flat_minibatch_epochs`):
    transitions, or whole segments with `agent.minibatch_advantages`; the gradient from autodiff or
    the fused kernel; `refresh(params, batch) -> batch` (optional) gives
    each epoch after the first its batch. Returns (params, opt_state, stats [epochs, minibatches])."""

    def grads(params, minibatch):
        if s.agent.minibatch_advantages:
            loss = lambda p: segment_minibatch_loss(s, p, minibatch, hparams)
        else:
            loss = lambda p: minibatch_loss(
                s.net, p, minibatch, hparams, s.agent, s.distribution, s.backend
            )
        (_, stats), g = jax.value_and_grad(loss, has_aux=True)(params)
        return g, stats

    flat_grads = None
    if s.fused:
        flat_grads = partial(
            fused_flat_grads,
            layout=fused_layout(params),
            hparams=hparams,
            agent=s.agent,
            backend=s.backend,
        )
    return loop.flat_minibatch_epochs(
        s.agent,
        loop.ppo_optimizer(s.agent, hparams),
        grads,
        params,
        opt_state,
        batch,
        key,
        refresh,
        flat_grads,
    )


def update(s: Setup, hparams, state, totals: episodes.EpisodeTotals):
    """One PPO update: rollout, observation statistics (with `agent.normalize_obs`), advantages,
    learning. Returns (state, totals, mean loss stats)."""
    key, rollout_key, shuffle_key = jax.random.split(state["key"], 3)
    params = state["params"]
    obs, env_state, traj, ended = rollout(s, params, state["obs"], state["env_state"], rollout_key)
    totals = episodes.add_totals(totals, ended)
    obs_stats = (
        observation_norm.update_observation_stats(params["obs_stats"], traj.obs, traj.obs.shape[2:])
        if s.agent.normalize_obs
        else None
    )
    params = policy_params(s.agent, network_params(s.agent, params), obs_stats)
    if (
        s.agent.minibatch_advantages
    ):  # whole segments; each minibatch's loss computes their advantages
        batch = segment_batch(s, hparams, params, traj)
    else:
        batch = learn_batch(s, hparams, params, traj)
    refresh = None
    if (
        s.agent.recompute_advantages
    ):  # every epoch's batch from its current network (the first epoch's is `batch`)
        refresh = lambda net_params, batch: learn_batch(
            s, hparams, policy_params(s.agent, net_params, obs_stats), traj
        )
    net_params, opt_state, stats = learn(
        s, hparams, network_params(s.agent, params), state["opt_state"], batch, shuffle_key, refresh
    )
    state = {
        "params": policy_params(s.agent, net_params, obs_stats),
        "opt_state": opt_state,
        "obs": obs,
        "env_state": env_state,
        "key": key,
        "step": state["step"] + s.agent.batch_size,
        "update": state["update"] + 1,
    }
    return state, totals, jax.tree.map(jnp.mean, stats)


def evaluate(s: Setup, params, key):
    """Mean return and length of the first episode of `eval_envs` fresh envs under the greedy policy."""
    act = lambda obs: loop.env_action(
        loop.greedy_action(apply_policy(s, params, obs)[0], s.distribution), s.distribution
    )
    returns, lengths = greedy_episodes(s.env, s.env_params, act, key, s.agent.eval_envs)
    return returns.mean(), lengths.mean()


def make_trainer(config) -> Trainer:
    agent = config.agent
    env, env_params = environment.make_env(config)
    net, distribution = make_network(agent, env, env_params)
    backend = environment.kernel_backend(config)
    fused = (
        agent.fused_update
        and kernels.resolve_backend(backend) in ("triton", "interpret")
        and fused_update_unfit_reason(config, env, env_params) is None
    )
    s = Setup(
        agent,
        env,
        env_params,
        *environment.batched(env),
        net,
        distribution,
        backend,
        fused,
        config.kernels.deterministic,
    )
    return loop.on_policy_trainer(
        agent, partial(init_state, s), partial(update, s), partial(evaluate, s)
    )


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action` in the env's own action space: the argmax of the logits,
    or the Gaussian mean (squashed by tanh for the tanh Gaussian), clipped and mapped to the Box
    bounds (the key is unused)."""
    agent = config.agent
    env, env_params = environment.make_env(config)
    net, distribution = make_network(agent, env, env_params)

    def policy(params, obs, key):
        logits_or_gaussian = net.apply(
            network_params(agent, params), network_input(agent, params, obs)
        )[0]
        return environment.to_env_action(
            env,
            env_params,
            loop.env_action(loop.greedy_action(logits_or_gaussian, distribution), distribution),
        )

    return policy
