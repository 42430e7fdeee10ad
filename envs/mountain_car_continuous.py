"""MountainCarContinuous-v0 with gymnasium's dynamics, reward,
time limit and initial-state distribution.

State s = (position, velocity). With the force f = clip(action[0], -1, 1) and power = 0.0015:

    velocity' = clip(velocity + f power - 0.0025 cos(3 position), -max_speed, max_speed)
    position' = clip(position + velocity', min_position, max_position)
    velocity' = 0  if position' == min_position and velocity' < 0   (inelastic left wall)
    reward    = 100 [terminated] - 0.1 action[0]^2

As in gymnasium the action penalty uses the action as given, *before* clipping: an action of 3
moves the car like 1 but costs 0.9. The episode terminates when position' >= goal_position (0.45)
and velocity' >= goal_velocity (0) and is truncated after 999 steps. The initial position is uniform
in [-0.6, -0.4], the velocity 0. The observation is the state, in [-1.2, -0.07] x [0.6, 0.07].

Actions: a float array of shape (1,). Finite values outside [-1, 1] are clipped for the dynamics
(concrete or traced, as gymnasium does); a concrete NaN/inf action raises in `Env.step`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import Env, concrete_or
from envs.mountain_car import car_observation, move_car, render_car, reset_car
from envs.spaces import Box


@struct.dataclass
class MountainCarContinuousParams:
    min_action: float = -1.0
    max_action: float = 1.0
    min_position: float = -1.2
    max_position: float = 0.6
    max_speed: float = 0.07
    goal_position: float = 0.45
    goal_velocity: float = 0.0
    power: float = 0.0015
    max_steps_in_episode: int = 999


@struct.dataclass
class MountainCarContinuousState:
    position: jax.Array
    velocity: jax.Array
    time: jax.Array


class MountainCarContinuous(Env):
    name = "MountainCarContinuous-v0"

    @property
    def default_params(self) -> MountainCarContinuousParams:
        return MountainCarContinuousParams()

    def reset_env(self, key, params: MountainCarContinuousParams):
        return reset_car(key, MountainCarContinuousState)

    def step_env(
        self, key, state: MountainCarContinuousState, action, params: MountainCarContinuousParams
    ):
        force = jnp.clip(action[0], params.min_action, params.max_action)
        velocity = state.velocity + force * params.power - 0.0025 * jnp.cos(3 * state.position)
        velocity = jnp.clip(velocity, -params.max_speed, params.max_speed)
        position, velocity = move_car(
            state.position, velocity, params.min_position, params.max_position
        )
        terminated = (position >= params.goal_position) & (velocity >= params.goal_velocity)
        reward = jnp.where(terminated, 100.0, 0.0) - 0.1 * action[0] ** 2
        new_state = MountainCarContinuousState(
            position=position, velocity=velocity, time=state.time + 1
        )
        return car_observation(new_state), new_state, reward, terminated, {}

    def observation_space(self, params: MountainCarContinuousParams) -> Box:
        """gymnasium's bounds, from the default params."""
        defaults = MountainCarContinuousParams()
        low = np.array([defaults.min_position, -defaults.max_speed], dtype=np.float32)
        high = np.array([defaults.max_position, defaults.max_speed], dtype=np.float32)
        return Box(low=low, high=high, shape=(2,))

    def action_space(self, params: MountainCarContinuousParams) -> Box:
        """[min_action, max_action] (the default [-1, 1] when the params are traced)."""
        defaults = MountainCarContinuousParams()
        low = concrete_or(params.min_action, defaults.min_action)
        high = concrete_or(params.max_action, defaults.max_action)
        return Box(low=low, high=high, shape=(1,))

    def render(
        self, state: MountainCarContinuousState, params: MountainCarContinuousParams
    ) -> np.ndarray:
        """rgb_array frame: the hill, the car, the flag at the goal."""
        return render_car(float(state.position), params)
