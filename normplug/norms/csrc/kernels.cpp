// Fused CPU passes of normplug's norms (SPEC §1–2), for float and double.
//
// Why this file exists: torch has fused CPU kernels for LayerNorm and plain
// BatchNorm only. Composed of torch ops, LayerNorm-simple, AdaNorm, RMSNorm,
// masked BatchNorm and PowerNorm each cost several extra passes and temporaries
// over the T×B×C activations (1.3–4.6× nn.LayerNorm). Here every forward is one
// statistics pass plus one output pass, every backward one reduction pass plus
// one gradient pass, like torch's own LayerNorm kernels.
//
// normplug/norms/cpu_kernels.py compiles this file once per machine
// (-O3 -march=native -fopenmp) and calls it through ctypes; the maths of every
// kernel is written out, with its derivation, in the Python wrapper that calls
// it. Conventions: activations are contiguous N×C row-major (row = token);
// `pad` is N bytes, nonzero at padding rows, or null when every row is real;
// padding rows are never read (so NaN there cannot leak) and their outputs
// are written as 0. Per-channel sums over rows are accumulated in double.
// `nt` is the number of threads (torch.get_num_threads()).
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

using i64 = int64_t;
using u8 = uint8_t;

namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr i64 kParallelMin = 1 << 15;

inline int threads_for(i64 N, i64 C, int nt) { return (nt > 1 && N * C >= kParallelMin) ? nt : 1; }

// How a pass over padded rows weighs a padding row against a real one (a real
// row counts 2): a reduction skips it (0); an output pass writes its zeros (1,
// about half the memory traffic of reading and writing a real row).
enum PadCost : int { kSkipPad = 0, kWritePad = 1 };

// Where each of kk threads starts in the rows [0, N) (kk + 1 entries, the last
// N): equal counts without a pad mask, equal work with one. Padding is at the
// end of sentences, so in the T×B row order it crowds the last rows: an even
// split by count gave the first thread most of the real rows (2 threads ran
// at 1.26× LayerNorm's time instead of 1.15× for one). Depends on the mask and
// thread count only. One scan for the total, one for the boundaries.
inline std::vector<i64> row_starts(const u8* pad, int pad_cost, i64 N, int kk) {
  std::vector<i64> start(size_t(kk) + 1, N);
  start[0] = 0;
  if (!pad) {
    for (int t = 1; t < kk; ++t) start[t] = N * t / kk;
    return start;
  }
  i64 total = 0;
  for (i64 r = 0; r < N; ++r) total += pad[r] ? pad_cost : 2;
  i64 acc = 0, r = 0;
  for (int t = 1; t < kk; ++t) {
    const i64 goal = total * t / kk;  // thread t starts where the work before it reaches this
    while (r < N && acc < goal) acc += pad[r++] ? pad_cost : 2;
    start[t] = r;
  }
  return start;
}

// f(r0, r1) over a static split of the rows [0, N) (balanced as row_starts says).
template <typename F>
void for_rows(i64 N, i64 C, int nt, F f, const u8* pad = nullptr, int pad_cost = kWritePad) {
  int k = threads_for(N, C, nt);
  if (k == 1) {
    f(i64(0), N);
    return;
  }
  std::vector<i64> start;
#pragma omp parallel num_threads(k)
  {
#pragma omp single
    start = row_starts(pad, pad_cost, N, omp_get_num_threads());
    const int t = omp_get_thread_num();
    f(start[t], start[t + 1]);
  }
}

// Per-channel sums: f(r0, r1, acc) adds its rows into acc (nacc·C doubles,
// zeroed). Threads fill private buffers that are then added in thread order,
// so a result depends on the thread count (and pad mask) only, not on scheduling.
template <typename F>
void reduce_rows(i64 N, i64 C, int nt, int nacc, double* out, F f, const u8* pad = nullptr,
                 int pad_cost = kSkipPad) {
  const i64 len = i64(nacc) * C;
  std::memset(out, 0, sizeof(double) * len);
  int k = threads_for(N, C, nt);
  if (k == 1) {
    f(i64(0), N, out);
    return;
  }
  std::vector<double> part(size_t(k) * len, 0.0);
  std::vector<i64> start;
#pragma omp parallel num_threads(k)
  {
#pragma omp single
    start = row_starts(pad, pad_cost, N, omp_get_num_threads());
    const int t = omp_get_thread_num();
    f(start[t], start[t + 1], part.data() + size_t(t) * len);
  }
  const int used = int(start.size()) - 1;
  for (int t = 0; t < used; ++t) {
    const double* p = part.data() + size_t(t) * len;
    for (i64 j = 0; j < len; ++j) out[j] += p[j];
  }
}

template <typename T>
inline T row_sum(const T* __restrict__ x, i64 C) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (i64 j = 0; j < C; ++j) s += x[j];
  return s;
}

