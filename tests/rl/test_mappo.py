"""MAPPO: the centralised critic reads the global state with each agent's one-hot id, the advantages
bootstrap from the global state a step reached (NumPy's GAE, agent by agent, on a toy team env),
the greedy policy is IPPO's actor, an env without a global state is refused before anything
compiles, and a short run on MPE simple_spread trains (finite losses, the env steps counted,
greedy evaluation episodes)."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_ippo import MPE, make_config, numpy_gae, toy_setup

from rl.agents import ippo, mappo
from rl.config import hyperparams
from rl.config.parsing import ConfigError

pytest.importorskip("jaxmarl")  # the jaxmarl extra (the test extra installs it)


def test_the_critic_reads_the_global_state_with_each_agents_id():
    states = jnp.arange(10.0).reshape(2, 5)  # [batch, G]
    seen = ippo.Observation(jnp.zeros((2, 3, 4)), jnp.ones((2, 3, 6), bool), states)
    view = np.asarray(mappo.world_view(3, 1, seen))
    assert view.shape == (2, 3, 5 + 3)
    for b in range(2):
        for agent in range(3):
            np.testing.assert_array_equal(view[b, agent], [*states[b], *np.eye(3)[agent]])
    images = jnp.arange(12.0).reshape(2, 2, 3)  # a global state of rank 2 is flattened
    view = mappo.world_view(3, 2, seen._replace(global_state=images))
    np.testing.assert_array_equal(view[1, 2], [*range(6, 12), 0, 0, 1])
    config = make_config(name="mappo")
    s = mappo.make_setup(config)
    params = jax.eval_shape(
        lambda key: ippo.init_state(s, key, hyperparams(config.agent)).params,
        jax.random.PRNGKey(0),
    )
    # MPE's global state: the 3 agents' 18-dim observations; the actor reads one observation
    assert params["critic"]["params"]["Dense_0"]["kernel"].shape == (3 * 18 + 3, 16)
    assert params["actor"]["params"]["Dense_0"]["kernel"].shape == (18, 16)
    assert mappo.make_policy is ippo.make_policy


def test_advantages_bootstrap_from_the_global_state_each_step_reached():
    s = toy_setup(
        critic=mappo.central_critic,
        global_state=True,
        name="mappo",
        num_steps=12,
        share_parameters=False,
        gamma=0.9,
        gae_lambda=0.8,
    )

    @jax.jit
    def run(key):
        state = ippo.init_state(s, key, hyperparams(s.agent))
        _, traj, _ = ippo.rollout(s, state.params, state.envs, state.key, 0.0)
        return state, traj, ippo.learn_batch(s, hyperparams(s.agent), state.params, traj)

    state, traj, (batch, advantages, targets) = run(jax.random.PRNGKey(0))
    critic = partial(s.critic.apply, state.params["critic"])
    assert traj.obs.global_state.shape == (12, 4, 9)
    # the global state's last entry is the time: the final one is a step on, also at episode ends
    np.testing.assert_array_equal(
        traj.final_obs.global_state[..., -1], (np.arange(12)[:, None] % 4 + 1) * np.ones(4)
    )
    values = np.asarray(critic(mappo.world_view(2, 1, traj.obs)), np.float64)
    next_values = np.asarray(critic(mappo.world_view(2, 1, traj.final_obs)), np.float64)
    assert not np.allclose(values[..., 0], values[..., 1])  # the id tells the agents apart
    reward, term, trunc = (np.asarray(x, np.float64) for x in traj[3:6])
    for env in range(4):
        for agent in range(2):
            expected = numpy_gae(
                reward[:, env, agent],
                values[:, env, agent],
                next_values[:, env, agent],
                term[:, env, agent],
                trunc[:, env, agent],
                0.9,
                0.8,
            )
            rows = np.arange(12) * 4 + env
            np.testing.assert_allclose(advantages[rows, agent], expected, atol=1e-5)
            np.testing.assert_allclose(batch.value[rows, agent], values[:, env, agent], atol=1e-5)


def test_an_env_without_a_global_state_is_refused_naming_env_id():
    with pytest.raises(ConfigError, match=r"env.id: mappo's centralised critic .* jaxmarl:hanabi"):
        make_config("jaxmarl:hanabi", name="mappo")


def test_a_short_mappo_run_on_mpe_trains():
    config = make_config(
        MPE, name="mappo", total_steps=512, num_steps=16, log_interval=4, eval_envs=2
    )
    _, metrics = jax.jit(mappo.make_train(config))(jax.random.PRNGKey(0))
    assert metrics["step"][-1] == 512
    for name in ("policy_loss", "value_loss", "entropy", "approx_kl"):
        assert np.all(np.isfinite(metrics[name])), name
    assert metrics["episodes"][-1] > 0 and np.isfinite(metrics["episode_return"][-1])
    assert metrics["eval_length"][-1] == 26 and np.isfinite(metrics["eval_return"][-1])
