"""Stop strings on detokenized text: where one occurs, and how much of the text's tail must be
held back because the next tokens might complete one."""

from __future__ import annotations

from collections.abc import Sequence


def find_stop_string(text: str, stops: Sequence[str], start: int) -> tuple[int, str] | None:
    """The earliest occurrence at or after `start` of any stop string: (position, the string).
    Of two starting at the same place, the longer wins."""
    best: tuple[int, str] | None = None
    for stop in stops:
        pos = text.find(stop, start)
        if pos >= 0 and (best is None or pos < best[0] or (pos == best[0] and len(stop) > len(best[1]))):
            best = (pos, stop)
    return best


def held_back_len(text: str, stops: Sequence[str], start: int) -> int:
    """Length of the longest tail of `text[start:]` that is a prefix of some stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop), len(text) - start), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
