// Batched small SVD / orthogonal polar factor (one-sided Jacobi, Hestenes), CPU.
#pragma once
#include <cstdint>

namespace lmc {

// One n x n matrix M (row-major). Any of U (n x n), S (n), Vh (n x n), P (n x n) may be
// null. Computes in double. Returns the number of Jacobi sweeps used.
//
// Conventions follow torch.linalg.svd: M = U diag(S) Vh, S descending, and P = U Vh is
// the orthogonal polar factor (the maximiser of tr(R^T M) over orthogonal R).
// Rank-deficient input: U is always orthogonal. Columns of U that belong to zero
// singular values (below 1e-140 times the largest absolute entry, i.e. exactly zero up
// to rounding) are completed to an orthonormal basis by Gram-Schmidt on the standard
// basis vectors, in order; P = U Vh is then one valid maximiser of tr(R^T M). Columns for
// tiny but nonzero singular values keep the direction Jacobi found (orthogonal to the
// others to the convergence tolerance). An all-zero matrix gives U = I, S = 0, Vh = I.
template <typename T>
int svd_jacobi_one(const T* M, int64_t n, T* U, T* S, T* Vh, T* P, double tol, int max_sweeps,
                   double* work /* size >= polar_work_size(n) */, int64_t* iwork /* size >= n */);

// Orthogonal polar factor P (n x n) of a well-conditioned M by the scaled Newton iteration in
// double (polar_newton.cpp). Returns the number of iterations (each one n x n Gauss-Jordan
// inverse), or 0, leaving P unspecified, for numerically singular input or no convergence;
// callers then fall back to svd_jacobi_one.
// work: >= 2 n^2 doubles (polar_work_size is enough); iwork: >= n.
template <typename T>
int polar_newton_one(const T* M, int64_t n, T* P, double* work, int64_t* iwork);

// Number of doubles svd_jacobi_one needs as work space.
inline int64_t polar_work_size(int64_t n) { return 4 * n * n + 6 * n + 16; }

// Convergence tolerance used for output type T: |a_i . a_j| <= tol * |a_i| |a_j|.
template <typename T>
double default_tol(int64_t n);

}  // namespace lmc
