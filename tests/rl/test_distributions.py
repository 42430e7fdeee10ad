"""The action distributions of rl.nn.networks against NumPy references in float64: each
distribution's sample (the formula with the same key, and its frequencies or moments over many
draws), log_prob_entropy (log-softmax, the Gaussian's closed form, the change of variables through
tanh), mode and env_action; and the objects pass through jit and vmap as pytrees (the same numbers,
up to float rounding under jit)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.nn import networks

RNG = np.random.default_rng(0)
LOGITS = RNG.normal(size=(6, 4)) * 2.0  # float64 references; the distributions see float32
MEAN, LOG_STD = RNG.normal(size=(6, 3)), RNG.normal(size=(6, 3)) * 0.5


def f32(x):
    return jnp.asarray(x, jnp.float32)


def log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def gaussian_log_density(x, mean, log_std):
    """log N(x; mean, exp(log_std)^2) per coordinate."""
    return -0.5 * ((x - mean) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi)


# ---------------------------------------------------------------- Categorical


@pytest.mark.parametrize("backend", [None, "reference"])
def test_categorical_log_prob_entropy_is_the_log_softmax(backend):
    pi = networks.Categorical.from_head(f32(LOGITS))
    actions = np.array([0, 3, 1, 2, 2, 0])
    log_prob, entropy = pi.log_prob_entropy(jnp.asarray(actions, jnp.int32), backend)
    log_p = log_softmax(LOGITS)
    np.testing.assert_allclose(log_prob, log_p[np.arange(6), actions], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(entropy, -(np.exp(log_p) * log_p).sum(-1), rtol=1e-5, atol=1e-6)


def test_categorical_by_hand():
    """pi = (1/4, 3/4): log pi(1) = log 3/4, H = -(1/4 log 1/4 + 3/4 log 3/4)."""
    pi = networks.Categorical.from_head(f32([[0.0, math.log(3.0)]]))
    log_prob, entropy = pi.log_prob_entropy(jnp.array([1], jnp.int32))
    np.testing.assert_allclose(log_prob, [math.log(0.75)], rtol=1e-6)
    # float32 (the Triton kernel on the GPU rounds its last bit differently from XLA's)
    np.testing.assert_allclose(
        entropy, [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))], rtol=1e-6
    )


def test_categorical_samples_follow_the_softmax():
    """Frequencies of 200,000 draws per row within 4 standard errors of softmax(logits)."""
    n = 200_000
    pi = networks.Categorical.from_head(jnp.broadcast_to(f32(LOGITS[:2]), (n, 2, 4)))
    actions = np.asarray(pi.sample(jax.random.PRNGKey(0)))
    assert actions.shape == (n, 2) and actions.dtype == np.int32
    probs = np.exp(log_softmax(LOGITS[:2]))
    for row in range(2):
        freq = np.bincount(actions[:, row], minlength=4) / n
        tolerance = 4 * np.sqrt(probs[row] * (1 - probs[row]) / n) + 1e-4
        assert np.all(np.abs(freq - probs[row]) <= tolerance), (freq, probs[row])


def test_categorical_mode_is_the_first_argmax_and_the_env_gets_the_action():
    pi = networks.Categorical.from_head(f32([[0.0, 2.0, 2.0], [5.0, -1.0, 0.0]]))
    np.testing.assert_array_equal(pi.mode(), [1, 0])
    assert pi.mode().dtype == jnp.int32
    action = jnp.array([2, 1], jnp.int32)
    assert pi.env_action(action) is action


# ---------------------------------------------------------------- Gaussian


def test_gaussian_log_prob_entropy_is_the_closed_form():
    pi = networks.Gaussian.from_head((f32(MEAN), f32(LOG_STD)))
    actions = RNG.normal(size=MEAN.shape) * 2.0
    log_prob, entropy = pi.log_prob_entropy(f32(actions))
    want = gaussian_log_density(actions, MEAN, LOG_STD).sum(-1)
    np.testing.assert_allclose(log_prob, want, rtol=1e-5, atol=1e-5)
    want_entropy = (LOG_STD + 0.5 * np.log(2 * np.pi * np.e)).sum(-1)
    np.testing.assert_allclose(entropy, want_entropy, rtol=1e-5, atol=1e-6)


def test_gaussian_sample_is_mean_plus_scaled_noise_and_has_its_moments():
    key = jax.random.PRNGKey(1)
    pi = networks.Gaussian.from_head((f32(MEAN), f32(LOG_STD)))
    eps = np.asarray(jax.random.normal(key, MEAN.shape), np.float64)
    np.testing.assert_allclose(pi.sample(key), MEAN + np.exp(LOG_STD) * eps, rtol=1e-5, atol=1e-6)
    n = 100_000
    many = networks.Gaussian(*(jnp.broadcast_to(f32(x[0]), (n, 3)) for x in (MEAN, LOG_STD)))
    draws = np.asarray(many.sample(key), np.float64)
    std = np.exp(LOG_STD[0])
    assert np.all(np.abs(draws.mean(0) - MEAN[0]) <= 5 * std / np.sqrt(n)), draws.mean(0)
    np.testing.assert_allclose(draws.std(0), std, rtol=0.02)


def test_gaussian_mode_is_the_mean_and_the_env_gets_the_action():
    pi = networks.Gaussian.from_head((f32(MEAN), f32(LOG_STD)))
    np.testing.assert_array_equal(pi.mode(), f32(MEAN))
    action = f32(MEAN) + 3.0
    assert pi.env_action(action) is action


# ---------------------------------------------------------------- TanhGaussian


def test_tanh_gaussian_scores_the_pre_squash_sample_by_the_change_of_variables():
    """log pi(tanh u) = sum_j log N(u_j) - log(1 - tanh(u_j)^2); H is the one-sample estimate
    sum_j log sigma_j + log(2 pi e) / 2 + log(1 - tanh(u_j)^2)."""
    pi = networks.TanhGaussian.from_head((f32(MEAN), f32(LOG_STD)))
    u = RNG.normal(size=MEAN.shape) * 1.5
    log_prob, entropy = pi.log_prob_entropy(f32(u))
    log_jacobian = np.log1p(-(np.tanh(u) ** 2))
    want = (gaussian_log_density(u, MEAN, LOG_STD) - log_jacobian).sum(-1)
    np.testing.assert_allclose(log_prob, want, rtol=1e-5, atol=1e-4)
    want_entropy = (LOG_STD + 0.5 * np.log(2 * np.pi * np.e) + log_jacobian).sum(-1)
    np.testing.assert_allclose(entropy, want_entropy, rtol=1e-5, atol=1e-4)


def test_tanh_gaussian_samples_before_the_squash_and_sends_tanh():
    key = jax.random.PRNGKey(2)
    pi = networks.TanhGaussian.from_head((f32(MEAN), f32(LOG_STD)))
    gaussian = networks.Gaussian.from_head((f32(MEAN), f32(LOG_STD)))
    u = pi.sample(key)
    np.testing.assert_array_equal(u, gaussian.sample(key))  # the pre-squash sample
    np.testing.assert_allclose(pi.env_action(u), np.tanh(np.asarray(u, np.float64)), rtol=1e-6)
    assert np.all(np.abs(np.asarray(pi.env_action(f32(MEAN) * 50))) <= 1.0)
    np.testing.assert_array_equal(pi.mode(), f32(MEAN))  # the pre-squash mean
    np.testing.assert_allclose(pi.env_action(pi.mode()), np.tanh(MEAN), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- as pytrees


@pytest.mark.parametrize(
    "distribution, head",
    [
        (networks.Categorical, f32(LOGITS)),
        (networks.Gaussian, (f32(MEAN), f32(LOG_STD))),
        (networks.TanhGaussian, (f32(MEAN), f32(LOG_STD))),
    ],
)
def test_distributions_pass_through_jit_and_vmap(distribution, head):
    pi = distribution.from_head(head)
    keys = jax.random.split(jax.random.PRNGKey(3), 6)
    sample_rows = jax.jit(jax.vmap(lambda pi, key: pi.sample(key)))(pi, keys)
    for row in range(6):
        one = jax.tree.map(lambda x: x[row], pi)
        np.testing.assert_allclose(sample_rows[row], one.sample(keys[row]), rtol=1e-6, atol=1e-6)
    mode = jax.jit(lambda pi: pi.mode())(pi)
    np.testing.assert_allclose(mode, pi.mode(), rtol=1e-6)
