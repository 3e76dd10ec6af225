// model_step_bench.cpp — training-step throughput of meshtrain's Llama against the same model and step in PyTorch
// eager from Python (bench/model_step_peer.py, same libtorch), in one run, with MFU against the measured matmul peak.
//
//   build-dir/model_step_bench [--model llama-100m] [--batch 4] [--seq 256] [--threads 2] [--dtype bf16] [--steps 3]
//                              [--trace-dir DIR]
//
// A step is forward, cross-entropy loss, backward and an AdamW update on random tokens; the first step of each side
// warms up and is not timed. meshtrain's side runs what its trainer runs on one device: the process memory set-up of
// the `meshtrain` binary (runtime/block_cache_allocator.hpp), the fused head loss (no [B, T, V] logits) and its own
// AdamW; the peer is what a PyTorch user writes (full logits, F.cross_entropy, torch.optim.AdamW). Prints tokens/s
// of both, the ratio meshtrain / PyTorch, and MFU. With several threads on fp32 the bench restarts itself with
// libgomp's idle threads sleeping, as `meshtrain` does (runtime/compute_threads.hpp); the peer inherits the setting.
//
// --trace-dir DIR: after the timed steps, each side runs `steps` more under libtorch's operator profiler (untimed: the
// profiler adds its own cost per op) and writes a Chrome trace, DIR/meshtrain.json and DIR/pytorch.json;
// bench/step_profile.py DIR/*.json --steps N lists the top operators by self time per step.
#include "meshtrain/model/llama.hpp"
#include "meshtrain/model/matmul_peak.hpp"
#include "meshtrain/runtime/block_cache_allocator.hpp"
#include "meshtrain/runtime/compute_threads.hpp"
#include "meshtrain/train/adamw.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <torch/csrc/autograd/profiler_legacy.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

using namespace meshtrain;

int main(int argc, char** argv) {
  if (!runtime::set_up_process_memory()) return 2;
  CLI::App app{"meshtrain Llama training step vs PyTorch eager (Python) on the same model and batch"};
  std::string model_name = "llama-100m", dtype_name = "bf16";
  int64_t batch = 4, seq = 256;
  int threads = 2, steps = 3;
  std::string trace_dir;
  app.add_option("--model", model_name)->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--seq", seq)->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--dtype", dtype_name)->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--trace-dir", trace_dir, "write operator traces of `steps` extra steps of each side here");
  CLI11_PARSE(app, argc, argv);
  const torch::Dtype dtype = dtype_name == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  runtime::restart_with_passive_openmp_waits(threads, dtype);
  at::set_num_threads(threads);

  config::LlamaConfig config = config::LlamaConfig::from_run_config(
      config::Config::load(config::default_config_dir(), {"model=" + model_name}));
  model::LlamaForCausalLM llama(config);
  model::initialize_parameters(llama, 0);
  llama.set_compute_dtype(dtype);
  const std::vector<torch::Tensor> parameters = llama.parameters();
  train::AdamWOptions adamw;  // torch.optim.AdamW's defaults, as the peer's
  adamw.learning_rate = 1e-4;
  train::AdamW optimizer(adamw, parameters);
  torch::Tensor tokens = torch::randint(config.vocab_size, {batch, seq + 1}, torch::kInt64);
  torch::Tensor inputs = tokens.narrow(1, 0, seq), targets = tokens.narrow(1, 1, seq);
  double timed = 0, loss = 0;
  auto train_step = [&] {
    for (const torch::Tensor& p : parameters) p.mutable_grad().reset();
    torch::Tensor l = llama.loss_sum(inputs, targets) / static_cast<double>(batch * seq);
    l.backward();
    std::vector<torch::Tensor> grads;
    for (const torch::Tensor& p : parameters) grads.push_back(p.grad());
    optimizer.step(grads, adamw.learning_rate);
    loss = l.item<double>();
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

  const std::string peer_script = std::string(MESHTRAIN_SOURCE_DIR) + "/bench/model_step_peer.py";
  const std::string command = fmt::format(
      "/usr/bin/python3 {} --config '{}' --batch {} --seq {} --threads {} --dtype {} --steps {}", peer_script,
      config.to_hf_json("float32").dump(), batch, seq, threads, dtype_name, steps) +
      (trace_dir.empty() ? "" : fmt::format(" --trace '{}/pytorch.json'", trace_dir));
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string output;
  char buffer[4096];
  while (pipe && std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
  if (!pipe || ::pclose(pipe) != 0) {
    std::cerr << "the PyTorch peer failed: " << command << "\n" << output;
    return 1;
  }
  const double peer = nlohmann::json::parse(output)["tokens_per_s"].get<double>();

  const model::MatmulPeak peak = model::measure_matmul_peak(dtype, 2048, 2.0);
  const double flops_per_token = config.training_flops_per_token(seq);
  std::cout << fmt::format(
      "model {} ({:.1f}M parameters), batch {} x seq {}, {} threads, {} compute, {} timed steps\n"
      "  meshtrain (C++)       {:9.1f} tokens/s   loss {:.4f}   MFU {:5.1f}%\n"
      "  PyTorch eager (Python){:9.1f} tokens/s                  MFU {:5.1f}%\n"
      "  ratio meshtrain / PyTorch: {:.2f}x\n"
      "  measured {} matmul peak: {:.1f} GFLOP/s; {:.2f} GFLOP per token (6N + attention)\n"
      "  OpenMP (both sides): {}\n",
      model_name, config.parameter_count() / 1e6, batch, seq, threads, dtype_name, steps, ours, loss,
      100 * ours * flops_per_token / (peak.gflops * 1e9), peer, 100 * peer * flops_per_token / (peak.gflops * 1e9),
      ours / peer, dtype_name, peak.gflops, flops_per_token / 1e9,
      runtime::openmp_wait_setting());
  return 0;
}
