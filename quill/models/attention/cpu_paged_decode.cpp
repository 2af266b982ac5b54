// Decode attention over a paged K,V cache on the CPU: one query token per sequence, keys and values read in
// place from the cache blocks the sequence's table lists (no copy into contiguous buffers, no padding).
//
// The step is bound by reading the cache, so the loops follow its layout: a block holds its tokens one after the
// other, each token's heads side by side, and a work item walks its tokens in that order, taking all its heads
// from each token's row. (Walking one head at a time jumps a whole row between reads, which the CPU's
// prefetchers do not follow: 13 against 25 GB/s here.) An item is a sequence, or a share of its heads where
// there are too few sequences to keep every thread busy; threads take the next item as they finish, since
// sequences differ in length. Caches are float32 or bfloat16 (read as stored, widened as they are read); the
// arithmetic is float32's either way. With AVX-512, heads of 64 or 128 values take a path of their own
// (attend_item16): 16 heads' dot products finished together, the softmax across heads in each vector, bfloat16
// multiplied by AVX-512-BF16's dot product: bfloat16 10-19% faster, float32 up to 8% (`python -m
// benchmarks.cpu_attention`: an AMX Xeon, 1 and 2 threads, the cache in and out of the CPU's caches).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

// Rows read this many tokens ahead are asked for in advance: a sequence's blocks lie anywhere in the cache, and the
// hardware prefetchers stop at each block's page boundaries (a 12-layer cache is far out of the CPU's caches).
constexpr int64_t AHEAD = 8;

static inline float widen(float x) { return x; }

// bfloat16 is float32's upper half: a shift the compiler vectorises, where c10::BFloat16's conversion stays scalar
static inline float widen(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#ifdef __AVX512F__
static inline __m512 widen16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 widen16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
#endif

// q . k over D. An `omp simd` reduction leaves its 16 lanes to a chain of scalar additions through memory (a quarter of
// the kernel's time), so with AVX-512 the 16 lanes are added up by its reduction sequence instead.
template <typename T_>
static inline float dot(const float* q, const T_* k, int64_t D) {
#ifdef __AVX512F__
  if (D % 16 == 0) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), widen16(k + d), acc);
    return _mm512_reduce_add_ps(acc);
  }
#endif
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < D; ++d) sum += q[d] * widen(k[d]);
  return sum;
}

#ifdef __AVX512F__
// acc[h] = sum over t of p[t][h] v[t][h] (p is (len, 16)), for float32 heads of C * 16 values: a few heads at a time,
// their sums held in 16 registers over all tokens (summed in memory they cost a load and a store per vector per
// token and head).
// `row(V, t)` is token t's first K,V head of the item; `kv[h]` head h's K,V head, relative to it.
template <int C, typename T_, typename Row, typename Prefetch>
static void weighted_values(const Row& row, const Prefetch& prefetch, const T_* V, const float* p, int64_t len,
                            int64_t heads, const int64_t* kv, float* acc) {
  constexpr int GROUP = 16 / C;
  for (int64_t h0 = 0; h0 < heads; h0 += GROUP) {
    const int n = static_cast<int>(std::min<int64_t>(GROUP, heads - h0));
    __m512 sum[GROUP][C];
    for (int i = 0; i < GROUP; ++i)
      for (int c = 0; c < C; ++c) sum[i][c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; ++t) {
      if (h0 == 0) prefetch(V, t + AHEAD);
      const T_* v = row(V, t);
      for (int i = 0; i < GROUP && i < n; ++i) {
        const __m512 weight = _mm512_set1_ps(p[t * 16 + h0 + i]);
        const T_* vh = v + kv[h0 + i] * C * 16;
        for (int c = 0; c < C; ++c) sum[i][c] = _mm512_fmadd_ps(weight, widen16(vh + c * 16), sum[i][c]);
      }
    }
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + ((h0 + i) * C + c) * 16, sum[i][c]);
  }
}

