"""Rainbow (Hessel et al. 2018) with every component switchable, compiled end to end:
`distributional` (C51), `dueling`, `noisy` head layers (keep epsilon at 0 with them), `n_step`
returns, prioritized replay (`per`) and `double_q` selection are config keys, so Rainbow's
ablations are config files (all off, n_step 1: DQN with a dueling-free MLP). The loop is DQN's
(`rl.replay.loop`); each env carries a window of its last n steps (`push_window`) from which
`n_step_transitions` stores a transition, and `rainbow_loss` learns from a sampled batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

import kernels
from rl.agents.trainer import Trainer, train_from_trainer
from rl.config.loops import ReplayLoopConfig
from rl.config.parsing import ConfigError, hp
from rl.core import collection, environment, episodes, exploration, losses, packing
from rl.core.log_points import scan_log_points
from rl.core.state import ReplayState
from rl.fused import rainbow as fused_rainbow
from rl.nn import layers, networks
from rl.nn.network_config import NetworkConfig, network_config
from rl.replay import buffers
from rl.replay import loop as replay


@dataclass(frozen=True)
class Config(ReplayLoopConfig):
    name: str = "rainbow"
    total_steps: int = hp(61_440, low=1, doc="env steps per seed (all envs counted)")
    lr: float = hp(1e-3, low=0.0, low_open=True, sweep=True, doc="Adam step size")
    target_update_interval: int = hp(128, low=1, doc="gradient steps between target updates")
    epsilon_start: float = hp(
        0.0, low=0.0, high=1.0, sweep=True, doc="epsilon-greedy with (or instead of) noisy nets"
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
    network: NetworkConfig = network_config(hidden=(128, 128), activation="relu")
    head_hidden: int = hp(0, low=0, doc="hidden units of each head stream (0: linear streams)")
    fused_acting: bool = hp(
        False,
        doc="act through one kernel launch (rl.fused.rainbow: the torso, the noisy dueling C51 "
        "head, the softmax expectation and the epsilon-greedy choice) when the kernel backend is "
        "triton/interpret (auto: on a GPU) and the network fits it (an MLP of two tanh, relu or "
        "silu hidden layers, every head component on, no head_hidden, sizes within "
        "kernels.rainbow_act's limits, fewer with run.matmul_precision: highest); else, silently, "
        "the network's apply. "
        "Off by default: rainbow_cartpole on one H200 took 9.03 s with it, 8.42 s without "
        "(benchmarks/RESULTS.md)",
    )

    def validate(self):
        super().validate()
        if self.distributional and not self.v_min < self.v_max:
            raise ConfigError(
                f"agent.v_min ({self.v_min}) must be below agent.v_max ({self.v_max})"
            )


check_env = environment.check_discrete_actions


class Setup(NamedTuple):
    """What the loop closes over: the env, the network, the C51 support (None: scalar Q), the
    settings and the kernels backend."""

    env: object
    env_params: object
    network: layers.Network
    support: jax.Array | None
    agent: Config
    backend: str
    deterministic: bool = False  # kernels.deterministic: the fixed-order projection
    fused_acting: bool = False  # acting through kernels.rainbow_epsilon_greedy (rl.fused.rainbow)
    dot_precision: str = "tf32"  # the kernel's matmuls (environment.kernel_precision)


def make_network(config, env, env_params) -> layers.Network:
    """Torso from `agent.network`, then Rainbow's head (outputs [..., actions, atoms])."""
    a = config.agent
    torso = networks.make_torso(a.network, env.observation_space(env_params))
    head = networks.rainbow_head(
        env.action_space(env_params).n,
        a.num_atoms if a.distributional else 1,
        a.dueling,
        a.noisy,
        a.head_hidden,
        a.network.activation,
    )
    return layers.build(networks.with_head(torso, head), a.network.backend, a.network.init)


def make_support(agent):
    return (
        jnp.linspace(agent.v_min, agent.v_max, agent.num_atoms, dtype=jnp.float32)
        if agent.distributional
        else None
    )


def make_setup(config) -> Setup:
    env, env_params = environment.make_env(config)
    agent, backend = config.agent, environment.kernel_backend(config)
    precision = environment.kernel_precision(config)
    obs_space, action_space = env.observation_space(env_params), env.action_space(env_params)
    return Setup(
        env,
        env_params,
        make_network(config, env, env_params),
        make_support(agent),
        agent,
        backend,
        config.kernels.deterministic,
        fused_rainbow.runs_fused(agent, obs_space, action_space, backend, precision),
        precision,
    )


def q_values(setup: Setup, outputs):
    """Q-values [..., A] from outputs [..., A, atoms]: the mean over the support, or the one
    output."""
    if setup.support is None:
        return outputs[..., 0]
    return losses.categorical_q_values(outputs, setup.support, backend=setup.backend)


def noise(setup: Setup, key):
    """The key noisy layers draw from, or None (noise-free) without noisy layers."""
    return key if setup.agent.noisy else None


