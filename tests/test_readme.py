"""Every code block of the README runs, so the README cannot rot.

Each Python block runs on its own in a fresh interpreter (a script of its own, `python
readme_block_lineN.py`), from an empty directory, so a block that uses a name must define or import
it itself, and nothing a block before it imported or set (a kernel backend, a registered env)
carries over. Bash blocks run with `bash -e` from an empty directory (one per pytest-xdist worker:
under `--dist loadgroup` the blocks spread over workers in any order, so each block must stand
alone, using only runs it makes itself), with `rl` on the PATH, `pip install ... &&` prefixes
dropped (the test runs in the installed environment) and FUSEDRL_SMOKE_LOG_POINTS=1
FUSEDRL_SMOKE_SEEDS=2, so each `rl train` stops after its first log point and trains at most 2
seeds. A block whose first line is `# README test: skip (reason)` is not run; the reason must say
why (a benchmark, a server, several devices or hosts, a fresh virtual environment, or the CI command
itself). The "Writing an agent" example runs with its final call shortened (2 log points of 20
updates, 2 seeds).

Every other block runs on the base install, or says in its first line which extras it needs,
`# needs the gymnax extra: pip install -e ".[gymnax]"`, and is skipped where they are missing. A
block that declares none runs as on the base install: the extras' libraries (EXTRAS) cannot be
imported while it runs and the interpret kernel backend is unavailable, so a block that needs an
extra without saying so fails here (`test_blocks_that_use_an_extra_declare_it` also reads each
block for the extras' ids and config names).

The blocks of SLOW_BLOCKS run only with `-m slow` (.ci/gpu_suite.sh's default run leaves them out
too): each repeats, at a cost of tens of CPU seconds, what a default test runs (named beside it);
the default suite still loads every `rl train` command of theirs and traces its program
(`test_slow_blocks_rl_train_commands_load_and_trace`), so a renamed key, a bad value or a program
that no longer builds fails there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SKIP = "# README test: skip ("
AGENT_CALL = "_, metrics = jax.jit(jax.vmap(train))(jax.random.split(jax.random.PRNGKey(0), 4))"
SHORT_AGENT_CALL = (
    "_, metrics = jax.jit(jax.vmap(lambda k: train(k, 2, 20)))"
    "(jax.random.split(jax.random.PRNGKey(0), 2))"
)


def readme_blocks(language: str) -> list[tuple[int, str]]:
    """(line number, code) of every ```language block of the README, in order."""
    text = README.read_text()
    return [
        (text[: m.start()].count("\n") + 1, m.group(1))
        for m in re.finditer(rf"```{language}\n(.*?)```", text, re.S)
    ]


def is_skipped(code: str) -> bool:
    return code.startswith(SKIP)


# Blocks run only with -m slow, each named by a line of its own, with the default tests that cover
# what it runs.
SLOW_BLOCKS = {
    # python: an env library's API called outside jit, each operation compiled on its own (a minute
    # of CPU for Brax's MJX ant, half of one for Craftax)
    'envs.make("brax:ant", backend="mjx"': "tests/envs/test_brax.py (reset, step, render)",
    'envs.make("craftax:Craftax-Classic-Symbolic-v1"': "tests/envs/test_craftax.py",
    # (half a minute of CPU: Playground's import, an MJX reset outside jit and a compiled step)
    'envs.make("playground:CartpoleBalance"': "tests/envs/test_playground.py",
    # bash: overrides, seeds and sweeps on the command line (tests/rl/test_cli.py, test_sweep.py);
    # packaged configs trained with the overrides of their results
    "rl train configs/qlearning_gridworld.yaml --seeds 30": "tests/rl/test_cli.py, test_sweep.py, "
    "test_qlearning.py, test_dqn.py (haiku, the reference kernels)",
    "rl train ppo_cartpole env.id=gymnax:CartPole-v1": "tests/envs/test_gymnax.py, "
    "tests/rl/test_minatar_configs.py (the MinAtar configs and their CNN torso)",
    "rl train configs/dqn_cartpole.yaml --seeds 16": "tests/rl/test_dqn.py, tests/faults/",
    "rl train configs/ppo_cartpole.yaml --sweep agent.lr=": "tests/rl/test_sweep.py, "
    "test_ppo_continuous_control.py, test_ppo_advantages.py",
    "rl train configs/td3_pendulum.yaml": "tests/rl/test_td3.py",
    "rl train crossq_pendulum --seeds 4": "tests/rl/test_crossq_simbav2_agents.py",
    "rl train fasttd3_pendulum --seeds 4": "tests/rl/test_fasttd3.py",
    "rl train configs/pqn_cartpole.yaml --seeds 16": "tests/rl/test_pqn.py",
    "rl train configs/ppo_rnn_cartpole_masked.yaml": "tests/rl/test_ppo_rnn.py (rl train, rl eval)",
    "rl train ippo_mpe_spread": "tests/rl/test_ippo.py",
}


def slow_mark(code: str) -> list:
    """[pytest.mark.slow] for a block of SLOW_BLOCKS, else []."""
    return [pytest.mark.slow] if any(line in code for line in SLOW_BLOCKS) else []


def readme_params(language: str) -> list:
    """The blocks of `language` as pytest params (line, code), id lineN, SLOW_BLOCKS marked slow."""
    return [
        pytest.param(line, code, id=f"line{line}", marks=slow_mark(code))
        for line, code in readme_blocks(language)
    ]


# The pip extras a block may need (CI installs them all through `test`; the GPU machine carries
# none): the modules each brings, which the base install cannot import, and what in a block's text
# shows it is used (an env id's prefix, a packaged config's name, a key or a backend).
EXTRAS = {
    "gymnax": (("gymnax",), ("gymnax:", "minatar")),
    "brax": (("brax", "mujoco"), ("brax:", "_brax_")),
    "craftax": (("craftax",), ("craftax:", "_craftax_")),
    "jumanji": (("jumanji",), ("jumanji:",)),
    "jaxmarl": (("jaxmarl",), ("jaxmarl:", "_mpe_", "_smax_", "_overcooked_")),
    "playground": (("mujoco_playground",), ("playground:", "_playground_")),
    "envpool": (("envpool",), ("envpool:", "_atari_")),
    "wandb": (("wandb",), ("run.wandb",)),
    "tensorboard": (("tensorboard",), ("tensorboard --logdir",)),
    "interpret": (("torch",), ('"interpret"', "backend=interpret")),
}
# a block's first line naming the extras it needs, as the install command
NEEDS = re.compile(r'^# needs the .+?: pip install -e "\.\[([a-z,]+)\]"')


def used_extras(code: str) -> list[str]:
    """The extras whose ids, config names, keys or backends `code` names."""
    return [name for name, (_, marks) in EXTRAS.items() if any(mark in code for mark in marks)]


def declared_extras(code: str) -> list[str]:
    """The extras a block's first line says it needs (`NEEDS`), else []."""
    match = NEEDS.match(code)
    return match.group(1).split(",") if match else []


def uninstalled(extras: list[str]) -> list[str]:
    """The extras of `extras` whose modules do not import here."""
    import importlib.util

    return [
        name
        for name in extras
        if any(importlib.util.find_spec(module) is None for module in EXTRAS[name][0])
    ]


def missing_extras(code: str) -> list[str]:
    """The extras `code` uses (`used_extras`) that are not installed here."""
    return uninstalled(used_extras(code))


def base_install_modules() -> list[str]:
    """The modules the extras bring: unimportable while a block that declares no extra runs."""
    return [module for modules, _ in EXTRAS.values() for module in modules]


def mujoco_cannot_render() -> bool:
    """Whether MuJoCo has no OpenGL platform here: MUJOCO_GL=disable, or (unset, without a display)
    neither libEGL nor libOSMesa, where envs.brax sets that (the GPU machine)."""
    from envs.brax import headless_mujoco_gl

    if "MUJOCO_GL" in os.environ:
        return os.environ["MUJOCO_GL"] == "disable"
    return not os.environ.get("DISPLAY") and headless_mujoco_gl() == "disable"


def without_brax_rendering(code: str) -> str:
    """`code` without its lines that render a Brax env, where MuJoCo cannot render (the rest still
    runs; tests/envs/test_brax.py checks the error `render` raises there)."""
    if "brax:" not in code or not mujoco_cannot_render():
        return code
    return "\n".join(line for line in code.splitlines() if "envs.render(" not in line)


def runnable_shell(code: str) -> str:
    """A bash block as the test runs it: `pip install ... &&` prefixes dropped."""
    return "\n".join(re.sub(r"^pip install [^&]*&&\s*", "", line) for line in code.splitlines())


def test_the_skipped_blocks_are_few_and_say_why():
    skipped = [
        code.splitlines()[0]
        for language in ("python", "bash")
        for _, code in readme_blocks(language)
        if is_skipped(code)
    ]
    assert len(skipped) <= 10, skipped
    assert all(line.endswith(")") and len(line) > len(SKIP) + 10 for line in skipped), skipped


def test_blocks_that_use_an_extra_declare_it():
    """Each block that is run names, in its first line, every extra it uses (and only known
    extras); the others run on the base install (test_python_block_runs, test_bash_block_runs)."""
    for language in ("python", "bash"):
        for line, code in readme_blocks(language):
            if is_skipped(code):
                continue
            declared = declared_extras(code)
            assert set(declared) <= set(EXTRAS), (line, declared)
            undeclared = set(used_extras(code)) - set(declared)
            assert not undeclared, (
                f"README.md {language} block at line {line} uses the extras {sorted(undeclared)}: "
                f'its first line must say so, # needs the ... extra: pip install -e ".[...]"'
            )


def test_the_slow_blocks_name_one_runnable_block_each():
    blocks = [code for language in ("python", "bash") for _, code in readme_blocks(language)]
    for line in SLOW_BLOCKS:
        found = [code for code in blocks if line in code]
        assert len(found) == 1 and not is_skipped(found[0]), (line, len(found))


def test_ci_runs_exactly_the_readme_test_command():
    (command,) = [
        code.splitlines()[1] for _, code in readme_blocks("bash") if "python -m pytest" in code
    ]
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert command in ci, f".ci/run must run the README's test command {command!r}"


def run_alone(line: int, code: str, cwd: Path, base_install: bool) -> None:
    """Run one block as a script in a fresh interpreter, from `cwd`, with this checkout first on
    its path; with `base_install`, the extras' modules cannot be imported in it (a sitecustomize
    that sets them to None in sys.modules, as the bash blocks have it). Fails the test with the
    block's line and the end of its traceback."""
    script = cwd / f"readme_block_line{line}.py"
    script.write_text(code)
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    if base_install:
        site = cwd / "base-install"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(
            f"import sys\nfor name in {base_install_modules()!r}:\n    sys.modules[name] = None\n"
        )
        paths.insert(0, str(site))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), MPLBACKEND="Agg")
    done = subprocess.run(
        [sys.executable, script.name], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        pytest.fail(f"README.md python block at line {line} fails:\n{done.stderr[-3000:]}")


# run after the Writing-an-agent example, in its interpreter: its shortened call trained 2 log
# points of 20 updates of 8 envs x 16 steps, and episodes ended with finite returns
AGENT_CHECK = """
import numpy as _np
_np.testing.assert_array_equal(_np.asarray(metrics["step"])[0], [20 * 8 * 16, 2 * 20 * 8 * 16])
assert _np.all(_np.asarray(metrics["episodes"]) > 0)
assert _np.all(_np.isfinite(_np.asarray(metrics["episode_return"])))
"""


def test_the_agent_example_is_one_python_block():
    assert sum(AGENT_CALL in code for _, code in readme_blocks("python")) == 1, AGENT_CALL


@pytest.mark.parametrize("line, code", readme_params("python"))
def test_python_block_runs(line, code, tmp_path):
    """Each Python block runs alone in a fresh interpreter from an empty directory: on the base
    install unless its first line names the extras it needs (skipped where they are missing)."""
    if is_skipped(code):
        pytest.skip(code.splitlines()[0])
    if uninstalled(declared_extras(code)):
        missing = uninstalled(declared_extras(code))
        pytest.skip(f"needs the extras {missing}, not installed here")
    if AGENT_CALL in code:  # the Writing-an-agent example, shortened and checked
        code = code.replace(AGENT_CALL, SHORT_AGENT_CALL) + AGENT_CHECK
    run_alone(line, without_brax_rendering(code), tmp_path, not declared_extras(code))
    if "episode.gif" in code:
        assert (tmp_path / "episode.gif").is_file()


def test_a_block_runs_without_the_names_of_the_blocks_before_it(tmp_path):
    """The fresh interpreter is what makes a block stand alone: a name defined by an earlier block
    is unknown, and a block using an extra's module fails where it declares none."""
    with pytest.raises(pytest.fail.Exception, match="NameError: name 'env' is not defined"):
        run_alone(1, "env.reset()\n", tmp_path, base_install=True)
    with pytest.raises(pytest.fail.Exception, match="ModuleNotFoundError|ImportError"):
        run_alone(2, "import gymnax\n", tmp_path, base_install=True)


SLOW_TRAIN_COMMANDS = [
    pytest.param(line, command, id=f"line{line}-{i}")
    for line, code in readme_blocks("bash")
    if slow_mark(code)
    for i, command in enumerate(c for c in code.splitlines() if c.startswith("rl train "))
]


@pytest.mark.parametrize("line, command", SLOW_TRAIN_COMMANDS)
def test_slow_blocks_rl_train_commands_load_and_trace(line, command, monkeypatch):
    """Each `rl train` command of a slow block, as its block runs it (FUSEDRL_SMOKE_SEEDS=2): the
    arguments parse, the config and its overrides and sweep load, and the run's init and chunk
    programs trace to their output shapes (no XLA compile, nothing run or written)."""
    import shlex

    import jax

    from rl.cli.main import build_parser
    from rl.cli.train import resolve_train_config
    from rl.run.programs import make_programs, run_mesh

    if missing_extras(command):
        pytest.skip(f"needs the optional libraries {missing_extras(command)}, not installed here")
    monkeypatch.chdir(REPO)  # configs/NAME.yaml paths
    monkeypatch.setenv("FUSEDRL_SMOKE_SEEDS", "2")
    args, extras = build_parser().parse_known_args(shlex.split(command, comments=True)[1:])
    assert all("=" in arg and not arg.startswith("-") for arg in extras), extras
    args.overrides = list(args.overrides) + extras
    config, grid = resolve_train_config(args)
    _, init, chunk, keys, hparams = make_programs(config, grid, run_mesh(config, None, "seeds"))
    state = jax.eval_shape(init, keys, hparams)
    _, metrics = jax.eval_shape(chunk(1), state, hparams)
    assert all(m.shape[:2] == (len(grid), config.run.seeds) for m in jax.tree.leaves(metrics))


@pytest.fixture(scope="module")
def shell(tmp_path_factory):
    """(working directory, environment) shared by the bash blocks this worker runs (each block
    stands alone)."""
    root = tmp_path_factory.mktemp("readme")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    rl = bin_dir / "rl"
    # the console script, from this checkout
    rl.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rl.cli.main "$@"\n')
    rl.chmod(0o755)
    work = root / "work"
    work.mkdir()
    env = dict(os.environ)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
        FUSEDRL_SMOKE_LOG_POINTS="1",
        FUSEDRL_SMOKE_SEEDS="2",
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_DIR=str(root),
        WANDB_CONFIG_DIR=str(root / "wandb-config"),
        WANDB_CACHE_DIR=str(root / "wandb-cache"),
        MPLBACKEND="Agg",
    )
    # commands name checkout paths (configs/*.yaml also resolve by name)
    for folder in ("configs", "benchmarks"):
        (work / folder).symlink_to(REPO / folder)
    # first on PYTHONPATH for a block that declares no extra: the extras' modules unimportable in
    # every Python process it starts, as on the base install
    base = root / "base-install"
    base.mkdir()
    (base / "sitecustomize.py").write_text(
        f"import sys\nfor name in {base_install_modules()!r}:\n    sys.modules[name] = None\n"
    )
    return work, env, base


@pytest.mark.parametrize("line, code", readme_params("bash"))
def test_bash_block_runs(line, code, shell):
    if is_skipped(code):
        pytest.skip(code.splitlines()[0])
    if uninstalled(declared_extras(code)):
        missing = uninstalled(declared_extras(code))
        pytest.skip(f"needs the extras {missing}, not installed here")
    work, env, base = shell
    if not declared_extras(code):
        env = {**env, "PYTHONPATH": os.pathsep.join([str(base), env["PYTHONPATH"]])}
    done = subprocess.run(
        ["bash", "-e", "-c", runnable_shell(code)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (
        f"README.md bash block at line {line} fails:\n{done.stderr[-3000:]}"
    )
