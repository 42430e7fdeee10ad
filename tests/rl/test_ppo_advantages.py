"""PPO's advantage schemes: GAE within `agent.gae_horizon` segments, advantages recomputed before
every epoch (`agent.recompute_advantages`) and computed in every minibatch over whole segments
(`agent.minibatch_advantages`), each against GAE run by hand or the per-update path.
(Bad values of these keys: tests/rl/test_ppo.py.)"""

import functools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_ppo import make_config

from rl.agents import ppo, ppo_variants
from rl.config import hyperparams
from rl.core import losses


def test_gae_horizon_equals_gae_run_on_each_segment_alone():
    """With agent.gae_horizon = 4 on a 12-step rollout, the advantages and targets are those of
    truncation-aware GAE run on steps 0-3, 4-7 and 8-11 as three separate rollouts (each segment's
    last step bootstrapping from V(final_obs)), episode ends inside the segments kept; 0 leaves the
    whole-rollout GAE, whose advantages at a segment's end look past it."""
    rng = np.random.default_rng(3)
    T, N = 12, 5
    r, v, nv = (jnp.asarray(rng.normal(size=(T, N)), jnp.float32) for _ in range(3))
    term, trunc = (jnp.asarray(rng.random((T, N)) < 0.15) for _ in range(2))
    gae = lambda sl, cuts: losses.truncation_aware_gae(
        r[sl], v[sl], nv[sl], term[sl], cuts, 0.97, 0.95, backend="reference"
    )
    cut = ppo.gae_cuts(make_config(num_steps=12, total_steps=960, gae_horizon=4).agent, trunc)
    np.testing.assert_array_equal(
        np.asarray(cut) & ~np.asarray(trunc), np.asarray(~trunc) & (np.arange(T)[:, None] % 4 == 3)
    )
    segmented = gae(slice(None), cut)
    for start in (0, 4, 8):
        alone = gae(slice(start, start + 4), trunc[start : start + 4])
        for a, b in zip(segmented, alone):
            np.testing.assert_allclose(a[start : start + 4], b, rtol=1e-6, atol=1e-6)
    assert ppo.gae_cuts(make_config().agent, trunc) is trunc
    whole = gae(slice(None), trunc)
    assert not np.allclose(whole[0][3], segmented[0][3])


def test_gae_horizon_changes_the_run_and_keeps_it_finite():
    key = jax.random.PRNGKey(0)
    cut, whole = runs(key, gae_horizon=8)(), runs(key)()
    assert np.isfinite(np.asarray(cut["value_loss"])).all()
    assert not np.allclose(cut["value_loss"], whole["value_loss"])


def runs(key, **agent):
    """`run(**hparams) -> metrics` of `make_config(**agent)`'s program from `key`, compiled once
    per module: sweepable hyperparameters such as lr are arguments of the compiled program (as in a
    sweep), so runs that differ only in them share one compile, and so do tests that run the same
    settings."""
    config = make_config(**agent)
    train, defaults = compiled_train(tuple(sorted(agent.items()))), hyperparams(config.agent)
    return lambda **h: train(key, {**defaults, **{k: jnp.float32(v) for k, v in h.items()}})[1]


@functools.cache
def compiled_train(agent: tuple):
    return jax.jit(ppo.make_train(make_config(**dict(agent))))


def test_recompute_advantages_recomputes_from_the_current_network():
    """With a step size so small that Adam leaves the network unchanged, recomputing the advantages
    before each epoch gives the run without it; with a real step size the runs differ (the later
    epochs learn from the updated critic's values), and one epoch has nothing to recompute."""
    key = jax.random.PRNGKey(0)
    recompute, plain = runs(key, recompute_advantages=True), runs(key)
    frozen = recompute(lr=1e-30), plain(lr=1e-30)
    for name in ("value_loss", "policy_loss", "approx_kl"):
        np.testing.assert_allclose(frozen[0][name], frozen[1][name], rtol=1e-5, atol=1e-7)
    assert not np.allclose(recompute()["value_loss"], plain()["value_loss"])
    for a, b in zip(
        jax.tree.leaves(runs(key, num_epochs=1, recompute_advantages=True)()),
        jax.tree.leaves(runs(key, num_epochs=1)()),
    ):
        np.testing.assert_array_equal(a, b)


