// model_step_bench.cpp — training-step throughput of meshtrain's Llama against the same model and step in PyTorch
// eager from Python (bench/model_step_peer.py, same libtorch), in one run, with MFU as the trainer computes it.
//
//   build-dir/model_step_bench [--model llama-100m] [--batch 4] [--seq 256] [--threads 2] [--dtype bf16] [--steps 3]
//                              [--bf16-matmul auto|native|fp32_gemm] [--no-peer] [--trace-dir DIR] [--set KEY=VALUE]
//                              [--quick]
//
// A step is forward, cross-entropy loss, backward and an AdamW update on random tokens; the first step of each side
// warms up and is not timed. Both sides do the same work, and the bench proves it: the peer starts from meshtrain's
// initial weights and trains on the same tokens (a safetensors file meshtrain writes), and every step's loss must
// agree (fp32: 1e-4 relative; bf16: 2e-2), or the bench fails without printing a ratio. meshtrain's side runs what its trainer runs on one device: the process memory set-up of
// the `meshtrain` binary (runtime/block_cache_allocator.hpp), the fused head loss (no [B, T, V] logits) and its own
// AdamW; the peer is what a PyTorch user writes (full logits, F.cross_entropy, torch.optim.AdamW). Prints tokens/s
// of both, the ratio meshtrain / PyTorch, and MFU. With several threads on fp32 GEMMs the bench restarts itself with
// libgomp's idle threads sleeping, as `meshtrain` does (runtime/compute_threads.hpp); the peer inherits the setting.
//
// bf16 matmuls run as `meshtrain` runs them (model/compute_matmul.hpp): --bf16-matmul as the config key bf16_matmul,
// the path printed; MFU divides by the peak of the GEMMs that run (fp32 on the fp32_gemm path), decided as the trainer
// decides it (train::decide_peak_flops: the larger of the CPU's theoretical peak and a measured rate), and is also
// printed against the theoretical peak alone. The peer runs
// PyTorch's own bf16 GEMM, ~30x slower than fp32 on a CPU without bf16 instructions: --no-peer leaves it out.
//
// --trace-dir DIR: after the timed steps, each side runs `steps` more under libtorch's operator profiler (untimed: the
// profiler adds its own cost per op) and writes a Chrome trace, DIR/meshtrain.json and DIR/pytorch.json;
// bench/step_profile.py DIR/*.json --steps N lists the top operators by self time per step.
//
// --set KEY=VALUE (repeatable) overrides the model's config as `meshtrain train` takes it (model.num_local_experts=8:
// a Mixtral, timed with --no-peer, as the peer writes a dense Llama). --quick: one timed step per side (unless
// --steps is given), about a minute for llama-100m in fp32 with the peer.
//
// The record opens with a header naming the CPU (model and the flags that decide matmul speed), the commit of the
// source and the load average before and after the run.
#include "meshtrain/common/atomic_file.hpp"
#include "meshtrain/common/cpu_info.hpp"
#include "meshtrain/config/config.hpp"
#include "meshtrain/model/compute_matmul.hpp"
#include "meshtrain/model/llama.hpp"
#include "meshtrain/model/safetensors.hpp"
#include "meshtrain/runtime/block_cache_allocator.hpp"
#include "meshtrain/runtime/compute_threads.hpp"
#include "meshtrain/train/adamw.hpp"
#include "meshtrain/train/metrics.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <torch/csrc/autograd/profiler_legacy.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

using namespace meshtrain;

