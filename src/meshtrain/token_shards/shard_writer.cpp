// shard_writer.cpp — streaming shard writer with a running CRC-32C over the payload.
#include "meshtrain/token_shards/shard_writer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"

namespace meshtrain::token_shards {

ShardWriter::ShardWriter(std::filesystem::path path, uint32_t token_bytes, std::string tokenizer_name,
                         std::string tokenizer_fingerprint)
    : path_(std::move(path)), temp_path_(path_.string() + ".tmp") {
  MT_CHECK(token_bytes == 2 || token_bytes == 4, "token width must be 2 or 4, got {}", token_bytes);
  header_.token_bytes = token_bytes;
  header_.tokenizer_name = std::move(tokenizer_name);
  header_.tokenizer_fingerprint = std::move(tokenizer_fingerprint);
  file_ = std::fopen(temp_path_.c_str(), "wb");
  MT_USER_CHECK(file_, "cannot create {}: {}", temp_path_.string(), std::strerror(errno));
  std::vector<uint8_t> placeholder(kShardHeaderBytes, 0);
  MT_USER_CHECK(std::fwrite(placeholder.data(), 1, placeholder.size(), file_) == placeholder.size(),
                "cannot write {}: {}", temp_path_.string(), std::strerror(errno));
}

ShardWriter::~ShardWriter() {
  if (file_) {
    std::fclose(file_);
    std::error_code ignored;
    std::filesystem::remove(temp_path_, ignored);
  }
}

void ShardWriter::write(const void* data, size_t size) {
  crc_ = crc32c(data, size, crc_);
  MT_USER_CHECK(std::fwrite(data, 1, size, file_) == size, "cannot write {}: {}", temp_path_.string(),
                std::strerror(errno));
}

void ShardWriter::append_document(const uint32_t* ids, size_t count) {
  MT_CHECK(file_, "append_document after finish on {}", path_.string());
  document_starts_.push_back(header_.token_count);
  ++header_.document_count;
  header_.token_count += count;
  if (count > 0) {
    const uint32_t largest = *std::max_element(ids, ids + count);
    max_token_ = std::max(max_token_.value_or(0), largest);
  }
  if (header_.token_bytes == 4) {
    write(ids, count * 4);
    return;
  }
  buffer_.resize(count * 2);
  for (size_t i = 0; i < count; ++i) {
    MT_CHECK(ids[i] <= 0xFFFF, "token id {} does not fit in a uint16 shard {}", ids[i], path_.string());
    uint16_t id = static_cast<uint16_t>(ids[i]);
    std::memcpy(buffer_.data() + 2 * i, &id, 2);
  }
  write(buffer_.data(), buffer_.size());
}

ShardEntry ShardWriter::finish() {
  MT_CHECK(file_, "finish called twice on {}", path_.string());
  layout_shard(header_);
  uint64_t tokens_end = header_.tokens_offset + header_.token_count * header_.token_bytes;
  const uint8_t zeros[8] = {};
  write(zeros, header_.documents_offset - tokens_end);
  document_starts_.push_back(header_.token_count);
  write(document_starts_.data(), document_starts_.size() * sizeof(uint64_t));
  header_.payload_crc32c = crc_;
  std::vector<uint8_t> header_bytes = encode_shard_header(header_);
  bool ok = std::fseek(file_, 0, SEEK_SET) == 0 &&
            std::fwrite(header_bytes.data(), 1, header_bytes.size(), file_) == header_bytes.size();
  ok = (std::fclose(file_) == 0) && ok;
  file_ = nullptr;
  MT_USER_CHECK(ok, "cannot write {}: {}", temp_path_.string(), std::strerror(errno));
  std::filesystem::rename(temp_path_, path_);
  return {path_.filename().string(), header_.token_count, header_.document_count, header_.file_bytes,
          header_.payload_crc32c, max_token_};
}

}  // namespace meshtrain::token_shards
