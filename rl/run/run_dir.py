"""A run directory: the files `rl train` writes into it, and reading them back (`rl eval`,
`rl train --resume`):
    config.yaml                 the resolved config and the sweep grid (`sweep`: a list of settings)
    metrics.jsonl, metrics.csv  one row per setting, seed and log point (rl.run.logging.RunLogger)
    tensorboard/                event files, setting_<s>/seed_<i>/
    checkpoints/<step>/         the training state every `run.checkpoint_every` log points
    final_params.msgpack        the final params, leading axes [settings, seeds] (`load_params`)
    summary.json, .rl-train.lock   the CLI's end-of-run summary; held by the `rl train` writing it
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path

import jax
import numpy as np
import yaml
from flax import serialization

from rl.config import Config, build_from_file
from rl.config.parsing import ConfigError, read_yaml
from rl.run.checkpoint import (
    CheckpointDamagedError,
    CheckpointError,
    CheckpointMismatchError,
    Checkpoints,
    abstract_for_storage,
    abstract_like,
)
from rl.run.checkpoint_integrity import signature_difference, state_signature
from rl.run.distributed import seed_mesh
from rl.run.programs import make_programs
from rl.run.run_files import (
    check_inside,
    check_run_dir,
    open_no_follow,
    read_final_params,
    saved_grid,
    write_atomic,
)

CONFIG_FILE = "config.yaml"
FINAL_PARAMS_FILE = "final_params.msgpack"
SUMMARY_FILE = "summary.json"
LOCK_FILE = ".rl-train.lock"


class RunDirInUseError(ConfigError):
    """Another process is training into the run directory (it holds LOCK_FILE)."""


@contextlib.contextmanager
def run_dir_lock(run_dir):
    """Hold an exclusive lock on `RUN_DIR/LOCK_FILE` (flock; released by the OS when the process
    ends, however it ends) while the block runs; RunDirInUseError at once if another process holds
    it. Where flock is missing (Windows) the block runs unlocked, and where the filesystem refuses
    it, unlocked after a warning. First, ConfigError where the run directory holds a symbolic link
    where fusedrl writes (rl.run.run_files.check_run_dir)."""
    check_run_dir(run_dir)
    try:
        import fcntl
    except ImportError:
        yield
        return
    path = Path(run_dir) / LOCK_FILE
    with open_no_follow(path, "r+", truncate=False) as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise RunDirInUseError(
                f"run directory {str(run_dir)!r} is in use by another rl train (process "
                f"{holder}); wait for it to end or stop it, then --resume"
            ) from None
        except OSError as err:  # a filesystem without flock (some NFS, FUSE, Lustre mounts)
            print(
                f"rl: warning: cannot lock {path} ({err.strerror or err}): nothing stops a second "
                "rl train from writing this run directory at the same time",
                file=sys.stderr,
            )
            yield
            return
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_run_config(run_dir: Path, config: Config, grid: list[dict]) -> None:
    """`config.yaml`: the resolved config with the sweep grid under `sweep`."""
    write_atomic(
        Path(run_dir) / CONFIG_FILE, yaml.safe_dump(run_record(config, grid), sort_keys=False)
    )


def load_run_config(run_dir) -> tuple[Config, list[dict]]:
    """The resolved config and sweep grid a run directory was trained with (ConfigError if
    missing)."""
    path = Path(run_dir) / CONFIG_FILE
    if not Path(run_dir).is_dir():
        raise ConfigError(f"run directory {str(run_dir)!r} does not exist")
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} does not exist: is {str(run_dir)!r} a run directory?")
    data = read_yaml(check_inside(run_dir, path, "the run's config"))
    grid = data.pop("sweep", None) or [{}]
    try:
        config = build_from_file(data, path)
    except ConfigError as err:  # the saved file is the culprit: name it
        if str(path) in str(err):
            raise
        raise ConfigError(f"{str(path)!r}: {err}") from None
    return config, saved_grid(grid, config, path)


# Keys of a run's config that --resume may find changed: where and how the run is written and
# shown, not what it computes.
RESUMABLE_KEYS = (
    "run.output_dir",
    "run.name",
    "run.progress",
    "run.checkpoint_every",
    "run.keep_checkpoints",
    "run.wandb",
    "run.compilation_cache",
)


def run_record(config: Config, grid: list[dict]) -> dict:
    """The config and sweep grid as stored in config.yaml and in each checkpoint's meta."""
    return {**config.to_dict(), "sweep": grid}


