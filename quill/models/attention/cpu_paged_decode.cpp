// Decode attention over a paged K,V cache on the CPU: one query token per sequence, keys and values read in
// place from the cache blocks the sequence's table lists (no copy into contiguous buffers, no padding).
//
// The step is bound by reading the cache, so the loops follow its layout: a block holds its tokens one after the
// other, each token's heads side by side, and a work item walks its tokens in that order, taking all its heads
// from each token's row. (Walking one head at a time jumps a whole row between reads, which the CPU's
// prefetchers do not follow: 13 against 25 GB/s here.) An item is a sequence, or a share of its heads where
// there are too few sequences to keep every thread busy; threads take the next item as they finish, since
// sequences differ in length.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
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
  if (B == 0) return out;
  const float* Q = q.data_ptr<float>();
  const float* K = k_cache.data_ptr<float>();
  const float* V = v_cache.data_ptr<float>();
  const int64_t* T = tables.data_ptr<int64_t>();
  const int64_t* L = lengths.data_ptr<int64_t>();
  float* O = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  // four items a thread at least, so that uneven lengths even out
  const int64_t threads = at::get_num_threads();
  const int64_t wanted = std::min(KVH, (4 * threads + B - 1) / B);  // shares of a sequence's heads
  const int64_t share_heads = (KVH + wanted - 1) / wanted;  // K,V heads of one share
  const int64_t shares = (KVH + share_heads - 1) / share_heads;  // as many as leave none empty
  const int64_t items = B * shares;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(threads, items), 1, [&](int64_t, int64_t) {
    std::vector<float> scores, acc;
    for (int64_t i = next++; i < items; i = next++) {
      const int64_t b = i / shares, g0 = (i % shares) * share_heads, g1 = std::min(KVH, g0 + share_heads);
      const int64_t h0 = g0 * G, heads = (g1 - g0) * G, len = std::min(L[b], W * S);
      const float* qb = Q + (b * H + h0) * D;
      scores.resize(heads * len);
      for (int64_t t = 0; t < len; ++t) {
        const float* k = K + T[b * W + t / S] * block_stride + (t % S) * token_stride + g0 * D;
        for (int64_t h = 0; h < heads; ++h) {
          const float* qh = qb + h * D;
          const float* kh = k + (h / G) * D;
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += qh[d] * kh[d];
          scores[h * len + t] = dot * s;
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* row = scores.data() + h * len;
        float top = -std::numeric_limits<float>::infinity(), sum = 0.f;
        for (int64_t t = 0; t < len; ++t) top = std::max(top, row[t]);
        for (int64_t t = 0; t < len; ++t) sum += (row[t] = std::exp(row[t] - top));
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < len; ++t) row[t] *= inv;
      }
      acc.assign(heads * D, 0.f);
      for (int64_t t = 0; t < len; ++t) {
        const float* v = V + T[b * W + t / S] * block_stride + (t % S) * token_stride + g0 * D;
        for (int64_t h = 0; h < heads; ++h) {
          const float p = scores[h * len + t];
          const float* vh = v + (h / G) * D;
          float* a = acc.data() + h * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) a[d] += p * vh[d];
        }
      }
      std::copy(acc.begin(), acc.end(), O + (b * H + h0) * D);
    }
  });
  return out;
}

// The GIL is let go while the kernel runs, so that the server's HTTP thread answers meanwhile.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "decode attention over a paged K,V cache (CPU)",
        pybind11::call_guard<pybind11::gil_scoped_release>());
}
