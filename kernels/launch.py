"""The launch layer shared by every kernel op: backend choice, vmap folding, launching.

Backends
--------
``"triton"``     the op's ``@triton.jit`` kernel through ``jax_triton.triton_call`` (GPU only).
``"reference"``  the op's plain-JAX implementation: the correctness oracle and the CPU default.
``"interpret"``  the *same* ``@triton.jit`` kernel run by Triton's CPU interpreter on torch CPU
                 tensors, reached from JAX through ``jax.pure_callback``. It goes through the same
                 :func:`launch` call, grid and vmap folding as ``"triton"``; only the last step
                 differs. Tests use it to check the kernel source without a GPU.

Which backend runs, first match wins:
  1. the op's ``backend=`` keyword argument (``"auto"`` there is the same as ``None``: go on down);
  2. the process-wide setting: :func:`set_backend` or the :func:`use_backend` context manager
     (for scripts and tests; library code passes ``backend=`` instead);
  3. the environment variable ``FUSEDRL_KERNEL_BACKEND`` (unset, empty or ``"auto"``: go on down);
  4. automatic: ``"triton"`` when JAX's default device is a GPU and ``jax_triton`` imports,
     else ``"reference"``.
An unknown name raises ``ValueError`` listing the valid ones; asking for a backend that cannot run
here raises :class:`BackendUnavailableError` saying why. The choice is made when the op is traced
(inside ``jit`` it is fixed at trace time).

How an op plugs in
------------------
An op file (``returns.py``, ``gae.py``, ``softmax.py``, ...) holds its Triton kernel(s), its
plain-JAX reference and its public function. The public function:

1. validates its inputs at trace time (:func:`check_float_array`, :func:`check_same_shape`,
   which raise ``ValueError`` naming the argument and the shapes);
2. picks the backend: ``name = resolve_backend(backend)``; for ``"reference"`` it simply returns the
   reference (plain JAX needs no custom rules: jit, vmap and grad all work);
3. otherwise calls a kernel path built from two pieces of this module:

   * a *core* function ``core(*arrays, lead)``: every positional argument is a JAX array carrying
     ``lead`` extra leading axes (vmapped axes folded in so far; the same sizes on every argument),
     followed by the op's own shape. The core reshapes them to a canonical layout (e.g.
     ``[B, T, N]`` with :func:`time_major_3d` or ``[rows, cols]`` with :func:`rows_2d`), computes
     the grid and calls :func:`launch` once, and reshapes the outputs back (they carry the same
     ``lead`` axes). Static choices (backend, block sizes) are closed over, not passed.
   * :func:`fold_vmap(core) <fold_vmap>` turns it into a ``jax.custom_batching.custom_vmap``
     function ``f(*arrays)`` = ``core(*arrays, lead=0)``. Under ``jax.vmap`` its rule broadcasts the
     unbatched arguments to the batch size, calls ``core`` with ``lead + 1`` and marks every output
     batched, so nested vmaps (seeds x envs x hyperparameters) still end in ONE launch whose grid
     covers the folded axes.

   * ``fold_vmap(core, batch_axes=...)`` declares which of the op's own axes are independent
     ("trailing": a scan's ``[T, *batch]`` columns; "leading": a row op's ``[*rows, K]`` rows), so
     that under ``jax.sharding`` the launch is split along them as well as along the folded vmap
     axes (:func:`split_over_batch_axes`); without it, an op's own axes are kept whole.

   Where the op is differentiable, wrap the folded function in a ``jax.custom_vjp`` (outside the
   custom_vmap, as JAX requires); its backward pass is again a ``fold_vmap`` function (usually
   another Triton kernel). Build these once per backend, e.g. with ``functools.lru_cache``.

Example (a scaled copy, ``y = a * x`` with ``a`` a traced scalar)::

    @triton.jit
    def _scale_kernel(x_ptr, a_ptr, n, y_ptr, BLOCK: tl.constexpr):  # inputs, scalars, then outputs
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        a = tl.load(a_ptr + tl.program_id(1))          # one scalar per folded batch row
        x = tl.load(x_ptr + tl.program_id(1) * n + offs, mask=offs < n)
        tl.store(y_ptr + tl.program_id(1) * n + offs, a * x, mask=offs < n)

    def _scale_core(x, a, *, lead, backend):
        x2, restore = rows_2d(x, lead)                  # [B, n]
        a1 = a.reshape(-1)                              # [B]
        y = launch(_scale_kernel, x2, a1, x2.shape[1], backend=backend,
                   out_shape=jax.ShapeDtypeStruct(x2.shape, x2.dtype),
                   grid=(cdiv(x2.shape[1], 1024), x2.shape[0]), BLOCK=1024)
        return restore(y)

    def scale(x, a, *, backend=None):
        name = resolve_backend(backend)
        if name == "reference":
            return a * x
        return fold_vmap(functools.partial(_scale_core, backend=name))(x, a)

:func:`launch` arguments follow ``triton_call``: arrays and Python ``int`` scalars in the kernel's
order, then one pointer per output (``out_shape``), then ``tl.constexpr`` keyword arguments.
Never pass Python floats (they become fp64 in the kernel) and never pass traced values as
scalars: pass them as arrays (gamma, lambda and discounts may be traced in a sweep).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kernels._triton import compile_without_torch  # noqa: F401  (rl.run.train lowers under it)
from kernels._triton import import_error as triton_import_error

BACKENDS: tuple[str, ...] = ("triton", "reference", "interpret")
# ``backend="auto"``: no choice made here (what ``None`` means), spelled as a value for configs.
AUTO = "auto"
ENV_VAR = "FUSEDRL_KERNEL_BACKEND"

_process_backend: str | None = None


class BackendUnavailableError(RuntimeError):
    """A kernel backend was asked for where it cannot run (e.g. ``triton`` without a GPU)."""


# --------------------------------------------------------------------------- backend choice


def _check_name(name: str, where: str) -> str:
    if name not in BACKENDS:
        raise ValueError(
            f"unknown kernel backend {name!r} ({where}); valid backends: {', '.join(BACKENDS)}, "
            f"or {AUTO!r} for the automatic choice"
        )
    return name


def set_backend(name: str | None) -> None:
    """Sets the process-wide kernel backend (``None`` or ``"auto"`` restores the automatic
    choice)."""
    global _process_backend
    if name == AUTO:
        name = None
    if name is not None:
        _check_name(name, "set_backend")
    _process_backend = name


def get_backend() -> str | None:
    """The process-wide setting made by :func:`set_backend`, or ``None`` when automatic."""
    return _process_backend


@contextlib.contextmanager
def use_backend(name: str | None) -> Iterator[None]:
    """Context manager: ``with use_backend("interpret"): ...``
    then restores the previous setting."""
    previous = _process_backend
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


@functools.lru_cache(maxsize=None)
def _jax_triton_import_error() -> str | None:
    try:
        import jax_triton  # noqa: F401  (lazy: it raises ImportError with a CPU-only jax)
    except Exception as err:  # ImportError, or anything a half-installed CUDA stack raises
        return f"{type(err).__name__}: {err}"
    return None


def _on_gpu() -> bool:
    try:
        return jax.default_backend() == "gpu"
    except RuntimeError:
        return False


def triton_unavailable_reason() -> str | None:
    """Why the ``triton`` backend cannot run here, or ``None`` when it can."""
    if not _on_gpu():
        return f"JAX's default backend is {jax.default_backend()!r}, not a GPU"
    if triton_import_error() is not None:
        return f"{triton_import_error()}; install it with pip install 'fusedrl[gpu]'"
    error = _jax_triton_import_error()
    if error is not None:
        return f"jax_triton does not import ({error}); install it with pip install 'fusedrl[gpu]'"
    return None


@functools.lru_cache(maxsize=None)
def interpret_unavailable_reason() -> str | None:
    """Why the ``interpret`` backend cannot run here (needs triton and torch), or ``None``."""
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
        from triton.runtime.interpreter import InterpretedFunction  # noqa: F401
    except Exception as err:
        return f"{type(err).__name__}: {err}; install them with pip install 'fusedrl[interpret]'"
    return None


def available_backends() -> tuple[str, ...]:
    """The backends that can run in this process, in :data:`BACKENDS` order."""
    names = []
    if triton_unavailable_reason() is None:
        names.append("triton")
    names.append("reference")
    if interpret_unavailable_reason() is None:
        names.append("interpret")
    return tuple(names)


def default_backend() -> str:
    """The automatic choice: ``triton`` on a GPU with jax_triton, else ``reference``."""
    return "triton" if triton_unavailable_reason() is None else "reference"


def _environment_choice() -> str | None:
    """The backend named by the environment variable, or None when it is unset, empty or "auto"."""
    value = os.environ.get(ENV_VAR)
    return None if not value or value == AUTO else value


def chosen_automatically(backend: str | None = None) -> bool:
    """Whether :func:`resolve_backend` (with this argument) falls through to the automatic choice:
    no ``backend=`` (or ``"auto"``), no process-wide setting and no environment variable. Ops may
    then trade the Triton kernel for XLA at shapes where they measured XLA faster
    (documented per op)."""
    return backend in (None, AUTO) and _process_backend is None and _environment_choice() is None


def resolve_backend(backend: str | None = None) -> str:
    """The backend an op call should use (see the module docstring for the order), checked."""
    if backend == AUTO:
        backend = None
    if backend is not None:
        name = _check_name(backend, "backend= argument")
    elif _process_backend is not None:
        name = _process_backend
    elif (from_environment := _environment_choice()) is not None:
        name = _check_name(from_environment, f"environment variable {ENV_VAR}")
    else:
        return default_backend()
    if name == "triton":
        reason = triton_unavailable_reason()
        if reason is not None:
            raise BackendUnavailableError(f"kernel backend 'triton' cannot run here: {reason}")
    elif name == "interpret":
        reason = interpret_unavailable_reason()
        if reason is not None:
            raise BackendUnavailableError(
                f"kernel backend 'interpret' needs triton and torch (CPU): {reason}"
            )
    return name


# --------------------------------------------------------------------------- input checks


def check_float_array(
    name: str, x: Any, *, min_ndim: int = 0, ndim: int | None = None
) -> jax.Array:
    """Returns ``x`` as a JAX array after checking it is floating point with the right rank."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(
            f"{name} must be a floating-point array, got dtype {x.dtype} with shape "
            f"{tuple(x.shape)}"
        )
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have rank {ndim}, got shape {tuple(x.shape)}")
    if x.ndim < min_ndim:
        raise ValueError(f"{name} must have rank >= {min_ndim}, got shape {tuple(x.shape)}")
    return jnp.asarray(x)


