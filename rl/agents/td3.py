"""TD3 (Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic Methods"),
compiled end to end; continuous actions.

The loop (`rl.config.loops.ReplayActorCriticConfig`, pieces from `rl.agents.actor_critic`):
`num_envs` envs take one step with the exploration policy a = clip(mu(s) + N(0,
exploration_noise^2), -1, 1) (uniformly random actions for the first `learning_starts` env steps),
the transitions (s, a, r, s' = info["final_obs"], terminated) go to a uniform replay buffer, and
`utd_ratio * num_envs` gradient steps follow. Each gradient step, on a fresh minibatch:

    target:  a' = clip(mu'(s') + clip(eps, -c, c), -1, 1),  eps ~ N(0, policy_noise^2)  (smoothing)
             y  = r + gamma (1 - terminated) min(Q1', Q2')(s', a')              (clipped double Q)
    critic:  L_Q = (mean (Q1(s, a) - y)^2 + mean (Q2(s, a) - y)^2) / 2
    every `policy_delay` critic steps (delayed policy updates):
    actor:   L_mu = -mean Q1(s, mu(s))
    targets: theta' <- tau theta + (1 - tau) theta'   (actor and critics)

Truncation is not termination: only `terminated` zeroes the bootstrap, and s' is the observation
reached before any auto-reset. Actions live in [-1, 1]^d; `environment.make_env` maps them onto
the env's bounds. Sweepable: lr, gamma, tau, max_grad_norm, exploration_noise, policy_noise,
noise_clip.

With `fused_network` on a Triton kernel backend (`rl.fused.critic`), the twin critics and their
target are one flat vector each: a critic step's targets, losses and backward are one
`kernels.twin_q_grads_flat` launch, and Adam and the Polyak target update the vector in one fused
step each; the actor's step (its forward, Q1's forward and backward to the action, its backward) is
one `kernels.deterministic_policy_grads_flat` launch on the raveled actor params. Off the CPU the
delayed update runs every gradient step and is kept every `policy_delay`-th (`collection.cond`: no
host round trip).

CrossQ (`agent.target_networks: false`, with `agent.network.batch_renorm`): no target actor or
critics; a' = clip(mu(s') + clip(eps, -c, c), -1, 1) from the online actor, and one pass of the
online critics in training mode over [(s, a); (s', a')] gives Q(s, a) and, held fixed,
min(Q1, Q2)(s', a') (`actor_critic.joint_q_values`); the running statistics are
`State.critic_stats`, and the actor's loss reads Q1 by them. SimbaV2 (`agent.network.torso:
simbav2`, `rl.nn.simbav2`): after each actor and critic step the hyperspherical weights are
projected back onto the sphere.

FastTD3 (Seo et al. 2025; `rl.agents.fast_recipe`): `agent.distributional` C51 twin critics
(`rl.nn.distributional`: cross-entropy to the projected target of the twin with the smaller expected
value; the actor maximises min(Q1, Q2) of the expected values), `agent.n_step` returns that stop at
termination and bootstrap at truncation, `agent.normalize_obs` (`State.obs_stats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl.agents import actor_critic, fast_recipe
from rl.agents.trainer import Trainer, train_from_trainer
from rl.config.loops import ReplayActorCriticConfig
from rl.config.parsing import hp
from rl.config.unrolling import unroll_of
from rl.core import collection, environment, losses, optimizers
from rl.core.log_points import log_point_metrics, scan_log_points
from rl.core.state import Envs
from rl.fused import critic as fused_critic
from rl.nn import distributional, networks, simbav2
from rl.nn.network_config import ActorCriticNetworkConfig, actor_critic_network_config
from rl.replay import buffers


@dataclass(frozen=True)
class Config(fast_recipe.RecipeConfig, ReplayActorCriticConfig):
    """TD3's settings: the replay actor-critic loop's, the exploration and target smoothing noise,
    and the policy delay."""

    name: str = "td3"
    exploration_noise: float = hp(
        0.1,
        low=0.0,
        sweep=True,
        doc="std of the Gaussian noise added to acting actions (in [-1, 1] units)",
    )
    policy_noise: float = hp(0.2, low=0.0, sweep=True, doc="std of the target policy smoothing")
    noise_clip: float = hp(
        0.5, low=0.0, sweep=True, doc="the smoothing noise is clipped to [-noise_clip, noise_clip]"
    )
    policy_delay: int = hp(2, low=1, doc="critic steps per actor and target update")
    network: ActorCriticNetworkConfig = actor_critic_network_config(
        hidden=(256, 256), activation="relu"
    )
    fused_network: bool = hp(
        True,
        doc="take the critic and actor steps through the fused kernels, the twin critics as one "
        "flat parameter vector (rl.fused.critic), when the kernel backend is triton/interpret "
        "(auto: on a GPU) and the networks fit them (MLPs of two tanh, relu or silu hidden "
        "layers within kernels.twin_q_grads.LIMITS, with target networks: not SimbaV2's or "
        "CrossQ's); else the network's apply and autodiff",
    )


def check_env(config, env, env_params) -> None:
    """TD3 needs Box observations and bounded Box actions; FastTD3's options their own
    (`fast_recipe.check`)."""
    environment.check_bounded_actions(config, env, env_params)
    fast_recipe.check(config, env, env_params)


class State(NamedTuple):
    """TD3's training state: the actor mu (`params`, what `make_policy` reads) and the twin
    critics, each with its target copy (None without target networks: CrossQ); the critics'
    running statistics (batch renormalisation's, `rl.nn.batch_renorm`; {} for critics without); the
    optimiser states {"actor", "critic"}; the replay buffer; the envs; the PRNG key; env steps and
    gradient steps so far; the running observation statistics (`agent.normalize_obs`, else
    None)."""

    params: Any
    target_params: Any
    critic_params: Any
    target_critic_params: Any
    critic_stats: Any
    opt_state: dict
    buffer: buffers.UniformBuffer
    envs: Envs
    key: jax.Array
    step: jax.Array
    updates: jax.Array
    obs_stats: Any = None


def make_networks(agent: Config, env, env_params):
    """(actor, critic): mu(s) in [-1, 1]^d, and the twin critics reading concat(obs, action)."""
    action_dim = int(np.prod(env.action_space(env_params).shape))
    head = networks.deterministic_policy_head(action_dim)
    return actor_critic.actor_and_twin_critic(
        agent.network, env.observation_space(env_params), head
    )


def make_policy(config):
    """`policy(params, obs, key) -> action` in the env's own action space: mu(obs) mapped onto the
    bounds."""
    env, env_params = environment.make_env(config)
    actor, _ = make_networks(config.agent, env, env_params)
    fast_recipe.check_policy_params(config)
    return lambda params, obs, key: environment.to_env_action(
        env, env_params, actor.apply(params, obs)
    )


def optimizer(hparams, b1: float = 0.9):
    """Adam (first-moment decay `b1`) on clipped gradients, for the actor and for the critics."""
    return optimizers.clipped_adam(hparams["lr"], hparams["max_grad_norm"], b1=b1)


# ---------------------------------------------------------------- losses of one minibatch


def target_action(actor, target_params, batch, key, hparams):
    """a' = clip(mu'(s') + clip(eps, -c, c), -1, 1): the smoothed target action (the module
    docstring)."""
    return losses.smoothed_target_action(
        actor(target_params, batch["next_obs"]),
        key,
        hparams["policy_noise"],
        hparams["noise_clip"],
    )


def critic_loss(
    actor, critic, critic_params, target_params, target_critic_params, batch, key, hparams
):
    """(L_Q, mean Q1) with the smoothed, clipped double-Q target (the module docstring); `actor`
    and `critic` are the networks' apply functions."""
    next_action = target_action(actor, target_params, batch, key, hparams)
    next_value = jnp.minimum(*critic(target_critic_params, batch["next_obs"], next_action))
    target = losses.q_learning_target(
        batch["reward"], fast_recipe.bootstrap_discount(hparams["gamma"], batch), next_value
    )
    q1, q2 = critic(critic_params, batch["obs"], batch["action"])
    return losses.twin_q_loss(q1, q2, target), jnp.mean(q1)


def actor_loss(actor, critic, actor_params, critic_params, batch, pick=lambda q1, q2: q1):
    """-mean Q1(s, mu(s)); `pick` the value of the twin values (Q1; FastTD3's distributional
    critics: min(Q1, Q2) of the expected values)."""
    q = pick(*critic(critic_params, batch["obs"], actor(actor_params, batch["obs"])))
    return losses.deterministic_policy_loss(q)


def distributional_critic_loss(
    actor, critic, z, backend, critic_params, target_params, target_critic_params, batch, key,
    hparams,
):  # fmt: skip
    """(L_Q, mean Q1) of the distributional twin critics (`rl.nn.distributional`): cross-entropy to
    the projected target of the twin with the smaller expected value at the smoothed target action
    (no bonus)."""
    next_action = target_action(actor, target_params, batch, key, hparams)
    return distributional.critic_loss(
        critic, z, critic_params, target_critic_params, batch, next_action,
        jnp.zeros_like(batch["reward"]), fast_recipe.bootstrap_discount(hparams["gamma"], batch),
        backend=backend,
    )  # fmt: skip


def joint_critic_loss(
    actor, critic, critic_params, critic_stats, actor_params, batch, key, hparams
):
    """CrossQ's ((L_Q, (mean Q1, critic_stats'))): the smoothed target action of the online actor,
    y = r + gamma (1 - terminated) min(Q1, Q2)(s', a') from the joint pass
    (`actor_critic.joint_q_values`; `critic` a `StatefulNetwork`)."""
    next_action = target_action(actor, actor_params, batch, key, hparams)
    (q1, q2), next_q, stats = actor_critic.joint_q_values(
        critic, critic_params, critic_stats, batch, next_action
    )
    target = losses.q_learning_target(
        batch["reward"],
        fast_recipe.bootstrap_discount(hparams["gamma"], batch),
        jnp.minimum(*next_q),
    )
    return losses.twin_q_loss(q1, q2, target), (jnp.mean(q1), stats)


# ---------------------------------------------------------------- learning, without the envs


class Learning(NamedTuple):
    """What TD3's learning reads (`make_learning`): the networks; the critics' init `(key, obs,
    action) -> (params, stats)`, their values `(params, stats, obs, action) -> (q1, q2)` (on their
    flat vector where fused; by the running statistics for CrossQ) and their loss `(params, stats,
    target actor params, target critic params, batch, key, hparams) -> (L_Q, (mean Q1, stats))`
    (target losses or CrossQ's joint one); the fused critic and actor setups (`rl.fused.critic`;
    None where the steps go through apply and autodiff); the action's shape; and the projection
    after an optimiser step (SimbaV2's sphere, else the identity); the value the actor's loss reads
    of the twin values (`actor_loss`'s `pick`)."""

    actor: Any
    critic: Any
    init_critic: Callable
    critic_values: Callable
    critic_loss: Callable
    fused: Any
    fused_actor: Any
    action_shape: tuple
    project: Callable
    pick: Callable = lambda q1, q2: q1


def make_learning(config, env, env_params) -> Learning:
    """The networks of `env`, with the twin critics as one flat vector and the fused actor step
    where `rl.fused.critic.for_agent` says the kernels run them, or CrossQ's critics keeping
    running statistics where there are no target networks, or FastTD3's distributional critics
    (`agent.distributional`, through XLA)."""
    agent = config.agent
    actor, critic = make_networks(agent, env, env_params)
    action_shape = env.action_space(env_params).shape
    project = simbav2.project if agent.network.torso == "simbav2" else (lambda params: params)
    if agent.distributional:
        critic = distributional.twin_critic(agent.network, agent.num_atoms)
        z = distributional.support(agent.v_min, agent.v_max, agent.num_atoms)
        backend = environment.kernel_backend(config)
        values = distributional.twin_values(critic.apply, z, backend=backend)

        def loss(params, stats, *args):
            value, q_mean = distributional_critic_loss(
                actor.apply, critic.apply, z, backend, params, *args
            )
            return value, (q_mean, stats)

        return Learning(
            actor, critic, lambda key, obs, action: (critic.init(key, obs, action), {}),
            lambda params, stats, obs, action: values(params, obs, action), loss, None, None,
            action_shape, project, jnp.minimum,
        )  # fmt: skip
    if not agent.target_networks:
        critic = actor_critic.joint_twin_critic(agent.network)
        values = partial(actor_critic.eval_q_values, critic)
        loss = lambda params, stats, actor_params, _, *rest: joint_critic_loss(
            actor.apply, critic, params, stats, actor_params, *rest
        )
        return Learning(actor, critic, critic.init, values, loss, None, None, action_shape, project)
    fused = fused_critic.for_agent(config, env, env_params, critic)
    apply = critic.apply if fused is None else partial(fused_critic.twin_q_values, fused)
    values = lambda params, stats, obs, action: apply(params, obs, action)
    init = critic.init if fused is None else partial(fused_critic.init, fused)

    def loss(params, stats, *args):
        value, q_mean = critic_loss(actor.apply, critic.apply, params, *args)
        return value, (q_mean, stats)

    example_obs = jnp.zeros(env.observation_space(env_params).shape, jnp.float32)
    fused_actor = (
        None if fused is None else fused_critic.deterministic_actor(fused, actor, example_obs)
    )
    init_critic = lambda key, obs, action: (init(key, obs, action), {})
    return Learning(
        actor, critic, init_critic, values, loss, fused, fused_actor, action_shape, project
    )


def init_learning(
    agent: Config, learning: Learning, hparams, actor_key, critic_key, obs, envs, key
):
    """A `State` before any step: the actor from `actor_key` and the twin critics from
    `critic_key` (with their running statistics), each with its target copy (None without target
    networks), two optimiser states, an empty buffer of `agent.buffer_size` transitions shaped like
    one observation `obs`; `envs` and `key` as given (None where the envs are stepped elsewhere:
    rl.sebulba)."""
    example_action = jnp.zeros(learning.action_shape, jnp.float32)
    params = learning.actor.init(actor_key, obs)
    critic_params, critic_stats = learning.init_critic(critic_key, obs, example_action)
    tx = optimizer(hparams, agent.adam_b1)
    opt_state = {"actor": tx.init(params), "critic": tx.init(critic_params)}
    buffer = actor_critic.empty_buffer(obs, example_action, agent.buffer_size)
    if agent.n_step > 1:  # n-step transitions: with the steps each bootstraps ahead
        example = fast_recipe.example_transition(obs, example_action)
        buffer = buffers.uniform_init(example, agent.buffer_size)
    counters = jnp.int32(0), jnp.int32(0)
    targets = (params, critic_params) if agent.target_networks else (None, None)
    return State(
        params,
        targets[0],
        critic_params,
        targets[1],
        critic_stats,
        opt_state,
        buffer,
        envs,
        key,
        *counters,
        fast_recipe.initial_obs_stats(agent, obs),
    )


def exploration_action(hparams, actor, params, obs, key):
    """clip(mu(s) + N(0, exploration_noise^2), -1, 1) for a batch of observations."""
    mean = actor.apply(params, obs)
    noise = hparams["exploration_noise"] * jax.random.normal(key, mean.shape)
    return jnp.clip(mean + noise, -1.0, 1.0)


def make_gradient_step(agent: Config, learning: Learning):
    """`gradient_step(hparams, state, key) -> (state, stats)`: a critic step on a uniform
    minibatch; every `policy_delay`-th step also the delayed update (else its loss reads NaN)."""
    actor, fused, fused_actor, project = (
        learning.actor, learning.fused, learning.fused_actor, learning.project,
    )  # fmt: skip

    def delayed_update(hparams, state: State, batch):
        """The actor's step against the new critics, then Polyak steps of both targets (if any)."""
        if fused_actor is None:
            values = partial(learning.critic_values, stats=state.critic_stats)
            critic = lambda params, obs, action: values(params, obs=obs, action=action)
            loss, grads = jax.value_and_grad(partial(actor_loss, actor.apply, critic))(
                state.params, state.critic_params, batch, learning.pick
            )
            sq_norm = None
        else:
            grads, sq_norm, stats = fused_critic.deterministic_policy_grads(
                fused, fused_actor, state.params, state.critic_params, batch["obs"]
            )
            loss = stats["loss"]
        params, actor_opt_state = actor_critic.optimizer_step(
            optimizer(hparams, agent.adam_b1), grads, state.opt_state["actor"], state.params,
            sq_norm,
        )  # fmt: skip
        state = state._replace(
            params=project(params), opt_state={**state.opt_state, "actor": actor_opt_state}
        )
        if agent.target_networks:
            tau = hparams["tau"]
            state = state._replace(
                target_params=optimizers.polyak(state.target_params, state.params, tau),
                target_critic_params=optimizers.polyak(
                    state.target_critic_params, state.critic_params, tau
                ),
            )
        return state, loss

    def gradient_step(hparams, state: State, key):
        sample_key, noise_key = jax.random.split(key)
        batch, _ = buffers.uniform_sample(state.buffer, sample_key, agent.batch_size)
        batch = fast_recipe.normalized_batch(batch, state.obs_stats, agent.obs_clip)
        if fused is None:
            target_actor = state.target_params if agent.target_networks else state.params
            (q_loss, (q_mean, critic_stats)), grads = jax.value_and_grad(
                learning.critic_loss, has_aux=True
            )(
                state.critic_params,
                state.critic_stats,
                target_actor,
                state.target_critic_params,
                batch,
                noise_key,
                hparams,
            )
            sq_norm = None
        else:
            next_action = target_action(actor.apply, state.target_params, batch, noise_key, hparams)
            grads, sq_norm, stats = fused_critic.critic_grads(
                fused, state.critic_params, state.target_critic_params, batch,
                fast_recipe.bootstrap_discount(hparams["gamma"], batch),
                next_action, jnp.zeros_like(batch["reward"]),
            )  # fmt: skip
            q_loss, q_mean, critic_stats = stats["loss"], stats["q_mean"], state.critic_stats
        critic_params, critic_opt_state = actor_critic.optimizer_step(
            optimizer(hparams, agent.adam_b1), grads, state.opt_state["critic"],
            state.critic_params, sq_norm,
        )  # fmt: skip
        state = state._replace(
            critic_params=project(critic_params),
            critic_stats=critic_stats,
            opt_state={**state.opt_state, "critic": critic_opt_state},
            updates=state.updates + 1,
        )
        skip = lambda state, batch: (state, jnp.float32(jnp.nan))
        state, pi_loss = collection.cond(
            state.updates % agent.policy_delay == 0,
            partial(delayed_update, hparams),
            skip,
            state,
            batch,
        )
        return state, {"critic_loss": q_loss, "actor_loss": pi_loss, "q_mean": q_mean}

    return gradient_step


# ---------------------------------------------------------------- the loop


def make_trainer(config) -> Trainer:
    agent = config.agent
    env, env_params = environment.make_env(config)
    learning = make_learning(config, env, env_params)
    actor = learning.actor
    gradient_step = make_gradient_step(agent, learning)
    store = fast_recipe.make_store(config)  # one-step or n-step transitions

    # ---------------------------------------------------------------- init

    def init(key, hparams) -> State:
        """Actor, twin critics and their target copies, two optimiser states, an empty buffer, the
        envs."""
        key, actor_key, critic_key, reset_key = jax.random.split(key, 4)
        envs = actor_critic.reset_envs(env, env_params, reset_key, agent.num_envs)
        action = jnp.zeros(learning.action_shape, jnp.float32)
        envs = fast_recipe.with_windows(agent, envs, action)  # n-step: each env's last n steps
        return init_learning(
            agent, learning, hparams, actor_key, critic_key, envs.obs[0], envs, key
        )

    # ---------------------------------------------------------------- act

    def act(hparams, state: State, totals, key):
        """All envs take one step with clip(mu(s) + N(0, exploration_noise^2), -1, 1), or uniformly
        random actions before learning_starts (mu reading the observations normalised by the
        statistics updated with them, `agent.normalize_obs`); the transitions go to the buffer."""
        act_key, env_key = jax.random.split(key)
        noise_key, random_key = jax.random.split(act_key)
        obs_stats = fast_recipe.collect_obs_stats(state.obs_stats, state.envs.obs)
        obs = fast_recipe.normalized(obs_stats, state.envs.obs, agent.obs_clip)
        action = exploration_action(hparams, actor, state.params, obs, noise_key)
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
        state, stats = collection.scan_when(
            state.step >= agent.learning_starts,
            partial(gradient_step, hparams),
            state,
            train_keys,
            unroll=min(unroll_of(agent), agent.gradient_steps),
        )
        return (state, totals), stats

    # ---------------------------------------------------------------- log period

    def log_period(hparams, state: State):
        """A log period's phases, then its metrics: env steps, the episodes that ended, the mean
        losses (NaN-skipping), the gradient steps so far and the return of `eval_episodes`
        deterministic episodes of mu."""
        key, phase_key, eval_key = jax.random.split(state.key, 3)
        phase = partial(act_then_train, hparams)
        state, totals, stats = actor_critic.scan_phases(
            phase, state._replace(key=key), phase_key, agent
        )
        metrics = log_point_metrics(state.step, totals, stats, jnp.nanmean)
        metrics["gradient_steps"] = state.updates
        if agent.eval_episodes:
            stats, clip = state.obs_stats, agent.obs_clip
            policy = lambda obs: actor.apply(state.params, fast_recipe.normalized(stats, obs, clip))
            metrics["eval_return"] = actor_critic.eval_return(
                env, env_params, policy, eval_key, agent.eval_episodes
            )
        return state, metrics

    # ---------------------------------------------------------------- run

    def run(state, hparams, num_log_points):
        return scan_log_points(partial(log_period, hparams), state, num_log_points)

    return Trainer(init=init, run=run, num_log_points=agent.num_log_points)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)