// Mean of a row, summed relative to its first element: exact for a constant
// row (a rounding error in μ there would be amplified by 1/ε in (x − μ)/(s + ε)).
template <typename T>
inline T row_mean(const T* __restrict__ x, i64 C) {
  const T x0 = x[0];
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (i64 j = 0; j < C; ++j) s += x[j] - x0;
  return x0 + s / T(C);
}

template <typename T>
inline T row_dot(const T* __restrict__ a, const T* __restrict__ b, i64 C) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (i64 j = 0; j < C; ++j) s += a[j] * b[j];
  return s;
}

// Σ a ⊙ b ⊙ c. (Written inline in RMSNorm's backward, GCC left this reduction
// unvectorised in some inlined copies: 2–4× slower, worst with 2 threads.)
template <typename T>
inline T row_dot3(const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ c, i64 C) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (i64 j = 0; j < C; ++j) s += a[j] * b[j] * c[j];
  return s;
}

template <typename T>
inline T row_centered_sq(const T* __restrict__ x, T mu, i64 C) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (i64 j = 0; j < C; ++j) {
    T d = x[j] - mu;
    s += d * d;
  }
  return s;
}

// ---------------------------------------------------------------- per token

// LayerNorm-simple family. ŷ = (x − μ)/D, D = s + ε, s the unbiased std.
// Output ŷ, or with ada: scale·(ŷ − k·ŷ²) (AdaNorm, C(1 − kŷ)ŷ).
// Saves per row μ, 1/D and 1/((C − 1)s) (0 when s = 0).
template <typename T>
void simple_fwd(const T* x, T* y, T* mean, T* inv_d, T* inv_cs, i64 N, i64 C, double eps, int ada,
                double k, double scale, int nt) {
  const T e = T(eps), kk = T(k), sc = T(scale);
  for_rows(N, C, nt, [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      const T* __restrict__ xr = x + r * C;
      T* __restrict__ yr = y + r * C;
      T mu = row_mean(xr, C);
      T s = std::sqrt(row_centered_sq(xr, mu, C) / T(C - 1));
      T a = T(1) / (s + e);
      mean[r] = mu;
      inv_d[r] = a;
      inv_cs[r] = s > T(0) ? T(1) / (T(C - 1) * s) : T(0);
      if (ada) {
#pragma omp simd
        for (i64 j = 0; j < C; ++j) {
          T h = (xr[j] - mu) * a;
          yr[j] = sc * (h - kk * h * h);
        }
      } else {
#pragma omp simd
        for (i64 j = 0; j < C; ++j) yr[j] = (xr[j] - mu) * a;
      }
    }
  });
}

// Input gradient of the family above. mode: 0 full, 1 μ detached, 2 s
// detached, 3 both detached, 4 AdaNorm (full, on g̃ = scale·g·(1 − kŷ)).
//   full:   (g − mean g)/D − ŷ·Σ(gŷ)/((C − 1)s)
//   μ det.: g/D            − ŷ·Σ(gŷ)/((C − 1)s)
//   s det.: (g − mean g)/D
//   both:   g/D
template <typename T>
void simple_bwd(const T* g, const T* x, const T* mean, const T* inv_d, const T* inv_cs, T* gx, i64 N,
                i64 C, int mode, double k, double scale, int nt) {
  const T kk = T(k), sc = T(scale);
  for_rows(N, C, nt, [&](i64 r0, i64 r1) {
    std::vector<T> buf(mode == 4 ? C : 0);
    for (i64 r = r0; r < r1; ++r) {
      const T* __restrict__ xr = x + r * C;
      const T* __restrict__ gr = g + r * C;
      T* __restrict__ out = gx + r * C;
      const T mu = mean[r], a = inv_d[r], cs = inv_cs[r];
      if (mode == 4) {  // g̃ = scale·g·(1 − kŷ), then as mode 0
        T* __restrict__ gt = buf.data();
#pragma omp simd
        for (i64 j = 0; j < C; ++j) gt[j] = sc * gr[j] * (T(1) - kk * (xr[j] - mu) * a);
        gr = gt;
      }
      const bool center = mode == 0 || mode == 2 || mode == 4;
      const bool std_term = mode == 0 || mode == 1 || mode == 4;
      T gmean = center ? row_sum(gr, C) / T(C) : T(0);
      T c = 0;
      if (std_term) {
        T sgy = 0;
#pragma omp simd reduction(+ : sgy)
        for (i64 j = 0; j < C; ++j) sgy += gr[j] * (xr[j] - mu);
        c = sgy * a * cs * a;  // Σ(gŷ)/((C − 1)s), times the 1/D of ŷ = (x − μ)/D
      }
#pragma omp simd
      for (i64 j = 0; j < C; ++j) out[j] = (gr[j] - gmean) * a - (xr[j] - mu) * c;
    }
  });
}