def test_segments_hold_consecutive_steps_of_one_env():
    t, n, h = 6, 3, 2
    x = jnp.arange(t * n).reshape(t, n)  # x[t, n] = t n_envs + n
    seg = np.asarray(ppo_variants.segments(x, h))
    assert seg.shape == (t // h * n, h)
    for k in range(t // h):
        for env in range(n):
            np.testing.assert_array_equal(
                seg[k * n + env], [(k * h + i) * n + env for i in range(h)]
            )
    assert ppo_variants.segments(jnp.zeros((t, n, 4, 5)), h).shape == (t // h * n, h, 4, 5)


def setup_and_rollout(config, seed=0):
    """The agent's Setup on the reference kernels, fresh state, and one rollout from it."""
    s = ppo.make_setup(config)._replace(backend="reference")
    hparams = hyperparams(config.agent)
    state = ppo.init_state(s, jax.random.PRNGKey(seed), hparams)
    _, traj, _ = jax.jit(partial(ppo.rollout, s))(
        state.params, state.envs, jax.random.PRNGKey(seed + 1)
    )
    return s, hparams, state.params, traj


@pytest.mark.parametrize(
    "env_id, clip_value_loss, normalize_advantages",
    [("CartPole-v1", True, True), ("Pendulum-v1", False, False)],
)
def test_minibatch_advantages_loss_equals_the_loss_on_precomputed_advantages(
    env_id, clip_value_loss, normalize_advantages, full_precision_matmuls
):
    """A minibatch of whole segments, whose loss computes V, GAE within each segment and the targets
    from the params it is given, has the loss and gradient of the same transitions with advantages
    precomputed at those params by the per-update path (`learn_batch` with the same gae_horizon):
    segment k N + n is steps kH..kH+H-1 of env n, flat rows t N + n. The rollout's end flags are
    replaced by random terminations and truncations, so both kinds fall inside and at segment
    ends."""
    config = make_config(
        env_id,
        num_steps=40,
        total_steps=400,
        num_envs=5,
        gae_horizon=4,
        minibatch_advantages=True,
        clip_value_loss=clip_value_loss,
        normalize_advantages=normalize_advantages,
        num_minibatches=1,
    )
    s, hparams, params, traj = setup_and_rollout(config)
    rng = np.random.default_rng(7)
    terminated = rng.random(traj.terminated.shape) < 0.1
    truncated = ~terminated & (rng.random(traj.truncated.shape) < 0.1)
    traj = traj._replace(terminated=jnp.asarray(terminated), truncated=jnp.asarray(truncated))
    seg = jax.jit(partial(ppo_variants.segment_batch, s))(hparams, params, traj)
    flat = jax.jit(partial(ppo.learn_batch, s))(hparams, params, traj)
    n, h = config.agent.num_envs, config.agent.gae_horizon
    ends = np.flatnonzero(
        np.asarray(seg.terminated | seg.truncated).any(axis=1)
    )  # segments with an episode end
    assert np.asarray(seg.truncated[ends[:3]]).any() and np.asarray(seg.terminated[ends[:3]]).any()
    rows = np.unique(np.concatenate([ends[:3], [0, 4, 7, 13, 49]]))  # of the 50 segments
    flat_rows = np.concatenate([[(r // n * h + i) * n + r % n for i in range(h)] for r in rows])
    seg_loss = lambda p: ppo.segment_minibatch_loss(
        s, hparams, p, jax.tree.map(lambda x: x[rows], seg)
    )
    flat_loss = lambda p: ppo.minibatch_loss(
        s, hparams, p, jax.tree.map(lambda x: x[flat_rows], flat)
    )
    (l_seg, st_seg), g_seg = jax.jit(jax.value_and_grad(seg_loss, has_aux=True))(params)
    (l_flat, st_flat), g_flat = jax.jit(jax.value_and_grad(flat_loss, has_aux=True))(params)
    np.testing.assert_allclose(l_seg, l_flat, rtol=1e-5, atol=1e-6)
    for name in st_flat:
        np.testing.assert_allclose(st_seg[name], st_flat[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for a, b in zip(jax.tree.leaves(g_seg), jax.tree.leaves(g_flat)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_minibatch_advantages_with_a_frozen_network_average_to_the_per_update_run(
    full_precision_matmuls,
):
    """With a step size so small that Adam leaves the network unchanged, every minibatch computes
    the targets the per-update path computes once, so the update's mean value loss (a mean over
    equal-sized minibatches of all transitions) is the per-update run's; entropy, KL and the
    (normalised-advantage) policy loss are checked alongside, though a frozen network makes them
    equal on any path. With a real step size the runs differ, each later minibatch scoring against
    the network its predecessors trained. Both sides use autodiff (the fused kernel computes its
    products at TF32 on the GPU)."""
    key = jax.random.PRNGKey(0)
    minibatch, plain = (
        runs(key, gae_horizon=8, fused_update=False, minibatch_advantages=True),
        runs(key, gae_horizon=8, fused_update=False),
    )
    frozen = minibatch(lr=1e-30), plain(lr=1e-30)
    for name in ("value_loss", "entropy", "approx_kl", "policy_loss"):
        np.testing.assert_allclose(
            frozen[0][name], frozen[1][name], rtol=1e-5, atol=1e-6, err_msg=name
        )
    learning = minibatch()
    assert np.isfinite(np.asarray(learning["value_loss"])).all()
    assert not np.allclose(learning["value_loss"], plain()["value_loss"])
    recompute = runs(key, gae_horizon=8, fused_update=False, recompute_advantages=True)
    assert not np.allclose(learning["value_loss"], recompute()["value_loss"])


def test_minibatch_advantages_take_the_autodiff_gradient():
    assert "agent.minibatch_advantages" in ppo_variants.fused_update_unfit_reason(
        make_config(gae_horizon=8, minibatch_advantages=True)
    )
    assert ppo_variants.fused_update_unfit_reason(make_config(gae_horizon=8)) is None
