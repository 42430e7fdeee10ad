"""PPO's continuous-control options (Brax-style): the tanh-squashed Gaussian policy
(`agent.continuous_policy: tanh_gaussian`), running observation normalisation
(`agent.normalize_obs`) and a critic torso of its own widths (`agent.critic_hidden`). The pieces are
checked against NumPy by hand and by Monte Carlo, the agent by short runs."""

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.agents import ppo, ppo_variants
from rl.config import build_config
from rl.config.parsing import ConfigError
from rl.core import environment, losses, observation_norm
from rl.nn import layers, networks, param_layout


def make_config(env_id="Pendulum-v1", network=None, **agent):
    base = dict(
        name="ppo",
        total_steps=1024,
        num_envs=4,
        num_steps=32,
        num_epochs=2,
        num_minibatches=2,
        log_interval=2,
    )
    base.update(agent)
    base["network"] = {"hidden": [16, 16], **(network or {})}
    return build_config({"env": {"id": env_id}, "agent": base})


# ---------------------------------------------------------------- the tanh Gaussian


@settings(max_examples=30, deadline=None)
@given(st.floats(-2.0, 2.0), st.floats(-1.5, 0.5), st.floats(-3.0, 3.0))
def test_tanh_gaussian_log_prob_is_the_change_of_variables(mu, log_std, u):
    sigma = math.exp(log_std)
    expected = (
        -0.5 * ((u - mu) / sigma) ** 2
        - log_std
        - 0.5 * math.log(2 * math.pi)
        - math.log(1.0 - math.tanh(u) ** 2)
    )
    log_prob, entropy = losses.tanh_gaussian_log_prob_entropy(
        jnp.array([mu]), jnp.array([log_std]), jnp.array([u])
    )
    np.testing.assert_allclose(float(log_prob), expected, rtol=1e-5, atol=1e-5)
    gaussian_entropy = log_std + 0.5 * math.log(2 * math.pi * math.e)
    np.testing.assert_allclose(
        float(entropy), gaussian_entropy + math.log(1.0 - math.tanh(u) ** 2), rtol=1e-5, atol=1e-5
    )


