"""Proximal Policy Optimisation (PPO, clipped objective) with GAE, discrete and continuous actions,
compiled end to end (PureJaxRL's make_train is the model).

One update: `num_envs` envs step `num_steps` times with the current policy; advantages come from
`kernels.gae`; then `num_epochs` passes over the batch in `num_minibatches` shuffled minibatches
minimise

    L = -mean(min(rho A, clip(rho, 1 - eps, 1 + eps) A))                     clipped surrogate
        + vf_coef * 0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2))
        - ent_coef * mean(H[pi])

with rho = pi(a|s) / pi_old(a|s), A the advantages normalised per minibatch (optional) and R = A + V_old
the GAE value targets. Gradients are clipped to a global norm (`max_grad_norm`); Adam's step size is
annealed linearly to 0 over the run (optional).

Truncation: every step bootstraps from V(info["final_obs"]) (the observation actually reached, before
auto-reset), so with d_t = gamma (1 - terminated_t) and lambda_t = lambda (1 - (terminated_t | truncated_t)):

    delta_t = r_t + d_t V(final_obs_t) - V(s_t),     A_t = delta_t + d_t lambda_t A_{t+1}

a time-limit end still bootstraps, and no advantage chain runs across an episode boundary.

Policies: categorical over logits (log-probability and entropy from
`kernels.categorical_log_prob_entropy`), or a diagonal Gaussian with a state-independent learned
log-std for Box actions. Continuous choice (documented): the Gaussian lives in a normalised action
space; a sample `u` is stored and scored unclipped (so log-probabilities stay exact), and the env
receives `low + (clip(u, -1, 1) + 1) (high - low) / 2`, i.e. actions are clipped to the bounds rather
than tanh-squashed. The greedy policy (evaluation, `make_policy`) uses the argmax / the mean.

Initialisation: orthogonal weights, gain sqrt(2) for hidden layers, 0.01 for the policy head and 1 for
the value head, zero biases (rl.networks.actor_critic). Actor and critic are separate torsos unless
`shared_network`.

Sweepable hyperparameters (lr, gamma, gae_lambda, clip_eps, vf_clip_eps, ent_coef, vf_coef,
max_grad_norm, reward_scale) are read from `hparams` inside the compiled program, so a grid of settings
is one more vmap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

import envs
import kernels
from envs.spaces import Box, Discrete
from rl import networks
from rl.agents import Trainer, train_from_trainer
from rl.config import ConfigError, hp
from rl.logging import emit
from rl.rollout import completed_episodes, greedy_episodes


@dataclass(frozen=True)
class Config:
    name: str = "ppo"
    total_steps: int = hp(500_000, low=1, doc="env steps per seed (all envs counted), rounded down to whole updates")
    num_envs: int = hp(4, low=1, doc="parallel envs")
    num_steps: int = hp(128, low=1, doc="rollout length per env per update")
    num_epochs: int = hp(4, low=1, doc="passes over each rollout")
    num_minibatches: int = hp(4, low=1, doc="minibatches per pass")
    lr: float = hp(2.5e-4, low=0.0, low_open=True, sweep=True, doc="Adam step size (annealed to 0 if anneal_lr)")
    anneal_lr: bool = hp(True, doc="linear learning-rate decay to 0 over the run")
    gamma: float = hp(0.99, low=0.0, high=1.0, sweep=True, doc="discount")
    gae_lambda: float = hp(0.95, low=0.0, high=1.0, sweep=True, doc="GAE lambda")
    clip_eps: float = hp(0.2, low=0.0, sweep=True, doc="surrogate clip range")
    clip_value_loss: bool = hp(True, doc="clip the value update around the old values")
    vf_clip_eps: float = hp(0.2, low=0.0, sweep=True, doc="value clip range (if clip_value_loss)")
    ent_coef: float = hp(0.01, low=0.0, sweep=True, doc="entropy bonus coefficient")
    vf_coef: float = hp(0.5, low=0.0, sweep=True, doc="value loss coefficient")
    max_grad_norm: float = hp(0.5, low=0.0, low_open=True, sweep=True, doc="global gradient-norm clip")
    normalize_advantages: bool = hp(True, doc="normalise advantages per minibatch")
    reward_scale: float = hp(1.0, low=0.0, low_open=True, sweep=True, doc="rewards are multiplied by this for learning")
    hidden: tuple[int, ...] = hp((64, 64), doc="hidden layer widths")
    activation: str = hp("tanh", choices=tuple(networks.ACTIVATIONS), doc="hidden activation")
    shared_network: bool = hp(False, doc="one torso for actor and critic")
    log_std_init: float = hp(0.0, doc="initial log-std of the Gaussian policy (continuous actions)")
    network_backend: str = hp("flax", choices=networks.BACKENDS)
    fused_update: bool = hp(True, doc="minibatch gradient from the fused kernel (kernels.ppo_actor_critic_grads) when the kernel backend is triton/interpret and the network fits it; else autodiff")
    log_interval: int = hp(8, low=1, doc="updates between log points")
    eval_envs: int = hp(0, low=0, doc="greedy evaluation episodes at each log point (0: no evaluation)")

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_steps // self.batch_size

    def validate(self):
        if self.batch_size % self.num_minibatches:
            raise ConfigError(f"agent.num_minibatches ({self.num_minibatches}) must divide agent.num_envs * agent.num_steps ({self.batch_size})")
        if self.num_updates < 1:
            raise ConfigError(f"agent.total_steps ({self.total_steps}) must be at least agent.num_envs * agent.num_steps ({self.batch_size})")
        if self.num_updates % self.log_interval:
            raise ConfigError(
                f"agent.log_interval ({self.log_interval} updates) must divide the number of updates "
                f"agent.total_steps // (agent.num_envs * agent.num_steps) = {self.num_updates}"
            )
        if not self.hidden or any(w < 1 for w in self.hidden):
            raise ConfigError(f"agent.hidden must list positive widths, got {list(self.hidden)}")


def check_env(config) -> None:
    """PPO needs Discrete or bounded Box actions."""
    env, params = envs.make(config.env.id, **dict(config.env.params))
    space = env.action_space(params)
    if isinstance(space, Box) and not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise ConfigError(f"env.id: ppo needs bounded Box actions; {config.env.id} has {space}")
    if not isinstance(space, (Box, Discrete)):
        raise ConfigError(f"env.id: ppo needs Discrete or Box actions; {config.env.id} has {space}")


# ---------------------------------------------------------------- policy distributions


def categorical_log_prob_entropy(logits, actions):
    """(log pi(a), H[pi]) of categorical policies: log_softmax(logits)[a] and -sum p log p (kernels op)."""
    return kernels.categorical_log_prob_entropy(logits, actions)


def gaussian_log_prob_entropy(mean, log_std, actions):
    """Diagonal Gaussian, summed over the last axis:
    log pi(a) = sum -((a - mu) / sigma)^2 / 2 - log sigma - log(2 pi) / 2;  H = sum log sigma + log(2 pi e) / 2."""
    z = (actions - mean) * jnp.exp(-log_std)
    log_prob = jnp.sum(-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi), axis=-1)
    entropy = jnp.sum(log_std + 0.5 * math.log(2 * math.pi * math.e), axis=-1)
    return log_prob, entropy


def log_prob_entropy(policy, actions, continuous: bool):
    if continuous:
        mean, log_std = policy
        return gaussian_log_prob_entropy(mean, log_std, actions)
    return categorical_log_prob_entropy(policy, actions)


def sample_action(policy, key, continuous: bool):
    """A sample of the policy: categorical index (int32) or mean + sigma * N(0, I)."""
    if continuous:
        mean, log_std = policy
        return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    return jax.random.categorical(key, policy).astype(jnp.int32)


def greedy_action(policy, continuous: bool):
    """argmax of the logits, or the Gaussian's mean."""
    if continuous:
        return policy[0]
    return jnp.argmax(policy, axis=-1).astype(jnp.int32)


