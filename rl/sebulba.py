"""The actor-learner architecture (Sebulba: Hessel et al. 2021, "Podracer architectures for scalable
reinforcement learning"; Cleanba) for PPO on gymnasium vector envs: `arch.name: sebulba`.

    actor thread i (of arch.actor_threads)           learner (the calling thread)
    a gymnasium vector env of num_envs / threads     for update u = first, first + 1, ...:
    for rollout k = first, first + 1, ...:             take rollout u from every actor's queue
      wait for params of version >= k - max_lag          (concatenated on the env axis)
      num_steps steps, acting with the jitted            lag = u - the version it was acted with
      policy on the thread's actor device                ppo.learn on the learner device(s)
      put (rollout k, version) in its queue  ----->      publish params of version u + 1

* Versions: params of version v are those after v updates. An update takes rollout u from every
  actor, and an actor starts rollout k only with params of version >= k - arch.max_lag, so every
  update's lag is in [0, max_lag]: 0 alternates actors and learner (the one-program path's
  on-policy PPO), 1 lets an actor collect the next rollout while the learner learns from the last
  (Cleanba's overlap). Each actor's queue holds at most arch.queue_size rollouts.
* Episode ends: the vector envs auto-reset in the step that ends an episode (gymnasium's
  `AutoresetMode.SAME_STEP`); each step records the observation it reached (`final_obs`: the one
  before the reset where an episode ended), so GAE bootstraps from V(final_obs) at a time limit and
  not at a termination, as everywhere in fusedrl.
* Learning is PPO's own `learn` (statistics, batch, minibatch epochs, fused kernels where they fit),
  compiled once before the actors start; the batch is split on its env axis over the learner devices
  (jax.sharding; XLA reduces the gradients). Params are never donated: actors read them.
* Faults: an actor that raises stops the run with its error, raised in the learner's thread; a side
  that waits longer than arch.queue_timeout_s for the other raises `StallError` saying which side
  stalled; every wait polls a stop event, so the learner's end, error or Ctrl-C stops the actors.
* Logging: every `agent.log_interval` updates a log point goes to the rl.logging sinks (`publish`):
  the actors' finished episodes, the mean loss stats, the lag (mean and max over actors and
  updates), the learner's share of time waiting for rollouts, env steps per second, and with
  `agent.eval_envs` the greedy return of that many episodes.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any, Callable, NamedTuple

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium.vector import AutoresetMode
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from envs.spaces import Discrete
from rl import environment
from rl.agents import ppo
from rl.config import hyperparams
from rl.config_parsing import ConfigError
from rl.logging import publish
from rl.programs import at_matmul_precision
from rl.sebulba_exchange import Exchange, StallError, Stopped

__all__ = ["Learner", "LearnerState", "StallError", "check_devices", "train"]


class LearnerState(NamedTuple):
    """The learner's training state (`rl.state`'s names): params, optimiser state, the PRNG key of
    the next update, env steps and updates so far. The envs live in the actor threads."""

    params: Any
    opt_state: Any
    key: jax.Array
    step: jax.Array
    updates: jax.Array


def check_devices(config) -> tuple[list, list]:
    """(actor devices, learner devices): `config.arch`'s indices into jax.devices(); ConfigError
    naming the key for an index that is not a device."""
    devices = jax.devices()
    for key in ("actor_devices", "learner_devices"):
        missing = [i for i in getattr(config.arch, key) if i >= len(devices)]
        if missing:
            raise ConfigError(
                f"arch.{key}: there is no device {missing[0]}; jax.devices() has {len(devices)}: "
                + ", ".join(map(str, devices))
            )
    return [devices[i] for i in config.arch.actor_devices], [
        devices[i] for i in config.arch.learner_devices
    ]


def make_vector_env(config, num_envs: int, mode: str):
    """`num_envs` copies of the gymnasium env `config.env.id` ("gymnasium:<id>", made with
    `env.params` as keywords) as a vector env (`mode` "sync" or "async") that auto-resets in the
    step an episode ends, the ended episode's observation in `info["final_obs"]`."""
    env_id = config.env.id.removeprefix("gymnasium:")
    vector_kwargs = {"autoreset_mode": AutoresetMode.SAME_STEP}
    if mode == "async":  # fresh worker processes: no fork of this multithreaded one
        vector_kwargs["context"] = "spawn"
    return gymnasium.make_vec(
        env_id, num_envs, vectorization_mode=mode, vector_kwargs=vector_kwargs, **config.env.params
    )


def obs_dtype(s: ppo.Setup):
    """The dtype the network reads observations in (as `envs.from_gymnasium` gives them)."""
    return np.int32 if isinstance(s.env.observation_space(s.env_params), Discrete) else np.float32


