"""The actor-learner architecture's env groups (`arch.env_groups`, rl.sebulba.learner.Actor): an
actor that steps its envs as two groups taking turns (acting for one while the other's envs step)
collects the rollouts one group collects with the same seeds and actions, on gymnasium's sync vector
env (the synchronous fallback of rl.sebulba.host_envs.SplitStep), its async one and envpool's
send/recv. envpool does not import on the CPU machines CI runs on, so envpool's path runs here on
`FakePool`, a small stand-in with envpool's API and semantics (tests/envs/test_envpool.py checks
envs.envpool against the real envpool where it imports)."""

from __future__ import annotations

import dataclasses
import sys
import threading
import types
from collections import namedtuple

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_sebulba import COUNTDOWN, SMALL

from rl.config import build_config
from rl.config.parsing import ConfigError
from rl.sebulba import learner as sebulba
from rl.sebulba.host_envs import SplitStep, make_vector_env
from rl.sebulba.pieces import make_pieces

# ---------------------------------------------------------------- a fake envpool


class FakePool:
    """An envpool pool of `num_envs` Countdown-like envs in envpool's synchronous mode (batch_size
    == num_envs), with envpool's gymnasium API and the semantics envs.envpool relies on:

    * `send(action, env_id=None)` hands the actions to the pool's own thread, which steps those envs
      while the caller goes on; `recv()` waits for that step and returns (obs, reward, terminated,
      truncated, info with "env_id") in the order the envs were sent; `step` is `send` + `recv`.
    * An env resets in the step *after* the one that ended its episode, ignoring that step's action
      (reward 0, no end): envpool's next-step reset. `reset()` resets every env.
    * obs = [t, seed of the env] (the env's seed is `seed + i`, as envpool seeds env i); reward =
      1 + action; an env's episode e (from 0) lasts `2 + (seed + e) % 4` steps: ending by
      termination, except at t = 4 where `max_episode_steps` truncates it.

    Stricter than envpool: one `send` at a time (`recv` before the next). `FakePool.in_flight`
    counts the sends of all pools whose `recv` has not come yet, `FakePool.most_in_flight` its
    maximum."""

    lock = threading.Lock()
    in_flight = most_in_flight = 0

    def __init__(self, num_envs, seed, max_episode_steps=4):
        self.num_envs, self.limit = num_envs, max_episode_steps
        self.seeds = seed + np.arange(num_envs)
        self.observation_space = gymnasium.spaces.Box(0.0, 1e9, (2,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)
        self.t, self.episode = np.zeros(num_envs, np.int64), np.zeros(num_envs, np.int64)
        self.ended = np.zeros(num_envs, bool)
        self.thread, self.result = None, None

    def obs(self, ids):
        return np.stack([self.t[ids], self.seeds[ids]], 1).astype(np.float32)

    def reset(self):
        self.t[:], self.episode[:], self.ended[:] = 0, 0, False
        ids = np.arange(self.num_envs)
        return self.obs(ids), {"env_id": ids}

    def send(self, action, env_id=None):
        assert self.thread is None, "FakePool: recv before the next send"
        ids = np.arange(self.num_envs) if env_id is None else np.asarray(env_id)
        action = np.asarray(action)
        assert action.shape == ids.shape, (action.shape, ids.shape)
        self.thread = threading.Thread(target=self._step, args=(ids, action))
        with FakePool.lock:
            FakePool.in_flight += 1
            FakePool.most_in_flight = max(FakePool.most_in_flight, FakePool.in_flight)
        self.thread.start()

    def recv(self):
        assert self.thread is not None, "FakePool: send before recv"
        self.thread.join()
        self.thread = None
        with FakePool.lock:
            FakePool.in_flight -= 1
        return self.result

    def step(self, action, env_id=None):
        self.send(action, env_id)
        return self.recv()

    def _step(self, ids, action):
        reward = np.zeros(len(ids), np.float32)
        terminated, truncated = np.zeros(len(ids), bool), np.zeros(len(ids), bool)
        for k in reversed(range(len(ids))):  # the pool's threads finish in any order
            i = ids[k]
            if self.ended[i]:  # envpool's next-step reset
                self.t[i], self.episode[i], self.ended[i] = 0, self.episode[i] + 1, False
                continue
            self.t[i] += 1
            reward[k] = 1.0 + action[k]
            terminated[k] = self.t[i] == 2 + (self.seeds[i] + self.episode[i]) % 4
            truncated[k] = not terminated[k] and self.t[i] == self.limit
            self.ended[i] = terminated[k] or truncated[k]
        self.result = self.obs(ids), reward, terminated, truncated, {"env_id": ids}

    def close(self):
        assert self.thread is None, "FakePool: closed with a step in flight"


Config = namedtuple("Config", "num_envs batch_size seed max_episode_steps")


def fake_envpool_module():
    """A stand-in for the `envpool` module (its `list_all_envs`, `make_spec`, `make`) holding one
    id, Countdown-v0 (`FakePool`)."""

    def make_spec(env_id, **options):
        pool = FakePool(1, 0, **options)
        spec = types.SimpleNamespace(config=Config(1, 1, 0, 4))
        spec.observation_space, spec.action_space = pool.observation_space, pool.action_space
        return spec

    def make(env_id, env_type, num_envs, seed, **options):
        assert env_type == "gymnasium"
        return FakePool(num_envs, seed, **options)

    return types.SimpleNamespace(
        list_all_envs=lambda: ["Countdown-v0"], make_spec=make_spec, make=make
    )


@pytest.fixture
def fake_envpool(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", fake_envpool_module())
    monkeypatch.setattr(FakePool, "most_in_flight", 0)
    return "envpool:Countdown-v0"


# ---------------------------------------------------------------- helpers


def config(env=COUNTDOWN, arch=None, agent=None, env_params=None):
    data = {"env": {"id": env, **({"params": env_params} if env_params else {})}}
    data["agent"] = {"name": "ppo", **SMALL, **(agent or {})}
    return build_config({**data, "arch": {"name": "sebulba", **(arch or {})}})


def fixed_policy(hparams, params, obs, key, step):
    """A policy that is a function of the observation (and the env steps before the rollout):
    the same actions whatever the groups, and a record that shows which obs it acted on."""
    x = obs[:, 0] if obs.shape[-1] == 2 else obs[:, 0] > 0  # the fake's t; CartPole's cart x
    action = ((x.astype(jnp.int32) + step // 64) % 2).astype(jnp.int32)
    log_prob = obs.sum(-1) + step
    return key, (action, log_prob), action


def rollouts(cfg, groups, count=3, seeds=(11, 12, 13, 14), mode=None):
    """`count` rollouts of an actor with `groups` env groups, the fixed policy and `seeds`."""
    arch = {"env_groups": groups, **({"vector_env": mode} if mode else {})}
    cfg = dataclasses.replace(cfg, arch=dataclasses.replace(cfg.arch, **arch))
    pieces = make_pieces(cfg)
    policy = jax.jit(fixed_policy)
    actor = sebulba.Actor(pieces, cfg, policy, list(seeds), jax.random.PRNGKey(0), jax.devices()[0])
    try:
        return [actor.rollout({}, k * 64) for k in range(count)]
    finally:
        actor.close()


def assert_same_rollouts(got, want):
    for (traj, returns, lengths), (traj_1, returns_1, lengths_1) in zip(got, want):
        for field, a, b in zip(traj._fields, traj, traj_1):
            np.testing.assert_array_equal(a, b, err_msg=field)
        assert sorted(zip(returns, lengths)) == sorted(zip(returns_1, lengths_1))


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    "arch, message",
    [
        ({"env_groups": 3}, r"^arch.env_groups: each actor thread's 2 envs .* into 3 groups"),
        ({"env_groups": 4, "actor_threads": 1}, None),
        ({"env_groups": 2, "actor_threads": 4}, r"^arch.env_groups: each actor thread's 1 envs"),
        ({"env_groups": 0}, r"arch.env_groups"),
    ],
)
def test_env_groups_that_do_not_split_an_actors_envs_are_refused(arch, message):
    if message is None:
        assert config(arch=arch).arch.env_groups == 4
        return
    with pytest.raises(ConfigError, match=message):
        config(arch=arch)


def test_env_groups_need_the_sebulba_arch():
    with pytest.raises(ConfigError, match=r"arch.env_groups is a setting of the actor-learner"):
        build_config(
            {"env": {"id": "CartPole-v1"}, "agent": {"name": "ppo"}, "arch": {"env_groups": 2}}
        )


# ---------------------------------------------------------------- SplitStep


def test_split_step_of_a_sync_vector_env_steps_in_step_wait_as_step_does():
    cfg = config(env="gymnasium:CartPole-v1")
    split = SplitStep(make_vector_env(cfg, [1, 2], "sync")[0])
    plain = make_vector_env(cfg, [1, 2], "sync")[0]
    assert not split.native
    for t in range(30):
        actions = jnp.asarray([t % 2, (t // 3) % 2])  # a device array, converted in step_wait
        split.step_async(actions)
        got, want = split.step_wait(), plain.step(np.asarray(actions))
        for a, b in zip(got[:4], want[:4]):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(AssertionError, match="step_async before step_wait"):
        split.step_wait()
    split.close()
    plain.close()


def test_envpool_vector_env_splits_its_step_into_send_and_recv(fake_envpool):
    from envs.envpool import VectorEnv

    envs = VectorEnv("Countdown-v0", 3, seed=5)
    split = SplitStep(envs)
    assert split.native
    obs, _ = envs.reset()
    ends = 0
    for _ in range(12):
        split.step_async(np.ones(3, np.int64))
        assert FakePool.in_flight == 1  # stepping on the pool's thread until step_wait
        next_obs, reward, terminated, truncated, info = split.step_wait()
        ended = terminated | truncated
        np.testing.assert_array_equal(reward, 2.0)  # never envpool's reset step's 0
        np.testing.assert_array_equal(next_obs[:, 1], [5, 6, 7])
        if ended.any():  # same-step auto-reset: the next episode's first obs, final_obs beside
            ends += 1
            np.testing.assert_array_equal(info["final_obs"][:, 0], obs[:, 0] + 1)
            np.testing.assert_array_equal(next_obs[ended, 0], 0)
            assert info["_final_obs"].tolist() == ended.tolist()
        np.testing.assert_array_equal(next_obs[~ended, 0], obs[~ended, 0] + 1)
        obs = next_obs
    assert ends >= 3
    envs.close()


# ---------------------------------------------------------------- two groups, one group's rollout


def test_two_groups_collect_one_groups_rollouts_on_gymnasium_sync_envs():
    cfg = config(env="gymnasium:CartPole-v1", agent={"num_steps": 40})
    one, two = rollouts(cfg, 1), rollouts(cfg, 2)
    assert_same_rollouts(two, one)
    assert one[0][0].obs.shape == (40, 4, 4) and one[0][0].terminated.any()
    first_obs = np.asarray(one[0][0].obs[0])
    assert len({tuple(x) for x in first_obs}) == 4  # four differently seeded envs


def test_two_groups_collect_one_groups_rollouts_on_gymnasium_async_envs():
    cfg = config(env="gymnasium:CartPole-v1", agent={"num_steps": 48})
    one = rollouts(cfg, 1, count=2, seeds=(3, 4))
    two = rollouts(cfg, 2, count=2, seeds=(3, 4), mode="async")
    assert_same_rollouts(two, one)
    assert (one[0][0].terminated | one[0][0].truncated).any()  # an episode end is compared too


@pytest.mark.parametrize("autoreset", ["same_step", "next_step"])
def test_two_groups_collect_one_groups_rollouts_on_envpool(fake_envpool, autoreset):
    """The fake's rewards show the action each step took, its obs the step and the env's seed, its
    log_prob record the obs acted on: all aligned as with one group, episodes (terminated,
    truncated at t = 4, final_obs) continued across rollouts, and with two groups the two pools'
    steps overlap. Same-step resets: the step after an end acts on the next episode's first obs.
    Next-step resets: it acts on the final obs and only resets the env (reward 0), recorded as a
    reset step, also where the end was a rollout's last step."""
    cfg = config(env=fake_envpool, agent={"num_steps": 10}, arch={"autoreset": autoreset})
    seeds = (11, 40, 7, 99)  # envpool seeds env i of the actor's pool seeds[0] + i
    one = rollouts(cfg, 1, seeds=seeds)
    assert FakePool.most_in_flight == 1
    FakePool.most_in_flight = 0
    two = rollouts(cfg, 2, seeds=seeds)
    assert FakePool.most_in_flight == 2  # one group's envs stepped while the actor acted
    assert_same_rollouts(two, one)
    column = lambda name: np.concatenate([getattr(traj, name) for traj, _, _ in one])  # [30, 4]
    obs, final_obs, ended = column("obs"), column("final_obs"), column("terminated")
    ended = ended | column("truncated")
    np.testing.assert_array_equal(obs[..., 1], np.broadcast_to([11, 12, 13, 14], (30, 4)))
    steps_before = np.repeat([0, 64, 128], 10)[:, None]  # each rollout's `step`
    np.testing.assert_array_equal(column("log_prob"), obs.sum(-1) + steps_before)
    truncated = column("truncated")
    assert truncated.any() and (final_obs[truncated, 0] == 4).all()
    assert (column("terminated") & (final_obs[..., 0] < 4)).any()
    if autoreset == "same_step":
        assert one[0][0].reset_step is None
        np.testing.assert_array_equal(column("reward"), 1.0 + column("action"))
        np.testing.assert_array_equal(final_obs[..., 0], obs[..., 0] + 1)
        np.testing.assert_array_equal(obs[1:][ended[:-1], 0], 0)  # the next episode's first obs
        np.testing.assert_array_equal(obs[1:][~ended[:-1], 0], obs[:-1][~ended[:-1], 0] + 1)
        return
    reset = column("reset_step")
    assert reset.dtype == bool and not reset[0].any()
    np.testing.assert_array_equal(reset[1:], ended[:-1])  # across the rollouts' bounds too
    assert ended[9::10][:2].any()  # an episode ended in a rollout's last step
    assert not (reset & ended).any()
    np.testing.assert_array_equal(column("reward"), np.where(reset, 0.0, 1.0 + column("action")))
    np.testing.assert_array_equal(final_obs[:-1], obs[1:])  # what a step reached is the next obs
    np.testing.assert_array_equal(final_obs[~reset, 0], obs[~reset, 0] + 1)
    np.testing.assert_array_equal(final_obs[reset, 0], 0)  # the reset: the next episode's first


def test_a_learner_with_two_env_groups_on_envpool_learns_with_bounded_lag(fake_envpool):
    learner = sebulba.Learner(
        config(env=fake_envpool, arch={"env_groups": 2, "max_lag": 1}, agent={"num_envs": 8})
    )
    state, rows = learner.run(learner.init(), num_updates=6)
    assert int(state.updates) == 6 and [row["step"] for row in rows] == [
        128 * (u + 1) for u in range(6)
    ]
    assert max(row["param_lag_max"] for row in rows) <= 1
    assert all(np.isfinite(row["policy_loss"]) for row in rows)
    lengths = [row["episode_length"] for row in rows if row["episodes"]]
    assert lengths and all(2 <= x <= 4 for x in lengths)  # reset steps not counted
    assert FakePool.most_in_flight >= 2
