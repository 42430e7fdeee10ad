"""Check each packaged config against its promise (rl.config.promise): train it on seeds set apart
for checking (10,000 up, never tuned on) with `rl train`, compare the seeds' final results with the
promise, and report the IQM with its 95% stratified-bootstrap interval (rl.cli.evaluation), whether
the promise was kept, and the wall clock as a user waits for it (process start to the summary,
compilation counted, the compilation cache off).

    python benchmarks/configs_check.py --configs cpu --out /tmp/check           # the cheap ones
    python benchmarks/configs_check.py --configs ppo_cartpole,dqn_cartpole --seeds 8 --out /tmp/c
    python benchmarks/configs_check.py --configs all --device gpu --out DIR    # on a GPU machine
    python benchmarks/configs_check.py --merge DIR/configs_check.json               # back here
    python benchmarks/configs_check.py --table                   # rewrite the two tables only

`--seeds N` (default: the promise's seeds) trains N seeds in one program (`rl train --seeds N`,
seeds vmapped) for `arch: anakin` configs; `arch: sebulba` configs train one seed a process, so
their N seeds are N processes one after the other. `--device cpu` hides any GPU (JAX_PLATFORMS=cpu);
`auto` takes jax's default backend. Each check is recorded under its device in
`benchmarks/configs_check.json` (the latest result per config and device) and in
`--out/configs_check.json`; the table "Packaged configs: promise and check" of
`benchmarks/RESULTS.md`, and the configs table of README.md, are rewritten
(benchmarks/configs_tables.py) from the records and the configs' promises. A config whose env
library is not installed is skipped with a line naming its extra.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# The training runs get the environment this script was started with; run as a script, its own
# process stays off the accelerators (an env library imported here could otherwise take a GPU's
# memory).
TRAIN_ENV = dict(os.environ)

from benchmarks.configs_tables import (  # noqa: E402
    README,
    VERDICTS,
    needed_module,
    render_table,
    replace_table,
    result_text,
    seconds_text,
    update_readme,
)
from rl.cli.evaluation import bootstrap_intervals  # noqa: E402
from rl.config.parsing import ConfigError, packaged_configs, read_yaml  # noqa: E402
from rl.config.promise import (  # noqa: E402
    CHECK_SEEDS_FROM,
    Promise,
    expected_seconds,
    judge,
    read_promise,
)

RECORDS = REPO / "benchmarks" / "configs_check.json"
RESULTS = REPO / "benchmarks" / "RESULTS.md"
# what `--configs cpu` takes: configs whose promised CPU time for the check's seeds is within this
CPU_SUBSET_SECONDS = 600.0


# ------------------------------------------------------------------------------- what to check


def missing_extra(env_id: str) -> str | None:
    """The extra to install when the env id's library cannot be imported here, else None."""
    needed = needed_module(env_id)
    if needed is None:
        return None
    try:
        __import__(needed[0])
    except Exception:  # noqa: BLE001 - any failure to import means the check cannot run here
        return needed[1]
    return None


def load_promises(names=None) -> dict[str, tuple[dict, Promise | None]]:
    """{name: (parsed config file, its Promise or None)} of the packaged configs (all, or `names`
    in that order); ConfigError naming an unknown config."""
    packaged = packaged_configs()
    chosen = list(packaged) if names is None else list(names)
    found = {}
    for name in chosen:
        if name not in packaged:
            raise ConfigError(
                f"--configs: {name!r} is not a packaged config (rl configs lists them)"
            )
        data = read_yaml(packaged[name])
        found[name] = (data, read_promise(data))
    return found


def select(spec: str, promises: dict, seeds: int | None) -> list[str]:
    """The configs `--configs` names: `all` (every config with a promise), `cpu` (those with a
    promised CPU time whose check of `seeds` (default: the promise's) takes at most
    CPU_SUBSET_SECONDS by it), or a comma-separated list of names (ConfigError naming an unknown
    one)."""
    if spec not in ("all", "cpu"):
        names = [name.strip() for name in spec.split(",") if name.strip()]
        unknown = [name for name in names if name not in promises]
        if unknown:
            raise ConfigError(f"--configs: {unknown[0]!r} is not a packaged config (rl configs)")
        return names
    chosen = []
    for name, (_, promise) in promises.items():
        if promise is None:
            continue
        if spec == "cpu":
            budget = expected_seconds(promise, "cpu", seeds or promise.seeds)
            if budget is None or budget > CPU_SUBSET_SECONDS:
                continue
        chosen.append(name)
    return chosen


def check_seed_start(start: int) -> int:
    """`start`, or ConfigError when it falls in the tuning range (below CHECK_SEEDS_FROM)."""
    if start < CHECK_SEEDS_FROM:
        raise ConfigError(
            f"--seed-start: {start} is in the tuning range; checks use seeds from "
            f"{CHECK_SEEDS_FROM}"
        )
    return start


