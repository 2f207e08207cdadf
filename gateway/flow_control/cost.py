"""A request's cost in the fair order: the tokens it is expected to take — its prompt's estimate
plus what it may generate, counted up to `output_tokens_cap` (a request that asks for the whole
context is not charged for tokens it will most likely never produce). The reservation the
per-key limits make (`gateway.keys.limits.request_cost`) is the starting point."""

from __future__ import annotations

from gateway.keys.limits import TokenCost


def flow_cost(reserved: TokenCost, output_tokens_cap: int | None) -> int:
    completion = reserved.completion if output_tokens_cap is None else min(reserved.completion, output_tokens_cap)
    return max(1, reserved.prompt + completion)
