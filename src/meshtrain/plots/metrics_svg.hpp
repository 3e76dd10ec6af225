// metrics_svg.hpp — a picture of a run: <output_dir>/metrics.svg, drawn from metrics.jsonl, readable in any browser.
//
// Two panels over the training steps: the training loss of every logged step with the eval loss of every evaluation
// (left axis: loss), and the step-time split of every logged step as stacked bars (compute, communication, data
// wait; milliseconds). The trainer draws it at the end of a run (host 0); `meshtrain plot OUTPUT_DIR` draws it for
// any run, finished or not.
#pragma once

#include <filesystem>

namespace meshtrain::plots {

// Reads <output_dir>/metrics.jsonl, writes <output_dir>/metrics.svg (atomically) and returns its path. UserError
// naming the file when it is missing, holds no training line, or a line is not a JSON object.
std::filesystem::path plot_metrics(const std::filesystem::path& output_dir);

}  // namespace meshtrain::plots
