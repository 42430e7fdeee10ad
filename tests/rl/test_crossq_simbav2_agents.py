"""CrossQ and SimbaV2 as options of SAC and TD3: config errors naming the key, CrossQ's joint pass
(the loss of critics without batch renorm equals separate passes; with it, the statistics are those
of the mixed batch), the fused kernels left out, short runs of each (running statistics in
`critic_stats`, no target networks, SimbaV2's weights on the sphere after training), same seed same
result, and a learning run that can fail (`-m slow`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.agents import actor_critic, sac, td3
from rl.config import build_config
from rl.config.parsing import ConfigError
from rl.core import environment, losses
from rl.fused import critic as fused_critic
from rl.nn import simbav2

CROSSQ = dict(target_networks=False, policy_delay=3, adam_b1=0.5)
RENORM = {"batch_renorm": True, "renorm_warmup": 20}


def make_config(name="sac", env_id="Pendulum-v1", network=None, **agent):
    base = dict(
        name=name,
        total_steps=192,
        learning_starts=64,
        batch_size=16,
        buffer_size=500,
        network={"hidden": [16, 16], **(network or {})},
        log_interval=64,
        eval_episodes=1,
    )
    base.update(agent)
    return build_config({"env": {"id": env_id}, "agent": base})


# ---------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    "name, env_id, network, agent, key",
    [
        ("sac", "Pendulum-v1", RENORM, {}, "agent.network.batch_renorm"),
        ("td3", "Pendulum-v1", RENORM, {}, "agent.network.batch_renorm"),
        ("sac", "Pendulum-v1", {**RENORM, "torso": "simbav2", "hidden": [16]}, CROSSQ,
         "agent.network.batch_renorm"),
        ("sac", "Pendulum-v1", {"torso": "simbav2", "hidden": [16, 8]}, {},
         "agent.network.hidden"),
        ("td3", "Pendulum-v1", {"torso": "simbav2", "hidden": [8], "critic_hidden": [8, 16]}, {},
         "agent.network.critic_hidden"),
        ("sac", "Pendulum-v1", {"torso": "simbav2", "hidden": [8], "layer_norm": True}, {},
         "agent.network.layer_norm"),
        ("sac", "Pendulum-v1", {"critic_hidden": [0]}, {}, "agent.network.critic_hidden"),
        ("sac", "Pendulum-v1", {"renorm_momentum": 1.0}, {}, "agent.network.renorm_momentum"),
        ("sac", "Pendulum-v1", {"torso": "cnn_minatar"}, {}, "agent.network.torso"),
        ("sac", "Pendulum-v1", {}, {"policy_delay": 0}, "agent.policy_delay"),
        ("td3", "Pendulum-v1", {}, {"adam_b1": 1.0}, "agent.adam_b1"),
        ("sac", "CartPole-v1", {}, CROSSQ, "agent.target_networks"),
    ],
)  # fmt: skip
def test_bad_config_names_the_key(name, env_id, network, agent, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        make_config(name, env_id, network, **agent)


def test_other_agents_do_not_take_the_options():
    with pytest.raises(ConfigError, match=r"agent\.network\.torso"):
        build_config(
            {
                "env": {"id": "CartPole-v1"},
                "agent": {"name": "dqn", "network": {"torso": "simbav2"}},
            }
        )
    with pytest.raises(ConfigError, match=r"agent\.network\.batch_renorm"):
        build_config(
            {"env": {"id": "CartPole-v1"}, "agent": {"name": "ppo", "network": {"batch_renorm": 1}}}
        )


def test_fused_kernels_fall_back_for_crossq_and_simbav2():
    """The fused twin critics hold plain MLPs bootstrapping from target critics: CrossQ's and
    SimbaV2's critics go through the network's apply (`agent.fused_network` means 'where they
    fit'), with a reason naming what does not fit."""
    config = make_config(network=RENORM, **CROSSQ)
    env, env_params = environment.make_env(config)
    spaces = env.observation_space(env_params), env.action_space(env_params)
    assert "batch renormalisation" in fused_critic.unfit_reason(config.agent.network, *spaces)
    assert fused_critic.for_agent(config, env, env_params, None) is None
    simba = make_config(network={"torso": "simbav2", "hidden": [16]}).agent.network
    assert "MLP" in fused_critic.unfit_reason(simba, *spaces)
    wide = make_config(network={"critic_hidden": [4096, 4096]}).agent.network
    assert fused_critic.unfit_reason(wide, *spaces) is not None  # the critics' own widths count


# ---------------------------------------------------------------- CrossQ's joint pass


def batch_of(rng, size=6):
    return {
        "obs": jnp.asarray(rng.normal(size=(size, 3)), jnp.float32),
        "action": jnp.asarray(rng.uniform(-1, 1, size=(size, 1)), jnp.float32),
        "reward": jnp.asarray(rng.normal(size=size), jnp.float32),
        "next_obs": jnp.asarray(rng.normal(size=(size, 3)), jnp.float32),
        "terminated": jnp.asarray(rng.uniform(size=size) < 0.3),
    }


def test_joint_loss_without_renorm_equals_separate_passes():
    """Without batch statistics the joint pass is two passes of the online critics: L_Q against
    y = r + gamma (1 - terminated) (min(Q1, Q2)(s', a') - alpha log pi(a'|s'))."""
    config = make_config(**CROSSQ)
    env, env_params = environment.make_env(config)
    variant = sac.make_variant(config.agent, env, env_params)
    batch, key = batch_of(np.random.default_rng(0)), jax.random.PRNGKey(3)
    actor_params = variant.actor.init(jax.random.PRNGKey(1), batch["obs"][0])
    critic_params, stats = variant.init_critic(jax.random.PRNGKey(2), batch["obs"][0])
    assert stats == {}

    @jax.jit
    def joint_and_separate(critic_params, actor_params):
        loss, (q_mean, _) = variant.critic_loss(
            critic_params, stats, actor_params, None, 0.5, batch, key, 0.9
        )
        apply = lambda obs, action: variant.critic.apply(critic_params, stats, obs, action)[0]
        next_action, bonus = sac.next_action_and_bonus(
            variant.actor.apply, actor_params, 0.5, batch["next_obs"], key
        )
        next_value = jnp.minimum(*apply(batch["next_obs"], next_action)) + bonus
        target = batch["reward"] + 0.9 * (1 - batch["terminated"]) * next_value
        q1, q2 = apply(batch["obs"], batch["action"])
        return (loss, q_mean), (losses.twin_q_loss(q1, q2, target), q1.mean())

    joint, separate = joint_and_separate(critic_params, actor_params)
    np.testing.assert_allclose(joint, separate, rtol=1e-5)


def test_joint_pass_renormalises_by_the_mixed_batch():
    """The critics' input layer sees [(s, a); (s', a')]: its running mean moves toward the mean of
    both halves, once per pass; (s', a')'s values carry no gradient."""
    config = make_config(network=RENORM, **CROSSQ)
    critic = actor_critic.joint_twin_critic(config.agent.network)
    batch = batch_of(np.random.default_rng(1))
    next_action = jnp.full((6, 1), 0.5)
    params, stats = critic.init(jax.random.PRNGKey(0), batch["obs"], batch["action"])
    (q1, _), (next_q1, _), new = actor_critic.joint_q_values(
        critic, params, stats, batch, next_action
    )
    both = np.concatenate(
        [
            np.concatenate([batch["obs"], batch["action"]], -1),
            np.concatenate([batch["next_obs"], next_action], -1),
        ]
    )
    first = [k for k in new if k.endswith("batch_renorm0_mean")]  # haiku/flax naming aside
    assert first, list(new)
    np.testing.assert_allclose(new[first[0]], 0.01 * both.mean(0), rtol=1e-4, atol=1e-7)
    assert all(int(v) == 1 for k, v in new.items() if k.endswith("steps"))
    grad = jax.grad(
        lambda p: jnp.sum(actor_critic.joint_q_values(critic, p, stats, batch, next_action)[1][0])
    )(params)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grad))
    assert q1.shape == next_q1.shape == (6,)


