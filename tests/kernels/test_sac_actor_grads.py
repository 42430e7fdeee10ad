"""The fused SAC actor gradient, kernels.sac_actor_grads_flat (the squashed-Gaussian actor through
the smaller of the twin critics), against its plain-JAX reference (autodiff) under jit and vmap for
odd sizes, its loss and entropy against a float64 NumPy forward pass, NaN propagation and
bad-input errors. The agent side (SAC through rl.fused.critic) is tests/rl/test_fused_critic.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import sac_actor_grads_flat
from kernels.sac_actor_grads import sac_actor_layout, unflatten
from kernels.twin_q_grads import twin_q_layout
from kernels.twin_q_grads import unflatten as critic_arrays


def make_case(rng, m, d, a, hidden, lead=(), scale=0.3):
    actor_layout, critic_layout = sac_actor_layout(d, hidden, a), twin_q_layout(d, a, hidden)

    def arr(*shape, scale=scale):
        return jnp.asarray(rng.normal(size=lead + shape).astype(np.float32) * scale)

    args = (
        arr(m, d, scale=1.0), arr(m, a, scale=1.0), jnp.full(lead, 0.2, jnp.float32),
        arr(actor_layout.size), arr(critic_layout.size),
    )  # fmt: skip
    return actor_layout, critic_layout, args


def relative_error(got, want) -> float:
    return float(jnp.max(jnp.abs(got - want)) / (jnp.max(jnp.abs(want)) + 1e-12))


def numpy_loss_and_entropy(actor_layout, critic_layout, args, activation, bounds=(-5.0, 2.0)):
    """L and H of the module docstring by a float64 NumPy forward pass."""
    obs, eps, alpha, actor, critic = (np.asarray(x, np.float64) for x in args)
    sigmoid = lambda z: 1.0 / (1.0 + np.exp(-z))
    f = {"tanh": np.tanh, "relu": lambda z: np.maximum(z, 0.0), "silu": lambda z: z * sigmoid(z)}[
        activation
    ]
    w1, b1, w2, b2, wm, bm, wr, br = (
        np.asarray(t, np.float64) for t in unflatten(jnp.asarray(actor), actor_layout)
    )
    h = f(f(obs @ w1 + b1) @ w2 + b2)
    lo, hi = bounds
    log_std = lo + 0.5 * (hi - lo) * (np.tanh(h @ wr + br) + 1.0)
    u = h @ wm + bm + np.exp(log_std) * eps
    log_prob = np.sum(
        -0.5 * eps**2 - log_std - 0.5 * math.log(2 * math.pi) - np.log(1 - np.tanh(u) ** 2), -1
    )
    x = np.concatenate([obs, np.tanh(u)], 1)
    qs = []
    for v1, c1, v2, c2, v3, c3 in critic_arrays(jnp.asarray(critic), critic_layout):
        v1, c1, v2, c2, v3, c3 = (np.asarray(t, np.float64) for t in (v1, c1, v2, c2, v3, c3))
        qs.append((f(f(x @ v1 + c1) @ v2 + c2) @ v3 + c3)[:, 0])
    return np.mean(alpha * log_prob - np.minimum(*qs)), -np.mean(log_prob)


@settings(max_examples=3, deadline=None)
@given(
    m=st.integers(1, 40),
    d=st.integers(1, 5),
    a=st.integers(1, 3),
    h1=st.sampled_from([1, 3, 17]),
    h2=st.sampled_from([2, 5]),
    activation=st.sampled_from(["relu", "tanh", "silu"]),
    seed=st.integers(0, 2**16),
)
def test_gradient_matches_autodiff_at_odd_sizes(kernel_backend, m, d, a, h1, h2, activation, seed):
    actor_layout, critic_layout, args = make_case(np.random.default_rng(seed), m, d, a, (h1, h2))
    options = dict(activation=activation, dot_precision="ieee")
    got = sac_actor_grads_flat(
        *args, actor_layout, critic_layout, backend=kernel_backend, **options
    )
    want = sac_actor_grads_flat(*args, actor_layout, critic_layout, backend="reference", **options)
    assert relative_error(got[0], want[0]) < 1e-4
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4)
    for name in ("loss", "entropy"):
        np.testing.assert_allclose(got[2][name], want[2][name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation", ["relu", "silu"])
def test_at_the_agents_sizes(backend, activation):
    """Pendulum's actor and critics at rejax's 64 x 64, 40 rows (three programs): the gradient
    against autodiff, the loss and entropy against a float64 NumPy forward pass."""
    actor_layout, critic_layout, args = make_case(
        np.random.default_rng(3), 40, 3, 1, (64, 64), scale=0.125
    )
    grads, sq_norm, stats = sac_actor_grads_flat(
        *args, actor_layout, critic_layout, backend=backend, activation=activation
    )
    want = sac_actor_grads_flat(
        *args, actor_layout, critic_layout, backend="reference", activation=activation,
        dot_precision="ieee",
    )  # fmt: skip
    tolerance = 2e-2 if jax.default_backend() == "gpu" else 1e-4
    assert relative_error(grads, want[0]) < tolerance
    loss, entropy = numpy_loss_and_entropy(actor_layout, critic_layout, args, activation)
    np.testing.assert_allclose(stats["loss"], loss, rtol=tolerance, atol=1e-5)
    np.testing.assert_allclose(stats["entropy"], entropy, rtol=tolerance, atol=1e-5)


def test_nested_vmap_equals_each_unbatched_call(backend):
    actor_layout, critic_layout, args = make_case(
        np.random.default_rng(9), 20, 3, 2, (8, 6), lead=(2, 3)
    )
    op = lambda *xs: sac_actor_grads_flat(
        *xs, actor_layout, critic_layout, backend=backend, dot_precision="ieee"
    )
    batched = jax.jit(jax.vmap(jax.vmap(op)))(*args)
    for i in range(2):
        for j in range(3):
            single = op(*(x[i, j] for x in args))
            np.testing.assert_allclose(batched[0][i, j], single[0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(batched[2]["loss"][i, j], single[2]["loss"], rtol=1e-5)


def test_nan_in_the_actor_propagates(backend):
    actor_layout, critic_layout, args = make_case(np.random.default_rng(2), 17, 3, 1, (5, 5))
    actor = args[3].at[actor_layout.offsets[2]].set(jnp.nan)  # a second-layer weight
    got = sac_actor_grads_flat(
        *args[:3], actor, args[4], actor_layout, critic_layout, backend=backend
    )
    assert bool(jnp.isnan(got[0]).any()) and bool(jnp.isnan(got[2]["loss"]))


def test_bad_input_names_the_argument():
    actor_layout, critic_layout, args = make_case(np.random.default_rng(0), 8, 3, 1, (4, 4))
    with pytest.raises(ValueError, match=r"eps must be \[8, 1\]"):
        sac_actor_grads_flat(args[0], args[1][:, :0], *args[2:], actor_layout, critic_layout)
    with pytest.raises(ValueError, match="alpha must be a scalar"):
        sac_actor_grads_flat(*args[:2], jnp.ones(2), *args[3:], actor_layout, critic_layout)
    with pytest.raises(ValueError, match="log_std_bounds must be"):
        sac_actor_grads_flat(*args, actor_layout, critic_layout, log_std_bounds=(2.0, -5.0))
