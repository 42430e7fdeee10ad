"""Adapter overhead: env steps per second through `envs.make(...)` against the library's own vmapped
step, for Brax's ant and Craftax-Symbolic (the Brax and Craftax adapters of envs/).

Usage:
    python benchmarks/envs_adapters_ecosystem.py                                  # 4096 envs, 100 steps a call
    python benchmarks/envs_adapters_ecosystem.py --num-envs 8 --steps 5 --runs 2 --brax-backend spring   # a CPU check
    python benchmarks/envs_adapters_ecosystem.py --cases craftax-symbolic --json out.json

Cases (each timed for fusedrl and for the library, same sizes, same random actions):
  brax-ant-first   ours: envs.make("brax:ant", backend=B, auto_reset="first"); library:
                   brax.envs.create("ant", backend=B, episode_length=1000) (EpisodeWrapper + Brax's
                   AutoResetWrapper, which restarts an env from its first state: the same work)
  brax-ant-fresh   ours with auto_reset="fresh" (a new random start every episode: one more reset per
                   step) against the same library step: the price of fresh starts, not of the adapter
  craftax-symbolic ours: envs.make("craftax:Craftax-Symbolic-v1"); library:
                   make_craftax_env_from_name("Craftax-Symbolic-v1", auto_reset=True).step (which resets
                   on every step and selects, as ours does)

Method (as benchmarks/envs.py): per case and side one jitted function runs `--steps` steps of N envs
as a `lax.scan` whose body samples a uniformly random action per env and steps all N in one vmap
(auto-reset included), carrying state and key across calls; compile time is reported apart; after
one warm-up call, the median of `--runs` synchronised calls; steps/s = N * steps / median, and the
ratio ours / library (1.00 = no overhead; the target is >= 0.95).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import envs  # noqa: E402
from benchmarks.envs import format_rate, machine  # noqa: E402

CASES = ("brax-ant-first", "brax-ant-fresh", "craftax-symbolic")


def scan_runner(reset_batch, step_batch, sample_batch, steps: int):
    """(init(key) -> carry, run(carry) -> (carry, reward_sum)) around batched reset/step functions:
    `reset_batch(key) -> state`, `step_batch(key, state, actions) -> (state, reward)`,
    `sample_batch(key) -> actions`."""

    def init(key):
        reset_key, key = jax.random.split(key)
        return reset_batch(reset_key), key

    def run(carry):
        def body(carry, _):
            state, key = carry
            key, action_key, step_key = jax.random.split(key, 3)
            state, reward = step_batch(step_key, state, sample_batch(action_key))
            return (state, key), jnp.sum(reward)

        carry, rewards = jax.lax.scan(body, carry, None, length=steps)
        return carry, jnp.sum(rewards)

    return init, run


def ours(env, params, num_envs: int, steps: int):
    venv = envs.vectorize(env, num_envs)
    space = env.action_space(params)

    def step_batch(key, state, actions):
        _, state, reward, _, _, _ = venv.step(key, state, actions, params)
        return state, reward

    return scan_runner(lambda key: venv.reset(key, params)[1], step_batch, lambda key: jax.vmap(space.sample)(jax.random.split(key, num_envs)), steps)


def brax_library(backend: str, num_envs: int, steps: int):
    from brax import envs as brax_envs

    env = brax_envs.create("ant", backend=backend, episode_length=1000, action_repeat=1, auto_reset=True)
    reset, step = jax.vmap(env.reset), jax.vmap(env.step)

    def step_batch(key, state, actions):
        state = step(state, actions)
        return state, state.reward

    sample = lambda key: jax.random.uniform(key, (num_envs, env.action_size), minval=-1.0, maxval=1.0)  # noqa: E731
    return scan_runner(lambda key: reset(jax.random.split(key, num_envs)), step_batch, sample, steps)


def craftax_library(num_envs: int, steps: int):
    from craftax.craftax_env import make_craftax_env_from_name

    env = make_craftax_env_from_name("Craftax-Symbolic-v1", auto_reset=True)
    params = env.default_params
    reset = jax.vmap(env.reset, in_axes=(0, None))
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def step_batch(key, state, actions):
        _, state, reward, _, _ = step(jax.random.split(key, num_envs), state, actions, params)
        return state, reward

    sample = lambda key: jax.random.randint(key, (num_envs,), 0, env.num_actions)  # noqa: E731
    return scan_runner(lambda key: reset(jax.random.split(key, num_envs), params)[1], step_batch, sample, steps)


def runners(case: str, num_envs: int, steps: int, brax_backend: str):
    """(ours, library): two (init, run) pairs for the case."""
    if case.startswith("brax-ant"):
        auto_reset = case.rsplit("-", 1)[1]
        env, params = envs.make("brax:ant", backend=brax_backend, episode_length=1000, action_repeat=1, auto_reset=auto_reset)
        return ours(env, params, num_envs, steps), brax_library(brax_backend, num_envs, steps)
    if case == "craftax-symbolic":
        env, params = envs.make("craftax:Craftax-Symbolic-v1")
        return ours(env, params, num_envs, steps), craftax_library(num_envs, steps)
    raise ValueError(f"unknown case {case!r}; cases: {', '.join(CASES)}")


def measure(init, run, runs: int) -> dict:
    """Compile time and the median wall time of one call."""
    carry = jax.jit(init)(jax.random.PRNGKey(0))
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
    return {"compile_s": round(compile_s, 2), "median_s": statistics.median(times), "min_s": min(times)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=100, help="steps per timed call (the scan length)")
    parser.add_argument("--runs", type=int, default=5, help="timed calls per side (median reported)")
    parser.add_argument("--brax-backend", default="mjx", choices=("mjx", "generalized", "positional", "spring"))
    parser.add_argument("--json", default=None, help="write the results and machine info to this file")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; cases: {', '.join(CASES)}")
    if min(args.num_envs, args.steps, args.runs) < 1:
        parser.error("--num-envs, --steps and --runs must be >= 1")

    info = machine()
    print(f"# {info['date']}  jax {info['jax']}  backend {info['backend']} ({info['device']}, {info['cpu_count']} CPUs)")
    print(f"# {args.num_envs} envs, {args.steps} steps per call, median of {args.runs} calls; Brax backend {args.brax_backend}")
    header = f"{'case':<18} {'side':<8} {'compile s':>9} {'call ms':>10} {'steps/s':>10} {'ours/lib':>8}"
    print(header)
    print("-" * len(header))
    results = []
    for case in cases:
        (ours_init, ours_run), (lib_init, lib_run) = runners(case, args.num_envs, args.steps, args.brax_backend)
        row = {"case": case, "num_envs": args.num_envs, "steps": args.steps, "runs": args.runs}
        for side, (init, run) in (("library", (lib_init, lib_run)), ("ours", (ours_init, ours_run))):
            r = measure(init, run, args.runs)
            r["steps_per_s"] = args.num_envs * args.steps / r["median_s"]
            row[side] = r
            ratio = f"{row['ours']['steps_per_s'] / row['library']['steps_per_s']:.3f}" if side == "ours" else ""
            print(f"{case:<18} {side:<8} {r['compile_s']:>9.1f} {r['median_s'] * 1e3:>10.2f} {format_rate(r['steps_per_s']):>10} {ratio:>8}", flush=True)
        row["ratio"] = row["ours"]["steps_per_s"] / row["library"]["steps_per_s"]
        results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "args": vars(args), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
