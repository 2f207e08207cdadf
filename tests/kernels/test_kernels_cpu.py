"""The hand-written CPU kernels (kernels/csrc/cpu_kernels.cpp) against the torch references:
paged decode and prefill attention read in place on shuffled block tables, GQA, edge lengths,
shared prefix blocks, both dtypes; the KV cache write; a token's attention is the same bit for
bit decoded or prefilled; the sampler's row argmax gives torch.argmax's indices (ties, NaN, -inf)."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close, make_paged_kv

from kernels import cpu_build, cpu_ext
from kernels.decode_attention import paged_attention_decode_cpu, paged_attention_decode_reference
from kernels.kv_cache import reshape_and_cache_cpu, reshape_and_cache_reference
from kernels.prefill_attention import paged_attention_prefill_cpu, paged_attention_prefill_reference

if cpu_ext.ops() is None:
    if cpu_build._compiler() is None:
        pytest.skip("no C++ compiler: the engine uses the torch references", allow_module_level=True)
    pytest.fail("the CPU kernels are not built: `make setup` runs `python -m kernels.cpu_build`",
                pytrace=False)

BLOCK_SIZE = 16
EDGE_LENS = [1, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 2 * BLOCK_SIZE + 3, 300]
TOLERANCE = {torch.float32: (2e-6, 2e-6), torch.bfloat16: (1.6e-2, 1e-2)}  # bf16: one output rounding


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """The same cache as a view of head-major storage, the layout the engine allocates."""
    return cache.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)


def _cache(seq_lens, *, num_kv_heads, head_dim, dtype, seed, shared_prefix_blocks=0, layout=head_major):
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables = make_paged_kv(seq_lens, block_size=BLOCK_SIZE, num_kv_heads=num_kv_heads,
                                             head_dim=head_dim, dtype=dtype, generator=g,
                                             shared_prefix_blocks=shared_prefix_blocks)
    return layout(k_cache), layout(v_cache), tables, g


def _close(out, expected):
    rtol, atol = TOLERANCE[expected.dtype]
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out.float(), expected.float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_kv_heads,group,head_dim", [(2, 1, 32), (3, 3, 64), (1, 8, 128)])
@pytest.mark.parametrize("layout", [head_major, lambda c: c], ids=["head_major", "token_major"])
def test_decode_matches_reference(dtype, num_kv_heads, group, head_dim, layout) -> None:
    k_cache, v_cache, tables, g = _cache(EDGE_LENS, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                                         seed=group, layout=layout)
    q = torch.randn(len(EDGE_LENS), num_kv_heads * group, head_dim, generator=g).to(dtype)
    lens = torch.tensor(EDGE_LENS, dtype=torch.int32)
    expected = paged_attention_decode_reference(q, k_cache, v_cache, tables, lens, head_dim**-0.5)
    _close(paged_attention_decode_cpu(q, k_cache, v_cache, tables, lens, head_dim**-0.5), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shared_prefix_blocks", [0, 2])
def test_prefill_matches_reference(dtype, shared_prefix_blocks) -> None:
    """Chunks after cached context, whole prompts, one-token chunks and chunks longer than the
    kernel's 16-query tile, with prefix blocks shared between sequences."""
    seq_lens = [40, 17, 1, 300, 33]
    q_lens = [40, 5, 1, 37, 16]
    k_cache, v_cache, tables, g = _cache(seq_lens, num_kv_heads=3, head_dim=64, dtype=dtype, seed=7,
                                         shared_prefix_blocks=shared_prefix_blocks)
    q = torch.randn(sum(q_lens), 9, 64, generator=g).to(dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    expected = paged_attention_prefill_reference(q, k_cache, v_cache, tables, cu, lens, 0.125)
    _close(paged_attention_prefill_cpu(q, k_cache, v_cache, tables, cu, lens, 0.125), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_token_decoded_or_prefilled_gets_the_same_bits(dtype) -> None:
    seq_len = 45
    k_cache, v_cache, tables, g = _cache([seq_len], num_kv_heads=3, head_dim=64, dtype=dtype, seed=3)
    q = torch.randn(seq_len, 9, 64, generator=g).to(dtype)
    prefilled = paged_attention_prefill_cpu(q, k_cache, v_cache, tables, torch.tensor([0, seq_len], dtype=torch.int32),
                                            torch.tensor([seq_len], dtype=torch.int32), 0.125)
    for position in (0, 15, 16, 30, seq_len - 1):
        decoded = paged_attention_decode_cpu(q[position:position + 1], k_cache, v_cache, tables,
                                             torch.tensor([position + 1], dtype=torch.int32), 0.125)
        assert torch.equal(decoded[0], prefilled[position])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_write_matches_reference(dtype) -> None:
    g = torch.Generator().manual_seed(0)
    k_cache = head_major(torch.zeros(6, BLOCK_SIZE, 3, 64, dtype=dtype))
    v_cache = head_major(torch.zeros(6, BLOCK_SIZE, 3, 64, dtype=dtype))
    k, v = (torch.randn(5, 3, 64, generator=g).to(dtype) for _ in range(2))
    slots = torch.tensor([0, 17, 95, 40, 33])
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    reshape_and_cache_reference(k, v, expected_k, expected_v, slots)
    reshape_and_cache_cpu(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_bad_arguments_are_named() -> None:
    k_cache, v_cache, tables, g = _cache([3, 5], num_kv_heads=2, head_dim=32, dtype=torch.float32, seed=0)
    q = torch.randn(2, 4, 32, generator=g)
    lens = torch.tensor([3, 5], dtype=torch.int32)
    with pytest.raises(TypeError, match="block_tables must be int32"):
        paged_attention_decode_cpu(q, k_cache, v_cache, tables.long(), lens, 0.5)
    with pytest.raises(TypeError, match="k_cache is torch.bfloat16 but q is torch.float32"):
        paged_attention_decode_cpu(q, k_cache.bfloat16(), v_cache.bfloat16(), tables, lens, 0.5)
    with pytest.raises(ValueError, match="q.shape\\[2\\]"):
        paged_attention_decode_cpu(q, k_cache[..., :16], v_cache[..., :16], tables, lens, 0.5)


def test_traces_as_opaque_ops_under_torch_compile() -> None:
    """The fake implementations let torch.compile put the ops in a graph (no graph break)."""
    k_cache, v_cache, tables, g = _cache([20, 3], num_kv_heads=2, head_dim=32, dtype=torch.float32, seed=1)
    q = torch.randn(2, 4, 32, generator=g)
    lens = torch.tensor([20, 3], dtype=torch.int32)

    def step(q, k_cache, v_cache):
        out = paged_attention_decode_cpu(q, k_cache, v_cache, tables, lens, 0.25)
        return out * 2

    compiled = torch.compile(step, backend="eager", fullgraph=True)
    assert_close(compiled(q, k_cache, v_cache), step(q, k_cache, v_cache), "attention")


@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 33, 49152])
def test_argmax_rows_gives_torchs_indices(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randint(-3, 3, (6, vocab), generator=g).float()  # many ties: the first index wins
    logits[1, vocab // 2] = float("nan")
    logits[2] = float("-inf")
    logits[3, -1] = logits[3, 0] = float("nan")
    logits[4, -1] = float("inf")
    for matrix in (logits, logits[:, : max(vocab - 1, 1)]):  # rows not a whole number of vectors apart
        assert torch.equal(cpu_ext.require_ops().argmax_rows(matrix), matrix.argmax(dim=-1))
