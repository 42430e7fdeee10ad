"""The fused Q-network kernels, kernels.q_learning_grads_flat and kernels.q_epsilon_greedy, against
their plain-JAX references (autodiff of the TD loss; the forward pass and select), under jit and
vmap, for odd sizes; the reference against a float64 NumPy computation by hand; NaN propagation;
bad input errors. The agent side (DQN through rl.fused.q) is tests/rl/test_dqn_fused.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kernels import q_epsilon_greedy, q_learning_grads_flat
from kernels.q_grads import QLayout, q_layout, unflatten


def make_case(rng, m, d, hidden, a, lead=()):
    layout = q_layout(d, hidden, a)

    def arr(*shape, scale=0.5):
        return jnp.asarray(rng.normal(size=lead + shape).astype(np.float32) * scale)

    discounts = jnp.asarray((rng.random(lead + (m,)) < 0.7) * 0.9, jnp.float32)
    actions = jnp.asarray(rng.integers(0, a, lead + (m,)), jnp.int32)
    args = (
        arr(m, d, scale=1.0), actions, arr(m, scale=1.0), discounts, arr(m, d, scale=1.0),
        arr(layout.size), arr(layout.size),
    )  # fmt: skip
    return layout, args


def relative_error(got, want) -> float:
    """max |got - want| / max |want| (the scale-free error the kernels are held to)."""
    return float(jnp.max(jnp.abs(got - want)) / (jnp.max(jnp.abs(want)) + 1e-12))


def tolerance() -> float:
    """tf32 products on the GPU (the kernel's and XLA's in the reference), full float32
    elsewhere."""
    return 2e-2 if jax.default_backend() == "gpu" else 1e-5


def grads_of(backend, layout, args, **options):
    return q_learning_grads_flat(*args, layout, backend=backend, **options)


# ---------------------------------------------------------------- the gradient


@settings(max_examples=4, deadline=None)
@given(
    m=st.integers(1, 40),
    d=st.integers(1, 5),
    h1=st.sampled_from([1, 3, 17]),
    h2=st.sampled_from([2, 5]),
    a=st.integers(1, 5),
    double_q=st.booleans(),
    loss=st.sampled_from(["huber", "mse"]),
    seed=st.integers(0, 2**16),
)
@example(m=1, d=3, h1=17, h2=2, a=2, double_q=False, loss="huber", seed=0)  # a small TD, one row
def test_gradient_matches_autodiff_at_odd_sizes(
    kernel_backend, m, d, h1, h2, a, double_q, loss, seed
):
    """Rows not a multiple of the 16-row program, widths 1 and 3 and 17, one action: the kernel's
    gradient, squared norm, loss and mean Q equal jax.grad of the same loss (relative error, to
    1e-5 of the largest gradient element; each element to 1e-4 of itself, since both sides round
    the TD error Q - y in float32 and a small one, of few rows, carries Q's and y's rounding: seen
    on an H200 at one row, 1.1e-5 of a gradient whose only nonzero element was 0.0053)."""
    layout, args = make_case(np.random.default_rng(seed), m, d, (h1, h2), a)
    options = dict(loss=loss, double_q=double_q, activation="relu", dot_precision="ieee")
    got = grads_of(kernel_backend, layout, args, **options)
    want = grads_of("reference", layout, args, **options)
    scale = float(jnp.max(jnp.abs(want[0])))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4)
    for name in ("loss", "q_mean"):
        np.testing.assert_allclose(got[2][name], want[2][name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "hidden, activation", [((120, 84), "relu"), ((64, 64), "tanh"), ((64, 64), "silu")]
)
def test_gradient_at_the_agents_sizes(backend, hidden, activation):
    """PureJaxRL's CartPole DQN (120 x 84, 128 rows) and 64 x 64 tanh and silu networks (144 rows:
    nine programs), against the float64 NumPy computation of the module docstring's gradient."""
    rng = np.random.default_rng(3)
    m = 128 if hidden == (120, 84) else 144
    layout, args = make_case(rng, m, 4, hidden, 2)
    got = grads_of(backend, layout, args, activation=activation, double_q=False, loss="mse")
    want = numpy_gradient(layout, args, activation, double_q=False, loss="mse")
    assert relative_error(got[0], jnp.asarray(want)) < tolerance()


