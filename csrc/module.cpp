// pybind11 module lmc_fast._C: batched small SVD / polar factor and batched linear
// assignment on numpy arrays (CPU, OpenMP across the batch), plus the CUDA launchers
// taking raw device pointers and a stream handle. No libtorch dependency.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef LMC_FAST_OPENMP
#include <omp.h>
#endif

#include "assignment.h"
#include "cuda_api.h"
#include "polar.h"

namespace py = pybind11;

#ifndef LMC_FAST_VERSION
#define LMC_FAST_VERSION "0.0.0"
#endif
#ifndef LMC_FAST_COMPILER
#define LMC_FAST_COMPILER "unknown"
#endif

namespace {

int max_threads() {
#ifdef LMC_FAST_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int resolve_threads(int num_threads, int64_t batch) {
  int t = num_threads > 0 ? num_threads : max_threads();
  if (batch < t) t = (int)std::max<int64_t>(1, batch);
  return t;
}

// Shape checks shared by the SVD entry points: (B, n, n).
void check_square_batch(const py::array& a, const char* fn) {
  if (a.ndim() != 3)
    throw py::value_error(std::string(fn) + ": expected a (B, n, n) array, got ndim=" +
                          std::to_string(a.ndim()));
  if (a.shape(1) != a.shape(2))
    throw py::value_error(std::string(fn) + ": matrices must be square, got (" +
                          std::to_string(a.shape(1)) + ", " + std::to_string(a.shape(2)) + ")");
}

template <typename T>
py::tuple svd_impl(py::array arr, bool want_uv, bool want_s, bool want_p, double tol,
                   int max_sweeps, int num_threads, bool newton) {
  // The Newton iteration serves the polar-only request; U, S, Vh need the Jacobi SVD.
  newton = newton && want_p && !want_uv && !want_s;
  auto M = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(arr);
  if (!M) throw py::value_error("svd: could not convert input to a contiguous array");
  const int64_t B = M.shape(0), n = M.shape(1);
  if (tol <= 0) tol = lmc::default_tol<T>(n);
  std::vector<py::ssize_t> mshape{B, n, n}, sshape{B, n};
  py::array_t<T> U, S, Vh, P;
  if (want_uv) {
    U = py::array_t<T>(mshape);
    Vh = py::array_t<T>(mshape);
  }
  if (want_s) S = py::array_t<T>(sshape);
  if (want_p) P = py::array_t<T>(mshape);
  py::array_t<int32_t> sweeps(std::vector<py::ssize_t>{B});

  const T* src = M.data();
  T* u = want_uv ? U.mutable_data() : nullptr;
  T* vh = want_uv ? Vh.mutable_data() : nullptr;
  T* s = want_s ? S.mutable_data() : nullptr;
  T* p = want_p ? P.mutable_data() : nullptr;
  int32_t* sw = sweeps.mutable_data();
  const int nt = resolve_threads(num_threads, B);
  {
    py::gil_scoped_release release;
#ifdef LMC_FAST_OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
      std::vector<double> work(lmc::polar_work_size(n));
      std::vector<int64_t> iwork(n + 1);
#ifdef LMC_FAST_OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
      for (int64_t b = 0; b < B; ++b) {
        const size_t off = (size_t)b * n * n;
        if (newton) {
          const int iters = lmc::polar_newton_one<T>(src + off, n, p + off, work.data(), iwork.data());
          if (iters > 0) {
            sw[b] = -iters;  // converged: minus the Newton iterations, no Jacobi sweeps
            continue;
          }
        }
        sw[b] = lmc::svd_jacobi_one<T>(src + off, n, u ? u + off : nullptr,
                                       s ? s + (size_t)b * n : nullptr, vh ? vh + off : nullptr,
                                       p ? p + off : nullptr, tol, max_sweeps, work.data(),
                                       iwork.data());
      }
    }
  }
  (void)nt;
  return py::make_tuple(U, S, Vh, P, sweeps);
}

py::tuple svd_dispatch(py::array arr, bool want_uv, bool want_s, bool want_p, double tol,
                       int max_sweeps, int num_threads, const char* fn,
                       const std::string& method = "jacobi") {
  if (method != "jacobi" && method != "newton")
    throw py::value_error(std::string(fn) + ": method must be 'newton' or 'jacobi', got '" + method + "'");
  const bool newton = method == "newton";
  check_square_batch(arr, fn);
  if (max_sweeps < 1) throw py::value_error(std::string(fn) + ": max_sweeps must be >= 1");
  const auto kind = arr.dtype().kind();
  const auto size = arr.dtype().itemsize();
  if (kind == 'f' && size == 4)
    return svd_impl<float>(arr, want_uv, want_s, want_p, tol, max_sweeps, num_threads, newton);
  if (kind == 'f' && size == 8)
    return svd_impl<double>(arr, want_uv, want_s, want_p, tol, max_sweeps, num_threads, newton);
  throw py::type_error(std::string(fn) + ": dtype must be float32 or float64, got " +
                       std::string(py::str(arr.dtype())));
}

