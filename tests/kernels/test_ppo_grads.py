"""kernels.ppo_actor_critic_grads and its flat-vector form ppo_actor_critic_grads_flat: the fused
kernels (triton / interpret) against the plain-JAX reference (autodiff of the loss), under jit,
nested vmap and row chunking; the flat layouts; bad input errors.
The reference itself is checked against the PPO agent's own loss and network
in tests/rl/test_ppo.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels.ppo_grads as ppo_grads
from benchmarks import kernel_resources
from kernels import ppo_actor_critic_grads


def make_case(rng, m=40, d=4, h1=16, h2=24, a=3, lead=()):
    def arr(*shape, scale=0.5):
        return jnp.asarray(rng.normal(size=lead + shape).astype(np.float32) * scale)

    actor = (arr(d, h1), arr(h1), arr(h1, h2), arr(h2), arr(h2, a), arr(a))
    critic = (arr(d, h1), arr(h1), arr(h1, h2), arr(h2), arr(h2, 1), arr(1))
    obs = arr(m, d, scale=1.0)
    actions = jnp.asarray(rng.integers(0, a, lead + (m,)), jnp.int32)
    # behaviour log-probs near the current ones so that some ratios fall inside the clip range,
    # some outside
    old_log_probs = jnp.full(lead + (m,), -np.log(a), jnp.float32) + arr(m, scale=0.3)
    rows = (old_log_probs, arr(m), arr(m, scale=1.0), arr(m, scale=1.0))
    return (obs, actions, *rows, actor, critic)


def assert_close(got, want, rtol=2e-4, atol=2e-6):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape == w.shape
        scale = float(jnp.max(jnp.abs(w))) + 1e-6
        np.testing.assert_allclose(
            np.asarray(g), np.asarray(w), rtol=rtol, atol=atol + rtol * scale
        )


# Each (activation, clip_value_loss) pair is its own test, 3 drawn shapes each, and pytest-xdist
# spreads them (each shape compiles its own kernels: minutes on the GPU in all). The default suite
# runs two pairs that cover each activation and each value loss; `-m slow` adds the other two. The
# Triton-source backends only: backend="reference" is ppo_actor_critic_grads_reference itself,
# which this would compare with itself.
@pytest.mark.parametrize(
    "activation, clip_value_loss",
    [
        ("tanh", True),
        ("relu", False),
        pytest.param("tanh", False, marks=pytest.mark.slow),
        pytest.param("relu", True, marks=pytest.mark.slow),
    ],
)
@settings(max_examples=3, deadline=None)
@given(
    m=st.integers(1, 70),
    d=st.integers(1, 6),
    h1=st.sampled_from([8, 16, 20]),
    h2=st.sampled_from([8, 16, 33]),
    a=st.integers(2, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_the_reference(kernel_backend, activation, clip_value_loss, m, d, h1, h2, a, seed):
    case = make_case(np.random.default_rng(seed), m, d, h1, h2, a)
    hparams = (0.2, 0.15, 0.01, 0.5)
    kw = dict(activation=activation, clip_value_loss=clip_value_loss, dot_precision="ieee")
    got = ppo_actor_critic_grads(*case, *hparams, backend=kernel_backend, **kw)
    want = ppo_grads.ppo_actor_critic_grads_reference(*case, *hparams, **kw)
    assert_close(got, want)


def test_statistics_are_the_hand_computed_ones(backend):
    """Zero weights: uniform policy (entropy log A, ratio exp(log(1/A) - lp_old)), value 0."""
    rng = np.random.default_rng(1)
    obs, actions, lp_old, v_old, adv, targets, actor, critic = make_case(rng, m=20, a=4)
    actor = tuple(jnp.zeros_like(w) for w in actor)
    critic = tuple(jnp.zeros_like(w) for w in critic)
    _, _, stats = ppo_actor_critic_grads(
        obs,
        actions,
        lp_old,
        v_old,
        adv,
        targets,
        actor,
        critic,
        0.2,
        0.1,
        0.01,
        0.5,
        backend=backend,
    )
    ratio = np.exp(np.log(0.25) - np.asarray(lp_old, np.float64))
    a = np.asarray(adv, np.float64)
    policy_loss = -np.mean(np.minimum(ratio * a, np.clip(ratio, 0.8, 1.2) * a))
    v_clipped = np.asarray(v_old) + np.clip(0.0 - np.asarray(v_old), -0.1, 0.1)
    value_loss = 0.5 * np.mean(
        np.maximum(np.asarray(targets) ** 2, (v_clipped - np.asarray(targets)) ** 2)
    )
    np.testing.assert_allclose(float(stats["policy_loss"]), policy_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(stats["value_loss"]), value_loss, rtol=1e-5)
    np.testing.assert_allclose(float(stats["entropy"]), np.log(4), rtol=1e-6)
    np.testing.assert_allclose(
        float(stats["approx_kl"]), np.mean(ratio - 1 - np.log(ratio)), rtol=1e-4, atol=1e-7
    )
    np.testing.assert_allclose(
        float(stats["clip_fraction"]), np.mean(np.abs(ratio - 1) > 0.2), atol=1e-6
    )


def test_nested_vmap_under_jit_equals_a_loop(kernel_backend):
    """[2 settings, 3 seeds] folded into one launch; the hyperparameters vary over the outer axis
    only."""
    rng = np.random.default_rng(2)
    case = make_case(rng, m=24, lead=(2, 3))
    clip = jnp.array([0.1, 0.3], jnp.float32)
    f = lambda c, *x: ppo_actor_critic_grads(
        *x, c, 0.2, 0.02, 0.5, backend=kernel_backend, dot_precision="ieee"
    )
    batched = jax.jit(jax.vmap(jax.vmap(f, in_axes=(None,) + (0,) * 8), in_axes=(0,) + (0,) * 8))(
        clip, *case
    )
    for i in range(2):
        for j in range(3):
            one = jax.tree.map(lambda x: x[i, j], case)
            want = ppo_grads.ppo_actor_critic_grads_reference(
                *one, clip[i], 0.2, 0.02, 0.5, dot_precision="ieee"
            )
            assert_close(jax.tree.map(lambda x: x[i, j], batched), want)


def test_rows_split_over_programs_give_the_same_gradient(kernel_backend, monkeypatch):
    """A large minibatch is cut into row chunks whose partial gradients are summed."""
    rng = np.random.default_rng(3)
    case = make_case(rng, m=100)
    one_chunk = ppo_actor_critic_grads(
        *case, 0.2, 0.2, 0.01, 0.5, backend=kernel_backend, dot_precision="ieee"
    )
    monkeypatch.setattr(ppo_grads, "MIN_PROGRAMS", 10**6)
    assert ppo_grads._row_chunks(1, 100)[1] == 4
    ppo_grads._kernel_op.cache_clear()
    chunked = ppo_actor_critic_grads(
        *case, 0.2, 0.2, 0.01, 0.5, backend=kernel_backend, dot_precision="ieee"
    )
    ppo_grads._kernel_op.cache_clear()
    assert_close(chunked, one_chunk, rtol=1e-5)


def test_automatic_triton_sends_one_small_minibatch_to_xla():
    """Only an automatically chosen triton, one minibatch (no vmap or vmaps of size 1),
    below the row crossover."""
    from kernels.ppo_grads import AUTO_TRITON_MIN_ROWS_ONE_SEED as rows
    from kernels.ppo_grads import automatic_crossover

    assert automatic_crossover("triton", True, 1, rows - 1) == "reference"
    assert automatic_crossover("triton", True, 1, rows) == "triton"
    assert automatic_crossover("triton", True, 2, 128) == "triton"
    assert automatic_crossover("triton", False, 1, 128) == "triton"
    assert automatic_crossover("interpret", True, 1, 128) == "interpret"


def test_the_automatic_crossover_routes_by_the_vmapped_size(monkeypatch):
    """With the automatic choice resolving to triton: one minibatch (unbatched, or vmapped once)
    gives the reference's gradients without launching a kernel, two vmapped minibatches launch the
    kernels."""

    def no_launch(*args, **kwargs):
        raise AssertionError("a kernel was launched")

    monkeypatch.setattr(ppo_grads, "resolve_backend", lambda backend=None: "triton")
    monkeypatch.setattr(ppo_grads, "chosen_automatically", lambda backend=None: True)
    monkeypatch.setattr(ppo_grads, "launch", no_launch)
    ppo_grads._kernel_op.cache_clear()
    try:
        rng = np.random.default_rng(4)
        hparams = (0.2, 0.15, 0.01, 0.5)
        case = make_case(rng, m=40)
        want = ppo_grads.ppo_actor_critic_grads_reference(*case, *hparams)
        assert_close(ppo_actor_critic_grads(*case, *hparams), want, rtol=1e-6)
        one = jax.tree.map(lambda x: x[None], case)
        got = jax.jit(jax.vmap(lambda *x: ppo_actor_critic_grads(*x, *hparams)))(*one)
        assert_close(jax.tree.map(lambda x: x[0], got), want, rtol=1e-6)
        layout = ppo_grads.concatenated_layout(4, (16, 24), 3)
        params = ppo_grads.flatten(case[6], case[7], layout)
        grads, sq_norm, _ = ppo_grads.ppo_actor_critic_grads_flat(
            *case[:6], params, layout, *hparams
        )
        want_flat = ppo_grads.flatten(want[0], want[1], layout)
        assert_close(grads, want_flat, rtol=1e-6)
        np.testing.assert_allclose(float(sq_norm), float(jnp.sum(jnp.square(want_flat))), rtol=1e-5)
        two = make_case(rng, m=40, lead=(2,))
        with pytest.raises(AssertionError, match="launched"):
            jax.vmap(lambda *x: ppo_actor_critic_grads(*x, *hparams))(*two)
    finally:
        ppo_grads._kernel_op.cache_clear()


def test_bad_inputs_name_the_argument():
    rng = np.random.default_rng(4)
    obs, actions, lp, v, adv, tg, actor, critic = make_case(rng)
    hp = (0.2, 0.2, 0.01, 0.5)
    with pytest.raises(ValueError, match=r"actions must be an integer array of shape \(40,\)"):
        ppo_actor_critic_grads(obs, actions[:5], lp, v, adv, tg, actor, critic, *hp)
    with pytest.raises(ValueError, match=r"targets must have shape \(40,\)"):
        ppo_actor_critic_grads(obs, actions, lp, v, adv, tg[:3], actor, critic, *hp)
    bad_critic = (critic[0][:2],) + critic[1:]
    with pytest.raises(ValueError, match=r"critic\[0\] must have shape \(4, 16\)"):
        ppo_actor_critic_grads(obs, actions, lp, v, adv, tg, actor, bad_critic, *hp)
    wide = make_case(rng, h1=200)
    with pytest.raises(ValueError, match="hidden widths .* exceed"):
        ppo_actor_critic_grads(*wide, *hp)
    with pytest.raises(ValueError, match="activation must be one of"):
        ppo_actor_critic_grads(obs, actions, lp, v, adv, tg, actor, critic, *hp, activation="gelu")


def shuffled_layout(rng, d=4, h1=16, h2=24, a=3):
    """The twelve arrays in a random order (actor and critic interleaved), as ravel_pytree of a dict
    of layers might lay them out."""
    layout = ppo_grads.concatenated_layout(d, (h1, h2), a)
    shapes = sum(layout.shapes(), [])
    offsets, at = [0] * 12, 0
    for k in rng.permutation(12):
        offsets[k] = at
        at += int(np.prod(shapes[k]))
    return layout._replace(actor=tuple(offsets[:6]), critic=tuple(offsets[6:]))


@pytest.mark.parametrize("activation, clip_value_loss", [("tanh", True), ("relu", False)])
def test_the_flat_op_reads_and_writes_the_vector_at_the_layout_s_offsets(
    backend, activation, clip_value_loss
):
    """params [size] in a shuffled layout: the gradient comes back in the same layout, equal to the
    tuple reference's arrays placed there, and the squared norm is the sum of its squares."""
    rng = np.random.default_rng(11)
    *case, actor, critic = make_case(rng, m=50)
    layout = shuffled_layout(rng)
    params = ppo_grads.flatten(actor, critic, layout)
    hparams = (0.2, 0.15, 0.01, 0.5)
    kw = dict(activation=activation, clip_value_loss=clip_value_loss, dot_precision="ieee")
    grads, sq_norm, stats = ppo_grads.ppo_actor_critic_grads_flat(
        *case, params, layout, *hparams, backend=backend, **kw
    )
    g_actor, g_critic, want_stats = ppo_grads.ppo_actor_critic_grads_reference(
        *case, actor, critic, *hparams, **kw
    )
    want = np.zeros(layout.size, np.float32)
    for offsets, arrays in ((layout.actor, g_actor), (layout.critic, g_critic)):
        for off, g in zip(offsets, arrays):
            want[off : off + g.size] = np.ravel(g)
    assert_close((grads, stats), (jnp.asarray(want), want_stats))
    np.testing.assert_allclose(
        float(sq_norm), float(np.sum(want.astype(np.float64) ** 2)), rtol=1e-4
    )


