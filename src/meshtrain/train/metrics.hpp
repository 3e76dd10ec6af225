// metrics.hpp — MetricsLogger: the trainer's report of each step: a log line every logging_steps (and at steps 1 and
// max_steps), the same numbers as a JSON line in <output_dir>/metrics.jsonl and, with metrics.tensorboard,
// TensorBoard scalars; a progress bar when stderr is a terminal. Keys, tags, averaging: docs/training.md, "Metrics".
//
// comm_bytes: the payload bytes device 0 passed to each kind of collective in the step. Routing: a Mixtral's aux_loss
// (without router_aux_loss_coef, averaged over the micro-batches), slots routed per expert over the global batch, the
// dropped fraction, device 0's time in all-to-alls. first_step s: the file's lines for steps >= s are dropped first
// (an atomic rewrite); each line is flushed as written. A non-finite loss is a UserError naming the step.
#pragma once

#include "meshtrain/settings/settings.hpp"
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
  double flops_per_token = 0;    // config::LlamaConfig::training_flops_per_token
  std::map<std::string, int64_t> comm_bytes;  // payload bytes per collective kind this step (see above)
  struct Routing {                            // a Mixtral's (see above)
    double aux_loss = 0;
    std::vector<double> expert_load;
    double dropped_fraction = 0;
    double alltoall_seconds = 0;
    double max_over_mean() const;
  };
  std::optional<Routing> routing;
  // Context parallelism: the time device 0 spent in the step's K/V exchange (gathers and gradient reduce-scatters).
  std::optional<double> kv_exchange_seconds;
  // Pipeline parallelism: stage by stage, the time the stage's device (of device 0's pipeline group) spent waiting
  // for a neighbouring stage in the step: the bubble (part of comm_s).
  std::optional<std::vector<double>> pipeline_bubble_seconds;
  // Their mean over the stages as a fraction of step_seconds.
  double pipeline_bubble_fraction() const;
};

struct EvalMetrics {
  int64_t step = 0;  // the training step the evaluated weights are those after
  double loss = 0;   // the global mean over every held-out token evaluated (identical on every host)
  int64_t tokens = 0;
  double seconds = 0;
};

// The MFU denominator of one device: the peak matmul FLOP/s for the dtype its GEMMs run in (fp32 for bf16 compute
// on the fp32_gemm path, model/compute_matmul.hpp). Host 0 decides it and every host uses its (JobFacts::mfu_peak).
struct PeakFlops {
  double flops = 0;         // the denominator: configured, else the larger of theoretical and measured
  std::string source;       // "configured" (metrics.peak_gflops), "theoretical" or "measured"
  double theoretical = 0;   // cores x clock x FLOP/cycle (common/cpu_info.hpp); 0 when not known
  std::string theoretical_how;
  double measured = 0;      // the best of a short run of 1024^3 products (0 when configured)
  std::string cpu;          // CpuInfo::describe() of host 0

  // "MFU denominator: 78.2 GFLOP/s per device, theoretical (1 core x 2.44 GHz x 32 FLOP/cycle ...); measured 71.3"
  std::string describe() const;
  nlohmann::json to_json() const;
  // UserError naming `source_name` for a malformed object.
  static PeakFlops from_json(const nlohmann::json& json, const std::string& source_name);
};

class MetricsLogger {
 public:
  // One per host. `is_writer` (host 0) writes metrics.jsonl and draws the progress bar; every host logs the lines.
  // `peak`: the MFU denominator (flops 0: no MFU). `first_step`: the step this run starts at (see above).
  // Uses logging_steps, max_steps, output_dir and metrics.tensorboard.
  MetricsLogger(const settings::Settings& settings, bool is_writer, PeakFlops peak, int64_t first_step = 1);
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
  PeakFlops peak_;
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

// Decides the denominator for a device of `threads` torch threads: metrics.peak_gflops when > 0; else the larger of
// this CPU's theoretical peak (when its flags and clock give one) and the measured rate (a short measurement, < 1 s,
// on the calling thread, made unless configured).
PeakFlops decide_peak_flops(double configured_gflops, torch::Dtype compute_dtype, int threads);

}  // namespace meshtrain::train
