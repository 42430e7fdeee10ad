"""DQN (Mnih et al. 2015) with optional double-Q (van Hasselt et al. 2016), compiled end to end.

For a sampled transition (s, a, r, s', terminated), s' = info["final_obs"] (the state actually
reached, before any auto-reset: a time-limit truncation still bootstraps, only termination stops it):

    y    = r + gamma * (1 - terminated) * Q_target(s', a*),
    a*   = argmax_a Q_target(s', a)      (DQN)   or   argmax_a Q_online(s', a)   (double-Q),
    loss = mean_batch huber(Q_online(s, a) - y)   (or the squared error),

minimised by Adam with global-norm gradient clipping. The target network follows the online one
every `target_update_interval` gradient steps: target <- tau * online + (1 - tau) * target
(tau = 1: a hard copy; tau < 1: Polyak averaging).

The loop, as in Stable-Baselines3: `num_envs` envs step together with epsilon-greedy actions
(epsilon decays linearly from `epsilon_start` to `epsilon_end` over `epsilon_decay_steps` env steps)
and every transition goes to a uniform replay buffer; after every `train_freq` env steps (all envs
counted) the agent takes `gradient_steps` gradient steps on batches of `batch_size`, once at least
`learning_starts` env steps have been taken. At each log point (every `log_interval` env steps)
`eval_episodes` greedy episodes run on separate eval envs inside the compiled program:
"eval_return" is their mean return.

All of it is one `lax.scan` over log points, so `jax.vmap(train)(keys)` trains many seeds at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax

import envs
from envs.spaces import Discrete
from rl import buffers, networks
from rl.agents import Trainer, train_from_trainer
from rl.config import ConfigError, hp
from rl.logging import emit
from rl.rollout import greedy_episodes


@dataclass(frozen=True)
class Config:
    name: str = "dqn"
    total_steps: int = hp(102_400, low=1, doc="env steps per seed (all envs counted)")
    num_envs: int = hp(1, low=1, doc="envs stepped together")
    buffer_size: int = hp(100_000, low=1, doc="replay capacity (transitions)")
    learning_starts: int = hp(1_000, low=0, doc="env steps before the first gradient step")
    batch_size: int = hp(64, low=1)
    train_freq: int = hp(256, low=1, doc="env steps between training phases (multiple of num_envs)")
    gradient_steps: int = hp(128, low=1, doc="gradient steps per training phase")
    lr: float = hp(5e-4, low=0.0, low_open=True, sweep=True, doc="Adam step size")
    gamma: float = hp(0.99, low=0.0, high=1.0, sweep=True, doc="discount")
    max_grad_norm: float = hp(10.0, low=0.0, low_open=True, sweep=True, doc="global-norm gradient clipping")
    target_update_interval: int = hp(256, low=1, doc="gradient steps between target updates")
    tau: float = hp(1.0, low=0.0, high=1.0, low_open=True, sweep=True, doc="target <- tau * online + (1 - tau) * target")
    epsilon_start: float = hp(1.0, low=0.0, high=1.0, sweep=True)
    epsilon_end: float = hp(0.04, low=0.0, high=1.0, sweep=True)
    epsilon_decay_steps: int = hp(8_000, low=1, doc="env steps of the linear epsilon decay")
    loss: str = hp("huber", choices=("huber", "mse"))
    double_q: bool = hp(True, doc="select the bootstrap action with the online network")
    hidden: tuple[int, ...] = hp((128, 128), doc="MLP hidden widths")
    activation: str = hp("relu", choices=tuple(networks.ACTIVATIONS))
    network_backend: str = hp("flax", choices=networks.BACKENDS)
    log_interval: int = hp(2_560, low=1, doc="env steps between log points (multiple of train_freq)")
    eval_episodes: int = hp(10, low=1, doc="greedy episodes per log point, on separate eval envs")

    def validate(self):
        validate_loop(self)


def validate_loop(c) -> None:
    """The step counts of the loop must nest: num_envs | train_freq | log_interval | total_steps."""
    if c.train_freq % c.num_envs:
        raise ConfigError(f"agent.train_freq ({c.train_freq}) must be a multiple of agent.num_envs ({c.num_envs})")
    if c.log_interval % c.train_freq:
        raise ConfigError(f"agent.log_interval ({c.log_interval}) must be a multiple of agent.train_freq ({c.train_freq})")
    if c.total_steps % c.log_interval:
        raise ConfigError(f"agent.total_steps ({c.total_steps}) must be a multiple of agent.log_interval ({c.log_interval})")
    if c.num_envs > c.buffer_size:
        raise ConfigError(f"agent.buffer_size ({c.buffer_size}) must hold at least one step of agent.num_envs ({c.num_envs}) envs")
    if any(width < 1 for width in c.hidden):
        raise ConfigError(f"agent.hidden: widths must be positive, got {list(c.hidden)}")


def check_env(config) -> None:
    """Q-learning with a network needs discrete actions."""
    env, params = envs.make(config.env.id, **dict(config.env.params))
    if not isinstance(env.action_space(params), Discrete):
        raise ConfigError(f"env.id: {config.agent.name} needs discrete actions; {config.env.id} has {env.action_space(params)}")


# ---------------------------------------------------------------- small pieces shared with rainbow.py


def num_discrete_obs(env, env_params):
    space = env.observation_space(env_params)
    return int(space.n) if isinstance(space, Discrete) else None


def optimiser(hparams):
    """Adam on clipped gradients, the step size read from the traced hyperparameters."""
    return optax.chain(optax.clip_by_global_norm(hparams["max_grad_norm"]), optax.scale_by_adam(), optax.scale(-hparams["lr"]))


def epsilon_greedy(key, q_values, epsilon):
    """Per row of `q_values` [envs, actions]: a uniform random action with probability epsilon, else argmax."""
    k_explore, k_action = jax.random.split(key)
    explore = jax.random.uniform(k_explore, q_values.shape[:-1]) < epsilon
    random_action = jax.random.randint(k_action, q_values.shape[:-1], 0, q_values.shape[-1])
    return jnp.where(explore, random_action, jnp.argmax(q_values, axis=-1)).astype(jnp.int32)


def update_target(target, online, tau, do_update):
    """target <- tau * online + (1 - tau) * target where `do_update`, else unchanged."""
    return jax.tree.map(lambda t, o: jnp.where(do_update, tau * o + (1.0 - tau) * t, t), target, online)


def init_episode_stats(num_envs):
    return {"return": jnp.zeros((num_envs,), jnp.float32), "length": jnp.zeros((num_envs,), jnp.int32)}


def track_episodes(running, ended, reward, done):
    """Add a step's rewards to the running episodes; move the finished ones into `ended` sums."""
    ret, length = running["return"] + reward, running["length"] + 1
    ended = {
        "return": ended["return"] + jnp.sum(jnp.where(done, ret, 0.0)),
        "length": ended["length"] + jnp.sum(jnp.where(done, length, 0)),
        "count": ended["count"] + jnp.sum(done),
    }
    return {"return": jnp.where(done, 0.0, ret), "length": jnp.where(done, 0, length)}, ended


