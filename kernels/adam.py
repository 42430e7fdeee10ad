"""Adam on gradients clipped to a global norm, with a target network's Polyak step, on flat
parameter vectors: the whole optimiser step of every seed in one launch.

For one seed's flat float32 vectors params, grads, mu, nu, target [P], its Adam step count c (steps
taken so far), step size lr, clip max_norm, the squared gradient norm q = ||grads||^2 and a
target step (tau, sync in {0, 1}):

    g       = grads                              if sqrt(q) < max_norm
              grads / sqrt(q) * max_norm         otherwise
    mu'     = b1 mu + (1 - b1) g
    nu'     = b2 nu + (1 - b2) g^2
    t       = c + 1
    params' = params - lr (mu' / (1 - b1^t)) / (sqrt(nu' / (1 - b2^t)) + eps)
    target' = tau params' + (1 - tau) target     if sync, else target
    c'      = t

That is `optax.chain(rl.core.optimizers.clip_by_global_norm(max_norm), optax.adam(lr, b1, b2, eps))`
(its clip with the norm given, `grad_sq_norm`) followed by
`rl.core.optimizers.periodic_polyak(target, params', tau, sync)`; `adam_step` returns (params', mu',
nu', target', c'). With `active` false (per seed) the step is skipped and everything comes back as
it was: the gate of a training phase that runs every time but counts only once learning has started,
inside the launch rather than as a select of every vector after it.

Why a kernel: on the GPU an agent's optimiser step is otherwise several small XLA kernels (the
norm's reduction, Adam's moments and update, the target's Polyak step, one or more per parameter
array), each ~1.3 us at the small MLPs of DQN or SAC; here one launch covers every seed's vectors,
one program per seed and block of `BLOCK` elements. The norm is an input: the fused gradient
kernels (`kernels.q_grads`, `kernels.twin_q_grads`) compute it with the gradient; without it
`adam_step` reduces it first (one XLA reduction). The bias corrections 1 - b^t are computed per
seed in JAX as optax computes them (a few scalar operations XLA fuses, with the other per-seed
scalars, into one row per seed), so that the step matches optax's to float32 rounding.

Backends: "reference" is the formula above in plain JAX; "triton" and "interpret" run the kernel.
With the automatic choice on a GPU, a step of fewer than `AUTO_TRITON_MIN_ELEMENTS` elements over
all vmapped seeds runs as XLA's fused loop instead (`_adam_rows`), where the launch measured
slower. The updated vectors and count are written in place of the inputs. Not differentiable (an
optimiser step). Batch the seeds with `jax.vmap`: every seed's vectors and scalars (the
hyperparameters may differ per seed) go into one launch.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from kernels._triton import tl, triton
from kernels.launch import (
    cdiv,
    check_float_array,
    chosen_automatically,
    fold_vmap,
    launch,
    resolve_backend,
)

__all__ = ["adam_step", "adam_step_reference"]

BLOCK = 1024  # elements per program
NUM_WARPS = 4
# With the automatic backend choice, fewer elements than this over all seeds take XLA's fused step
# (`_adam_rows`) instead of the launch: inside DQN's program on one H200 the launch lost at
# 1 seed x 10,934 params and took half XLA's time at 64 x 10,934 (benchmarks/RESULTS.md).
AUTO_TRITON_MIN_ELEMENTS = 1 << 17


SCALARS = ("correction1", "correction2", "lr", "max_norm", "sq_norm", "tau", "sync", "active")


@triton.jit
def _adam_kernel(
    params_ptr,
    grads_ptr,
    mu_ptr,
    nu_ptr,
    target_ptr,
    count_ptr,
    scalars_ptr,
    P,
    b1,
    one_minus_b1,
    b2,
    one_minus_b2,
    eps,
    params_out,
    mu_out,
    nu_out,
    target_out,
    count_out,
    BLOCK: tl.constexpr,
):
    """Program (s, j): elements [j BLOCK, (j + 1) BLOCK) of seed s (vectors: row s of [S, P];
    count: element s of [S]; scalars: row s of [S, 8] in `SCALARS` order); program (s, 0) also
    writes the seed's new count."""
    s = tl.program_id(0)
    j = tl.program_id(1)
    cols = j * BLOCK + tl.arange(0, BLOCK)
    ok = cols < P
    at = s.to(tl.int64) * P + cols
    row = scalars_ptr + s * 8
    correction1 = tl.load(row)  # 1 - b1^t, computed as optax computes it
    correction2 = tl.load(row + 1)
    lr = tl.load(row + 2)
    max_norm = tl.load(row + 3)
    norm = tl.sqrt(tl.load(row + 4))
    tau = tl.load(row + 5)
    sync = tl.load(row + 6)
    active = tl.load(row + 7) != 0.0
    count = tl.load(count_ptr + s)
    g = tl.load(grads_ptr + at, mask=ok, other=0.0)
    g = tl.where(norm < max_norm, g, g / norm * max_norm)
    mu_before = tl.load(mu_ptr + at, mask=ok, other=0.0)
    nu_before = tl.load(nu_ptr + at, mask=ok, other=0.0)
    params_before = tl.load(params_ptr + at, mask=ok, other=0.0)
    target_before = tl.load(target_ptr + at, mask=ok, other=0.0)
    mu = b1 * mu_before + one_minus_b1 * g
    nu = b2 * nu_before + one_minus_b2 * (g * g)
    step = (mu / correction1) / (tl.sqrt(nu / correction2) + eps)
    params = params_before - lr * step
    target = tl.where(sync != 0.0, tau * params + (1.0 - tau) * target_before, target_before)
    tl.store(params_out + at, tl.where(active, params, params_before), mask=ok)
    tl.store(mu_out + at, tl.where(active, mu, mu_before), mask=ok)
    tl.store(nu_out + at, tl.where(active, nu, nu_before), mask=ok)
    tl.store(target_out + at, tl.where(active, target, target_before), mask=ok)
    if j == 0:
        tl.store(count_out + s, tl.where(active, count + 1, count))