# (relu under -m slow: the activations' kernels are compared one by one in the two tests above)
@pytest.mark.parametrize("activation", ["tanh", pytest.param("relu", marks=pytest.mark.slow)])
def test_the_flat_op_under_nested_vmap_and_row_chunks(kernel_backend, activation, monkeypatch):
    """[2, 3] minibatches folded into one launch, with one program per minibatch (squared norm from
    the programs' sums, padding included: exact only because the padded units stay 0) and with rows
    cut into chunks (squared norm of the summed gradient)."""
    rng = np.random.default_rng(12)
    *case, actor, critic = make_case(rng, m=100, lead=(2, 3))
    layout = shuffled_layout(rng)
    params = ppo_grads.flatten(actor, critic, layout)
    kw = dict(activation=activation, dot_precision="ieee")
    f = lambda *x: ppo_grads.ppo_actor_critic_grads_flat(
        *x[:6], x[6], layout, 0.2, 0.2, 0.01, 0.5, backend=kernel_backend, **kw
    )
    want = jax.vmap(
        jax.vmap(
            lambda *x: ppo_grads.ppo_actor_critic_grads_flat(
                *x[:6], x[6], layout, 0.2, 0.2, 0.01, 0.5, backend="reference", **kw
            )
        )
    )(*case, params)
    for min_programs, chunks in ((1, 1), (10**6, 4)):
        monkeypatch.setattr(ppo_grads, "MIN_PROGRAMS", min_programs)
        assert ppo_grads._row_chunks(6, 100)[1] == chunks
        ppo_grads._kernel_op.cache_clear()
        try:
            got = jax.jit(jax.vmap(jax.vmap(f)))(*case, params)
        finally:
            ppo_grads._kernel_op.cache_clear()
        assert_close(got, want, rtol=1e-4)


