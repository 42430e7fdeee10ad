"""What the `rl` commands print: their exit statuses, the one-line error, and the end-of-run
summary of `rl train` (from the run's summary.json, written by `rl.run.summary.summarise`)."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import logging
import math
import os
import re
import sys
import warnings
from pathlib import Path

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1  # training diverged or the run directory could not be written
EXIT_SIGNAL_BASE = 128  # a run stopped by signal N exits 128 + N (a checkpoint was saved)
EXIT_INTERRUPTED = EXIT_SIGNAL_BASE + 2  # Ctrl-C (SIGINT)

# How the summary names its metric, after the metric's key (none for the others).
METRIC_LABELS = {"eval_return": ", the greedy evaluation return"}


class ReaderGoneStream:
    """A text stream that outlives its reader: once a write or flush meets a closed pipe (`rl train
    | head`, or `| tee log` ended by the same Ctrl-C), its file descriptor is pointed at /dev/null
    and later output is dropped, so the command goes on (training, saving checkpoints) as if its
    output were still read. Everything else is the wrapped stream's."""

    def __init__(self, stream):
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        """Write `text`, or drop it once the reader is gone; returns its length either way."""
        if not self.reader_gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop_output()
        return len(text)

    def flush(self) -> None:
        """Flush, unless the reader is gone."""
        if not self.reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop_output()

    def _drop_output(self) -> None:
        """The reader is gone: point the descriptor at /dev/null and drop what follows."""
        self.reader_gone = True
        try:  # what is still buffered (and what XLA writes to the descriptor) goes nowhere
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _frame_files(traceback) -> list[str]:
    """The source files of a traceback's frames, outermost first."""
    files = []
    while traceback is not None:
        files.append(traceback.tb_frame.f_code.co_filename)
        traceback = traceback.tb_next
    return files


def _is_loop_closed_echo(value, traceback) -> bool:
    """TensorStore completing a read or write after orbax closed the event loop awaiting it (after
    a failed or abandoned checkpoint write or read, which the command reports in one line): a
    RuntimeError("Event loop is closed") raised inside asyncio and nowhere else."""
    files = _frame_files(traceback)
    return (
        isinstance(value, RuntimeError)
        and str(value) == "Event loop is closed"
        and bool(files)
        and all(f"{os.sep}asyncio{os.sep}" in file for file in files)
    )


class _OrbaxTaskFilter(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" for orbax's own write tasks (a failed
    checkpoint write, which the command reports in one line); every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info or record.exc_info[2] is None:
            return True
        files = _frame_files(record.exc_info[2])
        return not any(f"{os.sep}orbax{os.sep}" in file for file in files)


# terminal escape sequences (gymnasium's logger colours its warnings yellow: ESC[33m ... ESC[0m)
ANSI_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# the packages whose warnings are rl's own, shown without a source location
OWN_PACKAGES = ("rl", "envs", "kernels")


def _import_path(filename: str) -> tuple[str, ...]:
    """`filename`'s parts below the sys.path entry it is imported from (`gymnasium/spaces/box.py`;
    the shortest such path), or () when no entry holds it."""
    path = Path(filename).resolve()
    found = ()
    for entry in sys.path:
        try:
            parts = path.relative_to(Path(entry or ".").resolve()).parts
        except (ValueError, OSError):
            continue
        if not found or len(parts) < len(found):
            found = parts
    return found


def warning_line(message, category, filename: str, lineno: int) -> str:
    """A Python warning as one line, `rl: warning: ...`: its text without terminal colour codes
    or gymnasium's `WARN: ` prefix, its lines joined; a library's warning (not rl's, envs' or
    kernels') names its category and where it was raised, `gymnasium/spaces/box.py:231`."""
    text = " ".join(ANSI_ESCAPES.sub("", str(message)).split()).removeprefix("WARN: ")
    inside = _import_path(filename)
    root = Path(__file__).resolve().parents[2]  # the folder holding rl/, envs/, kernels/
    try:
        own = Path(filename).resolve().relative_to(root).parts[0] in OWN_PACKAGES
    except (ValueError, IndexError):
        own = False
    if own:
        return f"rl: warning: {text}"
    where = "/".join(inside) if inside else Path(filename).name
    return f"rl: warning: {text} ({category.__name__}, {where}:{lineno})"


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """warnings.showwarning while an `rl` command runs: `warning_line` on stderr (or `file`)."""
    stream = sys.stderr if file is None else file
    try:
        stream.write(warning_line(message, category, filename, lineno) + "\n")
    except (OSError, ValueError):  # a closed stream: as Python's own showwarning, drop it
        pass