def act(s: ppo.Setup, params, obs, key):
    """(key, action, log pi(action|obs), the action the gymnasium env takes): a sample of PPO's
    policy, as its rollout takes one, with Box actions mapped to the env's bounds."""
    key, sample_key = jax.random.split(key)
    pi = ppo.policy(s, params, obs)
    action = pi.sample(sample_key)
    log_prob, _ = pi.log_prob_entropy(action, backend="reference")
    env_action = environment.to_env_action(s.env, s.env_params, pi.env_action(action))
    return key, action, log_prob, env_action


class Actor:
    """One actor's envs and acting (its thread runs `run`): `rollout(params)` steps the envs
    `agent.num_steps` times with the policy and returns (`ppo.Transition` of NumPy arrays
    [T, envs, ...], the returns and the lengths of the episodes that ended)."""

    def __init__(self, s: ppo.Setup, config, policy: Callable, seeds: list[int], key, device):
        self.s, self.config, self.policy, self.device = s, config, policy, device
        self.envs = make_vector_env(config, len(seeds), config.arch.vector_env)
        self.dtype = obs_dtype(s)
        self.obs = np.asarray(self.envs.reset(seed=seeds)[0], self.dtype)
        self.key = jax.device_put(key, device)
        self.returns, self.lengths = np.zeros(len(seeds)), np.zeros(len(seeds), np.int64)

    def rollout(self, params):
        steps, returns, lengths = [], [], []
        for _ in range(self.config.agent.num_steps):
            obs = jax.device_put(self.obs, self.device)
            self.key, action, log_prob, env_action = self.policy(params, obs, self.key)
            next_obs, reward, terminated, truncated, info = self.envs.step(np.asarray(env_action))
            next_obs = np.asarray(next_obs, self.dtype)
            final_obs = next_obs.copy()
            for i in np.flatnonzero(info.get("_final_obs", ())):
                final_obs[i] = info["final_obs"][i]
            steps.append((self.obs, action, log_prob, reward, terminated, truncated, final_obs))
            self.returns, self.lengths = self.returns + reward, self.lengths + 1
            ended = np.flatnonzero(terminated | truncated)
            returns += self.returns[ended].tolist()
            lengths += self.lengths[ended].tolist()
            self.returns[ended], self.lengths[ended] = 0.0, 0
            self.obs = next_obs
        columns = [np.stack([np.asarray(x) for x in column]) for column in zip(*steps)]
        columns[3] = columns[3].astype(np.float32)
        return ppo.Transition(*columns), returns, lengths

    def run(self, exchange: Exchange, index: int, first: int) -> None:
        """Rollouts first, first + 1, ... into `exchange` until it stops (module docstring); an
        error is handed to the learner."""
        name = f"actor {index}"
        try:
            for k in range(first, 2**62):
                params, version = exchange.params_for(k - self.config.arch.max_lag, name)
                traj, returns, lengths = self.rollout(jax.device_put(params, self.device))
                exchange.put(index, (traj, version, returns, lengths), name)
        except Stopped:
            pass
        except BaseException as error:  # raised again in the learner's thread
            exchange.fail(error, name)
        finally:
            self.envs.close()


class Programs(NamedTuple):
    """A learning setup's jitted programs (`programs`): PPO's setup, `policy(params, obs, key)`
    (`act`), `init(key, hparams) -> LearnerState`, `learn(hparams, params, opt_state, traj, key)
    -> (params, opt_state, mean loss stats)` (`ppo.learn`), compiled once (`compiled`), and the
    shardings of the learner devices' mesh: params replicated, rollouts split on the env axis."""

    s: ppo.Setup
    policy: Callable
    init: Callable
    learn: Callable
    compiled: dict
    replicated: NamedSharding
    split: NamedSharding


_PROGRAMS: dict = {}  # the programs of each learning setup: seeds of one config compile once


