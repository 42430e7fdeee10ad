"""Speed of the kernel ops: Triton vs the plain-JAX reference, against a device copy's bandwidth.

Usage (GPU machine):
    python benchmarks/kernels.py                       # every registered op and shape
    python benchmarks/kernels.py --ops gae --json out.json
    python benchmarks/kernels.py --ops policy_head --kernel-backend auto --paired  # interleaved A/B
    # time scan tilings (ScanConfig) per shape:
    python benchmarks/kernels.py --sweep all --sweep-ops both
    # time chosen tilings:
    python benchmarks/kernels.py --sweep loop --sweep-configs "loop:128,8,4,3;chain:64,32,4,3"
Smoke test on a CPU (tiny shapes, the interpreter standing in for the GPU):
    python benchmarks/kernels.py --small --kernel-backend interpret --runs 2

Method (DESIGN.md "How speed is measured"): every timed function is jitted and runs the op on
``reps`` distinct input sets in one program (distinct, so XLA cannot merge the calls and the L2
cache does not flatter small shapes: together they span several times the L2 size). Before any
timing the device runs matrix products for ``--warmup`` seconds (clocks up from idle); each
measurement runs its program for 0.2 s first, then takes ``--runs`` samples, each dispatching the
program back to back for about 2 ms and syncing once (host dispatch overlaps device work); the
median sample is divided by ``reps`` (see ``time_per_call``). With ``--paired`` the reference's
and the op's samples alternate, and the speed ratio is the median over adjacent pairs
(``time_paired``): use it where the two sides are close and the machine drifts. Bandwidth = the
op's minimal traffic (every input read once, every output written once) / time; "copy" is the
bandwidth of ``x + 1`` over a large float32 array (read + write), measured in the same run.
At 20-60 us a call, ratios also differ from process to process by about +-15% (each process
compiles and places its buffers anew; benchmarks/RESULTS.md, "Row ops under `auto`"): a claim near
parity needs several processes.

Adding an op: write a function ``my_cases(args) -> list[Case]`` and add it to ``CASE_BUILDERS``
(key = the op name used by ``--ops``). A Case carries the shape label, an input factory, the
reference and Triton functions, the traffic in bytes, and optional extra baselines.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

L2_BYTES = 50 * 2**20  # H100/H200 L2: 50 MiB


@dataclasses.dataclass
class Case:
    """One op at one shape. ``make_inputs(key)`` returns a tuple of device arrays; ``reference`` and
    ``triton`` map those inputs to the op's outputs; ``bytes_moved`` is the minimal traffic."""

    op: str
    shape: str
    make_inputs: Callable[[jax.Array], tuple]
    reference: Callable[..., Any]
    triton: Callable[..., Any]
    bytes_moved: int
    extra: dict[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    atol: float = 1e-3  # tolerance of the Triton output vs the reference (checked before timing)


# ----------------------------------------------------------------------------- timing


def _reps_for(bytes_per_call: int, max_reps: int) -> int:
    return int(min(max_reps, max(4, math.ceil(4 * L2_BYTES / max(bytes_per_call, 1)))))


def warm_up_device(seconds: float) -> None:
    """Keeps the device busy for ``seconds`` (matrix products) so that its clocks leave idle.

    An idle H200 was seen at 345 MHz SM clock right before timing; its first calls then run
    slow and the medians drift. Called once before any timing (``--warmup``)."""
    x = jax.random.normal(jax.random.PRNGKey(0), (4096, 4096), jnp.float32)
    step = jax.jit(lambda a: (a @ a) * (1.0 / 4096))
    jax.block_until_ready(step(x))
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(8):
            x = step(x)
        jax.block_until_ready(x)


WARM_SECONDS = (
    0.2  # each measurement first runs its program for this long (clocks, caches, allocator)
)
GROUP_SECONDS = 2e-3  # a timed sample dispatches programs back to back for about this long


def _prepared(fn: Callable[..., Any], input_sets: list[tuple]):
    """``(program, calls)``: ``fn`` jitted over every input set in one program, compiled and run for
    ``WARM_SECONDS``, and the number of back-to-back calls that make a sample
    of ``GROUP_SECONDS``."""
    many = jax.jit(lambda sets: [fn(*s) for s in sets])
    jax.block_until_ready(many(input_sets))  # compile
    count, start = 0, time.perf_counter()
    while True:
        out = many(input_sets)
        count += 1
        if count >= 2 and time.perf_counter() - start >= WARM_SECONDS:
            jax.block_until_ready(out)
            if time.perf_counter() - start >= WARM_SECONDS:
                break
    per_program = (time.perf_counter() - start) / count
    return many, int(max(1, min(200, round(GROUP_SECONDS / max(per_program, 1e-7)))))


def _sample(many, input_sets: list[tuple], calls: int) -> float:
    """Seconds per op call: ``calls`` programs dispatched back to back, one sync at the end."""
    start = time.perf_counter()
    for _ in range(calls):
        out = many(input_sets)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls / len(input_sets)


def time_per_call(fn: Callable[..., Any], input_sets: list[tuple], runs: int) -> float:
    """Median seconds per op call.

    ``fn`` runs on every input set in one jitted program (``len(input_sets)`` calls per
    program). After compiling, the program runs for ``WARM_SECONDS``; then each of ``runs``
    samples dispatches the program ``calls`` times back to back (no host sync in between, so the
    host's dispatch overlaps the device's work) and blocks once: sample = elapsed / (calls *
    sets). ``calls`` is chosen so a sample lasts about ``GROUP_SECONDS``.
    """
    many, calls = _prepared(fn, input_sets)
    times = [_sample(many, input_sets, calls) for _ in range(runs)]
    time_per_call.last_min = min(times)  # also reported: the least disturbed sample
    return statistics.median(times)


def time_paired(
    fn_a: Callable[..., Any], fn_b: Callable[..., Any], input_sets: list[tuple], runs: int
):
    """``(median a, median b, median of a / b over adjacent pairs)``, seconds per op call.

    As :func:`time_per_call`, but the two programs' samples alternate (a b, b a, a b, ...), and
    each pair's ratio is taken between samples a few milliseconds apart, so a drift of the
    device's clocks or of the host's load during the run reaches both sides of every ratio.
    """
    prepared = [_prepared(fn_a, input_sets), _prepared(fn_b, input_sets)]
    times_a, times_b, ratios = [], [], []
    for i in range(runs):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        pair = {k: _sample(prepared[k][0], input_sets, prepared[k][1]) for k in order}
        times_a.append(pair[0])
        times_b.append(pair[1])
        ratios.append(pair[0] / pair[1])
    return statistics.median(times_a), statistics.median(times_b), statistics.median(ratios)


def copy_bandwidth(runs: int, n_floats: int) -> float:
    """Bytes/s of ``x + 1`` (read + write) over float32 arrays of ``n_floats``, distinct buffers."""
    reps = 8
    keys = jax.random.split(jax.random.PRNGKey(0), reps)
    sets = [(jax.random.normal(k, (n_floats,), jnp.float32),) for k in keys]
    seconds = time_per_call(lambda x: x + 1.0, sets, runs)
    return 2 * 4 * n_floats / seconds


def max_abs_diff(a, b) -> float:
    leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return max(
        float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))))
        for x, y in zip(leaves_a, leaves_b)
    )


