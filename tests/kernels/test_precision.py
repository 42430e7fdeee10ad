"""The fused MLP kernels at each matmul precision (`dot_precision`: "ieee", "tf32", "bf16") against
a float64 oracle: the op's own plain-JAX reference run in float64 at full precision.

The bound on max |got - want| / max |want| (the scale-free error the kernels are held to) is stated
per precision in `BOUNDS`, from the unit roundoff of the products' operands and a margin for the
three layers forward and back:

    "ieee"   float32 operands and products, u = 2^-24 ~ 6e-8                      bound 1e-5
    "tf32"   10 stored mantissa bits, the operands cut to them: < 2^-10 ~ 1e-3      bound 5e-3
    "bf16"   7 stored mantissa bits, rounded to nearest: u = 2^-8 ~ 4e-3            bound 3e-2

On the CPU a "tf32" dot is full float32 on both sides (XLA:CPU and Triton's interpreter have no
TF32), so there the tf32 bound is met with room; on a GPU it is the tensor cores' TF32. "bf16" is
bfloat16 on every backend: the reference rounds the operands (`_mlp_tiles.reference_dot`), the
kernels too (`_mlp_tiles.matmul`; `kernels.launch` makes the interpreter round to nearest even and
multiply bf16 tiles as the GPU does).

Each gradient op runs two seeds in one jitted, vmapped call at odd sizes; each seed is checked
against its own float64 oracle. The ops are gradients, not differentiable themselves; the
reference's differentiable piece, `reference_dot` (a custom VJP whose backward rounds as the
kernels' backprop does), is checked under `jax.grad`. NaN in a weight propagates to the gradient
at every precision. An unknown precision, and a width a kernel does not hold, are one clear error.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import (
    deterministic_policy_grads_flat,
    ppo_grads,
    q_epsilon_greedy,
    q_learning_grads_flat,
    rainbow_epsilon_greedy,
    sac_actor_grads_flat,
    twin_q_grads_flat,
)
from kernels._mlp_tiles import PRECISIONS, matmul, reference_dot, reference_mlp
from kernels._triton import tl, triton
from kernels.launch import launch
from kernels.q_grads import q_layout
from kernels.q_grads import unflatten as q_arrays
from kernels.rainbow_act import NoisyLinear
from kernels.sac_actor_grads import sac_actor_layout
from kernels.twin_q_grads import twin_q_layout

BOUNDS = {"ieee": 1e-5, "tf32": 5e-3, "bf16": 3e-2}
SEEDS = 2


def relative_error(got, want) -> float:
    """max |got - want| / max |want|."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))


def normal(rng, *shape, scale=0.5):
    return jnp.asarray(rng.normal(size=shape).astype(np.float32) * scale)


def as_float64(tree):
    return jax.tree.map(
        lambda x: np.asarray(x, np.float64) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )


# ---------------------------------------------------------------- the gradient ops


def q_case(rng):
    """DQN's double-Q gradient, 21 rows, obs 3, hidden (17, 5), 3 actions."""
    layout = q_layout(3, (17, 5), 3)
    args = (
        normal(rng, SEEDS, 21, 3, scale=1.0),
        jnp.asarray(rng.integers(0, 3, (SEEDS, 21)), jnp.int32),
        normal(rng, SEEDS, 21, scale=1.0),
        jnp.asarray((rng.random((SEEDS, 21)) < 0.7) * 0.9, jnp.float32),
        normal(rng, SEEDS, 21, 3, scale=1.0),
        normal(rng, SEEDS, layout.size),
        normal(rng, SEEDS, layout.size),
    )

    def op(*xs, **kw):
        return q_learning_grads_flat(*xs, layout, loss="mse", double_q=True, **kw)

    return op, args, (5, layout.offsets[2])  # params: a weight of the second layer


def twin_q_case(rng):
    """The twin critics' gradient, 19 rows, obs 3, actions 2, hidden (9, 6)."""
    layout = twin_q_layout(3, 2, (9, 6))
    args = (
        normal(rng, SEEDS, 19, 3, scale=1.0),
        normal(rng, SEEDS, 19, 2),
        normal(rng, SEEDS, 19, scale=1.0),
        jnp.asarray((rng.random((SEEDS, 19)) < 0.7) * 0.9, jnp.float32),
        normal(rng, SEEDS, 19, 3, scale=1.0),
        normal(rng, SEEDS, 19, 2),
        normal(rng, SEEDS, 19, scale=0.1),
        normal(rng, SEEDS, layout.size),
        normal(rng, SEEDS, layout.size),
    )

    def op(*xs, **kw):
        return twin_q_grads_flat(*xs, layout, **kw)

    return op, args, (7, layout.offsets[8])  # params: critic 2's second-layer weight


