"""Tiling sweep for softmax, categorical_log_prob_entropy and categorical_projection (GPU).

Times each tiling of the three row-wise ops (the module settings TILE_ELEMENTS / NUM_WARPS of
kernels.softmax and kernels.policy_head, SCATTER_BLOCK / SCATTER_WARPS of
kernels.projection's default scatter kernel) on a few shapes with benchmarks/kernels.py's timing
(median of RUNS calls, fastest call too), picks per op the tiling with the smallest geometric mean
of the fastest calls, applies it, and runs benchmarks/kernels.py's cases for the three ops with it;
prints a table and writes $OUT/final.json. Usage on the GPU machine:
python benchmarks/rowwise_sweep.py (benchmarks/RESULTS.md, "Every op on one H200", has the three
ops' timings).
"""

import importlib
import importlib.util
import json
import math
import os
import sys

sys.path.insert(0, os.getcwd())
import jax

spec = importlib.util.spec_from_file_location("bench_kernels", "benchmarks/kernels.py")
bench = importlib.util.module_from_spec(spec)
sys.modules["bench_kernels"] = bench
spec.loader.exec_module(bench)

sm, ph, pj = (
    importlib.import_module(f"kernels.{m}") for m in ("softmax", "policy_head", "projection")
)


class A:
    kernel_backend = "triton"
    small = False
    runs = 20
    max_reps = 24
    checks = 1


RUNS = 12


def timeit(case, fn):
    keys = jax.random.split(jax.random.PRNGKey(1), 24)
    sets = [case.make_inputs(k) for k in keys[: bench._reps_for(case.bytes_moved, 24)]]
    err = bench.max_abs_diff(jax.jit(fn)(*sets[0]), jax.jit(case.reference)(*sets[0]))
    med = 1e6 * bench.time_per_call(fn, sets, RUNS)
    return med, 1e6 * bench.time_per_call.last_min, err


def sweep(op, cases, configs, apply, fn_of=lambda case, cfg: case.triton):
    mins = {}
    for cfg in configs:
        apply(cfg)
        for case in cases:
            try:
                med, mn, err = timeit(case, fn_of(case, cfg))
            except Exception as e:
                print("FAILED", op, case.shape, cfg, type(e).__name__, str(e)[:150], flush=True)
                mn = float("inf")
            else:
                print(
                    json.dumps(
                        dict(
                            op=op,
                            shape=case.shape,
                            cfg=cfg,
                            med=round(med, 1),
                            min=round(mn, 1),
                            err=err,
                        )
                    ),
                    flush=True,
                )
            mins.setdefault(cfg, []).append(mn)
    best = min(mins, key=lambda c: sum(math.log(t) for t in mins[c]))
    print(f"BEST {op}: {best} mins {[round(t, 1) for t in mins[best]]}", flush=True)
    apply(best)
    return best


row_cfgs = [
    (512, 1),
    (512, 2),
    (1024, 2),
    (1024, 4),
    (2048, 4),
    (2048, 8),
    (4096, 4),
    (4096, 8),
    (8192, 8),
    (8192, 16),
]


def set_sm(c):
    sm.TILE_ELEMENTS, sm.NUM_WARPS = c


def set_ph(c):
    ph.TILE_ELEMENTS, ph.NUM_WARPS = c


def set_pj(c):
    pj.SCATTER_BLOCK, pj.SCATTER_WARPS = c


narrow = [
    c for c in bench.softmax_cases(A) if c.shape in ("65536 x 18", "65536 x 51", "4096 x 18 x 51")
]
chosen = {"softmax": sweep("softmax", narrow, row_cfgs, set_sm)}
chosen["policy_head"] = sweep(
    "policy_head",
    [c for c in bench.policy_head_cases(A) if c.shape in ("65536 x 2", "65536 x 18")],
    row_cfgs,
    set_ph,
)
proj = [c for c in bench.projection_cases(A) if c.op == "categorical_projection"]
proj_cfgs = [(256, 2), (512, 4), (1024, 4), (2048, 4), (2048, 8), (4096, 8)]
chosen["projection"] = sweep("projection", proj, proj_cfgs, set_pj)
print("CHOSEN", json.dumps(chosen), flush=True)

copy_bw = bench.copy_bandwidth(A.runs, 2**26)
rows = []
for op in ("softmax", "policy_head", "projection"):
    for case in bench.CASE_BUILDERS[op](A):
        row = bench.run_case(case, A, copy_bw)
        rows.append(row)
        print(json.dumps(row), flush=True)
json.dump(
    {"info": bench.versions(), "chosen": chosen, "copy_GBps": copy_bw / 1e9, "rows": rows},
    open(os.environ.get("OUT", ".") + "/final.json", "w"),
    indent=1,
)
print(f"\ncopy bandwidth {copy_bw / 1e9:.0f} GB/s; tilings {chosen}")
print("| op | shape | reference us | triton us (min) | ratio | GB/s | of copy | max err |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    print(
        f"| {r['op']} | {r['shape']} | {r['reference_us']:.1f} | "
        f"{r['triton_us']:.1f} ({r['triton_min_us']:.1f}) | {r['speedup']:.1f}x | "
        f"{r['triton_GBps']:.0f} | {100 * r['frac_copy_bw']:.0f}% | "
        f"{r['max_abs_err']:.1e}{' WRONG' if r.get('WRONG') else ''} |"
    )
