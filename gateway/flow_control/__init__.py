"""Flow control: when a backend is full, requests wait in the gateway — in fair order across
tenants, by priority band with aging — or are refused at once when their wait would exceed
their route's time-to-first-token objective. While the backend has room nothing waits.

Its knobs are `gateway.config`'s (`[server.flow_control]`, `[backends.flow_control]`, a key's
`weight` and `priority`, a route's `ttft_slo_ms`); a refusal is `gateway.errors.QueueShed` (429).

- `tenant.py`: who a request counts against (its key, `user`, session or a header).
- `bands.py`: `priority` (lower first, as vLLM) and a key's default to a band.
- `ledger/`: the accounting behind one backend's queue, one atomic step at a time, in the
  order of `ledger/fair_order.py` (start-time fair queueing on tokens inside aging bands); in
  this process or shared by every worker through Redis.
- `service_rate.py`: tokens per second per slot, and the wait it predicts.
- `queue.py`: `FlowQueue.admit(ask) -> Ticket` / `ticket.release()`, per backend.
- `policy.py`: a request's facts (key, headers, `user`, `priority`, cost, route SLO) to its `Ask`
  and the priority the engine is sent.
- `capacity.py`: a backend's capacity and room, from its replicas or its engine.
- `build.py`: `FlowControl`, the policy and every backend's queue, built at start-up.
- `stats.py` and `metrics.py`: what is seen.
"""

from gateway.flow_control.build import FlowControl, build_flow_control
from gateway.flow_control.policy import Asked, FlowPolicy
from gateway.flow_control.queue import Ask, FlowQueue, QueueLimits, Ticket

__all__ = ["Ask", "Asked", "FlowControl", "FlowPolicy", "FlowQueue", "QueueLimits", "Ticket", "build_flow_control"]
