"""The tables of benchmarks/configs_check.py: "Packaged configs: promise and check" in
benchmarks/RESULTS.md (each config's promise, its latest check per device, with the IQM and its
interval, the machine and versions) and the configs table of README.md (the promise, the check in
short, the CPU and GPU times), both written from the configs' promises and the checks' records
(`{config: {device: record}}`, benchmarks/configs_check.json). A check is shown judged against the
promise as the config states it now.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from rl.config.parsing import packaged_configs
from rl.config.promise import Promise, expected_seconds, judge, promise_text

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
HEADING = "## Packaged configs: promise and check"
# env id prefix -> (module to import, the extra that brings it)
LIBRARIES = {
    "gymnax:": ("gymnax", "gymnax"),
    "brax:": ("brax", "brax"),
    "craftax:": ("craftax", "craftax"),
    "jumanji:": ("jumanji", "jumanji"),
    "jaxmarl:": ("jaxmarl", "jaxmarl"),
    "playground:": ("mujoco_playground", "playground"),
    "envpool:": ("envpool", "envpool"),
}
MUJOCO_IDS = ("HalfCheetah", "Ant", "Hopper", "Walker2d", "Humanoid", "Swimmer", "Reacher")
VERDICTS = {True: "kept", False: "MISSED: ", None: "measured (no result promised yet)"}


def needed_module(env_id: str) -> tuple[str, str] | None:
    """(module, extra) an env id needs beyond the base install, or None."""
    for prefix, needed in LIBRARIES.items():
        if env_id.startswith(prefix):
            return needed
    if env_id.startswith("gymnasium:") and env_id.split(":", 1)[1].startswith(MUJOCO_IDS):
        return ("mujoco", "gymnasium[mujoco]")
    return None


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
DEFAULT_NOTE = "rl.config.promise;"
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
