"""What each agent the actor-learner architecture (rl.sebulba) trains brings to it, built from the
agent's own module: how an actor acts, what a rollout step records, the learner's update (the
agent's own learning step) and the sizes of a rollout and of the run (`rollout_sizes`).

    pieces = make_pieces(config)
    key, record, env_action = pieces.act(hparams, params, obs, key, step)   # an actor's step
    traj = pieces.transition(obs, *record, reward, terminated, truncated, final_obs)  # [T, E, ...]
    params, opt_state, stored, stats = pieces.learn(hparams, params, opt_state, stored, traj, key)
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from rl.agents import actor_critic, dqn, ppo, pqn, sac, td3
from rl.config.arch import REPLAY_AGENTS, SEBULBA_AGENTS
from rl.config.unrolling import unroll_of
from rl.core import collection, environment, exploration
from rl.replay import buffers
from rl.replay import loop as replay
from rl.sebulba.host_envs import obs_dtype


class Pieces(NamedTuple):
    """An agent's pieces of the actor-learner loop; functions of values,
    jitted by the caller. `obs_space` is the env's observation space, `obs_dtype` the dtype the
    network reads. `learn`'s stats are each update's means, which a log point averages over its
    period; `log_point` gives what a log point reads off the replay state at its end instead,
    as the agent's one program logs it (DQN: epsilon after the env steps so far and the gradient
    steps so far, `replay.log_point_values`; SAC: alpha; TD3: the gradient steps so far)."""

    obs_space: Any
    obs_dtype: Any
    init: Callable  # (key, hparams, obs) -> (params, opt_state, stored: replay state or None)
    act: Callable  # (hparams, params, obs, key, step) -> (key, record, env_action)
    # (obs, *record, reward, terminated, truncated, final_obs, reset_step=None) -> Transition
    transition: Callable
    # (hparams, params, opt_state, stored, traj, key) -> (params, opt_state, stored, mean stats)
    learn: Callable
    greedy: Callable  # (params, obs) -> the env's action, for evaluation
    log_point: Callable = lambda hparams, stored: {}  # -> {name: value at a log point}


class Sizes(NamedTuple):
    """A run's rollouts and updates (`rollout_sizes`): `num_steps` steps per actor rollout,
    `steps` env steps an update learns from (num_steps x agent.num_envs), `num_updates` in the
    run, a log point every `log_interval` updates, `eval_envs` greedy episodes at each (0: none)."""

    num_steps: int
    steps: int
    num_updates: int
    log_interval: int
    eval_envs: int


def rollout_sizes(config) -> Sizes:
    """`Sizes` of `config`: PPO's and PQN's from their own keys (agent.num_steps, num_updates,
    log_interval in updates, eval_envs); a replay agent's from arch.rollout_steps and its env-step
    keys (agent.total_steps, log_interval in env steps, eval_episodes)."""
    agent = config.agent
    if agent.name in REPLAY_AGENTS:
        steps = config.arch.rollout_steps * agent.num_envs
        return Sizes(
            config.arch.rollout_steps,
            steps,
            agent.total_steps // steps,
            agent.log_interval // steps,
            agent.eval_episodes,
        )
    return Sizes(
        agent.num_steps, agent.batch_size, agent.num_updates, agent.log_interval, agent.eval_envs
    )


def make_pieces(config) -> Pieces:
    """The pieces of `config.agent` (one of `SEBULBA_AGENTS`)."""
    assert config.agent.name in SEBULBA_AGENTS, config.agent.name  # rl.config.arch.check_arch
    makers = {
        "dqn": dqn_pieces,
        "ppo": ppo_pieces,
        "pqn": pqn_pieces,
        "sac": sac_pieces,
        "td3": td3_pieces,
    }
    return makers[config.agent.name](config)


def ppo_pieces(config) -> Pieces:
    """PPO's pieces: actors sample the policy, recording (action, log pi(action|obs)), Box actions
    mapped to the env's bounds; the learner runs `ppo.learn`."""
    s = ppo.make_setup(config)
    grads_fn, batch_fn = ppo.learning_pieces(config, s)

    def act(hparams, params, obs, key, step):
        key, sample_key = jax.random.split(key)
        pi = ppo.policy(s, params, obs)
        action = pi.sample(sample_key)
        log_prob, _ = pi.log_prob_entropy(action, backend="reference")
        env_action = environment.to_env_action(s.env, s.env_params, pi.env_action(action))
        return key, (action, log_prob), env_action

    def learn(hparams, params, opt_state, stored, traj, key):
        learned = ppo.learn(s, grads_fn, batch_fn, hparams, params, opt_state, traj, key)
        return *learned[:2], stored, jax.tree.map(jnp.mean, learned[2])

    def greedy(params, obs):
        return environment.to_env_action(s.env, s.env_params, ppo.greedy_action(s, params, obs))

    space = s.env.observation_space(s.env_params)
    return Pieces(
        space,
        obs_dtype(space),
        lambda key, hparams, obs: (*ppo.init_params(s, key, hparams, obs), None),
        act,
        ppo.Transition,
        learn,
        greedy,
    )


