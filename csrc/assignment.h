// Exact linear assignment (Jonker-Volgenant shortest augmenting path), CPU.
#pragma once
#include <cstdint>

namespace lmc {

// Minimise sum_i cost[i, col[i]] (maximise with `maximize`) over injective maps rows -> columns
// for a dense n x m row-major score matrix with n <= m and finite entries, read in place as
// doubles (float32 scores cost no copy: at n = m = 14336 a double copy would be 1.6 GB).
// Writes col (n entries).
// Square problems start with LAPJV's initialisation: init_level 1 = column reduction and
// reduction transfer (the default: measured fastest on random dense scores here),
// 2 = also two rounds of augmenting row reduction (slower on Gaussian scores), 0 = none.
// Rectangular problems run the augmentation phase from zero column duals.
// Warm start (square problems only; ignored otherwise): v_init holds m column prices, e.g.
// v_out of an earlier solve of a similar cost matrix; they replace the initialisation and
// only the rows whose best column is contested need augmenting paths. Any prices give the
// same optimum; good ones save time. v_out (nullable) receives the final column prices, of
// the minimisation (of the negated scores when maximising).
// work: at least 4*m doubles; iwork: at least 5*m + n int64. T: float or double.
template <typename T>
void lap_solve(const T* cost, bool maximize, int64_t n, int64_t m, int64_t* col, double* work,
               int64_t* iwork, int init_level = 1, const double* v_init = nullptr,
               double* v_out = nullptr);

}  // namespace lmc
