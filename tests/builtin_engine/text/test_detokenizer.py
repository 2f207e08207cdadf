"""Incremental detokenizer: the pieces re-join to exactly `decode(ids)`, and no piece carries a
U+FFFD for a character that was merely split across tokens."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from builtin_engine.text.detokenizer import IncrementalDetokenizer
from builtin_engine.text.tokenizer import Tokenizer
from tests.builtin_engine.text.samples import TEXTS, byte_level_ids, make_spm_tokenizer, make_wordpiece_tokenizer
from tests.fixtures_models import EOT

REPLACEMENT = "\ufffd"


def stream(tokenizer: Tokenizer, ids: list[int], **kwargs) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, **kwargs)
    return [detok.push(i) for i in ids] + [detok.flush()]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)


@pytest.fixture(scope="module")
def smollm(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(default_model_dir)


def _check_token_by_token(tokenizer: Tokenizer) -> None:
    for name, text in TEXTS.items():
        for add in (True, False):
            ids = tokenizer.encode(text, add_special_tokens=add)
            for skip in (True, False):
                pieces = stream(tokenizer, ids, skip_special_tokens=skip)
                assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=skip), name
                assert not any(REPLACEMENT in p for p in pieces), name
        assert "".join(stream(tokenizer, tokenizer.encode(text, add_special_tokens=False))) == text


def _check_every_byte_split(tokenizer: Tokenizer) -> None:
    """Each text's UTF-8 bytes cut at every position, the two halves tokenized apart (so a
    character's bytes straddle a token boundary), streamed token by token."""
    for name, text in TEXTS.items():
        data = text.encode("utf-8")
        for cut in range(1, len(data)):
            ids = byte_level_ids(tokenizer, data[:cut]) + byte_level_ids(tokenizer, data[cut:])
            pieces = stream(tokenizer, ids)
            assert not any(REPLACEMENT in p for p in pieces), (name, cut, pieces)
            assert "".join(pieces) == text == tokenizer.decode(ids), (name, cut)


def _check_prompt_split_mid_character(tokenizer: Tokenizer) -> None:
    """The prompt's ids end inside a character: the first generated piece completes it."""
    text = TEXTS["mixed"]
    data = text.encode("utf-8")
    for cut in range(1, len(data)):
        prompt, output = byte_level_ids(tokenizer, data[:cut]), byte_level_ids(tokenizer, data[cut:])
        start = cut
        while start > 0 and (data[start] & 0xC0) == 0x80:  # back to the character's first byte
            start -= 1
        assert "".join(stream(tokenizer, output, prompt_ids=prompt)) == data[start:].decode(), cut


def test_tiny_token_by_token(tiny: Tokenizer) -> None:
    _check_token_by_token(tiny)


def test_tiny_every_byte_split(tiny: Tokenizer) -> None:
    _check_every_byte_split(tiny)


def test_tiny_prompt_split_mid_character(tiny: Tokenizer) -> None:
    _check_prompt_split_mid_character(tiny)


def test_split_character_is_held_back(tiny: Tokenizer) -> None:
    ids = [byte_level_ids(tiny, bytes([b]))[0] for b in "a😀".encode()]  # one token per byte
    assert stream(tiny, ids) == ["a", "", "", "", "😀", ""]


def test_special_tokens_skipped_or_kept(tiny: Tokenizer) -> None:
    ids = tiny.encode("Xin chào", add_special_tokens=True) + [tiny.token_to_id(EOT)]
    assert "".join(stream(tiny, ids)) == "Xin chào"
    assert "".join(stream(tiny, ids, skip_special_tokens=False)) == f"<|begin_of_text|>Xin chào{EOT}"


def test_invalid_bytes_match_tokenizers_decode(tiny: Tokenizer) -> None:
    """Bytes that never form a character are replaced exactly as `tokenizers` replaces them."""
    rng = random.Random(1234)
    alphabet = [0x41, 0x20, 0x80, 0x9F, 0xBF, 0xC0, 0xC2, 0xE0, 0xE4, 0xED, 0xA0, 0xF0, 0xF4, 0xF5, 0xFF]
    single = {b: byte_level_ids(tiny, bytes([b]))[0] for b in range(256)}
    for _ in range(400):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 10)))
        ids = [single[b] for b in data]
        assert "".join(stream(tiny, ids)) == tiny.decode(ids) == data.decode("utf-8", errors="replace"), data


def test_prompt_ids_do_not_change_byte_level_output(tiny: Tokenizer) -> None:
    prompt = tiny.encode("Question: ", add_special_tokens=True)
    output = tiny.encode(" Hà Nội 🙂", add_special_tokens=False)
    assert "".join(stream(tiny, output, prompt_ids=prompt)) == " Hà Nội 🙂"


def test_sentencepiece_leading_space(tmp_path: Path) -> None:
    spm = Tokenizer.from_dir(make_spm_tokenizer(tmp_path / "spm"))
    _check_token_by_token(spm)
    ids = spm.encode("Hello world", add_special_tokens=True)
    assert "".join(stream(spm, ids)) == "Hello world"  # the decoder's leading-space strip
    assert "".join(stream(spm, ids, skip_special_tokens=False)) == "<s> Hello world"
    # Continuing a prompt: the space belongs to the output, as decode(prompt + output) shows.
    prompt, output = ids[:2], ids[2:]
    whole, head = spm.decode(ids), spm.decode(prompt)
    assert "".join(stream(spm, output, prompt_ids=prompt)) == whole[len(head):]
    assert "".join(stream(spm, output, prompt_ids=[spm.bos_token_id])) == spm.decode(output)


def test_window_fallback_for_other_decoders(tmp_path: Path) -> None:
    wordpiece = Tokenizer.from_dir(make_wordpiece_tokenizer(tmp_path / "wp"))
    assert not wordpiece.has_byte_decoder
    for text in TEXTS.values():
        ids = wordpiece.encode(text, add_special_tokens=False)
        pieces = stream(wordpiece, ids)
        assert "".join(pieces) == wordpiece.decode(ids)
        assert not any(REPLACEMENT in p for p in pieces)


@pytest.mark.slow
def test_default_model_token_by_token(smollm: Tokenizer) -> None:
    _check_token_by_token(smollm)


@pytest.mark.slow
def test_default_model_every_byte_split(smollm: Tokenizer) -> None:
    _check_every_byte_split(smollm)
    _check_prompt_split_mid_character(smollm)