namespace {

// The standard output of a shell command; nullopt when it cannot start or exits non-zero.
std::optional<std::string> command_output(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return std::nullopt;
  std::string output;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
  if (::pclose(pipe) != 0) return std::nullopt;
  return output;
}

// "0.52 0.61 0.70": the 1, 5 and 15-minute load averages.
std::string load_average() {
  std::ifstream file("/proc/loadavg");
  std::string one, five, fifteen;
  file >> one >> five >> fifteen;
  return fmt::format("{} {} {}", one, five, fifteen);
}

// "commit 529a2d2" (" with uncommitted changes"), or "commit unknown" outside a git checkout.
std::string source_commit() {
  const std::string git = fmt::format("git -C '{}' ", MESHTRAIN_SOURCE_DIR);
  const std::optional<std::string> head = command_output(git + "rev-parse --short HEAD 2>/dev/null");
  if (!head) return "commit unknown";
  const std::optional<std::string> changes = command_output(git + "status --porcelain --untracked-files=no");
  return fmt::format("commit {}{}", head->substr(0, head->find('\n')),
                     changes && !changes->empty() ? " with uncommitted changes" : "");
}

// What the peer reports: its throughput and the loss of each of its steps (the warm-up step's first).
struct PeerResult {
  double tokens_per_s = 0;
  std::vector<double> losses;
};

// Runs the peer on the weights and tokens of `start_file` (written by write_start); nullopt (after printing why)
// when it fails.
std::optional<PeerResult> run_peer(const config::LlamaConfig& config, const std::string& start_file, int threads,
                                   const std::string& dtype_name, int steps, const std::string& trace_dir,
                                   const std::string& peer_environment) {
  const std::string peer_script = std::string(MESHTRAIN_SOURCE_DIR) + "/bench/model_step_peer.py";
  const std::string command = fmt::format(
      "{} /usr/bin/python3 {} --config '{}' --start '{}' --threads {} --dtype {} --steps {}", peer_environment,
      peer_script,
      config.to_hf_json("float32").dump(), start_file, threads, dtype_name, steps) +
      (trace_dir.empty() ? "" : fmt::format(" --trace '{}/pytorch.json'", trace_dir));
  const std::optional<std::string> output = command_output(command);
  if (!output) {
    std::cerr << "the PyTorch peer failed: " << command << "\n";
    return std::nullopt;
  }
  const nlohmann::json result = nlohmann::json::parse(*output);
  return PeerResult{result.at("tokens_per_s").get<double>(), result.at("losses").get<std::vector<double>>()};
}

// The start both sides train from: the model's initial parameters (Hugging Face names) and the token batch
// ("tokens", int64 [batch, seq + 1]), one safetensors file.
void write_start(const std::string& path, model::LlamaForCausalLM& llama, const torch::Tensor& tokens) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : llama.named_parameters()) tensors.emplace_back(item.key(), item.value().detach());
  tensors.emplace_back("tokens", tokens);
  AtomicFileWriter out(path);
  model::write_safetensors(out, tensors);
  out.commit();
}

}  // namespace

