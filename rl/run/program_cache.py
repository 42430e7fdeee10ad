"""A run's compiled programs kept whole, by what they are built from: a second `rl train` of an
unchanged config, and a resume, load `init` and the log point's program without tracing or
lowering them (JAX's persistent cache, rl.run.compile_cache, still traces and lowers a program to
find its entry). On GPUs only (`PLATFORMS`). An entry's key (`program_key`) hashes everything the
traced program depends on; loading one runs code from it, so only entries this user wrote are read.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import pickle
import re
from pathlib import Path

import jax

from rl.run.run_dir import RESUMABLE_KEYS

PACKAGES = ("envs", "kernels", "rl")
# libraries whose version can change a traced program (those not installed are recorded as such)
LIBRARIES = (
    "jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "flax", "optax", "chex", "numpy",
    "triton", "jax-triton", "dm-haiku", "gymnax", "brax", "mujoco", "mujoco-mjx", "craftax",
    "jumanji", "jaxmarl", "distrax", "playground",
)  # fmt: skip
ENV_PREFIXES = ("XLA_", "JAX_", "TRITON_", "FUSEDRL_", "CUDA_", "NVIDIA_")
HOST_ONLY_ENV = ("FUSEDRL_COMPILATION_CACHE", "FUSEDRL_SMOKE_LOG_POINTS")


# where whole programs are kept: XLA's GPU executables serialise whole; the CPU's may not (an op
# without serialisation, or a program loaded from JAX's cache that loses its compiled functions)
PLATFORMS = ("cuda", "rocm")


def kept_on(device) -> bool:
    """Whether a run on `device` keeps its whole compiled programs (`PLATFORMS`)."""
    return device.platform in PLATFORMS


def program_key(record: dict, devices: list, shard: str) -> str:
    """The entry name of a run's programs: a SHA-256 over the run `record`
    (rl.run.run_dir.run_record) less its host-only keys, the `devices` and `shard`, and
    `environment_digest()`."""
    computed = {
        section: {k: v for k, v in values.items() if f"{section}.{k}" not in HOST_ONLY_KEYS}
        if isinstance(values, dict)
        else values
        for section, values in record.items()
    }
    text = json.dumps(
        {
            "record": computed,
            "devices": [(d.platform, d.device_kind, d.id, d.process_index) for d in devices],
            "shard": shard,
            "environment": environment_digest(),
        },
        sort_keys=True,
        default=repr,
    )
    return "program-" + hashlib.sha256(text.encode()).hexdigest()


HOST_ONLY_KEYS = frozenset(RESUMABLE_KEYS) | {"run.seed"}


def environment_digest() -> str:
    """SHA-256 of what else a traced program depends on: `source_digest()`, the `LIBRARIES`'
    versions, JAX's settings and the environment variables under `ENV_PREFIXES`."""
    settings = {
        name: repr(value)
        for name, value in jax.config.values.items()
        if "cache" not in name  # where caches live, not what is compiled
    }
    variables = {
        name: value
        for name, value in os.environ.items()
        if name.startswith(ENV_PREFIXES) and name not in HOST_ONLY_ENV
    }
    text = json.dumps([source_digest(), library_versions(), settings, variables], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding envs/, kernels/ and rl/


def source_files() -> list[Path]:
    """The `.py` files of the envs, kernels and rl packages, sorted."""
    return [path for package in PACKAGES for path in sorted((SOURCE_ROOT / package).rglob("*.py"))]


@functools.cache
def source_digest() -> str:
    """SHA-256 of the `.py` files of the envs, kernels and rl packages (names and contents)."""
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(str(path.relative_to(SOURCE_ROOT)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.cache
def library_versions() -> dict:
    """{distribution: version, or None when it is not installed} for `LIBRARIES`."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def serialise(compiled: list) -> bytes:
    """The bytes of the compiled programs `compiled` (jax `Compiled`); raises what JAX raises for
    a program it cannot serialise."""
    from jax.experimental import serialize_executable

    return pickle.dumps([serialize_executable.serialize(program) for program in compiled])


def deserialise(data: bytes) -> list:
    """The compiled programs `serialise` wrote, loaded onto this process's devices. The CPU's
    LAPACK kernels (a program's QR, for orthogonal init) are bound first: JAX binds them when it
    lowers a program that calls them, and a loaded program is not lowered."""
    from jax.experimental import serialize_executable

    _bind_lapack()
    return [
        serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        for payload, in_tree, out_tree in pickle.loads(data)
    ]


def _bind_lapack() -> None:
    """Bind jaxlib's LAPACK kernels to their custom-call targets, as lowering a linalg op does."""
    from jax._src.lax import linalg

    initialize = getattr(linalg, "initialize_lapack", None)
    if initialize is not None:
        initialize()


def load(files, key: str) -> list | None:
    """The programs stored under `key` in `files` (a rl.run.compile_cache.CheckedFileCache), or
    None: no entry, an entry this user did not write (skipped), or one that does not load (one
    warning line; the entry is removed and the run compiles)."""
    path = files.entry(key)
    try:
        if path.stat().st_uid != os.getuid():
            return None
    except (FileNotFoundError, AttributeError):  # no entry; no owners on this platform
        return None
    except OSError:
        return None
    data = files.get(key)
    if data is None:
        return None
    try:
        return deserialise(data)
    except Exception as err:  # noqa: BLE001 - any failure to load means: compile instead
        files.stats.hits -= 1
        files.stats.warn(
            f"compilation cache {files._path}: a stored program did not load "
            f"({type(err).__name__}); compiling it again"
        )
        path.unlink(missing_ok=True)
        return None


def store(files, key: str, lowered: list, compiled: list) -> str:
    """Keep `compiled` (the compiles of `lowered`) under `key` in `files`, and say what happened:
    "stored", or why not: a program calls a custom-call target that a fresh process would not have
    bound before it runs the program (`loadable_targets`), or JAX cannot serialise it (the run
    then keeps only JAX's own entries)."""
    targets = set().union(*(custom_call_targets(program) for program in lowered))
    if not loadable_targets(targets):
        unbound = sorted(t for t in targets if not loadable_targets({t}))
        return f"not kept: calls {', '.join(unbound)}"
    try:
        data = serialise(compiled)
    except Exception as err:  # noqa: BLE001 - e.g. an op XLA cannot serialise
        return f"not kept: {type(err).__name__}: {str(err)[:200]}"
    files.put(key, data)
    return "stored"


def custom_call_targets(lowered) -> set[str]:
    """The custom-call targets the lowered program `lowered` (its StableHLO text) calls."""
    found = re.findall(r'custom_call @([\w$.]+)|call_target_name = "([^"]+)"', lowered.as_text())
    return {called or named for called, named in found}


# custom-call targets bound in a fresh process before a loaded program runs: XLA's own, jaxlib's
# GPU libraries and Triton launcher (bound when jax is imported) and LAPACK (`_bind_lapack`)
BOUND_TARGETS = ("Sharding", "SPMD", "LayoutConstraint", "annotate_device_placement", "__")
BOUND_PREFIXES = ("lapack_", "cu", "hip", "triton_kernel_call")


def loadable_targets(targets: set) -> bool:
    """Whether every custom-call target in `targets` is bound before a loaded program runs."""
    return all(name.startswith(BOUND_TARGETS + BOUND_PREFIXES) for name in targets)