# ---------------------------------------------------------------- short runs


def test_sac_crossq_runs_and_is_deterministic():
    """Running statistics in `critic_stats`, no target critics, the actor every 3rd step; the same
    seed gives the same run, another seed another."""
    config = make_config(network=RENORM, **CROSSQ)
    train = jax.jit(sac.make_train(config))
    state, metrics = train(jax.random.PRNGKey(0))
    again, metrics_again = train(jax.random.PRNGKey(0))
    _, other = train(jax.random.PRNGKey(1))
    for key in metrics:
        np.testing.assert_array_equal(metrics[key], metrics_again[key])
    np.testing.assert_array_equal(
        state.critic_stats["batch_renorm0_mean"], again.critic_stats["batch_renorm0_mean"]
    )
    assert not np.array_equal(metrics["critic_loss"], other["critic_loss"])
    assert state.target_critic_params is None
    gradient_steps = int(state.updates)
    assert gradient_steps == 192 - 64 + 1  # from the step that reaches learning_starts
    assert all(
        int(v) == gradient_steps for k, v in state.critic_stats.items() if k.endswith("steps")
    )
    assert (
        np.isfinite(metrics["critic_loss"][1:]).all() and np.isfinite(metrics["eval_return"]).all()
    )


def test_td3_crossq_runs_without_targets():
    config = make_config("td3", network=RENORM, **CROSSQ)
    state, metrics = jax.jit(td3.make_train(config))(jax.random.PRNGKey(0))
    assert state.target_params is None and state.target_critic_params is None
    assert all(int(v) == int(state.updates) for k, v in state.critic_stats.items() if "steps" in k)
    assert np.isfinite(metrics["critic_loss"][1:]).all()
    action = td3.make_policy(config)(state.params, jnp.zeros(3), None)
    assert action.shape == (1,) and -2.0 <= float(action[0]) <= 2.0


