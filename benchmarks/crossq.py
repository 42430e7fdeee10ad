"""CrossQ on Pendulum-v1: fusedrl's (`configs/crossq_pendulum.yaml`, its seeds vmapped in one
program) and, with `--sbx-python`, sbx's `CrossQ` at the same settings, side by side on this
machine.

    python benchmarks/crossq.py --seeds 2 --first-seed 10000 --steps 10000 \\
        [--sbx-python /tmp/sbxvenv/bin/python] [--json out.json]

Both are timed end to end (process start to the printed result, compilation counted): fusedrl's
`rl train` once for all seeds, sbx once per seed (one process each; its seeds run one after another,
so its time is the sum). The return is the mean over 8 deterministic episodes of the final policy:
fusedrl's `eval_return` at its last log point, sbx's from `evaluate_policy` on a fresh
`Pendulum-v1`. sbx is not a dependency of fusedrl: install it into a scratch environment
(`python -m venv --system-site-packages /tmp/sbxvenv && /tmp/sbxvenv/bin/pip install sbx-rl`) and
pass that environment's python.

The settings match where both libraries have them: 256x256 actor, critic widths `--critic`, batch
256, lr 1e-3 with Adam b1 = 0.5, one gradient step per env step, policy delay 3, `learning_starts`
1000, buffer 100k, automatic temperature from 1 toward -|A|, batch renorm momentum 0.99 with 100k
warm-up steps. sbx's actor also renormalises its layers (its default; `--sbx-plain-actor` turns
that off, as fusedrl's actor is a plain MLP), and it clips the log-std to [-20, 2] where fusedrl
bounds it smoothly in [-5, 2].
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SBX_RUN = """
import sys, time
start = time.perf_counter()
import gymnasium as gym, sbx
from sbx import CrossQ
from stable_baselines3.common.evaluation import evaluate_policy
seed, steps, critic, plain_actor = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
model = CrossQ(
    "MlpPolicy", "Pendulum-v1", learning_rate=1e-3, buffer_size=100_000, learning_starts=1000,
    batch_size=256, gamma=0.99, policy_delay=3, seed=seed,
    policy_kwargs=dict(
        net_arch=dict(pi=[256, 256], qf=[int(w) for w in critic.split(",")]),
        batch_norm_actor=plain_actor != "1",
    ),
)
model.learn(total_timesteps=steps)
mean, _ = evaluate_policy(model, gym.make("Pendulum-v1"), n_eval_episodes=8, deterministic=True)
print("SBX_RESULT", sbx.__version__, float(mean), time.perf_counter() - start)
"""


def run_fusedrl(seeds: int, first_seed: int, steps: int, critic: str) -> dict:
    """`rl train crossq_pendulum` for `seeds` vmapped seeds from `first_seed`: per-seed final
    eval_return and the wall clock of the whole process."""
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable, "-m", "rl.cli.main", "train", "crossq_pendulum", "--seeds", str(seeds),
            "--output-dir", out, "--name", "run", "--no-progress", f"run.seed={first_seed}",
            f"agent.total_steps={steps}", f"agent.network.critic_hidden=[{critic}]",
        ]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        summary = json.loads((Path(out) / "run" / "summary.json").read_text())
    per_seed = summary["settings"][0]["per_seed"]
    return {"returns": per_seed, "seconds": seconds, "compile_seconds": summary["compile_seconds"]}


def run_sbx(python: str, seeds: int, first_seed: int, steps: int, critic: str, plain: bool):
    """sbx's CrossQ, one process per seed: per-seed returns, the summed wall clock, its version."""
    returns, seconds, version = [], 0.0, None
    for seed in range(first_seed, first_seed + seeds):
        start = time.perf_counter()
        done = subprocess.run(
            [python, "-c", SBX_RUN, str(seed), str(steps), critic, "1" if plain else "0"],
            check=True,
            capture_output=True,
            text=True,
        )
        seconds += time.perf_counter() - start
        line = next(x for x in done.stdout.splitlines() if x.startswith("SBX_RESULT"))
        _, version, value, _ = line.split()
        returns.append(float(value))
    return {"returns": returns, "seconds": seconds, "version": version}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=10_000, help="env steps per seed")
    parser.add_argument("--critic", default="512,512", help="critic widths, comma-separated")
    parser.add_argument("--sbx-python", help="a python with sbx-rl installed (else fusedrl only)")
    parser.add_argument("--sbx-plain-actor", action="store_true", help="sbx's actor without BRN")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    results = {"fusedrl": run_fusedrl(args.seeds, args.first_seed, args.steps, args.critic)}
    if args.sbx_python:
        results["sbx"] = run_sbx(
            args.sbx_python, args.seeds, args.first_seed, args.steps, args.critic,
            args.sbx_plain_actor,
        )  # fmt: skip
    for name, result in results.items():
        returns = ", ".join(f"{r:.1f}" for r in result["returns"])
        print(f"{name}: returns [{returns}] at {args.steps} steps, {result['seconds']:.0f} s")
    if "sbx" in results:
        ratio = results["sbx"]["seconds"] / results["fusedrl"]["seconds"]
        print(f"wall clock, sbx / fusedrl: {ratio:.2f}x (sbx {results['sbx']['version']})")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **results}, indent=2))


if __name__ == "__main__":
    main()
