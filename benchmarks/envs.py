"""Env steps per second with a random policy, for each env and batch size.

Usage:
    python benchmarks/envs.py                                   # every env, 1 / 1024 / 65536 envs
    python benchmarks/envs.py --envs CartPole-v1 --num-envs 2048,65536 --steps 1000 --json out.json
    python benchmarks/envs.py --num-envs 65536 --steps 50 --runs 3   # a short CPU run

Method: for each (env, N) one jitted function runs `--steps` steps of N envs as a `lax.scan` whose
body samples a uniformly random action per env from the action space and steps
`envs.vectorize(env, N)` (one vmap, auto-reset included), carrying the env state and key across
calls (so the envs are in steady state, with episodes ending and resetting as they do in training).
Compile time (lower + compile) is reported apart. Each timed call is synchronised with
`block_until_ready`, after one warm-up call; the table reports the median of `--runs` calls and
steps/s = N * steps / median. The scan returns the summed reward so nothing is optimised away.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import envs  # noqa: E402

DEFAULT_ENVS = [
    "CartPole-v1",
    "Pendulum-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Acrobot-v1",
    "GridWorld",
]


def make_runner(env_id: str, num_envs: int, steps: int):
    """(init(key) -> carry, run(carry) -> (carry, reward_sum)) for `steps` random steps
    of `num_envs` envs."""
    env, params = envs.make(env_id)
    venv = envs.vectorize(env, num_envs)
    space = env.action_space(params)

    def init(key):
        reset_key, key = jax.random.split(key)
        _, state = venv.reset(reset_key, params)
        return state, key

    def run(carry):
        def body(carry, _):
            state, key = carry
            key, action_key, step_key = jax.random.split(key, 3)
            actions = jax.vmap(space.sample)(jax.random.split(action_key, num_envs))
            _, state, reward, _, _, _ = venv.step(step_key, state, actions, params)
            return (state, key), jnp.sum(reward)

        carry, rewards = jax.lax.scan(body, carry, None, length=steps)
        return carry, jnp.sum(rewards)

    return init, run


def measure(env_id: str, num_envs: int, steps: int, runs: int) -> dict:
    """Compile time and the median wall time of one call of `steps` steps of `num_envs` envs."""
    init, run = make_runner(env_id, num_envs, steps)
    carry = jax.jit(init)(jax.random.key(0))
    jax.block_until_ready(carry)
    start = time.perf_counter()
    compiled = jax.jit(run, donate_argnums=0).lower(carry).compile()
    compile_s = time.perf_counter() - start
    carry, total = compiled(carry)  # warm-up
    jax.block_until_ready(total)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        carry, total = compiled(carry)
        jax.block_until_ready(total)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {
        "env": env_id,
        "num_envs": num_envs,
        "steps": steps,
        "compile_s": round(compile_s, 3),
        "median_s": median,
        "min_s": min(times),
        "steps_per_s": num_envs * steps / median,
        "runs": runs,
    }


def machine() -> dict:
    device = jax.devices()[0]
    return {
        "date": datetime.date.today().isoformat(),
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or __import__("jaxlib").__version__,
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def format_rate(rate: float) -> str:
    return f"{rate / 1e6:.2f} M" if rate >= 1e6 else f"{rate / 1e3:.1f} k"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", default=",".join(DEFAULT_ENVS), help="comma-separated env ids")
    parser.add_argument("--num-envs", default="1,1024,65536", help="comma-separated batch sizes")
    parser.add_argument(
        "--steps", type=int, default=1000, help="steps per timed call (the scan length)"
    )
    parser.add_argument(
        "--runs", type=int, default=5, help="timed calls per case (median reported)"
    )
    parser.add_argument(
        "--json", default=None, help="write the results and machine info to this file"
    )
    args = parser.parse_args(argv)
    env_ids = [e for e in args.envs.split(",") if e]
    unknown = [e for e in env_ids if e not in envs.REGISTRY]
    if unknown:
        parser.error(f"unknown env id(s) {unknown}; known: {', '.join(envs.registered_ids())}")
    sizes = [int(n) for n in args.num_envs.split(",") if n]
    if args.steps < 1 or args.runs < 1 or any(n < 1 for n in sizes):
        parser.error("--steps, --runs and every --num-envs must be >= 1")

    info = machine()
    print(
        f"# {info['date']}  jax {info['jax']}  backend {info['backend']} ({info['device']}, "
        f"{info['cpu_count']} CPUs)"
    )
    print(f"# steps per call {args.steps}, median of {args.runs} calls")
    header = f"{'env':<26} {'num_envs':>8} {'compile s':>9} {'call ms':>9} {'steps/s':>10}"
    print(header)
    print("-" * len(header))
    results = []
    for env_id in env_ids:
        for n in sizes:
            r = measure(env_id, n, args.steps, args.runs)
            results.append(r)
            print(
                f"{env_id:<26} {n:>8} {r['compile_s']:>9.2f} {r['median_s'] * 1e3:>9.2f} "
                f"{format_rate(r['steps_per_s']):>10}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "args": vars(args), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
