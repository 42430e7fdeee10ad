"""Proximal Policy Optimisation (PPO, clipped objective; Schulman et al. 2017) with truncation-aware
GAE, discrete and continuous actions, compiled end to end (PureJaxRL's make_train is the model).

One update:

    rollout      num_envs envs step num_steps times with the current policy (the actor only)
    values       V(s_t) and V(final_obs_t) in one critic pass over the whole rollout
    advantages   A, R = truncation_aware_gae(r * reward_scale, V(s), V(final_obs), terminated, truncated)
    learn        num_epochs passes over the batch in num_minibatches shuffled minibatches, each an Adam
                 step (gradients clipped to max_grad_norm) on rl.losses.ppo_loss:

    L = -mean(min(rho A, clip(rho, 1 - eps, 1 + eps) A))
        + vf_coef 0.5 mean(max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2))
        - ent_coef mean(H[pi])

with rho = pi(a|s) / pi_old(a|s) and A normalised per minibatch (optional). Adam's step size decays
linearly to 0 over the updates (optional). The minibatch gradient is jax.grad of that loss, or, for a
categorical policy on two separate two-layer MLPs with a triton/interpret kernel backend, the fused
kernel `kernels.ppo_actor_critic_grads` of the same function (`fused_update`).

Truncation: with d_t = gamma (1 - terminated_t) and lambda_t = lambda (1 - (terminated_t | truncated_t)),

    delta_t = r_t + d_t V(final_obs_t) - V(s_t),     A_t = delta_t + d_t lambda_t A_{t+1},

so a time-limit end still bootstraps and no advantage chain crosses an episode boundary.

Policies: categorical over logits, or a diagonal Gaussian with a state-independent learned log-std
for Box actions. The Gaussian lives in the agent's action space [-1, 1]^d of `loop.make_env`: a
sample u is stored and scored unclipped (log-probabilities stay exact) and the env wrapper sends
L + (clip(u, -1, 1) + 1) (H - L) / 2, so actions are clipped to the bounds, not tanh-squashed. The
greedy policy (evaluation, `make_policy`) takes the argmax / the mean.

Networks: `agent.network` is the torso; separate actor and critic torsos unless `shared_network`;
orthogonal init, gain 0.01 for the policy head and 1 for the value head.

The sweepable hyperparameters (lr, gamma, gae_lambda, clip_eps, vf_clip_eps, ent_coef, vf_coef,
max_grad_norm, reward_scale) are read from `hparams` inside the compiled program.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

import kernels
from envs.spaces import Box, Discrete
from rl import losses, loop, networks
from rl.trainer import Trainer, train_from_trainer
from rl.config import ConfigError, hp
from rl.rollout import greedy_episodes

EPISODE_INFO = ("episode_done", "episode_return", "episode_length")


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
    network: networks.NetworkConfig = networks.network_config(hidden=(64, 64), activation="tanh")
    shared_network: bool = hp(False, doc="one torso for actor and critic")
    log_std_init: float = hp(0.0, doc="initial log-std of the Gaussian policy (continuous actions)")
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
        if self.num_updates < 1 or self.num_updates % self.log_interval:
            raise ConfigError(total_steps_problem(self.total_steps, self.batch_size, self.log_interval))


def total_steps_problem(total_steps: int, batch_size: int, log_interval: int) -> str:
    """The message for a total_steps whose whole updates (total_steps // batch_size) are not a positive
    multiple of log_interval, with the nearest values that work: the multiples of batch_size * log_interval."""
    unit = batch_size * log_interval
    below = total_steps // unit * unit
    valid = [value for value in (below, below + unit) if value > 0]
    updates = total_steps // batch_size
    return (
        f"agent.total_steps ({total_steps}) gives {updates} updates of agent.num_envs * agent.num_steps = {batch_size} steps, "
        f"which must be a positive multiple of agent.log_interval ({log_interval}); nearest valid: "
        + " or ".join(f"agent.total_steps={value}" for value in valid)
        + f" (multiples of {batch_size} * {log_interval} = {unit})"
    )


def check_env(config, env, env_params) -> None:
    """PPO needs Discrete or bounded Box actions."""
    space = env.action_space(env_params)
    if isinstance(space, Box) and not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise ConfigError(f"env.id: ppo needs bounded Box actions; {config.env.id} has {space}")
    if not isinstance(space, (Box, Discrete)):
        raise ConfigError(f"env.id: ppo needs Discrete or Box actions; {config.env.id} has {space}")


# ---------------------------------------------------------------- policy and network


def log_prob_entropy(policy, actions, continuous: bool, backend: str):
    """(log pi(a|s), H[pi(.|s)]): diagonal Gaussian (mean, log_std), or categorical logits
    (`kernels.categorical_log_prob_entropy`)."""
    if continuous:
        return losses.gaussian_log_prob_entropy(*policy, actions)
    return kernels.categorical_log_prob_entropy(policy, actions, backend=backend)


def sample_action(policy, key, continuous: bool):
    """A sample of the policy: mean + sigma N(0, I), or a categorical index (int32)."""
    if continuous:
        mean, log_std = policy
        return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    return jax.random.categorical(key, policy).astype(jnp.int32)


def greedy_action(policy, continuous: bool):
    """The Gaussian's mean, or the argmax of the logits."""
    if continuous:
        return policy[0]
    return jnp.argmax(policy, axis=-1).astype(jnp.int32)


def make_network(agent: Config, env, env_params):
    """(network obs -> (policy, value), continuous) for the agent's env: `agent.network`'s torso, a
    Gaussian or categorical policy head and a value head (`networks.actor_critic`)."""
    action_space, obs_space = env.action_space(env_params), env.observation_space(env_params)
    continuous = isinstance(action_space, Box)
    if continuous:
        head = networks.gaussian_policy_head(int(np.prod(action_space.shape)), agent.log_std_init)
    else:
        head = networks.categorical_policy_head(int(action_space.n))
    fn = networks.actor_critic(networks.make_torso(agent.network, obs_space), head, shared=agent.shared_network)
    return networks.build(fn, agent.network.backend), continuous


# ---------------------------------------------------------------- the minibatch gradient


class LearnBatch(NamedTuple):
    """What the loss reads of a step: observation, action, and the behaviour policy's log-prob and value."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array


def minibatch_loss(net, params, batch, hparams, agent: Config, continuous: bool, backend: str):
    """(L, stats) = `losses.ppo_loss` of a minibatch (LearnBatch, advantages, targets) under `params`,
    advantages normalised first if `agent.normalize_advantages`."""
    trans, advantages, targets = batch
    policy, values = net.apply(params, trans.obs)
    log_prob, entropy = log_prob_entropy(policy, trans.action, continuous, backend)
    if agent.normalize_advantages:
        advantages = losses.normalize(advantages)
    return losses.ppo_loss(
        log_prob, entropy, values, trans.log_prob, trans.value, advantages, targets,
        hparams["clip_eps"], hparams["vf_clip_eps"], hparams["ent_coef"], hparams["vf_coef"], agent.clip_value_loss,
    )


def fused_update_unfit_reason(config, env=None, env_params=None) -> str | None:
    """Why `kernels.ppo_actor_critic_grads` cannot compute this config's gradient, or None if it can:
    it needs Discrete actions, a flat Box observation, separate actor and critic mlp torsos with two
    hidden layers, tanh or relu, and sizes within `kernels.ppo_grads.LIMITS`. The env is
    `loop.make_env(config)` unless given."""
    if env is None:
        env, env_params = loop.make_env(config)
    agent, network = config.agent, config.agent.network
    action_space, obs_space = env.action_space(env_params), env.observation_space(env_params)
    limits = kernels.ppo_grads.LIMITS
    if not isinstance(action_space, Discrete):
        return "continuous actions (the kernel is for categorical policies)"
    if not isinstance(obs_space, Box) or len(obs_space.shape) != 1:
        return f"observation space {obs_space} is not a flat Box"
    if agent.shared_network or network.torso != "mlp" or network.layer_norm or len(network.hidden) != 2 or network.activation not in ("tanh", "relu"):
        return "the kernel needs separate actor and critic MLPs with two tanh or relu hidden layers"
    if max(network.hidden) > limits["hidden"] or obs_space.shape[0] > limits["obs_dim"] or action_space.n > limits["actions"]:
        return f"sizes beyond the kernel's limits {limits}"
    return None


def fused_loss_grads(params, batch, hparams, agent: Config, backend: str):
    """(grads, stats) of `minibatch_loss` for the categorical actor-critic of two separate two-layer
    torsos, from the fused kernel on `backend`: the same numbers as jax.grad (up to float rounding).
    Dense layers in creation order: actor hidden 1-2, critic hidden 1-2, actor head, critic head."""
    trans, advantages, targets = batch
    if agent.normalize_advantages:
        advantages = losses.normalize(advantages)
    (a1, a2, c1, c2, a3, c3) = networks.dense_layers(params)
    g_actor, g_critic, stats = kernels.ppo_actor_critic_grads(
        trans.obs, trans.action, trans.log_prob, trans.value, advantages, targets,
        (*a1, *a2, *a3), (*c1, *c2, *c3),
        hparams["clip_eps"], hparams["vf_clip_eps"], hparams["ent_coef"], hparams["vf_coef"],
        activation=agent.network.activation, clip_value_loss=agent.clip_value_loss, backend=backend,
    )
    pairs = lambda g: [(g[0], g[1]), (g[2], g[3]), (g[4], g[5])]
    (ga1, ga2, ga3), (gc1, gc2, gc3) = pairs(g_actor), pairs(g_critic)
    return networks.replace_dense_layers(params, [ga1, ga2, gc1, gc2, ga3, gc3]), stats


# ---------------------------------------------------------------- the training program


class Setup(NamedTuple):
    """What the compiled program is built from, fixed per make_trainer."""

    agent: Config
    env: Any
    env_params: Any
    reset: Any  # vmapped env.reset
    step: Any  # vmapped env.step
    net: networks.Network
    continuous: bool
    backend: str  # kernel backend
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
    episode: dict  # EpisodeStatistics' info: episode_done, episode_return, episode_length


def make_optimizer(agent: Config, hparams):
    """Adam (eps 1e-5) on gradients clipped to max_grad_norm; with anneal_lr the step size is
    lr (1 - update / num_updates), one update being num_epochs * num_minibatches Adam steps."""
    steps_per_update = agent.num_epochs * agent.num_minibatches

    def learning_rate(count):
        if not agent.anneal_lr:
            return hparams["lr"]
        return hparams["lr"] * (1.0 - (count // steps_per_update) / agent.num_updates)

    return loop.clipped_adam(learning_rate, hparams["max_grad_norm"], eps=1e-5)


def init_state(s: Setup, key, hparams):
    """Fresh params, optimiser state and envs (`num_envs` resets), the PRNG key and the counters."""
    key, net_key, reset_key = jax.random.split(key, 3)
    obs, env_state = s.reset(jax.random.split(reset_key, s.agent.num_envs), s.env_params)
    params = s.net.init(net_key, obs[0])
    return {
        "params": params,
        "opt_state": make_optimizer(s.agent, hparams).init(ravel_pytree(params)[0]),
        "obs": obs,
        "env_state": env_state,
        "key": key,
        "step": jnp.int32(0),
        "update": jnp.int32(0),
    }


def rollout_keys(key, num_steps: int, num_envs: int):
    """Per step: the action-sampling key and one env key per env (split up front, outside the loop)."""
    pairs = jax.vmap(jax.random.split)(jax.random.split(key, num_steps))
    return pairs[:, 0], jax.vmap(lambda k: jax.random.split(k, num_envs))(pairs[:, 1])


def rollout(s: Setup, params, obs, env_state, key):
    """num_steps steps of every env under the policy; (obs, env_state, Transition [T, E, ...])."""

    def env_step(carry, keys):
        params, obs, env_state = carry
        act_key, env_keys = keys
        policy, _ = s.net.apply(params, obs)
        action = sample_action(policy, act_key, s.continuous)
        log_prob, _ = log_prob_entropy(policy, action, s.continuous, s.backend)
        next_obs, env_state, reward, terminated, truncated, info = s.step(env_keys, env_state, action, s.env_params)
        episode = {name: info[name] for name in EPISODE_INFO}
        return (params, next_obs, env_state), Transition(obs, action, log_prob, reward, terminated, truncated, info["final_obs"], episode)

    keys = rollout_keys(key, s.agent.num_steps, s.agent.num_envs)
    (_, obs, env_state), traj = jax.lax.scan(env_step, (params, obs, env_state), keys)
    return obs, env_state, traj


def learn_batch(s: Setup, hparams, params, traj: Transition):
    """(LearnBatch, advantages, targets), flattened to [num_envs * num_steps, ...]: V(s_t) and
    V(final_obs_t) in one critic pass, then truncation-aware GAE on the scaled rewards."""
    _, values = s.net.apply(params, jnp.stack([traj.obs, traj.final_obs]))
    advantages, targets = losses.truncation_aware_gae(
        traj.reward * hparams["reward_scale"], values[0], values[1], traj.terminated, traj.truncated,
        hparams["gamma"], hparams["gae_lambda"], backend=s.backend, deterministic=s.deterministic,
    )
    data = (LearnBatch(traj.obs, traj.action, traj.log_prob, values[0]), advantages, targets)
    return jax.tree.map(lambda x: x.reshape((s.agent.batch_size,) + x.shape[2:]), data)


def learn(s: Setup, hparams, params, opt_state, batch, key):
    """num_epochs passes of shuffled minibatch Adam steps; Adam sees one flat parameter vector (one
    fused update instead of one per array). Returns (params, opt_state, stats [epochs, minibatches])."""
    agent = s.agent
    optimizer = make_optimizer(agent, hparams)
    flat_params, unravel = ravel_pytree(params)
    minibatch_size = agent.batch_size // agent.num_minibatches

    def grads(flat_params, minibatch):
        if s.fused:
            g, stats = fused_loss_grads(unravel(flat_params), minibatch, hparams, agent, s.backend)
            return ravel_pytree(g)[0], stats
        loss = lambda p: minibatch_loss(s.net, unravel(p), minibatch, hparams, agent, s.continuous, s.backend)
        (_, stats), g = jax.value_and_grad(loss, has_aux=True)(flat_params)
        return g, stats

    def minibatch_step(carry, minibatch):
        flat_params, opt_state = carry
        g, stats = grads(flat_params, minibatch)
        updates, opt_state = optimizer.update(g, opt_state, flat_params)
        return (optax.apply_updates(flat_params, updates), opt_state), stats

    def epoch(carry, key):
        order = jax.random.permutation(key, agent.batch_size)
        shape = (agent.num_minibatches, minibatch_size)
        minibatches = jax.tree.map(lambda x: jnp.take(x, order, axis=0).reshape(shape + x.shape[1:]), batch)
        return jax.lax.scan(minibatch_step, carry, minibatches)

    (flat_params, opt_state), stats = jax.lax.scan(epoch, (flat_params, opt_state), jax.random.split(key, agent.num_epochs))
    return unravel(flat_params), opt_state, stats


def update(s: Setup, hparams, state, totals: loop.EpisodeTotals):
    """One PPO update: rollout, advantages, learning. Returns (state, totals, mean loss stats)."""
    key, rollout_key, shuffle_key = jax.random.split(state["key"], 3)
    params = state["params"]
    obs, env_state, traj = rollout(s, params, state["obs"], state["env_state"], rollout_key)
    totals = loop.add_episodes(totals, traj.episode)
    batch = learn_batch(s, hparams, params, traj)
    params, opt_state, stats = learn(s, hparams, params, state["opt_state"], batch, shuffle_key)
    state = {
        "params": params,
        "opt_state": opt_state,
        "obs": obs,
        "env_state": env_state,
        "key": key,
        "step": state["step"] + s.agent.batch_size,
        "update": state["update"] + 1,
    }
    return state, totals, jax.tree.map(jnp.mean, stats)


def log_period(s: Setup, hparams, state):
    """log_interval updates, then the log point's metrics: env steps, the mean return and length of
    the episodes that ended, the loss stats, and (eval_envs > 0) greedy evaluation."""

    def one_update(carry, _):
        state, totals, stats = update(s, hparams, *carry)
        return (state, totals), stats

    (state, totals), stats = jax.lax.scan(one_update, (state, loop.no_episodes()), None, length=s.agent.log_interval)
    metrics = {"step": state["step"], **loop.episode_metrics(totals), **jax.tree.map(jnp.mean, stats)}
    if s.agent.eval_envs:
        key, eval_key = jax.random.split(state["key"])
        state = {**state, "key": key}
        metrics["eval_return"], metrics["eval_length"] = evaluate(s, state["params"], eval_key)
    return state, metrics


def evaluate(s: Setup, params, key):
    """Mean return and length of the first episode of `eval_envs` fresh envs under the greedy policy."""
    act = lambda obs: greedy_action(s.net.apply(params, obs)[0], s.continuous)
    returns, lengths = greedy_episodes(s.env, s.env_params, act, key, s.agent.eval_envs)
    return returns.mean(), lengths.mean()


def make_trainer(config) -> Trainer:
    agent = config.agent
    env, env_params = loop.make_env(config)
    net, continuous = make_network(agent, env, env_params)
    backend = loop.kernel_backend(config)
    fused = agent.fused_update and backend in ("triton", "interpret") and fused_update_unfit_reason(config, env, env_params) is None
    s = Setup(agent, env, env_params, *loop.batched(env), net, continuous, backend, fused, config.kernels.deterministic)

    def init(key, hparams):
        return init_state(s, key, hparams)

    def run(state, hparams, num_log_points):
        return loop.scan_log_points(lambda state: log_period(s, hparams, state), state, num_log_points)

    return Trainer(init=init, run=run, num_log_points=agent.num_updates // agent.log_interval)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action` in the env's own action space: the argmax of the logits,
    or the Gaussian mean clipped and mapped to the Box bounds (the key is unused)."""
    env, env_params = loop.make_env(config)
    net, continuous = make_network(config.agent, env, env_params)
    return lambda params, obs, key: loop.to_env_action(env, env_params, greedy_action(net.apply(params, obs)[0], continuous))