def pqn_pieces(config) -> Pieces:
    """PQN's pieces: actors act epsilon-greedily on Q with the epsilon of the env steps before the
    rollout (`pqn.epsilon` at `step`, as the one-program PQN at the update's start), recording the
    action; the learner computes the Q(lambda) targets with its own params (`pqn.learn_rollout`)."""
    agent = config.agent
    env, env_params = environment.make_env(config)
    apply = pqn.make_q_network(agent, env, env_params).apply
    kernel = dict(
        backend=environment.kernel_backend(config), deterministic=config.kernels.deterministic
    )

    def init(key, hparams, obs):
        params = pqn.make_q_network(agent, env, env_params).init(key, obs)
        return params, pqn.init_opt_state(agent, hparams, params), None

    def act(hparams, params, obs, key, step):
        key, act_key = jax.random.split(key)
        eps = pqn.epsilon(agent, hparams, step)
        action = exploration.epsilon_greedy(act_key, apply(params, obs), eps)
        return key, (action,), action

    def learn(hparams, params, opt_state, stored, traj, key):
        learned = pqn.learn_rollout(agent, apply, hparams, params, opt_state, traj, key, **kernel)
        return *learned[:2], stored, learned[2]

    space = env.observation_space(env_params)
    return Pieces(
        space,
        obs_dtype(space),
        init,
        act,
        lambda *columns, reset_step=None: pqn.Transition(
            *columns, episode={}, reset_step=reset_step
        ),
        learn,
        lambda params, obs: pqn.greedy_policy(apply, params)(obs),
    )


class ReplayAgent(NamedTuple):
    """What `replay_pieces` reads of a replay agent (DQN, SAC, TD3), from its own module:
    `init(hparams, key, obs)`, its state before any step (envs and key None); `explore(hparams,
    params, obs, key, step) -> (key, action)`, its acting actions (in [-1, 1]^|A| for a Box) after
    `step` env steps and the actor's next key; `train_phase(hparams, state, started, keys, unroll)
    -> (state, stats)`, its gradient steps of one training phase (one per key) where the traced
    bool `started` holds (`scan_when_phase` of its gradient step, DQN's `dqn.train_phase`);
    `greedy(params, obs)`, its deterministic actions; `log_point(hparams, state)`, what a log point
    reads off its state (`Pieces.log_point`); and its training phases: after every
    `phase_env_steps` env steps (all envs counted) come `phase_gradient_steps` gradient steps,
    once `learning_starts` env steps are stored."""

    init: Callable
    explore: Callable
    train_phase: Callable
    greedy: Callable
    log_point: Callable
    phase_env_steps: int
    phase_gradient_steps: int


def replay_state(state):
    """A replay agent's state (`rl.core.state.ReplayState`, SAC's and TD3's `State`) without its
    params and optimiser state, which the learner keeps in fields of their own: the replay
    buffer, target networks, critics and counters."""
    return state._replace(params=None, opt_state=None)


