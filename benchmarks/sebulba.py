"""Throughput of the actor-learner architecture (rl.sebulba) against its envs' own speed.

    python benchmarks/sebulba.py --config configs/ppo_atari_breakout.yaml --envs 8 --threads 2
    python benchmarks/sebulba.py --config configs/ppo_sebulba_cartpole.yaml --seconds 5 \\
        --env-groups 1 --measure random,agent                 # gymnasium's CartPole, on the CPU

For one layout (`--envs` envs over `--threads` actor threads, i.e. agent.num_envs and
arch.actor_threads), or several in turn (`--layouts 8x2,64x4`), it measures, each for `--seconds`
after its compile and warm-up:

* random: env steps/s of `--threads` Python threads, each stepping its own vector env of envs /
  threads envs (the actors' vector envs: envpool or gymnasium, rl.sebulba.host_envs.make_vector_env,
  resetting as arch.autoreset says; envpool stacking its frames as env.params say, whatever
  arch.frame_stack) with uniformly random actions: what the envs give without acting or
  learning;
* raw (envpool ids only): the same with bare envpool pools (`envpool.make` with the config's
  env.params), whose envs reset in the step after the one that ended their episode (that step's
  action ignored): envpool's own rate, without envs.envpool.VectorEnv (with arch.autoreset
  same_step it adds a second envpool step for the envs that ended, which random and the actors
  then include);
* act: one act's parts, in microseconds (median of 200), at one thread's envs (envs / threads),
  random observations of the env's shape and dtype, no envs stepping: `send_us`, the
  observations to the actor's device (`jax.device_put`, waited for; `send_frame_us`, with
  env.params.stack_num > 1, one frame of each stack, what `arch.frame_stack: device` sends);
  `program_us`, the acting program on observations already there until its env action is on
  the host; `act_us`, the actor's act as it runs (host observations, which the call sends);
* actors: env steps/s of the actor threads alone (rl.sebulba.learner.Actor, as a run's actors), each
  rolling out with the initial params without waiting for a learner: the actors' ceiling, with
  their shares of time waiting for their envs and acting, and an act's mean milliseconds;
* learner: env steps/s of the learner alone: its updates on ready-made rollouts (one actor
  rollout per actor thread, made before the clock starts) taken in as the run takes its rollouts
  in (`Learner.batch`), dispatched one after another and waited for at the end: the learner's
  ceiling, its host side included;
* agent: env steps/s of the whole run (rl.sebulba.learner.Learner.run, stopped after `--seconds`):
the
  median over its log points after the first two (at least three are needed), its overall rate
  (all its steps over the run's wall clock, the actors' start included), the learner's share of
  time waiting for rollouts, the actors' shares of time waiting for their envs and for their
  acting (rl.sebulba.actor.Times; the rest is their host work) and the mean parameter lag;
  compile_s is 0 where an earlier measurement of the process compiled the same update.

random, raw and learner run once per layout, actors and agent once per `--env-groups` value
(arch.env_groups). One JSON line per measurement, then a table with agent / random: the share of
the envs' own rate the run keeps (near 1: acting and learning keep up with the envs), against the
random rate measured just before (envpool's rate moves between calls, and within one by up to a
tenth: `--layouts 256x2,256x2,256x2` measures a layout in three rounds, each its own ratio).
Extra arguments are config overrides (`agent.num_steps=64`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path

import gymnasium
import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl.config import load_config  # noqa: E402
from rl.config.arch import REPLAY_AGENTS, autoreset_mode  # noqa: E402
from rl.sebulba import learner as sebulba
from rl.sebulba.actor import acting_program  # noqa: E402
from rl.sebulba.host_envs import make_vector_env  # noqa: E402
from rl.sebulba.pieces import rollout_sizes  # noqa: E402
from rl.sebulba.programs import local_copy  # noqa: E402

MEASURES = ("random", "raw", "act", "actors", "learner", "agent")


def layout_config(config_path: str, envs: int, threads: int, overrides: list[str]):
    """The config with `envs` envs over `threads` actor threads, and `overrides`."""
    layout = [f"agent.num_envs={envs}", f"arch.actor_threads={threads}"]
    return load_config(config_path, [*layout, *overrides])


def random_actions(space, rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` uniformly random actions of a Discrete (from its `start`) or bounded Box action space;
    ValueError naming the space otherwise."""
    if isinstance(space, gymnasium.spaces.Discrete):
        return int(space.start) + rng.integers(0, int(space.n), n)
    if isinstance(space, gymnasium.spaces.Box) and space.is_bounded("both"):
        low, high = np.broadcast_arrays(space.low, space.high)
        return rng.uniform(low, high, (n, *low.shape)).astype(space.dtype)
    raise ValueError(f"random actions need a Discrete or a bounded Box action space, got {space}")


