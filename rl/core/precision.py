"""Tracing a function under a float32 matmul precision (`run.matmul_precision`)."""

from __future__ import annotations

import functools

import jax


def at_matmul_precision(fn, precision: str):
    """`fn` traced under `jax.default_matmul_precision(precision)` (`run.matmul_precision`): every
    float32 dot it traces without an explicit precision gets that one; "default" leaves `fn` as it
    is (the platform's choice: TF32 on Ampere/Hopper GPUs, a 10-bit mantissa; full float32 on the
    CPU, where the setting changes nothing). A context manager entered while tracing, so the
    precision is part of the compiled program and no process-wide setting changes."""
    if precision == "default":
        return fn

    @functools.wraps(fn)
    def traced_at_precision(*args, **kwargs):
        with jax.default_matmul_precision(precision):
            return fn(*args, **kwargs)

    return traced_at_precision
