"""JaxMARL environments behind the multi-agent Env contract (`envs/multi_agent.py`; the `jaxmarl`
extra: pip install "fusedrl[jaxmarl]").

    env, params = envs.make("jaxmarl:MPE_simple_spread_v3")        # any MPE_* id
    env, params = envs.make("jaxmarl:SMAX", scenario="2s3z")         # every unit is an agent
    env, params = envs.make("jaxmarl:HeuristicEnemySMAX", scenario="3m")  # the allies only
    env, params = envs.make("jaxmarl:overcooked", layout="cramped_room")
    env, params = envs.make("jaxmarl:hanabi")

The env is `jaxmarl.make(id, **kwargs)`; `ids()` lists the ids this adapter supports (the four
families above; JaxMARL's others raise ValueError at `make`). Keywords go to JaxMARL's constructor
(an unknown one is a ValueError naming it), except:
  * `scenario` (SMAX, HeuristicEnemySMAX): a map name of JaxMARL's `MAP_NAME_TO_SCENARIO` ("3m",
    "2s3z", "3s5z", "3s_vs_5z", ...) or a JaxMARL `Scenario`; `layout` (overcooked): a name of
    JaxMARL's `overcooked_layouts` ("cramped_room", ...) or a layout dict. An unknown name is a
    ValueError naming it and listing the known ones.
  * `max_steps_in_episode`: the most steps an episode lasts. JaxMARL's `max_steps` keyword keeps
    its own meaning (MPE and SMAX end an episode on the step that *starts* at `max_steps`, so their
    episodes last max_steps + 1 steps: 26 for MPE's default 25, 101 for SMAX's 100; Overcooked's
    last max_steps, 400 by default); `max_steps_in_episode=N` sets it so that episodes last N steps
    (MPE, SMAX: max_steps = N - 1; Overcooked: N). Give one or the other.
    `params.max_steps_in_episode` (static: JaxMARL fixes its limit when the env is made) says how
    long episodes last, and a step that reaches it is truncated in every family. Hanabi has no time
    limit of its own: its default, 2 * deck + info tokens + colours (113), is more turns than a game
    of legal moves can take (plays and discards <= deck; hints <= tokens + discards + colours), so
    only illegal moves (a hint without tokens) can reach it.

Agents are stacked on axis 0 in the order of JaxMARL's `env.agents`. Observations are JaxMARL's
(their dtype kept: Overcooked's are uint8 images [H, W, 26], the shape JaxMARL returns, not the
(W, H, 26) its space declares); an env whose agents' flat observations differ in length pads them
with zeros at the end, and whose agents' action counts differ (SMAX's 3s_vs_5z: allies 10, enemies
8) takes Discrete(max n) with the padding actions masked out. `state` is `JaxMARLState(env_state,
time)`, `env_state` JaxMARL's state. Stepping is JaxMARL's `step` exactly (the same key split:
`step_env` with the first key, `reset` with the second when the episode ends), so the same keys
give the same numbers.

Episode ends, per family (terminated [A] from the state the step reached; truncated where the step
ends the episode at a time limit and the agent is not terminated):
  * MPE: no termination; JaxMARL's `done` (its time limit) is truncation for every agent.
  * SMAX, HeuristicEnemySMAX: a dead unit is terminated on every step from the one it dies on
    while the battle goes on (it keeps getting the team reward, its only action the no-op); when a
    team is all dead (battle won, lost or drawn) every agent is terminated, also on the last
    allowed step; the time limit otherwise truncates the units still alive.
  * Overcooked: no termination; JaxMARL's `done` (its time limit) is truncation.
  * Hanabi: JaxMARL's game end (out of lives, all fireworks built, the last round over) is
    termination for every agent; the only truncation is `params.max_steps_in_episode`.
The episode ends when every agent is terminated or truncated, exactly where JaxMARL's
`dones["__all__"]` is True, and only then auto-resets.

Action masks (`action_mask`, info["action_mask"]): JaxMARL's `get_avail_actions` (SMAX: a dead
unit may only stop); Hanabi's `get_legal_moves` (only the current player has moves other than the
no-op, which is the others' only move); all True for MPE and Overcooked.

Global state (`global_state`, info["global_state"], float32):
  * SMAX, HeuristicEnemySMAX: JaxMARL's `get_world_state` (every unit's health, position, cooldown
    and type, then the units' teams and types: (own features + 2) * units).
  * MPE: every agent's observation concatenated in agent order (JaxMARL's baselines' choice).
  * Overcooked: the agents' image observations stacked on the channel axis, [H, W, A * 26] (each
    agent's view lists its own layers first, so together they hold the whole kitchen).
  * Hanabi: none (`has_global_state` False): JaxMARL defines no state for it.

Extra info: Overcooked's `info["shaped_reward"]` [A] float32, JaxMARL's shaped reward (the
reward-shaping terms for placing onions, picking up dishes and soup), for an agent to anneal in.

Rendering (`envs.render(env, state, params)`, uint8 [H, W, 3]): MPE and SMAX are drawn with
envs.rendering's NumPy primitives (MPE: JaxMARL's entity colours and radii on the [-2, 2]^2 square
JaxMARL's viewer shows; SMAX: allies blue, enemies green as JaxMARL's viewer, a bar of remaining
health under each live unit); Overcooked is drawn by JaxMARL's own tile renderer. Hanabi has no
picture.

Importing JaxMARL prints two lines about optional submodules to stdout (and resets sys.stdout and
sys.stderr to the interpreter's own): the adapter swallows the lines and restores the streams.
JaxMARL's Overcooked warns at construction that OvercookedV2 exists: that warning is swallowed too.
"""

