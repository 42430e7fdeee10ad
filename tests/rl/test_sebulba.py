"""The actor-learner architecture (rl.sebulba): configs it refuses before anything starts,
the exchange's waits and stalls, an actor's error stopping the run, lag bounded by arch.max_lag,
rollouts keeping truncation apart from termination (GAE targets against a hand-built recursion),
the learner's update against the one-program PPO's, and `rl train` writing (and, after Ctrl-C,
resuming) a run directory. The CartPole learning check is marked slow."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import gymnasium
import jax
import numpy as np
import pytest
import yaml
from run_helpers import REPO, run_cli, subprocess_env

from rl.agents import ppo
from rl.config import build_config, hyperparams, load_config
from rl.config.parsing import ConfigError
from rl.core import episodes
from rl.run.actor_learner import append_log_point
from rl.sebulba import learner as sebulba
from rl.sebulba.exchange import Exchange, StallError, Stopped
from rl.sebulba.pieces import make_pieces

# ---------------------------------------------------------------- a toy gymnasium env

# what Countdown instances made from now on do at step `at`: raise, sleep `sleep` seconds, or (with
# `release`, a threading.Event) wait until the test sets it; `woke` (a path) is written once a
# sleep or wait ends. STEPS counts every Countdown step taken.
FAULT = {"at": None, "sleep": 0.0, "release": None, "woke": None}
STEPS = [0]


class Countdown(gymnasium.Env):
    """obs [t] (steps into the episode), reward 1 a step; even-numbered episodes (counted from the
    last seeded reset) terminate at t = 3, odd ones would at t = 7 but registration's TimeLimit
    truncates them at t = 5. At its
    FAULT["at"]-th step an instance raises (or, with FAULT["sleep"], sleeps that long once; with
    FAULT["release"], waits until it is set, a minute at most)."""

    observation_space = gymnasium.spaces.Box(0.0, 10.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self):
        self.fault, self.steps, self.episode, self.t = dict(FAULT), 0, -1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)  # a seed starts the count again: a seeded reset is reproducible
        self.episode, self.t = 0 if seed is not None else self.episode + 1, 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.steps += 1
        STEPS[0] += 1
        if self.steps == self.fault["at"]:
            if self.fault["release"] is not None:
                self.fault["release"].wait(timeout=60)
            elif not self.fault["sleep"]:
                raise RuntimeError(f"boom at step {self.steps}")
            else:
                time.sleep(self.fault["sleep"])
            if self.fault["woke"]:
                Path(self.fault["woke"]).write_text("")
        self.t += 1
        end = 3 if self.episode % 2 == 0 else 7
        return np.array([self.t], np.float32), 1.0, self.t == end, False, {}


gymnasium.register("FusedrlTest/Countdown-v0", entry_point=Countdown, max_episode_steps=5)
COUNTDOWN = "gymnasium:FusedrlTest/Countdown-v0"

# 32 updates of 4 envs x 16 steps: every test's learner compiles once (rl.sebulba.programs)
SMALL = {
    "total_steps": 2048,
    "num_envs": 4,
    "num_steps": 16,
    "num_epochs": 2,
    "num_minibatches": 2,
    "network": {"hidden": [16]},
    "log_interval": 1,
}


def config(env=COUNTDOWN, arch=None, agent=None, **sections):
    data = {"env": {"id": env}, "agent": {"name": "ppo", **SMALL, **(agent or {})}}
    return build_config({**data, "arch": {"name": "sebulba", **(arch or {})}, **sections})


@pytest.fixture(scope="module")
def learner():
    """The Countdown learner, compiled, and its initial state."""
    learner = sebulba.Learner(config())
    state = learner.init()
    learner.compile(state)
    return learner, state


@pytest.fixture
def fault(monkeypatch):
    def set_fault(at, sleep=0.0, release=None, woke=None):
        monkeypatch.setitem(FAULT, "at", at)
        monkeypatch.setitem(FAULT, "sleep", sleep)
        monkeypatch.setitem(FAULT, "release", release)
        monkeypatch.setitem(FAULT, "woke", woke)

    return set_fault


# ---------------------------------------------------------------- refused before anything starts


@pytest.mark.parametrize(
    "change, message",
    [
        ({"env": "CartPole-v1"}, r"env.id: arch sebulba steps gymnasium vector envs"),
        ({"env": "gymnasium:CartPol-v1"}, r"env.id: .*CartPol"),
        ({"arch": {"actor_threads": 3}}, r"arch.actor_threads: .* 3 actor threads"),
        ({"arch": {"learner_devices": [0, 1, 2]}}, r"arch.learner_devices: .* 3 learner devices"),
        ({"arch": {"actor_devices": [0, 0]}}, r"arch.actor_devices: expected distinct"),
        ({"arch": {"vector_env": "asyncc"}}, r"arch.vector_env: 'asyncc' is not one of"),
        ({"arch": {"env_groups": 3}}, r"arch.env_groups: each actor thread's 2 envs"),
        ({"arch": {"name": "sebulbaa"}}, r"did you mean 'sebulba'"),
        ({"run": {"seeds": 2}}, r"run.seeds: arch sebulba trains one seed"),
    ],
)
def test_configs_that_cannot_work_are_refused_when_loaded(change, message):
    with pytest.raises(ConfigError, match=message):
        config(**change)


def test_sebulba_settings_need_the_sebulba_arch_and_only_its_agents_run_on_it():
    with pytest.raises(ConfigError, match=r"arch.max_lag is a setting of the actor-learner"):
        build_config(
            {"env": {"id": "CartPole-v1"}, "agent": {"name": "ppo"}, "arch": {"max_lag": 2}}
        )
    with pytest.raises(ConfigError, match=r"sebulba trains dqn, ppo, pqn, sac, td3, not 'rainbow'"):
        build_config(
            {
                "env": {"id": "gymnasium:CartPole-v1"},
                "agent": {"name": "rainbow"},
                "arch": "sebulba",
            }
        )
    assert (
        "arch"
        not in build_config({"env": {"id": "CartPole-v1"}, "agent": {"name": "ppo"}}).to_dict()
    )


def test_a_device_that_is_not_there_is_refused_before_the_run_directory_is_made(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"arch.learner_devices: there is no device 7"):
        sebulba.check_devices(config(arch={"learner_devices": [7]}))
    args = ["train", "ppo_sebulba_cartpole", "--output-dir", tmp_path, "arch.actor_devices=[3]"]
    assert run_cli(args) == 2
    assert "arch.actor_devices: there is no device 3" in capsys.readouterr().err
    assert run_cli(["train", "ppo_sebulba_cartpole", "--sweep", "agent.lr=1e-3,3e-3"]) == 2
    assert "--sweep: not for arch sebulba" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- the exchange's waits


class Arch:
    actor_threads, queue_size, queue_timeout_s = 1, 1, 0.3


def test_every_wait_times_out_naming_the_side_that_stalled_and_stops_on_request():
    exchange = Exchange({"w": 0}, 0, Arch())
    with pytest.raises(StallError, match=r"actor 0 waited 0.3 s .* version 1; .* learner stalled"):
        exchange.params_for(1, "actor 0")
    exchange.put(0, "rollout 0", "actor 0")
    with pytest.raises(StallError, match=r"actor 0 waited .* queue is full\): the learner stalled"):
        exchange.put(0, "rollout 1", "actor 0")
    assert exchange.take(0) == "rollout 0"
    with pytest.raises(StallError, match=r"waited 0.3 s .* of actor 0: the actor stalled"):
        exchange.take(0)
    exchange.stop.set()
    with pytest.raises(Stopped):
        exchange.params_for(1, "actor 0")
    failing = Exchange({}, 0, Arch())
    failing.fail(ValueError("env broke"), "actor 0")
    with pytest.raises(ValueError, match="env broke"):
        failing.take(0)


# ---------------------------------------------------------------- faults in a running loop


def actor_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("sebulba-actor")]


def test_an_actor_that_raises_stops_the_whole_run_with_its_error(learner, fault):
    """The run stops with the actor's error, long before its 2048 env steps, and no actor thread
    is left (the other actor stopped too)."""
    learner, state = learner
    fault(at=40)
    before = STEPS[0]
    with pytest.raises(RuntimeError, match="boom at step 40"):
        learner.run(state)
    assert actor_threads() == []
    # 2 actors x 2 envs: about 4 x 40 steps, plus a rollout collected ahead (arch.max_lag 1)
    assert STEPS[0] - before < 512


def test_a_stalled_actor_stops_the_run_after_the_queue_timeout(learner, fault, tmp_path):
    """An env step that does not return until the test releases it (or a minute passes): the
    learner's wait for that actor's rollout times out and the run stops with a StallError while the
    env is still stalled, without waiting for it."""
    _, state = learner
    release, woke = threading.Event(), tmp_path / "woke"
    fault(at=20, release=release, woke=woke)
    stalling = sebulba.Learner(config(arch={"queue_timeout_s": 0.5}))
    try:
        with pytest.raises(StallError, match=r"for a rollout of actor \d: the actor stalled"):
            stalling.run(state)
        assert not woke.exists()  # the env is still in its step
    finally:
        release.set()


@pytest.mark.parametrize("max_lag", [0, 2])
def test_the_lag_of_every_update_is_within_max_lag(learner, max_lag):
    _, state = learner
    lagging = sebulba.Learner(config(arch={"max_lag": max_lag, "queue_size": 3}))
    _, rows = lagging.run(state, num_updates=12)
    assert [row["step"] for row in rows] == [64 * (u + 1) for u in range(12)]
    lags = [row["param_lag_max"] for row in rows]
    assert max(lags) <= max_lag and min(row["param_lag"] for row in rows) >= 0
    if max_lag == 0:
        assert lags == [0] * 12


def test_each_log_point_says_where_the_actors_time_went(learner, fault):
    _, state = learner
    fault(at=20, sleep=1.0)  # one env's step takes a second, once
    _, rows = sebulba.Learner(config(agent={"log_interval": 4})).run(state, num_updates=8)
    for row in rows:
        shares = row["actor_env_wait"], row["actor_act_wait"]
        assert min(shares) >= 0 and sum(shares) <= 1 + 1e-9, row
    assert max(row["actor_env_wait"] for row in rows) > 0.5  # the second spent in that step


# ---------------------------------------------------------------- rollouts and the learner's update


def test_rollouts_keep_truncation_apart_from_termination_in_the_gae_targets(learner):
    learner, state = learner
    toy = config(agent={"num_envs": 2, "num_steps": 12, "gamma": 0.9, "total_steps": 1152})
    s = ppo.make_setup(toy)
    device = learner.actor_devices[0]
    pieces = make_pieces(toy)
    actor = sebulba.Actor(pieces, toy, learner.policy, [0, 1], jax.random.PRNGKey(1), device)
    traj, returns, lengths = actor.rollout(state.params)
    # episodes: steps 0-2 end by termination at t = 3, steps 3-7 by the time limit at t = 5 (the
    # env would go on to 7), steps 8-10 by termination; step 11 starts the fourth
    assert np.flatnonzero(traj.terminated[:, 0]).tolist() == [2, 10]
    assert np.flatnonzero(traj.truncated[:, 0]).tolist() == [7]
    assert traj.final_obs[[2, 7, 10, 11], 0, 0].tolist() == [3, 5, 3, 1]
    assert traj.obs[[3, 8, 11], 0, 0].tolist() == [0, 0, 0]
    assert returns == [3.0, 3.0, 5.0, 5.0, 3.0, 3.0] and lengths == [3, 3, 5, 5, 3, 3]
    # GAE: V(final_obs) bootstraps a truncation, no chain crosses an episode end
    hparams = hyperparams(toy.agent)
    _, advantages, targets = ppo.learn_batch(s, hparams, state.params, traj)
    value = lambda obs: np.asarray(s.net.apply(state.params, obs)[1], np.float64)
    v, v_final = value(traj.obs), value(traj.final_obs)
    gamma, lam = 0.9, float(hparams["gae_lambda"])
    expected, next_advantage = np.zeros_like(v), np.zeros(2)
    for t in reversed(range(12)):
        ongoing = 1.0 - traj.terminated[t]
        delta = traj.reward[t] + gamma * ongoing * v_final[t] - v[t]
        cut = ongoing * (1.0 - traj.truncated[t])
        expected[t] = next_advantage = delta + gamma * lam * cut * next_advantage
    close = partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)
    close(np.asarray(advantages).reshape(12, 2), expected)
    close(np.asarray(targets).reshape(12, 2), expected + v)


def test_rollouts_keep_their_observations_on_the_actors_device_and_the_batch_joins_them(learner):
    """An actor's rollout holds the obs, the agent's record and (next-step resets) the reached obs
    as arrays on its device, the env's columns as NumPy arrays; `Learner.batch` joins two actors'
    rollouts on the env axis into the batch the host join of the same values gives, on the
    learner's sharding."""
    learner, state = learner
    device, pieces = learner.actor_devices[0], learner.pieces
    for mode in ("same_step", "next_step"):
        cfg = config(arch={"autoreset": mode})
        actors = [
            sebulba.Actor(pieces, cfg, learner.policy, seeds, jax.random.PRNGKey(i), device)
            for i, seeds in enumerate(([0, 1], [2, 3]))
        ]
        trajs = [actor.rollout(state.params)[0] for actor in actors]
        for actor in actors:
            actor.close()
        on_device = {"obs", "action", "log_prob"} | (
            {"final_obs"} if mode == "next_step" else set()
        )
        for traj in trajs:
            for name, column in traj._asdict().items():
                if column is not None:
                    assert isinstance(column, jax.Array) == (name in on_device), (mode, name)
        batch = learner.batch(trajs)
        host = [jax.tree.map(np.asarray, traj) for traj in trajs]
        for name, got, want in zip(batch._fields, batch, learner.batch(host)):
            if got is None:
                continue
            assert got.shape == (16, 4, *got.shape[2:]) and got.sharding == want.sharding, name
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=name)
        np.testing.assert_array_equal(np.asarray(batch.obs)[:, 2:], np.asarray(trajs[1].obs))


