"""The fault table of benchmarks/RESULTS.md (Reliability): runs the fault-injection suite
(`tests/faults/`) with each case's outcome recorded (`FUSEDRL_FAULT_TABLE`) and prints, per fault,
the agent families it hit, the injection points tried, how many runs came back bit-identical after
--resume, how many stopped with one clear line and their output intact, and the cases lost (failed:
the test's assertion names what broke).

    python benchmarks/faults.py            # pytest-xdist over 2 workers
    python benchmarks/faults.py -n 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_suite(workers: int, folder: Path) -> tuple[list[dict], list[str], float]:
    """(recorded outcomes, node ids of failed cases, seconds) of one run of tests/faults."""
    records, junit = folder / "outcomes.jsonl", folder / "junit.xml"
    env = {**os.environ, "FUSEDRL_FAULT_TABLE": str(records)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/faults"]
    command += ["-m", "slow or not slow"]  # every case: the default run leaves repeated kinds out
    command += ["-n", str(workers), "--dist", "loadgroup", f"--junitxml={junit}"]
    status = subprocess.run(command, cwd=REPO, env=env, check=False).returncode
    if not junit.exists():
        raise SystemExit(f"faults: pytest ended with status {status} and wrote no report")
    lines = records.read_text().splitlines() if records.exists() else []
    outcomes = [json.loads(line) for line in lines]
    suite = ElementTree.parse(junit).getroot()
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    seconds = sum(float(s.get("time", 0)) for s in suite.iter("testsuite"))
    return outcomes, failed, seconds


def table(outcomes: list[dict], failed: list[str]) -> list[str]:
    """Markdown rows: fault | families | points tried | identical | stopped cleanly, then the cases
    lost (a case is recorded only once all its checks passed, so a failed case is a lost one)."""
    rows: dict[str, dict] = defaultdict(lambda: {"families": set(), "identical": 0, "stopped": 0})
    for outcome in outcomes:
        row = rows[outcome["fault"]]
        row["families"].add(outcome["family"])
        row["identical" if outcome["outcome"] == "identical" else "stopped"] += 1
    lines = [
        "| fault | families | points tried | identical after resume | stopped cleanly |",
        "|---|---|---|---|---|",
    ]
    for fault, row in rows.items():
        tried = row["identical"] + row["stopped"]
        families = ", ".join(sorted(row["families"]))
        lines.append(f"| {fault} | {families} | {tried} | {row['identical']} | {row['stopped']} |")
    lines.append(f"| lost (failed cases) | | {len(failed)} | | |")
    return lines


def main() -> None:
    """Run the suite and print its table (exit status 1 if a case failed)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2, help="pytest-xdist workers (default 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        outcomes, failed, seconds = run_suite(args.n, Path(folder))
    print("\n".join(table(outcomes, failed)))
    print(f"\n{len(outcomes)} cases recorded, {len(failed)} failed, {seconds:.0f} s of tests")
    for node in failed:
        print("failed:", node)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
