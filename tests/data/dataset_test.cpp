// dataset_test.cpp — TokenDataset checks every id it hands on against the vocabulary: a shard whose index understates
// its largest id (its checksums intact, so nothing else notices when checksums are computed on first read) fails at
// the sample that holds the id, naming the shard, the sample and the id. And each sample's document numbers, across
// document and shard boundaries; and a token range of a sample (context parallelism's chunks) reads the same tokens
// and document numbers as the whole sample at those positions.
#include "meshtrain/common/error.hpp"
#include "meshtrain/data/dataset.hpp"
#include "meshtrain/token_shards/shard_writer.hpp"
#include "data/data_test_support.hpp"

#include "scratch_dir.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <numeric>

namespace fs = std::filesystem;

namespace meshtrain::data {
namespace {

// One shard of ids 0, 1, 2, ... (`token_bytes` wide) with `bad_id` at stream position 50, whose index says its largest
// id is vocab_size - 1.
void write_lying_shard(const fs::path& dir, uint32_t token_bytes, uint32_t vocab_size, uint32_t bad_id) {
  fs::create_directories(dir);
  token_shards::ShardWriter writer(dir / "shard_00000.tok", token_bytes, "test", "test:lying");
  std::vector<uint32_t> document(200);
  std::iota(document.begin(), document.end(), 0u);
  document[50] = bad_id;
  writer.append_document(document.data(), document.size());
  token_shards::ShardIndex index;
  index.tokenizer = {"test", "byte", "test:lying", vocab_size, -1};
  index.token_bytes = token_bytes;
  index.shards.push_back(writer.finish());
  index.shards.back().max_token = vocab_size - 1;  // the lie
  index.total_tokens = index.shards.back().tokens;
  index.total_documents = index.shards.back().documents;
  std::ofstream(dir / token_shards::kIndexFileName) << token_shards::index_to_json(index);
}

TEST(TokenDatasetTest, AnIdBeyondTheVocabularyIsCaughtWhereItIsHandedOn) {
  const meshtrain::testing::ScratchDir scratch("meshtrain_dataset_test");
  for (const auto& [token_bytes, vocab_size, bad_id] :
       {std::tuple<uint32_t, uint32_t, uint32_t>{2, 256, 300}, {4, 256, 70000}, {4, 1000, 4000000000u}}) {
    const fs::path dir = scratch.path() / std::to_string(bad_id);
    write_lying_shard(dir, token_bytes, vocab_size, bad_id);
    const TokenDataset dataset(dir, 8, token_shards::PayloadCheck::on_first_read);
    std::vector<int32_t> row(9);
    dataset.read_sample(5, row.data());  // tokens 40..48
    EXPECT_EQ(row[8], 48);
    try {
      dataset.read_sample(6, row.data());  // tokens 48..56
      ADD_FAILURE() << "an id beyond the vocabulary was handed on";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()),
                fmt::format("{}: token id check failed: sample 6 holds token id {} (token 50 of the shard), not "
                            "below the vocabulary size {} of tokenizer test; the index says the shard's largest id "
                            "is {} (the shard or its index.json was altered or damaged)",
                            (dir / "shard_00000.tok").string(), bad_id, vocab_size, vocab_size - 1));
    }
    // With checksums computed at open, the largest id is recomputed there and the index's is refused.
    EXPECT_THROW(TokenDataset(dir, 8, token_shards::PayloadCheck::at_open), UserError);
  }
}

TEST(TokenDatasetTest, DocumentNumbersCountTheDocumentStartsInASample) {
  testing::ScratchDir scratch("dataset_documents");
  // Shards of 100, 50 and 90 tokens in documents of 37 (each shard's last one shorter): documents start at stream
  // positions 0, 37, 74 | 100, 137 | 150, 187, 224.
  testing::write_counting_shards(scratch.path(), {100, 50, 90});
  const std::vector<int64_t> starts = {0, 37, 74, 100, 137, 150, 187, 224};
  auto document_at = [&](int64_t position) {
    return static_cast<int32_t>(std::upper_bound(starts.begin(), starts.end(), position) - starts.begin() - 1);
  };
  for (int64_t block_size : {8, 40, 120}) {
    const TokenDataset dataset(scratch.path(), block_size);
    std::vector<int32_t> documents(block_size);
    for (int64_t id = 0; id < dataset.num_samples(); ++id) {
      dataset.read_sample_documents(id, documents.data());
      const int64_t first = id * block_size;
      for (int64_t t = 0; t < block_size; ++t)
        ASSERT_EQ(documents[t], document_at(first + t) - document_at(first))
            << "block_size " << block_size << " sample " << id << " token " << t;
    }
  }
}

TEST(TokenDatasetTest, ATokenRangeReadsTheWholeSamplesTokensAndDocumentNumbersAtItsPositions) {
  testing::ScratchDir scratch("dataset_ranges");
  testing::write_counting_shards(scratch.path(), {100, 50, 90});  // documents start at 0, 37, 74 | 100, 137 | 150, ...
  const int64_t block_size = 40;
  const TokenDataset dataset(scratch.path(), block_size);
  std::vector<int32_t> tokens(block_size + 1), documents(block_size), part(block_size + 1);
  for (int64_t id = 0; id < dataset.num_samples(); ++id) {
    dataset.read_sample(id, tokens.data());
    dataset.read_sample_documents(id, documents.data());
    for (int64_t begin = 0; begin < block_size; begin += 5)
      for (int64_t end : {begin + 1, begin + 5, block_size}) {
        if (end > block_size) continue;
        const std::string where = fmt::format("sample {} tokens {}:{}", id, begin, end);
        dataset.read_sample(id, {begin, end + 1}, part.data());  // with the label token after it
        for (int64_t t = begin; t <= end; ++t) ASSERT_EQ(part[t - begin], tokens[t]) << where;
        dataset.read_sample_documents(id, {begin, end}, part.data());
        for (int64_t t = begin; t < end; ++t) ASSERT_EQ(part[t - begin], documents[t]) << where << " document";
      }
  }
}

}  // namespace
}  // namespace meshtrain::data