def train_commands(name: str, data: dict, seeds: int, start: int, out: Path) -> list[list[str]]:
    """The `rl train` command lines that train `seeds` seeds from `start` of config `name` into run
    directories under `out`: one for an anakin config (seeds vmapped), one per seed for sebulba."""
    arch = data.get("arch") or {}
    arch = arch if isinstance(arch, str) else arch.get("name", "anakin")
    base = [sys.executable, "-m", "rl.cli.main", "train", name, "--no-progress"]
    common = ["--output-dir", str(out), 'run.compilation_cache="off"']
    if arch == "sebulba":
        return [
            [*base, "--seeds", "1", "--name", f"{name}-{seed}", *common, f"run.seed={seed}"]
            for seed in range(start, start + seeds)
        ]
    return [
        [*base, "--seeds", str(seeds), "--name", f"{name}-{start}", *common, f"run.seed={start}"]
    ]


# ------------------------------------------------------------------------------- results


def final_per_seed(rows, metric: str) -> np.ndarray:
    """Per seed (the `seed` index of metrics.jsonl rows, setting 0), the metric's value at the last
    log point where it is finite; NaN for a seed without one."""
    last: dict[int, tuple[int, float]] = {}
    seeds = set()
    for row in rows:
        if row.get("setting", 0) != 0:
            continue
        seed = int(row["seed"])
        seeds.add(seed)
        value = row.get(metric)
        if value is None or not np.isfinite(float(value)):
            continue
        point = int(row.get("log_point", row.get("step", 0)))
        if seed not in last or point >= last[seed][0]:
            last[seed] = (point, float(value))
    return np.array([last[s][1] if s in last else np.nan for s in sorted(seeds)], np.float64)


