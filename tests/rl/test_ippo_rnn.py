"""Recurrent IPPO and MAPPO: each agent's hidden state resets exactly where its own episode ended
(a toy team whose agents leave at different times, against the cell stepped by hand), values
bootstrap from the pre-reset state, whole sequences re-run from their stored initial state score
the masked policy that acted, no masked action is sampled, shared and per-agent parameters (a
shared torso, agent ids, the critic on the global state), bad configs, the CI learning run (a toy
team task that needs memory, learned on 4 vmapped seeds beyond the best memoryless return, greedily
too, a fifth run of seed 0 reproducing the first), and `rl train` / `rl eval` of the SMAX configs
(slow)."""

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_ippo import MPE, GuessState, MaskedGuess, masked_log_softmax
from test_ippo import make_config as ippo_config

from envs.multi_agent import TeamEpisodeStatistics
from rl.agents import ippo_rnn, mappo, mappo_rnn
from rl.agents.trainer import train_from_trainer
from rl.config import hyperparams
from rl.config.parsing import ConfigError

pytest.importorskip("jaxmarl")  # the jaxmarl extra (the test extra installs it)
pytestmark = pytest.mark.usefixtures("full_precision_matmuls")  # float32 comparisons on the GPU


def make_config(env_id=MPE, env_params=None, **agent):
    """test_ippo's small config for recurrent IPPO: a 16-unit layer, a GRU of 8 and an 8-unit layer
    in each head, Brax's init (the orthogonal one's QRs are slow to compile on the CPU)."""
    network = {"hidden": [16], "recurrent_hidden": 8, "init": "lecun_uniform"}
    small = dict(name="ippo_rnn", network=network, head_hidden=[8])
    return ippo_config(env_id, env_params, **{**small, **agent})


def close(a, b, atol=1e-6):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=atol), a, b)


# ---------------------------------------------------------------- the hidden state on a toy team


class Toy(NamedTuple):
    """A recurrent MAPPO Setup on MaskedGuess, its params, the carry the rollout under test began
    with, its Transitions and learn batch, and two compiled pieces the tests share: `step(carry,
    Observations [E]) -> (carry, (logits, values))`, the network's step without resets, and
    `loss(minibatch)` at the params."""

    s: ippo_rnn.Setup
    params: Any
    carry: Any
    traj: ippo_rnn.Transition
    batch: tuple
    step: Any
    loss: Any


@pytest.fixture(scope="module")
def toy() -> Toy:
    """On MaskedGuess (agent a terminated from the second step of each 4-step episode, b truncated
    at the fourth; masks that change every step; a global state), recurrent MAPPO with one set of
    parameters per agent: a 6-step rollout of 3 envs, then the 6-step rollout under test, which
    starts 2 steps into an episode. Traced at full float32 matmul precision, as its tests compare
    (the function-scoped `full_precision_matmuls` starts after module fixtures)."""
    with jax.default_matmul_precision("highest"):
        return _toy()


def _toy() -> Toy:
    config = make_config(
        name="mappo_rnn",
        num_envs=3,
        num_steps=6,
        num_minibatches=1,
        share_parameters=False,
        gamma=0.9,
    )
    env = TeamEpisodeStatistics(MaskedGuess())
    env_params = env.default_params
    critic_view = mappo.world_input(env, env_params)
    s = ippo_rnn.setup(config, env, env_params, critic_view, global_state=True)
    hparams = hyperparams(config.agent)
    state = jax.jit(partial(ippo_rnn.init_state, s))(jax.random.PRNGKey(0), hparams)
    rollout = jax.jit(partial(ippo_rnn.rollout, s, state.params))
    envs, _, _ = rollout(state.envs, jax.random.PRNGKey(1), 0.0)
    _, traj, _ = rollout(envs, jax.random.PRNGKey(2), 0.0)
    batch = jax.jit(partial(ippo_rnn.learn_batch, s, hparams))(
        state.params, traj, envs.memory.carry
    )
    no_reset = jnp.zeros((3, 2), bool)
    step = jax.jit(lambda carry, seen: ippo_rnn.one_step(s, state.params, carry, seen, no_reset))
    loss = jax.jit(partial(ippo_rnn.minibatch_loss, s, hparams, state.params))
    return Toy(s, state.params, envs.memory.carry, traj, batch, step, loss)