def numpy_activation(activation):
    """(f, f') in float64 NumPy, f' as a function of the pre-activation z."""
    sigmoid = lambda z: 1.0 / (1.0 + np.exp(-z))
    return {
        "tanh": (np.tanh, lambda z: 1.0 - np.tanh(z) ** 2),
        "relu": (lambda z: np.maximum(z, 0.0), lambda z: (z > 0).astype(float)),
        "silu": (lambda z: z * sigmoid(z), lambda z: sigmoid(z) * (1.0 + z * (1.0 - sigmoid(z)))),
    }[activation]


def numpy_gradient(layout: QLayout, args, activation, double_q, loss):
    """dL/dtheta by hand in float64: forward, TD error, backpropagation."""
    obs, actions, rewards, discounts, next_obs, params, target = (
        np.asarray(x, np.float64) for x in args
    )
    actions = actions.astype(int)
    f, df = numpy_activation(activation)

    def forward(p, x):
        w1, b1, w2, b2, w3, b3 = (np.asarray(t) for t in unflatten(p, layout))
        z1 = x @ w1 + b1
        z2 = f(z1) @ w2 + b2
        return z1, z2, f(z2) @ w3 + b3, (w1, w2, w3)

    q_next_target = forward(target, next_obs)[2]
    selector = forward(params, next_obs)[2] if double_q else q_next_target
    best = np.argmax(selector, axis=1)
    y = rewards + discounts * q_next_target[np.arange(len(best)), best]
    z1, z2, q, (w1, w2, w3) = forward(params, obs)
    h1, h2 = f(z1), f(z2)
    rows = np.arange(len(actions))
    td = q[rows, actions] - y
    d_td = 2 * td if loss == "mse" else np.clip(td, -1, 1)
    d_out = np.zeros_like(q)
    d_out[rows, actions] = d_td / len(actions)
    d_z2 = (d_out @ w3.T) * df(z2)
    d_z1 = (d_z2 @ w2.T) * df(z1)
    grads = [obs.T @ d_z1, d_z1.sum(0), h1.T @ d_z2, d_z2.sum(0), h2.T @ d_out, d_out.sum(0)]
    flat = np.zeros(layout.size)
    for offset, g in zip(layout.offsets, grads):
        flat[offset : offset + g.size] = g.ravel()
    return flat


def test_reference_matches_numpy_with_double_q_and_huber():
    rng = np.random.default_rng(5)
    layout, args = make_case(rng, 33, 3, (7, 5), 4)
    got = grads_of("reference", layout, args, double_q=True, loss="huber", dot_precision="ieee")
    want = numpy_gradient(layout, args, "relu", double_q=True, loss="huber")
    assert relative_error(got[0], jnp.asarray(want)) < 1e-5


