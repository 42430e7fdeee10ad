"""What a run's compile time goes into, per packaged config: building the agent, tracing and
lowering `init` and the log point's program, the size of each program (StableHLO ops), compiling
each, and the part of the log point's program that the greedy evaluation adds (the same config
compiled with its evaluation turned off).

    python benchmarks/compile_profile.py ppo_cartpole dqn_cartpole pqn_cartpole [--json out.json]
    python benchmarks/compile_profile.py ppo_cartpole --override agent.unroll=8

Every program is compiled afresh (no persistent cache), on the default device, at 1 seed unless
`--seeds` says otherwise; each config runs in a process of its own, so one's compiles do not warm
the next. The table gives seconds and StableHLO op counts; `eval` is the log point's compile with
evaluation on minus off (and its ops), for configs that evaluate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EVAL_KEYS = ("eval_envs", "eval_episodes")


def op_count(lowered) -> int:
    """The StableHLO operations of a lowered program (its text's lines that assign a value)."""
    return sum(1 for line in lowered.as_text().splitlines() if " = " in line)


def profile(config_name: str, seeds: int, overrides: list[str], evaluate: bool) -> dict:
    """Seconds to build, trace+lower and compile `init` and the log point, and their op counts."""
    import jax

    from rl.config import load_config
    from rl.run.compile_cache import compilation_cache
    from rl.run.programs import make_programs, run_mesh

    config = load_config(config_name, [f"run.seeds={seeds}", *overrides])
    eval_key = next((k for k in EVAL_KEYS if getattr(config.agent, k, 0)), None)
    if not evaluate and eval_key is not None:
        config = load_config(config_name, [f"run.seeds={seeds}", *overrides, f"agent.{eval_key}=0"])
    with compilation_cache("off"):
        start = time.perf_counter()
        trainer, init, chunk, keys, hparams = make_programs(
            config, [{}], run_mesh(config, None, "seeds")
        )
        built = time.perf_counter()
        init_lowered = init.trace(keys, hparams).lower()
        log_point_lowered = chunk(1, donate=True).trace(init_lowered.out_info, hparams).lower()
        lowered = time.perf_counter()
        init_lowered.compile()
        init_compiled = time.perf_counter()
        log_point_lowered.compile()
        done = time.perf_counter()
    return {
        "config": config_name,
        "device": jax.devices()[0].device_kind,
        "evaluates": eval_key is not None,
        "build_s": built - start,
        "trace_lower_s": lowered - built,
        "init_compile_s": init_compiled - lowered,
        "log_point_compile_s": done - init_compiled,
        "init_ops": op_count(init_lowered),
        "log_point_ops": op_count(log_point_lowered),
    }


def in_subprocess(config_name: str, seeds: int, overrides: list[str], evaluate: bool) -> dict:
    """`profile` in a fresh Python process (so no compile warms another)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",  # not the script's path: benchmarks/envs.py would shadow the envs package
            "benchmarks.compile_profile",
            "--one",
            config_name,
            "--seeds",
            str(seeds),
            *(["--no-eval"] if not evaluate else []),
            *[f"--override={o}" for o in overrides],
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if done.returncode != 0:
        raise SystemExit(f"{config_name}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--override", action="append", default=[])
    parser.add_argument("--json")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-eval", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(profile(args.configs[0], args.seeds, args.override, not args.no_eval)))
        return
    rows = []
    for name in args.configs:
        row = in_subprocess(name, args.seeds, args.override, evaluate=True)
        if row["evaluates"]:
            plain = in_subprocess(name, args.seeds, args.override, evaluate=False)
            row["eval_compile_s"] = row["log_point_compile_s"] - plain["log_point_compile_s"]
            row["eval_ops"] = row["log_point_ops"] - plain["log_point_ops"]
        rows.append(row)
    header = (
        "| config | build s | trace+lower s | init compile s (ops) | log point compile s (ops) "
        "| of which eval s (ops) |"
    )
    print(f"{rows[0]['device']}, {args.seeds} seed(s)\n{header}\n|---|---|---|---|---|---|")
    for r in rows:
        evaluation = (
            f"{r['eval_compile_s']:.2f} ({r['eval_ops']:,})" if r["evaluates"] else "no eval"
        )
        print(
            f"| {r['config']} | {r['build_s']:.2f} | {r['trace_lower_s']:.2f} "
            f"| {r['init_compile_s']:.2f} ({r['init_ops']:,}) "
            f"| {r['log_point_compile_s']:.2f} ({r['log_point_ops']:,}) | {evaluation} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
