"""Pure-JAX environments with a functional, gymnax-style API and gymnasium's episode-end split.

    import envs
    env, params = envs.make("CartPole-v1")
    obs, state = env.reset(key, params)
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)
"""

from __future__ import annotations

import difflib
import importlib

from envs.core import Env
from envs.rendering import render, save_gif
from envs.spaces import Box, Discrete
from envs.wrappers import (
    ClipAction,
    EpisodeStatistics,
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

# "prefix:<id>" -> the adapter module of an outside env library (each behind its own pip extra,
# imported only when used): `make(id, **kwargs) -> (env, params)` and `ids()` (ImportError if missing).
ADAPTERS: dict[str, str] = {
    "brax": "envs.brax",
    "craftax": "envs.craftax",
    "jumanji": "envs.jumanji",
}


def __getattr__(name: str):
    """`envs.to_gymnasium` / `envs.from_gymnasium`, imported on first use (gymnasium stays optional to import envs)."""
    if name in ("to_gymnasium", "from_gymnasium"):
        from envs import gymnasium as interop

        return getattr(interop, name)
    raise AttributeError(f"module 'envs' has no attribute {name!r}")


def registered_ids() -> list[str]:
    """The ids `make` accepts: the built-in envs, then "<prefix>:<id>" for each adapter whose library
    is installed (listing those imports the libraries). `gymnasium:<id>` ids are not listed."""
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
    "brax:<name>", "craftax:<id>" or "jumanji:<id>" is that library's env through its adapter
    (`envs/brax.py`, ...; the keywords are documented there); ImportError naming the pip extra
    (`pip install "fusedrl[brax]"`, ...) if the library is not installed.
    """
    if isinstance(env_id, str) and env_id.startswith("gymnasium:"):
        from envs.gymnasium import from_gymnasium

        return from_gymnasium(env_id[len("gymnasium:"):], **param_overrides)
    prefix, colon, name = str(env_id).partition(":")
    if colon and prefix in ADAPTERS:
        return importlib.import_module(ADAPTERS[prefix]).make(name, **param_overrides)
    if env_id not in REGISTRY:
        close = difflib.get_close_matches(str(env_id), REGISTRY, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown env id {env_id!r}.{hint} Known ids: {', '.join(sorted(REGISTRY))}; "
            f"or 'gymnasium:<id>' for a gymnasium env through host callbacks, or {', '.join(repr(p + ':<id>') for p in ADAPTERS)} "
            "for an env of that library (envs.registered_ids() lists the installed ones)"
        )
    module_name, class_name = REGISTRY[env_id]
    env = getattr(importlib.import_module(module_name), class_name)()
    return env, env.make_params(**param_overrides)


__all__ = [
    "Env",
    "Box",
    "Discrete",
    "make",
    "registered_ids",
    "REGISTRY",
    "ADAPTERS",
    "vectorize",
    "Wrapper",
    "EpisodeStatistics",
    "NormalizeObservation",
    "NormalizeReward",
    "ClipAction",
    "RescaleAction",
    "render",
    "save_gif",
    "to_gymnasium",
    "from_gymnasium",
]