# ----------------------------------------------------------------------------- scan ops


def _scan_inputs(kind: str, t: int, n: int):
    def make(key):
        k = jax.random.split(key, 5)
        shape = (t, n)
        rewards = jax.random.normal(k[0], shape, jnp.float32)
        done = jax.random.uniform(k[1], shape) < 0.02
        discounts = 0.99 * (1.0 - done.astype(jnp.float32))
        if kind == "returns":
            return rewards, discounts, jax.random.normal(k[2], (n,), jnp.float32)
        if kind == "q_lambda":  # lambda (1 - done) per step, as PQN passes it
            return (
                rewards,
                jax.random.normal(k[3], shape, jnp.float32),
                discounts,
                0.95 * (1.0 - done.astype(jnp.float32)),
            )
        values = jax.random.normal(k[2], shape, jnp.float32)
        next_values = jax.random.normal(k[3], shape, jnp.float32)
        return rewards, values, next_values, discounts, jnp.float32(0.95)

    return make


def gae_associative_scan(rewards, values, next_values, discounts, lambda_):
    """GAE with lax.associative_scan over the time axis (a baseline)."""
    deltas = rewards + discounts * next_values - values
    coeffs = discounts * lambda_

    def combine(later, earlier):  # elements in reversed-time order; compose affine maps
        x_l, c_l = later
        x_e, c_e = earlier
        return x_e + c_e * x_l, c_e * c_l

    adv, _ = jax.lax.associative_scan(combine, (deltas, coeffs), reverse=True, axis=0)
    return adv, adv + values


def returns_cases(args) -> list[Case]:
    from kernels import discounted_returns
    from kernels.returns import discounted_returns_reference

    cases = []
    for t, n in args.scan_shapes:
        cases.append(
            Case(
                op="discounted_returns",
                shape=f"T={t} x N={n}",
                make_inputs=_scan_inputs("returns", t, n),
                reference=discounted_returns_reference,
                triton=lambda r, d, b, cfg=None: discounted_returns(
                    r, d, b, backend=args.kernel_backend, config=cfg
                ),
                bytes_moved=4 * (3 * t * n + n),
                extra={
                    "deterministic=True": lambda r, d, b: discounted_returns(
                        r, d, b, backend=args.kernel_backend, deterministic=True
                    )
                },
            )
        )
    return cases


def gae_cases(args) -> list[Case]:
    from kernels import gae
    from kernels.gae import gae_reference

    cases = []
    for t, n in args.scan_shapes:
        cases.append(
            Case(
                op="gae",
                shape=f"T={t} x N={n}",
                make_inputs=_scan_inputs("gae", t, n),
                reference=gae_reference,
                triton=lambda *a, cfg=None: gae(*a, backend=args.kernel_backend, config=cfg),
                bytes_moved=4 * 6 * t * n,
                extra={
                    "lax.associative_scan": gae_associative_scan,  # the reference is the lax.scan
                    "deterministic=True": lambda *a: gae(
                        *a, backend=args.kernel_backend, deterministic=True
                    ),
                },
            )
        )
    return cases


