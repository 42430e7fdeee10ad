"""Triton, where it is installed: the one place the op files get ``triton`` and ``tl`` from.

Triton is an optional dependency: the ``gpu`` extra brings it (with jax-triton) for the ``triton``
backend and the ``interpret`` extra (with CPU torch) for the ``interpret`` backend; the
``reference`` backend needs neither. Without Triton, ``import kernels`` still works: ``triton.jit``
keeps each kernel as its plain Python function (never run: :func:`kernels.launch.resolve_backend`
refuses the Triton backends first, with :data:`MISSING_MESSAGE`), and ``tl`` is only read inside
kernel bodies and string annotations, which are not evaluated.
"""

from __future__ import annotations

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
