// shard_test.cpp — the token-shard format: write/read round trips (uint16 and uint32), memory-mapped access, and
// up-front validation with the exact error for truncated, corrupted, wrong-magic, wrong-version and
// tokenizer-mismatched shards, token ids beyond the vocabulary, malformed index fields, and a shard truncated while
// mapped.
#include <gtest/gtest.h>

#include "scratch_dir.hpp"

#include <fstream>
#include <vector>
#include <nlohmann/json.hpp>

#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/token_shards/shard_reader.hpp"
#include "meshtrain/token_shards/shard_writer.hpp"

namespace meshtrain::token_shards {
namespace {

namespace fs = std::filesystem;

class TokensShardTest : public ::testing::Test {
 protected:

  // Writes a directory of one shard holding `documents`, with an index.
  void write_directory(const std::vector<std::vector<uint32_t>>& documents, uint32_t token_bytes,
                       uint32_t vocab_size = 70000) {
    fs::remove(shard_path());
    ShardWriter writer(dir_ / "shard_00000.tok", token_bytes, "test-tok", "crc32c:0000abcd:42");
    for (const auto& doc : documents) writer.append_document(doc.data(), doc.size());
    EXPECT_FALSE(fs::exists(dir_ / "shard_00000.tok")) << "the shard must appear only at finish()";
    ShardEntry entry = writer.finish();
    ShardIndex index;
    index.tokenizer = {"test-tok", "tiktoken", "crc32c:0000abcd:42", vocab_size, 3};
    index.token_bytes = token_bytes;
    index.total_tokens = entry.tokens;
    index.total_documents = entry.documents;
    index.shards.push_back(entry);
    std::ofstream(dir_ / kIndexFileName) << index_to_json(index);
  }