def q_lambda_cases(args) -> list[Case]:
    from kernels import q_lambda_returns
    from kernels.q_lambda import q_lambda_returns_reference

    cases = []
    for t, n in args.scan_shapes:
        cases.append(
            Case(
                op="q_lambda_returns",
                shape=f"T={t} x N={n}",
                make_inputs=_scan_inputs("q_lambda", t, n),
                reference=q_lambda_returns_reference,
                triton=lambda *a, cfg=None: q_lambda_returns(
                    *a, backend=args.kernel_backend, config=cfg
                ),
                bytes_moved=4 * 5 * t * n,
                extra={
                    "deterministic=True": lambda *a: q_lambda_returns(
                        *a, backend=args.kernel_backend, deterministic=True
                    )
                },
            )
        )
    return cases


# ------------------------------------------------------------------------- row-wise ops (kernels-2)


def _with_vjp(op):
    """(x..., cotangent) -> (outputs, input cotangents): one forward and one backward pass."""

    def fwd_bwd(*args):
        *primals, cotangent = args
        out, vjp = jax.vjp(op, *primals)
        return out, vjp(cotangent)

    return fwd_bwd


def softmax_cases(args) -> list[Case]:
    """softmax forward+backward vs jax.nn.softmax; bytes: fwd reads x, writes p; bwd reads p, g,
    writes dx."""
    from kernels import softmax
    from kernels.softmax import softmax_reference

    shapes = (
        [(8, 2), (8, 3, 51), (4, 300)]
        if args.small
        else [(65536, 2), (65536, 6), (65536, 18), (65536, 51), (4096, 18, 51), (4096, 4096)]
    )
    cases = []
    for shape in shapes:

        def make(key, shape=shape):
            k1, k2 = jax.random.split(key)
            return 3.0 * jax.random.normal(k1, shape, jnp.float32), jax.random.normal(
                k2, shape, jnp.float32
            )

        cases.append(
            Case(
                op="softmax fwd+bwd",
                shape=" x ".join(map(str, shape)),
                make_inputs=make,
                reference=_with_vjp(softmax_reference),
                triton=_with_vjp(lambda x: softmax(x, backend=args.kernel_backend)),
                bytes_moved=5 * 4 * math.prod(shape),
                atol=1e-5,
            )
        )
    return cases


def policy_head_cases(args) -> list[Case]:
    """categorical_log_prob_entropy forward+backward vs the XLA path (log_softmax, gather, entropy).

    Bytes: every input (logits, actions, the two cotangents) read once and every output
    (log_prob, entropy, d logits) written once."""
    from kernels import categorical_log_prob_entropy
    from kernels.policy_head import categorical_log_prob_entropy_reference

    shapes = [(16, 2), (9, 18)] if args.small else [(65536, 2), (65536, 6), (65536, 18), (4096, 18)]
    cases = []
    for rows, n_actions in shapes:

        def make(key, rows=rows, n_actions=n_actions):
            k1, k2, k3, k4 = jax.random.split(key, 4)
            logits = 2.0 * jax.random.normal(k1, (rows, n_actions), jnp.float32)
            actions = jax.random.randint(k2, (rows,), 0, n_actions)
            cotangent = (
                jax.random.normal(k3, (rows,), jnp.float32),
                jax.random.normal(k4, (rows,), jnp.float32),
            )
            return logits, actions, cotangent

        def fwd_bwd(op):
            def f(logits, actions, cotangent):
                out, vjp = jax.vjp(lambda x: op(x, actions), logits)
                return out, vjp(cotangent)

            return f

        cases.append(
            Case(
                op="policy head fwd+bwd",
                shape=f"{rows} x {n_actions}",
                make_inputs=make,
                reference=fwd_bwd(categorical_log_prob_entropy_reference),
                triton=fwd_bwd(
                    lambda x, a: categorical_log_prob_entropy(x, a, backend=args.kernel_backend)
                ),
                bytes_moved=4 * (2 * rows * n_actions + 5 * rows),
                atol=1e-4,
            )
        )
    return cases


def projection_cases(args) -> list[Case]:
    """C51 projection (forward) vs the [B, K, K] XLA formulation; plus forward+backward
    (atoms, probs)."""
    from kernels import categorical_projection
    from kernels.projection import ProjectionConfig, categorical_projection_reference

    k = 51
    support = jnp.linspace(-10.0, 10.0, k)
    batches = [8, 33] if args.small else [4096, 65536]
    cases = []
    for b in batches:

        def make(key, b=b):
            k1, k2, k3, k4 = jax.random.split(key, 4)
            rewards = jax.random.normal(k1, (b, 1), jnp.float32) * 2.0
            discounts = 0.99 * (jax.random.uniform(k2, (b, 1)) > 0.05)
            atoms = rewards + discounts * support  # a C51 Bellman target
            probs = jax.nn.softmax(jax.random.normal(k3, (b, k)), axis=-1)
            return atoms, probs, jax.random.normal(k4, (b, k), jnp.float32)

        reference = lambda a, p, g: categorical_projection_reference(a, p, support)
        triton = lambda a, p, g: categorical_projection(a, p, support, backend=args.kernel_backend)
        # kernels.deterministic: the fixed-order dense kernel (its speed cost against the scatter)
        deterministic = lambda a, p, g: categorical_projection(
            a, p, support, backend=args.kernel_backend, deterministic=True
        )
        cases.append(
            Case(
                op="categorical_projection",
                shape=f"B={b} x K={k}",
                make_inputs=make,
                reference=reference,
                triton=triton,
                bytes_moved=4 * 3 * b * k,
                atol=1e-5,
                extra={
                    "deterministic=True (dense kernel)": deterministic,
                    "scatter b256 w2": lambda a, p, g: categorical_projection(
                        a,
                        p,
                        support,
                        backend=args.kernel_backend,
                        config=ProjectionConfig(num_warps=2, block=256),
                    ),
                    "scatter b4096 w8": lambda a, p, g: categorical_projection(
                        a,
                        p,
                        support,
                        backend=args.kernel_backend,
                        config=ProjectionConfig(num_warps=8, block=4096),
                    ),
                },
            )
        )
        grad = lambda f: lambda a, p, g: jax.vjp(lambda a_, p_: f(a_, p_, g), a, p)[1](g)
        # atol: d atoms jumps where an atom lies exactly on a support point (a kink of the
        # projection); there the kernel takes the right-hand derivative and XLA's clip/where
        # formulation another one (seen at B=65536: 2 of 3.3M atoms, |diff| 0.023).
        cases.append(
            Case(
                op="projection bwd (atoms, probs)",
                shape=f"B={b} x K={k}",
                make_inputs=make,
                reference=grad(reference),
                triton=grad(triton),
                bytes_moved=4 * 5 * b * k,
                atol=5e-2,
            )
        )
    return cases