def check_same_shape(reference_name: str, reference: jax.Array, **others: jax.Array) -> None:
    """Raises ``ValueError`` naming the argument whose shape differs from ``reference``'s."""
    for name, x in others.items():
        if tuple(x.shape) != tuple(reference.shape):
            raise ValueError(
                f"{name} must have the shape of {reference_name} {tuple(reference.shape)}, "
                f"got {tuple(x.shape)}"
            )


def check_lambda_returns_inputs(rewards: Any, lambda_: Any, **others: Any) -> tuple[jax.Array, ...]:
    """Checks the inputs of a lambda-return op (GAE, Q(lambda)) and casts them to one dtype.

    ``rewards`` and each of ``others`` (by keyword, in order) are float arrays of rank >= 1 with the
    shape of ``rewards``; ``lambda_`` is a float scalar or an array of that shape. Returns
    ``(rewards, *others, lambda_)`` in their common result dtype; raises ``ValueError`` naming the
    argument otherwise.
    """
    rewards = check_float_array("rewards", rewards, min_ndim=1)
    arrays = {name: check_float_array(name, x, min_ndim=1) for name, x in others.items()}
    check_same_shape("rewards", rewards, **arrays)
    lambda_ = check_float_array("lambda_", lambda_)
    if lambda_.ndim != 0 and lambda_.shape != rewards.shape:
        raise ValueError(
            f"lambda_ must be a scalar or have the shape of rewards {tuple(rewards.shape)}, "
            f"got {tuple(lambda_.shape)}"
        )
    dtype = jnp.result_type(rewards, *arrays.values(), lambda_)
    return tuple(x.astype(dtype) for x in (rewards, *arrays.values(), lambda_))


