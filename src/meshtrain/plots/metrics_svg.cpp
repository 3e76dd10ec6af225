// metrics_svg.cpp — metrics.jsonl to SVG: axes with round ticks, the loss curves, the stacked step-time bars.
#include "meshtrain/plots/metrics_svg.hpp"

#include "meshtrain/common/atomic_file.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/json_read.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace meshtrain::plots {
namespace {

constexpr double kWidth = 900, kHeight = 660;
constexpr double kLeft = 80, kRight = 860;  // the plot area's x range, both panels
const char* const kLossColor = "#1f77b4";
const char* const kEvalColor = "#d62728";
const char* const kComputeColor = "#2ca02c";
const char* const kCommColor = "#ff7f0e";
const char* const kDataColor = "#7f7f7f";
const char* const kBubbleColor = "#9467bd";

struct TrainPoint {
  double step, loss, compute_ms, comm_ms, data_ms;
  double bubble_ms = 0;  // pipeline parallelism: device 0's wait for the other stages, out of comm_ms
};
struct EvalPoint {
  double step, loss;
};

double number(const nlohmann::json& row, const char* key) {
  return row.contains(key) && row[key].is_number() ? row[key].get<double>() : 0.0;
}

std::string escape_xml(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// Round tick values covering [low, high]: steps of 1, 2 or 5 x 10^k, about `count` of them.
// None when the range is not finite; never more than 2 x count + 2 (a step below the precision of huge values would
// otherwise never advance).
std::vector<double> ticks(double low, double high, int count) {
  std::vector<double> out;
  if (!std::isfinite(low) || !std::isfinite(high)) return out;
  if (!(high > low)) high = low + std::max(1.0, std::abs(low) * 1e-6);
  const double raw = (high - low) / count, magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  if (!(step > 0) || !std::isfinite(step)) return out;
  const size_t most = static_cast<size_t>(2 * count + 2);
  for (double v = std::ceil(low / step) * step; v <= high + step * 1e-9 && out.size() < most; v += step)
    out.push_back(v);
  return out;
}

std::string tick_label(double v) {
  if (v != 0 && (std::abs(v) >= 1e5 || std::abs(v) < 1e-2)) return fmt::format("{:.1e}", v);
  return fmt::format("{:g}", std::round(v * 1e4) / 1e4);
}

// A panel: maps data to pixels inside [kLeft, kRight] x [top, bottom] and draws its frame, grid and tick labels.
class Panel {
 public:
  Panel(double top, double bottom, double x_low, double x_high, double y_low, double y_high)
      : top_(top), bottom_(bottom), x_low_(x_low), x_high_(x_high > x_low ? x_high : x_low + 1), y_low_(y_low),
        y_high_(y_high > y_low ? y_high : y_low + 1) {}

  double x(double v) const { return kLeft + (v - x_low_) / (x_high_ - x_low_) * (kRight - kLeft); }
  double y(double v) const { return bottom_ - (v - y_low_) / (y_high_ - y_low_) * (bottom_ - top_); }
  double x_per_unit() const { return (kRight - kLeft) / (x_high_ - x_low_); }

  std::string axes(const std::string& title, const std::string& y_label) const {
    std::string svg = fmt::format(R"svg(<text x="{}" y="{}" font-size="15" font-weight="bold">{}</text>)svg"
                                  "\n",
                                  kLeft, top_ - 12, escape_xml(title));
    for (double v : ticks(y_low_, y_high_, 5)) {
      svg += fmt::format(R"svg(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#dddddd"/>)svg"
                         "\n",
                         kLeft, y(v), kRight, y(v));
      svg += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="end">{}</text>)svg"
                         "\n",
                         kLeft - 6, y(v) + 4, tick_label(v));
    }
    for (double v : ticks(x_low_, x_high_, 8))
      svg += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="middle">{}</text>)svg"
                         "\n",
                         x(v), bottom_ + 16, tick_label(v));
    svg += fmt::format(R"svg(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#333333"/>)svg"
                       "\n",
                       kLeft, top_, kRight - kLeft, bottom_ - top_);
    svg += fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" font-size="12" text-anchor="middle">step</text>)svg"
                       "\n",
                       (kLeft + kRight) / 2, bottom_ + 32);
    svg += fmt::format(R"svg(<text x="18" y="{:.1f}" font-size="12" text-anchor="middle" transform="rotate(-90 18 {:.1f})">{}</text>)svg"
                       "\n",
                       (top_ + bottom_) / 2, (top_ + bottom_) / 2, escape_xml(y_label));
    return svg;
  }

  std::string legend(const std::vector<std::pair<std::string, std::string>>& entries) const {
    std::string svg;
    double at = kRight - 150;
    for (size_t i = 0; i < entries.size(); ++i) {
      const double row = top_ + 14 + 16 * static_cast<double>(i);
      svg += fmt::format(R"svg(<rect x="{:.1f}" y="{:.1f}" width="12" height="10" fill="{}"/>)svg"
                         R"svg(<text x="{:.1f}" y="{:.1f}" font-size="11">{}</text>)svg"
                         "\n",
                         at, row - 9, entries[i].second, at + 18, row, escape_xml(entries[i].first));
    }
    return svg;
  }

 private:
  double top_, bottom_, x_low_, x_high_, y_low_, y_high_;
};

std::string polyline(const Panel& panel, const std::vector<std::pair<double, double>>& points, const char* color,
                     bool dots) {
  std::string coords, svg;
  for (const auto& [sx, sy] : points) coords += fmt::format("{:.1f},{:.1f} ", panel.x(sx), panel.y(sy));
  if (points.size() > 1)
    svg += fmt::format(R"svg(<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>)svg"
                       "\n",
                       coords, color);
  if (dots || points.size() == 1)
    for (const auto& [sx, sy] : points)
      svg += fmt::format(R"svg(<circle cx="{:.1f}" cy="{:.1f}" r="4" fill="{}"/>)svg"
                         "\n",
                         panel.x(sx), panel.y(sy), color);
  return svg;
}

