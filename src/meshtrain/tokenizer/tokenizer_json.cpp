// tokenizer_json.cpp — loads Hugging Face tokenizer.json files of the byte-level BPE kind (GPT-2, Llama 3): the
// vocabulary and merges in the GPT-2 byte-to-unicode alphabet, the pre-tokenizer regex, and the added tokens.
// Anything else (normalizers, other models, prefix spaces) is refused with a message naming the field.
//
// The file is untrusted: every field is checked for its JSON type (a wrong one is a UserError naming the file), and
// token ids must be below the number of entries (model.vocab plus added_tokens), as a vocabulary numbered from 0
// has them, so that an id cannot size the token table (4294967295 would wrap `id + 1` to 0).
#include <array>
#include <nlohmann/json.hpp>

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/json_read.hpp"
#include "meshtrain/tokenizer/tokenizer.hpp"

namespace meshtrain::tokenizer {
namespace {

const char* const kByteLevelPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's Split regex (the original cl100k pattern), known to be safe to cut at find_safe_split() positions.
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode(), inverted: code point -> byte (-1 if the code point stands for no byte).
std::array<int, 324> unicode_to_byte() {
  std::array<int, 324> table;
  table.fill(-1);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table[printable ? b : next++] = b;
  }
  return table;
}

// The bytes a token string of the byte-level alphabet stands for; false if it is not of that alphabet.
bool byte_level_decode(const std::string& token, std::string& bytes) {
  static const std::array<int, 324> table = unicode_to_byte();
  bytes.clear();
  for (size_t i = 0; i < token.size();) {
    unsigned char lead = token[i];
    uint32_t code;
    if (lead < 0x80) {
      code = lead;
      i += 1;
    } else if ((lead & 0xE0) == 0xC0 && i + 1 < token.size()) {
      code = ((lead & 0x1Fu) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;  // byte-level alphabet code points are all below U+0800
    }
    if (code >= table.size() || table[code] < 0) return false;
    bytes += static_cast<char>(table[code]);
  }
  return true;
}

const nlohmann::json& require(const nlohmann::json& object, const char* key, const std::filesystem::path& path) {
  MT_USER_CHECK(object.is_object() && object.contains(key), "{}: expected a field '{}'", path.string(), key);
  return object.at(key);
}

// A token id of `what`: a non-negative integer below `id_limit`.
uint32_t token_id(const nlohmann::json& value, uint64_t id_limit, const std::string& what,
                  const std::filesystem::path& path) {
  MT_USER_CHECK(value.is_number_unsigned() && value.get<uint64_t>() < id_limit,
                "{}: token id check failed: the id of {} is {}, expected an integer below {} (the number of entries "
                "in model.vocab and added_tokens)",
                path.string(), what, json_excerpt(value), id_limit);
  return value.get<uint32_t>();
}

std::string pre_tokenizer_pattern(const nlohmann::json& pre, const std::filesystem::path& path) {
  auto is_plain_byte_level = [&](const nlohmann::json& p, bool with_regex) {
    return p.value("type", "") == "ByteLevel" && !p.value("add_prefix_space", false) &&
           p.value("use_regex", true) == with_regex;
  };
  if (is_plain_byte_level(pre, true)) return kByteLevelPattern;
  if (pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].size() == 2) {
    const nlohmann::json& split = pre["pretokenizers"][0];
    if (split.value("type", "") == "Split" && split.value("behavior", "") == "Isolated" &&
        !split.value("invert", false) && split.contains("pattern") && split["pattern"].contains("Regex") &&
        is_plain_byte_level(pre["pretokenizers"][1], false))
      return split["pattern"]["Regex"].get<std::string>();
  }
  throw UserError(
      fmt::format("{}: unsupported pre_tokenizer {} (expected ByteLevel with use_regex and no prefix "
                  "space, or Sequence[Split(Regex, Isolated), ByteLevel(use_regex=false)])",
                  path.string(), json_excerpt(pre, 200)));
}

TokenizerSpec spec_from_json(const nlohmann::json& json, const std::string& bytes, const std::filesystem::path& path,
                             const std::string& name) {
  const nlohmann::json& model = require(json, "model", path);
  MT_USER_CHECK(model.value("type", "") == "BPE", "{}: model.type is '{}', expected BPE", path.string(),
                bounded_text(model.value("type", "")));
  MT_USER_CHECK(!model.value("byte_fallback", false), "{}: model.byte_fallback is not supported", path.string());
  MT_USER_CHECK(json.value("normalizer", nlohmann::json()).is_null(), "{}: normalizer must be null (byte-level BPE)",
                path.string());
  const nlohmann::json& decoder = require(json, "decoder", path);
  MT_USER_CHECK(decoder.value("type", "") == "ByteLevel", "{}: decoder.type must be ByteLevel", path.string());

  TokenizerSpec spec;
  spec.name = name;
  spec.kind = "tokenizer.json";
  spec.fingerprint = file_fingerprint(bytes);
  spec.pattern = pre_tokenizer_pattern(require(json, "pre_tokenizer", path), path);
  spec.whole_piece_lookup = model.value("ignore_merges", false);
  spec.splittable = spec.pattern == kByteLevelPattern || spec.pattern == kLlama3Pattern;

  const nlohmann::json& vocab = require(model, "vocab", path);
  MT_USER_CHECK(vocab.is_object(), "{}: model.vocab must be an object of token -> id", path.string());
  const nlohmann::json added_tokens = json.value("added_tokens", nlohmann::json::array());
  const uint64_t id_limit = vocab.size() + added_tokens.size();
  std::unordered_map<uint32_t, bool> added_ids;
  for (const nlohmann::json& added : added_tokens) {
    const std::string content = require(added, "content", path).get<std::string>();
    const std::string what = "added token '" + bounded_text(content) + "'";
    SpecialToken special{content, token_id(require(added, "id", path), id_limit, what, path)};
    added_ids[special.id] = true;
    spec.special_tokens.push_back(special);
    if (special.text == "<|endoftext|>" || (special.text == "<|end_of_text|>" && spec.end_of_text.empty()))
      spec.end_of_text = special.text;
  }

  std::unordered_map<std::string, uint32_t> vocab_ids;
  std::string token_bytes;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const uint32_t id = token_id(it.value(), id_limit, "vocab token '" + bounded_text(it.key()) + "'", path);
    vocab_ids[it.key()] = id;
    if (added_ids.count(id)) continue;
    MT_USER_CHECK(byte_level_decode(it.key(), token_bytes),
                  "{}: vocab token '{}' (id {}) is not in the byte-level "
                  "alphabet",
                  path.string(), bounded_text(it.key()), id);
    if (spec.token_bytes.size() <= id) spec.token_bytes.resize(id + 1);
    spec.token_bytes[id] = token_bytes;
  }

