"""How fast a backend gets through its queue, and what that predicts for a request's wait.

The rate is measured per slot: each completed request adds its cost (tokens) and how long it
held its slot, both as exponentially weighted moving averages, and one slot's throughput is the
ratio of the two (tokens per second). The backend's is that times the slots it has now. Per
slot, because completions per second only measure capacity while the backend is full: between
bursts they measure the demand, and an idle hour would teach the predictor that the backend is
slow. Per completion, so each worker learns it from its own requests (the slots are the same
for all), with nothing shared.

A request's predicted wait is the tokens waiting ahead of it over that rate: with a route's
`ttft_slo_ms`, a request that would wait longer is refused at once (429, with the predicted wait
as `Retry-After`) instead of being queued to time out. Before the first completion there is no
rate, and nothing is refused for a prediction.
"""

from __future__ import annotations

import math


class ServiceRate:
    def __init__(self, smoothing: float = 0.2) -> None:
        self.smoothing = smoothing
        self.cost: float | None = None  # tokens per completed request (average)
        self.held_s: float | None = None  # seconds a completed request held its slot (average)

    def observe(self, cost: int, held_s: float) -> None:
        if cost <= 0 or held_s <= 0:
            return
        if self.cost is None or self.held_s is None:
            self.cost, self.held_s = float(cost), held_s
            return
        a = self.smoothing
        self.cost += a * (cost - self.cost)
        self.held_s += a * (held_s - self.held_s)

    def per_slot(self) -> float | None:
        """Tokens per second one slot gets through; None before the first completion."""
        if self.cost is None or self.held_s is None:
            return None
        return self.cost / self.held_s

    def per_second(self, slots: int) -> float | None:
        per_slot = self.per_slot()
        return None if per_slot is None or slots <= 0 else per_slot * slots


class WaitPredictor:
    def __init__(self, rate: ServiceRate) -> None:
        self.rate = rate

    def max_ahead(self, slo_s: float, slots: int) -> int | None:
        """The most tokens that may wait ahead of a request for it to start within `slo_s`;
        None when there is no rate yet."""
        rate = self.rate.per_second(slots)
        return None if rate is None else int(slo_s * rate)

    def wait_s(self, ahead: int, slots: int) -> float | None:
        """The predicted wait behind `ahead` tokens; None when there is no rate yet."""
        rate = self.rate.per_second(slots)
        return None if rate is None else ahead / rate

    def retry_after_s(self, ahead: int, slots: int) -> float:
        """Whole seconds, at least 1, for `Retry-After`."""
        wait = self.wait_s(ahead, slots)
        return 1.0 if wait is None else float(max(1, math.ceil(wait)))
