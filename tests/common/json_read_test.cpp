// json_read_test.cpp — depth-limited JSON parsing (a value nested 100,000 levels deep is refused with the source and
// the limit named, never a crash), bounded parser messages, and bounded renderings of untrusted values; then each
// torch-free reader of untrusted JSON given a deeply nested file: tokenizer.json, a token-shard index, a line of
// prepare's JSONL input, metrics.jsonl for `plot`.
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/json_read.hpp"
#include "meshtrain/plots/metrics_svg.hpp"
#include "meshtrain/tokenizer/tokenizer.hpp"
#include "meshtrain/token_shards/prepare.hpp"
#include "meshtrain/token_shards/shard_format.hpp"

#include "scratch_dir.hpp"

#include <gtest/gtest.h>

#include <fstream>

namespace fs = std::filesystem;

namespace meshtrain {
namespace {

// An array nested `levels` deep: "[[[...]]]".
std::string nested(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

const char* const kTooDeep = "nested deeper than the limit of 64 levels of objects and arrays";

// The UserError message of `read` ("" if it returns).
template <typename Read>
std::string error_of(Read&& read) {
  try {
    read();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonReadTest, ADeepValueIsRefusedNamingTheSourceAndTheLimit) {
  EXPECT_EQ(parse_json(nested(64), "x.json").size(), 1u);
  EXPECT_EQ(error_of([] { parse_json(nested(65), "x.json"); }), std::string("x.json: ") + kTooDeep +
                                                                    " (damaged, or not a file meshtrain reads)");
  for (const std::string& text : {nested(100000), "{\"a\": " + nested(100000) + "}", std::string(100000, '[')}) {
    EXPECT_NE(error_of([&] { parse_json(text, "deep.json"); }).find(std::string("deep.json: ") + kTooDeep),
              std::string::npos);
    EXPECT_EQ(parse_json_if_valid(text), std::nullopt);
  }
  std::string objects;
  for (int i = 0; i < 100; ++i) objects += "{\"k\": ";
  objects += "1" + std::string(100, '}');
  EXPECT_NE(error_of([&] { parse_json(objects, "o.json"); }).find(kTooDeep), std::string::npos);
  // Brackets inside strings are text.
  EXPECT_EQ(parse_json("[\"" + std::string(1000, '[') + "\"]", "s.json")[0].get<std::string>().size(), 1000u);
}

TEST(JsonReadTest, InvalidJsonIsNamedWithABoundedMessage) {
  const std::string error = error_of([] { parse_json("[\"" + std::string(1 << 20, 'a'), "long.json"); });
  EXPECT_EQ(error.rfind("long.json: not valid JSON: ", 0), 0u) << error;
  EXPECT_LT(error.size(), 300u);
  EXPECT_EQ(parse_json_if_valid("{\"step\": 1"), std::nullopt);
  EXPECT_EQ(parse_json_if_valid("{\"step\": 1}").value()["step"], 1);
}

TEST(JsonReadTest, ExcerptsAreBoundedWhateverTheValue) {
  const nlohmann::json small = nlohmann::json::parse("{\"a\": [1, 2.5, null, true, \"x\"], \"b\": {}}");
  EXPECT_EQ(json_excerpt(small), small.dump());
  EXPECT_EQ(json_excerpt(nlohmann::json(std::vector<int>(100000, 7)), 20), "[7,7,7,7,7,7,7,7,7,7...");
  EXPECT_EQ(json_excerpt(nlohmann::json(std::string(1 << 20, 'z')), 10), "\"zzzzzzzzz...");
  // A value built deeper than any parse allows (nlohmann's own dump would recurse 100,000 times).
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 100000; ++i) deep = nlohmann::json::array({std::move(deep)});
  EXPECT_EQ(json_excerpt(deep, 5), "[[[[[...");
  // Invalid UTF-8 is replaced, and a cut never splits a character.
  EXPECT_EQ(json_excerpt(nlohmann::json(std::string("\xff"))), "\"\xef\xbf\xbd\"");
  EXPECT_EQ(bounded_text("a\xc3\xa9z", 2), "a...");
  EXPECT_EQ(bounded_text("short"), "short");
}

class NestedReaderTest : public ::testing::Test {
 protected:
  fs::path write(const std::string& name, const std::string& text) {
    const fs::path path = scratch_.path() / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  meshtrain::testing::ScratchDir scratch_{"meshtrain_json_read_test"};
};

TEST_F(NestedReaderTest, EveryTorchFreeReaderRefusesADeepFile) {
  const fs::path tokenizer = write("tok/tokenizer.json", "{\"model\": {\"type\": \"BPE\"}, \"pre_tokenizer\": " +
                                                             nested(100000) + "}");
  EXPECT_NE(error_of([&] { tokenizer::load_tokenizer(tokenizer.string()); })
                .find(tokenizer.string() + ": " + kTooDeep),
            std::string::npos);

  const fs::path index = scratch_.path() / "shards" / "index.json";
  const std::string index_text = "{\"format\": \"meshtrain-token-shards\", \"sources\": " + nested(100000) + "}";
  EXPECT_NE(error_of([&] { token_shards::index_from_json(index_text, index); }).find(index.string() + ": " + kTooDeep),
            std::string::npos);

  const fs::path jsonl = write("input/docs.jsonl", "{\"text\": \"a\"}\n{\"text\": " + nested(100000) + "}\n");
  token_shards::PrepareOptions options;
  options.inputs = {jsonl};
  options.output_dir = scratch_.path() / "prepared";
  const std::string prepare_error =
      error_of([&] { token_shards::prepare_token_shards(*tokenizer::load_tokenizer("byte"), options); });
  EXPECT_NE(prepare_error.find(jsonl.string() + ":2: " + kTooDeep), std::string::npos) << prepare_error;

  write("run/metrics.jsonl", "{\"step\": 1, \"loss\": 5.0}\n{\"step\": " + nested(100000) + "}\n");
  EXPECT_NE(error_of([&] { plots::plot_metrics(scratch_.path() / "run"); })
                .find((scratch_.path() / "run" / "metrics.jsonl").string() + ":2: not a metrics line"),
            std::string::npos);
}

}  // namespace
}  // namespace meshtrain
