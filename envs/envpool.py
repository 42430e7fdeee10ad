"""envpool's batched C++ envs (Atari through the ALE, classic control, ...) for the actor-learner
architecture (`arch.name: sebulba`, rl/sebulba/learner.py): envpool steps a whole batch of envs on
its own threads outside JAX, so its envs are not pure functions and never enter a compiled program.

    env, params = envs.make("envpool:Breakout-v5", episodic_life=True, reward_clip=True)
    vector = envs.envpool.VectorEnv("Breakout-v5", num_envs=8, seed=0, episodic_life=True)

Needs the `envpool` extra (`pip install -e ".[envpool]"` in the clone); without it `make`, `ids` and
`VectorEnv` raise `envs.core.MissingExtraError` naming the extra. envpool is imported on first use.

The mapping:
  * Keywords are envpool's own options for the id (`envpool.make_spec(id).config`); for Atari:
    `episodic_life` (a lost life terminates the agent's episode), `reward_clip` (rewards -> their
    sign), `noop_max` (random no-ops after a reset), `repeat_action_probability` (sticky actions),
    `stack_num` (frames stacked), `frame_skip`, `img_height` / `img_width` (84 x 84 grey by
    default), `max_episode_steps` (a time limit: `truncated`), `num_threads`. `num_envs`,
    `batch_size`, `seed` and `env_type` are set by fusedrl (agent.num_envs, the run's seed);
    ValueError for an unknown id (suggesting the closest) or option (listing the known ones).
  * `make` gives an `EnvpoolSpaces`: the observation and action spaces of those options (Atari:
    `Box(0, 255, [stack_num, height, width], uint8)`, frames channels first as envpool stacks them,
    and `Discrete(actions)`), from which networks are built; its `reset` and `step` raise (train it
    with `arch.name: sebulba`).
  * `VectorEnv` is gymnasium's vector API with either of gymnasium's auto-resets
    (`autoreset_mode`). envpool resets an env in the step *after* the one that ended its episode,
    ignoring that step's action, which returns the next episode's first observation with reward 0
    and neither end flag: gymnasium's `AutoresetMode.NEXT_STEP`, which "next_step" keeps as it is.
    "same_step" (the default; `AutoresetMode.SAME_STEP`, as fusedrl's envs) makes that reset step
    at once for the envs that ended (envpool's partial step, `env_id=`), so the observation
    `step` returns is the next episode's first and `info["final_obs"]` (a dense array beside the
    mask `info["_final_obs"]`) the one the episode ended on: exact, but a second, synchronous
    envpool step whenever an env's episode ends (on Atari 1-30 no-op frames after each lost
    life), while the pool's other envs wait. `step_async(actions)` and `step_wait()` split a step
    around the caller's work
    (envpool's `send` and `recv`: its threads step the envs meanwhile), as gymnasium's
    AsyncVectorEnv splits its own. With `episodic_life` the game goes on after a lost life
    (envpool's reset then only continues it). `info["score"]` is envpool's unclipped reward and
    `info["game_over"]` the end of the whole game (all lives lost, or the time limit): what a
    game's score is counted over.
"""

from __future__ import annotations

import difflib
from typing import Any

import numpy as np

from envs.core import Env, import_extra
from envs.spaces import Box, Discrete

EXTRA = "envpool"
# envpool.make's arguments that fusedrl sets itself, and where each comes from
SET_BY_FUSEDRL = {
    "num_envs": "agent.num_envs",
    "batch_size": "agent.num_envs",
    "seed": "run.seed",
    "env_type": "fusedrl",
}


def _envpool():
    return import_extra("envpool", EXTRA, "envpool:<id>")


def ids() -> list[str]:
    """envpool's registered ids (without the "envpool:" prefix); MissingExtraError without
    envpool."""
    return sorted(_envpool().list_all_envs())


def make_spec(env_id: str, **options: Any):
    """envpool's spec of `env_id` with `options` (module docstring); ValueError for an unknown id
    or option, or one fusedrl sets."""
    envpool = _envpool()
    known = envpool.list_all_envs()
    if env_id not in known:
        close = difflib.get_close_matches(env_id, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown envpool id {env_id!r}.{hint} envs.envpool.ids() lists envpool's "
            f"{len(known)} ids"
        )
    fixed = sorted(set(options) & set(SET_BY_FUSEDRL))
    if fixed:
        raise ValueError(
            f"envpool:{env_id}: {fixed[0]!r} is set by fusedrl (from {SET_BY_FUSEDRL[fixed[0]]}), "
            "not an env option"
        )
    fields = envpool.make_spec(env_id).config._fields
    unknown = sorted(set(options) - set(fields))
    if unknown:
        options_list = ", ".join(f for f in fields if f not in SET_BY_FUSEDRL and f != "base_path")
        raise ValueError(
            f"envpool:{env_id}: unknown option(s) {unknown}; envpool's options: {options_list}"
        )
    return envpool.make_spec(env_id, **options)


