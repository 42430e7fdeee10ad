"""The `rl` command line.

    rl configs                             list the packaged configs (rl train NAME trains one)
    rl train CONFIG.yaml|NAME [--seeds N] [--sweep agent.lr=1e-3,3e-3 ...] [--devices all] [dotted.key=value ...]
    rl train --resume RUN_DIR              continue a stopped run from its newest good checkpoint
    rl eval RUN_DIR [--episodes 100] [--checkpoint STEP] [--render episode.gif] [--json eval.json]
    rl plot RUN_DIR [RUN_DIR ...] [-o curve.png] [--metric episode_return]

Bad input (missing or unparsable file, unknown key, wrong type, value out of range, unknown env or
agent) prints one line `rl: error: ...` and exits with status 2 before anything is written. A run
that diverges (NaN or infinite loss or params) or cannot write its run directory (disk full, no
permission) prints one line and exits with status 1; Ctrl-C saves a checkpoint and exits with 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

from rl.config import Config, ConfigError, load_config, parse_sweep

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1  # training diverged or the run directory could not be written
EXIT_INTERRUPTED = 130  # Ctrl-C (a checkpoint was saved)


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's default prints the usage first)
        self.exit(EXIT_BAD_INPUT, f"rl: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="rl", description="Train JAX RL agents from config files.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)
    train = commands.add_parser("train", help="train an agent from a config file")
    train.add_argument(
        "config",
        nargs="?",
        help="a YAML config file, or the name of a packaged config (rl configs lists them)",
    )
    train.add_argument(
        "overrides", nargs="*", help="dotted.key=value overrides, e.g. agent.lr=0.05"
    )
    train.add_argument("--seeds", type=int, help="number of seeds trained at once (run.seeds)")
    train.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="agent.KEY=V1,V2",
        help="sweep a hyperparameter over values (repeatable: the grid of all combinations)",
    )
    train.add_argument("--output-dir", help="parent folder of the run directory (run.output_dir)")
    train.add_argument("--name", help="run directory name (run.name)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its newest good checkpoint",
    )
    train.add_argument(
        "--devices",
        metavar="N|all",
        help="shard the seed axis over N local devices (or all of them)",
    )
    train.add_argument(
        "--shard",
        choices=("seeds", "envs"),
        default="seeds",
        help="axis split over --devices: seeds (default) or, for one large agent, its parallel envs (agent.num_envs)",
    )
    train.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="multi-process run: address of process 0 (jax.distributed), or 'auto'",
    )
    train.add_argument("--num-processes", type=int, help="multi-process run: number of processes")
    train.add_argument("--process-id", type=int, help="multi-process run: this process's index")

    evaluate = commands.add_parser("eval", help="evaluate a trained run's deterministic policy")
    evaluate.add_argument("run_dir", help="a run directory written by rl train")
    evaluate.add_argument(
        "--episodes", type=int, default=100, help="episodes per seed (default 100)"
    )
    evaluate.add_argument(
        "--checkpoint",
        type=int,
        metavar="STEP",
        help="use the checkpoint at this env step instead of the final params",
    )
    evaluate.add_argument(
        "--render", metavar="FILE.gif", help="save a GIF of one episode (setting 0, seed 0)"
    )
    evaluate.add_argument(
        "--fps", type=int, default=10, help="frames per second of the GIF (default 10)"
    )
    evaluate.add_argument(
        "--seed", type=int, default=0, help="PRNG seed of the evaluation episodes"
    )
    evaluate.add_argument(
        "--json",
        metavar="FILE.json",
        help="also write the result (mean, median, std, min, max, per-seed means) as JSON",
    )

    commands.add_parser(
        "configs", help="list the configs shipped with the package (rl train NAME runs one)"
    )

    plot = commands.add_parser("plot", help="plot learning curves of runs as a PNG")
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    plot.add_argument(
        "-o", "--output", help="PNG file (default RUN_DIR/learning_curve.png of the first run)"
    )
    plot.add_argument(
        "--metric", default="episode_return", help="metric to plot (default episode_return)"
    )
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    unknown = [arg for arg in extras if arg.startswith("-") or "=" not in arg]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extras:  # overrides given after options land here
        args.overrides = list(getattr(args, "overrides", [])) + extras
    if extras and args.command != "train":
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    if args.command == "train":
        if (args.devices or args.coordinator) and "TF_CPP_MIN_LOG_LEVEL" not in os.environ:
            # Sharded runs gather each log point's metric scalars to device 0 for the host call (on
            # purpose: one call for all seeds); XLA's partitioner warns about that on every compile.
            os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        try:
            return train_command(args)
        except KeyboardInterrupt:  # Ctrl-C while loading (training itself handles its own)
            print("\nrl: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
    if args.command == "eval":
        return eval_command(args)
    if args.command == "plot":
        return plot_command(args)
    if args.command == "configs":
        return configs_command()
    return EXIT_BAD_INPUT


# ---------------------------------------------------------------- rl train


def resolve_train_config(args) -> tuple[Config, list[dict]]:
    """The validated config and sweep grid of `rl train`'s arguments (ConfigError on bad input)."""
    overrides = list(args.overrides)
    if args.seeds is not None:
        overrides.append(f"run.seeds={args.seeds}")
    if args.output_dir is not None:
        overrides.append(f"run.output_dir={args.output_dir}")
    if args.name is not None:
        overrides.append(f"run.name={args.name}")
    if args.no_progress:
        overrides.append("run.progress=false")
    from rl.train import smoke_seeds

    config = load_config(args.config, overrides)
    if smoke_seeds(config.run.seeds) != config.run.seeds:
        config = load_config(
            args.config, overrides + [f"run.seeds={smoke_seeds(config.run.seeds)}"]
        )
    grid = parse_sweep(args.sweep, config.agent) if args.sweep else [{}]
    return config, grid


