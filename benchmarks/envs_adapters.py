"""Adapter overhead: env steps per second through `envs.make("<library>:<id>")` against the
library's own env stepped the same way, side by side in one process, for gymnax, Brax and Craftax.

Usage:
    python benchmarks/envs_adapters.py        # every row whose library is installed, 4096 envs
    python benchmarks/envs_adapters.py --libraries gymnax,craftax --json out.json
    python benchmarks/envs_adapters.py --rows brax-ant-first --brax-backend mjx \\
        --steps 100 --runs 10
    # a short CPU check:
    python benchmarks/envs_adapters.py --num-envs 8 --steps 5 --runs 3 --brax-backend spring

Rows (each timed for fusedrl and for the library, same sizes, same random actions):
  gymnax-breakout   ours: envs.make("gymnax:Breakout-MinAtar"); library:
                    gymnax.make("Breakout-MinAtar")'s `step` (gymnax's auto-reset), vmapped the
                    same way
  brax-ant-first    ours: envs.make("brax:ant", backend=B, auto_reset="first"); library:
                    brax.envs.create("ant", backend=B, episode_length=1000) (EpisodeWrapper + Brax's
                    AutoResetWrapper, which restarts an env from its first state: the same work)
  brax-ant-fresh    ours with auto_reset="fresh" (a new random start every episode: one more
                    reset per step) against the same library step: the price of fresh starts, not
                    of the adapter
  craftax-symbolic  ours: envs.make("craftax:Craftax-Symbolic-v1"); library:
                    make_craftax_env_from_name("Craftax-Symbolic-v1", auto_reset=True).step
                    (which resets on every step and selects, as ours does)

Method (as benchmarks/envs.py): per row and side one jitted function runs `--steps` steps of N envs
as a `lax.scan` whose body splits the carried key, samples one uniformly random action per env (the
same sampler for both sides: the adapter's action space), steps all N envs in one vmap with a key
each (auto-reset included) and sums the rewards (so nothing is optimised away); env state and key
are carried across calls, so the envs are in steady state. Compile time (lower + compile) is
reported apart; both sides compile before either runs. After one warm-up call each, the two sides
are timed alternately (`--runs` calls each, every call synchronised with `block_until_ready`);
steps/s = N * steps / median call time, and the ratio fusedrl / library (1.00: no overhead; the
target is >= 0.95). A library that is not installed skips its rows (named in the output); `--json`
writes the results and the machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Callable, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import envs  # noqa: E402
from benchmarks.envs import format_rate, machine  # noqa: E402


class Side(NamedTuple):
    """One side of a row, batched over N envs: `reset(key) -> state`, `step(key, state, actions) ->
    (state, reward [N])`."""

    reset: Callable
    step: Callable


class Row(NamedTuple):
    library: str  # the module that must import for the row to run
    # (num_envs, brax_backend) -> (fusedrl Side, library Side, sample(key) -> actions [N])
    build: Callable


# ---------------------------------------------------------------- fusedrl's side


def fusedrl_side(env_id: str, num_envs: int, **make_kwargs):
    """(Side, sample) for `envs.make(env_id, **make_kwargs)` stepped through `envs.vectorize`; the
    sampler draws N actions uniformly from the adapter's action space."""
    env, params = envs.make(env_id, **make_kwargs)
    venv = envs.vectorize(env, num_envs)
    space = env.action_space(params)

    def step(key, state, actions):
        _, state, reward, _, _, _ = venv.step(key, state, actions, params)
        return state, reward

    sample = lambda key: jax.vmap(space.sample)(jax.random.split(key, num_envs))  # noqa: E731
    return Side(lambda key: venv.reset(key, params)[1], step), sample


def keyed_side(reset, step, params, num_envs: int, reward_index: int) -> Side:
    """A Side from gymnax-style `reset(key, params) -> (obs, state)` and `step(key, state, action,
    params) -> (obs, state, reward, ...)` (reward at `reward_index`), vmapped with one key per
    env."""
    batch_reset = jax.vmap(reset, in_axes=(0, None))
    batch_step = jax.vmap(step, in_axes=(0, 0, 0, None))

    def step_batch(key, state, actions):
        out = batch_step(jax.random.split(key, num_envs), state, actions, params)
        return out[1], out[reward_index]

    return Side(lambda key: batch_reset(jax.random.split(key, num_envs), params)[1], step_batch)


