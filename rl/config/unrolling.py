"""`agent.unroll: auto`: the loop unroll that gives the least compile plus training time for a run's
size on the device in use. Unrolling a `lax.scan` U times compiles U copies of its body and saves
loop trips on the GPU, so `auto` is U only on a GPU, for an MLP torso, for runs long enough by a
rule measured per agent (`BREAK_EVEN`, `auto_unroll`); else 1 (on the CPU a loop trip costs next
to nothing; a conv net's unrolled loop compiles for minutes).
"""

from __future__ import annotations

import dataclasses

from rl.config.parsing import ConfigError

GPU_PLATFORMS = ("cuda", "rocm", "gpu")

# agent: (U, {seeds measured: env steps per seed from which U pays}): (compile(U) - compile(1)) /
# (train seconds saved per env step at U), on one H200 with benchmarks/time_to_result.py's presets
BREAK_EVEN = {"dqn": (8, {1: 3_600_000, 64: 7_600_000})}


def auto_unroll(agent_name: str, platform: str, env_steps: int, seeds: int = 1) -> int:
    """The unroll `auto` stands for: U for `agent_name` on a GPU when the run's `env_steps` per
    seed reach the break-even measured at the fewest seeds >= `seeds`, else 1 (also beyond the
    most seeds measured, and for an agent without a measured rule)."""
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