def q_network_cases(args) -> list[Case]:
    """The fused Q-network ops at DQN's shapes vs XLA (the same maths in plain JAX, autodiff for the
    gradient): `q_learning_grads_flat` (target, selector and online passes, TD loss, backward) and
    `q_epsilon_greedy` (forward and choice). PureJaxRL's CartPole DQN (obs 4, 120 x 84, 2 actions,
    128 rows, 10 envs) at 1 and 64 seeds, and fusedrl's dqn_cartpole (128 x 128, 64 rows, double-Q)
    at 16 seeds, vmapped over the seeds as the agent runs them.

    Bytes: the weights of both networks read once per seed, the rows read once, the gradient (and
    the actions) written once."""
    from kernels import q_epsilon_greedy, q_learning_grads_flat
    from kernels.q_grads import q_layout

    shapes = (
        [(1, 16, (8, 8), False), (2, 20, (8, 8), True)]
        if args.small
        else [(1, 128, (120, 84), False), (64, 128, (120, 84), False), (16, 64, (128, 128), True)]
    )
    cases = []
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

        def grads(backend, layout=layout, double_q=double_q):
            op = lambda *xs: q_learning_grads_flat(
                *xs, layout, loss="mse", double_q=double_q, backend=backend
            )[0]
            return jax.vmap(op)

        cases.append(
            Case(
                op="q_learning_grads_flat",
                shape=f"{seeds} seeds x {rows} rows, {hidden[0]} x {hidden[1]}",
                make_inputs=make,
                reference=grads("reference"),
                triton=grads(args.kernel_backend),
                bytes_moved=4 * seeds * (3 * layout.size + rows * 12),
                atol=5e-2,
            )
        )
        envs = 10 if rows == 128 else 1

        def make_act(key, seeds=seeds, envs=envs, layout=layout):
            k1, k2, k3 = jax.random.split(key, 3)
            return (
                jax.random.normal(k1, (seeds, envs, 4), jnp.float32),
                0.1 * jax.random.normal(k2, (seeds, layout.size), jnp.float32),
                jax.random.uniform(k3, (seeds, envs, 2)),
                jnp.full((seeds,), 0.05, jnp.float32),
            )

        def act(backend, layout=layout):
            return jax.vmap(
                lambda o, p, u, e: q_epsilon_greedy(o, p, u, e, layout, backend=backend)
            )

        cases.append(
            Case(
                op="q_epsilon_greedy",
                shape=f"{seeds} seeds x {envs} envs, {hidden[0]} x {hidden[1]}",
                make_inputs=make_act,
                reference=act("reference"),
                triton=act(args.kernel_backend),
                bytes_moved=4 * seeds * (layout.size + envs * 7),
                atol=1.0,  # an action; ties at TF32 rounding may pick the other one
            )
        )
    return cases


