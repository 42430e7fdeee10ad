"""The launch layer: backend choice and its errors, vmap folding into one launch,
the interpreter."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl

import kernels
from kernels import launch as L


@triton.jit
def _affine_kernel(x_ptr, a_ptr, n, y_ptr, BLOCK: tl.constexpr):
    """y[b, i] = a[b] * x[b, i] + 1 over a [B, n] array, grid (column blocks, B)."""
    row = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + row)
    x = tl.load(x_ptr + row * n + offs, mask=mask)
    tl.store(y_ptr + row * n + offs, a * x + 1.0, mask=mask)


@triton.jit
def _writes_nothing_kernel(x_ptr, y_ptr):
    pass


def _affine_core(x, a, *, lead, backend, launches):
    x2, restore = L.rows_2d(x, lead, core_ndim=x.ndim - lead)
    launches.append(x2.shape)
    y = L.launch(
        _affine_kernel,
        x2,
        a.reshape(-1),
        x2.shape[1],
        backend=backend,
        out_shape=jax.ShapeDtypeStruct(x2.shape, x2.dtype),
        grid=(L.cdiv(x2.shape[1], 8), x2.shape[0]),
        BLOCK=8,
    )
    return restore(y)


# ------------------------------------------------------------------------- backend choice


def test_unknown_backend_names_the_valid_ones(monkeypatch):
    with pytest.raises(
        ValueError, match="unknown kernel backend 'cuda'.*triton, reference, interpret"
    ):
        L.resolve_backend("cuda")
    with pytest.raises(ValueError, match="unknown kernel backend 'gpu'"):
        L.set_backend("gpu")
    monkeypatch.setenv(L.ENV_VAR, "fast")
    with pytest.raises(ValueError, match="FUSEDRL_KERNEL_BACKEND"):
        L.resolve_backend()
    with pytest.raises(ValueError, match="unknown kernel backend"):
        kernels.gae(*[np.zeros((2, 1), np.float32)] * 4, np.float32(0.5), backend="nope")


def test_priority_call_then_setting_then_env_then_automatic(monkeypatch):
    monkeypatch.delenv(L.ENV_VAR, raising=False)
    assert L.resolve_backend() == L.default_backend()
    monkeypatch.setenv(L.ENV_VAR, "reference")
    assert L.resolve_backend() == "reference"
    with L.use_backend("interpret"):
        assert L.get_backend() == "interpret"
        assert L.resolve_backend() == "interpret"
        assert L.resolve_backend("reference") == "reference"
    assert L.get_backend() is None
    L.set_backend("interpret")
    try:
        assert L.resolve_backend() == "interpret"
    finally:
        L.set_backend(None)
    assert L.resolve_backend() == "reference"


def test_auto_is_the_automatic_choice_spelled_as_a_value(monkeypatch):
    """backend="auto" (what configs say) means what None means, at every level, and keeps an op's
    own small-shape crossovers (chosen_automatically) that a named backend switches off."""
    monkeypatch.delenv(L.ENV_VAR, raising=False)
    assert L.resolve_backend("auto") == L.resolve_backend(None) == L.default_backend()
    assert L.chosen_automatically("auto") and L.chosen_automatically(None)
    assert not L.chosen_automatically("reference")
    with L.use_backend("interpret"):
        assert L.resolve_backend("auto") == "interpret" and not L.chosen_automatically("auto")
    L.set_backend("auto")
    try:
        assert L.get_backend() is None
    finally:
        L.set_backend(None)
    monkeypatch.setenv(L.ENV_VAR, "auto")
    assert L.resolve_backend() == L.default_backend() and L.chosen_automatically("auto")
    monkeypatch.setenv(L.ENV_VAR, "reference")
    assert L.resolve_backend("auto") == "reference" and not L.chosen_automatically("auto")


@pytest.mark.skipif(
    L.interpret_unavailable_reason() is not None,
    reason="needs triton and torch (the interpret extra)",
)
def test_every_op_takes_auto_and_runs_the_kernel_the_process_chose(monkeypatch):
    """Under use_backend("interpret"), backend="auto" reaches each op's kernel path (the interpreter
    runs it through a pure_callback) and gives the reference's numbers."""
    monkeypatch.delenv(L.ENV_VAR, raising=False)
    T, N, B, K = 5, 3, 4, 21
    r, v, nv, d = (jax.random.uniform(jax.random.PRNGKey(i), (T, N)) for i in range(4))
    logits = jax.random.normal(jax.random.PRNGKey(5), (B, K))
    actions = jnp.arange(B) % K
    support = jnp.linspace(0.0, 10.0, K)
    calls = {
        "gae": lambda b: kernels.gae(r, v, nv, d, 0.9, backend=b),
        "q_lambda_returns": lambda b: kernels.q_lambda_returns(r, nv, d, 0.9, backend=b),
        "discounted_returns": lambda b: kernels.discounted_returns(r, d, nv[0], backend=b),
        "softmax": lambda b: kernels.softmax(logits, backend=b),
        "categorical_log_prob_entropy": lambda b: kernels.categorical_log_prob_entropy(
            logits, actions, backend=b
        ),
        "categorical_projection": lambda b: kernels.categorical_projection(
            jnp.broadcast_to(support * 0.9 + 0.5, (B, K)),
            jax.nn.softmax(logits),
            support,
            backend=b,
        ),
    }
    for name, call in calls.items():
        with L.use_backend("interpret"):
            assert "pure_callback" in str(jax.make_jaxpr(lambda: call("auto"))()), name
            got = call("auto")
        np.testing.assert_allclose(got, call("reference"), rtol=1e-5, atol=1e-5, err_msg=name)


