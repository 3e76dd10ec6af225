// shard_reader.cpp — memory mapping and the up-front validation of shard directories.
#include "meshtrain/tokens/shard_reader.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/tokenizer/tokenizer.hpp"

namespace meshtrain::tokens {
namespace fs = std::filesystem;

MappedFile::MappedFile(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_USER_CHECK(fd >= 0, "{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw UserError(fmt::format("{}: cannot stat: {}", path.string(), std::strerror(errno)));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      ::close(fd);
      throw UserError(fmt::format("{}: cannot map: {}", path.string(), std::strerror(errno)));
    }
    data_ = static_cast<const uint8_t*>(mapped);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

TokenShard::TokenShard(const fs::path& path, const ShardEntry& entry, bool verify_checksum)
    : path_(path), file_(std::make_shared<MappedFile>(path)) {
  const std::string name = path.string();
  header_ = decode_shard_header(file_->data(), file_->size(), path);
  MT_USER_CHECK(file_->size() >= header_.file_bytes, "{}: truncated: {} bytes, the header says {}", name, file_->size(),
                header_.file_bytes);
  MT_USER_CHECK(file_->size() == header_.file_bytes, "{}: corrupted: {} bytes after the end the header gives ({})",
                name, file_->size() - header_.file_bytes, header_.file_bytes);
  MT_USER_CHECK(header_.token_count == entry.tokens && header_.document_count == entry.documents &&
                    header_.payload_crc32c == entry.crc32c,
                "{}: does not match the index: {} tokens, {} documents, crc32c {:08x} (index: {}, {}, {:08x})", name,
                header_.token_count, header_.document_count, header_.payload_crc32c, entry.tokens, entry.documents,
                entry.crc32c);
  if (verify_checksum) {
    uint32_t actual = crc32c(file_->data() + kShardHeaderBytes, header_.file_bytes - kShardHeaderBytes);
    MT_USER_CHECK(actual == header_.payload_crc32c,
                  "{}: checksum mismatch: payload CRC-32C is {:08x}, the header "
                  "says {:08x} (the file is corrupted)",
                  name, actual, header_.payload_crc32c);
  }
  const uint64_t* starts = document_starts();
  MT_USER_CHECK(starts[0] == 0 && starts[header_.document_count] == header_.token_count,
                "{}: corrupted: document offsets must run from 0 to {}", name, header_.token_count);
  for (uint64_t d = 0; d < header_.document_count; ++d) {
    MT_USER_CHECK(starts[d] <= starts[d + 1], "{}: corrupted: document {} starts after document {}", name, d, d + 1);
  }
}

uint32_t TokenShard::token(uint64_t i) const {
  if (header_.token_bytes == 2) return static_cast<const uint16_t*>(tokens())[i];
  return static_cast<const uint32_t*>(tokens())[i];
}

void TokenShard::copy_tokens(uint64_t begin, uint64_t count, uint32_t* out) const {
  MT_CHECK(begin + count <= header_.token_count, "tokens [{}, {}) out of range of {} ({} tokens)", begin, begin + count,
           path_.string(), header_.token_count);
  if (header_.token_bytes == 4) {
    std::memcpy(out, static_cast<const uint32_t*>(tokens()) + begin, count * 4);
    return;
  }
  const uint16_t* narrow = static_cast<const uint16_t*>(tokens()) + begin;
  for (uint64_t i = 0; i < count; ++i) out[i] = narrow[i];
}

ShardDirectory ShardDirectory::open(const fs::path& dir, const OpenOptions& options) {
  ShardDirectory result;
  result.path_ = dir;
  MT_USER_CHECK(fs::is_directory(dir),
                "{}: not a directory (expected a token-shard directory from `meshtrain "
                "prepare`)",
                dir.string());
  fs::path index_path = dir / kIndexFileName;
  MT_USER_CHECK(fs::exists(index_path),
                "{}: missing: not a finished token-shard directory (an interrupted `meshtrain "
                "prepare` leaves none)",
                index_path.string());
  result.index_ = index_from_json(tokenizer::read_file_bytes(index_path), index_path);
  const ShardIndex& index = result.index_;
  if (!options.expected_tokenizer_fingerprint.empty()) {
    MT_USER_CHECK(index.tokenizer.fingerprint == options.expected_tokenizer_fingerprint,
                  "{}: tokenizer mismatch: prepared with {} ({}), expected {}", index_path.string(),
                  index.tokenizer.name, index.tokenizer.fingerprint, options.expected_tokenizer_fingerprint);
  }
  uint64_t tokens = 0, documents = 0;
  for (const ShardEntry& entry : index.shards) {
    fs::path shard_path = dir / entry.file;
    MT_USER_CHECK(fs::exists(shard_path), "{}: missing (listed in {})", shard_path.string(), index_path.string());
    TokenShard& shard = result.shards_.emplace_back(shard_path, entry, options.verify_checksums);
    MT_USER_CHECK(shard.header().tokenizer_fingerprint == index.tokenizer.fingerprint &&
                      shard.header().tokenizer_name == index.tokenizer.name,
                  "{}: tokenizer mismatch: the shard was written by {} ({}), the index says {} ({})",
                  shard_path.string(), shard.header().tokenizer_name, shard.header().tokenizer_fingerprint,
                  index.tokenizer.name, index.tokenizer.fingerprint);
    MT_USER_CHECK(shard.token_bytes() == index.token_bytes, "{}: token width {} differs from the index's {}",
                  shard_path.string(), shard.token_bytes(), index.token_bytes);
    tokens += shard.token_count();
    documents += shard.document_count();
  }
  MT_USER_CHECK(tokens == index.total_tokens && documents == index.total_documents,
                "{}: corrupted index: the shards hold {} tokens and {} documents, the index says {} and {}",
                index_path.string(), tokens, documents, index.total_tokens, index.total_documents);
  return result;
}

}  // namespace meshtrain::tokens
