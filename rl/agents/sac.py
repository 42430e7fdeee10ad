"""Soft Actor-Critic (SAC; Haarnoja et al. 2018) with twin Q-networks, Polyak targets and automatic
temperature tuning, compiled end to end; continuous (tanh-squashed Gaussian) and discrete
(categorical; Christodoulou 2019) actions.

Every phase the `num_envs` envs take one step (uniformly random actions for the first
`learning_starts` env steps), the transitions (s, a, r, s' = info["final_obs"], terminated) go to
a uniform replay buffer, and then `utd_ratio * num_envs` gradient steps follow, each on a fresh
minibatch (`rl.config.loops.ReplayActorCriticConfig`, pieces from `rl.agents.actor_critic`). With
alpha = exp(log_alpha) and Q = min(Q1, Q2):

    critic:  y = r + gamma (1 - terminated) V(s'),
             L_Q = sum_i mean((Q_i(s, a) - y)^2) / 2                          (y fixed)
    actor:   L_pi = mean(alpha log pi(a|s) - Q(s, a))
    alpha:   L_alpha = log_alpha (H(pi) - target_entropy)                     (H fixed)
    targets: theta_targ <- tau theta + (1 - tau) theta_targ

Truncation is not termination: only `terminated` zeroes the bootstrap, and s' is the observation
actually reached (before auto-reset), so a time-limit end still bootstraps.

Continuous (`TanhGaussian`): u ~ N(mu(s), sigma(s)^2), a = tanh(u) in (-1, 1)^|A|
(the env's `RescaleAction` maps it affinely onto the bounds), V(s') = Q_targ(s', a') - alpha log
pi(a'|s') for a' ~ pi(s'), a in L_pi a reparameterised sample, H = -log pi(a|s), target entropy
-target_entropy_scale |A| (`losses.soft_value`, `losses.sac_actor_loss`).

Discrete (`Categorical`): pi = softmax(logits); expectations over actions replace
sampling: V(s') = sum_a' pi(a'|s') (Q_targ(s', a') - alpha log pi(a'|s')),
L_pi = mean(sum_a pi(a|s) (alpha log pi(a|s) - Q(s, a))), H = -sum_a pi log pi, target entropy
target_entropy_scale log|A| (`losses.soft_value_discrete`, `losses.sac_actor_loss_discrete`).

Sweepable hyperparameters (lr, alpha_lr, gamma, tau, init_alpha, target_entropy_scale,
max_grad_norm) are read from `hparams` inside the compiled program.

With continuous actions and `fused_network` on a Triton kernel backend (`rl.fused.critic`), the
twin critics and their target are one flat vector each: a critic step's targets (on a' ~ pi(s') and
the bonus -alpha log pi(a'|s') drawn here), losses and backward are one `kernels.twin_q_grads_flat`
launch, and Adam and the Polyak target update the vector in one fused step each; the actor's step
(its forward, the sample and its log-probability, both critics' forwards and their backward to
the action, its backward) is one `kernels.sac_actor_grads_flat` launch on the raveled actor params.

CrossQ (Bhatt et al. 2024; `agent.target_networks: false`, with `agent.network.batch_renorm`, as
`configs/crossq_pendulum.yaml`): no target critics; one pass of the online critics in training mode
over the concatenated batch [(s, a); (s', a')], a' ~ pi(s'), gives Q(s, a) and, held fixed,
V(s') = min(Q1, Q2)(s', a') - alpha log pi(a'|s') (`actor_critic.joint_q_values`), so the critics'
batch statistics are those of both; the running statistics are `State.critic_stats`, and the
actor's loss reads the critics by them. With `agent.policy_delay` k > 1 the actor and temperature
step every k-th critic step (CrossQ: 3). SimbaV2 (`agent.network.torso: simbav2`, `rl.nn.simbav2`):
after each actor and critic step the hyperspherical weights are projected back onto the sphere.

FastSAC (`rl.agents.fast_recipe`, continuous actions for the first): `agent.distributional` C51 twin
critics (`rl.nn.distributional`; the bonus -alpha log pi(a'|s') enters the target value before the
projection), `agent.n_step` returns that stop at termination and bootstrap at truncation,
`agent.normalize_obs` (`State.obs_stats`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from envs.spaces import Box
from rl.agents import actor_critic, fast_recipe
from rl.agents.trainer import Trainer, train_from_trainer
from rl.config.loops import ReplayActorCriticConfig
from rl.config.parsing import ConfigError, hp
from rl.config.unrolling import unroll_of
from rl.core import collection, environment, losses, optimizers
from rl.core.log_points import log_point_metrics, scan_log_points
from rl.core.state import Envs
from rl.fused import critic as fused_critic
from rl.nn import distributional, networks, simbav2
from rl.nn.layers import Network
from rl.nn.network_config import ActorCriticNetworkConfig, actor_critic_network_config
from rl.nn.networks import Categorical, TanhGaussian
from rl.replay import buffers


@dataclass(frozen=True)
class Config(fast_recipe.RecipeConfig, ReplayActorCriticConfig):
    """SAC's settings: the replay actor-critic loop's, the temperature's (initial value, Adam step,
    target entropy) and the squashed Gaussian's log-std bounds."""

    name: str = "sac"
    alpha_lr: float = hp(1e-3, low=0.0, low_open=True, sweep=True, doc="Adam step of log alpha")
    init_alpha: float = hp(1.0, low=0.0, low_open=True, sweep=True, doc="initial temperature")
    autotune_alpha: bool = hp(
        True, doc="tune alpha toward the target entropy (else alpha stays init_alpha)"
    )
    target_entropy_scale: float = hp(
        1.0, sweep=True, doc="target entropy = -scale*|A| (continuous) or scale*log|A| (discrete)"
    )
    policy_delay: int = hp(1, low=1, doc="critic steps per actor and temperature step (CrossQ: 3)")
    network: ActorCriticNetworkConfig = actor_critic_network_config(
        hidden=(256, 256), activation="relu"
    )
    log_std_min: float = hp(-5.0, doc="lower bound of the policy's log-std (continuous)")
    log_std_max: float = hp(2.0, doc="upper bound of the policy's log-std (continuous)")
    fused_network: bool = hp(
        True,
        doc="take the critic and actor steps through the fused kernels, the twin critics as one "
        "flat parameter vector (rl.fused.critic), when the actions are continuous, the kernel "
        "backend is triton/interpret (auto: on a GPU) and the networks fit them (MLPs of two "
        "tanh, relu or silu hidden layers within kernels.twin_q_grads.LIMITS, with target "
        "critics: not SimbaV2's or CrossQ's); else the network's apply and autodiff",
    )

    def validate(self):
        super().validate()
        if self.log_std_min >= self.log_std_max:
            raise ConfigError(
                f"agent.log_std_min ({self.log_std_min}) must be below agent.log_std_max "
                f"({self.log_std_max})"
            )


