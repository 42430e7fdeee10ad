"""DQN, Rainbow and PQN on CartPole-v1: learning curves over many seeds, and training throughput.

    python benchmarks/dqn.py learning --agent dqn --seeds 16 [--json out.json] [agent.key=value ...]
    python benchmarks/dqn.py learning --agent rainbow --seeds 16 \\
        --config configs/rainbow_cartpole_no_per.yaml
    python benchmarks/dqn.py throughput --agent dqn --seeds 1 16 64 [--steps 20480]

`learning` trains all seeds in one compiled program (jit of vmap over seeds) from the agent's config
file (default configs/<agent>_cartpole.yaml) and prints, at fixed env-step budgets, the median and
interquartile range of the greedy evaluation return ("eval_return": the mean of `eval_episodes`
greedy episodes run inside the program at each log point), the fraction of seeds whose evaluation
return is >= the threshold AT that budget's log point, and the fraction that REACHED it at some
log point up to the budget. The learning targets (issue 5): DQN >= 475 within 100k env steps and
Rainbow within 60k, in >= 80% of 16 seeds; PQN (issue 13) >= 475 within 200k.

`throughput` measures env steps per second of the whole training program (env steps, acting,
replay, gradient steps at the config's ratio, evaluation) for each number of vmapped seeds, with
compilation timed apart (AOT `lower().compile()`), the median of `--repeats` runs.
Neither prints anything it did not measure; `--json` also writes the numbers to a file.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl.config import load_config  # noqa: E402
from rl.run.programs import build_program  # noqa: E402

BUDGETS = {
    "dqn": (20_000, 40_000, 60_000, 80_000, 100_000),
    "rainbow": (10_000, 20_000, 30_000, 40_000, 50_000, 60_000),
    "pqn": (50_000, 100_000, 150_000, 200_000),
}


def machine() -> dict:
    import jaxlib

    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "devices": [str(d) for d in jax.devices()],
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "command": " ".join(sys.argv),
    }


def compiled_program(config):
    program, keys, hparams = build_program(config)
    start = time.perf_counter()
    compiled = program.lower(keys, hparams).compile()
    return compiled, keys, hparams, time.perf_counter() - start


def learning_table(steps, eval_return, budgets, threshold):
    """Rows per budget: the last log point at or before it, median / IQR of eval_return there,
    fraction of seeds >= threshold there, fraction that reached threshold at any point up to it."""
    rows = []
    for budget in budgets:
        upto = np.flatnonzero(steps <= budget)
        if upto.size == 0:
            continue
        point = upto[-1]
        values = eval_return[:, point]
        q25, q50, q75 = np.percentile(values, [25, 50, 75])
        rows.append(
            {
                "budget": int(budget),
                "log_step": int(steps[point]),
                "median": float(q50),
                "iqr": [float(q25), float(q75)],
                "solved_at": float(np.mean(values >= threshold)),
                "reached_by": float(
                    np.mean((eval_return[:, : point + 1] >= threshold).any(axis=1))
                ),
            }
        )
    return rows


def run_learning(args) -> dict:
    config_path = args.config or f"configs/{args.agent}_cartpole.yaml"
    config = load_config(
        config_path, [f"run.seeds={args.seeds}", "run.progress=false", *args.overrides]
    )
    if config.agent.name != args.agent:
        raise SystemExit(f"--agent {args.agent} but {config_path} configures {config.agent.name}")
    compiled, keys, hparams, compile_s = compiled_program(config)
    start = time.perf_counter()
    _, metrics = jax.block_until_ready(compiled(keys, hparams))
    train_s = time.perf_counter() - start
    steps = np.asarray(metrics["step"])[0, 0]
    eval_return = np.asarray(metrics["eval_return"])[0]  # [seeds, log points]
    budgets = args.budgets or [b for b in BUDGETS[args.agent] if b <= config.agent.total_steps]
    rows = learning_table(steps, eval_return, budgets, args.threshold)
    first = [
        int(steps[np.argmax(r >= args.threshold)]) if (r >= args.threshold).any() else None
        for r in eval_return
    ]
    result = {
        "kind": "learning",
        "agent": args.agent,
        "config": config_path,
        "overrides": args.overrides,
        "seeds": args.seeds,
        "threshold": args.threshold,
        "compile_s": compile_s,
        "train_s": train_s,
        "env_steps_per_s": args.seeds * config.agent.total_steps / train_s,
        "table": rows,
        "first_step_reaching_threshold": first,
        "curves": {
            "step": steps.tolist(),
            "eval_return": eval_return.tolist(),
            "episode_return": np.asarray(metrics["episode_return"])[0].tolist(),
            "q_mean": np.asarray(metrics["q_mean"])[0].tolist(),
        },
        "machine": machine(),
    }
    print(
        f"{args.agent} {config_path} {' '.join(args.overrides)}: "
        f"{args.seeds} seeds x {config.agent.total_steps} env steps, compile {compile_s:.1f} s, "
        f"train {train_s:.1f} s ({result['env_steps_per_s']:,.0f} env steps/s all seeds)"
    )
    print(f"first log step with eval_return >= {args.threshold:g} per seed: {first}")
    print(
        "| env steps (log point) | median eval return | IQR | solved at this point | "
        "reached by this point |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['budget']:,} ({r['log_step']:,}) | {r['median']:.1f} | "
            f"{r['iqr'][0]:.1f} - {r['iqr'][1]:.1f} | {r['solved_at']:.0%} | "
            f"{r['reached_by']:.0%} |"
        )
    return result


def run_throughput(args) -> dict:
    config_path = args.config or f"configs/{args.agent}_cartpole.yaml"
    rows = []
    for seeds in args.seeds_list:
        overrides = [
            f"run.seeds={seeds}",
            "run.progress=false",
            f"agent.total_steps={args.steps}",
            *args.overrides,
        ]
        config = load_config(config_path, overrides)
        compiled, keys, hparams, compile_s = compiled_program(config)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            jax.block_until_ready(compiled(keys, hparams))
            times.append(time.perf_counter() - start)
        run_s = float(np.median(times))
        rows.append(
            {
                "seeds": seeds,
                "env_steps": args.steps,
                "compile_s": compile_s,
                "run_s": run_s,
                "env_steps_per_s": seeds * args.steps / run_s,
                "per_seed_steps_per_s": args.steps / run_s,
            }
        )
        print(
            f"{args.agent}: {seeds:3d} seeds x {args.steps} env steps: "
            f"compile {compile_s:6.1f} s, run {run_s:7.2f} s (median of {args.repeats}) "
            f"-> {seeds * args.steps / run_s:10,.0f} env steps/s "
            f"({args.steps / run_s:,.0f} per seed)",
            flush=True,
        )
    return {
        "kind": "throughput",
        "agent": args.agent,
        "config": config_path,
        "overrides": args.overrides,
        "rows": rows,
        "machine": machine(),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    for name in ("learning", "throughput"):
        p = sub.add_parser(name)
        p.add_argument("--agent", choices=tuple(BUDGETS), default="dqn")
        p.add_argument("--config", help="config file (default configs/<agent>_cartpole.yaml)")
        p.add_argument("--json", help="also write the results to this JSON file")
        p.add_argument("overrides", nargs="*", help="dotted.key=value config overrides")
        if name == "learning":
            p.add_argument("--seeds", type=int, default=16)
            p.add_argument("--threshold", type=float, default=475.0)
            p.add_argument(
                "--budgets",
                type=int,
                nargs="*",
                help="env-step budgets of the table (default per agent)",
            )
        else:
            p.add_argument("--seeds", dest="seeds_list", type=int, nargs="+", default=[1, 16, 64])
            p.add_argument(
                "--steps",
                type=int,
                default=20_480,
                help="env steps per seed (a multiple of the log interval)",
            )
            p.add_argument("--repeats", type=int, default=3)
    args, extras = parser.parse_known_args(argv)  # overrides may also follow the options
    unknown = [a for a in extras if a.startswith("-") or "=" not in a]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.overrides = list(args.overrides) + extras
    result = run_learning(args) if args.mode == "learning" else run_throughput(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