// RMSNorm: y = w ⊙ x·r, r = 1/sqrt(mean x² + ε); saves r per row.
template <typename T>
void rms_fwd(const T* x, const T* w, T* y, T* rs, i64 N, i64 C, double eps, int nt) {
  for_rows(N, C, nt, [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      const T* __restrict__ xr = x + r * C;
      T* __restrict__ yr = y + r * C;
      T rr = T(1) / std::sqrt(row_dot(xr, xr, C) / T(C) + T(eps));
      rs[r] = rr;
#pragma omp simd
      for (i64 j = 0; j < C; ++j) yr[j] = xr[j] * rr * w[j];
    }
  });
}

// ∂/∂x = r·(w⊙g) − x·r³·Σ(w⊙g⊙x)/C; ∂/∂w = Σ_rows g⊙x·r (into gw if not null).
template <typename T>
void rms_bwd(const T* g, const T* x, const T* w, const T* rs, T* gx, double* gw, i64 N, i64 C, int nt) {
  auto rows = [&](i64 r0, i64 r1, double* acc) {
    for (i64 r = r0; r < r1; ++r) {
      const T* __restrict__ xr = x + r * C;
      const T* __restrict__ gr = g + r * C;
      T* __restrict__ out = gx + r * C;
      const T rr = rs[r];
      const T c = row_dot3(w, gr, xr, C) * rr * rr * rr / T(C);
#pragma omp simd
      for (i64 j = 0; j < C; ++j) out[j] = rr * w[j] * gr[j] - xr[j] * c;
      if (acc) {
#pragma omp simd
        for (i64 j = 0; j < C; ++j) acc[j] += double(gr[j] * xr[j] * rr);
      }
    }
  };
  if (gw) {
    reduce_rows(N, C, nt, 1, gw, rows);
  } else {
    for_rows(N, C, nt, [&](i64 r0, i64 r1) { rows(r0, r1, nullptr); });
  }
}

// ScaleNorm: y = g·x·inv, inv = 1/max(‖x‖, ε); saves inv and c2 = inv² (0 where
// ‖x‖ < ε: there the denominator is the constant ε).
template <typename T>
void scale_fwd(const T* x, double g, T* y, T* inv, T* c2, i64 N, i64 C, double eps, int nt) {
  for_rows(N, C, nt, [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      const T* __restrict__ xr = x + r * C;
      T* __restrict__ yr = y + r * C;
      T nrm = std::sqrt(row_dot(xr, xr, C));
      bool small = !(nrm >= T(eps));
      T a = small ? T(1) / T(eps) : T(1) / nrm;
      inv[r] = a;
      c2[r] = small ? T(0) : a * a;
      const T ga = T(g) * a;
#pragma omp simd
      for (i64 j = 0; j < C; ++j) yr[j] = xr[j] * ga;
    }
  });
}

// ∂/∂x = g·inv·(gy − x·c2·Σ(gy⊙x)); ∂/∂g = Σ_rows inv·Σ(gy⊙x) (into *dg).
template <typename T>
void scale_bwd(const T* gy, const T* x, double g, const T* inv, const T* c2, T* gx, double* dg, i64 N, i64 C,
               int nt) {
  int k = threads_for(N, C, nt);
  std::vector<double> part(k, 0.0);
  int used = 1;
  auto rows = [&](i64 r0, i64 r1, double* acc) {
    double a = 0;
    for (i64 r = r0; r < r1; ++r) {
      const T* __restrict__ xr = x + r * C;
      const T* __restrict__ gr = gy + r * C;
      T* __restrict__ out = gx + r * C;
      T s = row_dot(gr, xr, C);
      a += double(s * inv[r]);
      const T ga = T(g) * inv[r], c = s * c2[r];
#pragma omp simd
      for (i64 j = 0; j < C; ++j) out[j] = ga * (gr[j] - xr[j] * c);
    }
    *acc = a;
  };
  if (k == 1) {
    rows(0, N, part.data());
  } else {
#pragma omp parallel num_threads(k)
    {
      int t = omp_get_thread_num(), kk = omp_get_num_threads();
      if (t == 0) used = kk;
      rows(N * t / kk, N * (t + 1) / kk, part.data() + t);
    }
  }
  double s = 0;
  for (int t = 0; t < used; ++t) s += part[t];
  *dg = s;
}

// --------------------------------------------------------- per channel (BN)

// Per-channel sums of one thread's rows: rows are added in the compute type
// and the block is added into the double accumulators every kBlock rows (float
// work in the inner loop, double accuracy across blocks).
constexpr int kBlock = 32;

