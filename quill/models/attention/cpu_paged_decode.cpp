// Decode attention over a paged K,V cache on the CPU: one query token per sequence, keys and values read in
// place from the cache blocks the sequence's table lists (no copy into contiguous buffers, no padding).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

// q (B, H, D); k_cache, v_cache (N, S, KVH, D) contiguous; tables (B, W) int64; lengths (B,) int64: keys each
// sequence attends to (its position + 1). Returns (B, H, D): softmax(q k^T * scale) v per head, grouped-query
// heads sharing their K,V head.
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor tables, torch::Tensor lengths, double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat && k_cache.scalar_type() == torch::kFloat &&
              v_cache.scalar_type() == torch::kFloat, "float32 tensors only");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the cache must be contiguous");
  q = q.contiguous();
  tables = tables.contiguous();
  lengths = lengths.contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t S = k_cache.size(1), KVH = k_cache.size(2), W = tables.size(1);
  TORCH_CHECK(H % KVH == 0 && k_cache.size(3) == D, "query and cache heads do not match");
  const int64_t G = H / KVH, token_stride = KVH * D, block_stride = S * KVH * D;
  auto out = torch::empty_like(q);
  const float* Q = q.data_ptr<float>();
  const float* K = k_cache.data_ptr<float>();
  const float* V = v_cache.data_ptr<float>();
  const int64_t* T = tables.data_ptr<int64_t>();
  const int64_t* L = lengths.data_ptr<int64_t>();
  float* O = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(G * D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / KVH, g = i % KVH, len = std::min(L[b], W * S);
      const float* q0 = Q + (b * H + g * G) * D;
      scores.assign(G * len, 0.f);
      for (int64_t t = 0; t < len; ++t) {
        const float* k = K + T[b * W + t / S] * block_stride + (t % S) * token_stride + g * D;
        for (int64_t h = 0; h < G; ++h) {
          const float* qh = q0 + h * D;
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += qh[d] * k[d];
          scores[h * len + t] = dot * s;
        }
      }
      for (int64_t h = 0; h < G; ++h) {
        float* row = scores.data() + h * len;
        float top = -std::numeric_limits<float>::infinity(), sum = 0.f;
        for (int64_t t = 0; t < len; ++t) top = std::max(top, row[t]);
        for (int64_t t = 0; t < len; ++t) sum += (row[t] = std::exp(row[t] - top));
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < len; ++t) row[t] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < len; ++t) {
        const float* v = V + T[b * W + t / S] * block_stride + (t % S) * token_stride + g * D;
        for (int64_t h = 0; h < G; ++h) {
          const float p = scores[h * len + t];
          float* a = acc.data() + h * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) a[d] += p * v[d];
        }
      }
      std::copy(acc.begin(), acc.end(), O + (b * H + g * G) * D);
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "decode attention over a paged K,V cache (CPU)");
}
