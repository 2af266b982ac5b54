// The state families' steps on the CPU, updating each sequence's state where it lies in its slot: one read and
// one write of the state per step, where the eager steps gather the slots into a copy, make four to ten passes
// over it and scatter it back. The same float32 arithmetic as the eager steps (and the GPU's Triton kernels).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// Eight floats as one vector (GCC's and Clang's vector extension: AVX registers on x86, pairs of NEON ones on Arm).
typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));

inline f8 load8(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store8(float* p, f8 v) { std::memcpy(p, &v, sizeof v); }

// exp(x) for x <= 0 (decays), eight at a time: 2^n * p(r), with x = n ln2 + r, |r| <= ln2 / 2 and p a degree-6
// polynomial; relative error below 3e-7 (libm's expf: 1e-7). Below -87 it gives 0, where expf's result would be
// a denormal anyway. Written on vectors because compilers leave a scalar exp unvectorized: 4x faster here.
inline f8 decay_exp8(f8 x) {
  const i8 tiny = x < -87.0f;
  x = tiny ? f8{} - 87.0f : x;
  const f8 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // rounded: 1.5 * 2^23 drops the fraction
  const f8 r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;  // ln 2 in two parts
  f8 p = r * (1.0f / 720) + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const i8 exponent = (__builtin_convertvector(n, i8) + 127) << 23;  // 2^n as a float's bits
  const f8 result = p * reinterpret_cast<const f8&>(exponent);
  return tiny ? f8{} : result;
}

void check_state(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat && t.stride(-1) == 1,
              name, " must be float32 with a contiguous last dimension");
}

torch::Tensor f32(const torch::Tensor& t) { return t.to(torch::kFloat).contiguous(); }

}  // namespace

// One channel's N states (`at`, in place) through Q tokens: s = exp(dt a) * s + dt u b, y = c . s after each.
void scan_channel(float* at, const float* a, int64_t N, int64_t Q, int64_t D, const float* U, const float* DT,
                  const float* B, const float* C, float* Y) {
  for (int64_t t = 0; t < Q; ++t) {
    const float step = DT[t * D], push = step * U[t * D];
    const float *b = B + t * N, *c = C + t * N;
    f8 sum = {};
    int64_t n = 0;
    for (; n + 8 <= N; n += 8) {
      const f8 s = decay_exp8(step * load8(a + n)) * load8(at + n) + push * load8(b + n);
      store8(at + n, s);
      sum += s * load8(c + n);
    }
    float out = 0.f;
    for (int lane = 0; lane < 8; ++lane) out += sum[lane];
    for (; n < N; ++n) {  // a state size that is not a multiple of 8
      at[n] = std::exp(step * a[n]) * at[n] + push * b[n];
      out += at[n] * c[n];
    }
    Y[t * D] = out;
  }
}

// Mamba-1's scan over Q tokens per row: state (S, d, N) (a layer's view of every slot); slots (R,) int64;
// u, dt (R, Q, d); A (d, N); B, C (R, Q, N) -> y (R, Q, d) = C . s after each token, with
// s = exp(dt A) * s + dt u B. A token with dt 0 leaves the state as it was (padding).
torch::Tensor mamba_scan(torch::Tensor state, torch::Tensor slots, torch::Tensor u, torch::Tensor dt,
                         torch::Tensor A, torch::Tensor B, torch::Tensor C) {
  check_state(state, "the state");
  slots = slots.to(torch::kLong).contiguous();
  u = f32(u), dt = f32(dt), A = f32(A), B = f32(B), C = f32(C);
  const int64_t R = u.size(0), Q = u.size(1), D = u.size(2), N = A.size(1);
  TORCH_CHECK(state.size(1) == D && state.size(2) == N, "state and inputs disagree on d_inner or d_state");
  auto y = torch::empty_like(u);
  float* S = state.data_ptr<float>();
  const int64_t slot_stride = state.stride(0), d_stride = state.stride(1);
  const int64_t* slot = slots.data_ptr<int64_t>();
  const float *U = u.data_ptr<float>(), *DT = dt.data_ptr<float>(), *AA = A.data_ptr<float>();
  const float *BB = B.data_ptr<float>(), *CC = C.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  constexpr int64_t CHANNELS = 64;  // channels per task: enough tasks to share among threads
  const int64_t blocks = (D + CHANNELS - 1) / CHANNELS;
  at::parallel_for(0, R * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / blocks, first = (task % blocks) * CHANNELS, last = std::min(D, first + CHANNELS);
      const int64_t row = r * Q * D;  // the row's first token, channel 0, in u, dt and y
      for (int64_t d = first; d < last; ++d) {
        float* at = S + slot[r] * slot_stride + d * d_stride;
        const float *a = AA + d * N, *b = BB + r * Q * N, *c = CC + r * Q * N;
        scan_channel(at, a, N, Q, D, U + row + d, DT + row + d, b, c, Y + row + d);
      }
    }
  });
  return y;
}