_UNSET = object()


def _same(a, b) -> bool:
    """Equal config values, NaN equal to NaN (as JSON text)."""
    if a is _UNSET or b is _UNSET:
        return a is b
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _flatten(tree, prefix: str = "") -> dict:
    """{dotted key: leaf value} of a nested dict (an empty dict is a leaf)."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def config_difference(saved: dict, current: dict) -> str | None:
    """The first key (dotted) whose value differs between the run record a checkpoint was written
    with and the current one, ignoring RESUMABLE_KEYS, as a phrase; None if they agree."""
    saved, current = _flatten(saved), _flatten(current)
    for key in list(current) + [k for k in saved if k not in current]:
        resumable = any(key == k or key.startswith(f"{k}.") for k in RESUMABLE_KEYS)
        if resumable or _same(saved.get(key, _UNSET), current.get(key, _UNSET)):
            continue
        was = repr(saved[key]) if key in saved else "not set"
        now = repr(current[key]) if key in current else "not set"
        return f"{key} is {now} in config.yaml, {was} when the checkpoint was written"
    return None


def config_check(config: Config, grid: list[dict]):
    """`check_meta` for rl.run.checkpoint's restores: a message when a checkpoint was written with
    another config than `config` and `grid` (checkpoints without a recorded config pass)."""
    current = json.loads(json.dumps(run_record(config, grid)))

    def check(meta: dict) -> str | None:
        """The difference of `meta["config"]` from the run's config, as the error's text."""
        if "config" not in meta:
            return None
        difference = config_difference(meta["config"], current)
        if difference is None:
            return None
        return (
            f"the run's config.yaml was changed after this checkpoint was written: {difference}. "
            "--resume continues a run with the config it was started with: put config.yaml back, "
            "or start a new run with the changed config. Nothing was moved"
        )

    return check


def check_resume_config(run_dir, config: Config, grid: list[dict]) -> None:
    """Before anything compiles for `rl train --resume`: CheckpointMismatchError if the newest
    checkpoint whose metadata reads was written with another config than the run's config.yaml
    now holds (`config_check`). Reads only metadata; damaged checkpoints are left to the restore."""
    # (a linked step is reported once, by the run that moves it aside)
    checkpoints = Checkpoints(run_dir, read_only=True, warn=lambda message: None)
    check = config_check(config, grid)
    for step in reversed(checkpoints.steps()):
        try:
            meta = checkpoints.read_meta(step)
        except (OSError, ValueError, KeyError, CheckpointError):  # damaged: the restore says so
            continue
        problem = check(meta)
        if problem is not None:
            raise CheckpointMismatchError(
                f"checkpoint {checkpoints.directory / str(step)}: {problem}"
            )
        return


def write_metrics_jsonl(path: Path, metrics: dict, grid: list[dict]) -> None:
    """One JSON object per (setting, seed, log point) with every scalar metric."""
    arrays = {k: np.asarray(v) for k, v in metrics.items()}
    num_settings, num_seeds, num_points = arrays["step"].shape[:3]
    with open_no_follow(path, "w") as f:
        for s in range(num_settings):
            for seed in range(num_seeds):
                for t in range(num_points):
                    row = {"setting": s, "seed": seed}
                    row.update(
                        {k: _json_number(v[s, seed, t]) for k, v in arrays.items() if v.ndim == 3}
                    )
                    f.write(json.dumps(row) + "\n")


def _json_number(value):
    value = value.item()
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_final(run_dir: Path, params, summary: dict) -> None:
    """`final_params.msgpack` (the host params, leading axes [settings, seeds]) and
    `summary.json`."""
    run_dir = Path(run_dir)
    write_atomic(run_dir / FINAL_PARAMS_FILE, serialization.msgpack_serialize(params))
    write_atomic(run_dir / SUMMARY_FILE, json.dumps(summary, indent=2))


def load_params(
    run_dir, config: Config, grid: list[dict], checkpoint: int | None = None, state_shapes=None
):
    """(params with leading axes [settings, seeds], description of where they came from): from
    `final_params.msgpack`, or from the checkpoint at env step `checkpoint`, or (a run that was
    stopped before the end) from the newest checkpoint. ConfigError when there are none.
    `state_shapes`: the run's training state as ShapeDtypeStructs with those leading axes, which
    the files are read into; by default the one-program agent's (`rl.run.programs.make_programs`),
    an actor-learner run's from its learner (rl.cli.evaluate).

    The params are read as the files hold them (`params_as_stored`): a run trained through the
    fused kernels (rl.fused.q, rl.fused.critic: a kernel backend that runs Triton) keeps its
    Q-network, or its critics, and their Adam moments as flat vectors, which the same config
    builds as trees where the kernels do not run (or the other way): its checkpoints are then read
    as stored (`params_only`) and only their params kept."""
    run_dir = Path(run_dir)
    if state_shapes is None:
        mesh = seed_mesh(jax.devices()[:1])
        _, init, _, keys, hparams = make_programs(config, grid, mesh)
        state_shapes = jax.eval_shape(init, keys, hparams)
    abstract_state = abstract_like(
        state_shapes, jax.sharding.SingleDeviceSharding(jax.devices()[0])
    )
    final = run_dir / FINAL_PARAMS_FILE
    if checkpoint is None and final.is_file():
        stored = read_final_params(run_dir)
        return params_as_stored(abstract_state.params, stored, str(final)), str(final)
    checkpoints = Checkpoints(run_dir, read_only=True)
    steps = checkpoints.steps()
    if checkpoint is not None and checkpoint not in steps:
        raise ConfigError(
            f"--checkpoint {checkpoint}: no such checkpoint in "
            f"{str(checkpoints.directory)!r}; available steps: "
            f"{', '.join(map(str, steps)) or 'none'}"
        )
    check = config_check(config, grid)
    # each checkpoint read into what it holds: a fallback past a damaged newest one decides anew
    target_of = lambda step: (
        None if params_only(checkpoints, step, abstract_state) else abstract_state
    )
    if checkpoint is None:
        restored = checkpoints.restore_latest(
            abstract_state, with_history=False, check_meta=check, target_of=target_of
        )
        if restored is None:
            raise ConfigError(f"{str(run_dir)!r} has neither final_params.msgpack nor a checkpoint")
        step, state, _, _ = restored
    else:
        step = checkpoint
        try:
            state, _, _ = checkpoints.restore(
                step, target_of(step), with_history=False, check_meta=check
            )
        except CheckpointDamagedError as err:
            raise ConfigError(
                f"checkpoint {checkpoints.directory / str(step)} is damaged ({err}); choose "
                "another --checkpoint"
            ) from None
    source = str(checkpoints.directory / str(step))
    if target_of(step) is None:  # it was read as stored
        return params_as_stored(abstract_state.params, state["params"], source), source
    return state.params, source


def params_only(checkpoints: Checkpoints, step: int, abstract_state) -> bool:
    """Whether checkpoint `step` is read as stored and only its params kept: the state it holds
    differs from `abstract_state` (what this config builds) while its params fit (`_params_fit`),
    as a run's does where it ran the fused kernels and this config, where they do not run, builds
    its networks and their optimiser state as trees (or the other way). False where its metadata
    cannot be read (the restore reports the damage) or records no signature."""
    try:
        stored = checkpoints.read_meta(step).get("state_signature")
    except (OSError, ValueError, KeyError, CheckpointError):
        return False
    expected = state_signature(abstract_for_storage(abstract_state))
    if stored is None or signature_difference(stored, expected) is None:
        return False
    return _params_fit(_params_part(stored), _params_part(expected))


def _params_part(signature: dict[str, str]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{leaf path: (dtype, shape)} of the params' leaves (`state.params...`) of a state
    signature (`rl.run.checkpoint_integrity.state_signature`: "float32[1, 2, 3]")."""
    part = {}
    for path, spec in signature.items():
        if path == ".params" or path.startswith((".params.", ".params[")):
            dtype, dims = spec.rstrip("]").split("[")
            part[path] = dtype, tuple(int(d) for d in dims.split(",") if d.strip())
    return part