# Steps t = 0..5 of the rollout under test are steps k = 2, 3, 0, 1, 2, 3 of their episodes.
# Agent a's carry is reset before it reads the observation of every step after one that ended its
# episode for it: after its terminations (k = 1, 2, 3) and at each new episode; agent b's only at
# a new episode (k = 0).
EXPECTED_RESET = np.array([[k in (0, 2, 3), k == 0] for k in (2, 3, 0, 1, 2, 3)])  # [T, agents]


def test_each_agents_hidden_state_resets_exactly_where_its_own_episode_ended(toy):
    traj = toy.traj
    np.testing.assert_array_equal(traj.reset, np.broadcast_to(EXPECTED_RESET[:, None], (6, 3, 2)))
    np.testing.assert_array_equal(
        traj.terminated[:, 0], [[1, 0], [1, 0], [0, 0], [1, 0]] + [[1, 0]] * 2
    )
    np.testing.assert_array_equal(
        traj.truncated[:, 0], [[0, 0], [0, 1], [0, 0], [0, 0], [0, 0], [0, 1]]
    )
    at = lambda tree, t: jax.tree.map(lambda x: x[t], tree)
    initial = toy.s.initial_carry(3)  # the pair (actor's, critic's), [E, A, H] each
    previous = toy.carry  # the carry the first rollout ended with: mid-episode, not the initial one
    for t in range(6):
        # by hand: agent i starts from the initial state where it is expected to reset, else from
        # its previous state, and the network steps without resets
        fresh = EXPECTED_RESET[t][None, :, None]
        start = jax.tree.map(lambda h0, h: jnp.where(fresh, h0, h), initial, previous)
        want, (_, value) = toy.step(start, at(traj.obs, t))
        close(at(traj.carry, t), want)
        close(traj.value[t], value)
        if EXPECTED_RESET[t].any():  # the carried state would have given another h_t
            other, _ = toy.step(previous, at(traj.obs, t))
            for h, h_other in zip(jax.tree.leaves(want), jax.tree.leaves(other)):
                assert not np.allclose(h[:, EXPECTED_RESET[t]], h_other[:, EXPECTED_RESET[t]])
                assert np.allclose(h[:, ~EXPECTED_RESET[t]], h_other[:, ~EXPECTED_RESET[t]])
        previous = want


def test_values_bootstrap_from_the_pre_reset_state(toy):
    """V(final_obs_t) (the global state the step reached, for MAPPO's critic) is the value one step
    on from h_t: where an agent goes on (no reset at t + 1) the rollout's V at t + 1, where its
    episode ended not the value from the initial state; the value target of agent b's truncated
    steps is r + gamma V(final_obs), of agent a's terminated steps r."""
    traj, (_, _, targets) = toy.traj, toy.batch
    at = lambda tree, t: jax.tree.map(lambda x: x[t], tree)
    boot = np.stack([toy.step(at(traj.carry, t), at(traj.final_obs, t))[1][1] for t in range(6)])
    goes_on = np.broadcast_to(~EXPECTED_RESET[1:, None], (5, 3, 2))  # no reset at t + 1
    np.testing.assert_allclose(boot[:-1][goes_on], traj.value[1:][goes_on], rtol=1e-5, atol=1e-6)
    _, (_, from_initial) = toy.step(toy.s.initial_carry(3), at(traj.final_obs, 1))
    assert not np.allclose(boot[1, :, 1], from_initial[:, 1], atol=1e-4)  # b truncated at t = 1
    targets = np.swapaxes(targets, 0, 1)  # [T, E, A]
    for t in (1, 5):
        close(targets[t, :, 1], traj.reward[t, :, 1] + 0.9 * boot[t, :, 1])
        close(targets[t, :, 0], traj.reward[t, :, 0])


