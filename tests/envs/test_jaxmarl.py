"""The JaxMARL adapter (envs/jaxmarl.py) against JaxMARL's own `step` / `step_env` / `reset` under
the same keys: observations, the auto-reset state, rewards, JaxMARL's dones split into terminated
and truncated by each family's rule, action masks, global state and Overcooked's shaped reward,
over 300 random masked steps across episode ends, jitted (one program per env, reused from
hand-built states for the SMAX end cases); names by map and layout; `max_steps_in_episode`;
spaces; rendering; the silent import and the error naming the extra."""

from __future__ import annotations

import importlib.util
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import FUSION_EMITTERS

import envs
from envs.jaxmarl import JaxMARLState
from envs.multi_agent import TeamEpisodeState, TeamEpisodeStatistics, is_multi_agent

HAVE_JAXMARL = importlib.util.find_spec("jaxmarl") is not None
needs_jaxmarl = pytest.mark.skipif(
    not HAVE_JAXMARL, reason='needs the jaxmarl extra: pip install "fusedrl[jaxmarl]"'
)

NUM_STEPS = 300
# XLA's backend passes off (a third less time) with the CPU fusion emitters, which tests/conftest.py
# turns off elsewhere: the parity is to the last bit, and the older emitters may round the same
# expression differently in our fusion and in JaxMARL's.
FAST_COMPILE = {"xla_backend_optimization_level": 0, **FUSION_EMITTERS}
# name -> (id, keywords): the envs of issue 41, with time limits short enough for several episodes
CASES = {
    "spread": ("MPE_simple_spread_v3", {}),
    "reference": ("MPE_simple_reference_v3", {"max_steps_in_episode": 10}),
    "smax_2s3z": ("SMAX", {"scenario": "2s3z", "max_steps_in_episode": 40}),
    "smax_3s_vs_5z": ("SMAX", {"scenario": "3s_vs_5z", "max_steps_in_episode": 40}),
    "heuristic_3m": ("HeuristicEnemySMAX", {"scenario": "3m", "max_steps_in_episode": 40}),
    # stalkers and zealots against the heuristic enemies: the recurrent agents' 2s3z configs
    "heuristic_2s3z": ("HeuristicEnemySMAX", {"scenario": "2s3z", "max_steps_in_episode": 40}),
    "overcooked": ("overcooked", {"layout": "cramped_room", "max_steps_in_episode": 50}),
    "hanabi": ("hanabi", {}),
}


def family(env_id: str) -> str:
    if env_id.startswith("MPE_"):
        return "mpe"
    return "smax" if "SMAX" in env_id else env_id


def jaxmarl_masks(jx, env_id, env_state, width):
    """JaxMARL's masks (get_legal_moves for Hanabi, get_avail_actions for SMAX, none for MPE and
    Overcooked) as bool [A, width], padded with False."""
    if env_id == "hanabi":
        masks = jx.get_legal_moves(env_state)
    elif "SMAX" in env_id:
        masks = jx.get_avail_actions(env_state)
    else:
        return jnp.ones((len(jx.agents), width), bool)
    rows = [jnp.asarray(masks[a], bool) for a in jx.agents]
    return jnp.stack([jnp.pad(r, (0, width - r.shape[0])) for r in rows])


