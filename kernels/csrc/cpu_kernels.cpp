// CPU kernels of the engine's decode step, registered as torch ops `switchyard_cpu::*`.
// Each has a plain-torch reference of the same signature in kernels/ (decode_attention.py,
// kv_cache.py); kernels/cpu_build.py compiles this file once per machine, and kernels/cpu.py
// loads it (or falls back to the references).
//
// The attention ops read K and V where they lie in the paged cache, position by position, with no
// gathered copy: one task per (run of query tokens of a sequence, kv head) computes the scores of
// that kv head's Hq / Hkv query heads against each cached position, a float32 softmax, then the
// weighted sum of the value rows. float32 math, the weights rounded to q's dtype before that sum
// (as sdpa's CPU kernel does), one rounding of the output to q's dtype. Decode runs are single
// tokens; prefill runs are tiles of a chunk's tokens, which share each K/V row read. A query's
// arithmetic is the same in both, so decode and prefill agree bit for bit on the same token.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

inline void to_float(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

inline void to_float(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    uint32_t wide = static_cast<uint32_t>(bits[i]) << 16;
    float value;
    std::memcpy(&value, &wide, sizeof(value));
    dst[i] = value;
  }
}

inline void from_float(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

inline void from_float(const float* src, c10::BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = c10::BFloat16(src[i]);  // round to nearest even
}

// exp(x) for x <= 0 (softmax after subtracting the max), vectorizable: 2^n * 2^f with f in
// [-0.5, 0.5] by a degree-7 Taylor polynomial (relative error < 1e-7); below -87 it returns ~0.
inline float exp_nonpositive(float x) {
  const float t = std::max(x, -87.0f) * 1.44269504088896341f;
  const float n = std::nearbyint(t);
  const float y = (t - n) * 0.693147180559945309f;
  float p = 1.f / 5040.f;
  p = p * y + 1.f / 720.f;
  p = p * y + 1.f / 120.f;
  p = p * y + 1.f / 24.f;
  p = p * y + 1.f / 6.f;
  p = p * y + 0.5f;
  p = p * y + 1.f;
  p = p * y + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Row-major views of the caches and the output, as raw pointers and strides.
template <typename T>
struct Operands {
  const T* q;
  const T* k;
  const T* v;
  T* out;
  int64_t q_st, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_st, o_sh;
  int64_t head_dim, block_size, group;
  float scale;

  Operands(const at::Tensor& q_, const at::Tensor& k_cache, const at::Tensor& v_cache, at::Tensor& out_, double s)
      : q(q_.data_ptr<T>()), k(k_cache.data_ptr<T>()), v(v_cache.data_ptr<T>()), out(out_.data_ptr<T>()),
        q_st(q_.stride(0)), q_sh(q_.stride(1)), k_sb(k_cache.stride(0)), k_ss(k_cache.stride(1)),
        k_sh(k_cache.stride(2)), v_sb(v_cache.stride(0)), v_ss(v_cache.stride(1)), v_sh(v_cache.stride(2)),
        o_st(out_.stride(0)), o_sh(out_.stride(1)), head_dim(q_.size(2)), block_size(k_cache.size(1)),
        group(q_.size(1) / k_cache.size(2)), scale(static_cast<float>(s)) {}
};

struct Scratch {
  std::vector<float> queries, row, acc, scores, denom;
};

// Query tokens [first_token, first_token + num_tokens) of one sequence, one kv head: token i of
// the run attends to cache positions [0, first_len + i). Each of its rows (token x query head of
// the group) is computed the same way whatever run it is part of, so a token's output does not
// depend on whether it was decoded alone or prefilled in a chunk.
template <typename T>
void attend(const Operands<T>& o, const int32_t* table, int64_t kv_head, int64_t first_token, int64_t num_tokens,
            int64_t first_len, Scratch& s) {
  const int64_t d_len = o.head_dim, group = o.group, rows = num_tokens * group;
  const int64_t max_len = first_len + num_tokens - 1;
  s.queries.resize(rows * d_len);
  s.row.resize(d_len);
  s.acc.assign(rows * d_len, 0.f);
  s.scores.resize(rows * max_len);
  s.denom.resize(rows);
  for (int64_t i = 0; i < num_tokens; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      float* query = s.queries.data() + (i * group + g) * d_len;
      to_float(o.q + (first_token + i) * o.q_st + (kv_head * group + g) * o.q_sh, query, d_len);
      for (int64_t d = 0; d < d_len; ++d) query[d] *= o.scale;
    }
  }
  for (int64_t pos = 0; pos < max_len; ++pos) {
    const int64_t block = table[pos / o.block_size];
    to_float(o.k + block * o.k_sb + (pos % o.block_size) * o.k_ss + kv_head * o.k_sh, s.row.data(), d_len);
    for (int64_t r = std::max<int64_t>(0, pos - first_len + 1) * group; r < rows; ++r) {
      s.scores[r * max_len + pos] = dot(s.queries.data() + r * d_len, s.row.data(), d_len);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = first_len + r / group;
    float* score = s.scores.data() + r * max_len;
    float top = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : top)
    for (int64_t pos = 0; pos < len; ++pos) top = std::max(top, score[pos]);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t pos = 0; pos < len; ++pos) {
      score[pos] = exp_nonpositive(score[pos] - top);
      sum += score[pos];
    }
    s.denom[r] = sum;
    // the weights the values are summed with are rounded to T (as sdpa's CPU kernel and the
    // Triton kernels do); the sum above, of the unrounded ones, divides at the end
    if constexpr (!std::is_same_v<T, float>) {
      for (int64_t pos = 0; pos < len; ++pos) score[pos] = static_cast<float>(static_cast<T>(score[pos]));
    }
  }
  for (int64_t pos = 0; pos < max_len; ++pos) {
    const int64_t block = table[pos / o.block_size];
    to_float(o.v + block * o.v_sb + (pos % o.block_size) * o.v_ss + kv_head * o.v_sh, s.row.data(), d_len);
    for (int64_t r = std::max<int64_t>(0, pos - first_len + 1) * group; r < rows; ++r) {
      axpy(s.scores[r * max_len + pos], s.row.data(), s.acc.data() + r * d_len, d_len);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* acc = s.acc.data() + r * d_len;
    const float inv = 1.f / s.denom[r];
    for (int64_t d = 0; d < d_len; ++d) acc[d] *= inv;
    const int64_t token = first_token + r / group, head = kv_head * group + r % group;
    from_float(acc, o.out + token * o.o_st + head * o.o_sh, d_len);
  }
}

#if defined(__AVX512F__)
// `attend` with AVX-512 registers, for head_dim = 16 * NV: the same arithmetic per row whatever
// run or register block it falls in (dots as NV multiply-adds then one horizontal sum, a masked
// vector softmax, the weighted sum of value rows in position order), so a token decoded and the
// same token prefilled still agree bit for bit. Rows are taken RB at a time, their queries and
// accumulators held in registers, so each K or V row read is converted once per RB rows. A row
// of the block whose causal length ends earlier gets weight 0 past its end (adding 0 * v leaves
// its sum unchanged).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

inline __m512 load16(const c10::BFloat16* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }

// round to nearest even, as c10::BFloat16(float) does for finite values
inline __m512i bf16_round_bits(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
}

inline __m512 round_to_bf16(__m512 x) {
  return _mm512_castsi512_ps(_mm512_and_si512(bf16_round_bits(x), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

inline void store16(c10::BFloat16* p, __m512 x) {
  const __m256i half = _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_round_bits(x), 16));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), half);
}