def rainbow_act_cases(args) -> list[Case]:
    """Rainbow's fused acting (`rainbow_epsilon_greedy`: the torso, the noisy dueling C51 head, the
    expected returns and the choice) vs XLA (the same maths in plain JAX) at rainbow_cartpole's
    shapes (obs 4, 128 x 128, 51 atoms, 2 actions, one env a seed) at 16 seeds, and with 8 envs a
    seed at 64 seeds, vmapped over the seeds as the agent runs them.

    Bytes: each seed's weights and noise read once, the rows read once, the actions written once."""
    from kernels import rainbow_epsilon_greedy
    from kernels.rainbow_act import NoisyLinear

    shapes = [(2, 3, 8, 5)] if args.small else [(16, 1, 128, 51), (64, 8, 128, 51)]
    cases = []
    for seeds, envs, hidden, atoms in shapes:
        outs = (atoms, 2 * atoms)
        weights = (
            4 * hidden
            + hidden
            + hidden * hidden
            + hidden
            + sum(2 * hidden * o + 2 * o + hidden + o for o in outs)
        )

        def make(key, seeds=seeds, envs=envs, hidden=hidden, atoms=atoms):
            keys = iter(jax.random.split(key, 20))
            draw = lambda *shape: 0.1 * jax.random.normal(next(keys), (seeds, *shape), jnp.float32)
            noisy = lambda out: (draw(hidden, out), draw(hidden, out), draw(out), draw(out),
                                 draw(hidden), draw(out))  # fmt: skip
            return (
                draw(envs, 4), draw(4, hidden), draw(hidden), draw(hidden, hidden), draw(hidden),
                *noisy(atoms), *noisy(2 * atoms),
                jax.random.uniform(next(keys), (seeds, envs, 2)),
                jnp.full((seeds,), 0.05, jnp.float32),
            )  # fmt: skip

        def act(backend, atoms=atoms):
            support = jnp.linspace(0.0, 100.0, atoms)

            def one(obs, w1, b1, w2, b2, *rest):
                value, advantage = NoisyLinear(*rest[:6]), NoisyLinear(*rest[6:12])
                uniforms, epsilon = rest[12:]
                return rainbow_epsilon_greedy(
                    obs, (w1, b1, w2, b2), value, advantage, support, uniforms, epsilon,
                    backend=backend,
                )  # fmt: skip

            return jax.vmap(one)

        cases.append(
            Case(
                op="rainbow_epsilon_greedy",
                shape=f"{seeds} seeds x {envs} envs, {hidden} x {hidden}, {atoms} atoms",
                make_inputs=make,
                reference=act("reference"),
                triton=act(args.kernel_backend),
                bytes_moved=4 * seeds * (weights + envs * 7),
                atol=1.0,  # an action; ties at TF32 rounding may pick the other one
            )
        )
    return cases


def twin_q_cases(args) -> list[Case]:
    """The fused twin-critic gradient (`twin_q_grads_flat`: both target critics, the target, both
    online critics and their backward) vs XLA (the same loss in plain JAX, autodiff) at SAC's and
    TD3's Pendulum shapes (3 observation features, 1 action): rejax's 64 x 64 with SAC's batch of
    256 and TD3's of 100 at 1 and 64 seeds, and 128 x 128 at batch 256, vmapped over the seeds as
    the agents run them.

    Bytes: both critics and both targets read once per seed, the rows read once, the gradient
    written once."""
    from kernels import twin_q_grads_flat
    from kernels.twin_q_grads import twin_q_layout

    shapes = (
        [(1, 16, (8, 8)), (2, 20, (8, 8))]
        if args.small
        else [
            (1, 256, (64, 64)),
            (64, 256, (64, 64)),
            (1, 100, (64, 64)),
            (64, 100, (64, 64)),
            (1, 256, (128, 128)),
        ]
    )
    cases = []
    for seeds, rows, hidden in shapes:
        layout = twin_q_layout(3, 1, hidden)

        def make(key, seeds=seeds, rows=rows, layout=layout):
            k = jax.random.split(key, 9)
            normal = lambda i, *shape: jax.random.normal(k[i], (seeds, *shape), jnp.float32)
            return (
                normal(0, rows, 3),
                jnp.tanh(normal(1, rows, 1)),
                normal(2, rows),
                jnp.full((seeds, rows), 0.99, jnp.float32),
                normal(3, rows, 3),
                jnp.tanh(normal(4, rows, 1)),
                0.1 * normal(5, rows),
                0.1 * normal(6, layout.size),
                0.1 * normal(7, layout.size),
            )

        def grads(backend, layout=layout):
            op = lambda *xs: twin_q_grads_flat(
                *xs, layout, activation=args.activation, backend=backend
            )[0]
            return jax.vmap(op)

        cases.append(
            Case(
                op="twin_q_grads_flat",
                shape=f"{seeds} seeds x {rows} rows, {hidden[0]} x {hidden[1]} {args.activation}",
                make_inputs=make,
                reference=grads("reference"),
                triton=grads(args.kernel_backend),
                bytes_moved=4 * seeds * (3 * layout.size + rows * 12),
                atol=5e-2,
            )
        )
    return cases


ACTOR_SHAPES = [(1, 256, (64, 64)), (64, 256, (64, 64)), (1, 100, (64, 64)), (64, 100, (64, 64))]


