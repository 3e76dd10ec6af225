// shard_format.cpp — shard header (de)serialization with its checks, and the index file as JSON.
#include "meshtrain/token_shards/shard_format.hpp"

#include <charconv>
#include <cstring>
#include <nlohmann/json.hpp>

#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/file_names.hpp"
#include "meshtrain/common/json_read.hpp"

namespace meshtrain::token_shards {
namespace {

// Byte offsets of the header fields (little-endian).
constexpr size_t kOffMagic = 0, kOffVersion = 8, kOffHeaderBytes = 12, kOffTokenBytes = 16, kOffTokenCount = 24,
                 kOffDocumentCount = 32, kOffTokensOffset = 40, kOffDocumentsOffset = 48, kOffFileBytes = 56,
                 kOffPayloadCrc = 64, kOffTokenizerName = 72, kOffTokenizerFingerprint = 104,
                 kOffHeaderCrc = kShardHeaderBytes - 4;
constexpr size_t kTokenizerNameBytes = 32, kTokenizerFingerprintBytes = 64;

template <typename T>
void put(std::vector<uint8_t>& out, size_t offset, T value) {
  std::memcpy(out.data() + offset, &value, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
}

template <typename T>
T get(const uint8_t* bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes + offset, sizeof(T));
  return value;
}

std::string get_string(const uint8_t* bytes, size_t offset, size_t size) {
  const char* begin = reinterpret_cast<const char*>(bytes + offset);
  return std::string(begin, strnlen(begin, size));
}

// A count or size of the index: a non-negative JSON integer (a negative or fractional one would wrap or be
// truncated by a plain get<uint64_t>()).
uint64_t unsigned_field(const nlohmann::json& object, const char* key, const std::string& file) {
  const nlohmann::json& value = object.at(key);
  MT_USER_CHECK(value.is_number_unsigned(), "{}: corrupted index: \"{}\" is {}, expected a non-negative integer",
                file, key, json_excerpt(value));
  return value.get<uint64_t>();
}

// A shard's "crc32c": exactly 8 hex digits.
uint32_t crc32c_field(const nlohmann::json& shard, const std::string& file) {
  const std::string text = shard.at("crc32c").get<std::string>();
  uint32_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  MT_USER_CHECK(text.size() == 8 && error == std::errc() && end == text.data() + text.size(),
                "{}: corrupted index: crc32c \"{}\" is not 8 hex digits", file, bounded_text(text));
  return value;
}

}  // namespace

void layout_shard(ShardHeader& header) {
  header.tokens_offset = kShardHeaderBytes;
  uint64_t tokens_end = header.tokens_offset + header.token_count * header.token_bytes;
  header.documents_offset = (tokens_end + 7) / 8 * 8;
  header.file_bytes = header.documents_offset + (header.document_count + 1) * 8;
}

std::vector<uint8_t> encode_shard_header(const ShardHeader& header) {
  MT_CHECK(header.tokenizer_name.size() < kTokenizerNameBytes, "tokenizer name '{}' is too long for the header",
           header.tokenizer_name);
  MT_CHECK(header.tokenizer_fingerprint.size() < kTokenizerFingerprintBytes, "tokenizer fingerprint is too long");
  std::vector<uint8_t> out(kShardHeaderBytes, 0);
  std::memcpy(out.data() + kOffMagic, kShardMagic, sizeof(kShardMagic));
  put<uint32_t>(out, kOffVersion, header.version);
  put<uint32_t>(out, kOffHeaderBytes, kShardHeaderBytes);
  put<uint32_t>(out, kOffTokenBytes, header.token_bytes);
  put<uint64_t>(out, kOffTokenCount, header.token_count);
  put<uint64_t>(out, kOffDocumentCount, header.document_count);
  put<uint64_t>(out, kOffTokensOffset, header.tokens_offset);
  put<uint64_t>(out, kOffDocumentsOffset, header.documents_offset);
  put<uint64_t>(out, kOffFileBytes, header.file_bytes);
  put<uint32_t>(out, kOffPayloadCrc, header.payload_crc32c);
  std::memcpy(out.data() + kOffTokenizerName, header.tokenizer_name.data(), header.tokenizer_name.size());
  std::memcpy(out.data() + kOffTokenizerFingerprint, header.tokenizer_fingerprint.data(),
              header.tokenizer_fingerprint.size());
  put<uint32_t>(out, kOffHeaderCrc, crc32c(out.data(), kOffHeaderCrc));
  return out;
}

ShardHeader decode_shard_header(const uint8_t* bytes, size_t available, const std::filesystem::path& file) {
  const std::string name = file.string();
  MT_USER_CHECK(available >= kShardHeaderBytes, "{}: truncated: {} bytes, shorter than the {}-byte header", name,
                available, kShardHeaderBytes);
  MT_USER_CHECK(std::memcmp(bytes, kShardMagic, sizeof(kShardMagic)) == 0,
                "{}: wrong magic: not a meshtrain token shard (expected \"MTTOKENS\")", name);
  ShardHeader header;
  header.version = get<uint32_t>(bytes, kOffVersion);
  MT_USER_CHECK(header.version == kShardVersion, "{}: wrong version: format version {}, this build reads version {}",
                name, header.version, kShardVersion);
  uint32_t stored_crc = get<uint32_t>(bytes, kOffHeaderCrc);
  uint32_t actual_crc = crc32c(bytes, kOffHeaderCrc);
  MT_USER_CHECK(stored_crc == actual_crc, "{}: corrupted header: header checksum {:08x} does not match {:08x}", name,
                actual_crc, stored_crc);
  MT_USER_CHECK(get<uint32_t>(bytes, kOffHeaderBytes) == kShardHeaderBytes, "{}: corrupted header: header size {}",
                name, get<uint32_t>(bytes, kOffHeaderBytes));
  header.token_bytes = get<uint32_t>(bytes, kOffTokenBytes);
  header.token_count = get<uint64_t>(bytes, kOffTokenCount);
  header.document_count = get<uint64_t>(bytes, kOffDocumentCount);
  header.tokens_offset = get<uint64_t>(bytes, kOffTokensOffset);
  header.documents_offset = get<uint64_t>(bytes, kOffDocumentsOffset);
  header.file_bytes = get<uint64_t>(bytes, kOffFileBytes);
  header.payload_crc32c = get<uint32_t>(bytes, kOffPayloadCrc);
  header.tokenizer_name = get_string(bytes, kOffTokenizerName, kTokenizerNameBytes);
  header.tokenizer_fingerprint = get_string(bytes, kOffTokenizerFingerprint, kTokenizerFingerprintBytes);
  MT_USER_CHECK(header.token_bytes == 2 || header.token_bytes == 4,
                "{}: corrupted header: token width {} (expected 2 "
                "or 4)",
                name, header.token_bytes);
  MT_USER_CHECK(header.token_count < (uint64_t(1) << 56) && header.document_count < (uint64_t(1) << 56),
                "{}: corrupted header: implausible counts ({} tokens, {} documents)", name, header.token_count,
                header.document_count);
  ShardHeader expected = header;
  layout_shard(expected);
  MT_USER_CHECK(expected.tokens_offset == header.tokens_offset &&
                    expected.documents_offset == header.documents_offset && expected.file_bytes == header.file_bytes,
                "{}: corrupted header: offsets do not follow from {} tokens and {} documents", name, header.token_count,
                header.document_count);
  return header;
}

std::string index_to_json(const ShardIndex& index) {
  nlohmann::ordered_json json;
  json["format"] = kIndexFormatName;
  json["version"] = index.version;
  json["tokenizer"] = {{"name", index.tokenizer.name},
                       {"kind", index.tokenizer.kind},
                       {"fingerprint", index.tokenizer.fingerprint},
                       {"vocab_size", index.tokenizer.vocab_size},
                       {"end_of_text_id", index.tokenizer.end_of_text_id}};
  json["token_bytes"] = index.token_bytes;
  json["tokens"] = index.total_tokens;
  json["documents"] = index.total_documents;
  json["shards"] = nlohmann::ordered_json::array();
  for (const ShardEntry& shard : index.shards) {
    nlohmann::ordered_json entry = {{"file", shard.file},
                                    {"tokens", shard.tokens},
                                    {"documents", shard.documents},
                                    {"bytes", shard.bytes},
                                    {"crc32c", fmt::format("{:08x}", shard.crc32c)}};
    if (shard.max_token) entry["max_token"] = *shard.max_token;
    json["shards"].push_back(entry);
  }
  json["sources"] = index.sources;
  return json.dump(2) + "\n";
}

ShardIndex index_from_json(const std::string& text, const std::filesystem::path& file) {
  const std::string name = file.string();
  const nlohmann::json json = parse_json(text, name);
  MT_USER_CHECK(json.is_object() && json.contains("format") && json["format"] == kIndexFormatName,
                "{}: wrong format: expected \"format\": \"{}\"", name, kIndexFormatName);
  ShardIndex index;
  try {
    const uint64_t version = unsigned_field(json, "version", name);
    MT_USER_CHECK(version == kShardVersion, "{}: wrong version: index version {}, this build reads version {}", name,
                  version, kShardVersion);
    const auto& tokenizer = json.at("tokenizer");
    const uint64_t vocab_size = unsigned_field(tokenizer, "vocab_size", name);
    MT_USER_CHECK(vocab_size <= UINT32_MAX, "{}: corrupted index: vocab_size {} does not fit 32 bits", name,
                  vocab_size);
    const nlohmann::json& end_of_text = tokenizer.at("end_of_text_id");
    MT_USER_CHECK(end_of_text.is_number_integer() && end_of_text.get<int64_t>() >= -1 &&
                      end_of_text.get<int64_t>() < static_cast<int64_t>(vocab_size),
                  "{}: corrupted index: end_of_text_id {} is neither -1 nor below vocab_size {}", name,
                  json_excerpt(end_of_text), vocab_size);
    index.tokenizer = {tokenizer.at("name").get<std::string>(), tokenizer.at("kind").get<std::string>(),
                       tokenizer.at("fingerprint").get<std::string>(), static_cast<uint32_t>(vocab_size),
                       end_of_text.get<int64_t>()};
    const uint64_t token_bytes = unsigned_field(json, "token_bytes", name);
    MT_USER_CHECK(token_bytes == 2 || token_bytes == 4, "{}: corrupted index: token_bytes {} (expected 2 or 4)", name,
                  token_bytes);
    index.token_bytes = static_cast<uint32_t>(token_bytes);
    index.total_tokens = unsigned_field(json, "tokens", name);
    index.total_documents = unsigned_field(json, "documents", name);
    MT_USER_CHECK(json.at("shards").is_array(), "{}: corrupted index: \"shards\" is not a list", name);
    for (const auto& shard : json.at("shards")) {
      ShardEntry entry{shard.at("file").get<std::string>(), unsigned_field(shard, "tokens", name),
                       unsigned_field(shard, "documents", name), unsigned_field(shard, "bytes", name),
                       crc32c_field(shard, name), std::nullopt};
      MT_USER_CHECK(is_plain_file_name(entry.file), "{}: corrupted index: shard file name {} must be a plain name",
                    name, json_excerpt(shard.at("file")));
      if (shard.contains("max_token")) {
        const uint64_t max_token = unsigned_field(shard, "max_token", name);
        MT_USER_CHECK(max_token <= UINT32_MAX, "{}: corrupted index: max_token {} of {} is not a token id", name,
                      max_token, entry.file);
        entry.max_token = static_cast<uint32_t>(max_token);
      }
      index.shards.push_back(entry);
    }
    index.sources = json.value("sources", std::vector<std::string>{});
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("{}: corrupted index: {}", name, e.what()));
  }
  return index;
}

}  // namespace meshtrain::token_shards
