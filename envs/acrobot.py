"""Acrobot-v1 with gymnasium's dynamics (RK4, the "book" equations), reward, limits and reset law.

Two links hang from a fixed joint; only the joint between them is actuated. State
s = (theta1, theta2, dtheta1, dtheta2), theta1 the first link's angle from hanging straight down and
theta2 the second link's angle relative to the first. Action a in {0, 1, 2} applies the torque
tau = (-1, 0, +1)[a] (plus uniform noise in +-torque_noise_max, 0 by default) at the middle joint.

Equations of motion (Sutton & Barto's book version; `book_or_nips="nips"` drops the
-m2 l1 lc2 dtheta1^2 sin(theta2) term, as in gymnasium):

    d1 = m1 lc1^2 + m2 (l1^2 + lc2^2 + 2 l1 lc2 cos theta2) + I1 + I2
    d2 = m2 (lc2^2 + l1 lc2 cos theta2) + I2
    phi2 = m2 lc2 g cos(theta1 + theta2 - pi/2)
    phi1 = -m2 l1 lc2 dtheta2^2 sin theta2 - 2 m2 l1 lc2 dtheta2 dtheta1 sin theta2
           + (m1 lc1 + m2 l1) g cos(theta1 - pi/2) + phi2
    ddtheta2 = (tau + d2/d1 phi1 - m2 l1 lc2 dtheta1^2 sin theta2 - phi2)
               / (m2 lc2^2 + I2 - d2^2/d1)
    ddtheta1 = -(d2 ddtheta2 + phi1) / d1

integrated over dt = 0.2 s with one classical Runge-Kutta (RK4) step, the torque held constant.
Afterwards the angles are wrapped into [-pi, pi] (gymnasium's `wrap`: subtract or add 2 pi until
inside) and the velocities clipped to +-4 pi and +-9 pi (gymnasium's `bound`). The episode
terminates when the tip is more than one link length above the joint,
-cos(theta1) - cos(theta1 + theta2) > 1; the reward is -1 on every step that does not terminate and
0 on the terminating one. Truncation after 500 steps. The initial state is uniform in [-0.1, 0.1]^4.
The observation is (cos theta1, sin theta1, cos theta2, sin theta2, dtheta1, dtheta2).

Traced actions outside [0, 3) are clipped into range (concrete ones raise in `Env.step`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import Env
from envs.rendering import canvas, draw_line, fill_circle, fill_polygon, rotated_rectangle
from envs.spaces import Box, Discrete


@struct.dataclass
class AcrobotParams:
    dt: float = 0.2
    link_length_1: float = 1.0
    link_length_2: float = 1.0
    link_mass_1: float = 1.0
    link_mass_2: float = 1.0
    link_com_pos_1: float = 0.5
    link_com_pos_2: float = 0.5
    link_moi: float = 1.0
    gravity: float = 9.8
    max_vel_1: float = 4 * math.pi
    max_vel_2: float = 9 * math.pi
    torque_noise_max: float = 0.0
    max_steps_in_episode: int = 500
    book_or_nips: str = struct.field(pytree_node=False, default="book")


@struct.dataclass
class AcrobotState:
    theta1: jax.Array
    theta2: jax.Array
    dtheta1: jax.Array
    dtheta2: jax.Array
    time: jax.Array


TORQUES = np.array([-1.0, 0.0, 1.0], dtype=np.float32)


def wrap(x: jax.Array, low: float, high: float) -> jax.Array:
    """x shifted by whole multiples of (high - low) into [low, high],
    like gymnasium's loop-based `wrap`.

    Values already in [low, high] are unchanged; x > high loses ceil((x - high) / d) periods d,
    x < low gains ceil((low - x) / d).
    """
    period = high - low
    down = jnp.ceil((x - high) / period)
    up = jnp.ceil((low - x) / period)
    return jnp.where(x > high, x - down * period, jnp.where(x < low, x + up * period, x))


def dynamics(y: jax.Array, torque: jax.Array, params: AcrobotParams) -> jax.Array:
    """d/dt of y = (theta1, theta2, dtheta1, dtheta2) under a constant torque (module docstring)."""
    theta1, theta2, dtheta1, dtheta2 = y
    m1, m2 = params.link_mass_1, params.link_mass_2
    l1 = params.link_length_1
    lc1, lc2 = params.link_com_pos_1, params.link_com_pos_2
    i1 = i2 = params.link_moi
    g = params.gravity
    d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * jnp.cos(theta2)) + i1 + i2
    d2 = m2 * (lc2**2 + l1 * lc2 * jnp.cos(theta2)) + i2
    phi2 = m2 * lc2 * g * jnp.cos(theta1 + theta2 - jnp.pi / 2.0)
    phi1 = (
        -m2 * l1 * lc2 * dtheta2**2 * jnp.sin(theta2)
        - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * jnp.sin(theta2)
        + (m1 * lc1 + m2 * l1) * g * jnp.cos(theta1 - jnp.pi / 2)
        + phi2
    )
    if params.book_or_nips == "nips":
        ddtheta2 = (torque + d2 / d1 * phi1 - phi2) / (m2 * lc2**2 + i2 - d2**2 / d1)
    elif params.book_or_nips == "book":
        ddtheta2 = (
            torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1**2 * jnp.sin(theta2) - phi2
        ) / (m2 * lc2**2 + i2 - d2**2 / d1)
    else:
        raise ValueError(
            f"Acrobot-v1: book_or_nips must be 'book' or 'nips', got {params.book_or_nips!r}"
        )
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return jnp.stack([dtheta1, dtheta2, ddtheta1, ddtheta2])


def rk4_step(f, y: jax.Array, dt) -> jax.Array:
    """One classical Runge-Kutta step: y + dt/6 (k1 + 2 k2 + 2 k3 + k4)."""
    k1 = f(y)
    k2 = f(y + dt / 2.0 * k1)
    k3 = f(y + dt / 2.0 * k2)
    k4 = f(y + dt * k3)
    return y + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)


def _obs(state: AcrobotState) -> jax.Array:
    return jnp.stack(
        [
            jnp.cos(state.theta1),
            jnp.sin(state.theta1),
            jnp.cos(state.theta2),
            jnp.sin(state.theta2),
            state.dtheta1,
            state.dtheta2,
        ]
    ).astype(jnp.float32)


def is_terminal(state: AcrobotState) -> jax.Array:
    """The tip is above one link length over the pivot: -cos(theta1) - cos(theta1 + theta2) > 1."""
    return -jnp.cos(state.theta1) - jnp.cos(state.theta2 + state.theta1) > 1.0


class Acrobot(Env):
    name = "Acrobot-v1"

    @property
    def default_params(self) -> AcrobotParams:
        return AcrobotParams()

    def reset_env(self, key, params: AcrobotParams):
        theta1, theta2, dtheta1, dtheta2 = jax.random.uniform(
            key, (4,), jnp.float32, minval=-0.1, maxval=0.1
        )
        state = AcrobotState(
            theta1=theta1, theta2=theta2, dtheta1=dtheta1, dtheta2=dtheta2, time=jnp.int32(0)
        )
        return _obs(state), state

    def step_env(self, key, state: AcrobotState, action, params: AcrobotParams):
        torque = jnp.asarray(TORQUES)[jnp.clip(action, 0, 2)]
        noise = (
            jax.random.uniform(key, (), jnp.float32, minval=-1.0, maxval=1.0)
            * params.torque_noise_max
        )
        torque = torque + noise
        y = jnp.stack([state.theta1, state.theta2, state.dtheta1, state.dtheta2])
        y = rk4_step(lambda y: dynamics(y, torque, params), y, params.dt)
        new_state = AcrobotState(
            theta1=wrap(y[0], -jnp.pi, jnp.pi),
            theta2=wrap(y[1], -jnp.pi, jnp.pi),
            dtheta1=jnp.clip(y[2], -params.max_vel_1, params.max_vel_1),
            dtheta2=jnp.clip(y[3], -params.max_vel_2, params.max_vel_2),
            time=state.time + 1,
        )
        terminated = is_terminal(new_state)
        reward = jnp.where(terminated, 0.0, -1.0)
        return _obs(new_state), new_state, reward, terminated, {}

    def observation_space(self, params: AcrobotParams) -> Box:
        """gymnasium's bounds, from the default params."""
        defaults = AcrobotParams()
        high = np.array(
            [1.0, 1.0, 1.0, 1.0, defaults.max_vel_1, defaults.max_vel_2], dtype=np.float32
        )
        return Box(low=-high, high=high, shape=(6,))

    def action_space(self, params: AcrobotParams) -> Discrete:
        return Discrete(3)

    def render(self, state: AcrobotState, params: AcrobotParams, size: int = 500) -> np.ndarray:
        """rgb_array frame: both links hanging from the centre, the goal height as a line."""
        l1, l2 = float(params.link_length_1), float(params.link_length_2)
        scale = size / (2 * (l1 + l2 + 0.2))
        center = np.array([size / 2, size / 2])
        image = canvas(size, size)
        draw_line(
            image,
            center + (-(l1 + l2 + 0.2) * scale, -l1 * scale),
            center + ((l1 + l2 + 0.2) * scale, -l1 * scale),
            1,
            (0, 0, 0),
        )
        theta1, theta12 = float(state.theta1), float(state.theta1) + float(state.theta2)
        joint = center + np.array([np.sin(theta1), np.cos(theta1)]) * l1 * scale  # screen y is down
        for start, angle, length in [(center, theta1, l1), (joint, theta12, l2)]:
            # a link pointing along (sin a, -cos a) in the world: screen angle a - pi/2
            fill_polygon(
                image,
                rotated_rectangle(
                    start, length * scale, 0.2 * scale, angle - math.pi / 2, anchor="start"
                ),
                (0, 204, 204),
            )
            fill_circle(image, start, 0.1 * scale, (204, 204, 0))
        return image