# --------------------------------------------------------------------------- layouts


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def time_major_3d(x: jax.Array, lead: int) -> tuple[jax.Array, Callable[[jax.Array], jax.Array]]:
    """Views ``x`` of shape ``[*lead_axes, T, *batch]`` as ``[B, T, N]`` (a reshape, no copy).

    ``B`` is the product of the ``lead`` folded vmap axes, ``N`` the product of the trailing batch
    axes. Returns the 3-d array and a function mapping a ``[B, T, N]`` result back to ``x``'s shape.
    """
    shape = tuple(x.shape)
    b = math.prod(shape[:lead])
    t = shape[lead]
    n = math.prod(shape[lead + 1 :])
    return x.reshape(b, t, n), lambda y: y.reshape(shape)


def rows_2d(
    x: jax.Array, lead: int, core_ndim: int = 1
) -> tuple[jax.Array, Callable[[jax.Array], jax.Array]]:
    """Views ``x`` as ``[rows, cols]``: the last ``core_ndim`` axes flattened into cols,
    the rest rows.

    The returned ``restore(y)`` maps ``y [rows, cols]`` back to ``x``'s shape, and
    ``y [rows, *tail]`` with another trailing shape to ``[*row axes, *tail]``.

    ``lead`` is accepted for symmetry with :func:`time_major_3d`: leading folded axes are rows too.
    """
    del lead
    shape = tuple(x.shape)
    split = len(shape) - core_ndim
    rows = math.prod(shape[:split])
    cols = math.prod(shape[split:])

    def restore(y: jax.Array) -> jax.Array:
        # same trailing size as x: x's shape; otherwise (e.g. a per-row result) the rows' shape
        # + y's tail
        return y.reshape(
            shape if tuple(y.shape[1:]) == (cols,) else shape[:split] + tuple(y.shape[1:])
        )

    return x.reshape(rows, cols), restore


