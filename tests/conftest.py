"""Fixtures shared by every test package."""

from __future__ import annotations

import jax
import pytest


@pytest.fixture
def full_precision_matmuls():
    """Float32 matmuls at full float32 precision while the test runs. On the GPU (Hopper) XLA runs
    float32 matmuls at TF32 by default (a 10-bit mantissa, relative error ~1e-3), so tests that compare
    two float32 computations of one network to 1e-5 (a cell against a library's cell, a batch against
    its rows) ask for "highest", which the CPU always gives."""
    with jax.default_matmul_precision("highest"):
        yield
