"""Soft Actor-Critic (SAC) with twin Q-networks, Polyak targets and automatic temperature tuning,
compiled end to end; continuous (tanh-squashed Gaussian) and discrete (categorical) actions.

Every iteration the `num_envs` envs take one step (uniformly random actions for the first
`learning_starts` env steps), the transitions (s, a, r, s' = info["final_obs"], terminated) go to a
uniform replay buffer (rl.buffers), and then `utd_ratio * num_envs` gradient steps follow, each on
a fresh minibatch. With alpha = exp(log_alpha) and Q = min(Q1, Q2):

    critic:  y = r + gamma (1 - terminated) (Q_targ(s', a') - alpha log pi(a'|s')),  a' ~ pi(s')
             L_Q = sum_i mean((Q_i(s, a) - y)^2) / 2                  (y held fixed)
    actor:   L_pi = mean(alpha log pi(a|s) - Q(s, a)),  a = tanh(mu + sigma eps) (reparameterised)
    alpha:   L_alpha = -mean(log_alpha (log pi(a|s) + target_entropy))   (log pi held fixed)
    targets: theta_targ <- tau theta + (1 - tau) theta_targ

Truncation is not termination: only `terminated` zeroes the bootstrap, and s' is the observation
actually reached (before auto-reset), so a time-limit end still bootstraps.

Continuous policy: u ~ N(mu(s), sigma(s)^2), a = tanh(u) in (-1, 1)^|A|, rescaled affinely to the
env's bounds. Its log-density (the affine rescale is a constant and is left out):

    log pi(a|s) = sum_j [log N(u_j; mu_j, sigma_j) - log(1 - tanh(u_j)^2)],
    log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))        (stable for large |u|)

and log sigma is bounded in [log_std_min, log_std_max] by a scaled tanh (rl.networks). Target
entropy: -target_entropy_scale * |A| (the usual -|A| with scale 1).

Discrete policy (Christodoulou 2019): pi = softmax(logits); expectations over actions replace
sampling: y = r + gamma (1 - terminated) sum_a' pi(a'|s') (Q_targ(s', a') - alpha log pi(a'|s')),
L_pi = mean(sum_a pi(a|s) (alpha log pi(a|s) - Q(s, a))), and the alpha loss uses the policy's
entropy; target entropy: target_entropy_scale * log|A| (a fraction of the uniform policy's entropy).

Sweepable hyperparameters (lr, alpha_lr, gamma, tau, init_alpha, target_entropy_scale,
max_grad_norm) are read from `hparams` inside the compiled program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax

import envs
from envs.spaces import Box, Discrete
from rl import buffers, networks
from rl.agents import Trainer, train_from_trainer
from rl.config import ConfigError, hp
from rl.logging import emit
from rl.rollout import greedy_episodes


@dataclass(frozen=True)
class Config:
    name: str = "sac"
    total_steps: int = hp(20_000, low=1, doc="env steps per seed (all envs counted)")
    num_envs: int = hp(1, low=1, doc="envs stepped together")
    buffer_size: int = hp(100_000, low=1, doc="replay capacity (transitions)")
    learning_starts: int = hp(1_000, low=0, doc="env steps of uniformly random actions before learning")
    batch_size: int = hp(256, low=1)
    utd_ratio: float = hp(1.0, low=0.0, low_open=True, doc="gradient steps per env step (utd_ratio * num_envs must be a whole number)")
    lr: float = hp(1e-3, low=0.0, low_open=True, sweep=True, doc="Adam step size of actor and critics")
    alpha_lr: float = hp(1e-3, low=0.0, low_open=True, sweep=True, doc="Adam step size of log alpha")
    gamma: float = hp(0.99, low=0.0, high=1.0, sweep=True, doc="discount")
    tau: float = hp(0.005, low=0.0, high=1.0, low_open=True, sweep=True, doc="Polyak step of the target critics")
    init_alpha: float = hp(1.0, low=0.0, low_open=True, sweep=True, doc="initial entropy temperature")
    autotune_alpha: bool = hp(True, doc="tune alpha toward the target entropy (else alpha stays init_alpha)")
    target_entropy_scale: float = hp(1.0, sweep=True, doc="target entropy = -scale*|A| (continuous) or scale*log|A| (discrete)")
    max_grad_norm: float = hp(1e6, low=0.0, low_open=True, sweep=True, doc="global gradient-norm clip (large: off)")
    hidden: tuple[int, ...] = hp((256, 256), doc="hidden widths of actor and critics")
    activation: str = hp("relu", choices=tuple(networks.ACTIVATIONS))
    log_std_min: float = hp(-5.0, doc="lower bound of the policy's log-std (continuous)")
    log_std_max: float = hp(2.0, doc="upper bound of the policy's log-std (continuous)")
    network_backend: str = hp("flax", choices=networks.BACKENDS)
    log_interval: int = hp(1_000, low=1, doc="env steps between log points (multiple of num_envs)")
    eval_episodes: int = hp(8, low=0, doc="deterministic evaluation episodes per log point (0: none)")

    @property
    def gradient_steps(self) -> int:
        """Gradient steps after each vectorised env step."""
        return int(round(self.utd_ratio * self.num_envs))

    def validate(self):
        if abs(self.utd_ratio * self.num_envs - self.gradient_steps) > 1e-9 or self.gradient_steps < 1:
            raise ConfigError(f"agent.utd_ratio ({self.utd_ratio}) * agent.num_envs ({self.num_envs}) must be a whole number >= 1")
        if self.log_interval % self.num_envs:
            raise ConfigError(f"agent.log_interval ({self.log_interval}) must be a multiple of agent.num_envs ({self.num_envs})")
        if self.total_steps % self.log_interval:
            raise ConfigError(f"agent.total_steps ({self.total_steps}) must be a multiple of agent.log_interval ({self.log_interval})")
        if self.log_std_min >= self.log_std_max:
            raise ConfigError(f"agent.log_std_min ({self.log_std_min}) must be below agent.log_std_max ({self.log_std_max})")
        if not self.hidden or any(w < 1 for w in self.hidden):
            raise ConfigError(f"agent.hidden must list positive widths, got {list(self.hidden)}")


def check_env(config) -> None:
    """SAC needs Box observations and bounded Box (or Discrete) actions."""
    env, params = envs.make(config.env.id, **dict(config.env.params))
    action_space, obs_space = env.action_space(params), env.observation_space(params)
    if not isinstance(obs_space, Box):
        raise ConfigError(f"env.id: sac needs vector (Box) observations; {config.env.id} has {obs_space}")
    if isinstance(action_space, Box) and not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
        raise ConfigError(f"env.id: sac needs bounded Box actions; {config.env.id} has {action_space}")


# ---------------------------------------------------------------- policy pieces


def tanh_log_det_jacobian(u):
    """log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), elementwise, stable for large |u|."""
    return 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))


def squashed_gaussian_sample(mean, log_std, key):
    """(a, log pi(a)) with a = tanh(mu + sigma eps), eps ~ N(0, I); log pi summed over the last axis
    (see the module docstring). Differentiable in mean and log_std (reparameterised)."""
    eps = jax.random.normal(key, mean.shape)
    u = mean + jnp.exp(log_std) * eps
    log_normal = -0.5 * eps * eps - log_std - 0.5 * math.log(2.0 * math.pi)
    return jnp.tanh(u), jnp.sum(log_normal - tanh_log_det_jacobian(u), axis=-1)


def squashed_gaussian_log_prob(mean, log_std, u):
    """log pi(tanh(u)) for a given pre-squash u (for tests and diagnostics)."""
    z = (u - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z * z - log_std - 0.5 * math.log(2.0 * math.pi) - tanh_log_det_jacobian(u), axis=-1)


def polyak(target, online, tau):
    """tau * online + (1 - tau) * target, leaf by leaf."""
    return jax.tree.map(lambda t, o: tau * o + (1.0 - tau) * t, target, online)


def rescale(action, low, high):
    """a in [-1, 1] -> low + (a + 1) (high - low) / 2."""
    return low + (action + 1.0) * 0.5 * (high - low)


# ---------------------------------------------------------------- losses


def continuous_losses(actor, critic):
    """The three SAC losses for a squashed Gaussian policy; `actor(params, obs) -> (mean, log_std)`,
    `critic(params, obs, action) -> (q1, q2)`."""

    def critic_loss(critic_params, actor_params, target_params, log_alpha, batch, key, gamma):
        mean, log_std = actor(actor_params, batch["next_obs"])
        next_action, next_log_prob = squashed_gaussian_sample(mean, log_std, key)
        q1_t, q2_t = critic(target_params, batch["next_obs"], next_action)
        soft_value = jnp.minimum(q1_t, q2_t) - jnp.exp(log_alpha) * next_log_prob
        y = jax.lax.stop_gradient(batch["reward"] + gamma * (1.0 - batch["terminated"].astype(jnp.float32)) * soft_value)
        q1, q2 = critic(critic_params, batch["obs"], batch["action"])
        return 0.5 * (jnp.mean(jnp.square(q1 - y)) + jnp.mean(jnp.square(q2 - y))), jnp.mean(q1)

    def actor_loss(actor_params, critic_params, log_alpha, batch, key):
        mean, log_std = actor(actor_params, batch["obs"])
        action, log_prob = squashed_gaussian_sample(mean, log_std, key)
        q1, q2 = critic(critic_params, batch["obs"], action)
        return jnp.mean(jnp.exp(log_alpha) * log_prob - jnp.minimum(q1, q2)), -jnp.mean(log_prob)

    return critic_loss, actor_loss


def discrete_losses(actor, critic):
    """The SAC losses for a categorical policy (expectations over actions); `actor(params, obs) -> logits`,
    `critic(params, obs) -> (q1, q2)` of shape [..., A]."""

    def critic_loss(critic_params, actor_params, target_params, log_alpha, batch, key, gamma):
        log_pi = jax.nn.log_softmax(actor(actor_params, batch["next_obs"]))
        q1_t, q2_t = critic(target_params, batch["next_obs"])
        soft_value = jnp.sum(jnp.exp(log_pi) * (jnp.minimum(q1_t, q2_t) - jnp.exp(log_alpha) * log_pi), axis=-1)
        y = jax.lax.stop_gradient(batch["reward"] + gamma * (1.0 - batch["terminated"].astype(jnp.float32)) * soft_value)
        q1, q2 = critic(critic_params, batch["obs"])
        a = batch["action"][:, None]
        q1, q2 = jnp.take_along_axis(q1, a, -1)[:, 0], jnp.take_along_axis(q2, a, -1)[:, 0]
        return 0.5 * (jnp.mean(jnp.square(q1 - y)) + jnp.mean(jnp.square(q2 - y))), jnp.mean(q1)

    def actor_loss(actor_params, critic_params, log_alpha, batch, key):
        log_pi = jax.nn.log_softmax(actor(actor_params, batch["obs"]))
        pi = jnp.exp(log_pi)
        q1, q2 = critic(critic_params, batch["obs"])
        q = jax.lax.stop_gradient(jnp.minimum(q1, q2))
        entropy = -jnp.sum(pi * log_pi, axis=-1)
        return jnp.mean(jnp.sum(pi * (jnp.exp(log_alpha) * log_pi - q), axis=-1)), jnp.mean(entropy)

    return critic_loss, actor_loss


def alpha_loss(log_alpha, entropy, target_entropy):
    """-log_alpha (log pi + target_entropy) = log_alpha (H - target_entropy), with H the (fixed) policy entropy."""
    return log_alpha * (jax.lax.stop_gradient(entropy) - target_entropy)


# ---------------------------------------------------------------- the trainer


def make_networks(config):
    env, env_params = envs.make(config.env.id, **dict(config.env.params))
    agent = config.agent
    space = env.action_space(env_params)
    continuous = isinstance(space, Box)
    if continuous:
        action_dim = int(np.prod(space.shape))
        actor_fn = networks.squashed_gaussian_actor(action_dim, agent.hidden, agent.activation, agent.log_std_min, agent.log_std_max)
        critic_fn = networks.twin_q(agent.hidden, agent.activation)
    else:
        action_dim = int(space.n)
        actor_fn = lambda layers, obs: layers.dense(networks.mlp(layers, networks.preprocess_obs(obs), agent.hidden, agent.activation), action_dim, scale=0.01)
        critic_fn = networks.twin_q(agent.hidden, agent.activation, num_actions=action_dim)
    return networks.build(actor_fn, agent.network_backend), networks.build(critic_fn, agent.network_backend), continuous, action_dim


def make_trainer(config) -> Trainer:
    agent = config.agent
    env, env_params = envs.make(config.env.id, **dict(config.env.params))
    actor, critic, continuous, action_dim = make_networks(config)
    space = env.action_space(env_params)
    if continuous:
        low = jnp.asarray(np.broadcast_to(np.asarray(space.low, np.float32), space.shape))
        high = jnp.asarray(np.broadcast_to(np.asarray(space.high, np.float32), space.shape))
        critic_loss_fn, actor_loss_fn = continuous_losses(actor.apply, critic.apply)
        env_action = lambda a: rescale(a, low, high)
    else:
        critic_loss_fn, actor_loss_fn = discrete_losses(actor.apply, critic.apply)
        env_action = lambda a: a
    num_envs = agent.num_envs
    iterations_per_log = agent.log_interval // num_envs
    vreset = jax.vmap(env.reset, in_axes=(0, None))
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def target_entropy(hparams):
        if continuous:
            return -hparams["target_entropy_scale"] * action_dim
        return hparams["target_entropy_scale"] * math.log(action_dim)

    def optimizers(hparams):
        adam = lambda lr: optax.chain(optax.clip_by_global_norm(hparams["max_grad_norm"]), optax.adam(lr))
        return adam(hparams["lr"]), adam(hparams["lr"]), optax.adam(hparams["alpha_lr"])

    def init(key, hparams):
        key, actor_key, critic_key, reset_key = jax.random.split(key, 4)
        obs, env_state = vreset(jax.random.split(reset_key, num_envs), env_params)
        example_action = jnp.zeros(space.shape, jnp.float32) if continuous else jnp.int32(0)
        params = {
            "actor": actor.init(actor_key, obs[0]),
            "critic": critic.init(critic_key, obs[0], example_action) if continuous else critic.init(critic_key, obs[0]),
            "log_alpha": jnp.log(hparams["init_alpha"]).astype(jnp.float32),
        }
        params["target_critic"] = params["critic"]
        actor_opt, critic_opt, alpha_opt = optimizers(hparams)
        example = {"obs": obs[0], "action": example_action, "reward": jnp.float32(0.0), "next_obs": obs[0], "terminated": jnp.bool_(False)}
        return {
            "params": params,
            "opt_state": {"actor": actor_opt.init(params["actor"]), "critic": critic_opt.init(params["critic"]), "log_alpha": alpha_opt.init(params["log_alpha"])},
            "buffer": buffers.uniform_init(example, agent.buffer_size),
            "obs": obs,
            "env_state": env_state,
            "key": key,
            "step": jnp.int32(0),
            "episode_return": jnp.zeros(num_envs, jnp.float32),
            "episode_length": jnp.zeros(num_envs, jnp.int32),
        }

    def act(actor_params, obs, key, step):
        """Uniformly random actions before learning_starts, else a sample of the policy."""
        policy_key, random_key = jax.random.split(key)
        if continuous:
            mean, log_std = actor.apply(actor_params, obs)
            action, _ = squashed_gaussian_sample(mean, log_std, policy_key)
            random_action = jax.random.uniform(random_key, action.shape, minval=-1.0, maxval=1.0)
        else:
            action = jax.random.categorical(policy_key, actor.apply(actor_params, obs)).astype(jnp.int32)
            random_action = jax.random.randint(random_key, action.shape, 0, action_dim, jnp.int32)
        return jnp.where(step < agent.learning_starts, random_action, action)

    def greedy(actor_params, obs):
        if continuous:
            return jnp.tanh(actor.apply(actor_params, obs)[0])
        return jnp.argmax(actor.apply(actor_params, obs), axis=-1).astype(jnp.int32)

    def run(state, hparams, num_log_points):
        actor_opt, critic_opt, alpha_opt = optimizers(hparams)
        entropy_target = target_entropy(hparams)

        def gradient_step(carry, key):
            params, opt_state, buffer = carry
            sample_key, critic_key, actor_key = jax.random.split(key, 3)
            batch, _ = buffers.uniform_sample(buffer, sample_key, agent.batch_size)
            (q_loss, q_mean), grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(
                params["critic"], params["actor"], params["target_critic"], params["log_alpha"], batch, critic_key, hparams["gamma"]
            )
            updates, critic_state = critic_opt.update(grads, opt_state["critic"], params["critic"])
            critic_params = optax.apply_updates(params["critic"], updates)
            (pi_loss, entropy), grads = jax.value_and_grad(actor_loss_fn, has_aux=True)(params["actor"], critic_params, params["log_alpha"], batch, actor_key)
            updates, actor_state = actor_opt.update(grads, opt_state["actor"], params["actor"])
            actor_params = optax.apply_updates(params["actor"], updates)
            log_alpha, alpha_state = params["log_alpha"], opt_state["log_alpha"]
            if agent.autotune_alpha:
                grad = jax.grad(alpha_loss)(log_alpha, entropy, entropy_target)
                updates, alpha_state = alpha_opt.update(grad, alpha_state, log_alpha)
                log_alpha = optax.apply_updates(log_alpha, updates)
            params = {"actor": actor_params, "critic": critic_params, "log_alpha": log_alpha, "target_critic": polyak(params["target_critic"], critic_params, hparams["tau"])}
            opt_state = {"actor": actor_state, "critic": critic_state, "log_alpha": alpha_state}
            return (params, opt_state, buffer), {"critic_loss": q_loss, "actor_loss": pi_loss, "q_mean": q_mean, "entropy": entropy}

        def learn(carry, key):
            return jax.lax.scan(gradient_step, carry, jax.random.split(key, agent.gradient_steps))

        def skip(carry, key):
            nan = jnp.full((agent.gradient_steps,), jnp.nan, jnp.float32)
            return carry, {"critic_loss": nan, "actor_loss": nan, "q_mean": nan, "entropy": nan}

        def iteration(carry, key):
            """All envs take one step; then the gradient steps, once learning has started."""
            state, stats = carry
            act_key, env_key, learn_key = jax.random.split(key, 3)
            action = act(state["params"]["actor"], state["obs"], act_key, state["step"])
            obs, env_state, reward, terminated, truncated, info = vstep(jax.random.split(env_key, num_envs), state["env_state"], env_action(action), env_params)
            transition = {"obs": state["obs"], "action": action, "reward": reward, "next_obs": info["final_obs"], "terminated": terminated}
            buffer = buffers.uniform_add(state["buffer"], transition)
            done = terminated | truncated
            ep_return, ep_length = state["episode_return"] + reward, state["episode_length"] + 1
            sum_return, sum_length, episodes = stats
            stats = (sum_return + jnp.sum(jnp.where(done, ep_return, 0.0)), sum_length + jnp.sum(jnp.where(done, ep_length, 0)), episodes + jnp.sum(done))
            step = state["step"] + num_envs
            (params, opt_state, buffer), aux = jax.lax.cond(step >= agent.learning_starts, learn, skip, (state["params"], state["opt_state"], buffer), learn_key)
            state = {
                **state,
                "params": params,
                "opt_state": opt_state,
                "buffer": buffer,
                "obs": obs,
                "env_state": env_state,
                "step": step,
                "episode_return": jnp.where(done, 0.0, ep_return),
                "episode_length": jnp.where(done, 0, ep_length),
            }
            return (state, stats), jax.tree.map(lambda x: x[-1], aux)

        def log_period(state, _):
            key, iter_key, eval_key = jax.random.split(state["key"], 3)
            zero_stats = (jnp.float32(0.0), jnp.int32(0), jnp.int32(0))
            (state, (sum_return, sum_length, episodes)), aux = jax.lax.scan(iteration, ({**state, "key": key}, zero_stats), jax.random.split(iter_key, iterations_per_log))
            metrics = {
                "step": state["step"],
                "episode_return": jnp.where(episodes > 0, sum_return / jnp.maximum(episodes, 1), jnp.nan),
                "episode_length": jnp.where(episodes > 0, sum_length / jnp.maximum(episodes, 1), jnp.nan),
                "episodes": episodes,
                "alpha": jnp.exp(state["params"]["log_alpha"]),
                **{name: jnp.nanmean(value) for name, value in aux.items()},
            }
            if agent.eval_episodes:
                metrics["eval_return"] = evaluate(state["params"]["actor"], eval_key)
            return state, emit(metrics)

        return jax.lax.scan(log_period, state, None, length=num_log_points)

    def evaluate(actor_params, key):
        """Mean return of `eval_episodes` episodes (one per env, from reset) under the greedy policy."""
        act = lambda obs: env_action(greedy(actor_params, obs))
        return greedy_episodes(env, env_params, act, key, agent.eval_episodes)[0].mean()

    return Trainer(init=init, run=run, num_log_points=agent.total_steps // agent.log_interval)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action`: tanh of the Gaussian mean rescaled to the bounds, or the
    argmax of the logits (the key is unused)."""
    env, env_params = envs.make(config.env.id, **dict(config.env.params))
    actor, _, continuous, _ = make_networks(config)
    space = env.action_space(env_params)

    def policy(params, obs, key):
        out = actor.apply(params["actor"], obs)
        if continuous:
            low = jnp.asarray(np.broadcast_to(np.asarray(space.low, np.float32), space.shape))
            high = jnp.asarray(np.broadcast_to(np.asarray(space.high, np.float32), space.shape))
            return rescale(jnp.tanh(out[0]), low, high)
        return jnp.argmax(out, axis=-1).astype(jnp.int32)

    return policy