// v[j]'s 16 lanes summed into lane j of one vector: 48 instructions for 16 sums, where _mm512_reduce_add_ps
// spends about 8 on each
static inline __m512 sum16(const __m512* v) {
  __m512 x[8], y[4];
  for (int i = 0; i < 8; ++i)  // per 128 bits: v[2i]'s partial sums in places 0, 2; v[2i+1]'s in 1, 3
    x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per 128 bits: the sums of v[4i .. 4i+3] over those 128 bits
    const __m512d a = _mm512_castps_pd(x[2 * i]), b = _mm512_castps_pd(x[2 * i + 1]);
    y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88), _mm512_shuffle_f32x4(y[0], y[1], 0xDD));
  const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], 0x88), _mm512_shuffle_f32x4(y[2], y[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
}

// q * k over D values, lane-wise (summed across lanes later, 16 at a time); bfloat16 pairs multiplied and added by
// AVX-512-BF16's dot product (float32 products and sums, no widening) where the CPU has it
static inline __m512 products(const float* q, const float* k, int64_t D) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k + d), acc);
  return acc;
}
static inline __m512 products(const uint16_t* q, const uint16_t* k, int64_t D) {
  __m512 acc = _mm512_setzero_ps();
#ifdef __AVX512BF16__
  for (int64_t d = 0; d < D; d += 32)
    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(q + d), (__m512bh)_mm512_loadu_si512(k + d));
#else
  for (int64_t d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(widen16(q + d), widen16(k + d), acc);
#endif
  return acc;
}

// e^x lane-wise for x <= 0, as exp_nonpositive below
static inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  for (const float c : {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

// weighted_values for bfloat16 heads of C * 32 values: each 32-value load split into its even and odd values (a
// shift and a mask; no widening shuffles), summed apart and put back in order at the end. `p` is (len, 16).
template <int C, typename Row, typename Prefetch>
static void weighted_values_bf16(const Row& row, const Prefetch& prefetch, const uint16_t* V, const float* p,
                                 int64_t len, int64_t heads, const int64_t* kv, float* acc) {
  constexpr int GROUP = 8 / C;
  const __m512i odd = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t h0 = 0; h0 < heads; h0 += GROUP) {
    const int n = static_cast<int>(std::min<int64_t>(GROUP, heads - h0));
    __m512 even_sum[GROUP][C], odd_sum[GROUP][C];
    for (int i = 0; i < GROUP; ++i)
      for (int c = 0; c < C; ++c) even_sum[i][c] = odd_sum[i][c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; ++t) {
      if (h0 == 0) prefetch(V, t + AHEAD);
      const uint16_t* v = row(V, t);
      for (int i = 0; i < GROUP && i < n; ++i) {
        const __m512 weight = _mm512_set1_ps(p[t * 16 + h0 + i]);
        const uint16_t* vh = v + kv[h0 + i] * C * 32;
        for (int c = 0; c < C; ++c) {
          const __m512i x = _mm512_loadu_si512(vh + c * 32);
          even_sum[i][c] = _mm512_fmadd_ps(weight, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), even_sum[i][c]);
          odd_sum[i][c] = _mm512_fmadd_ps(weight, _mm512_castsi512_ps(_mm512_and_si512(x, odd)), odd_sum[i][c]);
        }
      }
    }
    alignas(64) float e[16], o[16];
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < C; ++c) {
        _mm512_store_ps(e, even_sum[i][c]);
        _mm512_store_ps(o, odd_sum[i][c]);
        float* a = acc + (h0 + i) * C * 32 + c * 32;
        for (int j = 0; j < 16; ++j) a[2 * j] = e[j], a[2 * j + 1] = o[j];
      }
  }
}