def replay_pieces(config, env, env_params, agent_parts: ReplayAgent) -> Pieces:
    """The pieces of a replay agent (DQN, SAC, TD3): actors act with the agent's `explore` after
    the env steps before the rollout (uniformly random for SAC and TD3 while those are fewer than
    `learning_starts`), recording its action (in [-1, 1]^|A| for a Box, mapped to the env's bounds
    for the env). The learner holds the replay buffer and everything but the actor's params; it
    stores each rollout's arch.rollout_steps x num_envs transitions (s' the observation reached,
    before a reset), then takes the agent's own gradient steps of the training phases they hold,
    each phase's once the env steps stored by its end reach `learning_starts`
    (rl.config.arch.check_rollout_steps: an update holds whole phases). DQN's phases are its own
    (`gradient_steps` every `train_freq` env steps: as many gradient steps and target syncs as its
    one program after as many env steps, not the same batches); SAC's and TD3's phase is the whole
    update (`whole_update_phase`)."""
    agent = config.agent
    steps = config.arch.rollout_steps * agent.num_envs
    phases, per_phase = steps // agent_parts.phase_env_steps, agent_parts.phase_gradient_steps
    assert phases * agent_parts.phase_env_steps == steps, (steps, agent_parts.phase_env_steps)

    def init(key, hparams, obs):
        state = agent_parts.init(hparams, key, obs)
        return state.params, state.opt_state, replay_state(state)

    def act(hparams, params, obs, key, step):
        key, action = agent_parts.explore(hparams, params, obs, key, step)
        return key, (action,), environment.to_env_action(env, env_params, action)

    def transition(obs, action, reward, terminated, truncated, final_obs, reset_step=None):
        """The buffer's transition (`rl.replay.loop.transition`): `truncated` is not stored (a
        truncated step bootstraps from s' like any step that did not terminate), and there are no
        reset steps (same-step resets: rl.config.arch.check_rollout_steps)."""
        assert reset_step is None, "a replay agent's rollouts have no reset steps"
        return replay.transition(obs, action, reward, final_obs, terminated)

    def learn(hparams, params, opt_state, stored, traj, key):
        items = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), traj)  # [T x E, ...]
        phase_ends = stored.step + agent_parts.phase_env_steps * jnp.arange(1, phases + 1)
        state = stored._replace(
            params=params,
            opt_state=opt_state,
            buffer=buffers.uniform_add(stored.buffer, items),
            step=stored.step + items["reward"].shape[0],
        )
        keys = jax.random.split(key, phases * per_phase)
        keys = keys.reshape(phases, per_phase, *keys.shape[1:])
        unroll = min(unroll_of(agent), per_phase)

        def phase(state, xs):
            end, phase_keys = xs
            started = end >= agent.learning_starts
            return agent_parts.train_phase(hparams, state, started, phase_keys, unroll)

        state, stats = jax.lax.scan(phase, state, (phase_ends, keys))
        # NaN-skipping: TD3's actor loss reads NaN between its delayed updates; all NaN (before
        # learning_starts) stays NaN
        stats = jax.tree.map(jnp.nanmean, stats)
        return state.params, state.opt_state, replay_state(state), stats

    def greedy(params, obs):
        return environment.to_env_action(env, env_params, agent_parts.greedy(params, obs))

    space = env.observation_space(env_params)
    return Pieces(
        space, obs_dtype(space), init, act, transition, learn, greedy, agent_parts.log_point
    )


def scan_when_phase(gradient_step: Callable) -> Callable:
    """A `ReplayAgent.train_phase` of `gradient_step(hparams, state, key) -> (state, stats)`: its
    steps where `started` holds, else the state unchanged and NaN stats (`collection.scan_when`)."""

    def train_phase(hparams, state, started, keys, unroll):
        step = partial(gradient_step, hparams)
        return collection.scan_when(started, step, state, keys, unroll=unroll)

    return train_phase


