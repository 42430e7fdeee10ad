"""SimbaV2's torso (rl.nn.simbav2) against a float64 NumPy transcription of the paper's definitions
at small sizes: the l2 normalisation, the embedding, the residual LERP block and the features; the
hyperspherical weights start on the unit sphere, leave it under an Adam step and come back with the
projection (scalers and heads untouched); the Haiku backend builds the same function."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rl.nn import layers, simbav2


def normalize(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), simbav2.EPS)


def named(params):
    """{leaf name: float64 array} of a Flax network's params."""
    return {k: np.asarray(v, np.float64) for k, v in params["params"].items()}


def reference_torso(p, x, width, blocks):
    """simbav2.torso's docstring maths in float64 NumPy, reading the params by creation order:
    embedding (hyper_w0, scaler0), block b (hyper_w{2b+1}, scaler{2b+1}, hyper_w{2b+2},
    scaler{2b+2} = alpha), then (hyper_w{2B+1}, scaler{2B+1}). Returns (features, [z after the
    embedding and after each block])."""
    s = math.sqrt(2 / width)
    z = normalize(np.concatenate([x, np.full(x.shape[:-1] + (1,), simbav2.SHIFT)], -1))
    z = normalize((z @ p["hyper_w0"]) * p["scaler0"] * (s / s))
    zs = [z]
    for b in range(blocks):
        w1, w2 = p[f"hyper_w{2 * b + 1}"], p[f"hyper_w{2 * b + 2}"]
        inner = s / 2
        h = (z @ w1) * p[f"scaler{2 * b + 1}"] * (inner / inner)
        m = normalize((np.maximum(h, 0) + simbav2.EPS) @ w2)
        alpha = p[f"scaler{2 * b + 2}"] * ((1 / (blocks + 1)) / (1 / math.sqrt(width)))
        z = normalize(z + alpha * (m - z))
        zs.append(z)
    last = 2 * blocks + 1
    return (z @ p[f"hyper_w{last}"]) * p[f"scaler{last}"], zs


def torso_net(width, blocks, backend="flax"):
    return layers.build(lambda l, x: simbav2.torso(l, x, (width,) * blocks), backend)


def test_l2_normalize_and_its_floor():
    x = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
    np.testing.assert_allclose(simbav2.l2_normalize(x), [[0.6, 0.8], [0.0, 0.0]], rtol=1e-6)


def test_torso_and_residual_blocks_match_the_definition():
    width, blocks = 8, 2
    net = torso_net(width, blocks)
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    params = net.init(jax.random.PRNGKey(0), x)
    # perturb the scalers so that every multiplier of the definition matters
    params = jax.tree_util.tree_map_with_path(
        lambda path, v: v * (1.3 if "scaler" in jax.tree_util.keystr(path) else 1.0), params
    )
    p = named(params)
    assert sorted(k for k in p if k.startswith("hyper_w")) == [f"hyper_w{i}" for i in range(6)]
    want, zs = reference_torso(p, x.astype(np.float64), width, blocks)
    np.testing.assert_allclose(net.apply(params, x), want, rtol=1e-4, atol=1e-5)
    for z in zs:  # the embedding and each block's output lie on the unit sphere
        np.testing.assert_allclose(np.linalg.norm(z, axis=-1), 1.0, rtol=1e-6)
    # the residual interpolation is a real mix of z and the block's MLP: neither alone
    assert not np.allclose(zs[1], zs[0], atol=1e-3) and not np.allclose(zs[2], zs[1], atol=1e-3)


def test_initial_scalers_follow_the_reference_parameterisation():
    width, blocks = 16, 1
    p = named(torso_net(width, blocks).init(jax.random.PRNGKey(0), np.zeros((1, 3), np.float32)))
    np.testing.assert_allclose(p["scaler0"], math.sqrt(2 / width), rtol=1e-6)
    np.testing.assert_allclose(p["scaler1"], math.sqrt(2 / width) / 2, rtol=1e-6)
    np.testing.assert_allclose(p["scaler2"], 1 / math.sqrt(width), rtol=1e-6)  # alpha's scale
    np.testing.assert_allclose(p["scaler3"], 1.0)


def column_norms(params):
    return {
        jax.tree_util.keystr(path): np.linalg.norm(np.asarray(leaf), axis=0)
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
        if simbav2.is_hyper_weight(path)
    }


def test_projection_puts_the_weights_back_on_the_sphere_after_an_update():
    net = layers.build(
        lambda l, x: l.dense(simbav2.torso(l, x, (8,)), 1, scale=1.0)[..., 0], "flax"
    )
    x = np.random.default_rng(1).normal(size=(16, 3)).astype(np.float32)
    params = net.init(jax.random.PRNGKey(0), x)
    for norms in column_norms(params).values():
        np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
    loss = lambda p: jnp.mean(jnp.square(net.apply(p, x) - 1.0))
    tx = optax.adam(0.05)

    @jax.jit
    def step(params):
        updates, _ = tx.update(jax.grad(loss)(params), tx.init(params), params)
        return optax.apply_updates(params, updates)

    stepped = step(params)
    assert any(np.abs(n - 1.0).max() > 1e-3 for n in column_norms(stepped).values())
    projected = simbav2.project(stepped)
    for norms in column_norms(projected).values():
        np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
    # scalers and the head's dense layer are left as the step made them
    for path, leaf in jax.tree_util.tree_flatten_with_path(projected)[0]:
        if not simbav2.is_hyper_weight(path):
            before = dict(jax.tree_util.tree_flatten_with_path(stepped)[0])[path]
            np.testing.assert_array_equal(leaf, before)


@pytest.mark.parametrize("backend", ["haiku"])
def test_haiku_builds_the_same_function(backend):
    x = np.random.default_rng(2).normal(size=(4, 3)).astype(np.float32)
    flax_net, other = torso_net(8, 1), torso_net(8, 1, backend)
    flax_params = flax_net.init(jax.random.PRNGKey(0), x)
    other_params = other.init(jax.random.PRNGKey(0), x)
    (module,) = other_params.values()
    assert sorted(module) == sorted(flax_params["params"])
    mapped = {name: {k: flax_params["params"][k] for k in module} for name in other_params}
    np.testing.assert_allclose(
        other.apply(mapped, x), flax_net.apply(flax_params, x), rtol=1e-5, atol=1e-6
    )
    assert set(column_norms(other_params)) and all(
        np.allclose(n, 1.0, rtol=1e-5) for n in column_norms(other_params).values()
    )