def actor_cases(args) -> list[Case]:
    """The fused actor gradients vs XLA (the same loss in plain JAX, autodiff) at Pendulum's shapes
    (3 observation features, 1 action, rejax's 64 x 64 networks): SAC's (`sac_actor_grads_flat`:
    the actor's two heads, the reparameterised sample and its log-probability, both critics, the
    backward) and TD3's (`deterministic_policy_grads_flat`: the actor, the first critic, the
    backward) at batches 256 and 100 and 1 and 64 seeds, vmapped over the seeds.

    Bytes per seed: SAC reads the actor (twice), both critics and its rows (observation and draw),
    TD3 the actor (twice), the first critic and its observations; each writes the gradient once."""
    from kernels import deterministic_policy_grads_flat, sac_actor_grads_flat
    from kernels.q_grads import q_layout
    from kernels.sac_actor_grads import sac_actor_layout
    from kernels.twin_q_grads import twin_q_layout

    shapes = [(1, 16, (8, 8)), (2, 20, (8, 8))] if args.small else ACTOR_SHAPES
    act = args.activation
    cases = []
    for seeds, rows, hidden in shapes:
        critic = twin_q_layout(3, 1, hidden)
        sac, td3 = sac_actor_layout(3, hidden, 1), q_layout(3, hidden, 1)

        def make(key, seeds=seeds, rows=rows, actor_size=sac.size, critic=critic):
            k = jax.random.split(key, 4)
            normal = lambda i, *shape: jax.random.normal(k[i], (seeds, *shape), jnp.float32)
            return (
                normal(0, rows, 3),
                normal(1, rows, 1),
                jnp.full((seeds,), 0.2, jnp.float32),
                0.1 * normal(2, actor_size),
                0.1 * normal(3, critic.size),
            )

        def sac_grads(backend, sac=sac, critic=critic):
            op = lambda *xs: sac_actor_grads_flat(
                *xs, sac, critic, activation=act, backend=backend
            )[0]
            return jax.vmap(op)

        def td3_make(key, seeds=seeds, rows=rows, actor_size=td3.size, critic=critic):
            obs, _, _, actor, critic_params = make(
                key, seeds=seeds, rows=rows, actor_size=actor_size, critic=critic
            )
            return obs, actor, critic_params

        def td3_grads(backend, td3=td3, critic=critic):
            op = lambda *xs: deterministic_policy_grads_flat(
                *xs, td3, critic, activation=act, backend=backend
            )[0]
            return jax.vmap(op)

        label = f"{seeds} seeds x {rows} rows, {hidden[0]} x {hidden[1]} {act}"
        one_critic = critic.size // 2  # the twin layout holds the two critics' arrays alike
        for name, layout, factory, grads, read in (
            ("sac_actor_grads_flat", sac, make, sac_grads, 3 * sac.size + critic.size + rows * 4),
            (
                "deterministic_policy_grads_flat",
                td3,
                td3_make,
                td3_grads,
                3 * td3.size + one_critic + rows * 3,
            ),
        ):
            cases.append(
                Case(
                    op=name,
                    shape=label,
                    make_inputs=factory,
                    reference=grads("reference"),
                    triton=grads(args.kernel_backend),
                    bytes_moved=4 * seeds * read,
                    atol=5e-2,
                )
            )
    return cases


def adam_cases(args) -> list[Case]:
    """The optimiser step on flat vectors (`kernels.adam_step`: gradients clipped to a global norm
    given by the gradient kernels, Adam, the target's Polyak step) vs XLA (the same formula in
    plain JAX) and vs the agents' path without the kernel (`rl.core.optimizers.flat_step` of optax's
    clipped Adam, then `periodic_polyak`), vmapped over the seeds, at DQN's CartPole Q-network
    (10,934 params: 120 x 84) and a 256 x 256 MLP's size (70,000), 1 and 64 seeds.

    Bytes: params, grads, mu, nu and target read, four of them written."""
    from kernels.adam import adam_step
    from rl.core.optimizers import clipped_adam, flat_step, periodic_polyak

    shapes = (
        [(1, 300), (2, 1500)] if args.small else [(1, 10934), (64, 10934), (1, 70000), (64, 70000)]
    )
    cases = []
    for seeds, size in shapes:

        def make(key, seeds=seeds, size=size):
            k = jax.random.split(key, 5)
            normal = lambda i: jax.random.normal(k[i], (seeds, size), jnp.float32)
            grads = 0.1 * normal(1)
            sq_norm = jnp.sum(jnp.square(grads), axis=1)
            nu = jnp.square(0.1 * normal(3))
            count = jnp.full((seeds,), 10, jnp.int32)
            return normal(0), grads, 0.1 * normal(2), nu, normal(4), count, sq_norm

        def step(backend):
            def one(params, grads, mu, nu, target, count, sq_norm):
                return adam_step(
                    params,
                    grads,
                    mu,
                    nu,
                    count,
                    1e-3,
                    10.0,
                    sq_norm=sq_norm,
                    target=target,
                    tau=0.005,
                    sync=True,
                    backend=backend,
                )[:4]

            return jax.vmap(one)

        optimizer = clipped_adam(1e-3, 10.0)

        def optax_step(params, grads, mu, nu, target, count, sq_norm):
            def one(params, grads, mu, nu, target, count, sq_norm):
                state = optimizer.init(params)
                adam = state[1][0]._replace(count=count, mu=mu, nu=nu)
                state = (state[0], (adam, *state[1][1:]))
                params, state = flat_step(optimizer, params, state, grads, sq_norm)
                target = periodic_polyak(target, params, 0.005, True)
                return params, state[1][0].mu, state[1][0].nu, target

            return jax.vmap(one)(params, grads, mu, nu, target, count, sq_norm)

        cases.append(
            Case(
                op="adam_step",
                shape=f"{seeds} seeds x {size} params",
                make_inputs=make,
                reference=step("reference"),
                triton=step(args.kernel_backend),
                bytes_moved=4 * seeds * size * 9,
                extra={"optax": optax_step},
                atol=1e-5,
            )
        )
    return cases


CASE_BUILDERS: dict[str, Callable[[Any], list[Case]]] = {
    "discounted_returns": returns_cases,
    "gae": gae_cases,
    "q_lambda": q_lambda_cases,
    "softmax": softmax_cases,
    "policy_head": policy_head_cases,
    "projection": projection_cases,
    "q_network": q_network_cases,
    "rainbow_act": rainbow_act_cases,
    "twin_q": twin_q_cases,
    "actors": actor_cases,
    "adam": adam_cases,
}


