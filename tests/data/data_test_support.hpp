// data_test_support.hpp — test helpers for the data path: a synthetic token-shard directory whose token at stream
// position p is p + first_token (so a row names its own sample), and a config pointing at it.
#pragma once

#include "meshtrain/config/config.hpp"
#include "meshtrain/settings/settings.hpp"
#include "meshtrain/token_shards/shard_writer.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace meshtrain::testing {

// Writes shards of `shard_tokens` tokens each (documents of 37 tokens, the last one shorter) and index.json.
inline void write_counting_shards(const std::filesystem::path& dir, const std::vector<uint64_t>& shard_tokens,
                                  uint32_t token_bytes = 2, const std::string& fingerprint = "test:65536",
                                  uint32_t first_token = 0) {
  std::filesystem::create_directories(dir);
  token_shards::ShardIndex index;
  index.tokenizer = {"test", "byte", fingerprint, 65536, -1};
  index.token_bytes = token_bytes;
  uint32_t next = first_token;
  for (size_t s = 0; s < shard_tokens.size(); ++s) {
    const std::string file = "shard_0000" + std::to_string(s) + ".tok";
    token_shards::ShardWriter writer(dir / file, token_bytes, "test", fingerprint);
    for (uint64_t done = 0; done < shard_tokens[s];) {
      std::vector<uint32_t> document(std::min<uint64_t>(37, shard_tokens[s] - done));
      for (uint32_t& id : document) id = next++;
      writer.append_document(document.data(), document.size());
      done += document.size();
    }
    index.shards.push_back(writer.finish());
    index.total_tokens += index.shards.back().tokens;
    index.total_documents += index.shards.back().documents;
  }
  std::ofstream(dir / token_shards::kIndexFileName) << token_shards::index_to_json(index);
}

// The settings of the shipped defaults with `overrides` on top.
inline settings::Settings data_config(const std::filesystem::path& dataset, std::vector<std::string> overrides = {}) {
  overrides.insert(overrides.begin(), {"dataset.path=" + dataset.string(), "global_batch_size=8", "block_size=8"});
  return settings::Settings::from_config(config::Config::load(config::default_config_dir(), overrides));
}

}  // namespace meshtrain::testing