# --------------------------------------------------------------------------- vmap folding


def fold_vmap(
    core: Callable[..., Any], lead: int = 0, batch_axes: str | None = None
) -> Callable[..., Any]:
    """``f(*arrays) = core(*arrays, lead=lead)`` with a custom_vmap rule that folds vmapped axes.

    Under ``jax.vmap`` the rule receives the batched arguments with the vmapped axis first,
    broadcasts the unbatched ones to the same leading size, and calls ``fold_vmap(core, lead + 1)``
    on them, so the vmapped axis becomes one more leading axis of every argument and the kernel's
    grid covers it: one launch for any depth of nested vmaps. All outputs are marked batched.
    Positional arguments must be JAX arrays (not pytrees, not Python scalars).

    Where JAX sees more than one device, the launch is wrapped by :func:`split_over_batch_axes`, so
    that under ``jax.sharding`` each device runs it on its own slice of the folded vmap axes, and of
    the op's own batch axes when ``batch_axes`` declares them ("trailing": arrays ``[T, *batch]`` /
    ``[*batch]``, the scans; "leading": ``[*rows, K]`` / ``[*rows]``, the row ops; None: the op's
    axes are kept whole).
    """

    if batch_axes not in (None, *BATCH_AXES):
        raise ValueError(f"batch_axes must be one of {BATCH_AXES} or None, got {batch_axes!r}")

    @jax.custom_batching.custom_vmap
    def folded(*arrays):
        if (lead == 0 and batch_axes is None) or jax.device_count() == 1:  # nothing to split
            return core(*arrays, lead=lead)
        return split_over_batch_axes(core, lead, arrays, batch_axes)(*arrays)

    @folded.def_vmap
    def _rule(axis_size, in_batched, *arrays):
        arrays = [
            a if batched else jnp.broadcast_to(a, (axis_size,) + tuple(jnp.shape(a)))
            for a, batched in zip(arrays, in_batched)
        ]
        out = fold_vmap(core, lead + 1, batch_axes)(*arrays)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return folded


# --------------------------------------------------------------------------- sharding

BATCH_AXES = ("trailing", "leading")


