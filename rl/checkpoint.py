"""Checkpoints of a run's whole training state, written with orbax into
`RUN_DIR/checkpoints/<step>/`.

A checkpoint holds three items:

    state    the Trainer state of every setting and seed (params, optimiser state, target params,
             buffers, env states, PRNG keys, counters), leading axes [settings, seeds]
    history  the metrics so far: {"seed": {name: [settings, seeds, log points]},
             "host": {name: [log points]}} (host-side metrics such as steps_per_second)
    meta     JSON: log points done, env steps per seed, the agent and env names

`<step>` is the env step count per seed at the checkpoint. Orbax writes each checkpoint into a
temporary directory and renames it into place only once every file is written (and records
`commit_success.txt`), so a process killed mid-write leaves a temporary directory that is never
listed as a checkpoint. On top of that, `restore_latest` verifies what it reads (the restored tree
matches the expected shapes and dtypes, the metadata agrees with the history) and falls back to the
next older checkpoint with a warning if the newest one cannot be read.

Typed PRNG keys (`jax.random.key`) are stored as their raw key data and re-wrapped on restore.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

CHECKPOINT_DIR = "checkpoints"


class CheckpointError(RuntimeError):
    """No usable checkpoint, or a checkpoint that does not match the run."""


class CheckpointStructureError(CheckpointError):
    """A checkpoint whose state has another pytree structure than the run's agent builds: written by
    another version of fusedrl or another config. Not damage: `restore_latest` raises it and leaves
    the checkpoint where it is."""


def _quiet_orbax() -> None:
    """Orbax logs every save through absl (and warns when reading a checkpoint folder read-only);
    keep the CLI's output readable."""
    for name in ("absl", "orbax"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _is_key(x) -> bool:
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) and jax.dtypes.issubdtype(
        x.dtype, jax.dtypes.prng_key
    )


def _is_empty(x) -> bool:
    return (
        isinstance(x, (jax.Array, jax.ShapeDtypeStruct, np.ndarray)) and int(np.prod(x.shape)) == 0
    )


def strip_keys(tree):
    """The stored form of a state: typed PRNG key leaves replaced by their uint32 key data, and
    zero-size arrays (e.g. a Brax pipeline state's empty actuator arrays) by None, since orbax
    cannot store them and they hold no data (`restore_keys` recreates them from the abstract
    state)."""

    def convert(x):
        if _is_key(x):
            return jax.random.key_data(x)
        return None if _is_empty(x) else x

    return jax.tree.map(convert, tree)


def abstract_for_storage(abstract_tree):
    """The stored form of an abstract tree: typed key leaves as their key-data shape, zero-size
    leaves as None (as `strip_keys` stores them)."""

    def convert(x):
        if _is_key(x):
            data = jax.eval_shape(jax.random.key_data, x)
            return jax.ShapeDtypeStruct(
                data.shape, data.dtype, sharding=getattr(x, "sharding", None)
            )
        return None if _is_empty(x) else x

    return jax.tree.map(convert, abstract_tree)


def restore_keys(tree, abstract_tree):
    """Inverse of `strip_keys`: re-wrap key data where `abstract_tree` has typed keys, and put back
    the zero-size arrays (zeros of the abstract shape and dtype, placed by its sharding)."""
    specs, treedef = jax.tree.flatten(abstract_tree)
    stored = iter(jax.tree.leaves(tree))

    def convert(spec):
        if _is_empty(spec):
            empty = jnp.zeros(spec.shape, spec.dtype)
            sharding = getattr(spec, "sharding", None)
            return empty if sharding is None else jax.device_put(empty, sharding)
        x = next(stored)
        if _is_key(spec):
            return jax.random.wrap_key_data(
                x, impl=spec.dtype._impl.name
            )  # the key dtype names its PRNG impl
        return x

    return jax.tree.unflatten(treedef, [convert(spec) for spec in specs])


def checkpoint_dir(run_dir) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def _manager(directory: Path, keep: int | None = None, read_only: bool = False):
    import orbax.checkpoint as ocp

    _quiet_orbax()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=not read_only,
        read_only=read_only,
        cleanup_tmp_directories=not read_only,  # leftovers of a killed save
        enable_async_checkpointing=True,
    )
    return ocp.CheckpointManager(directory, options=options)


