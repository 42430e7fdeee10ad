"""The fused deterministic-policy gradient, kernels.deterministic_policy_grads_flat (TD3's actor
step through its first critic), against its plain-JAX reference (autodiff) under jit and vmap for
odd sizes, the reference against a float64 NumPy computation by hand, NaN propagation and
bad-input errors. The agent side (TD3 through rl.fused.critic) is tests/rl/test_fused_critic.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import deterministic_policy_grads_flat
from kernels.q_grads import q_layout
from kernels.q_grads import unflatten as actor_arrays
from kernels.twin_q_grads import twin_q_layout
from kernels.twin_q_grads import unflatten as critic_arrays


def make_case(rng, m, d, a, hidden, lead=(), scale=0.5):
    actor_layout, critic_layout = q_layout(d, hidden, a), twin_q_layout(d, a, hidden)

    def arr(*shape, scale=scale):
        return jnp.asarray(rng.normal(size=lead + shape).astype(np.float32) * scale)

    args = (arr(m, d, scale=1.0), arr(actor_layout.size), arr(critic_layout.size))
    return actor_layout, critic_layout, args


def relative_error(got, want) -> float:
    return float(jnp.max(jnp.abs(got - want)) / (jnp.max(jnp.abs(want)) + 1e-12))


def numpy_gradient(actor_layout, critic_layout, args, activation):
    """dL/d(actor params) by hand in float64, and L: the actor forward, Q1's forward, back through
    Q1 to the action, through the tanh and the actor."""
    obs, actor, critic = (np.asarray(x, np.float64) for x in args)
    sigmoid = lambda z: 1.0 / (1.0 + np.exp(-z))
    f, df = {
        "tanh": (np.tanh, lambda z: 1.0 - np.tanh(z) ** 2),
        "relu": (lambda z: np.maximum(z, 0.0), lambda z: (z > 0).astype(float)),
        "silu": (lambda z: z * sigmoid(z), lambda z: sigmoid(z) * (1.0 + z * (1.0 - sigmoid(z)))),
    }[activation]
    w1, b1, w2, b2, w3, b3 = (np.asarray(t, np.float64) for t in actor_arrays(actor, actor_layout))
    v1, c1, v2, c2, v3, c3 = (
        np.asarray(t, np.float64) for t in critic_arrays(jnp.asarray(critic), critic_layout)[0]
    )
    z1 = obs @ w1 + b1
    z2 = f(z1) @ w2 + b2
    mu = np.tanh(f(z2) @ w3 + b3)
    x = np.concatenate([obs, mu], 1)
    y1 = x @ v1 + c1
    y2 = f(y1) @ v2 + c2
    q = (f(y2) @ v3 + c3)[:, 0]
    m, d = len(q), obs.shape[1]
    d_q = -np.ones((m, 1)) / m
    d_y2 = (d_q @ v3.T) * df(y2)
    d_y1 = (d_y2 @ v2.T) * df(y1)
    d_pre = (d_y1 @ v1[d:].T) * (1 - mu**2)
    d_z2 = (d_pre @ w3.T) * df(z2)
    d_z1 = (d_z2 @ w2.T) * df(z1)
    grads = [obs.T @ d_z1, d_z1.sum(0), f(z1).T @ d_z2, d_z2.sum(0), f(z2).T @ d_pre, d_pre.sum(0)]
    flat = np.zeros(actor_layout.size)
    for offset, g in zip(actor_layout.offsets, grads):
        flat[offset : offset + g.size] = g.ravel()
    return flat, -q.mean()


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
    got = deterministic_policy_grads_flat(
        *args, actor_layout, critic_layout, backend=kernel_backend, **options
    )
    want = deterministic_policy_grads_flat(
        *args, actor_layout, critic_layout, backend="reference", **options
    )
    assert relative_error(got[0], want[0]) < 1e-4
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4)
    np.testing.assert_allclose(got[2]["loss"], want[2]["loss"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation", ["relu", "silu"])
def test_gradient_at_the_agents_sizes(backend, activation):
    """Pendulum's actor and critics (3 observation features, 1 action) at rejax's 64 x 64 and a
    batch of 40 rows (three programs, the last one part-filled), weights of about an initial
    network's scale (1 / sqrt(64)), against float64 NumPy."""
    actor_layout, critic_layout, args = make_case(
        np.random.default_rng(3), 40, 3, 1, (64, 64), scale=0.125
    )
    grads, sq_norm, stats = deterministic_policy_grads_flat(
        *args, actor_layout, critic_layout, backend=backend, activation=activation
    )
    want, loss = numpy_gradient(actor_layout, critic_layout, args, activation)
    tolerance = 2e-2 if jax.default_backend() == "gpu" else 1e-5
    assert relative_error(grads, jnp.asarray(want)) < tolerance
    np.testing.assert_allclose(sq_norm, np.sum(want**2), rtol=5 * tolerance)
    np.testing.assert_allclose(stats["loss"], loss, rtol=5 * tolerance, atol=1e-6)


def test_nested_vmap_equals_each_unbatched_call(backend):
    actor_layout, critic_layout, args = make_case(
        np.random.default_rng(9), 20, 3, 2, (8, 6), lead=(2, 3)
    )
    op = lambda *xs: deterministic_policy_grads_flat(
        *xs, actor_layout, critic_layout, backend=backend, dot_precision="ieee"
    )
    batched = jax.jit(jax.vmap(jax.vmap(op)))(*args)
    for i in range(2):
        for j in range(3):
            single = op(*(x[i, j] for x in args))
            np.testing.assert_allclose(batched[0][i, j], single[0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(batched[2]["loss"][i, j], single[2]["loss"], rtol=1e-5)


def test_nan_in_the_critic_propagates(backend):
    actor_layout, critic_layout, args = make_case(np.random.default_rng(2), 17, 3, 1, (5, 5))
    critic = args[2].at[critic_layout.offsets[2]].set(jnp.nan)  # a second-layer weight of Q1
    got = deterministic_policy_grads_flat(
        args[0], args[1], critic, actor_layout, critic_layout, backend=backend
    )
    assert bool(jnp.isnan(got[0]).any()) and bool(jnp.isnan(got[2]["loss"]))


def test_bad_input_names_the_argument():
    actor_layout, critic_layout, args = make_case(np.random.default_rng(0), 8, 3, 1, (4, 4))
    with pytest.raises(ValueError, match=r"obs must be \[rows >= 1, 3\]"):
        deterministic_policy_grads_flat(args[0][:, :2], *args[1:], actor_layout, critic_layout)
    with pytest.raises(ValueError, match=r"critic_params must be \[\d+\]"):
        deterministic_policy_grads_flat(*args[:2], args[2][:-1], actor_layout, critic_layout)
    with pytest.raises(ValueError, match="the same observation size, hidden widths"):
        other = twin_q_layout(3, 1, (4, 5))
        deterministic_policy_grads_flat(
            *args[:2], jnp.zeros(other.size), actor_layout, other, backend="reference"
        )
