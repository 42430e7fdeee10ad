"""An actor of the actor-learner architecture (rl.sebulba): one thread's envs, stepped as
`arch.env_groups` groups that take turns, and its acting with the newest params it may use.

    actor = Actor(pieces, config, policy, env_seeds, key, device)
    traj, returns, lengths = actor.rollout(params, step)     # num_steps steps of its envs
    actor.times                                              # where that rollout's time went
    actor.run(exchange, index, first)                        # rollouts until the exchange stops
"""

from __future__ import annotations

import functools
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl.config import hyperparams
from rl.config.arch import autoreset_mode, device_stack_depth
from rl.sebulba.exchange import Exchange, Stopped
from rl.sebulba.frame_stack import initial_stack, push_frames
from rl.sebulba.host_envs import Scores, make_env_groups, reached_obs
from rl.sebulba.pieces import Pieces, rollout_sizes

__all__ = ["Actor", "Rollout", "Times"]


class Times(NamedTuple):
    """Where one rollout's wall clock went (seconds): `envs`, waiting for the envs' steps
    (`step_wait`; with gymnasium's SyncVectorEnv the step itself runs there); `acting`, the acting
    until its env actions are on the host (the policy's dispatch, its program and the copy); and
    `total`, the whole rollout. The rest (total - envs - acting) is the actor's host work: the
    records, the columns, the episode bookkeeping, and waiting for Python's GIL."""

    envs: float
    acting: float
    total: float


class Rollout(NamedTuple):
    """What an actor hands the learner (`Exchange.put`): a rollout's Transition [T, envs, ...],
    the version of the params it acted with, the returns and lengths of the episodes that ended in
    it, and where its wall clock went."""

    traj: object
    version: int
    returns: list
    lengths: list
    times: Times


class _Group:
    """One env group of an actor (`Actor`): its envs (`rl.sebulba.host_envs.SplitStep`), the
    observations it acts on next (host, or on the actor's device at a rollout's start), its
    running games, and the rollout so far: the acting's records of its steps (device arrays: the
    observations as the acting received them, then the agent's record) in `records`, its host
    columns (reward, terminated, truncated, with same-step resets the reached obs, with next-step
    resets the reset steps) in `host`, arrays [T, envs, ...] filled one step at a time (rows [0,
    len(records)); None before the rollout's first step), and the step in flight's record in
    `record` (None while no step is). With next-step resets `ended` marks the envs whose episode
    ended in the last step: their next step is a reset step (it resets the env, ignoring the
    action), kept across rollouts. With `depth` frames stacked on the device
    (`rl.sebulba.frame_stack`), `obs` are the stacks there and `refill` marks the envs whose game
    ended in the last step (their next frame fills their stack)."""

    def __init__(self, envs, obs, depth: int = 0, device=None):
        self.envs, self.obs, self.scores = envs, obs, Scores(envs.num_envs)
        self.depth, self.refill = depth, np.zeros(envs.num_envs, bool)
        if depth:
            self.obs = initial_stack(jax.device_put(obs, device), depth)
        self.records: list[tuple] = []
        self.host: list[np.ndarray] | None = None
        self.record = None
        next_step = envs.autoreset_mode == "next_step"
        self.ended = np.zeros(envs.num_envs, bool) if next_step else None

    def start_rollout(self) -> None:
        self.records, self.host = [], None

    def columns(self) -> list:
        """The rollout's columns [T, envs, ...]: obs and the agent's record (stacked on the actor's
        device, where they stay: `_stack_on_device`), reward, terminated, truncated, reached obs
        and with next-step resets the reset steps. With next-step resets the reached obs are the
        next step's obs (`_reached_next`, on the device: the group's `obs` must be there, as the
        rollout's end leaves it), with same-step resets a host column. The steps' records are let go
        (their buffers freed while the rollout waits in the queue)."""
        obs, *records = [_stack_on_device(*column) for column in zip(*self.records)]
        self.records = []
        reward, terminated, truncated, *rest = self.host
        if self.ended is not None:
            rest = [_reached_next(obs, self.obs), *rest]
        return [obs, *records, reward, terminated, truncated, *rest]