def random_throughput(config, threads: int, seconds: float) -> dict:
    """Env steps/s of `threads` threads stepping their own vector envs with random actions."""
    per_thread = config.agent.num_envs // threads
    mode, autoreset = config.arch.vector_env, autoreset_mode(config)
    seeds = lambda i: list(range(1000 * i, 1000 * i + per_thread))
    pools = [make_vector_env(config, seeds(i), mode, autoreset)[0] for i in range(threads)]
    return stepping_rate(pools, [pool.single_action_space for pool in pools], seconds)


def raw_throughput(config, threads: int, seconds: float) -> dict:
    """Env steps/s of `threads` threads stepping their own bare envpool pools (envpool's own
    auto-reset) with random actions."""
    import envpool

    env_id = config.env.id.partition(":")[2]
    per_thread = config.agent.num_envs // threads
    pools = []
    for i in range(threads):
        pool = envpool.make(
            env_id, env_type="gymnasium", num_envs=per_thread, seed=1000 * i, **config.env.params
        )
        pool.reset()
        pools.append(pool)
    return stepping_rate(pools, [pool.action_space for pool in pools], seconds)


def stepping_rate(pools: list, spaces: list, seconds: float) -> dict:
    """{"sps": env steps/s} of one thread per vector env of `pools` stepping it (`step(actions)`)
    with random actions of its action space in `spaces`, for `seconds` after a warm-up; the pools
    are closed after."""
    counts, stop = [0] * len(pools), threading.Event()

    def work(i):
        rng, pool = np.random.default_rng(i), pools[i]
        while not stop.is_set():
            pool.step(random_actions(spaces[i], rng, pool.num_envs))
            counts[i] += pool.num_envs

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(pools))]
    for worker in workers:
        worker.start()
    time.sleep(min(2.0, seconds / 2))  # warm up
    start, begun = time.perf_counter(), sum(counts)
    time.sleep(seconds)
    done, end = sum(counts), time.perf_counter()
    stop.set()
    for worker in workers:
        worker.join()
    for pool in pools:
        pool.close()
    return {"sps": (done - begun) / (end - start)}


def make_actors(learner: sebulba.Learner, config, threads: int) -> list:
    """`threads` actors as a run's (rl.sebulba.learner.Actor), each on its share of the envs."""
    per_actor = config.agent.num_envs // threads
    return [
        sebulba.Actor(
            learner.pieces,
            config,
            learner.policy,
            list(range(1000 * i, 1000 * i + per_actor)),
            jax.random.PRNGKey(i),
            learner.actor_devices[i % len(learner.actor_devices)],
        )
        for i in range(threads)
    ]


