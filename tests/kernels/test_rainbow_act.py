"""kernels.rainbow_epsilon_greedy (Rainbow's fused acting): the reference against a float64 NumPy
computation of the noisy dueling C51 forward, the kernel against the reference at odd sizes under
jit and nested vmap, epsilon, NaN, and the errors for bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import rainbow_epsilon_greedy
from kernels.rainbow_act import LIMITS, NoisyLinear, rainbow_q_values, unfit_reason


def network(seed, n, d, h1, h2, z, a, lead=()):
    """Random inputs of the op: obs, torso, value, advantage, support, uniforms (each with the
    `lead` axes first)."""
    keys = iter(jax.random.split(jax.random.key(seed), 32))
    draw = lambda *shape, scale=0.3: scale * jax.random.normal(next(keys), lead + shape)
    positive = lambda *shape: jnp.abs(draw(*shape, scale=0.1))

    def noisy(out):
        return NoisyLinear(
            draw(h2, out), positive(h2, out), draw(out), positive(out), draw(h2, scale=1.0),
            draw(out, scale=1.0),
        )  # fmt: skip

    obs = draw(n, d, scale=1.0)
    torso = (draw(d, h1), draw(h1), draw(h1, h2), draw(h2))
    support = jnp.linspace(-10.0, 10.0, z)
    uniforms = jax.random.uniform(next(keys), lead + (n, 2))
    return obs, torso, noisy(z), noisy(a * z), support, uniforms


def numpy_q(obs, torso, value, advantage, support, activation="relu"):
    """Q [N, A] in float64 NumPy, the noisy weights formed as matrices."""
    f = {
        "relu": lambda x: np.maximum(x, 0),
        "tanh": np.tanh,
        "silu": lambda x: x / (1 + np.exp(-x)),
    }
    as64 = lambda x: np.asarray(x, np.float64)
    w1, b1, w2, b2 = map(as64, torso)
    h = f[activation](f[activation](as64(obs) @ w1 + b1) @ w2 + b2)

    def noisy(layer):
        w_mu, w_sigma, b_mu, b_sigma, e_in, e_out = map(as64, layer)
        return h @ (w_mu + w_sigma * np.outer(e_in, e_out)) + b_mu + b_sigma * e_out

    z = as64(support)
    v = noisy(value)[:, None, :]
    adv = noisy(advantage).reshape(h.shape[0], -1, z.size)
    logits = v + adv - adv.mean(axis=1, keepdims=True)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return (p * z).sum(axis=-1)


def numpy_actions(q, uniforms, epsilon):
    a = q.shape[-1]
    u = np.asarray(uniforms, np.float64)
    random = np.minimum(np.floor(np.asarray(uniforms)[..., 1] * a).astype(np.int32), a - 1)
    return np.where(u[..., 0] < epsilon, random, np.argmax(q, axis=-1))


def decided(q, margin=1e-4):
    """Rows whose best Q leads the second by more than `margin` (where float rounding cannot
    change the argmax)."""
    if q.shape[-1] == 1:
        return np.ones(q.shape[:-1], bool)
    top = np.sort(q, axis=-1)
    return top[..., -1] - top[..., -2] > margin


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 9),
    d=st.integers(1, 6),
    h=st.integers(1, 9),
    z=st.integers(2, 7),
    a=st.integers(1, 4),
    activation=st.sampled_from(["relu", "tanh", "silu"]),
    seed=st.integers(0, 2**16),
)
def test_reference_q_values_match_float64_numpy(n, d, h, z, a, activation, seed):
    obs, torso, value, advantage, support, _ = network(seed, n, d, h, h + 1, z, a)
    got = rainbow_q_values(
        obs, torso, value, advantage, support, activation=activation, dot_precision="ieee"
    )
    want = numpy_q(obs, torso, value, advantage, support, activation)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


CASES = [  # n, d, h1, h2, atoms, actions, activation, dot precision
    (1, 3, 1, 3, 2, 1, "relu", "ieee"),
    (19, 4, 84, 120, 51, 2, "relu", "ieee"),
    (19, 4, 84, 120, 51, 2, "tanh", "ieee"),
    (33, 7, 128, 64, 11, 6, "silu", "ieee"),
    (16, 64, 128, 128, 64, 6, "silu", "ieee"),  # 7 x 128 x 64 x 4 = 229,376 <= IEEE_SHARED_BYTES
    (16, 64, 128, 128, 128, 8, "silu", "tf32"),  # LIMITS
]


@pytest.mark.parametrize("n, d, h1, h2, z, a, activation, precision", CASES)
def test_actions_match_float64_numpy_at_odd_sizes(
    backend, n, d, h1, h2, z, a, activation, precision
):
    """Two seeds in one vmapped, jitted call; epsilon 0, 0.3 and 1 (all random). TF32 products
    round to about 1e-3 relative: there the rows compared are those whose best Q leads by more."""
    obs, torso, value, advantage, support, uniforms = network(1, n, d, h1, h2, z, a, lead=(2,))
    q = np.stack(
        [
            numpy_q(
                *jax.tree.map(lambda x: x[i], (obs, torso, value, advantage)), support, activation
            )
            for i in range(2)
        ]
    )
    for epsilon in (0.0, 0.3, 1.0):
        act = jax.jit(
            jax.vmap(
                lambda o, t, v, adv, u: rainbow_epsilon_greedy(
                    o, t, v, adv, support, u, epsilon, activation=activation,
                    dot_precision=precision, backend=backend,
                )
            )
        )  # fmt: skip
        got = np.asarray(act(obs, torso, value, advantage, uniforms))
        want = numpy_actions(q, uniforms, epsilon)
        margin = 1e-4 if precision == "ieee" else 2e-2 * np.abs(q).max()
        rows = decided(q, margin) | (np.asarray(uniforms)[..., 0] < epsilon)
        assert got.shape == (2, n) and got.dtype == np.int32
        assert rows.mean() > 0.8
        np.testing.assert_array_equal(got[rows], want[rows])


def test_nested_vmap_matches_the_reference(kernel_backend):
    obs, torso, value, advantage, support, uniforms = network(2, 5, 4, 16, 16, 5, 3, lead=(2, 3))
    epsilon = jnp.array([[0.0, 0.5, 1.0], [0.1, 0.0, 0.0]])

    def acting(backend):
        one = lambda o, t, v, adv, u, e: rainbow_epsilon_greedy(
            o, t, v, adv, support, u, e, dot_precision="ieee", backend=backend
        )
        return jax.jit(jax.vmap(jax.vmap(one)))(obs, torso, value, advantage, uniforms, epsilon)

    got, want = np.asarray(acting(kernel_backend)), np.asarray(acting("reference"))
    assert got.shape == (2, 3, 5)
    q = np.stack(
        [
            numpy_q(*jax.tree.map(lambda x: x[i, j], (obs, torso, value, advantage)), support)
            for i in range(2)
            for j in range(3)
        ]
    ).reshape(2, 3, 5, 3)
    rows = decided(q) | (np.asarray(uniforms)[..., 0] < np.asarray(epsilon)[..., None])
    assert rows.mean() > 0.8
    np.testing.assert_array_equal(got[rows], want[rows])


def test_nan_q_values_take_the_first_action_as_jnp_argmax_does(backend):
    obs, torso, value, advantage, support, uniforms = network(3, 4, 3, 8, 8, 5, 3)
    obs = obs.at[1, 0].set(jnp.nan)  # row 1: every Q NaN
    got = rainbow_epsilon_greedy(
        obs, torso, value, advantage, support, uniforms, 0.0, dot_precision="ieee", backend=backend
    )
    q = numpy_q(obs, torso, value, advantage, support)
    assert np.isnan(q[1]).all() and not np.isnan(q[[0, 2, 3]]).any()
    assert int(got[1]) == 0
    rows = decided(q)
    rows[1] = False
    np.testing.assert_array_equal(np.asarray(got)[rows], np.argmax(q, axis=-1)[rows])


def test_bad_input_names_the_argument(backend):
    obs, torso, value, advantage, support, uniforms = network(4, 4, 3, 8, 8, 5, 2)
    act = lambda **changed: rainbow_epsilon_greedy(
        **{
            "obs": obs, "torso": torso, "value": value, "advantage": advantage,
            "support": support, "uniforms": uniforms, "epsilon": 0.1, "backend": backend,
            **changed,
        }
    )  # fmt: skip
    with pytest.raises(ValueError, match="value.e_out must have shape"):
        act(value=value._replace(e_out=jnp.zeros(4)))
    with pytest.raises(ValueError, match="torso w2 must have shape"):
        act(torso=(torso[0], torso[1], torso[2][:5], torso[3]))
    with pytest.raises(ValueError, match=r"advantage.w_mu must be \[hidden, actions \* atoms\]"):
        act(advantage=advantage._replace(w_mu=jnp.zeros((8, 9))))
    with pytest.raises(ValueError, match="uniforms must have shape"):
        act(uniforms=uniforms[:, :1])
    with pytest.raises(ValueError, match="obs"):
        act(obs=obs.astype(jnp.int32))
    with pytest.raises(ValueError, match="activation"):
        act(activation="gelu")


def test_networks_beyond_the_limits_are_refused_by_the_kernel(kernel_backend):
    wide = LIMITS["hidden"] + 1
    obs, torso, value, advantage, support, uniforms = network(5, 2, 3, wide, 4, 3, 2)
    with pytest.raises(ValueError, match="hidden 256 > 128"):
        rainbow_epsilon_greedy(
            obs, torso, value, advantage, support, uniforms, 0.0, backend=kernel_backend
        )
    got = rainbow_epsilon_greedy(
        obs, torso, value, advantage, support, uniforms, 0.0, backend="reference"
    )
    assert got.shape == (2,)


def test_full_float32_products_beyond_the_shared_memory_are_refused(kernel_backend):
    """3 actions of 128 atoms at hidden 128: within LIMITS with TF32 products, but "ieee" products
    would stage 4 x 128 x 128 float32 in shared memory."""
    obs, torso, value, advantage, support, uniforms = network(6, 3, 4, 8, 128, 128, 3)
    act = lambda precision: rainbow_epsilon_greedy(
        obs, torso, value, advantage, support, uniforms, 0.0, dot_precision=precision,
        backend=kernel_backend,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"dot_precision 'ieee' .* 262144 bytes > 231424"):
        act("ieee")
    assert act("tf32").shape == (3,)
    assert unfit_reason(4, (128, 128), 64, 6, "ieee") is None
    assert unfit_reason(4, (128, 128), 64, 7, "ieee") is not None
    assert unfit_reason(4, (128, 16), 64, 7, "ieee") is None  # the head reads the last width
    assert unfit_reason(4, (128, 128), 128, 8, "tf32") is None