class Program:
    """One env and its jitted parity run. `prog(key)` resets fusedrl's env and JaxMARL's with the
    same key and takes NUM_STEPS random masked steps from there; `prog(key, state)` starts from
    `state` instead. Each step goes through fusedrl's `env.step` and, from the same state with the
    same key and actions, through JaxMARL's transition as its `MultiAgentEnv.step` makes it:
    `step_env` with the first key of `jax.random.split(key)` and `reset` with the second (the reset
    chosen where dones["__all__"]; `check_parity` makes that choice). Returns (fusedrl's and
    JaxMARL's first observations, the steps), NumPy arrays."""

    def __init__(self, name):
        self.env_id, kwargs = CASES[name]
        self.env, self.params = envs.make(f"jaxmarl:{self.env_id}", **kwargs)
        self.jx = self.env.env
        width = self.env.action_space(self.params).n
        env, params, jx, env_id = self.env, self.params, self.jx, self.env_id

        def run(key, state, fresh):
            reset_key, key = jax.random.split(key)
            obs, start = env.reset(reset_key, params)
            jx_obs = jx.reset(reset_key)[0]
            state = jax.tree.map(lambda a, b: jnp.where(fresh, a, b), start, state)

            def body(state, key):
                action_key, step_key = jax.random.split(key)
                mask = jaxmarl_masks(jx, env_id, state.env_state, width)
                actions = jax.random.categorical(action_key, jnp.where(mask, 0.0, -jnp.inf))
                ours = env.step(step_key, state, actions, params)
                by_agent = {a: actions[i] for i, a in enumerate(jx.agents)}
                step_env_key, reset_key = jax.random.split(step_key)
                reached = jx.step_env(step_env_key, state.env_state, by_agent)
                restart = jx.reset(reset_key)
                masks = (
                    jaxmarl_masks(jx, env_id, reached[1], width),
                    jaxmarl_masks(jx, env_id, restart[1], width),
                )
                return ours[1], (state, actions, ours, reached, restart, masks)

            steps = jax.lax.scan(body, state, jax.random.split(key, NUM_STEPS))[1]
            return (obs, jx_obs), steps

        self.run, self.compiled = jax.jit(run), None
        shapes = jax.eval_shape(lambda key: env.reset(key, params)[1], jax.random.key(0))
        self.blank = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def __call__(self, key, state=None):
        fresh = jnp.bool_(state is None)
        state = self.blank if state is None else state
        state = jax.tree.map(lambda x: jnp.array(x, x.dtype), state)  # not weak: one compile
        if self.compiled is None:  # compiled once; XLA's backend passes off (a third less time)
            self.compiled = self.run.lower(key, state, fresh).compile(FAST_COMPILE)
        return jax.tree.map(np.asarray, self.compiled(key, state, fresh))


_PROGRAMS: dict[str, Program] = {}


def program(name) -> Program:
    if name not in _PROGRAMS:
        _PROGRAMS[name] = Program(name)
    return _PROGRAMS[name]


def by_agent(values: dict, agents) -> np.ndarray:
    """A per-agent dict of [T, ...] arrays as [T, A, ...]."""
    return np.stack([np.asarray(values[a]) for a in agents], axis=1)


def expected_split(prog, env_state, dones):
    """(terminated, truncated) [T, A] by the documented rule of each family, from JaxMARL's dones
    and the state its `step_env` reached."""
    agents = prog.jx.agents
    done = by_agent(dones, agents)
    everyone = np.asarray(dones["__all__"])[:, None]
    kind = family(prog.env_id)
    if kind in ("mpe", "overcooked"):  # time limits only
        return np.zeros_like(done), done
    if kind == "hanabi":  # the game's end
        return done, np.zeros_like(done)
    battle = env_state.state if prog.env_id == "HeuristicEnemySMAX" else env_state
    alive, allies = np.asarray(battle.unit_alive), prog.jx.num_allies
    over = ~alive[:, :allies].any(-1) | ~alive[:, allies:].any(-1)
    terminated = done | over[:, None]
    return terminated, everyone & ~terminated


