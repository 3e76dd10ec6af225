// metrics.cpp — the log line, metrics.jsonl (trimmed on resume, flushed per line), the progress bar, the MFU peak.
#include "meshtrain/train/metrics.hpp"

#include "meshtrain/common/atomic_file.hpp"
#include "meshtrain/common/cpu_info.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/host_memory.hpp"
#include "meshtrain/common/json_read.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/model/compute_matmul.hpp"
#include "meshtrain/model/matmul_peak.hpp"
#include "meshtrain/runtime/compute_threads.hpp"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace fs = std::filesystem;

namespace meshtrain::train {
namespace {

constexpr const char* kMetricsFile = "metrics.jsonl";

void write_stderr(const std::string& text) {
  const char* data = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, data, left);
    if (n <= 0) return;
    data += n;
    left -= static_cast<size_t>(n);
  }
}

// Keeps the lines of an existing metrics file for steps before `first_step`; rewrites it atomically if any other
// line was there.
void drop_lines_from_step(const fs::path& path, int64_t first_step) {
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::string line, kept;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    const std::optional<nlohmann::json> json = parse_json_if_valid(line);
    if (json && json->is_object() && json->contains("step") && (*json)["step"].is_number_integer() &&
        (*json)["step"].get<int64_t>() < first_step)
      kept += line + "\n";
    else
      ++dropped;
  }
  if (dropped == 0) return;
  write_file_atomically(path, kept);
  log::info("{}: dropped {} line(s) for steps >= {} (this run writes them again)", path.string(), dropped,
            first_step);
}

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace

MetricsLogger::MetricsLogger(const settings::Settings& settings, bool is_writer, PeakFlops peak, int64_t first_step)
    : is_writer_(is_writer),
      progress_bar_(is_writer && ::isatty(STDERR_FILENO) == 1),
      peak_(std::move(peak)),
      logging_steps_(settings.metrics.logging_steps),
      max_steps_(settings.max_steps),
      first_step_(first_step),
      path_(settings.output_dir / kMetricsFile) {
  MT_CHECK(first_step >= 1, "MetricsLogger: first_step must be >= 1, got {}", first_step);
  if (!is_writer_) return;
  fs::create_directories(path_.parent_path());
  drop_lines_from_step(path_, first_step_);
  file_.open(path_, std::ios::app);
  MT_USER_CHECK(file_, "cannot open {} for appending", path_.string());
  if (settings.metrics.tensorboard) {
    events_.emplace(path_.parent_path() / "tensorboard");
    log::info("TensorBoard: {} (tensorboard --logdir {})", events_->path().string(), path_.parent_path().string());
  }
}

MetricsLogger::~MetricsLogger() { clear_progress(); }

void MetricsLogger::log(const StepMetrics& m) {
  MT_USER_CHECK(std::isfinite(m.loss),
                "step {}: the loss is {}: training diverged (try a lower optimizer.learning_rate, more "
                "lr_scheduler.warmup_steps, or max_grad_norm > 0)",
                m.step, m.loss);
  ++pending_steps_;
  pending_tokens_ += m.tokens;
  pending_step_s_ += m.step_seconds;
  pending_data_wait_s_ += m.data_wait_seconds;
  pending_compute_s_ += m.compute_seconds;
  pending_comm_s_ += m.comm_seconds;
  last_ = m;
  if (m.step > first_step_) {
    ++timed_steps_;
    timed_seconds_ += m.step_seconds;
  }
  if (m.step == 1 || m.step % logging_steps_ == 0 || m.step >= max_steps_) write_line(m);
  if (progress_bar_) draw_progress(m);
}

void MetricsLogger::log_eval(const EvalMetrics& m) {
  MT_USER_CHECK(std::isfinite(m.loss), "step {}: the eval loss is {}", m.step, m.loss);
  const double perplexity = std::exp(m.loss);
  clear_progress();
  log::info("eval at step {}/{}: eval_loss (global mean): {:.4f}, eval_perplexity: {:.2f} ({} held-out tokens in "
            "{:.2f} s)", m.step, max_steps_, m.loss, perplexity, m.tokens, m.seconds);
  if (!file_.is_open()) return;
  append_json_line({{"step", m.step},
                    {"eval_loss", m.loss},
                    {"eval_perplexity", perplexity},
                    {"eval_tokens", m.tokens},
                    {"eval_time_s", m.seconds}});
  if (events_) events_->add_scalars(m.step, {{"eval/eval_loss", m.loss}, {"eval/eval_perplexity", perplexity}});
}

void MetricsLogger::finish() {
  if (pending_steps_ > 0) write_line(last_);
  clear_progress();
  if (file_.is_open()) file_.close();
}

double StepMetrics::Routing::max_over_mean() const {
  if (expert_load.empty()) return 0;
  double sum = 0, max = 0;
  for (double load : expert_load) {
    sum += load;
    max = std::max(max, load);
  }
  return sum > 0 ? max * static_cast<double>(expert_load.size()) / sum : 0;
}