@pytest.mark.parametrize("mode", ["same_step", "next_step"])
def test_an_actor_warmed_up_compiles_nothing_more_and_keeps_its_key(learner, mode):
    """`Actor.warm_up` compiles the acting for every kind of observations a rollout acts on (host
    ones after a step, device ones at a rollout's start) without taking from the actor's PRNG key:
    rollouts after it add no program to the acting's cache."""
    learner, state = learner
    cfg, device = config(arch={"autoreset": mode}), learner.actor_devices[0]
    actor = sebulba.Actor(
        learner.pieces, cfg, learner.policy, [0, 1], jax.random.PRNGKey(5), device
    )
    params = jax.device_put(state.params, device)  # as `Actor.run` and `start_actors` put them
    try:
        key = np.asarray(actor.key)
        actor.warm_up(params)
        np.testing.assert_array_equal(np.asarray(actor.key), key)
        compiled = actor.policy._cache_size()
        for k in range(3):
            actor.rollout(params, k * 32)
        assert actor.policy._cache_size() == compiled
    finally:
        actor.close()


def test_the_learners_update_is_the_one_program_ppo_update(learner):
    """One update of the one-program PPO (on the same gymnasium env, through host callbacks) and
    the sebulba learner's compiled update on the same rollout, params, optimiser state and key:
    the same bits."""
    learner, _ = learner
    anakin = build_config({"env": {"id": COUNTDOWN}, "agent": {"name": "ppo", **SMALL}})
    s = ppo.make_setup(anakin)
    hparams = hyperparams(anakin.agent)
    state = jax.jit(partial(ppo.init_state, s))(jax.random.PRNGKey(0), hparams)
    grads_fn, batch_fn = ppo.learning_pieces(anakin, s)

    def update_and_its_rollout(state):
        _, rollout_key, _ = jax.random.split(state.key, 3)
        _, traj, _ = ppo.rollout(s, state.params, state.envs, rollout_key)
        expected, _, _ = ppo.update(s, grads_fn, batch_fn, hparams, state, episodes.no_episodes())
        return expected, traj

    expected, traj = jax.jit(update_and_its_rollout)(state)
    learn_key = jax.random.split(state.key, 3)[2]
    traj = jax.device_put(jax.tree.map(np.asarray, traj), learner.programs.split)
    params, opt_state, stored, stats = learner.programs.compiled["learn"](
        hparams, state.params, state.opt_state, None, traj, learn_key
    )
    assert stored is None  # PPO keeps no replay state
    for got, want in zip(jax.tree.leaves((params, opt_state)), jax.tree.leaves(expected[:2])):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert set(stats) >= {"policy_loss", "value_loss", "entropy"}


