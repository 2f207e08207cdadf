"""The model's tokenizer: `tokenizer.json` through the `tokenizers` library (no transformers import,
so loading takes a fraction of a second), plus what the engine needs on top of encode/decode:
end-of-sequence ids, special ids, and the raw bytes each token contributes to the output text.

`token_bytes` understands the two decoder families Llama-like models use:
- byte-level BPE (GPT-2, Llama 3, SmolLM, Qwen): every character of a token stands for one byte
  (`Ġ` is the space byte); a token with a character outside that table (an added token such as
  `<|im_end|>` whose characters all happen to be in it, or one that is not) falls back to its
  UTF-8 text, exactly as the `ByteLevel` decoder does;
- SentencePiece style (Llama 2, Mistral, Gemma): `▁` is a space, `<0xNN>` is the byte NN (byte
  fallback), and the decoder drops one leading space at the very start of the text
  (`strips_leading_space`).
Any other decoder gets an approximate `token_bytes` (the token decoded alone) and
`has_byte_decoder` False; the incremental detokenizer then re-decodes a short window instead.

`decode` is the `tokenizers` decode, with no `clean_up_tokenization_spaces` pass (as vLLM's
streaming detokenizer), so streamed and non-streamed text agree.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import tokenizers

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


class TokenizerError(Exception):
    """A model directory has no usable tokenizer."""


class Tokenizer:
    """Encode, decode and per-token bytes for one model. Build it with `Tokenizer.from_dir`."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        special_tokens: dict[str, str] | None = None,
        extra_eos_token_ids: Iterable[int] = (),
    ) -> None:
        self._tk = backend
        self._special_tokens = dict(special_tokens or {})
        added = backend.get_added_tokens_decoder()
        # Exactly the ids that `decode(..., skip_special_tokens=True)` drops.
        self.skipped_special_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = self._id_of(self.bos_token)
        self.eos_token_id = self._id_of(self.eos_token)
        eos = set(extra_eos_token_ids)
        if self.eos_token_id is not None:
            eos.add(self.eos_token_id)
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        named = {self._id_of(tok) for tok in self._special_tokens.values()} - {None}
        self.all_special_ids: list[int] = sorted(self.skipped_special_ids | named)
        self._byte_decoder = _ByteDecoderInfo.from_decoder(backend.decoder)
        self._bytes_cache: dict[int, bytes] = {}

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load `tokenizer.json`, with `tokenizer_config.json` (special token names) and
        `generation_config.json` (eos ids; `config.json` when that file is absent) if present."""
        path = Path(path)
        tokenizer_json = path / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise TokenizerError(f"{path} has no tokenizer.json (only fast tokenizers are supported)")
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_json))
        except Exception as exc:  # the Rust side raises plain Exception subclasses
            raise TokenizerError(f"{tokenizer_json} cannot be loaded: {exc}") from exc
        return cls(
            backend,
            special_tokens=load_special_tokens(path),
            extra_eos_token_ids=_generation_eos_ids(path),
        )

    # --- encode / decode -----------------------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Token ids of `text`. Rendered chat prompts already hold their special tokens: encode
        them with `add_special_tokens=False`; plain completion prompts with True."""
        return self._tk.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # --- vocabulary ----------------------------------------------------------------------------

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of `token_id` (`Ġhello`, `▁hello`, `<0x0A>`), None if out of range."""
        return self._tk.id_to_token(token_id)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str | None]:
        return [self._tk.id_to_token(i) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        return self._tk.token_to_id(token)

    @property
    def bos_token(self) -> str | None:
        return self._special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self._special_tokens.get("eos_token")

    @property
    def pad_token(self) -> str | None:
        return self._special_tokens.get("pad_token")

    @property
    def unk_token(self) -> str | None:
        return self._special_tokens.get("unk_token")

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """`bos_token`, `eos_token`, `unk_token`, `pad_token` as named in tokenizer_config.json."""
        return dict(self._special_tokens)

    # --- bytes ---------------------------------------------------------------------------------

    @property
    def has_byte_decoder(self) -> bool:
        """Whether `token_bytes` is exact (byte-level BPE or SentencePiece-style decoder)."""
        return self._byte_decoder.kind != "other"

    @property
    def strips_leading_space(self) -> bool:
        """Whether decoding drops one space at the very start of the text (SentencePiece)."""
        return self._byte_decoder.strips_leading_space

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes `token_id` contributes to decoded text (a piece of a UTF-8 character for
        byte tokens), as used for logprob `bytes`. Special tokens give their text's bytes. The
        SentencePiece start-of-text space strip is not applied here (the detokenizer does it)."""
        cached = self._bytes_cache.get(token_id)
        if cached is None:
            token = self._tk.id_to_token(token_id)
            if token is None:
                raise IndexError(f"token id {token_id} is out of range (vocab size {self.vocab_size})")
            if self._byte_decoder.kind == "other":
                cached = self._tk.decode([token_id], skip_special_tokens=False).encode("utf-8")
            else:
                cached = self._byte_decoder.bytes_of(token)
            self._bytes_cache[token_id] = cached
        return cached

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._tk.token_to_id(token)

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token!r}, eos={self.eos_token!r}, "
                f"eos_ids={sorted(self.eos_token_ids)}, decoder={self._byte_decoder.kind})")


