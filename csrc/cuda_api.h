// Host-side entry points of the CUDA kernels (csrc/cuda/*.cu). Pointers are raw device
// pointers, the stream is a cudaStream_t passed as an integer (0 = legacy default stream).
#pragma once
#include <cstdint>
#include <string>

namespace lmc {
namespace cuda {

// Largest n handled by the one-block-per-matrix Jacobi kernel.
constexpr int kPolarMaxN = 64;

// Batched SVD / polar factor of B row-major n x n matrices (n <= kPolarMaxN), computed in
// double inside the kernel. dtype: 0 = float32, 1 = float64. Any of U, S, Vh, P may be 0.
// Returns an empty string on success, else the CUDA error text.
std::string polar_svd(uintptr_t M, uintptr_t U, uintptr_t S, uintptr_t Vh, uintptr_t P,
                      int64_t B, int64_t n, int dtype, double tol, int max_sweeps,
                      uintptr_t stream);

// Number of visible CUDA devices (0 when no driver / no device).
int device_count();

}  // namespace cuda
}  // namespace lmc