double StepMetrics::pipeline_bubble_fraction() const {
  if (!pipeline_bubble_seconds || pipeline_bubble_seconds->empty() || step_seconds <= 0) return 0;
  double sum = 0;
  for (double seconds : *pipeline_bubble_seconds) sum += seconds;
  return sum / static_cast<double>(pipeline_bubble_seconds->size()) / step_seconds;
}

void MetricsLogger::write_line(const StepMetrics& m) {
  const double steps = static_cast<double>(pending_steps_);
  const double tokens_per_s = pending_step_s_ > 0 ? static_cast<double>(pending_tokens_) / pending_step_s_ : 0.0;
  const double tokens_per_s_per_device = tokens_per_s / std::max(m.num_devices, 1);
  const bool peak_known = peak_.flops > 0;
  const double mfu = peak_known ? m.flops_per_token * tokens_per_s_per_device / peak_.flops : 0.0;
  const double step_s = pending_step_s_ / steps, data_wait_s = pending_data_wait_s_ / steps;
  const double compute_s = pending_compute_s_ / steps, comm_s = pending_comm_s_ / steps;
  const double data_wait_percent = step_s > 0 ? 100.0 * data_wait_s / step_s : 0.0;

  clear_progress();
  log::info("epoch: {}, step: {}/{}, loss (global mean): {:.4f}, grad_norm: {:.4f}, lr: {:.3e}, tokens/s: {:.0f} "
            "({:.0f}/device){}, step time: {:.1f} ms (compute {:.1f}, comm {:.1f}), data wait: {:.1f} ms ({:.1f}%){}{}",
            m.epoch, m.step, max_steps_, m.loss, m.grad_norm, m.learning_rate, tokens_per_s, tokens_per_s_per_device,
            peak_known ? fmt::format(", MFU: {:.1f}%", 100 * mfu) : "", 1e3 * step_s, 1e3 * compute_s, 1e3 * comm_s,
            1e3 * data_wait_s, data_wait_percent,
            m.routing ? fmt::format(", aux_loss: {:.4f}, expert load max/mean: {:.2f}{}", m.routing->aux_loss,
                                    m.routing->max_over_mean(),
                                    m.routing->dropped_fraction > 0
                                        ? fmt::format(", dropped: {:.2f}%", 100 * m.routing->dropped_fraction)
                                        : "")
                      : "",
            m.pipeline_bubble_seconds ? fmt::format(", pipeline bubble: {:.1f}%", 100 * m.pipeline_bubble_fraction())
                                      : "");
  const double peak_rss_gb = static_cast<double>(peak_resident_bytes()) / 1e9;
  if (file_.is_open()) {
    nlohmann::json line = {{"step", m.step},
                           {"epoch", m.epoch},
                           {"loss", m.loss},
                           {"grad_norm", m.grad_norm},
                           {"lr", m.learning_rate},
                           {"tokens_per_s", tokens_per_s},
                           {"tokens_per_s_per_device", tokens_per_s_per_device},
                           {"mfu", peak_known ? nlohmann::json(mfu) : nlohmann::json(nullptr)},
                           {"mfu_peak", peak_.to_json()},
                           {"step_time_s", step_s},
                           {"data_wait_s", data_wait_s},
                           {"compute_s", compute_s},
                           {"comm_s", comm_s},
                           {"peak_rss_gb", peak_rss_gb},
                           {"comm_bytes", m.comm_bytes}};
    if (m.routing) {
      line["aux_loss"] = m.routing->aux_loss;
      line["expert_load"] = m.routing->expert_load;
      line["expert_load_max_over_mean"] = m.routing->max_over_mean();
      line["dropped_fraction"] = m.routing->dropped_fraction;
      line["alltoall_s"] = m.routing->alltoall_seconds;
    }
    if (m.kv_exchange_seconds) line["kv_exchange_s"] = *m.kv_exchange_seconds;
    if (m.pipeline_bubble_seconds) {
      line["pipeline_bubble_s"] = *m.pipeline_bubble_seconds;
      line["pipeline_bubble_fraction"] = m.pipeline_bubble_fraction();
    }
    append_json_line(line);
  }
  if (events_) {
    std::vector<std::pair<std::string, double>> scalars = {{"train/loss", m.loss},
                                                           {"train/grad_norm", m.grad_norm},
                                                           {"train/lr", m.learning_rate},
                                                           {"throughput/tokens_per_s", tokens_per_s},
                                                           {"throughput/tokens_per_s_per_device", tokens_per_s_per_device},
                                                           {"time/step_time_s", step_s},
                                                           {"time/data_wait_s", data_wait_s},
                                                           {"time/compute_s", compute_s},
                                                           {"time/comm_s", comm_s},
                                                           {"memory/peak_rss_gb", peak_rss_gb}};
    if (peak_known) scalars.emplace_back("throughput/mfu", mfu);
    if (m.kv_exchange_seconds) scalars.emplace_back("time/kv_exchange_s", *m.kv_exchange_seconds);
    if (m.pipeline_bubble_seconds) {
      scalars.emplace_back("pipeline/bubble_fraction", m.pipeline_bubble_fraction());
      for (size_t s = 0; s < m.pipeline_bubble_seconds->size(); ++s)
        scalars.emplace_back(fmt::format("pipeline/bubble_s_stage_{}", s), (*m.pipeline_bubble_seconds)[s]);
    }
    if (m.routing)
      for (const auto& [tag, value] : {std::pair<std::string, double>{"moe/aux_loss", m.routing->aux_loss},
                                       {"moe/expert_load_max_over_mean", m.routing->max_over_mean()},
                                       {"moe/dropped_fraction", m.routing->dropped_fraction}})
        scalars.emplace_back(tag, value);
    events_->add_scalars(m.step, scalars);
  }
  pending_steps_ = pending_tokens_ = 0;
  pending_step_s_ = pending_data_wait_s_ = pending_compute_s_ = pending_comm_s_ = 0;
}