def zero_ended():
    return {"return": jnp.float32(0.0), "length": jnp.int32(0), "count": jnp.int32(0)}


def episode_metrics(ended):
    """Means over the episodes that ended in a period (NaN if none did)."""
    some = ended["count"] > 0
    count = jnp.maximum(ended["count"], 1)
    return {
        "episode_return": jnp.where(some, ended["return"] / count, jnp.nan),
        "episode_length": jnp.where(some, ended["length"] / count, jnp.nan),
        "episodes": ended["count"],
    }


# ---------------------------------------------------------------- the loss


def td_loss(q_apply, params, target_params, batch, gamma, double_q: bool, loss: str):
    """(loss, (td_errors, q_taken)) for a batch of transitions (see the module docstring)."""
    q = q_apply(params, batch["obs"])
    q_taken = jnp.take_along_axis(q, batch["action"][:, None], axis=-1)[:, 0]
    q_next_target = q_apply(target_params, batch["next_obs"])
    if double_q:
        next_action = jnp.argmax(q_apply(params, batch["next_obs"]), axis=-1)
    else:
        next_action = jnp.argmax(q_next_target, axis=-1)
    next_value = jnp.take_along_axis(q_next_target, next_action[:, None], axis=-1)[:, 0]
    target = batch["reward"] + gamma * (1.0 - batch["terminated"].astype(jnp.float32)) * next_value
    td = q_taken - jax.lax.stop_gradient(target)
    per_item = optax.huber_loss(td, delta=1.0) if loss == "huber" else jnp.square(td)
    return per_item.mean(), (td, q_taken)


# ---------------------------------------------------------------- training


def make_phase(env_step, gradient_step, env_iterations: int, gradient_steps: int, learning_starts: int):
    """`phase((state, ended), key) -> ((state, ended), (losses, q_means))`: `env_iterations` steps of the
    batched envs, then `gradient_steps` gradient steps once `state["step"] >= learning_starts` (NaN
    losses before that). `gradient_step(state, key) -> (state, (loss, q_mean))`."""

    def train_phase(state, key):
        return jax.lax.scan(gradient_step, state, jax.random.split(key, gradient_steps))

    def skip_phase(state, key):
        nan = jnp.full((gradient_steps,), jnp.nan, jnp.float32)
        return state, (nan, nan)

    def phase(carry, key):
        k_roll, k_train = jax.random.split(key)
        (state, ended), _ = jax.lax.scan(env_step, carry, jax.random.split(k_roll, env_iterations))
        state, (loss, q_mean) = jax.lax.cond(state["step"] >= learning_starts, train_phase, skip_phase, state, k_train)
        return (state, ended), (loss, q_mean)

    return phase


