"""What the threads of the actor-learner loop (rl.sebulba) share, and how they wait for each
other: the newest params and their version, one bounded queue of rollouts per actor, a stop event
and the first failure. Every wait polls the stop event (and the learner's `should_stop`) and gives
up after `arch.queue_timeout_s` with a `StallError` that says which side stalled, so no wait can
hang."""

from __future__ import annotations

import queue
import threading
import time

POLL_S = 0.05  # how often a waiting side looks at the stop event


class StallError(RuntimeError):
    """A side of the actor-learner loop waited longer than arch.queue_timeout_s for the other."""


class Stopped(Exception):
    """The loop is stopping (the learner ended, failed or was asked to stop): a waiting thread
    leaves quietly."""


class Exchange:
    """Params of version `version` (updates done) published by the learner, read by the actors;
    `arch.actor_threads` queues of at most `arch.queue_size` rollouts; the stop event; the first
    failure of an actor (raised in the learner by `take`)."""

    def __init__(self, params, version: int, arch, should_stop=None):
        self.params, self.version = params, version
        self.timeout = arch.queue_timeout_s
        self.queues = [queue.Queue(arch.queue_size) for _ in range(arch.actor_threads)]
        self.changed = threading.Condition()
        self.stop = threading.Event()
        self.failure: tuple[BaseException, str] | None = None
        self.should_stop = should_stop

    def publish(self, params, version: int) -> None:
        """The learner's params after `version` updates, for the actors."""
        with self.changed:
            self.params, self.version = params, version
            self.changed.notify_all()

    def params_for(self, version: int, who: str):
        """(params, their version) as soon as the version is at least `version` (an actor, before
        its next rollout)."""
        deadline = time.monotonic() + self.timeout
        with self.changed:
            while self.version < version:
                self._wait_check(
                    deadline,
                    f"{who} waited {self.timeout:g} s (arch.queue_timeout_s) for params of "
                    f"version {version}; the learner is at {self.version}: the learner stalled",
                )
                self.changed.wait(POLL_S)
            return self.params, self.version

    def put(self, index: int, rollout, who: str) -> None:
        """Hand actor `index`'s rollout to the learner, waiting while its queue is full."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self.queues[index].put(rollout, timeout=POLL_S)
            except queue.Full:
                self._wait_check(
                    deadline,
                    f"{who} waited {self.timeout:g} s (arch.queue_timeout_s) to hand over a "
                    "rollout (its queue is full): the learner stalled",
                )

    def take(self, index: int):
        """The next rollout of actor `index` (the learner). An actor's failure is raised here, as
        it was raised in the actor's thread."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self.queues[index].get(timeout=POLL_S)
            except queue.Empty:
                self.raise_failure()
                self._wait_check(
                    deadline,
                    f"the learner waited {self.timeout:g} s (arch.queue_timeout_s) for a rollout "
                    f"of actor {index}: the actor stalled (its envs or its policy)",
                )

    def fail(self, error: BaseException, who: str) -> None:
        """An actor raised `error`: keep the first failure, stop everyone."""
        with self.changed:
            if self.failure is None:
                self.failure = (error, who)
        self.stop.set()

    def stopping(self) -> bool:
        """Whether the loop should end: stopped, or the learner's `should_stop()`."""
        return self.stop.is_set() or (self.should_stop is not None and self.should_stop())

    def raise_failure(self) -> None:
        """Raise an actor's error (the first) in the calling thread, if one failed."""
        if self.failure is not None:
            error, who = self.failure
            if hasattr(error, "add_note"):  # Python >= 3.11
                error.add_note(f"(raised in the actor-learner loop's {who})")
            raise error

    def _wait_check(self, deadline: float, stalled: str) -> None:
        if self.stopping():
            raise Stopped
        if time.monotonic() > deadline:
            raise StallError(stalled)
