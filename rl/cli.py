"""The `rl` command line.

    rl train CONFIG.yaml [--seeds N] [--sweep agent.lr=1e-3,3e-3 ...] [dotted.key=value ...]

Bad input (missing or unparsable file, unknown key, wrong type, value out of range, unknown env or
agent) prints one line `rl: error: ...` and exits with status 2 before anything is written.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from rl.config import ConfigError, Config, load_config, parse_sweep

EXIT_BAD_INPUT = 2


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's default prints the usage first)
        self.exit(EXIT_BAD_INPUT, f"rl: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="rl", description="Train JAX RL agents from config files.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)
    train = commands.add_parser("train", help="train an agent from a config file")
    train.add_argument("config", help="path of a YAML config file")
    train.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. agent.lr=0.05")
    train.add_argument("--seeds", type=int, help="number of seeds trained at once (run.seeds)")
    train.add_argument("--sweep", action="append", default=[], metavar="agent.KEY=V1,V2", help="sweep a hyperparameter over values (repeatable: the grid of all combinations)")
    train.add_argument("--output-dir", help="parent folder of the run directory (run.output_dir)")
    train.add_argument("--name", help="run directory name (run.name)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    unknown = [arg for arg in extras if arg.startswith("-") or "=" not in arg]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extras:  # overrides given after options land here
        args.overrides = list(getattr(args, "overrides", [])) + extras
    if args.command == "train":
        return train_command(args)
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
    config = load_config(args.config, overrides)
    grid = parse_sweep(args.sweep, config.agent) if args.sweep else [{}]
    return config, grid


def make_run_dir(config: Config) -> Path:
    """A new run directory; ConfigError if it exists already or cannot be created."""
    name = config.run.name or f"{config.agent.name}-{config.env.id}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = Path(config.run.output_dir) / name
    if path.exists():
        raise ConfigError(f"run directory {str(path)!r} already exists; choose another run.name")
    try:
        path.mkdir(parents=True)
    except OSError as err:
        raise ConfigError(f"cannot create run directory {str(path)!r}: {err.strerror}") from None
    return path


def train_command(args) -> int:
    try:
        config, grid = resolve_train_config(args)
        run_dir = make_run_dir(config)
    except ConfigError as err:
        print(f"rl: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from rl.train import run_training

    summary = run_training(config, grid, run_dir)
    print_summary(summary, run_dir)
    return 0


def _fmt(value: float) -> str:
    return "nan" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"


def print_summary(summary: dict, run_dir: Path) -> None:
    print(f"run directory: {run_dir}")
    print(f"compile {summary['compile_seconds']:.2f} s, train {summary['train_seconds']:.2f} s, " f"{summary['env_steps_per_second']:,.0f} env steps/s over all seeds")
    for row in summary["settings"]:
        label = ", ".join(f"{k}={v}" for k, v in row["hyperparams"].items()) or "config"
        print(f"  [{label}] final return {_fmt(row['final_return_mean'])} +- {_fmt(row['final_return_std'])} " f"(median {_fmt(row['final_return_median'])}, {row['seeds']} seeds)")


if __name__ == "__main__":
    sys.exit(main())
