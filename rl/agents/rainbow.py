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
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

import kernels
from rl import (
    agent_configs,
    buffers,
    environment,
    episodes,
    exploration,
    heads,
    loop,
    losses,
    networks,
    optimizers,
)
from rl.config_parsing import ConfigError, hp
from rl.trainer import Trainer, train_from_trainer


@dataclass(frozen=True)
class Config(agent_configs.ReplayLoopConfig):
    name: str = "rainbow"
    total_steps: int = hp(61_440, low=1, doc="env steps per seed (all envs counted)")
    lr: float = hp(1e-3, low=0.0, low_open=True, sweep=True, doc="Adam step size")
    target_update_interval: int = hp(128, low=1, doc="gradient steps between target updates")
    epsilon_start: float = hp(
        0.0,
        low=0.0,
        high=1.0,
        sweep=True,
        doc="epsilon-greedy on top of (or instead of) noisy nets",
    )
    epsilon_end: float = hp(0.0, low=0.0, high=1.0, sweep=True)
    epsilon_decay_steps: int = hp(10_000, low=1, doc="env steps of the linear epsilon decay")
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
    per_beta_start: float = hp(
        0.4, low=0.0, high=1.0, sweep=True, doc="importance exponent, annealed to 1"
    )
    per_beta_steps: int = hp(0, low=0, doc="env steps of the beta annealing (0: total_steps)")
    per_eps: float = hp(1e-6, low=0.0, low_open=True, sweep=True, doc="added to priorities")
    loss: str = hp("huber", choices=("huber", "mse"), doc="scalar (non-distributional) TD loss")
    network: networks.NetworkConfig = networks.network_config(hidden=(128, 128), activation="relu")
    head_hidden: int = hp(0, low=0, doc="hidden units of each head stream (0: linear streams)")

    def validate(self):
        super().validate()
        if self.distributional and not self.v_min < self.v_max:
            raise ConfigError(
                f"agent.v_min ({self.v_min}) must be below agent.v_max ({self.v_max})"
            )


check_env = environment.check_discrete_actions


class Setup(NamedTuple):
    """What the loop closes over: the env, the network, the C51 support (None: scalar Q) and settings."""

    env: object
    env_params: object
    network: networks.Network
    support: jax.Array | None
    agent: Config
    backend: str
    deterministic: bool = False  # kernels.deterministic: the fixed-order projection


def make_network(config, env, env_params) -> networks.Network:
    """Torso from `agent.network`, then Rainbow's head (outputs [..., actions, atoms])."""
    a = config.agent
    torso = networks.make_torso(a.network, env.observation_space(env_params))
    head = heads.rainbow_head(
        env.action_space(env_params).n,
        a.num_atoms if a.distributional else 1,
        a.dueling,
        a.noisy,
        a.head_hidden,
        a.network.activation,
    )
    return networks.build(networks.with_head(torso, head), a.network.backend, a.network.init)


def make_support(agent):
    return (
        jnp.linspace(agent.v_min, agent.v_max, agent.num_atoms, dtype=jnp.float32)
        if agent.distributional
        else None
    )


def q_values(setup: Setup, outputs):
    """Q-values [..., A] from outputs [..., A, atoms]: the mean over the support, or the one output."""
    if setup.support is None:
        return outputs[..., 0]
    return losses.categorical_q_values(outputs, setup.support, backend=setup.backend)


def noise(setup: Setup, key):
    """The key noisy layers draw from, or None (noise-free) without noisy layers."""
    return key if setup.agent.noisy else None


def push_window(window, step):
    """Drop the oldest of the last n steps [n, envs, ...] and append `step` [envs, ...]."""
    return jax.tree.map(
        lambda w, x: jnp.concatenate([w[1:], x[None].astype(w.dtype)], axis=0), window, step
    )


def rainbow_loss(setup: Setup, params, target_params, batch, weights, keys, gamma):
    """(mean_i w_i loss_i, (priorities, Q(s, a))) of a batch (the module docstring)."""
    k_online, k_next, k_target = keys
    apply, agent = setup.network.apply, setup.agent
    rows = jnp.arange(batch["action"].shape[0])
    outputs = apply(params, batch["obs"], rng=k_online)[rows, batch["action"]]
    next_target = apply(target_params, batch["next_obs"], rng=k_target)
    selector = apply(params, batch["next_obs"], rng=k_next) if agent.double_q else next_target
    next_action = jnp.argmax(q_values(setup, selector), axis=-1)
    discount = losses.n_step_discount(gamma, batch["bootstrap_steps"], batch["terminated"])
    if setup.support is None:
        target = losses.q_learning_target(
            batch["reward"], discount, next_target[rows, next_action, 0]
        )
        td = outputs[:, 0] - target
        return jnp.mean(weights * losses.td_loss(td, agent.loss)), (jnp.abs(td), outputs[:, 0])
    next_probs = kernels.softmax(next_target[rows, next_action], axis=-1, backend=setup.backend)
    m = losses.categorical_td_target(
        batch["reward"],
        discount,
        next_probs,
        setup.support,
        backend=setup.backend,
        deterministic=setup.deterministic,
    )
    cross_entropy, kl = losses.categorical_cross_entropy(outputs, m)
    q_taken = jnp.sum(jnp.exp(jax.nn.log_softmax(outputs, axis=-1)) * setup.support, axis=-1)
    return jnp.mean(weights * cross_entropy), (jax.lax.stop_gradient(kl), q_taken)


def optimiser(hparams):
    return optimizers.clipped_adam(hparams["lr"], hparams["max_grad_norm"])


# ---------------------------------------------------------------- the loop


