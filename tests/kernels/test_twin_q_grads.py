"""The fused twin-critic gradient, kernels.twin_q_grads_flat, against its plain-JAX reference
(autodiff of the clipped double-Q loss) under jit and vmap for odd sizes, the reference against a
float64 NumPy computation by hand, NaN propagation and bad-input errors. The agent side (TD3 and
SAC through rl.fused.critic) is tests/rl/test_fused_critic.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import twin_q_grads_flat
from kernels.twin_q_grads import TwinQLayout, twin_q_layout, unflatten


def make_case(rng, m, d, a, hidden, lead=()):
    layout = twin_q_layout(d, a, hidden)

    def arr(*shape, scale=0.5):
        return jnp.asarray(rng.normal(size=lead + shape).astype(np.float32) * scale)

    discounts = jnp.asarray((rng.random(lead + (m,)) < 0.7) * 0.9, jnp.float32)
    args = (
        arr(m, d, scale=1.0), arr(m, a), arr(m, scale=1.0), discounts, arr(m, d, scale=1.0),
        arr(m, a), arr(m, scale=0.1), arr(layout.size), arr(layout.size),
    )  # fmt: skip
    return layout, args


def relative_error(got, want) -> float:
    """max |got - want| / max |want| (the scale-free error the kernels are held to)."""
    return float(jnp.max(jnp.abs(got - want)) / (jnp.max(jnp.abs(want)) + 1e-12))


def tolerance() -> float:
    """tf32 products on the GPU (the kernel's and XLA's in the reference), full float32
    elsewhere."""
    return 2e-2 if jax.default_backend() == "gpu" else 1e-5


def numpy_activation(activation):
    """(f, f') in float64 NumPy, f' as a function of the pre-activation z."""
    sigmoid = lambda z: 1.0 / (1.0 + np.exp(-z))
    return {
        "tanh": (np.tanh, lambda z: 1.0 - np.tanh(z) ** 2),
        "relu": (lambda z: np.maximum(z, 0.0), lambda z: (z > 0).astype(float)),
        "silu": (lambda z: z * sigmoid(z), lambda z: sigmoid(z) * (1.0 + z * (1.0 - sigmoid(z)))),
    }[activation]


def numpy_gradient(layout: TwinQLayout, args, activation):
    """dL/dtheta by hand in float64: both target critics, y, both online critics, backpropagation;
    and the loss."""
    obs, act, rewards, discounts, next_obs, next_act, bonus, params, target = (
        np.asarray(x, np.float64) for x in args
    )
    f, df = numpy_activation(activation)

    def forward(arrays, x):
        w1, b1, w2, b2, w3, b3 = (np.asarray(t, np.float64) for t in arrays)
        z1 = x @ w1 + b1
        z2 = f(z1) @ w2 + b2
        return z1, z2, (f(z2) @ w3 + b3)[:, 0], (w1, w2, w3)

    x_next, x = np.concatenate([next_obs, next_act], 1), np.concatenate([obs, act], 1)
    q_next = [forward(c, x_next)[2] for c in unflatten(jnp.asarray(target), layout)]
    y = rewards + discounts * (np.minimum(*q_next) + bonus)
    flat, loss, m = np.zeros(layout.size), 0.0, len(y)
    for c, offsets in zip(
        unflatten(jnp.asarray(params), layout), (layout.offsets[:6], layout.offsets[6:])
    ):
        z1, z2, q, (w1, w2, w3) = forward(c, x)
        loss += 0.5 * np.mean((q - y) ** 2)
        d_out = ((q - y) / m)[:, None]
        d_z2 = (d_out @ w3.T) * df(z2)
        d_z1 = (d_z2 @ w2.T) * df(z1)
        h1, h2 = f(z1), f(z2)
        grads = [x.T @ d_z1, d_z1.sum(0), h1.T @ d_z2, d_z2.sum(0), h2.T @ d_out, d_out.sum(0)]
        for offset, g in zip(offsets, grads):
            flat[offset : offset + g.size] = g.ravel()
    return flat, loss


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
    """Rows not a multiple of the 16-row block, widths 1, 3, 17, one action dimension or three."""
    layout, args = make_case(np.random.default_rng(seed), m, d, a, (h1, h2))
    options = dict(activation=activation, dot_precision="ieee")
    got = twin_q_grads_flat(*args, layout, backend=kernel_backend, **options)
    want = twin_q_grads_flat(*args, layout, backend="reference", **options)
    assert relative_error(got[0], want[0]) < 1e-4
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4)
    np.testing.assert_allclose(got[2]["loss"], want[2]["loss"], rtol=1e-5)
    np.testing.assert_allclose(got[2]["q_mean"], want[2]["q_mean"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "hidden, activation, m",
    [
        ((64, 64), "relu", 40),
        ((64, 64), "silu", 40),
        pytest.param((64, 64), "relu", 256, marks=pytest.mark.slow),
        pytest.param((128, 128), "tanh", 100, marks=pytest.mark.slow),
    ],
)
def test_gradient_at_the_agents_sizes(backend, hidden, activation, m):
    """Pendulum's critics (3 + 1 inputs) at rejax's 64 x 64 (relu, and rejax's swish = silu; 40
    rows: three programs, the last one part-filled; rejax's batch of 256: 16 programs) and at
    128 x 128, against the float64 NumPy computation (the larger cases under `-m slow`: minutes on
    the CPU's interpreter)."""
    layout, args = make_case(np.random.default_rng(3), m, 3, 1, hidden)
    grads, sq_norm, stats = twin_q_grads_flat(*args, layout, backend=backend, activation=activation)
    want, loss = numpy_gradient(layout, args, activation)
    assert relative_error(grads, jnp.asarray(want)) < tolerance()
    np.testing.assert_allclose(sq_norm, np.sum(want**2), rtol=5 * tolerance())
    np.testing.assert_allclose(stats["loss"], loss, rtol=5 * tolerance())


def test_reference_matches_numpy():
    layout, args = make_case(np.random.default_rng(5), 33, 3, 2, (7, 5))
    got = twin_q_grads_flat(*args, layout, backend="reference", dot_precision="ieee")
    want, loss = numpy_gradient(layout, args, "relu")
    assert relative_error(got[0], jnp.asarray(want)) < 1e-5
    np.testing.assert_allclose(got[2]["loss"], loss, rtol=1e-5)


def test_nested_vmap_equals_each_unbatched_call(backend):
    """Seeds x settings vmapped (one launch): each minibatch's gradient equals its own call."""
    layout, args = make_case(np.random.default_rng(9), 20, 3, 1, (8, 6), lead=(2, 3))
    op = lambda *xs: twin_q_grads_flat(*xs, layout, backend=backend, dot_precision="ieee")
    batched = jax.jit(jax.vmap(jax.vmap(op)))(*args)
    for i in range(2):
        for j in range(3):
            single = op(*(x[i, j] for x in args))
            np.testing.assert_allclose(batched[0][i, j], single[0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(batched[2]["loss"][i, j], single[2]["loss"], rtol=1e-5)


def test_nan_in_the_weights_propagates(backend):
    layout, args = make_case(np.random.default_rng(2), 17, 3, 1, (5, 5))
    params = args[7].at[layout.offsets[8]].set(jnp.nan)  # a second-layer weight of critic 2
    got = twin_q_grads_flat(*args[:7], params, args[8], layout, backend=backend)
    assert bool(jnp.isnan(got[0]).any()) and bool(jnp.isnan(got[2]["loss"]))


def test_bad_input_names_the_argument():
    layout, args = make_case(np.random.default_rng(0), 8, 3, 1, (4, 4))
    with pytest.raises(ValueError, match=r"next_actions must be \[8, 1\]"):
        twin_q_grads_flat(*args[:5], args[5][:, :0], *args[6:], layout, backend="reference")
    with pytest.raises(ValueError, match=r"params must be \[\d+\] \(layout.size\)"):
        twin_q_grads_flat(*args[:7], args[7][:-1], args[8], layout, backend="reference")
    with pytest.raises(ValueError, match="activation must be one of"):
        twin_q_grads_flat(*args, layout, activation="gelu", backend="reference")
    with pytest.raises(ValueError, match="exactly once"):
        twin_q_grads_flat(*args, layout._replace(offsets=(0,) * 12), backend="reference")


def test_critics_beyond_the_limits_are_refused_by_the_kernel(kernel_backend):
    layout, args = make_case(np.random.default_rng(0), 8, 3, 1, (256, 8))
    with pytest.raises(ValueError, match="beyond the fused twin-critic kernel's limits"):
        twin_q_grads_flat(*args, layout, backend=kernel_backend)


def test_each_fused_network_op_holds_at_most_its_own_rows_a_program(monkeypatch):
    """The twin-critic, TD3 actor and SAC actor ops spread a minibatch with their own cap
    (their MAX_BLOCK_M), not the Q-learning op's."""
    from kernels import (
        deterministic_policy_grads,
        deterministic_policy_grads_flat,
        q_grads,
        sac_actor_grads,
        sac_actor_grads_flat,
        twin_q_grads,
        twin_q_grads_flat,
    )
    from kernels.q_grads import q_layout
    from kernels.sac_actor_grads import sac_actor_layout

    caps, rule = [], q_grads._block_rows
    monkeypatch.setattr(
        q_grads, "_block_rows", lambda b, m, cap=None: caps.append(cap) or rule(b, m, cap)
    )
    critic, rows = twin_q_layout(3, 1, (8, 8)), 20
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    obs, act = jax.random.normal(k[0], (rows, 3)), jnp.tanh(jax.random.normal(k[1], (rows, 1)))
    ones, zeros = jnp.ones(rows), jnp.zeros(rows)
    critic_params = 0.1 * jax.random.normal(k[2], (critic.size,))
    twin_q_grads_flat(
        obs,
        act,
        ones,
        ones,
        obs,
        act,
        zeros,
        critic_params,
        critic_params,
        critic,
        backend="interpret",
    )
    actor = q_layout(3, (8, 8), 1)
    deterministic_policy_grads_flat(
        obs, 0.1 * jnp.ones(actor.size), critic_params, actor, critic, backend="interpret"
    )
    sac = sac_actor_layout(3, (8, 8), 1)
    sac_actor_grads_flat(
        obs, act, 0.2, 0.1 * jnp.ones(sac.size), critic_params, sac, critic, backend="interpret"
    )
    assert caps == [
        twin_q_grads.MAX_BLOCK_M,
        deterministic_policy_grads.MAX_BLOCK_M,
        sac_actor_grads.MAX_BLOCK_M,
    ]