// One item's attention, 16 heads at a time (heads of 64 or 128 values): scores kept (len, 16), token-major, so that
// one sum16 finishes a token's 16 dot products and the softmax runs across the heads in each vector. `kv[h]`: head
// h's K,V head, relative to the item's first; `q` the item's queries as the model gave them.
template <typename T_, typename Row, typename Prefetch>
static void attend_item16(const Row& row, const Prefetch& prefetch, const T_* K, const T_* V, const T_* q,
                          int64_t len, int64_t heads, int64_t D, float s, std::vector<float>& scores,
                          const int64_t* kv, float* acc) {
  scores.resize(len * 16);
  float* p = scores.data();
  for (int64_t c0 = 0; c0 < heads; c0 += 16) {
    const int64_t n = std::min<int64_t>(16, heads - c0);
    for (int64_t t = 0; t < AHEAD; ++t) prefetch(K, t);
    for (int64_t t = 0; t < len; ++t) {
      prefetch(K, t + AHEAD);
      const T_* k = row(K, t);
      __m512 v[16];
      for (int64_t i = 0; i < 16; ++i)
        v[i] = i < n ? products(q + (c0 + i) * D, k + kv[c0 + i] * D, D) : _mm512_setzero_ps();
      _mm512_storeu_ps(p + t * 16, _mm512_mul_ps(sum16(v), _mm512_set1_ps(s)));
    }
    __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; ++t) top = _mm512_max_ps(top, _mm512_loadu_ps(p + t * 16));
    for (int64_t t = 0; t < len; ++t) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p + t * 16), top));
      _mm512_storeu_ps(p + t * 16, e);
      sum = _mm512_add_ps(sum, e);
    }
    const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.f), sum);
    for (int64_t t = 0; t < len; ++t) _mm512_storeu_ps(p + t * 16, _mm512_mul_ps(_mm512_loadu_ps(p + t * 16), inv));
    for (int64_t t = 0; t < AHEAD; ++t) prefetch(V, t);
    float* out = acc + c0 * D;
    if constexpr (std::is_same_v<T_, uint16_t>) {
      if (D == 64) weighted_values_bf16<2>(row, prefetch, V, p, len, n, kv + c0, out);
      else weighted_values_bf16<4>(row, prefetch, V, p, len, n, kv + c0, out);
    } else {
      if (D == 64) weighted_values<4>(row, prefetch, V, p, len, n, kv + c0, out);
      else weighted_values<8>(row, prefetch, V, p, len, n, kv + c0, out);
    }
  }
}
#endif

// float32 to bfloat16, rounding to nearest even (the scores of a softmax row are finite)
static inline void narrow(float x, float* out) { *out = x; }
static inline void narrow(float x, uint16_t* out) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  *out = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// e^x for x <= 0 (softmax's shifted scores): 2^n * 2^f, 2^f by a degree-6 polynomial on [-0.5, 0.5]; ~2 ulp, in
// plain arithmetic the compiler vectorises (std::exp stays a scalar call)
static inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float t = x * 1.44269504088896341f;
  const float n = std::nearbyint(t);
  const float f = (t - n) * 0.693147180559945309f;
  float p = 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// q (B, H, D), K, V (N, S, KVH, D) contiguous, in one dtype; T (B, W) block tables; L (B,) keys each sequence
