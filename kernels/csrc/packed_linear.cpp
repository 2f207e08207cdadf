// switchyard_cpu::packed_linear: x @ W^T (+ bias) on a oneDNN-packed matrix named by an int handle,
// the C++ twin of the Python op in builtin_engine/packed_linear.py. A compiled step calls it between
// its generated kernels with no Python in between, so the gaps stay short enough for the second
// OpenMP thread to still be spinning when the next GEMM starts. The handle → matrix table is filled
// from Python when a matrix is packed and emptied when its PackedMatrix goes.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace {

std::mutex table_mutex;
std::unordered_map<int64_t, at::Tensor> matrices;

void remember_packed(int64_t handle, const at::Tensor& packed) {
  std::lock_guard<std::mutex> lock(table_mutex);
  matrices[handle] = packed;
}

void forget_packed(int64_t handle) {
  std::lock_guard<std::mutex> lock(table_mutex);
  matrices.erase(handle);
}

at::Tensor packed_linear(const at::Tensor& x, int64_t handle, int64_t out_features,
                         const std::optional<at::Tensor>& bias) {
  at::Tensor matrix;
  {
    std::lock_guard<std::mutex> lock(table_mutex);
    auto found = matrices.find(handle);
    TORCH_CHECK(found != matrices.end(), "packed matrix ", handle, " is gone (its model was freed)");
    matrix = found->second;
  }
  static const auto linear_pointwise =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, std::string_view,
                            c10::List<std::optional<at::Scalar>>, std::optional<std::string_view>)>();
  at::Tensor out = linear_pointwise.call(x, matrix, bias, "none", c10::List<std::optional<at::Scalar>>(),
                                         std::string_view(""));
  TORCH_CHECK(out.size(-1) == out_features, "packed matrix ", handle, " has ", out.size(-1), " outputs, not ",
              out_features);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(switchyard_cpu, m) {
  m.def("remember_packed(int handle, Tensor packed) -> ()", &remember_packed);
  m.def("forget_packed(int handle) -> ()", &forget_packed);
  m.def("packed_linear(Tensor x, int handle, int out_features, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(switchyard_cpu, CPU, m) {
  m.impl("packed_linear", &packed_linear);
}