// exp_nonpositive, 16 lanes at a time
inline __m512 exp_nonpositive16(__m512 x) {
  const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 y = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

template <typename T, int NV>
void attend_vec(const Operands<T>& o, const int32_t* table, int64_t kv_head, int64_t first_token, int64_t num_tokens,
                int64_t first_len, Scratch& s) {
  constexpr int64_t D = 16 * NV;
  constexpr int64_t RB = NV <= 4 ? 4 : 2;  // rows per register block: RB * NV accumulators
  const int64_t group = o.group, rows = num_tokens * group;
  const int64_t max_len = first_len + num_tokens - 1;
  const int64_t stride = (max_len + 15) / 16 * 16;  // a row of scores, padded to whole vectors
  s.queries.resize(rows * D);
  s.scores.resize(rows * stride);
  s.denom.resize(rows);
  const __m512 scale = _mm512_set1_ps(o.scale);
  for (int64_t r = 0; r < rows; ++r) {
    const T* q = o.q + (first_token + r / group) * o.q_st + (kv_head * group + r % group) * o.q_sh;
    for (int j = 0; j < NV; ++j) store16(s.queries.data() + r * D + 16 * j, _mm512_mul_ps(load16(q + 16 * j), scale));
  }
  auto k_row = [&](int64_t pos) {
    return o.k + table[pos / o.block_size] * o.k_sb + (pos % o.block_size) * o.k_ss + kv_head * o.k_sh;
  };
  auto v_row = [&](int64_t pos) {
    return o.v + table[pos / o.block_size] * o.v_sb + (pos % o.block_size) * o.v_ss + kv_head * o.v_sh;
  };
  for (int64_t r0 = 0; r0 < rows; r0 += RB) {
    const int64_t nr = std::min(RB, rows - r0);
    const int64_t end = first_len + (r0 + nr - 1) / group;  // the block's longest row
    __m512 q[RB][NV];
    for (int64_t r = 0; r < RB; ++r)
      for (int j = 0; j < NV; ++j) q[r][j] = r < nr ? _mm512_loadu_ps(s.queries.data() + (r0 + r) * D + 16 * j)
                                                    : _mm512_setzero_ps();
    for (int64_t pos = 0; pos < end; ++pos) {
      const T* kp = k_row(pos);
      __m512 k[NV];
      for (int j = 0; j < NV; ++j) k[j] = load16(kp + 16 * j);
      for (int64_t r = 0; r < RB; ++r) {
        if (r >= nr) break;
        __m512 acc = _mm512_mul_ps(q[r][0], k[0]);
        for (int j = 1; j < NV; ++j) acc = _mm512_fmadd_ps(q[r][j], k[j], acc);
        s.scores[(r0 + r) * stride + pos] = _mm512_reduce_add_ps(acc);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = first_len + r / group;
    float* score = s.scores.data() + r * stride;
    __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t pos = 0; pos < len; pos += 16) {
      const __mmask16 m = len - pos >= 16 ? __mmask16(0xffff) : __mmask16((1u << (len - pos)) - 1);
      top = _mm512_mask_max_ps(top, m, top, _mm512_maskz_loadu_ps(m, score + pos));
    }
    const __m512 top_all = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t pos = 0; pos < stride; pos += 16) {
      const int64_t left = len - pos;
      const __mmask16 m = left >= 16 ? __mmask16(0xffff) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1);
      const __m512 e = _mm512_maskz_mov_ps(m, exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(score + pos), top_all)));
      sum = _mm512_add_ps(sum, e);
      // the weights the values are summed with are rounded to T (see `attend`); 0 past the row's end
      _mm512_storeu_ps(score + pos, std::is_same_v<T, float> ? e : round_to_bf16(e));
    }
    s.denom[r] = _mm512_reduce_add_ps(sum);
  }
  for (int64_t r0 = 0; r0 < rows; r0 += RB) {
    const int64_t nr = std::min(RB, rows - r0);
    const int64_t end = first_len + (r0 + nr - 1) / group;
    __m512 acc[RB][NV];
    for (int64_t r = 0; r < RB; ++r)
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t pos = 0; pos < end; ++pos) {
      const T* vp = v_row(pos);
      __m512 v[NV];
      for (int j = 0; j < NV; ++j) v[j] = load16(vp + 16 * j);
      for (int64_t r = 0; r < RB; ++r) {
        if (r >= nr) break;
        const __m512 w = _mm512_set1_ps(s.scores[(r0 + r) * stride + pos]);
        for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_fmadd_ps(w, v[j], acc[r][j]);
      }
    }
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t row = r0 + r, token = first_token + row / group, head = kv_head * group + row % group;
      const __m512 inv = _mm512_set1_ps(1.f / s.denom[row]);
      T* out = o.out + token * o.o_st + head * o.o_sh;
      for (int j = 0; j < NV; ++j) store16(out + 16 * j, _mm512_mul_ps(acc[r][j], inv));
    }
  }
}
#endif

