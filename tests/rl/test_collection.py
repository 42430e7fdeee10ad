"""rl.core.collection: a rollout's PRNG keys, the scan whose small per-step outputs are stored as
one packed row, and the scan that runs only where a traced predicate holds (`scan_when`: the
gradient steps of a replay agent's phase, skipped before learning_starts)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.core import collection, episodes

# ---------------------------------------------------------------- rollout keys


def test_rollout_keys_split_one_action_key_and_one_key_per_env_for_every_step():
    key = jax.random.PRNGKey(3)
    act_keys, env_keys = collection.rollout_keys(key, 5, 3)
    assert act_keys.shape == (5, 2) and env_keys.shape == (5, 3, 2)
    for t, step_key in enumerate(jax.random.split(key, 5)):
        act_key, env_key = jax.random.split(step_key)
        np.testing.assert_array_equal(act_keys[t], act_key)
        np.testing.assert_array_equal(env_keys[t], jax.random.split(env_key, 3))
    every = np.concatenate([np.asarray(act_keys), np.asarray(env_keys).reshape(-1, 2)])
    assert len({tuple(k) for k in every.tolist()}) == 20


# ---------------------------------------------------------------- packed per-step outputs


def _mixed_step(carry, x):
    """A step whose outputs mix float32 (NaN and -0.0 included), int32, bool, uint8 and a leaf above
    PACKED_OUTPUT_MAX elements, so every packing path of `scan_packed_outputs` is taken."""
    total, count = carry
    out = {
        "obs": jnp.stack([x, -x, x * 0.0 - 0.0, jnp.where(x > 1.5, jnp.nan, x)]),
        "action": (x * 7).astype(jnp.int32) - 3,
        "done": x > 2.0,
        "flags": jnp.full((20,), x > 1.0),  # a narrow leaf too large for the uint32 block
        "byte": (x * 11).astype(jnp.uint8),
        "image": jnp.full((collection.PACKED_OUTPUT_MAX + 1,), x, jnp.float32),  # stacked as it is
        "nested": (x.astype(jnp.float16), {"int": jnp.arange(3) + count}),
    }
    return (total + x, count + 1), out


def _assert_same_bits(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(
            np.atleast_1d(np.asarray(g)).view(np.uint8), np.atleast_1d(np.asarray(w)).view(np.uint8)
        )  # bits: NaN, -0.0


@pytest.mark.parametrize("unroll", [1, 3])
def test_scan_packed_outputs_equals_lax_scan_bit_for_bit(unroll):
    xs = jnp.asarray([0.5, 1.25, 2.5, -1.0, 3.0], jnp.float32)
    carry = (jnp.float32(0.0), jnp.int32(0))
    want = jax.lax.scan(_mixed_step, carry, xs, unroll=unroll)
    got = jax.jit(lambda c, x: collection.scan_packed_outputs(_mixed_step, c, x, unroll=unroll))(
        carry, xs
    )
    _assert_same_bits(got, want)


def test_scan_packed_outputs_under_vmap_and_with_no_small_outputs():
    xs = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)  # [batch 3, steps 4]
    step = lambda c, x: (c + x, {"image": jnp.full((collection.PACKED_OUTPUT_MAX + 1,), x), "x": x})
    want = jax.vmap(lambda x: jax.lax.scan(step, 0.0, x))(xs)
    got = jax.vmap(lambda x: collection.scan_packed_outputs(step, 0.0, x))(xs)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(g, w)
    only_large = lambda c, x: (c, jnp.full((collection.PACKED_OUTPUT_MAX + 1,), x))
    got, want = (
        collection.scan_packed_outputs(only_large, 0.0, xs[0]),
        jax.lax.scan(only_large, 0.0, xs[0]),
    )
    np.testing.assert_array_equal(got[1], want[1])
    counter = lambda c, _: (c + 1, {"c": c, "twice": 2 * c})  # no xs: `length` steps
    got, want = (
        collection.scan_packed_outputs(counter, 0, None, length=5),
        jax.lax.scan(counter, 0, None, length=5),
    )
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(g, w)


# ---------------------------------------------------------------- scan_when


def _float_step(carry, x):
    """A step with a pytree carry and float32 [3], float16 and a nested float32 [2, 2] output."""
    total, count = carry
    out = {
        "vec": jnp.stack([x, total, x * total]),
        "half": x.astype(jnp.float16),
        "nested": ({"mat": jnp.full((2, 2), x) + count},),
    }
    return (total + x, count + 1), out


XS = jnp.asarray([0.5, 1.25, 2.5, -1.0], jnp.float32)
CARRY = (jnp.float32(1.0), jnp.int32(2))


@pytest.mark.parametrize("unroll", [1, 3])
def test_scan_when_true_is_lax_scan(unroll):
    want = jax.lax.scan(_float_step, CARRY, XS, unroll=unroll)
    for pred in (True, jnp.bool_(True)):
        _assert_same_bits(collection.scan_when(pred, _float_step, CARRY, XS, unroll=unroll), want)
    jitted = jax.jit(lambda p: collection.scan_when(p, _float_step, CARRY, XS, unroll=unroll))
    _assert_same_bits(jitted(jnp.bool_(True)), want)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
def test_scan_when_false_keeps_the_carry_and_fills_the_outputs_with_nan():
    """The carry comes back unchanged; every output has the shape and dtype the scan would give,
    stacked over the steps, and is NaN (an integer output, NaN cast, keeps its shape and dtype)."""

    def step(carry, x):
        carry_out, out = _float_step(carry, x)
        return carry_out, {**out, "int": jnp.arange(3) + carry[1]}

    want_shapes = jax.eval_shape(lambda: jax.lax.scan(step, CARRY, XS)[1])
    run = jax.jit(lambda p: collection.scan_when(p, step, CARRY, XS))
    carry, out = run(jnp.bool_(False))
    _assert_same_bits(carry, CARRY)
    assert jax.tree.structure(out) == jax.tree.structure(want_shapes)
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(want_shapes)):
        assert got.shape == want.shape and got.dtype == want.dtype
    assert out["vec"].shape == (4, 3) and out["nested"][0]["mat"].shape == (4, 2, 2)
    assert out["half"].dtype == jnp.float16 and out["int"].dtype == want_shapes["int"].dtype
    for leaf in (out["vec"], out["half"], out["nested"][0]["mat"]):
        assert np.isnan(np.asarray(leaf, np.float32)).all()


def test_scan_when_under_vmap_with_a_batched_pred():
    """vmapped over a batch of carries, inputs and predicates: where the predicate holds, that
    element's `lax.scan`; elsewhere its carry unchanged and NaN outputs."""
    preds = jnp.array([True, False, True])
    carries = (jnp.array([1.0, 2.0, 3.0]), jnp.array([0, 5, 7], jnp.int32))
    xs = jnp.stack([XS, 2 * XS, -XS])
    run = jax.jit(jax.vmap(lambda p, c, x: collection.scan_when(p, _float_step, c, x)))
    carry, out = run(preds, carries, xs)
    assert out["vec"].shape == (3, 4, 3)
    for i in range(3):
        element = jax.tree.map(lambda leaf: leaf[i], (carry, out))
        c_i = jax.tree.map(lambda leaf: leaf[i], carries)
        if preds[i]:
            want = jax.lax.scan(_float_step, c_i, xs[i])
            for g, w in zip(jax.tree.leaves(element), jax.tree.leaves(want)):
                np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32))
        else:
            _assert_same_bits(element[0], c_i)
            for leaf in jax.tree.leaves(element[1]):
                assert np.isnan(np.asarray(leaf, np.float32)).all()


