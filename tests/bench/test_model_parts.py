"""bench/model_parts.py decodes GGUF blocks exactly as gguf-py does (then rounds to bfloat16 as
the converted checkpoint was), and finds the row order a checkpoint keeps."""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from model_parts import _row_order, decode_blocks  # noqa: E402


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_blocks_decode_as_gguf_does(kind: str) -> None:
    values = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32) * 3
    qtype = gguf.GGMLQuantizationType[kind]
    raw = gguf.quants.quantize(values, qtype)
    expected = torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(6, 96)).to(torch.bfloat16)
    decoded = decode_blocks(torch.from_numpy(raw), kind, (6, 96))
    assert torch.equal(decoded.view(torch.int16), expected.view(torch.int16))


def test_row_order_finds_the_permutation() -> None:
    rows = torch.randn(8, 32).to(torch.bfloat16)
    order = torch.randperm(8)
    assert torch.equal(rows[_row_order(rows, rows[order])], rows[order])
    assert torch.equal(_row_order(rows, rows), torch.arange(8))