def test_automatic_choice_matches_the_device():
    on_gpu = jax.default_backend() == "gpu" and L.triton_unavailable_reason() is None
    assert L.default_backend() == ("triton" if on_gpu else "reference")
    assert set(L.available_backends()) <= set(L.BACKENDS)


@pytest.mark.skipif(L.triton_unavailable_reason() is None, reason="triton can run on this machine")
def test_triton_where_it_cannot_run_is_a_clear_error():
    with pytest.raises(L.BackendUnavailableError, match="kernel backend 'triton' cannot run here"):
        L.resolve_backend("triton")
    with pytest.raises(L.BackendUnavailableError, match="cannot run here"):
        kernels.discounted_returns(
            np.zeros((2, 1), np.float32),
            np.zeros((2, 1), np.float32),
            np.zeros(1, np.float32),
            backend="triton",
        )


# ------------------------------------------------------------------------- launching and folding


def test_vmap_folds_into_one_launch(kernel_backend):
    launches = []
    op = functools.partial(_affine_core, backend=kernel_backend, launches=launches)
    x = jnp.arange(3 * 4 * 5, dtype=jnp.float32).reshape(3, 4, 5)
    a = jnp.array([1.0, -2.0, 3.0, 0.5], jnp.float32)

    # seeds (x batched, a not) x hyper-parameters (a batched, x not): partial batching at each level
    f = jax.vmap(
        jax.vmap(lambda a_, x_: L.fold_vmap(op)(x_, a_), in_axes=(None, 0)), in_axes=(0, None)
    )
    out = jax.jit(f)(a, x)
    np.testing.assert_allclose(out, a[:, None, None, None] * x[None] + 1.0)
    # the program holds one kernel call, on both vmapped axes folded into the grid's rows
    text = str(jax.make_jaxpr(f)(a, x))
    assert text.count("pure_callback[") + text.count("triton_kernel_call[") == 1
    assert launches[-1] == (4 * 3, 4 * 5)


def test_launch_rejects_python_floats(kernel_backend):
    with pytest.raises(TypeError, match="np.float32"):
        L.launch(
            _affine_kernel,
            jnp.zeros((1, 8)),
            jnp.ones(1),
            0.5,
            backend=kernel_backend,
            out_shape=jax.ShapeDtypeStruct((1, 8), jnp.float32),
            grid=(1, 1),
            BLOCK=8,
        )


def test_interpreter_marks_unwritten_outputs():
    if L.interpret_unavailable_reason() is not None:
        pytest.skip(L.interpret_unavailable_reason())
    out = L.launch(
        _writes_nothing_kernel,
        jnp.zeros(4),
        backend="interpret",
        out_shape=jax.ShapeDtypeStruct((4,), jnp.float32),
        grid=(1,),
    )
    assert np.isnan(np.asarray(out)).all()
    zeroed = L.launch(
        _writes_nothing_kernel,
        jnp.zeros(4),
        backend="interpret",
        out_shape=[jax.ShapeDtypeStruct((4,), jnp.float32)],
        grid=(1,),
        zeroed_outputs=(0,),
    )
    np.testing.assert_array_equal(zeroed[0], 0.0)