def programs(config, learner_devices) -> Programs:
    """The jitted programs of `config`'s learning setup (its agent, env, kernels, precision and
    learner devices), made once per process and shared by every `Learner` of that setup."""
    env = repr(sorted(config.to_dict()["env"].items()))
    ids = tuple(device.id for device in learner_devices)
    key = (config.agent, env, config.kernels, config.run.matmul_precision, ids)
    if key in _PROGRAMS:
        return _PROGRAMS[key]
    s, precision = ppo.make_setup(config), config.run.matmul_precision
    grads_fn, batch_fn = ppo.learning_pieces(config, s)

    def init(key, hparams):
        key, net_key = jax.random.split(key)
        space = s.env.observation_space(s.env_params)
        params, opt_state = ppo.init_params(
            s, net_key, hparams, jnp.zeros(space.shape, obs_dtype(s))
        )
        return LearnerState(params, opt_state, key, jnp.int32(0), jnp.int32(0))

    def learn(hparams, params, opt_state, traj, key):
        learned = ppo.learn(s, grads_fn, batch_fn, hparams, params, opt_state, traj, key)
        return *learned[:2], jax.tree.map(jnp.mean, learned[2])

    mesh = Mesh(np.array(learner_devices), ("envs",))
    replicated = NamedSharding(mesh, PartitionSpec())
    jitted = lambda fn, **kw: jax.jit(at_matmul_precision(fn, precision), **kw)
    _PROGRAMS[key] = Programs(
        s,
        jitted(partial(act, s)),
        jitted(init, out_shardings=replicated),
        jitted(learn, out_shardings=replicated),
        {},
        replicated,
        NamedSharding(mesh, PartitionSpec(None, "envs")),
    )
    return _PROGRAMS[key]


class Learner:
    """PPO's learner of the actor-learner loop: `init()` (a fresh `LearnerState`), `compile(state)`
    (its update, once per learning setup: `programs`), then `run(state)` trains with the actor
    threads it starts (module docstring)."""

    def __init__(self, config):
        self.config, self.agent, self.arch = config, config.agent, config.arch
        self.actor_devices, learner_devices = check_devices(config)
        self.programs = programs(config, learner_devices)
        self.s, self.policy = self.programs.s, self.programs.policy
        self.hparams = hyperparams(config.agent)
        self.compile_seconds, self.greedy, self.eval_envs = 0.0, None, None

    def init(self) -> LearnerState:
        """Fresh params and optimiser state (`ppo.init_params`) from PRNGKey(run.seed)."""
        return self.programs.init(jax.random.PRNGKey(self.config.run.seed), self.hparams)

    def compile(self, state: LearnerState) -> None:
        """Compile the update for rollouts of `num_steps` x `num_envs` steps (once per setup)."""
        if "learn" in self.programs.compiled:
            return
        start, key = time.perf_counter(), jax.random.PRNGKey(0)
        space = self.s.env.observation_space(self.s.env_params)
        obs = jax.ShapeDtypeStruct((self.agent.num_envs, *space.shape), obs_dtype(self.s))
        _, action, log_prob, _ = jax.eval_shape(self.policy, state.params, obs, key)
        reward, flag = (jax.ShapeDtypeStruct(log_prob.shape, t) for t in (np.float32, np.bool_))
        steps = ppo.Transition(obs, action, log_prob, reward, flag, flag, obs)
        split, T = self.programs.split, self.agent.num_steps
        traj = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((T, *x.shape), x.dtype, sharding=split), steps
        )
        lowered = self.programs.learn.lower(self.hparams, state.params, state.opt_state, traj, key)
        self.programs.compiled["learn"] = lowered.compile()
        self.compile_seconds += time.perf_counter() - start

    def start_actors(self, exchange: Exchange, first: int) -> list[threading.Thread]:
        """The actor threads, started: actor i steps its share of the envs (seeded from run.seed
        and `first`, so a resumed run starts fresh episodes) on actor device i mod devices."""
        threads, per_actor = [], self.agent.num_envs // self.arch.actor_threads
        seeds = np.random.SeedSequence([self.config.run.seed, first]).generate_state(
            self.agent.num_envs
        )
        base = jax.random.fold_in(jax.random.PRNGKey(self.config.run.seed), first)
        for i in range(self.arch.actor_threads):
            device = self.actor_devices[i % len(self.actor_devices)]
            mine = [int(x) % 2**31 for x in seeds[i * per_actor : (i + 1) * per_actor]]
            actor = Actor(
                self.s, self.config, self.policy, mine, jax.random.fold_in(base, i), device
            )
            put = partial(jax.device_put, device=device)  # the policy compiled before any wait
            jax.block_until_ready(self.policy(put(exchange.params), put(actor.obs), actor.key))
            thread = threading.Thread(
                target=actor.run, args=(exchange, i, first), name=f"sebulba-actor-{i}", daemon=True
            )
            thread.start()
            threads.append(thread)
        return threads

    def run(self, state, num_updates=None, should_stop=None, on_log_point=None):
        """Train from `state` to update `num_updates` (default agent.num_updates), a log point every
        agent.log_interval updates (published, and passed to `on_log_point(state, row)`), stopping
        early after the update in progress once `should_stop()` is true. Returns (state, rows)."""
        self.compile(state)
        learn, split = self.programs.compiled["learn"], self.programs.split
        last = self.agent.num_updates if num_updates is None else num_updates
        first = int(state.updates)
        exchange = Exchange(state.params, first, self.arch, should_stop)
        threads, rows, period, join_s = [], [], _Period(), 10.0
        try:
            threads = self.start_actors(exchange, first)
            for update in range(first, last):
                start = time.perf_counter()
                rollouts = [exchange.take(i) for i in range(self.arch.actor_threads)]
                period.waited += time.perf_counter() - start
                traj = jax.tree.map(lambda *x: np.concatenate(x, 1), *(r[0] for r in rollouts))
                key, learn_key = jax.random.split(state.key)
                traj = jax.device_put(traj, split)
                learned = learn(self.hparams, state.params, state.opt_state, traj, learn_key)
                step = state.step + self.agent.batch_size
                state = LearnerState(*learned[:2], key, step, state.updates + 1)
                exchange.publish(state.params, update + 1)
                lags = [update - version for _, version, _, _ in rollouts]
                period.add(learned[2], lags, rollouts, self.agent.batch_size)
                if (update + 1) % self.agent.log_interval == 0:
                    rows.append(self.log_point(state, period))
                    period = _Period()
                    if on_log_point is not None:
                        on_log_point(state, rows[-1])
                exchange.raise_failure()
                if exchange.stopping():
                    break
        except Stopped:  # should_stop() while waiting, or an actor failed
            exchange.raise_failure()
        except BaseException:  # the actors' state does not matter any more: a short join
            join_s = 1.0
            raise
        finally:
            exchange.stop.set()
            deadline = time.monotonic() + join_s
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
        return state, rows

    def log_point(self, state: LearnerState, period: "_Period") -> dict:
        """The log point of `period` (module docstring), published to the rl.logging sinks."""
        row = {"step": int(state.step), **period.metrics()}
        if self.agent.eval_envs:
            returns, lengths = self.evaluate(state.params)
            row.update(eval_return=float(np.mean(returns)), eval_length=float(np.mean(lengths)))
        publish({k: np.asarray([v]) for k, v in row.items()})  # a run of one seed
        return row

    def evaluate(self, params):
        """(returns, lengths) of the greedy policy's first episode in each of `agent.eval_envs`
        fresh envs (a sync vector env, made once)."""
        if self.greedy is None:
            self.greedy = jax.jit(ppo.make_policy(self.config))
            self.eval_envs = make_vector_env(self.config, self.agent.eval_envs, "sync")
        obs, _ = self.eval_envs.reset(seed=self.config.run.seed + 10**6)
        returns, lengths = np.zeros(len(obs)), np.zeros(len(obs), np.int64)
        running = np.ones(len(obs), bool)
        while running.any():
            action = self.greedy(params, np.asarray(obs, obs_dtype(self.s)), None)
            obs, reward, terminated, truncated, _ = self.eval_envs.step(np.asarray(action))
            returns, lengths = returns + running * reward, lengths + running
            running &= ~(terminated | truncated)
        return returns, lengths