std::string draw(const std::vector<TrainPoint>& train, const std::vector<EvalPoint>& eval, const std::string& title) {
  double step_low = train.front().step, step_high = train.back().step;
  double loss_low = std::numeric_limits<double>::infinity(), loss_high = -loss_low, time_high = 0;
  bool bubbles = false;
  for (const TrainPoint& p : train) {
    step_low = std::min(step_low, p.step);
    step_high = std::max(step_high, p.step);
    loss_low = std::min(loss_low, p.loss);
    loss_high = std::max(loss_high, p.loss);
    time_high = std::max(time_high, p.compute_ms + p.comm_ms + p.data_ms);
    bubbles |= p.bubble_ms > 0;
  }
  for (const EvalPoint& p : eval) {
    loss_low = std::min(loss_low, p.loss);
    loss_high = std::max(loss_high, p.loss);
    step_high = std::max(step_high, p.step);
  }
  const double margin = 0.05 * std::max(loss_high - loss_low, 1e-3);
  const Panel losses(60, 330, step_low, step_high, loss_low - margin, loss_high + margin);
  const Panel times(400, 600, step_low - 0.5, step_high + 0.5, 0, time_high > 0 ? time_high * 1.1 : 1);

  std::string svg = fmt::format(R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {} {}" font-family="sans-serif">)svg"
                                "\n<title>{}</title>\n"
                                R"svg(<rect width="100%" height="100%" fill="white"/>)svg"
                                "\n",
                                kWidth, kHeight, kWidth, kHeight, escape_xml(title));
  svg += losses.axes(title + ": loss", "loss (global mean)");
  std::vector<std::pair<double, double>> train_points, eval_points;
  for (const TrainPoint& p : train) train_points.emplace_back(p.step, p.loss);
  for (const EvalPoint& p : eval) eval_points.emplace_back(p.step, p.loss);
  svg += polyline(losses, train_points, kLossColor, false);
  std::vector<std::pair<std::string, std::string>> loss_legend = {{"training loss", kLossColor}};
  if (!eval.empty()) {
    svg += polyline(losses, eval_points, kEvalColor, true);
    loss_legend.emplace_back("eval loss", kEvalColor);
  }
  svg += losses.legend(loss_legend);

  svg += times.axes("step time per logged step (average since the previous line)", "milliseconds");
  const double bar = std::clamp(0.7 * times.x_per_unit(), 2.0, 40.0);
  for (const TrainPoint& p : train) {
    double base = 0;
    const double bubble_ms = std::min(p.bubble_ms, p.comm_ms);
    for (const auto& [ms, color] : {std::pair<double, const char*>{p.compute_ms, kComputeColor},
                                    {p.comm_ms - bubble_ms, kCommColor}, {bubble_ms, kBubbleColor},
                                    {p.data_ms, kDataColor}}) {
      if (ms <= 0) continue;
      svg += fmt::format(R"svg(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}"/>)svg"
                         "\n",
                         times.x(p.step) - bar / 2, times.y(base + ms), bar, times.y(base) - times.y(base + ms), color);
      base += ms;
    }
  }
  std::vector<std::pair<std::string, std::string>> time_legend = {{"compute", kComputeColor},
                                                                  {"communication", kCommColor}};
  if (bubbles) time_legend.emplace_back("pipeline bubble (stage 0)", kBubbleColor);
  time_legend.emplace_back("data wait", kDataColor);
  svg += times.legend(time_legend);
  return svg + "</svg>\n";
}

}  // namespace

fs::path plot_metrics(const fs::path& output_dir) {
  const fs::path source = output_dir / "metrics.jsonl";
  std::ifstream in(source);
  MT_USER_CHECK(in, "cannot read {} (is {} a meshtrain output_dir?)", source.string(), output_dir.string());
  std::vector<TrainPoint> train;
  std::vector<EvalPoint> eval;
  std::string line;
  for (int64_t line_number = 1; std::getline(in, line); ++line_number) {
    if (line.empty()) continue;
    const nlohmann::json row = parse_json_if_valid(line).value_or(nlohmann::json());
    MT_USER_CHECK(row.is_object() && row.contains("step") && row["step"].is_number(),
                  "{}:{}: not a metrics line (a JSON object with a step)", source.string(), line_number);
    const double step = row["step"].get<double>();
    if (row.contains("eval_loss"))
      eval.push_back({step, number(row, "eval_loss")});
    else if (row.contains("loss")) {
      // Device 0 is stage 0: its wait is the first stage's bubble.
      const bool pipelined = row.contains("pipeline_bubble_s") && row["pipeline_bubble_s"].is_array() &&
                             !row["pipeline_bubble_s"].empty() && row["pipeline_bubble_s"][0].is_number();
      train.push_back({step, number(row, "loss"), 1e3 * number(row, "compute_s"), 1e3 * number(row, "comm_s"),
                       1e3 * number(row, "data_wait_s"),
                       pipelined ? 1e3 * row["pipeline_bubble_s"][0].get<double>() : 0.0});
    }
  }
  MT_USER_CHECK(!train.empty(), "{} holds no training line yet: nothing to plot", source.string());
  const fs::path target = output_dir / "metrics.svg";
  write_file_atomically(target, draw(train, eval, "meshtrain run " + output_dir.string()));
  return target;
}

}  // namespace meshtrain::plots