def make_run_dir(config: Config, exist_ok: bool = False) -> Path:
    """A new run directory; ConfigError if it exists already or cannot be created."""
    env_name = config.env.id.replace(":", "-").replace(
        "/", "-"
    )  # "gymnax:Breakout-MinAtar": no ':' in file names
    name = config.run.name or f"{config.agent.name}-{env_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = Path(config.run.output_dir) / name
    if path.exists() and not exist_ok:
        raise ConfigError(f"run directory {str(path)!r} already exists; choose another run.name")
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
    except OSError as err:
        raise ConfigError(f"cannot create run directory {str(path)!r}: {err.strerror}") from None
    if not os.access(path, os.W_OK):
        raise ConfigError(f"run directory {str(path)!r} is not writable")
    return path


def resume_conflicts(args) -> list[str]:
    """What `rl train --resume RUN_DIR` was given besides the run directory, each as a phrase (a
    `key=value` in the config position is an override, as the user meant it)."""
    positional = [args.config] if args.config else []
    overrides = [text for text in positional if "=" in text] + list(args.overrides)
    conflicts = [f"the config file {text!r}" for text in positional if "=" not in text]
    if overrides:
        conflicts.append(f"the override{'s' if len(overrides) > 1 else ''} {' '.join(overrides)}")
    flags = (
        ("--sweep", args.sweep),
        ("--seeds", args.seeds),
        ("--output-dir", args.output_dir),
        ("--name", args.name),
    )
    conflicts += [flag for flag, value in flags if value]
    return conflicts


def resolve_resume(args) -> tuple[Config, list[dict], Path]:
    """The saved config and grid of `rl train --resume RUN_DIR` (ConfigError on bad input)."""
    from rl.run_dir import load_run_config

    given = resume_conflicts(args)
    if given:
        raise ConfigError(
            f"--resume continues a run with the config saved in it, so drop {' and '.join(given)} (to train with another config, start a new run: rl train CONFIG ...)"
        )
    config, grid = load_run_config(args.resume)
    if args.no_progress:
        config = dataclasses.replace(config, run=dataclasses.replace(config.run, progress=False))
    run_dir = Path(args.resume)
    if not os.access(run_dir, os.W_OK):
        raise ConfigError(f"run directory {str(run_dir)!r} is not writable")
    return config, grid, run_dir


def _error(message: str, status: int) -> int:
    print(f"rl: error: {message}", file=sys.stderr)
    return status


