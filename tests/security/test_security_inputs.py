"""Issue 68, configs and command lines from elsewhere: env ids import no module named by data, the
coordinator listens where it is told, sizes fail fast from the config alone, names are strings
without control characters, and crafted files give one line naming the file."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from run_helpers import REPO, TINY, run_cli, subprocess_env, write_config

from rl.config import load_config
from rl.config.parsing import ConfigError

# ---------------------------------------------------------------- env ids import no module


def test_a_gymnasium_module_id_imports_nothing(tmp_path, monkeypatch):
    pytest.importorskip("gymnasium")
    (tmp_path / "fusedrl_planted.py").write_text("raise SystemExit('planted code ran')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m` puts the current folder first
    data = {"env": {"id": "gymnasium:fusedrl_planted:CartPole-v1"}, "agent": {"name": "dqn"}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="env.id: .*'module:id'"):
        load_config(tmp_path / "config.yaml")
    assert "fusedrl_planted" not in sys.modules


# ---------------------------------------------------------------- the coordinator's bind address

LISTENING = """
import sys
from rl.run import distributed
port = int(sys.argv[1])
distributed.initialize(f"127.0.0.1:{port}", 1, 0)
for name in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(name).read().splitlines()[1:]:
        fields = line.split()
        address, hex_port = fields[1].rsplit(":", 1)
        if int(hex_port, 16) == port and fields[3] == "0A":  # LISTEN
            print(address)
