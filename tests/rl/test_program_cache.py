"""Whole compiled programs kept by what they are built from (rl.run.program_cache): the key changes
with everything a traced program depends on and with nothing else, only programs a fresh process
can run are kept, and an entry that is damaged, foreign or does not load is never run."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import TINY

from rl.config import build_config
from rl.run import program_cache
from rl.run.compile_cache import CacheStats, CheckedFileCache
from rl.run.run_dir import run_record


def record(**changes) -> dict:
    """The run record of the tiny Q-learning config with `changes` ({"section.key": value})."""
    data = json.loads(json.dumps(TINY))
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        data[section][key] = value
    return run_record(build_config(data), [{}])


def key_of(**changes) -> str:
    return program_cache.program_key(record(**changes), jax.devices()[:1], "seeds")


def test_the_key_ignores_where_and_how_a_run_is_written_and_its_base_seed():
    base = key_of()
    assert base.startswith("program-") and base == key_of()
    for dotted, value in [
        ("run.name", "elsewhere"),
        ("run.output_dir", "/tmp/other"),
        ("run.progress", True),
        ("run.checkpoint_every", 7),
        ("run.keep_checkpoints", 9),
        ("run.compilation_cache", "off"),
        ("run.seed", 123),
    ]:
        assert key_of(**{dotted: value}) == base, dotted


def test_the_key_follows_what_the_program_computes(monkeypatch):
    base = key_of()
    assert key_of(**{"run.seeds": 3}) != base
    assert key_of(**{"agent.total_steps": 40_000}) != base
    assert key_of(**{"env.params": {"size": 6, "max_steps_in_episode": 50}}) != base
    assert program_cache.program_key(record(), jax.devices()[:1], "envs") != base
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    assert key_of() != base
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setattr(program_cache, "source_digest", lambda: "edited source")
    assert key_of() != base
    monkeypatch.undo()
    monkeypatch.setattr(program_cache, "library_versions", lambda: {"jax": "0.0.1"})
    assert key_of() != base


def test_the_source_digest_covers_every_module_of_the_packages():
    files = {
        path.relative_to(program_cache.SOURCE_ROOT).as_posix()
        for path in program_cache.source_files()
    }
    assert {
        "rl/agents/ppo.py",
        "rl/run/program_cache.py",
        "envs/core.py",
        "kernels/launch.py",
    } <= files
    assert len(files) > 120
    assert len(program_cache.source_digest()) == 64


def test_only_targets_bound_before_a_loaded_program_runs_are_kept():
    assert program_cache.loadable_targets(set())
    assert program_cache.loadable_targets(
        {"lapack_sgeqrf_ffi", "Sharding", "cusolver_getrf_ffi", "triton_kernel_call"}
    )
    assert not program_cache.loadable_targets({"lapack_sgeqrf_ffi", "my_library_kernel"})


def test_the_targets_a_lowered_program_calls():
    def orthogonal(key):
        return jnp.linalg.qr(jax.random.normal(key, (4, 4)))[0].sum()

    lowered = jax.jit(orthogonal).lower(jax.random.PRNGKey(0))
    targets = program_cache.custom_call_targets(lowered)
    if jax.default_backend() == "cpu":
        assert any(name.startswith("lapack_") for name in targets), targets
    assert program_cache.loadable_targets(targets)
    assert program_cache.custom_call_targets(jax.jit(jnp.sin).lower(1.0)) == set()


def kept_program(tmp_path):
    """(files, key, compiled): a small program compiled afresh and stored under `key`."""
    stats = CacheStats()
    files = CheckedFileCache(tmp_path, stats)
    lowered = jax.jit(lambda x: jnp.cumsum(x * 3.0)).lower(np.ones(5, np.float32))
    compiled = lowered.compile()
    outcome = program_cache.store(files, "program-test", [lowered], [compiled])
    assert outcome == "stored" or outcome.startswith("not kept: "), outcome
    return files, "program-test", compiled


def skip_unless_kept(files, key) -> None:
    """Skip where XLA could not serialise the small program: allowed only on a platform whose runs
    do not keep whole programs (the CPU); on a GPU that is a failure."""
    if files.entry(key).exists():
        return
    assert not program_cache.kept_on(jax.devices()[0]), "a GPU program was not kept"
    pytest.skip(f"XLA cannot serialise this program on {jax.default_backend()}")


def test_a_kept_program_loads_and_computes_what_it_did(tmp_path):
    files, key, compiled = kept_program(tmp_path)
    skip_unless_kept(files, key)
    (loaded,) = program_cache.load(files, key)
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(loaded(x), compiled(x))
    assert files.stats.hits == 1 and not files.stats.warnings


def test_an_entry_another_user_wrote_is_not_read(tmp_path, monkeypatch):
    files, key, _ = kept_program(tmp_path)
    skip_unless_kept(files, key)
    monkeypatch.setattr(program_cache.os, "getuid", lambda: files.entry(key).stat().st_uid + 1)
    assert program_cache.load(files, key) is None
    assert files.stats.hits == 0 and files.entry(key).exists()


def test_an_entry_that_does_not_load_gives_one_warning_and_is_removed(tmp_path, capsys):
    files = CheckedFileCache(tmp_path, CacheStats())
    files.put("program-bad", b"not a pickle of programs")
    assert program_cache.load(files, "program-bad") is None
    assert program_cache.load(files, "program-missing") is None
    (warning,) = files.stats.warnings
    assert "did not load" in warning and "compiling it again" in warning
    assert not files.entry("program-bad").exists() and files.stats.hits == 0
    assert capsys.readouterr().err.count("rl: warning") == 1


def test_a_damaged_entry_is_not_run(tmp_path):
    files, key, _ = kept_program(tmp_path)
    skip_unless_kept(files, key)
    data = bytearray(files.entry(key).read_bytes())
    data[-10] ^= 0xFF
    files.entry(key).write_bytes(bytes(data))
    assert program_cache.load(files, key) is None
    assert any("damaged entry" in w for w in files.stats.warnings)


def test_programs_with_unbound_targets_are_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(program_cache, "custom_call_targets", lambda lowered: {"unknown_kernel"})
    files, key, _ = kept_program(tmp_path)
    assert not files.entry(key).exists() and files.stats.misses == 0
    lowered = jax.jit(jnp.sin).lower(1.0)
    outcome = program_cache.store(files, key, [lowered], [lowered.compile()])
    assert outcome == "not kept: calls unknown_kernel"


def test_whole_programs_are_kept_on_gpus_only():
    class Device:
        def __init__(self, platform):
            self.platform = platform

    assert program_cache.kept_on(Device("cuda")) and program_cache.kept_on(Device("rocm"))
    assert not program_cache.kept_on(Device("cpu"))
