// One-sided Jacobi (Hestenes) SVD for many small matrices, OpenMP across the batch.
//
// Layout: the work matrix W has n rows of length 2n; row k holds column k of A (= M V)
// followed by column k of V, so one plane rotation of the pair (i, j) updates two
// contiguous rows of length 2n (A and V together) and vectorises cleanly. Squared column
// norms are cached and updated by the rotation (recomputed at the start of each sweep).
#include "polar.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace lmc {

template <typename T>
double default_tol(int64_t n) {
  // fp32 output: 1e-10 relative orthogonality is far below what fp32 can represent.
  // fp64 output: a few ulps times n.
  if (sizeof(T) == 4) return 1e-10;
  return std::max<double>(4.0, (double)n) * DBL_EPSILON;
}

template <typename F>
static inline F dot_n(const F* __restrict a, const F* __restrict b, int64_t n) {
  F s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    s0 += a[k] * b[k];
    s1 += a[k + 1] * b[k + 1];
    s2 += a[k + 2] * b[k + 2];
    s3 += a[k + 3] * b[k + 3];
  }
  for (; k < n; ++k) s0 += a[k] * b[k];
  return (s0 + s1) + (s2 + s3);
}

template <typename F>
static inline void rotate_n(F* __restrict a, F* __restrict b, int64_t n, F c, F s) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) {
    const F x = a[k], y = b[k];
    a[k] = c * x - s * y;
    b[k] = s * x + c * y;
  }
}

// Cyclic one-sided Jacobi sweeps on the n rows (length w, the first n entries are the
// column of A) of W, with de Rijk pivoting (rows sorted by decreasing norm before each
// sweep). Rotations are computed in double. Returns the number of sweeps run (the last
// one is the sweep that found nothing to rotate, unless max_sweeps was hit).
template <typename F>
static int jacobi_sweeps(F* W, double* d, int64_t n, int64_t w, double tol, int max_sweeps,
                         double stop_below = 0.0) {
  int sweep = 0;
  const double tol2 = tol * tol;
  stop_below *= stop_below;  // compared with squared ratios
  while (sweep < max_sweeps) {
    ++sweep;
    for (int64_t k = 0; k < n; ++k) d[k] = (double)dot_n<F>(W + k * w, W + k * w, n);
    for (int64_t i = 0; i < n - 1; ++i) {
      int64_t best = i;
      for (int64_t k = i + 1; k < n; ++k)
        if (d[k] > d[best]) best = k;
      if (best != i) {
        std::swap(d[i], d[best]);
        std::swap_ranges(W + i * w, W + i * w + w, W + best * w);
      }
    }
    int64_t rotated = 0;
    double maxoff = 0.0;
    for (int64_t i = 0; i < n - 1; ++i) {
      F* wi = W + i * w;
      for (int64_t j = i + 1; j < n; ++j) {
        F* wj = W + j * w;
        const double g = (double)dot_n<F>(wi, wj, n);
        const double di = d[i], dj = d[j];
        const double dd = di * dj;
        if (!(g * g > tol2 * dd)) continue;
        if (stop_below > 0) maxoff = std::max(maxoff, g * g / dd);
        const double zeta = (dj - di) / (2.0 * g);
        const double t = std::copysign(1.0, zeta) / (std::fabs(zeta) + std::sqrt(1.0 + zeta * zeta));
        const double c = 1.0 / std::sqrt(1.0 + t * t);
        const double s = c * t;
        rotate_n<F>(wi, wj, w, (F)c, (F)s);
        d[i] = di - t * g;
        d[j] = dj + t * g;
        ++rotated;
      }
    }
    if (rotated == 0) break;
    // Early exit (used by the float phase only): every pair of this sweep started below
    // stop_below, so the quadratic convergence of the sweep has taken it far lower.
    if (maxoff < stop_below) break;
  }
  return sweep;
}

