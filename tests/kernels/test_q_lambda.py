"""q_lambda_returns on every backend vs a float64 NumPy loop, under jit/vmap/scan/grad,
traced lambda."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from run_helpers import central_differences

from kernels import q_lambda_returns
from kernels._chunked_scan import ScanConfig
from kernels.q_lambda import q_lambda_returns_reference

CONFIGS = [
    None,
    ScanConfig(chunk_t=4, block_n=4, chained=False),
    ScanConfig(chunk_t=4, block_n=8, chained=True),
    ScanConfig(chunk_t=2, block_n=4, chained=True, prefix_lookup=False),
]


def numpy_q_lambda(rewards, next_values, discounts, lambda_):
    """float64 loop: G_{T-1} = r + d nv; G_t = r_t + d_t ((1 - l_t) nv_t + l_t G_{t+1})."""
    r, nv, d = (np.asarray(a, np.float64) for a in (rewards, next_values, discounts))
    lam = np.broadcast_to(np.asarray(lambda_, np.float64), r.shape)
    out = np.zeros_like(r)
    g = nv[-1]
    for t in reversed(range(r.shape[0])):
        g = r[t] + d[t] * ((1 - lam[t]) * nv[t] + lam[t] * g)
        out[t] = g
    return out


def assert_close(actual, expected, horizon):
    expected = np.asarray(expected, np.float64)
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(
        np.asarray(actual, np.float64), expected, rtol=1e-5, atol=2e-6 * (horizon + 1) * scale
    )


def random_inputs(rng, shape, gamma=0.99, done_prob=0.2):
    rewards, next_values = (rng.normal(size=shape).astype(np.float32) for _ in range(2))
    done = rng.uniform(size=shape) < done_prob
    return rewards, next_values, (gamma * (1.0 - done)).astype(np.float32)


# The property test calls the op through one jitted program per example (an example's shapes are
# new, so an eager call would compile each of the op's operations on its own); the other tests
# call it eagerly.
q_lambda_returns_jit = jax.jit(q_lambda_returns, static_argnames=("backend",))


@settings(max_examples=25, deadline=None)
@given(
    horizon=st.integers(1, 40),
    batch=st.sampled_from([(), (1,), (3,), (2, 3), (7, 1)]),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    per_step_lambda=st.booleans(),
    done_prob=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_float64_numpy(
    backend, horizon, batch, gamma, lam, per_step_lambda, done_prob, seed
):
    rng = np.random.default_rng(seed)
    shape = (horizon, *batch)
    inputs = random_inputs(rng, shape, gamma, done_prob)
    lambda_ = (
        (lam * (rng.uniform(size=shape) > 0.2)).astype(np.float32)
        if per_step_lambda
        else np.float32(lam)
    )
    got = q_lambda_returns_jit(*inputs, lambda_, backend=backend)
    assert got.shape == shape and got.dtype == jnp.float32
    assert_close(got, numpy_q_lambda(*inputs, lambda_), horizon)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("shape", [(1, 3), (9, 5), (17, 2, 3)])
def test_tilings(kernel_backend, config, shape):
    rng = np.random.default_rng(1)
    inputs = random_inputs(rng, shape)
    lambda_ = rng.uniform(size=shape).astype(np.float32)
    got = q_lambda_returns(*inputs, lambda_, backend=kernel_backend, config=config)
    assert_close(got, numpy_q_lambda(*inputs, lambda_), shape[0])


def test_hand_computed_case(backend):
    # T=3, one env, lambda 0.5; the episode ends at step 1
    # (discount 0, lambda cut to 0 by the caller).
    rewards = np.array([1.0, 2.0, 3.0], np.float32)
    next_values = np.array([4.0, 5.0, 6.0], np.float32)
    discounts = np.array([0.5, 0.0, 0.5], np.float32)
    lambdas = np.array([0.5, 0.0, 0.5], np.float32)
    got = q_lambda_returns(rewards, next_values, discounts, lambdas, backend=backend)
    # G_2 = 3 + .5 * 6 = 6 (last step: bootstrap only); G_1 = 2 + 0 = 2;
    # G_0 = 1 + .5 * (.5 * 4 + .5 * 2) = 2.5
    np.testing.assert_allclose(got, [2.5, 2.0, 6.0], rtol=1e-6)


def test_limits_are_one_step_q_learning_and_monte_carlo(backend):
    """lambda = 0: r + d nv (DQN's target); lambda = 1, no ends: the discounted return to the
    horizon bootstrapped from the last next value."""
    rng = np.random.default_rng(4)
    rewards, next_values = rng.normal(size=(2, 8, 3)).astype(np.float32)
    discounts = np.full((8, 3), 0.9, np.float32)
    np.testing.assert_allclose(
        q_lambda_returns(rewards, next_values, discounts, np.float32(0), backend=backend),
        rewards + discounts * next_values,
        rtol=1e-5,
        atol=1e-6,
    )
    want = np.zeros((8, 3))
    g = next_values[-1].astype(np.float64)
    for t in reversed(range(8)):
        g = rewards[t] + 0.9 * g
        want[t] = g
    assert_close(
        q_lambda_returns(rewards, next_values, discounts, np.float32(1), backend=backend), want, 8
    )


def test_jit_nested_vmap_over_lambda_and_seeds(backend):
    rng = np.random.default_rng(2)
    seeds, horizon, envs = 2, 10, 3
    rewards = rng.normal(size=(seeds, horizon, envs)).astype(np.float32)
    _, next_values, discounts = random_inputs(rng, (horizon, envs))
    lambdas = jnp.array([0.0, 0.5, 0.95, 1.0], jnp.float32)
    one = lambda lam, r: q_lambda_returns(r, next_values, discounts, lam, backend=backend)
    got = jax.jit(jax.vmap(jax.vmap(one, in_axes=(None, 0)), in_axes=(0, None)))(lambdas, rewards)
    assert got.shape == (4, seeds, horizon, envs)
    for i, lam in enumerate(np.asarray(lambdas)):
        for s in range(seeds):
            assert_close(
                got[i, s], numpy_q_lambda(rewards[s], next_values, discounts, lam), horizon
            )


def test_inside_lax_scan(backend):
    rng = np.random.default_rng(3)
    inputs = random_inputs(rng, (6, 4))

    @jax.jit
    def run(lambdas):
        return jax.lax.scan(
            lambda c, lam: (c, q_lambda_returns(*inputs, lam, backend=backend)), 0.0, lambdas
        )[1]

    lambdas = jnp.array([0.3, 0.9], jnp.float32)
    out = run(lambdas)
    for i, lam in enumerate(np.asarray(lambdas)):
        assert_close(out[i], numpy_q_lambda(*inputs, lam), 6)


@pytest.mark.parametrize("per_step_lambda", [False, True])
def test_gradients_match_float64_finite_differences(backend, per_step_lambda):
    """The gradients with respect to every input, lambda too, against float64 central differences
    of the NumPy loop `numpy_q_lambda` (an oracle independent of the op and of JAX), and, for a
    kernel backend, against autodiff of the reference."""
    rng = np.random.default_rng(5)
    shape = (11, 3)
    inputs = random_inputs(rng, shape)
    lambda_ = rng.uniform(size=shape).astype(np.float32) if per_step_lambda else np.float32(0.9)
    weights = rng.normal(size=shape).astype(np.float32)

    def loss(fn, xp=jnp):
        return lambda *args: xp.sum(weights * fn(*args) ** 2)

    reference = lambda r, nv, d, lam: q_lambda_returns_reference(
        r, nv, d, jnp.broadcast_to(lam, r.shape)
    )
    argnums = (0, 1, 2, 3)
    ours = jax.jit(
        jax.grad(loss(lambda *a: q_lambda_returns(*a, backend=backend)), argnums=argnums)
    )(*inputs, lambda_)
    oracle = central_differences(loss(numpy_q_lambda, np), (*inputs, lambda_))
    for got, want in zip(ours, oracle):
        assert np.shape(got) == np.shape(want)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if backend != "reference":
        ref = jax.grad(loss(reference), argnums=argnums)(*inputs, lambda_)
        for got, want in zip(ours, ref):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "index, bad, message",
    [
        (0, np.zeros((5, 3), np.int32), "rewards must be a floating-point array, got dtype int32"),
        (
            1,
            np.zeros((4, 3), np.float32),
            r"next_values must have the shape of rewards \(5, 3\), got \(4, 3\)",
        ),
        (2, np.zeros((5, 3), np.int32), "discounts must be a floating-point"),
        (
            3,
            np.zeros((5,), np.float32),
            r"lambda_ must be a scalar or have the shape of rewards \(5, 3\), got \(5,\)",
        ),
    ],
)
def test_bad_inputs_raise_at_trace_time(backend, index, bad, message):
    args = [np.zeros((5, 3), np.float32) for _ in range(3)] + [np.float32(0.95)]
    args[index] = bad
    with pytest.raises(ValueError, match=message):
        jax.jit(lambda *a: q_lambda_returns(*a, backend=backend)).lower(*args)
