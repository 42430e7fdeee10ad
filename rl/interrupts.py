"""Ctrl-C during a run: the first press stops the runner after the chunk in progress (which is
checkpointed), a second one stops it at once.

A compiled program with host callbacks can hold the main thread inside XLA until the whole chunk
is done, so the runner calls its programs through `call_interruptibly` (in a worker thread, the
main thread waiting in short joins) and Python's SIGINT handler runs at once.
"""

from __future__ import annotations

import signal
import sys
import threading

import jax


class TrainingInterrupted(Exception):
    """Ctrl-C: the run stopped after saving a checkpoint (or, on a second Ctrl-C, without one: then
    `immediate` is True and the abandoned chunk may still be computing in a daemon thread)."""

    immediate = False


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


class SigintGuard:
    """While entered (in the main thread): the first Ctrl-C prints `message` and sets `requested`,
    which the runner reads to stop after the chunk in progress (saving a checkpoint); a second one
    raises KeyboardInterrupt, keeping the checkpoints already written."""

    def __init__(self, message: str):
        self.requested = False
        self.message = message
        self.previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(f"\nrl: {self.message}", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False