def act_parts(config, threads: int, repeats: int = 200) -> dict:
    """One act's parts at one thread's envs (module docstring)."""
    learner = sebulba.Learner(config)
    state = learner.init()
    device = learner.actor_devices[0]
    act = acting_program(learner.policy, device)
    params, hparams = jax.device_put((state.params, learner.hparams), device)
    key, step = jax.device_put((jax.random.PRNGKey(0), np.int32(0)), device)
    space, envs = learner.pieces.obs_space, config.agent.num_envs // threads
    dtype, rng = np.dtype(learner.pieces.obs_dtype), np.random.default_rng(0)
    shape = (envs, *space.shape)
    draw = lambda: (
        rng.integers(0, 256, shape).astype(dtype)
        if dtype.kind in "ui"
        else rng.standard_normal(shape).astype(dtype)
    )
    host = [draw() for _ in range(4)]
    on_device = jax.device_put(host[0], device)
    acted = lambda obs: np.asarray(act(hparams, params, obs, key, step)[2])

    def median_us(fn) -> float:
        fn(0)  # compile and warm up
        times = []
        for i in range(repeats):
            start = time.perf_counter()
            fn(i)
            times.append(time.perf_counter() - start)
        return 1e6 * float(np.median(times))

    send = lambda x: jax.block_until_ready(jax.device_put(x, device))
    frames = {}
    if int(config.env.params.get("stack_num", 1)) > 1:  # what arch.frame_stack: device sends
        frames["send_frame_us"] = median_us(lambda i: send(host[i % 4][:, :1]))
    return {
        "send_us": median_us(lambda i: send(host[i % 4])),
        **frames,
        "program_us": median_us(lambda i: acted(on_device)),
        "act_us": median_us(lambda i: acted(host[i % 4])),
        "obs_mb": host[0].nbytes / 2**20,
    }


def actors_throughput(config, threads: int, seconds: float) -> dict:
    """Env steps/s of the actor threads alone, rolling out with the initial params, their shares
    of time waiting for their envs and acting (rl.sebulba.actor.Times), and the mean act's
    milliseconds (one group's envs)."""
    learner = sebulba.Learner(config)
    state = learner.init()
    per_actor, actors = config.agent.num_envs // threads, make_actors(learner, config, threads)
    params = [jax.device_put(state.params, actor.device) for actor in actors]
    for actor, p in zip(actors, params):
        actor.warm_up(p)  # compile and warm up
        actor.rollout(p)
    batch, counts = rollout_sizes(config).num_steps * per_actor, [0] * threads
    stop = threading.Event()
    spent = [np.zeros(3) for _ in range(threads)]  # envs, acting, total seconds

    def work(i):
        while not stop.is_set():
            actors[i].rollout(params[i], counts[i])
            counts[i] += batch
            spent[i] += actors[i].times

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - start
    for actor in actors:
        actor.close()
    envs_s, acting_s, total_s = sum(spent)
    return {
        "sps": sum(counts) / wall,
        "actor_env_wait": envs_s / total_s,
        "actor_act_wait": acting_s / total_s,
        "act_ms": 1e3 * acting_s / (sum(counts) / per_actor * config.arch.env_groups),
    }


def learner_throughput(config, threads: int, seconds: float) -> dict:
    """Env steps/s of the learner alone on ready-made rollouts (module docstring); a replay agent's
    with its gradient steps from the first update (agent.learning_starts 0)."""
    if config.agent.name in REPLAY_AGENTS:
        config = dataclasses.replace(
            config, agent=dataclasses.replace(config.agent, learning_starts=0)
        )
    learner = sebulba.Learner(config)
    state = learner.init()
    learner.compile(state)
    learn = learner.programs.compiled["learn"]
    actors = make_actors(learner, config, threads)
    # each taken in every update
    params = [jax.device_put(local_copy(state.params), actor.device) for actor in actors]
    rollouts = [actor.rollout(p)[0] for actor, p in zip(actors, params)]
    for actor in actors:
        actor.close()
    learned, key = state[:3], jax.random.PRNGKey(0)  # params, optimiser and replay state

    def update(params, opt_state, stored):
        traj = learner.batch(rollouts)
        return learn(learner.hparams, params, opt_state, stored, traj, key)[:3]

    learned = jax.block_until_ready(update(*learned))  # warm up (a replay agent's optimiser and
    # replay state are donated: the next update takes the ones this returns)
    start, updates = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        learned = update(*learned)
        updates += 1
    jax.block_until_ready(learned)
    wall = time.perf_counter() - start
    return {"sps": updates * rollout_sizes(config).steps / wall, "update_s": wall / updates}