class Actor:
    """One actor's envs and acting (its thread runs `run`): `rollout(params, step)` steps the envs
    `rollout_sizes(config).num_steps` times with the agent's `act` (`step`: env steps before the
    rollout) and returns (the agent's Transition [T, envs, ...], the returns and the lengths of the
    episodes that ended); `times` then says where its wall clock went (`Times`). The observations go
    to the actor's device once, for the acting, and the rollout keeps them there:
    its obs, its agent record and (next-step resets) its reached obs are arrays on the actor's
    device, the rest NumPy arrays (`Learner.batch` joins both kinds; with several processes,
    jax.distributed, all NumPy arrays: the learner builds the batch from every process's host
    data). With `arch.frame_stack: device` envpool sends each step's newest frames alone and the
    actor stacks them there (`rl.sebulba.frame_stack`): the same observations as envpool's own
    stacks.

    The envs are `arch.env_groups` groups (rl.sebulba.host_envs.make_env_groups) that take turns:
    the actor acts for group g and starts its envs' step (`step_async`), then collects group g + 1's
    step started before (`step_wait`) and acts for it, and so on, so while the actor waits for
    its device to act for one group, the other groups' envs step (envpool's threads, gymnasium's
    worker processes). A rollout starts and ends with no step in flight, so every step of it
    acts with the params it was given; each env's steps keep their order, and the rollout's env
    axis is the groups' envs in order: the rollout one group would give with the same seeds and
    actions. With next-step resets (`arch.autoreset`) the Transition's `reset_step` marks the
    steps that only reset their env (the step after an episode's end, also across rollouts), and
    a step's reached observation is its next observation (the final one where an episode
    ended)."""

    def __init__(self, pieces: Pieces, config, policy: Callable, seeds: list[int], key, device):
        self.pieces, self.config, self.device = pieces, config, device
        self.sizes = rollout_sizes(config)
        self.policy = acting_program(policy, device)
        self.hparams = jax.device_put(hyperparams(config.agent), device)
        arch, dtype = config.arch, pieces.obs_dtype
        autoreset = autoreset_mode(config)
        depth = device_stack_depth(config)
        groups = make_env_groups(
            config, seeds, arch.vector_env, arch.env_groups, autoreset, frames=depth > 0
        )
        self.groups = [_Group(envs, np.asarray(obs, dtype), depth, device) for envs, obs in groups]
        self.key = jax.device_put(key, device)
        self.times = Times(0.0, 0.0, 0.0)  # the last rollout's

    def act(self, params, obs, step):
        """(record, env action) of one step from the observations `obs` (`step`: env steps before
        the rollout, `device_step`'s); the record is (obs on the actor's device, *the agent's
        record). Host `obs` go to the policy's program as they are: the call copies them to the
        actor's device, where the program's other arguments lie, without a `jax.device_put` of
        its own first."""
        self.key, record, env_action = self.policy(self.hparams, params, obs, self.key, step)
        return record, env_action

    def warm_up(self, params) -> None:
        """Compile the acting for the observations it takes (host ones after a step, the device
        ones a rollout starts from), before the actor's thread starts; the actor's PRNG key is
        left as it was."""
        key, obs, step = self.key, self.groups[0].obs, self.device_step(0)
        for x in (obs, jax.device_put(obs, self.device)):
            jax.block_until_ready(self.act(params, x, step))
        self.key = key

    def device_step(self, step: int) -> jax.Array:
        """`step` as an int32 on the actor's device: sent once a rollout, not with every act."""
        return jax.device_put(np.int32(step), self.device)

    def rollout(self, params, step: int = 0):
        start = time.perf_counter()
        waiting, acting = 0.0, 0.0
        step = self.device_step(step)
        for group in self.groups:
            group.start_rollout()
        for _ in range(self.sizes.num_steps):
            for group in self.groups:
                if group.record is not None:
                    waiting += self.collect(group)
                act_start = time.perf_counter()
                group.record, env_action = self.act(params, group.obs, step)
                group.envs.step_async(env_action)  # the env action on the host first
                acting += time.perf_counter() - act_start
        for group in self.groups:
            waiting += self.collect(group)
            # the next rollout's first obs, and this one's last reached obs with next-step resets
            group.obs = jax.device_put(group.obs, self.device)
        per_group = [group.columns() for group in self.groups]
        columns = [_joined(column) for column in zip(*per_group)]  # [T, envs, ...]
        reset_step = columns.pop() if self.groups[0].ended is not None else None
        *columns, reward, terminated, truncated, reached = columns
        ends = (reward.astype(np.float32), terminated, truncated, reached)
        traj = self.pieces.transition(*columns, *ends, reset_step=reset_step)
        if jax.process_count() > 1:  # to the host here, in the actors' threads (`Learner.batch`)
            traj = jax.tree.map(np.asarray, traj)
        returns, lengths = [], []
        for group in self.groups:
            group_returns, group_lengths = group.scores.take()
            returns, lengths = returns + group_returns, lengths + group_lengths
        self.times = Times(waiting, acting, time.perf_counter() - start)
        return traj, returns, lengths

    def collect(self, group: _Group) -> float:
        """Finish `group`'s step in flight: record it (its host values written into the
        rollout's columns while they are fresh in cache, not stacked at the end), and move on to
        the observations it reached (the next episode's first where one ended). Returns the
        seconds it waited for the envs' step."""
        wait_start = time.perf_counter()
        next_obs, reward, terminated, truncated, info = group.envs.step_wait()
        waited = time.perf_counter() - wait_start
        next_obs = np.asarray(next_obs, self.pieces.obs_dtype)
        terminated, truncated = np.asarray(terminated), np.asarray(truncated)
        if group.depth:  # the frames onto the stacks on the device (a reset step's refills)
            next_obs = push_frames(group.obs, next_obs, group.refill)
            group.refill = (terminated | truncated) & np.asarray(info["game_over"])
        host, reset_step = [np.asarray(reward), terminated, truncated], None
        if group.ended is None:  # same-step resets: where an episode ended, its final obs
            host.append(reached_obs(next_obs, info))
        else:  # next-step resets: this step reset the envs that ended
            reset_step, group.ended = group.ended, terminated | truncated
            host.append(reset_step)
        if group.host is None:  # fresh arrays each rollout: the learner may hold the last ones
            steps = self.sizes.num_steps
            group.host = [np.empty((steps, *x.shape), x.dtype) for x in host]
        for column, x in zip(group.host, host):
            column[len(group.records)] = x
        group.records.append(group.record)
        group.scores.add(reward, terminated, truncated, info, reset_step)
        group.obs, group.record = next_obs, None
        return waited

    def close(self) -> None:
        for group in self.groups:
            group.envs.close()

    def run(self, exchange: Exchange, index: int, first: int) -> None:
        """Rollouts first, first + 1, ... into `exchange` until it stops: rollout k waits for
        params of version >= k - arch.max_lag (`Exchange.params_for`) and goes to the learner
        through the actor's queue (`Exchange.put`, with the params' version and its `Times`); an
        error is handed to the learner's thread (`Exchange.fail`) and raised there."""
        name, batch = f"actor {index}", self.sizes.steps
        try:
            for k in range(first, 2**62):
                params, version = exchange.params_for(k - self.config.arch.max_lag, name)
                params = jax.device_put(params, self.device)
                traj, returns, lengths = self.rollout(params, k * batch)
                exchange.put(index, Rollout(traj, version, returns, lengths, self.times), name)
        except Stopped:
            pass
        except BaseException as error:  # raised again in the learner's thread
            exchange.fail(error, name)
        finally:
            self.close()


