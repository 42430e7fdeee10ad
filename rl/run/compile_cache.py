"""JAX's persistent compilation cache for a run: a second `rl train` of the same config, and a
resume, load the compiled programs from disk instead of compiling them (`compilation_cache`,
`run.compilation_cache`). A cache that fails never stops a run: it warns in one line and the
program compiles as without it. The cache is trusted code: share its directory with no one you
would not let run programs on your machine (JAX's own warning).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import jax

ENV_VAR = "FUSEDRL_COMPILATION_CACHE"
_MAGIC = b"fusedrl-cache-1\n"
_DIGEST_BYTES = 32
_LOCK = threading.RLock()  # one run's cache at a time within a process


def cache_directory(setting: str | bool) -> Path | None:
    """The cache directory `setting` (`run.compilation_cache`) names, or None for "off": "auto"
    reads the environment variable FUSEDRL_COMPILATION_CACHE ("off", or a directory), else the
    per-user `$XDG_CACHE_HOME/fusedrl/jax` (`~/.cache/fusedrl/jax`); any other value is the
    directory, whose entries live in a subfolder per jax, jaxlib, platform and device kind. YAML
    reads an unquoted `off` as false (and `on` as true): false is "off", true is "auto"."""
    if setting is True:
        setting = "auto"
    if setting is False:
        return None
    if setting == "auto":
        setting = os.environ.get(ENV_VAR, "").strip() or "auto"
    if setting == "off":
        return None
    if setting != "auto":
        return Path(setting).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fusedrl" / "jax"


def platform_folder() -> str:
    """`jax-<version>_jaxlib-<version>_<platform>-<device kind>`: the subfolder of this process's
    entries (a file-name-safe string)."""
    import jaxlib

    device = jax.devices()[0]
    text = (
        f"jax-{jax.__version__}_jaxlib-{jaxlib.__version__}_{device.platform}-{device.device_kind}"
    )
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text)


@dataclass
class CacheStats:
    """What the cache did inside one `compilation_cache` block: its `directory` (None when off),
    the programs loaded (`hits`) and compiled and written (`misses`), and the `warnings` printed."""

    directory: Path | None = None
    hits: int = 0
    misses: int = 0
    warnings: list[str] = field(default_factory=list)
    files: "CheckedFileCache | None" = None  # the entries' folder (None when off)

    def warn(self, message: str) -> None:
        """Print `message` as one warning line on stderr, once per distinct message."""
        if message not in self.warnings:
            self.warnings.append(message)
            print(f"rl: warning: {message}", file=sys.stderr, flush=True)


class CheckedFileCache:
    """JAX's cache interface (`get(key) -> bytes | None`, `put(key, bytes)`) over one directory:
    each entry is a header, the SHA-256 of the value and the value, written to a temporary file
    and renamed into place. An entry whose digest does not match is reported once, removed, and
    read as a miss; a write that fails is reported once and writes stop for the rest of the run."""

    def __init__(self, directory: Path, stats: CacheStats):
        self._path = directory
        self.stats = stats
        self.writable = True

    def entry(self, key: str) -> Path:
        return self._path / f"{key}-cache"

    def get(self, key: str) -> bytes | None:
        path = self.entry(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            self.stats.warn(
                f"compilation cache {self._path} cannot be read ({err.strerror}); compiling instead"
            )
            return None
        digest, value = (
            data[len(_MAGIC) : len(_MAGIC) + _DIGEST_BYTES],
            data[len(_MAGIC) + _DIGEST_BYTES :],
        )
        if not data.startswith(_MAGIC) or hashlib.sha256(value).digest() != digest:
            self.stats.warn(
                f"compilation cache {self._path} holds a damaged entry; compiling that program "
                "again and replacing it"
            )
            try:
                path.unlink()
            except OSError:
                pass
            return None
        self.stats.hits += 1
        return value

    def put(self, key: str, value: bytes) -> None:
        if not self.writable:
            return
        self.stats.misses += 1
        data = _MAGIC + hashlib.sha256(value).digest() + value
        temporary = None
        try:
            with tempfile.NamedTemporaryFile(
                dir=self._path, prefix=".writing-", delete=False
            ) as handle:
                temporary = handle.name
                handle.write(data)
            os.replace(temporary, self.entry(key))
        except OSError as err:
            self.writable = False
            self.stats.warn(
                f"compilation cache {self._path} cannot be written ({err.strerror}); this run "
                "compiles without storing its programs"
            )
            if temporary is not None:
                try:
                    os.unlink(temporary)
                except OSError:
                    pass

    def clear(self) -> None:
        for path in self._path.glob("*-cache"):
            path.unlink(missing_ok=True)


def _usable_directory(directory: Path, stats: CacheStats) -> Path | None:
    """`directory`'s subfolder for this process (made if needed), or None with one warning line
    when it cannot be made or written."""
    folder = directory / platform_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError as err:
        stats.warn(
            f"compilation cache {directory} cannot be used ({err.strerror or err}); compiling "
            f"without it (set run.compilation_cache or {ENV_VAR} to another directory, or off)"
        )
        return None
    return folder


@contextmanager
def compilation_cache(setting: str = "auto"):
    """Within the block, JAX compiles through the persistent cache `setting` names
    (`cache_directory`); yields the block's `CacheStats`. JAX's cache settings are restored on
    exit."""
    stats = CacheStats()
    directory = cache_directory(setting)
    folder = _usable_directory(directory, stats) if directory is not None else None
    if folder is None:
        with _jax_cache(None):
            yield stats
        return
    stats.directory = folder
    stats.files = CheckedFileCache(folder, stats)
    with _jax_cache(stats.files):
        yield stats


@contextmanager
def _jax_cache(cache):
    """Point JAX's persistent compilation cache at `cache` (None: no persistent cache) for the
    block, every program cached however short its compile; JAX's settings come back after."""
    from jax._src import compilation_cache as jax_cache

    names = (
        "jax_enable_compilation_cache",
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    with _LOCK:
        previous = {name: getattr(jax.config, name) for name in names}
        try:
            jax_cache.reset_cache()
            if cache is None:
                jax.config.update("jax_enable_compilation_cache", False)
            else:
                jax.config.update("jax_enable_compilation_cache", True)
                jax.config.update("jax_compilation_cache_dir", str(cache._path))
                jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
                jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
                _install(jax_cache, cache)
            yield
        finally:
            jax_cache.reset_cache()
            for name, value in previous.items():
                jax.config.update(name, value)


def _install(jax_cache, cache) -> None:
    """Make `cache` the persistent cache JAX reads and writes (its module's `_cache`). A JAX whose
    module keeps it elsewhere uses its own file cache in the same folder instead (no digests)."""
    mutex = getattr(jax_cache, "_cache_initialized_mutex", None)
    if mutex is None or not hasattr(jax_cache, "_cache"):
        return
    with mutex:
        jax_cache._cache = cache
        jax_cache._cache_initialized = True
