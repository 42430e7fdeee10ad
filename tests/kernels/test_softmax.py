"""softmax on every backend vs a float64 NumPy reference, under jit/vmap/scan/grad."""

from __future__ import annotations

import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import softmax
from kernels.softmax import softmax_reference

# the module itself (the package attribute ``kernels.softmax`` is the function)
softmax_module = importlib.import_module("kernels.softmax")

# one kernel launch in a jaxpr: an equation of either primitive
LAUNCH = re.compile(r"= (?:pure_callback|triton_kernel_call)\[")


def numpy_softmax(x, axis=-1):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def numpy_softmax_vjp(x, g, axis=-1):
    """dx = p * (g - sum(g * p)) in float64."""
    p = numpy_softmax(x, axis)
    g = np.asarray(g, np.float64)
    return p * (g - (g * p).sum(axis=axis, keepdims=True))


def assert_close(actual, expected, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


# The property test calls the op through one jitted program per example (an example's shapes are
# new, so an eager call would compile each of the op's operations on its own); the other tests
# call it eagerly.
softmax_jit = jax.jit(softmax, static_argnames=("axis", "backend"))


@settings(max_examples=20, deadline=None)
@given(
    lead=st.sampled_from([(), (1,), (3,), (5,), (2, 3)]),
    cols=st.sampled_from([1, 2, 3, 4, 6, 9, 18, 33, 51, 70]),
    axis_from_end=st.sampled_from([True, False]),
    scale=st.sampled_from([0.1, 1.0, 30.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_float64_numpy(backend, lead, cols, axis_from_end, scale, seed):
    rng = np.random.default_rng(seed)
    shape = (*lead, cols)
    x = (scale * rng.normal(size=shape)).astype(np.float32)
    axis = -1 if axis_from_end else 0
    out = softmax_jit(x, axis=axis, backend=backend)
    assert out.shape == x.shape and out.dtype == jnp.float32
    assert_close(out, numpy_softmax(x, axis))
    assert_close(out.sum(axis=axis), 1.0, atol=1e-5)


@pytest.mark.parametrize("shape", [(3, 17), (2, 40), (1, 64), (2, 3, 51)])
def test_wide_rows_stream_in_chunks(kernel_backend, monkeypatch, shape):
    """Rows wider than MAX_TILE_COLUMNS take the looped kernels (forward and backward)."""
    monkeypatch.setattr(softmax_module, "MAX_TILE_COLUMNS", 16)
    rng = np.random.default_rng(3)
    x = (5 * rng.normal(size=shape)).astype(np.float32)
    g = rng.normal(size=shape).astype(np.float32)
    assert softmax_module.row_tiling(int(np.prod(shape[:-1])), shape[-1])[3]  # looped
    p, vjp = jax.vjp(lambda v: softmax(v, backend=kernel_backend), x)
    assert_close(p, numpy_softmax(x))
    assert_close(vjp(g)[0], numpy_softmax_vjp(x, g))


def test_row_tiling_keeps_many_programs():
    block_r, block_n, _, looped = softmax_module.row_tiling(65536, 18)
    assert (block_n, looped) == (32, False) and block_r * block_n <= 2048
    assert softmax_module.row_tiling(4096, 4096)[:2] == (1, 4096)
    assert softmax_module.row_tiling(8, 10_000)[3]  # streamed


def test_extreme_and_infinite_logits(backend):
    x = np.array([[1e4, -1e4, 0.0], [-np.inf, 0.0, 1.0], [88.0, 89.0, 90.0]], np.float32)
    out = softmax(x, backend=backend)
    assert np.all(np.isfinite(np.asarray(out)))
    expected = numpy_softmax(np.where(np.isinf(x), -1e30, x))
    assert_close(out, expected)


def test_other_axis_and_dtype(backend):
    x = np.random.default_rng(0).normal(size=(4, 5, 6)).astype(np.float32)
    assert_close(softmax(x, axis=1, backend=backend), numpy_softmax(x, axis=1))
    assert_close(softmax(x, axis=-3, backend=backend), numpy_softmax(x, axis=0))
    half = softmax(jnp.asarray(x, jnp.bfloat16), backend=backend)
    assert half.dtype == jnp.bfloat16
    assert_close(
        half,
        numpy_softmax(np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32)),
        rtol=2e-2,
        atol=1e-2,
    )


def test_jit_and_nested_vmap(backend):
    x = np.random.default_rng(1).normal(size=(3, 4, 5, 7)).astype(np.float32)
    f = jax.jit(jax.vmap(jax.vmap(lambda v: softmax(v, backend=backend))))
    assert_close(f(x), numpy_softmax(x))
    # a vmapped axis that is not leading, and softmax over a non-last axis inside vmap
    g = jax.vmap(lambda v: softmax(v, axis=0, backend=backend), in_axes=2, out_axes=2)
    assert_close(g(x), numpy_softmax(x, axis=0))


def count_launches(jaxpr) -> int:
    return len(LAUNCH.findall(str(jaxpr)))


def test_one_launch_under_nested_vmap(kernel_backend):
    x = jnp.zeros((3, 4, 5, 7))
    jaxpr = jax.make_jaxpr(jax.vmap(jax.vmap(lambda v: softmax(v, backend=kernel_backend))))(x)
    assert count_launches(jaxpr) == 1


def test_inside_lax_scan(backend):
    xs = np.random.default_rng(2).normal(size=(5, 3, 6)).astype(np.float32)

    def step(carry, x):
        p = softmax(x + carry, backend=backend)
        return carry + p, p

    carry, ps = jax.jit(lambda xs: jax.lax.scan(step, jnp.zeros((3, 6)), xs))(xs)
    expected_carry = np.zeros((3, 6))
    for t in range(5):
        p = numpy_softmax(xs[t] + expected_carry)
        assert_close(ps[t], p, atol=2e-6)
        expected_carry = expected_carry + p
    assert_close(carry, expected_carry, atol=1e-5)


@pytest.mark.parametrize(
    "shape,axis", [((6, 5), -1), ((2, 3, 18), -1), ((4, 51), -1), ((5, 4, 3), 1)]
)
def test_gradients_match_the_hand_derived_float64_vjp(backend, shape, axis):
    """The gradient of a loss of the softmax against the float64 NumPy VJP p (g - sum(g p)) (an
    oracle independent of the op and of JAX), and, for a kernel backend, against autodiff of the
    reference."""
    rng = np.random.default_rng(4)
    x = (3 * rng.normal(size=shape)).astype(np.float32)
    w = rng.normal(size=shape).astype(np.float32)

    def loss(op):
        return lambda v: jnp.sum(w * jnp.log(op(v, axis=axis) + 0.1))

    grad = jax.jit(jax.grad(loss(lambda v, axis: softmax(v, axis=axis, backend=backend))))(x)
    p = numpy_softmax(x, axis)
    assert_close(grad, numpy_softmax_vjp(x, w / (p + 0.1), axis), atol=1e-6)
    if backend != "reference":
        expected = jax.grad(loss(softmax_reference))(x)
        assert_close(grad, np.asarray(expected, np.float64), atol=1e-6)


def test_gradients_under_vmap(backend):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 4, 9)).astype(np.float32)
    g = rng.normal(size=(3, 4, 9)).astype(np.float32)
    vjp = jax.vmap(
        jax.vmap(lambda v, c: jax.vjp(lambda u: softmax(u, backend=backend), v)[1](c)[0])
    )
    assert_close(vjp(x, g), numpy_softmax_vjp(x, g))


@pytest.mark.parametrize(
    "x,axis,message",
    [
        (
            np.arange(6).reshape(2, 3),
            -1,
            r"x must be a floating-point array, got dtype int\d+ with shape \(2, 3\)",
        ),
        (np.float32(1.0), -1, r"x must have rank >= 1, got shape \(\)"),
        (np.zeros((2, 3), np.float32), 2, r"axis 2 is out of range for x of shape \(2, 3\)"),
        (np.zeros((2, 3), np.float32), 1.0, r"axis must be an int"),
    ],
)
def test_bad_inputs_raise_at_trace_time(backend, x, axis, message):
    with pytest.raises(ValueError, match=message):
        jax.jit(lambda v: softmax(v, axis=axis, backend=backend))(x)


def test_automatic_choice_sends_narrow_rows_to_xla(monkeypatch):
    """Below AUTO_TRITON_MIN_COLUMNS an automatically chosen triton becomes XLA (measured faster
    there); a named backend is kept, and wider rows keep triton."""
    from kernels import launch
    from kernels.softmax import AUTO_TRITON_MIN_COLUMNS, automatic_crossover

    narrow, wide = AUTO_TRITON_MIN_COLUMNS - 1, AUTO_TRITON_MIN_COLUMNS
    assert automatic_crossover("triton", True, narrow) == "reference"
    assert automatic_crossover("triton", True, wide) == "triton"
    assert automatic_crossover("triton", False, narrow) == "triton"
    assert automatic_crossover("interpret", True, narrow) == "interpret"
    monkeypatch.delenv(launch.ENV_VAR, raising=False)
    assert launch.chosen_automatically(None) and not launch.chosen_automatically("triton")
    monkeypatch.setenv(launch.ENV_VAR, "reference")
    assert not launch.chosen_automatically(None)
    monkeypatch.delenv(launch.ENV_VAR)
    with launch.use_backend("reference"):
        assert not launch.chosen_automatically(None)


def test_softmax_on_narrow_rows_runs_no_kernel_when_the_choice_is_automatic(monkeypatch):
    """Through softmax() itself: an automatic triton choice on 6 columns traces no triton call."""
    module = importlib.import_module(
        "kernels.softmax"
    )  # the module (kernels.softmax is also the function)
    monkeypatch.setattr(module, "resolve_backend", lambda backend=None: "triton")
    monkeypatch.setattr(module, "chosen_automatically", lambda backend=None: True)
    x = jax.random.normal(jax.random.PRNGKey(0), (32, 6))
    jaxpr = str(jax.make_jaxpr(module.softmax)(x))
    assert "triton" not in jaxpr and "callback" not in jaxpr
    np.testing.assert_allclose(module.softmax(x), softmax_reference(x, -1), rtol=1e-6)
