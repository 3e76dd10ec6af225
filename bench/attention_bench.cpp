// attention_bench.cpp — causal attention forward + backward on one device: the tiled kernel
// (model/flash_attention.hpp) against the blocked attention the model ran before it (blocks of 64 queries against the
// keys they see, scores and softmax through libtorch, kept for backward), alternated, with this machine's fp32 matmul
// rate measured in the same run.
//
//   build-dir/bench/attention_bench [--seq 8192] [--batch 1] [--heads 12] [--kv-heads 4] [--head-dim 64] [--threads 2]
//                                   [--runs 3] [--no-blocked]
//
// The defaults are llama-100m's attention shapes, fp32, on the threads a 1-device host of this 2-core machine gives
// its device (runtime/compute_threads.hpp; OpenBLAS's pool set to the same count, passive OpenMP waits as `meshtrain`
// restarts with). A run times one forward + backward of each (after one untimed warm-up of each at the same shapes),
// the gradient of a fixed random output gradient.
//
// FLOP counting, the causal half only (T x T / 2 query-key pairs per head, 2 E FLOPs per pair and product): forward 2
// products (scores, probabilities x V), backward 5 (the scores again, dV, dP, dK, dQ): 7 x B x H x E x T x T FLOPs per
// forward + backward. "of matmul" divides that rate by the measured rate of 2048^3 fp32 matmuls on the same threads.
#include "meshtrain/model/flash_attention.hpp"
#include "meshtrain/model/matmul_peak.hpp"
#include "meshtrain/runtime/compute_threads.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <iostream>

using namespace meshtrain;

namespace {

// LlamaAttention::forward's attention before the tiled kernel (its loop over blocks of 64 queries; fp32, so its
// compute_matmul calls were torch::matmul). q [B, H, T, E], k and v [B, K, T, E]; returns [B, T, H, E].
torch::Tensor blocked_attention(const torch::Tensor& q_BHTE, const torch::Tensor& k_BKSE, const torch::Tensor& v_BKSE) {
  constexpr int64_t kQueryBlock = 64;
  const int64_t B = q_BHTE.size(0), H = q_BHTE.size(1), T = q_BHTE.size(2), E = q_BHTE.size(3);
  const int64_t K = k_BKSE.size(1), G = H / K, S = k_BKSE.size(2);
  const torch::Tensor q_scaled_BHTE = q_BHTE * (1.0 / std::sqrt(double(E)));
  std::vector<torch::Tensor> out_blocks_BQHE;
  for (int64_t t0 = 0; t0 < T; t0 += kQueryBlock) {
    const int64_t Q = std::min(kQueryBlock, T - t0), P = S - T + t0 + Q;
    const torch::Tensor q_BKRE = q_scaled_BHTE.narrow(2, t0, Q).reshape({B, K, G * Q, E});
    const torch::Tensor k_BKPE = k_BKSE.narrow(2, 0, P), v_BKPE = v_BKSE.narrow(2, 0, P);
    const torch::Tensor scores_BKRP = torch::matmul(q_BKRE, k_BKPE.transpose(-1, -2));
    const torch::Tensor future_QP = torch::ones({Q, P}, torch::kBool).triu(S - T + t0 + 1);
    const torch::Tensor scores_BKGQP = scores_BKRP.view({B, K, G, Q, P}).masked_fill(future_QP, -INFINITY);
    const torch::Tensor probs_BKRP = torch::softmax(scores_BKGQP, -1).view({B, K, G * Q, P});
    const torch::Tensor out_BKRE = torch::matmul(probs_BKRP, v_BKPE);
    out_blocks_BQHE.push_back(out_BKRE.view({B, H, Q, E}).transpose(1, 2));
  }
  return out_blocks_BQHE.size() == 1 ? out_blocks_BQHE[0] : torch::cat(out_blocks_BQHE, 1);
}

torch::Tensor tiled_attention(const torch::Tensor& q_BHTE, const torch::Tensor& k_BKSE, const torch::Tensor& v_BKSE) {
  const int64_t T = q_BHTE.size(2);
  return model::flash_attention(q_BHTE, k_BKSE, v_BKSE, model::AttentionMask::causal(0, T, T)).out_BHTE.transpose(1, 2);
}

// Seconds of one forward + backward of `attention` ([B, T, H, E] out) for the output gradient grad_BTHE.
template <class Attention>
double time_step(Attention attention, const torch::Tensor& q_BHTE, const torch::Tensor& k_BKSE,
                 const torch::Tensor& v_BKSE, const torch::Tensor& grad_BTHE) {
  const auto start = std::chrono::steady_clock::now();
  const torch::Tensor out_BTHE = attention(q_BHTE, k_BKSE, v_BKSE);
  const auto grads = torch::autograd::grad({out_BTHE}, {q_BHTE, k_BKSE, v_BKSE}, {grad_BTHE});
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"causal attention forward + backward: the tiled kernel against the blocked attention it replaced"};
  int64_t seq = 8192, batch = 1, heads = 12, kv_heads = 4, head_dim = 64;
  int threads = 2, runs = 3;
  bool no_blocked = false;
  app.add_option("--seq", seq)->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--heads", heads)->capture_default_str();
  app.add_option("--kv-heads", kv_heads)->capture_default_str();
  app.add_option("--head-dim", head_dim)->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--runs", runs, "alternated runs of each")->capture_default_str();
  app.add_flag("--no-blocked", no_blocked, "time the tiled kernel only");
  CLI11_PARSE(app, argc, argv);
  runtime::restart_with_passive_openmp_waits(threads, torch::kFloat32);
  const std::string blas = runtime::set_blas_threads(threads);
  at::set_num_threads(threads);