def read_finals(run_dir: Path, metric: str) -> np.ndarray:
    """final_per_seed of a run directory's metrics.jsonl."""
    with open(run_dir / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return final_per_seed(rows, metric)


def summarise_check(promise: Promise, finals, reps: int = 20_000) -> dict:
    """The check's figures: IQM with its 95% bootstrap interval over the finite finals, the
    promise's verdict (rl.config.promise.judge), the share and median, per-seed values."""
    finals = np.asarray(finals, np.float64)
    verdict = judge(promise, finals)
    finite = finals[np.isfinite(finals)]
    interval = bootstrap_intervals(finite, ("iqm",), reps=reps)["iqm"] if finite.size else None
    return {
        "kept": verdict.kept,
        "broken": list(verdict.broken),
        "share": verdict.share,
        "median": verdict.median,
        "iqm": None if interval is None else list(interval),
        "finals": [None if not np.isfinite(v) else round(float(v), 3) for v in finals],
    }


PROBE = (
    "import jax; d = jax.devices(); print(jax.default_backend(), len(d), d[0].device_kind, sep='|')"
)


def probe(env: dict) -> tuple[str, str]:
    """(`cpu` or `gpu`, the machine in words: `2-core Intel Xeon` or `1 x NVIDIA H200`) of what
    the training runs will see with `env`, asked of jax in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    backend, count, kind = done.stdout.strip().splitlines()[-1].split("|")
    if backend == "cpu":
        return "cpu", cpu_name()
    return "gpu", f"{count} x {kind}"


def cpu_name() -> str:
    """`2-core Intel(R) Xeon(R) Processor`: the cores and the model of this machine's CPU."""
    model = platform.processor() or "CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()}-core {model}"


def versions() -> str:
    """`jax 0.10.2, commit abc1234` of this checkout."""
    import jax

    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return f"jax {jax.__version__}, commit {commit}"


def train_env(device: str) -> dict:
    """The environment of the training runs: as this script was started, with JAX_PLATFORMS=cpu
    for `--device cpu`."""
    return dict(TRAIN_ENV, **({"JAX_PLATFORMS": "cpu"} if device == "cpu" else {}))


def run_check(name, data, promise, seeds, start, out, where, env, timeout=None) -> dict:
    """Train config `name` on `seeds` seeds from `start` and judge it: the record of the check.
    `where`: (device, machine) as `probe` gives them. RuntimeError naming the config when a run
    fails or takes over `timeout` seconds."""
    commands = train_commands(name, data, seeds, start, out)
    seconds, finals = [], []
    for command in commands:
        began = time.perf_counter()
        try:
            done = subprocess.run(
                command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{name}: stopped after --timeout {timeout:g} s") from None
        seconds.append(time.perf_counter() - began)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"{name}: rl train exited {done.returncode}: {' | '.join(tail)}")
        run_dir = out / command[command.index("--name") + 1]
        finals.extend(read_finals(run_dir, promise.metric))
    return {
        "config": name,
        "device": where[0],
        "machine": where[1],
        "date": datetime.date.today().isoformat(),
        "versions": versions(),
        "seeds": [start, start + seeds - 1],
        "metric": promise.metric,
        "at_least": promise.at_least,
        "env_steps": int(data["agent"]["total_steps"]),
        "seconds": round(float(sum(seconds)), 1),
        "processes": len(commands),
        "command": " ".join(["rl", *commands[0][3:]]).replace(str(out), "DIR")
        + (" (one process a seed)" if len(commands) > 1 else ""),
        **summarise_check(promise, finals),
    }


# ------------------------------------------------------------------------------- the records


def merge(records: dict, new: list[dict]) -> dict:
    """`records` ({config: {device: record}}) with each of `new` in its config and device's
    place."""
    merged = {name: dict(by_device) for name, by_device in records.items()}
    for record in new:
        merged.setdefault(record["config"], {})[record["device"]] = record
    return merged


def load_records(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def write_records(path: Path, records: dict) -> None:
    path.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="cpu", help="all, cpu, or names separated by commas")
    parser.add_argument("--seeds", type=int, help="seeds per config (default: the promise's)")
    parser.add_argument("--seed-start", type=int, default=CHECK_SEEDS_FROM)
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    parser.add_argument("--out", type=Path, help="folder for the run directories and the records")
    parser.add_argument(
        "--merge", type=Path, nargs="*", help="records files of checks run elsewhere"
    )
    parser.add_argument("--table", action="store_true", help="only rewrite the RESULTS.md table")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--timeout", type=float, help="seconds a training process may take")
    parser.add_argument(
        "--no-results", action="store_true", help="leave RESULTS.md and the records"
    )
    args = parser.parse_args(argv)
    try:
        start = check_seed_start(args.seed_start)
        promises = load_promises()
        new: list[dict] = []
        failed: list[str] = []
        if args.merge:
            for path in args.merge:
                if not path.is_file():
                    raise ConfigError(f"--merge: {str(path)!r} is not a file")
                new.extend(
                    r for by_device in load_records(path).values() for r in by_device.values()
                )
        elif not args.table:
            new, failed = check_configs(args, promises, start)
    except (ConfigError, RuntimeError) as err:
        print(f"configs_check: {err}", file=sys.stderr)
        return 2
    status = 0 if not failed and all(r["kept"] is not False for r in new) else 1
    if args.dry_run or args.no_results:
        return status
    records = merge(load_records(RECORDS), new)
    write_records(RECORDS, records)
    RESULTS.write_text(replace_table(RESULTS.read_text(), render_table(promises, records)))
    README.write_text(update_readme(README.read_text(), promises, records))
    print(
        f"configs_check: wrote {RECORDS.relative_to(REPO)} and the configs tables of "
        f"{RESULTS.name} and {README.name}"
    )
    return status


def check_configs(args, promises: dict, start: int) -> tuple[list[dict], list[str]]:
    """Run the checks `args` asks for; print one line per config; the records, and the configs
    whose training failed or was stopped."""
    if args.out is None and not args.dry_run:
        raise ConfigError("--out: required to train (the run directories go there)")
    env = train_env(args.device)
    where = None if args.dry_run else probe(env)
    if where is not None and args.device == "gpu" and where[0] != "gpu":
        raise ConfigError("--device gpu: jax sees no GPU here")
    names = select(args.configs, promises, args.seeds)
    new, failed = [], []
    for name in names:
        data, promise = promises[name]
        if promise is None:
            print(f"{name}: no promise: skipped")
            continue
        seeds = args.seeds or promise.seeds
        extra = missing_extra(str(data["env"]["id"]))
        if extra is not None:
            print(f"{name}: skipped: needs the {extra} extra")
            continue
        if args.dry_run:
            out = args.out or Path("OUT")
            for command in train_commands(name, data, seeds, start, out):
                print(" ".join(command))
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        try:
            record = run_check(
                name, data, promise, seeds, start, args.out, where, env, args.timeout
            )
        except RuntimeError as err:  # the next config still runs; the exit status says it
            print(f"{name}: FAILED: {err}", flush=True)
            failed.append(name)
            continue
        new.append(record)
        write_records(
            args.out / "configs_check.json",
            merge(load_records(args.out / "configs_check.json"), [record]),
        )
        verdict = VERDICTS[record["kept"]] + "; ".join(record["broken"])
        print(
            f"{name}: {result_text(record)} on seeds {start}-{start + seeds - 1}: {verdict}; "
            f"{seconds_text(record['seconds'])} on {record['machine']}",
            flush=True,
        )
    if failed:
        print(f"configs_check: failed or stopped: {', '.join(failed)}", file=sys.stderr)
    return new, failed


if __name__ == "__main__":
    os.environ["JAX_PLATFORMS"] = "cpu"  # this process only: the runs get TRAIN_ENV
    sys.exit(main())
