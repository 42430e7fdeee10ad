"""Fixtures shared by every test package."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys


def _cpu_only() -> bool:
    """Whether JAX can only run on the CPU here: JAX_PLATFORMS names no other platform and no GPU
    plugin of jaxlib (jax-cuda*, jax-rocm*) is installed."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms:
        return all(p.strip() == "cpu" for p in platforms.split(","))
    names = (d.metadata["Name"] or "" for d in importlib.metadata.distributions())
    return not any(
        n.lower().startswith(("jax-cuda", "jax_cuda", "jax-rocm", "jax_rocm")) for n in names
    )


# On the CPU the tests compile with LLVM's optimisation off (`--xla_backend_optimization_level=0`)
# and with XLA's older CPU emitters instead of its fusion emitters
# (`--xla_cpu_use_fusion_emitters=false`, about 40% less compile time for a training program): the
# suite is mostly compiles of small programs, and the persistent cache below cannot spare most of
# them (JAX never stores a program with a host callback, which every training loop's log points
# are). Both change results in the last bits, never what a test asserts: a test whose two programs
# must agree to the last bit compiles both with run_helpers.FUSION_EMITTERS or
# XLA_DEFAULT_OPTIMIZATION. Set here, before JAX starts its backend, for the tests only (library
# code never sets XLA flags); subprocesses the tests start inherit them (run_helpers.subprocess_env
# adds to them). A flag already in XLA_FLAGS is kept; the emitters' flag is left out where this
# jaxlib does not know it; GPU runs are left as they are.
TEST_XLA_FLAGS = {
    "xla_backend_optimization_level": "0",
    "xla_cpu_use_fusion_emitters": "false",
}


def _xla_accepts(flag: str) -> bool:
    """Whether this jaxlib's XLA takes `flag` in XLA_FLAGS (an unknown flag there stops the
    process): one CPU computation in a subprocess with it set."""
    probe = "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"
    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
    return (
        subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode == 0
    )


if _cpu_only():
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", "")]
        + [
            f"--{name}={value}"
            for name, value in TEST_XLA_FLAGS.items()
            if name not in os.environ.get("XLA_FLAGS", "")
            and (name == "xla_backend_optimization_level" or _xla_accepts(f"--{name}={value}"))
        ]
    ).strip()

# On the CPU the test run shares one JAX persistent compilation cache, a folder made here by the
# first process to load this file (pytest, or pytest-xdist's controller) and removed when it ends:
# its workers and every subprocess the tests start inherit it through the environment, so a program
# that another test, worker or `rl` subprocess compiled already (the same XLA module with the same
# options and flags) is loaded instead of compiled again. Tests still trace and lower every program
# and run every step. The size limit turns on JAX's file lock, so no process reads a half-written
# entry. A cache folder already in the environment is kept (and not removed). The runs the tests
# train (`rl train`, rl.run.train.run_training) keep their programs in the same folder
# (FUSEDRL_COMPILATION_CACHE; rl.run.compile_cache gives them a subfolder of their own), so whether
# a run compiles or loads its programs depends on the tests before it: tests of the cache itself
# name their own folder.
if _cpu_only() and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_DIR = tempfile.mkdtemp(prefix="fusedrl-jax-")
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
else:
    _CACHE_DIR = None
if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    os.environ.setdefault("FUSEDRL_COMPILATION_CACHE", os.environ["JAX_COMPILATION_CACHE_DIR"])

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def full_precision_matmuls():
    """Float32 matmuls at full float32 precision while the test runs. On the GPU (Hopper) XLA runs
    float32 matmuls at TF32 by default (a 10-bit mantissa, relative error ~1e-3), so tests that
    compare two float32 computations of one network to 1e-5 (a cell against a library's cell, a
    batch against its rows) ask for "highest", which the CPU always gives."""
    with jax.default_matmul_precision("highest"):
        yield


# Modules whose tests share no expensive module-scoped fixture and take long in total: under
# pytest-xdist `--dist loadgroup` each of their tests may go to any worker (the README's blocks are
# self-contained; the fused PPO gradient's property tests each compile their own kernels; the
# agents' training tests each compile their own program). Every other module stays whole on one
# worker, so its module-scoped fixtures compile once.
SPREAD_MODULES = (
    "test_readme.py",
    "test_ppo_grads.py",
    "test_ppo.py",
    "test_ppo_advantages.py",
    "test_ppo_rnn.py",
    "test_sweep.py",
)

# Modules that share session-scoped fixtures, kept together on one worker so that the fixtures are
# built once: the tabular fault modules share the reference and the stopped `rl train` runs of
# tests/faults/conftest.py (a worker that ran one of them would otherwise train both again).
SHARED_GROUPS = {
    "tests/faults/test_faults_tabular_damage.py": "tests/faults/tabular",
    "tests/faults/test_faults_tabular_signals.py": "tests/faults/tabular",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Groups tests for pytest-xdist's `loadgroup` distribution (.ci/run, .ci/gpu_suite.sh). First
    (tryfirst): each xdist worker turns the `xdist_group` marks into node ids in its own
    pytest_collection_modifyitems, which otherwise runs before this one and finds none."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        module = item.nodeid.split("::")[0]
        group = (
            item.nodeid if module.endswith(SPREAD_MODULES) else SHARED_GROUPS.get(module, module)
        )
        item.add_marker(pytest.mark.xdist_group(group))


# (resolved once, at import: tests that chdir must not move it)
TEST_TIMES = (
    os.path.abspath(os.environ["FUSEDRL_TEST_TIMES"])
    if os.environ.get("FUSEDRL_TEST_TIMES")
    else None
)


def pytest_runtest_logreport(report):
    """With FUSEDRL_TEST_TIMES=FILE, appends each finished test's "worker, phase:outcome, seconds,
    node id" line to FILE as it finishes (.ci/gpu_suite.sh: a run stopped at its time limit still
    shows where its time went, per test and per worker)."""
    path = TEST_TIMES
    if (
        not path
        or not (report.when == "call" or report.outcome != "passed")
        or os.environ.get("PYTEST_XDIST_WORKER")
    ):
        # under pytest-xdist the controller writes:
        # it receives every worker's reports, with its node
        return
    node = getattr(report, "node", None)
    worker = node.gateway.id if node is not None else "main"
    with open(path, "a") as f:
        f.write(
            f"{worker}\t{report.when}:{report.outcome}\t{report.duration:.2f}\t{report.nodeid}\n"
        )


def pytest_unconfigure(config):
    """Removes the compilation cache folder this process made (_CACHE_DIR) when the run ends."""
    if _CACHE_DIR is not None:
        import shutil

        shutil.rmtree(_CACHE_DIR, ignore_errors=True)