  auto vocab_id = [&](const std::string& token) {
    auto it = vocab_ids.find(token);
    MT_USER_CHECK(it != vocab_ids.end(), "{}: merge refers to '{}', which is not in model.vocab", path.string(),
                  bounded_text(token));
    return it->second;
  };
  for (const nlohmann::json& merge : require(model, "merges", path)) {
    std::string left, right;
    if (merge.is_array()) {
      left = merge.at(0).get<std::string>();
      right = merge.at(1).get<std::string>();
    } else {
      std::string text = merge.get<std::string>();
      size_t space = text.find(' ', 1);
      MT_USER_CHECK(space != std::string::npos, "{}: merge '{}' is not `left right`", path.string(),
                    bounded_text(text));
      left = text.substr(0, space);
      right = text.substr(space + 1);
    }
    spec.merges.push_back({vocab_id(left), vocab_id(right), vocab_id(left + right)});
  }
  MT_USER_CHECK(!spec.merges.empty(), "{}: model.merges is empty", path.string());
  return spec;
}

}  // namespace

TokenizerSpec tokenizer_json_spec(const std::filesystem::path& path, const std::string& name) {
  const std::string bytes = read_file_bytes(path);
  const nlohmann::json json = parse_json(bytes, path.string());
  try {
    return spec_from_json(json, bytes, path, name);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong JSON type
    throw UserError(fmt::format("{}: unexpected structure: {}", path.string(), e.what()));
  }
}

}  // namespace meshtrain::tokenizer
