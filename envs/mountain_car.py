"""MountainCar-v0 with gymnasium's dynamics, reward, time limit and initial-state distribution.

State s = (position, velocity). Action a in {0, 1, 2} = push left, no push, push right:

    velocity' = clip(velocity + (a - 1) force - gravity cos(3 position), -max_speed, max_speed)
    position' = clip(position + velocity', min_position, max_position)
    velocity' = 0  if position' == min_position and velocity' < 0   (inelastic left wall)

with force = 0.001, gravity = 0.0025, max_speed = 0.07, positions in [-1.2, 0.6]. Reward -1 on every
step. The episode terminates when position' >= goal_position (0.5) and velocity' >= goal_velocity
(0) and is truncated after 200 steps. The initial position is uniform in [-0.6, -0.4], the velocity
0. The observation is the state, in the Box [-1.2, -0.07] x [0.6, 0.07]. The hill's height is
sin(3 position) * 0.45 + 0.55 (used only for rendering).

Traced actions outside [0, 3) are clipped into range (concrete ones raise in `Env.step`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import Env
from envs.rendering import (
    canvas,
    draw_line,
    draw_polyline,
    fill_circle,
    fill_polygon,
    rotated_rectangle,
)
from envs.spaces import Box, Discrete


@struct.dataclass
class MountainCarParams:
    min_position: float = -1.2
    max_position: float = 0.6
    max_speed: float = 0.07
    goal_position: float = 0.5
    goal_velocity: float = 0.0
    force: float = 0.001
    gravity: float = 0.0025
    max_steps_in_episode: int = 200


@struct.dataclass
class MountainCarState:
    position: jax.Array
    velocity: jax.Array
    time: jax.Array


def car_observation(state) -> jax.Array:
    """(position, velocity) as float32."""
    return jnp.stack([state.position, state.velocity]).astype(jnp.float32)


def height_of(position):
    """Height of the hill at `position`: sin(3 x) * 0.45 + 0.55."""
    return np.sin(3 * np.asarray(position)) * 0.45 + 0.55


def reset_car(key, state_cls):
    """Position uniform in [-0.6, -0.4], velocity 0 (both MountainCar variants)."""
    position = jax.random.uniform(key, (), jnp.float32, minval=-0.6, maxval=-0.4)
    state = state_cls(position=position, velocity=jnp.float32(0.0), time=jnp.int32(0))
    return car_observation(state), state


def move_car(position, velocity, min_position, max_position):
    """Position update with the clip at the walls and the inelastic left wall
    (shared by both variants)."""
    position = jnp.clip(position + velocity, min_position, max_position)
    velocity = jnp.where((position == min_position) & (velocity < 0), 0.0, velocity)
    return position.astype(jnp.float32), velocity.astype(jnp.float32)


def render_car(position: float, params, width: int = 600, height: int = 400) -> np.ndarray:
    """rgb_array frame of either MountainCar: the hill, the car on it (tilted with the slope),
    the flag."""
    low, high = float(params.min_position), float(params.max_position)
    scale = width / (high - low)

    def to_screen(x, y):
        return (x - low) * scale, height - y * scale

    image = canvas(height, width)
    xs = np.linspace(low, high, 100)
    draw_polyline(image, np.stack(to_screen(xs, height_of(xs)), -1), 2, (0, 0, 0))
    flag_x, flag_y = to_screen(float(params.goal_position), float(height_of(params.goal_position)))
    draw_line(image, (flag_x, flag_y), (flag_x, flag_y - 50), 2, (0, 0, 0))
    fill_polygon(
        image,
        [(flag_x, flag_y - 50), (flag_x, flag_y - 40), (flag_x + 25, flag_y - 45)],
        (204, 204, 0),
    )
    angle = float(np.arctan(1.35 * np.cos(3 * position)))  # slope of the hill
    x, y = to_screen(position, float(height_of(position)))
    normal = np.array(
        [-np.sin(angle), -np.cos(angle)]
    )  # up, perpendicular to the slope, screen coordinates
    body_center = np.array([x, y]) + normal * 20
    fill_polygon(image, rotated_rectangle(body_center, 40, 20, angle), (0, 0, 0))
    for offset in (-10, 10):
        wheel = np.array([x, y]) + normal * 7 + np.array([np.cos(angle), -np.sin(angle)]) * offset
        fill_circle(image, wheel, 7, (128, 128, 128))
    return image


class MountainCar(Env):
    name = "MountainCar-v0"

    @property
    def default_params(self) -> MountainCarParams:
        return MountainCarParams()

    def reset_env(self, key, params: MountainCarParams):
        return reset_car(key, MountainCarState)

    def step_env(self, key, state: MountainCarState, action, params: MountainCarParams):
        push = jnp.clip(action, 0, 2) - 1
        velocity = (
            state.velocity + push * params.force + jnp.cos(3 * state.position) * (-params.gravity)
        )
        velocity = jnp.clip(velocity, -params.max_speed, params.max_speed)
        position, velocity = move_car(
            state.position, velocity, params.min_position, params.max_position
        )
        terminated = (position >= params.goal_position) & (velocity >= params.goal_velocity)
        new_state = MountainCarState(position=position, velocity=velocity, time=state.time + 1)
        return car_observation(new_state), new_state, jnp.float32(-1.0), terminated, {}

    def observation_space(self, params: MountainCarParams) -> Box:
        """gymnasium's bounds, from the default params."""
        defaults = MountainCarParams()
        low = np.array([defaults.min_position, -defaults.max_speed], dtype=np.float32)
        high = np.array([defaults.max_position, defaults.max_speed], dtype=np.float32)
        return Box(low=low, high=high, shape=(2,))

    def action_space(self, params: MountainCarParams) -> Discrete:
        return Discrete(3)

    def render(self, state: MountainCarState, params: MountainCarParams) -> np.ndarray:
        """rgb_array frame: the hill, the car, the flag at the goal."""
        return render_car(float(state.position), params)
