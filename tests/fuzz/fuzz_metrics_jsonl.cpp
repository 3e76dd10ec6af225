// fuzz_metrics_jsonl.cpp — fuzzes metrics.jsonl as `meshtrain plot` reads it (plots::plot_metrics): the input is a
// run's metrics.jsonl, drawn into metrics.svg.
//
// Accepted: meshtrain::UserError (no training line, a line that is not a JSON object or nests too deep, naming the
// file). Anything else is a finding.
#include "fuzz_target.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/plots/metrics_svg.hpp"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::write_input(fuzz::scratch_dir() / "metrics.jsonl", data, size);
  try {
    plots::plot_metrics(fuzz::scratch_dir());
  } catch (const UserError&) {
  }
  return 0;
}
