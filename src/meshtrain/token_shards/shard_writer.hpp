// shard_writer.hpp — writes one token-shard file: documents are appended as they come, the header (counts,
// checksums) is filled in at finish(), and the file appears under its final name only then (temp name + rename).
// The index entry it returns also records the largest token id, which the reader checks against the vocabulary.
#pragma once

#include <cstdio>
#include <filesystem>
#include <optional>

#include "meshtrain/token_shards/shard_format.hpp"

namespace meshtrain::token_shards {

class ShardWriter {
 public:
  // `token_bytes` is 2 or 4; every id must fit in it.
  ShardWriter(std::filesystem::path path, uint32_t token_bytes, std::string tokenizer_name,
              std::string tokenizer_fingerprint);
  ~ShardWriter();  // an unfinished shard's temporary file is removed
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends one document's tokens (the caller includes any separator token).
  void append_document(const uint32_t* ids, size_t count);
  uint64_t token_count() const { return header_.token_count; }
  uint64_t document_count() const { return header_.document_count; }

  // Writes the document offsets and the header, closes, renames into place; returns the index entry.
  ShardEntry finish();

 private:
  void write(const void* data, size_t size);

  std::filesystem::path path_, temp_path_;
  std::FILE* file_ = nullptr;
  ShardHeader header_;
  std::vector<uint64_t> document_starts_;
  std::vector<uint8_t> buffer_;
  uint32_t crc_ = 0;
  std::optional<uint32_t> max_token_;  // recorded in the index entry
};

}  // namespace meshtrain::token_shards