def test_no_masked_action_is_sampled_and_the_loss_scores_the_masked_policy_that_acted(toy):
    traj, (seqs, advantages, _) = toy.traj, toy.batch
    mask, action = np.asarray(traj.obs.action_mask), np.asarray(traj.action)
    assert mask.shape == (6, 3, 2, 4) and action.shape == (6, 3, 2)
    assert np.take_along_axis(mask, action[..., None], -1).all()
    assert 0.2 < mask[..., 1, :].mean() < 0.9  # agent b's masks do rule actions out
    # the learn batch: env-major sequences with the carry the rollout began with
    assert seqs.obs.obs.shape == (3, 6, 2, 4) and advantages.shape == (3, 6, 2)
    close(seqs.initial_carry, toy.carry)
    np.testing.assert_array_equal(seqs.action, np.swapaxes(action, 0, 1))
    # at the behaviour params the loss's log-probabilities, re-run over two envs' sequences from
    # their initial state, are the stored ones: ratio 1 on every agent step, which it would not be
    # without the stored masks where they rule actions out
    minibatch = jax.tree.map(lambda x: x[jnp.array([2, 0])], toy.batch)
    _, stats = toy.loss(minibatch)
    assert abs(float(stats["approx_kl"])) < 1e-6 and float(stats["clip_fraction"]) == 0.0
    seen = minibatch[0].obs
    unmasked = minibatch[0]._replace(obs=seen._replace(action_mask=jnp.ones_like(seen.action_mask)))
    _, stats = toy.loss((unmasked, *minibatch[1:]))
    assert float(stats["approx_kl"]) > 1e-3
    # and those of the rollout are the masked softmax of the logits
    _, (logits, _) = toy.step(toy.s.initial_carry(3), jax.tree.map(lambda x: x[2], traj.obs))
    first = EXPECTED_RESET[2]  # at t = 2 every agent begins an episode: the initial state
    assert first.all()
    reference = masked_log_softmax(np.asarray(logits, np.float64), mask[2])
    close(traj.log_prob[2], np.take_along_axis(reference, action[2][..., None], -1)[..., 0], 1e-5)


def test_the_greedy_team_policy_is_the_argmax_of_the_actor_that_acted_from_the_same_carry(toy):
    """MAPPO-RNN's greedy step (its `make_policy` and in-program evaluation; one set of parameters
    per agent, actor and critic on cells of their own) over the rollout's steps t = 2, 3 (every
    agent begins an episode at t = 2, no carry is reset at t = 3), from the initial carry: every
    agent's action is the argmax of the masked logits the training network gave there, the actor's
    carry is the rollout's, and the critic's carry stays the initial one (not read)."""
    step = jax.jit(ippo_rnn.greedy_policy(toy.s).step)
    initial = toy.s.initial_carry(3)
    carry, full, overruled = initial, initial, 0
    for t in (2, 3):
        seen = jax.tree.map(lambda x: x[t], toy.traj.obs)
        carry, action = step(toy.params, carry, seen.obs, None, seen.action_mask)
        full, (logits, _) = toy.step(full, seen)
        mask = np.asarray(seen.action_mask)
        np.testing.assert_array_equal(action, np.where(mask, logits, -np.inf).argmax(-1))
        overruled += int((~np.take_along_axis(mask, np.argmax(logits, -1)[..., None], -1)).sum())
        close(carry[0], jax.tree.map(lambda x: x[t], toy.traj.carry)[0])
        close(carry[1], initial[1])
    assert overruled > 0  # the masks do change some agent's greedy action


# ---------------------------------------------------------------- parameters


def param_shapes(config, module=ippo_rnn):
    s = module.make_setup(config)
    state = jax.eval_shape(
        lambda key: ippo_rnn.init_state(s, key, hyperparams(config.agent)), jax.random.PRNGKey(0)
    )
    return jax.tree.map(lambda x: x.shape, state.params)["params"]