def load_special_tokens(path: str | Path) -> dict[str, str]:
    """`bos_token`/`eos_token`/`unk_token`/`pad_token` from `tokenizer_config.json` (as strings;
    older files store `{"content": ...}` objects); empty when the file is absent."""
    config = _read_json(Path(path) / "tokenizer_config.json") or {}
    found = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found[key] = value
    return found


def _generation_eos_ids(path: Path) -> list[int]:
    config = _read_json(path / "generation_config.json") or _read_json(path / "config.json") or {}
    eos = config.get("eos_token_id")
    if isinstance(eos, int):
        return [eos]
    if isinstance(eos, list):
        return [i for i in eos if isinstance(i, int)]
    return []


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"{path} is not valid JSON: {exc}") from exc
    return data if isinstance(data, dict) else None


@lru_cache(maxsize=1)
def _byte_level_table() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: printable character -> the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class _ByteDecoderInfo:
    """What a `tokenizers` decoder does to bytes, read from its JSON state."""

    def __init__(self, kind: str, *, space_char: str = "▁", byte_fallback: bool = False,
                 strips_leading_space: bool = False) -> None:
        self.kind = kind  # "byte_level" | "sentencepiece" | "other"
        self.space_char = space_char
        self.byte_fallback = byte_fallback
        self.strips_leading_space = strips_leading_space

    @classmethod
    def from_decoder(cls, decoder: Any) -> _ByteDecoderInfo:
        if decoder is None:
            return cls("other")
        state = json.loads(decoder.__getstate__())
        parts = state["decoders"] if state.get("type") == "Sequence" else [state]
        types = [p.get("type") for p in parts]
        if types == ["ByteLevel"]:
            return cls("byte_level")
        space_char, byte_fallback, strips = None, False, False
        for part in parts:
            kind = part.get("type")
            if kind == "Replace" and part.get("content") == " " and "String" in part.get("pattern", {}):
                space_char = part["pattern"]["String"]
            elif kind == "Metaspace":
                space_char = part.get("replacement", "▁")
                strips = part.get("prepend_scheme", "always") != "never" and part.get("add_prefix_space", True)
            elif kind == "ByteFallback":
                byte_fallback = True
            elif kind == "Strip" and part.get("content") == " " and part.get("start", 0) >= 1:
                strips = True
            elif kind != "Fuse":
                return cls("other")
        if space_char is None or len(space_char) != 1:
            return cls("other")
        return cls("sentencepiece", space_char=space_char, byte_fallback=byte_fallback,
                   strips_leading_space=strips)

    def bytes_of(self, token: str) -> bytes:
        if self.kind == "byte_level":
            table = _byte_level_table()
            try:
                return bytes(table[c] for c in token)
            except KeyError:  # a character outside the byte table: the decoder keeps the text
                return token.encode("utf-8")
        if self.byte_fallback and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            try:
                return bytes([int(token[3:5], 16)])
            except ValueError:
                pass
        return token.replace(self.space_char, " ").encode("utf-8")
