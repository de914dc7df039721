// Jonker-Volgenant (LAPJV) for dense cost matrices. Written from the 1987 paper's
// description: column reduction, reduction transfer, augmenting row reduction, then
// Dijkstra-style shortest augmenting paths with column prices v and implicit row prices.
#include "assignment.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace lmc {

namespace {

// The caller's scores read in place as double costs (negated when maximising): no n x m copy.
template <typename T>
struct Costs {
  const T* c;
  double sign;
  struct Row {
    const T* r;
    double sign;
    double operator[](int64_t j) const { return sign * static_cast<double>(r[j]); }
  };
  Row operator+(int64_t offset) const { return Row{c + offset, sign}; }
  double operator[](int64_t k) const { return sign * static_cast<double>(c[k]); }
};

// Shortest augmenting path from free row f; updates x (row->col), y (col->row), v.
template <typename C>
void augment_from(const C& c, int64_t m, int64_t f, int64_t* x, int64_t* y, double* v,
                  double* d, int64_t* pred, int64_t* collist) {
  const auto cf = c + f * m;
  for (int64_t j = 0; j < m; ++j) {
    d[j] = cf[j] - v[j];
    pred[j] = f;
    collist[j] = j;
  }
  int64_t low = 0, up = 0, last = 0, endofpath = -1;
  double mn = 0;
  bool found = false;
  while (!found) {
    if (up == low) {
      // Collect the columns with minimal d among the unscanned ones into [low, up).
      last = low - 1;
      mn = d[collist[up++]];
      for (int64_t k = up; k < m; ++k) {
        const int64_t j = collist[k];
        const double h = d[j];
        if (h <= mn) {
          if (h < mn) {
            up = low;
            mn = h;
          }
          collist[k] = collist[up];
          collist[up++] = j;
        }
      }
      for (int64_t k = low; k < up; ++k) {
        if (y[collist[k]] < 0) {
          endofpath = collist[k];
          found = true;
          break;
        }
      }
    }
    if (!found) {
      // Scan one column at the minimum distance: relax through its row.
      const int64_t j1 = collist[low++];
      const int64_t i = y[j1];
      const auto ci = c + i * m;
      const double h = ci[j1] - v[j1] - mn;
      for (int64_t k = up; k < m; ++k) {
        const int64_t j = collist[k];
        const double v2 = ci[j] - v[j] - h;
        if (v2 < d[j]) {
          pred[j] = i;
          if (v2 == mn) {
            if (y[j] < 0) {
              endofpath = j;
              found = true;
              break;
            }
            collist[k] = collist[up];
            collist[up++] = j;
          }
          d[j] = v2;
        }
      }
    }
  }
  // Price update for the scanned columns.
  for (int64_t k = 0; k <= last; ++k) {
    const int64_t j1 = collist[k];
    v[j1] += d[j1] - mn;
  }
  // Augment along the predecessor chain.
  while (true) {
    const int64_t i = pred[endofpath];
    y[endofpath] = i;
    const int64_t j1 = endofpath;
    endofpath = x[i];
    x[i] = j1;
    if (i == f) break;
  }
}

// Each row in order takes its cheapest column under prices v (zero when v is null) if that
// column is still free; the others are appended to freerows. Rows end at an argmin of
// c_ij - v_j, so the implicit row prices u_i = min_j (c_ij - v_j) stay dual feasible.
template <typename C>
int64_t take_row_minima(const C& c, int64_t n, int64_t m, const double* v, int64_t* x,
                        int64_t* y, int64_t* freerows) {
  int64_t numfree = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto ci = c + i * m;
    double best = ci[0] - (v ? v[0] : 0.0);
    int64_t j1 = 0;
    for (int64_t j = 1; j < m; ++j) {
      const double h = ci[j] - (v ? v[j] : 0.0);
      if (h < best) {
        best = h;
        j1 = j;
      }
    }
    if (y[j1] < 0) {
      x[i] = j1;
      y[j1] = i;
    } else {
      freerows[numfree++] = i;
    }
  }
  return numfree;
}