template <typename T>
py::object lap_impl(py::array arr, bool maximize, int num_threads, int init_level,
                    py::object duals, bool return_duals) {
  auto C = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(arr);
  if (!C) throw py::value_error("linear_assignment: could not convert input");
  const int64_t B = C.shape(0), n = C.shape(1), m = C.shape(2);
  py::array_t<double, py::array::c_style | py::array::forcecast> v_in;
  if (!duals.is_none()) {
    v_in = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(duals);
    if (!v_in || v_in.ndim() != 2 || v_in.shape(0) != B || v_in.shape(1) != m)
      throw py::value_error("linear_assignment: duals must be a (B, m) = (" + std::to_string(B) +
                            ", " + std::to_string(m) + ") float array from an earlier call");
  }
  py::array_t<int64_t> out(std::vector<py::ssize_t>{B, n});
  py::array_t<double> v_out(std::vector<py::ssize_t>{return_duals ? B : 0, m});
  const T* src = C.data();
  const double* vin = duals.is_none() ? nullptr : v_in.data();
  double* vout = return_duals ? v_out.mutable_data() : nullptr;
  int64_t* dst = out.mutable_data();
  bool bad = false;
  const int nt = resolve_threads(num_threads, B);
  {
    py::gil_scoped_release release;
#ifdef LMC_FAST_OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
      std::vector<double> work(4 * m + 8);
      std::vector<int64_t> iwork(5 * m + n + 8);
#ifdef LMC_FAST_OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
      for (int64_t b = 0; b < B; ++b) {
        const T* cb = src + (size_t)b * n * m;
        bool finite = true;  // the solver reads the scores in place: checked first, not copied
        for (size_t k = 0; k < (size_t)n * m; ++k) finite &= std::isfinite(static_cast<double>(cb[k]));
        const double* vb = vin ? vin + (size_t)b * m : nullptr;
        for (int64_t j = 0; vb && j < m; ++j) finite &= std::isfinite(vb[j]);
        if (!finite) {
#ifdef LMC_FAST_OPENMP
#pragma omp atomic write
#endif
          bad = true;
          continue;
        }
        lmc::lap_solve(cb, maximize, n, m, dst + (size_t)b * n, work.data(), iwork.data(), init_level,
                       vb, vout ? vout + (size_t)b * m : nullptr);
      }
    }
  }
  (void)nt;
  if (bad) throw py::value_error("linear_assignment: costs and duals must be finite (found NaN or inf)");
  if (return_duals) return py::make_tuple(out, v_out);
  return out;
}

py::object linear_assignment(py::array arr, bool maximize, int num_threads, int init_level,
                             py::object duals, bool return_duals) {
  if (arr.ndim() != 3)
    throw py::value_error("linear_assignment: expected a (B, n, m) array, got ndim=" +
                          std::to_string(arr.ndim()));
  if (arr.shape(1) > arr.shape(2))
    throw py::value_error("linear_assignment: needs rows <= columns, got (" +
                          std::to_string(arr.shape(1)) + ", " + std::to_string(arr.shape(2)) +
                          ")");
  const auto kind = arr.dtype().kind();
  const auto size = arr.dtype().itemsize();
  if (kind == 'f' && size == 4)
    return lap_impl<float>(arr, maximize, num_threads, init_level, duals, return_duals);
  if ((kind == 'f' && size == 8) || kind == 'i' || kind == 'u')
    return lap_impl<double>(arr, maximize, num_threads, init_level, duals, return_duals);
  throw py::type_error("linear_assignment: dtype must be float32, float64 or integer, got " +
                       std::string(py::str(arr.dtype())));
}

bool have_cuda() {
#ifdef LMC_FAST_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void polar_cuda(uintptr_t M, uintptr_t U, uintptr_t S, uintptr_t Vh, uintptr_t P, int64_t B,
                int64_t n, const std::string& dtype, double tol, int max_sweeps, uintptr_t stream) {
#ifdef LMC_FAST_WITH_CUDA
  int code;
  if (dtype == "float32") code = 0;
  else if (dtype == "float64") code = 1;
  else throw py::type_error("polar_cuda: dtype must be 'float32' or 'float64', got " + dtype);
  if (tol <= 0) tol = code == 0 ? lmc::default_tol<float>(n) : lmc::default_tol<double>(n);
  std::string err;
  {
    py::gil_scoped_release release;
    err = lmc::cuda::polar_svd(M, U, S, Vh, P, B, n, code, tol, max_sweeps, stream);
  }
  if (!err.empty()) throw std::runtime_error("polar_cuda: " + err);
#else
  (void)M; (void)U; (void)S; (void)Vh; (void)P; (void)B; (void)n; (void)dtype; (void)tol;
  (void)max_sweeps; (void)stream;
  throw std::runtime_error("polar_cuda: lmc_fast._C was built without CUDA");
#endif
}