def bias_corrections(count, b1: float, b2: float):
    """(1 - b1^t, 1 - b2^t) for t = count + 1, computed as optax's Adam computes them."""
    t = count + 1
    return 1 - b1**t, 1 - b2**t


def adam_step_reference(
    params,
    grads,
    mu,
    nu,
    target,
    count,
    corrections,
    lr,
    max_norm,
    sq_norm,
    tau,
    sync,
    active,
    *,
    b1,
    b2,
    eps,
):
    """The module docstring's (params', mu', nu', target', count') in plain JAX, or the inputs
    unchanged where `active` is false; `corrections` are `bias_corrections(count, b1, b2)`."""
    norm = jnp.sqrt(sq_norm)
    g = jnp.where(norm < max_norm, grads, grads / norm * max_norm)
    # Each value is gated as it is made and the next reads the gated one, so nothing reads an
    # input after its output is written: XLA updates every vector in place, with no copy.
    new_mu = jnp.where(active, b1 * mu + (1.0 - b1) * g, mu)
    new_nu = jnp.where(active, b2 * nu + (1.0 - b2) * jnp.square(g), nu)
    correction1, correction2 = corrections
    step = lr * (new_mu / correction1) / (jnp.sqrt(new_nu / correction2) + eps)
    new_params = jnp.where(active, params - step, params)
    synced = (sync != 0) & active
    new_target = jnp.where(synced, tau * new_params + (1.0 - tau) * target, target)
    return new_params, new_mu, new_nu, new_target, jnp.where(active, count + 1, count)


def _adam_rows(params, grads, mu, nu, target, count, scalars, hyper):
    """`adam_step_reference` on [..., P] vectors, count [...] and scalars [..., 8] (`SCALARS`
    order), each seed's scalars a [..., 1] column that broadcasts along its vector: what XLA fuses
    into one loop where the launch would cost more. The vectors keep their shape (no [S, P]
    reshape), so XLA updates each in place."""
    b1, _, b2, _, eps = hyper
    correction1, correction2, lr, max_norm, sq_norm, tau, sync, active = (
        scalars[..., k : k + 1] for k in range(len(SCALARS))
    )
    out = adam_step_reference(
        params, grads, mu, nu, target, count[..., None], (correction1, correction2), lr, max_norm,
        sq_norm, tau, sync, active != 0.0, b1=b1, b2=b2, eps=eps,
    )  # fmt: skip
    return [*out[:4], out[4][..., 0]]


def _adam_core(
    params, grads, mu, nu, target, count, scalars, *, lead, backend, hyper, automatic, has_target
):
    lead_shape = tuple(params.shape[:lead])
    s, p = math.prod(lead_shape), params.shape[lead]
    if automatic and backend == "triton" and s * p < AUTO_TRITON_MIN_ELEMENTS:
        return _adam_rows(params, grads, mu, nu, target, count, scalars, hyper)
    vector = lambda x: x.reshape(s, p)
    args = (*map(vector, (params, grads, mu, nu, target)), count.reshape(s))
    scalars = scalars.reshape(s, len(SCALARS))
    aliases = {0: 0, 2: 1, 3: 2, 5: 4} | ({4: 3} if has_target else {})  # else target = params
    outs = launch(
        _adam_kernel,
        *args,
        scalars,
        p,
        *(np.float32(h) for h in hyper),  # 1 - b in float64 first, as optax rounds it
        backend=backend,
        out_shape=[jax.ShapeDtypeStruct((s, p), jnp.float32)] * 4
        + [jax.ShapeDtypeStruct((s,), jnp.int32)],
        grid=(s, cdiv(p, BLOCK)),
        input_output_aliases=aliases,
        num_warps=NUM_WARPS,
        BLOCK=BLOCK,
    )
    return [x.reshape(lead_shape + x.shape[1:]) for x in outs]