def check_parity(prog, trajectory):
    """Every step of `trajectory` (a Program's output) against JaxMARL's; returns (terminated,
    truncated, info) for coverage checks."""
    state, actions, ours, reached, fresh, (final_mask, fresh_mask) = trajectory
    obs, next_state, reward, terminated, truncated, info = ours
    f_obs, f_state, f_reward, f_dones, f_info = reached
    agents, kind = prog.jx.agents, family(prog.env_id)
    end = f_dones["__all__"]

    def after_reset(fresh, reached):  # JaxMARL's auto-reset: the fresh episode where it ended
        return np.where(end.reshape(-1, *[1] * (np.ndim(reached) - 1)), fresh, reached)

    jx_obs = {a: after_reset(fresh[0][a], f_obs[a]) for a in fresh[0]}
    np.testing.assert_array_equal(obs, by_agent(jx_obs, agents))
    for a, b, c in zip(*(jax.tree.leaves(x) for x in (next_state.env_state, fresh[1], f_state))):
        np.testing.assert_array_equal(a, after_reset(b, c))  # the auto-reset state is JaxMARL's
    np.testing.assert_array_equal(info["episode_end"], end)
    np.testing.assert_array_equal(next_state.time, np.where(end, 0, state.time + 1))
    np.testing.assert_array_equal(info["final_obs"], by_agent(f_obs, agents))
    np.testing.assert_array_equal(reward, by_agent(f_reward, agents).astype(np.float32))
    want_terminated, want_truncated = expected_split(prog, f_state, f_dones)
    np.testing.assert_array_equal(terminated, want_terminated)
    np.testing.assert_array_equal(truncated, want_truncated)
    assert not (terminated & truncated).any()
    np.testing.assert_array_equal(end, (terminated | truncated).all(-1))
    mask = after_reset(fresh_mask, final_mask)
    np.testing.assert_array_equal(info["action_mask"], mask)
    np.testing.assert_array_equal(info["final_action_mask"], final_mask)
    allowed = np.take_along_axis(mask[:-1], actions[1:, :, None], -1)  # the masks drove the actions
    assert allowed.all()
    if kind == "smax":
        # the world state computed in another fusion: float32 round-off apart on a GPU
        world = dict(rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(info["global_state"], jx_obs["world_state"], **world)
        np.testing.assert_allclose(info["final_global_state"], f_obs["world_state"], **world)
    elif kind == "mpe":  # every agent's observation, concatenated
        flat = lambda o: np.concatenate([np.asarray(o[a]) for a in agents], axis=-1)  # noqa: E731
        # get_obs recomputed from the state in another fusion: float32 round-off apart
        np.testing.assert_allclose(info["global_state"], flat(jx_obs), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(info["final_global_state"], flat(f_obs), rtol=1e-6, atol=1e-6)
    elif kind == "overcooked":  # the images stacked on channels; the shaped reward per agent
        channels = lambda o: np.concatenate([np.asarray(o[a]) for a in agents], -1)  # noqa: E731
        np.testing.assert_array_equal(info["global_state"], channels(jx_obs).astype(np.float32))
        np.testing.assert_array_equal(info["final_global_state"], channels(f_obs))
        np.testing.assert_array_equal(
            info["shaped_reward"], by_agent(f_info["shaped_reward"], agents)
        )
    else:
        assert "global_state" not in info
    return terminated, truncated, info


@pytest.fixture(scope="module")
def jaxmarl():
    if not HAVE_JAXMARL:
        pytest.skip('needs the jaxmarl extra: pip install "fusedrl[jaxmarl]"')
    from envs.jaxmarl import _jaxmarl

    return _jaxmarl()


@pytest.mark.parametrize("name", sorted(CASES))
def test_stepping_equals_jaxmarl_under_the_same_keys(jaxmarl, name):
    prog = program(name)
    env, params = prog.env, prog.params
    (obs, jx_obs), steps = prog(jax.random.key(1))
    np.testing.assert_array_equal(obs, np.stack([jx_obs[a] for a in prog.jx.agents]))
    space = env.observation_space(params)
    assert obs.shape == (env.num_agents, *space.shape) and obs.dtype == space.dtype

    terminated, truncated, info = check_parity(prog, steps)
    end = info["episode_end"]
    kind = family(prog.env_id)
    assert end.sum() >= 2, "the run crosses episode ends"
    if kind in ("mpe", "overcooked"):  # time-limit episodes of exactly max_steps_in_episode
        assert not terminated.any() and truncated.any()
        assert np.all(np.diff(np.flatnonzero(end)) == params.max_steps_in_episode)
    if kind == "smax":  # a dead unit is terminated while the battle goes on
        assert (terminated.any(-1) & ~end).any()
        if prog.env_id == "SMAX":
            assert (truncated.any(-1) & terminated.any(-1)).any()  # time limit, some units dead
    if prog.env_id == "HeuristicEnemySMAX":
        assert (terminated.all(-1) & end).any()  # battles lost to the heuristic enemies
    if kind == "hanabi":  # only the current player has moves other than the no-op
        assert terminated[end].all() and not truncated.any()
        mask = info["action_mask"]
        playing = mask[..., :-1].any(-1)
        assert (playing.sum(-1) == 1).all()
        assert (mask[..., -1] == ~playing).all()


def first_state(prog):
    """A fresh state of the program's env (the start of a run)."""
    return jax.tree.map(lambda x: x[0], prog(jax.random.key(3))[1][0])


def battle_state(prog, state, time_left: int, dead_allies=(), dead_enemies=()):
    """`state` with units killed and the clock set so that the next step reaches the time limit
    after `time_left` steps."""
    jx = prog.jx
    inner = state.env_state.state if prog.env_id == "HeuristicEnemySMAX" else state.env_state
    dead = np.zeros(jx.num_allies + jx.num_enemies, bool)
    dead[list(dead_allies)] = True
    dead[[jx.num_allies + i for i in dead_enemies]] = True
    limit = prog.params.max_steps_in_episode
    inner = inner.replace(
        unit_alive=inner.unit_alive & ~dead,
        unit_health=jnp.where(dead, 0.0, inner.unit_health),
        step=inner.step * 0 + (limit - time_left),  # keeps JaxMARL's (weak) type: no recompile
    )
    if prog.env_id == "HeuristicEnemySMAX":
        inner = state.env_state.replace(state=inner)
    return JaxMARLState(inner, jnp.int32(limit - time_left))


def test_smax_battle_ends_terminate_even_on_the_last_step(jaxmarl):
    """HeuristicEnemySMAX 3m from hand-built states (the parity program, reused): a battle won on
    the step that reaches the time limit terminates every ally; at the time limit a dead ally is
    terminated and the live ones truncated; a dead ally mid-battle is terminated while the episode
    goes on."""
    prog = program("heuristic_3m")
    state = first_state(prog)
    key = jax.random.key(4)

    won = battle_state(prog, state, 1, dead_enemies=(0, 1, 2))
    terminated, truncated, info = check_parity(prog, prog(key, won)[1])
    assert terminated[0].all() and not truncated[0].any() and info["episode_end"][0]

    one_down = battle_state(prog, state, 1, dead_allies=(0,))
    terminated, truncated, info = check_parity(prog, prog(key, one_down)[1])
    np.testing.assert_array_equal(terminated[0], [True, False, False])
    np.testing.assert_array_equal(truncated[0], [False, True, True])

    mid_battle = battle_state(prog, state, 20, dead_allies=(1,))
    terminated, truncated, info = check_parity(prog, prog(key, mid_battle)[1])
    np.testing.assert_array_equal(terminated[:3], [[False, True, False]] * 3)
    assert not info["episode_end"][:3].any()
    np.testing.assert_array_equal(
        info["action_mask"][:3, 1, :], [[False] * 4 + [True] + [False] * 3] * 3
    )


def test_spaces_params_and_global_state_space(jaxmarl):
    """Each env's spaces, episode length and global-state space (cached: the same object)."""
    want = {  # id, keywords -> obs shape, dtype, actions, agents, global state, steps an episode
        ("MPE_simple_spread_v3", ()): ((18,), np.float32, 5, 3, (54,), 26),
        ("MPE_simple_reference_v3", ()): ((21,), np.float32, 50, 2, (42,), 26),
        ("SMAX", (("scenario", "3m"),)): (None, np.float32, 8, 6, (6 * 12,), 101),
        ("SMAX", (("scenario", "3s_vs_5z"),)): (None, np.float32, 10, 8, (8 * 12,), 101),
        ("HeuristicEnemySMAX", (("scenario", "3m"),)): (None, np.float32, 8, 3, (72,), 101),
        ("HeuristicEnemySMAX", (("scenario", "2s3z"),)): ((127,), np.float32, 10, 5, (120,), 101),
        ("overcooked", (("layout", "cramped_room"),)): (
            (4, 5, 26),
            np.uint8,
            6,
            2,
            (4, 5, 52),
            400,
        ),
        ("hanabi", ()): ((658,), np.float32, 21, 2, None, 113),
    }
    for (env_id, keywords), (obs, dtype, n, agents, world, steps) in want.items():
        env, params = envs.make(f"jaxmarl:{env_id}", **dict(keywords))
        space = env.observation_space(params)
        assert obs is None or space.shape == obs
        assert np.dtype(space.dtype) == dtype and env.action_space(params).n == n
        assert env.num_agents == agents and params.max_steps_in_episode == steps
        assert is_multi_agent(env) and is_multi_agent(TeamEpisodeStatistics(env))
        if world is None:
            assert not env.has_global_state
            with pytest.raises(ValueError, match="has no global state"):
                env.global_state_space(params)
        else:
            assert env.global_state_space(params).shape == world
            assert env.global_state_space(params) is env.global_state_space(params)
    env, _ = envs.make("jaxmarl:SMAX", scenario="3m")
    assert env.env.state_size == 72 and env.agent_ids[:3] == ("ally_0", "ally_1", "ally_2")


def test_max_steps_in_episode_sets_jaxmarls_limit(jaxmarl):
    """max_steps_in_episode=N makes episodes of N steps (MPE/SMAX end on the step starting at
    max_steps: max_steps = N - 1; Overcooked's: N); JaxMARL's max_steps keeps its meaning."""
    env, params = envs.make("jaxmarl:MPE_simple_spread_v3", max_steps_in_episode=10)
    assert env.env.max_steps == 9 and params.max_steps_in_episode == 10
    env, params = envs.make("jaxmarl:MPE_simple_spread_v3", max_steps=10)
    assert env.env.max_steps == 10 and params.max_steps_in_episode == 11
    env, params = envs.make("jaxmarl:HeuristicEnemySMAX", scenario="3m", max_steps_in_episode=50)
    assert env.env.max_steps == 49 and params.max_steps_in_episode == 50
    env, params = envs.make("jaxmarl:overcooked", max_steps_in_episode=50)
    assert env.env.max_steps == 50 and params.max_steps_in_episode == 50
    env, params = envs.make("jaxmarl:hanabi", max_steps_in_episode=7)
    assert params.max_steps_in_episode == 7
    with pytest.raises(ValueError, match="not both"):
        envs.make("jaxmarl:SMAX", max_steps=5, max_steps_in_episode=6)
    with pytest.raises(ValueError, match="positive integer"):
        envs.make("jaxmarl:SMAX", max_steps_in_episode=0)


def test_unknown_names_raise_one_error_naming_them(jaxmarl):
    from rl.config import EnvConfig
    from rl.config.parsing import ConfigError

    with pytest.raises(ValueError, match=r"unknown map '4m'.*3m, 2s3z, 25m, 3s5z"):
        envs.make("jaxmarl:SMAX", scenario="4m")
    with pytest.raises(ValueError, match=r"unknown map 'x'.*3s_vs_5z"):
        envs.make("jaxmarl:HeuristicEnemySMAX", scenario="x")
    with pytest.raises(ValueError, match=r"unknown layout 'kitchen'.*cramped_room, asymm"):
        envs.make("jaxmarl:overcooked", layout="kitchen")
    with pytest.raises(ValueError, match=r"unknown keyword\(s\) \['max_step'\]"):
        envs.make("jaxmarl:MPE_simple_spread_v3", max_step=10)  # MPE takes **kwargs: checked
    with pytest.raises(ValueError, match=r"unknown keyword\(s\) \['num_playrs'\]"):
        envs.make("jaxmarl:hanabi", num_playrs=3)
    with pytest.raises(ValueError, match="jaxmarl:MPE_simple_reference_v3: .*2 agents"):
        envs.make("jaxmarl:MPE_simple_reference_v3", num_agents=3)  # JaxMARL's own assert
    for env_id in ("MPE_simple_spread_v9", "coin_game"):  # unknown; JaxMARL's but not supported
        with pytest.raises(ValueError, match=f"unsupported id '{env_id}'.*MPE_simple_spread_v3"):
            envs.make(f"jaxmarl:{env_id}")
    assert (
        "jaxmarl:SMAX" in envs.registered_ids() and "jaxmarl:coin_game" not in envs.registered_ids()
    )
    with pytest.raises(ConfigError, match=r"^env.params: .*unknown map '4m'"):
        EnvConfig(id="jaxmarl:SMAX", params={"scenario": "4m"}).make()


def test_render_draws_mpe_smax_and_overcooked(jaxmarl):
    """A frame of the right shape from a wrapped state; it follows the state."""
    sizes = {  # the parity programs' envs (their reset compiled once)
        "spread": (500, 500, 3),
        "smax_2s3z": (512, 512, 3),
        "heuristic_3m": (512, 512, 3),
        "overcooked": ((4 + 2) * 32, (5 + 2) * 32, 3),  # cramped_room and its border, 32 px a tile
    }
    for name, shape in sizes.items():
        prog = program(name)
        env, params, env_id = prog.env, prog.params, prog.env_id
        wrapped = TeamEpisodeStatistics(env)
        zero = jnp.float32(0.0), jnp.int32(0)
        state = TeamEpisodeState(first_state(prog), *zero, *zero)
        frame = envs.render(wrapped, state, params)  # peels the wrapper
        assert frame.shape == shape and frame.dtype == np.uint8
        assert len(np.unique(frame.reshape(-1, 3), axis=0)) >= 3, env_id
        moved = envs.render(env, state.env_state.replace(env_state=shift(env_id, state)), params)
        assert not np.array_equal(frame, moved), env_id
    prog = program("hanabi")
    env, params, state = prog.env, prog.params, first_state(prog)
    with pytest.raises(ValueError, match="has no render method"):
        envs.render(env, state, params)


def shift(env_id, state):
    """The JaxMARL state of a wrapped state with something visible changed."""
    inner = state.env_state.env_state
    if env_id.startswith("MPE_"):
        return inner.replace(p_pos=inner.p_pos + 0.5)
    if env_id == "SMAX":
        return inner.replace(unit_alive=np.arange(inner.unit_alive.size) > 0)  # unit 0 dead
    if env_id == "HeuristicEnemySMAX":
        return inner.replace(state=inner.state.replace(unit_health=inner.state.unit_health / 2))
    from jaxmarl.environments.overcooked.common import OBJECT_TO_INDEX

    return inner.replace(agent_inv=np.full_like(inner.agent_inv, OBJECT_TO_INDEX["plate"]))


def test_import_prints_nothing_and_keeps_the_streams(jaxmarl, monkeypatch, capfd):
    """JaxMARL's first import prints two lines to stdout after its MABrax module has reset
    sys.stdout/sys.stderr to the interpreter's: through the adapter, nothing shows and the streams
    stay."""
    for name in [m for m in sys.modules if m == "jaxmarl" or m.startswith("jaxmarl.")]:
        monkeypatch.delitem(sys.modules, name)
    streams = sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__
    capfd.readouterr()
    from envs.jaxmarl import _jaxmarl

    module = _jaxmarl()
    assert "jaxmarl" in sys.modules and module is sys.modules["jaxmarl"]
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) == streams


def test_missing_extra_names_it(hide_package):
    hide_package("jaxmarl")
    with pytest.raises(
        envs.MissingExtraError,
        match=r"jaxmarl:SMAX needs the 'jaxmarl' package.*"
        r"pip install -e \"\.\[jaxmarl\]\" in the fusedrl clone",
    ):
        envs.make("jaxmarl:SMAX", scenario="3m")
    assert not any(i.startswith("jaxmarl:") for i in envs.registered_ids())
