"""kernels.adam: clipped Adam and the target's Polyak step on flat vectors, against a float64 NumPy
evaluation of the formula and against optax's own Adam (rl.core.optimizers.clipped_adam) step by
step; under jit and nested vmap with per-seed hyperparameters; odd sizes around the block; NaN
propagation; one clear error for bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.adam import BLOCK, adam_step
from rl.core.optimizers import clipped_adam, flat_step, periodic_polyak

B1, B2, EPS = 0.9, 0.999, 1e-8


def float64_step(params, grads, mu, nu, target, count, lr, max_norm, tau, sync, eps=EPS):
    """The module docstring's step in float64 NumPy (an independent evaluation)."""
    params, grads, mu, nu, target = (
        np.asarray(x, np.float64) for x in (params, grads, mu, nu, target)
    )
    norm = np.sqrt(np.sum(grads**2))
    g = grads if norm < max_norm else grads / norm * max_norm
    mu = B1 * mu + (1 - B1) * g
    nu = B2 * nu + (1 - B2) * g**2
    t = count + 1
    params = params - lr * (mu / (1 - B1**t)) / (np.sqrt(nu / (1 - B2**t)) + eps)
    target = tau * params + (1 - tau) * target if sync else target
    return params, mu, nu, target, t


def vectors(seed: int, size: int, scale: float = 1.0):
    """params, grads, mu, nu (>= 0), target [size] float32."""
    rng = np.random.default_rng(seed)
    params, grads, mu, target = (rng.normal(size=size).astype(np.float32) for _ in range(4))
    nu = (rng.normal(size=size) ** 2 * 0.1).astype(np.float32)
    return params, grads * scale, mu * 0.1, nu, target


def assert_step_close(out, expected, before, what: str):
    """Every output within float32 rounding of the float64 step (the relative error reported):
    the moments to 2e-6 and 1e-6 of their largest element (where b mu and (1 - b) g cancel);
    params and target to their own rounding plus 1e-4 of the step, for the bias corrections
    1 - b^t, which float32 holds to ~1e-5 at t = 1 (as optax computes them)."""
    step = np.max(np.abs(expected[0] - np.asarray(before, np.float64)))
    for name, got, want in zip(("params", "mu", "nu", "target"), out[:4], expected[:4]):
        got, want = np.asarray(got, np.float64), np.asarray(want)
        relative = np.max(np.abs(got - want) / (np.abs(want) + 1e-6))
        np.testing.assert_allclose(
            got,
            want,
            rtol=2e-6,
            atol=1e-6 * np.max(np.abs(want)) if name in ("mu", "nu") else 2e-7 + 1e-4 * step,
            err_msg=f"{what}: {name} (relative error {relative:.2e})",
        )
    assert int(out[4]) == expected[4]


@pytest.mark.parametrize("size", [1, BLOCK - 1, BLOCK + 1, 2 * BLOCK + 7])
@pytest.mark.parametrize("clipped", [False, True])
def test_matches_the_float64_step(backend, size, clipped):
    """Sizes around the block, the clip inactive (norm below max_norm) and active, with a target
    synced: every output as float64 NumPy has it."""
    params, grads, mu, nu, target = vectors(size, size)
    norm = float(np.sqrt(np.sum(grads.astype(np.float64) ** 2)))
    max_norm = norm / 2 if clipped else norm * 2
    args = (params, grads, mu, nu, 6, 3e-3, max_norm)
    out = adam_step(*args, target=target, tau=0.25, sync=True, backend=backend)
    expected = float64_step(params, grads, mu, nu, target, 6, 3e-3, max_norm, 0.25, True)
    assert_step_close(out, expected, params, f"{backend}, size {size}")


