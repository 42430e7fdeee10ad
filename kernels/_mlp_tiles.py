"""Triton building blocks of the fused MLP kernels (`ppo_grads`, `q_grads`, `q_act`, `twin_q_grads`,
`deterministic_policy_grads`, `sac_actor_grads`): tiles of a two-hidden-layer MLP read from and
written to a flat parameter vector, its forward pass and its backpropagation for one block of rows;
and the checks and sums around their launches (`check_flat_layout`, `summed_partials`).

The MLP, with activation f = tanh, relu or silu (f(0) = 0, so padded hidden units stay 0 and their
gradients are exactly 0; `ACTIVATION_CODES` gives each its constexpr code):

    h1 = f(x W1 + b1),   h2 = f(h1 W2 + b2),   out = h2 W3 + b3

Every tile is zero-padded to power-of-two sizes (at least 16, what `tl.dot` needs), so the padded
rows and columns add exact zeros to every product and sum.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from kernels._triton import tl, triton
from kernels.launch import next_power_of_2

ACTIVATION_CODES = {"tanh": 0, "relu": 1, "silu": 2}
# the same activations in plain JAX, for the ops' references
REFERENCE_ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu, "silu": jax.nn.silu}


# the kernels' matmul precisions (`matmul`): float32 operands with TF32 or full float32 products,
# or bfloat16 operands; every one accumulates in float32
PRECISIONS = ("tf32", "ieee", "bf16")


def check_precision(dot_precision: str) -> str:
    """`dot_precision` after checking it is one of `PRECISIONS`; ValueError naming the argument
    otherwise."""
    if dot_precision not in PRECISIONS:
        raise ValueError(f"dot_precision must be one of {PRECISIONS}, got {dot_precision!r}")
    return dot_precision


def _plain_dot(a, b, dot_precision: str):
    """a [..., K] @ b [K, N] at `dot_precision` (`reference_dot`'s forward)."""
    if dot_precision == "bf16":
        return jax.lax.dot_general(
            a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
            (((a.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.float32,
        )  # fmt: skip
    precision = jax.lax.Precision.HIGHEST if dot_precision == "ieee" else None
    return jnp.dot(a, b, precision=precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def reference_dot(a, b, dot_precision: str):
    """a @ b (a [..., K], b [K, N]) with the kernels' numerics (`matmul`), in plain JAX:

        "bf16":  bf16(a) @ bf16(b), products exact and summed in float32; the backward the same,
                 da = bf16(g) @ bf16(b)^T, db = bf16(a)^T @ bf16(g), as the kernels' backprop
        "ieee":  float32 at Precision.HIGHEST
        "tf32":  float32 at the default precision: XLA's TF32 products on an Ampere/Hopper GPU, full
                 float32 on the CPU (where the interpreter's "tf32" dot is full float32 too)

    The result is float32 for "bf16" and the operands' dtype otherwise (float64 operands, the
    tests' oracle, stay float64 at "ieee")."""
    return _plain_dot(a, b, dot_precision)


def _reference_dot_fwd(a, b, dot_precision):
    return _plain_dot(a, b, dot_precision), (a, b)


def _reference_dot_bwd(dot_precision, saved, g):
    a, b = saved
    a2 = a.reshape(-1, a.shape[-1])
    g2 = g.reshape(-1, g.shape[-1])
    da = _plain_dot(g2, b.T, dot_precision).reshape(a.shape)
    db = _plain_dot(a2.T, g2, dot_precision)
    return da.astype(a.dtype), db.astype(b.dtype)


reference_dot.defvjp(_reference_dot_fwd, _reference_dot_bwd)


def reference_mlp(layers, x, activation: str, dot_precision: str):
    """The module docstring's MLP in plain JAX, out = f(f(x W1 + b1) W2 + b2) W3 + b3, from
    `layers` (w1, b1, w2, b2, w3, b3), its matmuls `reference_dot` at `dot_precision` (one of
    `PRECISIONS`): the ops' references."""
    f = REFERENCE_ACTIVATIONS[activation]
    w1, b1, w2, b2, w3, b3 = layers
    dot = functools.partial(reference_dot, dot_precision=dot_precision)
    return dot(f(dot(f(dot(x, w1) + b1), w2) + b2), w3) + b3


def summed_partials(grads, aux, b: int, chunks: int):
    """(grads [b, P], ||grads||^2 [b], aux summed over each seed's programs [b, K]) from a launch
    that wrote one partial gradient per program, grads [b chunks, P], and per program aux [b chunks,
    K] whose last column is the program's sum of squared gradient entries. One program per seed:
    its sum of squares is the norm; several: the partials are summed first (the squares of the sum
    are not the programs' sums)."""
    sums = aux.reshape(b, chunks, aux.shape[-1]).sum(axis=1)
    if chunks == 1:
        return grads, sums[:, -1], sums
    grads = grads.reshape(b, chunks, grads.shape[-1]).sum(axis=1)
    return grads, jnp.sum(jnp.square(grads), axis=1), sums


def check_flat_layout(layout, cls, arrays: int, sizes):
    """`layout` after checking it is a `cls` (a NamedTuple with `offsets`, `hidden`, `size` and
    `shapes()`): `arrays` offsets and two hidden widths, Python ints, positive sizes
    (`sizes(layout)`: its size fields), and the arrays covering [0, size) exactly once (the kernels
    write every gradient entry and nothing else). ValueError naming the problem otherwise."""
    if not isinstance(layout, cls):
        raise ValueError(
            f"layout must be a {cls.__module__}.{cls.__name__}, got {type(layout).__name__}"
        )
    if len(layout.offsets) != arrays or len(layout.hidden) != 2:
        raise ValueError(f"layout needs {arrays} offsets and 2 hidden widths, got {layout}")
    dims = list(sizes(layout))
    ints = [*layout.offsets, *dims, layout.size]
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in ints):
        raise ValueError(f"layout entries must be Python ints (a layout is static), got {layout}")
    if min(dims) < 1:
        raise ValueError(f"layout: sizes must be positive, got {layout}")
    spans = sorted((int(o), int(o) + math.prod(s)) for o, s in zip(layout.offsets, layout.shapes()))
    at = 0
    for start, end in spans:
        if start != at:
            raise ValueError(
                f"layout: the {arrays} arrays must cover the flat vector's {layout.size} entries "
                f"exactly once, with no gap or overlap; an array starts at {start} where the "
                f"ones before end at {at} (layout {layout})"
            )
        at = end
    if at != layout.size:
        raise ValueError(f"layout: the arrays cover {at} entries, the vector has {layout.size}")
    return layout


def padded(n: int) -> int:
    """The tile size that holds n entries: a power of two, at least 16."""
    return max(16, next_power_of_2(n))


@triton.jit
def load_matrix(ptr, R, C, RP: tl.constexpr, CP: tl.constexpr):
    """The row-major [R, C] matrix at ptr, zero-padded to [RP, CP]."""
    r = tl.arange(0, RP)
    c = tl.arange(0, CP)
    return tl.load(
        ptr + r[:, None] * C + c[None, :], mask=(r[:, None] < R) & (c[None, :] < C), other=0.0
    )


@triton.jit
def load_vector(ptr, C, CP: tl.constexpr):
    c = tl.arange(0, CP)
    return tl.load(ptr + c, mask=c < C, other=0.0)


@triton.jit
def store_matrix(ptr, R, C, value, RP: tl.constexpr, CP: tl.constexpr):
    r = tl.arange(0, RP)
    c = tl.arange(0, CP)
    tl.store(ptr + r[:, None] * C + c[None, :], value, mask=(r[:, None] < R) & (c[None, :] < C))


@triton.jit
def store_vector(ptr, C, value, CP: tl.constexpr):
    c = tl.arange(0, CP)
    tl.store(ptr + c, value, mask=c < C)


@triton.jit
def activate(z, ACT: tl.constexpr):
    """f(z) for the activation code ACT (`ACTIVATION_CODES`)."""
    if ACT == 1:
        return tl.maximum(z, 0.0, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN, as in XLA
    elif ACT == 2:
        return z / (1.0 + tl.exp(-z))  # silu: z sigmoid(z)
    else:
        return 1.0 - 2.0 / (
            tl.exp(2.0 * z) + 1.0
        )  # tanh; saturates to +-1 without overflow trouble


@triton.jit
def saved(z, ACT: tl.constexpr):
    """What a hidden layer keeps for the backward: h = f(z) for tanh and relu (f' is a function of
    h), z itself for silu (whose f' needs z)."""
    if ACT == 2:
        return z
    else:
        return activate(z, ACT)


@triton.jit
def output(s, ACT: tl.constexpr):
    """The hidden layer's output h from what `saved` kept."""
    if ACT == 2:
        return activate(s, ACT)
    else:
        return s


@triton.jit
def activation_grad(s, ACT: tl.constexpr):
    """f'(z) from what `saved` kept: relu -> [h > 0], tanh -> 1 - h^2, silu -> sigmoid(z)
    (1 + z (1 - sigmoid(z)))."""
    if ACT == 1:
        return (s > 0.0).to(tl.float32)
    elif ACT == 2:
        sigmoid = 1.0 / (1.0 + tl.exp(-s))
        return sigmoid * (1.0 + s * (1.0 - sigmoid))
    else:
        return 1.0 - s * s


@triton.jit
def matmul(a, b, PRECISION: tl.constexpr):
    """a @ b accumulated in float32, its products at PRECISION (`PRECISIONS`): "bf16" rounds both
    operands to bfloat16 (to nearest even) for the tensor cores' bf16 x bf16 -> f32 dot; "tf32"
    and "ieee" are `tl.dot`'s input precisions on float32 operands."""
    if PRECISION == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), out_dtype=tl.float32)
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def torso(x, w1, b1, w2, b2, ACT: tl.constexpr, PRECISION: tl.constexpr):
    """(s1, s2): what the two hidden layers keep (`saved`); `output(s2, ACT)` is the features."""
    s1 = saved(matmul(x, w1, PRECISION) + b1[None, :], ACT)
    s2 = saved(matmul(output(s1, ACT), w2, PRECISION) + b2[None, :], ACT)
    return s1, s2


@triton.jit
def backprop(
    x,
    s1,
    s2,
    d_out,
    w2,
    w3,
    g_w1,
    g_b1,
    g_w2,
    g_b2,
    g_w3,
    g_b3,
    ACT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Adds this block's weight gradients, given dL/d(out) for its rows (zero on padded rows);
    s1, s2 what `torso` kept.

    w2 and w3 stay as loaded ([in, out]) and are transposed inside each ``tl.dot``: the forward
    pass reads them untransposed, so the row loop holds one on-chip copy of each weight, not two
    (benchmarks/RESULTS.md, "Tried and did not pay", times the hoisted-transpose variant)."""
    h1 = output(s1, ACT)
    h2 = output(s2, ACT)
    g_w3 += matmul(tl.trans(h2), d_out, PRECISION)
    g_b3 += tl.sum(d_out, axis=0)
    d_z2 = matmul(d_out, tl.trans(w3), PRECISION) * activation_grad(s2, ACT)
    g_w2 += matmul(tl.trans(h1), d_z2, PRECISION)
    g_b2 += tl.sum(d_z2, axis=0)
    d_z1 = matmul(d_z2, tl.trans(w2), PRECISION) * activation_grad(s1, ACT)
    g_w1 += matmul(tl.trans(x), d_z1, PRECISION)
    g_b1 += tl.sum(d_z1, axis=0)
    return g_w1, g_b1, g_w2, g_b2, g_w3, g_b3


@triton.jit
def load_mlp(
    ptr,
    off_w1,
    off_b1,
    off_w2,
    off_b2,
    off_w3,
    off_b3,
    D,
    H1,
    H2,
    O,
    DP: tl.constexpr,
    H1P: tl.constexpr,
    H2P: tl.constexpr,
    OP: tl.constexpr,
):
    """The six arrays of one MLP from a flat parameter vector at ptr, each at its offset,
    zero-padded."""
    w1 = load_matrix(ptr + off_w1, D, H1, DP, H1P)
    b1 = load_vector(ptr + off_b1, H1, H1P)
    w2 = load_matrix(ptr + off_w2, H1, H2, H1P, H2P)
    b2 = load_vector(ptr + off_b2, H2, H2P)
    w3 = load_matrix(ptr + off_w3, H2, O, H2P, OP)
    b3 = load_vector(ptr + off_b3, O, OP)
    return w1, b1, w2, b2, w3, b3


@triton.jit
def store_grads(
    ptr,
    off_w1,
    off_b1,
    off_w2,
    off_b2,
    off_w3,
    off_b3,
    D,
    H1,
    H2,
    O,
    g_w1,
    g_b1,
    g_w2,
    g_b2,
    g_w3,
    g_b3,
    DP: tl.constexpr,
    H1P: tl.constexpr,
    H2P: tl.constexpr,
    OP: tl.constexpr,
):
    """Writes the six gradients into a flat vector at ptr, each at its array's offset; returns their
    sum of squares (the padding is zero, so the padded tiles sum exactly)."""
    store_matrix(ptr + off_w1, D, H1, g_w1, DP, H1P)
    store_vector(ptr + off_b1, H1, g_b1, H1P)
    store_matrix(ptr + off_w2, H1, H2, g_w2, H1P, H2P)
    store_vector(ptr + off_b2, H2, g_b2, H2P)
    store_matrix(ptr + off_w3, H2, O, g_w3, H2P, OP)
    store_vector(ptr + off_b3, O, g_b3, OP)
    return (
        tl.sum(tl.sum(g_w1 * g_w1, axis=1), axis=0)
        + tl.sum(g_b1 * g_b1, axis=0)
        + tl.sum(tl.sum(g_w2 * g_w2, axis=1), axis=0)
        + tl.sum(g_b2 * g_b2, axis=0)
        + tl.sum(tl.sum(g_w3 * g_w3, axis=1), axis=0)
        + tl.sum(g_b3 * g_b3, axis=0)
    )