def test_shared_and_per_agent_parameters_a_shared_torso_agent_ids_and_the_global_critic():
    shared = param_shapes(make_config())
    separate = param_shapes(make_config(share_parameters=False))
    is_shape = lambda x: isinstance(x, tuple)
    flat = lambda tree: jax.tree.leaves(tree, is_leaf=is_shape)
    assert flat(separate) == [(3, *shape) for shape in flat(shared)]  # MPE: 3 agents
    # separate actor and critic: two cells, each after a 16-unit layer; the actor's layers first
    assert shared["Dense_0"]["kernel"] == (18, 16) and shared["gru_1_recurrent_kernel"] == (8, 24)
    assert shared["Dense_3"]["kernel"] == (8, 5)  # the policy's logits after its 8-unit layer
    one_torso = param_shapes(make_config(shared_network=True))
    assert "gru_1_recurrent_kernel" not in one_torso and len(one_torso) == 6 + 2
    with_ids = param_shapes(make_config(agent_id_input=True))
    assert with_ids["Dense_0"]["kernel"] == (18 + 3, 16)
    world = param_shapes(make_config(name="mappo_rnn"), mappo_rnn)
    # the critic's torso reads the world view: the 3 agents' observations and the agent's id
    assert world["Dense_0"]["kernel"] == (18, 16) and world["Dense_4"]["kernel"] == (3 * 18 + 3, 16)
    assert mappo_rnn.Config().name == "mappo_rnn"


# ---------------------------------------------------------------- CI learning: a task for memory


class Recall(MaskedGuess):
    """MaskedGuess's two agents, each rewarded 1 for taking its target action, but the targets are
    drawn once an episode and seen only on its first step (later observations are zeros); no action
    is masked and no agent leaves early. A random team's return over the 4 steps is 1, the best
    memoryless one's 1 + 3/4 (the first step right, chance after); only memory does better, up to
    4."""

    name = "Recall"

    def reset_env(self, key, params):
        target = jax.random.randint(key, (2,), 0, self.n)
        state = GuessState(target, jnp.ones((2, self.n), bool), jnp.int32(0))
        return jax.nn.one_hot(target, self.n), state

    def step_env(self, key, state, actions, params):
        reward = (actions == state.target).astype(jnp.float32)
        state = state.replace(time=state.time + 1)
        return jnp.zeros((2, self.n)), state, reward, jnp.zeros(2, bool), {}


def test_ippo_rnn_learns_to_remember_beyond_any_memoryless_policy_on_4_seeds_reproducibly():
    """50 updates of 16 envs x 8 steps (a minute of CPU with compilation) on `Recall`, one torso
    for actor and critic as JaxMARL's ippo_rnn: every seed's training and greedy team returns end
    above the best memoryless return, 1.75, by at least a whole step's reward (>= 2.75; the float
    rounding of the CPU's vector units decides some seeds' last step: on an Intel Xeon VM one
    seed's greedy return ends at 2.75, on the AMD EPYC CI machines above it)."""
    config = make_config(
        total_steps=6400,
        num_envs=16,
        num_steps=8,
        num_epochs=4,
        num_minibatches=2,
        lr=0.01,
        anneal_lr=False,
        log_interval=25,
        eval_envs=8,
        shared_network=True,
        network={"hidden": [16], "recurrent_hidden": 16, "init": "lecun_uniform"},
        head_hidden=[16],
    )
    env = TeamEpisodeStatistics(Recall())
    params = env.default_params
    s = ippo_rnn.setup(config, env, params, ippo_rnn.actor_view(config.agent, env, params))
    train = jax.jit(jax.vmap(train_from_trainer(ippo_rnn.trainer(s), config.agent)))
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    _, metrics = train(jnp.concatenate([keys, keys[:1]]))  # a fifth run: seed 0 again
    assert metrics["step"][0, -1] == 6400
    for name in ("episode_return", "eval_return"):
        assert np.all(metrics[name][:4, -1] >= 2.75), (name, metrics[name])
    jax.tree.map(lambda x: np.testing.assert_array_equal(x[0], x[4]), metrics)
    assert not np.array_equal(metrics["episode_return"][0], metrics["episode_return"][1])


# ---------------------------------------------------------------- the SMAX configs