@functools.lru_cache(maxsize=None)
def _kernel_op(backend, b1: float, b2: float, eps: float, automatic: bool, has_target: bool):
    hyper = (b1, 1.0 - b1, b2, 1.0 - b2, eps)
    core = functools.partial(
        _adam_core, backend=backend, hyper=hyper, automatic=automatic, has_target=has_target
    )
    return fold_vmap(core)


def _check_hyper(b1, b2, eps) -> tuple[float, float, float]:
    for name, value in (("b1", b1), ("b2", b2)):
        if not 0.0 < float(value) < 1.0:
            raise ValueError(f"{name} must be in (0, 1), got {value}")
    if not float(eps) >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return float(b1), float(b2), float(eps)


def adam_step(
    params,
    grads,
    mu,
    nu,
    count,
    lr,
    max_norm,
    *,
    sq_norm=None,
    target=None,
    tau=1.0,
    sync=False,
    active=True,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    backend: str | None = None,
):
    """One clipped Adam step and target step of the module docstring.

    params, grads, mu, nu (and target) [P] float32 flat vectors; count the int32 count of steps
    taken (optax's `ScaleByAdamState.count`); lr, max_norm, tau scalars and sync a bool scalar (all
    may be traced); sq_norm ||grads||^2 where known already (else reduced here); active a bool
    scalar: where false the step is skipped, everything comes back unchanged (a training phase
    before learning starts, with no select of the vectors after the launch). b1, b2, eps are fixed
    numbers. Returns (params', mu', nu', target', count'), target' None without a target. Under
    `jax.vmap` every seed's step is one launch."""
    b1, b2, eps = _check_hyper(b1, b2, eps)
    vectors = {"params": params, "grads": grads, "mu": mu, "nu": nu}
    if target is not None:
        vectors["target"] = target
    vectors = {k: jnp.asarray(v) for k, v in vectors.items()}
    for name, value in vectors.items():
        check_float_array(name, value)
        if value.ndim != 1 or value.shape != vectors["params"].shape:
            raise ValueError(
                f"{name} must be a flat vector shaped like params "
                f"{tuple(vectors['params'].shape)}, got {tuple(value.shape)}"
            )
    scalars = {"count": count, "lr": lr, "max_norm": max_norm, "tau": tau, "sync": sync}
    scalars["active"] = active
    if sq_norm is not None:
        scalars["sq_norm"] = sq_norm
    for name, value in scalars.items():
        if jnp.shape(value) != ():
            raise ValueError(f"{name} must be a scalar, got shape {jnp.shape(value)}")
    params, grads, mu, nu = (
        vectors[k].astype(jnp.float32) for k in ("params", "grads", "mu", "nu")
    )
    has_target = target is not None
    target = vectors["target"].astype(jnp.float32) if has_target else params
    count = jnp.asarray(count, jnp.int32)
    lr, max_norm, tau = (jnp.asarray(x, jnp.float32) for x in (lr, max_norm, tau))
    sync = jnp.asarray(sync, jnp.float32) if has_target else jnp.float32(0.0)
    active = jnp.asarray(active, jnp.float32)
    sq_norm = jnp.sum(jnp.square(grads)) if sq_norm is None else jnp.asarray(sq_norm, jnp.float32)
    corrections = bias_corrections(count, b1, b2)
    name = resolve_backend(backend)
    if name == "reference":
        args = (params, grads, mu, nu, target, count, corrections, lr, max_norm, sq_norm, tau)
        out = adam_step_reference(*args, sync, active != 0, b1=b1, b2=b2, eps=eps)
    else:  # the per-seed scalars as one row (one small XLA fusion feeds the launch)
        row = jnp.stack([*corrections, lr, max_norm, sq_norm, tau, sync, active]).astype(
            jnp.float32
        )
        op = _kernel_op(name, b1, b2, eps, chosen_automatically(backend), has_target)
        out = op(params, grads, mu, nu, target, count, row)
    params, mu, nu, target, count = out
    return params, mu, nu, (target if has_target else None), count