template <typename T>
struct BlockSums {
  std::vector<T> blk;
  double* out;
  int rows = 0;
  BlockSums(double* out_, i64 len) : blk(len, T(0)), out(out_) {}
  T* data() { return blk.data(); }
  void row_done() {
    if (++rows == kBlock) flush();
  }
  void flush() {
    const i64 len = i64(blk.size());
    for (i64 j = 0; j < len; ++j) {
      out[j] += double(blk[j]);
      blk[j] = T(0);
    }
    rows = 0;
  }
  ~BlockSums() { flush(); }
};

// Per-channel mean and biased variance over the real rows (at least one),
// from sums shifted by the first real row (stable without a second pass).
template <typename T>
void col_moments(const T* x, const u8* pad, i64 N, i64 C, T* mean, T* var, int nt) {
  std::vector<double> acc(2 * C);
  i64 first = 0, n = 0;
  while (pad && first < N - 1 && pad[first]) ++first;
  for (i64 r = 0; r < N; ++r) n += !(pad && pad[r]);
  const T* __restrict__ K = x + first * C;
  reduce_rows(N, C, nt, 2, acc.data(), [&](i64 r0, i64 r1, double* a) {
    BlockSums<T> sums(a, 2 * C);
    T* __restrict__ b1 = sums.data();
    T* __restrict__ b2 = sums.data() + C;
    for (i64 r = r0; r < r1; ++r) {
      if (pad && pad[r]) continue;
      const T* __restrict__ xr = x + r * C;
#pragma omp simd
      for (i64 j = 0; j < C; ++j) {
        T d = xr[j] - K[j];
        b1[j] += d;
        b2[j] += d * d;
      }
      sums.row_done();
    }
  }, pad);
  for (i64 j = 0; j < C; ++j) {
    double m = acc[j] / double(n);
    double v = acc[C + j] / double(n) - m * m;
    mean[j] = T(double(K[j]) + m);
    var[j] = T(v > 0 ? v : 0);
  }
}

// y = a ⊙ x + b at real rows (b may be null), 0 at padding rows.
template <typename T>
void affine_rows(const T* x, const u8* pad, const T* a, const T* b, T* y, i64 N, i64 C, int nt) {
  for_rows(N, C, nt, [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      T* __restrict__ yr = y + r * C;
      if (pad && pad[r]) {
        std::memset(yr, 0, sizeof(T) * C);
        continue;
      }
      const T* __restrict__ xr = x + r * C;
      if (b) {
#pragma omp simd
        for (i64 j = 0; j < C; ++j) yr[j] = a[j] * xr[j] + b[j];
      } else {
#pragma omp simd
        for (i64 j = 0; j < C; ++j) yr[j] = a[j] * xr[j];
      }
    }
  }, pad);
}

// Σ_real g and Σ_real g ⊙ (x − μ), per channel (BN backward reductions).
template <typename T>
void col_grad_sums(const T* g, const T* x, const u8* pad, const T* mean, i64 N, i64 C, double* sg,
                   double* sgx, int nt) {
  std::vector<double> acc(2 * C);
  reduce_rows(N, C, nt, 2, acc.data(), [&](i64 r0, i64 r1, double* a) {
    BlockSums<T> sums(a, 2 * C);
    T* __restrict__ b1 = sums.data();
    T* __restrict__ b2 = sums.data() + C;
    for (i64 r = r0; r < r1; ++r) {
      if (pad && pad[r]) continue;
      const T* __restrict__ xr = x + r * C;
      const T* __restrict__ gr = g + r * C;
#pragma omp simd
      for (i64 j = 0; j < C; ++j) {
        b1[j] += gr[j];
        b2[j] += gr[j] * (xr[j] - mean[j]);
      }
      sums.row_done();
    }
  }, pad);
  std::memcpy(sg, acc.data(), sizeof(double) * C);
  std::memcpy(sgx, acc.data() + C, sizeof(double) * C);
}

// gx = k1 ⊙ g + k2 ⊙ x + k3 at real rows (k1 null: no g term), 0 at padding rows.
template <typename T>
void grad_rows(const T* g, const T* x, const u8* pad, const T* k1, const T* k2, const T* k3, T* gx, i64 N,
               i64 C, int nt) {
  for_rows(N, C, nt, [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      T* __restrict__ out = gx + r * C;
      if (pad && pad[r]) {
        std::memset(out, 0, sizeof(T) * C);
        continue;
      }
      const T* __restrict__ xr = x + r * C;
      if (k1) {
        const T* __restrict__ gr = g + r * C;
#pragma omp simd
        for (i64 j = 0; j < C; ++j) out[j] = k1[j] * gr[j] + k2[j] * xr[j] + k3[j];
      } else {
#pragma omp simd
        for (i64 j = 0; j < C; ++j) out[j] = k2[j] * xr[j] + k3[j];
      }
    }
  }, pad);
}

// ------------------------------------------------------------------ PowerNorm