def _params_fit(stored: dict, expected: dict) -> bool:
    """Whether params of these leaves ({path: (dtype, shape)}) hold the same numbers: the same
    leaves, or, on one side, one vector [settings, seeds, size] (a fused network's, rl.fused.q)
    of the dtype and per-seed size of the other side's leaves."""
    if not stored or not expected:  # a state without params: nothing to read as stored
        return False
    if stored == expected:
        return True
    flat, tree = (stored, expected) if list(stored) == [".params"] else (expected, stored)
    if list(flat) != [".params"] or not tree:
        return False
    (dtype, shape), leaves = flat[".params"], tree.values()
    return (
        len(shape) == 3
        and all(d == dtype and s[:2] == shape[:2] for d, s in leaves)
        and sum(int(np.prod(s[2:])) for _, s in leaves) == shape[2]
    )


def params_as_stored(target, stored, source: str):
    """`stored`, params as a file holds them (read without a target: nested dicts and lists of
    arrays), in the structure of `target` (the params this config builds, leading axes [settings,
    seeds]); where one side is one vector [settings, seeds, size] and the other a tree of as many
    numbers per seed (a run trained through the fused Q-network, rl.fused.q, evaluated where its
    kernels do not run, or the other way), `stored` as it is: the agent's policy reads either
    (`rl.fused.q.as_tree`). ConfigError naming `source` where the shapes (both trees or both
    vectors) or the numbers per seed differ."""
    is_array = lambda x: isinstance(x, (np.ndarray, jax.Array, jax.ShapeDtypeStruct))
    if is_array(stored) == is_array(target):
        stored_shapes, built_shapes = _leaf_shapes(stored), _leaf_shapes(target)
        if stored_shapes != built_shapes:
            differ = sorted(set(stored_shapes.items()) ^ set(built_shapes.items()))[0][0]
            where = differ or "the params"
            stored_shape = stored_shapes.get(differ, "absent")
            built_shape = built_shapes.get(differ, "absent")
            raise ConfigError(
                f"{source}: its params differ from the ones this config builds at {where} "
                f"({stored_shape} stored, {built_shape} built): was the run's agent.network or "
                "env changed in config.yaml?"
            )
        return serialization.from_state_dict(target, stored)
    per_seed = lambda tree: sum(int(np.prod(x.shape[2:])) for x in jax.tree.leaves(tree))
    if per_seed(stored) != per_seed(target):
        raise ConfigError(
            f"{source}: its params hold {per_seed(stored)} numbers per seed, the network this "
            f"config builds {per_seed(target)}: was the run's agent.network or env changed in "
            "config.yaml?"
        )
    return jax.tree.map(np.asarray, stored)


def _leaf_shapes(params) -> dict[str, tuple[int, ...]]:
    """{leaf path: shape} of a params tree, or of one array (path "")."""
    leaves = jax.tree_util.tree_flatten_with_path(serialization.to_state_dict(params))[0]
    return {jax.tree_util.keystr(path): tuple(np.shape(leaf)) for path, leaf in leaves}