from __future__ import annotations

import inspect
import io
import sys
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import import_extra
from envs.multi_agent import MultiAgentEnv
from envs.spaces import Box, Discrete

EXTRA = "jaxmarl"
SMAX_IDS = ("SMAX", "HeuristicEnemySMAX")
# The keywords JaxMARL's SimpleMPE reads from its **kwargs (its other keywords are named).
MPE_KEYWORDS = (
    "rad",
    "moveable",
    "silent",
    "collide",
    "mass",
    "accel",
    "max_speed",
    "u_noise",
    "c_noise",
    "damping",
    "contact_force",
    "contact_margin",
)


def _jaxmarl(user: str = "jaxmarl:<id>"):
    """The `jaxmarl` module. Its first import prints two lines about optional submodules to
    stdout, after its MABrax module has set sys.stdout and sys.stderr to sys.__stdout__ and
    sys.__stderr__: those point at a sink (stdout) and the current stderr while it imports, and
    all four are restored after."""
    saved = sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__
    try:
        sys.stdout = sys.__stdout__ = io.StringIO()
        sys.__stderr__ = sys.stderr
        return import_extra("jaxmarl", EXTRA, user)
    finally:
        sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__ = saved


def _supported(env_id: str) -> bool:
    return env_id.startswith("MPE_") or env_id in (*SMAX_IDS, "overcooked", "hanabi")


def ids() -> list[str]:
    """The JaxMARL ids this adapter supports (MissingExtraError if JaxMARL is not installed)."""
    return sorted(i for i in _jaxmarl().registered_envs if _supported(i))


@struct.dataclass
class JaxMARLParams:
    """The most steps an episode lasts; JaxMARL keeps its settings in the env object, so this is
    static (fixed when the env is made)."""

    max_steps_in_episode: int = struct.field(pytree_node=False, default=0)


@struct.dataclass
class JaxMARLState:
    env_state: Any  # JaxMARL's state
    time: jax.Array  # steps taken in this episode (int32)


def _keywords(cls) -> set[str]:
    """The named keyword parameters of the constructors along `cls`'s MRO."""
    names = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass) and klass is not object:
            for p in list(inspect.signature(klass.__init__).parameters.values())[1:]:
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                    names.add(p.name)
    return names


