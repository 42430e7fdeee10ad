"""CartPole-v1 with gymnasium's dynamics, rewards, thresholds and time limit.

State s = (x, x_dot, theta, theta_dot). With F = +force_mag for action 1 and -force_mag for action
0, M = masscart + masspole and l = length (half the pole):

    temp      = (F + masspole * l * theta_dot^2 * sin(theta)) / M
    theta_acc = (g sin(theta) - cos(theta) temp) / (l (4/3 - masspole cos^2(theta) / M))
    x_acc     = temp - masspole * l * theta_acc * cos(theta) / M

integrated with explicit Euler over tau = 0.02 s (positions first, from the old velocities).
Reward 1 on every step, including the terminating one (gymnasium >= 1.0). The episode terminates
when |x| > 2.4 or |theta| > 12 degrees and is truncated after 500 steps. The initial state is
uniform in [-0.05, 0.05]^4. Traced actions other than 0/1 are treated as "not 1" (push left).
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
class CartPoleParams:
    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    length: float = 0.5
    force_mag: float = 10.0
    tau: float = 0.02
    theta_threshold_radians: float = 12 * 2 * math.pi / 360
    x_threshold: float = 2.4
    max_steps_in_episode: int = 500


@struct.dataclass
class CartPoleState:
    x: jax.Array
    x_dot: jax.Array
    theta: jax.Array
    theta_dot: jax.Array
    time: jax.Array


def _obs(state: CartPoleState) -> jax.Array:
    return jnp.stack([state.x, state.x_dot, state.theta, state.theta_dot]).astype(jnp.float32)


class CartPole(Env):
    name = "CartPole-v1"

    @property
    def default_params(self) -> CartPoleParams:
        return CartPoleParams()

    def reset_env(self, key, params: CartPoleParams):
        x, x_dot, theta, theta_dot = jax.random.uniform(
            key, (4,), jnp.float32, minval=-0.05, maxval=0.05
        )
        state = CartPoleState(x=x, x_dot=x_dot, theta=theta, theta_dot=theta_dot, time=jnp.int32(0))
        return _obs(state), state

    def step_env(self, key, state: CartPoleState, action, params: CartPoleParams):
        force = jnp.where(action == 1, params.force_mag, -params.force_mag)
        total_mass = params.masspole + params.masscart
        polemass_length = params.masspole * params.length
        costheta, sintheta = jnp.cos(state.theta), jnp.sin(state.theta)
        temp = (force + polemass_length * state.theta_dot**2 * sintheta) / total_mass
        thetaacc = (params.gravity * sintheta - costheta * temp) / (
            params.length * (4.0 / 3.0 - params.masspole * costheta**2 / total_mass)
        )
        xacc = temp - polemass_length * thetaacc * costheta / total_mass
        new_state = CartPoleState(
            x=state.x + params.tau * state.x_dot,
            x_dot=state.x_dot + params.tau * xacc,
            theta=state.theta + params.tau * state.theta_dot,
            theta_dot=state.theta_dot + params.tau * thetaacc,
            time=state.time + 1,
        )
        terminated = (
            (new_state.x < -params.x_threshold)
            | (new_state.x > params.x_threshold)
            | (new_state.theta < -params.theta_threshold_radians)
            | (new_state.theta > params.theta_threshold_radians)
        )
        return _obs(new_state), new_state, jnp.float32(1.0), terminated, {}

    def observation_space(self, params: CartPoleParams) -> Box:
        """gymnasium's (1.x) bounds: twice the termination thresholds,
        unbounded (infinite) velocities."""
        defaults, big = CartPoleParams(), np.inf
        high = np.array(
            [defaults.x_threshold * 2, big, defaults.theta_threshold_radians * 2, big],
            dtype=np.float32,
        )
        return Box(low=-high, high=high, shape=(4,))

    def action_space(self, params: CartPoleParams) -> Discrete:
        return Discrete(2)

    def render(
        self, state: CartPoleState, params: CartPoleParams, width: int = 600, height: int = 400
    ) -> np.ndarray:
        """rgb_array frame: track, cart at x, pole at angle theta
        (the view spans +-2 x_threshold)."""
        scale = width / (4 * float(params.x_threshold))
        cart_x, cart_y = float(state.x) * scale + width / 2, height - 100
        image = canvas(height, width)
        draw_line(image, (0, cart_y), (width, cart_y), 1, (0, 0, 0))
        fill_polygon(image, rotated_rectangle((cart_x, cart_y - 15), 50, 30, 0.0), (0, 0, 0))
        pole = rotated_rectangle(
            (cart_x, cart_y - 22),
            2 * float(params.length) * scale,
            10,
            math.pi / 2 - float(state.theta),
            anchor="start",
        )
        fill_polygon(image, pole, (202, 152, 101))
        return fill_circle(image, (cart_x, cart_y - 22), 5, (129, 132, 203))
