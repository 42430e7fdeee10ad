"""Pendulum-v1 with gymnasium's dynamics, reward, time limit and initial-state distribution.

State s = (theta, theta_dot), theta = 0 upright, counter-clockwise positive. With the torque
u = clip(action[0], -max_torque, max_torque), one step of semi-implicit Euler over dt = 0.05 s:

    theta_dot'   = clip(theta_dot + (3 g / (2 l) sin(theta) + 3 / (m l^2) u) dt,
                        -max_speed, max_speed)
    theta'       = theta + theta_dot' dt
    reward       = -(normalize(theta)^2 + 0.1 theta_dot^2 + 0.001 u^2)
    normalize(x) = ((x + pi) mod 2 pi) - pi

(the reward uses the state *before* the step). theta itself is not wrapped. The observation is
(cos theta, sin theta, theta_dot) in [-1, 1] x [-1, 1] x [-8, 8]. The episode never terminates and
is truncated after 200 steps. The initial state is uniform: theta in [-pi, pi], theta_dot in
[-1, 1].

Actions: a float array of shape (1,). Finite values outside [-max_torque, max_torque] are clipped
(concrete or traced, as gymnasium clips them); a concrete NaN/inf action raises in `Env.step`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import Env, concrete_or
from envs.rendering import canvas, draw_line, fill_circle, fill_polygon, rotated_rectangle
from envs.spaces import Box


@struct.dataclass
class PendulumParams:
    max_speed: float = 8.0
    max_torque: float = 2.0
    dt: float = 0.05
    g: float = 10.0
    m: float = 1.0
    l: float = 1.0
    max_steps_in_episode: int = 200


@struct.dataclass
class PendulumState:
    theta: jax.Array
    theta_dot: jax.Array
    time: jax.Array
    last_u: jax.Array  # the (clipped) torque of the last step, 0 after a reset; for rendering


def angle_normalize(x: jax.Array) -> jax.Array:
    """x wrapped into [-pi, pi): ((x + pi) mod 2 pi) - pi."""
    return ((x + jnp.pi) % (2 * jnp.pi)) - jnp.pi


def _obs(state: PendulumState) -> jax.Array:
    return jnp.stack([jnp.cos(state.theta), jnp.sin(state.theta), state.theta_dot]).astype(
        jnp.float32
    )


class Pendulum(Env):
    name = "Pendulum-v1"

    @property
    def default_params(self) -> PendulumParams:
        return PendulumParams()

    def reset_env(self, key, params: PendulumParams):
        high = jnp.array([jnp.pi, 1.0], jnp.float32)
        theta, theta_dot = jax.random.uniform(key, (2,), jnp.float32, minval=-high, maxval=high)
        state = PendulumState(
            theta=theta, theta_dot=theta_dot, time=jnp.int32(0), last_u=jnp.float32(0.0)
        )
        return _obs(state), state

    def step_env(self, key, state: PendulumState, action, params: PendulumParams):
        u = jnp.clip(action[0], -params.max_torque, params.max_torque)
        costs = angle_normalize(state.theta) ** 2 + 0.1 * state.theta_dot**2 + 0.001 * u**2
        theta_dot = (
            state.theta_dot
            + (
                3 * params.g / (2 * params.l) * jnp.sin(state.theta)
                + 3.0 / (params.m * params.l**2) * u
            )
            * params.dt
        )
        theta_dot = jnp.clip(theta_dot, -params.max_speed, params.max_speed)
        theta = state.theta + theta_dot * params.dt
        new_state = PendulumState(
            theta=jnp.asarray(theta, jnp.float32),
            theta_dot=jnp.asarray(theta_dot, jnp.float32),
            time=state.time + 1,
            last_u=jnp.asarray(u, jnp.float32),
        )
        return _obs(new_state), new_state, -costs, jnp.bool_(False), {}

    def observation_space(self, params: PendulumParams) -> Box:
        max_speed = concrete_or(params.max_speed, PendulumParams().max_speed)
        high = np.array([1.0, 1.0, max_speed], dtype=np.float32)
        return Box(low=-high, high=high, shape=(3,))

    def action_space(self, params: PendulumParams) -> Box:
        max_torque = concrete_or(params.max_torque, PendulumParams().max_torque)
        return Box(low=-max_torque, high=max_torque, shape=(1,))

    def render(self, state: PendulumState, params: PendulumParams, size: int = 500) -> np.ndarray:
        """rgb_array frame: the rod at angle theta (0 up, counter-clockwise),
        the last torque as a bar."""
        scale = size / 4.4
        center = (size / 2, size / 2)
        image = canvas(size, size)
        rod = rotated_rectangle(
            center,
            float(params.l) * scale,
            0.2 * scale,
            math.pi / 2 + float(state.theta),
            anchor="start",
        )
        fill_polygon(image, rod, (204, 77, 77))
        fill_circle(image, center, 0.05 * scale, (0, 0, 0))
        torque = float(state.last_u) / max(float(params.max_torque), 1e-6)
        draw_line(
            image,
            (size / 2, size - 20),
            (size / 2 + torque * size / 4, size - 20),
            8,
            (77, 77, 204),
        )
        return image