def uniform_before_learning_starts(agent, action_space, explore: Callable) -> Callable:
    """`explore(hparams, params, obs, key) -> action` (SAC's, TD3's) as a `ReplayAgent.explore`:
    uniformly random actions while the env steps before the rollout are fewer than
    `agent.learning_starts`, explore's after."""

    def explore_after_random(hparams, params, obs, key, step):
        key, explore_key, random_key = jax.random.split(key, 3)
        action = explore(hparams, params, obs, explore_key)
        random_action = actor_critic.random_actions(action_space, random_key, obs.shape[0])
        return key, jnp.where(step < agent.learning_starts, random_action, action)

    return explore_after_random


def whole_update_phase(config) -> dict:
    """SAC's and TD3's training phases under rl.sebulba: one an update, of its rollout_steps
    x num_envs env steps and rollout_steps x agent.gradient_steps gradient steps (utd_ratio
    gradient steps per env step, gated on the env steps stored after the rollout)."""
    rollout_steps, agent = config.arch.rollout_steps, config.agent
    return {
        "phase_env_steps": rollout_steps * agent.num_envs,
        "phase_gradient_steps": rollout_steps * agent.gradient_steps,
    }


def dqn_pieces(config) -> Pieces:
    agent = config.agent
    env, env_params = environment.make_env(config)
    dqn.check_env(config, env, env_params)
    learning = dqn.make_learning(config, env, env_params)

    def explore(hparams, params, obs, key, step):
        key, act_key = jax.random.split(key)
        return key, dqn.exploration_action(agent, learning, hparams, params, obs, act_key, step)

    parts = ReplayAgent(
        lambda hparams, key, obs: dqn.init_learning(
            agent, learning, hparams, key, obs, envs=None, key=None
        ),
        explore,
        partial(dqn.train_phase, learning, dqn.make_gradient_step(agent, learning)),
        partial(dqn.greedy_action, learning.apply),
        partial(replay.log_point_values, agent),
        phase_env_steps=agent.train_freq,
        phase_gradient_steps=agent.gradient_steps,
    )
    return replay_pieces(config, env, env_params, parts)


def sac_pieces(config) -> Pieces:
    agent = config.agent
    env, env_params = environment.make_env(config)
    sac.check_env(config, env, env_params)
    learning = sac.make_learning(config, env, env_params)
    variant = learning.variant

    def explore(hparams, params, obs, key):
        policy = variant.distribution.from_head(variant.actor.apply(params, obs))
        return policy.env_action(policy.sample(key))

    parts = ReplayAgent(
        lambda hparams, key, obs: sac.init_learning(
            agent, learning, hparams, *jax.random.split(key), obs, envs=None, key=None
        ),
        uniform_before_learning_starts(agent, env.action_space(env_params), explore),
        scan_when_phase(sac.make_gradient_step(agent, learning)),
        partial(sac.greedy_action, variant),
        lambda hparams, state: {"alpha": jnp.exp(state.log_alpha)},  # as sac's one program
        **whole_update_phase(config),
    )
    return replay_pieces(config, env, env_params, parts)


def td3_pieces(config) -> Pieces:
    agent = config.agent
    env, env_params = environment.make_env(config)
    td3.check_env(config, env, env_params)
    learning = td3.make_learning(config, env, env_params)
    explore = lambda hparams, params, obs, key: td3.exploration_action(
        hparams, learning.actor, params, obs, key
    )
    parts = ReplayAgent(
        lambda hparams, key, obs: td3.init_learning(
            agent, learning, hparams, *jax.random.split(key), obs, envs=None, key=None
        ),
        uniform_before_learning_starts(agent, env.action_space(env_params), explore),
        scan_when_phase(td3.make_gradient_step(agent, learning)),
        learning.actor.apply,
        lambda hparams, state: {"gradient_steps": state.updates},  # as td3's one program
        **whole_update_phase(config),
    )
    return replay_pieces(config, env, env_params, parts)
