"""Priority bands: which band a request waits in, from the `priority` it sent (the vLLM
extension: lower is served earlier) and its key's default.

Band 0 is served first. `band_edges` split the integers: band i holds the priorities below
edge i and at or above edge i-1, so `[0, 1]` makes three bands — negative, zero, positive.
Aging (a waiting request rising one band per `aging_s`) is the ledgers' part: it depends on how
long a request has waited, which only the ledger's clock knows.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Literal

ClientPriority = Literal["honour", "lower_only", "ignore"]


class Bands:
    def __init__(self, edges: Sequence[int], client_priority: ClientPriority = "honour") -> None:
        self.edges = tuple(edges)
        self.client_priority = client_priority

    @property
    def num_bands(self) -> int:
        return len(self.edges) + 1

    def band_of(self, priority: int) -> int:
        return bisect_right(self.edges, priority)

    def effective_priority(self, sent: int | None, key_default: int | None) -> int:
        """The priority a request is served at (and that the engine is sent): what it sent
        (None: it sent none) weighed against its key's default, per `client_priority`."""
        floor = key_default or 0
        if sent is None or self.client_priority == "ignore":
            return floor
        if self.client_priority == "lower_only":
            return max(sent, floor)
        return sent