def test_sac_simbav2_keeps_its_weights_on_the_sphere():
    config = make_config(network={"torso": "simbav2", "hidden": [16], "critic_hidden": [16, 16]})
    state, metrics = jax.jit(sac.make_train(config))(jax.random.PRNGKey(0))
    assert np.isfinite(metrics["critic_loss"][1:]).all()
    hyper = [
        leaf
        for params in (state.params, state.critic_params)
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
        if simbav2.is_hyper_weight(path)
    ]
    assert len(hyper) == 4 + 2 * 6  # the actor: embedding, one block, features; twin critics of two
    for w in hyper:
        np.testing.assert_allclose(np.linalg.norm(w, axis=0), 1.0, rtol=1e-5)


# ---------------------------------------------------------------- learning


TD3_RENORM_XFAIL = pytest.mark.xfail(
    reason="measured 2026-12-02 on the two seeds of split(PRNGKey(10000)): TD3 with batch renorm "
    "and no targets stays near -1400 at 4000 steps (final q_mean about -900, the running variance "
    "of the action input about 0.06), while TD3 without targets or batch renorm reaches -177 and "
    "-217; plain TD3 at these settings does not learn in 4000 steps either",
    strict=False,
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, network",
    [
        pytest.param("sac", RENORM, id="sac-renorm"),
        pytest.param("td3", {}, id="td3-joint-pass"),
        pytest.param("td3", RENORM, marks=TD3_RENORM_XFAIL, id="td3-renorm"),
    ],
)
def test_crossq_learns_pendulum(name, network):
    """CrossQ (narrow nets, short warm-up) on Pendulum: the greedy return climbs from about -1300
    to above -700 within 4000 env steps (`-m slow`; seed 10000): SAC's last two log points, TD3's
    best of its last three (its greedy return swings from one log point to the next; gamma 0.98 as
    `configs/td3_pendulum.yaml`). SAC with batch renorm, TD3 with the joint pass alone; TD3 with
    batch renorm is an expected failure (TD3_RENORM_XFAIL)."""
    config = make_config(
        name,
        gamma=0.99 if name == "sac" else 0.98,
        network={"hidden": [64, 64], "critic_hidden": [128, 128], **network},
        total_steps=4000,
        learning_starts=500,
        batch_size=128,
        buffer_size=5000,
        log_interval=500,
        eval_episodes=4,
        **CROSSQ,
    )
    train = sac.make_train if name == "sac" else td3.make_train
    _, metrics = jax.jit(train(config))(jax.random.PRNGKey(10_000))
    ev = np.asarray(metrics["eval_return"])
    late = ev[-2:].mean() if name == "sac" else ev[-3:].max()
    assert late > ev[0] + 300 and late > -700, ev
