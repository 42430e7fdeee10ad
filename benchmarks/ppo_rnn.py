"""Recurrent PPO against feedforward PPO on a partially observable env (masked-velocity CartPole by
default): the same seeds and env-step budget for both, and the fraction of seeds whose greedy return
reaches the threshold.

    python benchmarks/ppo_rnn.py --seeds 16 --budget 1000000    # the issue's target, on the GPU
    python benchmarks/ppo_rnn.py --seeds 2 --budget 100000 --kernel-backend reference  # a CPU check
    python benchmarks/ppo_rnn.py --recurrent configs/ppo_rnn_cartpole_masked.yaml \\
        --feedforward configs/ppo_cartpole.yaml --observe positions --threshold 475 --json out.json

Each agent runs its own config (`--recurrent`, `--feedforward`) on the env of the recurrent config
with `env.observe` set to `--observe` (the velocities hidden: `envs.MaskObservation`), its
`agent.total_steps` cut to the whole log points that fit in `--budget` (so its learning-rate
annealing ends at the budget), all seeds in one compiled program, and is judged as
`benchmarks/ppo.py learning` does: the greedy evaluation return (`eval_return`, the mean of the
config's `eval_envs` greedy episodes at each log point) of each seed at the last log point within
the budget, and whether it reached the threshold at any log point so far. The per-log-point tables
come first, then one summary row per agent. Nothing is printed that was not measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ppo import learning, load, machine  # noqa: E402  (the PPO script's learning runner is agent-agnostic)


def fit_to_budget(config_path: str, overrides: list[str], seeds: int, budget: int) -> list[str]:
    """`overrides` plus agent.total_steps = the whole log points of this config within `budget`."""
    agent = load(config_path, overrides, seeds).agent
    unit = agent.batch_size * agent.log_interval
    return overrides + [f"agent.total_steps={max(unit, budget // unit * unit)}"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--recurrent", default="configs/ppo_rnn_cartpole_masked.yaml", help="recurrent PPO config"
    )
    parser.add_argument(
        "--feedforward", default="configs/ppo_cartpole.yaml", help="feedforward PPO config"
    )
    parser.add_argument(
        "--observe",
        default="positions",
        help=(
            "env.observe for both (a preset or a list such as [0,2]; 'null': the full observation)"
        ),
    )
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--budget", type=int, default=1_000_000, help="env steps per seed")
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument(
        "--kernel-backend",
        default="auto",
        help="kernels backend (reference, triton, interpret, auto)",
    )
    parser.add_argument("--rows", type=int, default=8, help="learning table rows per agent")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)

    env = load(args.recurrent, [], 1).env
    env_id, env_overrides = (
        env.id,
        [
            f"env.id={env.id}",
            f"env.params={json.dumps(dict(env.params))}",
            f"env.observe={args.observe}",
        ],
    )
    results = {"machine": machine(), "agents": {}}
    for label, path in (("recurrent", args.recurrent), ("feedforward", args.feedforward)):
        overrides = fit_to_budget(path, env_overrides, args.seeds, args.budget)
        run = argparse.Namespace(
            config=path,
            overrides=overrides,
            seeds=args.seeds,
            kernel_backend=args.kernel_backend,
            threshold=args.threshold,
            budget=args.budget,
            rows=args.rows,
            run_dir=None,
        )
        print(f"== {label}: {path} {' '.join(overrides)}")
        results["agents"][label] = learning(run)
        print()

    print(
        f"{env_id} with env.observe={args.observe}, {args.seeds} seeds, "
        f"budget {args.budget} env steps, threshold {args.threshold}:"
    )
    print(
        "| agent | config | env steps | seeds >= threshold at the budget | reached by then | "
        "median greedy return | train time |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, path in (("recurrent", args.recurrent), ("feedforward", args.feedforward)):
        result = results["agents"][label]
        verdict = result["verdict"]
        print(
            f"| {label} | {path} | {verdict['log_point_step']} | "
            f"{verdict['frac_at_budget']:.0%} | {verdict['frac_reached_by_budget']:.0%} | "
            f"{verdict['median_at_budget']:.1f} | {result['train_s']:.1f} s |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=float))


if __name__ == "__main__":
    main()