def init(setup: Setup, key, hparams):
    agent = setup.agent
    key, net_key, reset_key = jax.random.split(key, 3)
    reset, _ = environment.batched(setup.env)
    obs, env_state = reset(jax.random.split(reset_key, agent.num_envs), setup.env_params)
    params = setup.network.init(net_key, obs[0])
    zeros = lambda x: jnp.zeros((agent.n_step,) + x.shape, x.dtype)
    flags = jnp.zeros((agent.n_step, agent.num_envs), jnp.bool_)
    window = {
        "obs": zeros(obs),
        "action": zeros(jnp.zeros((agent.num_envs,), jnp.int32)),
        "reward": zeros(jnp.zeros((agent.num_envs,))),
        "final_obs": zeros(obs),
        "terminated": flags,
        "truncated": flags,
    }
    example = jax.tree.map(
        lambda x: x[0],
        losses.n_step_transition(
            window, 0.0, backend=setup.backend, deterministic=setup.deterministic
        ),
    )
    buffer = (buffers.prioritized_init if agent.per else buffers.uniform_init)(
        example, agent.buffer_size
    )
    return loop.replay_state(
        key,
        params,
        optimiser(hparams).init(params),
        buffer,
        obs,
        env_state,
        window=window,
        window_filled=jnp.int32(0),
    )


def env_step(setup: Setup, hparams, carry, key):
    """All envs act (noisy and/or epsilon-greedy); the oldest step of each full window is stored."""
    state, totals = carry
    agent = setup.agent
    k_noise, k_act, k_env = jax.random.split(key, 3)
    q = q_values(
        setup, setup.network.apply(state["params"], state["obs"], rng=noise(setup, k_noise))
    )
    action = exploration.epsilon_greedy(
        k_act, q, loop.replay_epsilon(agent, hparams, state["step"])
    )
    _, step = environment.batched(setup.env)
    obs, env_state, reward, terminated, truncated, info = step(
        jax.random.split(k_env, agent.num_envs), state["env_state"], action, setup.env_params
    )
    window = push_window(
        state["window"],
        {
            "obs": state["obs"],
            "action": action,
            "reward": reward,
            "final_obs": info["final_obs"],
            "terminated": terminated,
            "truncated": truncated,
        },
    )
    filled = jnp.minimum(state["window_filled"] + 1, agent.n_step)
    buffer_add = (
        partial(buffers.prioritized_add, backend=setup.backend)
        if agent.per
        else buffers.uniform_add
    )
    buffer = buffer_add(
        state["buffer"],
        losses.n_step_transition(
            window, hparams["gamma"], backend=setup.backend, deterministic=setup.deterministic
        ),
        filled >= agent.n_step,
    )
    state = {
        **state,
        "buffer": buffer,
        "window": window,
        "window_filled": filled,
        "obs": obs,
        "env_state": env_state,
        "step": state["step"] + agent.num_envs,
    }
    return (state, episodes.add_episodes(totals, info)), None


def sample(setup: Setup, hparams, buffer, key, step):
    """(batch, indices, importance weights): PER with beta annealed to 1, or uniform with weights 1."""
    agent = setup.agent
    if agent.per:
        beta = exploration.linear_schedule(
            hparams["per_beta_start"], 1.0, agent.per_beta_steps or agent.total_steps, step
        )
        return buffers.prioritized_sample(
            buffer, key, agent.batch_size, beta, backend=setup.backend
        )
    batch, indices = buffers.uniform_sample(buffer, key, agent.batch_size)
    return batch, indices, jnp.ones((agent.batch_size,), jnp.float32)


def gradient_step(setup: Setup, hparams, state, key):
    """One Adam step; PER priorities of the batch updated; the target follows periodically."""
    agent = setup.agent
    k_sample, k_online, k_next, k_target = jax.random.split(key, 4)
    batch, indices, weights = sample(setup, hparams, state["buffer"], k_sample, state["step"])
    keys = (noise(setup, k_online), noise(setup, k_next), noise(setup, k_target))
    loss_fn = lambda p: rainbow_loss(
        setup, p, state["target_params"], batch, weights, keys, hparams["gamma"]
    )
    (loss, (priorities, q_taken)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state["params"]
    )
    buffer = state["buffer"]
    if agent.per:
        buffer = buffers.prioritized_update(
            buffer,
            indices,
            priorities + hparams["per_eps"],
            hparams["per_alpha"],
            backend=setup.backend,
        )
    updates, opt_state = optimiser(hparams).update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    updates_done = state["updates"] + 1
    target = optimizers.periodic_polyak(
        state["target_params"],
        params,
        hparams["tau"],
        updates_done % agent.target_update_interval == 0,
    )
    state = {
        **state,
        "params": params,
        "target_params": target,
        "opt_state": opt_state,
        "buffer": buffer,
        "updates": updates_done,
    }
    return state, {"loss": loss, "q_mean": q_taken.mean()}


def greedy_policy(setup: Setup, params):
    """obs -> argmax_a of the noise-free network's Q-values."""
    return lambda obs: jnp.argmax(
        q_values(setup, setup.network.apply(params, obs)), axis=-1
    ).astype(jnp.int32)


def make_setup(config) -> Setup:
    env, env_params = environment.make_env(config)
    agent = config.agent
    return Setup(
        env,
        env_params,
        make_network(config, env, env_params),
        make_support(agent),
        agent,
        environment.kernel_backend(config),
        config.kernels.deterministic,
    )


def make_trainer(config) -> Trainer:
    setup, agent = make_setup(config), config.agent
    return loop.replay_trainer(
        agent,
        setup.env,
        setup.env_params,
        partial(init, setup),
        partial(env_step, setup),
        partial(gradient_step, setup),
        partial(greedy_policy, setup),
    )


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action`: argmax of the noise-free network's Q-values."""
    setup = make_setup(config)
    return lambda params, obs, key: greedy_policy(setup, params)(obs)
