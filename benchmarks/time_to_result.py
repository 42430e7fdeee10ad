"""Time to result: whole processes, from start to the printed result, compilation counted.

    python benchmarks/time_to_result.py ppo --seeds 1 64 --rounds 3 \\
        --peer "python3 .peers/run_pjx_ppo.py {seeds}"
    python benchmarks/time_to_result.py pqn --seeds 1 --rounds 3 [--json out.json] [key=value ...]

Each round runs, for every seed count, the peer's own script (`--peer`, a command with `{seeds}`
in it, run from the repository root; left out, only fusedrl runs), then `rl train` at the peer's
settings twice: first with an empty compilation cache (a folder of its own per round, so the
program compiles), then again with the cache the first run filled (the second run of a config, as
a user starts it again). Sides alternate within a round. Each is timed from the subprocess's start
to its exit, and `rl train`'s summary.json gives its own split: start-up (imports, config, until
the compile starts), compile or cache load, train; "to first step" is start-up plus compile. The
table gives the median over rounds with the range, and the ratio of the peer's median to
fusedrl's. Extra `key=value` arguments are `rl train` overrides for fusedrl's side.

Presets (fusedrl's settings matching the peer script's):
- ppo: PureJaxRL `ppo.py`'s CartPole config (4 envs x 128 steps, 499,712 env steps, 4 epochs x 4
  minibatches, lr 2.5e-4 annealed, tanh 64 x 64, separate actor and critic), 16 log points, no
  greedy evaluation (PureJaxRL has none).
- dqn: PureJaxRL `dqn.py`'s CartPole config (10 envs, 500,000 env steps, buffer 10,000, batch
  128, a gradient step every 10 env steps, target every 500, 120 x 84), 10 log points, no greedy
  evaluation.
- pqn: purejaxql `pqn_cartpole.yaml` (32 envs x 64 steps, 499,712 env steps, 4 epochs x 16
  minibatches, 256 x 256 with LayerNorm, lr 1e-4 annealed), 16 log points, no greedy evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PRESETS = {
    "ppo": [
        "ppo_cartpole",
        "agent.total_steps=499712",
        "agent.num_envs=4",
        "agent.num_steps=128",
        "agent.num_epochs=4",
        "agent.num_minibatches=4",
        "agent.lr=2.5e-4",
        "agent.anneal_lr=true",
        "agent.gamma=0.99",
        "agent.gae_lambda=0.95",
        "agent.clip_eps=0.2",
        "agent.ent_coef=0.01",
        "agent.vf_coef=0.5",
        "agent.max_grad_norm=0.5",
        "agent.network.hidden=[64,64]",
        "agent.network.activation=tanh",
        "agent.shared_network=false",
        "agent.log_interval=61",
        "agent.eval_envs=0",
    ],
    "dqn": [
        "dqn_cartpole",
        "agent.total_steps=500000",
        "agent.num_envs=10",
        "agent.buffer_size=10000",
        "agent.batch_size=128",
        "agent.learning_starts=10000",
        "agent.train_freq=10",
        "agent.gradient_steps=1",
        "agent.lr=2.5e-4",
        "agent.target_update_interval=50",
        "agent.epsilon_end=0.05",
        "agent.epsilon_decay_steps=250000",
        "agent.double_q=false",
        "agent.loss=mse",
        "agent.network.hidden=[120,84]",
        "agent.max_grad_norm=1e9",
        "agent.eval_episodes=0",
        "agent.log_interval=50000",
    ],
    "pqn": [
        "pqn_cartpole",
        "agent.total_steps=499712",
        "agent.num_envs=32",
        "agent.num_steps=64",
        "agent.num_minibatches=16",
        "agent.num_epochs=4",
        "agent.lr=1e-4",
        "agent.anneal_lr=true",
        "agent.max_grad_norm=10",
        "agent.epsilon_end=0.2",
        "agent.epsilon_decay_fraction=0.2",
        "agent.q_lambda=0.95",
        "agent.reward_scale=0.1",
        "agent.network.hidden=[256,256]",
        "agent.eval_envs=0",
        "agent.log_interval=61",
    ],
}


def timed(command: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    """(seconds from start to exit, the finished process) of `command` run from the repo root."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{done.stderr[-3000:]}")
    return seconds, done


def fusedrl_run(preset: list[str], seeds: int, cache: Path, out: Path, extra: list[str]) -> dict:
    """One `rl train` process at `seeds` seeds with the compilation cache `cache`: its wall time
    and its summary's split."""
    name = f"ttr-{time.time_ns()}"
    command = [sys.executable, "-m", "rl.cli.main", "train", *preset, "--seeds", str(seeds)]
    command += ["--no-progress", "--output-dir", str(out), "--name", name, *extra]
    env = {**os.environ, "FUSEDRL_COMPILATION_CACHE": str(cache)}
    seconds, _ = timed(command, env)
    summary = json.loads((out / name / "summary.json").read_text())
    return {
        "wall": seconds,
        "startup": summary["startup_seconds"],
        "compile": summary["compile_seconds"],
        "from_cache": summary["programs_from_cache"],
        "whole_programs": summary.get("whole_programs"),  # loaded, stored, or why not
        "train": summary["train_seconds"],
        "first_step": summary["startup_seconds"] + summary["compile_seconds"],
        "result": summary["settings"][0]["median"],
    }


def peer_run(template: str, seeds: int) -> dict:
    """One process of the peer's script: its wall time and its last printed line."""
    seconds, done = timed(shlex.split(template.format(seeds=seeds)), dict(os.environ))
    lines = done.stdout.strip().splitlines()
    return {"wall": seconds, "printed": lines[-1] if lines else ""}


def spread(values: list[float]) -> str:
    """median (min-max) of `values`."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peer", help="the peer's command, with {seeds}")
    parser.add_argument("--json", help="write every measurement here")
    parser.add_argument("overrides", nargs="*", help="rl train overrides for fusedrl's side")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="time-to-result-") as scratch:
        scratch = Path(scratch)
        for round_index in range(args.rounds):
            for seeds in args.seeds:
                row = {"round": round_index, "seeds": seeds}
                if args.peer:
                    row["peer"] = peer_run(args.peer, seeds)
                cache = scratch / f"cache-{round_index}-{seeds}"
                preset = PRESETS[args.preset]
                row["cold"] = fusedrl_run(preset, seeds, cache, scratch, args.overrides)
                row["warm"] = fusedrl_run(preset, seeds, cache, scratch, args.overrides)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{args.preset}, {platform.node()}, rounds: {args.rounds}")
    print(
        "| seeds | peer s | fusedrl first run s (start-up, compile, train) | ratio | "
        "second run s (to first step) | ratio |"
    )
    print("|---|---|---|---|---|---|")
    for seeds in args.seeds:
        mine = [r for r in rows if r["seeds"] == seeds]
        cold = [r["cold"]["wall"] for r in mine]
        warm = [r["warm"]["wall"] for r in mine]
        split = ", ".join(
            f"{statistics.median(r['cold'][k] for r in mine):.1f}"
            for k in ("startup", "compile", "train")
        )
        first = spread([r["warm"]["first_step"] for r in mine])
        peer = [r["peer"]["wall"] for r in mine if "peer" in r]
        ratio = lambda ours: (
            f"{statistics.median(peer) / statistics.median(ours):.2f}x" if peer else "-"
        )
        print(
            f"| {seeds} | {spread(peer) if peer else '-'} | {spread(cold)} ({split}) | "
            f"{ratio(cold)} | {spread(warm)} ({first}) | {ratio(warm)} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
