"""Pure-JAX environments with a functional, gymnax-style API and gymnasium's episode-end split.

import envs
env, params = envs.make("CartPole-v1")
obs, state = env.reset(key, params)
obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)
"""

from __future__ import annotations

import difflib
import importlib

from envs.core import Env, MissingExtraError
from envs.rendering import render, save_gif
from envs.spaces import Box, Discrete
from envs.wrappers import (
    ClipAction,
    EpisodeStatistics,
    MaskObservation,
    NormalizeObservation,
    NormalizeReward,
    RescaleAction,
    Wrapper,
    vectorize,
)

# id -> (module, class). Add new envs here once their module imports cleanly.
REGISTRY: dict[str, tuple[str, str]] = {
    "GridWorld": ("envs.gridworld", "GridWorld"),
    "CartPole-v1": ("envs.cartpole", "CartPole"),
    "Pendulum-v1": ("envs.pendulum", "Pendulum"),
    "MountainCar-v0": ("envs.mountain_car", "MountainCar"),
    "MountainCarContinuous-v0": ("envs.mountain_car_continuous", "MountainCarContinuous"),
    "Acrobot-v1": ("envs.acrobot", "Acrobot"),
}

# "<prefix>:<id>" -> the adapter module of an outside env library (each behind its own pip extra,
# imported only when used): `make(id, **params) -> (env, params)` and `ids()` (the library's ids;
# `MissingExtraError`, an ImportError naming the extra, when the library is missing).
ADAPTERS: dict[str, str] = {
    "gymnax": "envs.gymnax",
    "brax": "envs.brax",
    "craftax": "envs.craftax",
    "jumanji": "envs.jumanji",
    "jaxmarl": "envs.jaxmarl",
    "playground": "envs.playground",  # MuJoCo Playground: DM Control, locomotion, manipulation
    "envpool": "envs.envpool",  # spaces only: envpool envs step in rl.sebulba's actor threads
}


def __getattr__(name: str):
    """`envs.to_gymnasium` / `envs.from_gymnasium`, imported on first use
    (gymnasium stays optional to import envs)."""
    if name in ("to_gymnasium", "from_gymnasium"):
        from envs import gymnasium as interop

        return getattr(interop, name)
    raise AttributeError(f"module 'envs' has no attribute {name!r}")


def registered_ids() -> list[str]:
    """The ids `make` accepts: the built-in envs, then "<prefix>:<id>" for each adapter whose
    library is installed (listing those imports the libraries). `gymnasium:<id>` ids are not
    listed."""
    ids = sorted(REGISTRY)
    for prefix, module in ADAPTERS.items():
        try:
            ids += [f"{prefix}:{name}" for name in importlib.import_module(module).ids()]
        except ImportError:  # the adapter's extra is not installed
            pass
    return ids


def make(env_id: str, **param_overrides):
    """(env, params) for a registered id, with some env params replaced.

    Raises ValueError for an unknown id (listing the known ones, suggesting the closest) and for
    unknown param names. An id "gymnasium:<id>" wraps gymnasium's own env through host callbacks,
    `from_gymnasium("<id>", **param_overrides)` (the overrides go to `gymnasium.make`). An id
    "<prefix>:<id>" of `ADAPTERS` ("gymnax:Breakout-MinAtar", "brax:ant", "craftax:<id>",
    "jumanji:<id>", "playground:CheetahRun") is that library's env through its adapter
    (`envs/gymnax.py`, ...; the keywords are documented there); `MissingExtraError` (an ImportError
    naming the pip extra, e.g. `pip install "fusedrl[brax]"`) if the library is not installed.
    """
    if isinstance(env_id, str) and env_id.startswith("gymnasium:"):
        from envs.gymnasium import from_gymnasium

        return from_gymnasium(env_id[len("gymnasium:") :], **param_overrides)
    prefix, colon, library_id = env_id.partition(":") if isinstance(env_id, str) else ("", "", "")
    if colon and prefix in ADAPTERS:
        return importlib.import_module(ADAPTERS[prefix]).make(library_id, **param_overrides)
    if env_id not in REGISTRY:
        raise ValueError(unknown_id_message(env_id))
    module_name, class_name = REGISTRY[env_id]
    env = getattr(importlib.import_module(module_name), class_name)()
    return env, env.make_params(**param_overrides)


def unknown_id_message(env_id) -> str:
    """The error for an unknown id: fusedrl's ids, the adapter prefixes, and the closest known id
    (an installed library's id when `env_id` is one without its prefix)."""
    candidates = registered_ids()
    prefixed = [known for known in candidates if known.partition(":")[2] == env_id]
    close = prefixed[:1] or difflib.get_close_matches(str(env_id), candidates, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    libraries = ", ".join(f"'{prefix}:<id>'" for prefix in ADAPTERS)
    return (
        f"unknown env id {env_id!r}.{hint} Known ids: {', '.join(sorted(REGISTRY))}; "
        f"{libraries} for the ids of other env libraries (envs.registered_ids() "
        "lists those installed); or 'gymnasium:<id>' for a gymnasium env through host callbacks"
    )


__all__ = [
    "Env",
    "Box",
    "Discrete",
    "make",
    "registered_ids",
    "REGISTRY",
    "ADAPTERS",
    "MissingExtraError",
    "vectorize",
    "Wrapper",
    "EpisodeStatistics",
    "MaskObservation",
    "NormalizeObservation",
    "NormalizeReward",
    "ClipAction",
    "RescaleAction",
    "render",
    "save_gif",
    "to_gymnasium",
    "from_gymnasium",
]
