"""Writing and reading the files of a run directory without following links planted in it: run
directories are shared (zipped, copied from a cluster), so one may hold `metrics.jsonl ->
~/.bashrc`. Files written whole go through a renamed temporary file (`write_atomic`), streamed
ones are opened with `O_NOFOLLOW` (`open_no_follow`), a run directory whose entries are links is
refused before `rl train` writes (`check_run_dir`), and reads refuse a link that leaves the run
directory (`check_inside`); what a run's files hold is checked as they are read.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path

from rl.config.parsing import ConfigError

# The entries of a run directory that fusedrl writes or reads (files and folders).
RUN_ENTRIES = (
    "config.yaml",
    "metrics.jsonl",
    "metrics.csv",
    "summary.json",
    "final_params.msgpack",
    ".rl-train.lock",
    "learning_curve.png",
    "checkpoints",
    "damaged_checkpoints",
    "tensorboard",
    "wandb",
)
# Folders whose whole tree fusedrl writes into (checkpoints/ is rl.run.checkpoint's: a linked step
# there is set aside, not refused).
WRITTEN_TREES = ("tensorboard", "wandb", "damaged_checkpoints")

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def link_error(path: Path, what: str = "a run directory") -> ConfigError:
    """The one-line error for a symbolic link where fusedrl writes or reads."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return ConfigError(
        f"{str(path)!r} is a symbolic link (to {target!r}): fusedrl does not write or read "
        f"through links in {what}; remove the link"
    )


def check_run_dir(run_dir) -> None:
    """ConfigError naming the first entry of `run_dir` that fusedrl writes (RUN_ENTRIES) and that is
    a symbolic link, or any link inside the folders it writes into (WRITTEN_TREES)."""
    run_dir = Path(run_dir)
    for name in RUN_ENTRIES:
        if (run_dir / name).is_symlink():
            raise link_error(run_dir / name)
    for name in WRITTEN_TREES:
        for folder, dirs, files in os.walk(run_dir / name):  # does not descend into links
            for entry in dirs + files:
                if os.path.islink(os.path.join(folder, entry)):
                    raise link_error(Path(folder) / entry)


def open_no_follow(path, mode: str = "w", truncate: bool = True):
    """`open(path, mode)` for writing text that fails (ConfigError naming the link) where `path` is
    a symbolic link, instead of writing to its target. `truncate=False` keeps the contents (a lock
    file's: mode "r+")."""
    flags = os.O_CREAT | _NOFOLLOW | _CLOEXEC
    flags |= os.O_RDWR if "+" in mode else os.O_WRONLY
    if truncate:
        flags |= os.O_TRUNC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if Path(path).is_symlink():
            raise link_error(Path(path)) from None
        raise err
    return os.fdopen(fd, mode)


def write_atomic(path, data: bytes | str) -> None:
    """Write `data` to `path` through a new temporary file in the same folder renamed over it: a
    symbolic link at `path` is replaced by the file (its target is not written), and a reader
    never sees half a file."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    # a new name (O_EXCL: never an existing file or link), with the permissions open() gives
    temporary = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    fd = os.open(temporary, flags, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def check_inside(run_dir, path, what: str | None = None) -> Path:
    """`path` (inside `run_dir`), or ConfigError where it is a symbolic link (or under one) whose
    target lies outside the run directory: a run directory's files are read from it only."""
    run_dir, path = Path(run_dir), Path(path)
    if path.is_symlink() or path.resolve() != path.absolute():
        root = run_dir.resolve()
        target = path.resolve()
        if target != root and root not in target.parents:
            raise ConfigError(
                f"{str(path)!r} ({what or 'in a run directory'}) is a symbolic link to "
                f"{str(target)!r}, outside the run directory: not read"
            )
    return path


def saved_grid(grid, config, path) -> list[dict]:
    """The `sweep` of a run's config.yaml as a list of settings ({sweepable agent key: number}),
    or ConfigError naming the file."""
    from rl.config import sweepable

    names = sweepable(config.agent)
    if not isinstance(grid, list) or not all(
        isinstance(setting, dict)
        and all(
            key in names and isinstance(value, (int, float)) and not isinstance(value, bool)
            for key, value in setting.items()
        )
        for setting in grid
    ):
        raise ConfigError(
            f"{str(path)!r}: its sweep must be a list of settings of the agent's sweepable keys "
            f"({', '.join(names)}) to numbers"
        )
    return [dict(setting) for setting in grid]


def read_final_params(run_dir):
    """The params `final_params.msgpack` holds, as stored (nested dicts of arrays); ConfigError
    naming the file where it leaves the run directory or is not a msgpack of arrays."""
    import jax
    import numpy as np
    from flax import serialization

    path = check_inside(run_dir, Path(run_dir) / "final_params.msgpack", "the final params")
    try:
        stored = serialization.msgpack_restore(path.read_bytes())
    except OSError as err:
        raise ConfigError(f"{str(path)!r} cannot be read: {err.strerror or err}") from None
    except Exception as err:  # msgpack's and flax's errors for bytes that are not params
        raise ConfigError(
            f"{str(path)!r} is not a params file fusedrl wrote ({type(err).__name__}); "
            "evaluate a checkpoint instead (--checkpoint STEP)"
        ) from None
    leaves = jax.tree.leaves(stored)
    if not leaves or not all(isinstance(leaf, np.ndarray) for leaf in leaves):
        raise ConfigError(
            f"{str(path)!r} is not a params file fusedrl wrote (it holds no arrays, or other "
            "values than arrays); evaluate a checkpoint instead (--checkpoint STEP)"
        )
    return stored


def holds_checkpoints(run_dir) -> bool:
    """Whether `RUN_DIR/checkpoints/` holds a checkpoint step folder (finalised or not)."""
    folder = Path(run_dir) / "checkpoints"
    return folder.is_dir() and any(entry.name[:1].isdigit() for entry in folder.iterdir())


def check_shared_run_dir(run_dir, first_process: bool) -> None:
    """For a multi-process run, whose processes all make its new directory: ConfigError where
    `run_dir` already holds a run, as a one-process run refuses an existing directory: a finished
    one (summary.json, final_params.msgpack), checkpoints, or, seen by process 0 (which writes it
    later), a config.yaml."""
    run_dir = Path(run_dir)
    held = [name for name in ("summary.json", "final_params.msgpack") if (run_dir / name).exists()]
    held += ["checkpoints"] if holds_checkpoints(run_dir) else []
    held += ["config.yaml"] if first_process and (run_dir / "config.yaml").exists() else []
    if held:
        raise ConfigError(
            f"run directory {str(run_dir)!r} already holds a run ({', '.join(held)}); choose "
            "another run.name, or continue that run with --resume"
        )


@contextlib.contextmanager
def removed_if_start_fails(run_dir, made: bool, kept: tuple[type[BaseException], ...] = ()):
    """Remove `run_dir` (made by this process, `made`) when the block fails before any checkpoint
    was written, so a failed start leaves no half-made run directory; not for the errors `kept`
    (`rl train`'s: Ctrl-C or SIGTERM, whose message offers --resume; a divergence, whose metrics
    show it; a write error, after which what was written stays; a directory another process holds).
    """
    try:
        yield
    except Exception as err:
        if made and not isinstance(err, kept) and not holds_checkpoints(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
