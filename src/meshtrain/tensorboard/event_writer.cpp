// event_writer.cpp — the TFRecord framing and the Event protobufs (libprotobuf-generated from event.proto).
#include "meshtrain/tensorboard/event_writer.hpp"

#include "event.pb.h"

#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"

#include <fmt/format.h>

#include <chrono>

#include <unistd.h>

namespace fs = std::filesystem;

namespace meshtrain::tensorboard {
namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

template <typename T>
void put_little_endian(char* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

EventWriter::EventWriter(const fs::path& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  MT_USER_CHECK(!error, "cannot create the TensorBoard folder {}: {}", dir.string(), error.message());
  const double now = unix_seconds();
  path_ = dir / fmt::format("events.out.tfevents.{}.{}.{}.0", static_cast<int64_t>(now), host_name(), ::getpid());
  file_.open(path_, std::ios::binary | std::ios::trunc);
  MT_USER_CHECK(file_, "cannot create the TensorBoard event file {}", path_.string());
  proto::Event event;
  event.set_wall_time(now);
  event.set_file_version("brain.Event:2");
  write_record(event.SerializeAsString());
}

void EventWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  proto::Event event;
  event.set_wall_time(unix_seconds());
  event.set_step(step);
  proto::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    proto::SummaryValue* entry = summary->add_value();
    entry->set_tag(tag);
    entry->set_simple_value(static_cast<float>(value));
  }
  write_record(event.SerializeAsString());
}

void EventWriter::write_record(const std::string& bytes) {
  char header[12];
  const uint64_t length = bytes.size();
  put_little_endian(header, length);
  put_little_endian(header + 8, masked_crc32c(header, 8));
  char footer[4];
  put_little_endian(footer, masked_crc32c(bytes.data(), bytes.size()));
  file_.write(header, sizeof(header));
  file_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file_.write(footer, sizeof(footer));
  file_.flush();
  MT_USER_CHECK(file_, "cannot write the TensorBoard event file {} (disk full?)", path_.string());
}

}  // namespace meshtrain::tensorboard