def test_tanh_gaussian_entropy_estimate_averages_to_the_true_entropy():
    """E_u[estimate] over samples u of the policy = H[tanh(U)], the latter by quadrature of
    -p_Y log p_Y on (-1, 1) in float64."""
    mu, log_std = 0.4, -0.3
    sigma = math.exp(log_std)
    u = mu + sigma * np.random.default_rng(0).standard_normal(200_000)
    _, estimates = jax.vmap(
        lambda x: losses.tanh_gaussian_log_prob_entropy(
            jnp.array([mu]), jnp.array([log_std]), x[None]
        )
    )(jnp.asarray(u, jnp.float32))
    grid = (
        np.linspace(-12.0, 12.0, 400_001) * sigma + mu
    )  # integrate over u: H[Y] = -E_u[log p_Y(tanh u)]
    p_u = np.exp(-0.5 * ((grid - mu) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
    log_p_y = np.log(p_u) - np.log1p(-(np.tanh(grid) ** 2) + 0.0)
    true_entropy = -np.trapezoid(p_u * log_p_y, grid)
    assert abs(float(np.mean(estimates)) - true_entropy) < 5e-3, (
        float(np.mean(estimates)),
        true_entropy,
    )


def test_tanh_gaussian_entropy_gradient_is_reparameterised():
    """d/dmu log(1 - tanh(u')^2) = -2 tanh(u) and d/dlog_std = 1 - 2 tanh(u) eps sigma,
    eps = (u - mu) / sigma."""
    mu, log_std, u = 0.3, -0.5, 1.1
    grad = jax.grad(
        lambda m, s: losses.tanh_gaussian_log_prob_entropy(m[None], s[None], jnp.array([u]))[1],
        argnums=(0, 1),
    )(jnp.float32(mu), jnp.float32(log_std))
    t = math.tanh(u)
    np.testing.assert_allclose(float(grad[0]), -2 * t, rtol=1e-5)
    np.testing.assert_allclose(float(grad[1]), 1.0 - 2 * t * (u - mu), rtol=1e-5)


def test_tanh_gaussian_head_scale_is_softplus_plus_min_std():
    net = layers.build(
        networks.with_head(lambda layers, x: x, networks.tanh_gaussian_policy_head(3)), "flax"
    )
    params = net.init(jax.random.PRNGKey(0), jnp.zeros(5))
    x = jax.random.normal(jax.random.PRNGKey(1), (7, 5))
    mean, log_std = net.apply(params, x)
    kernel, bias = param_layout.dense_layers(params)[0]
    raw = np.asarray(x) @ np.asarray(kernel) + np.asarray(bias)
    np.testing.assert_allclose(mean, raw[:, :3], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.exp(log_std), np.log1p(np.exp(raw[:, 3:])) + 0.001, rtol=1e-5)


def test_tanh_gaussian_policy_sends_tanh_of_the_stored_sample():
    head = (jnp.array([[0.5, -2.0]]), jnp.array([[0.0, 1.0]]))
    pi = networks.TanhGaussian.from_head(head)
    u = pi.sample(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(pi.env_action(u), jnp.tanh(u))
    np.testing.assert_array_equal(networks.Gaussian.from_head(head).env_action(u), u)
    np.testing.assert_array_equal(pi.mode(), head[0])


# ---------------------------------------------------------------- observation statistics


def test_observation_stats_are_the_mean_and_variance_of_everything_seen():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, (5, 4, 3)).astype(np.float32) for _ in range(3)]
    stats = observation_norm.initial_observation_stats((3,))
    for batch in batches:
        stats = observation_norm.update_observation_stats(stats, jnp.asarray(batch), (3,))
    seen = np.concatenate([b.reshape(-1, 3) for b in batches]).astype(np.float64)
    np.testing.assert_allclose(
        stats["mean"], seen.mean(0), rtol=1e-4, atol=1e-4
    )  # the 1e-4 prior count barely weighs
    np.testing.assert_allclose(stats["var"], seen.var(0), rtol=1e-3)
    out = observation_norm.normalize_observation(jnp.asarray(batches[0]), stats)
    np.testing.assert_allclose(
        out,
        np.clip((batches[0] - stats["mean"]) / np.sqrt(stats["var"] + 1e-8), -10, 10),
        rtol=1e-5,
        atol=1e-5,
    )


def test_observation_stats_are_per_channel_for_images():
    rng = np.random.default_rng(1)
    images = rng.uniform(0, 1, (6, 10, 10, 4)).astype(np.float32) * np.array(
        [1, 2, 3, 4], np.float32
    )
    stats = observation_norm.update_observation_stats(
        observation_norm.initial_observation_stats((10, 10, 4)), jnp.asarray(images), (10, 10, 4)
    )
    assert stats["mean"].shape == (4,)
    np.testing.assert_allclose(stats["mean"], images.reshape(-1, 4).mean(0), rtol=1e-4)
    np.testing.assert_allclose(stats["var"], images.reshape(-1, 4).var(0), rtol=1e-3)


# ---------------------------------------------------------------- the agent


def test_ppo_with_normalised_observations_keeps_the_statistics_of_every_rollout_in_its_params():
    config = make_config(total_steps=1024, normalize_obs=True, eval_envs=2)  # 8 updates of 4 x 32
    state, metrics = jax.jit(ppo.make_train(config))(jax.random.PRNGKey(0))
    stats = state.params["obs_stats"]
    np.testing.assert_allclose(float(stats["count"]), 1024 + 1e-4, rtol=1e-6)
    # Pendulum's observation is (cos, sin, angular velocity): bounded, the cos/sin means in [-1, 1]
    assert np.all(np.abs(np.asarray(stats["mean"][:2])) <= 1.0) and np.all(
        np.asarray(stats["var"]) > 0
    )
    assert np.all(np.isfinite(metrics["eval_return"]))
    obs = jnp.array([[1.0, 0.0, 0.5]])
    policy = ppo.make_policy(config)
    net, _ = ppo.make_network(config.agent, *environment.make_env(config))
    mean = net.apply(state.params["network"], observation_norm.normalize_observation(obs, stats))[
        0
    ][0]
    np.testing.assert_allclose(
        policy(state.params, obs, None),
        np.clip(np.asarray(mean), -1, 1) * 2.0,
        rtol=1e-5,
        atol=1e-6,
    )


def test_obs_clip_bounds_the_normalised_observation_or_leaves_it_whole():
    """agent.obs_clip c: the network reads clip((obs - mean) / sd, -c, c); null: the unclipped value
        (Brax's normaliser); without agent.normalize_obs, the raw observation, and an obs_clip other
    than the default is an error."""
    stats = {"mean": jnp.zeros(3), "var": jnp.ones(3), "count": jnp.float32(1.0)}
    params = {"network": None, "obs_stats": stats}
    obs = jnp.array([[50.0, -30.0, 2.0]])
    read = lambda **agent: np.asarray(
        ppo.network_input(make_config(normalize_obs=True, **agent).agent, params, obs)
    )
    np.testing.assert_allclose(read(), [[10.0, -10.0, 2.0]], rtol=1e-6)
    np.testing.assert_allclose(read(obs_clip=4.0), [[4.0, -4.0, 2.0]], rtol=1e-6)
    np.testing.assert_allclose(read(obs_clip=None), [[50.0, -30.0, 2.0]], rtol=1e-6)
    assert ppo.network_input(make_config().agent, params, obs) is obs
    for bad in (0.0, -1.0):
        with pytest.raises(ConfigError, match=r"agent\.obs_clip"):
            make_config(normalize_obs=True, obs_clip=bad)
    for unused in (4.0, None):
        with pytest.raises(
            ConfigError,
            match=r"agent\.obs_clip \(.*\) clips normalised observations: it needs "
            r"agent\.normalize_obs: true",
        ):
            make_config(obs_clip=unused)


def test_ppo_with_unclipped_normalised_observations_trains():
    _, metrics = jax.jit(ppo.make_train(make_config(normalize_obs=True, obs_clip=None)))(
        jax.random.PRNGKey(0)
    )
    assert np.isfinite(np.asarray(metrics["value_loss"])).all()


def test_ppo_normalised_observations_reach_the_learner_normalised():
    """The batch an update learns from holds the rollout's observations normalised under the
    statistics merged with that rollout (the batch function sees the rollout as the network reads
    it)."""
    from rl.config import hyperparams
    from rl.core import episodes

    config = make_config(normalize_obs=True)
    s = ppo.make_setup(config)._replace(backend="reference")
    hp = hyperparams(config.agent)
    state = ppo.init_state(s, jax.random.PRNGKey(0), hp)
    seen = []

    def batch_fn(hparams, net_params, traj):
        batch = ppo.learn_batch(s, hparams, net_params, traj)
        seen.append(batch[0].obs)
        return batch

    grads_fn = partial(ppo.autodiff_grads, partial(ppo.minibatch_loss, s))
    new_state, _, _ = ppo.update(s, grads_fn, batch_fn, hp, state, episodes.no_episodes())
    rollout_key = jax.random.split(state.key, 3)[1]
    _, traj, _ = ppo.rollout(s, state.params, state.envs, rollout_key)
    stats = observation_norm.update_observation_stats(state.params["obs_stats"], traj.obs, (3,))
    jax.tree.map(np.testing.assert_array_equal, new_state.params["obs_stats"], stats)
    np.testing.assert_allclose(
        seen[0], observation_norm.normalize_observation(traj.obs, stats).reshape(-1, 3), rtol=1e-6
    )
    np.testing.assert_allclose(np.mean(np.asarray(seen[0]), 0), 0.0, atol=1e-3)  # only this rollout


def test_ppo_tanh_gaussian_pendulum_improves_with_normalised_observations_and_acts_within_bounds():
    config = make_config(
        total_steps=49_152,
        num_envs=16,
        num_steps=256,
        num_epochs=10,
        num_minibatches=16,
        lr=1e-3,
        gamma=0.9,
        ent_coef=0.0,
        reward_scale=0.1,
        clip_value_loss=False,
        network={"hidden": [32, 32]},
        log_interval=4,
        continuous_policy="tanh_gaussian",
        normalize_obs=True,
        critic_hidden=[64, 64],
    )
    state, metrics = jax.jit(ppo.make_train(config))(jax.random.PRNGKey(0))
    returns = np.asarray(metrics["episode_return"])
    assert np.all(np.isfinite(returns)) and returns[-1] > returns[0] + 150, returns
    critic_layer = param_layout.dense_layers(state.params["network"])[2][0]
    assert critic_layer.shape == (3, 64)  # actor 3 -> 16 -> 16, critic 3 -> 64 -> 64
    policy = ppo.make_policy(config)
    obs = jnp.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 8.0], [0.0, 1.0, -8.0]])
    actions = policy(state.params, obs, None)
    net, _ = ppo.make_network(config.agent, *environment.make_env(config))
    mean = net.apply(
        state.params["network"],
        observation_norm.normalize_observation(obs, state.params["obs_stats"]),
    )[0][0]
    np.testing.assert_allclose(actions, np.tanh(np.asarray(mean)) * 2.0, rtol=1e-5, atol=1e-6)


