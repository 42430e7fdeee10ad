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
listed as a checkpoint. Once orbax has finalised it, `FILES_MANIFEST` records every file's size and
CRC-32 (written atomically beside the items; a checkpoint whose process died before that is used
unverified). The meta item also holds the stored state's signature (`state_signature`) and whatever
the caller adds (the run's config).

Restoring tells two failures apart:
- **mismatch** (`CheckpointMismatchError`): the checkpoint is whole but is not this run's, e.g. the
  run's config.yaml was edited or another fusedrl version built another state. Nothing is moved;
  `restore_latest` raises it with the first differing config key or state leaf.
- **damage** (`CheckpointDamagedError` and anything orbax raises reading it): a file is missing,
  shorter or has other bytes than the manifest records, or orbax cannot read it. `restore_latest`
  moves it to `damaged_checkpoints/`, reports one line and falls back to the next older checkpoint.

Typed PRNG keys (`jax.random.key`) are stored as their raw key data and re-wrapped on restore.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rl.checkpoint_integrity import (
    FILES_MANIFEST,
    CheckpointDamagedError,
    CheckpointError,
    CheckpointMismatchError,
    signature_difference,
    state_signature,
    verify_files,
    write_files_manifest,
)

__all__ = [
    "FILES_MANIFEST",
    "CheckpointDamagedError",
    "CheckpointError",
    "CheckpointMismatchError",
    "Checkpoints",
]

CHECKPOINT_DIR = "checkpoints"

# What orbax says when the stored tree does not fit the requested one (not damage).
_ORBAX_MISMATCH = ("Structure mismatch", "tree structures do not match", "Requested shape")


def _quiet_orbax() -> None:
    """Orbax logs every save through absl, warns when reading a checkpoint folder read-only, and
    logs a failed write with its traceback from each of its threads; `Checkpoints` reports what
    matters itself (a failed write as one OSError), so keep the CLI's output readable."""
    for name in ("absl", "orbax"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


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
        self.unlisted: int | None = None  # the step being written, not yet in a files manifest
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
        returns, files are written in the background; `wait` or the next `save` waits for it and
        writes its files manifest). `meta` (JSON) gets the state's signature added."""
        import orbax.checkpoint as ocp

        self.wait()
        stored = strip_keys(state)
        history = jax.tree.map(np.asarray, history)
        self._manager.save(
            int(step),
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(stored),
                history=ocp.args.StandardSave(history),
                meta=ocp.args.JsonSave({**meta, "state_signature": state_signature(stored)}),
            ),
            force=True,
        )
        self.unlisted = int(step)

    def wait(self) -> None:
        """Block until the checkpoint being written is finalised, then record its files manifest
        (from process 0 of a multi-process run). A failed write raises OSError naming the
        checkpoint (the disk's error where orbax reports one, e.g. ENOSPC)."""
        if self._manager is None:
            return
        step, self.unlisted = self.unlisted, None
        try:
            self._manager.wait_until_finished()
        except Exception as err:
            if isinstance(err, OSError) or step is None:
                raise
            raise _write_error(err, self.directory / str(step)) from err
        if step is not None and jax.process_index() == 0:
            write_files_manifest(self.directory / str(step))

    def restore(self, step: int, abstract_state, with_history: bool = True, check_meta=None):
        """(state, history, meta) of checkpoint `step`, placed like `abstract_state` (a tree of
        ShapeDtypeStructs, with shardings where arrays should be sharded).

        Before reading any array: the files are checked against the manifest
        (CheckpointDamagedError), then `check_meta(meta)` (the caller's check, e.g. of the config:
        a message for CheckpointMismatchError, or None) and the state signature
        (CheckpointMismatchError)."""
        import orbax.checkpoint as ocp

        folder = self.directory / str(step)
        verify_files(folder)
        meta = dict(
            self._manager.restore(int(step), args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
                "meta"
            ]
        )
        problem = check_meta(meta) if check_meta is not None else None
        if problem is not None:
            raise CheckpointMismatchError(f"checkpoint {folder}: {problem}")
        storage = abstract_for_storage(abstract_state)
        if "state_signature" in meta:
            difference = signature_difference(meta["state_signature"], state_signature(storage))
            if difference is not None:
                raise CheckpointMismatchError(self._mismatch_message(step, difference))
        items = {"state": ocp.args.StandardRestore(storage), "meta": ocp.args.JsonRestore()}
        if with_history:
            items["history"] = ocp.args.StandardRestore()
        try:
            restored = self._manager.restore(int(step), args=ocp.args.Composite(**items))
        except ValueError as err:
            first_line = str(err).splitlines()[0] if str(err) else ""
            if any(phrase in str(err) for phrase in _ORBAX_MISMATCH):
                raise CheckpointMismatchError(self._mismatch_message(step, first_line)) from None
            raise
        state = restore_keys(restored["state"], abstract_state)
        try:
            _check_matches(state, abstract_state)
        except CheckpointMismatchError as err:
            raise CheckpointMismatchError(self._mismatch_message(step, str(err))) from None
        history = jax.tree.map(np.asarray, dict(restored["history"])) if with_history else None
        if with_history:
            _check_history(history, meta)
        return state, history, meta

    def _mismatch_message(self, step: int, detail: str) -> str:
        return (
            f"checkpoint {self.directory / str(step)} does not fit the state this run builds: "
            f"{detail}. It was written with another config or another version of fusedrl; resume "
            "it with the config and version that wrote it, or start a new run. The checkpoint is "
            "left as it is"
        )

    def restore_latest(self, abstract_state, with_history: bool = True, warn=None, check_meta=None):
        """(step, state, history, meta) of the newest checkpoint that reads back correctly, or None
        if there is none. A damaged checkpoint is reported through `warn` in one line and skipped
        (moved to `damaged_checkpoints/` unless read-only); a mismatch
        (`CheckpointMismatchError`, from the signature or from `check_meta`) is not damage and
        stops the restore."""
        warn = warn or (lambda message: print(f"rl: warning: {message}", file=sys.stderr))
        for step in reversed(self.steps()):
            try:
                return (step, *self.restore(step, abstract_state, with_history, check_meta))
            except CheckpointMismatchError:
                raise
            except Exception as err:  # damaged: set it aside, fall back to an older one
                detail = str(err).splitlines()[0] if str(err) else ""
                reason = (
                    detail
                    if isinstance(err, CheckpointDamagedError)
                    else f"{type(err).__name__}: {detail}"
                )
                moved = "" if self.read_only else f"; moved to {self._set_aside(step)}"
                warn(
                    f"checkpoint {self.directory / str(step)} is damaged ({reason}){moved}; "
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
            self.wait()
            self._manager.close()


def _write_error(err: Exception, folder: Path) -> OSError:
    """An OSError for a checkpoint write that failed inside orbax/TensorStore (which report the
    system error as text: "... No space left on device [os_error_code='28']")."""
    found = re.search(r"os_error_code='(\d+)'", str(err))
    code = int(found.group(1)) if found else errno.EIO
    return OSError(code, os.strerror(code), str(folder))


def _check_matches(tree, abstract_tree) -> None:
    """CheckpointError unless `tree` has the structure, shapes and dtypes of `abstract_tree`."""
    if jax.tree.structure(tree) != jax.tree.structure(abstract_tree):
        raise CheckpointMismatchError(
            "the checkpoint's state does not have the structure this config's agent builds"
        )
    for (path, leaf), spec in zip(
        jax.tree_util.tree_leaves_with_path(tree), jax.tree.leaves(abstract_tree)
    ):
        if tuple(leaf.shape) != tuple(spec.shape) or leaf.dtype != spec.dtype:
            raise CheckpointMismatchError(
                f"state{jax.tree_util.keystr(path)} is {leaf.dtype}{list(leaf.shape)} in the "
                f"checkpoint, this run builds {spec.dtype}{list(spec.shape)}"
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
