"""The optimiser step inside a gradient-step loop, as a replay agent's training phase runs it: one
jitted `lax.scan` of `--steps` steps, each updating flat params, Adam's mu and nu, the target and
the counts from that step's gradient, gated by a traced bool (the phase's "learning has started").

    python benchmarks/optimizer_loop.py [--params 17000] [--seeds 1] [--steps 128] [--repeats 20]

Compared, in one process on the default device:

    optax     `rl.core.optimizers.flat_step` of `clipped_adam`, then `periodic_polyak`
    adam_step `kernels.adam_step` with the target and the gate (`active`) inside the step, on the
              automatic backend choice (a GPU: the Triton launch, or XLA's fused loop below
              `kernels.adam.AUTO_TRITON_MIN_ELEMENTS`; a CPU: plain JAX)

Printed per variant: microseconds per step (median of `--repeats` timed calls, compile apart) and
the copies of a whole vector in the compiled loop body: a step that updates its vectors in place
has none; each copy is one more pass over a vector (on a GPU, one more kernel). `--seeds` vmaps the
loop over that many seeds.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from rl.core import optimizers

LR, MAX_NORM, TAU, TARGET_INTERVAL = 1e-3, 10.0, 1.0, 50


def optax_step(carry, grads):
    """The optax step: optax's clipped Adam on the flat vector, then the periodic target copy (the
    gate is applied once after the loop, `optax_loop`)."""
    params, opt_state, target, updates, active = carry
    params, opt_state = optimizers.flat_step(
        optimizers.clipped_adam(LR, MAX_NORM), params, opt_state, grads, jnp.sum(grads * grads)
    )
    done = updates + 1
    target = optimizers.periodic_polyak(target, params, TAU, done % TARGET_INTERVAL == 0)
    return (params, opt_state, target, done, active), None


def optax_loop(carry, grads):
    """DQN's phase (`collection.scan_when`, branchless): every step runs, then the gate keeps the
    loop's result or the state before it."""
    new = jax.lax.scan(optax_step, carry, grads)[0]
    return jax.tree.map(lambda a, b: jnp.where(carry[-1], a, b), new, carry)


def adam_step_step(carry, grads):
    """The same step as one `kernels.adam_step` on the optax state's vectors, the target's copy and
    the gate inside it."""
    params, (clip_state, (adam, scale_state)), target, updates, active = carry
    done = updates + active.astype(jnp.int32)
    sync = (done % TARGET_INTERVAL == 0) & active
    params, mu, nu, target, count = kernels.adam_step(
        params, grads, adam.mu, adam.nu, adam.count, LR, MAX_NORM,
        sq_norm=jnp.sum(grads * grads), target=target, tau=TAU, sync=sync, active=active,
    )  # fmt: skip
    adam = adam._replace(count=count, mu=mu, nu=nu)
    return (params, (clip_state, (adam, scale_state)), target, done, active), None


def vector_copies(compiled_text: str, size: int) -> int:
    """Copies of an f32[size] vector (or a seed-batched [S, size] one) in the loop bodies of an
    optimised HLO module."""
    pattern = re.compile(rf"= f32\[(\d+,)?{size}\]\{{[0-9,]*\}} copy\(")
    copies = 0
    for name in set(re.findall(r"body=(%[\w.\-]+)", compiled_text)):  # every while loop's body
        body = re.search(rf"\n{re.escape(name)} [^\n]*\{{\n(.*?)\n}}", compiled_text, re.S)
        copies += len(pattern.findall(body.group(1))) if body else 0
    return copies


def adam_step_loop(carry, grads):
    return jax.lax.scan(adam_step_step, carry, grads)[0]


def measure(loop, seeds: int, size: int, steps: int, repeats: int) -> tuple[float, int]:
    params = jnp.ones((seeds, size))
    opt_state = jax.vmap(optimizers.clipped_adam(LR, MAX_NORM).init)(params)
    # step-major: a step's gradients of every seed are one contiguous [seeds, size] block, as a
    # gradient computed inside the step is (a seed-major slice would be strided)
    grads = jax.random.normal(jax.random.PRNGKey(0), (steps, seeds, size))
    carry = (params, opt_state, params + 1.0, jnp.zeros(seeds, jnp.int32), jnp.ones(seeds, bool))

    run = jax.jit(jax.vmap(loop, in_axes=(0, 1)) if seeds > 1 else loop)
    if seeds == 1:
        carry = jax.tree.map(lambda x: x[0], carry)
        grads = grads[:, 0]
    compiled = run.lower(carry, grads).compile()
    copies = vector_copies(compiled.as_text(), size)
    jax.block_until_ready(compiled(carry, grads))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(carry, grads))
        times.append(time.perf_counter() - start)
    return float(np.median(times)) / steps * 1e6, copies


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=int, default=17_000, help="params per seed")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=128, help="gradient steps in the loop")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    print(
        f"device {device.device_kind}, jax {jax.__version__}, kernel backend "
        f"{kernels.resolve_backend()}; {args.seeds} seed(s) x {args.params} params, "
        f"{args.steps} steps a loop"
    )
    print("| variant | us a step | vector copies in the loop |")
    print("|---|---|---|")
    for name, loop in (("optax", optax_loop), ("adam_step", adam_step_loop)):
        us, copies = measure(loop, args.seeds, args.params, args.steps, args.repeats)
        print(f"| {name} | {us:.1f} | {copies} |")


if __name__ == "__main__":
    main()