def _batch_factor_axes(op_shape: tuple, batch: tuple, where: str | None) -> range:
    """The op axes of an array of op shape ``op_shape`` that are the op's batch axes ``batch``:
    its last ``len(batch)`` axes when they equal ``batch`` ("trailing": ``[T, *batch]`` or
    ``[*batch]``), its first ones ("leading": ``[*rows, K]`` or ``[*rows]``); none otherwise."""
    k = len(batch)
    if where is None or k == 0 or len(op_shape) < k:
        return range(0)
    if where == "trailing" and op_shape[len(op_shape) - k :] == batch:
        return range(len(op_shape) - k, len(op_shape))
    if where == "leading" and op_shape[:k] == batch:
        return range(k)
    return range(0)


def split_over_batch_axes(
    core: Callable[..., Any], lead: int, arrays: Sequence[jax.Array], batch_axes: str | None = None
) -> Callable[..., Any]:
    """``core(*arrays, lead=lead)`` as an op XLA's SPMD partitioner may split along its independent
    axes: the ``lead`` folded vmap axes, which every argument and output carries first, and, when
    the op declares them (``batch_axes``), its own batch axes.

    Why it is sound: the folded axes are vmapped axes, and a vmapped function's result at index
    ``i`` depends on the arguments at index ``i`` alone; an op that declares batch axes promises the
    same of them (a scan's columns, a row op's rows). So for any split of those axes over the
    devices of a mesh, running the kernel on each device's slice (a smaller grid) and concatenating
    gives the op's result. The launch is a custom call (``triton_call``, or the interpreter's
    ``pure_callback``) that XLA cannot look into: without this rule the partitioner gathers every
    argument onto one device around it and scatters the outputs back.

    Batch axes (``batch_axes``): the op's batch shape is the first argument's op shape (after the
    ``lead`` axes) without its first axis ("trailing": ``[T, *batch]``, the scans) or without its
    last axis ("leading": ``[*rows, K]``, the row ops); each argument and output whose op shape ends
    (trailing) or starts (leading) with that batch shape shares those axes.

    Rule (``jax.experimental.custom_partitioning``): the lead axes and the batch axes are factors
    shared by the arrays that carry them; every other axis is the op's own and is kept whole
    (``need_replication``: the time axis of a scan cannot be split). The partition gives each shared
    factor the split of the first argument that splits it (a factor whose mesh axes an earlier
    factor already took stays whole) and replicates the rest. On one device, or inside
    ``shard_map``, custom_partitioning inlines ``core`` unchanged.

    A launch that calls back into the host (the ``"interpret"`` backend) is returned as it is:
    custom_partitioning lowers the per-device function into a module whose host callbacks it does
    not keep alive, so they cannot run inside it (JAX 0.10-0.11). Those launches keep the gather.
    """
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import NamedSharding, PartitionSpec

    jaxpr, out_avals = jax.make_jaxpr(functools.partial(core, lead=lead), return_shape=True)(
        *arrays
    )
    if _calls_host(jaxpr.jaxpr):
        return functools.partial(core, lead=lead)
    first = tuple(arrays[0].shape[lead:]) if arrays else ()
    batch = (first[1:] if batch_axes == "trailing" else first[:-1]) if first else ()

    def factors(prefix: str, shape: tuple) -> list[str]:
        op_shape = tuple(shape[lead:])
        shared = {
            axis: f"b{i}" for i, axis in enumerate(_batch_factor_axes(op_shape, batch, batch_axes))
        }
        return [f"l{i}" for i in range(lead)] + [
            shared.get(j, f"{prefix}d{j}") for j in range(len(op_shape))
        ]

    operands = [factors(f"a{i}", a.shape) for i, a in enumerate(arrays)]
    results = [
        factors(f"r{k}", o.shape) for k, o in enumerate(jax.tree_util.tree_leaves(out_avals))
    ]
    shared = [f"l{i}" for i in range(lead)] + [f"b{i}" for i in range(len(batch))]
    own = tuple(f for mapping in operands + results for f in mapping if f not in shared)
    rule = (
        ", ".join(" ".join(m) for m in operands) + " -> " + ", ".join(" ".join(m) for m in results)
    )

    def splits(arg_shapes) -> dict:
        """Each shared factor's split (a PartitionSpec entry),
        from the first argument splitting it."""
        found: dict = {}
        for mapping, a in zip(operands, arg_shapes):
            if isinstance(a.sharding, NamedSharding):
                spec = tuple(a.sharding.spec) + (None,) * (len(mapping) - len(a.sharding.spec))
                for f, entry in zip(mapping, spec):
                    if f in shared and entry is not None:
                        found.setdefault(f, entry)
        chosen, taken = {}, set()
        for f in shared:  # lead axes first; a mesh axis splits one factor at most
            names = set(found[f]) if isinstance(found.get(f), tuple) else {found.get(f)} - {None}
            if names and not names & taken:
                chosen[f] = found[f]
                taken |= names
        return chosen

    def on(mesh, chosen: dict, mapping: list[str]):
        return NamedSharding(mesh, PartitionSpec(*(chosen.get(f) for f in mapping)))

    def infer(mesh, arg_shapes, result_shape):
        chosen = splits(arg_shapes)
        flat, tree = jax.tree_util.tree_flatten(result_shape)
        return jax.tree_util.tree_unflatten(
            tree, [on(mesh, chosen, m) for m in results[: len(flat)]]
        )

    def partition(mesh, arg_shapes, result_shape):
        chosen = splits(arg_shapes)
        arg_shardings = tuple(on(mesh, chosen, m) for m in operands)
        return (
            mesh,
            functools.partial(core, lead=lead),
            infer(mesh, arg_shapes, result_shape),
            arg_shardings,
        )

    @custom_partitioning
    def op(*args):
        return core(*args, lead=lead)

    op.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule=rule,
        need_replication_factors=own,
    )
    return op