def make_trainer(config) -> Trainer:
    env, env_params = envs.make(config.env.id, **dict(config.env.params))
    agent = config.agent
    num_actions = env.action_space(env_params).n
    network = networks.build(
        networks.q_mlp(num_actions, agent.hidden, agent.activation, num_discrete_obs(env, env_params)), agent.network_backend
    )
    iterations_per_phase = agent.train_freq // agent.num_envs
    phases_per_log = agent.log_interval // agent.train_freq
    vmap_reset = jax.vmap(env.reset, in_axes=(0, None))
    vmap_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def init(key, hparams):
        key, net_key, reset_key = jax.random.split(key, 3)
        obs, env_state = vmap_reset(jax.random.split(reset_key, agent.num_envs), env_params)
        params = network.init(net_key, obs[0])
        example = {"obs": obs[0], "action": jnp.int32(0), "reward": jnp.float32(0.0), "next_obs": obs[0], "terminated": jnp.bool_(False)}
        return {
            "params": params,
            "target_params": params,
            "opt_state": optimiser(hparams).init(params),
            "buffer": buffers.uniform_init(example, agent.buffer_size),
            "obs": obs,
            "env_state": env_state,
            "episodes": init_episode_stats(agent.num_envs),
            "key": key,
            "step": jnp.int32(0),
            "updates": jnp.int32(0),
        }

    def run(state, hparams, num_log_points):
        tx = optimiser(hparams)

        def env_step(carry, key):
            """All envs take one epsilon-greedy step; the transitions go to the buffer."""
            state, ended = carry
            k_act, k_env = jax.random.split(key)
            epsilon = buffers.linear_schedule(hparams["epsilon_start"], hparams["epsilon_end"], agent.epsilon_decay_steps, state["step"])
            action = epsilon_greedy(k_act, network.apply(state["params"], state["obs"]), epsilon)
            obs, env_state, reward, terminated, truncated, info = vmap_step(jax.random.split(k_env, agent.num_envs), state["env_state"], action, env_params)
            transition = {"obs": state["obs"], "action": action, "reward": reward, "next_obs": info["final_obs"], "terminated": terminated}
            episodes, ended = track_episodes(state["episodes"], ended, reward, terminated | truncated)
            state = {**state, "buffer": buffers.uniform_add(state["buffer"], transition), "obs": obs, "env_state": env_state,
                     "episodes": episodes, "step": state["step"] + agent.num_envs}
            return (state, ended), None

        def gradient_step(state, key):
            batch, _ = buffers.uniform_sample(state["buffer"], key, agent.batch_size)
            loss_fn = lambda p: td_loss(network.apply, p, state["target_params"], batch, hparams["gamma"], agent.double_q, agent.loss)
            (loss, (_, q_taken)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
            updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
            params = optax.apply_updates(state["params"], updates)
            num_updates = state["updates"] + 1
            target = update_target(state["target_params"], params, hparams["tau"], num_updates % agent.target_update_interval == 0)
            state = {**state, "params": params, "target_params": target, "opt_state": opt_state, "updates": num_updates}
            return state, (loss, q_taken.mean())

        phase = make_phase(env_step, gradient_step, iterations_per_phase, agent.gradient_steps, agent.learning_starts)

        def log_period(state, _):
            key, k_phases, k_eval = jax.random.split(state["key"], 3)
            (state, ended), (loss, q_mean) = jax.lax.scan(phase, ({**state, "key": key}, zero_ended()), jax.random.split(k_phases, phases_per_log))
            greedy = lambda obs: jnp.argmax(network.apply(state["params"], obs), axis=-1).astype(jnp.int32)
            metrics = {
                "step": state["step"],
                **episode_metrics(ended),
                "eval_return": greedy_episodes(env, env_params, greedy, k_eval, agent.eval_episodes)[0].mean(),
                "loss": jnp.nanmean(loss),
                "q_mean": jnp.nanmean(q_mean),
                "epsilon": buffers.linear_schedule(hparams["epsilon_start"], hparams["epsilon_end"], agent.epsilon_decay_steps, state["step"]),
                "gradient_steps": state["updates"],
            }
            return state, emit(metrics)

        return jax.lax.scan(log_period, state, None, length=num_log_points)

    return Trainer(init=init, run=run, num_log_points=agent.total_steps // agent.log_interval)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action`: argmax of the online Q-network (first index on ties)."""
    env, env_params = envs.make(config.env.id, **dict(config.env.params))
    agent = config.agent
    network = networks.build(
        networks.q_mlp(env.action_space(env_params).n, agent.hidden, agent.activation, num_discrete_obs(env, env_params)), agent.network_backend
    )

    def policy(params, obs, key):
        return jnp.argmax(network.apply(params, obs), axis=-1).astype(jnp.int32)

    return policy
