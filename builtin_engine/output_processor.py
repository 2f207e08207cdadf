"""Per choice: detokenize each new token, decide whether the choice has finished (EOS, stop
token id, stop string, length) and which text may go out now.

Text that could still turn into a stop string is held back until it cannot; a matched stop
string is cut from the text (kept with `include_stop_str_in_output`). EOS and stop token ids
finish a choice only after `min_tokens` (the sampler bans them before), and their own text is
dropped unless `include_stop_str_in_output`. Stop strings count once `min_tokens` tokens exist, and
only where the newest token's text completes them (as in vLLM).

A sequence decoding under a grammar (structured outputs) has its matcher advanced here with each
token; a matcher that accepted a stop token has terminated, and the choice finishes with "stop"
(also under `ignore_eos`: nothing may follow). A token the grammar refuses (the sampler masks
them, so only through a bug) finishes the choice too, rather than emit text that breaks it.
"""

from __future__ import annotations

import logging
from typing import Protocol

from builtin_engine.outputs import ChoiceOutput, FinishReason, TokenLogprobs
from builtin_engine.scheduling.sequence import Sequence
from builtin_engine.text.stop_strings import find_stop_string, held_back_len

_log = logging.getLogger(__name__)


class Detokenizer(Protocol):
    def push(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class ChoiceState:
    def __init__(self, seq: Sequence, *, detokenizer: Detokenizer | None, eos_token_ids: frozenset[int]) -> None:
        self.seq = seq
        self.detokenizer = detokenizer
        self.eos_token_ids = frozenset() if seq.params.ignore_eos else eos_token_ids
        self.text = ""  # detokenized output so far (cut at a stop string)
        self.num_sent = 0  # characters of `text` already handed out

    def on_token(self, token_id: int, logprobs: TokenLogprobs | None) -> ChoiceOutput:
        """Process the token just appended to the sequence."""
        seq, p = self.seq, self.seq.params
        reason: FinishReason | None = None
        stop_reason: str | int | None = None
        past_min = seq.num_output_tokens >= p.min_tokens
        if past_min and (token_id in self.eos_token_ids or token_id in p.stop_token_ids):
            reason = "stop"
            stop_reason = token_id if token_id in p.stop_token_ids else None
        if seq.matcher is not None and reason is None:
            if not seq.matcher.accept(token_id):
                _log.warning("sequence %r: token %d is outside its grammar; finishing it", seq, token_id)
                reason = "stop"
            elif seq.matcher.is_terminated:
                reason = "stop"
        num_chars_before = len(self.text)
        if self.detokenizer is not None and (reason is None or p.include_stop_str_in_output):
            self.text += self.detokenizer.push(token_id)
        if reason is None and p.stop and past_min:
            # only stop strings that this token's text completes (as vLLM)
            start = max(self.num_sent, num_chars_before - max(map(len, p.stop)) + 1)
            match = find_stop_string(self.text, p.stop, start)
            if match is not None:
                pos, stop = match
                reason, stop_reason = "stop", stop
                self.text = self.text[: pos + len(stop) if p.include_stop_str_in_output else pos]
        if reason is None and seq.num_output_tokens >= seq.max_tokens:
            reason = "length"
        if reason is not None and not isinstance(stop_reason, str) and self.detokenizer is not None:
            self.text += self.detokenizer.flush()  # a partial character left at the end
        end = len(self.text)
        if reason is None and p.stop:
            end -= held_back_len(self.text, p.stop, self.num_sent)
        text, self.num_sent = self.text[self.num_sent : end], max(self.num_sent, end)
        return ChoiceOutput(
            index=seq.index,
            text=text,
            token_ids=[token_id],
            logprobs=[logprobs] if logprobs is not None else None,
            finish_reason=reason,
            stop_reason=stop_reason,
        )
