"""The actor-learner architecture (`arch.name: sebulba`; Sebulba of Hessel et al. 2021, Cleanba) for
PPO, PQN, DQN, SAC and TD3 on envs stepped outside JAX (gymnasium vector envs, envpool):

    actor thread i, rollout k: wait for params of version >= k - max_lag, step, queue the rollout
    learner, update u:         take rollout u from every actor, learn, publish version u + 1

`Learner` runs the loop (its docstring: versions, episode ends, several hosts, faults); `train`
is the entry point.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rl.config import hyperparams
from rl.config.arch import REPLAY_AGENTS, autoreset_mode
from rl.sebulba.actor import Actor
from rl.sebulba.exchange import Exchange, StallError, Stopped
from rl.sebulba.host_envs import greedy_episodes, make_vector_env
from rl.sebulba.pieces import rollout_sizes
from rl.sebulba.programs import (
    LearnerState,
    check_devices,
    learner_mesh_devices,
    local_copy,
    programs,
)

OK, STOP, FAILED = 0, 1, 2  # a process's vote before each update (processes > 1: `Learner.take`)
# a log point's timings: with several processes, process 0's (`Learner.log_point`)
TIMINGS = ("rollout_wait", "actor_env_wait", "actor_act_wait")

__all__ = [
    "Actor",
    "Learner",
    "LearnerState",
    "StallError",
    "check_devices",
    "local_copy",
    "train",
]


class Learner:
    """The learner of the actor-learner loop (PPO's, PQN's, DQN's, SAC's or TD3's): `init()` (a
    fresh `LearnerState`), `compile(state)` (its update, once per learning setup: `programs`), then
    `run(state)` trains with the actor threads it starts.

    Versions: params of version v are those after v updates; update u takes rollout u from every
    actor (each actor's queue holds at most `arch.queue_size`), so every lag is in [0, max_lag]
    (0: actors and learner alternate, on-policy; 1: Cleanba's overlap). An actor steps its envs as
    `arch.env_groups` groups taking turns (`rl.sebulba.actor.Actor`).
    Episode ends (`arch.autoreset`): each step records `final_obs`, so a time limit bootstraps and
    a termination does not; a next-step reset (envpool's) is recorded with `reset_step` set and
    left out of the losses, their means and PPO's advantage normalisation.
    The learning step is the agent's own (rl.sebulba.pieces), compiled once before the actors
    start; the batch is split on its env axis over the learner devices (replay agents: one
    device). Params are never donated: actors read them.
    Several hosts (`rl train --coordinator ...`): agent.num_envs is the run's total; process p's
    actor i is the run's actor p * actor_threads + i; the update is one program over every
    process's learner devices (`global_batch`), params replicated, actors reading `local_copy`.
    Faults: an actor's error is raised in the learner's thread; a side waiting longer than
    `arch.queue_timeout_s` raises `StallError`; with several processes every process votes before
    each update (`take`, `settle`)."""

    def __init__(self, config):
        self.config, self.agent, self.arch = config, config.agent, config.arch
        self.actor_devices, _ = check_devices(config)
        self.programs = programs(config, learner_mesh_devices(config))
        self.pieces, self.policy = self.programs.pieces, self.programs.policy
        self.sizes = rollout_sizes(config)
        self.hparams = self.replicated(hyperparams(config.agent))
        self.compile_seconds, self.greedy, self.eval_envs = 0.0, None, None
        # several processes (jax.distributed): process p steps the p-th block of agent.num_envs
        self.process, self.processes = jax.process_index(), jax.process_count()

    def replicated(self, tree):
        """Host values (the same on every process) as arrays replicated over the learner's mesh."""
        sharding = self.programs.replicated
        put = lambda x: jax.make_array_from_callback(
            np.shape(x), sharding, lambda i: np.asarray(x)[i]
        )
        return jax.tree.map(put, tree)

    def init(self) -> LearnerState:
        """Fresh params and optimiser state (the agent's init) from PRNGKey(run.seed)."""
        key = self.replicated(np.asarray(jax.random.PRNGKey(self.config.run.seed)))
        return self.programs.init(key, self.hparams)

    def compile(self, state: LearnerState) -> None:
        """Compile the update for rollouts of `num_steps` x `num_envs` steps (once per setup)."""
        if "learn" in self.programs.compiled:
            return
        start, key = time.perf_counter(), jax.random.PRNGKey(0)
        shape, pieces = (self.agent.num_envs, *self.pieces.obs_space.shape), self.pieces
        obs = jax.ShapeDtypeStruct(shape, pieces.obs_dtype)
        step = jax.ShapeDtypeStruct((), np.int32)
        _, record, _ = jax.eval_shape(self.policy, self.hparams, state.params, obs, key, step)
        reward, flag = (jax.ShapeDtypeStruct(shape[:1], t) for t in (np.float32, np.bool_))
        reset_step = flag if autoreset_mode(self.config) == "next_step" else None
        steps = pieces.transition(obs, *record, reward, flag, flag, obs, reset_step=reset_step)
        split, T = self.programs.split, self.sizes.num_steps
        traj = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((T, *x.shape), x.dtype, sharding=split), steps
        )
        lowered = self.programs.learn.lower(
            self.hparams, state.params, state.opt_state, state.replay, traj, key
        )
        self.programs.compiled["learn"] = lowered.compile()
        self.compile_seconds += time.perf_counter() - start

    def start_actors(self, exchange: Exchange, first: int) -> list[threading.Thread]:
        """The actor threads, started: actor i steps its share of the envs (seeded from run.seed
        and `first`, so a resumed run starts fresh episodes) on actor device i mod devices. With
        several processes, process p's actor i is the run's actor p * actor_threads + i (its
        env seeds and PRNG key): the envs of a one-process run with all processes' threads."""
        threads = []
        per_actor = self.agent.num_envs // (self.arch.actor_threads * self.processes)
        seeds = np.random.SeedSequence([self.config.run.seed, first]).generate_state(
            self.agent.num_envs
        )
        base = jax.random.fold_in(jax.random.PRNGKey(self.config.run.seed), first)
        for i in range(self.arch.actor_threads):
            device = self.actor_devices[i % len(self.actor_devices)]
            n = self.process * self.arch.actor_threads + i  # the run's actor index
            mine = [int(x) % 2**31 for x in seeds[n * per_actor : (n + 1) * per_actor]]
            actor = Actor(
                self.pieces, self.config, self.policy, mine, jax.random.fold_in(base, n), device
            )
            actor.warm_up(jax.device_put(exchange.params, device))  # compiled before any wait
            thread = threading.Thread(
                target=actor.run, args=(exchange, i, first), name=f"sebulba-actor-{i}", daemon=True
            )
            thread.start()
            threads.append(thread)
        return threads

    def run(self, state, num_updates=None, should_stop=None, on_log_point=None):
        """Train from `state` to update `num_updates` (default the run's, `rollout_sizes`), a log
        point every `rollout_sizes(config).log_interval` updates (published, and passed to
        `on_log_point(state, row)`), stopping
        early after the update in progress once `should_stop()` is true (several processes: once
        it is true on any process at a vote, before the update that vote precedes, `take`).
        Returns (state, rows)."""
        self.compile(state)
        learn = self.programs.compiled["learn"]
        last = self.sizes.num_updates if num_updates is None else num_updates
        first = int(state.updates)
        asked = lambda: bool(should_stop and should_stop())
        # with several processes, should_stop() is voted on before an update, never mid-wait
        alone = should_stop if self.processes == 1 else None
        exchange = Exchange(local_copy(state.params), first, self.arch, alone)
        new_period = lambda: _Period(skip_nan=self.agent.name in REPLAY_AGENTS)
        threads, rows, period, join_s = [], [], new_period(), 10.0
        failed = None  # several processes: this process's log point failed, voted on next
        try:
            threads = self.start_actors(exchange, first)
            for update in range(first, last):
                start = time.perf_counter()
                rollouts, stop = self.take(exchange, asked, failed)
                if stop:  # several processes: one asked to stop; none enters this update
                    break
                period.waited += time.perf_counter() - start
                traj = self.batch([rollout.traj for rollout in rollouts])
                key, learn_key = jax.random.split(state.key)
                learned = learn(
                    self.hparams, state.params, state.opt_state, state.replay, traj, learn_key
                )
                if self.processes > 1:  # no other collective (gloo on CPUs) may overlap it
                    jax.block_until_ready(learned)
                step = state.step + self.sizes.steps
                state = LearnerState(*learned[:3], key, step, state.updates + 1)
                exchange.publish(local_copy(state.params), update + 1)
                lags = [update - rollout.version for rollout in rollouts]
                period.add(learned[3], lags, rollouts, self.sizes.steps)
                if (update + 1) % self.sizes.log_interval == 0:
                    rows.append(self.log_point(state, period))
                    period = new_period()
                    failed = self.after_log_point(state, rows[-1], on_log_point)
                if self.processes == 1:  # several processes voted before the update (`take`)
                    exchange.raise_failure()
                    if exchange.stopping() or asked():
                        break
            if self.processes > 1:  # a failure at the last log point stops every process too
                self.settle(failed)
        except Stopped:  # one process: should_stop() while waiting, or an actor failed
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

    def take(
        self, exchange: Exchange, asked: Callable[[], bool], failed: BaseException | None = None
    ) -> tuple[list, bool]:
        """(every actor's next rollout, whether every process stops before this update).

        One process: an actor's error, or `StallError` when an actor stalled, raises here, and
        `Stopped` when `should_stop()` comes true while it waits; otherwise whether to stop is
        asked after the update (`run`), so this says False. Several processes: every process votes
        once (`settle`) after taking its rollouts, before `learn`, so a process whose actors or
        last log point failed never enters the collective update. Its vote: FAILED if its last
        log point `failed` (then it takes nothing) or anything interrupted its take (an actor
        raised before or after handing over its rollout, `take` timed out on a stalled actor, a
        second Ctrl-C), else STOP if `asked()` (Ctrl-C), else OK."""
        takes = range(self.arch.actor_threads)
        if self.processes == 1:
            return [exchange.take(i) for i in takes], False
        rollouts, error = [], failed
        if error is None:
            try:
                rollouts = [exchange.take(i) for i in takes]
                exchange.raise_failure()  # an actor that failed after handing over its rollout
            except BaseException as caught:  # an actor's error (SystemExit too), StallError,
                error = caught  # Stopped (an actor failed) or KeyboardInterrupt: voted, raised
            if isinstance(error, Stopped):
                try:
                    exchange.raise_failure()  # the actor's error that stopped the take
                except BaseException as actors:
                    error = actors
        return rollouts, self.settle(error, asked)

    def settle(self, error: BaseException | None, asked: Callable[[], bool] | None = None) -> bool:
        """This process's vote (FAILED with an `error`, else STOP if `asked()`, else OK) against
        every other process's, one `agree` (one process: no vote). Any FAILED: a failed process
        raises its own error, every other process a RuntimeError naming the failed ones. Else
        whether any process voted STOP (then no process learns from the rollouts just taken: the
        state stays the one after the update in progress when the stop was asked). Every process
        calls it at the same points: before each update (`take`), after the last (`run`), and
        before each checkpoint of a run (rl.run.actor_learner), whose write is collective."""
        stop = bool(asked and error is None and asked())
        if self.processes == 1:
            if error is not None:
                raise error
            return stop
        votes = self.agree(FAILED if error is not None else STOP if stop else OK)
        if error is not None:
            raise error
        failed = [p for p, vote in enumerate(votes) if vote == FAILED]
        if failed:
            several = len(failed) > 1
            raise RuntimeError(
                f"sebulba: process{'es' * several} {', '.join(map(str, failed))} failed (an actor "
                f"raised or stalled, a log point's sinks or checkpoint raised, or it was "
                f"interrupted), so process {self.process} stopped too; "
                f"{'their' if several else 'its'} own output (stderr) has the error"
            )
        return STOP in votes

    def after_log_point(self, state: LearnerState, row: dict, on_log_point) -> BaseException | None:
        """`on_log_point(state, row)` after the log point `row` (a run's sinks and checkpoint). One
        process: their errors raise. Several processes: the error is returned, for this process to
        vote FAILED before the next update (`take`) or after the last one (`run`), so that no other
        process waits for it in a collective."""
        try:
            if on_log_point is not None:
                on_log_point(state, row)
        except BaseException as error:  # a sink's or a checkpoint's error, a second Ctrl-C
            if self.processes == 1:
                raise
            return error
        return None

    def global_batch(self, sharding, x: np.ndarray) -> jax.Array:
        """This process's rollout columns [T, local envs, ...] as the run's batch [T, num_envs,
        ...], split on the env axis over the learner devices of every process."""
        shape = (x.shape[0], x.shape[1] * self.processes, *x.shape[2:])
        return jax.make_array_from_process_local_data(sharding, x, shape)

    def batch(self, trajs: list):
        """The update's rollout from this process's actors' Transitions [T, envs_i, ...] (actor
        order), joined on the env axis: a column of NumPy arrays on the host, then the run's batch
        on the learner devices (`global_batch`); one of the actors' device arrays on the first
        learner device, then split over the learner devices (with several processes: through the
        host, as a NumPy column)."""
        return jax.tree.map(self.joined, *trajs)

    def joined(self, *columns):
        """One column of the update's rollout from the actors' (`batch`)."""
        on_host = all(isinstance(x, np.ndarray) for x in columns)
        if on_host or self.processes > 1:
            x = np.concatenate([np.asarray(x) for x in columns], 1)
            return self.global_batch(self.programs.split, x)
        first = self.programs.split.mesh.devices.flat[0]
        x = jnp.concatenate([jax.device_put(x, first) for x in columns], 1)
        return jax.device_put(x, self.programs.split)

    def agree(self, vote: int) -> np.ndarray:
        """Every process's `vote` (OK, STOP or FAILED), in process order: one allgather, which
        every process calls once per update (`take`)."""
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(np.int32(vote))).reshape(-1)

    def log_point(self, state: LearnerState, period: "_Period") -> dict:
        """The log point of `period`, every `rollout_sizes(config).log_interval` updates: the
        actors' finished episodes (envpool Atari: games, `Scores`), the mean loss stats
        (NaN-skipping for the replay agents), the lag (mean, max), the learner's share of time
        waiting for rollouts, env steps per second, `actor_env_wait` and `actor_act_wait`
        (rl.sebulba.actor.Times), the greedy return with `agent.eval_envs` (replay agents:
        `eval_episodes`), and `Pieces.log_point`'s values. With several processes: episodes and
        lags of every process's actors; the greedy evaluation and the timings of process 0, whose
        row every process gets. An evaluation that raises on process 0 stops every process here
        (process 0 with its error, the others with a RuntimeError naming it)."""
        row = {"step": int(state.step), **period.metrics(self.processes)}
        values = self.pieces.log_point(self.hparams, state.replay)  # the agent's, at this point
        row.update({name: np.asarray(value).item() for name, value in values.items()})
        error = None
        if self.sizes.eval_envs:
            returns, lengths = [np.nan], [np.nan]
            if self.process == 0:
                try:
                    returns, lengths = self.evaluate(local_copy(state.params))
                except Exception as caught:  # sent to every process first (several processes)
                    if self.processes == 1:
                        raise
                    error = caught
            row.update(eval_return=float(np.mean(returns)), eval_length=float(np.mean(lengths)))
        if self.processes > 1:  # the timings and the evaluation as process 0 has them
            from jax.experimental import multihost_utils

            own = [k for k in (*TIMINGS, "sps", "eval_return", "eval_length") if k in row]
            sent = np.asarray([error is not None, *(row[k] for k in own)], np.float64)
            values = np.asarray(multihost_utils.broadcast_one_to_all(sent))
            if error is not None:
                raise error
            if values[0]:
                raise RuntimeError(
                    f"sebulba: process 0's greedy evaluation raised at step "
                    f"{row['step']}, so process {self.process} stopped too; process 0's own "
                    "output (stderr) has the error"
                )
            row.update(zip(own, map(float, values[1:])))
        return row

    def evaluate(self, params):
        """(returns, lengths) of the greedy policy's first episode (game: `Scores`) in each of
        `rollout_sizes(config).eval_envs` fresh envs (a sync vector env, made once)."""
        seeds = [self.config.run.seed + 10**6 + i for i in range(self.sizes.eval_envs)]
        if self.greedy is None:
            self.greedy = jax.jit(self.pieces.greedy)
            self.eval_envs, obs = make_vector_env(self.config, seeds, "sync")
        else:
            obs, _ = self.eval_envs.reset(seed=seeds)
        act = lambda obs: self.greedy(params, obs)  # params on one device (local_copy)
        return greedy_episodes(self.eval_envs, obs, act, self.pieces.obs_dtype)


class _Period:
    """What the updates of one log period add up to: loss stats, lags, finished episodes, the
    learner's time waiting for rollouts, and the period's wall clock. With `skip_nan` (the replay
    agents, whose updates before `learning_starts` have NaN stats) the stats' means skip NaN."""

    def __init__(self, skip_nan: bool = False):
        self.skip_nan = skip_nan
        self.stats, self.lags, self.returns, self.lengths = [], [], [], []
        self.waited, self.steps, self.start = 0.0, 0, time.perf_counter()
        self.actor_times = np.zeros(3)  # Times summed over the period's rollouts

    def add(self, stats, lags, rollouts, steps: int):
        self.stats.append(stats)
        self.steps += steps
        self.lags += lags
        for rollout in rollouts:
            self.returns += rollout.returns
            self.lengths += rollout.lengths
            self.actor_times += rollout.times

    def metrics(self, processes: int = 1) -> dict:
        """The period's log point (`Learner.log_point`); with several `processes`, episodes and
        lags summed over every process's actors (a collective: every process calls it)."""
        seconds = time.perf_counter() - self.start
        stats = jax.tree.map(lambda *x: _mean(x, self.skip_nan), *self.stats)
        totals = np.asarray(
            [
                len(self.returns),
                sum(self.returns),
                sum(self.lengths),
                len(self.lags),
                sum(self.lags),
            ],
            np.float64,
        )
        lag_max = max(self.lags)
        if processes > 1:
            from jax.experimental import multihost_utils

            gathered = np.asarray(multihost_utils.process_allgather(np.append(totals, lag_max)))
            totals, lag_max = gathered[:, :-1].sum(0), gathered[:, -1].max()
        episodes, returns, lengths, lags, lag_sum = totals
        mean = lambda total, count: float(total / count) if count else float("nan")
        return {
            "episode_return": mean(returns, episodes),
            "episode_length": mean(lengths, episodes),
            "episodes": int(episodes),
            **stats,
            "param_lag": mean(lag_sum, lags),
            "param_lag_max": int(lag_max),
            "rollout_wait": self.waited / seconds,
            "actor_env_wait": self.actor_times[0] / max(self.actor_times[2], 1e-12),
            "actor_act_wait": self.actor_times[1] / max(self.actor_times[2], 1e-12),
            "sps": self.steps / seconds,
        }


def _mean(values, skip_nan: bool) -> float:
    """The mean of `values`, NaN-skipping with `skip_nan` (NaN where all are NaN)."""
    values = np.asarray(values, np.float64)
    if skip_nan:
        values = values[~np.isnan(values)]
        if not values.size:
            return float("nan")
    return float(np.mean(values))


def train(config, state: LearnerState | None = None, **run):
    """Train `config` (arch.name: sebulba) from `state` (default `Learner.init()`): (final
    `LearnerState`, metrics {name: array over log points}); `run` as `Learner.run` takes it."""
    learner = Learner(config)
    state, rows = learner.run(learner.init() if state is None else state, **run)
    return state, {k: np.asarray([row[k] for row in rows]) for k in (rows[0] if rows else {})}
