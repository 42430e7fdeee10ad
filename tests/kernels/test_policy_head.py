"""categorical_log_prob_entropy on every backend vs float64 NumPy, under jit/vmap/scan/grad."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import categorical_log_prob_entropy
from kernels.policy_head import categorical_log_prob_entropy_reference

# one kernel launch in a jaxpr: an equation of either primitive
LAUNCH = re.compile(r"= (?:pure_callback|triton_kernel_call)\[")


def numpy_policy_head(logits, actions):
    """float64: (log p[a], -sum p log p) with log p = x - logsumexp(x)."""
    x = np.asarray(logits, np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    p = np.exp(log_p)
    log_prob = np.take_along_axis(log_p, np.asarray(actions)[..., None], axis=-1)[..., 0]
    entropy = -np.where(p > 0, p * np.where(p > 0, log_p, 0.0), 0.0).sum(axis=-1)
    return log_prob, entropy


def numpy_policy_head_vjp(logits, actions, g_lp, g_ent):
    """d x = g_lp (onehot(a) - p) - g_ent p (log p + H), float64."""
    x = np.asarray(logits, np.float64)
    log_p = x - x.max(-1, keepdims=True)
    log_p = log_p - np.log(np.exp(log_p).sum(-1, keepdims=True))
    p = np.exp(log_p)
    entropy = -(p * log_p).sum(-1, keepdims=True)
    onehot = np.eye(x.shape[-1])[np.asarray(actions)]
    return np.asarray(g_lp, np.float64)[..., None] * (onehot - p) - np.asarray(g_ent, np.float64)[
        ..., None
    ] * p * (log_p + entropy)


def assert_close(actual, expected, rtol=1e-5, atol=2e-6):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


def random_inputs(rng, batch, n_actions, scale=2.0):
    logits = (scale * rng.normal(size=(*batch, n_actions))).astype(np.float32)
    actions = rng.integers(0, n_actions, size=batch).astype(np.int32)
    return logits, actions


# The property test calls the op through one jitted program per example (an example's shapes are
# new, so an eager call would compile each of the op's operations on its own); the other tests
# call it eagerly.
categorical_log_prob_entropy_jit = jax.jit(
    categorical_log_prob_entropy, static_argnames=("backend",)
)


@settings(max_examples=20, deadline=None)
@given(
    batch=st.sampled_from([(), (1,), (3,), (7,), (2, 3), (4, 1, 2)]),
    n_actions=st.sampled_from([1, 2, 3, 5, 9, 18, 33, 51]),
    scale=st.sampled_from([0.1, 2.0, 40.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_float64_numpy(backend, batch, n_actions, scale, seed):
    logits, actions = random_inputs(np.random.default_rng(seed), batch, n_actions, scale)
    log_prob, entropy = categorical_log_prob_entropy_jit(logits, actions, backend=backend)
    assert log_prob.shape == batch and entropy.shape == batch
    assert log_prob.dtype == jnp.float32 and entropy.dtype == jnp.float32
    expected_lp, expected_ent = numpy_policy_head(logits, actions)
    assert_close(log_prob, expected_lp, atol=1e-5)
    assert_close(entropy, expected_ent, atol=1e-5)


def test_hand_cases(backend):
    logits = np.array([[0.0, 0.0], [0.0, np.log(3.0)], [5.0, 5.0]], np.float32)
    actions = np.array([0, 1, 1], np.int32)
    log_prob, entropy = categorical_log_prob_entropy(logits, actions, backend=backend)
    assert_close(log_prob, [np.log(0.5), np.log(0.75), np.log(0.5)])
    h = -(0.25 * np.log(0.25) + 0.75 * np.log(0.75))
    assert_close(entropy, [np.log(2.0), h, np.log(2.0)])


def test_masked_actions_with_minus_infinity(backend):
    """Logits of -inf (masked actions) have p = 0 and add nothing to the entropy."""
    logits = np.array([[1.0, -np.inf, 2.0, -np.inf]], np.float32)
    actions = np.array([2], np.int32)
    log_prob, entropy = categorical_log_prob_entropy(logits, actions, backend=backend)
    expected_lp, expected_ent = numpy_policy_head(logits[:, [0, 2]], np.array([1]))
    assert_close(log_prob, expected_lp)
    assert_close(entropy, expected_ent)


def test_out_of_range_actions(backend):
    logits, _ = random_inputs(np.random.default_rng(0), (4,), 3)
    with pytest.raises(ValueError, match=r"actions must lie in \[0, 3\).*got values in \[0, 3\]"):
        categorical_log_prob_entropy(logits, np.array([0, 1, 2, 3]), backend=backend)
    with pytest.raises(ValueError, match=r"got values in \[-1, 2\]"):
        categorical_log_prob_entropy(logits, np.array([0, -1, 2, 2]), backend=backend)
    # traced actions cannot be checked: an out-of-range one gives a NaN log_prob
    f = jax.jit(lambda a: categorical_log_prob_entropy(logits, a, backend=backend))
    log_prob, entropy = f(jnp.array([0, 5, 1, -2]))
    log_prob = np.asarray(log_prob)
    assert np.isnan(log_prob[[1, 3]]).all() and np.isfinite(log_prob[[0, 2]]).all()
    assert np.isfinite(np.asarray(entropy)).all()


def test_jit_and_nested_vmap(backend):
    logits, actions = random_inputs(np.random.default_rng(1), (3, 4, 5), 6)
    f = jax.jit(
        jax.vmap(jax.vmap(lambda x, a: categorical_log_prob_entropy(x, a, backend=backend)))
    )
    for out, expected in zip(f(logits, actions), numpy_policy_head(logits, actions)):
        assert_close(out, expected)
    # only the actions are vmapped: every action of one row of logits
    g = jax.vmap(lambda a: categorical_log_prob_entropy(logits[0, 0, 0], a, backend=backend))
    log_prob, entropy = g(jnp.arange(6))
    expected_lp, expected_ent = numpy_policy_head(logits[0, 0, 0][None].repeat(6, 0), np.arange(6))
    assert_close(log_prob, expected_lp)
    assert_close(entropy, expected_ent)


def test_one_launch_under_nested_vmap(kernel_backend):
    x, a = jnp.zeros((3, 4, 5, 6)), jnp.zeros((3, 4, 5), jnp.int32)
    f = jax.vmap(jax.vmap(lambda x, a: categorical_log_prob_entropy(x, a, backend=kernel_backend)))
    text = str(jax.make_jaxpr(f)(x, a))
    assert len(LAUNCH.findall(text)) == 1


def test_inside_lax_scan(backend):
    logits, actions = random_inputs(np.random.default_rng(2), (6, 5), 4)

    def step(total, xa):
        log_prob, entropy = categorical_log_prob_entropy(*xa, backend=backend)
        return total + log_prob.sum() + entropy.sum(), log_prob

    total, log_probs = jax.jit(lambda x, a: jax.lax.scan(step, 0.0, (x, a)))(logits, actions)
    expected_lp, expected_ent = numpy_policy_head(logits, actions)
    assert_close(log_probs, expected_lp)
    assert_close(total, expected_lp.sum() + expected_ent.sum(), atol=1e-4)


@pytest.mark.parametrize("batch,n_actions", [((7,), 2), ((3, 5), 18), ((4,), 51), ((2, 2, 3), 1)])
@pytest.mark.parametrize("weights", ["both", "log_prob_only", "entropy_only"])
def test_gradients_match_the_hand_derived_float64_vjp(backend, batch, n_actions, weights):
    """The gradient of a weighted sum of log-probabilities and entropies against the float64 NumPy
    VJP `numpy_policy_head_vjp` (an oracle independent of the op and of JAX), and, for a kernel
    backend, against autodiff of the reference."""
    rng = np.random.default_rng(3)
    logits, actions = random_inputs(rng, batch, n_actions)
    w_lp = rng.normal(size=batch).astype(np.float32) * (weights != "entropy_only")
    w_ent = rng.normal(size=batch).astype(np.float32) * (weights != "log_prob_only")

    def loss(op):
        def f(x):
            log_prob, entropy = op(x, actions)
            return jnp.sum(w_lp * log_prob + w_ent * entropy)

        return f

    op = lambda x, a: categorical_log_prob_entropy(x, a, backend=backend)
    grad = jax.jit(jax.grad(loss(op)))(logits)
    assert_close(grad, numpy_policy_head_vjp(logits, actions, w_lp, w_ent), atol=1e-5)
    if backend != "reference":
        expected = jax.grad(loss(categorical_log_prob_entropy_reference))(logits)
        assert_close(grad, np.asarray(expected, np.float64), atol=1e-5)


def test_gradients_under_vmap_and_of_a_ppo_like_loss(backend):
    rng = np.random.default_rng(4)
    logits, actions = random_inputs(rng, (3, 8), 5)
    advantages = rng.normal(size=(3, 8)).astype(np.float32)

    def loss(op, x):
        log_prob, entropy = op(x, actions)
        ratio = jnp.exp(log_prob - jax.lax.stop_gradient(log_prob))
        return -jnp.mean(ratio * advantages) - 0.01 * jnp.mean(entropy)

    op = lambda x, a: categorical_log_prob_entropy(x, a, backend=backend)
    grad = jax.jit(jax.grad(lambda x: loss(op, x)))(logits)
    expected = jax.grad(lambda x: loss(categorical_log_prob_entropy_reference, x))(logits)
    assert_close(grad, np.asarray(expected, np.float64), atol=1e-6)
    per_seed = jax.vmap(jax.grad(lambda x, a: jnp.sum(op(x, a)[0] + op(x, a)[1])))(logits, actions)
    assert_close(
        per_seed,
        numpy_policy_head_vjp(logits, actions, np.ones((3, 8)), np.ones((3, 8))),
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "logits,actions,message",
    [
        (
            np.zeros((4, 3), np.int32),
            np.zeros(4, np.int32),
            r"logits must be a floating-point array, got dtype int32 with shape \(4, 3\)",
        ),
        (np.float32(0.0), np.int32(0), r"logits must have rank >= 1, got shape \(\)"),
        (
            np.zeros((4, 0), np.float32),
            np.zeros(4, np.int32),
            r"at least one action, got shape \(4, 0\)",
        ),
        (
            np.zeros((4, 3), np.float32),
            np.zeros(4, np.float32),
            r"actions must be an integer array, got dtype float32 with shape \(4,\)",
        ),
        (
            np.zeros((4, 3), np.float32),
            np.zeros(5, np.int32),
            r"actions must have the shape of logits without its last axis \(4,\) \(logits \(4, "
            r"3\)\), got \(5,\)",
        ),
        (np.zeros((4, 3), np.float32), np.zeros((4, 3), np.int32), r"got \(4, 3\)"),
    ],
)
def test_bad_inputs_raise_at_trace_time(backend, logits, actions, message):
    with pytest.raises(ValueError, match=message):
        jax.jit(lambda x, a: categorical_log_prob_entropy(x, a, backend=backend))(logits, actions)
