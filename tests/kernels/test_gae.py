"""gae on every backend vs a float64 NumPy reference, under jit/vmap/scan/grad, traced lambda."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from run_helpers import central_differences

from kernels import gae
from kernels._chunked_scan import ScanConfig
from kernels.gae import gae_reference

CONFIGS = [
    None,
    ScanConfig(chunk_t=4, block_n=4, chained=False),
    ScanConfig(chunk_t=4, block_n=8, chained=True),
    ScanConfig(
        chunk_t=2, block_n=4, chained=True, prefix_lookup=False
    ),  # look-back composes aggregates
]


def numpy_gae(rewards, values, next_values, discounts, lambda_):
    """float64 loop: delta = r + d nv - v; A_t = delta_t + d_t lambda_t A_{t+1}; targets = A + v."""
    r, v, nv, d = (np.asarray(a, np.float64) for a in (rewards, values, next_values, discounts))
    lam = np.broadcast_to(np.asarray(lambda_, np.float64), r.shape)
    adv = np.zeros_like(r)
    acc = np.zeros(r.shape[1:])
    for t in reversed(range(r.shape[0])):
        acc = r[t] + d[t] * nv[t] - v[t] + d[t] * lam[t] * acc
        adv[t] = acc
    return adv, adv + v


def assert_close(actual, expected, horizon):
    expected = np.asarray(expected, np.float64)
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(
        np.asarray(actual, np.float64), expected, rtol=1e-5, atol=2e-6 * (horizon + 1) * scale
    )


def random_inputs(rng, shape, gamma=0.99, done_prob=0.2):
    rewards, values, next_values = (rng.normal(size=shape).astype(np.float32) for _ in range(3))
    done = rng.uniform(size=shape) < done_prob
    discounts = (gamma * (1.0 - done)).astype(np.float32)
    return rewards, values, next_values, discounts


# The property test calls the op through one jitted program per example (an example's shapes are
# new, so an eager call would compile each of the op's operations on its own); the other tests
# call it eagerly.
gae_jit = jax.jit(gae, static_argnames=("backend",))


@settings(max_examples=25, deadline=None)
@given(
    horizon=st.integers(1, 40),
    batch=st.sampled_from([(), (1,), (3,), (5,), (2, 3), (7, 1)]),
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
    if per_step_lambda:  # truncations: lambda = 0 cuts the chain, delta still bootstraps
        lambda_ = (lam * (rng.uniform(size=shape) > 0.2)).astype(np.float32)
    else:
        lambda_ = np.float32(lam)
    adv, targets = gae_jit(*inputs, lambda_, backend=backend)
    want_adv, want_targets = numpy_gae(*inputs, lambda_)
    assert adv.shape == targets.shape == shape and adv.dtype == jnp.float32
    assert_close(adv, want_adv, horizon)
    assert_close(targets, want_targets, horizon)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("shape", [(1, 3), (9, 5), (17, 2, 3)])
@pytest.mark.parametrize("per_step_lambda", [False, True])
def test_tilings(kernel_backend, config, shape, per_step_lambda):
    rng = np.random.default_rng(1)
    inputs = random_inputs(rng, shape)
    lambda_ = rng.uniform(size=shape).astype(np.float32) if per_step_lambda else np.float32(0.9)
    got = gae(*inputs, lambda_, backend=kernel_backend, config=config)
    for g, w in zip(got, numpy_gae(*inputs, lambda_)):
        assert_close(g, w, shape[0])


def test_hand_computed_case(backend):
    # T=3, one env; episode ends after step 1 (discount 0 there).
    rewards = np.array([1.0, 2.0, 3.0], np.float32)
    values = np.array([0.5, 1.0, 1.5], np.float32)
    next_values = np.array([1.0, 1.5, 2.0], np.float32)
    discounts = np.array([0.5, 0.0, 0.5], np.float32)
    adv, targets = gae(rewards, values, next_values, discounts, np.float32(0.5), backend=backend)
    # deltas: 1 + .5*1 - .5 = 1.0; 2 + 0 - 1 = 1.0; 3 + .5*2 - 1.5 = 2.5
    # A_2 = 2.5; A_1 = 1.0 + 0 * A_2 = 1.0; A_0 = 1.0 + .25 * 1.0 = 1.25
    np.testing.assert_allclose(adv, [1.25, 1.0, 2.5], rtol=1e-6)
    np.testing.assert_allclose(targets, [1.75, 2.0, 4.0], rtol=1e-6)


def test_purejaxrl_formulation(backend):
    """next_values = values[1:] ++ last_value and discounts = gamma (1 - done) give PureJaxRL's
    GAE."""
    rng = np.random.default_rng(7)
    horizon, envs, gamma, lam = 12, 3, 0.99, 0.95
    rewards, values = rng.normal(size=(2, horizon, envs)).astype(np.float32)
    last_value = rng.normal(size=envs).astype(np.float32)
    done = rng.uniform(size=(horizon, envs)) < 0.2
    adv, _ = gae(
        rewards,
        values,
        np.concatenate([values[1:], last_value[None]]),
        (gamma * (1 - done)).astype(np.float32),
        np.float32(lam),
        backend=backend,
    )
    gae_acc, expected = np.zeros(envs), np.zeros((horizon, envs))  # PureJaxRL's loop, unrolled
    next_value = last_value.astype(np.float64)
    for t in reversed(range(horizon)):
        delta = rewards[t] + gamma * next_value * (1 - done[t]) - values[t]
        gae_acc = delta + gamma * lam * (1 - done[t]) * gae_acc
        expected[t] = gae_acc
        next_value = values[t]
    assert_close(adv, expected, horizon)


def test_jit_nested_vmap_over_lambda_and_seeds(backend):
    """Traced lambda: vmap over lambda values (rewards shared) x seeds, under jit: one launch."""
    rng = np.random.default_rng(2)
    seeds, horizon, envs = 2, 10, 3
    rewards = rng.normal(size=(seeds, horizon, envs)).astype(np.float32)
    _, values, next_values, discounts = random_inputs(rng, (horizon, envs))
    lambdas = jnp.array([0.0, 0.5, 0.95, 1.0], jnp.float32)

    def one(lam, r):
        return gae(r, values, next_values, discounts, lam, backend=backend)

    adv, targets = jax.jit(jax.vmap(jax.vmap(one, in_axes=(None, 0)), in_axes=(0, None)))(
        lambdas, rewards
    )
    assert adv.shape == (4, seeds, horizon, envs)
    for i, lam in enumerate(np.asarray(lambdas)):
        for s in range(seeds):
            want_adv, want_targets = numpy_gae(rewards[s], values, next_values, discounts, lam)
            assert_close(adv[i, s], want_adv, horizon)
            assert_close(targets[i, s], want_targets, horizon)


def test_inside_lax_scan(backend):
    rng = np.random.default_rng(3)
    inputs = random_inputs(rng, (6, 4))

    @jax.jit
    def run(lambdas):
        return jax.lax.scan(
            lambda c, lam: (c, gae(*inputs, lam, backend=backend)[0]), 0.0, lambdas
        )[1]

    lambdas = jnp.array([0.3, 0.9], jnp.float32)
    out = run(lambdas)
    for i, lam in enumerate(np.asarray(lambdas)):
        assert_close(out[i], numpy_gae(*inputs, lam)[0], 6)


@pytest.mark.parametrize("per_step_lambda", [False, True])
def test_gradients_match_float64_finite_differences(backend, per_step_lambda):
    """The gradients of a loss of (advantages, targets) with respect to every input, lambda too,
    against float64 central differences of the NumPy loop `numpy_gae` (an oracle independent of
    the op and of JAX), and, for a kernel backend, against autodiff of the reference."""
    rng = np.random.default_rng(5)
    shape = (11, 3)
    inputs = random_inputs(rng, shape)
    lambda_ = rng.uniform(size=shape).astype(np.float32) if per_step_lambda else np.float32(0.9)
    w_adv, w_tgt = rng.normal(size=(2, *shape)).astype(np.float32)

    def loss(fn, xp=jnp):
        def f(*args):
            adv, targets = fn(*args)
            return xp.sum(w_adv * adv) + xp.sum(w_tgt * targets**2)

        return f

    argnums = (0, 1, 2, 3, 4)
    ours = jax.jit(jax.grad(loss(lambda *a: gae(*a, backend=backend)), argnums=argnums))(
        *inputs, lambda_
    )
    oracle = central_differences(loss(numpy_gae, np), (*inputs, lambda_))
    for got, want in zip(ours, oracle):
        assert np.shape(got) == np.shape(want)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if backend != "reference":
        ref = jax.grad(loss(gae_reference), argnums=argnums)(*inputs, lambda_)
        for got, want in zip(ours, ref):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "index, bad, message",
    [
        (0, np.zeros((5, 3), np.int32), "rewards must be a floating-point array, got dtype int32"),
        (
            1,
            np.zeros((5, 2), np.float32),
            r"values must have the shape of rewards \(5, 3\), got \(5, 2\)",
        ),
        (
            2,
            np.zeros((4, 3), np.float32),
            r"next_values must have the shape of rewards \(5, 3\), got \(4, 3\)",
        ),
        (3, np.zeros((5, 3), np.int32), "discounts must be a floating-point"),
        (
            4,
            np.zeros((5,), np.float32),
            r"lambda_ must be a scalar or have the shape of rewards \(5, 3\), got \(5,\)",
        ),
        (4, np.int32(1), "lambda_ must be a floating-point"),
    ],
)
def test_bad_inputs_raise_at_trace_time(backend, index, bad, message):
    args = [np.zeros((5, 3), np.float32) for _ in range(4)] + [np.float32(0.95)]
    args[index] = bad
    with pytest.raises(ValueError, match=message):
        jax.jit(lambda *a: gae(*a, backend=backend)).lower(*args)


def test_rank_zero_rewards_raise(backend):
    with pytest.raises(ValueError, match=r"rewards must have rank >= 1, got shape \(\)"):
        gae(
            np.float32(1),
            np.float32(1),
            np.float32(1),
            np.float32(1),
            np.float32(1),
            backend=backend,
        )