void MetricsLogger::append_json_line(const nlohmann::json& line) {
  file_ << line.dump() << '\n';
  file_.flush();
  MT_USER_CHECK(file_, "cannot write {} (disk full?)", path_.string());
}

void MetricsLogger::draw_progress(const StepMetrics& m) {
  constexpr int kWidth = 30;
  const double fraction = std::clamp(static_cast<double>(m.step) / static_cast<double>(max_steps_), 0.0, 1.0);
  const int filled = static_cast<int>(fraction * kWidth);
  const double seconds_per_step = timed_steps_ > 0 ? timed_seconds_ / timed_steps_ : m.step_seconds;
  const int64_t steps_left = std::max<int64_t>(max_steps_ - m.step, 0);
  write_stderr(fmt::format("\r\033[K{:3.0f}% |{}{}| {}/{} [loss {:.4f}, {:.2f} s/step, ETA {}]", 100 * fraction,
                           std::string(filled, '#'), std::string(kWidth - filled, ' '), m.step, max_steps_, m.loss,
                           seconds_per_step, format_duration(seconds_per_step * steps_left)));
  progress_shown_ = true;
}

void MetricsLogger::clear_progress() {
  if (!progress_shown_) return;
  write_stderr("\r\033[K");
  progress_shown_ = false;
}

std::string PeakFlops::describe() const {
  std::string text = fmt::format("MFU denominator: {:.1f} GFLOP/s per device, {}", flops / 1e9, source);
  if (source == "theoretical") {
    text += fmt::format(" ({})", theoretical_how);
    if (measured > 0) text += fmt::format("; measured {:.1f} GFLOP/s (1024^3 products)", measured / 1e9);
  } else if (source == "measured") {
    text += " (1024^3 products)";
    text += theoretical > 0 ? fmt::format("; above the theoretical {:.1f} GFLOP/s ({}): the CPU runs above its listed "
                                          "clock", theoretical / 1e9, theoretical_how)
                            : fmt::format("; no theoretical figure: {}", theoretical_how);
  } else {
    text += " (metrics.peak_gflops)";
  }
  return text + fmt::format("; CPU {}, decided by host 0 for every host", cpu);
}

nlohmann::json PeakFlops::to_json() const {
  return {{"flops", flops},       {"source", source}, {"theoretical", theoretical}, {"theoretical_how", theoretical_how},
          {"measured", measured}, {"cpu", cpu}};
}

PeakFlops PeakFlops::from_json(const nlohmann::json& json, const std::string& source_name) {
  PeakFlops peak;
  try {
    peak.flops = json.at("flops").get<double>();
    peak.source = json.at("source").get<std::string>();
    peak.theoretical = json.at("theoretical").get<double>();
    peak.theoretical_how = json.at("theoretical_how").get<std::string>();
    peak.measured = json.at("measured").get<double>();
    peak.cpu = json.at("cpu").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("{}: not an MFU peak ({}): {}", source_name, e.what(), json_excerpt(json)));
  }
  return peak;
}

PeakFlops decide_peak_flops(double configured_gflops, torch::Dtype compute_dtype, int threads) {
  MT_CHECK(threads >= 1, "decide_peak_flops: threads must be >= 1, got {}", threads);
  // The GEMMs that run: fp32 ones for bf16 compute on the fp32_gemm path (model/compute_matmul.hpp).
  const torch::Dtype gemm_dtype = model::gemm_dtype(compute_dtype);
  const CpuInfo cpu = read_cpu_info();
  const TheoreticalPeak theoretical = theoretical_peak(cpu, threads, gemm_dtype == torch::kBFloat16);
  PeakFlops peak;
  peak.cpu = cpu.describe();
  peak.theoretical = theoretical.flops;
  peak.theoretical_how = theoretical.how;
  if (configured_gflops > 0) {
    peak.flops = configured_gflops * 1e9;
    peak.source = "configured";
    return peak;
  }
  {
    runtime::ThreadCountGuard guard(threads);
    peak.measured = model::measure_matmul_peak(gemm_dtype, 1024, 0.25).gflops * 1e9;
  }
  // A measured rate above the theoretical figure means the CPU runs faster than its listed clock (a boost clock
  // that /proc/cpuinfo does not show): the larger is the peak, so that MFU never credits more than the machine did.
  peak.source = peak.theoretical >= peak.measured ? "theoretical" : "measured";
  peak.flops = std::max(peak.theoretical, peak.measured);
  return peak;
}

}  // namespace meshtrain::train