def to_env_action(action, low, high):
    """Normalised action u -> env action low + (clip(u, -1, 1) + 1) (high - low) / 2."""
    return low + (jnp.clip(action, -1.0, 1.0) + 1.0) * 0.5 * (high - low)


# ---------------------------------------------------------------- loss pieces


def normalize(x, eps: float = 1e-8):
    """(x - mean(x)) / (std(x) + eps)."""
    return (x - x.mean()) / (x.std() + eps)


def clipped_surrogate_loss(ratio, advantages, clip_eps):
    """-mean(min(rho A, clip(rho, 1 - eps, 1 + eps) A))."""
    return -jnp.mean(jnp.minimum(ratio * advantages, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages))


def value_loss(values, old_values, targets, clip_eps, clip: bool):
    """0.5 mean(max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)), or 0.5 mean((V - R)^2) unclipped."""
    unclipped = jnp.square(values - targets)
    if not clip:
        return 0.5 * jnp.mean(unclipped)
    clipped = jnp.square(old_values + jnp.clip(values - old_values, -clip_eps, clip_eps) - targets)
    return 0.5 * jnp.mean(jnp.maximum(unclipped, clipped))


def truncation_aware_gae(rewards, values, next_values, terminated, truncated, gamma, gae_lambda):
    """GAE with d_t = gamma (1 - terminated_t), lambda_t = lambda (1 - (terminated_t | truncated_t)), time-major;
    `next_values` = V(final_obs). Returns (advantages, targets)."""
    discounts = gamma * (1.0 - terminated.astype(jnp.float32))
    lambdas = gae_lambda * (1.0 - (terminated | truncated).astype(jnp.float32))
    return kernels.gae(rewards, values, next_values, discounts, lambdas)


