"""Frames stacked on the actor's device (`arch.frame_stack: device`, rl.sebulba.frame_stack):
`push_frames` against a deque of frames per env (hypothesis); with envpool (skipped without it), its
rule against envpool's own stack_num, step for step through resets and lost lives, and an actor's
rollouts equal to those of an actor on envpool's stacks; the configs it refuses."""

from __future__ import annotations

import collections

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.config import build_config, load_config
from rl.config.parsing import ConfigError
from rl.sebulba.frame_stack import initial_stack, push_frames


@settings(max_examples=40, deadline=None)
@given(
    envs=st.integers(1, 5),
    depth=st.integers(2, 5),
    refills=st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=1, max_size=12),
)
def test_push_frames_keeps_each_envs_last_frames_since_its_refill(envs, depth, refills):
    rng = np.random.default_rng(envs * 100 + depth)
    frames = rng.integers(0, 256, (envs, 1, 3, 2), np.uint8)
    stack = initial_stack(frames, depth)
    deques = [collections.deque([frames[e, 0]] * depth, maxlen=depth) for e in range(envs)]
    for refill in refills:
        frames = rng.integers(0, 256, (envs, 1, 3, 2), np.uint8)
        refill = np.array(refill[:envs])
        stack = push_frames(stack, frames, refill)
        for e in range(envs):
            if refill[e]:
                deques[e].extend([frames[e, 0]] * depth)
            else:
                deques[e].append(frames[e, 0])
        want = np.stack([np.stack(list(d)) for d in deques])
        np.testing.assert_array_equal(np.asarray(stack), want)
        assert stack.dtype == np.uint8 and stack.shape == (envs, depth, 3, 2)


def test_a_device_frame_stack_is_refused_where_it_cannot_follow_envpool():
    data = {"env": {"id": "gymnasium:CartPole-v1"}, "agent": {"name": "ppo"}}
    with pytest.raises(ConfigError, match=r"^arch.frame_stack: device stacks envpool's frames"):
        build_config({**data, "arch": {"name": "sebulba", "frame_stack": "device"}})
    with pytest.raises(ConfigError, match=r"^arch.frame_stack is a setting of the actor-learner"):
        build_config({**data, "arch": {"frame_stack": "device"}})


def envpool_config(arch=None, **params):
    """configs/ppo_atari_breakout.yaml (episodic life: a lost life ends an episode) at 8 envs."""
    pytest.importorskip("envpool")
    overrides = ["agent.num_envs=8", "agent.num_steps=64", "agent.total_steps=262144"]
    overrides += [f"arch.{key}={value}" for key, value in (arch or {}).items()]
    overrides += [f"env.params.{key}={value}" for key, value in params.items()]
    return load_config("configs/ppo_atari_breakout.yaml", overrides)


@pytest.mark.parametrize(
    "arch, params, message",
    [
        ({"autoreset": "same_step"}, {}, r"^arch.frame_stack: device .* arch.autoreset: next_step"),
        ({}, {"stack_num": 1}, r"^arch.frame_stack: device needs env.params.stack_num .* got 1"),
    ],
)
def test_a_device_frame_stack_needs_next_step_resets_and_frames_to_stack(arch, params, message):
    with pytest.raises(ConfigError, match=message):
        envpool_config({"frame_stack": "device", **arch}, **params)


def test_envpools_own_stacks_are_its_frames_pushed_as_rl_frame_stack_pushes_them():
    """Twin pools of one seed, stack_num 4 and 1, random actions, 600 steps of 6 envs (lost lives
    and whole games ending): the single frames pushed with a refill after each game's end give
    envpool's stacks at every step."""
    envpool = pytest.importorskip("envpool")
    options = dict(episodic_life=True, reward_clip=True, noop_max=30, img_height=44, img_width=44)
    make = lambda stack: envpool.make(
        "Breakout-v5", env_type="gymnasium", num_envs=6, seed=5, stack_num=stack, **options
    )
    stacked, single = make(4), make(1)
    want, _ = stacked.reset()
    frames, _ = single.reset()
    stack, refill, rng, games = (
        initial_stack(frames, 4),
        np.zeros(6, bool),
        np.random.default_rng(0),
        0,
    )
    np.testing.assert_array_equal(np.asarray(stack), want)
    for _ in range(600):
        actions = rng.integers(0, 4, 6)
        want, _, terminated, truncated, info = stacked.step(actions)
        frames, *_ = single.step(actions)
        stack = push_frames(stack, frames, refill)
        np.testing.assert_array_equal(np.asarray(stack), want)
        refill = (terminated | truncated) & ((np.asarray(info["terminated"]) != 0) | truncated)
        games += int(refill.sum())
    assert games >= 3  # whole games ended (and lives were lost before them)


def test_an_actor_stacking_on_its_device_rolls_out_what_one_on_envpools_stacks_does():
    from rl.config import hyperparams
    from rl.sebulba import learner as sebulba
    from rl.sebulba.pieces import make_pieces

    def rollouts(frame_stack):
        cfg = envpool_config({"frame_stack": frame_stack, "actor_threads": 1})
        pieces = make_pieces(cfg)
        params, _, _ = pieces.init(
            jax.random.PRNGKey(0), hyperparams(cfg.agent), np.zeros((4, 84, 84), np.uint8)
        )
        actor = sebulba.Actor(
            pieces,
            cfg,
            jax.jit(pieces.act),
            list(range(8)),
            jax.random.PRNGKey(3),
            jax.devices()[0],
        )
        frames = 1 if frame_stack == "device" else 4  # what envpool returns a step
        assert actor.groups[0].envs.envs.single_observation_space.shape == (frames, 84, 84)
        try:
            return [actor.rollout(params, k * 512) for k in range(4)]
        finally:
            actor.close()

    got, want = rollouts("device"), rollouts("envpool")
    ends, games = 0, 0
    for (traj, returns, lengths), (traj_1, returns_1, lengths_1) in zip(got, want):
        for name, a, b in zip(traj._fields, traj, traj_1):
            if b is not None:
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
        assert returns == returns_1 and lengths == lengths_1
        ends, games = ends + int(np.asarray(traj.terminated).sum()), games + len(returns)
    assert ends >= 20 and games >= 3  # lost lives and whole games: reset steps of both kinds