template <typename C>
void lap_run(const C& c, int64_t n, int64_t m, int64_t* col, double* work, int64_t* iwork, int init_level,
             const double* v_init, double* v_out) {
  double* v = work;            // m
  double* d = work + m;        // m
  double* vmin = work + 2 * m; // m (column reduction)
  int64_t* y = iwork;          // m: column -> row
  int64_t* pred = iwork + m;   // m
  int64_t* collist = iwork + 2 * m;  // m
  int64_t* freerows = iwork + 3 * m; // up to max(n, m)
  int64_t* argmin = iwork + 4 * m;   // m
  int64_t* x = col;            // n: row -> column

  for (int64_t i = 0; i < n; ++i) x[i] = -1;
  for (int64_t j = 0; j < m; ++j) y[j] = -1;
  int64_t numfree = 0;
  const bool warm = v_init != nullptr && n == m && n > 1;

  bool warm_kept = false;
  if (warm) {
    // Warm start: any column prices are dual feasible with the implicit row prices
    // u_i = min_j (c_ij - v_j). Each row takes its best column under the caller's prices if
    // that column is still free; augmenting row reduction then places the contested rows.
    // When the problem moved far from the one the prices came from (over a quarter of the
    // rows contested), those prices are worse than none: restart cold.
    for (int64_t j = 0; j < m; ++j) v[j] = v_init[j];
    numfree = take_row_minima(c, n, m, v, x, y, freerows);
    warm_kept = 4 * numfree <= n;
    if (!warm_kept) {
      for (int64_t i = 0; i < n; ++i) x[i] = -1;
      for (int64_t j = 0; j < m; ++j) y[j] = -1;
      numfree = 0;
    }
  }
  if (warm_kept) {
    // Prices and partial assignment from the warm start.
  } else if (n == m && n > 1 && init_level >= 1) {
    // Column reduction: v_j = min_i c_ij, scanning rows (contiguous) not columns.
    for (int64_t j = 0; j < m; ++j) {
      vmin[j] = c[j];
      argmin[j] = 0;
    }
    for (int64_t i = 1; i < n; ++i) {
      const auto ci = c + i * m;
      for (int64_t j = 0; j < m; ++j)
        if (ci[j] < vmin[j]) {
          vmin[j] = ci[j];
          argmin[j] = i;
        }
    }
    // matches[i] counted in d (as doubles) to save a buffer.
    double* matches = d;
    for (int64_t i = 0; i < n; ++i) matches[i] = 0;
    for (int64_t j = m - 1; j >= 0; --j) {
      v[j] = vmin[j];
      const int64_t imin = argmin[j];
      matches[imin] += 1;
      if (matches[imin] == 1) {
        x[imin] = j;
        y[j] = imin;
      } else if (v[j] < v[x[imin]]) {
        const int64_t j1 = x[imin];
        x[imin] = j;
        y[j] = imin;
        y[j1] = -1;
      } else {
        y[j] = -1;
      }
    }
    // Reduction transfer from singly assigned rows.
    for (int64_t i = 0; i < n; ++i) {
      if (matches[i] == 0) {
        freerows[numfree++] = i;
      } else if (matches[i] == 1) {
        const int64_t j1 = x[i];
        const auto ci = c + i * m;
        double mu = std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < m; ++j)
          if (j != j1) mu = std::min(mu, ci[j] - v[j]);
        mu -= ci[j1] - v[j1];
        if (mu > 0) v[j1] -= mu;
      }
    }
  } else {
    for (int64_t j = 0; j < m; ++j) v[j] = 0;
    if (n < m && init_level >= 1) {
      // Rectangular: with zero prices each row may take its cheapest column if still free
      // (u_i = min_j c_ij keeps the duals feasible, and unassigned columns keep price 0, as
      // optimality needs when some columns stay unassigned). Most rows of a wide problem
      // land this way; only the contested ones need augmenting paths.
      numfree = take_row_minima(c, n, m, nullptr, x, y, freerows);
    } else {
      for (int64_t i = 0; i < n; ++i) freerows[numfree++] = i;
    }
  }

  if (n == m && n > 1 && (warm_kept || init_level >= 2)) {
    // Augmenting row reduction, two rounds.
    for (int round = 0; round < 2 && numfree > 0; ++round) {
      int64_t k = 0;
      const int64_t prvnumfree = numfree;
      numfree = 0;
      int64_t guard = 0;
      const int64_t guard_max = 100 * n + 1000;
      while (k < prvnumfree) {
        const int64_t i = freerows[k++];
        const auto ci = c + i * m;
        double umin = ci[0] - v[0], usubmin = std::numeric_limits<double>::infinity();
        int64_t j1 = 0, j2 = -1;
        for (int64_t j = 1; j < m; ++j) {
          const double h = ci[j] - v[j];
          if (h < usubmin) {
            if (h >= umin) {
              usubmin = h;
              j2 = j;
            } else {
              usubmin = umin;
              umin = h;
              j2 = j1;
              j1 = j;
            }
          }
        }
        int64_t i0 = y[j1];
        const bool strict = umin < usubmin;
        if (strict) {
          v[j1] -= usubmin - umin;
        } else if (i0 >= 0) {
          j1 = j2;
          i0 = y[j2];
        }
        x[i] = j1;
        y[j1] = i;
        if (i0 >= 0) {
          x[i0] = -1;
          if (strict && ++guard < guard_max)
            freerows[--k] = i0;
          else
            freerows[numfree++] = i0;
        }
      }
    }
  }

  // Augmentation for the remaining free rows.
  for (int64_t f = 0; f < numfree; ++f)
    augment_from(c, m, freerows[f], x, y, v, d, pred, collist);
  if (v_out != nullptr)
    for (int64_t j = 0; j < m; ++j) v_out[j] = v[j];
}

}  // namespace

template <typename T>
void lap_solve(const T* cost, bool maximize, int64_t n, int64_t m, int64_t* col, double* work,
               int64_t* iwork, int init_level, const double* v_init, double* v_out) {
  lap_run(Costs<T>{cost, maximize ? -1.0 : 1.0}, n, m, col, work, iwork, init_level, v_init, v_out);
}

template void lap_solve<float>(const float*, bool, int64_t, int64_t, int64_t*, double*, int64_t*, int,
                               const double*, double*);
template void lap_solve<double>(const double*, bool, int64_t, int64_t, int64_t*, double*, int64_t*, int,
                                const double*, double*);

}  // namespace lmc