def test_bad_layouts_and_flat_params_are_named():
    rng = np.random.default_rng(13)
    *case, actor, critic = make_case(rng)
    layout = ppo_grads.concatenated_layout(4, (16, 24), 3)
    params = ppo_grads.flatten(actor, critic, layout)
    hp = (0.2, 0.2, 0.01, 0.5)
    flat = ppo_grads.ppo_actor_critic_grads_flat
    gap = layout._replace(critic=tuple(o + 1 for o in layout.critic), size=layout.size + 1)
    with pytest.raises(
        ValueError, match=r"critic\[0\] starts at \d+, but the arrays before it end at \d+"
    ):
        flat(*case, jnp.zeros(gap.size), gap, *hp)
    with pytest.raises(
        ValueError, match=r"the twelve arrays cover \d+ entries, the flat vector has \d+"
    ):
        flat(*case, jnp.zeros(layout.size + 2), layout._replace(size=layout.size + 2), *hp)
    with pytest.raises(ValueError, match=r"params must have shape \(\d+,\) \(the layout's size\)"):
        flat(*case, params[:-1], layout, *hp)
    with pytest.raises(ValueError, match=r"obs must have shape \(M, 5\)"):
        flat(
            *case,
            jnp.zeros(ppo_grads.concatenated_layout(5, (16, 24), 3).size),
            ppo_grads.concatenated_layout(5, (16, 24), 3),
            *hp,
        )
    with pytest.raises(ValueError, match=r"targets must have shape \(40,\)"):
        flat(*case[:5], case[5][:3], params, layout, *hp)
    with pytest.raises(ValueError, match=r"layout.actor must hold 6 offsets"):
        flat(*case, params, layout._replace(actor=layout.actor[:5]), *hp)
    with pytest.raises(ValueError, match=r"layout.hidden must be two widths"):
        flat(*case, params, layout._replace(hidden=(16,)), *hp)
    with pytest.raises(ValueError, match=r"layout.size must be a Python int \(a layout is static"):
        jax.jit(lambda size: flat(*case, params, layout._replace(size=size), *hp))(layout.size)
    listed = layout._replace(
        actor=list(layout.actor), hidden=list(layout.hidden)
    )  # e.g. read from a config: normalised
    assert_close(flat(*case, params, listed, *hp), flat(*case, params, layout, *hp), rtol=0)


