"""Check each packaged config against its promise (rl.promise): train it on seeds set apart for
checking (10,000 up, never tuned on) with `rl train`, compare the seeds' final results with the
promise, and report the IQM with its 95% stratified-bootstrap interval (rl.evaluation), whether the
promise was kept, and the wall clock as a user waits for it (process start to the summary,
compilation counted, the compilation cache off).

    python benchmarks/configs_check.py --configs cpu --out /tmp/check           # the cheap ones
    python benchmarks/configs_check.py --configs ppo_cartpole,dqn_cartpole --seeds 8 --out /tmp/c
    python benchmarks/configs_check.py --configs all --out $OUT/check            # on a GPU machine
    python benchmarks/configs_check.py --merge $OUT/check/configs_check.json     # back here
    python benchmarks/configs_check.py --table                                   # RESULTS.md only

`--seeds N` (default: the promise's seeds) trains N seeds in one program (`rl train --seeds N`,
seeds vmapped) for `arch: anakin` configs; `arch: sebulba` configs train one seed a process, so
their N seeds are N processes one after the other. `--device cpu` hides any GPU
(JAX_PLATFORMS=cpu); `auto` takes jax's default backend. Each check is recorded under its device in
`benchmarks/configs_check.json` (the latest result per config and device) and in
`--out/configs_check.json`; the table "Packaged configs: promise and check" of
`benchmarks/RESULTS.md`, and the configs table of README.md, are rewritten from the records and the
configs' promises. A config whose env library is not installed is skipped with a line naming its
extra.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# The training runs get the environment this script was started with; this process itself stays
# off the accelerators (an env library imported here could otherwise take a GPU's memory).
TRAIN_ENV = dict(os.environ)
os.environ["JAX_PLATFORMS"] = "cpu"

from rl.config_parsing import ConfigError, packaged_configs, read_yaml  # noqa: E402
from rl.evaluation import bootstrap_intervals  # noqa: E402
from rl.promise import (  # noqa: E402
    CHECK_SEEDS_FROM,
    Promise,
    expected_seconds,
    judge,
    promise_text,
    read_promise,
)

RECORDS = REPO / "benchmarks" / "configs_check.json"
RESULTS = REPO / "benchmarks" / "RESULTS.md"
HEADING = "## Packaged configs: promise and check"
# env id prefix -> (module to import, the extra that brings it)
LIBRARIES = {
    "gymnax:": ("gymnax", "gymnax"),
    "brax:": ("brax", "brax"),
    "craftax:": ("craftax", "craftax"),
    "jumanji:": ("jumanji", "jumanji"),
    "jaxmarl:": ("jaxmarl", "jaxmarl"),
    "envpool:": ("envpool", "envpool"),
}
MUJOCO_IDS = ("HalfCheetah", "Ant", "Hopper", "Walker2d", "Humanoid", "Swimmer", "Reacher")
VERDICTS = {True: "kept", False: "MISSED: ", None: "measured (no result promised yet)"}
# what `--configs cpu` takes: configs whose promised CPU time for the check's seeds is within this
CPU_SUBSET_SECONDS = 600.0


# ------------------------------------------------------------------------------- what to check


def needed_module(env_id: str) -> tuple[str, str] | None:
    """(module, extra) an env id needs beyond the base install, or None."""
    for prefix, needed in LIBRARIES.items():
        if env_id.startswith(prefix):
            return needed
    if env_id.startswith("gymnasium:") and env_id.split(":", 1)[1].startswith(MUJOCO_IDS):
        return ("mujoco", "gymnasium[mujoco]")
    return None


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
    base = [sys.executable, "-m", "rl.cli", "train", name, "--no-progress"]
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
    promise's verdict (rl.promise.judge), the share and median, per-seed values."""
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
        "command": " ".join(["rl", *commands[0][3:]])
        + (" (one process a seed)" if len(commands) > 1 else ""),
        **summarise_check(promise, finals),
    }


# ------------------------------------------------------------------------------- the table


def merge(records: dict, new: list[dict]) -> dict:
    """`records` ({config: {device: record}}) with each of `new` in its config and device's
    place."""
    merged = {name: dict(by_device) for name, by_device in records.items()}
    for record in new:
        merged.setdefault(record["config"], {})[record["device"]] = record
    return merged


def seconds_text(seconds: float | None) -> str:
    """`38 s`, `4.5 min`, `2.1 h`; `not stated` for None."""
    if seconds is None:
        return "not stated"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def latest(by_device: dict) -> dict | None:
    """The newest record of a config (by date; GPU first on a tie: more seeds, its own timing)."""
    if not by_device:
        return None
    return max(by_device.values(), key=lambda r: (r["date"], r["device"] == "gpu"))