def space(gym_space):
    """The fusedrl space of an envpool (gymnasium) Discrete or Box space; a Box of uint8 (image
    frames) keeps its dtype, other Boxes are float32."""
    if hasattr(gym_space, "n"):
        return Discrete(int(gym_space.n))
    dtype = np.uint8 if np.dtype(gym_space.dtype) == np.uint8 else np.float32
    return Box(gym_space.low, gym_space.high, tuple(gym_space.shape), dtype)


class EnvpoolSpaces(Env):
    """An envpool env as fusedrl sees it outside the actor threads: its spaces (module docstring).
    Its params are its options (a dict); `reset` and `step` raise: envpool envs step in batches on
    the host, in rl.sebulba's actors."""

    def __init__(self, env_id: str, options: dict, obs_space, action_space):
        self.name, self.options = f"envpool:{env_id}", dict(options)
        self._obs_space, self._action_space = obs_space, action_space

    @property
    def default_params(self) -> dict:
        return self.options

    def observation_space(self, params=None):
        return self._obs_space

    def action_space(self, params=None):
        return self._action_space

    def reset(self, key=None, params=None):
        raise NotImplementedError(
            f"{self.name} steps batches of envs on the host (envpool), outside JAX: train it with "
            "arch.name: sebulba (its actors step an envs.envpool.VectorEnv)"
        )

    step = reset_env = step_env = reset


def make(env_id: str, **options: Any) -> tuple[EnvpoolSpaces, dict]:
    """(EnvpoolSpaces, its options) for the envpool id `env_id` (no prefix) and envpool's
    `options`; ValueError for an unknown id or option."""
    spec = make_spec(env_id, **options)
    env = EnvpoolSpaces(env_id, options, space(spec.observation_space), space(spec.action_space))
    return env, env.default_params


AUTORESET_MODES = ("same_step", "next_step")


class VectorEnv:
    """`num_envs` envpool envs of `env_id` stepped as one batch (env i seeded `seed + i` by
    envpool), with gymnasium's vector API and `autoreset_mode` "same_step" or "next_step"
    (module docstring)."""

    def __init__(
        self, env_id: str, num_envs: int, seed: int, autoreset_mode: str = "same_step", **options
    ):
        if autoreset_mode not in AUTORESET_MODES:
            raise ValueError(
                f"autoreset_mode: expected one of {AUTORESET_MODES}, got {autoreset_mode!r}"
            )
        make_spec(env_id, **options)  # the errors that name the option
        self.envs = _envpool().make(
            env_id, env_type="gymnasium", num_envs=num_envs, seed=int(seed), **options
        )
        self.num_envs, self.autoreset_mode = num_envs, autoreset_mode
        self.single_observation_space = self.envs.observation_space
        self.single_action_space = self.envs.action_space
        sample = np.asarray(self.envs.action_space.sample())  # the reset step's ignored actions
        self.reset_actions = np.zeros((num_envs, *sample.shape), sample.dtype)

    def reset(self, seed=None, options=None):
        """(observations, info) of fresh episodes; the seed was given at construction (a later
        `seed` is ignored: envpool seeds its envs once)."""
        obs, _ = self.envs.reset()
        return obs, {}

    def step(self, actions):
        """(obs, reward, terminated, truncated, info): envpool's step of every env, with
        "same_step" then the reset step of those whose episode ended (module docstring);
        `step_async` then `step_wait`."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions):
        """Start the step of every env with `actions` and return at once (envpool's `send`):
        envpool's threads step the envs while the caller goes on (an actor acting for its other
        envs); `step_wait` collects the step. One step at a time: `step_wait` before the next."""
        self.envs.send(np.asarray(actions))

    def step_wait(self):
        """(obs, reward, terminated, truncated, info) of the step `step_async` started (envpool's
        `recv`: a pool of num_envs == batch_size returns its envs in the order they were sent),
        with "same_step" after the reset step of the envs whose episode ended (module
        docstring)."""
        obs, reward, terminated, truncated, info = self.envs.recv()
        ended = np.flatnonzero(terminated | truncated)
        game_over = terminated | truncated
        if "terminated" in info:  # envpool's Atari: the game's own end, not a lost life
            game_over = truncated | (np.asarray(info["terminated"]) != 0)
        out = {"score": np.asarray(info.get("reward", reward)), "game_over": game_over}
        if ended.size and self.autoreset_mode == "same_step":
            first, *_, first_info = self.envs.step(self.reset_actions[ended], env_id=ended)
            final_obs, obs = obs, obs.copy()
            obs[np.asarray(first_info["env_id"])] = first
            out.update(final_obs=final_obs, _final_obs=terminated | truncated)
        return obs, reward, terminated, truncated, out

    def close(self):
        self.envs.close()