@contextlib.contextmanager
def command_output(restore: bool = True):
    """While an `rl` command runs (its entry point enters this; everything comes back on exit):
    sys.stdout and sys.stderr as ReaderGoneStreams, and the echoes of a failed checkpoint write or
    read left out (the command reports such a failure itself in one line): sys.excepthook and
    sys.unraisablehook skip `_is_loop_closed_echo`, the asyncio logger `_OrbaxTaskFilter`'s
    records; Python warnings (gymnasium's, coloured for a terminal, among them) as one clean line
    each (`warning_line`). `restore=False` (the `rl` executable) keeps them for the rest of the
    process, whose shutdown collects the last of orbax's tasks and flushes the streams."""
    saved = sys.stdout, sys.stderr, sys.excepthook, sys.unraisablehook, warnings.showwarning
    asyncio_logger, orbax_tasks = logging.getLogger("asyncio"), _OrbaxTaskFilter()
    excepthook, unraisablehook = sys.excepthook, sys.unraisablehook

    def quiet_excepthook(kind, value, traceback):
        if not _is_loop_closed_echo(value, traceback):
            excepthook(kind, value, traceback)

    def quiet_unraisablehook(unraisable):
        if not _is_loop_closed_echo(unraisable.exc_value, unraisable.exc_traceback):
            unraisablehook(unraisable)

    sys.stdout, sys.stderr = ReaderGoneStream(sys.stdout), ReaderGoneStream(sys.stderr)
    sys.excepthook, sys.unraisablehook = quiet_excepthook, quiet_unraisablehook
    warnings.showwarning = _show_warning
    asyncio_logger.addFilter(orbax_tasks)
    try:
        yield
    finally:
        gc.collect()  # orbax's abandoned tasks are reported when collected: while still filtered
        if restore:
            sys.stdout, sys.stderr, sys.excepthook, sys.unraisablehook = saved[:4]
            warnings.showwarning = saved[4]
            asyncio_logger.removeFilter(orbax_tasks)


def error(message: str, status: int) -> int:
    """Print `rl: error: message` on stderr; returns `status`."""
    print(f"rl: error: {message}", file=sys.stderr)
    return status


def _fmt(value) -> str:
    return (
        "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.4g}"
    )


def summary_lines(summary: dict) -> list[str]:
    """The end-of-run summary as printed: timing, then per setting the final value of the metric it
    names (summary["metric"]: the greedy evaluation return `eval_return` where the agent evaluates,
    else the training episodes' `episode_return`) across seeds: mean +- std, median, min and max."""
    rate = summary["env_steps_per_second"]
    speed = (
        f"{rate:,.0f} env steps/s over all seeds"
        if rate is not None
        else "no env steps trained in this process"
    )
    compiled = (
        "programs loaded from the compilation cache"
        if summary.get("programs_from_cache")
        else "compile"
    )
    times = f"{compiled} {summary['compile_seconds']:.2f} s, train {summary['train_seconds']:.2f} s"
    if summary.get("process_seconds") is not None and summary.get("startup_seconds") is not None:
        times = (
            f"process {summary['process_seconds']:.2f} s: start-up "
            f"{summary['startup_seconds']:.2f} s, {times}"
        )
    lines = [f"{times}, {speed}"]
    if summary.get("kernels_precision", "float32") != "float32":  # float32 is the default
        lines.append(
            f"kernels.precision {summary['kernels_precision']}: the fused MLP kernels' matmuls at "
            f"{summary.get('kernels_dot_precision')}"
        )
    metric = summary["metric"]
    label = METRIC_LABELS.get(metric, "")
    lines.append(f"final {metric}{label} ({summary['metric_description']}):")
    for row in summary["settings"]:
        finished = sum(v is not None for v in row["per_seed"])
        seeds = (
            f"{row['seeds']} seed{'s' if row['seeds'] != 1 else ''}"
            if finished == row["seeds"]
            else f"{finished} of {row['seeds']} seeds have a value"
        )
        where = f"{row['label']}: " if row["label"] else ""
        lines.append(
            f"  {where}{_fmt(row['mean'])} +- {_fmt(row['std'])} (median {_fmt(row['median'])}, "
            f"min {_fmt(row['min'])}, max {_fmt(row['max'])}; {seeds})"
        )
    return lines


def completed_summary(run_dir: Path) -> dict | None:
    """The saved summary of a run that finished (it wrote final_params.msgpack and summary.json),
    or None."""
    path = Path(run_dir) / "summary.json"
    if not (path.is_file() and (Path(run_dir) / "final_params.msgpack").is_file()):
        return None
    if path.is_symlink():  # not read: `rl train` refuses the run directory in one line
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else {}


def print_complete(summary: dict, run_dir: Path) -> None:
    """What `rl train --resume` prints for a run that is already complete."""
    print(
        f"run {run_dir} is already complete: nothing to resume "
        f"(evaluate it with: rl eval {run_dir})"
    )
    if "metric" in summary:  # summaries written before the metric was named are not repeated
        try:
            lines = summary_lines(summary)[1:]
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            print(f"rl: warning: {Path(run_dir) / 'summary.json'} cannot be read", file=sys.stderr)
            return
        for line in lines:
            print(line)


def print_summary(summary: dict, run_dir: Path) -> None:
    print(f"run directory: {run_dir}")
    for line in summary_lines(summary):
        print(line)