def check_env(config, env, env_params) -> None:
    """SAC needs Box observations and bounded Box (or Discrete) actions; CrossQ's joint pass
    (agent.target_networks: false) Box actions; FastSAC's options their own
    (`fast_recipe.check`)."""
    environment.check_bounded_actions(config, env, env_params, discrete_ok=True)
    fast_recipe.check(config, env, env_params)
    if not config.agent.target_networks and not isinstance(env.action_space(env_params), Box):
        raise ConfigError(
            f"agent.target_networks: false (CrossQ) needs Box actions; {config.env.id} has "
            "discrete ones: set agent.target_networks: true"
        )


class State(NamedTuple):
    """SAC's training state: the actor (`params`, what `make_policy` reads), the twin critics, their
    target copy (None without target networks: CrossQ) and their running statistics (batch
    renormalisation's, `rl.nn.batch_renorm`; {} for critics without), the optimiser states {"actor",
    "critic", "log_alpha"}, log alpha, the replay buffer, the envs, the PRNG key, env steps and
    gradient steps so far, the running observation statistics (`agent.normalize_obs`, else
    None)."""

    params: Any
    critic_params: Any
    target_critic_params: Any
    critic_stats: Any
    opt_state: dict
    log_alpha: jax.Array
    buffer: buffers.UniformBuffer
    envs: Envs
    key: jax.Array
    step: jax.Array
    updates: jax.Array
    obs_stats: Any = None


# ---------------------------------------------------------------- losses of one minibatch


def next_action_and_bonus(actor, actor_params, alpha, next_obs, key):
    """(a', -alpha log pi(a'|s')) for a' ~ pi(s'): the sample and entropy bonus of the soft value
    V(s') = min(Q1', Q2')(s', a') - alpha log pi(a'|s') (`losses.soft_value`)."""
    next_policy = TanhGaussian.from_head(actor(actor_params, next_obs))
    next_action, next_log_prob = next_policy.squashed_sample(key)
    return next_action, -alpha * next_log_prob


