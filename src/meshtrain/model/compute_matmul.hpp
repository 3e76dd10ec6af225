// compute_matmul.hpp — the model's matmuls in the compute dtype, and how this process runs the bf16 ones.
//
// A CPU with bf16 instructions (avx512_bf16, amx_bf16) multiplies bf16 in oneDNN faster than fp32. On one without
// them (AVX2 only: AMD EPYC Zen 3) libtorch 1.13's bf16 GEMM is a generic loop, 4.9 GFLOP/s against 149-179 for
// fp32 through OpenBLAS, so a bf16 step would be ~30x slower than fp32 (BENCHMARKS.md, "bf16 on a CPU without bf16").
// There a bf16 matmul runs as an fp32 GEMM of the bf16 values ("fp32_gemm"): a product of two bf16 values is exact in
// fp32, so this is a bf16 GEMM with fp32 accumulation (what oneDNN computes) up to summation order, its result
// rounded to bf16. Only the GEMM's operands are widened, for the GEMM's duration: the tensors around it stay bf16
// (activations kept for backward, FSDP's gathers, gradients between layers).
//
// The path is one choice per process (each host decides for its own CPU): the setting bf16_matmul=auto|native|
// fp32_gemm (configs/defaults.yaml), where auto reads the CPU's flags and times a bf16 and an fp32 product of the
// model's projection shape (choose_bf16_matmul). Until a path is set, the first bf16 matmul chooses automatically
// (logged), so that no caller runs the slow path unknowingly.
//
// Legend: N rows (tokens), I inner (contracted) size, O output columns; "..." leading batch dimensions.
#pragma once

#include "meshtrain/settings/settings.hpp"

#include <torch/torch.h>

#include <optional>
#include <string>

namespace meshtrain::model {

using settings::Bf16Matmul;
using settings::bf16_matmul_from_name;
using settings::bf16_matmul_name;

// The torch dtype of compute_dtype.
inline torch::Dtype torch_dtype(settings::ComputeDtype dtype) {
  return dtype == settings::ComputeDtype::bfloat16 ? torch::kBFloat16 : torch::kFloat32;
}

// What decided the path, for the start-up line.
struct Bf16MatmulChoice {
  Bf16Matmul path = Bf16Matmul::native;  // native or fp32_gemm
  Bf16Matmul setting = Bf16Matmul::automatic;
  std::string bf16_flags;  // the CPU's bf16 flags found ("avx512_bf16 amx_bf16"), "" for none
  // The probe (auto only; 0 when forced): GFLOP/s of the fastest [rows, width] x [width, width] product timed in
  // each dtype.
  int64_t probe_rows = 0, probe_width = 0;
  double probe_bf16_gflops = 0, probe_fp32_gflops = 0;

  // "bf16 matmuls: fp32 GEMMs of bf16 values (this CPU has no avx512_bf16/amx_bf16; probe [256 x 768] x [768 x 768]:
  // bf16 4.9 GFLOP/s vs fp32 150.2; bf16_matmul=native forces libtorch's bf16 GEMM)"
  std::string describe() const;
};

// The path for `setting`: native or fp32_gemm as forced; auto: native when the CPU lists a bf16 flag and a bf16
// product of the model's projection shape ([256, D] x [D, D], D = hidden_size within [256, 1024]) runs at least as
// fast as the fp32 one on the calling thread's torch threads (the flags alone would trust a libtorch that may not use
// them; the probe alone, a noisy timing), fp32_gemm otherwise. The probe times a warm-up product and then products for
// 0.02 s (one at least) per dtype and compares the fastest of each: about 0.1 s on a CPU without bf16. Sets nothing.
Bf16MatmulChoice choose_bf16_matmul(Bf16Matmul setting, int64_t hidden_size);

// The bf16 CPU flags /proc/cpuinfo lists (avx512_bf16, amx_bf16; bf16 on Arm), space-separated; "" for none.
std::string cpu_bf16_flags();

// The path every bf16 matmul of this process takes from now on (native or fp32_gemm). Set at start-up, before
// device threads compute; tests set either path.
void set_bf16_matmul(Bf16Matmul path);
// The path set, or when none was set, the automatic choice for a 512-wide projection (made once, and logged).
Bf16Matmul bf16_matmul();

// The dtype the GEMMs of `compute_dtype` run in on this process's path: kFloat32 for bf16 on fp32_gemm, else
// `compute_dtype` (the matmul peak that MFU divides by, the OpenMP setting that suits the GEMM's library).
torch::Dtype gemm_dtype(torch::Dtype compute_dtype);

// `t` as a GEMM of `compute_dtype` reads it: t.to(compute_dtype), except bf16 on fp32_gemm: fp32 holding t's
// values rounded to bf16. For a caller that does its own GEMMs outside autograd and reuses an operand (the chunked
// head loss): torch::matmul of two of these, then .to(compute_dtype), is what compute_matmul computes.
torch::Tensor gemm_operand(const torch::Tensor& t, torch::Dtype compute_dtype);

// a [N, I] @ b [I, O] outside autograd, as compute_matmul computes it: in their dtype (both fp32 or both bf16), bf16
// on fp32_gemm as an fp32 GEMM of the bf16 values rounded to bf16. For a caller that writes its own backward. With
// `out` ([N, O], a's dtype) the result is written there (straight from the GEMM where it runs in a's dtype) and
// `out` is returned; with `accumulate`, added to what `out` holds.
torch::Tensor gemm(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& out = {},
                   bool accumulate = false);

// a @ b in their dtype (both fp32 or both bf16), differentiable; bf16 on fp32_gemm saves the bf16 operands for
// backward, and its gradients are fp32 GEMMs of bf16 values too, rounded to bf16. Shapes: a [..., N, I] with
// b [I, O] (a projection); the result is [..., N, O].
torch::Tensor compute_matmul(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace meshtrain::model
