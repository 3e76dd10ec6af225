// atomic_file.cpp — temporary name, fsync, rename, directory fsync (POSIX).
#include "meshtrain/common/atomic_file.hpp"

#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace meshtrain {

AtomicFileWriter::AtomicFileWriter(const std::filesystem::path& path)
    : path_(path), temp_path_(path.string() + ".tmp") {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MT_USER_CHECK(fd_ >= 0, "cannot create {}: {}", temp_path_.string(), std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, size_t size) {
  MT_CHECK(fd_ >= 0, "write to {} after commit", path_.string());
  crc32c_ = meshtrain::crc32c(data, size, crc32c_);
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    MT_USER_CHECK(n > 0, "writing {} failed after {} bytes: {}", temp_path_.string(), bytes_written_,
                  std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
    bytes_written_ += static_cast<uint64_t>(n);
  }
}

void AtomicFileWriter::commit() {
  MT_CHECK(fd_ >= 0, "{} committed twice", path_.string());
  MT_USER_CHECK(::fsync(fd_) == 0, "fsync of {} failed: {}", temp_path_.string(), std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  MT_USER_CHECK(::rename(temp_path_.c_str(), path_.c_str()) == 0, "renaming {} to {} failed: {}",
                temp_path_.string(), path_.string(), std::strerror(errno));
  fsync_directory(path_.parent_path().empty() ? std::filesystem::path(".") : path_.parent_path());
}

void write_file_atomically(const std::filesystem::path& path, const std::string& text) {
  AtomicFileWriter writer(path);
  writer.write(text.data(), text.size());
  writer.commit();
}

void fsync_directory(const std::filesystem::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MT_USER_CHECK(fd >= 0, "cannot open directory {}: {}", dir.string(), std::strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  MT_USER_CHECK(rc == 0, "fsync of directory {} failed: {}", dir.string(), std::strerror(errno));
}

}  // namespace meshtrain