def test_critic_hidden_needs_separate_torsos():
    with pytest.raises(ConfigError, match="agent.critic_hidden: a shared torso"):
        ppo.check_env(
            make_config(shared_network=True, critic_hidden=[8]),
            *environment.make_env(make_config()),
        )
    assert "critic's hidden widths" in ppo_variants.fused_update_unfit_reason(
        make_config("CartPole-v1", critic_hidden=[32, 32])
    )


def test_unknown_continuous_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="continuous_policy"):
        make_config(continuous_policy="beta")


def test_a_run_with_normalised_observations_checkpoints_and_evaluates_from_the_cli(
    tmp_path, capsys
):
    """The statistics are part of the saved params: `rl eval` of the run reads them back."""
    import yaml

    from rl.cli.main import main

    config = {
        "env": {"id": "Pendulum-v1"},
        "run": {"seeds": 2},
        "agent": {
            "name": "ppo",
            "total_steps": 256,
            "num_envs": 4,
            "num_steps": 32,
            "num_minibatches": 2,
            "log_interval": 1,
            "eval_envs": 2,
            "normalize_obs": True,
            "continuous_policy": "tanh_gaussian",
            "network": {"hidden": [8, 8]},
        },
    }
    path = tmp_path / "ppo.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path), "--output-dir", str(tmp_path / "runs"), "--name", "norm"]) == 0
    assert main(["eval", str(tmp_path / "runs" / "norm"), "--episodes", "2"]) == 0
    assert "over 2 episodes x 2 seeds" in capsys.readouterr().out