def _os_error(err: BaseException):
    """The OSError behind `err` (orbax and others wrap them), or None."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def train_command(args) -> int:
    from rl import distributed

    try:
        distributed.initialize(args.coordinator, args.num_processes, args.process_id)
        if args.resume:
            config, grid, run_dir = resolve_resume(args)
            finished = completed_summary(run_dir)
            if finished is not None:
                print_complete(finished, run_dir)
                return 0
        else:
            if args.config is None:
                raise ConfigError("rl train needs a config file (or --resume RUN_DIR)")
            config, grid = resolve_train_config(args)
        devices = args.devices or (
            "all" if args.coordinator else 1
        )  # a multi-process run spans every device
        if args.shard == "envs":
            from rl.programs import env_axis_size

            env_axis_size(config, len(distributed.select_devices(devices, None)))
        else:
            distributed.select_devices(devices, config.run.seeds)
        multi_process = distributed.jax.process_count() > 1
        if multi_process and not args.resume and not config.run.name:
            raise ConfigError(
                "a multi-process run needs run.name (--name) so that every process writes the same run directory"
            )
        if not args.resume:
            run_dir = make_run_dir(
                config, exist_ok=multi_process
            )  # every process of a multi-process run makes it
    except ConfigError as err:
        return _error(str(err), EXIT_BAD_INPUT)
    from rl.checkpoint import CheckpointStructureError
    from rl.divergence import NonFiniteError
    from rl.interrupts import TrainingInterrupted
    from rl.train import run_training

    try:
        summary = run_training(
            config, grid, run_dir, resume=bool(args.resume), devices=devices, shard=args.shard
        )
    except (NonFiniteError, CheckpointStructureError) as err:
        return _error(str(err), EXIT_FAILED)
    except TrainingInterrupted as err:
        print(f"rl: {err}", file=sys.stderr)
        if err.immediate:  # the abandoned chunk still runs inside XLA: leave without waiting for it
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except Exception as err:
        os_error = _os_error(err)
        if os_error is None:
            raise
        where = os_error.filename or run_dir
        return _error(
            f"cannot write the run directory {str(run_dir)!r} ({where}): {os_error.strerror or os_error}",
            EXIT_FAILED,
        )
    if distributed.is_main_process():
        print_summary(summary, run_dir)
    return 0


# ---------------------------------------------------------------- rl eval and rl plot


def eval_command(args) -> int:
    from rl.checkpoint import CheckpointStructureError
    from rl.evaluate import evaluate_run, print_evaluation

    try:
        if args.episodes < 1:
            raise ConfigError(f"--episodes: expected a positive integer, got {args.episodes}")
        if args.render is not None and not args.render.lower().endswith(".gif"):
            raise ConfigError(f"--render: expected a .gif file name, got {args.render!r}")
        if args.fps < 1:
            raise ConfigError(f"--fps: expected a positive integer, got {args.fps}")
        result = evaluate_run(
            args.run_dir,
            episodes=args.episodes,
            checkpoint=args.checkpoint,
            render=args.render,
            seed=args.seed,
            fps=args.fps,
        )
        if args.json is not None:
            Path(args.json).write_text(json.dumps(result, indent=2))
    except ConfigError as err:
        return _error(str(err), EXIT_BAD_INPUT)
    except CheckpointStructureError as err:
        return _error(str(err), EXIT_FAILED)
    except OSError as err:
        return _error(
            f"cannot write {err.filename or args.render or args.json}: {err.strerror or err}",
            EXIT_FAILED,
        )
    print_evaluation(result)
    return 0


def config_listing(packaged: dict) -> list[str]:
    """`rl configs`: one line per packaged config, its name, agent and env."""
    from rl.config import read_yaml

    lines = []
    for name, path in packaged.items():
        data = read_yaml(path)
        agent, env = (
            (data.get("agent") or {}).get("name", "?"),
            (data.get("env") or {}).get("id", "?"),
        )
        lines.append(f"{name:<40} {agent} on {env}")
    return lines


def configs_command() -> int:
    from rl.config import packaged_configs

    packaged = packaged_configs()
    try:
        lines = config_listing(packaged)
    except ConfigError as err:
        return _error(str(err), EXIT_FAILED)
    print("\n".join(lines))
    print(
        f"({len(packaged)} configs in {next(iter(packaged.values())).parent if packaged else 'the package'}; run one with: rl train NAME)"
    )
    return 0


def plot_command(args) -> int:
    from rl.plot import plot_runs

    try:
        path = plot_runs(args.run_dirs, output=args.output, metric=args.metric)
    except ConfigError as err:
        return _error(str(err), EXIT_BAD_INPUT)
    except OSError as err:
        return _error(
            f"cannot write {err.filename or args.output}: {err.strerror or err}", EXIT_FAILED
        )
    print(f"wrote {path}")
    return 0


def _fmt(value) -> str:
    return (
        "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.4g}"
    )


def summary_lines(summary: dict) -> list[str]:
    """The end-of-run summary as printed: timing, then per setting the final value of the metric it
    names (summary["metric"]) across seeds: mean +- std, median, min and max."""
    rate = summary["env_steps_per_second"]
    speed = (
        f"{rate:,.0f} env steps/s over all seeds"
        if rate is not None
        else "no env steps trained in this process"
    )
    lines = [
        f"compile {summary['compile_seconds']:.2f} s, train {summary['train_seconds']:.2f} s, {speed}"
    ]
    lines.append(f"final {summary['metric']} ({summary['metric_description']}):")
    for row in summary["settings"]:
        finished = sum(v is not None for v in row["per_seed"])
        seeds = (
            f"{row['seeds']} seeds"
            if finished == row["seeds"]
            else f"{finished} of {row['seeds']} seeds have a value"
        )
        where = f"{row['label']}: " if row["label"] else ""
        lines.append(
            f"  {where}{_fmt(row['mean'])} +- {_fmt(row['std'])} (median {_fmt(row['median'])}, min {_fmt(row['min'])}, max {_fmt(row['max'])}; {seeds})"
        )
    return lines


def completed_summary(run_dir: Path) -> dict | None:
    """The saved summary of a run that finished (it wrote final_params.msgpack and summary.json), or None."""
    path = Path(run_dir) / "summary.json"
    if not (path.is_file() and (Path(run_dir) / "final_params.msgpack").is_file()):
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def print_complete(summary: dict, run_dir: Path) -> None:
    """What `rl train --resume` prints for a run that is already complete."""
    print(
        f"run {run_dir} is already complete: nothing to resume (evaluate it with: rl eval {run_dir})"
    )
    if "metric" in summary:  # summaries written before the metric was named are not repeated
        for line in summary_lines(summary)[1:]:
            print(line)


def print_summary(summary: dict, run_dir: Path) -> None:
    print(f"run directory: {run_dir}")
    for line in summary_lines(summary):
        print(line)


if __name__ == "__main__":
    sys.exit(main())
