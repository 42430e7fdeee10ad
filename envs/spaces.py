"""Observation and action spaces.

Spaces are small immutable descriptions (not pytrees): they are static with respect to `jit`.
Each converts to the matching `gymnasium.spaces` object with `to_gymnasium()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class Discrete:
    """The integers {0, 1, ..., n - 1}."""

    n: int
    dtype: Any = jnp.int32

    @property
    def shape(self) -> tuple[int, ...]:
        return ()

    def sample(self, key: jax.Array) -> jax.Array:
        """A uniformly random element."""
        return jax.random.randint(key, (), 0, self.n, dtype=self.dtype)

    def contains(self, x) -> jax.Array:
        """True where `x` is an integer in [0, n)."""
        x = jnp.asarray(x)
        if x.shape != () or not jnp.issubdtype(x.dtype, jnp.integer):
            return jnp.asarray(False)
        return jnp.logical_and(x >= 0, x < self.n)

    def to_gymnasium(self):
        import gymnasium

        return gymnasium.spaces.Discrete(int(self.n))


@dataclass(frozen=True, eq=False)
class Box:
    """Real vectors with elementwise bounds `low <= x <= high` (bounds may be +-inf)."""

    low: Any
    high: Any
    shape: tuple[int, ...]
    dtype: Any = jnp.float32
    _low: np.ndarray = field(init=False, repr=False, compare=False)
    _high: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(
            self, "_low", np.broadcast_to(np.asarray(self.low, np.float32), self.shape)
        )
        object.__setattr__(
            self, "_high", np.broadcast_to(np.asarray(self.high, np.float32), self.shape)
        )

    def sample(self, key: jax.Array) -> jax.Array:
        """Uniform on bounded dimensions; standard normal on unbounded ones (as gymnasium)."""
        low, high = jnp.asarray(self._low), jnp.asarray(self._high)
        bounded = jnp.isfinite(low) & jnp.isfinite(high)
        k1, k2 = jax.random.split(key)
        u = jax.random.uniform(
            k1,
            self.shape,
            minval=jnp.where(bounded, low, 0.0),
            maxval=jnp.where(bounded, high, 1.0),
        )
        n = jax.random.normal(k2, self.shape)
        return jnp.where(bounded, u, n).astype(self.dtype)

    def contains(self, x) -> jax.Array:
        """True where `x` has this shape and lies within the bounds."""
        x = jnp.asarray(x)
        if x.shape != self.shape:
            return jnp.asarray(False)
        return jnp.all((x >= self._low) & (x <= self._high))

    def to_gymnasium(self):
        import gymnasium

        return gymnasium.spaces.Box(
            low=self._low.copy(), high=self._high.copy(), shape=self.shape, dtype=np.float32
        )


Space = Discrete | Box


def is_concrete(x) -> bool:
    """True when `x` has a value now (not a tracer inside jit/vmap/grad), by trying to read it."""
    try:
        np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return False
    return True


def check_action(space: Space, action, env_name: str) -> jax.Array:
    """Validate an action against its space and return it as a JAX array of the space's dtype.

    Shape and dtype are checked at trace time (a wrong shape or a float action for a discrete space
    raises `ValueError`). Values are checked only when the action is concrete (not traced): a
    discrete action outside [0, n) raises `ValueError`; a continuous action with a NaN or infinite
    entry raises `ValueError`. Traced out-of-range values cannot raise inside `jit`; the envs clip
    them into the space (documented in each env). Finite continuous values outside the Box are never
    an error, concrete or traced: the continuous envs clip them, as gymnasium's do, so eager and
    jitted code behave the same and Gaussian policies need no clipping of their own.
    """
    shape = tuple(jnp.shape(action))
    dtype = jnp.result_type(action)
    if isinstance(space, Discrete):
        if shape != ():
            raise ValueError(
                f"{env_name}.step: action must be a scalar integer in [0, {space.n}), "
                f"got shape {shape}"
            )
        if not jnp.issubdtype(dtype, jnp.integer):
            raise ValueError(
                f"{env_name}.step: action must be an integer in [0, {space.n}), got dtype {dtype}"
            )
        if is_concrete(action):
            value = int(np.asarray(action))
            if not 0 <= value < space.n:
                raise ValueError(
                    f"{env_name}.step: action {value} is outside "
                    f"Discrete({space.n}) = [0, {space.n})"
                )
        return jnp.asarray(action, space.dtype)
    if shape != space.shape:
        raise ValueError(
            f"{env_name}.step: action must have shape {space.shape}, got shape {shape}"
        )
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"{env_name}.step: continuous action must be a float array, got dtype {dtype}"
        )
    if is_concrete(action) and not np.all(np.isfinite(np.asarray(action))):
        raise ValueError(
            f"{env_name}.step: continuous action must be finite, got {np.asarray(action).tolist()}"
        )
    return jnp.asarray(action, space.dtype)


def from_gymnasium(space) -> Space:
    """The equivalent space for a `gymnasium.spaces.Discrete` or `Box`."""
    import gymnasium

    if isinstance(space, gymnasium.spaces.Discrete):
        if int(space.start) != 0:
            raise ValueError(
                f"only Discrete spaces starting at 0 are supported, got start={space.start}"
            )
        return Discrete(int(space.n))
    if isinstance(space, gymnasium.spaces.Box):
        return Box(low=space.low, high=space.high, shape=space.shape)
    raise ValueError(f"unsupported gymnasium space {space!r}: only Discrete and Box are supported")


def batch_shape(space: Space, leading: Sequence[int]) -> tuple[int, ...]:
    """Shape of a batch of elements of `space` with the given leading dimensions."""
    return tuple(leading) + tuple(space.shape)