def sac_actor_case(rng):
    """SAC's actor gradient, 18 rows, obs 3, actions 2, hidden (7, 5)."""
    actor, critic = sac_actor_layout(3, (7, 5), 2), twin_q_layout(3, 2, (7, 5))
    args = (
        normal(rng, SEEDS, 18, 3, scale=1.0),
        normal(rng, SEEDS, 18, 2, scale=1.0),
        jnp.full((SEEDS,), 0.2, jnp.float32),
        normal(rng, SEEDS, actor.size, scale=0.3),
        normal(rng, SEEDS, critic.size, scale=0.3),
    )

    def op(*xs, **kw):
        return sac_actor_grads_flat(*xs, actor, critic, **kw)

    return op, args, None


def deterministic_case(rng):
    """TD3's actor gradient, 17 rows, obs 3, actions 2, hidden (6, 9). Its weights are drawn at 0.3,
    not 0.5: at 0.5 this case's float64 gradient itself moves by up to 7% when its inputs move by
    2^-9 relative (the rows' terms cancel in the mean), which no bf16 computation can beat."""
    actor, critic = q_layout(3, (6, 9), 2), twin_q_layout(3, 2, (6, 9))
    args = (
        normal(rng, SEEDS, 17, 3, scale=1.0),
        normal(rng, SEEDS, actor.size, scale=0.3),
        normal(rng, SEEDS, critic.size, scale=0.3),
    )

    def op(*xs, **kw):
        return deterministic_policy_grads_flat(*xs, actor, critic, **kw)

    return op, args, None


def ppo_case(rng):
    """PPO's actor-critic gradient, 23 rows, obs 4, hidden (7, 11), 3 actions."""
    layout = ppo_grads.concatenated_layout(4, (7, 11), 3)
    old_log_probs = jnp.full((SEEDS, 23), -np.log(3), jnp.float32) + normal(
        rng, SEEDS, 23, scale=0.3
    )
    args = (
        normal(rng, SEEDS, 23, 4, scale=1.0),
        jnp.asarray(rng.integers(0, 3, (SEEDS, 23)), jnp.int32),
        old_log_probs,
        normal(rng, SEEDS, 23),
        normal(rng, SEEDS, 23, scale=1.0),
        normal(rng, SEEDS, 23, scale=1.0),
        normal(rng, SEEDS, layout.size),
    )

    def op(*xs, **kw):
        return ppo_grads.ppo_actor_critic_grads_flat(*xs, layout, 0.2, 0.2, 0.01, 0.5, **kw)

    return op, args, (6, layout.actor[2])  # params: the actor's second-layer weight


GRADIENT_OPS = {
    "q_learning": q_case,
    "twin_q": twin_q_case,
    "sac_actor": sac_actor_case,
    "deterministic_policy": deterministic_case,
    "ppo": ppo_case,
}


def float64_oracle(op, args):
    """The op's reference, in float64 at full precision, one seed at a time."""
    with jax.enable_x64(True):
        outs = [
            op(*(x[i] for x in as_float64(args)), backend="reference", dot_precision="ieee")
            for i in range(SEEDS)
        ]
        return [jax.tree.map(lambda x: np.asarray(x, np.float64), out) for out in outs]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", sorted(GRADIENT_OPS))
def test_gradient_within_the_precision_s_bound_of_float64(backend, name, precision):
    """Two seeds in one jit(vmap(op)) call: each seed's gradient, squared norm and statistics
    (loss, mean Q, entropy ...) within BOUNDS[precision] of the float64 oracle."""
    op, args, _ = GRADIENT_OPS[name](np.random.default_rng(7))
    grads, sq_norm, stats = jax.jit(
        jax.vmap(functools.partial(op, backend=backend, dot_precision=precision))
    )(*args)
    bound = BOUNDS[precision]
    for i, (want_grads, want_sq, want_stats) in enumerate(float64_oracle(op, args)):
        assert grads.dtype == jnp.float32 and grads.shape[1:] == want_grads.shape
        assert relative_error(grads[i], want_grads) < bound, (
            i,
            relative_error(grads[i], want_grads),
        )
        assert relative_error(sq_norm[i], want_sq) < 2 * bound
        for key, want in want_stats.items():  # a clipped-row count may move by a row: not held
            if key != "clip_fraction":
                assert abs(float(stats[key][i]) - want) < bound * (1.0 + abs(want)), key


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", ["q_learning", "twin_q", "ppo"])
def test_nan_in_a_weight_propagates_at_every_precision(backend, name, precision):
    """A NaN second-layer weight (bf16 keeps NaN a NaN) reaches the gradient and the loss. (The PPO
    kernels' policy_loss stays finite there, at every precision, where the reference's is NaN: their
    softmax takes the max logit with NaN ignored; not a matter of precision.)"""
    op, args, (at, offset) = GRADIENT_OPS[name](np.random.default_rng(2))
    single = [x[0] for x in args]
    single[at] = single[at].at[offset].set(jnp.nan)
    grads, _, stats = op(*single, backend=backend, dot_precision=precision)
    assert bool(jnp.isnan(grads).any())
    if name != "ppo":  # the PPO kernels' statistics take the rows' max logit with NaN ignored
        assert bool(jnp.isnan(stats["loss"]))