def _calls_host(jaxpr) -> bool:
    """Whether ``jaxpr`` (or a jaxpr nested in one of its equations) contains a host callback."""
    from jax.extend.core import jaxprs_in_params

    return any(
        "callback" in eqn.primitive.name
        or any(_calls_host(sub) for sub in jaxprs_in_params(eqn.params))
        for eqn in jaxpr.eqns
    )


# --------------------------------------------------------------------------- launching


ShapeDtype = Any  # anything with .shape and .dtype, e.g. jax.ShapeDtypeStruct


def launch(
    kernel: Any,
    *args: Any,
    out_shape: ShapeDtype | Sequence[ShapeDtype],
    grid: tuple[int, ...],
    backend: str,
    zeroed_outputs: Sequence[int] = (),
    input_output_aliases: dict[int, int] | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    **constexprs: Any,
) -> Any:
    """Runs ``kernel`` (a ``@triton.jit`` function) on ``backend`` ("triton" or "interpret").

    ``args``: JAX arrays and Python ``int`` scalars in the kernel's parameter order; the kernel then
    receives one pointer per entry of ``out_shape``, and ``constexprs`` as ``tl.constexpr``
    keywords. ``grid`` is a tuple of up to 3 ints. Outputs listed in ``zeroed_outputs`` start as
    zeros; ``input_output_aliases`` maps the position of an array among the array arguments to an
    output that starts as that array (the same buffer on the GPU: an in-place update, XLA copying
    the input first only where it is still needed); the others start undefined (NaN / garbage
    under ``interpret``, to catch unwritten elements). Returns one array or a list, matching
    ``out_shape``.
    """
    aliases = dict(input_output_aliases or {})
    single = not isinstance(out_shape, (list, tuple))
    out_shapes = [out_shape] if single else list(out_shape)
    out_shapes = [jax.ShapeDtypeStruct(tuple(s.shape), s.dtype) for s in out_shapes]
    grid = tuple(int(g) for g in grid)
    for a in args:
        if isinstance(a, float):
            raise TypeError(
                "launch: pass float scalars as np.float32 or as arrays, not Python floats"
            )
    if backend == "triton":
        import jax_triton  # lazy: ImportError with a CPU-only jax

        out = jax_triton.triton_call(
            *args,
            kernel=kernel,
            out_shape=out_shapes,
            grid=grid,
            num_warps=num_warps,
            num_stages=num_stages,
            zeroed_outputs=tuple(zeroed_outputs),
            input_output_aliases=aliases,
            **constexprs,
        )
    elif backend == "interpret":
        out = _interpret_call(
            kernel, args, out_shapes, grid, tuple(zeroed_outputs), constexprs, aliases
        )
    else:
        raise ValueError(f"launch needs backend 'triton' or 'interpret', got {backend!r}")
    return out[0] if single else list(out)