@settings(max_examples=15, deadline=None)
@given(  # sizes around the block from a set: each compiles once
    size=st.sampled_from([1, 2, 7, 100, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK - 5]),
    count=st.integers(0, 10**6),
    lr=st.floats(1e-5, 1e-1),
    clip=st.floats(0.05, 20.0),
    tau=st.floats(0.0, 1.0),
    sync=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_matches_the_float64_step(backend, size, count, lr, clip, tau, sync, seed):
    """Any size, step count (the bias corrections from 1 - b^1 to ~1), step size, clip ratio and
    target step: the float64 step within float32 rounding, sq_norm given as the gradient kernels
    give it."""
    params, grads, mu, nu, target = vectors(seed, size)
    norm = float(np.sqrt(np.sum(grads.astype(np.float64) ** 2)))
    max_norm = norm * clip
    out = adam_step(
        params,
        grads,
        mu,
        nu,
        count,
        lr,
        max_norm,
        sq_norm=np.float32(norm**2),
        target=target,
        tau=tau,
        sync=sync,
        backend=backend,
    )
    expected = float64_step(params, grads, mu, nu, target, count, lr, max_norm, tau, sync)
    assert_step_close(out, expected, params, f"{backend}, size {size}, count {count}")


def test_five_steps_follow_optax(backend):
    """Five steps from a fresh state along changing gradients, against optax's clipped Adam on the
    same flat vector (rl.core.optimizers.flat_step) and rl.core.optimizers.periodic_polyak every
    other step: the same moments and count, params and target within float32 rounding."""
    size = 2 * BLOCK + 3
    params, _, _, _, target = vectors(0, size)
    optimizer = clipped_adam(1e-2, 1.5)
    state = optimizer.init(jnp.asarray(params))
    ref_params, ref_target = jnp.asarray(params), jnp.asarray(target)
    mu, nu, count = np.zeros(size, np.float32), np.zeros(size, np.float32), 0
    for step in range(5):
        grads = vectors(100 + step, size, scale=0.2 * (step + 1))[1]
        ref_params, state = flat_step(optimizer, ref_params, state, jnp.asarray(grads))
        ref_target = periodic_polyak(ref_target, ref_params, 0.5, step % 2 == 1)
        params, mu, nu, target, count = adam_step(
            params,
            grads,
            mu,
            nu,
            count,
            1e-2,
            1.5,
            target=target,
            tau=0.5,
            sync=step % 2 == 1,
            backend=backend,
        )
        adam_state = state[1][0]
        np.testing.assert_allclose(mu, adam_state.mu, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(nu, adam_state.nu, rtol=1e-6, atol=1e-12)
        assert int(count) == int(adam_state.count) == step + 1
        np.testing.assert_allclose(params, ref_params, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(target, ref_target, rtol=1e-6, atol=1e-6)


def test_without_a_target_or_a_norm(backend):
    """No target: None back; no sq_norm: the norm is reduced from grads (the same step)."""
    params, grads, mu, nu, _ = vectors(1, 300)
    norm_sq = np.float32(np.sum(grads.astype(np.float64) ** 2))
    given_norm = adam_step(params, grads, mu, nu, 2, 1e-3, 1.0, sq_norm=norm_sq, backend=backend)
    reduced = adam_step(params, grads, mu, nu, 2, 1e-3, 1.0, backend=backend)
    assert given_norm[3] is None and reduced[3] is None
    for a, b in zip(given_norm[:3], reduced[:3]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_nested_vmap_under_jit_equals_a_loop(kernel_backend):
    """Settings x seeds with per-seed step sizes, clips, counts, target flags and `active` flags,
    under jit: one launch, each seed's step as if alone (an inactive seed's vectors and count
    exactly as they were)."""
    settings_, seeds, size = 2, 3, BLOCK + 5
    rng = np.random.default_rng(7)
    draw = lambda *shape: rng.normal(size=(settings_, seeds, *shape)).astype(np.float32)
    params, grads, mu, target = draw(size), draw(size), draw(size) * 0.1, draw(size)
    nu = draw(size) ** 2 * 0.1
    count = rng.integers(0, 100, (settings_, seeds)).astype(np.int32)
    lr = rng.uniform(1e-4, 1e-2, (settings_, seeds)).astype(np.float32)
    clip = rng.uniform(5.0, 60.0, (settings_, seeds)).astype(np.float32)
    sync = rng.integers(0, 2, (settings_, seeds)).astype(bool)
    active = np.array([[True, False, True], [True, True, False]])

    def one(p, g, m, n, c, l, mx, t, s, a, backend):
        return adam_step(p, g, m, n, c, l, mx, target=t, tau=0.1, sync=s, active=a, backend=backend)

    inputs = (params, grads, mu, nu, count, lr, clip, target, sync, active)
    batched = jax.jit(jax.vmap(jax.vmap(lambda *a: one(*a, kernel_backend))))(*inputs)
    for i in range(settings_):
        for j in range(seeds):
            alone = one(*(x[i, j] for x in inputs), "reference")
            if not active[i, j]:
                before = (params, mu, nu, target, count)
                for got, was in zip(batched, before):
                    np.testing.assert_array_equal(got[i, j], was[i, j])
            for got, want in zip(batched, alone):
                # float32 rounding apart (the batched norm reduces in another order)
                np.testing.assert_allclose(got[i, j], want, rtol=1e-5, atol=1e-6)


def test_an_inactive_step_returns_everything_as_it_was(backend):
    """active=False: params, moments, target and count come back bit for bit, whatever the
    gradient (NaN included) and the target flag; active=True from the same inputs steps."""
    params, grads, mu, nu, target = vectors(3, BLOCK + 9)
    grads[5] = np.nan
    out = adam_step(
        params, grads, mu, nu, 4, 1e-2, 1.0, target=target, sync=True, active=False,
        backend=backend,
    )  # fmt: skip
    for got, was in zip(out, (params, mu, nu, target, 4)):
        np.testing.assert_array_equal(got, was)
    grads[5] = 0.0
    out = adam_step(
        params, grads, mu, nu, 4, 1e-2, 1.0, target=target, sync=True, active=True,
        backend=backend,
    )  # fmt: skip
    assert int(out[4]) == 5 and not np.array_equal(out[0], params)


def test_the_automatic_choices_xla_rows_are_the_kernels_step():
    """`_adam_rows` (XLA's fused step, which the automatic choice takes below
    AUTO_TRITON_MIN_ELEMENTS on a GPU) on [S, P] rows with per-seed scalars: each seed's float64
    step, an inactive seed unchanged; the same on one unbatched vector [P] and on nested seed axes
    [1, S, P] (the shapes the step keeps)."""
    from kernels.adam import _adam_rows, bias_corrections

    seeds, size = 3, 37
    rows = [vectors(10 + i, size) for i in range(seeds)]
    params, grads, mu, nu, target = (np.stack(x) for x in zip(*rows))
    count = np.array([0, 5, 9], np.int32)
    lr, max_norm, tau = np.array([1e-3, 3e-2, 1e-2]), np.array([0.5, 50.0, 2.0]), 0.3
    sq_norm = np.sum(grads.astype(np.float64) ** 2, axis=1)
    sync, active = np.array([1.0, 0.0, 1.0]), np.array([1.0, 1.0, 0.0])
    c1, c2 = bias_corrections(jnp.asarray(count), B1, B2)
    scalars = np.stack([c1, c2, lr, max_norm, sq_norm, np.full(3, tau), sync, active], 1)
    hyper = (B1, 1 - B1, B2, 1 - B2, EPS)
    args = (params, grads, mu, nu, target, count, scalars.astype(np.float32))
    out = _adam_rows(*(jnp.asarray(x) for x in args), hyper)
    nested = _adam_rows(*(jnp.asarray(x)[None] for x in args), hyper)
    for got, want in zip(nested, out):  # (to float32 round-off: XLA may fuse shapes differently)
        np.testing.assert_allclose(got[0], want, rtol=1e-6, atol=0)
    for i in range(seeds):
        alone = _adam_rows(*(jnp.asarray(x[i]) for x in args), hyper)
        for got, want in zip(alone, out):
            assert got.shape == want.shape[1:]
            np.testing.assert_allclose(got, want[i], rtol=1e-6, atol=0)
    for i in range(seeds):
        got = [x[i] for x in out]
        if not active[i]:
            for g, was in zip(got, (params[i], mu[i], nu[i], target[i], count[i])):
                np.testing.assert_array_equal(g, was)
            continue
        expected = float64_step(
            params[i], grads[i], mu[i], nu[i], target[i], count[i], lr[i], max_norm[i], tau,
            bool(sync[i]),
        )  # fmt: skip
        assert_step_close(got, expected, params[i], f"seed {i}")


def test_nan_propagates(backend):
    """NaN in the params stays where it is; NaN in a gradient makes the norm NaN, so every element
    of the step is NaN (as optax's clip gives it)."""
    params, grads, mu, nu, _ = vectors(2, 50)
    params[3] = np.nan
    out = adam_step(params, grads, mu, nu, 0, 1e-3, 1.0, backend=backend)
    assert np.isnan(out[0][3]) and np.isfinite(np.delete(np.asarray(out[0]), 3)).all()
    params[3], grads[7] = 0.0, np.nan
    out = adam_step(params, grads, mu, nu, 0, 1e-3, 1.0, backend=backend)
    assert np.isnan(np.asarray(out[0])).all() and np.isnan(np.asarray(out[1])).all()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(mu=np.zeros(4, np.float32)), r"mu must be a flat vector shaped like params \(5,\)"),
        (dict(params=np.zeros((5, 1), np.float32)), r"params must be a flat vector"),
        (dict(lr=np.ones(2, np.float32)), r"lr must be a scalar, got shape \(2,\)"),
        (dict(active=np.ones(3, bool)), r"active must be a scalar, got shape \(3,\)"),
        (dict(grads=np.arange(5)), r"grads"),
        (dict(b1=1.0), r"b1 must be in \(0, 1\), got 1.0"),
        (dict(eps=-1.0), r"eps must be >= 0"),
    ],
)
def test_bad_input_gets_one_clear_error(change, message):
    arguments = dict(
        params=np.zeros(5, np.float32),
        grads=np.ones(5, np.float32),
        mu=np.zeros(5, np.float32),
        nu=np.zeros(5, np.float32),
        count=0,
        lr=1e-3,
        max_norm=1.0,
    )
    arguments.update(change)
    with pytest.raises((ValueError, TypeError), match=message):
        adam_step(**arguments, backend="reference")
