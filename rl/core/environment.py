"""The env an agent trains on: `make_env` (the configured env with episode statistics, Box actions
rescaled to [-1, 1]), the env's batched reset and step, the checks an agent makes of an env's spaces
before anything compiles, and the kernel backend the agent passes to every kernels op.

    env, env_params = environment.make_env(config)
    reset, step = environment.batched(env)       # vmapped over a leading env axis
"""

from __future__ import annotations

import jax
import numpy as np

import kernels
from envs.multi_agent import TeamEpisodeStatistics, is_multi_agent
from envs.spaces import Box, Discrete
from envs.wrappers import EpisodeStatistics, RescaleAction, Wrapper
from rl.config.parsing import ConfigError


def make_env(config):
    """(env, env_params) for `config.env` (`EnvConfig.make`: its observation masked if `env.observe`
    is set), wrapped for training:

    - Box actions are rescaled: the agent acts in [-1, 1]^d, the env receives
      L + (clip(a, -1, 1) + 1) (H - L) / 2 (`envs.wrappers.RescaleAction`; needs finite bounds);
    - `envs.wrappers.EpisodeStatistics` reports each episode's undiscounted return and length in
      `info` when it ends (terminated or truncated); for a multi-agent env
      `envs.multi_agent.TeamEpisodeStatistics`, the team's (mean over agents) return.
    """
    env, env_params = config.env.make()
    if is_multi_agent(env):
        return TeamEpisodeStatistics(env), env_params
    space = env.action_space(env_params)
    if (
        isinstance(space, Box)
        and np.all(np.isfinite(space.low))
        and np.all(np.isfinite(space.high))
    ):
        env = RescaleAction(env)
    return EpisodeStatistics(env), env_params


def to_env_action(env, env_params, action):
    """The unwrapped env's action for an agent action, through the action wrappers of `env`'s
    stack (`RescaleAction` from `make_env`); the identity for discrete actions."""
    while isinstance(env, Wrapper):
        if isinstance(env, RescaleAction):
            action = env.inner_action(action, env_params)
        env = env.env
    return action


def batched(env):
    """(reset, step) of `env` vmapped over a leading env axis: `reset(keys[E], params)`,
    `step(keys[E], states, actions[E], params)`; params are shared."""
    return jax.vmap(env.reset, in_axes=(0, None)), jax.vmap(env.step, in_axes=(0, 0, 0, None))


def check_bounded_actions(config, env, env_params, discrete_ok: bool = False) -> None:
    """ConfigError unless observations are a flat Box (read by an mlp or simbav2 torso) and actions
    a bounded Box (or Discrete, if `discrete_ok`)."""
    action_space, obs_space = env.action_space(env_params), env.observation_space(env_params)
    name = config.agent.name
    if not isinstance(obs_space, Box) or len(obs_space.shape) != 1:
        raise ConfigError(
            f"env.id: {name} needs vector (Box) observations; {config.env.id} has {obs_space}"
        )
    if config.agent.network.torso not in ("mlp", "simbav2"):
        raise ConfigError(
            f"agent.network.torso: {name} supports only the mlp and simbav2 torsos (its critics "
            f"read concat(obs, action)); got {config.agent.network.torso!r}"
        )
    if isinstance(action_space, Discrete) and discrete_ok:
        return
    if not isinstance(action_space, Box):
        wanted = "bounded Box or Discrete" if discrete_ok else "continuous (Box)"
        raise ConfigError(
            f"env.id: {name} needs {wanted} actions; {config.env.id} has {action_space}"
        )
    if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
        raise ConfigError(
            f"env.id: {name} needs bounded Box actions; {config.env.id} has {action_space}"
        )


def check_discrete_actions(config, env, env_params) -> None:
    """ConfigError unless the env's actions are Discrete (Q-learning with a network needs them)."""
    space = env.action_space(env_params)
    if not isinstance(space, Discrete):
        raise ConfigError(
            f"env.id: {config.agent.name} needs discrete actions; {config.env.id} has {space}"
        )


def check_policy_env(config, env, env_params) -> None:
    """ConfigError unless the env's actions are Discrete or a bounded Box (a policy-gradient agent's
    categorical or Gaussian policy)."""
    space, name = env.action_space(env_params), config.agent.name
    if isinstance(space, Box) and not (
        np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))
    ):
        raise ConfigError(f"env.id: {name} needs bounded Box actions; {config.env.id} has {space}")
    if not isinstance(space, (Box, Discrete)):
        raise ConfigError(
            f"env.id: {name} needs Discrete or Box actions; {config.env.id} has {space}"
        )


def kernel_precision(config) -> str:
    """The fused MLP kernels' matmul precision (their `dot_precision=`) for
    `config.kernels.precision`: "bf16" and "tf32" as named; "float32" gives float32 operands whose
    products follow `run.matmul_precision`, as XLA's float32 matmuls in the same program do: "ieee"
    (full float32) at "highest", else "tf32" (the tensor cores' TF32, full float32 on the CPU).
    Fixed when the agent is built and passed down as a value, like `kernel_backend`."""
    precision = config.kernels.precision
    if precision in ("bf16", "tf32"):
        return precision
    return "ieee" if config.run.matmul_precision == "highest" else "tf32"


def kernel_backend(config) -> str:
    """The kernel backend the agent passes to every kernels op, fixed when the agent is built:
    `config.kernels.backend` resolved by `kernels.resolve_backend` (a named backend that cannot run
    raises `kernels.BackendUnavailableError` here). Where that is the automatic choice ("auto" with
    no process-wide setting and no FUSEDRL_KERNEL_BACKEND), "auto" itself, so that each op picks by
    the device and, where it measured XLA faster at small shapes, by its own shape."""
    name = kernels.resolve_backend(config.kernels.backend)
    return "auto" if kernels.launch.chosen_automatically(config.kernels.backend) else name