# ---------------------------------------------------------------- acting


def decided(q, margin):
    """Rows whose best Q leads the second by more than `margin`."""
    top = np.sort(q, axis=-1)
    return top[..., -1] - top[..., -2] > margin


@pytest.mark.parametrize("precision", PRECISIONS)
def test_q_epsilon_greedy_picks_the_float64_greedy_action(backend, precision):
    """Greedy actions (epsilon 0) of two seeds in one jit(vmap) call equal the float64 argmax on
    every row whose best Q leads by more than the precision's bound."""
    rng = np.random.default_rng(3)
    layout = q_layout(3, (13, 6), 5)
    obs, params = normal(rng, SEEDS, 29, 3, scale=1.0), normal(rng, SEEDS, layout.size)
    uniforms = jnp.ones((SEEDS, 29, 2)) * 0.99
    act = jax.jit(
        jax.vmap(
            lambda o, p: q_epsilon_greedy(
                o, p, uniforms[0], 0.0, layout, backend=backend, dot_precision=precision
            )
        )
    )
    got = np.asarray(act(obs, params))
    with jax.enable_x64(True):
        q = np.stack(
            [
                np.asarray(reference_mlp(q_arrays(p, layout), o, "relu", "ieee"))
                for o, p in zip(as_float64(obs), as_float64(params))
            ]
        )
    rows = decided(q, 4 * BOUNDS[precision] * np.abs(q).max())
    assert rows.mean() > 0.5
    np.testing.assert_array_equal(got[rows], np.argmax(q, axis=-1)[rows])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_rainbow_epsilon_greedy_picks_the_float64_greedy_action(backend, precision):
    rng = np.random.default_rng(4)
    d, h1, h2, z, a, n = 3, 11, 6, 5, 3, 19

    def noisy(out):
        draw = lambda *s, scale=0.3: normal(rng, *s, scale=scale)
        return NoisyLinear(
            draw(h2, out), jnp.abs(draw(h2, out, scale=0.1)), draw(out),
            jnp.abs(draw(out, scale=0.1)), draw(h2, scale=1.0), draw(out, scale=1.0),
        )  # fmt: skip

    obs = normal(rng, n, d, scale=1.0)
    torso = (normal(rng, d, h1, scale=0.3), normal(rng, h1), normal(rng, h1, h2, scale=0.3),
             normal(rng, h2))  # fmt: skip
    value, advantage = noisy(z), noisy(a * z)
    support = jnp.linspace(-10.0, 10.0, z)
    uniforms = jnp.ones((n, 2)) * 0.99
    got = np.asarray(
        jax.jit(
            lambda o: rainbow_epsilon_greedy(
                o, torso, value, advantage, support, uniforms, 0.0,
                backend=backend, dot_precision=precision,
            )
        )(obs)
    )  # fmt: skip
    from kernels.rainbow_act import rainbow_q_values

    with jax.enable_x64(True):
        q = np.asarray(
            rainbow_q_values(
                *as_float64((obs, torso, value, advantage, support)), dot_precision="ieee"
            )
        )
    rows = decided(q, 4 * BOUNDS[precision] * np.abs(q).max())
    assert rows.mean() > 0.5
    np.testing.assert_array_equal(got[rows], np.argmax(q, axis=-1)[rows])


# ---------------------------------------------------------------- the reference's matmul


@pytest.mark.parametrize("precision", PRECISIONS)
def test_reference_dot_and_its_gradient_within_the_bound(precision):
    """jax.grad through `reference_mlp` at each precision against float64 autodiff; under bf16 the
    forward is float32 from bf16 operands, and the backward's products round as the kernels' do."""
    rng = np.random.default_rng(5)
    layers = tuple(
        normal(rng, *s) for s in [(5, 13), (13,), (13, 7), (7,), (7, 3), (3,)]
    )  # fmt: skip
    x, c = normal(rng, 11, 5, scale=1.0), normal(rng, 11, 3, scale=1.0)
    loss = lambda ls, x, c, p: jnp.sum(reference_mlp(ls, x, "tanh", p) * c)
    value, grads = jax.value_and_grad(loss)(layers, x, c, precision)
    assert value.dtype == jnp.float32
    with jax.enable_x64(True):
        want_value, want = jax.value_and_grad(loss)(*as_float64((layers, x, c)), "ieee")
        want = [np.asarray(w) for w in want]
    assert abs(float(value) - float(want_value)) < BOUNDS[precision] * np.abs(want_value) + 1e-6
    for g, w in zip(grads, want):
        assert g.dtype == jnp.float32
        assert relative_error(g, w) < BOUNDS[precision]