int main(int argc, char** argv) {
  if (!runtime::set_up_process_memory()) return 2;
  CLI::App app{"meshtrain Llama training step vs PyTorch eager (Python) on the same model and batch"};
  std::string model_name = "llama-100m", dtype_name = "bf16", bf16_matmul_name = "auto";
  int64_t batch = 4, seq = 256;
  int threads = 2, steps = 3;
  bool no_peer = false;
  std::string trace_dir;
  std::vector<std::string> model_overrides;
  app.add_option("--model", model_name)->capture_default_str();
  app.add_option("--set", model_overrides, "a config override, repeatable (e.g. model.num_local_experts=8)");
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--seq", seq)->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--dtype", dtype_name)->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--bf16-matmul", bf16_matmul_name, "how bf16 matmuls run, as the config key bf16_matmul")
      ->check(CLI::IsMember({"auto", "native", "fp32_gemm"}))
      ->capture_default_str();
  app.add_flag("--no-peer", no_peer, "time meshtrain only (no PyTorch peer, no ratio)");
  std::string peer_malloc = "tcmalloc";
  app.add_option("--peer-malloc", peer_malloc, "the peer's allocator, as parallel_bench.sh's PEER_MALLOC")
      ->check(CLI::IsMember({"tcmalloc", "jemalloc", "glibc-tuned", "glibc"}))
      ->capture_default_str();
  bool quick = false;
  app.add_flag("--quick", quick, "1 timed step per side (unless --steps is given)");
  app.add_option("--trace-dir", trace_dir, "write operator traces of `steps` extra steps of each side here");
  CLI11_PARSE(app, argc, argv);
  if (quick && app.count("--steps") == 0) steps = 1;
  const std::string load_before = load_average();
  const torch::Dtype dtype = dtype_name == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  at::set_num_threads(threads);

  const config::LlamaConfig config =
      settings::Settings::from_config(config::Config::load(config::default_config_dir(), [&] {
        std::vector<std::string> overrides{"model=" + model_name};
        overrides.insert(overrides.end(), model_overrides.begin(), model_overrides.end());
        return overrides;
      }()))
          .model;
  if (config.is_moe() && !no_peer) {
    std::cerr << "model_step_bench: the PyTorch peer is a dense Llama; time a Mixtral with --no-peer\n";
    return 2;
  }
  std::string bf16_path;  // the start-up line of bf16 compute
  if (dtype == torch::kBFloat16) {
    const model::Bf16MatmulChoice choice =
        model::choose_bf16_matmul(*model::bf16_matmul_from_name(bf16_matmul_name), config.hidden_size);
    model::set_bf16_matmul(choice.path);
    bf16_path = choice.describe();
  }
  runtime::restart_with_passive_openmp_waits(threads, model::gemm_dtype(dtype));

  model::LlamaForCausalLM llama(config);
  model::initialize_parameters(llama, 0);
  llama.set_compute_dtype(dtype);
  const std::vector<torch::Tensor> parameters = llama.parameters();
  train::AdamWOptions adamw;  // torch.optim.AdamW's defaults, as the peer's
  adamw.learning_rate = 1e-4;
  train::AdamW optimizer(adamw, parameters);
  torch::Tensor tokens = torch::randint(config.vocab_size, {batch, seq + 1}, torch::kInt64);
  torch::Tensor inputs = tokens.narrow(1, 0, seq), targets = tokens.narrow(1, 1, seq);
  const std::string start_file = (std::filesystem::temp_directory_path() /
                                  fmt::format("model_step_bench_start_{}.safetensors", ::getpid()))
                                     .string();
  // The peer at its best (BENCHMARKS.md, "The peer's settings"): Debian's tcmalloc by LD_PRELOAD unless told
  // otherwise; its OpenMP waits are this process's (set above).
  const std::string lib = "/usr/lib/x86_64-linux-gnu/";
  const std::string preloaded = peer_malloc == "tcmalloc"   ? lib + "libtcmalloc_minimal.so.4"
                                : peer_malloc == "jemalloc" ? lib + "libjemalloc.so.2"
                                                            : "";
  const std::string peer_environment =
      !preloaded.empty()             ? "LD_PRELOAD=" + preloaded
      : peer_malloc == "glibc-tuned" ? "GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
                                       "glibc.malloc.trim_threshold=1099511627776"
                                     : "";
  if (!no_peer && !preloaded.empty() && !std::filesystem::exists(preloaded)) {
    std::cerr << "model_step_bench: --peer-malloc " << peer_malloc << " needs " << preloaded
              << " (bash scripts/setup.sh installs it)\n";
    return 2;
  }
  if (!no_peer) write_start(start_file, llama, tokens);
  double timed = 0, loss = 0;
  std::vector<double> losses;  // of every step, the warm-up's first
  auto train_step = [&] {
    for (const torch::Tensor& p : parameters) p.mutable_grad().reset();
    torch::Tensor l = llama.loss_sum(inputs, targets) / static_cast<double>(batch * seq);
    l.backward();
    std::vector<torch::Tensor> grads;
    for (const torch::Tensor& p : parameters) grads.push_back(p.grad());
    optimizer.step(grads, adamw.learning_rate);
    loss = l.item<double>();
    losses.push_back(loss);
  };
  for (int step = 0; step <= steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    train_step();
    if (step) timed += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double ours = static_cast<double>(batch * seq * steps) / timed;
  if (!trace_dir.empty()) {
    std::filesystem::create_directories(trace_dir);
    torch::autograd::profiler::RecordProfile profile(trace_dir + "/meshtrain.json");
    for (int step = 0; step < steps; ++step) train_step();
  }

  double peer = 0;
  std::string agreement;
  if (!no_peer) {
    const std::optional<PeerResult> result = run_peer(config, start_file, threads, dtype_name, steps, trace_dir,
                                                       peer_environment);
    std::filesystem::remove(start_file);
    if (!result) return 1;
    peer = result->tokens_per_s;
    // Equal work: the same start, the same batch, the same updates give the same losses, step by step (bf16: within
    // its rounding, which differs between meshtrain's fp32 GEMMs of bf16 values and autocast's).
    const double tolerance = dtype == torch::kBFloat16 ? 2e-2 : 1e-4;
    double worst = 0;
    for (size_t k = 0; k < std::min(result->losses.size(), losses.size()); ++k)
      worst = std::max(worst, std::abs(result->losses[k] - losses[k]) / std::abs(losses[k]));
    if (result->losses.size() != losses.size() || worst > tolerance) {
      std::cerr << fmt::format("the peer did other work: losses meshtrain [{:.6f}], PyTorch [{:.6f}] (relative "
                               "difference up to {:.2e}, tolerance {:.0e}); no ratio\n",
                               fmt::join(losses, ", "), fmt::join(result->losses, ", "), worst, tolerance);
      return 1;
    }
    agreement = fmt::format("  equal work: both sides start from meshtrain's initial weights and train on the same "
                            "tokens; their {} losses agree within {:.1e} relative (tolerance {:.0e})\n",
                            losses.size(), worst, tolerance);
  }

  const torch::Dtype gemm = model::gemm_dtype(dtype);
  const train::PeakFlops peak = train::decide_peak_flops(0, dtype, threads);
  const double flops_per_token = config.training_flops_per_token(seq);
  auto mfu = [&](double tokens_per_s) { return 100 * tokens_per_s * flops_per_token / peak.flops; };
  auto of_theoretical = [&](double tokens_per_s) {
    return peak.theoretical > 0 ? fmt::format(" ({:.1f}% of the theoretical peak)",
                                              100 * tokens_per_s * flops_per_token / peak.theoretical)
                                : std::string();
  };
  const CpuInfo cpu = read_cpu_info();
  std::string report = fmt::format("model_step_bench: CPU {} (SIMD flags: {}), {}; load average (1/5/15 min) "
                                   "before {}, after {}\n", cpu.model.empty() ? "unknown" : cpu.model,
                                   cpu.matmul_flags().empty() ? "none of avx fma avx2 avx512f avx512_bf16 amx_bf16"
                                                              : cpu.matmul_flags(),
                                   source_commit(), load_before, load_average());
  report += fmt::format("model {} ({:.1f}M parameters), batch {} x seq {}, {} threads, {} compute, {} timed "
                                   "steps\n", model_name, config.parameter_count() / 1e6, batch, seq, threads,
                                   dtype_name, steps);
  if (!bf16_path.empty()) report += fmt::format("  {}\n", bf16_path);
  report +=
      fmt::format("  meshtrain (C++)       {:9.1f} tokens/s   loss {:.4f}   MFU {:5.1f}%{}\n", ours, loss, mfu(ours),
                  of_theoretical(ours));
  if (!no_peer)
    report += fmt::format("  PyTorch eager (Python){:9.1f} tokens/s                  MFU {:5.1f}%{}\n"
                          "  ratio meshtrain / PyTorch: {:.2f}x\n", peer, mfu(peer), of_theoretical(peer), ours / peer);
  report += agreement;
  report += fmt::format("  {} ({} GEMMs, {} threads); {:.2f} GFLOP per token (6N + attention)\n"
                        "  OpenMP ({}): {}{}\n", peak.describe(), gemm == torch::kBFloat16 ? "bf16" : "fp32", threads,
                        flops_per_token / 1e9, no_peer ? "meshtrain" : "both sides", runtime::openmp_wait_setting(),
                        no_peer ? "" : fmt::format("; the peer's allocator: {} ({})", peer_malloc,
                                                   peer_environment.empty() ? "glibc's defaults" : peer_environment));
  std::cout << report;
  return 0;
}
