"""Shared fixtures for the kernel tests: run each test once per kernel backend.

Backends under test:
  * FUSEDRL_TEST_BACKENDS="triton,reference" (comma-separated) when set;
  * otherwise the CPU ones ("reference", plus "interpret" when triton and torch import), and
    "triton" too when it can run here (a GPU with jax_triton), in which case "interpret" is left out
    (the GPU run proves the kernel on the device; the interpreter run is CI's job).

Use the ``backend`` fixture (a backend name) in a test, or ``kernel_backends()`` to parametrize.
Tests that need a Triton backend (not "reference") can use the ``kernel_backend`` fixture.
Both are session-scoped (plain strings), so hypothesis ``@given`` tests can use them.
"""

from __future__ import annotations

import os

import pytest

from kernels.launch import BACKENDS, available_backends


def kernel_backends() -> list[str]:
    """The backends the kernel tests run on (see the module docstring)."""
    requested = os.environ.get("FUSEDRL_TEST_BACKENDS")
    if requested:
        names = [n.strip() for n in requested.split(",") if n.strip()]
        unknown = [n for n in names if n not in BACKENDS]
        if unknown:
            raise ValueError(
                f"FUSEDRL_TEST_BACKENDS names unknown backends {unknown}; valid: {BACKENDS}"
            )
        return names
    names = available_backends()
    if "triton" in names:
        return ["triton", "reference"]
    return [n for n in ("reference", "interpret") if n in names]


@pytest.fixture(scope="session", params=kernel_backends())
def backend(request) -> str:
    """Each kernel backend under test, by name."""
    return request.param


@pytest.fixture(
    scope="session", params=[n for n in kernel_backends() if n != "reference"] or ["<none>"]
)
def kernel_backend(request) -> str:
    """Each backend under test that runs the Triton source (triton / interpret)."""
    if request.param == "<none>":
        pytest.skip("no Triton-source backend under test here")
    return request.param