def window_step(obs, action, reward, final_obs, terminated, truncated) -> dict:
    """One step of the envs as their windows keep it (each [envs, ...])."""
    return {
        "obs": obs,
        "action": action,
        "reward": reward,
        "final_obs": final_obs,
        "terminated": terminated,
        "truncated": truncated,
    }


def window_layout(obs_example, action_example=None) -> packing.StorageLayout:
    """The packing of one env's `window_step` with observations of `obs_example`'s shape and dtype
    (one env's; an array, a tracer or a `jax.ShapeDtypeStruct`): obs and final_obs, an int32
    action (or one like `action_example`: a continuous actor-critic's), a float32 reward and two
    flags. It depends on those shapes and dtypes only."""
    obs = jnp.zeros(obs_example.shape, obs_example.dtype)
    action = (
        jnp.int32(0)
        if action_example is None
        else jnp.zeros(action_example.shape, action_example.dtype)
    )
    flag = jnp.bool_(False)
    return packing.storage_layout(window_step(obs, action, jnp.float32(0), obs, flag, flag))


def empty_window(layout: packing.StorageLayout, num_envs: int, n: int) -> tuple:
    """The windows before any step: zero blocks [envs, n, width] (what `push_window` fills)."""
    return tuple(
        jnp.zeros((num_envs, n, width), dtype)
        for dtype, width in zip(layout.block_dtypes, layout.block_widths)
    )


def push_window(window, step, layout: packing.StorageLayout):
    """Each env's window of its last n steps (packed blocks [envs, n, width], `state.envs.memory`)
    drops its oldest step and appends `step` (a `window_step` [envs, ...]): one concatenation per
    block (one block, or two where the observations are large narrow-dtype images)."""
    return tuple(
        jnp.concatenate([w[:, 1:], x[:, None]], axis=1)
        for w, x in zip(window, packing.pack(layout, step))
    )


def n_step_transitions(setup: Setup, window, gamma):
    """The n-step transition of the oldest step of each env's window [envs, n, ...]
    (`losses.n_step_transition`, which reads the window time-major): truncation bootstraps and
    termination does not, at any position in the window. The last n - 1 steps of a run are never
    stored."""
    time_major = jax.tree.map(lambda w: jnp.swapaxes(w, 0, 1), window)
    return losses.n_step_transition(
        time_major, gamma, backend=setup.backend, deterministic=setup.deterministic
    )


def rainbow_loss(setup: Setup, params, target_params, batch, weights, keys, gamma):
    """(mean_i w_i loss_i, (priorities, Q(s, a))) of a batch of n-step transitions, w PER's
    importance weights (1 for uniform replay), a* = argmax_a Q_online(s_boot, a) (double_q) or
    argmax_a Q_target(s_boot, a), d = gamma^(L+1) (1 - terminated) (`losses.n_step_discount`):

        distributional: m = project(R + d z, p_target(s_boot, a*)) onto the support z,
                        loss_i = -sum_k m_k log p_online(s, a)_k,   priority_i = KL(m || p_online)
        scalar:         y = R + d Q_target(s_boot, a*),
                        loss_i = huber (or squared) TD error,      priority_i = |TD|

    The caller adds per_eps to the priorities. `keys`: independent noise of the noisy layers for
    the online, online next-state and target nets."""
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


def sample(setup: Setup, hparams, buffer, key, step):
    """(batch, indices, importance weights): PER with beta annealed linearly to 1 over
    per_beta_steps env steps (0: total_steps), or uniform with weights 1."""
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


def greedy_action(setup: Setup, params, obs):
    """argmax_a of the noise-free network's Q-values (first index on ties)."""
    q = q_values(setup, setup.network.apply(params, obs))
    return jnp.argmax(q, axis=-1).astype(jnp.int32)


# ---------------------------------------------------------------- the loop