// Group scaling of the real rows, in one pass: rg[r·G + q] = 1/sqrt(mean of
// squares of group q + 1e-5), z = x·rg; Σ_real z² per channel into sz2 (if not
// null); y = z ⊙ a + b (b may be null) at real rows and 0 at padding rows (if
// y is not null).
template <typename T>
void group_scale_rows(const T* x, const u8* pad, T* rg, double* sz2, const T* a, const T* b, T* y, i64 N,
                      i64 C, i64 G, int nt) {
  const i64 D = C / G;
  auto rows = [&](i64 r0, i64 r1, double* acc) {
    BlockSums<T> sums(acc, acc ? C : 0);
    for (i64 r = r0; r < r1; ++r) {
      if (pad && pad[r]) {
        if (y) std::memset(y + r * C, 0, sizeof(T) * C);
        continue;
      }
      for (i64 q = 0; q < G; ++q) {
        const T* __restrict__ xr = x + r * C + q * D;
        const T rr = T(1) / std::sqrt(row_dot(xr, xr, D) / T(D) + T(1e-5));
        rg[r * G + q] = rr;
        if (acc) {
          T* __restrict__ s = sums.data() + q * D;
#pragma omp simd
          for (i64 j = 0; j < D; ++j) {
            T z = xr[j] * rr;
            s[j] += z * z;
          }
        }
        if (y) {
          const T* __restrict__ aq = a + q * D;
          T* __restrict__ yq = y + r * C + q * D;
          if (b) {
            const T* __restrict__ bq = b + q * D;
#pragma omp simd
            for (i64 j = 0; j < D; ++j) yq[j] = xr[j] * rr * aq[j] + bq[j];
          } else {
#pragma omp simd
            for (i64 j = 0; j < D; ++j) yq[j] = xr[j] * rr * aq[j];
          }
        }
      }
      if (acc) sums.row_done();
    }
  };
  if (sz2) {
    reduce_rows(N, C, nt, 1, sz2, rows, pad, y ? kWritePad : kSkipPad);
  } else {
    for_rows(N, C, nt, [&](i64 r0, i64 r1) { rows(r0, r1, nullptr); }, pad);
  }
}

// The PowerNorm input gradient and its reductions, in one pass: at real rows
// dz = gy ⊙ a − z ⊙ b and, through the group scaling, dx = rg·(dz − z·mean_group(dz ⊙ z));
// 0 at padding rows. Σ_real gy ⊙ z into sgz and Σ_real gy into sg.
template <typename T>
void group_grad_rows(const T* gy, const T* x, const u8* pad, const T* rg, const T* a, const T* b, T* dx,
                     double* sgz, double* sg, i64 N, i64 C, i64 G, int nt) {
  const i64 D = C / G;
  std::vector<double> acc(2 * C);
  reduce_rows(N, C, nt, 2, acc.data(), [&](i64 r0, i64 r1, double* ac) {
    BlockSums<T> sums(ac, 2 * C);
    for (i64 r = r0; r < r1; ++r) {
      T* __restrict__ out = dx + r * C;
      if (pad && pad[r]) {
        std::memset(out, 0, sizeof(T) * C);
        continue;
      }
      for (i64 q = 0; q < G; ++q) {
        const T* __restrict__ xr = x + r * C + q * D;
        const T* __restrict__ gr = gy + r * C + q * D;
        const T* __restrict__ aq = a + q * D;
        const T* __restrict__ bq = b + q * D;
        T* __restrict__ s1 = sums.data() + q * D;
        T* __restrict__ s2 = sums.data() + C + q * D;
        T* __restrict__ oq = out + q * D;
        const T rr = rg[r * G + q];
        T s = 0;
#pragma omp simd reduction(+ : s)
        for (i64 j = 0; j < D; ++j) {
          T z = xr[j] * rr;
          T dz = gr[j] * aq[j] - z * bq[j];
          oq[j] = dz;
          s += dz * z;
          s1[j] += gr[j] * z;
          s2[j] += gr[j];
        }
        const T m = s / T(D);
#pragma omp simd
        for (i64 j = 0; j < D; ++j) oq[j] = rr * (oq[j] - xr[j] * rr * m);
      }
      sums.row_done();
    }
  }, pad, kWritePad);
  std::memcpy(sgz, acc.data(), sizeof(double) * C);
  std::memcpy(sg, acc.data() + C, sizeof(double) * C);
}

// ------------------------------------------------ whole-layer entry points
// Each runs a norm's whole training forward or backward in one call: the
// per-channel coefficient arithmetic (a few hundred numbers) is done here in
// double too, because as separate torch ops it costs more than a pass over the data.

