"""The `arch` section of a config: how a run is laid out. `anakin` (the default) compiles envs,
acting and learning into one program (`rl.run.train`); `sebulba` steps gymnasium or envpool vector
envs in actor threads and learns from their rollouts in the main thread (`rl.sebulba.learner`).
`check_arch` refuses, before anything runs, what the chosen layout cannot train."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from rl.config.parsing import ConfigError, hp

SEBULBA_AGENTS = (
    "dqn",
    "ppo",
    "pqn",
    "sac",
    "td3",
)  # what rl.sebulba.learner trains (rl.sebulba.pieces)
REPLAY_AGENTS = ("dqn", "sac", "td3")  # those learning from a replay buffer (`arch.rollout_steps`)
HOST_ENV_PREFIXES = ("gymnasium:", "envpool:")  # the env ids it steps


@dataclass(frozen=True)
class ArchConfig:
    """The `arch` section (module docstring); every key but `name` is sebulba's. In a file,
    `arch: sebulba` is short for `arch: {name: sebulba}`."""

    name: str = hp("anakin", choices=("anakin", "sebulba"), doc="the architecture")
    actor_threads: int = hp(
        2, low=1, doc="sebulba: actor threads, each stepping agent.num_envs / actor_threads envs"
    )
    vector_env: str = hp(
        "sync",
        choices=("sync", "async"),
        doc="sebulba: each actor's gymnasium vector env, SyncVectorEnv (its envs stepped in the "
        "actor thread) or AsyncVectorEnv (one process per env); envpool steps its own on threads",
    )
    autoreset: str = hp(
        "auto",
        choices=("auto", "same_step", "next_step"),
        doc="sebulba: when an actor's envs reset after an episode's end: same_step (the step that "
        "ends it returns the next episode's first observation, its final one beside it) or "
        "next_step (the env resets in its next step, whose action is ignored; that step is "
        "recorded and left out of the loss); auto: next_step for envpool (its own reset: no "
        "second envpool step for the envs that ended), same_step for gymnasium",
    )
    frame_stack: str = hp(
        "envpool",
        choices=("envpool", "device"),
        doc="sebulba, envpool ids with env.params.stack_num > 1 and next-step resets: where an "
        "actor's observations are stacked: envpool (its own stack, sent to the device whole each "
        "step) or device (envpool returns single frames, a quarter of the bytes to send; the "
        "actor stacks them on its device as envpool would: rl.sebulba.frame_stack)",
    )
    env_groups: int = hp(
        1,
        low=1,
        doc="sebulba: groups each actor thread's envs are stepped in, taking turns: while one "
        "group's envs step (envpool's send/recv, gymnasium's AsyncVectorEnv step_async/step_wait) "
        "the actor acts for the next, so acting and env steps overlap (Cleanba's two env halves); "
        "1: act, then step, no overlap. A thread's envs must split evenly into the groups",
    )
    actor_devices: tuple[int, ...] = hp(
        (0,),
        doc="sebulba: indices into jax.local_devices() (each host's own) the actors act on "
        "(threads round robin)",
    )
    learner_devices: tuple[int, ...] = hp(
        (0,),
        doc="sebulba: indices into jax.local_devices() (each host's own) the learner learns on "
        "(its batch split on the env axis over them, on every host of a jax.distributed run; "
        "gradients reduced by XLA)",
    )
    max_lag: int = hp(
        1,
        low=0,
        doc="sebulba: most updates the learner may be ahead of the params a rollout was collected "
        "with (0: actors wait for every update, no overlap)",
    )
    queue_size: int = hp(1, low=1, doc="sebulba: rollouts each actor may have waiting")
    rollout_steps: int = hp(
        16,
        low=1,
        doc="sebulba, DQN, SAC and TD3: env steps each actor takes per rollout; the learner adds a "
        "rollout's transitions to its replay buffer, then takes rollout_steps x agent.utd_ratio x "
        "agent.num_envs gradient steps (SAC, TD3), or agent.gradient_steps for each "
        "agent.train_freq of its rollout_steps x agent.num_envs env steps (DQN); PPO and PQN roll "
        "out agent.num_steps steps",
    )
    queue_timeout_s: float = hp(
        300.0,
        low=0.0,
        low_open=True,
        doc="sebulba: seconds a side waits for the other (a rollout, params, room in the queue) "
        "before the run stops naming the side that stalled",
    )

    def validate(self):
        """Sebulba's keys need arch.name: sebulba; device lists are non-empty, without repeats."""
        changed = [
            f.name
            for f in dataclasses.fields(self)
            if f.name != "name" and getattr(self, f.name) != f.default
        ]
        if self.name == "anakin" and changed:
            raise ConfigError(
                f"arch.{changed[0]} is a setting of the actor-learner architecture: set "
                "arch.name: sebulba (or drop it)"
            )
        for key in ("actor_devices", "learner_devices"):
            devices = getattr(self, key)
            if not devices or len(set(devices)) != len(devices) or min(devices) < 0:
                raise ConfigError(
                    f"arch.{key}: expected distinct device indices (>= 0), got {list(devices)}"
                )


