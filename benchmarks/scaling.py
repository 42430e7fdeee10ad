"""Throughput of a config's training program with the seed axis sharded over 1, 2, ... devices.

    python benchmarks/scaling.py configs/qlearning_gridworld.yaml --devices 1,2 \\
        --seeds-per-device 64
    python benchmarks/scaling.py configs/ppo_cartpole.yaml --devices 1,2 --seeds 128 \\
        agent.total_steps=1000000

For each device count D it builds the same programs `rl train --devices D` runs
(rl.run.programs.make_programs: init, and `run` over a chunk of `--log-points` log points, jitted
with NamedSharding over a "seeds" mesh), compiles them (compile time reported apart), runs one
warm-up chunk, then times `--repeats` chunks, each continuing from the previous state (so caches are
not flattered by replaying the same inputs), synchronising the devices after each. It reports the
median env steps per second summed over all seeds, and the speed-up against the first device count
measured in the same run.

Weak scaling (default): `--seeds-per-device` seeds on each device, so the work grows with D. Strong
scaling: `--seeds N` fixes the total (N must be a multiple of every D). `--shard envs --seeds 1`
splits one agent's parallel envs instead (agent.num_envs must be a multiple of every D).

For a multi-GPU figure in benchmarks/RESULTS.md, name the machine, date, versions and command.
On the CPU, `XLA_FLAGS=--xla_force_host_platform_device_count=4` gives 4 host devices that share the
same cores: it checks the script runs, it does not measure scaling.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")


def count_collectives(hlo_text: str) -> dict:
    """How many instructions of each collective kind the compiled program holds (its async starts
    counted once). Seeds are independent, so a seed-sharded training chunk should hold none beyond
    the small gathers of the per-log-point metrics."""
    counts = {}
    for kind in COLLECTIVES:
        starts = len(re.findall(rf"= [^=]*\b{kind}-start\(", hlo_text))
        plain = len(re.findall(rf"= [^=]*\b{kind}\(", hlo_text))
        if starts + plain:
            counts[kind] = starts + plain
    return counts


def measure(
    config_path: str,
    overrides: list[str],
    devices: int,
    seeds: int,
    log_points: int,
    repeats: int,
    shard: str = "seeds",
) -> dict:
    import jax
    import numpy as np

    from rl.config import load_config
    from rl.run.distributed import seed_mesh, select_devices
    from rl.run.programs import make_programs

    config = load_config(config_path, [*overrides, f"run.seeds={seeds}", "run.progress=false"])
    mesh = seed_mesh(select_devices(devices, seeds if shard == "seeds" else None), axis=shard)
    trainer, init, chunk, keys, hparams = make_programs(config, [{}], mesh, shard)
    log_points = min(log_points, trainer.num_log_points)
    start = time.perf_counter()
    state = jax.block_until_ready(init(keys, hparams))
    program = chunk(log_points).lower(state, hparams).compile()
    compile_seconds = time.perf_counter() - start
    collectives = count_collectives(program.as_text())
    state, metrics = jax.block_until_ready(program(state, hparams))  # warm-up
    steps_per_chunk = None
    times = []
    for _ in range(repeats):
        before = int(np.max(np.asarray(metrics["step"])[..., -1]))
        start = time.perf_counter()
        state, metrics = jax.block_until_ready(program(state, hparams))
        times.append(time.perf_counter() - start)
        steps_per_chunk = int(np.max(np.asarray(metrics["step"])[..., -1])) - before
    seconds = statistics.median(times)
    return {
        "devices": devices,
        "shard": shard,
        "seeds": seeds,
        "log_points_per_chunk": log_points,
        "env_steps_per_seed_per_chunk": steps_per_chunk,
        "compile_seconds": round(compile_seconds, 3),
        "collectives": collectives,
        "median_chunk_seconds": seconds,
        "env_steps_per_second": steps_per_chunk * seeds / seconds if seconds > 0 else float("nan"),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value config overrides")
    parser.add_argument(
        "--devices", default="1,2", help="comma-separated device counts (default 1,2)"
    )
    parser.add_argument(
        "--seeds-per-device", type=int, default=64, help="weak scaling: seeds on each device"
    )
    parser.add_argument(
        "--seeds", type=int, help="strong scaling: total seeds (overrides --seeds-per-device)"
    )
    parser.add_argument("--log-points", type=int, default=5, help="log points per timed chunk")
    parser.add_argument("--repeats", type=int, default=5, help="timed chunks per device count")
    parser.add_argument(
        "--shard",
        choices=("seeds", "envs"),
        default="seeds",
        help="axis split over the devices (envs: one large agent; give --seeds 1)",
    )
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options

    import jax

    counts = [int(c) for c in args.devices.split(",")]
    available = len(jax.devices())
    if max(counts) > available:
        parser.error(
            f"--devices {args.devices}: only {available} {jax.devices()[0].platform} device(s) here"
        )
    rows = []
    for count in counts:
        seeds = args.seeds if args.seeds is not None else args.seeds_per_device * count
        rows.append(
            measure(
                args.config, args.overrides, count, seeds, args.log_points, args.repeats, args.shard
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    import jaxlib

    machine = (
        f"{jax.devices()[0].device_kind} x{available}, {platform.node()}, jax {jax.__version__}, "
        f"jaxlib {jaxlib.__version__}"
    )
    print(f"\n{args.config} {' '.join(args.overrides)}  ({machine}, {time.strftime('%Y-%m-%d')})")
    print(
        "| devices | seeds | env steps/s (all seeds) | speed-up | compile s | "
        "collectives in the chunk |"
    )
    print("|---|---|---|---|---|---|")
    base = rows[0]["env_steps_per_second"]
    for row in rows:
        print(
            f"| {row['devices']} | {row['seeds']} | {row['env_steps_per_second']:,.0f} | "
            f"{row['env_steps_per_second'] / base:.2f}x | {row['compile_seconds']:.1f} | "
            f"{', '.join(f'{k} {v}' for k, v in row['collectives'].items()) or 'none'} |"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": machine,
                    "config": args.config,
                    "overrides": args.overrides,
                    "rows": rows,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
