"""Batch renormalisation (rl.nn.batch_renorm) against a float64 NumPy transcription of Ioffe
(2017)'s definition: r and d clipping, the warm-up's plain batch normalisation, the running
statistics' update, r and d held out of the gradient, the inference branch, and the layer inside a
`StatefulNetwork` on Flax and Haiku (statistics updated in training, untouched in inference)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.nn import batch_renorm
from rl.nn.batch_renorm import D_MAX, EPS, R_MAX


def reference(x, mean, var, steps, momentum, warmup):
    """Float64 NumPy: (x_hat, mean', var', r, d) of the training branch."""
    x = np.asarray(x, np.float64)
    mu_b, var_b = x.mean(0), x.var(0)
    s_b, s = np.sqrt(var_b + EPS), np.sqrt(np.asarray(var, np.float64) + EPS)
    r = np.clip(s_b / s, 1 / R_MAX, R_MAX)
    d = np.clip((mu_b - mean) / s, -D_MAX, D_MAX)
    if steps < warmup:
        r, d = np.ones_like(r), np.zeros_like(d)
    x_hat = (x - mu_b) / s_b * r + d
    return x_hat, momentum * mean + (1 - momentum) * mu_b, momentum * var + (1 - momentum) * var_b


def stats_of(mean, var, steps):
    return {
        "mean": jnp.asarray(mean, jnp.float32),
        "var": jnp.asarray(var, jnp.float32),
        "steps": jnp.int32(steps),
    }


@pytest.mark.parametrize("steps, warmup", [(5, 3), (2, 3)], ids=["renorm", "warmup"])
def test_training_branch_matches_the_definition(steps, warmup):
    """Features chosen so that r and d hit both clips (a running variance far below and far above
    the batch's, a running mean far away) and one stays inside; in the warm-up r = 1, d = 0."""
    rng = np.random.default_rng(0)
    x = rng.normal([0.0, 3.0, -1.0, 0.5], [1.0, 0.2, 2.0, 1.0], size=(7, 4)).astype(np.float32)
    mean = np.array([0.1, -200.0, 30.0, 0.4])
    var = np.array([1.2, 100.0, 1e-4, 0.9])
    x_hat, new = batch_renorm.renorm_train(x, stats_of(mean, var, steps), 0.9, warmup)
    want, want_mean, want_var = reference(x, mean, var, steps, 0.9, warmup)
    np.testing.assert_allclose(x_hat, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(new["mean"], want_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new["var"], want_var, rtol=1e-5, atol=1e-6)
    assert int(new["steps"]) == steps + 1
    if steps >= warmup:  # the case exercises both clips of r and of d
        s_b, s = np.sqrt(x.var(0) + EPS), np.sqrt(var + EPS)
        raw_r, raw_d = s_b / s, (x.mean(0) - mean) / s
        assert raw_r[1] < 1 / R_MAX and raw_r[2] > R_MAX and 1 / R_MAX < raw_r[0] < R_MAX
        assert raw_d[1] > D_MAX and raw_d[2] < -D_MAX and abs(raw_d[0]) < D_MAX
    else:  # plain batch normalisation
        np.testing.assert_allclose(x_hat.mean(0), 0.0, atol=1e-5)


def test_r_and_d_are_held_out_of_the_gradient():
    """d/dx sum(c * x_hat) equals the gradient of batch normalisation scaled by the constant r."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(6, 3)), jnp.float32)
    c = jnp.asarray(rng.normal(size=(6, 3)), jnp.float32)
    stats = stats_of([0.3, -0.2, 0.1], [0.5, 2.0, 1.0], 10)
    grad = jax.grad(lambda x: jnp.sum(c * batch_renorm.renorm_train(x, stats, 0.99, 0)[0]))(x)
    s_b, s = jnp.sqrt(x.var(0) + EPS), jnp.sqrt(stats["var"] + EPS)
    r = jnp.clip(s_b / s, 1 / R_MAX, R_MAX)
    d = jnp.clip((x.mean(0) - stats["mean"]) / s, -D_MAX, D_MAX)
    fixed = lambda x: jnp.sum(c * ((x - x.mean(0)) / jnp.sqrt(x.var(0) + EPS) * r + d))
    np.testing.assert_allclose(grad, jax.grad(fixed)(x), rtol=1e-5, atol=1e-6)


def test_inference_branch_reads_the_running_statistics():
    x = np.array([[1.0, -2.0], [0.5, 4.0]], np.float32)
    stats = stats_of([0.2, 1.0], [4.0, 0.25], 7)
    want = (x - np.array([0.2, 1.0])) / np.sqrt(np.array([4.0, 0.25]) + EPS)
    np.testing.assert_allclose(batch_renorm.renorm_eval(x, stats), want, rtol=1e-6)


def suffix_values(stats, suffix):
    """The leaves of a network's statistics whose names end in `suffix`, in name order."""
    flat = jax.tree_util.tree_flatten_with_path(stats)[0]
    named = [(jax.tree_util.keystr(path), leaf) for path, leaf in flat]
    return [leaf for name, leaf in sorted(named) if name.rstrip("']").endswith(suffix)]


@pytest.mark.parametrize("backend", ["flax", "haiku"])
def test_layer_in_a_network_updates_its_statistics_only_in_training(backend):
    """One layer (gamma = 1, beta = 0 at first): its training pass gives the definition's x_hat
    and updated statistics; an inference pass reads them and leaves them as they are."""
    net = batch_renorm.build(
        lambda layers, x: batch_renorm.batch_renorm(layers, x, 0.9, 0), backend
    )
    x = np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32)
    params, stats = net.init(jax.random.PRNGKey(0), x)
    np.testing.assert_array_equal(suffix_values(stats, "mean")[0], 0.0)
    np.testing.assert_array_equal(suffix_values(stats, "var")[0], 1.0)
    y, trained = net.apply(params, stats, x, training=True)
    want, want_mean, want_var = reference(x, np.zeros(3), np.ones(3), 0, 0.9, 0)
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(suffix_values(trained, "mean")[0], want_mean, rtol=1e-5)
    np.testing.assert_allclose(suffix_values(trained, "var")[0], want_var, rtol=1e-5)
    assert int(suffix_values(trained, "steps")[0]) == 1
    y_eval, same = net.apply(params, trained, x)
    assert same is trained
    want_eval = batch_renorm.renorm_eval(x, stats_of(want_mean, want_var, 1))
    np.testing.assert_allclose(y_eval, want_eval, rtol=1e-5, atol=1e-6)


def test_crossq_torso_renormalises_the_input_and_every_hidden_layer():
    fn = lambda layers, x: batch_renorm.renorm_mlp(layers, x, (8, 6), "relu")
    net = batch_renorm.build(fn)
    params, stats = net.init(jax.random.PRNGKey(0), np.zeros((4, 3), np.float32))
    assert [v.shape for v in suffix_values(stats, "mean")] == [(3,), (8,), (6,)]
    out, _ = net.apply(params, stats, np.ones((4, 3), np.float32), training=True)
    assert out.shape == (4, 6)