# ----------------------------------------------------------------------------- driver


def run_case(case: Case, args, copy_bw: float) -> dict:
    keys = jax.random.split(jax.random.PRNGKey(1), args.max_reps)
    first = case.make_inputs(keys[0])
    reps = _reps_for(case.bytes_moved, args.max_reps)
    sets = [first] + [case.make_inputs(k) for k in keys[1:reps]]
    want, triton_fn = jax.jit(case.reference)(*first), jax.jit(case.triton)
    error = max(
        max_abs_diff(triton_fn(*s), want if s is first else jax.jit(case.reference)(*s))
        for s in ([first] * args.checks + sets[1 : args.checks])
    )
    row = {"op": case.op, "shape": case.shape, "reps": reps, "max_abs_err": error}
    if args.paired:
        ref_s, triton_s, ratio = time_paired(case.reference, case.triton, sets, args.runs)
        row["reference_us"], row["triton_us"], row["speedup"] = 1e6 * ref_s, 1e6 * triton_s, ratio
    else:
        row["reference_us"] = 1e6 * time_per_call(case.reference, sets, args.runs)
        row["triton_us"] = 1e6 * time_per_call(case.triton, sets, args.runs)
        row["triton_min_us"] = 1e6 * time_per_call.last_min
        row["speedup"] = row["reference_us"] / row["triton_us"]
    row["triton_GBps"] = case.bytes_moved / row["triton_us"] / 1e3
    row["frac_copy_bw"] = row["triton_GBps"] * 1e9 / copy_bw
    for name, fn in case.extra.items():
        row[f"{name}_us"] = 1e6 * time_per_call(fn, sets, args.runs)
    if error > case.atol:
        row["WRONG"] = True
    return row


def sweep_scan_configs(args, copy_bw: float) -> list[dict]:
    """Times ScanConfig tilings for gae and discounted_returns at each scan shape."""
    from kernels._chunked_scan import ScanConfig, choose_config

    rows = []
    # (chunk_t, block_n, num_warps, num_stages)
    # run 1 of 2026-11-21 swept 11 loop tilings (32..256 x 8..64); the best were tall and narrow
    loop = [
        (128, 8, 4, 3),
        (256, 8, 4, 3),
        (128, 8, 2, 3),
        (64, 8, 2, 4),
        (256, 8, 8, 3),
        (128, 8, 4, 4),
        (256, 4, 4, 3),
        (128, 16, 4, 4),
        (512, 8, 8, 2),
    ]
    chained = [(64, 32, 4, 3)]
    configs = []
    if args.sweep_configs:  # "loop:128,8,4,3;chain:64,32,4,3": these instead of the lists above
        for item in args.sweep_configs.split(";"):
            kind, numbers = item.split(":")
            t, n, w, st = (int(v) for v in numbers.split(","))
            configs.append(ScanConfig(t, n, kind == "chain", w, st))
        loop, chained = [], []
    if args.sweep in ("loop", "all"):
        configs += [ScanConfig(t, n, False, w, st) for t, n, w, st in loop]
    if args.sweep in ("chained", "all"):
        configs += [ScanConfig(t, n, True, w, st) for t, n, w, st in chained]
    builders = [gae_cases] if args.sweep_ops == "gae" else [gae_cases, returns_cases]
    for builder in builders:
        for case in builder(args):
            keys = jax.random.split(jax.random.PRNGKey(1), args.max_reps)
            reps = _reps_for(case.bytes_moved, args.max_reps)
            sets = [case.make_inputs(k) for k in keys[:reps]]
            want = jax.jit(case.reference)(*sets[0])
            t, n = (int(s.split("=")[1]) for s in case.shape.split(" x "))
            if args.sweep_shapes and f"{t}x{n}" not in args.sweep_shapes.split(","):
                continue
            auto = choose_config(1, t, n)
            for cfg in ([None] if args.sweep == "all" else []) + configs:
                fn = lambda *a, cfg=cfg: case.triton(*a, cfg=cfg)
                label = "auto " + _cfg_label(auto) if cfg is None else _cfg_label(cfg)
                try:
                    err = max_abs_diff(jax.jit(fn)(*sets[0]), want)
                    us = 1e6 * time_per_call(fn, sets, args.runs)
                    us_min = 1e6 * time_per_call.last_min
                except Exception as e:  # a tiling the compiler rejects (registers, shared memory)
                    print(
                        f"  {case.op:18s} {case.shape:16s} {label:28s} FAILED "
                        f"{type(e).__name__}: {str(e)[:100]}"
                    )
                    continue
                gbps = case.bytes_moved / us / 1e3
                row = {
                    "op": case.op,
                    "shape": case.shape,
                    "config": label,
                    "us": us,
                    "min_us": us_min,
                    "GBps": gbps,
                    "frac_copy_bw": gbps * 1e9 / copy_bw,
                    "max_abs_err": err,
                }
                rows.append(row)
                print(
                    f"  {case.op:18s} {case.shape:16s} {label:28s} {us:9.1f} us {gbps:7.0f} GB/s "
                    f"{row['frac_copy_bw']:5.2f} copy  (min {us_min:.1f} us)  err {err:.1e}",
                    flush=True,
                )
    return rows