def test_shared_memory_estimate_is_triton_s_request_on_an_h100():
    """The formula against the bytes Triton asked for on an H100 (tf32 products;
    benchmarks/RESULTS.md, "The fused PPO gradient"): exact where the kernel did not fit, and under
    the 227 KB limit where it ran."""
    for sizes, requested in (
        ((64, (128, 128), 64), 295_680),
        ((64, (128, 128), 32), 262_912),
        ((64, (128, 128), 16), 246_528),
    ):
        assert ppo_grads.shared_memory_estimate(*sizes) == requested
        assert "shared memory" in ppo_grads.too_big_for_shared_memory(*sizes)
    for ran in ((16, (128, 128), 16), (64, (64, 64), 64), (8, (128, 128), 4), (4, (120, 120), 2)):
        assert ppo_grads.too_big_for_shared_memory(*ran) is None


def test_programs_per_sm_by_each_limit():
    """Hand-computed sm_90 occupancy: 255 registers round to 256, 4 warps x 32 threads x 256 =
    32,768 of 65,536; 70,400 + 1,024 reserved bytes of shared memory go 3 times into 233,472."""
    assert kernel_resources.programs_per_sm(255, 70_400, 4) == {
        "registers": 2,
        "shared": 3,
        "warps": 16,
        "programs": 32,
        "fit": 2,
    }
    assert kernel_resources.programs_per_sm(128, 50_000, 4)["fit"] == 4
    assert (
        kernel_resources.programs_per_sm(201, 10_000, 8)["registers"] == 1
    )  # 208 x 256 threads = 53,248
    assert kernel_resources.programs_per_sm(32, 1_000, 1)["fit"] == 32