def continuous_losses(actor, critic):
    """`critic_loss(critic_params, actor_params, target_params, alpha, batch, key, gamma) -> (L_Q,
    mean Q1)` and `actor_loss(actor_params, critic_params, alpha, batch, key) -> (L_pi, H)` for a
    squashed Gaussian policy, H = -mean log pi(a|s) of the sampled actions; `actor(params, obs)`
    and `critic(params, obs, action)` are the networks' apply functions."""

    def critic_loss(critic_params, actor_params, target_params, alpha, batch, key, gamma):
        next_action, bonus = next_action_and_bonus(
            actor, actor_params, alpha, batch["next_obs"], key
        )
        next_value = jnp.minimum(*critic(target_params, batch["next_obs"], next_action)) + bonus
        target = losses.q_learning_target(
            batch["reward"], fast_recipe.bootstrap_discount(gamma, batch), next_value
        )
        q1, q2 = critic(critic_params, batch["obs"], batch["action"])
        return losses.twin_q_loss(q1, q2, target), jnp.mean(q1)

    def actor_loss(actor_params, critic_params, alpha, batch, key):
        policy = TanhGaussian.from_head(actor(actor_params, batch["obs"]))
        action, log_prob = policy.squashed_sample(key)
        q1, q2 = critic(critic_params, batch["obs"], action)
        return losses.sac_actor_loss(log_prob, q1, q2, alpha), -jnp.mean(log_prob)

    return critic_loss, actor_loss


def distributional_losses(actor, critic, z, backend=None):
    """The pair for FastSAC's distributional twin critics (`rl.nn.distributional`; `critic(params,
    obs, action) -> (logits_1, logits_2)`): the bonus -alpha log pi(a'|s') enters the target value
    before the projection, m = Phi(R + d (z - alpha log pi(a'|s'))); the actor's loss is
    `continuous_losses`' on the expected values."""
    _, actor_loss = continuous_losses(actor, distributional.twin_values(critic, z, backend=backend))

    def critic_loss(critic_params, actor_params, target_params, alpha, batch, key, gamma):
        next_action, bonus = next_action_and_bonus(
            actor, actor_params, alpha, batch["next_obs"], key
        )
        discount = fast_recipe.bootstrap_discount(gamma, batch)
        return distributional.critic_loss(
            critic, z, critic_params, target_params, batch, next_action, bonus, discount,
            backend=backend,
        )  # fmt: skip

    return critic_loss, actor_loss


def discrete_losses(actor, critic):
    """The same pair for a categorical policy (`critic(params, obs) -> (q1, q2)`, each [..., A]):
    expectations over actions, no sampling (the keys are unused); H = mean over the batch of
    -sum_a pi(a|s) log pi(a|s)."""

    def critic_loss(critic_params, actor_params, target_params, alpha, batch, key, gamma):
        next_log_pi = jax.nn.log_softmax(actor(actor_params, batch["next_obs"]))
        next_value = losses.soft_value_discrete(
            next_log_pi, *critic(target_params, batch["next_obs"]), alpha
        )
        target = losses.q_learning_target(
            batch["reward"], fast_recipe.bootstrap_discount(gamma, batch), next_value
        )
        q1, q2 = (
            losses.action_value(q, batch["action"]) for q in critic(critic_params, batch["obs"])
        )
        return losses.twin_q_loss(q1, q2, target), jnp.mean(q1)

    def actor_loss(actor_params, critic_params, alpha, batch, key):
        log_pi = jax.nn.log_softmax(actor(actor_params, batch["obs"]))
        entropy = -jnp.sum(jnp.exp(log_pi) * log_pi, axis=-1)
        loss = losses.sac_actor_loss_discrete(log_pi, *critic(critic_params, batch["obs"]), alpha)
        return loss, jnp.mean(entropy)

    return critic_loss, actor_loss


def without_stats(critic_loss, actor_loss):
    """A pair of losses of critics without running statistics, in the signatures the loop calls:
    `critic_loss(critic_params, critic_stats, actor_params, target_params, alpha, batch, key,
    gamma) -> (L_Q, (mean Q1, critic_stats))` and `actor_loss(actor_params, critic_params,
    critic_stats, alpha, batch, key) -> (L_pi, H)`; the statistics ({}) pass through."""

    def critic(critic_params, critic_stats, *args):
        loss, q_mean = critic_loss(critic_params, *args)
        return loss, (q_mean, critic_stats)

    def actor(actor_params, critic_params, critic_stats, *args):
        return actor_loss(actor_params, critic_params, *args)

    return critic, actor


