"""The persistent compilation cache of `rl train` (rl.run.compile_cache) and the one training
program of a run (rl.run.train): one compile whatever the chunks, a second run and a resume that
load every program, bit-identical results with the cache on and off, and a cache that fails without
stopping the run (one warning line)."""

from __future__ import annotations

import errno
import json

import jax
import numpy as np
import pytest
from run_helpers import TINY, final_params, run_signalled, subprocess_env, write_config

from rl.config import build_config
from rl.config.parsing import apply_overrides
from rl.run import compile_cache
from rl.run.compile_cache import CacheStats, CheckedFileCache, compilation_cache
from rl.run.train import run_training


def tiny(tmp_path, name: str, cache, **run) -> tuple:
    """(config, run directory) of the tiny Q-learning run `name` whose cache setting is `cache`."""
    data = json.loads(json.dumps(TINY))
    data["run"].update(compilation_cache=str(cache), **run)
    run_dir = tmp_path / name
    run_dir.mkdir()
    return build_config(data), run_dir


def compiles_during(fn) -> list[str]:
    """The names of the programs XLA compiled (or loaded from a cache) while `fn()` ran."""
    names = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            names.append(kwargs.get("fun_name", "?"))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        fn()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return names


@pytest.mark.parametrize(
    "total_steps, log_interval, checkpoint_every", [(20_000, 1_000, 4), (7_000, 1_000, 3)]
)
def test_a_run_compiles_each_program_once_whatever_its_chunks(
    tmp_path, total_steps, log_interval, checkpoint_every
):
    data = json.loads(json.dumps(TINY))
    data["agent"].update(total_steps=total_steps, log_interval=log_interval)
    data["run"].update(checkpoint_every=checkpoint_every, compilation_cache="off")
    (tmp_path / "run").mkdir()
    names = compiles_during(lambda: run_training(build_config(data), [{}], tmp_path / "run"))
    # the runner's programs (init, the log points'), each once; the rest are small helpers
    assert names.count("jit(log_points)") == 1 and names.count("jit(init)") == 1, names


def test_a_second_run_and_a_resume_load_every_program_from_the_cache(tmp_path, capsys):
    cache = tmp_path / "cache"
    config, first = tiny(tmp_path, "first", cache)
    run_training(config, [{}], first)
    capsys.readouterr()
    config, second = tiny(tmp_path, "second", cache)
    summary = run_training(config, [{}], second)
    assert summary["programs_from_cache"]
    assert "rl: warning" not in capsys.readouterr().err
    config, off = tiny(tmp_path, "off", "off")
    assert not run_training(config, [{}], off)["programs_from_cache"]
    for run_dir in (second, off):  # bit-identical whichever way the programs came
        jax.tree.map(np.testing.assert_array_equal, final_params(run_dir), final_params(first))
    # in processes of their own (their programs lower alike: the same environment): a whole run
    # fills a cache, a run stopped by Ctrl-C and its resume load from it and end where it ended
    config_path = write_config(
        tmp_path, compilation_cache=str(tmp_path / "cli-cache"), progress=True
    )
    whole = run_subprocess(["train", config_path, "--name", "whole"])
    assert "rl: compiled in" in whole.stderr
    stopped = run_signalled(["train", config_path, "--name", "cut"], 9_000, "SIGINT")
    assert stopped.returncode == 130, stopped.stderr[-2000:]
    assert "loaded the compiled programs from the cache" in stopped.stderr
    resumed = run_subprocess(["train", "--resume", tmp_path / "runs" / "cut"])
    assert "loaded the compiled programs from the cache" in resumed.stderr
    jax.tree.map(
        np.testing.assert_array_equal,
        final_params(tmp_path / "runs" / "cut"),
        final_params(tmp_path / "runs" / "whole"),
    )


