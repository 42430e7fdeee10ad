"""Ctrl-C (SIGINT) or SIGTERM during a run: the first one stops the runner after the chunk in
progress (which is checkpointed), a second one stops it at once (`StopSignalGuard`); the exit
status is 128 + the signal's number (130, 143). Waits on compiled programs go through
`call_interruptibly`, so Python's SIGINT handler runs at once.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import jax


class TrainingInterrupted(Exception):
    """Ctrl-C or SIGTERM: the run stopped after saving a checkpoint (or, on a second signal, without
    one: then `immediate` is True and the abandoned chunk may still be computing in a daemon
    thread). `signal_number` is the signal that stopped it."""

    immediate = False

    def __init__(self, message: str, signal_number: int = signal.SIGINT):
        super().__init__(message)
        self.signal_number = int(signal_number)


def call_interruptibly(fn, *args, block: bool = True):
    """`jax.block_until_ready(fn(*args))` (just `fn(*args)` with `block=False`), run in a worker
    thread while the main thread waits in short joins, so that Python signal handlers (Ctrl-C) run
    at once. Called from another thread, it runs `fn` there."""
    wait = jax.block_until_ready if block else (lambda x: x)
    if threading.current_thread() is not threading.main_thread():
        return wait(fn(*args))
    result = {}

    def target():
        try:
            result["value"] = wait(fn(*args))
        except BaseException as err:  # re-raised in the main thread
            result["error"] = err

    worker = threading.Thread(target=target, name="rl-train-chunk", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.05)
    if "error" in result:
        raise result["error"]
    return result["value"]


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# a stop signal this soon after the first is the same request delivered twice (GNU timeout sends
# it to the process and to its group), not a second Ctrl-C; a person pressing Ctrl-C again takes
# longer
COALESCE_SECONDS = 1.0


class StopSignalGuard:
    """While entered (in the main thread): the first SIGINT (Ctrl-C) or SIGTERM prints `message`
    and sets `requested` (and `signal_number`), which the runner reads to stop after the chunk in
    progress (saving a checkpoint); a second one raises KeyboardInterrupt, keeping the checkpoints
    already written, unless it comes within `coalesce_seconds` of the first (then it is the first
    one's copy and is ignored: GNU `timeout -s INT` signals the process and then its process
    group, and a terminal's Ctrl-C reaches every process of the foreground group). The previous
    handlers come back on exit."""

    def __init__(self, message: str, coalesce_seconds: float = COALESCE_SECONDS):
        self.requested = False
        self.signal_number = int(signal.SIGINT)
        self.message = message
        self.coalesce_seconds = coalesce_seconds
        self.first_at = None  # time.monotonic() of the first signal
        self.previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {number: signal.signal(number, self._handle) for number in STOP_SIGNALS}
        return self

    def _handle(self, signum, frame):
        now = time.monotonic()
        if self.requested:
            if now - self.first_at < self.coalesce_seconds:
                return  # the first signal's copy (sent to the process and to its group)
            raise KeyboardInterrupt
        self.requested, self.signal_number, self.first_at = True, int(signum), now
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        print(f"\nrl: {name}: {self.message}", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        self.previous = {}
        return False