def joint_losses(actor, critic):
    """CrossQ's pair, in `without_stats`'s signatures (`critic` a `StatefulNetwork`; the target
    params are unused): y = r + gamma (1 - terminated) (min(Q1, Q2)(s', a') - alpha log pi(a'|s'))
    from the joint pass (`actor_critic.joint_q_values`), which returns the updated statistics; the
    actor's loss reads the critics by their running statistics."""

    def critic_loss(critic_params, critic_stats, actor_params, _, alpha, batch, key, gamma):
        next_action, bonus = next_action_and_bonus(
            actor, actor_params, alpha, batch["next_obs"], key
        )
        (q1, q2), next_q, stats = actor_critic.joint_q_values(
            critic, critic_params, critic_stats, batch, next_action
        )
        target = losses.q_learning_target(
            batch["reward"],
            fast_recipe.bootstrap_discount(gamma, batch),
            jnp.minimum(*next_q) + bonus,
        )
        return losses.twin_q_loss(q1, q2, target), (jnp.mean(q1), stats)

    def actor_loss(actor_params, critic_params, critic_stats, alpha, batch, key):
        values = partial(actor_critic.eval_q_values, critic, stats=critic_stats)
        _, loss = continuous_losses(actor, lambda p, o, a: values(p, obs=o, action=a))
        return loss(actor_params, critic_params, alpha, batch, key)

    return critic_loss, actor_loss


# ---------------------------------------------------------------- continuous or discrete


class Variant(NamedTuple):
    """What SAC's loop reads off the env's action space (`make_variant`)."""

    actor: Network  # (mean, log_std) of the pre-tanh Gaussian, or logits
    critic: Any  # the twin critics: a Network, or a StatefulNetwork (CrossQ)
    distribution: type  # TanhGaussian or Categorical
    init_critic: Callable  # (key, obs) -> (twin critic params, their running statistics)
    example_action: Any  # one action, for shapes
    critic_loss: Callable  # `without_stats`'s signature: continuous, discrete or joint losses
    actor_loss: Callable  # from the same
    entropy_unit: float  # target entropy / target_entropy_scale: -|A|, or log|A|
    project: Callable  # params -> params after an optimiser step (SimbaV2's sphere; else as is)


def make_variant(agent: Config, env, env_params, backend: str | None = None) -> Variant:
    """A squashed Gaussian policy and critics reading concat(obs, action) for Box actions (with
    CrossQ's joint losses and critics keeping running statistics where there are no target
    networks, or FastSAC's distributional critics, their projection on the kernel `backend`); a
    categorical policy and critics with one Q per action for Discrete ones."""
    space, obs_space = env.action_space(env_params), env.observation_space(env_params)
    project = simbav2.project if agent.network.torso == "simbav2" else (lambda params: params)
    if isinstance(space, Box):
        action_dim = int(np.prod(space.shape))
        head = networks.squashed_gaussian_head(action_dim, agent.log_std_min, agent.log_std_max)
        actor, critic = actor_critic.actor_and_twin_critic(agent.network, obs_space, head)
        example = np.zeros(space.shape, np.float32)
        if agent.distributional:
            critic = distributional.twin_critic(agent.network, agent.num_atoms)
            z = distributional.support(agent.v_min, agent.v_max, agent.num_atoms)
            init_critic = lambda key, obs: (critic.init(key, obs, example), {})
            pair = without_stats(*distributional_losses(actor.apply, critic.apply, z, backend))
        elif not agent.target_networks:
            critic = actor_critic.joint_twin_critic(agent.network)
            init_critic = lambda key, obs: critic.init(key, obs, example)
            pair = joint_losses(actor.apply, critic)
        else:
            init_critic = lambda key, obs: (critic.init(key, obs, example), {})
            pair = without_stats(*continuous_losses(actor.apply, critic.apply))
        return Variant(
            actor, critic, TanhGaussian, init_critic, example, *pair, -action_dim, project
        )
    num_actions = int(space.n)
    head = networks.categorical_policy_head(num_actions)
    actor, critic = actor_critic.actor_and_twin_critic(agent.network, obs_space, head, num_actions)
    pair = without_stats(*discrete_losses(actor.apply, critic.apply))
    unit = math.log(num_actions)
    init_critic = lambda key, obs: (critic.init(key, obs), {})
    return Variant(actor, critic, Categorical, init_critic, np.int32(0), *pair, unit, project)


