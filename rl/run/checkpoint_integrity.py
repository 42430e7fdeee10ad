"""What makes a checkpoint trustworthy before any array is read: the errors that tell a damaged
checkpoint from one that does not fit the run, the state signature a checkpoint's meta records, and
the files manifest (every file's size and CRC-32) written once orbax has finalised a checkpoint,
and the folders no checkpoint fusedrl wrote can be (a symbolic link, one holding a link, one
without its meta/ item: `check_folder`; links in checkpoints/ set aside: `set_aside_links`).
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import jax
import numpy as np

FILES_MANIFEST = "fusedrl_files.json"


class CheckpointError(RuntimeError):
    """No usable checkpoint, or a checkpoint that does not match the run."""


class CheckpointMismatchError(CheckpointError):
    """A whole checkpoint that does not fit this run: its config differs from the run's config.yaml,
    or its state has another structure, shape or dtype than the run's agent builds (another config
    or another version of fusedrl). Not damage: `restore_latest` raises it and leaves the checkpoint
    where it is."""


class CheckpointDamagedError(CheckpointError):
    """A checkpoint whose files are not those written: missing, truncated or with other bytes than
    its manifest records."""


def state_signature(tree) -> dict[str, str]:
    """{leaf path: "dtype[shape]"} of a state in its stored form (`strip_keys`), e.g.
    {"['params']['w']": "float32[1, 2, 3]"}: what a checkpoint's meta records and a restore
    compares before reading any array."""
    return {
        jax.tree_util.keystr(path): f"{np.dtype(leaf.dtype).name}{list(leaf.shape)}"
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }


def signature_difference(stored: dict[str, str], expected: dict[str, str]) -> str | None:
    """The first difference between a checkpoint's state signature and the one this run builds, as
    a phrase naming the leaf, or None when they agree."""
    for path, spec in expected.items():
        if path not in stored:
            return f"state{path} ({spec}) is not in the checkpoint"
        if stored[path] != spec:
            return f"state{path} is {stored[path]} in the checkpoint, this run builds {spec}"
    extra = next((path for path in stored if path not in expected), None)
    return None if extra is None else f"the checkpoint holds state{extra}, which this run lacks"


def _crc32(path: Path) -> int:
    """The CRC-32 of a file's bytes, read in 4 MiB blocks (zlib releases the GIL meanwhile)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def write_files_manifest(folder: Path) -> None:
    """`folder/FILES_MANIFEST`: {relative path: [bytes, CRC-32]} of every file under `folder`,
    written to a temporary name and renamed into place."""
    files = {
        str(path.relative_to(folder)): [path.stat().st_size, _crc32(path)]
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != FILES_MANIFEST
    }
    temporary = folder / f".{FILES_MANIFEST}.tmp"
    with open(temporary, "w") as f:
        f.write(json.dumps({"files": files}))
        f.flush()
        os.fsync(f.fileno())  # on disk before it is named: power loss leaves no empty manifest
    os.replace(temporary, folder / FILES_MANIFEST)


def verify_files(folder: Path) -> bool:
    """True if `folder` holds every file its manifest lists, with the recorded size and CRC-32;
    False if it has no manifest (written by a process that stopped right after orbax finished, or
    by an older fusedrl); CheckpointDamagedError naming the first file that differs."""
    manifest = folder / FILES_MANIFEST
    if not manifest.is_file():
        return False
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        raise CheckpointDamagedError(f"its file list {FILES_MANIFEST} cannot be read") from None
    for name, (size, crc) in files.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointDamagedError(f"{name} is missing")
        if path.stat().st_size != size:
            raise CheckpointDamagedError(
                f"{name} has {path.stat().st_size} bytes, {size} when written"
            )
        if _crc32(path) != crc:
            raise CheckpointDamagedError(f"{name} has other bytes than when written (CRC-32)")
    return True


def set_aside(directory: Path, entry: Path) -> Path:
    """Move `entry` of `directory` (checkpoints/) into `damaged_checkpoints/` beside it, under a
    free name; a symbolic link is moved as the link (its target stays where it is)."""
    target = directory.parent / "damaged_checkpoints" / entry.name
    suffix = 0
    while target.exists() or target.is_symlink():
        suffix += 1
        target = target.with_name(f"{entry.name}.{suffix}")
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(entry, target)
    return target


def check_folder(folder: Path) -> None:
    """CheckpointDamagedError for a checkpoint folder fusedrl cannot have written whole: a symbolic
    link, one holding a symbolic link, or one without its `meta/` item."""
    if folder.is_symlink():
        raise CheckpointDamagedError(f"it is a symbolic link (to {os.readlink(folder)!r})")
    if not folder.is_dir():
        raise CheckpointDamagedError("it is not a folder")
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            if os.path.islink(os.path.join(parent, name)):
                inner = os.path.relpath(os.path.join(parent, name), folder)
                raise CheckpointDamagedError(f"it holds a symbolic link, {inner}")
    if not (folder / "meta").is_dir():
        raise CheckpointDamagedError("its meta/ folder is missing")


def set_aside_links(directory: Path, read_only: bool, warn) -> set[int]:
    """The steps (folder names) of `directory` (a run's checkpoints/) that are symbolic links: moved
    (the links themselves) to `damaged_checkpoints/` by a writer (process 0), each with one `warn`,
    so that nothing reads, overwrites or deletes through them; skipped with one by a reader."""
    if not directory.is_dir():
        return set()
    linked = set()
    for entry in sorted(directory.iterdir()):
        if not entry.is_symlink():
            continue
        if entry.name.isdigit():
            linked.add(int(entry.name))
        target = os.readlink(entry)
        if read_only:
            warn(f"checkpoint {entry} is a symbolic link (to {target!r}): skipped")
        elif jax.process_index() == 0:
            moved = set_aside(directory, entry)
            warn(
                f"checkpoint {entry} is a symbolic link (to {target!r}); the link was moved "
                f"to {moved}"
            )
    return linked


def check_matches(tree, abstract_tree) -> None:
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


def check_history(history: dict, meta: dict) -> None:
    """CheckpointDamagedError unless every per-seed metric history has the metadata's count of log
    points."""
    points = int(meta["log_points"])
    for name, values in history.get("seed", {}).items():
        if values.shape[-1] != points:
            raise CheckpointDamagedError(
                f"history of {name!r} has {values.shape[-1]} log points, the metadata says {points}"
            )