// `attend_vec` where the head size has a vector version, `attend` otherwise.
template <typename T>
void attend_any(const Operands<T>& o, const int32_t* table, int64_t kv_head, int64_t first_token, int64_t num_tokens,
                int64_t first_len, Scratch& s) {
#if defined(__AVX512F__)
  switch (o.head_dim) {
    case 32: return attend_vec<T, 2>(o, table, kv_head, first_token, num_tokens, first_len, s);
    case 64: return attend_vec<T, 4>(o, table, kv_head, first_token, num_tokens, first_len, s);
    case 128: return attend_vec<T, 8>(o, table, kv_head, first_token, num_tokens, first_len, s);
    default: break;
  }
#endif
  attend(o, table, kv_head, first_token, num_tokens, first_len, s);
}

// A run of query tokens of one sequence (see `attend`).
struct Run {
  int64_t seq, first_token, num_tokens, first_len;
};

template <typename T>
void attend_runs(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                 const at::Tensor& block_tables, const std::vector<Run>& runs, double scale, at::Tensor& out) {
  const Operands<T> o(q, k_cache, v_cache, out, scale);
  const int64_t num_kv_heads = k_cache.size(2);
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t table_stride = block_tables.stride(0);
  at::parallel_for(0, static_cast<int64_t>(runs.size()) * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t task = begin; task < end; ++task) {
      const Run& run = runs[task / num_kv_heads];
      attend_any(o, tables + run.seq * table_stride, task % num_kv_heads, run.first_token, run.num_tokens,
             run.first_len, scratch);
    }
  });
}