"""


def test_a_local_coordinator_listens_on_loopback_only():
    if not Path("/proc/net/tcp").exists():
        pytest.skip("reads Linux's /proc/net/tcp")
    import socket

    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-c", LISTENING, str(port)],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    addresses = done.stdout.split()
    assert done.returncode == 0 and addresses, done.stderr
    # 127.0.0.1 as /proc writes it, alone or IPv4-mapped in IPv6 (not 0.0.0.0 or ::)
    assert all(a.endswith("0100007F") for a in addresses), addresses


def test_the_bind_address_is_the_coordinators_own(monkeypatch):
    import jax

    from rl.run import distributed

    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append(k))
    monkeypatch.setattr(jax.config, "update", lambda *a: None)
    distributed.initialize("localhost:1234", 2, 0)
    assert calls[-1].get("coordinator_bind_address") == "127.0.0.1:1234"
    distributed.initialize("host0:1234", 2, 1)
    assert calls[-1].get("coordinator_bind_address") == "host0:1234"
    distributed.initialize("host0:1234", 2, 1, bind="0.0.0.0:1234")  # --coordinator-bind
    assert calls[-1].get("coordinator_bind_address") == "0.0.0.0:1234"


# ---------------------------------------------------------------- sizes fail fast


def fails_fast(overrides: list[str], match: str, config="qlearning_gridworld") -> None:
    """load_config with `overrides` raises ConfigError matching `match` within 10 s."""
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=match):
        load_config(config, overrides)
    assert time.perf_counter() - start < 10


def test_many_seeds_fail_fast():
    fails_fast(
        ["run.seeds=100000", "agent.buffer_size=1000000"], "run.seeds: .* memory", "dqn_cartpole"
    )


def test_a_huge_buffer_fails_fast():
    fails_fast(["agent.buffer_size=1000000000000"], "agent.buffer_size: .*TiB", "dqn_cartpole")


def test_a_huge_network_fails_fast():
    fails_fast(
        ["agent.network.hidden=[100000000, 100000000]"], "agent.network.hidden", "dqn_cartpole"
    )


def test_a_seed_past_32_bits_fails_fast():
    fails_fast(["run.seed=100000000000000000000000"], "run.seed: .*out of range")
    fails_fast([f"run.seed={2**32 - 2}", "run.seeds=4"], "run.seed: .*32-bit")


def test_a_trillion_log_points_fail_fast():
    fails_fast(["agent.total_steps=1000000000000", "agent.log_interval=1"], "agent.log_interval")


def test_seed_keys_are_one_call_per_seed_bit_for_bit():
    import jax
    import jax.numpy as jnp
    import numpy as np

    from rl.run.programs import seed_keys

    for seed, seeds in ((0, 30), (2**31 - 3, 6), (2**32 - 4, 4)):
        config = SimpleNamespace(run=SimpleNamespace(seed=seed, seeds=seeds))
        loop = jnp.stack([jax.random.PRNGKey(seed + i) for i in range(seeds)])
        np.testing.assert_array_equal(np.asarray(seed_keys(config)), np.asarray(loop))
    start = time.perf_counter()
    seed_keys(SimpleNamespace(run=SimpleNamespace(seed=0, seeds=1_000_000)))
    assert time.perf_counter() - start < 5


BOMB = """
env: {id: GridWorld}
agent: {name: qlearning}
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
"""
for level in "bcdefghi":
    previous = chr(ord(level) - 1)
    BOMB += f"{level}: &{level} [{', '.join([f'*{previous}'] * 9)}]\n"


def test_a_billion_laughs_config_fails_fast(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="aliases are expanded"):
        load_config(path)
    assert time.perf_counter() - start < 5


def test_a_billion_laughs_in_a_run_directory_fails_fast(tmp_path):
    from rl.run.run_dir import load_run_config

    (tmp_path / "config.yaml").write_text(BOMB)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="config.yaml.*aliases are expanded"):
        load_run_config(tmp_path)
    assert time.perf_counter() - start < 5


def test_a_failed_start_removes_the_run_directory_it_made(tmp_path, monkeypatch):
    import rl.run.train

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory allocating the replay buffer")

    monkeypatch.setattr(rl.run.train, "make_programs", out_of_memory)
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        run_cli(["train", write_config(tmp_path), "--name", "failed"])
    assert not (tmp_path / "runs" / "failed").exists()


# ---------------------------------------------------------------- names


def train_args(config: Path, name: str) -> SimpleNamespace:
    return SimpleNamespace(
        config=str(config), overrides=[], seeds=None, output_dir=None, name=name,
        no_progress=True, sweep=[],
    )  # fmt: skip


@pytest.mark.parametrize("name", ["null", "~", "#x", "[1]"])
def test_a_command_line_name_is_a_string(tmp_path, name):
    from rl.cli.train import resolve_train_config

    config, _ = resolve_train_config(train_args(write_config(tmp_path), name))
    assert config.run.name == name


@pytest.mark.parametrize("name", ["a\nrl: forged line", "nul\x00", "esc\x1b[2J", "x" * 300])
def test_a_name_with_control_characters_or_too_long_is_refused(tmp_path, name, capsys):
    data = {**TINY, "run": {**TINY["run"], "name": name}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    assert run_cli(["train", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rl: error: run.name")
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- multi-process runs


def test_a_multi_process_run_refuses_a_finished_runs_directory(tmp_path):
    from rl.cli.train import make_run_dir

    run_dir = tmp_path / "runs" / "big"
    run_dir.mkdir(parents=True)
    for name in ("config.yaml", "summary.json", "final_params.msgpack"):
        (run_dir / name).write_text("{}")
    config = load_config(write_config(tmp_path), [f"run.output_dir={tmp_path / 'runs'}"])
    config = config.__class__(**{**config.__dict__, "run": config.run.__class__(
        **{**config.run.__dict__, "name": "big"})})  # fmt: skip
    with pytest.raises(ConfigError, match="already holds a run"):
        make_run_dir(config, exist_ok=True)


# ---------------------------------------------------------------- crafted files


def test_a_crafted_final_params_file_is_one_line(tmp_path):
    from rl.run.run_dir import load_params

    config = load_config(write_config(tmp_path))
    for content in (b"\xc1\xc1 not msgpack", b"\x93\x01\x02\x03", b"\x81\xa1w\xa3str"):
        (tmp_path / "final_params.msgpack").write_bytes(content)
        with pytest.raises(ConfigError, match="final_params.msgpack"):
            load_params(tmp_path, config, [{}])


def test_crafted_metrics_rows_are_skipped_in_one_line(tmp_path):
    from rl.cli.plot import read_metrics

    good = {"setting": 0, "seed": 0, "log_point": 0, "step": 1000, "episode_return": 1.0}
    crafted = [{**good, "step": "x"}, {**good, "seed": [0]}, {**good, "episode_return": {"a": 1}}]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in [good, *crafted])
    )
    warnings = []
    assert read_metrics(tmp_path, warnings.append) == [good]
    assert len(warnings) == 1 and "3 lines" in warnings[0]


@pytest.mark.parametrize(
    "crafted",
    [
        {"env": {"id": "GridWorld", "params": {"size": [1, 2]}}},
        {"sweep": 5},
        {"sweep": [{"lr": "x"}]},
    ],
)
def test_a_crafted_run_config_is_one_line(tmp_path, crafted):
    from rl.run.run_dir import load_run_config

    data = {**TINY, **crafted}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="config.yaml"):
        load_run_config(tmp_path)


def test_a_dollar_in_a_sweep_label_plots(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # matplotlib reads text between two '$' as mathtext, and stops at a bad one
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"sweep": [{"lr": "$\\frac{$"}]}))
    rows = [
        {"setting": 0, "seed": 0, "log_point": t, "step": t, "episode_return": t} for t in (1, 2)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert run_cli(["plot", run_dir, "-o", tmp_path / "c.png"]) == 0


def test_a_read_failure_in_eval_says_read(tmp_path, monkeypatch, capsys):
    import rl.cli.evaluate

    def gone(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", str(tmp_path / "checkpoints/4"))

    monkeypatch.setattr(rl.cli.evaluate, "evaluate_run", gone)
    assert run_cli(["eval", tmp_path]) == 1
    assert capsys.readouterr().err.startswith("rl: error: cannot read ")


class _Device:
    """A device reporting `bytes_limit` of memory, as a GPU's `memory_stats()` does."""

    device_kind = "a small GPU"

    def __init__(self, limit):
        self.limit = limit

    def memory_stats(self):
        return None if self.limit is None else {"bytes_limit": self.limit}


def test_a_state_beyond_the_device_memory_is_refused_before_anything_runs():
    from rl.config import load_config
    from rl.config.limits import check_device_memory

    config = load_config("dqn_cartpole", ["run.seeds=64", "agent.buffer_size=100000"])
    with pytest.raises(ConfigError, match=r"agent.buffer_size: .* on each device .* small GPU"):
        check_device_memory(config, 1, [_Device(100 << 20)])
    check_device_memory(config, 1, [_Device(100 << 20)] * 8)  # 8 seeds a device fit
    check_device_memory(config, 1, [_Device(None)])  # the CPU reports no limit: nothing checked
