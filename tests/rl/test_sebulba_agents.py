"""The actor-learner architecture (rl.sebulba) beyond PPO on gymnasium: PQN's actors and
learner, `rl eval` of a sebulba run, the cnn torso reading envpool's uint8 frames stacked channels
first, and envpool's Atari envs in an actor (skipped without envpool). The CartPole learning checks
are marked slow."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from run_helpers import REPO, run_cli
from test_sebulba import COUNTDOWN, SMALL

from rl.agents import pqn
from rl.config import build_config, hyperparams, load_config
from rl.nn import layers, networks
from rl.nn.network_config import NetworkConfig
from rl.sebulba import learner as sebulba
from rl.sebulba.pieces import make_pieces

PQN_SMALL = {**SMALL, "name": "pqn", "epsilon_decay_fraction": 0.5, "reward_scale": 1.0}


def pqn_config(agent=None, arch=None):
    data = {"env": {"id": COUNTDOWN}, "agent": {**PQN_SMALL, **(agent or {})}}
    return build_config({**data, "arch": {"name": "sebulba", **(arch or {})}})


# ---------------------------------------------------------------- PQN


def test_pqn_actors_act_epsilon_greedy_with_the_epsilon_of_the_steps_before_the_rollout():
    config = pqn_config()
    pieces = make_pieces(config)
    hparams = hyperparams(config.agent)
    params, _, _ = pieces.init(jax.random.PRNGKey(0), hparams, np.zeros((1,), np.float32))
    obs = jnp.arange(64, dtype=jnp.float32).reshape(64, 1) / 8
    greedy = np.asarray(pqn.greedy_policy(make_q(config), params)(obs))
    act = jax.jit(pieces.act)
    acted = lambda step: np.asarray(act(hparams, params, obs, jax.random.PRNGKey(1), step)[2])
    # epsilon 1 at step 0, 0.05 from half of the 2048 steps on
    assert (acted(0) != greedy).sum() > 16
    assert (acted(1024) != greedy).sum() <= 10
    hparams = {**hparams, "epsilon_end": jnp.float32(0.0)}
    np.testing.assert_array_equal(acted(1024), greedy)


def make_q(config):
    return pqn.make_q_network(config.agent, *config.env.make()).apply


def test_pqn_learns_from_the_actors_rollouts_with_lag_within_max_lag():
    learner = sebulba.Learner(pqn_config(arch={"max_lag": 1}))
    state, rows = learner.run(learner.init(), num_updates=8)
    assert int(state.updates) == 8 and [row["step"] for row in rows] == [
        64 * (u + 1) for u in range(8)
    ]
    assert all(np.isfinite(row["loss"]) and np.isfinite(row["q_mean"]) for row in rows)
    assert max(row["param_lag_max"] for row in rows) <= 1
    returns = [row["episode_return"] for row in rows if row["episodes"]]
    assert returns and all(3.0 <= r <= 5.0 for r in returns)  # Countdown's 3- and 5-step episodes


def test_pqn_targets_bootstrap_a_truncation_from_the_observation_it_reached():
    config = pqn_config(agent={"num_envs": 2, "num_steps": 12, "gamma": 0.9, "total_steps": 1152})
    pieces = make_pieces(config)
    hparams = hyperparams(config.agent)
    params, _, _ = pieces.init(jax.random.PRNGKey(0), hparams, np.zeros((1,), np.float32))
    actor = sebulba.Actor(
        pieces, config, jax.jit(pieces.act), [0, 1], jax.random.PRNGKey(1), jax.devices()[0]
    )
    traj, _, _ = actor.rollout(params)
    assert np.flatnonzero(traj.truncated[:, 0]).tolist() == [7]
    apply = make_q(config)
    targets = np.asarray(pqn.q_lambda_targets(apply, params, traj, hparams, "reference"))
    q_next = np.asarray(apply(params, traj.final_obs)).max(-1)
    lam, expected, next_return = float(hparams["q_lambda"]), np.zeros((12, 2)), np.zeros(2)
    for t in reversed(range(12)):
        ongoing, ended = 1.0 - traj.terminated[t], traj.terminated[t] | traj.truncated[t]
        lam_t = lam * (1.0 - ended) if t < 11 else 0.0
        g = (1 - lam_t) * q_next[t] + lam_t * next_return
        expected[t] = next_return = traj.reward[t] + 0.9 * ongoing * g
    np.testing.assert_allclose(targets, expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- rl eval of a sebulba run


def test_rl_eval_plays_a_sebulba_runs_greedy_policy_on_the_host_envs(tmp_path, capsys):
    path = tmp_path / "countdown.yaml"
    data = build_config(  # SMALL: the learner test_sebulba compiles (rl.sebulba.programs)
        {"env": {"id": COUNTDOWN}, "agent": {"name": "ppo", **SMALL}, "arch": "sebulba"}
    ).to_dict()
    data["run"].update(output_dir=str(tmp_path), name="demo", progress=False)
    path.write_text(yaml.safe_dump(data))
    assert run_cli(["train", path]) == 0
    capsys.readouterr()
    out = tmp_path / "eval.json"
    assert run_cli(["eval", tmp_path / "demo", "--episodes", "3", "--json", out]) == 0
    (setting,) = json.loads(out.read_text())["settings"]
    # every env's first (seeded) Countdown episode terminates after 3 steps, a reward of 1 each
    assert (setting["episodes"], setting["mean"], setting["length_mean"]) == (3, 3.0, 3.0)
    assert run_cli(["eval", tmp_path / "demo", "--render", tmp_path / "x.gif"]) == 2
    assert "--render: not for arch sebulba runs" in capsys.readouterr().err
    # from a checkpoint (the learner's state, not the one-program agent's), named or the newest
    # where the run has no final params (stopped before its end)
    checkpoints = sorted(int(p.name) for p in (tmp_path / "demo" / "checkpoints").iterdir())
    args = ["eval", tmp_path / "demo", "--episodes", "3", "--json", out]
    assert run_cli([*args, "--checkpoint", str(checkpoints[-1])]) == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["settings"] == [setting]
    (tmp_path / "demo" / "final_params.msgpack").unlink()
    assert run_cli(args) == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["params"].endswith(str(checkpoints[-1])) and result["settings"] == [setting]


# ---------------------------------------------------------------- images


def test_the_cnn_torso_reads_uint8_frames_channels_first_as_scaled_frames_channels_last(
    full_precision_matmuls,
):
    # (full float32 convolutions on the GPU too: at TF32 the two layouts round apart, ~5e-5)
    from envs.spaces import Box

    frames = np.random.default_rng(0).integers(0, 256, (3, 4, 44, 44), np.uint8)
    first = NetworkConfig(torso="nature_cnn", hidden=(32,), channels_first=True)
    last = NetworkConfig(torso="nature_cnn", hidden=(32,))
    build = lambda config, shape: layers.build(
        networks.make_torso(config, Box(0, 255, shape, np.uint8)), "flax", "orthogonal"
    )
    net_first, net_last = build(first, (4, 44, 44)), build(last, (44, 44, 4))
    scaled = np.moveaxis(frames, 1, -1).astype(np.float32) / 255
    params = net_last.init(jax.random.PRNGKey(0), scaled[0])
    np.testing.assert_allclose(
        net_first.apply(params, frames), net_last.apply(params, scaled), rtol=1e-5, atol=1e-6
    )
    with pytest.raises(ValueError, match=r"channels_first: true"):
        networks.make_torso(last, Box(0, 255, (4, 44, 44), np.uint8))


# ---------------------------------------------------------------- envpool's Atari in an actor


ATARI_SMALL = [
    "agent.num_envs=4",
    "agent.num_steps=32",
    "agent.total_steps=256",
    "agent.log_interval=1",
    "env.params.img_height=44",
    "env.params.img_width=44",
]


@pytest.mark.parametrize("agent", ["ppo", "pqn"])
def test_an_actor_steps_envpool_atari_with_uint8_frames_and_either_autoreset(agent):
    """Same-step resets: a step after an end acts on the next episode's first frames. Next-step
    resets (envpool's own, arch.autoreset's default for envpool): it acts on the final frames,
    resets the env (reward 0, no end) and is recorded as a reset step."""
    pytest.importorskip("envpool")
    for autoreset in ("same_step", "next_step"):
        overrides = [*ATARI_SMALL, f"arch.autoreset={autoreset}"]
        config = load_config(REPO / f"configs/{agent}_atari_breakout.yaml", overrides)
        learner = sebulba.Learner(config)
        state = learner.init()
        actor = sebulba.Actor(
            learner.pieces, config, learner.policy, [5, 6], jax.random.PRNGKey(0), jax.devices()[0]
        )
        try:
            traj, _, _ = actor.rollout(state.params)
        finally:
            actor.close()
        assert traj.obs.dtype == np.uint8 and traj.obs.shape == (32, 2, 4, 44, 44)
        ended = traj.terminated | traj.truncated
        assert ended[:-1].any(), "no life lost in 31 steps: more steps"
        if autoreset == "same_step":
            assert traj.reset_step is None
            t, i = np.argwhere(ended[:-1])[0]
            assert not np.array_equal(traj.final_obs[t, i], traj.obs[t + 1, i])  # a new episode's
            running = ~ended[:-1]
            np.testing.assert_array_equal(traj.final_obs[:-1][running], traj.obs[1:][running])
        else:
            np.testing.assert_array_equal(traj.reset_step[1:], ended[:-1])
            np.testing.assert_array_equal(traj.final_obs[:-1], traj.obs[1:])
            assert (traj.reward[traj.reset_step] == 0).all()
            assert not ended[traj.reset_step].any()


@pytest.mark.parametrize(
    "env_id, overrides",
    [("Breakout-v5", ATARI_SMALL), ("HalfCheetah-v5", ["env.params.max_episode_steps=16"])],
)
def test_rl_eval_plays_an_envpool_runs_greedy_policy(tmp_path, capsys, env_id, overrides):
    """`rl eval` of an envpool run: its params are read into the learner's state (envpool's envs
    cannot reset inside JAX) and played on envpool's host envs; the game's score for Atari."""
    envpool = pytest.importorskip("envpool")
    if env_id not in envpool.list_all_envs():  # an envpool built without MuJoCo
        pytest.skip(f"needs envpool's {env_id}")
    config = "ppo_atari_breakout" if env_id.startswith("Breakout") else "ppo_sebulba_halfcheetah"
    args = ["train", REPO / f"configs/{config}.yaml", "--output-dir", tmp_path, "--name", "run"]
    small = ["agent.num_envs=4", "agent.num_steps=32", "agent.total_steps=256"]
    small += ["agent.log_interval=1", f"env.id=envpool:{env_id}", "run.progress=false"]
    assert run_cli([*args, *small, *overrides]) == 0, capsys.readouterr().err
    out = tmp_path / "eval.json"
    assert run_cli(["eval", tmp_path / "run", "--episodes", "2", "--json", out]) == 0, (
        capsys.readouterr().err
    )
    (setting,) = json.loads(out.read_text())["settings"]
    assert setting["episodes"] == 2 and np.isfinite(setting["mean"])
    if env_id.startswith("HalfCheetah"):
        assert setting["length_mean"] == 16.0  # the time limit the run trained with


# ---------------------------------------------------------------- learning (slow)


@pytest.mark.slow
def test_pqn_through_the_actor_learner_path_solves_cartpole_on_most_of_4_seeds():
    """PQN (configs/pqn_sebulba_cartpole.yaml: 2 actor threads, the learner on the CPU, gymnasium
    CartPole): the greedy return at the last log point >= 475 on at least 3 of 4 seeds."""
    finals = []
    for seed in range(4):
        cartpole = load_config(REPO / "configs/pqn_sebulba_cartpole.yaml", [f"run.seed={seed}"])
        _, metrics = sebulba.train(cartpole)
        finals.append(float(metrics["eval_return"][-1]))
    assert sum(value >= 475 for value in finals) >= 3, finals
