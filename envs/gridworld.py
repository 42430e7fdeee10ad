"""GridWorld: walk from a start cell to a goal cell on a square grid.

Cells are numbered row-major, `cell = row * size + col`, row 0 at the top. The observation is the
agent's cell index (Discrete(size * size)), which is what a tabular agent indexes its Q-table with.

Actions: 0 = right (col + 1), 1 = up (row - 1), 2 = left (col - 1), 3 = down (row + 1). A move that
would leave the grid or enter a wall cell leaves the agent where it is. Reaching the goal gives
reward 1 and terminates the episode; every other step gives reward 0. Episodes are truncated after
`max_steps_in_episode` steps. Defaults: 5 x 5, start in the bottom-right corner, goal in the
top-left, no walls, 100 steps; the shortest path then takes 2 * (size - 1) = 8 steps.

Traced actions outside [0, 4) are clipped into range (concrete ones raise in `Env.step`).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import Env
from envs.rendering import canvas, fill_circle, fill_polygon
from envs.spaces import Discrete

# (row, col) offsets of the four actions: right, up, left, down.
MOVES = np.array([[0, 1], [-1, 0], [0, -1], [1, 0]], dtype=np.int32)


@struct.dataclass
class GridWorldParams:
    """`size` is static (it fixes the observation space); the rest may be traced or vmapped."""

    start: jax.Array  # int32 cell index
    goal: jax.Array  # int32 cell index
    walls: jax.Array  # bool [size * size], True where a cell is blocked
    max_steps_in_episode: jax.Array  # int32
    size: int = struct.field(pytree_node=False, default=5)


@struct.dataclass
class GridWorldState:
    cell: jax.Array  # int32
    time: jax.Array  # int32


def _cell_index(cell: Sequence[int] | int, size: int, what: str) -> int:
    """A (row, col) pair or a cell index, validated, as a cell index."""
    if isinstance(cell, (int, np.integer)):
        index = int(cell)
        if not 0 <= index < size * size:
            raise ValueError(
                f"GridWorld: {what} cell index {index} is outside the {size}x{size} grid"
            )
        return index
    row, col = (int(v) for v in cell)
    if not (0 <= row < size and 0 <= col < size):
        raise ValueError(
            f"GridWorld: {what} (row, col) = ({row}, {col}) is outside the {size}x{size} grid"
        )
    return row * size + col


def make_gridworld_params(
    size: int = 5, start=None, goal=None, walls=(), max_steps_in_episode: int = 100
) -> GridWorldParams:
    """Params from plain values: `start`/`goal` as (row, col) or a cell index,
    `walls` as (row, col) pairs."""
    size = int(size)
    if size < 2:
        raise ValueError(f"GridWorld: size must be at least 2, got {size}")
    if int(max_steps_in_episode) < 1:
        raise ValueError(
            f"GridWorld: max_steps_in_episode must be >= 1, got {max_steps_in_episode}"
        )
    start_index = _cell_index((size - 1, size - 1) if start is None else start, size, "start")
    goal_index = _cell_index((0, 0) if goal is None else goal, size, "goal")
    wall_mask = np.zeros(size * size, dtype=bool)
    for wall in walls:
        wall_mask[_cell_index(wall, size, "wall")] = True
    if wall_mask[start_index] or wall_mask[goal_index]:
        raise ValueError("GridWorld: the start and goal cells cannot be walls")
    if start_index == goal_index:
        raise ValueError(
            f"GridWorld: start and goal must be different cells, both are cell {start_index}"
        )
    return GridWorldParams(
        start=jnp.int32(start_index),
        goal=jnp.int32(goal_index),
        walls=jnp.asarray(wall_mask),
        max_steps_in_episode=jnp.int32(max_steps_in_episode),
        size=size,
    )


def move(cell: jax.Array, action: jax.Array, params: GridWorldParams) -> jax.Array:
    """The cell reached by `action` from `cell`: clipped at the border, blocked by walls."""
    size = params.size
    row, col = cell // size, cell % size
    offset = jnp.asarray(MOVES)[action]
    new_row = jnp.clip(row + offset[0], 0, size - 1)
    new_col = jnp.clip(col + offset[1], 0, size - 1)
    new_cell = new_row * size + new_col
    return jnp.where(params.walls[new_cell], cell, new_cell).astype(jnp.int32)


class GridWorld(Env):
    name = "GridWorld"

    @property
    def default_params(self) -> GridWorldParams:
        return make_gridworld_params()

    def make_params(self, **overrides) -> GridWorldParams:
        """Params from plain values (see `make_gridworld_params`);
        start/goal default to the corners."""
        known = ["size", "start", "goal", "walls", "max_steps_in_episode"]
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ValueError(f"{self.name}: unknown env param(s) {unknown}; known params: {known}")
        return make_gridworld_params(**overrides)

    def reset_env(self, key, params: GridWorldParams):
        state = GridWorldState(cell=jnp.asarray(params.start, jnp.int32), time=jnp.int32(0))
        return state.cell, state

    def step_env(self, key, state: GridWorldState, action, params: GridWorldParams):
        action = jnp.clip(action, 0, 3)
        cell = move(state.cell, action, params)
        at_goal = cell == params.goal
        reward = at_goal.astype(jnp.float32)
        new_state = GridWorldState(cell=cell, time=state.time + 1)
        return cell, new_state, reward, at_goal, {}

    def observation_space(self, params: GridWorldParams) -> Discrete:
        return Discrete(params.size * params.size)

    def action_space(self, params: GridWorldParams) -> Discrete:
        return Discrete(4)

    def render(
        self, state: GridWorldState, params: GridWorldParams, cell_pixels: int = 40
    ) -> np.ndarray:
        """rgb_array frame: walls dark grey, goal green, agent red,
        on a grid of `cell_pixels` cells."""
        size, c = params.size, cell_pixels
        image = canvas(size * c, size * c)
        walls = np.asarray(params.walls)
        for cell in range(size * size):
            row, col = divmod(cell, size)
            color = (
                (70, 70, 70) if walls[cell] else (90, 180, 90) if cell == int(params.goal) else None
            )
            if color is not None:
                fill_polygon(
                    image,
                    [
                        (col * c, row * c),
                        ((col + 1) * c, row * c),
                        ((col + 1) * c, (row + 1) * c),
                        (col * c, (row + 1) * c),
                    ],
                    color,
                )
        image[::c, :] = image[:, ::c] = 200  # grid lines
        row, col = divmod(int(state.cell), size)
        return fill_circle(image, ((col + 0.5) * c, (row + 0.5) * c), 0.35 * c, (210, 60, 60))

    @staticmethod
    def shortest_path_length(params: GridWorldParams) -> int:
        """Length of the shortest start-to-goal path (breadth-first search on the host);
        -1 if none."""
        size = params.size
        walls = np.asarray(params.walls)
        start, goal = int(params.start), int(params.goal)
        distance = {start: 0}
        frontier = [start]
        while frontier:
            nxt = []
            for cell in frontier:
                if cell == goal:
                    return distance[cell]
                row, col = divmod(cell, size)
                for dr, dc in MOVES:
                    r, c = min(max(row + dr, 0), size - 1), min(max(col + dc, 0), size - 1)
                    new = r * size + c
                    if not walls[new] and new not in distance:
                        distance[new] = distance[cell] + 1
                        nxt.append(new)
            frontier = nxt
        return -1
