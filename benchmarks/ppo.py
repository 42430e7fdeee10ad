"""PPO: learning curves over many seeds, and training throughput with the kernel backend chosen.

    python benchmarks/ppo.py learning --config configs/ppo_cartpole.yaml --seeds 64 \\
        --threshold 475 --budget 150000
    python benchmarks/ppo.py learning --config configs/ppo_pendulum.yaml --seeds 16 \\
        --threshold -250 --budget 1000000
    python benchmarks/ppo.py throughput --preset purejaxrl --seeds 1,2048 \\
        --kernel-backend reference,triton [--json out.json]
    python benchmarks/ppo.py throughput --preset large --seeds 1,64

`learning` trains every seed in one compiled program (the config's own evaluation: `eval_envs`
greedy episodes at each log point, run inside the program) and prints per log point the median and
interquartile range of the evaluation return, the fraction of seeds at or above `--threshold` AT
that log point and the fraction that REACHED it at some log point so far; then the verdict at
`--budget` env steps (the last log point at or before it).

`throughput` times the whole training program (rollouts, GAE, epochs of minibatch updates; no
evaluation, one log point) for each number of vmapped seeds and each kernel backend, compilation
apart (AOT `lower().compile()`), median of `--repeats` calls after one warm-up call. Presets:
`purejaxrl` is PureJaxRL's CartPole configuration (4 envs x 128 steps, 500k env steps -> 976
updates, 4 epochs x 4 minibatches, lr 2.5e-4 annealed, gamma .99, lambda .95, clip .2, ent .01,
vf .5, max grad norm .5, 64x64 tanh, separate actor and critic); `large` is the same with 2048
envs x 128 steps (so GAE runs on 128 x 2048 per seed) for 16 updates. Extra `agent.key=value`
arguments override either mode's config. Nothing is printed that was not measured; `--json` also
writes the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl.config import KernelsConfig, build_config  # noqa: E402
from rl.config.parsing import apply_overrides, build_dataclass, read_yaml  # noqa: E402
from rl.run.programs import build_program  # noqa: E402
from rl.run.run_dir import write_metrics_jsonl  # noqa: E402

PUREJAXRL = dict(
    name="ppo",
    total_steps=500_000,
    num_envs=4,
    num_steps=128,
    num_epochs=4,
    num_minibatches=4,
    lr=2.5e-4,
    anneal_lr=True,
    gamma=0.99,
    gae_lambda=0.95,
    clip_eps=0.2,
    clip_value_loss=True,
    vf_clip_eps=0.2,
    ent_coef=0.01,
    vf_coef=0.5,
    max_grad_norm=0.5,
    network={"hidden": [64, 64], "activation": "tanh"},
    shared_network=False,
    log_interval=976,
    eval_envs=0,
)
PRESETS = {
    "purejaxrl": {"env": {"id": "CartPole-v1"}, "agent": PUREJAXRL},
    "large": {
        "env": {"id": "CartPole-v1"},
        "agent": {
            **PUREJAXRL,
            "num_envs": 2048,
            "total_steps": 16 * 2048 * 128,
            "log_interval": 16,
        },
    },
}


def machine() -> dict:
    import jaxlib

    versions = {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
    for name in ("triton", "jax_triton", "flax", "optax"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - a missing optional package is reported as absent
            versions[name] = None
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "platform": platform.platform(),
        "devices": [str(d) for d in jax.devices()],
        **versions,
        "command": " ".join(sys.argv),
    }


def load(config: str, overrides: list[str], seeds: int):
    data = PRESETS[config] if config in PRESETS else read_yaml(config)
    data = apply_overrides(data, list(overrides) + [f"run.seeds={seeds}", "run.progress=false"])
    return build_config(data)


def with_kernel_backend(config, backend: str | None):
    """`config` with `kernels.backend` set (None or "auto": the automatic choice)."""
    kernels = build_dataclass(
        KernelsConfig, {"backend": backend or "auto"}, "kernels"
    )  # ConfigError naming kernels.backend
    return dataclasses.replace(config, kernels=kernels)


def compile_program(config, backend: str | None):
    config = with_kernel_backend(config, backend)
    program, keys, hparams = build_program(config)
    start = time.perf_counter()
    compiled = program.lower(keys, hparams).compile()
    return compiled, keys, hparams, time.perf_counter() - start


# ---------------------------------------------------------------- throughput


def throughput(args) -> list[dict]:
    rows = []
    for backend in args.kernel_backend.split(","):
        for seeds in (int(s) for s in args.seeds.split(",")):
            config = load(
                args.preset if args.config is None else args.config, args.overrides, seeds
            )
            try:
                compiled, keys, hparams, compile_s = compile_program(config, backend)
            except Exception as err:  # noqa: BLE001 - e.g. triton without a GPU: report and go on
                print(
                    f"{backend:>9} seeds={seeds}: cannot run ({type(err).__name__}: "
                    f"{str(err).splitlines()[0]})"
                )
                continue
            jax.block_until_ready(compiled(keys, hparams))  # warm-up
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                jax.block_until_ready(compiled(keys, hparams))
                times.append(time.perf_counter() - start)
            agent = config.agent
            per_seed = (
                agent.num_updates * agent.batch_size
                if hasattr(agent, "num_updates")
                else agent.total_steps
            )
            steps = per_seed * seeds
            row = {
                "backend": backend,
                "seeds": seeds,
                "env_steps_per_seed": per_seed,
                "compile_s": compile_s,
                "train_s_median": float(np.median(times)),
                "train_s_min": float(np.min(times)),
                "env_steps_per_s": steps / float(np.median(times)),
            }
            rows.append(row)
            print(
                f"{backend:>9} seeds={seeds:<5} compile {compile_s:6.1f} s  train "
                f"{row['train_s_median']:8.2f} s (min {row['train_s_min']:.2f})  "
                f"{row['env_steps_per_s']:14,.0f} env steps/s"
            )
    return rows


# ---------------------------------------------------------------- learning


def learning(args) -> dict:
    config = load(args.config, args.overrides, args.seeds)
    config = with_kernel_backend(config, args.kernel_backend.split(",")[0])
    program, keys, hparams = build_program(config)
    start = time.perf_counter()
    compiled = program.lower(keys, hparams).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    _, metrics = jax.block_until_ready(compiled(keys, hparams))
    train_s = time.perf_counter() - start
    steps = np.asarray(metrics["step"])[0, 0]
    key = "eval_return" if "eval_return" in metrics else "episode_return"
    returns = np.asarray(metrics[key], np.float64)[0]  # [seeds, log points]
    reached = np.maximum.accumulate(np.nan_to_num(returns, nan=-np.inf), axis=1) >= args.threshold
    print(
        f"{config.agent.name} on {config.env.id}: {args.seeds} seeds, compile {compile_s:.1f} s, "
        f"train {train_s:.1f} s; metric {key}, threshold {args.threshold}"
    )
    print("| env steps | median | IQR | at >= threshold | reached so far |")
    print("|---|---|---|---|---|")
    stride = max(1, len(steps) // args.rows)
    table = []
    for i in range(len(steps)):
        q25, med, q75 = np.nanpercentile(returns[:, i], [25, 50, 75])
        row = {
            "step": int(steps[i]),
            "median": med,
            "q25": q25,
            "q75": q75,
            "frac_at": float(np.mean(returns[:, i] >= args.threshold)),
            "frac_reached": float(reached[:, i].mean()),
        }
        table.append(row)
        if i % stride == stride - 1 or i == len(steps) - 1:
            print(
                f"| {row['step']} | {med:.1f} | {q25:.1f} .. {q75:.1f} | {row['frac_at']:.2f} | "
                f"{row['frac_reached']:.2f} |"
            )
    budget = args.budget or int(steps[-1])
    i = int(np.searchsorted(steps, budget, side="right")) - 1
    verdict = {
        "budget": budget,
        "log_point_step": int(steps[i]),
        "frac_at_budget": table[i]["frac_at"],
        "frac_reached_by_budget": table[i]["frac_reached"],
        "median_at_budget": table[i]["median"],
        "per_seed_at_budget": [None if np.isnan(v) else float(v) for v in returns[:, i]],
    }
    print(
        f"at {steps[i]} env steps (budget {budget}): "
        f"{verdict['frac_at_budget']:.0%} of seeds at >= {args.threshold}, "
        f"{verdict['frac_reached_by_budget']:.0%} reached it by then; "
        f"median {verdict['median_at_budget']:.1f}"
    )
    if (
        args.run_dir
    ):  # metrics.jsonl as `rl train` writes it, so `rl plot` draws this run beside others
        Path(args.run_dir).mkdir(parents=True, exist_ok=True)
        write_metrics_jsonl(Path(args.run_dir) / "metrics.jsonl", metrics, [{}])
    return {
        "config": config.to_dict(),
        "compile_s": compile_s,
        "train_s": train_s,
        "table": table,
        "verdict": verdict,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("learning", "throughput"))
    parser.add_argument(
        "--config", help="YAML config (learning) or a preset name / YAML (throughput)"
    )
    parser.add_argument(
        "--preset",
        default="purejaxrl",
        choices=sorted(PRESETS),
        help="throughput preset when --config is not given",
    )
    parser.add_argument(
        "--seeds",
        default="1",
        help="learning: number of seeds; throughput: comma list, e.g. 1,64,2048",
    )
    parser.add_argument(
        "--kernel-backend",
        default="reference",
        help="comma list of kernels backends (reference, triton, interpret), or auto",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per throughput point")
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument(
        "--budget", type=int, default=None, help="env steps at which the learning target is judged"
    )
    parser.add_argument("--rows", type=int, default=12, help="learning table rows")
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument(
        "--run-dir",
        help="learning: also write DIR/metrics.jsonl (every seed, every log point) for `rl plot`",
    )
    parser.add_argument("overrides", nargs="*", help="dotted.key=value config overrides")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    result = {"machine": machine()}
    if args.mode == "throughput":
        result["throughput"] = throughput(args)
    else:
        if args.config is None:
            parser.error("learning needs --config")
        args.seeds = int(args.seeds)
        result["learning"] = learning(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=float))


if __name__ == "__main__":
    main()
