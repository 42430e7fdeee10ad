"""Game scores of Atari runs in windows of env steps: fusedrl runs beside CleanRL's logs.

    python benchmarks/atari_scores.py --window 131072 --points 5,10,15,19 \\
        runs/ppo-envpool-Breakout-v5-20261129-084950 cleanrl_seed2.log

Each argument is a fusedrl run directory, whose metrics.jsonl has a row per log point with
`episode_return` (the mean unclipped score, over all lives, of the games that ended in the log
point's env steps), or the standard output of CleanRL's `ppo_atari_envpool.py`, which prints
`global_step=G, episodic_return=R` as each game ends (G counts env steps over all envs). CleanRL's
games are grouped into windows of `--window` env steps, (k - 1) window < G <= k window for the
k-th, as fusedrl's log points group theirs (set `--window` to agent.log_interval x
agent.num_envs x agent.num_steps). The table has each source's mean score in the windows
`--points` (1-based), the frames each window ends at (env steps x `--frame-skip`), the games in
each window and how far the source got. A window a source did not finish is marked with the step
it stopped at; one it did not reach is "-".
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

CLEANRL_GAME = re.compile(r"global_step=(\d+), episodic_return=\[?([-+0-9.eE]+)\]?")


def fusedrl_windows(run_dir: Path, window: int) -> tuple[dict[int, tuple[float, int]], int]:
    """({window k (1-based): (mean score, games)}, last env step) of a fusedrl run directory of one
    seed and setting whose log points are `window` env steps apart (SystemExit otherwise)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if len({(row.get("setting"), row.get("seed")) for row in rows}) > 1:
        raise SystemExit(f"{run_dir}: several seeds or settings; give runs of one seed each")
    for row in rows:
        if row["step"] != (row["log_point"] + 1) * window:
            raise SystemExit(
                f"{run_dir}: log point {row['log_point']} ends at step {row['step']}, not "
                f"{(row['log_point'] + 1) * window}: set --window to the run's env steps a log "
                "point (agent.log_interval x agent.num_envs x agent.num_steps)"
            )
    windows = {row["log_point"] + 1: (row["episode_return"], row["episodes"]) for row in rows}
    return windows, max(row["step"] for row in rows)


def cleanrl_windows(log: Path, window: int) -> tuple[dict[int, tuple[float, int]], int]:
    """({window k: (mean score, games)}, last step a game ended at) of a CleanRL stdout log."""
    games = [(int(step), float(score)) for step, score in CLEANRL_GAME.findall(log.read_text())]
    if not games:
        raise SystemExit(f"{log}: no 'global_step=..., episodic_return=...' lines")
    grouped: dict[int, list[float]] = {}
    for step, score in games:
        grouped.setdefault(-(-step // window), []).append(score)
    windows = {k: (sum(v) / len(v), len(v)) for k, v in grouped.items()}
    return windows, max(step for step, _ in games)


def table(sources, window: int, points: list[int], frame_skip: int) -> str:
    """The markdown table of `sources` ([(name, windows, last step)])."""
    frames = [f"{k * window * frame_skip / 1e6:.2f}M" for k in points]
    heads = " | ".join(f"score to {f} frames (games)" for f in frames)
    lines = [
        f"| source | {heads} | last step |",
        "|---" * (len(points) + 2) + "|",
    ]
    for name, windows, last in sources:
        cells = []
        for k in points:
            if k not in windows or (k - 1) * window >= last:
                cells.append("-")
                continue
            score, games = windows[k]
            partial = f", to step {last:,}" if last < k * window else ""
            cells.append(f"{score:.2f} ({games}{partial})")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {last:,} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", type=Path, help="fusedrl run dirs or CleanRL logs")
    parser.add_argument("--window", type=int, default=131072, help="env steps a window")
    parser.add_argument("--points", default="5,10,15,19", help="1-based windows to show")
    parser.add_argument("--frame-skip", type=int, default=4, help="frames an env step")
    args = parser.parse_args(argv)
    points = [int(k) for k in args.points.split(",")]
    sources = []
    for path in args.sources:
        if path.is_dir():
            sources.append((path.name, *fusedrl_windows(path, args.window)))
        else:
            sources.append((path.name, *cleanrl_windows(path, args.window)))
    print(table(sources, args.window, points, args.frame_skip))


if __name__ == "__main__":
    main()
