"""Rainbow (Hessel et al. 2018) with every component switchable, compiled end to end.

Components (config keys): `distributional` (C51 over `num_atoms` atoms on [v_min, v_max]),
`dueling` streams, `noisy` factorised-Gaussian head layers (exploration by parameter noise; keep
epsilon at 0 with them), `n_step` returns, prioritized replay (`per`), `double_q` action selection.
Switching them off one at a time gives Rainbow's ablations from config files alone; all off
(num_atoms irrelevant, n_step 1) is DQN with a dueling-free MLP.

N-step transitions. Each env keeps a window of its last n steps. Once full, the oldest step t
becomes one stored transition (obs_t, a_t, R, s_boot, terminated_L, L + 1): with L the first step
in the window where the episode ended (terminated or truncated), or n - 1,

    R = sum_{k=0..L} gamma^k r_{t+k}      (kernels.discounted_returns with discounts gamma * (1 - done)),
    s_boot = info["final_obs"] of step t+L (pre-reset: a truncated episode bootstraps from it),

and the bootstrap discount is gamma^(L+1) * (1 - terminated_{t+L}). So truncation bootstraps and
termination does not, at any position in the window. (The last n - 1 steps of a run are never stored.)

Targets, for a sampled transition, with the next action a* = argmax_a Q_online(s_boot, a) (double-Q)
or argmax_a Q_target(s_boot, a), and discount d = gamma^(L+1) (1 - terminated):

    distributional: m = project(R + d z, p_target(s_boot, a*)) onto the support z
                    (kernels.categorical_projection, probabilities by kernels.softmax),
                    loss_i = -sum_k m_k log p_online(s, a)_k (log-softmax for stability),
                    priority_i = KL(m || p_online(s, a));
    scalar:         y = R + d Q_target(s_boot, a*), loss_i = huber (or squared) TD error, priority_i = |TD|.

The batch loss is mean_i w_i loss_i with PER's importance weights w (1 for uniform replay); sampled
items get priority_i + per_eps. Noisy layers draw independent noise for acting (once per step, shared
by the envs), for the online net, the online next-state net and the target net; greedy evaluation
uses the noise-free mean network. The loop (phases of `train_freq` env steps then `gradient_steps`
gradient steps, eval at log points) is dqn.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax

import envs
from kernels.projection import categorical_projection
from kernels.returns import discounted_returns
from kernels.softmax import softmax
from rl import buffers, networks
from rl.agents import Trainer, train_from_trainer
from rl.agents.dqn import (
    check_env,  # noqa: F401  (discrete actions, re-exported for rl.config)
    episode_metrics,
    epsilon_greedy,
    init_episode_stats,
    make_phase,
    num_discrete_obs,
    optimiser,
    track_episodes,
    update_target,
    validate_loop,
    zero_ended,
)
from rl.config import ConfigError, hp
from rl.logging import emit
from rl.rollout import greedy_episodes


@dataclass(frozen=True)
class Config:
    name: str = "rainbow"
    total_steps: int = hp(61_440, low=1, doc="env steps per seed (all envs counted)")
    num_envs: int = hp(1, low=1, doc="envs stepped together")
    buffer_size: int = hp(16_384, low=1, doc="replay capacity (transitions); PER steps cost O(capacity) on XLA:CPU")
    learning_starts: int = hp(1_000, low=0, doc="env steps before the first gradient step")
    batch_size: int = hp(64, low=1)
    train_freq: int = hp(256, low=1, doc="env steps between training phases (multiple of num_envs)")
    gradient_steps: int = hp(128, low=1, doc="gradient steps per training phase")
    lr: float = hp(1e-3, low=0.0, low_open=True, sweep=True, doc="Adam step size")
    gamma: float = hp(0.99, low=0.0, high=1.0, sweep=True, doc="discount")
    max_grad_norm: float = hp(10.0, low=0.0, low_open=True, sweep=True, doc="global-norm gradient clipping")
    target_update_interval: int = hp(128, low=1, doc="gradient steps between target updates")
    tau: float = hp(1.0, low=0.0, high=1.0, low_open=True, sweep=True, doc="target <- tau * online + (1 - tau) * target")
    epsilon_start: float = hp(0.0, low=0.0, high=1.0, sweep=True, doc="epsilon-greedy on top of (or instead of) noisy nets")
    epsilon_end: float = hp(0.0, low=0.0, high=1.0, sweep=True)
    epsilon_decay_steps: int = hp(10_000, low=1)
    # components
    noisy: bool = hp(True, doc="factorised-Gaussian noisy head layers")
    dueling: bool = hp(True, doc="value and advantage streams")
    distributional: bool = hp(True, doc="C51 categorical returns (else scalar Q-values)")
    double_q: bool = hp(True, doc="select the bootstrap action with the online network")
    per: bool = hp(True, doc="proportional prioritized replay (else uniform)")
    n_step: int = hp(3, low=1, high=100, doc="steps of the n-step return")
    # their parameters
    num_atoms: int = hp(51, low=2, doc="C51 atoms")
    v_min: float = hp(0.0, doc="lowest atom")
    v_max: float = hp(100.0, doc="highest atom")
    per_alpha: float = hp(0.5, low=0.0, sweep=True, doc="priority exponent")
    per_beta_start: float = hp(0.4, low=0.0, high=1.0, sweep=True, doc="importance exponent, annealed to 1")
    per_beta_steps: int = hp(0, low=0, doc="env steps of the beta annealing (0: total_steps)")
    per_eps: float = hp(1e-6, low=0.0, low_open=True, sweep=True, doc="added to priorities")
    loss: str = hp("huber", choices=("huber", "mse"), doc="scalar (non-distributional) TD loss")
    hidden: tuple[int, ...] = hp((128, 128), doc="MLP torso widths")
    head_hidden: int = hp(0, low=0, doc="hidden units of each head stream (0: linear streams)")
    activation: str = hp("relu", choices=tuple(networks.ACTIVATIONS))
    network_backend: str = hp("flax", choices=networks.BACKENDS)
    log_interval: int = hp(2_560, low=1, doc="env steps between log points (multiple of train_freq)")
    eval_episodes: int = hp(10, low=1, doc="greedy episodes per log point, on separate eval envs")

    def validate(self):
        validate_loop(self)
        if self.distributional and not self.v_min < self.v_max:
            raise ConfigError(f"agent.v_min ({self.v_min}) must be below agent.v_max ({self.v_max})")


def build_network(config):
    env, env_params = envs.make(config.env.id, **dict(config.env.params))
    a = config.agent
    fn = networks.rainbow_q(
        env.action_space(env_params).n, a.hidden, a.head_hidden, a.num_atoms if a.distributional else 1,
        a.dueling, a.noisy, a.activation, num_discrete_obs(env, env_params),
    )
    return networks.build(fn, a.network_backend)


def q_values(outputs, support):
    """Q-values [..., A] from network outputs [..., A, atoms]: the mean of the softmax over the
    support when distributional, else the single output."""
    if support is None:
        return outputs[..., 0]
    return jnp.sum(softmax(outputs, axis=-1) * support, axis=-1)


# ---------------------------------------------------------------- n-step transitions


def push_window(window, step):
    """Drop the oldest of the last n steps [n, envs, ...] and append `step` [envs, ...]."""
    return jax.tree.map(lambda w, x: jnp.concatenate([w[1:], x[None].astype(w.dtype)], axis=0), window, step)


def n_step_transition(window, gamma):
    """The stored transition of the oldest step of a full window (see the module docstring).

    window: {"obs", "action", "reward", "final_obs", "terminated", "truncated"}, each [n, envs, ...].
    """
    n = window["reward"].shape[0]
    done = window["terminated"] | window["truncated"]
    discounts = gamma * (1.0 - done.astype(jnp.float32))
    ret = discounted_returns(window["reward"], discounts, jnp.zeros_like(window["reward"][0]))[0]
    last = jnp.arange(n)[:, None] == n - 1
    end = jnp.argmax(done | last, axis=0)  # [envs]: first episode end in the window, else n - 1
    take = lambda x: jnp.take_along_axis(x, end.reshape((1, -1) + (1,) * (x.ndim - 2)), axis=0)[0]
    return {
        "obs": window["obs"][0],
        "action": window["action"][0],
        "reward": ret,
        "next_obs": take(window["final_obs"]),
        "terminated": take(window["terminated"]),
        "bootstrap_steps": (end + 1).astype(jnp.int32),
    }


# ---------------------------------------------------------------- the loss


def categorical_target(reward, discount, next_probs, support):
    """m = project(reward + discount * z, next_probs) onto z (no gradient)."""
    atoms = reward[:, None] + discount[:, None] * support[None, :]
    return jax.lax.stop_gradient(categorical_projection(atoms, next_probs, support))


def rainbow_loss(apply, params, target_params, batch, weights, keys, gamma, support, double_q: bool, loss: str):
    """(weighted mean loss, (priorities, Q(s, a))) for a batch; see the module docstring."""
    k_online, k_next, k_target = keys
    rows = jnp.arange(batch["action"].shape[0])
    outputs = apply(params, batch["obs"], rng=k_online)[rows, batch["action"]]  # [B, atoms]
    next_target = apply(target_params, batch["next_obs"], rng=k_target)  # [B, A, atoms]
    if double_q:
        next_action = jnp.argmax(q_values(apply(params, batch["next_obs"], rng=k_next), support), axis=-1)
    else:
        next_action = jnp.argmax(q_values(next_target, support), axis=-1)
    discount = gamma ** batch["bootstrap_steps"].astype(jnp.float32) * (1.0 - batch["terminated"].astype(jnp.float32))
    if support is None:
        target = jax.lax.stop_gradient(batch["reward"] + discount * next_target[rows, next_action, 0])
        td = outputs[:, 0] - target
        per_item = optax.huber_loss(td, delta=1.0) if loss == "huber" else jnp.square(td)
        return jnp.mean(weights * per_item), (jnp.abs(td), outputs[:, 0])
    m = categorical_target(batch["reward"], discount, softmax(next_target[rows, next_action], axis=-1), support)
    log_p = jax.nn.log_softmax(outputs, axis=-1)
    cross_entropy = -jnp.sum(m * log_p, axis=-1)
    kl = cross_entropy + jnp.sum(jnp.where(m > 0, m * jnp.log(jnp.where(m > 0, m, 1.0)), 0.0), axis=-1)
    q_taken = jnp.sum(jnp.exp(log_p) * support, axis=-1)
    return jnp.mean(weights * cross_entropy), (jax.lax.stop_gradient(jnp.maximum(kl, 0.0)), q_taken)


# ---------------------------------------------------------------- training


def make_trainer(config) -> Trainer:
    env, env_params = envs.make(config.env.id, **dict(config.env.params))
    agent = config.agent
    network = build_network(config)
    support = jnp.linspace(agent.v_min, agent.v_max, agent.num_atoms, dtype=jnp.float32) if agent.distributional else None
    noise = (lambda key: key) if agent.noisy else (lambda key: None)
    iterations_per_phase = agent.train_freq // agent.num_envs
    phases_per_log = agent.log_interval // agent.train_freq
    beta_steps = agent.per_beta_steps or agent.total_steps
    n = agent.n_step
    vmap_reset = jax.vmap(env.reset, in_axes=(0, None))
    vmap_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    buffer_init = buffers.prioritized_init if agent.per else buffers.uniform_init
    buffer_add = buffers.prioritized_add if agent.per else buffers.uniform_add

    def init(key, hparams):
        key, net_key, reset_key = jax.random.split(key, 3)
        obs, env_state = vmap_reset(jax.random.split(reset_key, agent.num_envs), env_params)
        params = network.init(net_key, obs[0])
        zeros = lambda x: jnp.zeros((n,) + x.shape, x.dtype)
        flags = jnp.zeros((n, agent.num_envs), jnp.bool_)
        window = {"obs": zeros(obs), "action": zeros(jnp.zeros((agent.num_envs,), jnp.int32)), "reward": zeros(jnp.zeros((agent.num_envs,))),
                  "final_obs": zeros(obs), "terminated": flags, "truncated": flags}
        example = jax.tree.map(lambda x: x[0], n_step_transition(window, 0.0))
        return {
            "params": params,
            "target_params": params,
            "opt_state": optimiser(hparams).init(params),
            "buffer": buffer_init(example, agent.buffer_size),
            "window": window,
            "window_filled": jnp.int32(0),
            "obs": obs,
            "env_state": env_state,
            "episodes": init_episode_stats(agent.num_envs),
            "key": key,
            "step": jnp.int32(0),
            "updates": jnp.int32(0),
        }

    def run(state, hparams, num_log_points):
        tx = optimiser(hparams)
        epsilon_at = lambda step: buffers.linear_schedule(hparams["epsilon_start"], hparams["epsilon_end"], agent.epsilon_decay_steps, step)

        def env_step(carry, key):
            """All envs act (noisy and/or epsilon-greedy); the oldest step of each full window is stored."""
            state, ended = carry
            k_noise, k_act, k_env = jax.random.split(key, 3)
            q = q_values(network.apply(state["params"], state["obs"], rng=noise(k_noise)), support)
            action = epsilon_greedy(k_act, q, epsilon_at(state["step"]))
            obs, env_state, reward, terminated, truncated, info = vmap_step(jax.random.split(k_env, agent.num_envs), state["env_state"], action, env_params)
            step = {"obs": state["obs"], "action": action, "reward": reward, "final_obs": info["final_obs"], "terminated": terminated, "truncated": truncated}
            window = push_window(state["window"], step)
            filled = jnp.minimum(state["window_filled"] + 1, n)
            buffer = buffer_add(state["buffer"], n_step_transition(window, hparams["gamma"]), filled >= n)
            episodes, ended = track_episodes(state["episodes"], ended, reward, terminated | truncated)
            state = {**state, "buffer": buffer, "window": window, "window_filled": filled, "obs": obs, "env_state": env_state,
                     "episodes": episodes, "step": state["step"] + agent.num_envs}
            return (state, ended), None

        def gradient_step(state, key):
            k_sample, k_online, k_next, k_target = jax.random.split(key, 4)
            buffer = state["buffer"]
            if agent.per:
                beta = buffers.linear_schedule(hparams["per_beta_start"], 1.0, beta_steps, state["step"])
                batch, indices, weights = buffers.prioritized_sample(buffer, k_sample, agent.batch_size, beta)
            else:
                batch, indices = buffers.uniform_sample(buffer, k_sample, agent.batch_size)
                weights = jnp.ones((agent.batch_size,), jnp.float32)
            keys = (noise(k_online), noise(k_next), noise(k_target))
            loss_fn = lambda p: rainbow_loss(network.apply, p, state["target_params"], batch, weights, keys, hparams["gamma"], support, agent.double_q, agent.loss)
            (loss, (priorities, q_taken)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
            if agent.per:
                buffer = buffers.prioritized_update(buffer, indices, priorities + hparams["per_eps"], hparams["per_alpha"])
            updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
            params = optax.apply_updates(state["params"], updates)
            num_updates = state["updates"] + 1
            target = update_target(state["target_params"], params, hparams["tau"], num_updates % agent.target_update_interval == 0)
            state = {**state, "params": params, "target_params": target, "opt_state": opt_state, "buffer": buffer, "updates": num_updates}
            return state, (loss, q_taken.mean())

        phase = make_phase(env_step, gradient_step, iterations_per_phase, agent.gradient_steps, agent.learning_starts)

        def log_period(state, _):
            key, k_phases, k_eval = jax.random.split(state["key"], 3)
            (state, ended), (loss, q_mean) = jax.lax.scan(phase, ({**state, "key": key}, zero_ended()), jax.random.split(k_phases, phases_per_log))
            greedy = lambda obs: jnp.argmax(q_values(network.apply(state["params"], obs), support), axis=-1).astype(jnp.int32)
            metrics = {
                "step": state["step"],
                **episode_metrics(ended),
                "eval_return": greedy_episodes(env, env_params, greedy, k_eval, agent.eval_episodes)[0].mean(),
                "loss": jnp.nanmean(loss),
                "q_mean": jnp.nanmean(q_mean),
                "epsilon": epsilon_at(state["step"]),
                "gradient_steps": state["updates"],
            }
            return state, emit(metrics)

        return jax.lax.scan(log_period, state, None, length=num_log_points)

    return Trainer(init=init, run=run, num_log_points=agent.total_steps // agent.log_interval)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action`: argmax of the noise-free network's Q-values."""
    network = build_network(config)
    a = config.agent
    support = jnp.linspace(a.v_min, a.v_max, a.num_atoms, dtype=jnp.float32) if a.distributional else None

    def policy(params, obs, key):
        return jnp.argmax(q_values(network.apply(params, obs), support), axis=-1).astype(jnp.int32)

    return policy