def test_nested_vmap_is_one_launch_per_seed_batch(backend):
    """Seeds x settings vmapped: each minibatch's gradient equals its own unbatched call."""
    rng = np.random.default_rng(9)
    layout, args = make_case(rng, 20, 3, (8, 6), 3, lead=(2, 3))
    options = dict(double_q=True, loss="huber", dot_precision="ieee")
    op = lambda *xs: q_learning_grads_flat(*xs, layout, backend=backend, **options)
    batched = jax.jit(jax.vmap(jax.vmap(op)))(*args)
    for i in range(2):
        for j in range(3):
            single = op(*(x[i, j] for x in args))
            np.testing.assert_allclose(batched[0][i, j], single[0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(batched[2]["loss"][i, j], single[2]["loss"], rtol=1e-5)


def test_nan_in_the_weights_propagates(backend):
    layout, args = make_case(np.random.default_rng(2), 17, 3, (5, 5), 2)
    params = args[5].at[layout.offsets[2]].set(jnp.nan)  # a weight of the second layer
    got = grads_of(backend, layout, (*args[:5], params, args[6]))
    assert bool(jnp.isnan(got[0]).any()) and bool(jnp.isnan(got[2]["loss"]))


# ---------------------------------------------------------------- acting


@pytest.mark.parametrize("n, hidden, a", [(10, (120, 84), 2), (37, (5, 3), 5), (1, (1, 1), 1)])
def test_epsilon_greedy_matches_the_reference(backend, n, hidden, a):
    """The same uniforms give the same actions: greedy at epsilon 0, random at 1, mixed between."""
    rng = np.random.default_rng(n)
    layout = q_layout(4, hidden, a)
    params = jnp.asarray(rng.normal(size=layout.size).astype(np.float32))
    obs = jnp.asarray(rng.normal(size=(n, 4)).astype(np.float32))
    uniforms = jax.random.uniform(jax.random.key(n), (n, 2))
    for epsilon in (0.0, 0.4, 1.0):
        got = q_epsilon_greedy(obs, params, uniforms, epsilon, layout, backend=backend)
        want = q_epsilon_greedy(
            obs, params, uniforms, epsilon, layout, backend="reference", dot_precision="ieee"
        )
        assert got.dtype == jnp.int32 and got.shape == (n,)
        np.testing.assert_array_equal(got, want)


def test_epsilon_greedy_under_vmap_with_a_traced_epsilon_per_seed(backend):
    rng = np.random.default_rng(4)
    layout = q_layout(3, (8, 8), 4)
    params = jnp.asarray(rng.normal(size=(3, layout.size)).astype(np.float32))
    obs = jnp.asarray(rng.normal(size=(3, 20, 3)).astype(np.float32))
    uniforms = jax.random.uniform(jax.random.key(1), (3, 20, 2))
    epsilon = jnp.array([0.0, 0.3, 1.0])

    def act(name):
        op = lambda o, p, u, e: q_epsilon_greedy(o, p, u, e, layout, backend=name)
        return jax.jit(jax.vmap(op))(obs, params, uniforms, epsilon)

    np.testing.assert_array_equal(act(backend), act("reference"))


# ---------------------------------------------------------------- bad input


def test_bad_input_names_the_argument():
    layout, args = make_case(np.random.default_rng(0), 8, 3, (4, 4), 2)
    with pytest.raises(ValueError, match=r"obs and next_obs must both be \[rows, 3\]"):
        q_learning_grads_flat(args[0][:, :2], *args[1:], layout)
    with pytest.raises(ValueError, match=r"rewards must be \[8\]"):
        q_learning_grads_flat(args[0], args[1], args[2][:5], *args[3:], layout)
    with pytest.raises(ValueError, match=rf"params must be \[{layout.size}\]"):
        q_learning_grads_flat(*args[:5], args[5][:-1], args[6], layout)
    with pytest.raises(ValueError, match="loss must be one of"):
        q_learning_grads_flat(*args, layout, loss="l1")
    with pytest.raises(ValueError, match="gap or overlap"):
        q_learning_grads_flat(*args, layout._replace(offsets=(1, *layout.offsets[1:])))
    with pytest.raises(ValueError, match=r"uniforms must be \[8, 2\]"):
        q_epsilon_greedy(args[0], args[5], jnp.zeros((8,)), 0.1, layout)


def test_networks_beyond_the_limits_are_refused_by_the_kernel(kernel_backend):
    layout, args = make_case(np.random.default_rng(0), 4, 3, (4, 200), 2)
    with pytest.raises(ValueError, match="beyond the fused Q-learning kernel's limits"):
        q_learning_grads_flat(*args, layout, backend=kernel_backend)


@settings(max_examples=200, deadline=None)
@given(
    seeds=st.integers(1, 4096),
    rows=st.integers(1, 1024),
    cap=st.sampled_from([16, 32, 64]),
)
def test_rows_per_program_are_the_fewest_that_keep_the_grid_small_within_the_cap(seeds, rows, cap):
    """`_block_rows`: a power of two from MIN_BLOCK_M up to the cap; below the cap the grid holds
    at most MAX_PROGRAMS programs, and half as many rows a program would have exceeded it."""
    from kernels import q_grads

    block = q_grads._block_rows(seeds, rows, cap)
    programs = lambda b: seeds * -(-rows // b)
    assert q_grads.MIN_BLOCK_M <= block <= cap and block & (block - 1) == 0
    if block < cap:
        assert programs(block) <= q_grads.MAX_PROGRAMS
    if block > q_grads.MIN_BLOCK_M:
        assert programs(block // 2) > q_grads.MAX_PROGRAMS
    assert q_grads._block_rows(seeds, rows) == q_grads._block_rows(seeds, rows, q_grads.MAX_BLOCK_M)