template <typename T>
int svd_jacobi_one(const T* M, int64_t n, T* U, T* S, T* Vh, T* P, double tol, int max_sweeps,
                   double* work, int64_t* iwork) {
  const int64_t w = 2 * n;
  double* W = work;              // n x 2n
  double* d = work + n * w;      // n: squared norms
  double* sig = d + n;           // n: singular values (unsorted)
  double* tmp = sig + n;         // n: scratch vector
  double* Ucols = work;          // reuse W's A half for U columns after convergence

  // Scale by a power of two (exact) so that squared norms neither overflow nor underflow.
  double amax = 0;
  for (int64_t k = 0; k < n * n; ++k) amax = std::max(amax, std::fabs((double)M[k]));
  int ex = 0;
  if (amax > 0) std::frexp(amax, &ex);
  const double scale = std::ldexp(1.0, -ex), unscale = std::ldexp(1.0, ex);

  for (int64_t c = 0; c < n; ++c) {
    double* row = W + c * w;
    for (int64_t r = 0; r < n; ++r) row[r] = (double)M[r * n + c] * scale;
    for (int64_t r = 0; r < n; ++r) row[n + r] = (r == c) ? 1.0 : 0.0;
  }

  int sweep = 0;
  if (amax > 0) {
    // All in double: a float first phase (tried) needed more sweeps in total and was
    // slower than double throughout on this CPU.
    sweep = jacobi_sweeps<double>(W, d, n, w, tol, max_sweeps);
  }

  // Singular values and descending order (stable on ties).
  for (int64_t k = 0; k < n; ++k) sig[k] = std::sqrt(dot_n(W + k * w, W + k * w, n));
  int64_t* order = iwork;
  std::iota(order, order + n, (int64_t)0);
  std::stable_sort(order, order + n, [&](int64_t a, int64_t b) { return sig[a] > sig[b]; });

  // Normalise U columns in place (row k of W's first half); mark null columns.
  const double null_thresh = 1e-140;  // relative to the scaled input (max |entry| in [0.5, 1))
  for (int64_t k = 0; k < n; ++k) {
    double* row = W + k * w;
    if (sig[k] > null_thresh) {
      const double inv = 1.0 / sig[k];
      for (int64_t r = 0; r < n; ++r) row[r] *= inv;
    } else {
      sig[k] = 0.0;
    }
  }
  // Complete null columns (in sorted order) with Gram-Schmidt on e_0, e_1, ... (twice).
  int64_t next_e = 0;
  for (int64_t kk = 0; kk < n; ++kk) {
    const int64_t k = order[kk];
    if (sig[k] > 0) continue;
    double* uk = W + k * w;
    for (; next_e < n; ++next_e) {
      for (int64_t r = 0; r < n; ++r) tmp[r] = (r == next_e) ? 1.0 : 0.0;
      for (int pass = 0; pass < 2; ++pass) {
        for (int64_t qq = 0; qq < n; ++qq) {
          const int64_t q = order[qq];
          if (q == k) continue;
          if (sig[q] == 0 && qq > kk) continue;  // not yet completed
          const double* uq = W + q * w;
          const double p = dot_n(tmp, uq, n);
          for (int64_t r = 0; r < n; ++r) tmp[r] -= p * uq[r];
        }
      }
      const double nn = std::sqrt(dot_n(tmp, tmp, n));
      if (nn > 0.5) {
        for (int64_t r = 0; r < n; ++r) uk[r] = tmp[r] / nn;
        ++next_e;
        break;
      }
    }
  }

  if (S)
    for (int64_t kk = 0; kk < n; ++kk) S[kk] = (T)(sig[order[kk]] * unscale);
  if (U)
    for (int64_t kk = 0; kk < n; ++kk) {
      const double* uk = Ucols + order[kk] * w;
      for (int64_t r = 0; r < n; ++r) U[r * n + kk] = (T)uk[r];
    }
  if (Vh)
    for (int64_t kk = 0; kk < n; ++kk) {
      const double* vk = W + order[kk] * w + n;
      for (int64_t c = 0; c < n; ++c) Vh[kk * n + c] = (T)vk[c];
    }
  if (P) {
    // P = sum_k u_k v_k^T, accumulated row by row in double.
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < n; ++c) tmp[c] = 0.0;
      for (int64_t k = 0; k < n; ++k) {
        const double urk = W[k * w + r];
        const double* vk = W + k * w + n;
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) tmp[c] += urk * vk[c];
      }
      for (int64_t c = 0; c < n; ++c) P[r * n + c] = (T)tmp[c];
    }
  }
  return sweep;
}

template int svd_jacobi_one<float>(const float*, int64_t, float*, float*, float*, float*, double,
                                   int, double*, int64_t*);
template int svd_jacobi_one<double>(const double*, int64_t, double*, double*, double*, double*,
                                    double, int, double*, int64_t*);
template double default_tol<float>(int64_t);
template double default_tol<double>(int64_t);

}  // namespace lmc
