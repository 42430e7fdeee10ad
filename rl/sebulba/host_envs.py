"""The host envs of the actor-learner architecture (rl.sebulba): a batch of envs stepped outside JAX
with gymnasium's vector API, one per actor thread (`make_vector_env`: `gymnasium:<id>` or
`envpool:<id>`), split into `arch.env_groups` groups whose steps come in two halves (`SplitStep`,
`make_env_groups`) so that one group's envs step while the actor acts for another.
"""

from __future__ import annotations

import numpy as np

from envs.spaces import Box, Discrete


def obs_dtype(space):
    """The dtype observations of `space` reach the network in: uint8 frames stay uint8 to the
    device (a quarter of float32's bytes; the cnn torso scales them), Discrete ones are int32,
    others float32."""
    if isinstance(space, Discrete):
        return np.int32
    if isinstance(space, Box) and np.dtype(space.dtype) == np.uint8:
        return np.uint8
    return np.float32


def make_vector_env(
    config, seeds: list[int], mode: str, autoreset: str = "same_step", frames: bool = False
):
    """(vector env, its first observations) of len(seeds) envs of `config.env.id`:
    `gymnasium:<id>`, gymnasium's env (`env.params` its keywords) in a SyncVectorEnv (stepped in
    the actor's thread) or AsyncVectorEnv (one process per env) by `arch.vector_env`;
    `envpool:<id>`, an `envs.envpool.VectorEnv` (`env.params` envpool's options: Atari's frame
    preprocessing, episodic life, reward clipping ...) stepped on envpool's own threads. Seeded by
    `seeds` (envpool: its first, env i getting seeds[0] + i); `mode` "sync" or "async" for
    gymnasium ids; `autoreset` "same_step" or "next_step" (gymnasium's `AutoresetMode`s);
    `frames` (envpool): each step's newest frame alone (stack_num 1, `rl.sebulba.frame_stack` stacks
    them)."""
    prefix, _, env_id = config.env.id.partition(":")
    if prefix == "envpool":
        from envs.envpool import VectorEnv

        options = {**config.env.params, **({"stack_num": 1} if frames else {})}
        envs = VectorEnv(env_id, len(seeds), seeds[0] % 2**30, autoreset, **options)
        return envs, envs.reset()[0]
    import gymnasium
    from gymnasium.vector import AutoresetMode

    from envs.gymnasium import check_gymnasium_id

    check_gymnasium_id(env_id)  # no 'module:id': it would import a module named by the config

    autoreset_modes = {"same_step": AutoresetMode.SAME_STEP, "next_step": AutoresetMode.NEXT_STEP}
    vector_kwargs = {"autoreset_mode": autoreset_modes[autoreset]}
    if mode == "async":  # fresh worker processes: no fork of this multithreaded one
        vector_kwargs["context"] = "spawn"
    envs = gymnasium.make_vec(
        env_id,
        len(seeds),
        vectorization_mode=mode,
        vector_kwargs=vector_kwargs,
        **config.env.params,
    )
    return envs, envs.reset(seed=seeds)[0]


class SplitStep:
    """A host vector env's step in two halves: `step_async(actions)` starts it and returns,
    `step_wait()` gives what `envs.step(actions)` would have, (obs, reward, terminated, truncated,
    info). Where `envs` has its own halves (envpool's `send` / `recv` in envs.envpool.VectorEnv,
    gymnasium's AsyncVectorEnv) the envs step on their own threads or processes in between;
    otherwise (gymnasium's SyncVectorEnv) `step_async` keeps the actions and `step_wait` steps:
    the step runs in the caller's thread, and the actions may still be arriving from the device
    until then (a jax.Array is converted in `step_wait`). One step at a time. `autoreset_mode`
    says when `envs` reset ("same_step" or "next_step", `make_vector_env`'s `autoreset`)."""

    def __init__(self, envs, autoreset_mode: str = "same_step"):
        self.envs, self.num_envs, self.autoreset_mode = envs, envs.num_envs, autoreset_mode
        self.native = callable(getattr(envs, "step_async", None)) and callable(
            getattr(envs, "step_wait", None)
        )
        self.actions = None

    def step_async(self, actions) -> None:
        assert self.actions is None, "step_wait before the next step_async"
        if self.native:
            self.envs.step_async(np.asarray(actions))
        self.actions = actions

    def step_wait(self):
        assert self.actions is not None, "step_async before step_wait"
        actions, self.actions = self.actions, None
        if self.native:
            return self.envs.step_wait()
        return self.envs.step(np.asarray(actions))

    def close(self) -> None:
        self.envs.close()