// Masked BN training forward. Outputs: mean, var (μ_B, biased σ²_B), aux (3×C:
// invstd, running mean and running variance after this step's update), tid
// (mean_c |μ̂ − μ_B|/σ_B and mean_c |σ̂/σ_B − 1| against the updated running
// statistics, σ_B = sqrt(σ²_B)) and y; run_mean/run_var are updated in place
// with momentum ρ: μ̂ ← (1 − ρ)μ̂ + ρ μ_B, σ̂² ← (1 − ρ)σ̂² + ρ σ²_B.
template <typename T>
void bn_train_fwd(const T* x, const u8* pad, i64 N, i64 C, const T* w, const T* b, double eps, double rho,
                  T* run_mean, T* run_var, T* mean, T* var, T* aux, T* tid, T* y, int nt) {
  col_moments(x, pad, N, C, mean, var, nt);
  std::vector<T> scale(C), shift(C);
  T* invstd = aux;
  double tm = 0, tv = 0;
  for (i64 j = 0; j < C; ++j) {
    const double m = double(mean[j]), v = double(var[j]);
    const double inv = 1.0 / std::sqrt(v + eps);
    invstd[j] = T(inv);
    const double sc = w ? inv * double(w[j]) : inv;
    scale[j] = T(sc);
    shift[j] = T((b ? double(b[j]) : 0.0) - m * sc);
    run_mean[j] = T((1.0 - rho) * double(run_mean[j]) + rho * double(T(m)));
    run_var[j] = T((1.0 - rho) * double(run_var[j]) + rho * double(T(v)));
    aux[C + j] = run_mean[j];
    aux[2 * C + j] = run_var[j];
    const double sb = std::sqrt(double(var[j]));
    tm += std::fabs(double(run_mean[j]) - double(mean[j])) / sb;
    tv += std::fabs(std::sqrt(double(run_var[j])) / sb - 1.0);
  }
  tid[0] = T(tm / double(C));
  tid[1] = T(tv / double(C));
  affine_rows(x, pad, scale.data(), shift.data(), y, N, C, nt);
}

// Masked BN backward (training statistics, n real rows). g, g_mean, g_var:
// gradients of y, μ_B, σ²_B, each may be null; gx, gw, gb: outputs, may be null.
//   gx = w·invstd·(g − Σg/n − x̂·Σ(g x̂)/n) + ḡ_μ/n + ḡ_σ²·2(x − μ)/n  (0 at padding)
//   gw = Σ g x̂, gb = Σ g, with x̂ = (x − μ)·invstd and sums over the real rows.
template <typename T>
void bn_bwd(const T* g, const T* x, const u8* pad, i64 N, i64 C, i64 n, const T* mean, const T* invstd,
            const T* w, const T* g_mean, const T* g_var, T* gx, T* gw, T* gb, int nt) {
  std::vector<double> sg(C, 0.0), sgx(C, 0.0);
  if (g) col_grad_sums(g, x, pad, mean, N, C, sg.data(), sgx.data(), nt);
  std::vector<T> k1(C), k2(C), k3(C);
  const double dn = double(n);
  for (i64 j = 0; j < C; ++j) {
    const double inv = double(invstd[j]), mu = double(mean[j]);
    const double g_xhat = sgx[j] * inv;
    if (gw) gw[j] = T(g_xhat);
    if (gb) gb[j] = T(sg[j]);
    const double a1 = w ? inv * double(w[j]) : inv;
    double a2 = -a1 * inv * g_xhat / dn;
    double a3 = -a1 * sg[j] / dn - a2 * mu;
    if (g_var) {
      a2 += double(g_var[j]) * 2.0 / dn;
      a3 -= double(g_var[j]) * 2.0 / dn * mu;
    }
    if (g_mean) a3 += double(g_mean[j]) / dn;
    k1[j] = T(a1);
    k2[j] = T(a2);
    k3[j] = T(a3);
  }
  if (gx) grad_rows(g, x, pad, g ? k1.data() : nullptr, k2.data(), k3.data(), gx, N, C, nt);
}