# the sizes nearest the limit on either side; (16, 128 x 128, 32) is one the formula under-counts
# (by 8 KB: `-m slow`). Triton 3.6.0 swept over every padded size within LIMITS gave the same
# decision at all 144.
@pytest.mark.parametrize(
    "obs_dim, hidden, actions",
    [
        (32, (128, 128), 32),
        pytest.param(16, (128, 128), 32, marks=pytest.mark.slow),
        (64, (128, 128), 16),
    ],
)
def test_fit_decision_is_triton_s_for_an_h100(obs_dim, hidden, actions):
    """`too_big_for_shared_memory` says a size fits exactly when the larger of the two kernels, as
    Triton compiles them for sm_90 (ahead of time, no GPU: benchmarks/kernel_resources.py), asks for
    no more than SHARED_MEMORY_BYTES."""
    pytest.importorskip("triton")
    requests = [
        compiled.metadata.shared
        for compiled in kernel_resources.compile_both((obs_dim, hidden, actions)).values()
    ]
    fits = max(requests) <= ppo_grads.SHARED_MEMORY_BYTES
    assert (ppo_grads.too_big_for_shared_memory(obs_dim, hidden, actions) is None) == fits, requests


def test_the_largest_networks_that_fit_run(backend):
    """Hidden 128 x 128 with the most features and actions measured to fit one program with tf32
    products (obs 16, 16 actions). (Every limit of kernels.ppo_grads.LIMITS at once fits with ieee
    products, measured once (benchmarks/RESULTS.md, "The fused PPO gradient"), but its FMA kernel
    takes two minutes to compile.)"""
    case = make_case(np.random.default_rng(7), m=64, d=16, h1=128, h2=128, a=16)
    hparams = (0.2, 0.15, 0.01, 0.5)
    got = ppo_actor_critic_grads(*case, *hparams, backend=backend)
    want = ppo_grads.ppo_actor_critic_grads_reference(*case, *hparams, dot_precision="ieee")
    tf32_products = (
        jax.default_backend() == "gpu"
    )  # the kernel's, and XLA's in the reference backend
    assert_close(got, want, rtol=2e-2 if tf32_products else 1e-3)


def test_sizes_beyond_shared_memory_are_refused_on_the_gpu(backend):
    """obs 64, hidden 128 x 128, 16 actions with tf32 products: one ValueError naming the sizes on
    the GPU (where the launch would fail), a result elsewhere (no shared memory to run out of)."""
    case = make_case(np.random.default_rng(8), m=32, d=64, h1=128, h2=128, a=16)
    hparams = (0.2, 0.15, 0.01, 0.5)
    if backend == "triton":
        with pytest.raises(
            ValueError,
            match=r"obs_dim 64, hidden \(128, 128\) and 16 actions need about 246,528 bytes",
        ):
            ppo_actor_critic_grads(*case, *hparams, backend=backend)
    else:
        assert np.all(
            np.isfinite(np.asarray(ppo_actor_critic_grads(*case, *hparams, backend=backend)[0][0]))
        )