class JaxMARLEnv(MultiAgentEnv):
    """A JaxMARL `MultiAgentEnv` stacked on an agents axis (the module docstring); the families
    below set the episode-end rule, the masks and the global state."""

    def __init__(self, env_id: str, jaxmarl_env, max_steps_in_episode: int):
        self.name = f"jaxmarl:{env_id}"
        self.env_id = env_id
        self.env = jaxmarl_env
        self.agent_ids = tuple(jaxmarl_env.agents)
        self.max_steps_in_episode = int(max_steps_in_episode)
        self._global_space = None

        obs, state = jax.eval_shape(jaxmarl_env.reset, jax.random.key(0))
        self._state_shape = state
        shapes = [tuple(obs[agent].shape) for agent in self.agent_ids]
        dtypes = {jnp.dtype(obs[agent].dtype) for agent in self.agent_ids}
        if len(dtypes) > 1 or (len(set(shapes)) > 1 and any(len(s) != 1 for s in shapes)):
            raise ValueError(
                f"{self.name}: the agents' observations differ beyond the length of a flat vector "
                f"(shapes {shapes}, dtypes {sorted(map(str, dtypes))}); not supported"
            )
        self._obs_lengths = [s[0] if s else 1 for s in shapes]
        shape = (max(self._obs_lengths),) if len(set(shapes)) > 1 else shapes[0]
        low, high = self._bounds(jaxmarl_env.observation_space(self.agent_ids[0]), shape)
        self._obs_space = Box(low, high, shape, dtypes.pop())

        spaces = [jaxmarl_env.action_space(agent) for agent in self.agent_ids]
        if all(hasattr(space, "n") for space in spaces):
            self._action_counts = [int(space.n) for space in spaces]
            self._action_space = Discrete(max(self._action_counts))
        elif all(hasattr(space, "low") for space in spaces):
            shapes = {tuple(np.shape(np.zeros(space.shape))) for space in spaces}
            if len(shapes) > 1:
                raise ValueError(f"{self.name}: the agents' Box actions differ in shape {shapes}")
            self._action_counts = None
            shape = shapes.pop()
            self._action_space = Box(*self._bounds(spaces[0], shape), shape, np.float32)
        else:
            raise ValueError(
                f"{self.name}: JaxMARL action spaces {spaces} are not all Discrete/Box"
            )

    @staticmethod
    def _bounds(space, shape) -> tuple[np.ndarray, np.ndarray]:
        """JaxMARL's Box bounds broadcast to `shape` (unbounded where they do not broadcast)."""
        try:
            low = np.broadcast_to(np.asarray(space.low, np.float32), shape)
            high = np.broadcast_to(np.asarray(space.high, np.float32), shape)
        except (AttributeError, ValueError):
            low, high = np.full(shape, -np.inf, np.float32), np.full(shape, np.inf, np.float32)
        return low, high

    # --- the contract ------------------------------------------------------------------------

    @property
    def default_params(self) -> JaxMARLParams:
        return JaxMARLParams(max_steps_in_episode=self.max_steps_in_episode)

    def observation_space(self, params) -> Box:
        return self._obs_space

    def action_space(self, params):
        return self._action_space

    def stack(self, values: dict) -> jax.Array:
        """JaxMARL's per-agent dict as one array, agents on axis 0."""
        return jnp.stack([jnp.asarray(values[agent]) for agent in self.agent_ids])

    def stack_obs(self, obs: dict) -> jax.Array:
        """JaxMARL's observations [A, *obs_shape], flat ones of different lengths zero-padded at
        the end."""
        rows = [jnp.asarray(obs[agent]) for agent in self.agent_ids]
        if len(set(self._obs_lengths)) > 1:  # flat observations (checked at construction)
            width = max(self._obs_lengths)
            rows = [jnp.pad(row, (0, width - row.shape[0])) for row in rows]
        return jnp.stack(rows)

    def unstack(self, values: jax.Array) -> dict:
        return {agent: values[i] for i, agent in enumerate(self.agent_ids)}

    def reset_env(self, key, params):
        obs, state = self.env.reset(key)
        return self.stack_obs(obs), JaxMARLState(state, jnp.int32(0))

    def step_env(self, key, state, action, params):
        obs, env_state, reward, dones, info = self.env.step_env(
            key, state.env_state, self.unstack(action)
        )
        terminated = self.terminated(env_state, self.stack(dones))
        info = {
            name: self.stack(value) if isinstance(value, dict) else value
            for name, value in info.items()
        }
        next_state = JaxMARLState(env_state, state.time + 1)
        return self.stack_obs(obs), next_state, self.stack(reward), terminated, info

    def truncation(self, state, params):
        return self.time_limit(state.env_state) | (state.time >= params.max_steps_in_episode)

    def action_mask(self, state, params):
        if self._action_counts is None:
            return super().action_mask(state, params)
        masks = self.available(state.env_state)
        width = self._action_space.n
        rows = [
            jnp.pad(jnp.asarray(masks[agent], jnp.bool_), (0, width - n))
            for agent, n in zip(self.agent_ids, self._action_counts)
        ]
        return jnp.stack(rows)

    def global_state_space(self, params) -> Box:
        if not self.has_global_state:
            return super().global_state_space(params)
        if self._global_space is None:
            wrapped = JaxMARLState(self._state_shape, jax.ShapeDtypeStruct((), jnp.int32))
            shape = jax.eval_shape(lambda s: self.global_state(s, params), wrapped).shape
            self._global_space = Box(-np.inf, np.inf, tuple(shape), np.float32)
        return self._global_space

    # --- what a family decides ---------------------------------------------------------------

    def terminated(self, env_state, dones: jax.Array) -> jax.Array:
        """bool [A]: which agents are out of the episode in `env_state` (JaxMARL's per-agent
        `dones` [A] given)."""
        return jnp.zeros((self.num_agents,), jnp.bool_)

    def time_limit(self, env_state) -> jax.Array:
        """Whether JaxMARL's own time limit ends the episode at `env_state`."""
        return env_state.done

    def available(self, env_state) -> dict:
        """JaxMARL's per-agent action masks (all actions available unless a family has masks)."""
        return {
            agent: jnp.ones((n,), jnp.bool_)
            for agent, n in zip(self.agent_ids, self._action_counts)
        }


