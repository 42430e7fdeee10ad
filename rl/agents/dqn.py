"""DQN (Mnih et al. 2015) with optional double-Q (van Hasselt et al. 2016), compiled end to end: a
Q-network learns from a uniform replay buffer of epsilon-greedy transitions (`q_loss`), its target
network following it every `target_update_interval` gradient steps; the loop is
`rl.config.loops.ReplayLoopConfig`'s (`rl.replay.loop`). With `fused_network` on a Triton kernel
backend, acting, a gradient step and Adam's step are one kernel launch each (`rl.fused.q`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from rl.agents.trainer import Trainer, train_from_trainer
from rl.config.loops import ReplayLoopConfig
from rl.config.parsing import hp
from rl.core import collection, environment, episodes, exploration, losses
from rl.core.log_points import scan_log_points
from rl.core.state import ReplayState
from rl.fused import q as fused_q
from rl.nn import networks
from rl.nn.layers import Network
from rl.nn.network_config import NetworkConfig, network_config
from rl.replay import buffers
from rl.replay import loop as replay


@dataclass(frozen=True)
class Config(ReplayLoopConfig):
    name: str = "dqn"
    loss: str = hp("huber", choices=("huber", "mse"))
    double_q: bool = hp(True, doc="select the bootstrap action with the online network")
    network: NetworkConfig = network_config(hidden=(128, 128), activation="relu")
    fused_network: bool = hp(
        True,
        doc="act and take gradient steps through the fused Q-network kernels on one flat parameter "
        "vector (rl.fused.q) when the kernel backend is triton/interpret (auto: on a GPU) and the "
        "network fits them (an MLP of two tanh, relu or silu hidden layers within "
        "kernels.q_grads.LIMITS); else the network's apply and autodiff (PureJaxRL's DQN "
        "settings on one H200: 1.6x faster at 1 seed, 1.25x at 64; benchmarks/RESULTS.md)",
    )


check_env = environment.check_discrete_actions


def make_q_network(config, env, env_params) -> Network:
    """Torso from `agent.network`, then a linear head of one Q-value per action."""
    return networks.q_network(
        config.agent.network, env.observation_space(env_params), env.action_space(env_params).n
    )


def q_loss(apply, params, target_params, batch, gamma, double_q: bool, kind: str):
    """(mean TD loss, (TD errors, Q(s, a))) of a batch of transitions (s, a, r, s', terminated),
    s' = info["final_obs"] (reached before any auto-reset: a time limit still bootstraps):

        y    = r + gamma (1 - terminated) Q_target(s', a*),
        a*   = argmax_a Q_target(s', a)   (DQN)   or   argmax_a Q_online(s', a)   (double_q),
        loss = mean_batch huber(Q_online(s, a) - y)   (kind "mse": the squared error).
    """
    q_taken = losses.action_value(apply(params, batch["obs"]), batch["action"])
    q_next_target = apply(target_params, batch["next_obs"])
    q_next_selector = apply(params, batch["next_obs"]) if double_q else q_next_target
    next_value = losses.bootstrap_value(q_next_target, q_next_selector)
    target = losses.q_learning_target(
        batch["reward"], losses.episode_discount(gamma, batch["terminated"]), next_value
    )
    td = q_taken - target
    return losses.td_loss(td, kind).mean(), (td, q_taken)


def greedy_action(apply, params, obs):
    """argmax_a Q(obs, a), first index on ties."""
    return jnp.argmax(apply(params, obs), axis=-1).astype(jnp.int32)


def make_fused(config, env, env_params, q_network: Network):
    """The fused view of the Q-network (`rl.fused.q`) when `agent.fused_network` is on, the kernel
    backend runs Triton and the network fits; else None."""
    agent, obs_space = config.agent, env.observation_space(env_params)
    backend = environment.kernel_backend(config)
    action_space = env.action_space(env_params)
    if not fused_q.runs_fused(agent.network, obs_space, action_space, backend, agent.fused_network):
        return None
    example = jnp.zeros(obs_space.shape, jnp.float32)
    precision = environment.kernel_precision(config)
    return fused_q.make(q_network, agent.network, example, backend, precision)


def apply_of(q_network: Network, fused):
    """`apply(params, obs) -> Q-values`: on the flat vector when fused."""
    return q_network.apply if fused is None else partial(fused_q.q_values, fused)


# ---------------------------------------------------------------- learning, without the envs


class Learning(NamedTuple):
    """What DQN's acting and learning read (`make_learning`): the Q-network, its fused view
    (`rl.fused.q`; None where acting and gradient steps go through apply and autodiff) and
    `apply(params, obs) -> Q-values` (on the flat vector where fused)."""

    q_network: Network
    fused: Any
    apply: Callable


def make_learning(config, env, env_params) -> Learning:
    """The Q-network of `env`, fused where `make_fused` says the kernels run it."""
    q_network = make_q_network(config, env, env_params)
    fused = make_fused(config, env, env_params, q_network)
    return Learning(q_network, fused, apply_of(q_network, fused))


def init_learning(agent: Config, learning: Learning, hparams, net_key, obs, envs, key):
    """A `ReplayState` before any step: the Q-network from `net_key` (one flat vector where fused),
    its target copy and Adam's state, an empty uniform buffer of `agent.buffer_size` transitions
    shaped like one observation `obs`; `envs` and `key` as given (None where the envs are stepped
    elsewhere: rl.sebulba)."""
    fused = learning.fused
    init_params = learning.q_network.init if fused is None else partial(fused_q.init, fused)
    params = init_params(net_key, obs)
    example = replay.transition(obs, jnp.int32(0), jnp.float32(0.0), obs, jnp.bool_(False))
    buffer = buffers.uniform_init(example, agent.buffer_size)
    return replay.initial_state(key, params, buffer, envs, hparams)


def exploration_action(agent: Config, learning: Learning, hparams, params, obs, key, step):
    """Epsilon-greedy actions [N] for observations `obs` [N, ...] after `step` env steps: a
    uniformly random action with probability epsilon = `replay.epsilon(agent, hparams, step)`, else
    argmax_a Q(obs, a) (`rl.core.exploration.epsilon_greedy`; one kernel launch where fused)."""
    epsilon = replay.epsilon(agent, hparams, step)
    if learning.fused is None:
        return exploration.epsilon_greedy(key, learning.apply(params, obs), epsilon)
    return fused_q.epsilon_greedy(learning.fused, params, obs, key, epsilon)


def make_gradient_step(agent: Config, learning: Learning):
    """`gradient_step(hparams, state, key, active=True) -> (state, {"loss", "q_mean"})`: one Adam
    step on a uniformly sampled batch; the target follows every `target_update_interval` gradient
    steps (`replay.learn`). Fused, the step is skipped inside the optimiser's step where `active`
    (a traced bool) is false."""
    apply, fused = learning.apply, learning.fused

    def gradient_step(hparams, state: ReplayState, key, active=True):
        batch, _ = buffers.uniform_sample(state.buffer, key, agent.batch_size)
        if fused is None:
            loss_fn = partial(
                q_loss,
                apply,
                target_params=state.target_params,
                batch=batch,
                gamma=hparams["gamma"],
                double_q=agent.double_q,
                kind=agent.loss,
            )
            (loss, (_, q_taken)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
            sq_norm, stats = None, {"loss": loss, "q_mean": q_taken.mean()}
        else:
            discounts = losses.episode_discount(hparams["gamma"], batch["terminated"])
            grads, sq_norm, stats = fused_q.q_learning_grads(
                fused, state.params, state.target_params, batch, discounts,
                loss=agent.loss, double_q=agent.double_q,
            )  # fmt: skip
        backend = None if fused is None else fused.backend  # Adam and the target: one step
        interval = agent.target_update_interval
        state = replay.learn(state, grads, hparams, interval, sq_norm, backend, active)
        return state, stats

    return gradient_step


def train_phase(learning: Learning, gradient_step, hparams, state, started, keys, unroll: int):
    """A training phase: `gradient_step`s (`make_gradient_step`'s), one per key of `keys`, taken
    where the traced bool `started` holds (`learning_starts` env steps stored), else the state
    unchanged and their statistics NaN. `collection.scan_when`, or, fused, `collection.scan_gated`:
    the gate inside Adam's step, no select of the params, target and Adam moments after the phase.
    Off the CPU, and always when fused, the steps run every phase and their results are kept only
    once `started` (no host round trip per phase). Returns (state, statistics [len(keys)])."""
    learn = partial(gradient_step, hparams)
    scan = collection.scan_when if learning.fused is None else collection.scan_gated
    return scan(started, learn, state, keys, unroll=unroll)


# ---------------------------------------------------------------- the loop


def make_trainer(config) -> Trainer:
    agent = config.agent
    env, env_params = environment.make_env(config)
    learning = make_learning(config, env, env_params)
    gradient_step = make_gradient_step(agent, learning)
    loop = replay.loop_of(agent)

    # ---------------------------------------------------------------- init

    def init(key, hparams) -> ReplayState:
        """The Q-network, its target copy and Adam state, an empty uniform buffer, the envs."""
        key, net_key, reset_key = jax.random.split(key, 3)
        envs = replay.reset_envs(env, env_params, reset_key, agent.num_envs)
        return init_learning(agent, learning, hparams, net_key, envs.obs[0], envs, key)

    # ---------------------------------------------------------------- act

    def act(hparams, carry, keys):
        """All envs take one epsilon-greedy step (keys: the acting's, each env's); their
        transitions (s, a, r, s' = info["final_obs"], terminated) go to the buffer."""
        state, totals = carry
        act_key, env_keys = keys
        action = exploration_action(
            agent, learning, hparams, state.params, state.envs.obs, act_key, state.step
        )
        envs, reward, terminated, _, info = replay.step_envs_with_keys(
            env, env_params, state.envs, action, env_keys
        )
        stored = replay.transition(state.envs.obs, action, reward, info["final_obs"], terminated)
        buffer = buffers.uniform_add(state.buffer, stored)
        state = state._replace(envs=envs, buffer=buffer, step=state.step + agent.num_envs)
        return (state, episodes.add_episodes(totals, info)), None

    # ---------------------------------------------------------------- act, then train

    def act_then_train(hparams, carry, keys):
        """`env_iterations` steps of all envs, then, once `learning_starts` env steps are stored,
        `gradient_steps` gradient steps (their statistics [gradient_steps] NaN before); `keys`:
        the phase's (`replay.period_keys`)."""
        act_keys, learn_keys = (keys["act"][:, 0], keys["env"]), keys["learn"]
        act_step = partial(act, hparams)
        (state, totals), _ = jax.lax.scan(act_step, carry, act_keys, unroll=loop.act_unroll)
        started = state.step >= agent.learning_starts
        state, stats = train_phase(
            learning, gradient_step, hparams, state, started, learn_keys, loop.learn_unroll
        )
        return (state, totals), stats

    # ---------------------------------------------------------------- log period

    def log_period(hparams, state: ReplayState):
        """A log period's phases, then the log point's metrics (`replay.log_metrics`) and the
        mean return of `eval_episodes` episodes of the greedy policy."""
        key, phase_key, eval_key = jax.random.split(state.key, 3)
        phase = partial(act_then_train, hparams)
        keys = replay.period_keys(phase_key, loop, agent.num_envs)
        state, totals, stats = replay.scan_phases_with_keys(
            phase, state._replace(key=key), keys, loop
        )
        metrics = replay.log_metrics(agent, hparams, state, totals, stats)
        if agent.eval_episodes:
            policy = partial(greedy_action, learning.apply, state.params)
            metrics["eval_return"] = replay.eval_return(
                env, env_params, policy, eval_key, agent.eval_episodes
            )
        return state, metrics

    # ---------------------------------------------------------------- run

    def run(state, hparams, num_log_points):
        return scan_log_points(partial(log_period, hparams), state, num_log_points)

    return Trainer(init=init, run=run, num_log_points=agent.total_steps // agent.log_interval)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action`: argmax of the online Q-network (first index on
    ties). `params` may be the network's tree or a fused run's flat vector (`fused_q.as_tree`), so a
    run trained through the kernels on a GPU evaluates anywhere."""
    env, env_params = environment.make_env(config)
    q_network = make_q_network(config, env, env_params)
    example = jnp.zeros(env.observation_space(env_params).shape, jnp.float32)
    tree = partial(fused_q.as_tree, q_network, example)
    return lambda params, obs, key: greedy_action(q_network.apply, tree(params), obs)
