"""Tokenizer: ids and text agree with transformers; token bytes rebuild the text exactly."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from builtin_engine.text.tokenizer import Tokenizer, TokenizerError
from tests.builtin_engine.text.samples import TEXTS, make_spm_tokenizer, make_wordpiece_tokenizer
from tests.fixtures_models import BOS, EOS, EOT


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)


@pytest.fixture(scope="module")
def tiny_hf(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _check_matches_transformers(ours: Tokenizer, hf) -> None:
    assert ours.vocab_size == len(hf)
    for text in [*TEXTS.values(), "", " leading and trailing spaces  ", "line\nbreaks\r\n\ttabs"]:
        for add in (True, False):
            ids = ours.encode(text, add_special_tokens=add)
            assert ids == hf(text, add_special_tokens=add)["input_ids"], (text, add)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert ours.bos_token == hf.bos_token
    assert ours.eos_token == hf.eos_token
    assert set(hf.all_special_ids) <= set(ours.all_special_ids)


def _check_bytes_rebuild_text(ours: Tokenizer) -> None:
    for text in TEXTS.values():
        ids = ours.encode(text, add_special_tokens=False)
        assert b"".join(ours.token_bytes(i) for i in ids) == text.encode("utf-8"), text


def test_tiny_matches_transformers(tiny: Tokenizer, tiny_hf) -> None:
    _check_matches_transformers(tiny, tiny_hf)


def test_tiny_special_tokens(tiny: Tokenizer) -> None:
    bos, eos, eot = (tiny.token_to_id(t) for t in (BOS, EOS, EOT))
    assert tiny.bos_token == BOS and tiny.bos_token_id == bos
    assert tiny.eos_token == EOT and tiny.eos_token_id == eot
    assert tiny.eos_token_ids == frozenset({eos, eot})  # generation_config.json + tokenizer eos
    assert tiny.pad_token == EOS
    assert set(tiny.all_special_ids) == set(range(5))
    assert tiny.skipped_special_ids == frozenset(range(5))
    assert tiny.encode("Hi", add_special_tokens=True)[0] == bos
    assert tiny.encode("Hi", add_special_tokens=False)[0] != bos
    # Special tokens written in text are recognised (rendered chat prompts rely on it).
    ids = tiny.encode(f"{BOS}Hi{EOT}", add_special_tokens=False)
    assert (ids[0], ids[-1]) == (bos, eot) and bos not in ids[1:-1]


def test_tiny_vocabulary_lookups(tiny: Tokenizer) -> None:
    ids = tiny.encode(" hello world", add_special_tokens=False)
    tokens = tiny.convert_ids_to_tokens(ids)
    assert tokens == [tiny.id_to_token(i) for i in ids]
    assert all(t is not None and t.startswith("Ġ") for t in tokens[:1])
    assert [tiny.token_to_id(t) for t in tokens] == ids
    assert tiny.id_to_token(tiny.vocab_size) is None
    assert tiny.token_to_id("no such token here") is None


def test_tiny_token_bytes(tiny: Tokenizer) -> None:
    _check_bytes_rebuild_text(tiny)
    space_hello = tiny.encode(" hello", add_special_tokens=False)
    assert b"".join(tiny.token_bytes(i) for i in space_hello) == b" hello"
    assert tiny.token_bytes(tiny.token_to_id(EOT)) == EOT.encode()
    # Single-byte tokens carry the raw byte, even when it is only part of a character.
    assert tiny.token_bytes(tiny.token_to_id("ð")) == b"\xf0"  # 😀's first byte
    assert tiny.token_bytes(tiny.token_to_id("Ġ")) == b" "
    with pytest.raises(IndexError):
        tiny.token_bytes(tiny.vocab_size + 10)


def test_sentencepiece_style_bytes(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(make_spm_tokenizer(tmp_path / "spm"))
    assert tok.has_byte_decoder and tok.strips_leading_space
    assert tok.token_bytes(tok.token_to_id("<0xE4>")) == b"\xe4"
    for text in TEXTS.values():
        ids = tok.encode(text, add_special_tokens=True)
        assert tok.decode(ids) == text
        # "▁" is a space; the decoder drops the one the normalizer put in front.
        assert b"".join(tok.token_bytes(i) for i in ids[1:]) == b" " + text.encode("utf-8")


def test_other_decoder_is_flagged(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(make_wordpiece_tokenizer(tmp_path / "wp"))
    assert not tok.has_byte_decoder
    assert tok.bos_token is None and tok.eos_token_ids == frozenset()
    assert tok.token_bytes(tok.encode("hello", add_special_tokens=False)[0])  # approximate, not empty


def test_missing_tokenizer_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_eos_ids_from_config_json_when_no_generation_config(tiny_model_dir: Path, tmp_path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tiny_model_dir / name).read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 1}))
    assert Tokenizer.from_dir(tmp_path).eos_token_ids == frozenset({1, 4})


@pytest.mark.slow
def test_default_model_matches_transformers(default_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    started = time.monotonic()
    ours = Tokenizer.from_dir(default_model_dir)
    assert time.monotonic() - started < 2.0  # tokenizers only: well under a second here
    _check_matches_transformers(ours, AutoTokenizer.from_pretrained(default_model_dir))
    _check_bytes_rebuild_text(ours)
    assert ours.bos_token == "<|im_start|>" and ours.eos_token == "<|im_end|>"
    assert ours.eos_token_ids == frozenset({2})
    assert ours.vocab_size == 49152
    assert ours.has_byte_decoder and not ours.strips_leading_space
