"""Multi-agent training programs: wall clock and the team return they reach, per number of vmapped
seeds, compilation apart, for a side-by-side with JaxMARL's baselines at the same settings.

    python benchmarks/marl.py --config configs/ippo_mpe_spread.yaml --seeds 1,64
    python benchmarks/marl.py --config configs/pqn_vdn_mpe_spread.yaml --seeds 1,64 \\
        agent.total_steps=1000000 --json out.json

For each seed count: the whole training program (`rl.run.programs.build_program`, the config's own
log points and in-program evaluation) compiled ahead of time, then `--repeats` timed calls (the
first is the timing when `--repeats 1`; no warm-up call, as a training run has none). The team
return is the config's `episode_return` metric (the mean over agents of each agent's undiscounted
episode return, `envs.multi_agent.TeamEpisodeStatistics`) averaged over the last 5% of log points,
per seed; `eval_return` (greedy episodes) the same where the config evaluates.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ppo import compile_program, load, machine  # noqa: E402


def tail_mean(values: np.ndarray) -> np.ndarray:
    """Per seed, the mean over the last 5% (at least one) of the log points that are not NaN."""
    tail = max(1, values.shape[-1] // 20)
    return np.nanmean(values[..., -tail:], axis=-1)


def measure(config_path: str, overrides: list[str], seeds: int, repeats: int) -> dict:
    config = load(config_path, overrides, seeds)
    compiled, keys, hparams, compile_s = compile_program(config, config.kernels.backend)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _, metrics = jax.block_until_ready(compiled(keys, hparams))
        times.append(time.perf_counter() - start)
    row = {
        "config": config_path,
        "agent": config.agent.name,
        "env": config.env.id,
        "seeds": seeds,
        "env_steps_per_seed": int(np.asarray(metrics["step"])[0, 0, -1]),
        "compile_s": round(compile_s, 2),
        "run_s": [round(t, 3) for t in times],
        "median_s": round(float(np.median(times)), 3),
    }
    for name in ("episode_return", "eval_return"):
        if name in metrics:
            per_seed = tail_mean(np.asarray(metrics[name], np.float64)[0])
            row[f"final_{name}_per_seed"] = [round(float(x), 3) for x in per_seed]
            row[f"final_{name}_mean"] = round(float(np.mean(per_seed)), 3)
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--seeds", default="1", help="comma-separated seed counts")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", help="also write the rows and the machine here")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value config overrides")
    args = parser.parse_args(argv)
    rows = []
    for seeds in (int(s) for s in args.seeds.split(",")):
        row = measure(args.config, args.overrides, seeds, args.repeats)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
