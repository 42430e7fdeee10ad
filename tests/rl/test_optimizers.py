"""rl.core.optimizers: the global gradient norm and its clip (which can take the squared norm
computed already), one optimiser step on a flat parameter vector, the annealed step size, and Polyak
averaging of target networks."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.flatten_util import ravel_pytree

from rl.core import optimizers

# ---------------------------------------------------------------- the global norm and its clip


@settings(max_examples=30, deadline=None)
@given(st.floats(1e-3, 1e3), st.integers(0, 2**31 - 1))
def test_clip_by_global_norm_matches_optax(max_norm, seed):
    rng = np.random.default_rng(seed)
    grads = {
        "w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
        "b": (jnp.asarray(rng.normal(size=3), jnp.float32),),
    }
    ours, state = optimizers.clip_by_global_norm(max_norm).update(
        grads, optimizers.clip_by_global_norm(max_norm).init(grads)
    )
    theirs, their_state = optax.clip_by_global_norm(max_norm).update(
        grads, optax.clip_by_global_norm(max_norm).init(grads)
    )
    assert jax.tree.structure(state) == jax.tree.structure(their_state)
    np.testing.assert_allclose(optimizers.global_norm(grads), optax.global_norm(grads), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)


def test_global_norm_by_hand():
    assert float(optimizers.global_norm({})) == 0.0  # as optax.global_norm
    np.testing.assert_allclose(
        optimizers.global_norm({"a": jnp.array([3.0]), "b": jnp.array([[4.0, 0.0]])}), 5.0
    )
    clip = optimizers.clip_by_global_norm(1.0)
    grads = {"a": jnp.array([3.0]), "b": jnp.array([[4.0, 0.0]])}
    clipped, _ = clip.update(grads, clip.init(grads))
    np.testing.assert_allclose(clipped["a"], [0.6], rtol=1e-6)
    np.testing.assert_allclose(clipped["b"], [[0.8, 0.0]], rtol=1e-6)


def test_clip_takes_a_given_squared_norm_through_the_chain():
    """`grad_sq_norm` passed to a chain that starts with the clip replaces the clip's own norm: the
    true one gives the same step as none; a larger one scales the gradient by max_norm / sqrt(given)
    (here 1 / 10, then through plain SGD); a smaller one leaves it unclipped."""
    optimizer = optax.chain(optimizers.clip_by_global_norm(1.0), optax.sgd(1.0))
    grads = jnp.array([3.0, 4.0, 0.0])  # ||g|| = 5
    state = optimizer.init(grads)
    plain, _ = optimizer.update(grads, state, grads)
    np.testing.assert_allclose(np.asarray(plain), [-0.6, -0.8, 0.0], rtol=1e-6)
    given, _ = optimizer.update(grads, state, grads, grad_sq_norm=jnp.float32(25.0))
    np.testing.assert_allclose(np.asarray(given), np.asarray(plain), rtol=1e-6)
    larger, _ = optimizer.update(grads, state, grads, grad_sq_norm=jnp.float32(100.0))
    np.testing.assert_allclose(np.asarray(larger), [-0.3, -0.4, 0.0], rtol=1e-6)
    smaller, _ = optimizer.update(grads, state, grads, grad_sq_norm=jnp.float32(0.25))
    np.testing.assert_allclose(np.asarray(smaller), -np.asarray(grads))


# ---------------------------------------------------------------- one step on a flat vector


PARAMS = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([[3.0]]), "c": jnp.array([-1.0, 0.5, 4.0])}


def _grads(seed, scale):
    return scale * jax.random.normal(jax.random.PRNGKey(seed), (6,))


def test_flat_step_is_optax_update_then_apply_updates_bit_for_bit():
    """Three steps of `clipped_adam` (clipping at the first step, not after) and of plain Adam (no
    extra-argument support of its own) on the raveled params, each equal to optax's `update` +
    `apply_updates` on the same flat vector, both eager and both under jit."""
    flat, _ = ravel_pytree(PARAMS)

    def optax_step(optimizer, flat_params, opt_state, grads):
        updates, opt_state = optimizer.update(grads, opt_state, flat_params)
        return optax.apply_updates(flat_params, updates), opt_state

    for optimizer in (optimizers.clipped_adam(0.1, 1.0), optax.adam(0.1)):
        ours = partial(optimizers.flat_step, optimizer)
        theirs = partial(optax_step, optimizer)
        for wrap in (lambda f: f, jax.jit):
            a = b = (flat, optimizer.init(flat))
            for i, scale in enumerate((10.0, 0.1, 0.1)):
                a, b = wrap(ours)(*a, _grads(i, scale)), wrap(theirs)(*b, _grads(i, scale))
                for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
                    np.testing.assert_array_equal(x, y)
            assert not np.array_equal(a[0], flat)


def test_flat_step_with_the_gradients_squared_norm_equals_the_clip_from_the_gradient():
    """Given ||g||^2 of g itself, the clip in `clipped_adam` scales g as its own norm pass would:
    the same params and Adam state, where the clip acts (||g|| > max) and where it does not."""
    flat, _ = ravel_pytree(PARAMS)
    optimizer = optimizers.clipped_adam(0.1, 1.0)
    state = optimizer.init(flat)
    for scale in (10.0, 0.01):
        g = _grads(0, scale)
        want = optimizers.flat_step(optimizer, flat, state, g)
        got = optimizers.flat_step(optimizer, flat, state, g, grad_sq_norm=jnp.sum(jnp.square(g)))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_flat_step_steps_along_the_given_norm_and_the_params_come_back_in_their_tree():
    """With a clip-then-SGD optimiser a given squared norm (not g's own) sets the step:
    -lr g max_norm / sqrt(given); `ravel_pytree`'s unravel gives the params back in their tree."""
    params = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([[3.0]])}
    flat, unravel = ravel_pytree(params)
    optimizer = optax.chain(optimizers.clip_by_global_norm(1.0), optax.sgd(0.5))
    g = jnp.array([1.0, 0.0, 2.0])  # ||g|| = sqrt(5), given as 4
    new, _ = optimizers.flat_step(
        optimizer, flat, optimizer.init(flat), g, grad_sq_norm=jnp.float32(16.0)
    )
    new = unravel(new)
    # ravel order: a (2 entries), then b (1): g / 4 (clip at norm 4), times lr 0.5
    np.testing.assert_allclose(np.asarray(new["a"]), [1.0 - 0.125, 2.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(new["b"]), [[3.0 - 0.25]], rtol=1e-6)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_flat_clipped_adam_polyak_is_flat_step_then_periodic_polyak(backend):
    """Three steps (clipped at the first, a target sync at the second only) of the one-launch step
    against `flat_step(clipped_adam)` + `periodic_polyak`: the same params, target and optax state
    (its layout too, so either step continues the other's state), to float32 rounding; with
    `active` false, everything as it was."""
    if backend == "interpret":
        pytest.importorskip("triton")
    flat, _ = ravel_pytree(PARAMS)
    optimizer = optimizers.clipped_adam(0.1, 1.0)
    step = jax.jit(optimizers.flat_clipped_adam_polyak, static_argnames="backend")
    ours = theirs = (flat, optimizer.init(flat), flat - 1.0)
    for i, (scale, sync) in enumerate(((10.0, False), (0.1, True), (0.1, False))):
        g = _grads(i, scale)
        sq_norm = jnp.sum(jnp.square(g)) if i else None
        ours = step(*ours[:2], g, sq_norm, ours[2], 0.1, 1.0, 0.25, sync, backend=backend)
        params, opt_state = optimizers.flat_step(optimizer, theirs[0], theirs[1], g)
        theirs = (params, opt_state, optimizers.periodic_polyak(theirs[2], params, 0.25, sync))
        assert jax.tree.structure(ours) == jax.tree.structure(theirs)
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
            np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7, err_msg=f"step {i}")
    assert not np.allclose(ours[2], flat - 1.0)
    skipped = step(*ours[:2], _grads(5, 1.0), None, ours[2], 0.1, 1.0, 0.25, True, backend, False)
    for a, b in zip(jax.tree.leaves(skipped), jax.tree.leaves(ours)):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- the annealed step size


