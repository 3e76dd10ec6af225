// shard_reader.hpp — opens a token-shard directory, validates it up front, and gives memory-mapped, zero-copy
// access to each shard's tokens (uint16 or uint32) and document boundaries. Each failed check is a UserError naming
// the file and the check (the checks, in order: docs/formats.md, "Validation when a directory is opened").
//
// A shard truncated in place after it was opened makes the next read of its mapping raise SIGBUS: the handler that
// MappedFile registers prints which file went short and at which byte and ends the process with kTruncatedWhileMapped
// (no exception can be thrown from the fault); faults elsewhere go to the handler installed before it (or to the
// default action). Replacing a shard by rename is harmless: the mapping keeps the old file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/token_shards/shard_format.hpp"

namespace meshtrain::token_shards {

// The exit status of a process that read a mapped file someone truncated (EX_IOERR of sysexits.h).
inline constexpr int kTruncatedWhileMapped = 74;

// A read-only memory mapping of a whole file, named to the SIGBUS handler while it exists.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  std::string path_;  // read by the SIGBUS handler
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  int registration_ = -1;  // slot in the handler's table; -1 if none
};

// When a shard's payload CRC-32C is checked (the header, the index and their agreement are checked at open always):
//   at_open        while opening: every byte of every shard is read before the first sample (O(dataset))
//   on_first_read  the first time a token of the shard is copied out (copy_tokens), before it is handed on: the
//                  cost moves to the loader's threads and to the shards a host actually reads (the trainer)
//   never          only the index is needed (`plan`)
enum class PayloadCheck { at_open, on_first_read, never };

// One validated shard, mapped.
class TokenShard {
 public:
  TokenShard(const std::filesystem::path& path, const ShardEntry& entry, PayloadCheck payload_check);

  const std::filesystem::path& path() const { return path_; }
  const ShardHeader& header() const { return header_; }
  uint64_t token_count() const { return header_.token_count; }
  uint64_t document_count() const { return header_.document_count; }
  uint32_t token_bytes() const { return header_.token_bytes; }
  // The largest token id; none if the shard has no tokens.
  std::optional<uint32_t> max_token() const { return max_token_; }
  // The raw token array: uint16_t* when token_bytes() == 2, uint32_t* when 4.
  const void* tokens() const { return file_->data() + header_.tokens_offset; }
  uint32_t token(uint64_t i) const;
  // Copies tokens [begin, begin + count) widened to uint32 into `out` and returns the largest of them (0 if none),
  // for the caller to check against the vocabulary: max_token() comes from the index when the payload is not
  // checksummed at open, and a shard whose index understates it would otherwise hand on any id. With
  // PayloadCheck::on_first_read the first call checks the payload CRC-32C first (UserError naming the file if it
  // fails; thread-safe).
  uint32_t copy_tokens(uint64_t begin, uint64_t count, uint32_t* out) const;
  // Token offsets where documents start: document_count() + 1 entries, the last is token_count().
  const uint64_t* document_starts() const {
    return reinterpret_cast<const uint64_t*>(file_->data() + header_.documents_offset);
  }

 private:
  std::filesystem::path path_;
  void check_payload() const;  // UserError unless the payload's CRC-32C is the header's

  std::shared_ptr<MappedFile> file_;
  ShardHeader header_;
  std::optional<uint32_t> max_token_;
  std::shared_ptr<std::once_flag> first_read_check_;  // set with PayloadCheck::on_first_read
};

struct OpenOptions {
  // If set, the tokenizer fingerprint the shards must have been prepared with (a mismatch is an error).
  std::string expected_tokenizer_fingerprint;
  PayloadCheck payload_check = PayloadCheck::at_open;
};

class ShardDirectory {
 public:
  static ShardDirectory open(const std::filesystem::path& dir, const OpenOptions& options = {});

  const std::filesystem::path& path() const { return path_; }
  const ShardIndex& index() const { return index_; }
  const std::vector<TokenShard>& shards() const { return shards_; }
  uint64_t total_tokens() const { return index_.total_tokens; }

 private:
  std::filesystem::path path_;
  ShardIndex index_;
  std::vector<TokenShard> shards_;
};

}  // namespace meshtrain::token_shards
