"""Throughput of tabular Q-learning on GridWorld: agent-steps per second on ONE CPU core.

    python benchmarks/qlearning.py                       # 1 and 30 agents, two scenarios (below)
    python benchmarks/qlearning.py --agents 1 30 100 --repeats 9 agent.lr=0.2

Pins the process to one core (`os.sched_setaffinity`, as `taskset -c 0` does) and restricts XLA's
CPU backend to one thread (`--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`)
before jax is imported. For each scenario and agent count it compiles `jit(train)` (one agent) or
`jit(vmap(train))` once and reports the compile time apart, warms up once, then times `--repeats`
runs (fresh seeds each, synchronised with `block_until_ready`) and reports medians of

  * wall-clock time (`time.perf_counter`), the rate a user sees on this machine as loaded as it is;
  * process CPU time (`time.process_time`), the core time the run consumed: on a shared machine
    this is the steady-state cost of the program itself,
    without the time spent waiting for the core.

Scenarios (the whole training program is timed: epsilon-greedy acting, env steps, TD updates, the
greedy evaluation at every log point):

  * `config`: the config as `rl train` runs it (default: 20,000 steps, a log point every 1,000);
  * `long`: a long run, `--long-steps` steps with a log point every `--long-interval`, where the
    fixed cost of a log point (the greedy evaluation) is amortised: the per-step rate.

The per-log-point overhead printed last is
(config time - config steps x long per-step time) / points.
"""

from __future__ import annotations

import argparse
import os
import sys

CORE = 0


def pin_to_one_core() -> None:
    os.sched_setaffinity(0, {CORE})
    flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "configs", "qlearning_gridworld.yaml"
        ),
    )
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 30])
    parser.add_argument(
        "--scenarios", nargs="+", default=["config", "long"], choices=["config", "long"]
    )
    parser.add_argument(
        "--long-steps", type=int, default=1_000_000, help="env steps per agent in the long scenario"
    )
    parser.add_argument(
        "--long-interval", type=int, default=100_000, help="log interval in the long scenario"
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--no-pin", action="store_true", help="do not pin to one core / one XLA thread"
    )
    parser.add_argument(
        "overrides", nargs="*", help="dotted.key=value config overrides (both scenarios)"
    )
    args = parser.parse_args(argv)
    if not args.no_pin:
        pin_to_one_core()

    import platform
    import statistics
    import time

    import jax
    import numpy as np

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from rl.agents import qlearning
    from rl.config import load_config

    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}, "
        f"python {platform.python_version()}, cpu affinity {sorted(os.sched_getaffinity(0))}"
    )
    print(
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    scenario_overrides = {
        "config": [],
        "long": [
            f"agent.total_steps={args.long_steps}",
            f"agent.log_interval={args.long_interval}",
        ],
    }
    results = {}
    for scenario in args.scenarios:
        config = load_config(args.config, list(args.overrides) + scenario_overrides[scenario])
        steps, points = (
            config.agent.total_steps,
            config.agent.total_steps // config.agent.log_interval,
        )
        train = qlearning.make_train(config)
        for num_agents in args.agents:
            program = jax.jit(train) if num_agents == 1 else jax.jit(jax.vmap(train))

            def keys(r):
                base = jax.random.PRNGKey(1000 * r)
                return base if num_agents == 1 else jax.random.split(base, num_agents)

            start = time.perf_counter()
            compiled = program.lower(keys(0)).compile()
            compile_s = time.perf_counter() - start
            jax.block_until_ready(compiled(keys(0)))  # warm-up
            wall, cpu = [], []
            for r in range(1, args.repeats + 1):
                k = jax.block_until_ready(keys(r))
                start_wall, start_cpu = time.perf_counter(), time.process_time()
                _, metrics = jax.block_until_ready(compiled(k))
                wall.append(time.perf_counter() - start_wall)
                cpu.append(time.process_time() - start_cpu)
            greedy = np.asarray(metrics["greedy_episode_length"])[..., -1]
            row = dict(
                steps=steps,
                points=points,
                compile=compile_s,
                wall=statistics.median(wall),
                cpu=statistics.median(cpu),
                wall_min=min(wall),
            )
            results[scenario, num_agents] = row
            work = num_agents * steps
            print(
                f"{scenario:>6} {num_agents:>3} agents x {steps} steps ({points} log points): "
                f"compile {compile_s:.2f} s; wall median {row['wall'] * 1e3:.1f} ms (min "
                f"{row['wall_min'] * 1e3:.1f}) = {work / row['wall'] / 1e6:.2f} M agent-steps/s; "
                f"cpu median {row['cpu'] * 1e3:.1f} ms = {work / row['cpu'] / 1e6:.2f} M "
                f"agent-steps/s ({row['cpu'] / work * 1e9:.0f} ns/agent-step); "
                f"final greedy length {greedy.mean():.2f}",
                flush=True,
            )
    print()
    print(
        "| scenario | agents | steps/agent | log points | compile (s) | wall median (ms) | "
        "M agent-steps/s (wall) | CPU median (ms) | M agent-steps/s (CPU) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (scenario, num_agents), row in results.items():
        work = num_agents * row["steps"]
        print(
            f"| {scenario} | {num_agents} | {row['steps']:,} | {row['points']} | "
            f"{row['compile']:.2f} | {row['wall'] * 1e3:.1f} | {work / row['wall'] / 1e6:.2f} | "
            f"{row['cpu'] * 1e3:.1f} | {work / row['cpu'] / 1e6:.2f} |"
        )
    for num_agents in args.agents:
        if ("config", num_agents) in results and ("long", num_agents) in results:
            short, long = results["config", num_agents], results["long", num_agents]
            per_step = long["cpu"] / long["steps"]
            overhead = (short["cpu"] - short["steps"] * per_step) / short["points"]
            print(
                f"{num_agents} agents: CPU cost per log point (callback + greedy eval + period "
                f"setup) ~ {overhead * 1e6:.0f} us vs "
                f"{per_step * short['steps'] / short['points'] * 1e6:.0f} us for the "
                f"{short['steps'] // short['points']} steps between log points"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