# ---------------------------------------------------------------- the rows (the library's side)


def gymnax_breakout(num_envs: int, brax_backend: str):
    import gymnax

    env, params = gymnax.make("Breakout-MinAtar")
    ours, sample = fusedrl_side("gymnax:Breakout-MinAtar", num_envs)
    return ours, keyed_side(env.reset, env.step, params, num_envs, reward_index=2), sample


def brax_ant(auto_reset: str) -> Callable:
    def build(num_envs: int, brax_backend: str):
        from brax import envs as brax_envs

        env = brax_envs.create(
            "ant", backend=brax_backend, episode_length=1000, action_repeat=1, auto_reset=True
        )
        reset, step = jax.vmap(env.reset), jax.vmap(env.step)

        def step_batch(key, state, actions):  # Brax's step takes no key
            state = step(state, actions)
            return state, state.reward

        library = Side(lambda key: reset(jax.random.split(key, num_envs)), step_batch)
        ours, sample = fusedrl_side(
            "brax:ant",
            num_envs,
            backend=brax_backend,
            episode_length=1000,
            action_repeat=1,
            auto_reset=auto_reset,
        )
        return ours, library, sample

    return build


def craftax_symbolic(num_envs: int, brax_backend: str):
    from craftax.craftax_env import make_craftax_env_from_name

    env = make_craftax_env_from_name("Craftax-Symbolic-v1", auto_reset=True)
    ours, sample = fusedrl_side("craftax:Craftax-Symbolic-v1", num_envs)
    return (
        ours,
        keyed_side(env.reset, env.step, env.default_params, num_envs, reward_index=2),
        sample,
    )


ROWS: dict[str, Row] = {
    "gymnax-breakout": Row("gymnax", gymnax_breakout),
    "brax-ant-first": Row("brax", brax_ant("first")),
    "brax-ant-fresh": Row("brax", brax_ant("fresh")),
    "craftax-symbolic": Row("craftax", craftax_symbolic),
}
DEFAULT_ROWS = (
    "gymnax-breakout",
    "brax-ant-first",
    "craftax-symbolic",
)  # brax-ant-fresh on request


# ---------------------------------------------------------------- measuring


def scan_runner(side: Side, sample: Callable, steps: int):
    """(init(key) -> carry, run(carry) -> (carry, reward_sum)): `steps` random steps of one side."""

    def init(key):
        reset_key, key = jax.random.split(key)
        return side.reset(reset_key), key

    def run(carry):
        def body(carry, _):
            state, key = carry
            key, action_key, step_key = jax.random.split(key, 3)
            state, reward = side.step(step_key, state, sample(action_key))
            return (state, key), jnp.sum(reward)

        carry, rewards = jax.lax.scan(body, carry, None, length=steps)
        return carry, jnp.sum(rewards)

    return init, run


def compile_side(side: Side, sample: Callable, steps: int):
    """[initial carry, the compiled run, compile seconds (lower + compile)];
    nothing run yet but the reset."""
    init, run = scan_runner(side, sample, steps)
    carry = jax.block_until_ready(jax.jit(init)(jax.random.PRNGKey(0)))
    start = time.perf_counter()
    compiled = jax.jit(run, donate_argnums=0).lower(carry).compile()
    return [carry, compiled, time.perf_counter() - start]


def warm_up(entry: list) -> None:
    """One synchronised call of a compiled side (its carry advanced in place)."""
    entry[0], total = entry[1](entry[0])
    jax.block_until_ready(total)


def time_alternately(compiled: dict, runs: int) -> dict:
    """{side: [seconds per call]}: `runs` synchronised calls of each side, the sides alternating."""
    times = {name: [] for name in compiled}
    for _ in range(runs):
        for name, entry in compiled.items():
            start = time.perf_counter()
            entry[0], total = entry[1](entry[0])
            jax.block_until_ready(total)
            times[name].append(time.perf_counter() - start)
    return times


