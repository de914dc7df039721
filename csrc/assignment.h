// Exact linear assignment (Jonker-Volgenant shortest augmenting path), CPU.
#pragma once
#include <cstdint>

namespace lmc {

// Minimise sum_i cost[i, col[i]] over injective maps rows -> columns for a dense n x m
// row-major cost matrix with n <= m and finite entries. Writes col (n entries).
// Square problems use the full LAPJV initialisation (column reduction, reduction
// transfer, two rounds of augmenting row reduction) before the augmentation phase;
// rectangular ones use the augmentation phase from zero duals.
// work: at least 4*m doubles; iwork: at least 5*m + n int64.
void lap_solve(const double* cost, int64_t n, int64_t m, int64_t* col, double* work,
               int64_t* iwork);

}  // namespace lmc
