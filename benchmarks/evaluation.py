"""The stratified bootstrap of rl.cli.evaluation: how long 50,000 resamples of 100 runs x 10 tasks
take for the four aggregates (IQM, median, mean, optimality gap) together.

    python benchmarks/evaluation.py [--reps 50000] [--runs 100] [--tasks 10] [--calls 7]

Scores are drawn once (a normal per task around its own mean); each call is a whole
`rl.cli.evaluation.bootstrap_intervals` (pooling, resampling, the four aggregates, the percentile
intervals), timed on the wall clock after one warm-up call. Prints each call's time, the median
and the range, with the load average (the target, issue 69: < 1 s on the 2-core CPU).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl.cli.evaluation import AGGREGATES, bootstrap_intervals  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--calls", type=int, default=7)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    scores = rng.normal(rng.uniform(0, 1, size=args.tasks), 0.3, size=(args.runs, args.tasks))
    bootstrap_intervals(scores, AGGREGATES, reps=1_000)  # warm-up
    times = []
    for _ in range(args.calls):
        start = time.perf_counter()
        intervals = bootstrap_intervals(scores, AGGREGATES, reps=args.reps, seed=len(times))
        times.append(time.perf_counter() - start)
        print(f"  {times[-1]:.3f} s (load average {os.getloadavg()[0]:.2f})", flush=True)
    print(
        f"{args.reps:,} resamples of {args.runs} runs x {args.tasks} tasks, "
        f"{', '.join(AGGREGATES)}: median {np.median(times):.3f} s "
        f"(range {min(times):.3f}-{max(times):.3f} s over {args.calls} calls; "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"numpy {np.__version__})"
    )
    for name, interval in intervals.items():
        print(f"  {name}: {interval.point:.4f} [{interval.low:.4f}, {interval.high:.4f}]")


if __name__ == "__main__":
    main()