def greedy_action(variant: Variant, params, obs):
    """The deterministic action: tanh of the Gaussian mean, or the most likely action."""
    policy = variant.distribution.from_head(variant.actor.apply(params, obs))
    return policy.env_action(policy.mode())


def make_optimizers(hparams, b1: float = 0.9):
    """(actor, critic, log alpha) optimisers: Adam (first-moment decay `b1`) on clipped gradients
    for the networks, plain Adam for log alpha."""
    clipped = optimizers.clipped_adam(hparams["lr"], hparams["max_grad_norm"], b1=b1)
    return clipped, clipped, optax.adam(hparams["alpha_lr"])


# ---------------------------------------------------------------- learning, without the envs


class Learning(NamedTuple):
    """What SAC's learning reads (`make_learning`): the networks and losses (`Variant`), and the
    fused critic and actor setups (`rl.fused.critic`; None where the steps go through apply and
    autodiff)."""

    variant: Variant
    fused: Any
    fused_actor: Any


def make_learning(config, env, env_params) -> Learning:
    """The variant of the env's action space, with the twin critics as one flat vector and the
    fused actor step where `rl.fused.critic.for_agent` says the kernels run them."""
    agent = config.agent
    variant = make_variant(agent, env, env_params, environment.kernel_backend(config))
    if agent.distributional:  # atoms the fused kernels do not hold: through XLA
        return Learning(variant, None, None)
    fused = fused_critic.for_agent(config, env, env_params, variant.critic)
    if fused is None:
        return Learning(variant, None, None)
    # the critics are a flat vector: the actor's loss reads them unraveled
    critic_apply = partial(fused_critic.twin_q_values, fused)
    _, actor_loss_fn = without_stats(*continuous_losses(variant.actor.apply, critic_apply))
    init_critic = lambda key, obs: (
        fused_critic.init(fused, key, obs, variant.example_action),
        {},
    )
    variant = variant._replace(init_critic=init_critic, actor_loss=actor_loss_fn)
    example_obs = jnp.zeros(env.observation_space(env_params).shape, jnp.float32)
    return Learning(
        variant, fused, fused_critic.squashed_gaussian_actor(fused, variant.actor, example_obs)
    )


def init_learning(
    agent: Config, learning: Learning, hparams, actor_key, critic_key, obs, envs, key
):
    """A `State` before any step: the actor from `actor_key`, the twin critics from `critic_key`
    (with their running statistics) and their target copy (None without target networks), log
    alpha = log init_alpha, the three optimiser states, an empty buffer of `agent.buffer_size`
    transitions shaped like one observation `obs`; `envs` and `key` as given (None where the envs
    are stepped elsewhere: rl.sebulba)."""
    variant = learning.variant
    params = variant.actor.init(actor_key, obs)
    critic_params, critic_stats = variant.init_critic(critic_key, obs)
    log_alpha = jnp.log(hparams["init_alpha"]).astype(jnp.float32)
    actor_opt, critic_opt, alpha_opt = make_optimizers(hparams, agent.adam_b1)
    opt_state = {
        "actor": actor_opt.init(params),
        "critic": critic_opt.init(critic_params),
        "log_alpha": alpha_opt.init(log_alpha),
    }
    buffer = actor_critic.empty_buffer(obs, variant.example_action, agent.buffer_size)
    if agent.n_step > 1:  # n-step transitions: with the steps each bootstraps ahead
        example = fast_recipe.example_transition(obs, variant.example_action)
        buffer = buffers.uniform_init(example, agent.buffer_size)
    counters = jnp.int32(0), jnp.int32(0)
    target = critic_params if agent.target_networks else None
    return State(
        params,
        critic_params,
        target,
        critic_stats,
        opt_state,
        log_alpha,
        buffer,
        envs,
        key,
        *counters,
        fast_recipe.initial_obs_stats(agent, obs),
    )


