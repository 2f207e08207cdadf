"""bench/flow_control_share.py reads A's share of the grants made while others waited off a
request log: which grants count (another tenant waiting in A's band or above, aged as the ledger
ages it; every band with `literal`), A's share of them, and what its weight owed it then."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from flow_control_share import a_share, read_log, requests_of  # noqa: E402

BANDS = {"A": 1, "B": 0, "C": 2}
WEIGHTS = {"A": 1.0, "B": 1.0, "C": 1.0}


def line(request_id: str, ts: float, *, queued_s: float | None = None, outcome: str = "ok", error: str | None = None,
         e2e: float = 1.0) -> dict:
    made = {"ts": ts, "request_id": request_id, "outcome": outcome, "error": error, "e2e": e2e}
    if queued_s is not None:
        made["queued_ms"] = round(queued_s * 1000)
    return made


def test_the_grants_made_while_b_waited_count_its_own_included(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    lines = [
        line("A-1", 0.0),  # straight through: never waited, granted before anyone waited
        line("B-1", 0.0, queued_s=2.0),  # waits 0..2
        line("A-2", 0.5, queued_s=0.5),  # granted at 1 while B waits: A's
        line("A-3", 0.5, queued_s=2.5),  # waits 0.5..3: A in contention at 2
        line("A-4", 0.2, outcome="error:QueueShed", error="queue_wait_over_slo", e2e=0.0),  # refused at once: no wait
    ]
    log.write_text("".join(json.dumps(each) + "\n" for each in lines))
    share = a_share(requests_of(read_log(log)), bands=BANDS, weights=WEIGHTS, aging_s=30.0)
    assert (share.counted_grants, share.a_grants, share.share, share.owed) == (2, 1, 0.5, 0.5)  # at 1 (A), at 2 (B itself)


def test_a_lower_band_counts_in_band_only_once_aged_into_as_band() -> None:
    lines = [
        line("C-1", 0.0, queued_s=40.0),  # band 2 until 30 s, band 1 (A's) after
        line("A-1", 5.0, queued_s=5.0),  # granted at 10: C waits, in band 2
        line("A-2", 5.0, queued_s=30.0),  # granted at 35: C waits, aged into band 1
        line("A-3", 30.0, queued_s=12.0),  # waits past C's grant at 40
    ]
    requests = requests_of(lines)
    in_band = a_share(requests, bands=BANDS, weights=WEIGHTS, aging_s=30.0)
    assert (in_band.counted_grants, in_band.a_grants) == (2, 1)  # at 35 (A) and at 40 (C)
    literal = a_share(requests, bands=BANDS, weights=WEIGHTS, aging_s=30.0, literal=True)
    assert (literal.counted_grants, literal.a_grants, literal.share) == (3, 2, 2 / 3)
    assert literal.owed == 0.5
    strict = a_share(requests, bands=BANDS, weights=WEIGHTS, aging_s=0.0)  # no aging: C never reaches A's band
    assert (strict.counted_grants, strict.share, strict.owed) == (0, None, None)


def test_a_refusal_after_waiting_was_a_wait_and_weights_set_what_is_owed() -> None:
    lines = [
        line("C-1", 0.0, outcome="error:QueueShed", error="queue_timeout", e2e=60.0),  # waited 60 s, never granted
        line("A-1", 0.0, queued_s=31.0),  # granted at 31: C waits (aged into band 1)
    ]
    share = a_share(requests_of(lines), bands=BANDS, weights={"A": 3.0, "B": 1.0, "C": 1.0}, aging_s=30.0)
    assert (share.counted_grants, share.a_grants, share.owed) == (1, 1, 0.75)
