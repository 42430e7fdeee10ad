"""Frames stacked on an actor's device as envpool stacks them (`arch.frame_stack: device`,
rl.sebulba.actor): envpool sends each env's newest frame alone ([E, 1, H, W], a quarter of a
4-frame stack's bytes) and the actor keeps the stacks [E, depth, H, W] on its device.

    stack = initial_stack(frames, depth)         # each env's first frame, depth times
    stack = push_frames(stack, frames, refill)   # after a step: its frames pushed in
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

__all__ = ["initial_stack", "push_frames"]


@partial(jax.jit, static_argnums=1)
def initial_stack(frames, depth: int):
    """stack[e, k] = frames[e, 0] for k < depth: [E, 1, ...] -> [E, depth, ...]."""
    return jnp.repeat(frames, depth, axis=1)


@jax.jit
def push_frames(stack, frames, refill):
    """The stacks after `frames` [E, 1, ...]: stack[e, k] = frames[e, 0] for every k where
    `refill[e]` (a new game's first frame), else (stack[e, 1], ..., stack[e, depth - 1],
    frames[e, 0]). envpool's rule (tests/rl/test_frame_stack.py checks it against its stack_num):
    the frame after a lost life shifts in like any other (an episodic-life end is no new game)."""
    shifted = jnp.concatenate([stack[:, 1:], frames], axis=1)
    refill = refill.reshape(refill.shape + (1,) * (stack.ndim - 1))
    return jnp.where(refill, jnp.broadcast_to(frames, stack.shape), shifted)
