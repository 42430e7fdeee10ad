"""Adapter overhead: env steps per second through `envs.make("<library>:<id>")` against the library's
own env stepped the same way, side by side in one process.

Usage:
    python benchmarks/envs_adapters.py                                  # every row whose library is installed, 4096 envs
    python benchmarks/envs_adapters.py --rows gymnax:Breakout-MinAtar --num-envs 4096 --steps 1000 --runs 20 --json out.json
    python benchmarks/envs_adapters.py --num-envs 8,64 --steps 100 --runs 5      # a short CPU run

Method: for each row and N, two jitted functions run `--steps` steps of N envs as a `lax.scan`, one
through fusedrl's adapter (`env.step` of `envs.make(id)`, vmapped over the envs), one through the
library's own API (for gymnax: `gymnax.make(id)`'s `env.step`, vmapped the same way). The scan body
is the same for both: split the carried key, sample one uniformly random action per env from that
side's action space, step every env with its own key (auto-reset included), sum the rewards (so
nothing is optimised away); the env state and key are carried across calls, so the envs are in
steady state. Compile time (lower + compile) is reported apart. After one warm-up call each, the
two sides are timed alternately (`--runs` calls each, every call synchronised with
`block_until_ready`), and the table reports steps/s = N * steps / median call time and the ratio
fusedrl / library (1.00: no overhead; the target is >= 0.95).

Rows: `ROWS` maps a fusedrl id to a function returning the library's own side as
(reset(key, params) -> (obs, state), step(key, state, action, params) -> (state, reward),
sample_action(key) -> action, params), written against the library's API only. Another adapter
(brax, craftax, ...) is one more entry; its library is imported only when its row runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import envs  # noqa: E402


def _load_env_benchmark():
    """benchmarks/envs.py (its machine() and format_rate()), loaded by path: its name clashes with the envs package."""
    spec = importlib.util.spec_from_file_location("benchmarks_envs", os.path.join(os.path.dirname(os.path.abspath(__file__)), "envs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- the library's own side, per row


def gymnax_native(env_id: str) -> Callable:
    def make():
        import gymnax

        env, params = gymnax.make(env_id)

        def step(key, state, action, params):
            _, state, reward, _, _, _ = env.step(key, state, action, params)
            return state, reward

        return env.reset, step, env.action_space(params).sample, params

    return make


ROWS: dict[str, Callable] = {
    "gymnax:Breakout-MinAtar": gymnax_native("Breakout-MinAtar"),
}


def fusedrl_side(env_id: str):
    env, params = envs.make(env_id)

    def step(key, state, action, params):
        _, state, reward, _, _, _ = env.step(key, state, action, params)
        return state, reward

    return env.reset, step, env.action_space(params).sample, params


# ---------------------------------------------------------------- measuring


def make_runner(side, num_envs: int, steps: int):
    """(init(key) -> carry, run(carry) -> (carry, reward_sum)): `steps` random steps of `num_envs` envs of one side."""
    reset, step, sample_action, params = side
    batch_reset = jax.vmap(reset, in_axes=(0, None))
    batch_step = jax.vmap(step, in_axes=(0, 0, 0, None))

    def init(key):
        reset_key, key = jax.random.split(key)
        _, state = batch_reset(jax.random.split(reset_key, num_envs), params)
        return state, key

    def run(carry):
        def body(carry, _):
            state, key = carry
            key, action_key, step_key = jax.random.split(key, 3)
            actions = jax.vmap(sample_action)(jax.random.split(action_key, num_envs))
            state, reward = batch_step(jax.random.split(step_key, num_envs), state, actions, params)
            return (state, key), jnp.sum(reward)

        carry, rewards = jax.lax.scan(body, carry, None, length=steps)
        return carry, jnp.sum(rewards)

    return init, run


def compiled_runner(side, num_envs: int, steps: int):
    """(carry after a warm-up call, compiled run, compile seconds)."""
    init, run = make_runner(side, num_envs, steps)
    carry = jax.block_until_ready(jax.jit(init)(jax.random.key(0)))
    start = time.perf_counter()
    compiled = jax.jit(run, donate_argnums=0).lower(carry).compile()
    compile_s = time.perf_counter() - start
    carry, total = compiled(carry)  # warm-up
    jax.block_until_ready(total)
    return carry, compiled, compile_s


def measure(row_id: str, num_envs: int, steps: int, runs: int) -> dict:
    """Both sides of a row at `num_envs`, timed alternately; steps/s of each and their ratio."""
    sides = {"fusedrl": fusedrl_side(row_id), "library": ROWS[row_id]()}
    state = {name: compiled_runner(side, num_envs, steps) for name, side in sides.items()}
    times = {name: [] for name in sides}
    for _ in range(runs):
        for name in sides:
            carry, compiled, compile_s = state[name]
            start = time.perf_counter()
            carry, total = compiled(carry)
            jax.block_until_ready(total)
            times[name].append(time.perf_counter() - start)
            state[name] = (carry, compiled, compile_s)
    result = {"row": row_id, "num_envs": num_envs, "steps": steps, "runs": runs}
    for name in sides:
        median = statistics.median(times[name])
        result[name] = {"compile_s": round(state[name][2], 3), "median_s": median, "min_s": min(times[name]), "steps_per_s": num_envs * steps / median}
    result["ratio"] = result["fusedrl"]["steps_per_s"] / result["library"]["steps_per_s"]
    return result


def available_rows() -> list[str]:
    """The rows whose library is installed (the prefix of the id is the library's module)."""
    return [row for row in ROWS if importlib.util.find_spec(row.partition(":")[0]) is not None]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default=None, help=f"comma-separated fusedrl ids (default: every installed one of {', '.join(ROWS)})")
    parser.add_argument("--num-envs", default="4096", help="comma-separated batch sizes")
    parser.add_argument("--steps", type=int, default=1000, help="steps per timed call (the scan length)")
    parser.add_argument("--runs", type=int, default=10, help="timed calls per side and case (median reported)")
    parser.add_argument("--json", default=None, help="write the results and machine info to this file")
    args = parser.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r] if args.rows else available_rows()
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown row(s) {unknown}; rows: {', '.join(ROWS)}")
    if not rows:
        parser.error(f"no row's library is installed (rows: {', '.join(ROWS)}); e.g. pip install \"fusedrl[gymnax]\"")
    sizes = [int(n) for n in args.num_envs.split(",") if n]
    if args.steps < 1 or args.runs < 1 or any(n < 1 for n in sizes):
        parser.error("--steps, --runs and every --num-envs must be >= 1")

    bench = _load_env_benchmark()
    info = bench.machine()
    print(f"# {info['date']}  jax {info['jax']}  backend {info['backend']} ({info['device']}, {info['cpu_count']} CPUs)")
    print(f"# steps per call {args.steps}, median of {args.runs} calls per side, sides timed alternately")
    header = f"{'row':<26} {'num_envs':>8} {'fusedrl steps/s':>16} {'library steps/s':>16} {'ratio':>6} {'compile s (f/l)':>16}"
    print(header)
    print("-" * len(header))
    results = []
    for row in rows:
        for n in sizes:
            r = measure(row, n, args.steps, args.runs)
            results.append(r)
            compile_s = f"{r['fusedrl']['compile_s']:.1f}/{r['library']['compile_s']:.1f}"
            print(f"{row:<26} {n:>8} {bench.format_rate(r['fusedrl']['steps_per_s']):>16} {bench.format_rate(r['library']['steps_per_s']):>16} "
                  f"{r['ratio']:>6.3f} {compile_s:>16}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "args": vars(args), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
