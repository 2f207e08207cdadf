"""Structured outputs: grammars compiled with xgrammar (as vLLM does), one matcher per sequence,
and the token masks the sampler applies.

    compiler = GrammarCompiler(tokenizer, vocab_size=V, stop_token_ids=eos_ids)   # once per model
    spec = grammar_spec(structured_outputs, response_format)   # from the request; None: unconstrained
    grammar = compiler.compile(spec, stop_token_ids=...)       # cached per (kind, source); raises early
    SamplingParams(..., grammar=grammar)                        # each Sequence gets its own Matcher

Per step, `MaskBuffer.fill_and_apply` fills one bitmask row per constrained sequence and sets
the disallowed logits to -inf (about 0.1 ms per row for a 49k vocabulary on one CPU thread)
before `kernels.sample`; rows without a grammar cost nothing. The output processor advances each matcher with the token
sampled; the end-of-sequence tokens are allowed only where the grammar may end, and accepting one
terminates the matcher (the choice then finishes with "stop").

UTF-8: xgrammar checks the shape of multi-byte characters but not every range, so a model that
samples byte tokens could write an encoded surrogate (ED A0..BF ..), an overlong form or a code
point past U+10FFFF, which decodes to U+FFFD and breaks a string's length limit. Tokens holding a
byte that never occurs in UTF-8 (C0, C1, F5..FF) are left out of the grammar vocabulary, and after
a lead byte E0 / ED / F0 / F4 the tokens whose first byte would make the character invalid are
masked too (`Utf8Guard`).

JSON is generated compactly (`{"a": 1, "b": [2, 3]}`: no free whitespace between tokens, which a
weak model otherwise fills until `max_tokens`), unless the request sends vLLM's
`disable_any_whitespace: false`. Objects follow the schema's property order and allow no
properties it does not name (xgrammar's strict mode, vLLM's default).

xgrammar is imported on first use: an engine that never sees a grammar never loads it.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from builtin_engine.errors import InvalidRequestError
from builtin_engine.text.grammar import GrammarKind, GrammarSpec, grammar_spec, json_schema_spec  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from builtin_engine.text.tokenizer import Tokenizer

DEFAULT_CACHE_SIZE = 256  # compiled grammars kept (LRU); a JSON schema's is typically tens of KB


def choice_ebnf(choices: Sequence[str]) -> str:
    """An EBNF (GBNF) grammar whose language is exactly `choices`."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


# ---- compiled grammars and matchers ------------------------------------------------------------


class Utf8Guard:
    """Per vocabulary: each token's bytes, and for the lead bytes whose second byte has a
    narrower range than 80..BF (E0, ED, F0, F4), the tokens that must not follow them."""

    _SECOND_BYTE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}

    def __init__(self, vocab: list[bytes]) -> None:
        self.vocab = vocab
        self.banned_after: dict[int, torch.Tensor] = {}
        for lead, (lo, hi) in self._SECOND_BYTE.items():
            ids = [i for i, token in enumerate(vocab) if token and 0x80 <= token[0] <= 0xBF and not lo <= token[0] <= hi]
            self.banned_after[lead] = torch.tensor(ids, dtype=torch.int64)

    def pending_lead(self, token_id: int, previous: int | None) -> int | None:
        """The lead byte a character is left open on after `token_id`, when it is one of the
        guarded ones and nothing of the character followed it yet."""
        token = self.vocab[token_id] if token_id < len(self.vocab) else b""
        if not token:
            return previous
        last = token[-1]
        return last if last in self._SECOND_BYTE else None


@dataclass(frozen=True, slots=True, eq=False)
class Grammar:
    """What one request decodes under: a compiled grammar (shared, cached) and the token ids that
    may end it. Immutable; every sequence of the request gets its own `Matcher`."""

    compiled: Any  # xgrammar.CompiledGrammar
    stop_token_ids: tuple[int, ...]
    kind: GrammarKind
    utf8: Utf8Guard | None = None

    def new_matcher(self) -> Matcher:
        import xgrammar as xgr

        return Matcher(xgr.GrammarMatcher(self.compiled, override_stop_tokens=list(self.stop_token_ids)), self.utf8)

    def __repr__(self) -> str:
        return f"Grammar({self.kind}, stop={list(self.stop_token_ids)})"