def make_env_groups(
    config, seeds: list[int], mode: str, groups: int, autoreset="same_step", frames=False
):
    """[(SplitStep, its first observations)] of `groups` vector envs splitting the len(seeds)
    envs of `make_vector_env(config, seeds, mode, autoreset, frames)` in order: env i gets the
    seed it gets there (gymnasium: seeds[i]; envpool: seeds[0] + i), whatever the groups."""
    per_group = len(seeds) // groups
    assert per_group * groups == len(seeds), (len(seeds), groups)  # rl.config.arch.check_arch
    if config.env.id.startswith("envpool:"):  # envpool seeds a pool's env i with its seed + i
        first = seeds[0] % (2**30 - len(seeds))  # make_vector_env's seed % 2**30 keeps it
        seeds = [first + i for i in range(len(seeds))]
    made = []
    for g in range(groups):
        group_seeds = seeds[g * per_group : (g + 1) * per_group]
        envs, obs = make_vector_env(config, group_seeds, mode, autoreset, frames)
        made.append((SplitStep(envs, autoreset), obs))
    return made


def reached_obs(next_obs, info):
    """The observations a step reached: `next_obs`, except where an episode ended in a same-step
    reset, the one it ended on (`info["final_obs"]`: envpool's dense array, or gymnasium's object
    array beside the mask `info["_final_obs"]`). With next-step resets `next_obs` is always it."""
    if "final_obs" not in info:
        return next_obs
    final = info["final_obs"]
    if final.dtype != object:
        return np.asarray(final, next_obs.dtype)
    reached = next_obs.copy()
    for i in np.flatnonzero(info["_final_obs"]):
        reached[i] = final[i]
    return reached


class Scores:
    """The return and length of each env's running game, and those of the games that ended: the
    rewards and ends a vector env reports for scoring (`info["score"]` and `info["game_over"]`
    where it gives them: envpool's unclipped rewards over all of a game's lives), else the
    rewards and episode ends themselves. A length counts the agent's steps, not an env's reset
    steps (`add`'s `reset_step`)."""

    def __init__(self, num_envs: int):
        self.returns, self.lengths = np.zeros(num_envs), np.zeros(num_envs, np.int64)
        self.ended_returns: list[float] = []
        self.ended_lengths: list[int] = []

    def add(self, reward, terminated, truncated, info, reset_step=None) -> None:
        """One step of every env; `reset_step` [envs]: where the step only reset its env (a
        next-step reset), not counted in the game's length."""
        reward = info.get("score", reward)
        over = info.get("game_over", np.asarray(terminated) | np.asarray(truncated))
        counted = 1 if reset_step is None else ~np.asarray(reset_step)
        self.returns, self.lengths = self.returns + reward, self.lengths + counted
        ended = np.flatnonzero(over)
        self.ended_returns += self.returns[ended].tolist()
        self.ended_lengths += self.lengths[ended].tolist()
        self.returns[ended], self.lengths[ended] = 0.0, 0

    def take(self) -> tuple[list[float], list[int]]:
        """The ended games' (returns, lengths) since the last `take`."""
        taken = self.ended_returns, self.ended_lengths
        self.ended_returns, self.ended_lengths = [], []
        return taken


def greedy_episodes(envs, obs, act, dtype):
    """(returns, lengths) of the first episode (game: `Scores`) of every env of the vector env
    `envs` from its observations `obs`, acting with `act(obs in dtype) -> env actions`."""
    returns, lengths = np.zeros(len(obs)), np.zeros(len(obs), np.int64)
    running = np.ones(len(obs), bool)
    while running.any():
        action = act(np.asarray(obs, dtype))
        obs, reward, terminated, truncated, info = envs.step(np.asarray(action))
        reward = info.get("score", reward)
        returns, lengths = returns + running * reward, lengths + running
        running &= ~info.get("game_over", terminated | truncated)
    return returns, lengths