def result_text(record: dict) -> str:
    """`IQM 500 [488, 500]; median 500; 56% >= 475` of one check."""
    iqm = record["iqm"]
    parts = ["no result"] if iqm is None else [f"IQM {iqm[0]:.1f} [{iqm[1]:.1f}, {iqm[2]:.1f}]"]
    parts.append(f"median {record['median']:.1f}")
    if record["share"] is not None:
        parts.append(f"{record['share']:.0%} of seeds >= {record['at_least']:g}")
    return "; ".join(parts)


def time_text(record: dict | None) -> str:
    """`61 s (4 seeds)`: a check's wall clock and seeds; `-` for no check."""
    if record is None:
        return "-"
    return (
        f"{seconds_text(record['seconds'])} ({record['seeds'][1] - record['seeds'][0] + 1} seeds)"
    )


def rejudged(record: dict, promise: Promise) -> dict:
    """`record` judged again against `promise` as the config states it now (a promise restated
    after its check is shown against the check's per-seed results)."""
    verdict = judge(promise, [np.nan if v is None else v for v in record["finals"]])
    return {
        **record,
        "kept": verdict.kept,
        "broken": list(verdict.broken),
        "share": verdict.share,
        "median": verdict.median,
        "at_least": promise.at_least,
    }


def table_row(name: str, promise: Promise | None, by_device: dict, pending: str) -> str:
    """One row of the table: the promise, the latest check (judged against the promise as it
    stands), and each device's time."""
    if promise is None:
        return f"| `{name}` | no promise stated | | | | |"
    record = latest(by_device)
    record = None if record is None else rejudged(record, promise)
    stated = (
        f"{promise_text(promise)} ({METRIC_NAMES[promise.metric]}); "
        f"CPU, 1 seed: {seconds_text(promise.cpu_seconds)}; "
        f"GPU: {seconds_text(promise.gpu_seconds)}"
    )
    times = [time_text(by_device.get(device)) for device in ("cpu", "gpu")]
    if record is None:
        return f"| `{name}` | {stated} | {pending} | | {times[0]} | {times[1]} |"
    seeds = f"{record['seeds'][0]}-{record['seeds'][1]}"
    where = f"{record['machine']}, {record['date']}, {record['versions']}"
    verdict = VERDICTS[record["kept"]].replace("MISSED", "**missed**") + "; ".join(record["broken"])
    return (
        f"| `{name}` | {stated} | {seeds}: {result_text(record)} ({where}) | {verdict} | "
        f"{times[0]} | {times[1]} |"
    )


def pending_text(data: dict, promise: Promise | None) -> str:
    """Why a config has no check yet: not run yet (on the CPU where it states a CPU time, else on
    a GPU), with the extra its env needs."""
    where = "CPU or GPU" if promise is not None and promise.cpu_seconds is not None else "GPU"
    extra = needed_module(str(data.get("env", {}).get("id", "")))
    return f"pending ({where})" if extra is None else f"pending ({where}; the `{extra[1]}` extra)"


METRIC_NAMES = {"eval_return": "greedy", "episode_return": "training episodes"}


def render_table(promises: dict, records: dict) -> str:
    """The markdown table of every packaged config's promise and latest check."""
    lines = [
        "| config | promise at the budget; time (CPU: `--seeds 1`, 2-core; GPU: the promise's "
        "seeds, one H200) | check: seeds, result (machine, date, versions) | promise | "
        "CPU time of the check | GPU time of the check |",
        "|---|---|---|---|---|---|",
    ]
    for name, (data, promise) in promises.items():
        lines.append(table_row(name, promise, records.get(name, {}), pending_text(data, promise)))
    return "\n".join(lines)


def replace_table(text: str, table: str) -> str:
    """`text` (RESULTS.md) with the first table after HEADING replaced by `table`; ValueError when
    the heading is missing."""
    at = text.find(HEADING)
    if at < 0:
        raise ValueError(f"RESULTS.md has no heading {HEADING!r}")
    match = re.compile(r"^\|.*(?:\n\|.*)*", re.M).search(text, at)
    if match is None:
        raise ValueError(f"RESULTS.md has no table under {HEADING!r}")
    return text[: match.start()] + table + text[match.end() :]


README = REPO / "README.md"
README_HEADER = (
    "| config | agent, env | seeds x env steps | promise at the budget | check on seeds 10,000 up "
    "| CPU time, 1 seed | GPU time |"
)
DEFAULT_NOTE = "rl.promise;"
TEN_MINUTES = 600.0


