"""The conv torsos (MinAtar's net and the Nature-DQN net) in both backends: output shapes, equal
parameter counts, any leading batch dims, orthogonal conv init, clear errors for observations that
are not images; the mlp torso flattens image observations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs.spaces import Box
from rl.config import build_config
from rl.config.parsing import ConfigError
from rl.nn import cnn, layers, networks
from rl.nn.network_config import NetworkConfig

pytestmark = pytest.mark.usefixtures(
    "full_precision_matmuls"
)  # exact float32 comparisons, also on the GPU

KEY = jax.random.PRNGKey(0)
MINATAR = Box(0, 1, (10, 10, 4))
ATARI = Box(0, 255, (84, 84, 4))


def count(params) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def q_net(torso: str, hidden, obs_space, num_actions: int):
    config = NetworkConfig(torso=torso, hidden=hidden, activation="relu")
    return networks.with_head(networks.make_torso(config, obs_space), networks.q_head(num_actions))


# (torso, hidden, observation space, actions, parameter count by hand)
CASES = {
    # conv 3x3x4x16 + 16 -> 8x8x16 = 1024 features -> dense 128 -> 3 Q-values
    "cnn_minatar": (
        "cnn_minatar",
        (128,),
        MINATAR,
        3,
        (3 * 3 * 4 * 16 + 16) + (1024 * 128 + 128) + (128 * 3 + 3),
    ),
    # 84 -> 20 -> 9 -> 7: 7x7x64 = 3136 features -> dense 512 -> 6 Q-values
    "nature_cnn": (
        "nature_cnn",
        (512,),
        ATARI,
        6,
        (8 * 8 * 4 * 32 + 32)
        + (4 * 4 * 32 * 64 + 64)
        + (3 * 3 * 64 * 64 + 64)
        + (3136 * 512 + 512)
        + (512 * 6 + 6),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flax_and_haiku_agree_on_shapes_and_parameter_counts(name):
    torso, hidden, space, actions, num_params = CASES[name]
    obs = jnp.zeros((5,) + space.shape)
    results = {}
    for backend in layers.BACKENDS:
        net = layers.build(q_net(torso, hidden, space, actions), backend)
        params = jax.eval_shape(net.init, KEY, obs)  # shapes only
        assert jax.eval_shape(net.apply, params, obs).shape == (5, actions)
        assert jax.eval_shape(net.apply, params, obs[0]).shape == (actions,)  # one observation
        assert jax.eval_shape(net.apply, params, jnp.zeros((2, 3) + space.shape)).shape == (
            2,
            3,
            actions,
        )
        results[backend] = (count(params), sorted(x.shape for x in jax.tree.leaves(params)))
    assert results["flax"] == results["haiku"]
    assert results["flax"][0] == num_params
    assert (
        cnn.cnn_output_shape(torso, space)
        == {"cnn_minatar": (8, 8, 16), "nature_cnn": (7, 7, 64)}[name]
    )


@pytest.mark.parametrize("backend", layers.BACKENDS)
def test_leading_batch_dims_are_independent_samples(backend):
    net = layers.build(q_net("cnn_minatar", (32,), MINATAR, 3), backend)
    obs = jax.random.bernoulli(jax.random.PRNGKey(1), 0.3, (2, 3, 10, 10, 4)).astype(jnp.float32)
    params = net.init(KEY, obs[0, 0])
    batched = net.apply(params, obs)
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(
                batched[i, j], net.apply(params, obs[i, j]), rtol=1e-5, atol=1e-6
            )


@pytest.mark.parametrize("backend", layers.BACKENDS)
def test_conv_kernels_are_orthogonal_with_gain_sqrt2(backend):
    net = layers.build(q_net("cnn_minatar", (8,), MINATAR, 2), backend)
    params = net.init(KEY, jnp.zeros(MINATAR.shape))
    kernels = [x for x in jax.tree.leaves(params) if x.ndim == 4]
    assert len(kernels) == 1 and kernels[0].shape == (3, 3, 4, 16)
    w = np.asarray(kernels[0], np.float64).reshape(36, 16)
    np.testing.assert_allclose(w.T @ w, 2.0 * np.eye(16), atol=1e-5)


def test_actor_critic_with_a_cnn_torso_has_two_conv_stacks():
    config = NetworkConfig(torso="cnn_minatar", hidden=(128,), activation="relu")
    torso = networks.make_torso(config, MINATAR)
    for shared, stacks in ((False, 2), (True, 1)):
        net = layers.build(
            networks.actor_critic(torso, networks.categorical_policy_head(3), shared=shared), "flax"
        )
        params = net.init(KEY, jnp.zeros(MINATAR.shape))
        assert sum(x.ndim == 4 for x in jax.tree.leaves(params)) == stacks
        logits, value = net.apply(params, jnp.zeros((7,) + MINATAR.shape))
        assert logits.shape == (7, 3) and value.shape == (7,)


def test_mlp_flattens_image_observations():
    net = layers.build(q_net("mlp", (16,), MINATAR, 3), "haiku")
    params = net.init(KEY, jnp.zeros(MINATAR.shape))
    assert params["linear"]["w"].shape == (400, 16)
    assert net.apply(params, jnp.zeros((4, 2) + MINATAR.shape)).shape == (4, 2, 3)


def test_cnn_torsos_need_images_large_enough():
    config = NetworkConfig(torso="cnn_minatar")
    with pytest.raises(
        ValueError,
        match=r"torso 'cnn_minatar' needs image observations, a Box of shape "
        r"\[height, width, channels\]",
    ):
        networks.make_torso(config, Box(-1, 1, (4,)))
    with pytest.raises(ValueError, match="needs image observations"):
        networks.make_torso(config)  # no observation space
    with pytest.raises(ValueError, match=r"images of 10x10 are too small for its 4x4 conv layers"):
        networks.make_torso(NetworkConfig(torso="nature_cnn"), MINATAR)
    networks.make_torso(
        NetworkConfig(torso="nature_cnn"), Box(0, 1, (36, 36, 1))
    )  # the smallest it takes
    with pytest.raises(ConfigError, match="^agent.network.torso: torso 'nature_cnn'"):
        NetworkConfig(torso="nature_cnn").check_obs_space(Box(0, 1, (35, 40, 3)))


@pytest.mark.parametrize(
    "agent, env, message",
    [
        (
            "ppo",
            "CartPole-v1",
            r"^agent.network.torso: torso 'cnn_minatar' needs image observations",
        ),
        (
            "dqn",
            "CartPole-v1",
            r"^agent.network.torso: torso 'cnn_minatar' needs image observations",
        ),
        (
            "rainbow",
            "Acrobot-v1",
            r"^agent.network.torso: torso 'cnn_minatar' needs image observations",
        ),
        (
            "sac",
            "Pendulum-v1",
            r"^agent.network.torso: 'cnn_minatar' is not one of \['mlp', 'simbav2'\]",
        ),
        (
            "td3",
            "Pendulum-v1",
            r"^agent.network.torso: 'cnn_minatar' is not one of \['mlp', 'simbav2'\]",
        ),
    ],
)
def test_configs_with_a_cnn_torso_on_vector_observations_fail_naming_the_key(agent, env, message):
    with pytest.raises(ConfigError, match=message):
        build_config(
            {"env": {"id": env}, "agent": {"name": agent, "network": {"torso": "cnn_minatar"}}}
        )


def test_unknown_torso_is_a_config_error_listing_the_torsos():
    with pytest.raises(
        ConfigError,
        match=r"agent.network.torso: 'cnn' is not one of \['mlp', 'cnn_minatar', 'nature_cnn'",
    ):
        build_config(
            {"env": {"id": "CartPole-v1"}, "agent": {"name": "dqn", "network": {"torso": "cnn"}}}
        )
