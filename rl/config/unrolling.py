"""`agent.unroll: auto`: the loop unroll that gives the least compile plus training time for a
run's size on the device in use, from a rule measured per agent.

Unrolling a `lax.scan` U times makes XLA compile U copies of its body (compile time grows about
linearly in U) and saves loop trips on the GPU (the training program runs faster). It pays when
the run trains long enough for the time saved to exceed the extra compile:

    unroll U  iff  platform is a GPU  and  the network is an MLP
              and  agent.total_steps (per seed) >= BREAK_EVEN[agent][seeds measured]

where BREAK_EVEN = (compile(U) - compile(1)) / (train seconds saved per env step at U), measured
on one H200 with the time-to-result presets (`benchmarks/time_to_result.py`). DQN at PureJaxRL's
CartPole settings (500k steps): unroll 8 compiled in 20.8 s against 12.1 s; at 1 seed it trained
in 2.1 s against 3.3 s (a break-even of 8.7 s / (1.2 s / 500k steps) = 3.6M steps), at 64 seeds
in 4.09 s against 4.66 s (0.57 s saved: 7.6M steps, taking the 1-seed compile gap; RESULTS.md,
DQN). The saving shrinks as seeds grow, so a run of 2 to 64 seeds takes the 64-seed break-even
and a larger one, unmeasured, stays rolled. On the CPU a loop trip costs next to nothing and
unrolling only adds compile time: auto is 1 there, and for the agents without a measured rule. A
conv net's unrolled loop compiles for minutes (MinAtar Freeway at unroll 8 did not finish
compiling in 200 s on an H100; README, PQN), so auto keeps 1 for any other torso.
"""

from __future__ import annotations

import dataclasses

from rl.config.parsing import ConfigError

GPU_PLATFORMS = ("cuda", "rocm", "gpu")

# agent: (U, {seeds measured: env steps per seed from which U pays}), one H200 (module docstring)
BREAK_EVEN = {"dqn": (8, {1: 3_600_000, 64: 7_600_000})}


def auto_unroll(agent_name: str, platform: str, env_steps: int, seeds: int = 1) -> int:
    """The unroll `auto` stands for: U for `agent_name` on a GPU when the run's `env_steps` per
    seed reach the break-even measured at the fewest seeds >= `seeds`, else 1 (also beyond the
    most seeds measured)."""
    rule = BREAK_EVEN.get(agent_name)
    if platform not in GPU_PLATFORMS or rule is None:
        return 1
    unroll, break_even = rule
    measured = [n for n in sorted(break_even) if n >= seeds]
    return unroll if measured and env_steps >= break_even[measured[0]] else 1


def resolve_unroll(agent, agent_name: str, platform: str, seeds: int = 1):
    """`agent` (an agent's Config) with `unroll: auto` replaced by `auto_unroll`'s choice; a
    config without `unroll`, or with a number, as it is. ConfigError for any other string."""
    unroll = getattr(agent, "unroll", None)
    if unroll is None or isinstance(unroll, int):
        return agent
    if unroll != "auto":
        raise ConfigError(f"agent.unroll: expected a positive integer or auto, got {unroll!r}")
    network = getattr(agent, "network", None)
    if getattr(network, "torso", "mlp") != "mlp":
        return dataclasses.replace(agent, unroll=1)
    env_steps = int(getattr(agent, "total_steps", 0))
    return dataclasses.replace(agent, unroll=auto_unroll(agent_name, platform, env_steps, seeds))


def unroll_of(agent) -> int:
    """`agent.unroll` as a number: `auto` (left in a Config built in Python, not by
    rl.config.build_config, which resolves it for the run's seeds) resolved for one seed on JAX's
    default device. The agent's name is its Config's module's (`rl.agents.dqn` -> dqn)."""
    if isinstance(agent.unroll, int):
        return agent.unroll
    import jax

    name = type(agent).__module__.rpartition(".")[2]
    return resolve_unroll(agent, name, jax.devices()[0].platform).unroll