def make_trainer(config) -> Trainer:
    """Rainbow's Trainer. Noisy layers draw independent noise for acting (once per step, shared by
    the envs) and for each net of the loss; greedy evaluation uses the noise-free mean network.
    With `fused_acting` (`rl.fused.rainbow`) acting is one kernel launch: the same noise, the same
    actions up to float rounding."""
    setup = make_setup(config)
    agent, env, env_params = setup.agent, setup.env, setup.env_params
    network, loop = setup.network, replay.loop_of(agent)

    # ---------------------------------------------------------------- init

    def init(key, hparams) -> ReplayState:
        """The network, its target copy and Adam state, an empty buffer (prioritized or uniform)
        of n-step transitions, the envs with empty windows of their last n steps (`envs.memory`,
        packed [envs, n, width])."""
        key, net_key, reset_key = jax.random.split(key, 3)
        envs = replay.reset_envs(env, env_params, reset_key, agent.num_envs)
        params = network.init(net_key, envs.obs[0])
        layout = window_layout(envs.obs[0])
        window = empty_window(layout, agent.num_envs, agent.n_step)
        unpacked = packing.unpack(layout, window)
        example = jax.tree.map(lambda x: x[0], n_step_transitions(setup, unpacked, 0.0))
        empty = buffers.prioritized_init if agent.per else buffers.uniform_init
        buffer = empty(example, agent.buffer_size)
        return replay.initial_state(key, params, buffer, envs._replace(memory=window), hparams)

    # ---------------------------------------------------------------- act

    def act(hparams, carry, keys):
        """All envs act on the (noisy) network's Q-values, epsilon-greedy on top; each env's
        window takes the step, and once the windows are full the n-step transition of each
        window's oldest step goes to the buffer. `keys`: (the noise's and epsilon-greedy's
        [2], each env's)."""
        state, totals = carry
        (noise_key, act_key), env_keys = keys
        epsilon = replay.epsilon(agent, hparams, state.step)
        if setup.fused_acting:  # the same actions up to float rounding, in one launch
            action = fused_rainbow.epsilon_greedy(
                state.params, state.envs.obs, epsilon, setup.support, noise_key=noise_key,
                act_key=act_key, activation=agent.network.activation, backend=setup.backend,
                precision=setup.dot_precision,
            )  # fmt: skip
        else:
            outputs = network.apply(state.params, state.envs.obs, rng=noise(setup, noise_key))
            action = exploration.epsilon_greedy(act_key, q_values(setup, outputs), epsilon)
        envs, reward, terminated, truncated, info = replay.step_envs_with_keys(
            env, env_params, state.envs, action, env_keys
        )
        taken = window_step(
            state.envs.obs, action, reward, info["final_obs"], terminated, truncated
        )
        layout = window_layout(state.envs.obs[0])
        window = push_window(state.envs.memory, taken, layout)
        step = state.step + agent.num_envs
        full = step >= agent.n_step * agent.num_envs
        stored = n_step_transitions(setup, packing.unpack(layout, window), hparams["gamma"])
        if agent.per:
            buffer = buffers.prioritized_add(state.buffer, stored, full, backend=setup.backend)
        else:
            buffer = buffers.uniform_add(state.buffer, stored, full)
        state = state._replace(envs=envs._replace(memory=window), buffer=buffer, step=step)
        return (state, episodes.add_episodes(totals, info)), None

    # ---------------------------------------------------------------- gradient step

    def gradient_step(hparams, state: ReplayState, keys):
        """One Adam step on a sampled batch, independent noise for the online, next-state and
        target nets; the batch's PER priorities updated; the target follows every
        `target_update_interval` gradient steps. `keys` [4]: the sample's and the three nets'."""
        sample_key, online_key, next_key, target_key = keys
        batch, indices, weights = sample(setup, hparams, state.buffer, sample_key, state.step)
        keys = tuple(noise(setup, k) for k in (online_key, next_key, target_key))
        loss_fn = lambda params: rainbow_loss(
            setup, params, state.target_params, batch, weights, keys, hparams["gamma"]
        )
        (loss, (priorities, q_taken)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params
        )
        if agent.per:
            priorities = priorities + hparams["per_eps"]
            buffer = buffers.prioritized_update(
                state.buffer, indices, priorities, hparams["per_alpha"], backend=setup.backend
            )
            state = state._replace(buffer=buffer)
        state = replay.learn(state, grads, hparams, agent.target_update_interval)
        return state, {"loss": loss, "q_mean": q_taken.mean()}

    # ---------------------------------------------------------------- act, then train

    def act_then_train(hparams, carry, keys):
        """`env_iterations` steps of all envs; then, from `learning_starts` env steps on,
        `gradient_steps` gradient steps, whose statistics read NaN before; `keys`: the phase's
        (`replay.period_keys`)."""
        act_keys, learn_keys = (keys["act"], keys["env"]), keys["learn"]
        (state, totals), _ = jax.lax.scan(
            partial(act, hparams), carry, act_keys, unroll=loop.act_unroll
        )
        state, stats = collection.scan_when(
            state.step >= agent.learning_starts,
            partial(gradient_step, hparams),
            state,
            learn_keys,
            unroll=loop.learn_unroll,
        )
        return (state, totals), stats

    # ---------------------------------------------------------------- log period

    def log_period(hparams, state: ReplayState):
        """A log period's phases; the log point's metrics (`replay.log_metrics`); the mean return
        of `eval_episodes` episodes of the noise-free network's greedy policy."""
        key, phase_key, eval_key = jax.random.split(state.key, 3)
        keys = replay.period_keys(phase_key, loop, agent.num_envs, acting_keys=2, learn_keys=4)
        state, totals, stats = replay.scan_phases_with_keys(
            partial(act_then_train, hparams), state._replace(key=key), keys, loop
        )
        metrics = replay.log_metrics(agent, hparams, state, totals, stats)
        if agent.eval_episodes:
            metrics["eval_return"] = replay.eval_return(
                env,
                env_params,
                partial(greedy_action, setup, state.params),
                eval_key,
                agent.eval_episodes,
            )
        return state, metrics

    # ---------------------------------------------------------------- run

    def run(state, hparams, num_log_points):
        return scan_log_points(partial(log_period, hparams), state, num_log_points)

    num_log_points = agent.total_steps // agent.log_interval
    return Trainer(init=init, run=run, num_log_points=num_log_points)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action`: argmax of the noise-free network's Q-values."""
    setup = make_setup(config)
    return lambda params, obs, key: greedy_action(setup, params, obs)
