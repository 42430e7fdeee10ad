"""The `rl` command line: the parser, `main`, `rl eval`, `rl plot` and `rl configs` (the others:
rl.cli.train, rl.cli.compare; what the commands print: rl.cli.output).
    rl configs                  list the packaged configs (rl train NAME trains one)
    rl train CONFIG.yaml|NAME [--seeds N] [--sweep agent.lr=1e-3,3e-3 ...] [dotted.key=value ...]
    rl train --resume RUN_DIR   continue a stopped run from its newest good checkpoint
    rl eval RUN_DIR [--episodes 100] [--checkpoint STEP] [--render episode.gif] [--json eval.json]
    rl plot RUN_DIR [RUN_DIR ...] [-o curve.png] [--metric eval_return]
    rl compare RUN_DIR [RUN_DIR ...] [--by name|config] [--at STEPS] [--plot DIR]   (IQM, ...)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rl.cli.output import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    command_output,
    error,
)
from rl.cli.train import train_command
from rl.config.parsing import ConfigError


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
        help="axis split over --devices: seeds (default) or, for one large agent, its parallel "
        "envs (agent.num_envs)",
    )
    train.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="multi-process run: address of process 0 (jax.distributed), or 'auto'",
    )
    train.add_argument(
        "--coordinator-bind",
        metavar="HOST:PORT",
        help="multi-process run: where process 0 listens (default: the --coordinator address "
        "itself; 0.0.0.0:PORT for every interface)",
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
        "--metric",
        help="metric to plot (default: the one the end-of-run summary reports, eval_return where "
        "the runs evaluate, else episode_return)",
    )

    compare = commands.add_parser(
        "compare",
        help="compare groups of runs: IQM, median, optimality gap with 95%% bootstrap intervals, "
        "probability of improvement",
    )
    compare.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    compare.add_argument(
        "--by",
        choices=("name", "config"),
        default="name",
        help="group runs by run directory name and sweep setting (default) or by config",
    )
    compare.add_argument(
        "--metric", help="metric compared (default: eval_return where every run has it)"
    )
    compare.add_argument(
        "--at", type=int, metavar="STEPS", help="compare at this env step (default: the last)"
    )
    compare.add_argument(
        "--normalize",
        metavar="LOW,HIGH|REF.yaml",
        help="scores to (x - low) / (high - low): one pair, or a YAML file {env id: [low, high]} "
        "(a negative LOW: --normalize=-500,0)",
    )
    compare.add_argument("--plot", metavar="DIR", help="write the figures as PNGs into DIR")
    compare.add_argument(
        "--reps", type=int, default=50_000, help="bootstrap resamples (default 50000)"
    )
    compare.add_argument("--seed", type=int, default=0, help="seed of the resampling")
    return parser


def main(argv=None) -> int:
    """`rl ARGV...` (sys.argv when None); returns the exit status. Bad input (a missing or
    unparsable file, an unknown key, a wrong type, a value out of range, an unknown env or agent, a
    run directory that cannot be created or is in use by another `rl train`, a `--resume` of a
    checkpoint its edited config.yaml does not fit) prints one line `rl: error: ...` and returns 2
    before anything is written; a run that diverges or cannot write its run directory prints one
    line and returns 1; Ctrl-C and SIGTERM save a checkpoint and return 130 and 143. Output to a
    reader that has gone (a closed pipe) is dropped without stopping the command
    (rl.cli.output.command_output)."""
    with command_output():
        return run_command(argv)


def console() -> None:
    """The `rl` executable: `main` on sys.argv, exiting with its status, with the output handling
    of rl.cli.output.command_output kept until the process ends."""
    with command_output(restore=False):
        status = run_command()
    sys.exit(status)


def run_command(argv=None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    unknown = [arg for arg in extras if arg.startswith("-") or "=" not in arg]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extras:  # overrides given after options land here
        args.overrides = list(getattr(args, "overrides", [])) + extras
    if extras and args.command != "train":
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    try:
        check_run_dir_arguments(args)
    except ConfigError as err:
        return error(str(err), EXIT_BAD_INPUT)
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
    if args.command == "compare":
        from rl.cli.compare import compare_command

        return compare_command(args)
    if args.command == "configs":
        return configs_command()
    return EXIT_BAD_INPUT


def check_run_dir_arguments(args) -> None:
    """ConfigError for a RUN_DIR argument (`rl train --resume`, `rl eval`, `rl plot`, `rl compare`)
    that is a file: it says so, and names the file's folder when that is a run directory (a path
    to its config.yaml or metrics.jsonl given for the run)."""
    given = {
        "train": [args.resume] if getattr(args, "resume", None) else [],
        "eval": [getattr(args, "run_dir", None)],
        "plot": getattr(args, "run_dirs", []),
        "compare": getattr(args, "run_dirs", []),
    }.get(args.command, [])
    for path in [Path(p) for p in given if p is not None]:
        if path.is_file():
            folder = path.parent
            hint = (
                f"; its folder {str(folder)!r} is one"
                if (folder / "config.yaml").is_file()
                else " (rl train writes one per run: runs/<agent>-<env>-<time>/)"
            )
            raise ConfigError(f"{str(path)!r} is a file, not a run directory{hint}")


# ---------------------------------------------------------------- rl eval, rl configs and rl plot


def eval_command(args) -> int:
    from rl.cli.evaluate import evaluate_run, print_evaluation
    from rl.run.checkpoint import CheckpointMismatchError

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
        return error(str(err), EXIT_BAD_INPUT)
    except CheckpointMismatchError as err:
        return error(str(err), EXIT_BAD_INPUT)
    except OSError as err:
        # a file the command writes, or one of the run's it reads (a checkpoint deleted meanwhile)
        written = {str(p) for p in (args.render, args.json) if p is not None}
        verb = "write" if err.filename is None or str(err.filename) in written else "read"
        return error(
            f"cannot {verb} {err.filename or args.render or args.json}: {err.strerror or err}",
            EXIT_FAILED,
        )
    print_evaluation(result)
    return 0


def config_listing(packaged: dict) -> list[str]:
    """`rl configs`: one line per packaged config, its name, agent and env."""
    from rl.config.parsing import read_yaml

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
    from rl.config.parsing import packaged_configs

    packaged = packaged_configs()
    try:
        lines = config_listing(packaged)
    except ConfigError as err:
        return error(str(err), EXIT_FAILED)
    print("\n".join(lines))
    where = next(iter(packaged.values())).parent if packaged else "the package"
    print(f"({len(packaged)} configs in {where}; run one with: rl train NAME)")
    return 0


def plot_command(args) -> int:
    from rl.cli.plot import plot_runs

    try:
        path = plot_runs(
            args.run_dirs,
            output=args.output,
            metric=args.metric,
            warn=lambda message: print(f"rl: warning: {message}", file=sys.stderr),
        )
    except ConfigError as err:
        return error(str(err), EXIT_BAD_INPUT)
    except OSError as err:
        return error(
            f"cannot write {err.filename or args.output}: {err.strerror or err}", EXIT_FAILED
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    console()
