// fuzz_token_shards.cpp — fuzzes the token-shard reader (token_shards::ShardDirectory::open and the mapped shard access)
// with either kind of file it reads:
//
//   an input starting with "MTTOKENS" is a shard file: the harness writes it as shard_00000.tok, puts the right
//     header and payload CRC-32C into it (else nearly every mutation would stop at the checksums, which the unit
//     tests cover) and an index.json that agrees with its header, so the mutations reach the field checks, the
//     document offsets, the token ids against the vocabulary (the index records no largest id, so the reader scans
//     for it) and the token reads;
//   any other input is an index.json, opened beside two valid shards (uint16 and uint32 tokens) it may name.
//
// Accepted: meshtrain::UserError (the reader's rejection, naming the file and the check). Anything else is a finding.
#include "fuzz_target.hpp"

#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/token_shards/shard_reader.hpp"
#include "meshtrain/token_shards/shard_writer.hpp"

namespace fs = std::filesystem;
using namespace meshtrain;

namespace {

constexpr size_t kOffTokenBytes = 16, kOffTokenCount = 24, kOffDocumentCount = 32, kOffPayloadCrc = 64,
                 kOffTokenizerName = 72, kOffTokenizerFingerprint = 104;

// Folder with two valid shards that fuzzed indexes may name (written once per process).
const fs::path& shards_for_indexes() {
  static const fs::path dir = [] {
    fs::path path = fuzz::scratch_dir() / "indexed";
    fs::create_directories(path);
    const std::vector<uint32_t> doc_a = {3, 10, 11, 12}, doc_b = {3, 65535}, doc_c = {3, 69999};
    token_shards::ShardWriter narrow(path / "shard_00000.tok", 2, "fuzz-tok", "crc32c:0000abcd:42");
    narrow.append_document(doc_a.data(), doc_a.size());
    narrow.append_document(doc_b.data(), doc_b.size());
    narrow.finish();
    token_shards::ShardWriter wide(path / "shard_00001.tok", 4, "fuzz-tok", "crc32c:0000abcd:42");
    wide.append_document(doc_c.data(), doc_c.size());
    wide.finish();
    return path;
  }();
  return dir;
}

template <typename T>
T field(const std::vector<uint8_t>& bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

std::string text_field(const std::vector<uint8_t>& bytes, size_t offset, size_t size) {
  const char* begin = reinterpret_cast<const char*>(bytes.data() + offset);
  return std::string(begin, strnlen(begin, size));
}

// Writes the shard with its checksums fixed and an index that agrees with its header; returns the folder, or an
// empty path if the header holds a tokenizer name that JSON cannot carry.
fs::path write_shard_directory(const uint8_t* data, size_t size) {
  const fs::path dir = fuzz::scratch_dir() / "shard";
  fs::create_directories(dir);
  std::vector<uint8_t> bytes(data, data + size);
  token_shards::ShardIndex index;
  index.tokenizer = {"fuzz-tok", "tiktoken", "crc32c:0000abcd:42", 70000, 3};
  if (bytes.size() >= token_shards::kShardHeaderBytes) {
    const uint32_t payload_crc = crc32c(bytes.data() + token_shards::kShardHeaderBytes, bytes.size() - token_shards::kShardHeaderBytes);
    std::memcpy(bytes.data() + kOffPayloadCrc, &payload_crc, 4);
    const uint32_t header_crc = crc32c(bytes.data(), token_shards::kShardHeaderBytes - 4);
    std::memcpy(bytes.data() + token_shards::kShardHeaderBytes - 4, &header_crc, 4);
    index.tokenizer.name = text_field(bytes, kOffTokenizerName, 32);
    index.tokenizer.fingerprint = text_field(bytes, kOffTokenizerFingerprint, 64);
    index.token_bytes = field<uint32_t>(bytes, kOffTokenBytes);
    token_shards::ShardEntry entry{"shard_00000.tok", field<uint64_t>(bytes, kOffTokenCount),
                             field<uint64_t>(bytes, kOffDocumentCount), bytes.size(), payload_crc, std::nullopt};
    index.total_tokens = entry.tokens;
    index.total_documents = entry.documents;
    index.shards.push_back(entry);
  }
  std::string index_text;
  try {
    index_text = token_shards::index_to_json(index);
  } catch (const nlohmann::json::type_error&) {  // the header's tokenizer name is not UTF-8: no index can name it
    return {};
  }
  fuzz::write_input(dir / "shard_00000.tok", bytes.data(), bytes.size());
  fuzz::write_input(dir / token_shards::kIndexFileName, index_text.data(), index_text.size());
  return dir;
}

// Reads every token and document offset of every shard, as the data pipeline would.
void read_everything(const token_shards::ShardDirectory& directory) {
  std::vector<uint32_t> buffer;
  for (const token_shards::TokenShard& shard : directory.shards()) {
    buffer.resize(shard.token_count());
    shard.copy_tokens(0, shard.token_count(), buffer.data());
    const uint64_t* starts = shard.document_starts();
    for (uint64_t d = 0; d < shard.document_count(); ++d) {
      if (starts[d + 1] > starts[d]) (void)shard.token(starts[d + 1] - 1);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const bool is_shard = size >= sizeof(token_shards::kShardMagic) &&
                        std::memcmp(data, token_shards::kShardMagic, sizeof(token_shards::kShardMagic)) == 0;
  fs::path dir;
  if (is_shard) {
    dir = write_shard_directory(data, size);
    if (dir.empty()) return 0;
  } else {
    dir = shards_for_indexes();
    fuzz::write_input(dir / token_shards::kIndexFileName, data, size);
  }
  for (token_shards::PayloadCheck check :
       {token_shards::PayloadCheck::never, token_shards::PayloadCheck::on_first_read, token_shards::PayloadCheck::at_open}) {
    try {
      read_everything(token_shards::ShardDirectory::open(dir, token_shards::OpenOptions{"", check}));
    } catch (const UserError&) {
    }
  }
  return 0;
}
