"""Stopping a run that diverged: a NaN or an infinity in a chunk's metrics or params.

After every chunk of log points the runner (rl.run.train) checks the chunk's metrics on the host and
whether each instance's params are finite (`finite_per_instance`, on the device); the first
problem stops the run before the chunk is checkpointed, with a message naming the metric or
params leaf, the step, the setting and the seed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rl.run.logging import NAN_ALLOWED_PREFIXES


class NonFiniteError(RuntimeError):
    """Training produced a NaN or infinity in a loss or the params; the message names where."""


def find_non_finite(
    metrics: dict, finite_params: dict, step_range: tuple[int, int], history: dict | None = None
) -> str | None:
    """A message naming the first diverged metric (its value, step, setting and seed) or params leaf
    in a chunk, or None.

    A metric has diverged at a log point where it is infinite, or NaN after having been finite
    earlier in the run (`history` holds the earlier log points): a metric that is NaN from the start
    means "no value yet" (a loss before learning starts). Metrics named `episode_*` or `eval_*` may
    be NaN at any time (no episode ended since the last log point); they stop the run only when
    infinite. Params must be finite."""
    first = None
    for name, values in metrics.items():
        values = np.asarray(values)
        if name == "step" or not np.issubdtype(values.dtype, np.floating) or values.ndim < 3:
            continue
        earlier = np.asarray(history[name]) if history and name in history else values[:, :, :0]
        full = np.concatenate([earlier, values], axis=2)
        flat = full.reshape(*full.shape[:3], -1)  # [settings, seeds, log points, any extra axes]
        bad = np.isinf(flat).any(-1)
        if not name.startswith(NAN_ALLOWED_PREFIXES):
            finite_before = (
                np.cumsum(np.isfinite(flat).all(-1), axis=2) - np.isfinite(flat).all(-1) > 0
            )
            bad |= np.isnan(flat).any(-1) & finite_before
        bad = np.argwhere(bad[:, :, earlier.shape[2] :])
        if bad.size:
            s, i, t = min(bad.tolist(), key=lambda index: index[2])
            point = flat[s, i, earlier.shape[2] + t]
            value = point[~np.isfinite(point)][0]
            if first is None or t < first[0]:
                step = int(np.asarray(metrics["step"])[s, i, t])
                first = (t, f"non-finite {name} ({value}) at step {step} (setting {s}, seed {i})")
    if first is not None:
        return first[1]
    for path, finite in jax.tree_util.tree_leaves_with_path(finite_params):
        bad = np.argwhere(~np.asarray(finite))
        if bad.size:
            s, i = bad[0].tolist()
            return (
                f"non-finite params{jax.tree_util.keystr(path)} between step {step_range[0]} and "
                f"step {step_range[1]} (setting {s}, seed {i})"
            )
    return None


@jax.jit
def finite_per_instance(tree):
    """Per leaf, bool[settings, seeds]: whether that instance's values are all finite."""

    def check(x):
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            return jnp.ones(x.shape[:2], bool)
        return jnp.isfinite(x).reshape(x.shape[0], x.shape[1], -1).all(-1)

    return jax.tree.map(check, tree)