void check_attention_args(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& block_tables, const at::Tensor& seq_lens) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "bad shapes");
  TORCH_CHECK(q.stride(2) == 1 && k_cache.stride(3) == 1 && v_cache.stride(3) == 1, "head dim must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt, "int32 tables and lens");
  TORCH_CHECK(block_tables.stride(1) == 1 && seq_lens.is_contiguous(), "tables rows and lens contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(), "one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "float32 or bfloat16");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads a multiple of kv heads");
}

at::Tensor run_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                         const at::Tensor& block_tables, const std::vector<Run>& runs, double scale) {
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (q.scalar_type() == at::kFloat) {
    attend_runs<float>(q, k_cache, v_cache, block_tables, runs, scale, out);
  } else {
    attend_runs<c10::BFloat16>(q, k_cache, v_cache, block_tables, runs, scale, out);
  }
  return out;
}

at::Tensor paged_attention_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale) {
  check_attention_args(q, k_cache, v_cache, block_tables, seq_lens);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  std::vector<Run> runs(q.size(0));
  for (int64_t b = 0; b < q.size(0); ++b) runs[b] = Run{b, b, 1, lens[b]};
  return run_attention(q, k_cache, v_cache, block_tables, runs, scale);
}

constexpr int64_t kPrefillTile = 16;  // query tokens of one sequence that share each K/V row read

at::Tensor paged_attention_prefill(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                   const at::Tensor& block_tables, const at::Tensor& cu_seqlens_q,
                                   const at::Tensor& seq_lens, double scale) {
  check_attention_args(q, k_cache, v_cache, block_tables, seq_lens);
  TORCH_CHECK(cu_seqlens_q.scalar_type() == at::kInt && cu_seqlens_q.is_contiguous(), "int32 cu_seqlens_q");
  const int32_t* cu = cu_seqlens_q.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  std::vector<Run> runs;
  for (int64_t b = 0; b < seq_lens.size(0); ++b) {
    const int64_t q_len = cu[b + 1] - cu[b], context = lens[b] - q_len;
    for (int64_t i = 0; i < q_len; i += kPrefillTile) {
      runs.push_back(Run{b, cu[b] + i, std::min(kPrefillTile, q_len - i), context + i + 1});
    }
  }
  at::Tensor out = run_attention(q, k_cache, v_cache, block_tables, runs, scale);
  const int64_t covered = cu[seq_lens.size(0)];  // rows past the last sequence's (padding) get zeros
  if (covered < q.size(0)) out.narrow(0, covered, q.size(0) - covered).zero_();
  return out;
}

template <typename T>
void cache_kernel(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
                  const at::Tensor& slot_mapping) {
  const int64_t num_tokens = k.size(0), num_kv_heads = k.size(1), head_dim = k.size(2);
  const int64_t block_size = k_cache.size(1);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const T* k_ptr = k.data_ptr<T>();
  const T* v_ptr = v.data_ptr<T>();
  T* kc = k_cache.data_ptr<T>();
  T* vc = v_cache.data_ptr<T>();
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slots[t];
    const int64_t block = slot / block_size, offset = slot % block_size;
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      std::memcpy(kc + block * k_cache.stride(0) + offset * k_cache.stride(1) + h * k_cache.stride(2),
                  k_ptr + t * k.stride(0) + h * k.stride(1), head_dim * sizeof(T));
      std::memcpy(vc + block * v_cache.stride(0) + offset * v_cache.stride(1) + h * v_cache.stride(2),
                  v_ptr + t * v.stride(0) + h * v.stride(1), head_dim * sizeof(T));
    }
  }
}

void reshape_and_cache(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
                       const at::Tensor& slot_mapping) {
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes() && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "bad shapes");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1 && k_cache.stride(3) == 1 && v_cache.stride(3) == 1,
              "head dim must be contiguous");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(), "int64 slot_mapping");
  TORCH_CHECK(k.scalar_type() == k_cache.scalar_type() && v.scalar_type() == v_cache.scalar_type() &&
                  k.scalar_type() == v.scalar_type(), "one dtype");
  if (k.scalar_type() == at::kFloat) {
    cache_kernel<float>(k, v, k_cache, v_cache, slot_mapping);
  } else {
    TORCH_CHECK(k.scalar_type() == at::kBFloat16, "float32 or bfloat16");
    cache_kernel<c10::BFloat16>(k, v, k_cache, v_cache, slot_mapping);
  }
}

}  // namespace

TORCH_LIBRARY(switchyard_cpu, m) {
  m.def("paged_attention_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
        "float scale) -> Tensor");
  m.def("paged_attention_prefill(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor cu_seqlens_q, Tensor seq_lens, float scale) -> Tensor");
  m.def("reshape_and_cache(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(switchyard_cpu, CPU, m) {
  m.impl("paged_attention_decode", &paged_attention_decode);
  m.impl("paged_attention_prefill", &paged_attention_prefill);
  m.impl("reshape_and_cache", &reshape_and_cache);
}
