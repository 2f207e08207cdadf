"""Property tests of the incremental detokenizer (`builtin_engine/text/detokenizer.py`) on the tiny
model's byte-level tokenizer: any UTF-8 text, its bytes split anywhere into token runs (so a
character's bytes straddle tokens, as a model may emit them), streams back to exactly the text,
and no piece ever carries a U+FFFD for a character that was merely split."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builtin_engine.text.detokenizer import IncrementalDetokenizer
from builtin_engine.text.tokenizer import Tokenizer
from tests.builtin_engine.text.samples import byte_level_ids

LONG = os.environ.get("SWITCHYARD_LONG") == "1"
PROFILE = settings(max_examples=2000 if LONG else 150, deadline=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
REPLACEMENT = "\ufffd"

# any text that has a UTF-8 form (no lone surrogates); emoji, CJK, combining marks, controls
texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)


def stream(tokenizer: Tokenizer, ids: list[int], **kwargs: object) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, **kwargs)  # type: ignore[arg-type]
    return [detok.push(i) for i in ids] + [detok.flush()]


@st.composite
def split_bytes(draw: st.DrawFn) -> tuple[str, list[bytes]]:
    text = draw(texts)
    data = text.encode("utf-8")
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=8))))
    bounds = [0, *cuts, len(data)]
    return text, [data[a:b] for a, b in zip(bounds, bounds[1:])]


@PROFILE
@given(split_bytes())
def test_any_split_of_any_text_rejoins_exactly(tiny: Tokenizer, case: tuple[str, list[bytes]]) -> None:
    text, parts = case
    ids = [i for part in parts for i in byte_level_ids(tiny, part)]
    pieces = stream(tiny, ids)
    assert "".join(pieces) == text
    assert not any(REPLACEMENT in p for p in pieces) or REPLACEMENT in text


@PROFILE
@given(texts)
def test_token_by_token_equals_decode(tiny: Tokenizer, text: str) -> None:
    ids = tiny.encode(text, add_special_tokens=False)
    assert "".join(stream(tiny, ids)) == tiny.decode(ids)


@PROFILE
@given(split_bytes(), st.data())
def test_a_prompt_ending_mid_character_is_completed_by_the_output(tiny: Tokenizer, case: tuple[str, list[bytes]], data: st.DataObject) -> None:
    text, _ = case
    raw = text.encode("utf-8")
    cut = data.draw(st.integers(0, len(raw)))
    prompt, output = byte_level_ids(tiny, raw[:cut]), byte_level_ids(tiny, raw[cut:])
    start = cut
    while 0 < start < len(raw) and (raw[start] & 0xC0) == 0x80:  # back to the character's first byte
        start -= 1
    assert "".join(stream(tiny, output, prompt_ids=prompt)) == raw[start:].decode()
