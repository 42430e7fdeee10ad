"""The kernels' deterministic mode (``deterministic=True``): the fixed-order C51 projection and the
fixed-order look-back of the chained scans give the float64 answer and the same bits on every call.

On the interpreter every kernel runs its programs one after another, so repeated calls agree there
anyway; what CI proves is that the mode picks the fixed-order kernels (the launches are recorded)
and that they are right. On a GPU (``FUSEDRL_TEST_BACKENDS=triton``) the shapes are large enough to
pick the atomic-add scatter and the chained grid by default, and the repeated calls must agree
bitwise: that is the reproducibility the mode promises there.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import _chunked_scan as cs

# the modules (kernels.gae etc. are names of the public functions in the package namespace)
projection, gae_module, q_lambda_module, returns_module = (
    importlib.import_module(f"kernels.{name}")
    for name in ("projection", "gae", "q_lambda", "returns")
)


def repeats(backend: str) -> int:
    """Calls compared bit for bit: several on the GPU; two on the interpreter
    (it runs programs in order)."""
    return 5 if backend == "triton" else 2


def hat_projection_float64(atoms, probs, support):
    """float64 oracle: atom i at fractional support index x_i (clipped, interpolated within its
    bracket) gives target j the mass p_i max(0, 1 - |x_i - j|)."""
    s = np.asarray(support, np.float64)
    z = np.clip(np.asarray(atoms, np.float64), s[0], s[-1])
    x = np.interp(z, s, np.arange(len(s), dtype=np.float64))
    hat = np.maximum(
        0.0, 1.0 - np.abs(x[..., None, :] - np.arange(len(s))[:, None])
    )  # [..., K, K_src]
    return np.sum(hat * np.asarray(probs, np.float64)[..., None, :], axis=-1)


def linear_scan_float64(x, c, carry):
    """float64: y_t = x_t + c_t y_{t+1}, y_T = carry."""
    x, c = np.asarray(x, np.float64), np.asarray(c, np.float64)
    y, acc = np.zeros_like(x), np.asarray(carry, np.float64)
    for t in reversed(range(x.shape[0])):
        acc = x[t] + c[t] * acc
        y[t] = acc
    return y


def projection_inputs(backend):
    """Many atoms sharing bracket ends (atomic adds meet); GPU-sized on triton."""
    rows = 4096 if backend == "triton" else 6
    rng = np.random.default_rng(0)
    support = np.linspace(-10.0, 10.0, 51).astype(np.float32)
    atoms = (rng.normal(size=(rows, 51)) * 2.0 + 1.0).astype(np.float32)
    probs = rng.dirichlet(np.ones(51), size=rows).astype(np.float32)
    return atoms, probs, support


def scan_inputs(backend):
    """A long time axis and few columns (the chained grid by default on triton)."""
    t, n = (4096, 8) if backend == "triton" else (37, 3)
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=(t, n)).astype(np.float32)
    discounts = (0.99 * (rng.uniform(size=(t, n)) > 0.01)).astype(np.float32)
    return rewards, discounts, rng.normal(size=(n,)).astype(np.float32)


def chained_config(backend):
    """On the interpreter the small shapes pick the loop grid: force a chained one."""
    return None if backend == "triton" else cs.ScanConfig(chunk_t=4, block_n=4, chained=True)


def assert_bitwise_equal_calls(fn, backend):
    first = np.asarray(fn())
    for _ in range(repeats(backend) - 1):
        np.testing.assert_array_equal(np.asarray(fn()), first)
    return first


def test_pick_config_fixes_the_chained_look_back_order():
    chained = cs.ScanConfig(chunk_t=4, block_n=4, chained=True)
    loop = cs.ScanConfig(chunk_t=4, block_n=4, chained=False)
    assert cs.pick_config(chained, 1, 8, 4, True).prefix_lookup is False
    assert cs.pick_config(chained, 1, 8, 4, False) == chained
    assert cs.pick_config(loop, 1, 8, 4, True) == loop  # already order-free
    auto = cs.choose_config(1, 4096, 8)
    assert auto.chained and cs.pick_config(None, 1, 4096, 8, True) == cs.ScanConfig(
        auto.chunk_t, auto.block_n, True, auto.num_warps, auto.num_stages, prefix_lookup=False
    )


def recorded_launches(monkeypatch, module):
    """Records (kernel name, PREFIX_LOOKUP) of every launch `module` makes from now on. The op
    cache and JAX's trace caches are cleared first: a call traced by an earlier test in this
    worker with the same shapes would otherwise reuse its trace and launch nothing new here."""
    if hasattr(module, "_kernel_op"):
        module._kernel_op.cache_clear()
    jax.clear_caches()
    seen = []
    real = module.launch

    def spy(kernel, *args, **kwargs):
        seen.append(
            (
                kernel.fn.__name__
                if hasattr(kernel, "fn")
                else getattr(kernel, "__name__", str(kernel)),
                kwargs.get("PREFIX_LOOKUP"),
            )
        )
        return real(kernel, *args, **kwargs)

    monkeypatch.setattr(module, "launch", spy)
    return seen


def test_deterministic_projection_launches_the_dense_kernel(kernel_backend, monkeypatch):
    seen = recorded_launches(monkeypatch, projection)
    atoms, probs, support = projection_inputs("interpret")
    kernels.categorical_projection(atoms[:3], probs[:3], support, backend=kernel_backend)
    kernels.categorical_projection(
        atoms[:4], probs[:4], support, backend=kernel_backend, deterministic=True
    )
    assert [name for name, _ in seen] == ["_projection_scatter_kernel", "_projection_fwd_kernel"]


def test_deterministic_projection_matches_float64_and_repeats_bitwise(kernel_backend):
    atoms, probs, support = projection_inputs(kernel_backend)
    op = jax.jit(
        lambda a, p: kernels.categorical_projection(
            a, p, support, backend=kernel_backend, deterministic=True
        )
    )
    out = assert_bitwise_equal_calls(lambda: op(atoms, probs), kernel_backend)
    np.testing.assert_allclose(
        out, hat_projection_float64(atoms, probs, support), rtol=1e-5, atol=2e-6
    )
    # the gradient (a gather) as well
    grad = jax.jit(
        jax.grad(
            lambda p: jnp.sum(
                jnp.sin(jnp.arange(51.0))
                * kernels.categorical_projection(
                    atoms, p, support, backend=kernel_backend, deterministic=True
                )
            )
        )
    )
    assert_bitwise_equal_calls(lambda: grad(probs), kernel_backend)


def test_deterministic_projection_rejects_a_scatter_config(kernel_backend):
    atoms, probs, support = projection_inputs("interpret")
    with pytest.raises(ValueError, match="method='dense'"):
        kernels.categorical_projection(
            atoms,
            probs,
            support,
            backend=kernel_backend,
            deterministic=True,
            config=projection.ProjectionConfig(method="scatter"),
        )


@pytest.mark.parametrize("op", ["discounted_returns", "gae", "q_lambda_returns"])
def test_deterministic_scans_look_back_in_order_match_float64_and_repeat_bitwise(
    kernel_backend, monkeypatch, op
):
    module = {
        "discounted_returns": returns_module,
        "gae": gae_module,
        "q_lambda_returns": q_lambda_module,
    }[op]
    seen = recorded_launches(monkeypatch, module)
    if module is not returns_module:  # the backward passes' adjoint scan launches from returns.py
        seen_adjoint = recorded_launches(monkeypatch, returns_module)
    else:
        seen_adjoint = seen
    rewards, discounts, bootstrap = scan_inputs(kernel_backend)
    config = chained_config(kernel_backend)
    zeros = jnp.zeros_like(rewards)
    if op == "discounted_returns":
        run = lambda r: kernels.discounted_returns(
            r, discounts, bootstrap, backend=kernel_backend, config=config, deterministic=True
        )
        expected = linear_scan_float64(rewards, discounts, bootstrap)
    elif (
        op == "gae"
    ):  # values 0, next values = rewards: delta = 2 r; A_t = delta_t + d_t * 0.9 A_{t+1}
        run = lambda r: kernels.gae(
            r, zeros, r, discounts, 0.9, backend=kernel_backend, config=config, deterministic=True
        )[0]
        expected = linear_scan_float64(
            rewards + discounts * rewards, 0.9 * discounts.astype(np.float64), 0.0
        )
    else:  # lambda 1 except the last step: G = r + d G_{t+1}, bootstrapped with next_values at T-1
        run = lambda r: kernels.q_lambda_returns(
            r, r, discounts, 1.0, backend=kernel_backend, config=config, deterministic=True
        )
        last = rewards[-1].astype(np.float64) * (1.0 + discounts[-1])
        expected = linear_scan_float64(rewards[:-1], discounts[:-1], last)
        expected = np.concatenate([expected, last[None]])
    out = assert_bitwise_equal_calls(jax.jit(lambda: run(rewards)), kernel_backend)
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6 * rewards.shape[0] * scale)
    assert_bitwise_equal_calls(
        jax.jit(lambda: jax.grad(lambda r: jnp.sum(jnp.cos(run(r))))(rewards)), kernel_backend
    )
    lookups = {flag for _, flag in seen + (seen_adjoint if seen_adjoint is not seen else [])}
    if config is not None or cs.choose_config(1, *rewards.shape).chained:
        assert lookups == {False}, (
            f"{op}: deterministic launches looked back with PREFIX_LOOKUP={lookups}"
        )
