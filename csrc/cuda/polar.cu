// Batched small SVD / polar factor on the GPU: one thread block per matrix, one-sided
// Jacobi (Hestenes) in shared memory, double precision inside.
//
// The n columns (padded to an even count with a zero column) are paired by the
// round-robin ("circle") tournament ordering: each of the n-1 steps of a sweep rotates
// n/2 disjoint column pairs in parallel, one group of G threads per pair (G a power of
// two <= 32, so a group lives inside one warp and reduces with shuffles). Storage is
// column-major in shared memory: A = M V (n x n) and V (n x n), columns contiguous.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <string>

#include "cuda_api.h"

namespace lmc {
namespace cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int circle_pos(int k, int s, int np) {
  // Position k (0..np-1) in round s of the circle method with player 0 fixed.
  return k == 0 ? 0 : ((k - 1 + s) % (np - 1)) + 1;
}

template <typename T>
__global__ void polar_jacobi_kernel(const T* __restrict__ Min, T* __restrict__ Uout,
                                    T* __restrict__ Sout, T* __restrict__ Vhout,
                                    T* __restrict__ Pout, int n, double tol, int max_sweeps) {
  extern __shared__ double smem[];
  const int np = n + (n & 1);  // padded column count (even)
  double* A = smem;            // np columns of length n (column-major)
  double* V = A + np * n;      // np columns of length np
  double* sig = V + np * np;   // np
  int* order = reinterpret_cast<int*>(sig + np);  // np: sorted position -> column
  __shared__ double s_scale;
  __shared__ int s_any;

  const int tid = threadIdx.x;
  const int nthreads = blockDim.x;
  const T* M = Min + (size_t)blockIdx.x * n * n;

  // Load A = M (column-major) and V = I; find max |entry| for power-of-two scaling.
  double local_max = 0.0;
  for (int idx = tid; idx < n * n; idx += nthreads) {
    const int r = idx / n, c = idx % n;
    const double val = (double)M[idx];
    A[c * n + r] = val;
    local_max = fmax(local_max, fabs(val));
  }
  for (int idx = tid; idx < n; idx += nthreads) {
    if (np != n) A[n * n + idx] = 0.0;  // zero padding column
  }
  for (int idx = tid; idx < np * np; idx += nthreads) V[idx] = (idx / np == idx % np) ? 1.0 : 0.0;
  // Block max.
  for (int off = 16; off > 0; off >>= 1) local_max = fmax(local_max, __shfl_xor_sync(0xffffffffu, local_max, off));
  if (tid == 0) s_scale = 0.0;
  __syncthreads();
  if ((tid & 31) == 0) {
    // atomicMax on doubles via bit pattern (non-negative values order like integers).
    atomicMax(reinterpret_cast<unsigned long long*>(&s_scale), (unsigned long long)__double_as_longlong(local_max));
  }
  __syncthreads();
  const double amax = s_scale;
  int ex = 0;
  if (amax > 0) frexp(amax, &ex);
  const double scale = ldexp(1.0, -ex), unscale = ldexp(1.0, ex);
  for (int idx = tid; idx < n * n; idx += nthreads) A[idx] *= scale;
  __syncthreads();

  const int npairs = np / 2;
  int G = 1;
  while (G * 2 <= 32 && G * 2 * npairs <= nthreads) G *= 2;
  const int pair = tid / G;  // may be >= npairs: idle in the rotation phase
  const int lane = tid % G;
  const unsigned gmask = (G == 32) ? 0xffffffffu : (((1u << G) - 1u) << ((tid & 31) / G * G));

  if (amax > 0) {
    for (int sweep = 0; sweep < max_sweeps; ++sweep) {
      if (tid == 0) s_any = 0;
      __syncthreads();
      int any = 0;
      for (int step = 0; step < np - 1; ++step) {
        if (pair < npairs) {
          int i = circle_pos(pair, step, np), j = circle_pos(np - 1 - pair, step, np);
          if (i > j) { const int t = i; i = j; j = t; }
          double* ai = A + i * n;
          double* aj = A + j * n;
          double g = 0, di = 0, dj = 0;
          for (int r = lane; r < n; r += G) {
            const double x = ai[r], y = aj[r];
            g += x * y; di += x * x; dj += y * y;
          }
          for (int off = G / 2; off > 0; off >>= 1) {
            g += __shfl_xor_sync(gmask, g, off);
            di += __shfl_xor_sync(gmask, di, off);
            dj += __shfl_xor_sync(gmask, dj, off);
          }
          if (fabs(g) > tol * sqrt(di * dj)) {
            const double zeta = (dj - di) / (2.0 * g);
            const double t = copysign(1.0, zeta) / (fabs(zeta) + sqrt(1.0 + zeta * zeta));
            const double c = rsqrt(1.0 + t * t);
            const double s = c * t;
            for (int r = lane; r < n; r += G) {
              const double x = ai[r], y = aj[r];
              ai[r] = c * x - s * y;
              aj[r] = s * x + c * y;
            }
            double* vi = V + i * np;
            double* vj = V + j * np;
            for (int r = lane; r < np; r += G) {
              const double x = vi[r], y = vj[r];
              vi[r] = c * x - s * y;
              vj[r] = s * x + c * y;
            }
            any = 1;
          }
        }
        __syncthreads();
      }
      if (any) s_any = 1;  // benign race: every writer stores 1
      __syncthreads();
      if (!s_any) break;
    }
  }

  // Singular values (column norms) of the n real columns.
  for (int k = tid; k < n; k += nthreads) {
    double s = 0;
    for (int r = 0; r < n; ++r) s += A[k * n + r] * A[k * n + r];
    sig[k] = sqrt(s);
  }
  __syncthreads();
  // Rank of each column in descending order (ties by index): order[rank] = k.
  for (int k = tid; k < n; k += nthreads) {
    int rank = 0;
    const double sk = sig[k];
    for (int q = 0; q < n; ++q) rank += (sig[q] > sk) || (sig[q] == sk && q < k);
    order[rank] = k;
  }
  __syncthreads();
  // Normalise U columns; null columns (zero singular value) get sig = 0.
  const double null_thresh = 1e-140;
  for (int idx = tid; idx < n * n; idx += nthreads) {
    const int k = idx / n;
    const double sk = sig[k];
    A[idx] = sk > null_thresh ? A[idx] / sk : 0.0;
  }
  __syncthreads();
  if (tid == 0) {
    // Rare path: complete the null columns to an orthonormal basis (serial Gram-Schmidt
    // on e_0, e_1, ..., twice), in sorted order, exactly as the CPU code does.
    bool has_null = false;
    for (int k = 0; k < n; ++k) if (!(sig[k] > null_thresh)) { sig[k] = 0.0; has_null = true; }
    if (has_null) {
      double tmp[kPolarMaxN];
      int next_e = 0;
      for (int kk = 0; kk < n; ++kk) {
        const int k = order[kk];
        if (sig[k] > 0) continue;
        for (; next_e < n; ++next_e) {
          for (int r = 0; r < n; ++r) tmp[r] = (r == next_e) ? 1.0 : 0.0;
          for (int pass = 0; pass < 2; ++pass) {
            for (int qq = 0; qq < n; ++qq) {
              const int q = order[qq];
              if (q == k) continue;
              if (sig[q] == 0 && qq > kk) continue;
              const double* uq = A + q * n;
              double p = 0;
              for (int r = 0; r < n; ++r) p += tmp[r] * uq[r];
              for (int r = 0; r < n; ++r) tmp[r] -= p * uq[r];
            }
          }
          double nn = 0;
          for (int r = 0; r < n; ++r) nn += tmp[r] * tmp[r];
          nn = sqrt(nn);
          if (nn > 0.5) {
            for (int r = 0; r < n; ++r) A[k * n + r] = tmp[r] / nn;
            ++next_e;
            break;
          }
        }
      }
    }
  }
  __syncthreads();

  const size_t base = (size_t)blockIdx.x * n * n;
  if (Sout)
    for (int kk = tid; kk < n; kk += nthreads) Sout[(size_t)blockIdx.x * n + kk] = (T)(sig[order[kk]] * unscale);
  if (Uout)
    for (int idx = tid; idx < n * n; idx += nthreads) {
      const int r = idx / n, kk = idx % n;
      Uout[base + idx] = (T)A[order[kk] * n + r];
    }
  if (Vhout)
    for (int idx = tid; idx < n * n; idx += nthreads) {
      const int kk = idx / n, c = idx % n;
      Vhout[base + idx] = (T)V[order[kk] * np + c];
    }
  if (Pout)
    for (int idx = tid; idx < n * n; idx += nthreads) {
      const int r = idx / n, c = idx % n;
      double acc = 0;
      for (int k = 0; k < n; ++k) acc += A[k * n + r] * V[k * np + c];
      Pout[base + idx] = (T)acc;
    }
}

template <typename T>
std::string launch(uintptr_t M, uintptr_t U, uintptr_t S, uintptr_t Vh, uintptr_t P, int64_t B,
                   int64_t n, double tol, int max_sweeps, uintptr_t stream) {
  const int np = (int)(n + (n & 1));
  const size_t smem = sizeof(double) * ((size_t)np * n + (size_t)np * np + np) + sizeof(int) * np;
  auto kern = polar_jacobi_kernel<T>;
  cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  const int64_t max_grid = 2147483647LL;
  for (int64_t b0 = 0; b0 < B; b0 += max_grid) {
    const int64_t nb = (B - b0 < max_grid) ? (B - b0) : max_grid;
    const size_t off = (size_t)b0 * n * n;
    kern<<<(unsigned)nb, kThreads, smem, reinterpret_cast<cudaStream_t>(stream)>>>(
        reinterpret_cast<const T*>(M) + off, U ? reinterpret_cast<T*>(U) + off : nullptr,
        S ? reinterpret_cast<T*>(S) + (size_t)b0 * n : nullptr,
        Vh ? reinterpret_cast<T*>(Vh) + off : nullptr, P ? reinterpret_cast<T*>(P) + off : nullptr,
        (int)n, tol, max_sweeps);
    err = cudaGetLastError();
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  return std::string();
}

}  // namespace

std::string polar_svd(uintptr_t M, uintptr_t U, uintptr_t S, uintptr_t Vh, uintptr_t P, int64_t B,
                      int64_t n, int dtype, double tol, int max_sweeps, uintptr_t stream) {
  if (n < 1 || n > kPolarMaxN) return "polar_svd: n must be in [1, 64] on the GPU path";
  if (B <= 0) return std::string();
  if (dtype == 0) return launch<float>(M, U, S, Vh, P, B, n, tol, max_sweeps, stream);
  if (dtype == 1) return launch<double>(M, U, S, Vh, P, B, n, tol, max_sweeps, stream);
  return "polar_svd: dtype must be float32 (0) or float64 (1)";
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

}  // namespace cuda
}  // namespace lmc