_interpreted_cache: dict[int, tuple[Any, Any]] = {}
_interpreter_lock = threading.Lock()


def _interpreted(kernel: Any) -> Any:
    """The interpreter twin of an already-decorated ``@triton.jit`` function.

    Triton picks interpret mode from TRITON_INTERPRET when a function is *decorated*; wrapping the
    undecorated Python function (``kernel.fn``) in ``InterpretedFunction`` gets the interpreter on
    demand without touching how the same kernel compiles for the GPU. Keyed by identity: hashing a
    JITFunction parses its source, which fails while the interpreter has patched triton.language.
    """
    from triton.runtime.interpreter import InterpretedFunction

    entry = _interpreted_cache.get(id(kernel))
    if entry is None:
        entry = _interpreted_cache[id(kernel)] = (kernel, InterpretedFunction(kernel.fn))
    return entry[1]


def _triton_language_namespaces() -> list[Any]:
    """The ``triton.language`` modules loaded now and the classes they define: what Triton's
    interpreter patches (``tl.arange``, ``tl.tensor.__index__``, ...) while it runs a kernel."""
    import sys

    modules = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("triton.language") and m is not None
    ]
    classes = {
        id(v): v
        for m in modules
        for v in vars(m).values()
        if isinstance(v, type) and getattr(v, "__module__", "").startswith("triton.language")
    }
    return modules + list(classes.values())


@contextlib.contextmanager
def _restoring_triton_language() -> Iterator[None]:
    """Puts every ``triton.language`` module and class attribute that existed on entry back
    as it was.

    Triton 3.6's interpreter leaves its patches in ``triton.language`` after a launch (3.9 restores
    them), so a later GPU compile of any kernel in the same process would trace interpreter builtins
    and fail; restoring the attributes it replaced keeps the interpret and triton backends usable
    side by side. Names it added (absent on entry) are left in place: Triton 3.9 adds names it
    relies on in later launches.
    """
    namespaces = _triton_language_namespaces()
    saved = [(ns, dict(vars(ns))) for ns in namespaces]
    try:
        yield
    finally:
        for ns, before in saved:  # names the interpreter added stay: it may rely on them later
            now = vars(ns)
            for name, value in before.items():
                if now.get(name, _MISSING) is not value:
                    try:
                        setattr(ns, name, value)
                    except (AttributeError, TypeError):
                        pass


_MISSING = object()


@contextlib.contextmanager
def _interpret_device_calls() -> Iterator[None]:
    """Routes calls of ``@triton.jit`` helpers (``tl.min``, combine functions, our own helpers)
    made from an interpreted kernel to their interpreter twins, for the duration of one launch, and
    leaves ``triton.language`` as it found it; for that launch the interpreter also rounds float32
    to bfloat16 and multiplies bfloat16 tiles as the GPU does (`_BFLOAT16_METHODS`)."""
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    with _interpreter_lock, _restoring_triton_language():
        original = JITFunction.__call__
        original_patch = interpreter._patch_lang_tensor
        builder = interpreter.InterpreterBuilder
        original_builder = {  # a method a Triton version lacks is left alone
            name: getattr(builder, name) for name in _BFLOAT16_METHODS if hasattr(builder, name)
        }
        JITFunction.__call__ = lambda self, *args, **kwargs: _interpreted(self)(*args, **kwargs)
        interpreter._patch_lang_tensor = _with_scalar_index(original_patch)
        for name, method in original_builder.items():
            setattr(builder, name, _BFLOAT16_METHODS[name](method))
        try:
            yield
        finally:
            JITFunction.__call__ = original
            interpreter._patch_lang_tensor = original_patch
            for name, method in original_builder.items():
                setattr(builder, name, method)