@pytest.mark.parametrize("name", ["ippo_rnn", "mappo_rnn"])
@pytest.mark.parametrize("scenario", ["3m", "2s3z"])
def test_the_smax_configs_have_jaxmarls_recurrent_settings(name, scenario):
    """JaxMARL's ippo_rnn_smax / mappo_homogenous_rnn_smax settings on 3m and on 2s3z (JaxMARL's
    default map: 2 stalkers and 3 zealots, 10 actions), the configs alike but for the map."""
    from rl.config import load_config

    config = load_config(f"configs/{name}_smax_{scenario}.yaml")
    agent, network = config.agent, config.agent.network
    assert agent.name == name and config.env.params["scenario"] == scenario
    assert config.env.id == "jaxmarl:HeuristicEnemySMAX"
    other = load_config(f"configs/{name}_smax_3m.yaml")
    assert (config.agent, config.env.params | {"scenario": "3m"}) == (other.agent, other.env.params)
    assert (agent.num_envs, agent.num_steps, agent.num_epochs, agent.num_minibatches) == (
        128,
        128,
        4,
        4,
    )
    assert (network.torso, network.hidden, network.recurrent_hidden) == ("gru", (128,), 128)
    assert agent.head_hidden == (128,) and agent.max_grad_norm == 0.25
    assert agent.shared_network == (name == "ippo_rnn")  # JaxMARL's ippo_rnn: one torso


@pytest.mark.slow
@pytest.mark.parametrize("config", ["ippo_rnn_smax_3m", "mappo_rnn_smax_3m", "mappo_rnn_smax_2s3z"])
def test_rl_train_and_rl_eval_of_the_smax_config(config, tmp_path):
    """`rl train configs/CONFIG.yaml` at a tiny budget (small networks too: the compilation, about a
    minute of CPU, is the cost), then `rl eval` of the run: the greedy recurrent team policy plays
    SMAX from a fresh carry each episode, and renders one (2s3z: a team of two unit types)."""
    from rl.cli.evaluate import evaluate_run
    from rl.cli.main import main

    tiny = [
        "agent.total_steps=64",
        "agent.num_envs=4",
        "agent.num_steps=8",
        "agent.num_minibatches=2",
        "agent.log_interval=2",
        "agent.eval_envs=2",
        "agent.network.hidden=[8]",
        "agent.network.recurrent_hidden=8",
        "agent.head_hidden=[8]",
    ]
    where = ["--seeds", "2", "--output-dir", str(tmp_path), "--name", "run", "--no-progress"]
    assert main(["train", f"configs/{config}.yaml", *tiny, *where]) == 0
    gif = tmp_path / "episode.gif"
    assert main(["eval", str(tmp_path / "run"), "--episodes", "2", "--render", str(gif)]) == 0
    assert gif.stat().st_size > 0
    row = evaluate_run(tmp_path / "run", episodes=2)["settings"][0]
    assert row["seeds"] == 2 and np.isfinite(row["mean"]) and 1 <= row["length_mean"] <= 101


# ---------------------------------------------------------------- bad configs


@pytest.mark.parametrize(
    "env_id, env_params, agent, key",
    [
        ("CartPole-v1", {}, {}, "env.id: agent 'ippo_rnn' trains teams"),
        (MPE, {"action_type": "Continuous"}, {}, "env.id: ippo_rnn supports Discrete actions"),
        ("jaxmarl:hanabi", {}, {"name": "mappo_rnn"}, "env.id: mappo_rnn's centralised critic"),
        (MPE, {}, {"name": "mappo_rnn", "shared_network": True}, "agent.shared_network"),
        (MPE, {}, {"network": {"torso": "mlp"}}, "agent.network.torso: ippo_rnn needs a recurrent"),
        (MPE, {}, {"num_minibatches": 3}, "agent.num_minibatches .* whole sequences"),
        (MPE, {}, {"head_hidden": [8, 0]}, "agent.head_hidden"),
        (MPE, {}, {"name": "ippo", "network": {"torso": "gru"}}, "cannot carry .*ippo_rnn"),
    ],
)
def test_bad_configs_name_the_key(env_id, env_params, agent, key):
    build = ippo_config if agent.get("name") == "ippo" else make_config  # ippo: no head_hidden
    with pytest.raises(ConfigError, match=key):
        build(env_id, env_params, **agent)