@jax.jit
def _stack_on_device(*steps):
    """One column [T, envs, ...] of the acting's records from its steps' device arrays, stacked on
    their device by one compiled program (not an operation per step)."""
    return jnp.stack(steps)


@jax.jit
def _reached_next(obs, last):
    """The obs each step of a rollout reached with next-step resets: obs[t + 1], and `last` (the
    obs after the rollout) for its last step. An episode's end is no exception: its final obs is
    the next step's obs (that step resets the env)."""
    return jnp.concatenate([obs[1:], last[None]])


@jax.jit
def _concatenate_envs(*columns):
    return jnp.concatenate(columns, 1)


def _joined(group_columns: tuple):
    """The groups' [T, envs_g, ...] columns side by side on the env axis (one group's as it is):
    host columns on the host, device columns on their device."""
    if len(group_columns) == 1:
        return group_columns[0]
    if isinstance(group_columns[0], np.ndarray):
        return np.concatenate(group_columns, 1)
    return _concatenate_envs(*group_columns)


@functools.cache  # one program per policy and device, whatever the actors
def acting_program(policy: Callable, device) -> Callable:
    """`policy` ((hparams, params, obs, key, step) -> (key, record, env action)) jitted with the
    observations on the device prepended to its record: (key, (obs, *record), env action), so the
    rollout keeps the obs the acting sent to the device instead of sending them again. On a GPU
    `device` the env action is written to pinned host memory: read on the host without a copy of
    its own after the program (one H200: 84 us from launch to the action on the host, against 211
    us through device memory), the key and the record staying on the device (elsewhere every
    output stays there). Its outputs' shardings are the device's own, so the key an act returns
    asks for no other program than the first act's."""

    def act(hparams, params, obs, key, step):
        key, record, env_action = policy(hparams, params, obs, key, step)
        return key, (obs, *record), env_action

    on_device = jax.sharding.SingleDeviceSharding(device)
    if device.platform != "gpu":  # every output on the device, whatever the params' sharding
        return jax.jit(act, out_shardings=on_device)
    on_host = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    return jax.jit(act, out_shardings=(on_device, on_device, on_host))
