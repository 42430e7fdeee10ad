"""Speed of the fused gradient steps at each matmul precision (`kernels.precision`): float32, tf32,
bf16.

Usage (GPU machine):
    python benchmarks/precision.py                     # every step, shape and precision
    python benchmarks/precision.py --steps dqn sac --runs 50 --json precision.json
Smoke test on a CPU (tiny shapes, the interpreter standing in for the GPU; times mean nothing):
    python benchmarks/precision.py --small --kernel-backend interpret --runs 2 --warmup 0

What is timed (each vmapped over the seeds as the agents run them, inside one jitted program):
  dqn   `kernels.q_learning_grads_flat`: target, selector and online passes, TD loss, backward.
        PureJaxRL's CartPole DQN (obs 4, 120 x 84, 2 actions, 128 rows) at 1 and 64 seeds;
        configs/dqn_cartpole.yaml (128 x 128, 64 rows, double-Q) at 16 seeds.
  sac   `kernels.twin_q_grads_flat` then `kernels.sac_actor_grads_flat` (a critic step and an actor
        step): rejax's Pendulum (obs 3, action 1, 64 x 64, 256 rows) at 64 seeds; halfcheetah's
        sizes (obs 17, action 6, 256 rows) at the kernels' widest, 128 x 128, at 1 and 16 seeds.
  pqn   no fused PQN kernel exists (benchmarks/RESULTS.md, "Tried and did not pay"): PQN's
        minibatch gradient in XLA, autodiff of 0.5 (Q(s, a) - G)^2 through a 256 x 256 ReLU MLP
        without LayerNorm (obs 4, 2 actions, 128 rows) at 1 and 64 seeds, its matmuls by
        `kernels._mlp_tiles.reference_dot` at each precision: what bf16 buys XLA at PQN's width.
The fused steps run on `--kernel-backend` (triton); beside each, the same step on the reference
backend (XLA) at the same precision, for the ratio. Each row's "error" is the relative error
max |g - g_ieee| / max |g_ieee| of its gradient against the float32 ("ieee") reference on the same
inputs (checked before timing), so a fast row that computes something else shows.

Precisions: "float32" is the kernels' "ieee" (full float32 products; `kernels.precision: float32`
gives this only at `run.matmul_precision: highest`, TF32 otherwise), "tf32" the tensor cores' TF32,
"bf16" bfloat16 operands with float32 accumulation. The reference's "tf32" is XLA at the default
precision (TF32 on the GPU).

Method: `benchmarks/kernels.py`'s `time_per_call` (every timed function jitted over `--reps`
distinct input sets in one program, run for 0.2 s, then `--runs` samples of about 2 ms of
back-to-back calls with one device sync each; the median sample per call), after `--warmup` seconds
of matrix products. One process: DESIGN.md asks for the median of at least 3 processes with their
range before a figure goes into RESULTS.md, so run the script 3 times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.kernels import time_per_call, versions, warm_up_device  # noqa: E402

PRECISIONS = {"float32": "ieee", "tf32": "tf32", "bf16": "bf16"}  # label -> dot_precision


# ---------------------------------------------------------------- the steps


def dqn_steps(small: bool) -> list[tuple[str, int, Callable, Callable]]:
    """(shape label, seeds, make_inputs(key), step(backend, dot_precision) -> grads fn)."""
    from kernels import q_learning_grads_flat
    from kernels.q_grads import q_layout

    shapes = (
        [(2, 20, (8, 8), True)]
        if small
        else [(1, 128, (120, 84), False), (64, 128, (120, 84), False), (16, 64, (128, 128), True)]
    )
    out = []
    for seeds, rows, hidden, double_q in shapes:
        layout = q_layout(4, hidden, 2)

        def make(key, seeds=seeds, rows=rows, layout=layout):
            k = jax.random.split(key, 6)
            normal = lambda i, *shape: jax.random.normal(k[i], (seeds, *shape), jnp.float32)
            return (
                normal(0, rows, 4),
                jax.random.randint(k[1], (seeds, rows), 0, 2),
                normal(2, rows),
                jnp.full((seeds, rows), 0.99, jnp.float32),
                normal(3, rows, 4),
                0.1 * normal(4, layout.size),
                0.1 * normal(5, layout.size),
            )

        def step(backend, precision, layout=layout, double_q=double_q):
            return jax.vmap(
                lambda *xs: q_learning_grads_flat(
                    *xs, layout, loss="huber", double_q=double_q, dot_precision=precision,
                    backend=backend,
                )[0]
            )  # fmt: skip

        label = f"{rows} rows, {hidden[0]} x {hidden[1]}{', double-Q' if double_q else ''}"
        out.append((label, seeds, make, step))
    return out


def sac_steps(small: bool) -> list[tuple[str, int, Callable, Callable]]:
    from kernels import sac_actor_grads_flat, twin_q_grads_flat
    from kernels.sac_actor_grads import sac_actor_layout
    from kernels.twin_q_grads import twin_q_layout

    shapes = (
        [(2, 20, 3, 1, (8, 8))]
        if small
        else [(64, 256, 3, 1, (64, 64)), (1, 256, 17, 6, (128, 128)), (16, 256, 17, 6, (128, 128))]
    )
    out = []
    for seeds, rows, d, a, hidden in shapes:
        critic, actor = twin_q_layout(d, a, hidden), sac_actor_layout(d, hidden, a)

        def make(key, seeds=seeds, rows=rows, d=d, a=a, critic=critic, actor=actor):
            k = jax.random.split(key, 10)
            normal = lambda i, *shape: jax.random.normal(k[i], (seeds, *shape), jnp.float32)
            return (
                normal(0, rows, d), jnp.tanh(normal(1, rows, a)), normal(2, rows),
                jnp.full((seeds, rows), 0.99, jnp.float32), normal(3, rows, d),
                jnp.tanh(normal(4, rows, a)), 0.1 * normal(5, rows), 0.1 * normal(6, critic.size),
                0.1 * normal(7, critic.size), normal(8, rows, a), 0.1 * normal(9, actor.size),
            )  # fmt: skip

        def step(backend, precision, critic=critic, actor=actor):
            options = dict(dot_precision=precision, backend=backend)

            def one_seed(*xs):
                *batch, params, target, eps, actor_params = xs
                critic_grads = twin_q_grads_flat(*batch, params, target, critic, **options)[0]
                actor_grads = sac_actor_grads_flat(
                    batch[0], eps, jnp.float32(0.2), actor_params, params, actor, critic, **options
                )[0]
                return jnp.concatenate([critic_grads, actor_grads])

            return jax.vmap(one_seed)

        label = f"{rows} rows, obs {d}, action {a}, {hidden[0]} x {hidden[1]}: critic + actor"
        out.append((label, seeds, make, step))
    return out


def pqn_steps(small: bool) -> list[tuple[str, int, Callable, Callable]]:
    from kernels._mlp_tiles import reference_mlp

    shapes = [(2, 20, (16, 16))] if small else [(1, 128, (256, 256)), (64, 128, (256, 256))]
    out = []
    for seeds, rows, (h1, h2) in shapes:
        shapes_ = [(4, h1), (h1,), (h1, h2), (h2,), (h2, 2), (2,)]

        def make(key, seeds=seeds, rows=rows, shapes_=shapes_):
            k = jax.random.split(key, 9)
            normal = lambda i, *shape: jax.random.normal(k[i], (seeds, *shape), jnp.float32)
            layers = tuple(0.1 * normal(3 + i, *s) for i, s in enumerate(shapes_))
            return (
                normal(0, rows, 4),
                jax.random.randint(k[1], (seeds, rows), 0, 2),
                normal(2, rows),
                layers,
            )

        def step(backend, precision):
            del backend  # XLA only: no fused PQN kernel

            def loss(layers, obs, actions, targets):
                q = reference_mlp(layers, obs, "relu", precision)
                q_taken = jnp.take_along_axis(q, actions[:, None], axis=-1)[:, 0]
                return 0.5 * jnp.mean(jnp.square(q_taken - targets))

            def one_seed(obs, actions, targets, layers):
                grads = jax.grad(loss)(layers, obs, actions, targets)
                return jnp.concatenate([g.reshape(-1) for g in grads])

            return jax.vmap(one_seed)

        out.append((f"{rows} rows, {h1} x {h2} (XLA autodiff)", seeds, make, step))
    return out


STEPS = {"dqn": dqn_steps, "sac": sac_steps, "pqn": pqn_steps}


# ---------------------------------------------------------------- running


def relative_error(got, want) -> float:
    return float(jnp.max(jnp.abs(got - want)) / (jnp.max(jnp.abs(want)) + 1e-30))


def measure(name: str, args) -> list[dict]:
    rows = []
    for label, seeds, make, step in STEPS[name](args.small):
        keys = jax.random.split(jax.random.key(0), args.reps)
        input_sets = [make(k) for k in keys]
        want = jax.jit(step("reference", "ieee"))(*input_sets[0])
        sides = ["reference"] if name == "pqn" else [args.kernel_backend, "reference"]
        for precision_label, precision in PRECISIONS.items():
            for backend in sides:
                fn = step(backend, precision)
                error = relative_error(jax.jit(fn)(*input_sets[0]), want)
                seconds = time_per_call(fn, input_sets, args.runs)
                rows.append(
                    dict(step=name, shape=label, seeds=seeds, precision=precision_label,
                         backend="xla" if backend == "reference" else backend,
                         us=seconds * 1e6, error=error)
                )  # fmt: skip
                print_row(rows[-1], rows)
    return rows


def print_row(row: dict, rows: list[dict]) -> None:
    """One table line; "vs float32": the time of the same step, shape and backend at float32
    divided by this row's (above 1: faster than float32)."""
    base = next(
        r["us"]
        for r in rows
        if (r["step"], r["shape"], r["seeds"], r["backend"], r["precision"])
        == (row["step"], row["shape"], row["seeds"], row["backend"], "float32")
    )
    print(
        f"| {row['step']} | {row['shape']} | {row['seeds']} | {row['precision']} | "
        f"{row['backend']} | {row['us']:.1f} | {base / row['us']:.2f}x | {row['error']:.1e} |",
        flush=True,
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", nargs="+", choices=sorted(STEPS), default=["dqn", "sac", "pqn"])
    parser.add_argument("--kernel-backend", default="triton", choices=("triton", "interpret"))
    parser.add_argument("--runs", type=int, default=30, help="timed samples per row (median)")
    parser.add_argument("--reps", type=int, default=8, help="distinct input sets per program")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of matmuls first")
    parser.add_argument("--small", action="store_true", help="tiny shapes (a CPU smoke test)")
    parser.add_argument("--json", help="also write the rows and versions to this file")
    args = parser.parse_args(argv)
    info = versions()
    print(" ".join(f"{k} {v}" for k, v in info.items()))
    if args.warmup > 0:
        warm_up_device(args.warmup)
    print("| step | shape | seeds | precision | backend | us / call | vs float32 | error |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [row for name in args.steps for row in measure(name, args)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"versions": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
