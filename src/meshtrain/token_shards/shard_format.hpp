// shard_format.hpp — the token-shard format: one directory holding shard files and an index (docs/formats.md).
//
//   <dir>/index.json         format name and version, the tokenizer (name, kind, fingerprint, vocabulary size,
//                            end-of-text id), the token width, and per shard: file, tokens, documents, bytes, CRC-32C
//                            and the largest token id (absent in indexes written before it was recorded)
//   <dir>/shard_00000.tok    a 256-byte header, the tokens (uint16 or uint32, little-endian), zero padding to 8
//                            bytes, then document_count + 1 uint64 token offsets where documents start (the last
//                            one is token_count). All offsets and counts are 64-bit.
//
// The index is written last, and the directory is renamed into place only when complete: a directory without
// index.json is never a finished shard directory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain::token_shards {

inline constexpr char kShardMagic[8] = {'M', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr uint32_t kShardHeaderBytes = 256;
inline constexpr const char* kIndexFileName = "index.json";
inline constexpr const char* kIndexFormatName = "meshtrain-token-shards";

// The fixed-size header at the start of every shard file. Field offsets are given in docs/formats.md.
struct ShardHeader {
  uint32_t version = kShardVersion;
  uint32_t token_bytes = 2;  // 2 (uint16) or 4 (uint32)
  uint64_t token_count = 0;
  uint64_t document_count = 0;
  uint64_t tokens_offset = kShardHeaderBytes;
  uint64_t documents_offset = 0;      // tokens_offset + token_count * token_bytes, rounded up to 8
  uint64_t file_bytes = 0;            // documents_offset + (document_count + 1) * 8
  uint32_t payload_crc32c = 0;        // CRC-32C of bytes [kShardHeaderBytes, file_bytes)
  std::string tokenizer_name;         // at most 31 bytes
  std::string tokenizer_fingerprint;  // at most 63 bytes
};

// Serializes `header` into kShardHeaderBytes bytes, ending with the CRC-32C of the bytes before it.
std::vector<uint8_t> encode_shard_header(const ShardHeader& header);
// Parses and checks a header (magic, version, header checksum, field consistency). Throws UserError naming `file`
// and the failed check.
ShardHeader decode_shard_header(const uint8_t* bytes, size_t available, const std::filesystem::path& file);
// The layout that follows from the counts: documents_offset and file_bytes.
void layout_shard(ShardHeader& header);

struct ShardEntry {
  std::string file;  // relative to the directory
  uint64_t tokens = 0;
  uint64_t documents = 0;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;  // payload CRC-32C, as in the header
  std::optional<uint32_t> max_token;  // the largest token id in the shard; none if the shard has no tokens
};

struct TokenizerRecord {
  std::string name, kind, fingerprint;
  uint32_t vocab_size = 0;
  int64_t end_of_text_id = -1;  // -1: none
};

struct ShardIndex {
  uint32_t version = kShardVersion;
  TokenizerRecord tokenizer;
  uint32_t token_bytes = 2;
  uint64_t total_tokens = 0;
  uint64_t total_documents = 0;
  std::vector<ShardEntry> shards;
  std::vector<std::string> sources;  // the input files, as given to prepare
};

std::string index_to_json(const ShardIndex& index);
// Parses index.json; UserError naming `file` and the field that is missing or wrong.
ShardIndex index_from_json(const std::string& text, const std::filesystem::path& file);

}  // namespace meshtrain::token_shards
