"""A packaged config's promise: what it reaches at its budget and how long it takes, in a `promise:`
section (`Promise`: each key's meaning) that `rl train` validates and otherwise ignores, and that
`benchmarks/configs_check.py` checks on seeds set apart for checking (CHECK_SEEDS_FROM and up).

    promise: {seeds: 16, metric: eval_return, at_least: 475, share: 0.5, median: 500, spread: 25,
              cpu_seconds: 40, gpu_seconds: 20}     # or `pending: why` instead of a result
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from rl.config.parsing import ConfigError, build_dataclass, hp

# Seeds from here up are kept for checking: never tuned on (DESIGN.md, "How speed is measured").
CHECK_SEEDS_FROM = 10_000


@dataclass(frozen=True)
class Promise:
    seeds: int = field(metadata=dict(low=1, doc="the seeds the result is stated for"))
    metric: str = hp(
        "eval_return",
        choices=("eval_return", "episode_return"),
        doc="the metric whose final value per seed is promised",
    )
    at_least: typing.Optional[float] = hp(None, doc="a return the `share` of seeds reaches")
    share: typing.Optional[float] = hp(
        None, low=0.0, high=1.0, low_open=True, doc="the share of seeds at or above `at_least`"
    )
    median: typing.Optional[float] = hp(None, doc="the median over seeds at the budget")
    spread: typing.Optional[float] = hp(
        None, low=0.0, doc="how far below `median` a check's median may fall"
    )
    cpu_seconds: typing.Optional[float] = hp(
        None, low=0.0, low_open=True, doc="`rl train NAME --seeds 1`, 2-core CPU"
    )
    gpu_seconds: typing.Optional[float] = hp(
        None, low=0.0, low_open=True, doc="`rl train NAME --seeds <seeds>`, one H200"
    )
    pending: typing.Optional[str] = hp(
        None, doc="why no result is stated yet: a check measures it, the promise states it after"
    )

    def validate(self):
        """ConfigError naming the key when a part is half given or no result is promised."""
        for first, second in (("at_least", "share"), ("median", "spread")):
            if (getattr(self, first) is None) != (getattr(self, second) is None):
                given, missing = (
                    (first, second) if getattr(self, second) is None else (second, first)
                )
                raise ConfigError(f"promise.{missing}: required with promise.{given}")
        if self.at_least is None and self.median is None and self.pending is None:
            raise ConfigError(
                "promise: states no result; give at_least and share, or median and spread "
                "(or pending: why not yet)"
            )


def parse_promise(data) -> Promise:
    """The validated Promise of a config's `promise:` mapping; ConfigError naming the key."""
    if isinstance(data, Mapping) and "seeds" not in data:
        raise ConfigError("promise.seeds is required: the seeds the result is stated for")
    return build_dataclass(Promise, data, "promise")


def read_promise(config_data: Mapping) -> Promise | None:
    """The Promise of a parsed config file (None when it has no `promise:` section)."""
    data = config_data.get("promise")
    return None if data is None else parse_promise(data)


class Verdict(typing.NamedTuple):
    """A check's outcome: whether the promise held (None when it states no result yet), the share
    of seeds at or above `at_least` (None when not promised), the median over seeds, and one line
    per broken part."""

    kept: bool | None
    share: float | None
    median: float
    broken: tuple[str, ...]


def judge(promise: Promise, finals) -> Verdict:
    """Whether per-seed final results `finals` ([seeds]; NaN: a seed without a result, below every
    threshold) keep `promise`: it holds when every stated part holds, the share of seeds at or
    above `at_least` is at least `share`, and the median over seeds is at least `median - spread`.
    A seed's result is the metric at its last log point where it is finite (rl.run.summary);
    returns are higher-is-better, so doing better never breaks a promise."""
    values = np.asarray(finals, np.float64).ravel()
    if values.size == 0:
        raise ValueError("finals: no seeds")
    finite = values[np.isfinite(values)]
    median = float(np.median(finite)) if finite.size else math.nan
    broken = []
    share = None
    if promise.at_least is not None:
        share = float(np.mean(np.where(np.isfinite(values), values, -np.inf) >= promise.at_least))
        if share < promise.share - 1e-9:
            broken.append(
                f"{share:.0%} of seeds >= {promise.at_least:g}, promised {promise.share:.0%}"
            )
    if promise.median is not None:
        floor = promise.median - promise.spread
        if not median >= floor:  # NaN (no seed has a result) breaks it too
            broken.append(f"median {median:.1f} < {floor:g}")
    missing = values.size - finite.size
    if missing:
        broken.append(f"{missing} seed(s) without a result")
    if promise.at_least is None and promise.median is None:
        return Verdict(None, None, median, ())
    return Verdict(not broken, share, median, tuple(broken))


def promise_text(promise: Promise) -> str:
    """The promised result in words: `>= 475 in >= 50% of 16 seeds; median 500 (-25)`."""
    seeds = f"{promise.seeds} seed{'s' if promise.seeds != 1 else ''}"
    parts = []
    if promise.at_least is not None:
        parts.append(f">= {promise.at_least:g} in >= {promise.share:.0%} of {seeds}")
    if promise.median is not None:
        parts.append(f"median {promise.median:g} (-{promise.spread:g}) over {seeds}")
    return "; ".join(parts) or f"no result stated yet: {promise.pending}"


def expected_seconds(promise: Promise, device: str, seeds: int) -> float | None:
    """The wall clock the promise implies for a check of `seeds` seeds on `device` ("cpu" or
    "gpu"): on the CPU time grows about with the seeds (an upper bound: compilation is paid once),
    `seeds * cpu_seconds`; on a GPU the seeds are vmapped in one program, so `gpu_seconds` for up
    to the promise's seeds. None when the promise states no time for that device."""
    if device == "cpu":
        return None if promise.cpu_seconds is None else seeds * promise.cpu_seconds
    if device == "gpu":
        if promise.gpu_seconds is None:
            return None
        return promise.gpu_seconds * max(1.0, seeds / promise.seeds)
    raise ValueError(f"device: expected 'cpu' or 'gpu', got {device!r}")


def as_dict(promise: Promise) -> dict:
    """The promise's stated fields (those not None), YAML-ready."""
    return {k: v for k, v in dataclasses.asdict(promise).items() if v is not None}
