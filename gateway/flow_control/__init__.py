"""Flow control: when a backend is full, requests wait in the gateway — in fair order across
tenants, by priority band with aging — or are refused at once when their wait would exceed
their route's time-to-first-token objective. While the backend has room nothing waits.

- `config.py`: the knobs (`[server.flow_control]`, `[backends.flow_control]`, a key's `weight`
  and `priority`, a route's `ttft_slo_ms`).
- `tenant.py`: who a request counts against (its key, `user`, session or a header).
- `bands.py`: `priority` (lower first, as vLLM) and a key's default to a band.
- `fair_order.py`: the order — start-time fair queueing on tokens inside aging bands.
- `ledger.py`: the accounting behind one backend's queue, one atomic step at a time;
  `memory_ledger.py` in this process, `redis_ledger.py` shared by every worker through Redis.
- `service_rate.py`: tokens per second per slot, and the wait it predicts.
- `queue.py`: `FlowQueue.admit(ask) -> Ticket` / `ticket.release()`, per backend.
- `policy.py`: a request's facts (key, headers, `user`, `priority`, cost, route SLO) to its `Ask`
  and the priority the engine is sent; `build.py`: a backend's queue from the knobs.
- `capacity.py`: a fleet's capacity and room, from its replicas; `cost.py`: a request's tokens.
- `errors.py`: `QueueShed` (429 with `Retry-After`); `stats.py` and `metrics.py`: what is seen.
"""

from gateway.flow_control.bands import Bands
from gateway.flow_control.config import BackendFlowConfig, FlowControlConfig, KeyFlowFields, RouteFlowFields, check_flow_config
from gateway.flow_control.errors import QueueShed
from gateway.flow_control.ledger import Ledger, LedgerError
from gateway.flow_control.memory_ledger import MemoryLedger
from gateway.flow_control.policy import FlowPolicy
from gateway.flow_control.queue import Ask, FlowQueue, QueueLimits, Ticket, new_owner
from gateway.flow_control.service_rate import ServiceRate
from gateway.flow_control.tenant import TenantSource

__all__ = [
    "Ask", "BackendFlowConfig", "Bands", "FlowControlConfig", "FlowPolicy", "FlowQueue", "KeyFlowFields", "Ledger", "LedgerError",
    "MemoryLedger", "QueueLimits", "QueueShed", "RouteFlowFields", "ServiceRate", "TenantSource", "Ticket",
    "check_flow_config", "new_owner",
]
