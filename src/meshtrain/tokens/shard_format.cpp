// shard_format.cpp — shard header (de)serialization with its checks, and the index file as JSON.
#include "meshtrain/tokens/shard_format.hpp"

#include <cstring>
#include <nlohmann/json.hpp>

#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"

namespace meshtrain::tokens {
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
    json["shards"].push_back({{"file", shard.file},
                              {"tokens", shard.tokens},
                              {"documents", shard.documents},
                              {"bytes", shard.bytes},
                              {"crc32c", fmt::format("{:08x}", shard.crc32c)}});
  }
  json["sources"] = index.sources;
  return json.dump(2) + "\n";
}

ShardIndex index_from_json(const std::string& text, const std::filesystem::path& file) {
  const std::string name = file.string();
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("{}: corrupted index: not valid JSON ({})", name, e.what()));
  }
  MT_USER_CHECK(json.is_object() && json.value("format", "") == kIndexFormatName,
                "{}: wrong format: expected \"format\": \"{}\"", name, kIndexFormatName);
  ShardIndex index;
  try {
    index.version = json.at("version").get<uint32_t>();
    MT_USER_CHECK(index.version == kShardVersion, "{}: wrong version: index version {}, this build reads version {}",
                  name, index.version, kShardVersion);
    const auto& tokenizer = json.at("tokenizer");
    index.tokenizer = {tokenizer.at("name").get<std::string>(), tokenizer.at("kind").get<std::string>(),
                       tokenizer.at("fingerprint").get<std::string>(), tokenizer.at("vocab_size").get<uint32_t>(),
                       tokenizer.at("end_of_text_id").get<int64_t>()};
    index.token_bytes = json.at("token_bytes").get<uint32_t>();
    index.total_tokens = json.at("tokens").get<uint64_t>();
    index.total_documents = json.at("documents").get<uint64_t>();
    for (const auto& shard : json.at("shards")) {
      ShardEntry entry{shard.at("file").get<std::string>(), shard.at("tokens").get<uint64_t>(),
                       shard.at("documents").get<uint64_t>(), shard.at("bytes").get<uint64_t>(),
                       static_cast<uint32_t>(std::stoul(shard.at("crc32c").get<std::string>(), nullptr, 16))};
      MT_USER_CHECK(entry.file.find('/') == std::string::npos && !entry.file.empty() && entry.file[0] != '.',
                    "{}: corrupted index: shard file name '{}' must be a plain name", name, entry.file);
      index.shards.push_back(entry);
    }
    index.sources = json.value("sources", std::vector<std::string>{});
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("{}: corrupted index: {}", name, e.what()));
  } catch (const std::logic_error& e) {  // std::stoul on a malformed checksum
    throw UserError(fmt::format("{}: corrupted index: bad crc32c ({})", name, e.what()));
  }
  return index;
}

}  // namespace meshtrain::tokens
