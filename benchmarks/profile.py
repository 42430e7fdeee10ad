"""Where a training program spends its device time: a profiler trace of one call, summed per kernel.

    python benchmarks/profile.py --preset purejaxrl --seeds 2048 agent.total_steps=65536 \\
        agent.log_interval=128
    python benchmarks/profile.py --config configs/sac_pendulum.yaml --seeds 8 --top 30 \\
        --hlo-out /tmp/hlo.txt

Compiles the program `rl train` would run (settings x seeds vmapped, `benchmarks/ppo.py`'s presets
or a YAML config, `agent.key=value` overrides), calls it once to warm up, then once under
`jax.profiler.trace`. From the trace it prints, for the device plane (the GPU when there is one):
wall time of the call, time the device was busy (union of kernel intervals), the number of kernels,
and the `--top` kernel names by total time with their count and mean duration. Optionally writes the
optimised HLO (`--hlo-out`) to match kernel names (fusion names) to the program. Nothing here is a
throughput figure: the trace itself slows the run; use benchmarks/ppo.py for timings.
"""

from __future__ import annotations

import argparse
import collections
import glob
import sys
import tempfile
import time
from pathlib import Path

import jax
from jax.profiler import ProfileData

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ppo import load, with_kernel_backend  # noqa: E402
from rl.run.programs import build_program  # noqa: E402


def busy_time_ns(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals."""
    total, current_start, current_end = 0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def device_events(trace_dir: str):
    """[(plane name, line name, event name, start ns, duration ns)] of the device planes
    of the trace."""
    (path,) = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
    data = ProfileData.from_file(path)
    planes = [p for p in data.planes if p.name.startswith("/device:")]
    rows = []
    for plane in planes:
        for line in plane.lines:
            for event in line.events:
                rows.append(
                    (plane.name, line.name, event.name, int(event.start_ns), int(event.duration_ns))
                )
    return rows


def summarise(rows, wall_s: float, top: int) -> None:
    by_line = collections.Counter((plane, line) for plane, line, *_ in rows)
    print("device lines (plane, line: events):")
    for (plane, line), count in by_line.most_common():
        print(f"  {plane} | {line}: {count}")
    # kernels live on the stream lines; skip the per-op / per-module summary lines
    kernel_rows = [r for r in rows if "stream" in r[1].lower()] or rows
    busy = busy_time_ns([(start, start + dur) for *_, start, dur in kernel_rows])
    total = sum(dur for *_, dur in kernel_rows)
    print(
        f"wall {wall_s * 1e3:.1f} ms; device busy {busy / 1e6:.1f} ms ({busy / 1e9 / wall_s:.0%}); "
        f"{len(kernel_rows)} kernels, summed {total / 1e6:.1f} ms"
    )
    per_name = collections.defaultdict(lambda: [0, 0])
    for _, _, name, _, dur in kernel_rows:
        per_name[name][0] += 1
        per_name[name][1] += dur
    print("| kernel | count | total ms | share | mean us |")
    print("|---|---|---|---|---|")
    for name, (count, dur) in sorted(per_name.items(), key=lambda kv: -kv[1][1])[:top]:
        print(
            f"| {name[:90]} | {count} | {dur / 1e6:.2f} | {dur / max(total, 1):.1%} | "
            f"{dur / count / 1e3:.1f} |"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="YAML config (default: --preset)")
    parser.add_argument(
        "--preset",
        default="purejaxrl",
        help="a benchmarks/ppo.py preset when --config is not given",
    )
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument(
        "--kernel-backend", default=None, help="reference, triton or interpret (default: automatic)"
    )
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--hlo-out", help="write the optimised HLO text here")
    parser.add_argument("--trace-dir", help="keep the trace here (default: a temporary directory)")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value config overrides")
    args = parser.parse_intermixed_args(argv)
    config = load(args.config or args.preset, args.overrides, args.seeds)
    config = with_kernel_backend(config, args.kernel_backend)
    program, keys, hparams = build_program(config)
    compiled = program.lower(keys, hparams).compile()
    if args.hlo_out:
        Path(args.hlo_out).write_text(compiled.as_text())
    jax.block_until_ready(compiled(keys, hparams))
    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="fusedrl-trace-")
    with jax.profiler.trace(trace_dir):
        start = time.perf_counter()
        jax.block_until_ready(compiled(keys, hparams))
        wall_s = time.perf_counter() - start
    summarise(device_events(trace_dir), wall_s, args.top)


if __name__ == "__main__":
    main()
