// plot_command.cpp — `meshtrain plot OUTPUT_DIR`: draws <output_dir>/metrics.svg from its metrics.jsonl
// (plots/metrics_svg.hpp) and prints its path; works on a run that is still going.
#include "meshtrain/cli/commands.hpp"
#include "meshtrain/plots/metrics_svg.hpp"

#include <CLI/CLI.hpp>

#include <iostream>

namespace meshtrain::cli {

int plot_command(int argc, char** argv) {
  CLI::App app{"Draw a run's training loss, eval loss and step-time split as <output_dir>/metrics.svg.",
               "meshtrain plot"};
  std::string output_dir;
  app.add_option("output_dir", output_dir, "the run's output_dir (it holds metrics.jsonl)")->required();
  CLI11_PARSE(app, argc, argv);
  std::cout << plots::plot_metrics(output_dir).string() << "\n";
  return 0;
}

}  // namespace meshtrain::cli