def make_gradient_step(agent: Config, learning: Learning) -> Callable:
    """`gradient_step(hparams, state, key) -> (state, stats)`: on one uniformly sampled minibatch,
    the critics; then, every `policy_delay`-th step (else their statistics read NaN), the actor
    (against the new critics) and log alpha (if autotuned); then the Polyak targets (if any)."""
    variant, fused, fused_actor = learning
    actor = variant.actor

    def actor_and_temperature(hparams, state: State, batch, alpha, key):
        """The actor's step against the critics of `state`, then log alpha's: (state, (L_pi, H))."""
        actor_opt, _, alpha_opt = make_optimizers(hparams, agent.adam_b1)
        if fused_actor is None:
            (actor_loss, entropy), grads = jax.value_and_grad(variant.actor_loss, has_aux=True)(
                state.params, state.critic_params, state.critic_stats, alpha, batch, key
            )
            sq_norm = None
        else:  # the same draws as TanhGaussian.squashed_sample(key)
            eps = jax.random.normal(key, batch["action"].shape)
            grads, sq_norm, stats = fused_critic.sac_actor_grads(
                fused, fused_actor, state.params, state.critic_params, batch["obs"], eps, alpha,
                (agent.log_std_min, agent.log_std_max),
            )  # fmt: skip
            actor_loss, entropy = stats["loss"], stats["entropy"]
        params, actor_state = actor_critic.optimizer_step(
            actor_opt, grads, state.opt_state["actor"], state.params, sq_norm
        )
        # the temperature, toward the target entropy
        log_alpha, alpha_state = state.log_alpha, state.opt_state["log_alpha"]
        if agent.autotune_alpha:
            entropy_target = hparams["target_entropy_scale"] * variant.entropy_unit
            grad = jax.grad(losses.temperature_loss)(log_alpha, entropy, entropy_target)
            log_alpha, alpha_state = actor_critic.optimizer_step(
                alpha_opt, grad, alpha_state, log_alpha
            )
        opt_state = {**state.opt_state, "actor": actor_state, "log_alpha": alpha_state}
        state = state._replace(
            params=variant.project(params), log_alpha=log_alpha, opt_state=opt_state
        )
        return state, (actor_loss, entropy)

    def gradient_step(hparams, state: State, key):
        _, critic_opt, _ = make_optimizers(hparams, agent.adam_b1)
        sample_key, critic_key, actor_key = jax.random.split(key, 3)
        batch, _ = buffers.uniform_sample(state.buffer, sample_key, agent.batch_size)
        batch = fast_recipe.normalized_batch(batch, state.obs_stats, agent.obs_clip)
        alpha = jnp.exp(state.log_alpha)
        # the critics, toward y = r + gamma (1 - terminated) V(s')
        if fused is None:
            (critic_loss, (q_mean, critic_stats)), grads = jax.value_and_grad(
                variant.critic_loss, has_aux=True
            )(
                state.critic_params,
                state.critic_stats,
                state.params,
                state.target_critic_params,
                alpha,
                batch,
                critic_key,
                hparams["gamma"],
            )
            sq_norm = None
        else:
            next_action, bonus = next_action_and_bonus(
                actor.apply, state.params, alpha, batch["next_obs"], critic_key
            )
            grads, sq_norm, stats = fused_critic.critic_grads(
                fused, state.critic_params, state.target_critic_params, batch,
                fast_recipe.bootstrap_discount(hparams["gamma"], batch), next_action, bonus,
            )  # fmt: skip
            critic_loss, q_mean, critic_stats = stats["loss"], stats["q_mean"], state.critic_stats
        critic_params, critic_state = actor_critic.optimizer_step(
            critic_opt, grads, state.opt_state["critic"], state.critic_params, sq_norm
        )
        state = state._replace(
            critic_params=variant.project(critic_params),
            critic_stats=critic_stats,
            opt_state={**state.opt_state, "critic": critic_state},
            updates=state.updates + 1,
        )
        # the actor and the temperature, against the new critics
        delayed = partial(actor_and_temperature, hparams)
        if agent.policy_delay == 1:
            state, (actor_loss, entropy) = delayed(state, batch, alpha, actor_key)
        else:
            skip = lambda state, *_: (state, (jnp.float32(jnp.nan), jnp.float32(jnp.nan)))
            due = state.updates % agent.policy_delay == 0
            state, (actor_loss, entropy) = collection.cond(
                due, delayed, skip, state, batch, alpha, actor_key
            )
        # the Polyak targets
        if agent.target_networks:
            state = state._replace(
                target_critic_params=optimizers.polyak(
                    state.target_critic_params, state.critic_params, hparams["tau"]
                )
            )
        stats = {"critic_loss": critic_loss, "actor_loss": actor_loss, "q_mean": q_mean}
        return state, {**stats, "entropy": entropy}

    return gradient_step