def test_scan_gated_is_scan_when_for_a_step_that_applies_the_gate():
    """A step that leaves its carry unchanged where its gate is false: the same carry and outputs
    (NaN where false) as `scan_when` of the ungated step, for a true, a false and a batched gate."""

    def gated(carry, x, active):
        new, out = _float_step(carry, x)
        return jax.tree.map(lambda a, b: jnp.where(active, a, b), new, carry), out

    for pred in (jnp.bool_(True), jnp.bool_(False)):
        want = jax.jit(lambda p: collection.scan_when(p, _float_step, CARRY, XS))(pred)
        got = jax.jit(lambda p: collection.scan_gated(p, gated, CARRY, XS))(pred)
        _assert_same_bits(got, want)
    preds, carries = jnp.array([True, False]), jax.tree.map(lambda x: jnp.stack([x, x]), CARRY)
    run = lambda step: jax.jit(jax.vmap(step))(preds, carries)
    _assert_same_bits(
        run(lambda p, c: collection.scan_gated(p, gated, c, XS)),
        run(lambda p, c: collection.scan_when(p, _float_step, c, XS, branchless=True)),
    )


# ---------------------------------------------------------------- a replay phase: act, then train


def _toy_steps():
    """An env step that counts steps and ends an episode of return 1 and length 1 every step, and a
    gradient step that counts updates and returns (loss = updates so far, a uniform of its key)."""

    def env_step(carry, key):
        state, totals = carry
        info = {
            "episode_done": jnp.bool_(True),
            "episode_return": jnp.float32(1.0),
            "episode_length": jnp.int32(1),
        }
        return ({**state, "step": state["step"] + 1}, episodes.add_episodes(totals, info)), None

    def gradient_step(state, key):
        updates = state["updates"] + 1
        return {**state, "updates": updates}, {
            "loss": updates.astype(jnp.float32),
            "draw": jax.random.uniform(key),
        }

    return env_step, gradient_step