# ---------------------------------------------------------------- rl train


def test_rl_train_writes_a_run_stops_on_ctrl_c_with_a_checkpoint_and_resumes(tmp_path, capsys):
    path = tmp_path / "countdown.yaml"
    data = config().to_dict()
    data["run"].update(output_dir=str(tmp_path), name="demo", progress=False, checkpoint_every=100)
    path.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "demo"

    def interrupt_at_the_first_log_point():
        metrics = run_dir / "metrics.jsonl"
        while not metrics.is_file() or not metrics.read_text():
            time.sleep(0.02)
        signal.raise_signal(signal.SIGINT)

    threading.Thread(target=interrupt_at_the_first_log_point, daemon=True).start()
    assert run_cli(["train", path]) == 130
    err = capsys.readouterr().err
    assert "Ctrl-C: stopping after the current update" in err and "--resume" in err
    (checkpoint,) = (run_dir / "checkpoints").iterdir()
    assert 0 < int(checkpoint.name) < 2048
    assert run_cli(["train", "--resume", run_dir]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [64 * (i + 1) for i in range(32)]
    assert {"episode_return", "param_lag", "sps", "steps_per_second"} <= set(rows[0])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["metric"] == "episode_return" and (run_dir / "final_params.msgpack").is_file()
    assert run_cli(["plot", run_dir, "-o", tmp_path / "curve.png"]) == 0
    assert (tmp_path / "curve.png").stat().st_size > 0


@pytest.mark.parametrize("env_groups", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_ppo_through_the_actor_learner_path_solves_cartpole_on_most_of_4_seeds(env_groups):
    """2 actor threads, the learner on the CPU, gymnasium CartPole with the shipped config's
    budget: the return of the training episodes at the last log point >= 475 on at least 3 of 4
    seeds; with each actor's envs in one group (in the default suite: about 95 s on 2 CPU cores),
    and in two taking turns (arch.env_groups; `-m slow`)."""
    finals = []
    for seed in range(4):
        overrides = [f"run.seed={seed}", f"arch.env_groups={env_groups}"]
        cartpole = load_config(REPO / "configs/ppo_sebulba_cartpole.yaml", overrides)
        _, metrics = sebulba.train(cartpole)
        finals.append(float(metrics["episode_return"][-1]))
    assert sum(value >= 475 for value in finals) >= 3, finals


SPLIT_LEARNER = """
import json, jax, numpy as np
from rl.sebulba import learner as sebulba
from rl.config import load_config

params = []
for devices in ([0], [0, 1]):
    overrides = ["agent.total_steps=1024", "agent.num_epochs=2", "agent.log_interval=4"]
    overrides += ["arch.max_lag=0", f"arch.learner_devices={devices}", "arch.actor_devices=[1]"]
    state, _ = sebulba.train(load_config("configs/ppo_sebulba_cartpole.yaml", overrides))
    params.append([np.asarray(x) for x in jax.tree.leaves(state.params)])
    leaves = jax.tree.leaves(state.params)
    placed = {(x.sharding.is_fully_replicated, len(x.sharding.device_set)) for x in leaves}
print(json.dumps({
    "devices": len(jax.devices()),
    "placed": sorted(placed),
    "max_difference": max(float(np.abs(a - b).max()) for a, b in zip(*params)),
}))
"""


@pytest.mark.slow
def test_a_learner_split_over_two_devices_learns_what_one_device_learns():
    """max_lag 0 makes a run deterministic: the same params whether the learner's batch is on one
    CPU device or split over two (XLA reduces the gradients), actors on the second device. Slow
    (a fresh process compiles both learners: about 50 s on a busy 2-core CPU)."""
    done = subprocess.run(
        [sys.executable, "-c", SPLIT_LEARNER],
        cwd=REPO,
        env=subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=2"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["devices"] == 2 and result["placed"] == [[True, 2]]  # replicated on both
    assert result["max_difference"] < 1e-5


def test_a_metric_new_since_a_resumed_checkpoint_starts_with_nan_for_the_earlier_log_points():
    """A run resumed from a checkpoint written before its agent logged a metric: the history keeps
    one entry per log point (what the next checkpoint's check reads), NaN before the metric."""
    history = {"step": [64, 128], "loss": [1.0, 2.0]}
    append_log_point(history, {"step": 192, "loss": 3.0, "gradient_steps": 5})
    assert history["step"] == [64, 128, 192] and history["loss"] == [1.0, 2.0, 3.0]
    assert np.isnan(history["gradient_steps"][:2]).all() and history["gradient_steps"][2] == 5
