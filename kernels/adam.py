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

That is `optax.chain(rl.optimizers.clip_by_global_norm(max_norm), optax.adam(lr, b1, b2, eps))`
(its clip with the norm given, `grad_sq_norm`) followed by `rl.optimizers.periodic_polyak(target,
params', tau, sync)`; `adam_step` returns (params', mu', nu', target', c').

Why a kernel: on the GPU an agent's optimiser step is otherwise several small XLA kernels (the
norm's reduction, Adam's moments and update, the target's Polyak step, one or more per parameter
array), each ~1.3 us at the small MLPs of DQN or SAC; here one launch covers every seed's vectors,
one program per seed and block of `BLOCK` elements. The norm is an input: the fused gradient
kernels (`kernels.q_grads`, `kernels.twin_q_grads`) compute it with the gradient; without it
`adam_step` reduces it first (one XLA reduction). The bias corrections 1 - b^t are computed per
seed in JAX as optax computes them (a few scalar operations XLA fuses), so that the step matches
optax's to float32 rounding.

Backends: "reference" is the formula above in plain JAX; "triton" and "interpret" run the kernel.
Not differentiable (an optimiser step). Batch the seeds with `jax.vmap`: every seed's vectors and
scalars (the hyperparameters may differ per seed) go into one launch.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from kernels._triton import tl, triton
from kernels.launch import cdiv, check_float_array, fold_vmap, launch, resolve_backend

__all__ = ["adam_step", "adam_step_reference"]

BLOCK = 1024  # elements per program
NUM_WARPS = 4


@triton.jit
def _adam_kernel(
    params_ptr,
    grads_ptr,
    mu_ptr,
    nu_ptr,
    target_ptr,
    count_ptr,
    correction1_ptr,
    correction2_ptr,
    lr_ptr,
    max_norm_ptr,
    sq_norm_ptr,
    tau_ptr,
    sync_ptr,
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
    scalars: element s of [S]); program (s, 0) also writes the seed's new count."""
    s = tl.program_id(0)
    j = tl.program_id(1)
    cols = j * BLOCK + tl.arange(0, BLOCK)
    ok = cols < P
    at = s.to(tl.int64) * P + cols
    count = tl.load(count_ptr + s)
    norm = tl.sqrt(tl.load(sq_norm_ptr + s))
    max_norm = tl.load(max_norm_ptr + s)
    lr = tl.load(lr_ptr + s)
    tau = tl.load(tau_ptr + s)
    sync = tl.load(sync_ptr + s)
    g = tl.load(grads_ptr + at, mask=ok, other=0.0)
    g = tl.where(norm < max_norm, g, g / norm * max_norm)
    mu = b1 * tl.load(mu_ptr + at, mask=ok, other=0.0) + one_minus_b1 * g
    nu = b2 * tl.load(nu_ptr + at, mask=ok, other=0.0) + one_minus_b2 * (g * g)
    correction1 = tl.load(correction1_ptr + s)  # 1 - b1^t, computed as optax computes it
    correction2 = tl.load(correction2_ptr + s)
    step = (mu / correction1) / (tl.sqrt(nu / correction2) + eps)
    params = tl.load(params_ptr + at, mask=ok, other=0.0) - lr * step
    target = tl.load(target_ptr + at, mask=ok, other=0.0)
    target = tl.where(sync != 0.0, tau * params + (1.0 - tau) * target, target)
    tl.store(params_out + at, params, mask=ok)
    tl.store(mu_out + at, mu, mask=ok)
    tl.store(nu_out + at, nu, mask=ok)
    tl.store(target_out + at, target, mask=ok)
    if j == 0:
        tl.store(count_out + s, count + 1)


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
    *,
    b1,
    b2,
    eps,
):
    """The module docstring's (params', mu', nu', target', count') in plain JAX; `corrections`
    are `bias_corrections(count, b1, b2)`."""
    norm = jnp.sqrt(sq_norm)
    g = jnp.where(norm < max_norm, grads, grads / norm * max_norm)
    mu = b1 * mu + (1.0 - b1) * g
    nu = b2 * nu + (1.0 - b2) * jnp.square(g)
    correction1, correction2 = corrections
    params = params - lr * (mu / correction1) / (jnp.sqrt(nu / correction2) + eps)
    target = jnp.where(sync != 0, tau * params + (1.0 - tau) * target, target)
    return params, mu, nu, target, count + 1


def _adam_core(
    params,
    grads,
    mu,
    nu,
    target,
    count,
    correction1,
    correction2,
    lr,
    max_norm,
    sq_norm,
    tau,
    sync,
    *,
    lead,
    backend,
    hyper,
):
    lead_shape = tuple(params.shape[:lead])
    s, p = math.prod(lead_shape), params.shape[lead]
    vector = lambda x: x.reshape(s, p)
    scalar = lambda x, dtype=jnp.float32: x.reshape(s).astype(dtype)
    vectors = jax.ShapeDtypeStruct((s, p), jnp.float32)
    outs = launch(
        _adam_kernel,
        *map(vector, (params, grads, mu, nu, target)),
        scalar(count, jnp.int32),
        *map(scalar, (correction1, correction2, lr, max_norm, sq_norm, tau, sync)),
        p,
        *(np.float32(h) for h in hyper),  # 1 - b in float64 first, as optax rounds it
        backend=backend,
        out_shape=[vectors] * 4 + [jax.ShapeDtypeStruct((s,), jnp.int32)],
        grid=(s, cdiv(p, BLOCK)),
        input_output_aliases={0: 0, 2: 1, 3: 2, 5: 4},  # the target not: it may be params
        num_warps=NUM_WARPS,
        BLOCK=BLOCK,
    )
    return [x.reshape(lead_shape + x.shape[1:]) for x in outs]


@functools.lru_cache(maxsize=None)
def _kernel_op(backend, b1: float, b2: float, eps: float):
    hyper = (b1, 1.0 - b1, b2, 1.0 - b2, eps)
    return fold_vmap(functools.partial(_adam_core, backend=backend, hyper=hyper))


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
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    backend: str | None = None,
):
    """One clipped Adam step and target step of the module docstring.

    params, grads, mu, nu (and target) [P] float32 flat vectors; count the int32 count of steps
    taken (optax's `ScaleByAdamState.count`); lr, max_norm, tau scalars and sync a bool scalar (all
    may be traced); sq_norm ||grads||^2 where known already (else reduced here). b1, b2, eps are
    fixed numbers. Returns (params', mu', nu', target', count'), target' None without a target.
    Under `jax.vmap` every seed's step is one launch."""
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
    sq_norm = jnp.sum(jnp.square(grads)) if sq_norm is None else jnp.asarray(sq_norm, jnp.float32)
    corrections = bias_corrections(count, b1, b2)
    name = resolve_backend(backend)
    if name == "reference":
        args = (params, grads, mu, nu, target, count, corrections, lr, max_norm, sq_norm, tau, sync)
        out = adam_step_reference(*args, b1=b1, b2=b2, eps=eps)
    else:
        args = (params, grads, mu, nu, target, count, *corrections, lr, max_norm, sq_norm)
        out = _kernel_op(name, b1, b2, eps)(*args, tau, sync)
    params, mu, nu, target, count = out
    return params, mu, nu, (target if has_target else None), count
