// metrics.hpp — what the trainer reports each step, and where: a torchprime-style log line every logging_steps
// (and at step 1 and the last step), the same numbers as one JSON object per logged step in
// <output_dir>/metrics.jsonl, and a one-line progress bar on stderr when stderr is a terminal.
//
// Loss, grad norm and learning rate are those of the logged step; throughput and times (tokens/s, MFU, step, data
// wait, compute, communication) are averaged over the steps since the previous logged line, so one slow step does
// not make the line lie. MFU = flops_per_token * tokens/s per device / peak FLOP/s per device, printed only when
// the peak is known. A non-finite loss stops the run with a UserError naming the step (torchprime raises too).
//
// metrics.jsonl keys: step, epoch, loss, grad_norm, lr, tokens_per_s, tokens_per_s_per_device, mfu (null when the
// peak is unknown), step_time_s, data_wait_s, compute_s, comm_s, peak_rss_gb (the host's peak resident memory so
// far), and comm_bytes: the payload bytes device 0 passed to each kind of collective during the logged step
// ({"allgather": .., "reduce_scatter": .., "allreduce": .., "alltoall": .., "broadcast": ..}). A Mixtral's lines add
// aux_loss (Hugging Face's load-balancing loss, without router_aux_loss_coef, averaged over the step's micro-batches;
// `loss` stays the language-model cross entropy), expert_load (the token slots routed to each expert over the global
// batch, summed over layers and micro-batches), expert_load_max_over_mean, dropped_fraction and alltoall_s (the time
// device 0 waited in all-to-alls during the logged step: the exposed expert-parallel exchange). An evaluation adds its
// own line: step, eval_loss, eval_perplexity, eval_tokens, eval_time_s. Each line is flushed as it is written, so a
// crash keeps the lines before it; a run that starts at step s (resumed from a checkpoint at s - 1, or s = 1 for a
// fresh run) first drops the lines for steps >= s (an atomic rewrite), so the file holds one line per step (and one
// per evaluation).
//
// With metrics.tensorboard on, the writer also adds each line's numbers to a TensorBoard event file under
// <output_dir>/tensorboard (tensorboard/event_writer.hpp) as scalars tagged <group>/<key>: train/ (loss, grad_norm,
// lr), throughput/ (tokens_per_s, tokens_per_s_per_device, mfu when known), time/ (step_time_s, data_wait_s,
// compute_s, comm_s), memory/peak_rss_gb, moe/ (aux_loss, expert_load_max_over_mean, dropped_fraction) and eval/
// (eval_loss, eval_perplexity).
#pragma once

#include "meshtrain/config/config.hpp"
#include "meshtrain/tensorboard/event_writer.hpp"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <fstream>
#include <vector>

namespace meshtrain::train {

struct StepMetrics {
  int64_t step = 0;   // 1-based optimizer step
  int64_t epoch = 0;
  double loss = 0;    // the global mean over every token of the step (identical on every host)
  double grad_norm = 0;  // global, before clipping
  double learning_rate = 0;
  double step_seconds = 0;       // wall time of the whole step
  double data_wait_seconds = 0;  // of which waiting for the batch
  double compute_seconds = 0;    // forward, backward, optimizer
  double comm_seconds = 0;       // collectives
  int64_t tokens = 0;            // global tokens this step
  int num_devices = 1;
  double flops_per_token = 0;    // model::LlamaConfig::training_flops_per_token
  std::map<std::string, int64_t> comm_bytes;  // payload bytes per collective kind this step (see above)
  struct Routing {                            // a Mixtral's (see above)
    double aux_loss = 0;
    std::vector<double> expert_load;
    double dropped_fraction = 0;
    double alltoall_seconds = 0;
    double max_over_mean() const;
  };
  std::optional<Routing> routing;
};

struct EvalMetrics {
  int64_t step = 0;  // the training step the evaluated weights are those after
  double loss = 0;   // the global mean over every held-out token evaluated (identical on every host)
  int64_t tokens = 0;
  double seconds = 0;
};

class MetricsLogger {
 public:
  // One per host. `is_writer` (host 0) writes metrics.jsonl and draws the progress bar; every host logs the lines.
  // `peak_flops_per_device` in FLOP/s, 0 when unknown. `first_step`: the step this run starts at (see above).
  // Reads logging_steps (>= 1), max_steps and output_dir.
  MetricsLogger(const config::Config& config, bool is_writer, double peak_flops_per_device, int64_t first_step = 1);
  ~MetricsLogger();  // ends the progress bar's line
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Call once per step, in order. UserError naming the step if the loss is NaN or infinite.
  void log(const StepMetrics& metrics);
  // Logs an evaluation (every host) and writes its metrics.jsonl line (the writer). UserError if the loss is not finite.
  void log_eval(const EvalMetrics& metrics);
  // Logs the last step if its line is still due (a run that ended before max_steps), closes the file.
  void finish();

  const std::filesystem::path& metrics_path() const { return path_; }

 private:
  void write_line(const StepMetrics& metrics);
  void append_json_line(const nlohmann::json& line);  // to metrics.jsonl, flushed
  void draw_progress(const StepMetrics& metrics);
  void clear_progress();

  bool is_writer_, progress_bar_;
  double peak_flops_;
  int64_t logging_steps_, max_steps_, first_step_;
  std::filesystem::path path_;
  std::ofstream file_;
  std::optional<tensorboard::EventWriter> events_;
  // Sums over the steps since the last logged line.
  int64_t pending_steps_ = 0, pending_tokens_ = 0;
  double pending_step_s_ = 0, pending_data_wait_s_ = 0, pending_compute_s_ = 0, pending_comm_s_ = 0;
  StepMetrics last_;
  // For the progress bar's ETA: the time of this run's steps after its first.
  int64_t timed_steps_ = 0;
  double timed_seconds_ = 0;
  bool progress_shown_ = false;
};

// The peak matmul FLOP/s of one device for MFU: metrics.peak_gflops * 1e9 when that key is set and > 0, else a
// short measurement (< 1 s) of 1024^3 products on the calling thread with `threads` torch threads (logged, with the
// key to set instead), in the dtype the GEMMs of `compute_dtype` run in (fp32 for bf16 compute on the fp32_gemm path,
// model/compute_matmul.hpp). CPU only: the measurement runs CPU kernels.
double peak_flops_per_device(const config::Config& config, torch::Dtype compute_dtype, int threads);

}  // namespace meshtrain::train
