// atomic_file.hpp — files that appear whole or not at all: written under a temporary name, fsynced, then renamed
// over the final name (and the directory fsynced), so a crash never leaves a half-written file under its real name.
// The writer keeps the CRC-32C of what it wrote, for completion markers that let a reader detect damage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace meshtrain {

class AtomicFileWriter {
 public:
  // Opens "<path>.tmp" for writing; UserError naming the file if it cannot.
  explicit AtomicFileWriter(const std::filesystem::path& path);
  ~AtomicFileWriter();  // removes the temporary file if commit() was not reached
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t size);  // UserError naming the file on a short write (disk full...)
  uint64_t bytes_written() const { return bytes_written_; }
  uint32_t crc32c() const { return crc32c_; }  // of every byte written so far
  // fsync, close, rename to the final path, fsync the directory.
  void commit();

 private:
  std::filesystem::path path_, temp_path_;
  int fd_ = -1;
  uint64_t bytes_written_ = 0;
  uint32_t crc32c_ = 0;
};

// Writes `text` to `path` atomically.
void write_file_atomically(const std::filesystem::path& path, const std::string& text);

// fsyncs a directory so that renames and creations inside it are durable.
void fsync_directory(const std::filesystem::path& dir);

}  // namespace meshtrain