// Mamba-1's convolution for one token per row, with its SiLU: window (S, d, K - 1) (a layer's view of every slot,
// oldest input first); slots (R,); x (R, d); weight (d, K); bias (d,) or empty -> y (R, d) =
// silu(bias + weight . [window, x]) per channel; each window slides in place, x its newest input.
torch::Tensor conv_step(torch::Tensor window, torch::Tensor slots, torch::Tensor x, torch::Tensor weight,
                        torch::Tensor bias) {
  check_state(window, "the window");
  slots = slots.to(torch::kLong).contiguous();
  x = f32(x), weight = f32(weight);
  const bool has_bias = bias.numel() > 0;
  if (has_bias) bias = f32(bias);
  const int64_t R = x.size(0), D = x.size(1), K1 = window.size(2), K = weight.size(1);
  TORCH_CHECK(window.size(1) == D && weight.size(0) == D && K == K1 + 1, "window, input and weight disagree");
  auto y = torch::empty_like(x);
  float* W = window.data_ptr<float>();
  const int64_t w0 = window.stride(0), w1 = window.stride(1);
  const int64_t* slot = slots.data_ptr<int64_t>();
  const float *X = x.data_ptr<float>(), *WT = weight.data_ptr<float>();
  const float* BS = has_bias ? bias.data_ptr<float>() : nullptr;
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* out = Y + r * D;
      for (int64_t d = 0; d < D; ++d) {
        float* past = W + slot[r] * w0 + d * w1;
        const float* w = WT + d * K;
        const float now = X[r * D + d];
        float acc = has_bias ? BS[d] : 0.f;
        for (int64_t k = 0; k < K1; ++k) acc += w[k] * past[k];
        acc += w[K1] * now;
        for (int64_t k = 0; k + 1 < K1; ++k) past[k] = past[k + 1];
        if (K1 > 0) past[K1 - 1] = now;
        out[d] = acc;
      }
      int64_t d = 0;
      for (; d + 8 <= D; d += 8) {  // silu(a) = a sigmoid(a), from exp(-|a|) <= 1 on either side of 0
        const f8 a = load8(out + d), e = decay_exp8(a < 0.f ? a : -a), one = f8{} + 1.f;
        store8(out + d, a * (a < 0.f ? e / (one + e) : one / (one + e)));
      }
      for (; d < D; ++d) out[d] = out[d] / (1.f + std::exp(-out[d]));
    }
  });
  return y;
}

// Mamba-2's decode step: state (S, H, P, N); slots (R,); x (R, H, P); dt (R, H); A (H,); B, C (R, G, N)
// -> y (R, H, P) = S C for each row's new state S = exp(dt A) S + dt x B^T, heads grouped G to a B and C.
torch::Tensor ssd_step(torch::Tensor state, torch::Tensor slots, torch::Tensor x, torch::Tensor dt,
                       torch::Tensor A, torch::Tensor B, torch::Tensor C) {
  check_state(state, "the state");
  slots = slots.to(torch::kLong).contiguous();
  x = f32(x), dt = f32(dt), A = f32(A), B = f32(B), C = f32(C);
  const int64_t R = x.size(0), H = x.size(1), P = x.size(2), G = B.size(1), N = B.size(2);
  TORCH_CHECK(H % G == 0 && state.size(1) == H && state.size(2) == P && state.size(3) == N,
              "state and inputs disagree on heads, head width or state size");
  auto y = torch::empty_like(x);
  float* S = state.data_ptr<float>();
  const int64_t s0 = state.stride(0), s1 = state.stride(1), s2 = state.stride(2);
  const int64_t* slot = slots.data_ptr<int64_t>();
  const float *X = x.data_ptr<float>(), *DT = dt.data_ptr<float>(), *AA = A.data_ptr<float>();
  const float *BB = B.data_ptr<float>(), *CC = C.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, R * H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / H, h = task % H, g = h / (H / G);
      const float step = DT[r * H + h], decay = std::exp(step * AA[h]);
      const float *b = BB + (r * G + g) * N, *c = CC + (r * G + g) * N;
      for (int64_t p = 0; p < P; ++p) {
        float* s = S + slot[r] * s0 + h * s1 + p * s2;
        const float push = step * X[(r * H + h) * P + p];
        float out = 0.f;
#pragma omp simd reduction(+ : out)
        for (int64_t n = 0; n < N; ++n) {
          s[n] = s[n] * decay + push * b[n];
          out += s[n] * c[n];
        }
        Y[(r * H + h) * P + p] = out;
      }
    }
  });
  return y;
}