  // Opens the directory and returns the UserError message ("" if it opens).
  std::string open_error(const OpenOptions& options = {}) {
    try {
      ShardDirectory::open(dir_, options);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }

  void patch(uint64_t offset, const std::string& bytes) {
    std::fstream file(dir_ / "shard_00000.tok", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(offset);
    file.write(bytes.data(), bytes.size());
  }

  fs::path shard_path() const { return dir_ / "shard_00000.tok"; }

  // Rewrites index.json through `edit` of its JSON.
  template <typename Edit>
  void edit_index(Edit&& edit) {
    nlohmann::json json = nlohmann::json::parse(std::ifstream(dir_ / kIndexFileName));
    edit(json);
    std::ofstream(dir_ / kIndexFileName) << json.dump();
  }

  meshtrain::testing::ScratchDir scratch_{"meshtrain_shard_test"};
  const fs::path& dir_ = scratch_.path();
  const std::vector<std::vector<uint32_t>> documents_ = {{3, 10, 11, 12}, {3, 65535}, {3}, {3, 7, 8}};
};

TEST(TokensChecksumTest, Crc32cCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(TokensChecksumTest, Crc32cOfLongBuffersMatchesTheBitwiseDefinition) {
  // Long enough for the three-stream path (pieces of 3 x 4096 bytes) and a tail, chained at odd split points.
  std::vector<uint8_t> data(3 * 4096 * 3 + 1234);
  uint64_t state = 12345;
  for (uint8_t& byte : data) byte = static_cast<uint8_t>((state = state * 6364136223846793005ull + 1) >> 56);
  uint32_t expected = ~0u;  // the reflected Castagnoli polynomial, a bit at a time
  for (uint8_t byte : data) {
    expected ^= byte;
    for (int k = 0; k < 8; ++k) expected = (expected & 1) ? (expected >> 1) ^ 0x82F63B78u : expected >> 1;
  }
  expected = ~expected;
  EXPECT_EQ(crc32c(data.data(), data.size()), expected);
  for (size_t split : {size_t{1}, size_t{4095}, size_t{12288}, size_t{20001}}) {
    const uint32_t first = crc32c(data.data(), split);
    EXPECT_EQ(crc32c(data.data() + split, data.size() - split, first), expected) << "split at " << split;
  }
}

TEST_F(TokensShardTest, RoundTripsUint16AndUint32) {
  for (uint32_t width : {2u, 4u}) {
    std::vector<std::vector<uint32_t>> documents = documents_;
    if (width == 4) documents[1][1] = 128255;
    write_directory(documents, width, width == 4 ? 128256 : 70000);
    ShardDirectory dir = ShardDirectory::open(dir_);
    ASSERT_EQ(dir.shards().size(), 1u);
    const TokenShard& shard = dir.shards()[0];
    EXPECT_EQ(shard.token_bytes(), width);
    EXPECT_EQ(shard.token_count(), 10u);
    EXPECT_EQ(shard.document_count(), 4u);
    EXPECT_EQ(dir.total_tokens(), 10u);
    const uint64_t* starts = shard.document_starts();
    EXPECT_EQ(std::vector<uint64_t>(starts, starts + 5), (std::vector<uint64_t>{0, 4, 6, 7, 10}));
    std::vector<uint32_t> all(10);
    shard.copy_tokens(0, 10, all.data());
    std::vector<uint32_t> expected;
    for (const auto& doc : documents) expected.insert(expected.end(), doc.begin(), doc.end());
    EXPECT_EQ(all, expected);
    EXPECT_EQ(shard.token(5), expected[5]);
    EXPECT_EQ(dir.index().tokenizer.name, "test-tok");
    EXPECT_EQ(dir.index().tokenizer.end_of_text_id, 3);
  }
}

TEST_F(TokensShardTest, TruncatedShardIsNamed) {
  write_directory(documents_, 2);
  // 256 header + 10 uint16 tokens padded to 280 + 5 document offsets = 320 bytes.
  fs::resize_file(shard_path(), fs::file_size(shard_path()) - 8);
  EXPECT_EQ(open_error(), shard_path().string() + ": truncated: 312 bytes, the header says 320");
  fs::resize_file(shard_path(), 100);
  EXPECT_EQ(open_error(), shard_path().string() + ": truncated: 100 bytes, shorter than the 256-byte header");
}

TEST_F(TokensShardTest, CorruptedPayloadFailsTheChecksum) {
  write_directory(documents_, 2);
  patch(kShardHeaderBytes + 2, std::string("\x01", 1));
  std::string error = open_error();
  EXPECT_NE(error.find(shard_path().string() + ": checksum mismatch: payload CRC-32C is"), std::string::npos) << error;
  OpenOptions no_checksum;
  no_checksum.payload_check = PayloadCheck::never;
  EXPECT_EQ(open_error(no_checksum), "");
  // Checked on the first read instead: opening costs nothing, the first copy of a token fails (every time).
  OpenOptions on_read;
  on_read.payload_check = PayloadCheck::on_first_read;
  ShardDirectory lazy = ShardDirectory::open(dir_, on_read);
  uint32_t token = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      lazy.shards()[0].copy_tokens(0, 1, &token);
      ADD_FAILURE() << "a corrupted shard was read without an error";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(shard_path().string() + ": checksum mismatch"), std::string::npos)
          << e.what();
    }
  }
  write_directory(documents_, 2);
  ShardDirectory intact = ShardDirectory::open(dir_, on_read);
  intact.shards()[0].copy_tokens(0, 1, &token);  // a good shard reads
}

TEST_F(TokensShardTest, WrongMagicAndVersionAndCorruptedHeader) {
  write_directory(documents_, 2);
  patch(0, "NOTTOKEN");
  EXPECT_EQ(open_error(), shard_path().string() + ": wrong magic: not a meshtrain token shard (expected \"MTTOKENS\")");
  write_directory(documents_, 2);
  patch(8, std::string("\x02\0\0\0", 4));
  EXPECT_EQ(open_error(), shard_path().string() + ": wrong version: format version 2, this build reads version 1");
  write_directory(documents_, 2);
  patch(24, std::string("\x09", 1));  // token count, without fixing the header checksum
  std::string error = open_error();
  EXPECT_NE(error.find(shard_path().string() + ": corrupted header: header checksum"), std::string::npos) << error;
}

TEST_F(TokensShardTest, HugeCountsAreRejectedWithoutOverflow) {
  // A consistent header that claims more than 4 GiB of tokens over a short file: 64-bit sizes, a clean error.
  ShardHeader header;
  header.token_bytes = 4;
  header.token_count = (uint64_t(5) << 30);
  header.document_count = 1;
  layout_shard(header);
  EXPECT_EQ(header.documents_offset, kShardHeaderBytes + (uint64_t(20) << 30));
  std::vector<uint8_t> bytes = encode_shard_header(header);
  ShardHeader decoded = decode_shard_header(bytes.data(), bytes.size(), "x.tok");
  EXPECT_EQ(decoded.file_bytes, header.file_bytes);
  write_directory(documents_, 2);
  std::ofstream(shard_path(), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::string error = open_error();
  EXPECT_EQ(error,
            shard_path().string() + ": truncated: 256 bytes, the header says " + std::to_string(header.file_bytes));
}

TEST_F(TokensShardTest, TokenizerMismatchAndMissingIndex) {
  write_directory(documents_, 2);
  OpenOptions options;
  options.expected_tokenizer_fingerprint = "crc32c:ffffffff:1";
  EXPECT_EQ(open_error(options), (dir_ / kIndexFileName).string() +
                                     ": tokenizer mismatch: prepared with test-tok (crc32c:0000abcd:42), expected "
                                     "crc32c:ffffffff:1");
  options.expected_tokenizer_fingerprint = "crc32c:0000abcd:42";
  EXPECT_EQ(open_error(options), "");
  fs::remove(dir_ / kIndexFileName);
  std::string error = open_error();
  EXPECT_NE(error.find("index.json: missing: not a finished token-shard directory"), std::string::npos) << error;
}

TEST_F(TokensShardTest, TokenIdsAreCheckedAgainstTheVocabulary) {
  // The index records each shard's largest id; the reader compares it with the tokenizer's vocabulary.
  write_directory(documents_, 2, 1000);
  EXPECT_EQ(open_error(), shard_path().string() +
                              ": token id check failed: token id 65535 is not below the vocabulary size 1000 of "
                              "tokenizer test-tok (" + (dir_ / kIndexFileName).string() + ")");
  // An index without the record (written before it existed): the reader scans the shard, checksums or not.
  edit_index([](nlohmann::json& json) { json["shards"][0].erase("max_token"); });
  OpenOptions no_checksum;
  no_checksum.payload_check = PayloadCheck::never;
  EXPECT_NE(open_error(no_checksum).find("token id 65535 is not below the vocabulary size 1000"), std::string::npos);
  // A record that understates the largest id is caught when checksums are verified.
  write_directory(documents_, 2);
  edit_index([](nlohmann::json& json) { json["shards"][0]["max_token"] = 12; });
  EXPECT_EQ(open_error(), shard_path().string() + ": does not match the index: the largest token id is 65535, the "
                                                  "index says 12");
  write_directory(documents_, 2);
  ShardDirectory dir = ShardDirectory::open(dir_);
  EXPECT_EQ(dir.shards()[0].max_token(), 65535u);
  EXPECT_EQ(dir.index().shards[0].max_token, 65535u);
}

TEST_F(TokensShardTest, IndexFieldsAreCheckedStrictly) {
  const std::string index = (dir_ / kIndexFileName).string();
  auto error_after = [&](auto&& edit) {
    write_directory(documents_, 2);
    edit_index(edit);
    return open_error();
  };
  EXPECT_EQ(error_after([](nlohmann::json& j) { j["shards"][0]["file"] = "../shard_00000.tok"; }),
            index + ": corrupted index: shard file name \"../shard_00000.tok\" must be a plain name");
  EXPECT_EQ(error_after([](nlohmann::json& j) { j["shards"][0]["file"] = std::string("shard\0x", 7); }),
            index + ": corrupted index: shard file name \"shard\\u0000x\" must be a plain name");
  // "-1" and 10 digits went through std::stoul and were truncated to 32 bits.
  EXPECT_EQ(error_after([](nlohmann::json& j) { j["shards"][0]["crc32c"] = "1ffffffff"; }),
            index + ": corrupted index: crc32c \"1ffffffff\" is not 8 hex digits");
  EXPECT_EQ(error_after([](nlohmann::json& j) { j["tokens"] = -10; }),
            index + ": corrupted index: \"tokens\" is -10, expected a non-negative integer");
  EXPECT_EQ(error_after([](nlohmann::json& j) { j["tokenizer"]["vocab_size"] = 4294967296; }),
            index + ": corrupted index: vocab_size 4294967296 does not fit 32 bits");
  EXPECT_EQ(error_after([](nlohmann::json& j) { j["format"] = 1; }),  // json.value() threw a raw type_error
            index + ": wrong format: expected \"format\": \"" + kIndexFormatName + "\"");
  EXPECT_EQ(error_after([](nlohmann::json& j) { j["version"] = 4294967297; }),  // wrapped to 1
            index + ": wrong version: index version 4294967297, this build reads version 1");
}

TEST_F(TokensShardTest, ShardTruncatedWhileMappedEndsTheProcessNamingIt) {
  write_directory(documents_, 4);
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(
      {
        ShardDirectory dir = ShardDirectory::open(dir_);
        fs::resize_file(shard_path(), 0);  // another process shortening the file in place
        std::vector<uint32_t> tokens(10);
        dir.shards()[0].copy_tokens(0, 10, tokens.data());
      },
      ::testing::ExitedWithCode(kTruncatedWhileMapped),
      "shard_00000.tok: truncated while mapped: reading byte [0-9]+ of the 336 bytes it had when it was opened");
}

TEST_F(TokensShardTest, UnfinishedWriterLeavesNoFile) {
  {
    ShardWriter writer(dir_ / "shard_00000.tok", 2, "t", "f");
    std::vector<uint32_t> doc = {1, 2, 3};
    writer.append_document(doc.data(), doc.size());
  }
  EXPECT_TRUE(fs::is_empty(dir_));
}

}  // namespace
}  // namespace meshtrain::token_shards
