// event_writer.hpp — EventWriter: a TensorBoard event file of scalar summaries, readable by `tensorboard --logdir`
// while the run is still writing it.
//
// The file, <dir>/events.out.tfevents.<unix seconds>.<hostname>.<pid>.0, is a TFRecord stream: each record is
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | the bytes | uint32 masked CRC-32C of them
// with masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8, and each record's bytes are one Event protobuf
// (event.proto; encoded by libprotobuf). The first event holds file_version "brain.Event:2"; every later one holds the
// scalars of one step, each a Summary value with its tag and simple_value (float). Each add_scalars() is flushed to
// the file, so a live run shows up, and a crash keeps what was written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain::tensorboard {

class EventWriter {
 public:
  // Creates `dir` if needed and a new event file in it. UserError naming the file if it cannot be written.
  explicit EventWriter(const std::filesystem::path& dir);

  // One event at `step` holding every (tag, value) as a scalar summary, written and flushed. UserError naming the
  // file if the write fails.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& bytes);

  std::filesystem::path path_;
  std::ofstream file_;
};

// TFRecord's mask of a CRC-32C (it keeps a CRC of data that holds CRCs from being trivially equal to them).
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace meshtrain::tensorboard