def measure(row: str, num_envs: int, steps: int, runs: int, brax_backend: str) -> dict:
    """Both sides of a row at `num_envs`: compile seconds, median/min call seconds, steps/s,
    and the ratio."""
    ours, library, sample = ROWS[row].build(num_envs, brax_backend)
    compiled = {
        "fusedrl": compile_side(ours, sample, steps),
        "library": compile_side(library, sample, steps),
    }
    for entry in compiled.values():  # both compiled before either runs
        warm_up(entry)
    times = time_alternately(compiled, runs)
    result = {"row": row, "num_envs": num_envs, "steps": steps, "runs": runs}
    for name, entry in compiled.items():
        median = statistics.median(times[name])
        result[name] = {
            "compile_s": round(entry[2], 3),
            "median_s": median,
            "min_s": min(times[name]),
            "steps_per_s": num_envs * steps / median,
        }
    result["ratio"] = result["fusedrl"]["steps_per_s"] / result["library"]["steps_per_s"]
    return result


def installed(library: str) -> bool:
    return importlib.util.find_spec(library) is not None


def select_rows(rows: str | None, libraries: str | None) -> list[str]:
    """The rows asked for (`--rows`, else DEFAULT_ROWS), kept to `--libraries` if given;
    ValueError on unknown names."""
    chosen = [r for r in rows.split(",") if r] if rows else list(DEFAULT_ROWS)
    unknown = [r for r in chosen if r not in ROWS]
    if unknown:
        raise ValueError(f"unknown row(s) {unknown}; rows: {', '.join(ROWS)}")
    if libraries:
        wanted = [lib for lib in libraries.split(",") if lib]
        known = sorted({row.library for row in ROWS.values()})
        if any(lib not in known for lib in wanted):
            raise ValueError(f"unknown library in {wanted}; libraries: {', '.join(known)}")
        chosen = [r for r in chosen if ROWS[r].library in wanted]
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rows",
        default=None,
        help=f"comma-separated, of: {', '.join(ROWS)} (default: {', '.join(DEFAULT_ROWS)})",
    )
    parser.add_argument(
        "--libraries",
        default=None,
        help="only the rows of these libraries (comma-separated: gymnax, brax, craftax)",
    )
    parser.add_argument("--num-envs", default="4096", help="comma-separated batch sizes")
    parser.add_argument(
        "--steps", type=int, default=100, help="steps per timed call (the scan length)"
    )
    parser.add_argument(
        "--runs", type=int, default=10, help="timed calls per side and case (median reported)"
    )
    parser.add_argument(
        "--brax-backend", default="mjx", choices=("mjx", "generalized", "positional", "spring")
    )
    parser.add_argument(
        "--json", default=None, help="write the results and machine info to this file"
    )
    args = parser.parse_args(argv)
    try:
        rows = select_rows(args.rows, args.libraries)
    except ValueError as error:
        parser.error(str(error))
    sizes = [int(n) for n in args.num_envs.split(",") if n]
    if args.steps < 1 or args.runs < 1 or not sizes or any(n < 1 for n in sizes):
        parser.error("--steps, --runs and every --num-envs must be >= 1")

    info = machine()
    print(
        f"# {info['date']}  jax {info['jax']}  backend {info['backend']} ({info['device']}, "
        f"{info['cpu_count']} CPUs)"
    )
    print(
        f"# {args.steps} steps per call, median of {args.runs} calls per side, "
        f"sides timed alternately; Brax backend {args.brax_backend}"
    )
    header = (
        f"{'row':<18} {'num_envs':>8} {'fusedrl steps/s':>16} {'library steps/s':>16} "
        f"{'ratio':>6} {'compile s (f/l)':>16}"
    )
    print(header)
    print("-" * len(header))
    results, skipped = [], []
    for row in rows:
        if not installed(ROWS[row].library):
            skipped.append(row)
            print(f"{row:<18} skipped: {ROWS[row].library} is not installed", flush=True)
            continue
        for n in sizes:
            r = measure(row, n, args.steps, args.runs, args.brax_backend)
            results.append(r)
            compile_s = f"{r['fusedrl']['compile_s']:.1f}/{r['library']['compile_s']:.1f}"
            print(
                f"{row:<18} {n:>8} {format_rate(r['fusedrl']['steps_per_s']):>16} "
                f"{format_rate(r['library']['steps_per_s']):>16} {r['ratio']:>6.3f} "
                f"{compile_s:>16}",
                flush=True,
            )
            if args.json:  # after every row, so a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump(
                        {
                            "machine": info,
                            "args": vars(args),
                            "results": results,
                            "skipped": skipped,
                        },
                        f,
                        indent=1,
                    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"machine": info, "args": vars(args), "results": results, "skipped": skipped},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