class _Period:
    """What the updates of one log period add up to: loss stats, lags, finished episodes, the
    learner's time waiting for rollouts, and the period's wall clock."""

    def __init__(self):
        self.stats, self.lags, self.returns, self.lengths = [], [], [], []
        self.waited, self.steps, self.start = 0.0, 0, time.perf_counter()

    def add(self, stats, lags, rollouts, steps: int):
        self.stats.append(stats)
        self.steps += steps
        self.lags += lags
        for _, _, returns, lengths in rollouts:
            self.returns += returns
            self.lengths += lengths

    def metrics(self) -> dict:
        seconds = time.perf_counter() - self.start
        stats = jax.tree.map(lambda *x: float(np.mean(x)), *self.stats)
        mean = lambda x: float(np.mean(x)) if x else float("nan")
        return {
            "episode_return": mean(self.returns),
            "episode_length": mean(self.lengths),
            "episodes": len(self.returns),
            **stats,
            "param_lag": mean(self.lags),
            "param_lag_max": int(max(self.lags)),
            "rollout_wait": self.waited / seconds,
            "sps": self.steps / seconds,
        }


def train(config, state: LearnerState | None = None, **run):
    """Train `config` (arch.name: sebulba) from `state` (default `Learner.init()`): (final
    `LearnerState`, metrics {name: array over log points}); `run` as `Learner.run` takes it."""
    learner = Learner(config)
    state, rows = learner.run(learner.init() if state is None else state, **run)
    return state, {k: np.asarray([row[k] for row in rows]) for k in (rows[0] if rows else {})}