def agent_throughput(config_path: str, envs: int, threads: int, seconds: float, overrides) -> dict:
    """The whole run's env steps/s (module docstring), stopped after `seconds`; a log point about
    every 4096 env steps."""
    probe = layout_config(config_path, envs, threads, overrides)
    per_update = rollout_sizes(probe).steps
    log = max(1, 4096 // per_update)
    updates = 4096 - 4096 % log  # more than the run does in `seconds`
    log_interval = log * per_update if probe.agent.name in REPLAY_AGENTS else log  # env steps
    timing = [f"agent.total_steps={updates * per_update}", f"agent.log_interval={log_interval}"]
    config = layout_config(config_path, envs, threads, [*overrides, *timing])
    learner = sebulba.Learner(config)
    state = learner.init()
    learner.compile(state)
    deadline: list[float] = []

    def should_stop():
        if not deadline:  # the clock starts with the run
            deadline.append(time.monotonic() + seconds)
        return time.monotonic() > deadline[0]

    start = time.perf_counter()
    final, rows = learner.run(state, should_stop=should_stop)
    wall = time.perf_counter() - start
    if len(rows) < 3:
        return {"error": f"{len(rows)} log points in {seconds} s, 3 needed; give more --seconds"}
    kept = rows[2:]  # the first two hold the actors' start and the queues filling
    return {
        "sps": float(np.median([r["sps"] for r in kept])),
        "sps_overall": int(final.step) / wall,
        "rollout_wait": float(np.median([r["rollout_wait"] for r in kept])),
        "actor_env_wait": float(np.median([r["actor_env_wait"] for r in kept])),
        "actor_act_wait": float(np.median([r["actor_act_wait"] for r in kept])),
        "param_lag": float(np.mean([r["param_lag"] for r in kept])),
        "log_points": len(rows),
        "compile_s": learner.compile_seconds,
    }


def parse_layouts(text: str) -> list[tuple[int, int]]:
    """[(envs, threads)] of "ExT,ExT,..." (e.g. "8x2,64x4"); ValueError naming a bad item."""
    layouts = []
    for item in text.split(","):
        envs, x, threads = item.strip().partition("x")
        if not (x and envs.isdigit() and threads.isdigit()) or int(threads) == 0:
            raise ValueError(f"--layouts: {item!r} is not ENVSxTHREADS (e.g. 64x4)")
        layouts.append((int(envs), int(threads)))
    return layouts


def table(rows: list[dict]) -> str:
    """The measurements as a Markdown table: a line per agent measurement, beside the random,
    raw, learner and actors measurements of its layout (envs x threads; actors: and env_groups
    value) made last before it, so that a layout measured several times (`--layouts
    256x2,256x2`) pairs each agent rate with its own round's random rate; agent / random and
    agent / raw are the agent rate over those."""
    layout = lambda r: (r["envs"], r["threads"])
    random_sps, raw_sps, learner_sps, actors = {}, {}, {}, {}  # the latest, as the rows come
    lines = [
        "| envs x threads | env_groups | random sps | raw sps | actors sps | learner sps | "
        "agent sps (overall) | agent / random | agent / raw | learner waiting | "
        "actors: envs / acting / rest | lag |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["what"] == "random" and "sps" in r:
            random_sps[layout(r)] = r["sps"]
        elif r["what"] == "raw":
            raw_sps[layout(r)] = r["sps"]
        elif r["what"] == "learner":
            learner_sps[layout(r)] = r["sps"]
        elif r["what"] == "actors":
            actors[(layout(r), r["env_groups"])] = r
        if r["what"] != "agent":
            continue
        if "error" in r:
            lines.append(f"| {r['envs']} x {r['threads']} | {r['env_groups']} | {r['error']} |")
            continue
        actor_sps = actors.get((layout(r), r["env_groups"]), {}).get("sps", np.nan)
        random = random_sps.get(layout(r), np.nan)
        raw = raw_sps.get(layout(r), np.nan)
        learner = learner_sps.get(layout(r), np.nan)
        lines.append(
            f"| {r['envs']} x {r['threads']} | {r['env_groups']} | {random:.0f} | {raw:.0f} | "
            f"{actor_sps:.0f} | {learner:.0f} | {r['sps']:.0f} ({r['sps_overall']:.0f}) | "
            f"{r['sps'] / random:.2f} | {r['sps'] / raw:.2f} | {r['rollout_wait']:.2f} | "
            f"{r['actor_env_wait']:.2f} / {r['actor_act_wait']:.2f} / "
            f"{1 - r['actor_env_wait'] - r['actor_act_wait']:.2f} | {r['param_lag']:.2f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/ppo_atari_breakout.yaml")
    parser.add_argument("--envs", type=int, default=8, help="agent.num_envs")
    parser.add_argument("--threads", type=int, default=2, help="arch.actor_threads")
    parser.add_argument(
        "--layouts",
        help="several layouts in turn, ENVSxTHREADS comma-separated (e.g. 8x2,64x4); "
        "instead of --envs and --threads",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="per measurement")
    parser.add_argument("--env-groups", default="1,2", help="arch.env_groups values, e.g. 1,2")
    parser.add_argument(
        "--measure", default=",".join(MEASURES), help=f"a comma-separated subset of {MEASURES}"
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. agent.num_steps=64")
    args = parser.parse_intermixed_args(argv)
    measures = args.measure.split(",")
    unknown = sorted(set(measures) - set(MEASURES))
    if unknown:
        parser.error(f"--measure: unknown {unknown}; choose from {MEASURES}")
    groups = [int(g) for g in args.env_groups.split(",")]
    try:
        layouts = parse_layouts(args.layouts) if args.layouts else [(args.envs, args.threads)]
    except ValueError as error:
        parser.error(str(error))
    for envs, threads in layouts:  # every config first: bad input refused before measuring
        for g in groups:
            config = layout_config(
                args.config, envs, threads, [*args.overrides, f"arch.env_groups={g}"]
            )
    if "raw" in measures and not config.env.id.startswith("envpool:"):
        parser.error(
            f"--measure raw: envpool ids only ({args.config} steps {config.env.id}, whose vector "
            "env is its library's own: `random` measures it)"
        )
    rows = []

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    for envs, threads in layouts:
        base = {"envs": envs, "threads": threads, "device": str(jax.devices()[0])}
        base["config"] = args.config
        if "random" in measures:
            config = layout_config(args.config, envs, threads, args.overrides)
            emit({**base, "what": "random", **random_throughput(config, threads, args.seconds)})
        if "raw" in measures:
            config = layout_config(args.config, envs, threads, args.overrides)
            emit({**base, "what": "raw", **raw_throughput(config, threads, args.seconds)})
        if "act" in measures:
            config = layout_config(args.config, envs, threads, args.overrides)
            emit({**base, "what": "act", **act_parts(config, threads)})
        if "learner" in measures:
            config = layout_config(args.config, envs, threads, args.overrides)
            emit({**base, "what": "learner", **learner_throughput(config, threads, args.seconds)})
        for g in groups:
            overrides = [*args.overrides, f"arch.env_groups={g}"]
            grouped = {**base, "env_groups": g}
            if "actors" in measures:
                cfg = layout_config(args.config, envs, threads, overrides)
                emit({**grouped, "what": "actors", **actors_throughput(cfg, threads, args.seconds)})
            if "agent" in measures:
                result = agent_throughput(args.config, envs, threads, args.seconds, overrides)
                emit({**grouped, "what": "agent", **result})
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