def autoreset_mode(config) -> str:
    """ "same_step" or "next_step": when the actors' envs reset (`ArchConfig.autoreset`, "auto"
    resolved by the env id, and same_step for `REPLAY_AGENTS`, whose buffers store whole
    transitions); "same_step" for arch anakin (fusedrl's own envs)."""
    if config.arch.name != "sebulba":
        return "same_step"
    if config.arch.autoreset != "auto":
        return config.arch.autoreset
    if config.agent.name in REPLAY_AGENTS:
        return "same_step"
    return "next_step" if config.env.id.startswith("envpool:") else "same_step"


def device_stack_depth(config) -> int:
    """Frames an actor stacks on its device (`ArchConfig.frame_stack` device: env.params's
    stack_num), 0 where envpool stacks them (or nothing is stacked)."""
    if config.arch.name != "sebulba" or config.arch.frame_stack != "device":
        return 0
    return int(config.env.params.get("stack_num", 0))


def check_arch(config) -> None:
    """ConfigError when `config.arch` cannot lay out this run: sebulba trains one seed of a
    `SEBULBA_AGENTS` agent on a gymnasium or envpool env (`gymnasium:<id>`, `envpool:<id>`), its
    envs split evenly over the actor threads and the learner devices, and each thread's envs over
    its env groups; an envpool env trains only under sebulba."""
    arch, agent = config.arch, config.agent
    if getattr(agent, "lag_correction", False) and (arch.name != "sebulba" or not arch.max_lag):
        raise ConfigError(
            "agent.lag_correction corrects for rollouts collected with older params: it needs "
            "arch.name: sebulba with arch.max_lag > 0 (here every rollout is on-policy)"
        )
    if arch.name != "sebulba":
        if config.env.id.startswith("envpool:"):
            raise ConfigError(
                f"env.id: {config.env.id} steps batches of envs on the host (envpool), outside "
                "JAX: train it with arch.name: sebulba"
            )
        return
    if agent.name not in SEBULBA_AGENTS:
        raise ConfigError(
            f"arch.name: sebulba trains {', '.join(SEBULBA_AGENTS)}, not {agent.name!r}; use "
            "arch.name: anakin for it"
        )
    if not config.env.id.startswith(HOST_ENV_PREFIXES) or config.env.observe is not None:
        raise ConfigError(
            f"env.id: arch sebulba steps gymnasium vector envs or envpool: use 'gymnasium:<id>' "
            f"(e.g. gymnasium:CartPole-v1) or 'envpool:<id>' (e.g. envpool:Breakout-v5) without "
            f"env.observe; got {config.env.id!r} (a JAX env trains faster in one program: "
            "arch.name: anakin)"
        )
    splits = (
        ("actor_threads", arch.actor_threads, "actor threads"),
        ("learner_devices", len(arch.learner_devices), "learner devices"),
    )
    for key, parts, what in splits:
        if agent.num_envs % parts:
            raise ConfigError(
                f"arch.{key}: agent.num_envs ({agent.num_envs}) must split evenly over {parts} "
                f"{what}"
            )
    per_actor = agent.num_envs // arch.actor_threads
    if per_actor % arch.env_groups:
        raise ConfigError(
            f"arch.env_groups: each actor thread's {per_actor} envs (agent.num_envs "
            f"{agent.num_envs} / arch.actor_threads {arch.actor_threads}) must split evenly into "
            f"{arch.env_groups} groups"
        )
    check_rollout_steps(config)
    if arch.frame_stack == "device":
        check_device_frame_stack(config)
    if config.run.seeds != 1:
        raise ConfigError(
            f"run.seeds: arch sebulba trains one seed per run, got {config.run.seeds} (start one "
            "run per seed, with run.seed)"
        )