def _cfg_label(cfg) -> str:
    return (
        f"{'chain' if cfg.chained else 'loop'} t{cfg.chunk_t} n{cfg.block_n} w{cfg.num_warps} "
        f"s{cfg.num_stages}"
    )


def versions() -> dict:
    out = {"python": platform.python_version(), "jax": jax.__version__}
    for name in ("jaxlib", "triton", "jax_triton"):
        try:
            out[name] = __import__(name).__version__
        except Exception as e:  # noqa: BLE001
            out[name] = f"unavailable ({type(e).__name__})"
    out["device"] = str(jax.devices()[0].device_kind) if jax.devices() else "?"
    return out


def set_max_block_rows(rows: int) -> None:
    """Every fused-network op's MAX_BLOCK_M setting to `rows` (a power of two >= 16): for this
    benchmark process, to sweep the rows per program."""
    from kernels import deterministic_policy_grads, q_grads, sac_actor_grads, twin_q_grads

    if rows < 16 or rows & (rows - 1):
        raise SystemExit(f"--max-block-rows must be a power of two >= 16, got {rows}")
    for module in (q_grads, twin_q_grads, deterministic_policy_grads, sac_actor_grads):
        module.MAX_BLOCK_M = rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", default=",".join(CASE_BUILDERS), help="comma-separated op names")
    parser.add_argument("--runs", type=int, default=30, help="timed calls per measurement (median)")
    parser.add_argument(
        "--max-reps", type=int, default=24, help="most distinct input sets per timed call"
    )
    parser.add_argument(
        "--kernel-backend",
        default="triton",
        help=(
            "triton (GPU), interpret (CPU smoke test), "
            'or auto (the "triton" column is then the automatic choice, '
            "XLA where an op measured it faster)"
        ),
    )
    parser.add_argument("--small", action="store_true", help="tiny shapes (CPU smoke test)")
    parser.add_argument(
        "--activation",
        default="relu",
        choices=["relu", "tanh", "silu"],
        help="hidden activation of the twin_q and actors ops' networks",
    )
    parser.add_argument(
        "--max-block-rows",
        type=int,
        help=(
            "rows per program at most for every fused-network op (their MAX_BLOCK_M settings; "
            "default: each op's own)"
        ),
    )
    parser.add_argument(
        "--sweep",
        choices=["loop", "chained", "all"],
        help="time ScanConfig tilings of the scan ops",
    )
    parser.add_argument(
        "--sweep-ops", default="gae", choices=["gae", "both"], help="ops the sweep times"
    )
    parser.add_argument("--sweep-shapes", default="", help="e.g. 1024x4096,128x4096 (default: all)")
    parser.add_argument(
        "--sweep-configs",
        default="",
        help=(
            "tilings to sweep instead of the built-in lists, e.g. "
            '"loop:128,8,4,3;chain:64,32,4,3" (chunk_t, block_n, num_warps, num_stages)'
        ),
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help=(
            "alternate the reference's and the op's samples; "
            "the ratio is the median of adjacent pairs' ratios"
        ),
    )
    parser.add_argument(
        "--checks", type=int, default=1, help="repeat the correctness check (races)"
    )
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="seconds of device work before any timing"
    )
    parser.add_argument("--json", help="write the rows and versions to this path")
    args = parser.parse_args(argv)
    args.scan_shapes = (
        [(16, 32), (33, 8)] if args.small else [(1024, 4096), (128, 4096), (128, 65536)]
    )

    if args.max_block_rows is not None:
        set_max_block_rows(args.max_block_rows)
    info = versions()
    info["date"] = datetime.date.today().isoformat()
    info["command"] = "python benchmarks/kernels.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    print(" ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    warm_up_device(args.warmup)
    copy_bw = copy_bandwidth(args.runs, 2**16 if args.small else 2**26)
    print(f"copy bandwidth (x + 1, float32, 256 MiB): {copy_bw / 1e9:.0f} GB/s", flush=True)

    rows = []
    if args.sweep:
        rows = sweep_scan_configs(args, copy_bw)
    else:
        for op in args.ops.split(","):
            if op not in CASE_BUILDERS:
                raise SystemExit(f"unknown op {op!r}; registered: {', '.join(CASE_BUILDERS)}")
            for case in CASE_BUILDERS[op](args):
                row = run_case(case, args, copy_bw)
                rows.append(row)
                print(json.dumps(row), flush=True)
        print()
        print(
            "| op | shape | reference us | triton us (min) | "
            f"{'paired ratio' if args.paired else 'ratio'} | GB/s | "
            f"of copy ({copy_bw / 1e9:.0f} GB/s) | other baselines | max err |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            extras = ", ".join(
                f"{k[:-3]} {v:.0f} us"
                for k, v in r.items()
                if k.endswith("_us") and k not in ("reference_us", "triton_us", "triton_min_us")
            )
            flag = " WRONG" if r.get("WRONG") else ""
            fastest = f" ({r['triton_min_us']:.1f})" if "triton_min_us" in r else ""
            print(
                f"| {r['op']} | {r['shape']} | {r['reference_us']:.1f} | "
                f"{r['triton_us']:.1f}{fastest} | {r['speedup']:.1f}x | {r['triton_GBps']:.0f} | "
                f"{100 * r['frac_copy_bw']:.0f}% | {extras} | {r['max_abs_err']:.1e}{flag} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "copy_GBps": copy_bw / 1e9, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