  auto gen = at::detail::createCPUGenerator(0);
  const torch::Tensor q_BHTE = torch::randn({batch, heads, seq, head_dim}, gen).requires_grad_();
  const torch::Tensor k_BKSE = torch::randn({batch, kv_heads, seq, head_dim}, gen).requires_grad_();
  const torch::Tensor v_BKSE = torch::randn({batch, kv_heads, seq, head_dim}, gen).requires_grad_();
  const torch::Tensor grad_BTHE = torch::randn({batch, seq, heads, head_dim}, gen);
  const double flops = 7.0 * batch * heads * head_dim * static_cast<double>(seq) * seq;
  const model::MatmulPeak peak = model::measure_matmul_peak(torch::kFloat32, 2048, 2.0);

  std::cout << fmt::format("causal attention fwd+bwd, B={} H={} K={} T={} E={}, fp32, {} threads ({}; OpenMP {}); "
                           "{:.1f} GFLOP counted (7 x B H E T^2)\n  fp32 matmul 2048^3: {:.1f} GFLOP/s\n",
                           batch, heads, kv_heads, seq, head_dim, threads, blas, runtime::openmp_wait_setting(),
                           flops / 1e9, peak.gflops);
  time_step(tiled_attention, q_BHTE, k_BKSE, v_BKSE, grad_BTHE);  // warm-up
  if (!no_blocked) time_step(blocked_attention, q_BHTE, k_BKSE, v_BKSE, grad_BTHE);
  for (int run = 1; run <= runs; ++run) {
    const double blocked = no_blocked ? 0 : time_step(blocked_attention, q_BHTE, k_BKSE, v_BKSE, grad_BTHE);
    const double tiled = time_step(tiled_attention, q_BHTE, k_BKSE, v_BKSE, grad_BTHE);
    const double rate = flops / tiled / 1e9;
    std::cout << fmt::format("  run {}: tiled {:.2f} s ({:.1f} GFLOP/s, {:.0f}% of matmul)", run, tiled, rate,
                             100 * rate / peak.gflops);
    if (!no_blocked)
      std::cout << fmt::format("   blocked {:.2f} s ({:.1f} GFLOP/s)   tiled / blocked throughput {:.2f}x", blocked,
                               flops / blocked / 1e9, blocked / tiled);
    std::cout << "\n";
  }
  const model::MatmulPeak after = model::measure_matmul_peak(torch::kFloat32, 2048, 2.0);
  std::cout << fmt::format("  fp32 matmul 2048^3 after the runs: {:.1f} GFLOP/s\n", after.gflops);
  return 0;
}