// PowerNorm training forward (SPEC §2 steps 1–4), n ≥ 1 real rows. warm: this
// forward is in warm-up; k: warm-up forwards including this one. Outputs rg
// (N×G group scales), aux (4×C: σ²_B, inv_fwd, inv_bwd, ψ² after the update),
// disc (Σ_c |ψ² − σ²_B| and mean_c |ψ/σ_B − 1|, against the updated ψ²) and y;
// psi2 is updated in place (cumulative mean in warm-up, EMA with α_f after).
// After warm-up the output is normalised with the ψ² of earlier steps, so
// statistics and output take one pass; in warm-up σ²_B is needed first (two).
template <typename T>
void pn_train_fwd(const T* x, const u8* pad, i64 N, i64 C, i64 G, i64 n, const T* w, const T* b, double eps,
                  int warm, i64 k, double alpha_fwd, T* psi2, T* rg, T* aux, T* disc, T* y, int nt) {
  std::vector<double> sz2(C);
  std::vector<T> scale(C);
  if (!warm) {
    for (i64 j = 0; j < C; ++j) {
      const double inv_fwd = 1.0 / std::sqrt(double(psi2[j]) + eps);
      aux[C + j] = T(inv_fwd);
      scale[j] = T(w ? inv_fwd * double(w[j]) : inv_fwd);
    }
    group_scale_rows(x, pad, rg, sz2.data(), scale.data(), b, y, N, C, G, nt);
  } else {
    group_scale_rows<T>(x, pad, rg, sz2.data(), nullptr, nullptr, nullptr, N, C, G, nt);
  }
  double rv = 0, tv = 0;
  const double kk = double(k > 1 ? k : 1);
  for (i64 j = 0; j < C; ++j) {
    const T s2t = T(sz2[j] / double(n));
    const double s2 = double(s2t), p = double(psi2[j]);
    const double inv_bwd = 1.0 / std::sqrt(s2 + eps);
    if (warm) {
      aux[C + j] = T(inv_bwd);
      scale[j] = T(w ? inv_bwd * double(w[j]) : inv_bwd);
    }
    const double np = warm ? p + (s2 - p) / kk : p * alpha_fwd + s2 * (1.0 - alpha_fwd);
    psi2[j] = T(np);
    aux[j] = s2t;
    aux[2 * C + j] = T(inv_bwd);
    aux[3 * C + j] = psi2[j];
    const double pn = double(psi2[j]);
    rv += std::fabs(pn - s2);
    tv += std::fabs(std::sqrt(pn) / std::sqrt(s2) - 1.0);
  }
  disc[0] = T(rv);
  disc[1] = T(tv / double(C));
  if (warm) {  // second pass: the rows are scaled again rather than z stored
    group_scale_rows<T>(x, pad, rg, nullptr, scale.data(), b, y, N, C, G, nt);
  }
}

// PowerNorm eval: y = (x·rg) ⊙ (w/sqrt(ψ² + ε)) + b at real rows, 0 at padding.
template <typename T>
void pn_eval_fwd(const T* x, const u8* pad, i64 N, i64 C, i64 G, const T* w, const T* b, double eps,
                 const T* psi2, T* rg, T* y, int nt) {
  std::vector<T> scale(C);
  for (i64 j = 0; j < C; ++j) {
    const double inv = 1.0 / std::sqrt(double(psi2[j]) + eps);
    scale[j] = T(w ? inv * double(w[j]) : inv);
  }
  group_scale_rows<T>(x, pad, rg, nullptr, scale.data(), b, y, N, C, G, nt);
}

// PowerNorm backward (SPEC §2 step 5), n real rows behind σ²_B, in one pass:
// the coefficients use ν as the previous backward left it, so the input
// gradient needs no reduction first. aux as written by pn_train_fwd; nu (ν) is
// then updated in place:
//   ∂L/∂z = gy ⊙ (γ·inv_bwd) − z ⊙ ((1 − α_b)·ν·inv_fwd·inv_bwd), then through
//   the group scaling; Σ gy⊙ẑ = inv_fwd·Σ gy⊙z (= ∂L/∂γ), ∂L/∂β = Σ gy,
//   ν += γ·Σ gy⊙ẑ/n − (1 − α_b)·ν·σ²_B·inv_fwd².
template <typename T>
void pn_bwd(const T* gy, const T* x, const u8* pad, const T* rg, i64 N, i64 C, i64 G, i64 n, const T* w,
            const T* aux, double alpha_bkw, T* nu, T* dx, T* gw, T* gb, int nt) {
  const T* sigma2 = aux;
  const T* inv_fwd = aux + C;
  const T* inv_bwd = aux + 2 * C;
  const double kb = 1.0 - alpha_bkw;
  std::vector<T> a(C), bb(C);
  for (i64 j = 0; j < C; ++j) {
    const double gam = w ? double(w[j]) : 1.0;
    a[j] = T(gam * double(inv_bwd[j]));
    bb[j] = T(kb * double(nu[j]) * double(inv_fwd[j]) * double(inv_bwd[j]));
  }
  std::vector<double> sgz(C), sg(C);
  group_grad_rows(gy, x, pad, rg, a.data(), bb.data(), dx, sgz.data(), sg.data(), N, C, G, nt);
  for (i64 j = 0; j < C; ++j) {
    const double gam = w ? double(w[j]) : 1.0, fi = double(inv_fwd[j]), v = double(nu[j]);
    const double gy_zhat = sgz[j] * fi;
    if (gw) gw[j] = T(gy_zhat);
    if (gb) gb[j] = T(sg[j]);
    nu[j] = T(v + gam * gy_zhat / double(n) - kb * v * double(sigma2[j]) * fi * fi);
  }
}

}  // namespace

// ------------------------------------------------------------ C entry points

