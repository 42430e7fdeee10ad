"""Triton, where it is installed: the one place the op files get ``triton`` and ``tl`` from.

Triton is an optional dependency: the ``gpu`` extra brings it (with jax-triton) for the ``triton``
backend and the ``interpret`` extra (with CPU torch) for the ``interpret`` backend; the
``reference`` backend needs neither. Without Triton, ``import kernels`` still works: ``triton.jit``
keeps each kernel as its plain Python function (never run: :func:`kernels.launch.resolve_backend`
refuses the Triton backends first, with :data:`MISSING_MESSAGE`), and ``tl`` is only read inside
kernel bodies and string annotations, which are not evaluated.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

MISSING_MESSAGE = (
    "Triton is not installed: the 'interpret' kernel backend needs pip install "
    "'fusedrl[interpret]' (Triton and CPU torch) and the 'triton' backend pip install "
    "'fusedrl[gpu]' (Triton and jax-triton); the 'reference' backend needs neither"
)


@functools.lru_cache(maxsize=None)
def import_error() -> str | None:
    """Why Triton does not import here (``"ModuleNotFoundError: ..."``),
    or ``None`` when it does."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as err:  # ImportError, or a broken install
        return f"{type(err).__name__}: {err}"
    return None


class _MissingTriton:
    """Stands in for the ``triton`` module when it does not import: ``@triton.jit`` returns the
    function unchanged; anything else raises ImportError with :data:`MISSING_MESSAGE`."""

    @staticmethod
    def jit(fn: Callable | None = None, **_options: Any):
        return fn if fn is not None else (lambda f: f)

    def __getattr__(self, name: str):
        raise ImportError(f"triton.{name}: {MISSING_MESSAGE}")


class _MissingLanguage:
    """Stands in for ``triton.language``; only kernel bodies use it,
    and they never run without Triton."""

    def __getattr__(self, name: str):
        raise ImportError(f"triton.language.{name}: {MISSING_MESSAGE}")


if import_error() is None:
    import triton
    import triton.language as tl
else:
    triton = _MissingTriton()
    tl = _MissingLanguage()

__all__ = ["MISSING_MESSAGE", "import_error", "tl", "triton"]


class _TargetOnlyDriver:
    """Triton's active driver while jax-triton compiles kernels: it answers the compile's question
    (`get_current_target`: CUDA at the GPU's compute capability, as JAX reports it) without
    Triton's own CUDA driver, whose construction imports torch (seconds, where torch is
    installed). Anything else is asked of Triton's own driver."""

    def __init__(self, capability: int):
        self.capability = capability

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.capability, 32)

    def __getattr__(self, name: str):
        from triton.runtime import driver

        return getattr(driver.default, name)


@contextlib.contextmanager
def compile_without_torch(device):
    """While the block runs (lowering programs with Triton kernels for `device`, a JAX CUDA
    device), Triton asks `_TargetOnlyDriver` for its target instead of making its own driver,
    where Triton has made none yet; Triton's state is as before afterwards. Elsewhere (no Triton,
    another platform, a driver already made, a Triton without this driver registry) the block
    runs unchanged."""
    capability = getattr(device, "compute_capability", None)
    registry = None
    if import_error() is None and device.platform == "gpu" and capability:
        from triton.runtime import driver as registry
    if registry is None or getattr(registry, "_active", 1) is not None:
        yield
        return
    major, minor = str(capability).split(".")[:2]
    registry._active = _TargetOnlyDriver(int(major) * 10 + int(minor))
    try:
        yield
    finally:
        registry._active = None
