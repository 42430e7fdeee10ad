"""The base install has no Triton: `import kernels`, the reference backend and the agents work
without it, and asking for a Triton backend is one clear error naming the extra to install."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Runs with triton, torch and jax_triton made unimportable, as on a machine without them.
WITHOUT_TRITON = textwrap.dedent(
    """
    import sys

    class Missing:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("triton", "torch", "jax_triton"):
                raise ModuleNotFoundError(f"No module named {name!r}")

    sys.meta_path.insert(0, Missing())
    import jax.numpy as jnp
    import kernels

    rewards = jnp.ones((4, 3))
    advantages, targets = kernels.gae(
        rewards, jnp.zeros((4, 3)), jnp.zeros((4, 3)), jnp.full((4, 3), 0.9), 0.95,
        backend="reference",
    )
    print("reference", float(targets[0, 0]))
    print("available", kernels.available_backends())
    for name in ("interpret", "triton"):
        try:
            kernels.softmax(jnp.zeros((2, 3)), backend=name)
        except kernels.BackendUnavailableError as err:
            print(name, "->", err)
    from rl.agents import ppo  # an agent module imports without Triton too
    print("triton" in sys.modules)
    """
)


def test_kernels_import_and_run_the_reference_backend_without_triton():
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TRITON],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("reference 3.") and lines[1] == "available ('reference',)"
    assert lines[2].startswith(
        "interpret -> kernel backend 'interpret' needs triton and torch (CPU): ModuleNotFoundError"
    )
    assert lines[2].endswith("install them with pip install 'fusedrl[interpret]'")
    assert lines[3].startswith(
        "triton -> kernel backend 'triton' cannot run here"
    )  # on the CPU: not a GPU first
    assert lines[4] == "False"  # nothing imported triton


def test_op_files_take_triton_from_one_guarded_module():
    """`import triton` at the top of an op file would make Triton a base dependency again."""
    offenders = [
        path.name
        for path in sorted((REPO / "kernels").glob("*.py"))
        if path.name != "_triton.py"
        and any(
            line.startswith(("import triton", "from triton"))
            for line in path.read_text().splitlines()
        )
    ]
    assert offenders == []