class MPE(JaxMARLEnv):
    """JaxMARL's MPE: time-limit episodes, no masks, the observations concatenated as global
    state."""

    has_global_state = True

    def global_state(self, state, params):
        obs = self.env.get_obs(state.env_state)
        return jnp.concatenate([jnp.ravel(obs[agent]) for agent in self.agent_ids]).astype(
            jnp.float32
        )

    def render(self, state, params) -> np.ndarray:
        """The entities as discs in JaxMARL's colours and radii, on the [-2, 2]^2 square."""
        from envs.rendering import canvas, fill_circle

        size, half = 500, 2.0
        image = canvas(size, size)
        scale = size / (2 * half)
        positions = np.asarray(state.env_state.p_pos)
        radii = np.asarray(self.env.rad)
        order = list(range(self.env.num_agents, len(positions))) + list(range(self.env.num_agents))
        for i in order:  # landmarks first, agents on top
            x, y = positions[i]
            centre = ((x + half) * scale, (half - y) * scale)
            fill_circle(image, centre, radii[i] * scale, self.env.colour[i])
        return image


class SMAX(JaxMARLEnv):
    """JaxMARL's SMAX (every unit an agent) or HeuristicEnemySMAX (the allies against JaxMARL's
    heuristic enemies)."""

    has_global_state = True

    @property
    def heuristic(self) -> bool:
        return self.env_id == "HeuristicEnemySMAX"

    def battle(self, env_state):
        """JaxMARL's SMAX state (inside HeuristicEnemySMAX's)."""
        return env_state.state if self.heuristic else env_state

    def battle_over(self, env_state) -> jax.Array:
        """Whether a team is all dead."""
        alive = self.battle(env_state).unit_alive
        allies = self.env.num_allies
        return ~jnp.any(alive[:allies]) | ~jnp.any(alive[allies:])

    def terminated(self, env_state, dones):
        return dones | self.battle_over(env_state)

    def time_limit(self, env_state):
        return self.battle(env_state).done

    def available(self, env_state):
        return self.env.get_avail_actions(env_state)

    def global_state(self, state, params):
        return jnp.asarray(self.env.get_world_state(state.env_state), jnp.float32)

    def render(self, state, params) -> np.ndarray:
        """Live units as discs of their radius (allies blue, enemies green) with a health bar."""
        from envs.rendering import canvas, fill_circle, fill_polygon

        battle = self.battle(state.env_state)
        scale = 16
        width, height = self.env.map_width, self.env.map_height
        image = canvas(height * scale, width * scale)
        allies = self.env.num_allies
        positions, alive = np.asarray(battle.unit_positions), np.asarray(battle.unit_alive)
        types, health = np.asarray(battle.unit_types), np.asarray(battle.unit_health)
        radii = np.asarray(self.env.unit_type_radiuses)[types]
        full = np.asarray(self.env.unit_type_health)[types]
        for i in np.flatnonzero(alive):
            x, y = positions[i][0] * scale, (height - positions[i][1]) * scale
            r = radii[i] * scale
            fill_circle(image, (x, y), r, (0, 0, 255) if i < allies else (0, 128, 0))
            left, top, length = x - r, y + r + 2, 2 * r * float(np.clip(health[i] / full[i], 0, 1))
            bar = [(left, top), (left + length, top), (left + length, top + 3), (left, top + 3)]
            fill_polygon(image, bar, (220, 0, 0))
        return image