def test_an_interpreter_launch_leaves_triton_language_as_it_was():
    """Triton's interpreter patches triton.language while it runs (3.6 leaves the patches behind);
    after a launch every module and class attribute there is the same object as before."""
    if L.interpret_unavailable_reason() is not None:
        pytest.skip(L.interpret_unavailable_reason())
    before = [(ns, dict(vars(ns))) for ns in L._triton_language_namespaces()]
    L.launch(
        _affine_kernel,
        jnp.zeros((1, 8)),
        jnp.ones(1),
        8,
        backend="interpret",
        out_shape=jax.ShapeDtypeStruct((1, 8), jnp.float32),
        grid=(1, 1),
        BLOCK=8,
    ).block_until_ready()
    changed = [
        f"{getattr(ns, '__name__', ns)}.{name}"
        for ns, attrs in before
        for name, value in attrs.items()
        if vars(ns).get(name) is not value
    ]
    assert not changed, changed


def test_triton_compiles_after_the_interpreter_ran_in_the_same_process():
    """The README's order on a GPU: an op on the interpreter,
    then the same op compiled for the GPU."""
    if L.interpret_unavailable_reason() is not None or L.triton_unavailable_reason() is not None:
        pytest.skip("needs both the interpret and the triton backend (a GPU with jax-triton)")
    x, scale = jnp.arange(8.0).reshape(1, 8), jnp.ones(1)
    call = lambda backend: L.launch(
        _affine_kernel,
        x,
        scale,
        8,
        backend=backend,
        out_shape=jax.ShapeDtypeStruct((1, 8), jnp.float32),
        grid=(1, 1),
        BLOCK=8,
    )
    interpreted = np.asarray(call("interpret"))
    np.testing.assert_array_equal(np.asarray(call("triton")), interpreted)
    rewards, discounts = (
        jnp.ones((16, 4)),
        jnp.full((16, 4), 0.9),
    )  # a kernel with @triton.jit helpers
    np.testing.assert_allclose(
        kernels.discounted_returns(rewards, discounts, jnp.zeros(4), backend="triton"),
        kernels.discounted_returns(rewards, discounts, jnp.zeros(4), backend="reference"),
        rtol=1e-6,
    )


def test_the_interpreter_runs_after_triton_compiled_in_the_same_process():
    """The other order: an op compiled for the GPU, then the same op (with @triton.jit helpers) on
    the interpreter, which must see triton.language as the GPU compile left it."""
    if L.interpret_unavailable_reason() is not None or L.triton_unavailable_reason() is not None:
        pytest.skip("needs both the interpret and the triton backend (a GPU with jax-triton)")
    rewards, discounts, last = jnp.ones((16, 4)), jnp.full((16, 4), 0.9), jnp.zeros(4)
    reference = kernels.discounted_returns(rewards, discounts, last, backend="reference")
    np.testing.assert_allclose(
        kernels.discounted_returns(rewards, discounts, last, backend="triton"), reference, rtol=1e-6
    )
    np.testing.assert_allclose(
        kernels.discounted_returns(rewards, discounts, last, backend="interpret"),
        reference,
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        kernels.discounted_returns(rewards, discounts, last, backend="triton"), reference, rtol=1e-6
    )


def test_shape_helpers():
    x = jnp.zeros((2, 3, 7, 4, 5))
    x3, restore = L.time_major_3d(x, lead=2)
    assert x3.shape == (6, 7, 20) and restore(x3).shape == x.shape
    x2, restore2 = L.rows_2d(jnp.zeros((2, 3, 4)), lead=0)
    assert x2.shape == (6, 4) and restore2(x2).shape == (2, 3, 4)
    assert [L.next_power_of_2(n) for n in (1, 2, 3, 17)] == [1, 2, 4, 32]


def test_lowering_asks_a_target_only_triton_driver_and_puts_triton_back():
    """rl.run.train lowers its programs under `compile_without_torch`: Triton's target comes from
    the device's compute capability (no torch import through Triton's CUDA driver), and Triton has
    no active driver afterwards, as before. Elsewhere the block changes nothing."""
    pytest.importorskip("triton")
    from triton.runtime import driver

    from kernels.launch import compile_without_torch

    class Hopper:
        platform, compute_capability = "gpu", "9.0"

    if driver._active is not None:
        pytest.skip("Triton's driver is already made in this process")
    with compile_without_torch(Hopper()):
        target = driver.active.get_current_target()
        assert (target.backend, target.arch, target.warp_size) == ("cuda", 90, 32)
    assert driver._active is None
    with compile_without_torch(jax.devices("cpu")[0]):
        assert driver._active is None
