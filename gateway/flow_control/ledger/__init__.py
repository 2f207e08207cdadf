"""The ledger: a backend's shared accounting of its queue, one atomic step at a time (`base`),
in the order `fair_order` defines — in this process (`memory_ledger`) or in Redis, shared by
every worker (`redis_ledger`; imported only where `[server] state` is set)."""

from gateway.flow_control.ledger.base import Arrival, Entry, Ledger, LedgerError
from gateway.flow_control.ledger.fair_order import entry_id
from gateway.flow_control.ledger.memory_ledger import MemoryLedger

__all__ = ["Arrival", "Entry", "Ledger", "LedgerError", "MemoryLedger", "entry_id"]
