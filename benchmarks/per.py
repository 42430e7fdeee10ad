"""Prioritized replay's cost: the whole training program with PER against the same program with
uniform replay, and the replay operations alone.

    python benchmarks/per.py ratio [--steps 10240] [--buffer-size 100000] [--rounds 7] \\
        [--json out.json]
    python benchmarks/per.py ops [--capacities 4096 16384 100000] [--steps 512]

`ratio` compiles three 1-seed CartPole programs at the same buffer size, network and replay ratio
(128 gradient steps per 256 env steps), then runs them in alternating order `--rounds` times (one
timed call each per round, order reversed every other round) and reports the median time per env
step of each (wall clock and process CPU time) and the ratios:

    rainbow_per    Rainbow with only PER switched on (no noisy, dueling, C51, n-step)
    rainbow_uniform  the same with agent.per=false
    dqn_uniform    DQN (configs/dqn_cartpole.yaml) with uniform replay

The target (issue 15) is rainbow_per / rainbow_uniform and rainbow_per / dqn_uniform <= 1.3.
On a shared CPU the CPU-time ratio is the steadier one; the load average is printed with each round.

`ops` times a jitted `lax.scan` of prioritized_sample + prioritized_update (batch 64, weights used
like a loss's) per step at each capacity, and of uniform_sample alone, median of 5 calls.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.dqn import compiled_program, machine  # noqa: E402
from rl.config import load_config  # noqa: E402
from rl.core import packing
from rl.replay import buffers

PER_ONLY = [
    "agent.noisy=false",
    "agent.dueling=false",
    "agent.distributional=false",
    "agent.n_step=1",
]


def sides(steps: int, buffer_size: int) -> dict:
    common = [
        "run.seeds=1",
        "run.progress=false",
        f"agent.total_steps={steps}",
        f"agent.buffer_size={buffer_size}",
    ]
    return {
        "rainbow_per": ("configs/rainbow_cartpole.yaml", common + PER_ONLY + ["agent.per=true"]),
        "rainbow_uniform": (
            "configs/rainbow_cartpole.yaml",
            common + PER_ONLY + ["agent.per=false"],
        ),
        "dqn_uniform": ("configs/dqn_cartpole.yaml", common),
    }


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_ratio(args) -> dict:
    programs, compile_s = {}, {}
    for name, (path, overrides) in sides(args.steps, args.buffer_size).items():
        compiled, keys, hparams, compile_s[name] = compiled_program(load_config(path, overrides))
        jax.block_until_ready(compiled(keys, hparams))  # one untimed call
        programs[name] = (compiled, keys, hparams)
        print(f"{name}: compiled in {compile_s[name]:.1f} s", flush=True)
    wall = {name: [] for name in programs}
    cpu = {name: [] for name in programs}
    for r in range(args.rounds):
        for name in list(programs)[:: 1 if r % 2 == 0 else -1]:
            compiled, keys, hparams = programs[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(compiled(keys, hparams))
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
        print(
            f"round {r}: "
            + ", ".join(f"{n} {wall[n][-1]:.3f} s" for n in programs)
            + f"; load {load()}",
            flush=True,
        )
    us = {
        kind: {n: float(np.median(v)) / args.steps * 1e6 for n, v in times.items()}
        for kind, times in (("wall", wall), ("cpu", cpu))
    }
    ratios = {
        kind: {
            f"rainbow_per / {other}": us[kind]["rainbow_per"] / us[kind][other]
            for other in ("rainbow_uniform", "dqn_uniform")
        }
        for kind in us
    }
    for kind in ("wall", "cpu"):
        print(
            f"median {kind} time per env step: "
            + ", ".join(f"{n} {v:.1f} us" for n, v in us[kind].items())
        )
        print(f"  ratios ({kind}): " + ", ".join(f"{k} = {v:.2f}" for k, v in ratios[kind].items()))
    print(f"load average at the end: {load()}")
    return {
        "kind": "ratio",
        "steps": args.steps,
        "buffer_size": args.buffer_size,
        "rounds": args.rounds,
        "compile_s": compile_s,
        "wall_s": wall,
        "cpu_s": cpu,
        "us_per_env_step": us,
        "ratios": ratios,
        "load_end": load(),
        "machine": machine(),
    }


def time_scan(step, state, steps: int) -> float:
    """Median seconds per step of a jitted lax.scan of `step` (5 timed calls after one untimed, each
    with its own key)."""
    run = jax.jit(lambda state, key: jax.lax.scan(step, state, jax.random.split(key, steps))[0])
    keys = jax.random.split(
        jax.random.PRNGKey(0), 6
    )  # a fresh key per call: no call repeats another
    jax.block_until_ready(run(state, keys[0]))
    times = []
    for key in keys[1:]:
        start = time.perf_counter()
        jax.block_until_ready(run(state, key))
        times.append(time.perf_counter() - start)
    return float(np.median(times)) / steps


def run_ops(args) -> dict:
    rows = []
    item = {"obs": jnp.zeros((4,)), "reward": jnp.float32(0)}
    for capacity in args.capacities:
        full = {"obs": jnp.ones((capacity, 4)), "reward": jnp.ones((capacity,))}
        empty = buffers.prioritized_init(item, capacity)
        per = empty._replace(  # full, every leaf 1
            storage=packing.pack(empty.layout, full),
            size=jnp.int32(capacity),
            tree=buffers.sumtree_from_leaves(jnp.ones((capacity,))),
        )
        uniform = buffers.uniform_add(buffers.uniform_init(item, capacity), full)

        def per_step(carry, key):
            buf, acc = carry
            items, idx, weights = buffers.prioritized_sample(buf, key, 64, 0.5)
            td = items["obs"].sum(-1) - items["reward"] + jax.random.uniform(key, (64,))
            return (
                buffers.prioritized_update(buf, idx, jnp.abs(td) + 1e-6, 0.6),
                acc + jnp.mean(weights * td**2),
            ), None

        def uniform_step(carry, key):
            buf, acc = carry
            items, _ = buffers.uniform_sample(buf, key, 64)
            return (buf, acc + jnp.mean((items["obs"].sum(-1) - items["reward"]) ** 2)), None

        per_us = time_scan(per_step, (per, jnp.float32(0)), args.steps) * 1e6
        uniform_us = time_scan(uniform_step, (uniform, jnp.float32(0)), args.steps) * 1e6
        rows.append(
            {"capacity": capacity, "per_sample_update_us": per_us, "uniform_sample_us": uniform_us}
        )
        print(
            f"capacity {capacity:7d}: PER sample + update {per_us:7.1f} us/step, "
            f"uniform sample {uniform_us:6.1f} us/step; load {load()}",
            flush=True,
        )
    return {"kind": "ops", "steps": args.steps, "rows": rows, "machine": machine()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    ratio = sub.add_parser("ratio")
    ratio.add_argument(
        "--steps",
        type=int,
        default=10_240,
        help="env steps per seed (a multiple of the log interval)",
    )
    ratio.add_argument("--buffer-size", type=int, default=100_000)
    ratio.add_argument("--rounds", type=int, default=7)
    ops = sub.add_parser("ops")
    ops.add_argument("--capacities", type=int, nargs="+", default=[4_096, 16_384, 100_000])
    ops.add_argument("--steps", type=int, default=512)
    for p in (ratio, ops):
        p.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    result = run_ratio(args) if args.mode == "ratio" else run_ops(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
