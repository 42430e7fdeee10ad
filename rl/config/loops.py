"""The settings of agents of one family, which each agent's `Config` extends: the replay loop of
value-based agents (`ReplayLoopConfig`: DQN, Rainbow), the replay loop of continuous-control
actor-critics (`ReplayActorCriticConfig`: SAC, TD3), the rollout-then-learn loop of on-policy
agents (`OnPolicyLoopConfig`: PQN) and PPO's (`PPOLoopConfig`: PPO, recurrent PPO). Each
`validate` names the config key whose value cannot work.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

from rl.config.parsing import ConfigError, hp

UNROLL_DOC = (
    "loop trips (speed only, the same computation): a phase's env and gradient loops unroll "
    "min(unroll, n); the loop over phases max(1, unroll // max(env_iterations, gradient_steps)); "
    "auto: rl.config.unrolling's measured choice for the device and the run's size"
)


@dataclass(frozen=True)
class ReplayLoopConfig:
    """Settings of the act-then-train loop of value-based replay agents (DQN, Rainbow), which
    extend it: `num_envs` envs step together with epsilon-greedy actions; after every `train_freq`
    env steps (all envs counted) come `gradient_steps` gradient steps on batches of `batch_size`,
    once `learning_starts` env steps are stored; the target network follows the online one every
    `target_update_interval` gradient steps (target <- tau online + (1 - tau) target). A log point
    comes every `log_interval // train_freq` phases (`rl.replay.loop`)."""

    total_steps: int = hp(102_400, low=1, doc="env steps per seed (all envs counted)")
    num_envs: int = hp(1, low=1, doc="envs stepped together")
    buffer_size: int = hp(100_000, low=1, doc="replay capacity (transitions)")
    learning_starts: int = hp(1_000, low=0, doc="env steps before the first gradient step")
    batch_size: int = hp(64, low=1)
    train_freq: int = hp(256, low=1, doc="env steps between training phases (multiple of num_envs)")
    gradient_steps: int = hp(128, low=1, doc="gradient steps per training phase")
    lr: float = hp(5e-4, low=0.0, low_open=True, sweep=True, doc="Adam step size")
    gamma: float = hp(0.99, low=0.0, high=1.0, sweep=True, doc="discount")
    max_grad_norm: float = hp(
        10.0, low=0.0, low_open=True, sweep=True, doc="global-norm gradient clipping"
    )
    target_update_interval: int = hp(256, low=1, doc="gradient steps between target updates")
    tau: float = hp(
        1.0, low=0.0, high=1.0, low_open=True, sweep=True, doc="Polyak step of the target network"
    )
    epsilon_start: float = hp(1.0, low=0.0, high=1.0, sweep=True)
    epsilon_end: float = hp(0.04, low=0.0, high=1.0, sweep=True)
    epsilon_decay_steps: int = hp(8_000, low=1, doc="env steps of the linear epsilon decay")
    log_interval: int = hp(
        2_560, low=1, doc="env steps between log points (multiple of train_freq)"
    )
    eval_episodes: int = hp(
        10,
        low=0,
        doc="greedy episodes per log point, on separate eval envs (0: none, no eval_return)",
    )
    unroll: typing.Union[int, str] = hp("auto", low=1, doc=UNROLL_DOC)

    def validate(self):
        """The step counts nest: num_envs | train_freq | log_interval | total_steps; one step of the
        envs fits the buffer."""
        nested = ("num_envs", "train_freq", "log_interval", "total_steps")
        for inner, outer in zip(nested, nested[1:]):
            if getattr(self, outer) % getattr(self, inner):
                raise ConfigError(
                    f"agent.{outer} ({getattr(self, outer)}) must be a multiple of agent.{inner} "
                    f"({getattr(self, inner)})"
                )
        if self.num_envs > self.buffer_size:
            raise ConfigError(
                f"agent.buffer_size ({self.buffer_size}) must hold at least one step of "
                f"agent.num_envs ({self.num_envs}) envs"
            )


@dataclass(frozen=True)
class ReplayActorCriticConfig:
    """Settings of the loop of replay actor-critics with continuous control (SAC, TD3), which extend
    it: each phase `num_envs` envs take one step, the transitions go to a uniform replay buffer,
    then `utd_ratio * num_envs` gradient steps follow on batches of `batch_size`, once
    `learning_starts` env steps (of uniformly random actions) are stored; a log point comes every
    `log_interval // num_envs` phases (`rl.agents.actor_critic.scan_phases`)."""

    total_steps: int = hp(20_000, low=1, doc="env steps per seed (all envs counted)")
    num_envs: int = hp(1, low=1, doc="envs stepped together")
    utd_ratio: float = hp(
        1.0,
        low=0.0,
        low_open=True,
        doc="gradient steps per env step (utd_ratio * num_envs must be a whole number)",
    )
    buffer_size: int = hp(100_000, low=1, doc="replay capacity (transitions)")
    learning_starts: int = hp(
        1_000, low=0, doc="env steps of uniformly random actions before learning"
    )
    batch_size: int = hp(256, low=1)
    lr: float = hp(
        1e-3, low=0.0, low_open=True, sweep=True, doc="Adam step size of actor and critics"
    )
    gamma: float = hp(0.99, low=0.0, high=1.0, sweep=True, doc="discount")
    tau: float = hp(
        0.005,
        low=0.0,
        high=1.0,
        low_open=True,
        sweep=True,
        doc="Polyak step of the target networks",
    )
    max_grad_norm: float = hp(
        1e6,
        low=0.0,
        low_open=True,
        sweep=True,
        doc="global gradient-norm clip of actor and critics (large: off)",
    )
    log_interval: int = hp(1_000, low=1, doc="env steps between log points (multiple of num_envs)")
    eval_episodes: int = hp(
        8, low=0, doc="deterministic evaluation episodes per log point (0: none)"
    )
    unroll: typing.Union[int, str] = hp("auto", low=1, doc=UNROLL_DOC)
    target_networks: bool = hp(
        True,
        doc="bootstrap from Polyak-averaged target critics (and target actor: TD3); false: from "
        "the online critics in one joint pass over (s, a) and (s', a') (CrossQ)",
    )
    adam_b1: float = hp(
        0.9, low=0.0, high=1.0, high_open=True, doc="Adam's first-moment decay (CrossQ: 0.5)"
    )

    @property
    def gradient_steps(self) -> int:
        """Gradient steps after each vectorised env step."""
        return int(round(self.utd_ratio * self.num_envs))

    @property
    def num_log_points(self) -> int:
        """Log points in a whole run."""
        return self.total_steps // self.log_interval

    def validate(self):
        network = getattr(self, "network", None)
        if getattr(network, "batch_renorm", False) and self.target_networks:
            raise ConfigError(
                "agent.network.batch_renorm needs agent.target_networks: false (CrossQ: the "
                "critics' batch statistics come from one joint pass over (s, a) and (s', a'))"
            )
        if (
            abs(self.utd_ratio * self.num_envs - self.gradient_steps) > 1e-9
            or self.gradient_steps < 1
        ):
            raise ConfigError(
                f"agent.utd_ratio ({self.utd_ratio}) * agent.num_envs ({self.num_envs}) must be a "
                "whole number >= 1"
            )
        if self.log_interval % self.num_envs:
            raise ConfigError(
                f"agent.log_interval ({self.log_interval}) must be a multiple of agent.num_envs "
                f"({self.num_envs})"
            )
        if self.total_steps % self.log_interval:
            raise ConfigError(
                f"agent.total_steps ({self.total_steps}) must be a multiple of agent.log_interval "
                f"({self.log_interval})"
            )


@dataclass(frozen=True)
class OnPolicyLoopConfig:
    """Settings of the rollout-then-learn loop of on-policy agents (PQN), which extend it: each
    update `num_envs` envs step `num_steps` times with the current network, then `num_epochs`
    passes over that batch in `num_minibatches` shuffled minibatches, one Adam step each."""

    total_steps: int = hp(
        500_000, low=1, doc="env steps per seed (all envs counted), rounded down to whole updates"
    )
    num_envs: int = hp(32, low=1, doc="parallel envs")
    num_steps: int = hp(64, low=1, doc="rollout length per env per update")
    num_epochs: int = hp(4, low=1, doc="passes over each rollout")
    num_minibatches: int = hp(16, low=1, doc="minibatches per pass")
    anneal_lr: bool = hp(True, doc="linear learning-rate decay to 0 over the run")
    log_interval: int = hp(8, low=1, doc="updates between log points")
    eval_envs: int = hp(
        0, low=0, doc="greedy evaluation episodes at each log point (0: no evaluation)"
    )
    unroll: typing.Union[int, str] = hp(
        "auto",
        low=1,
        doc="iterations per loop trip of the rollout and minibatch scans (speed only: fewer loop "
        "trips on the GPU); auto: rl.config.unrolling's measured choice for the device and the "
        "run's size",
    )

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_steps // self.batch_size

    def validate(self):
        if self.batch_size % self.num_minibatches:
            raise ConfigError(
                f"agent.num_minibatches ({self.num_minibatches}) must divide "
                f"agent.num_envs * agent.num_steps ({self.batch_size})"
            )
        if self.num_updates < 1:
            raise ConfigError(
                f"agent.total_steps ({self.total_steps}) must be at least "
                f"agent.num_envs * agent.num_steps ({self.batch_size})"
            )
        if self.num_updates % self.log_interval:
            lower = self.num_updates // self.log_interval * self.log_interval * self.batch_size
            raise ConfigError(
                f"agent.log_interval ({self.log_interval} updates) must divide the number of "
                f"updates agent.total_steps // (agent.num_envs * agent.num_steps) = "
                f"{self.num_updates}; "
                f"e.g. agent.total_steps={max(lower, self.log_interval * self.batch_size)} or "
                f"{lower + self.log_interval * self.batch_size}"
            )


@dataclass(frozen=True)
class PPOLoopConfig(OnPolicyLoopConfig):
    """Settings of PPO's loop, which PPO and recurrent PPO extend: `OnPolicyLoopConfig`'s rollouts
    and epochs of shuffled minibatches (PPO's defaults: 4 envs x 128 steps, 4 minibatches), each
    minibatch an Adam step on PPO's clipped objective (`rl.core.losses.ppo_loss`), advantages from
    truncation-aware GAE."""

    num_envs: int = hp(4, low=1, doc="parallel envs")
    num_steps: int = hp(128, low=1, doc="rollout length per env per update")
    num_minibatches: int = hp(4, low=1, doc="minibatches per pass")
    lr: float = hp(
        2.5e-4,
        low=0.0,
        low_open=True,
        sweep=True,
        doc="Adam step size (annealed to 0 if anneal_lr)",
    )
    gamma: float = hp(0.99, low=0.0, high=1.0, sweep=True, doc="discount")
    gae_lambda: float = hp(0.95, low=0.0, high=1.0, sweep=True, doc="GAE lambda")
    clip_eps: float = hp(0.2, low=0.0, sweep=True, doc="surrogate clip range")
    clip_value_loss: bool = hp(True, doc="clip the value update around the old values")
    vf_clip_eps: float = hp(0.2, low=0.0, sweep=True, doc="value clip range (if clip_value_loss)")
    ent_coef: float = hp(0.01, low=0.0, sweep=True, doc="entropy bonus coefficient")
    vf_coef: float = hp(0.5, low=0.0, sweep=True, doc="value loss coefficient")
    max_grad_norm: float = hp(
        0.5, low=0.0, low_open=True, sweep=True, doc="global gradient-norm clip"
    )
    adam_eps: float = hp(
        1e-5,
        low=0.0,
        low_open=True,
        doc="Adam's epsilon (1e-5: the PPO implementations' usual; 1e-8: optax's and Brax's)",
    )
    normalize_advantages: bool = hp(True, doc="normalise advantages per minibatch")
    reward_scale: float = hp(
        1.0, low=0.0, low_open=True, sweep=True, doc="rewards are multiplied by this for learning"
    )
    shared_network: bool = hp(False, doc="one torso for actor and critic")
    continuous_policy: str = hp(
        "gaussian",
        choices=("gaussian", "tanh_gaussian"),
        doc="policy for Box actions: a Gaussian with a learned state-independent log-std, its "
        "samples clipped to the bounds; or a tanh-squashed Gaussian with a state-dependent scale "
        "softplus(x) + 0.001 (Brax's PPO)",
    )
    log_std_init: float = hp(
        0.0, doc="initial log-std of the gaussian policy (continuous_policy: gaussian)"
    )

    def validate(self):
        if self.batch_size % self.num_minibatches:
            raise ConfigError(
                f"agent.num_minibatches ({self.num_minibatches}) must divide agent.num_envs * "
                f"agent.num_steps ({self.batch_size})"
            )
        if self.num_updates < 1 or self.num_updates % self.log_interval:
            raise ConfigError(
                total_steps_problem(self.total_steps, self.batch_size, self.log_interval)
            )


def total_steps_problem(total_steps: int, batch_size: int, log_interval: int) -> str:
    """The message for a total_steps whose whole updates (total_steps // batch_size) are not a
    positive multiple of log_interval, with the nearest values that work: the multiples of
    batch_size * log_interval."""
    unit = batch_size * log_interval
    below = total_steps // unit * unit
    valid = [value for value in (below, below + unit) if value > 0]
    updates = total_steps // batch_size
    return (
        f"agent.total_steps ({total_steps}) gives {updates} updates of agent.num_envs * "
        f"agent.num_steps = {batch_size} steps, which must be a positive multiple of "
        f"agent.log_interval ({log_interval}); nearest valid: "
        + " or ".join(f"agent.total_steps={value}" for value in valid)
        + f" (multiples of {batch_size} * {log_interval} = {unit})"
    )