class Checkpoints:
    """Save and restore a run's checkpoints (see the module docstring)."""

    def __init__(self, run_dir, keep: int | None = 3, read_only: bool = False):
        self.directory = checkpoint_dir(run_dir)
        self.read_only = read_only
        if read_only and not self.directory.is_dir():
            self._manager = None
        else:
            self._manager = _manager(self.directory.absolute(), keep, read_only)

    def steps(self) -> list[int]:
        """Steps of the finalised checkpoints, oldest first (temporary directories are not
        listed)."""
        if self._manager is None:
            return []
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def save(self, step: int, state, history: dict, meta: dict) -> None:
        """Start writing a checkpoint (asynchronously: arrays are copied off the device before this
        returns, files are written in the background; `wait` or the next `save` waits for it)."""
        import orbax.checkpoint as ocp

        history = jax.tree.map(np.asarray, history)
        self._manager.save(
            int(step),
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(strip_keys(state)),
                history=ocp.args.StandardSave(history),
                meta=ocp.args.JsonSave(meta),
            ),
            force=True,
        )

    def wait(self) -> None:
        """Block until the checkpoint being written is finalised (re-raises a failed write)."""
        if self._manager is not None:
            self._manager.wait_until_finished()

    def restore(self, step: int, abstract_state, with_history: bool = True):
        """(state, history, meta) of checkpoint `step`, placed like `abstract_state` (a tree of
        ShapeDtypeStructs, with shardings where arrays should be sharded)."""
        import orbax.checkpoint as ocp

        items = {
            "state": ocp.args.StandardRestore(abstract_for_storage(abstract_state)),
            "meta": ocp.args.JsonRestore(),
        }
        if with_history:
            items["history"] = ocp.args.StandardRestore()
        try:
            restored = self._manager.restore(int(step), args=ocp.args.Composite(**items))
        except ValueError as err:
            # orbax's message when the saved tree has other keys
            if "Structure mismatch" in str(err):
                raise CheckpointStructureError(
                    self._structure_message(step, str(err).splitlines()[0])
                ) from None
            raise
        state = restore_keys(restored["state"], abstract_state)
        _check_matches(state, abstract_state)
        history = jax.tree.map(np.asarray, dict(restored["history"])) if with_history else None
        meta = dict(restored["meta"])
        if with_history:
            _check_history(history, meta)
        return state, history, meta

    def _structure_message(self, step: int, detail: str) -> str:
        return (
            f"checkpoint {self.directory / str(step)} holds a training state of another "
            f"structure than this run's agent builds ({detail}): it was written by another "
            "version of fusedrl or with another config. Resume it with the version that wrote "
            "it, or start a new run; the checkpoint is left as it is"
        )

    def restore_latest(self, abstract_state, with_history: bool = True, warn=None):
        """(step, state, history, meta) of the newest checkpoint that reads back correctly, or None
        if there is none. A checkpoint that fails to read is reported through `warn` and skipped
        (moved to `damaged_checkpoints/` unless read-only); one of another structure
        (`CheckpointStructureError`) is not damage and stops the restore."""
        warn = warn or (lambda message: print(f"rl: warning: {message}", file=sys.stderr))
        for step in reversed(self.steps()):
            try:
                return (step, *self.restore(step, abstract_state, with_history))
            except CheckpointStructureError:
                raise
            except (
                Exception
            ) as err:  # a damaged checkpoint: set it aside, fall back to an older one
                reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                moved = "" if self.read_only else f", moved to {self._set_aside(step)}"
                warn(
                    f"checkpoint {self.directory / str(step)} cannot be used ({reason}){moved}; "
                    "trying an older one"
                )
        return None

    def _set_aside(self, step: int) -> Path:
        """Move a damaged checkpoint out of the way (so a resumed run can write that step again)."""
        import shutil

        target = self.directory.parent / "damaged_checkpoints" / str(step)
        suffix = 0
        while target.exists():
            suffix += 1
            target = target.with_name(f"{step}.{suffix}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(self.directory / str(step)), str(target))
        self._manager.reload()
        return target

    def close(self) -> None:
        if self._manager is not None:
            self._manager.wait_until_finished()
            self._manager.close()


def _check_matches(tree, abstract_tree) -> None:
    """CheckpointError unless `tree` has the structure, shapes and dtypes of `abstract_tree`."""
    if jax.tree.structure(tree) != jax.tree.structure(abstract_tree):
        raise CheckpointStructureError(
            "the checkpoint's state does not have the structure this config's agent builds"
        )
    for (path, leaf), spec in zip(
        jax.tree_util.tree_leaves_with_path(tree), jax.tree.leaves(abstract_tree)
    ):
        if tuple(leaf.shape) != tuple(spec.shape) or leaf.dtype != spec.dtype:
            raise CheckpointError(
                f"state{jax.tree_util.keystr(path)} is {leaf.dtype}{list(leaf.shape)} in the "
                f"checkpoint, expected {spec.dtype}{list(spec.shape)}"
            )


def _check_history(history: dict, meta: dict) -> None:
    points = int(meta["log_points"])
    for name, values in history.get("seed", {}).items():
        if values.shape[-1] != points:
            raise CheckpointError(
                f"history of {name!r} has {values.shape[-1]} log points, the metadata says {points}"
            )


def abstract_like(tree, sharding=None):
    """ShapeDtypeStructs of `tree`'s leaves (with `sharding` if given, else each leaf's own)."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape,
            x.dtype,
            sharding=sharding if sharding is not None else getattr(x, "sharding", None),
        ),
        tree,
    )


def all_finite(tree) -> jax.Array:
    """Per leaf, whether every element is finite (integer leaves are always finite)."""
    return jax.tree.map(
        lambda x: (
            jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.bool_(True)
        ),
        tree,
    )