// xLSTM's mLSTM decode step: C (S, H, Dk, Dv), n (S, H, Dk), m (S, H) a block's view of every slot; slots (R,);
// q, k (R, H, Dk), v (R, H, Dv), i, f (R, H) pre-activations -> (h (R, H, Dv), new n (R, H, Dk), new m (R, H)).
// C is updated in its slots; n and m come back for the caller to store, as the GPU kernel returns them.
std::vector<torch::Tensor> mlstm_step(torch::Tensor C, torch::Tensor n, torch::Tensor m, torch::Tensor slots,
                                      torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor i,
                                      torch::Tensor f, double eps) {
  check_state(C, "the state");
  check_state(n, "the state");
  TORCH_CHECK(m.scalar_type() == torch::kFloat, "the state must be float32");
  slots = slots.to(torch::kLong).contiguous();
  q = f32(q), k = f32(k), v = f32(v), i = f32(i), f = f32(f);
  const int64_t R = q.size(0), H = q.size(1), Dk = q.size(2), Dv = v.size(2);
  TORCH_CHECK(C.size(1) == H && C.size(2) == Dk && C.size(3) == Dv, "state and inputs disagree on head sizes");
  auto h = torch::empty_like(v), n_out = torch::empty_like(q), m_out = torch::empty_like(i);
  float *CC = C.data_ptr<float>(), *NN = n.data_ptr<float>(), *MM = m.data_ptr<float>();
  const int64_t c0 = C.stride(0), c1 = C.stride(1), c2 = C.stride(2), n0 = n.stride(0), n1 = n.stride(1);
  const int64_t m0 = m.stride(0), m1 = m.stride(1);
  const int64_t* slot = slots.data_ptr<int64_t>();
  const float *Qp = q.data_ptr<float>(), *Kp = k.data_ptr<float>(), *Vp = v.data_ptr<float>();
  const float *Ip = i.data_ptr<float>(), *Fp = f.data_ptr<float>();
  float *Hp = h.data_ptr<float>(), *Nout = n_out.data_ptr<float>(), *Mout = m_out.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dk)), epsilon = static_cast<float>(eps);
  at::parallel_for(0, R * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> numerator(Dv);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / H, hd = task % H, rh = r * H + hd, s = slot[r];
      const float fg = Fp[rh], ig = Ip[rh], old_m = MM[s * m0 + hd * m1];
      const float log_f = std::min(fg, 0.0f) - std::log1p(std::exp(-std::abs(fg)));  // log sigmoid(f)
      const float new_m = std::max(log_f + old_m, ig);
      const float keep = std::exp(log_f + old_m - new_m), write = std::exp(ig - new_m);
      const float *qv = Qp + rh * Dk, *kv = Kp + rh * Dk, *vv = Vp + rh * Dv;
      float* memory = CC + s * c0 + hd * c1;
      const float* old_n = NN + s * n0 + hd * n1;
      std::fill(numerator.begin(), numerator.end(), 0.f);
      float denominator = 0.f;
      for (int64_t a = 0; a < Dk; ++a) {
        float* row = memory + a * c2;
        const float written = write * kv[a], query = qv[a] * scale;
        float* out = numerator.data();
#pragma omp simd
        for (int64_t b = 0; b < Dv; ++b) {
          row[b] = keep * row[b] + written * vv[b];
          out[b] += query * row[b];
        }
        const float new_n = keep * old_n[a] + written;
        Nout[rh * Dk + a] = new_n;
        denominator += query * new_n;
      }
      const float norm = std::max(std::abs(denominator), std::exp(-new_m)) + epsilon;
      for (int64_t b = 0; b < Dv; ++b) Hp[rh * Dv + b] = numerator[b] / norm;
      Mout[rh] = new_m;
    }
  });
  return {h, n_out, m_out};
}

// The GIL is let go while a kernel runs, so that the server's HTTP thread answers meanwhile.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  const auto unlocked = pybind11::call_guard<pybind11::gil_scoped_release>();
  module.def("mamba_scan", &mamba_scan, "Mamba-1's scan from each row's slot, in place (CPU)", unlocked);
  module.def("conv_step", &conv_step, "Mamba-1's convolution and SiLU for one token, windows slid in place (CPU)",
             unlocked);
  module.def("ssd_step", &ssd_step, "Mamba-2's decode step in each row's slot (CPU)", unlocked);
  module.def("mlstm_step", &mlstm_step, "the mLSTM's decode step in each row's slot (CPU)", unlocked);
}