def promise_note(path: Path) -> str | None:
    """The comment on a config file's `promise:` line (where the promised figures come from), or
    None when it has none or only the generic one."""
    for line in Path(path).read_text().splitlines():
        if line.startswith("promise:") and "#" in line:
            note = line.split("#", 1)[1].strip()
            return None if note.startswith(DEFAULT_NOTE) else note
    return None


def steps_text(steps: int) -> str:
    """`102k`, `1.97M`: env steps in short."""
    return f"{steps / 1e6:.3g}M" if steps >= 1e6 else f"{steps / 1e3:.3g}k"


def check_text(promise: Promise, by_device: dict, pending: str) -> str:
    """The README's check cell: the verdict of the latest check with its seeds, machine and time."""
    record = latest(by_device)
    if record is None:
        return pending
    record = rejudged(record, promise)
    verdict = {True: "kept", False: "**missed**", None: "measured"}[record["kept"]]
    seeds = record["seeds"][1] - record["seeds"][0] + 1
    where = "2-core CPU" if record["device"] == "cpu" else record["machine"]
    return (
        f"{verdict}: {result_text(record)} ({seeds} seeds, {where}, "
        f"{seconds_text(record['seconds'])}, {record['date']})"
    )


def shipped_cpu_seconds(promise: Promise, seeds: int, cpu_check: dict | None) -> float | None:
    """The CPU time of the config as shipped (`seeds` seeds): a CPU check of at least that many
    seeds, else `seeds` times the 1-seed time (an upper bound), else None."""
    if cpu_check is not None and cpu_check["seeds"][1] - cpu_check["seeds"][0] + 1 >= seeds:
        return cpu_check["seconds"]
    return expected_seconds(promise, "cpu", seeds)


def readme_row(names: list[str], agent: str, promises: dict, records: dict) -> str:
    """One row of the README's configs table for `names` (one config, or several that share one
    promise), its `agent, env` cell kept."""
    data, promise = promises[names[0]]
    path = packaged_configs()[names[0]]
    run = data.get("run") if isinstance(data.get("run"), dict) else {}
    shipped = f"{run.get('seeds', 1)} x {steps_text(int(data['agent']['total_steps']))}"
    stated = promise_text(promise)
    if promise.pending is None:
        stated += f" ({METRIC_NAMES[promise.metric]})"
        note = promise_note(path)
        stated += f"; {note}" if note else ""
    cpu = promise.cpu_seconds
    cpu_cell = "not measured" if cpu is None else seconds_text(cpu)
    if cpu is not None and cpu > TEN_MINUTES:
        cpu_cell += " (over 10 min)"
    shipped_seeds = int(run.get("seeds", 1))
    shipped_cpu = shipped_cpu_seconds(promise, shipped_seeds, records.get(names[0], {}).get("cpu"))
    if shipped_seeds > 1 and shipped_cpu is not None and shipped_cpu > TEN_MINUTES:
        cpu_cell += f"; as shipped ({shipped_seeds} seeds) over 10 min"
    gpu_cell = (
        "not measured yet" if promise.gpu_seconds is None else seconds_text(promise.gpu_seconds)
    )
    by_device = records.get(names[0], {})
    check = check_text(promise, by_device, pending_text(data, promise))
    first = ", ".join(f"`{name}`" for name in names)
    return f"| {first} | {agent} | {shipped} | {stated} | {check} | {cpu_cell} | {gpu_cell} |"


def update_readme(text: str, promises: dict, records: dict) -> str:
    """`text` (README.md) with its configs table rewritten from the promises and the checks: each
    row keeps its configs and its `agent, env` cell; a config with no row gets one. ValueError
    when the table is missing."""
    start = text.find(README_HEADER)
    if start < 0:
        raise ValueError("README.md has no configs table (its header row changed?)")
    end = text.find("\n\n", start)
    rows = text[start:end].splitlines()[2:]
    groups = []
    for row in rows:
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        groups.append((re.findall(r"`([a-z0-9_]+)`", cells[0]), cells[1]))
    listed = {name for names, _ in groups for name in names}
    for name, (data, _) in promises.items():
        if name not in listed:
            groups.append(([name], f"{data['agent']['name']}, {data['env']['id']}"))
    lines = [README_HEADER, "|---|---|---|---|---|---|---|"]
    lines += [readme_row(names, agent, promises, records) for names, agent in groups]
    return text[:start] + "\n".join(lines) + text[end:]


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
    sys.exit(main())