def test_annealed_clipped_adam_decays_the_step_size_per_update():
    """Adam on a constant gradient (below the clip) moves each parameter by its step size at every
    step (m_hat / sqrt(v_hat) = 1); annealed, the step size is lr (1 - update / num_updates), one
    update being num_epochs * num_minibatches steps: here 2 steps per update, 4 updates."""
    g = jnp.array([0.5, -0.5])
    for anneal, want in ((True, [1, 1, 0.75, 0.75, 0.5, 0.5, 0.25, 0.25]), (False, [1] * 8)):
        agent = SimpleNamespace(num_epochs=2, num_minibatches=1, num_updates=4, anneal_lr=anneal)
        optimizer = optimizers.annealed_clipped_adam(agent, 1.0, 10.0)
        params, moves = jnp.zeros(2), []
        state = optimizer.init(params)
        for _ in range(8):
            updates, state = optimizer.update(g, state, params)
            params = optax.apply_updates(params, updates)
            moves.append(float(-updates[0]))
        np.testing.assert_allclose(moves, want, rtol=1e-4)


# ---------------------------------------------------------------- target networks


TARGET = {"w": jnp.array([0.0, 4.0]), "b": {"c": jnp.array(8.0)}}
ONLINE = {"w": jnp.array([1.0, 0.0]), "b": {"c": jnp.array(0.0)}}


def test_polyak_averages_leaf_by_leaf():
    new = optimizers.polyak(TARGET, ONLINE, 0.25)
    np.testing.assert_allclose(new["w"], [0.25, 3.0])
    np.testing.assert_allclose(new["b"]["c"], 6.0)
    copy = optimizers.polyak(TARGET, ONLINE, 1.0)
    jax.tree.map(np.testing.assert_array_equal, copy, ONLINE)


def test_periodic_polyak_updates_only_when_asked():
    update = jax.jit(lambda flag: optimizers.periodic_polyak(TARGET, ONLINE, 0.5, flag))
    jax.tree.map(np.testing.assert_array_equal, update(jnp.bool_(False)), TARGET)
    jax.tree.map(
        np.testing.assert_allclose, update(jnp.bool_(True)), optimizers.polyak(TARGET, ONLINE, 0.5)
    )
    np.testing.assert_allclose(update(jnp.bool_(True))["w"], [0.5, 2.0])