def fused_update_unfit_reason(config) -> str | None:
    """Why `kernels.ppo_actor_critic_grads` cannot compute this config's gradient, or None if it can:
    it needs Discrete actions, a flat Box observation, separate actor and critic with two hidden
    layers, tanh or relu, and sizes within `kernels.ppo_grads.LIMITS`."""
    agent = config.agent
    env, env_params = envs.make(config.env.id, **dict(config.env.params))
    action_space, obs_space = env.action_space(env_params), env.observation_space(env_params)
    limits = kernels.ppo_grads.LIMITS
    if not isinstance(action_space, Discrete):
        return "continuous actions (the kernel is for categorical policies)"
    if not isinstance(obs_space, Box) or len(obs_space.shape) != 1:
        return f"observation space {obs_space} is not a flat Box"
    if agent.shared_network or len(agent.hidden) != 2 or agent.activation not in ("tanh", "relu"):
        return "the kernel needs separate actor and critic MLPs with two tanh or relu hidden layers"
    if max(agent.hidden) > limits["hidden"] or obs_space.shape[0] > limits["obs_dim"] or action_space.n > limits["actions"]:
        return f"sizes beyond the kernel's limits {limits}"
    return None


def fused_loss_grads(params, batch, hparams, agent):
    """(grads, stats) of the PPO loss for `actor_critic`'s separate two-layer torsos, from the fused
    kernel; the same numbers as `jax.grad(loss_fn)` (up to float rounding). Dense layers in creation
    order: actor hidden 1-2, critic hidden 1-2, actor head, critic head."""
    trans, advantages, targets = batch
    if agent.normalize_advantages:
        advantages = normalize(advantages)
    (a1, a2, c1, c2, a3, c3) = networks.dense_layers(params)
    g_actor, g_critic, stats = kernels.ppo_actor_critic_grads(
        trans.obs, trans.action, trans.log_prob, trans.value, advantages, targets,
        (*a1, *a2, *a3), (*c1, *c2, *c3),
        hparams["clip_eps"], hparams["vf_clip_eps"], hparams["ent_coef"], hparams["vf_coef"],
        activation=agent.activation, clip_value_loss=agent.clip_value_loss,
    )
    pairs = lambda g: [(g[0], g[1]), (g[2], g[3]), (g[4], g[5])]
    (ga1, ga2, ga3), (gc1, gc2, gc3) = pairs(g_actor), pairs(g_critic)
    return networks.replace_dense_layers(params, [ga1, ga2, gc1, gc2, ga3, gc3]), stats


class Transition(NamedTuple):
    """One rollout step, as the acting loop records it (values are computed afterwards, in one batch)."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array


class LearnBatch(NamedTuple):
    """What the loss reads of a step: observation, action, and the behaviour policy's log-prob and value."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array


# ---------------------------------------------------------------- the trainer


def make_network(config):
    env, env_params = envs.make(config.env.id, **dict(config.env.params))
    agent = config.agent
    action_space, obs_space = env.action_space(env_params), env.observation_space(env_params)
    continuous = isinstance(action_space, Box)
    action_dim = int(np.prod(action_space.shape)) if continuous else int(action_space.n)
    fn = networks.actor_critic(
        action_dim,
        continuous=continuous,
        hidden=agent.hidden,
        act=agent.activation,
        shared=agent.shared_network,
        log_std_init=agent.log_std_init,
        num_discrete_obs=obs_space.n if isinstance(obs_space, Discrete) else None,
    )
    return networks.build(fn, agent.network_backend), continuous