#define NP_EXPORT(T, S)                                                                                      \
  extern "C" void simple_fwd_##S(const T* x, T* y, T* mean, T* inv_d, T* inv_cs, i64 N, i64 C, double eps,  \
                                 int ada, double k, double scale, int nt) {                                  \
    simple_fwd<T>(x, y, mean, inv_d, inv_cs, N, C, eps, ada, k, scale, nt);                                  \
  }                                                                                                          \
  extern "C" void simple_bwd_##S(const T* g, const T* x, const T* mean, const T* inv_d, const T* inv_cs,     \
                                 T* gx, i64 N, i64 C, int mode, double k, double scale, int nt) {            \
    simple_bwd<T>(g, x, mean, inv_d, inv_cs, gx, N, C, mode, k, scale, nt);                                  \
  }                                                                                                          \
  extern "C" void rms_fwd_##S(const T* x, const T* w, T* y, T* rs, i64 N, i64 C, double eps, int nt) {       \
    rms_fwd<T>(x, w, y, rs, N, C, eps, nt);                                                                  \
  }                                                                                                          \
  extern "C" void rms_bwd_##S(const T* g, const T* x, const T* w, const T* rs, T* gx, double* gw, i64 N,     \
                              i64 C, int nt) {                                                               \
    rms_bwd<T>(g, x, w, rs, gx, gw, N, C, nt);                                                               \
  }                                                                                                          \
  extern "C" void scale_fwd_##S(const T* x, double g, T* y, T* inv, T* c2, i64 N, i64 C, double eps,         \
                                int nt) {                                                                    \
    scale_fwd<T>(x, g, y, inv, c2, N, C, eps, nt);                                                           \
  }                                                                                                          \
  extern "C" void scale_bwd_##S(const T* gy, const T* x, double g, const T* inv, const T* c2, T* gx,         \
                                double* dg, i64 N, i64 C, int nt) {                                          \
    scale_bwd<T>(gy, x, g, inv, c2, gx, dg, N, C, nt);                                                       \
  }                                                                                                          \
  extern "C" void affine_rows_##S(const T* x, const u8* pad, const T* a, const T* b, T* y, i64 N, i64 C,     \
                                  int nt) {                                                                  \
    affine_rows<T>(x, pad, a, b, y, N, C, nt);                                                               \
  }                                                                                                          \
  extern "C" void bn_train_fwd_##S(const T* x, const u8* pad, i64 N, i64 C, const T* w, const T* b,          \
                                   double eps, double rho, T* run_mean, T* run_var, T* mean, T* var, T* aux, \
                                   T* tid, T* y, int nt) {                                                   \
    bn_train_fwd<T>(x, pad, N, C, w, b, eps, rho, run_mean, run_var, mean, var, aux, tid, y, nt);            \
  }                                                                                                          \
  extern "C" void bn_bwd_##S(const T* g, const T* x, const u8* pad, i64 N, i64 C, i64 n, const T* mean,     \
                             const T* invstd, const T* w, const T* g_mean, const T* g_var, T* gx, T* gw,     \
                             T* gb, int nt) {                                                                \
    bn_bwd<T>(g, x, pad, N, C, n, mean, invstd, w, g_mean, g_var, gx, gw, gb, nt);                           \
  }                                                                                                          \
  extern "C" void pn_train_fwd_##S(const T* x, const u8* pad, i64 N, i64 C, i64 G, i64 n, const T* w,       \
                                   const T* b, double eps, int warm, i64 k, double alpha_fwd, T* psi2,       \
                                   T* rg, T* aux, T* disc, T* y, int nt) {                                   \
    pn_train_fwd<T>(x, pad, N, C, G, n, w, b, eps, warm, k, alpha_fwd, psi2, rg, aux, disc, y, nt);          \
  }                                                                                                          \
  extern "C" void pn_eval_fwd_##S(const T* x, const u8* pad, i64 N, i64 C, i64 G, const T* w, const T* b,   \
                                  double eps, const T* psi2, T* rg, T* y, int nt) {                          \
    pn_eval_fwd<T>(x, pad, N, C, G, w, b, eps, psi2, rg, y, nt);                                             \
  }                                                                                                          \
  extern "C" void pn_bwd_##S(const T* gy, const T* x, const u8* pad, const T* rg, i64 N, i64 C, i64 G,      \
                             i64 n, const T* w, const T* aux, double alpha_bkw, T* nu, T* dx, T* gw, T* gb,  \
                             int nt) {                                                                       \
    pn_bwd<T>(gy, x, pad, rg, N, C, G, n, w, aux, alpha_bkw, nu, dx, gw, gb, nt);                            \
  }

NP_EXPORT(float, f32)
NP_EXPORT(double, f64)

// Bumped whenever an entry point changes signature: the loader checks it.
extern "C" int normplug_kernels_abi() { return 2; }
