// compute_matmul.cpp — the bf16 path's choice (CPU flags and a probe) and the fp32 GEMM of bf16 values as an
// autograd function (compute_matmul.hpp says why). Legend as there: N rows, I inner size, O output columns.
#include "meshtrain/model/compute_matmul.hpp"

#include "meshtrain/common/cpu_info.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/model/matmul_peak.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>

namespace meshtrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kPathUnset = -1;
std::atomic<int> process_path{kPathUnset};

// The probe's width is the model's hidden size, within [256, 1024]: smaller products time mostly overheads.
constexpr int64_t kProbeRows = 256, kProbeMinWidth = 256, kProbeMaxWidth = 1024, kDefaultProbeWidth = 512;
constexpr double kProbeSeconds = 0.02;  // per dtype after its warm-up product; one product at least

// a_NI @ b_IO as an fp32 GEMM of bf16 values, rounded to bf16; the gradients the same way from the saved bf16
// operands. b is [I, O] (rows of a folded into N).
struct Fp32GemmOfBf16 : torch::autograd::Function<Fp32GemmOfBf16> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a_NI, const torch::Tensor& b_IO) {
    ctx->save_for_backward({a_NI, b_IO});
    return torch::matmul(a_NI.to(torch::kFloat32), b_IO.to(torch::kFloat32)).to(torch::kBFloat16);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &a_NI = saved[0], &b_IO = saved[1];
    const torch::Tensor grad32_NO = grad_outputs[0].to(torch::kFloat32);
    torch::Tensor grad_a_NI, grad_b_IO;
    if (ctx->needs_input_grad(0))
      grad_a_NI = torch::matmul(grad32_NO, b_IO.to(torch::kFloat32).transpose(-1, -2)).to(torch::kBFloat16);
    if (ctx->needs_input_grad(1)) {
      const torch::Tensor a32_NI = a_NI.to(torch::kFloat32);
      grad_b_IO = torch::matmul(a32_NI.reshape({-1, a_NI.size(-1)}).t(), grad32_NO.reshape({-1, grad32_NO.size(-1)}))
                      .to(torch::kBFloat16);
    }
    return {grad_a_NI, grad_b_IO};
  }
};

}  // namespace

std::string cpu_bf16_flags() {
  const CpuInfo cpu = read_cpu_info();
  std::string found;
  for (const char* flag : {"avx512_bf16", "amx_bf16", "bf16"})
    if (cpu.has(flag)) found += (found.empty() ? "" : " ") + std::string(flag);
  return found;
}

std::string Bf16MatmulChoice::describe() const {
  const std::string what = path == Bf16Matmul::native ? "libtorch's bf16 GEMMs" : "fp32 GEMMs of bf16 values";
  const std::string flags =
      bf16_flags.empty() ? "this CPU has no avx512_bf16/amx_bf16" : "this CPU has " + bf16_flags;
  if (setting != Bf16Matmul::automatic)
    return fmt::format("bf16 matmuls: {} (bf16_matmul={}; {})", what, bf16_matmul_name(setting), flags);
  const std::string probe =
      fmt::format("probe [{} x {}] x [{} x {}]: bf16 {:.1f} GFLOP/s vs fp32 {:.1f}", probe_rows, probe_width,
                  probe_width, probe_width, probe_bf16_gflops, probe_fp32_gflops);
  const std::string other = path == Bf16Matmul::native ? "fp32_gemm" : "native";
  return fmt::format("bf16 matmuls: {} ({}; {}; bf16_matmul={} forces the other path)", what, flags, probe, other);
}

Bf16MatmulChoice choose_bf16_matmul(Bf16Matmul setting, int64_t hidden_size) {
  MT_CHECK(hidden_size >= 1, "choose_bf16_matmul: hidden size {}", hidden_size);
  Bf16MatmulChoice choice;
  choice.setting = setting;
  choice.bf16_flags = cpu_bf16_flags();
  if (setting != Bf16Matmul::automatic) {
    choice.path = setting;
    return choice;
  }
  choice.probe_rows = kProbeRows;
  choice.probe_width = std::clamp(hidden_size, kProbeMinWidth, kProbeMaxWidth);
  const int64_t w = choice.probe_width;
  choice.probe_bf16_gflops = measure_matmul_rate(torch::kBFloat16, kProbeRows, w, w, kProbeSeconds).best_gflops;
  choice.probe_fp32_gflops = measure_matmul_rate(torch::kFloat32, kProbeRows, w, w, kProbeSeconds).best_gflops;
  // Native needs both: the instructions, and a libtorch that uses them for this product.
  const bool native = !choice.bf16_flags.empty() && choice.probe_bf16_gflops >= choice.probe_fp32_gflops;
  choice.path = native ? Bf16Matmul::native : Bf16Matmul::fp32_gemm;
  return choice;
}

void set_bf16_matmul(Bf16Matmul path) {
  MT_CHECK(path != Bf16Matmul::automatic, "set_bf16_matmul: a path (native or fp32_gemm), not auto");
  process_path.store(static_cast<int>(path));
}

Bf16Matmul bf16_matmul() {
  const int path = process_path.load();
  if (path != kPathUnset) return static_cast<Bf16Matmul>(path);
  static const Bf16Matmul chosen = [] {  // once per process, whichever thread asks first
    const Bf16MatmulChoice choice = choose_bf16_matmul(Bf16Matmul::automatic, kDefaultProbeWidth);
    log::info("{} (no path was set: chosen at the first bf16 matmul)", choice.describe());
    return choice.path;
  }();
  int unset = kPathUnset;
  process_path.compare_exchange_strong(unset, static_cast<int>(chosen));
  return static_cast<Bf16Matmul>(process_path.load());
}

torch::Dtype gemm_dtype(torch::Dtype compute_dtype) {
  return compute_dtype == torch::kBFloat16 && bf16_matmul() == Bf16Matmul::fp32_gemm ? torch::kFloat32
                                                                                     : compute_dtype;
}

torch::Tensor gemm_operand(const torch::Tensor& t, torch::Dtype compute_dtype) {
  if (gemm_dtype(compute_dtype) == compute_dtype) return t.to(compute_dtype);
  return t.to(torch::kBFloat16).to(torch::kFloat32);  // the bf16 rounding first (no-op for a bf16 t), then widened
}

torch::Tensor gemm(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& out, bool accumulate) {
  if (a.scalar_type() != torch::kBFloat16 || bf16_matmul() == Bf16Matmul::native) {
    if (!out.defined()) return at::mm(a, b);
    torch::Tensor into = out;
    return accumulate ? into.addmm_(a, b) : at::mm_out(into, a, b);
  }
  const torch::Tensor result = at::mm(a.to(torch::kFloat32), b.to(torch::kFloat32));
  if (!out.defined()) return result.to(torch::kBFloat16);
  torch::Tensor into = out;
  return accumulate ? into.copy_((into.to(torch::kFloat32) + result).to(torch::kBFloat16)) : into.copy_(result);
}

torch::Tensor compute_matmul(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != torch::kBFloat16 || bf16_matmul() == Bf16Matmul::native) return torch::matmul(a, b);
  MT_CHECK(b.scalar_type() == torch::kBFloat16, "compute_matmul: a is bf16, b is {}", c10::toString(b.scalar_type()));
  MT_CHECK(a.dim() >= 2 && b.dim() == 2, "compute_matmul: expected a [..., N, I] with b [I, O], got {} and {}",
           c10::str(a.sizes()), c10::str(b.sizes()));
  return Fp32GemmOfBf16::apply(a, b);
}

}  // namespace meshtrain::model
