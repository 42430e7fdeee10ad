"""Checkpoint and resume: a run killed with SIGKILL in the middle of a chunk and resumed with
`rl train --resume` ends with exactly the params (and metrics) of an uninterrupted run; damaged or
half-written checkpoints are never used; chunked runs equal one long run."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from run_helpers import (
    NEURAL,
    final_params,
    metric_rows,
    run_cli,
    run_signalled,
    trained_run,
    write_config,
)

from rl.run.checkpoint import CheckpointMismatchError, Checkpoints, abstract_like


def assert_same_params(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_run_killed_mid_chunk_and_resumed_equals_uninterrupted_run(
    tmp_path, tmp_path_factory, capsys
):
    reference = trained_run(tmp_path_factory)  # same config, never interrupted
    config = write_config(tmp_path)
    killed = run_signalled(
        ["train", config, "--name", "killed"], signal_at=13_000, signal_name="SIGKILL"
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    run_dir = tmp_path / "runs" / "killed"
    assert not (run_dir / "final_params.msgpack").exists()
    steps = Checkpoints(run_dir, read_only=True).steps()
    assert steps and max(steps) <= 12_000 and set(steps) <= {4000, 8000, 12_000}

    # A damaged newer checkpoint (files cut short) and a leftover temporary directory must be
    # skipped.
    damaged = run_dir / "checkpoints" / "16000"
    shutil.copytree(run_dir / "checkpoints" / str(max(steps)), damaged)
    for path in (damaged / "state").rglob("*"):
        if path.is_file():
            path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 3])
    (run_dir / "checkpoints" / "20000.orbax-checkpoint-tmp-1234567").mkdir()

    capsys.readouterr()
    assert run_cli(["train", "--resume", run_dir]) == 0
    err = capsys.readouterr().err
    # one line for the damaged checkpoint (named by the file its manifest disagrees with), one for
    # the resume: no orbax traceback
    warning, resuming = err.splitlines()
    assert warning.startswith("rl: warning: checkpoint ") and "16000 is damaged (state/" in warning
    assert "bytes when written" not in warning and "when written); moved to" in warning
    assert resuming.startswith("rl: resuming from checkpoint")
    assert (run_dir / "damaged_checkpoints" / "16000").is_dir()
    assert_same_params(final_params(run_dir), final_params(reference))
    assert metric_rows(run_dir) == metric_rows(
        reference
    )  # rows written after the checkpoint were replaced
    assert Checkpoints(run_dir, read_only=True).steps()[-1] == 20_000
    # TensorBoard drops the killed process's events after the checkpoint (a purge marker at resume).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for run in (run_dir, reference):
        accumulator = EventAccumulator(str(run / "tensorboard" / "setting_0" / "seed_0"))
        accumulator.Reload()
        lengths = [(e.step, e.value) for e in accumulator.Scalars("episode_length")]
        assert [step for step, _ in lengths] == list(range(1000, 20_001, 1000))
        if run is run_dir:
            resumed = lengths
    assert resumed == lengths


def test_resume_of_a_finished_run_changes_nothing(tmp_path_factory, capsys):
    run_dir = trained_run(tmp_path_factory)
    before = (run_dir / "final_params.msgpack").read_bytes()
    capsys.readouterr()
    assert run_cli(["train", "--resume", run_dir]) == 0
    out = capsys.readouterr().out
    assert f"run {run_dir} is already complete: nothing to resume" in out and "nan" not in out
    assert (run_dir / "final_params.msgpack").read_bytes() == before


def test_resume_of_a_run_whose_last_chunk_was_saved_trains_nothing(
    tmp_path_factory, tmp_path, capsys
):
    """Every log point checkpointed but summary.json never written (killed just before the end)."""
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(trained_run(tmp_path_factory), run_dir)
    (run_dir / "summary.json").unlink()
    capsys.readouterr()
    assert run_cli(["train", "--resume", run_dir]) == 0
    out = capsys.readouterr().out
    assert "no env steps trained in this process" in out and "nan" not in out
    assert json.loads((run_dir / "summary.json").read_text())["env_steps_per_second"] is None


def test_chunked_runner_equals_one_compiled_program(tmp_path_factory):
    from rl.run.run_dir import load_run_config
    from rl.run.train import train_many

    run_dir = trained_run(tmp_path_factory)
    config, grid = load_run_config(run_dir)
    state, metrics = train_many(config, grid)
    assert_same_params(final_params(run_dir), np.asarray(state.params))
    rows = metric_rows(run_dir)
    returns = np.asarray(metrics["episode_return"])
    for row in rows:
        expected = returns[row["setting"], row["seed"], row["log_point"]]
        assert (row["episode_return"] is None and np.isnan(expected)) or row[
            "episode_return"
        ] == pytest.approx(float(expected), rel=0, abs=0)


def test_checkpoint_roundtrip_keeps_structure_and_typed_keys(tmp_path):
    from flax import struct

    @struct.dataclass
    class EnvState:
        cell: jax.Array
        time: jax.Array
        actuators: (
            jax.Array
        )  # zero-size, as a Brax pipeline state's `act` on ant: orbax cannot store it

    state = {
        "params": {"w": np.arange(12, dtype=np.float32).reshape(1, 2, 6)},
        "env_state": EnvState(
            cell=np.ones((1, 2), np.int32),
            time=np.zeros((1, 2), np.int32),
            actuators=np.zeros((1, 2, 0), np.float32),
        ),
        "key": jax.random.split(jax.random.key(3), 2)[None],  # typed keys
        "raw_key": np.zeros((1, 2, 2), np.uint32),
    }
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    state = jax.device_put(state, sharding)
    checkpoints = Checkpoints(tmp_path)
    history = {
        "seed": {"step": np.array([[[10]] * 2])},
        "host": {"steps_per_second": np.array([1.0])},
    }
    checkpoints.save(10, state, history, {"log_points": 1})
    checkpoints.close()
    restored_state, restored_history, meta = Checkpoints(tmp_path, read_only=True).restore(
        10, abstract_like(state)
    )
    assert isinstance(restored_state["env_state"], EnvState)
    assert (
        restored_state["env_state"].actuators.shape == (1, 2, 0)
        and restored_state["env_state"].actuators.dtype == np.float32
    )
    np.testing.assert_array_equal(restored_state["env_state"].cell, state["env_state"].cell)
    assert jax.dtypes.issubdtype(restored_state["key"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(
        jax.random.key_data(restored_state["key"]), jax.random.key_data(state["key"])
    )
    np.testing.assert_array_equal(restored_state["params"]["w"], state["params"]["w"])
    assert meta["log_points"] == 1 and meta["state_signature"]["['params']['w']"] == (
        "float32[1, 2, 6]"
    )
    np.testing.assert_array_equal(restored_history["seed"]["step"], history["seed"]["step"])


def test_checkpoint_of_another_shape_is_a_mismatch_left_in_place(tmp_path):
    """A leaf of another shape (e.g. `agent.network.hidden` edited in config.yaml) is not damage:
    the restore stops naming the leaf and both shapes, and the checkpoint stays where it is."""
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save(
        1,
        {"params": np.zeros((1, 2, 3), np.float32)},
        {"seed": {"step": np.ones((1, 2, 1))}, "host": {"x": np.ones(1)}},
        {"log_points": 1},
    )
    checkpoints.close()
    wrong = {
        "params": jax.ShapeDtypeStruct(
            (1, 2, 4), np.float32, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])
        )
    }
    warnings = []
    with pytest.raises(
        CheckpointMismatchError,
        match=r"state\['params'\] is float32\[1, 2, 3\] in the checkpoint, this run builds "
        r"float32\[1, 2, 4\]",
    ):
        Checkpoints(tmp_path).restore_latest(wrong, warn=warnings.append)
    assert not warnings and Checkpoints(tmp_path, read_only=True).steps() == [1]
    assert not (tmp_path / "damaged_checkpoints").exists()


@pytest.mark.slow
@pytest.mark.parametrize("agent", sorted(NEURAL))
def test_neural_agent_interrupted_and_resumed_equals_uninterrupted(agent, tmp_path, capsys):
    """Ctrl-C after the first log point (in-process: the signal handler is the real one), resume."""
    import os
    import signal

    from rl.run import logging as rl_logging

    config = write_config(
        tmp_path, {**NEURAL[agent], "run": {"seeds": 2, "checkpoint_every": 1, "progress": False}}
    )
    assert run_cli(["train", config, "--name", "full"]) == 0
    sent = []

    def interrupt(values):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    with rl_logging.sink(interrupt):
        assert run_cli(["train", config, "--name", "stopped"]) == 130
    assert "interrupted at step" in capsys.readouterr().err
    assert run_cli(["train", "--resume", tmp_path / "runs" / "stopped"]) == 0
    runs = tmp_path / "runs"
    assert (runs / "stopped" / "final_params.msgpack").read_bytes() == (
        runs / "full" / "final_params.msgpack"
    ).read_bytes()
    assert metric_rows(runs / "stopped") == metric_rows(runs / "full")


def test_a_checkpoint_of_another_structure_stops_the_restore_and_stays_in_place(tmp_path):
    """E.g. a replay agent's checkpoint written before the packed buffer storage: not damage, so it
    is neither moved to damaged_checkpoints/ nor skipped for an older one; the error names the
    checkpoint."""
    import jax.numpy as jnp

    checkpoints = Checkpoints(tmp_path / "run")
    old = {
        "params": {"w": jnp.ones((1, 2, 3))},
        "buffer": {"data": {"obs": jnp.zeros((1, 2, 4, 3))}},
    }
    checkpoints.save(
        10,
        old,
        {"seed": {"step": np.zeros((1, 2, 1))}, "host": {"wall_time": np.zeros(1)}},
        {"log_points": 1, "step": 10},
    )
    checkpoints.wait()
    new = jax.eval_shape(
        lambda: {
            "params": {"w": jnp.ones((1, 2, 3))},
            "buffer": {"storage": (jnp.zeros((1, 2, 4, 5), jnp.uint32),)},
        }
    )
    with pytest.raises(
        CheckpointMismatchError,
        match=r"checkpoints/10 does not fit the state this run builds: state\['buffer'\]",
    ):
        checkpoints.restore_latest(new)
    assert checkpoints.steps() == [10] and not (tmp_path / "run" / "damaged_checkpoints").exists()


def test_a_failed_orbax_write_is_the_os_error_it_reports(tmp_path):
    """TensorStore reports a failed write as text inside a ValueError; `Checkpoints.wait` raises it
    as the OSError it names (the CLI prints that in one line); any other failure as it is."""
    import errno

    from rl.run.checkpoint import _write_error

    full = ValueError(
        'RESOURCE_EXHAUSTED: Error writing "params.w/0.0" in OCDBT database: Failed to write 64 '
        "bytes to file 9: No space left on device [os_error_code='28']"
    )
    error = _write_error(full, tmp_path / "checkpoints" / "40")
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    assert error.strerror == "No space left on device"
    assert error.filename == str(tmp_path / "checkpoints" / "40")
    other = ValueError("unsupported leaf type")
    assert _write_error(other, tmp_path) is other


def test_checkpoint_files_manifest_finds_any_change(tmp_path):
    """The manifest written once a checkpoint is final names the first file that is missing,
    shorter or has other bytes; a folder without one is reported as unverified (False)."""
    from rl.run.checkpoint_integrity import (
        CheckpointDamagedError,
        verify_files,
        write_files_manifest,
    )

    folder = tmp_path / "10"
    (folder / "state").mkdir(parents=True)
    (folder / "state" / "data").write_bytes(bytes(range(256)))
    (folder / "meta").write_text("{}")
    assert verify_files(folder) is False
    write_files_manifest(folder)
    assert verify_files(folder) is True
    data = folder / "state" / "data"
    data.write_bytes(bytes(range(255)) + b"\x00")
    with pytest.raises(CheckpointDamagedError, match=r"state/data has other bytes"):
        verify_files(folder)
    data.write_bytes(bytes(range(100)))
    with pytest.raises(CheckpointDamagedError, match=r"state/data has 100 bytes, 256 when written"):
        verify_files(folder)
    data.unlink()
    with pytest.raises(CheckpointDamagedError, match=r"state/data is missing"):
        verify_files(folder)


def test_config_difference_names_the_first_changed_key_and_ignores_where_a_run_is_written():
    from rl.run.run_dir import config_difference

    saved = {
        "agent": {"lr": 0.001, "network": {"hidden": [64, 64]}},
        "run": {"seed": 0, "progress": True, "checkpoint_every": 10, "wandb": {"mode": None}},
        "sweep": [{}],
    }
    same_run = {
        "agent": {"lr": 0.001, "network": {"hidden": [64, 64]}},
        "run": {"seed": 0, "progress": False, "checkpoint_every": 2, "wandb": {"mode": "offline"}},
        "sweep": [{}],
    }
    assert config_difference(saved, same_run) is None
    edited = {**same_run, "agent": {"lr": 0.001, "network": {"hidden": [32, 32]}}}
    assert config_difference(saved, edited) == (
        "agent.network.hidden is [32, 32] in config.yaml, [64, 64] when the checkpoint was written"
    )
    reseeded = {**same_run, "run": {**same_run["run"], "seed": 1}, "sweep": [{"agent.lr": 0.1}]}
    assert config_difference(saved, reseeded).startswith("run.seed is 1 in config.yaml, 0 when")
    assert config_difference(saved, {**same_run, "agent": {"network": {"hidden": [64, 64]}}}) == (
        "agent.lr is not set in config.yaml, 0.001 when the checkpoint was written"
    )


@pytest.mark.parametrize("points", [2, 4], ids=["short", "long"])
def test_a_history_of_another_length_than_its_meta_says_is_damage(points, tmp_path):
    """A checkpoint's metric history must hold exactly the log points its meta records: one cut
    short, or one too long, is damage (skipped on --resume, with one warning), never a history
    that --resume would continue with log points missing."""
    from rl.run.checkpoint_integrity import CheckpointDamagedError, check_history

    history = {"seed": {"step": np.zeros((1, 2, points)), "loss": np.zeros((1, 2, 3))}}
    with pytest.raises(CheckpointDamagedError, match=f"'step' has {points} log points, the meta"):
        check_history(history, {"log_points": 3})
    check_history({"seed": {"step": np.zeros((1, 2, 3))}}, {"log_points": 3})
    # through a checkpoint written with it
    state = {"params": np.zeros((1, 2, 3), np.float32)}
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save(30, state, {"seed": {"step": np.zeros((1, 2, points))}}, {"log_points": 3})
    checkpoints.close()
    warnings = []
    assert Checkpoints(tmp_path).restore_latest(abstract_like(state), warn=warnings.append) is None
    assert "30 is damaged (history of 'step' has" in warnings[0] and len(warnings) == 2
