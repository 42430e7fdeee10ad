"""The `rl train` command: the config and sweep grid from the command line (or the saved ones of
`--resume RUN_DIR`), a new run directory, the training run (`rl.run.train.run_training`) and its
summary; bad input exits 2 before anything is written, a failed run 1, Ctrl-C 130 and SIGTERM 143
(after saving a checkpoint)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

from rl.cli.output import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_SIGNAL_BASE,
    completed_summary,
    error,
    print_complete,
    print_summary,
)
from rl.config import Config, load_config, parse_sweep
from rl.config.parsing import ConfigError, quoted_override


def resolve_train_config(args) -> tuple[Config, list[dict]]:
    """The validated config and sweep grid of `rl train`'s arguments (ConfigError on bad input)."""
    overrides = list(args.overrides)
    if args.seeds is not None:
        overrides.append(f"run.seeds={args.seeds}")
    # names are strings as given: `--name null` is the name "null", not YAML's None
    if args.output_dir is not None:
        overrides.append(quoted_override("run.output_dir", args.output_dir))
    if args.name is not None:
        overrides.append(quoted_override("run.name", args.name))
    if args.no_progress:
        overrides.append("run.progress=false")
    from rl.run.train import smoke_seeds

    config = load_config(args.config, overrides)
    if smoke_seeds(config.run.seeds) != config.run.seeds:
        config = load_config(
            args.config, overrides + [f"run.seeds={smoke_seeds(config.run.seeds)}"]
        )
    grid = parse_sweep(args.sweep, config.agent) if args.sweep else [{}]
    return config, grid


def make_run_dir(config: Config, exist_ok: bool = False) -> Path:
    """A new run directory; ConfigError if it exists already or cannot be created."""
    # "gymnax:Breakout-MinAtar": no ':' in file names
    env_name = config.env.id.replace(":", "-").replace("/", "-")
    name = config.run.name or f"{config.agent.name}-{env_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = Path(config.run.output_dir) / name
    if path.exists() and not exist_ok:
        raise ConfigError(f"run directory {str(path)!r} already exists; choose another run.name")
    if path.exists() and exist_ok:  # a multi-process run: every process makes it
        from rl.run.distributed import is_main_process
        from rl.run.run_files import check_shared_run_dir

        check_shared_run_dir(path, is_main_process())
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
    from rl.run.run_dir import load_run_config

    given = resume_conflicts(args)
    if given:
        raise ConfigError(
            f"--resume continues a run with the config saved in it, so drop {' and '.join(given)} "
            "(to train with another config, start a new run: rl train CONFIG ...)"
        )
    config, grid = load_run_config(args.resume)
    if args.no_progress:
        config = dataclasses.replace(config, run=dataclasses.replace(config.run, progress=False))
    run_dir = Path(args.resume)
    if not os.access(run_dir, os.W_OK):
        raise ConfigError(f"run directory {str(run_dir)!r} is not writable")
    return config, grid, run_dir


def check_sebulba_arguments(args, config: Config, grid: list[dict]) -> None:
    """ConfigError for what an actor-learner run (`arch.name: sebulba`) cannot take: a sweep,
    --devices and --shard (its devices are arch.actor_devices and arch.learner_devices), devices
    that are not there or envs that do not split over the processes
    (`rl.sebulba.learner.check_devices`). Several processes (--coordinator) each run their actors
    and a shard of the learner."""
    from rl.sebulba.learner import check_devices

    given = ["--devices"] if args.devices else []
    given += ["--shard envs"] if args.shard == "envs" else []
    given += ["--sweep"] if len(grid) > 1 else []
    if given:
        raise ConfigError(
            f"{' and '.join(given)}: not for arch sebulba, which trains one setting (its devices "
            "on each host: arch.actor_devices and arch.learner_devices)"
        )
    check_devices(config)


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
    from rl.run import distributed
    from rl.run.checkpoint import CheckpointMismatchError

    try:
        distributed.initialize(
            args.coordinator, args.num_processes, args.process_id, args.coordinator_bind
        )
        if args.resume:
            config, grid, run_dir = resolve_resume(args)
            finished = completed_summary(run_dir)
            if finished is not None:
                print_complete(finished, run_dir)
                return 0
            from rl.run.run_dir import check_resume_config

            check_resume_config(run_dir, config, grid)
        else:
            if args.config is None:
                raise ConfigError("rl train needs a config file (or --resume RUN_DIR)")
            config, grid = resolve_train_config(args)
        # a multi-process run spans every device
        devices = args.devices or ("all" if args.coordinator else 1)
        if config.arch.name == "sebulba":
            check_sebulba_arguments(args, config, grid)
        elif args.shard == "envs":
            from rl.run.programs import env_axis_size

            env_axis_size(config, len(distributed.select_devices(devices, None)))
        else:
            distributed.select_devices(devices, config.run.seeds)
        multi_process = distributed.jax.process_count() > 1
        if multi_process and not args.resume and not config.run.name:
            raise ConfigError(
                "a multi-process run needs run.name (--name) so that every process writes the "
                "same run directory"
            )
        if not args.resume:
            # every process of a multi-process run makes it
            run_dir = make_run_dir(config, exist_ok=multi_process)
            if config.run.progress and distributed.is_main_process():
                # where to point `rl plot` or TensorBoard while it trains (the summary repeats it)
                print(f"rl: run directory: {run_dir}", file=sys.stderr, flush=True)
    except (ConfigError, CheckpointMismatchError) as err:
        return error(str(err), EXIT_BAD_INPUT)
    from rl.run.divergence import NonFiniteError
    from rl.run.interrupts import TrainingInterrupted
    from rl.run.run_dir import RunDirInUseError
    from rl.run.run_files import removed_if_start_fails
    from rl.run.train import run_training

    try:
        # a new run's directory (made by this one process) goes if the run fails to start
        kept = (TrainingInterrupted, NonFiniteError, RunDirInUseError, OSError)
        with removed_if_start_fails(run_dir, not args.resume and not multi_process, kept):
            if config.arch.name == "sebulba":
                from rl.run.actor_learner import run_training as run_sebulba

                summary = run_sebulba(config, grid, run_dir, resume=bool(args.resume))
            else:
                summary = run_training(
                    config,
                    grid,
                    run_dir,
                    resume=bool(args.resume),
                    devices=devices,
                    shard=args.shard,
                )
    except (CheckpointMismatchError, ConfigError) as err:  # e.g. the run directory is in use
        return error(str(err), EXIT_BAD_INPUT)
    except NonFiniteError as err:
        return error(str(err), EXIT_FAILED)
    except TrainingInterrupted as err:
        print(f"rl: {err}", file=sys.stderr)
        status = EXIT_SIGNAL_BASE + err.signal_number  # 130 for Ctrl-C, 143 for SIGTERM
        if err.immediate:  # the abandoned chunk still runs inside XLA: leave without waiting for it
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        return status
    except Exception as err:
        os_error = _os_error(err)
        if os_error is None:
            raise
        where = os_error.filename or run_dir
        return error(
            f"cannot write the run directory {str(run_dir)!r} ({where}): "
            f"{os_error.strerror or os_error}",
            EXIT_FAILED,
        )
    if distributed.is_main_process():
        print_summary(summary, run_dir)
    return 0