// attends to (its position + 1); O (B, H, D) in that dtype: softmax(q k^T * scale) v per head, grouped-query heads
// sharing their K,V head.
template <typename T_>
static void attend(const T_* Q, const T_* K, const T_* V, const int64_t* T, const int64_t* L, T_* O,
                   int64_t B, int64_t H, int64_t D, int64_t S, int64_t KVH, int64_t W, double scale) {
  const int64_t G = H / KVH, token_stride = KVH * D, block_stride = S * KVH * D;
  const float s = static_cast<float>(scale);
  // four items a thread at least, so that uneven lengths even out
  const int64_t threads = at::get_num_threads();
  const int64_t wanted = std::min(KVH, (4 * threads + B - 1) / B);  // shares of a sequence's heads
  const int64_t share_heads = (KVH + wanted - 1) / wanted;  // K,V heads of one share
  const int64_t shares = (KVH + share_heads - 1) / share_heads;  // as many as leave none empty
  const int64_t items = B * shares;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(threads, items), 1, [&](int64_t, int64_t) {
    std::vector<float> qf, scores, acc;
    std::vector<int64_t> kv_of;
    for (int64_t i = next++; i < items; i = next++) {
      const int64_t b = i / shares, g0 = (i % shares) * share_heads, g1 = std::min(KVH, g0 + share_heads);
      const int64_t h0 = g0 * G, heads = (g1 - g0) * G, len = std::min(L[b], W * S);
      // token t's K or V heads g0..g1 (heads sharing a K,V head are walked beside it: no division per head)
      const int64_t row_bytes = (g1 - g0) * D * static_cast<int64_t>(sizeof(T_));
      auto row = [&](const T_* cache, int64_t t) { return cache + T[b * W + t / S] * block_stride +
                                                           (t % S) * token_stride + g0 * D; };
      auto prefetch = [&](const T_* cache, int64_t t) {
        if (t >= len) return;
        const char* p = reinterpret_cast<const char*>(row(cache, t));
        for (int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(p + o);
      };
#ifdef __AVX512F__
      if (D == 64 || D == 128) {
        kv_of.resize(heads);
        for (int64_t h = 0; h < heads; ++h) kv_of[h] = h / G;
        acc.resize(heads * D);
        attend_item16(row, prefetch, K, V, Q + (b * H + h0) * D, len, heads, D, s, scores, kv_of.data(), acc.data());
        for (int64_t j = 0; j < heads * D; ++j) narrow(acc[j], O + (b * H + h0) * D + j);
        continue;
      }
#endif
      scores.resize(heads * len);
      qf.resize(heads * D);  // the item's queries, widened once
      for (int64_t j = 0; j < heads * D; ++j) qf[j] = widen(Q[(b * H + h0) * D + j]);
      const float* qb = qf.data();
      for (int64_t t = 0; t < AHEAD; ++t) prefetch(K, t);
      for (int64_t t = 0; t < len; ++t) {
        prefetch(K, t + AHEAD);
        const T_* k = row(K, t);
        for (int64_t kv = 0, h = 0; kv < g1 - g0; ++kv) {
          const T_* kh = k + kv * D;
          for (int64_t g = 0; g < G; ++g, ++h) {
            scores[h * len + t] = dot(qb + h * D, kh, D) * s;
          }
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* row = scores.data() + h * len;
        float top = -std::numeric_limits<float>::infinity(), sum = 0.f;
        for (int64_t t = 0; t < len; ++t) top = std::max(top, row[t]);
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; ++t) sum += (row[t] = exp_nonpositive(row[t] - top));
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < len; ++t) row[t] *= inv;
      }
      acc.resize(heads * D);
      for (int64_t t = 0; t < AHEAD; ++t) prefetch(V, t);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < len; ++t) {
        prefetch(V, t + AHEAD);
        const T_* v = row(V, t);
        for (int64_t kv = 0, h = 0; kv < g1 - g0; ++kv) {
          const T_* vh = v + kv * D;
          for (int64_t g = 0; g < G; ++g, ++h) {
            const float p = scores[h * len + t];
            float* a = acc.data() + h * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) a[d] += p * widen(vh[d]);
          }
        }
      }
      for (int64_t j = 0; j < heads * D; ++j) narrow(acc[j], O + (b * H + h0) * D + j);
    }
  });
}

// q (B, H, D); k_cache, v_cache (N, S, KVH, D) contiguous, float32 or bfloat16 alike; tables (B, W) int64; lengths
// (B,) int64. Returns (B, H, D) in the caches' dtype (q is taken in it).
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor tables, torch::Tensor lengths, double scale) {
  const auto kind = k_cache.scalar_type();
  TORCH_CHECK((kind == torch::kFloat || kind == torch::kBFloat16) && v_cache.scalar_type() == kind,
              "float32 or bfloat16 caches only");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the cache must be contiguous");
  q = q.to(kind).contiguous();  // in the cache's dtype, as the model's own queries are
  tables = tables.contiguous();
  lengths = lengths.contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t S = k_cache.size(1), KVH = k_cache.size(2), W = tables.size(1);
  TORCH_CHECK(H % KVH == 0 && k_cache.size(3) == D, "query and cache heads do not match");
  auto out = torch::empty_like(q);
  if (B == 0) return out;
  const int64_t* T = tables.data_ptr<int64_t>();
  const int64_t* L = lengths.data_ptr<int64_t>();
  if (kind == torch::kFloat) {
    attend(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), T, L, out.data_ptr<float>(),
           B, H, D, S, KVH, W, scale);
  } else {
    const auto bits = [](torch::Tensor& x) { return reinterpret_cast<uint16_t*>(x.data_ptr<at::BFloat16>()); };
    attend<uint16_t>(bits(q), bits(k_cache), bits(v_cache), T, L, bits(out), B, H, D, S, KVH, W, scale);
  }
  return out;
}

// The GIL is let go while the kernel runs, so that the server's HTTP thread answers meanwhile.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "decode attention over a paged K,V cache (CPU)",
        pybind11::call_guard<pybind11::gil_scoped_release>());
}