def check_rollout_steps(config) -> None:
    """ConfigError unless the rollouts fit the agent: `arch.rollout_steps` is the replay agents'
    (PPO and PQN roll out agent.num_steps), whose learner holds one replay buffer on one device,
    stores whole transitions (same-step resets) and logs every agent.log_interval env steps, a
    multiple of an update's rollout_steps x num_envs, which hold whole training phases of
    agent.train_freq env steps where the agent has them (DQN)."""
    arch, agent = config.arch, config.agent
    default = next(f.default for f in dataclasses.fields(arch) if f.name == "rollout_steps")
    if agent.name not in REPLAY_AGENTS:
        if arch.rollout_steps != default:
            raise ConfigError(
                f"arch.rollout_steps sets the rollouts of {', '.join(REPLAY_AGENTS)}; "
                f"{agent.name}'s rollouts are agent.num_steps ({agent.num_steps}) steps long"
            )
        return
    if arch.autoreset == "next_step":
        raise ConfigError(
            f"arch.autoreset: next_step records reset steps that are not transitions; "
            f"{agent.name}'s replay buffer stores whole ones: use same_step (or auto)"
        )
    if arch.frame_stack == "device":
        raise ConfigError(
            f"arch.frame_stack: device follows envpool's next-step resets; {agent.name} resets "
            "in the same step (its buffer stores whole transitions): use arch.frame_stack: envpool"
        )
    if len(arch.learner_devices) != 1:
        raise ConfigError(
            f"arch.learner_devices: {agent.name} learns on one device, which holds its replay "
            f"buffer; got {list(arch.learner_devices)}"
        )
    steps = arch.rollout_steps * agent.num_envs
    if agent.buffer_size < steps:
        raise ConfigError(
            f"agent.buffer_size ({agent.buffer_size}) must hold an update's transitions, "
            f"arch.rollout_steps x agent.num_envs ({arch.rollout_steps} x {agent.num_envs} = "
            f"{steps})"
        )
    train_freq = getattr(agent, "train_freq", None)
    if train_freq is not None and steps % train_freq:
        unit = train_freq // math.gcd(train_freq, agent.num_envs)  # rollout_steps that fit
        fits = unit * -(-arch.rollout_steps // unit)
        raise ConfigError(
            f"arch.rollout_steps x agent.num_envs ({arch.rollout_steps} x {agent.num_envs} = "
            f"{steps} env steps an update) must be a multiple of agent.train_freq ({train_freq}): "
            "an update takes agent.gradient_steps for each train_freq env steps it holds (e.g. "
            f"arch.rollout_steps={fits})"
        )
    if agent.log_interval % steps:
        raise ConfigError(
            f"agent.log_interval ({agent.log_interval} env steps) must be a multiple of an "
            f"update's env steps, arch.rollout_steps x agent.num_envs ({arch.rollout_steps} x "
            f"{agent.num_envs} = {steps})"
        )


def check_device_frame_stack(config) -> None:
    """ConfigError unless `arch.frame_stack: device` can stack this run's frames: an envpool id,
    next-step resets (the actor follows envpool's own resets) and env.params.stack_num > 1."""
    if not config.env.id.startswith("envpool:"):
        raise ConfigError(
            f"arch.frame_stack: device stacks envpool's frames; {config.env.id} is not an envpool "
            "id (use arch.frame_stack: envpool)"
        )
    if autoreset_mode(config) != "next_step":
        raise ConfigError(
            "arch.frame_stack: device follows envpool's own resets; it needs arch.autoreset: "
            f"next_step (or auto), not {config.arch.autoreset}"
        )
    if int(config.env.params.get("stack_num", 1)) < 2:
        raise ConfigError(
            "arch.frame_stack: device needs env.params.stack_num of at least 2 (frames to stack), "
            f"got {config.env.params.get('stack_num', 'none')}"
        )