def run_subprocess(args):
    """`rl ARGS` in a process of its own, which must succeed."""
    import subprocess
    import sys

    from run_helpers import REPO

    done = subprocess.run(
        [sys.executable, "-m", "rl.cli.main", *map(str, args)],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_damaged_entries_give_one_warning_and_are_replaced(tmp_path, capsys):
    cache = tmp_path / "cache"
    config, first = tiny(tmp_path, "first", cache)
    run_training(config, [{}], first)
    entries = list(cache.glob("*/*-cache"))
    assert entries
    for entry in entries:  # a bit flipped in each, one cut short
        data = bytearray(entry.read_bytes())
        data[-1] ^= 1
        entry.write_bytes(bytes(data[: len(data) - (entry == entries[0])]))
    capsys.readouterr()
    config, second = tiny(tmp_path, "second", cache)
    assert not run_training(config, [{}], second)["programs_from_cache"]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "damaged entry" in warnings[0]
    jax.tree.map(np.testing.assert_array_equal, final_params(second), final_params(first))
    config, third = tiny(tmp_path, "third", cache)
    assert run_training(config, [{}], third)["programs_from_cache"]


def test_a_cache_that_cannot_be_made_gives_one_warning_and_the_run_compiles(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config, run_dir = tiny(tmp_path, "run", blocker / "cache")
    capsys.readouterr()
    assert not run_training(config, [{}], run_dir)["programs_from_cache"]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and str(blocker / "cache") in warnings[0]
    assert (run_dir / "final_params.msgpack").exists()


def test_a_full_disk_stops_the_writes_with_one_warning(tmp_path, monkeypatch, capsys):
    stats = CacheStats(directory=tmp_path)
    cache = CheckedFileCache(tmp_path, stats)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(compile_cache.tempfile, "NamedTemporaryFile", full)
    cache.put("a", b"x" * 10)
    cache.put("b", b"y" * 10)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err
    assert not cache.writable and list(tmp_path.iterdir()) == []


def test_entries_round_trip_and_a_damaged_one_reads_as_a_miss(tmp_path, capsys):
    stats = CacheStats(directory=tmp_path)
    cache = CheckedFileCache(tmp_path, stats)
    cache.put("key", b"compiled program")
    assert cache.get("key") == b"compiled program" and cache.get("other") is None
    entry = cache.entry("key")
    entry.write_bytes(entry.read_bytes()[:-3])
    assert cache.get("key") is None and not entry.exists()
    assert capsys.readouterr().err.count("rl: warning:") == 1
    assert not list(tmp_path.glob(".writing-*"))  # no temporary file left behind


def test_entries_of_another_jax_jaxlib_or_device_live_apart():
    import jaxlib

    folder = compile_cache.platform_folder()
    device = jax.devices()[0]
    assert jax.__version__ in folder and jaxlib.__version__ in folder
    assert device.platform in folder and device.device_kind.replace(" ", "-") in folder


def test_the_setting_and_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(compile_cache.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.cache_directory("auto") == tmp_path / "fusedrl" / "jax"
    assert compile_cache.cache_directory("off") is None
    assert compile_cache.cache_directory(str(tmp_path / "c")) == tmp_path / "c"
    monkeypatch.setenv(compile_cache.ENV_VAR, "off")
    assert compile_cache.cache_directory("auto") is None
    assert compile_cache.cache_directory(str(tmp_path / "c")) == tmp_path / "c"
    monkeypatch.setenv(compile_cache.ENV_VAR, str(tmp_path / "env"))
    assert compile_cache.cache_directory("auto") == tmp_path / "env"


@pytest.mark.parametrize("word, off", [("off", True), ("false", True), ("on", False)])
def test_yaml_reads_an_unquoted_off_as_false_and_that_is_off(tmp_path, monkeypatch, word, off):
    monkeypatch.delenv(compile_cache.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    data = json.loads(json.dumps(TINY))
    config = build_config(apply_overrides(data, [f"run.compilation_cache={word}"]))
    expected = None if off else tmp_path / "fusedrl" / "jax"
    assert compile_cache.cache_directory(config.run.compilation_cache) == expected


def test_jax_settings_come_back_after_the_block(tmp_path):
    before = jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache
    with compilation_cache(str(tmp_path)) as stats:
        assert stats.directory is not None
        jax.jit(lambda x: x * 3.0)(np.float32(2.0)).block_until_ready()
    assert (jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache) == before
    assert stats.misses == 1 and list(stats.directory.glob("*-cache"))


@pytest.mark.slow  # the test above already runs rl train in processes of their own
def test_the_cli_run_in_a_subprocess_loads_its_programs_the_second_time(tmp_path):
    config = write_config(tmp_path, compilation_cache=str(tmp_path / "cache"), progress=True)
    errs = [run_subprocess(["train", config, "--name", name]).stderr for name in ("one", "two")]
    assert "rl: compiled in" in errs[0]
    assert "rl: loaded the compiled programs from the cache" in errs[1]


def test_the_summary_says_what_became_of_the_whole_programs(tmp_path):
    cache = tmp_path / "cache"
    config, first = tiny(tmp_path, "first", cache)
    outcome = run_training(config, [{}], first)["whole_programs"]
    config, second = tiny(tmp_path, "second", cache)
    again = run_training(config, [{}], second)["whole_programs"]
    platform = jax.devices()[0].platform
    if compile_cache_keeps_whole_programs(platform):
        assert outcome == "stored" or outcome.startswith("not kept: "), outcome
        assert again == ("loaded" if outcome == "stored" else outcome)
    else:
        assert outcome == again == f"not kept on {platform}"
    config, off = tiny(tmp_path, "off", "off")
    assert run_training(config, [{}], off)["whole_programs"] is None


def compile_cache_keeps_whole_programs(platform: str) -> bool:
    from rl.run.program_cache import PLATFORMS

    return platform in PLATFORMS