int cuda_device_count() {
#ifdef LMC_FAST_WITH_CUDA
  return lmc::cuda::device_count();
#else
  return 0;
#endif
}

py::dict build_info() {
  py::dict d;
  d["version"] = LMC_FAST_VERSION;
#ifdef LMC_FAST_OPENMP
  d["openmp"] = true;
#else
  d["openmp"] = false;
#endif
  d["openmp_threads"] = max_threads();
  d["cuda"] = have_cuda();
#ifdef LMC_FAST_CUDA_ARCHES
  d["cuda_arches"] = LMC_FAST_CUDA_ARCHES;
#else
  d["cuda_arches"] = "";
#endif
#ifdef LMC_FAST_WITH_CUDA
  d["cuda_polar_max_n"] = lmc::cuda::kPolarMaxN;
#else
  d["cuda_polar_max_n"] = 0;
#endif
  d["compiler"] = LMC_FAST_COMPILER;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "lmc_fast compiled kernels: batched small SVD / polar factor, batched linear assignment";

  m.def(
      "svd_small",
      [](py::array M, double tol, int max_sweeps, int num_threads) {
        py::tuple r = svd_dispatch(M, true, true, false, tol, max_sweeps, num_threads, "svd_small");
        return py::make_tuple(r[0], r[1], r[2]);
      },
      py::arg("M"), py::arg("tol") = 0.0, py::arg("max_sweeps") = 60, py::arg("num_threads") = 0,
      "Batched SVD of a (B, n, n) float32/float64 array by one-sided Jacobi in double.\n"
      "Returns (U, S, Vh) with M = U diag(S) Vh and S descending (torch.linalg.svd convention).\n"
      "Columns of U for exactly-zero singular values are completed to an orthonormal basis.");
  m.def(
      "polar",
      [](py::array M, double tol, int max_sweeps, int num_threads, const std::string& method) {
        py::tuple r = svd_dispatch(M, false, false, true, tol, max_sweeps, num_threads, "polar", method);
        return py::object(r[3]);
      },
      py::arg("M"), py::arg("tol") = 0.0, py::arg("max_sweeps") = 60, py::arg("num_threads") = 0,
      py::arg("method") = "newton",
      "Orthogonal polar factor U Vh of each matrix of a (B, n, n) array.\n"
      "method='newton': scaled Newton iteration in double, falling back to the Jacobi SVD for\n"
      "numerically singular matrices; method='jacobi': always the Jacobi SVD.");
  m.def(
      "polar_svd",
      [](py::array M, bool want_uv, bool want_s, bool want_p, double tol, int max_sweeps,
         int num_threads, const std::string& method) {
        return svd_dispatch(M, want_uv, want_s, want_p, tol, max_sweeps, num_threads, "polar_svd", method);
      },
      py::arg("M"), py::arg("want_uv") = true, py::arg("want_s") = true, py::arg("want_p") = true,
      py::arg("tol") = 0.0, py::arg("max_sweeps") = 60, py::arg("num_threads") = 0,
      py::arg("method") = "jacobi",
      "General entry: returns (U, S, Vh, P, sweeps); unrequested outputs are None.\n"
      "method='newton' applies to the polar-only request (want_p alone); sweeps holds minus the\n"
      "Newton iterations where that converged, else the Jacobi sweeps of the fallback.");
  m.def("linear_assignment", &linear_assignment, py::arg("C"), py::arg("maximize") = true,
        py::arg("num_threads") = 0, py::arg("init_level") = 1, py::arg("duals") = py::none(),
        py::arg("return_duals") = false,
        "Exact batched linear assignment (Jonker-Volgenant) of a (B, n, m) array, n <= m.\n"
        "Returns (B, n) int64 column indices. Costs must be finite.\n"
        "duals: (B, m) column prices of an earlier solve of similar problems (same sense) to\n"
        "warm-start square problems; return_duals=True returns (cols, duals).");
  m.def("polar_cuda", &polar_cuda, py::arg("M"), py::arg("U"), py::arg("S"), py::arg("Vh"),
        py::arg("P"), py::arg("B"), py::arg("n"), py::arg("dtype"), py::arg("tol") = 0.0,
        py::arg("max_sweeps") = 60, py::arg("stream") = 0,
        "CUDA batched SVD / polar factor on raw device pointers (0 = not wanted), n <= 64.");
  m.def("cuda_device_count", &cuda_device_count);
  m.def("build_info", &build_info);
}
