"""Kernel launches under jax.sharding: an op whose folded vmap axes, or declared batch axes, are
split over devices runs on each device's slice, with no gather
(kernels.launch.split_over_batch_axes).

The CPU checks run in one subprocess with 2 forced CPU devices (XLA_FLAGS must be set before JAX
starts). They drive the rule with plain-JAX launch stand-ins, whose traced shapes and collectives
can be read: the Triton launch itself needs a GPU, and the interpreter's host-callback launch is
left unsplit by design (its fallback is checked here too). The Triton launch under the rule is
checked on two GPUs at the end (skipped with fewer)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from run_helpers import REPO, subprocess_env

SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from kernels.launch import fold_vmap, available_backends
    import kernels

    mesh = Mesh(np.array(jax.devices()), ("d",))
    out, traced = {"devices": len(jax.devices())}, []
    COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")

    def reverse_cumsum_core(x, y, *, lead):
        # a launch stand-in that needs the whole time axis (axis `lead`), like a scan kernel
        traced.append(tuple(x.shape))
        return [jnp.flip(jnp.cumsum(jnp.flip(x, lead), lead), lead) + y, x * y]

    def reference(x, y):
        return [jnp.flip(jnp.cumsum(jnp.flip(x, 2), 2), 2) + y, x * y]

    op = fold_vmap(reverse_cumsum_core)
    many = jax.vmap(jax.vmap(op))  # [settings, seeds, T, N]
    x = jax.random.normal(jax.random.key(0), (2, 4, 8, 4))
    y = jax.random.normal(jax.random.key(1), (2, 4, 8, 4))
    want = reference(x, y)

    def run(name, spec):
        sharding = NamedSharding(mesh, spec)
        xs, ys = jax.device_put(x, sharding), jax.device_put(y, sharding)
        traced.clear()
        f = jax.jit(many)
        text = f.lower(xs, ys).compile().as_text()
        got = f(xs, ys)
        out[name] = {
            "collectives": [c for c in COLLECTIVES if c in text],
            "traced": sorted(set(traced)),
            "error": max(float(jnp.max(jnp.abs(g - w))) for g, w in zip(got, want)),
            "out_spec": [str(tuple(g.sharding.spec)) for g in got],
        }

    run("seeds", P(None, "d"))      # the seed axis split (rl train --devices)
    run("settings", P("d"))         # the settings axis split
    run("time", P(None, None, "d")) # an op axis split: the op must still see the whole time axis

    # inside a training loop: the op in a lax.scan body, vmapped over split seeds
    def loop(x, y):
        def body(carry, _):
            a, b = op(carry, y)
            return a * 0.5 + b, None
        return jax.lax.scan(body, x, None, length=3)[0]

    sharding = NamedSharding(mesh, P("d"))
    xs, ys = jax.device_put(x[0], sharding), jax.device_put(y[0], sharding)
    traced.clear()
    g = jax.jit(jax.vmap(loop))
    text = g.lower(xs, ys).compile().as_text()
    want_loop = jax.jit(jax.vmap(loop))(x[0], y[0])
    out["scan"] = {
        "collectives": [c for c in COLLECTIVES if c in text],
        "traced": sorted(set(traced)),
        "error": float(jnp.max(jnp.abs(g(xs, ys) - want_loop))),
    }

    # the op's own batch axes, declared: an env axis split (rl train --shard envs),
    # with and without vmap
    scan = fold_vmap(reverse_cumsum_core, batch_axes="trailing")  # [T, *batch]: time first
    env_split = NamedSharding(mesh, P(None, None, "d"))
    for name, f, a in (("envs_vmapped", jax.vmap(scan), x[0]), ("envs_unbatched", scan, x[0, 0])):
        spec = P(None, None, "d") if a.ndim == 3 else P(None, "d")
        xs = jax.device_put(a, NamedSharding(mesh, spec))
        traced.clear()
        g = jax.jit(f)
        text = g.lower(xs, xs).compile().as_text()
        got = g(xs, xs)
        axis = a.ndim - 2
        want_env = [jnp.flip(jnp.cumsum(jnp.flip(a, axis), axis), axis) + a, a * a]
        out[name] = {
            "collectives": [c for c in COLLECTIVES if c in text],
            "traced": sorted(set(traced)),
            "error": max(float(jnp.max(jnp.abs(u - w))) for u, w in zip(got, want_env)),
        }

    def row_sum_core(x, *, lead):  # a row op: [*rows, K] -> [*rows]
        traced.append(tuple(x.shape))
        return jnp.sum(x, axis=-1)

    rows = jax.device_put(x.reshape(16, 4, 4), NamedSharding(mesh, P(None, "d")))
    traced.clear()
    g = jax.jit(jax.vmap(fold_vmap(row_sum_core, batch_axes="leading")))
    text = g.lower(rows).compile().as_text()
    out["rows"] = {
        "collectives": [c for c in COLLECTIVES if c in text],
        "traced": sorted(set(traced)),
        "error": float(jnp.max(jnp.abs(g(rows) - x.reshape(16, 4, 4).sum(-1)))),
    }

    # a launch that calls back into the host is left unsplit, and still correct
    def host_core(x, *, lead):
        return jax.pure_callback(
            lambda a: np.asarray(a) * 2.0, jax.ShapeDtypeStruct(x.shape, x.dtype), x
        )

    sharding = NamedSharding(mesh, P(None, "d"))
    # (out_shardings as rl.run.programs gives them: a callback's own output is placed on device 0)
    got = jax.jit(jax.vmap(jax.vmap(fold_vmap(host_core))), out_shardings=sharding)(
        jax.device_put(x, sharding)
    )
    out["host_error"] = float(jnp.max(jnp.abs(got - 2 * x)))

    # the real GAE op on the interpreter (its Triton source on the CPU), seeds split
    if "interpret" in available_backends():
        r, v, nv, d = (
            jax.device_put(jax.random.normal(jax.random.key(i), (4, 16, 8)), sharding)
            for i in range(4)
        )
        gae = lambda backend: jax.jit(
            jax.vmap(lambda *a: kernels.gae(*a, 0.95, backend=backend)), out_shardings=sharding
        )(r, v, nv, d)
        out["gae_interpret_error"] = max(
            float(jnp.max(jnp.abs(a - b))) for a, b in zip(gae("interpret"), gae("reference"))
        )
    print("RESULT " + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def cpu_result() -> dict:
    env = subprocess_env()
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_split_seed_axis_runs_each_devices_slice_without_collectives(cpu_result):
    seeds = cpu_result["seeds"]
    assert cpu_result["devices"] == 2
    assert seeds["collectives"] == []
    # the launch is traced at the per-device shape (and at the whole shape, to read the op's shapes)
    assert [2, 2, 8, 4] in seeds["traced"]
    assert {tuple(s) for s in seeds["traced"] if len(s) == 4} == {(2, 2, 8, 4), (2, 4, 8, 4)}
    assert seeds["out_spec"] == ["(None, 'd')"] * 2
    assert seeds["error"] < 1e-5


def test_split_inside_a_scan_body(cpu_result):
    scan = cpu_result["scan"]
    assert scan["collectives"] == [] and [2, 8, 4] in scan["traced"] and scan["error"] < 1e-5


def test_split_settings_axis_too(cpu_result):
    settings = cpu_result["settings"]
    assert settings["collectives"] == []
    assert [1, 4, 8, 4] in settings["traced"]
    assert settings["error"] < 1e-5


def test_an_op_axis_is_never_split(cpu_result):
    # the input arrives split on the time axis: the partitioner must gather it,
    # and the op sees all of T
    time = cpu_result["time"]
    assert all(shape[2] == 8 for shape in time["traced"])
    assert time["error"] < 1e-5


def test_declared_batch_axes_split_an_env_axis_too(cpu_result):
    # [seeds, T, envs] split on envs, and an unbatched [T, envs]: each device scans its own envs
    vmapped, unbatched = cpu_result["envs_vmapped"], cpu_result["envs_unbatched"]
    assert vmapped["collectives"] == [] and unbatched["collectives"] == []
    assert [4, 8, 2] in vmapped["traced"] and [8, 2] in unbatched["traced"]
    assert vmapped["error"] < 1e-5 and unbatched["error"] < 1e-5


def test_declared_rows_of_a_row_op_split(cpu_result):
    rows = cpu_result["rows"]
    assert rows["collectives"] == [] and [16, 2, 4] in rows["traced"] and rows["error"] < 1e-5


def test_a_host_callback_launch_is_left_unsplit_and_correct(cpu_result):
    assert cpu_result["host_error"] == 0.0
    if "gae_interpret_error" in cpu_result:
        assert cpu_result["gae_interpret_error"] < 1e-5


def _gpus() -> int:
    try:
        return len(jax.devices("gpu"))
    except RuntimeError:
        return 0


@pytest.mark.skipif(_gpus() < 2, reason="needs two GPUs (device kind nvidia-h200-x2)")
def test_triton_gae_split_over_two_gpus_without_gathering():
    """The seed axis of a vmapped GAE, then the env axis of an unbatched one,
    split over two GPUs."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import kernels

    mesh = Mesh(np.array(jax.devices("gpu")[:2]), ("d",))
    sharding = NamedSharding(mesh, PartitionSpec("d"))
    r, v, nv, d = (
        jax.device_put(jax.random.normal(jax.random.key(i), (4, 64, 32)), sharding)
        for i in range(4)
    )

    def gae(backend):
        return jax.jit(jax.vmap(lambda *a: kernels.gae(*a, 0.95, backend=backend)))

    text = gae("triton").lower(r, v, nv, d).compile().as_text()
    assert "all-gather" not in text and "all-to-all" not in text
    got, want = gae("triton")(r, v, nv, d), gae("reference")(r, v, nv, d)
    for g, w in zip(got, want):
        assert tuple(g.sharding.spec)[:1] == ("d",)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)

    # the env axis of one agent's [T, envs] rollout (rl train --shard envs)
    env_split = NamedSharding(mesh, PartitionSpec(None, "d"))
    r, v, nv, d = (jax.device_put(x[0], env_split) for x in (r, v, nv, d))
    one = lambda backend: jax.jit(lambda *a: kernels.gae(*a, 0.95, backend=backend))
    text = one("triton").lower(r, v, nv, d).compile().as_text()
    assert "all-gather" not in text and "all-to-all" not in text
    for g, w in zip(one("triton")(r, v, nv, d), one("reference")(r, v, nv, d)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