def make_trainer(config) -> Trainer:
    agent = config.agent
    env, env_params = envs.make(config.env.id, **dict(config.env.params))
    net, continuous = make_network(config)
    action_space = env.action_space(env_params)
    if continuous:
        low = jnp.asarray(np.broadcast_to(np.asarray(action_space.low, np.float32), action_space.shape))
        high = jnp.asarray(np.broadcast_to(np.asarray(action_space.high, np.float32), action_space.shape))
        env_action = lambda a: to_env_action(a, low, high)
    else:
        env_action = lambda a: a
    num_envs, num_steps, num_updates = agent.num_envs, agent.num_steps, agent.num_updates
    minibatch_size = agent.batch_size // agent.num_minibatches
    grad_steps_per_update = agent.num_epochs * agent.num_minibatches
    vreset = jax.vmap(env.reset, in_axes=(0, None))
    # the kernel backend is fixed when the program is traced, as for every kernels op
    use_fused_update = agent.fused_update and kernels.resolve_backend() != "reference" and fused_update_unfit_reason(config) is None
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def make_optimizer(hparams):
        def learning_rate(count):
            if not agent.anneal_lr:
                return hparams["lr"]
            return hparams["lr"] * (1.0 - (count // grad_steps_per_update) / num_updates)

        return optax.chain(optax.clip_by_global_norm(hparams["max_grad_norm"]), optax.adam(learning_rate, eps=1e-5))

    def init(key, hparams):
        key, net_key, reset_key = jax.random.split(key, 3)
        obs, env_state = vreset(jax.random.split(reset_key, num_envs), env_params)
        params = net.init(net_key, obs[0])
        return {
            "params": params,
            "opt_state": make_optimizer(hparams).init(ravel_pytree(params)[0]),
            "obs": obs,
            "env_state": env_state,
            "key": key,
            "step": jnp.int32(0),
            "update": jnp.int32(0),
            "episode_return": jnp.zeros(num_envs, jnp.float32),
            "episode_length": jnp.zeros(num_envs, jnp.int32),
        }

    def loss_fn(params, batch, hparams):
        (trans, advantages, targets) = batch
        policy, values = net.apply(params, trans.obs)
        log_prob, entropy = log_prob_entropy(policy, trans.action, continuous)
        log_ratio = log_prob - trans.log_prob
        ratio = jnp.exp(log_ratio)
        if agent.normalize_advantages:
            advantages = normalize(advantages)
        policy_loss = clipped_surrogate_loss(ratio, advantages, hparams["clip_eps"])
        v_loss = value_loss(values, trans.value, targets, hparams["vf_clip_eps"], agent.clip_value_loss)
        entropy = jnp.mean(entropy)
        total = policy_loss + hparams["vf_coef"] * v_loss - hparams["ent_coef"] * entropy
        aux = {
            "policy_loss": policy_loss,
            "value_loss": v_loss,
            "entropy": entropy,
            "approx_kl": jnp.mean((ratio - 1.0) - log_ratio),
            "clip_fraction": jnp.mean((jnp.abs(ratio - 1.0) > hparams["clip_eps"]).astype(jnp.float32)),
        }
        return total, aux

    def rollout_keys(key):
        """Per step: the action-sampling key and one env key per env (split up front, outside the loop)."""
        pairs = jax.vmap(jax.random.split)(jax.random.split(key, num_steps))
        return pairs[:, 0], jax.vmap(lambda k: jax.random.split(k, num_envs))(pairs[:, 1])

    def run(state, hparams, num_log_points):
        optimizer = make_optimizer(hparams)

        def env_step(carry, keys):
            # acting needs only the policy: the critic runs once per update on the whole batch below
            params, obs, env_state = carry
            act_key, env_keys = keys
            policy, _ = net.apply(params, obs)
            action = sample_action(policy, act_key, continuous)
            log_prob, _ = log_prob_entropy(policy, action, continuous)
            next_obs, env_state, reward, terminated, truncated, info = vstep(env_keys, env_state, env_action(action), env_params)
            transition = Transition(obs, action, log_prob, reward, terminated, truncated, info["final_obs"])
            return (params, next_obs, env_state), transition

        def update(carry, _):
            state, stats = carry
            key, rollout_key, shuffle_key = jax.random.split(state["key"], 3)
            params = state["params"]
            (_, obs, env_state), traj = jax.lax.scan(env_step, (params, state["obs"], state["env_state"]), rollout_keys(rollout_key))
            sum_return, sum_length, episodes, ep_return, ep_length = completed_episodes(
                traj.reward, traj.terminated | traj.truncated, state["episode_return"], state["episode_length"]
            )
            stats = (stats[0] + sum_return, stats[1] + sum_length, stats[2] + episodes)
            # V(s_t) and V(final_obs_t) (the observation actually reached, for bootstrapping) in one pass
            _, values = net.apply(params, jnp.stack([traj.obs, traj.final_obs]))
            advantages, targets = truncation_aware_gae(
                traj.reward * hparams["reward_scale"], values[0], values[1], traj.terminated, traj.truncated, hparams["gamma"], hparams["gae_lambda"]
            )
            # only what the loss reads is shuffled into minibatches
            learn_data = (LearnBatch(traj.obs, traj.action, traj.log_prob, values[0]), advantages, targets)
            flat = jax.tree.map(lambda x: x.reshape((agent.batch_size,) + x.shape[2:]), learn_data)
            # the optimiser sees one flat parameter vector: one fused Adam update instead of one per array
            flat_params, unravel = ravel_pytree(params)
            loss_of_flat = lambda p, batch: loss_fn(unravel(p), batch, hparams)

            def flat_grads(flat_params, batch):
                if use_fused_update:
                    grads, aux = fused_loss_grads(unravel(flat_params), batch, hparams, agent)
                    return ravel_pytree(grads)[0], aux
                (_, aux), grads = jax.value_and_grad(loss_of_flat, has_aux=True)(flat_params, batch)
                return grads, aux

            def epoch(carry, key):
                def minibatch_step(carry, batch):
                    flat_params, opt_state = carry
                    grads, aux = flat_grads(flat_params, batch)
                    updates, opt_state = optimizer.update(grads, opt_state, flat_params)
                    return (optax.apply_updates(flat_params, updates), opt_state), aux

                order = jax.random.permutation(key, agent.batch_size)
                shuffled = jax.tree.map(lambda x: jnp.take(x, order, axis=0).reshape((agent.num_minibatches, minibatch_size) + x.shape[1:]), flat)
                return jax.lax.scan(minibatch_step, carry, shuffled)

            (flat_params, opt_state), aux = jax.lax.scan(epoch, (flat_params, state["opt_state"]), jax.random.split(shuffle_key, agent.num_epochs))
            state = {
                "params": unravel(flat_params),
                "opt_state": opt_state,
                "obs": obs,
                "env_state": env_state,
                "key": key,
                "step": state["step"] + agent.batch_size,
                "update": state["update"] + 1,
                "episode_return": ep_return,
                "episode_length": ep_length,
            }
            return (state, stats), jax.tree.map(jnp.mean, aux)

        def log_period(state, _):
            zero_stats = (jnp.float32(0.0), jnp.int32(0), jnp.int32(0))
            (state, (sum_return, sum_length, episodes)), aux = jax.lax.scan(update, (state, zero_stats), None, length=agent.log_interval)
            metrics = {
                "step": state["step"],
                "episode_return": jnp.where(episodes > 0, sum_return / jnp.maximum(episodes, 1), jnp.nan),
                "episode_length": jnp.where(episodes > 0, sum_length / jnp.maximum(episodes, 1), jnp.nan),
                "episodes": episodes,
                **jax.tree.map(jnp.mean, aux),
            }
            if agent.eval_envs:
                key, eval_key = jax.random.split(state["key"])
                state = {**state, "key": key}
                eval_return, eval_length = evaluate(state["params"], eval_key)
                metrics["eval_return"], metrics["eval_length"] = eval_return, eval_length
            return state, emit(metrics)

        return jax.lax.scan(log_period, state, None, length=num_log_points)

    def evaluate(params, key):
        """Mean return and length of the first episode of `eval_envs` envs under the greedy policy."""
        act = lambda obs: env_action(greedy_action(net.apply(params, obs)[0], continuous))
        returns, lengths = greedy_episodes(env, env_params, act, key, agent.eval_envs)
        return returns.mean(), lengths.mean()

    return Trainer(init=init, run=run, num_log_points=agent.num_updates // agent.log_interval)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action`: argmax of the logits, or the Gaussian mean clipped and scaled
    to the action bounds (the key is unused)."""
    env, env_params = envs.make(config.env.id, **dict(config.env.params))
    net, continuous = make_network(config)
    space = env.action_space(env_params)

    def policy(params, obs, key):
        out, _ = net.apply(params, obs)
        action = greedy_action(out, continuous)
        if continuous:
            low = jnp.asarray(np.broadcast_to(np.asarray(space.low, np.float32), space.shape))
            high = jnp.asarray(np.broadcast_to(np.asarray(space.high, np.float32), space.shape))
            return to_env_action(action, low, high)
        return action

    return policy
