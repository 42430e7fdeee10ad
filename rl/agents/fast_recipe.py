"""FastTD3's recipe (Seo et al. 2025) as options of the replay actor-critics (TD3, SAC: FastSAC):
their settings (`RecipeConfig`, a base of both agents' `Config`) and the pieces their loops
compose where an option is on. Each option off leaves the loop as it was.

- `agent.distributional`: C51 twin critics over a fixed support (`rl.nn.distributional`).
- `agent.n_step`: n-step returns. Each env keeps a window of its last n steps in
  `state.envs.memory` (Rainbow's window: `rl.agents.rainbow.window_layout`, `push_window`); once
  full, the oldest step becomes one stored transition (`losses.n_step_transition`): with L the
  first step of the window where the episode ended (terminated or truncated), or n - 1,

      R = sum_{k=0..L} gamma^k r_{t+k},  s' = info["final_obs"] of step t+L,
      d = gamma^(L+1) (1 - terminated_{t+L})                                 (`bootstrap_discount`)

  so termination stops the return without a bootstrap and truncation stops it bootstrapping from
  the pre-reset observation. (The last n - 1 steps of a run are never stored.)
- `agent.normalize_obs`: observation normalisation (`rl.core.observation_norm`). The running mean
and
  variance of every observation the envs present to the actor (one update per env step, all envs)
  are `state.obs_stats`; the actor (acting, its loss, the target action) and the critics read
  clip((obs - mean) / sqrt(var + 1e-8), -obs_clip, obs_clip) with the statistics of the moment.
  The buffer keeps raw observations, so a sampled batch is normalised by today's statistics, as
  FastTD3 does.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp

from envs.spaces import Box
from rl.agents import actor_critic, rainbow
from rl.config.parsing import ConfigError, hp
from rl.core import environment, episodes, losses, observation_norm, packing
from rl.core.state import Envs
from rl.replay import buffers


@dataclass(frozen=True)
class RecipeConfig:
    """The recipe's settings, a base of TD3's and SAC's `Config` before
    `rl.config.loops.ReplayActorCriticConfig` (its `validate` calls that one's first)."""

    distributional: bool = hp(
        False,
        doc="C51 twin critics: logits over agent.num_atoms atoms on [agent.v_min, agent.v_max], "
        "cross-entropy to the projected target of the twin with the smaller expected value "
        "(FastTD3; rl.nn.distributional); runs through XLA, not the fused critic kernels",
    )
    num_atoms: int = hp(101, low=2, doc="atoms of the distributional critics' support")
    v_min: float = hp(-250.0, doc="lowest atom of the distributional critics' support")
    v_max: float = hp(250.0, doc="highest atom of the distributional critics' support")
    n_step: int = hp(
        1,
        low=1,
        high=100,
        doc="steps of the n-step return: stops at termination (no bootstrap) and at truncation "
        "(bootstrap from final_obs); 1: one-step TD",
    )
    normalize_obs: bool = hp(
        False,
        doc="actor and critics read observations normalised by their running mean and variance "
        "over every collected observation (state.obs_stats)",
    )
    obs_clip: typing.Optional[float] = hp(
        10.0,
        low=0.0,
        low_open=True,
        doc="with agent.normalize_obs, normalised observations are clipped to [-obs_clip, "
        "obs_clip]; null: not clipped",
    )

    def validate(self):
        super().validate()
        if not self.v_min < self.v_max:
            raise ConfigError(
                f"agent.v_min ({self.v_min}) must be below agent.v_max ({self.v_max})"
            )
        if self.distributional and not self.target_networks:
            raise ConfigError(
                "agent.distributional: the distributional critics bootstrap from target critics; "
                "set agent.target_networks: true (CrossQ's joint pass has scalar critics)"
            )


def check(config, env, env_params) -> None:
    """ConfigError, naming the key, where the recipe's options cannot run: distributional critics
    need Box actions, and the fused critic kernels (chosen by `kernels.backend: triton` or
    `interpret` with `agent.fused_network`) hold scalar heads only; n-step returns and observation
    normalisation run in the one-program loop (arch anakin)."""
    agent = config.agent
    if agent.distributional and not isinstance(env.action_space(env_params), Box):
        raise ConfigError(
            f"agent.distributional needs Box actions; {config.env.id} has discrete ones"
        )
    if agent.distributional and agent.fused_network and config.kernels.backend != "auto":
        if config.kernels.backend in ("triton", "interpret"):
            raise ConfigError(
                "agent.fused_network: the fused twin-critic kernels hold scalar heads, not "
                "agent.distributional's atoms; set agent.fused_network: false (the "
                "distributional critics then run through XLA, the projection on "
                f"kernels.backend {config.kernels.backend})"
            )
    if config.arch.name != "anakin":
        for key, off in (("n_step", agent.n_step == 1), ("normalize_obs", not agent.normalize_obs)):
            if not off:
                raise ConfigError(
                    f"agent.{key} runs in the one-program loop only; set arch.name: anakin "
                    f"or agent.{key} off"
                )


# ---------------------------------------------------------------- n-step returns


def bootstrap_discount(gamma, batch):
    """d [B] of a sampled batch: gamma^n (1 - terminated) for n-step transitions (those with
    "bootstrap_steps", `losses.n_step_discount`), else gamma (1 - terminated)."""
    if "bootstrap_steps" in batch:
        return losses.n_step_discount(gamma, batch["bootstrap_steps"], batch["terminated"])
    return losses.episode_discount(gamma, batch["terminated"])


def empty_window(obs, action, num_envs: int, n: int) -> tuple:
    """The envs' windows of their last n steps before any step (`state.envs.memory`), for
    observations like `obs` and actions like `action` (one env's)."""
    return rainbow.empty_window(rainbow.window_layout(obs, action), num_envs, n)


def example_transition(obs, action) -> dict:
    """One n-step transition shaped like the buffer stores it (obs, action, reward, next_obs,
    terminated, bootstrap_steps), for `buffers.uniform_init`."""
    return {
        "obs": obs,
        "action": action,
        "reward": jnp.float32(0.0),
        "next_obs": obs,
        "terminated": jnp.bool_(False),
        "bootstrap_steps": jnp.int32(1),
    }


def n_step_transitions(window, gamma, *, backend=None, deterministic=False) -> dict:
    """The n-step transition of the oldest step of each env's window (a `window_step` pytree, each
    leaf [envs, n, ...]): `losses.n_step_transition` on the time-major window."""
    time_major = jax.tree.map(lambda w: jnp.swapaxes(w, 0, 1), window)
    return losses.n_step_transition(time_major, gamma, backend=backend, deterministic=deterministic)


def step_and_store_n_step(
    env, env_params, state, totals, action, key, n: int, gamma, backend=None, deterministic=False
):
    """`actor_critic.step_and_store` with n-step transitions: all envs take `action` (the same
    keys), each env's window (`state.envs.memory`) takes the step, and once the windows are full
    (n steps of all envs) the n-step transition of each window's oldest step goes to the uniform
    buffer. Returns (state, totals)."""
    _, step = environment.batched(env)
    num_envs = action.shape[0]
    obs, env_state, reward, terminated, truncated, info = step(
        jax.random.split(key, num_envs), state.envs.state, action, env_params
    )
    layout = rainbow.window_layout(state.envs.obs[0], action[0])
    taken = rainbow.window_step(
        state.envs.obs, action, reward, info["final_obs"], terminated, truncated
    )
    window = rainbow.push_window(state.envs.memory, taken, layout)
    count = state.step + num_envs
    stored = n_step_transitions(
        packing.unpack(layout, window), gamma, backend=backend, deterministic=deterministic
    )
    state = state._replace(
        envs=Envs(obs, env_state, window),
        buffer=buffers.uniform_add(state.buffer, stored, count >= n * num_envs),
        step=count,
    )
    return state, episodes.add_episodes(totals, info)


def make_store(config) -> Callable:
    """The loop's `store(env, env_params, state, totals, action, key, hparams) -> (state, totals)`:
    `step_and_store_n_step` with `agent.n_step` > 1 (gamma read from `hparams`), else
    `actor_critic.step_and_store`."""
    agent = config.agent
    if agent.n_step == 1:
        return lambda *args, hparams: actor_critic.step_and_store(*args)
    backend, deterministic = environment.kernel_backend(config), config.kernels.deterministic
    return lambda *args, hparams: step_and_store_n_step(
        *args, agent.n_step, hparams["gamma"], backend, deterministic
    )


def with_windows(agent, envs: Envs, action) -> Envs:
    """`envs` with empty windows of their last n steps as their memory (`agent.n_step` > 1, actions
    like `action`), else as they are."""
    if agent.n_step == 1:
        return envs
    window = empty_window(envs.obs[0], jnp.asarray(action), envs.obs.shape[0], agent.n_step)
    return envs._replace(memory=window)


# ---------------------------------------------------------------- observation normalisation


def initial_obs_stats(agent, obs):
    """`state.obs_stats` at the start: mean 0, var 1 per feature of one observation `obs` with
    `agent.normalize_obs`, else None (no leaves: the state of a run without it is unchanged)."""
    if not agent.normalize_obs:
        return None
    return observation_norm.initial_observation_stats(jnp.shape(obs))


def collect_obs_stats(stats, obs):
    """`stats` merged with the envs' observations `obs` [envs, ...] (Chan et al.'s rule,
    `observation_norm.update_observation_stats`); None stays None."""
    if stats is None:
        return None
    return observation_norm.update_observation_stats(stats, obs, obs.shape[1:])


def normalized(stats, obs, clip):
    """What the networks read: `obs` normalised by `stats` and clipped to [-clip, clip]
    (`observation_norm.normalize_observation`), or `obs` itself where `stats` is None."""
    if stats is None:
        return obs
    return observation_norm.normalize_observation(obs, stats, clip)


def normalized_batch(batch: dict, stats, clip) -> dict:
    """A sampled batch with its obs and next_obs `normalized` (the batch itself for None)."""
    if stats is None:
        return batch
    return {
        **batch,
        "obs": normalized(stats, batch["obs"], clip),
        "next_obs": normalized(stats, batch["next_obs"], clip),
    }


def check_policy_params(config) -> None:
    """ConfigError for `make_policy` with `agent.normalize_obs`: the policy's params (what the
    runner saves and `rl evaluate` reads: `state.params`) hold the actor only, and its statistics
    live in `state.obs_stats`; a policy without them would read raw observations. The runs' own
    eval_return reads both."""
    if config.agent.normalize_obs:
        raise ConfigError(
            "agent.normalize_obs: the saved policy params hold the actor without its observation "
            "statistics (state.obs_stats), so the policy cannot be rebuilt from them; read the "
            "run's eval_return instead, or train with agent.normalize_obs: false"
        )