def _toy_phase(learning_starts, env_iterations=2, gradient_steps=3, unroll=1):
    """A replay agent's phase, jitted: `env_iterations` env steps, then `gradient_steps` gradient
    steps through `scan_when` once state["step"] >= learning_starts (NaN stats before)."""
    env_step, gradient_step = _toy_steps()

    def phase(carry, key):
        keys = jax.random.split(key, env_iterations + gradient_steps)
        (state, totals), _ = jax.lax.scan(
            env_step, carry, keys[:env_iterations], unroll=min(unroll, env_iterations)
        )
        learning = state["step"] >= learning_starts
        state, stats = collection.scan_when(
            learning,
            gradient_step,
            state,
            keys[env_iterations:],
            unroll=min(unroll, gradient_steps),
        )
        return (state, totals), stats

    return jax.jit(phase)


START = ({"step": jnp.int32(0), "updates": jnp.int32(0)}, episodes.no_episodes())


def test_phase_stats_are_nan_before_learning_starts_then_it_trains():
    phase = _toy_phase(learning_starts=4)
    # phase 1: 2 env steps (step 2 < 4): no gradient step, stats NaN with the gradient steps' shape
    carry, stats = phase(START, jax.random.PRNGKey(0))
    assert int(carry[0]["step"]) == 2 and int(carry[0]["updates"]) == 0
    assert stats["loss"].shape == (3,)
    assert np.isnan(stats["loss"]).all() and np.isnan(stats["draw"]).all()
    # phase 2: step 4 >= learning_starts: 3 gradient steps after the env steps, each with its key
    carry, stats = phase(carry, jax.random.PRNGKey(1))
    assert int(carry[0]["step"]) == 4 and int(carry[0]["updates"]) == 3
    np.testing.assert_array_equal(stats["loss"], [1.0, 2.0, 3.0])
    assert len(set(np.asarray(stats["draw"]).tolist())) == 3
    # phase 3: trains again, and the episode totals ran through every env step
    carry, stats = phase(carry, jax.random.PRNGKey(2))
    assert int(carry[0]["updates"]) == 6
    np.testing.assert_array_equal(stats["loss"], [4.0, 5.0, 6.0])
    assert int(carry[1].count) == 6 and float(carry[1].returns) == 6.0


def test_phase_with_learning_starts_zero_trains_from_the_first_phase():
    phase = _toy_phase(learning_starts=0, env_iterations=1, gradient_steps=2)
    carry, stats = phase(START, jax.random.PRNGKey(0))
    assert int(carry[0]["updates"]) == 2
    np.testing.assert_array_equal(stats["loss"], [1.0, 2.0])


def test_unrolled_phase_computes_the_same_as_the_rolled_one():
    rolled = _toy_phase(learning_starts=4, env_iterations=3, gradient_steps=4)
    unrolled = _toy_phase(learning_starts=4, env_iterations=3, gradient_steps=4, unroll=8)
    a, b = START, START
    for i in range(3):
        a, stats_a = rolled(a, jax.random.PRNGKey(i))
        b, stats_b = unrolled(b, jax.random.PRNGKey(i))
        _assert_same_bits((a, stats_a), (b, stats_b))  # NaN stats before learning equal NaN
    # phase 1 (step 3 < 4) skipped learning, phases 2 and 3 trained
    assert int(b[0]["updates"]) == 8