def test_bf16_reference_dot_rounds_its_operands_to_bfloat16():
    """bf16(a) @ bf16(b) summed in float32: equal to float64 products of the rounded operands (to
    float32's sum error), and not equal to the float32 product."""
    rng = np.random.default_rng(6)
    a, b = normal(rng, 16, 32, scale=1.0), normal(rng, 32, 8, scale=1.0)
    got = np.asarray(reference_dot(a, b, "bf16"))
    rounded = lambda x: np.asarray(x.astype(jnp.bfloat16), np.float64)
    np.testing.assert_allclose(got, rounded(a) @ rounded(b), rtol=1e-6, atol=1e-5)
    assert relative_error(got, np.asarray(a, np.float64) @ np.asarray(b, np.float64)) > 1e-4


@triton.jit
def _tile_product_kernel(a_ptr, b_ptr, c_ptr, PRECISION: tl.constexpr):
    """c = a @ b on one 16 x 16 tile, by `_mlp_tiles.matmul` at PRECISION."""
    r = tl.arange(0, 16)
    at = r[:, None] * 16 + r[None, :]
    tl.store(c_ptr + at, matmul(tl.load(a_ptr + at), tl.load(b_ptr + at), PRECISION))


def test_interpreter_multiplies_bf16_tiles_as_the_gpu_does(kernel_backend):
    """`_mlp_tiles.matmul` at "bf16" on one 16 x 16 tile: the operands rounded to nearest even
    (1 + 2^-8 + 2^-9 rounds up, carrying into the mantissa; 2 - 2^-9 carries into the exponent),
    NaN stays NaN, the products summed in float32."""
    rng = np.random.default_rng(8)
    a = rng.normal(size=(16, 16)).astype(np.float32)
    a[0, :3] = [1 + 2**-8 + 2**-9, 2 - 2**-9, 1 + 2**-9]  # up, up (a carry), down
    a[5, 5] = np.nan
    b = np.eye(16, dtype=np.float32)
    b[:, 7] += rng.normal(size=16).astype(np.float32)
    got = np.asarray(
        launch(
            _tile_product_kernel, jnp.asarray(a), jnp.asarray(b), backend=kernel_backend,
            out_shape=jax.ShapeDtypeStruct((16, 16), jnp.float32), grid=(1,), PRECISION="bf16",
        )
    )  # fmt: skip
    rounded = lambda x: np.asarray(jnp.asarray(x).astype(jnp.bfloat16), np.float64)
    want = rounded(a) @ rounded(b)
    assert got[0, 0] == 1 + 2**-7 and got[0, 1] == 2.0 and got[0, 2] == 1.0
    assert np.isnan(got[5]).all() and not np.isnan(np.delete(got, 5, axis=0)).any()
    np.testing.assert_allclose(
        np.delete(got, 5, axis=0), np.delete(want, 5, axis=0), rtol=1e-6, atol=1e-5
    )


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("name", sorted(GRADIENT_OPS))
def test_an_unknown_precision_is_one_error_naming_the_argument(name):
    op, args, _ = GRADIENT_OPS[name](np.random.default_rng(0))
    with pytest.raises(
        ValueError, match=r"dot_precision must be one of \('tf32', 'ieee', 'bf16'\)"
    ):
        op(*(x[0] for x in args), backend="reference", dot_precision="fp16")


def test_bf16_does_not_widen_the_kernels_limits(kernel_backend):
    """256-wide layers stay beyond the Q-learning and twin-critic kernels at every precision (the
    weight gradients' float32 tiles are what does not fit on chip; the reference still runs)."""
    rng = np.random.default_rng(0)
    layout = q_layout(3, (256, 256), 2)
    args = (
        normal(rng, 4, 3), jnp.zeros(4, jnp.int32), normal(rng, 4), normal(rng, 4),
        normal(rng, 4, 3), normal(rng, layout.size), normal(rng, layout.size),
    )  # fmt: skip
    with pytest.raises(ValueError, match="beyond the fused Q-learning kernel's limits"):
        q_learning_grads_flat(*args, layout, backend=kernel_backend, dot_precision="bf16")
    twin = twin_q_layout(3, 2, (256, 256))
    twin_args = (
        normal(rng, 4, 3), normal(rng, 4, 2), normal(rng, 4), normal(rng, 4), normal(rng, 4, 3),
        normal(rng, 4, 2), normal(rng, 4), normal(rng, twin.size), normal(rng, twin.size),
    )  # fmt: skip
    with pytest.raises(ValueError, match="beyond the fused twin-critic kernel's limits"):
        twin_q_grads_flat(*twin_args, twin, backend=kernel_backend, dot_precision="bf16")