# ---------------------------------------------------------------- the loop


def make_trainer(config) -> Trainer:
    agent = config.agent
    env, env_params = environment.make_env(config)
    learning = make_learning(config, env, env_params)
    variant, actor = learning.variant, learning.variant.actor
    gradient_step = make_gradient_step(agent, learning)
    store = fast_recipe.make_store(config)  # one-step or n-step transitions

    # ---------------------------------------------------------------- init

    def init(key, hparams) -> State:
        """Actor, twin critics and their target copy, log alpha, three optimiser states, an empty
        buffer, the envs."""
        key, actor_key, critic_key, reset_key = jax.random.split(key, 4)
        envs = actor_critic.reset_envs(env, env_params, reset_key, agent.num_envs)
        envs = fast_recipe.with_windows(agent, envs, variant.example_action)  # n-step windows
        return init_learning(
            agent, learning, hparams, actor_key, critic_key, envs.obs[0], envs, key
        )

    # ---------------------------------------------------------------- act

    def act(hparams, state: State, totals, key):
        """All envs take one step with a sample of the policy (in [-1, 1]^|A| for a Box), or
        uniformly random actions before learning_starts (the policy reading the observations
        normalised by the statistics updated with them, `agent.normalize_obs`); the transitions go
        to the buffer."""
        act_key, env_key = jax.random.split(key)
        policy_key, random_key = jax.random.split(act_key)
        obs_stats = fast_recipe.collect_obs_stats(state.obs_stats, state.envs.obs)
        obs = fast_recipe.normalized(obs_stats, state.envs.obs, agent.obs_clip)
        policy = variant.distribution.from_head(actor.apply(state.params, obs))
        action = policy.env_action(policy.sample(policy_key))
        space = env.action_space(env_params)
        random_action = actor_critic.random_actions(space, random_key, agent.num_envs)
        action = jnp.where(state.step < agent.learning_starts, random_action, action)
        state = state._replace(obs_stats=obs_stats)
        return store(env, env_params, state, totals, action, env_key, hparams=hparams)

    # ---------------------------------------------------------------- act, then train

    def act_then_train(hparams, carry, key):
        """One env step of all envs, then (once learning_starts env steps are stored) the phase's
        gradient steps; their statistics [gradient_steps] read NaN before learning."""
        act_key, train_keys = actor_critic.phase_keys(key, agent.gradient_steps)
        state, totals = act(hparams, *carry, act_key)
        started = state.step >= agent.learning_starts
        step = partial(gradient_step, hparams)
        unroll = min(unroll_of(agent), agent.gradient_steps)
        state, stats = collection.scan_when(started, step, state, train_keys, unroll=unroll)
        return (state, totals), stats

    # ---------------------------------------------------------------- log period

    def log_period(hparams, state: State):
        """A log period's phases, then its metrics: env steps, the episodes that ended, the mean
        losses and entropy (NaN-skipping), alpha, and the return of `eval_episodes` episodes of
        `greedy_action`."""
        key, phase_key, eval_key = jax.random.split(state.key, 3)
        state, totals, stats = actor_critic.scan_phases(
            partial(act_then_train, hparams), state._replace(key=key), phase_key, agent
        )
        metrics = log_point_metrics(state.step, totals, stats, jnp.nanmean)
        if agent.eval_episodes:
            stats, clip = state.obs_stats, agent.obs_clip
            policy = lambda obs: greedy_action(
                variant, state.params, fast_recipe.normalized(stats, obs, clip)
            )
            metrics["eval_return"] = actor_critic.eval_return(
                env, env_params, policy, eval_key, agent.eval_episodes
            )
        return state, {**metrics, "alpha": jnp.exp(state.log_alpha)}

    # ---------------------------------------------------------------- run

    def run(state, hparams, num_log_points):
        return scan_log_points(partial(log_period, hparams), state, num_log_points)

    return Trainer(init=init, run=run, num_log_points=agent.num_log_points)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action` in the env's own action space: tanh of the Gaussian mean
    mapped onto the Box bounds, or the argmax of the logits (the key is unused)."""
    env, env_params = environment.make_env(config)
    variant = make_variant(config.agent, env, env_params)
    fast_recipe.check_policy_params(config)
    return lambda params, obs, key: environment.to_env_action(
        env, env_params, greedy_action(variant, params, obs)
    )