class Matcher:
    """The grammar state of one sequence: which tokens may come next."""

    __slots__ = ("_matcher", "_utf8", "open_lead")

    def __init__(self, matcher: Any, utf8: Utf8Guard | None = None) -> None:
        self._matcher = matcher  # xgrammar.GrammarMatcher
        self._utf8 = utf8
        self.open_lead: int | None = None  # a guarded UTF-8 lead byte the text ends on

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False (state unchanged) when the grammar forbids it."""
        if not self._matcher.accept_token(token_id):
            return False
        if self._utf8 is not None:
            self.open_lead = self._utf8.pending_lead(token_id, self.open_lead)
        return True

    def banned_next(self) -> torch.Tensor | None:
        """Token ids that would break the UTF-8 character left open, beyond the grammar's mask."""
        if self.open_lead is None or self._utf8 is None:
            return None
        return self._utf8.banned_after[self.open_lead]

    @property
    def is_terminated(self) -> bool:
        """A stop token was accepted: nothing may follow."""
        return self._matcher.is_terminated()

    @property
    def can_end(self) -> bool:
        """The text so far is a complete sentence of the grammar."""
        return self._matcher.is_completed()


class GrammarCompiler:
    """Compiles `GrammarSpec`s for one model's vocabulary; an LRU cache of compiled grammars
    per (kind, source, whitespace). Thread-safe (compilation runs outside the event loop)."""

    def __init__(self, tokenizer: Tokenizer, *, vocab_size: int, stop_token_ids: Iterable[int],
                 cache_size: int = DEFAULT_CACHE_SIZE, max_threads: int = 2) -> None:
        import xgrammar as xgr

        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(sorted(set(stop_token_ids)))
        vocab = _encoded_vocab(tokenizer, vocab_size)
        self.utf8 = Utf8Guard(vocab)
        stops = list(self.stop_token_ids)
        self._compiler = xgr.GrammarCompiler(
            xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stops),
            max_threads=max_threads, cache_enabled=False)
        # JSON kinds: xgrammar's JSON strings admit raw control characters, which JSON forbids
        # (a weak model does sample such byte tokens), so its vocabulary leaves them out.
        json_vocab = [b"" if _CONTROL_BYTES.search(token) else token for token in vocab]
        self._json_compiler = xgr.GrammarCompiler(
            xgr.TokenizerInfo(json_vocab, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stops),
            max_threads=max_threads, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str, bool], Any] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.num_compiled = 0  # cache misses (tests, metrics)

    def cached(self, spec: GrammarSpec, *, stop_token_ids: Iterable[int] = ()) -> Grammar | None:
        """The grammar if it is compiled already (no waiting), else None."""
        with self._lock:
            compiled = self._cache.get(spec.key)
            if compiled is None:
                return None
            self._cache.move_to_end(spec.key)
        return self._grammar(compiled, spec, stop_token_ids)

    def compile(self, spec: GrammarSpec, *, stop_token_ids: Iterable[int] = ()) -> Grammar:
        """Compile (or fetch) `spec`; `stop_token_ids` end it besides the model's EOS ids.
        Raises `InvalidRequestError` naming what is wrong with the schema, regex or grammar."""
        found = self.cached(spec, stop_token_ids=stop_token_ids)
        if found is not None:
            return found
        compiled = self._compile(spec)
        with self._lock:
            self._cache[spec.key] = compiled
            self._cache.move_to_end(spec.key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            self.num_compiled += 1
        return self._grammar(compiled, spec, stop_token_ids)

    def _grammar(self, compiled: Any, spec: GrammarSpec, stop_token_ids: Iterable[int]) -> Grammar:
        stops = tuple(sorted(set(self.stop_token_ids) | {t for t in stop_token_ids if 0 <= t < self.vocab_size}))
        return Grammar(compiled=compiled, stop_token_ids=stops, kind=spec.kind, utf8=self.utf8)

    def _compile(self, spec: GrammarSpec) -> Any:
        c = self._compiler
        j = self._json_compiler
        try:
            if spec.kind == "json":
                return j.compile_json_schema(spec.source, any_whitespace=spec.any_whitespace, strict_mode=True)
            if spec.kind == "json_object":
                return j.compile_json_schema('{"type":"object"}', any_whitespace=spec.any_whitespace, strict_mode=False)
            if spec.kind == "regex":
                return c.compile_regex(spec.source)
            if spec.kind == "choice":
                return c.compile_grammar(choice_ebnf(json.loads(spec.source)))
            if spec.kind == "grammar":
                return self._compile_grammar_text(spec.source)
            if spec.kind == "structural_tag":
                return j.compile_structural_tag(spec.source)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise InvalidRequestError(f"Invalid {_WHAT[spec.kind]} in `{spec.param}`: {_clean(exc)}",
                                      param=spec.param) from None
        raise InvalidRequestError(f"Unknown structured output kind {spec.kind!r}.", param=spec.param)

    def _compile_grammar_text(self, text: str) -> Any:
        """EBNF/GBNF (`root ::= ...`); a grammar with no `::=` is tried as Lark (`start: ...`)."""
        if "::=" not in text and hasattr(self._compiler, "compile_lark"):
            return self._compiler.compile_lark(text)
        return self._compiler.compile_grammar(text)


_WHAT: dict[str, str] = {
    "json": "JSON schema",
    "json_object": "JSON object grammar",
    "regex": "regular expression",
    "choice": "choice list",
    "grammar": "grammar",
    "structural_tag": "structural tag",
}
_NEVER_UTF8 = re.compile(rb"[\xc0\xc1\xf5-\xff]")
_CONTROL_BYTES = re.compile(rb"[\x00-\x09\x0b\x0c\x0e-\x1f]")  # all but \n and \r, which JSON strings never admit here
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+?:\d+: (Check failed: \(.*?\) is false: )?")


def _clean(exc: BaseException) -> str:
    """xgrammar's message without its C++ log prefix ("[12:00:00] /project/cpp/x.cc:94: ")."""
    text = " ".join(str(exc).split())
    text = _LOG_PREFIX.sub("", text)
    return text.rstrip(".") + "."


def _encoded_vocab(tokenizer: Tokenizer, vocab_size: int) -> list[bytes]:
    """Each token's raw bytes; as empty (which xgrammar never allows inside a grammar, stop
    tokens excepted): special tokens (those decoding drops), ids past the tokenizer's vocabulary,
    and tokens holding a byte that no UTF-8 text has."""
    special = tokenizer.skipped_special_ids
    vocab = []
    for token_id in range(vocab_size):
        if token_id in special or token_id >= tokenizer.vocab_size:
            vocab.append(b"")
        else:
            token = tokenizer.token_bytes(token_id)
            vocab.append(b"" if _NEVER_UTF8.search(token) else token)
    return vocab


# ---- masks (the sampler's side) -----------------------------------------------------------------


class MaskBuffer:
    """A reusable int32 bitmask [rows, ceil(V / 32)] on the CPU (where xgrammar fills it), and
    the table that turns its bytes into additive masks (0 or -inf per token) on the logits'
    device: one `index_select` and one `index_add_` per step for all constrained rows, several
    times faster on the CPU than xgrammar's own apply, and no Triton needed on a GPU."""

    def __init__(self) -> None:
        self._bitmask: torch.Tensor | None = None
        self._tables: dict[torch.device, torch.Tensor] = {}

    def fill_and_apply(self, logits: torch.Tensor, rows: Sequence[int], matchers: Sequence[Matcher]) -> None:
        """Set logits[row, t] = -inf for every token t the row's matcher forbids next. logits
        [S, V] float32, modified in place; `rows[i]` is the row of `matchers[i]`."""
        num_rows, vocab_size = logits.shape
        k = len(matchers)
        words = (vocab_size + 31) // 32
        bitmask = self._bitmask
        if bitmask is None or bitmask.shape[0] < k or bitmask.shape[1] != words:
            bitmask = self._bitmask = torch.empty((max(k, 8), words), dtype=torch.int32)
        for i, matcher in enumerate(matchers):  # microseconds each; threads would cost more here
            matcher._matcher.fill_next_token_bitmask(bitmask, i)
        device = logits.device
        table = self._tables.get(device)
        if table is None:
            table = self._tables[device] = _byte_masks().to(device)
        packed = bitmask[:k].view(torch.uint8).to(device, non_blocking=True).long()  # [k, 4W] little-endian bytes
        additive = torch.index_select(table, 0, packed.view(-1)).view(k, -1)[:, :vocab_size]  # [k, V]
        if k == num_rows and list(rows) == list(range(num_rows)):
            logits.add_(additive)
        else:
            logits.index_add_(0, torch.tensor(list(rows), dtype=torch.int64, device=device), additive)
        for row, matcher in zip(rows, matchers):
            banned = matcher.banned_next()
            if banned is not None:
                logits[row, banned.to(device)] = float("-inf")


def _byte_masks() -> torch.Tensor:
    """[256, 8] float32: for each byte of a bitmask, 0 where bit i is set (token allowed), -inf
    where not; xgrammar's bitmask is little-endian (token j is bit j % 32 of word j // 32)."""
    bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
    return torch.where(bits.bool(), 0.0, float("-inf")).to(torch.float32)
