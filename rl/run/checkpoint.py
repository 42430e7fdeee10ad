"""Checkpoints of a run's whole training state, written with orbax into
`RUN_DIR/checkpoints/<step>/` (`<step>`: env steps per seed), and restored (`Checkpoints`). A
checkpoint holds the Trainer state of every setting and seed (leading axes [settings, seeds]), the
metrics history and JSON meta; orbax's atomic rename and a manifest of every file's size and
CRC-32 let a restore tell a checkpoint that is not this run's (`CheckpointMismatchError`) from a
damaged one (`CheckpointDamagedError`, set aside in `damaged_checkpoints/`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rl.run.checkpoint_integrity import (
    FILES_MANIFEST,
    CheckpointDamagedError,
    CheckpointError,
    CheckpointMismatchError,
    check_folder,
    check_history,
    check_matches,
    set_aside,
    set_aside_links,
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
    """Save and restore a run's checkpoints. A checkpoint holds three items: `state` (params,
    optimiser state, target params, buffers, env states, PRNG keys, counters; typed keys stored as
    their key data), `history` ({"seed": {name: [settings, seeds, log points]}, "host": {name:
    [log points]}}) and `meta` (JSON: log points done, env steps per seed, the agent and env names,
    the state's signature, what the caller adds). Orbax renames a checkpoint into place once every
    file is written; then `FILES_MANIFEST` records every file's size and CRC-32. Restoring, a
    mismatch (whole, but not this run's: an edited config.yaml, another fusedrl version) raises
    `CheckpointMismatchError` naming the first differing key or leaf, and moves nothing; damage (a
    file missing, short or other than the manifest, or unreadable) sets the checkpoint aside in
    `damaged_checkpoints/` with one line, and `restore_latest` falls back to the next older one.

    Symbolic links in `checkpoints/` (a step folder or a temporary one that is a link, as a shared
    run directory may hold) are never read, written or deleted through: a writer moves each link
    itself to `damaged_checkpoints/` with one warning, a reader (`read_only`) skips it with one."""

    def __init__(self, run_dir, keep: int | None = 3, read_only: bool = False, warn=None):
        self.directory = checkpoint_dir(run_dir)
        self.read_only = read_only
        self.warn = warn or (lambda message: print(f"rl: warning: {message}", file=sys.stderr))
        if self.directory.is_symlink():
            from rl.run.run_files import link_error

            raise link_error(self.directory)
        self._linked = set_aside_links(self.directory, read_only, self.warn)
        # the thread that waits for the checkpoint being written and records its files manifest
        self._finishing: threading.Thread | None = None
        self._write_failure: BaseException | None = None
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
        return sorted(step for step in self._manager.all_steps() if step not in self._linked)

    def save(self, step: int, state, history: dict, meta: dict) -> None:
        """Start writing a checkpoint (asynchronously: arrays are copied off the device before this
        returns; the files are written, and then their manifest, in the background; `wait` or the
        next `save` waits for both). `meta` (JSON) gets the state's signature added."""
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
        self._finishing = threading.Thread(
            target=self._finish, args=(int(step),), name="rl-checkpoint-manifest", daemon=True
        )
        self._finishing.start()

    def _finish(self, step: int) -> None:
        """In a background thread: wait until orbax has finalised checkpoint `step`, then record
        its files manifest (process 0 of a multi-process run); a failure is kept for `wait`."""
        try:
            self._manager.wait_until_finished()
            if jax.process_index() == 0:
                write_files_manifest(self.directory / str(step))
        except BaseException as err:  # re-raised by wait() in the caller's thread
            self._write_failure = _write_error(err, self.directory / str(step))

    def written_within(self, seconds: float) -> bool:
        """Whether the checkpoint being written (if any) is done within `seconds`."""
        if self._finishing is not None:
            self._finishing.join(seconds)
            return not self._finishing.is_alive()
        return True

    def wait(self) -> None:
        """Block until the checkpoint being written is finalised and its manifest recorded. A
        failed write raises OSError naming the checkpoint (the disk's error where orbax reports
        one, e.g. ENOSPC); any other failure is raised as it is."""
        if self._finishing is not None:
            self._finishing.join()
            self._finishing = None
        failure, self._write_failure = self._write_failure, None
        if failure is not None:
            raise failure

    def read_meta(self, step: int) -> dict:
        """The JSON metadata of checkpoint `step` (no array is read)."""
        import orbax.checkpoint as ocp

        check_folder(self.directory / str(int(step)))
        restored = self._manager.restore(
            int(step), args=ocp.args.Composite(meta=ocp.args.JsonRestore())
        )
        meta = restored["meta"]
        if not isinstance(meta, dict):
            raise CheckpointDamagedError(f"its metadata is {type(meta).__name__}, not a mapping")
        return dict(meta)

    def restore(self, step: int, abstract_state, with_history: bool = True, check_meta=None):
        """(state, history, meta) of checkpoint `step`, placed like `abstract_state` (a tree of
        ShapeDtypeStructs, with shardings where arrays should be sharded); with `abstract_state`
        None, the state as stored (nested dicts and lists of arrays, typed keys as their key data)
        on this process's first device, without the signature's check (for reading one part of a
        state this config does not build: rl.run.run_dir.load_params).

        Before reading any array: the files are checked against the manifest
        (CheckpointDamagedError), then `check_meta(meta)` (the caller's check, e.g. of the config:
        a message for CheckpointMismatchError, or None) and the state signature
        (CheckpointMismatchError). A checkpoint without a manifest that orbax cannot read is
        damaged too; one whose files verified is not, and orbax's error is raised as it is."""
        import orbax.checkpoint as ocp

        folder = self.directory / str(step)
        check_folder(folder)
        verified = verify_files(folder)
        try:
            meta = self.read_meta(step)
        except CheckpointDamagedError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as err:  # also json's JSONDecodeError
            raise CheckpointDamagedError(
                f"its metadata cannot be read: {_first_line(err)}"
            ) from None
        problem = check_meta(meta) if check_meta is not None else None
        if problem is not None:
            raise CheckpointMismatchError(f"checkpoint {folder}: {problem}")
        if abstract_state is None:
            first = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            items = {"state": ocp.args.StandardRestore(fallback_sharding=first)}
        else:
            storage = abstract_for_storage(abstract_state)
            if "state_signature" in meta:
                difference = signature_difference(meta["state_signature"], state_signature(storage))
                if difference is not None:
                    raise CheckpointMismatchError(self._mismatch_message(step, difference))
            items = {"state": ocp.args.StandardRestore(storage)}
        items["meta"] = ocp.args.JsonRestore()
        if with_history:
            items["history"] = ocp.args.StandardRestore()
        try:
            restored = self._manager.restore(int(step), args=ocp.args.Composite(**items))
        except (OSError, ValueError) as err:
            if "state_signature" not in meta and any(p in str(err) for p in _ORBAX_MISMATCH):
                raise CheckpointMismatchError(
                    self._mismatch_message(step, _first_line(err))
                ) from None
            if verified:
                raise
            raise CheckpointDamagedError(f"orbax cannot read it: {_first_line(err)}") from None
        state = restored["state"]
        if abstract_state is not None:
            state = restore_keys(state, abstract_state)
            try:
                check_matches(state, abstract_state)
            except CheckpointMismatchError as err:
                raise CheckpointMismatchError(self._mismatch_message(step, str(err))) from None
        history = jax.tree.map(np.asarray, dict(restored["history"])) if with_history else None
        if with_history:
            check_history(history, meta)
        return state, history, meta

    def _mismatch_message(self, step: int, detail: str) -> str:
        """The error for a checkpoint that does not fit the run, with what differs (`detail`)."""
        return (
            f"checkpoint {self.directory / str(step)} does not fit the state this run builds: "
            f"{detail}. It was written with another config or another version of fusedrl; resume "
            "it with the config and version that wrote it, or start a new run. The checkpoint is "
            "left as it is"
        )

    def restore_latest(
        self, abstract_state, with_history: bool = True, warn=None, check_meta=None, target_of=None
    ):
        """(step, state, history, meta) of the newest checkpoint that reads back correctly, or None
        if there is none; `target_of(step)`, where given, is what to read checkpoint `step` into
        (`restore`'s `abstract_state`, None: as stored) in place of `abstract_state`.

        A damaged checkpoint (`CheckpointDamagedError`, which covers what orbax
        cannot read of one without a manifest) is reported through `warn` in one line and skipped
        (moved to `damaged_checkpoints/` by process 0 unless read-only); if every checkpoint was
        damaged, `warn` says the run starts over. A mismatch (`CheckpointMismatchError`) is not
        damage and stops the restore; any other error (out of memory, a bug) is raised as it is."""
        warn = warn or (lambda message: print(f"rl: warning: {message}", file=sys.stderr))
        steps = self.steps()
        for step in reversed(steps):
            try:
                target = abstract_state if target_of is None else target_of(step)
                return (step, *self.restore(step, target, with_history, check_meta))
            except CheckpointDamagedError as err:  # set it aside, fall back to an older one
                moved = ""
                if not self.read_only and jax.process_index() == 0:
                    moved = f"; moved to {self._set_aside(step)}"
                warn(
                    f"checkpoint {self.directory / str(step)} is damaged ({err}){moved}; "
                    "trying an older one"
                )
        if steps:
            warn(f"none of the {len(steps)} checkpoints could be used: training from the start")
        return None

    def _set_aside(self, step: int) -> Path:
        """Move a damaged checkpoint out of the way (so a resumed run can write that step again)."""
        target = set_aside(self.directory, self.directory / str(step))
        self._manager.reload()
        return target

    def close(self) -> None:
        """Wait for the checkpoint being written (raising its failure), then release orbax."""
        if self._manager is not None:
            try:
                self.wait()
            finally:
                self._manager.close()


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def _write_error(err: BaseException, folder: Path) -> BaseException:
    """What a failed checkpoint write raises: an OSError for one that failed inside
    orbax/TensorStore on a system error, which they report as text ("... No space left on device
    [os_error_code='28']"), naming the checkpoint; any other failure as it is."""
    if isinstance(err, OSError):
        return err
    found = re.search(r"os_error_code='(\d+)'", str(err))
    if found is None:
        return err
    code = int(found.group(1))
    return OSError(code, os.strerror(code), str(folder))


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