class Overcooked(JaxMARLEnv):
    """JaxMARL's Overcooked: time-limit episodes, the shaped reward in info, the two image
    observations stacked on channels as global state."""

    has_global_state = True

    def global_state(self, state, params):
        obs = self.env.get_obs(state.env_state)
        return jnp.concatenate([obs[agent] for agent in self.agent_ids], axis=-1).astype(
            jnp.float32
        )

    def render(self, state, params) -> np.ndarray:
        """JaxMARL's tile renderer (its OvercookedVisualizer's frame, 32 pixels a tile)."""
        from jaxmarl.viz.overcooked_visualizer import TILE_PIXELS, OvercookedVisualizer

        env_state = state.env_state
        padding = self.env.agent_view_size - 2
        grid = np.asarray(env_state.maze_map)[padding:-padding, padding:-padding, :]
        return OvercookedVisualizer._render_grid(
            grid,
            tile_size=TILE_PIXELS,
            agent_dir_idx=np.asarray(env_state.agent_dir_idx),
            agent_inv=np.asarray(env_state.agent_inv),
        )


class Hanabi(JaxMARLEnv):
    """JaxMARL's Hanabi: the game's end terminates, legal moves as masks, no global state."""

    def terminated(self, env_state, dones):
        return dones

    def time_limit(self, env_state):
        return jnp.bool_(False)

    def available(self, env_state):
        return self.env.get_legal_moves(env_state)


def _lookup(kind: str, name, known: dict, env_id: str):
    """`known[name]` for a string `name`; ValueError naming it and listing the known names."""
    if not isinstance(name, str):
        return name
    if name not in known:
        raise ValueError(
            f"jaxmarl:{env_id}: unknown {kind} {name!r}; JaxMARL's {kind}s: {', '.join(known)}"
        )
    return known[name]


def make(env_id: str, **kwargs: Any):
    """(env, params): JaxMARL's `jaxmarl.make(env_id, **kwargs)` behind the multi-agent contract
    (the module docstring: `scenario` and `layout` by name, `max_steps_in_episode`). ValueError
    for an id, map, layout or keyword JaxMARL or this adapter does not have."""
    jaxmarl = _jaxmarl(f"jaxmarl:{env_id}")
    if env_id not in jaxmarl.registered_envs or not _supported(env_id):
        raise ValueError(
            f"jaxmarl: unknown or unsupported id {env_id!r}; supported: {', '.join(ids())}"
        )
    from jaxmarl import environments as jm

    family = {"overcooked": Overcooked, "hanabi": Hanabi}.get(env_id, SMAX)
    family = MPE if env_id.startswith("MPE_") else family
    kwargs = dict(kwargs)
    steps = kwargs.pop("max_steps_in_episode", None)

    if family is SMAX:
        from jaxmarl.environments.smax.smax_env import MAP_NAME_TO_SCENARIO

        if "scenario" in kwargs:
            kwargs["scenario"] = _lookup("map", kwargs["scenario"], MAP_NAME_TO_SCENARIO, env_id)
        known = _keywords(jm.SMAX) | (
            _keywords(jm.HeuristicEnemySMAX) if env_id == "HeuristicEnemySMAX" else set()
        )
    elif family is Overcooked:
        if "layout" in kwargs:
            kwargs["layout"] = _lookup("layout", kwargs["layout"], jm.overcooked_layouts, env_id)
        known = _keywords(jm.Overcooked)
    elif family is Hanabi:
        known = _keywords(jm.Hanabi)
    else:
        known = _keywords(type(jaxmarl.make(env_id))) | set(MPE_KEYWORDS)
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ValueError(
            f"jaxmarl:{env_id}: unknown keyword(s) {unknown}; JaxMARL's keywords: "
            f"{sorted(known)} and max_steps_in_episode"
        )

    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
            raise ValueError(
                f"jaxmarl:{env_id}: max_steps_in_episode must be a positive integer, got {steps!r}"
            )
        if "max_steps" in kwargs:
            raise ValueError(
                f"jaxmarl:{env_id}: give max_steps_in_episode (steps an episode lasts) or "
                "JaxMARL's max_steps, not both"
            )
        if family is not Hanabi:  # MPE and SMAX end an episode on the step starting at max_steps
            kwargs["max_steps"] = int(steps) - (0 if family is Overcooked else 1)

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "OvercookedV2 is now released", DeprecationWarning)
            jaxmarl_env = jaxmarl.make(env_id, **kwargs)
    except (TypeError, AssertionError) as error:  # a keyword value JaxMARL refuses
        raise ValueError(f"jaxmarl:{env_id}: {error}") from None

    if steps is None:
        if family is Hanabi:  # plays + discards <= deck; hints <= tokens + discards + colours
            game = jaxmarl_env
            steps = 2 * int(game.deck_size) + int(game.max_info_tokens) + int(game.num_colors)
        else:
            steps = int(jaxmarl_env.max_steps) + (0 if family is Overcooked else 1)
    env = family(env_id, jaxmarl_env, steps)
    return env, env.default_params