def _with_scalar_index(patch_lang_tensor):
    """Triton's ``_patch_lang_tensor`` followed by an ``__index__`` that reads the one element of
    the handle's array, whatever its shape. The interpreter holds a scalar (a kernel argument such
    as a loop bound) as a shape-(1,) array; Triton 3.6 converts it with ``int(data)``, which NumPy
    refuses for arrays of ndim > 0, so ``range(n)`` over such a scalar fails there
    (3.9 squeezes)."""

    def patch(tensor, *args, **kwargs):
        patch_lang_tensor(tensor, *args, **kwargs)
        tensor.__index__ = lambda self: int(np.asarray(self.handle.data).reshape(-1)[0])

    return patch


def _bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16, to nearest even (NaN stays NaN), as the uint16 bit
    patterns the interpreter keeps bfloat16 tensors in."""
    import ml_dtypes  # a dependency of jax

    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def _bfloat16_values(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 bit patterns (exact)."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _rounding_to_bfloat16(convert):
    """A builder conversion (``create_fp_trunc`` / ``create_fp_to_fp``) whose float32 -> bfloat16
    case rounds to nearest even, as the GPU's ``cvt.rn.bf16.f32`` does. Triton 3.6-3.9's
    interpreter truncates there (``create_fp_trunc``) or rounds without carrying into the exponent
    (``create_fp_to_fp``), so a bf16 kernel would round differently under the interpreter."""

    def patched(self, src, dst_type, *rest):
        from triton.runtime.interpreter import TensorHandle

        if src.dtype.scalar == _tl_dtype("float32") and dst_type.scalar == _tl_dtype("bfloat16"):
            return TensorHandle(_bfloat16_bits(src.data), dst_type.scalar)
        return convert(self, src, dst_type, *rest)

    return patched


def _bfloat16_dot(create_dot):
    """The builder's ``create_dot`` with bfloat16 operands read as their float32 values (exact) and
    multiplied in float32: Triton 3.9's interpreter multiplies their uint16 bit patterns as
    integers. The products of two bfloat16 values are exact in float32, so this is the tensor
    cores' bf16 x bf16 -> f32 dot up to the order of the sum."""

    def patched(self, a, b, *rest):
        from triton.runtime.interpreter import TensorHandle

        bf16, f32 = _tl_dtype("bfloat16"), _tl_dtype("float32")
        as_f32 = lambda t: (
            TensorHandle(_bfloat16_values(t.data), f32) if t.dtype.scalar == bf16 else t
        )
        return create_dot(self, as_f32(a), as_f32(b), *rest)

    return patched


def _tl_dtype(name: str):
    import triton.language as tl

    return getattr(tl, name)


# the interpreter builder's methods replaced for one launch (see `_interpret_device_calls`)
_BFLOAT16_METHODS = {
    "create_fp_trunc": _rounding_to_bfloat16,
    "create_fp_to_fp": _rounding_to_bfloat16,
    "create_dot": _bfloat16_dot,
}


def _interpret_call(kernel, args, out_shapes, grid, zeroed_outputs, constexprs, aliases=None):
    array_positions = [
        i for i, a in enumerate(args) if not isinstance(a, (int, np.integer, np.floating, bool))
    ]
    arrays = [args[i] for i in array_positions]
    starts_as = {out: array for array, out in (aliases or {}).items()}

    def host(*host_arrays):
        import torch

        kernel_args = list(args)
        for i, a in zip(array_positions, host_arrays):
            kernel_args[i] = torch.from_numpy(np.array(a, copy=True))
        for i, a in enumerate(kernel_args):  # the interpreter wants Python scalars
            if isinstance(a, (np.integer, bool)):
                kernel_args[i] = int(a)
            elif isinstance(a, np.floating):
                kernel_args[i] = float(a)
        outs = []
        for j, s in enumerate(out_shapes):
            t = torch.from_numpy(np.zeros(s.shape, s.dtype))
            if j in starts_as:
                t = torch.from_numpy(
                    np.array(host_arrays[starts_as[j]], dtype=s.dtype, copy=True).reshape(s.shape)
                )
            elif j not in zeroed_outputs:
                t.fill_(float("nan") if np.issubdtype(s.dtype, np.floating) else -7)
            outs.append(t)
        with _interpret_device_calls():
            _interpreted(kernel)[grid](*kernel_args, *outs, **constexprs)
        return [o.numpy() for o in outs]

    return jax.pure_callback(host, out_shapes, *arrays)
