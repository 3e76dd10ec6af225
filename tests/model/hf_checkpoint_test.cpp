// hf_checkpoint_test.cpp — safetensors and Hugging Face checkpoint directories: round trips (single file, sharded,
// bf16), the completion marker, and damaged or mismatched checkpoints refused with the file and the check named
// (overflowing shapes, marker and index file names outside the directory).
#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/host_memory.hpp"
#include "meshtrain/model/hf_checkpoint.hpp"
#include "meshtrain/model/safetensors.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace fs = std::filesystem;

namespace meshtrain::model {
using namespace meshtrain::checkpoint;
namespace {

LlamaConfig small_config() {
  LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  return c;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("meshtrain_ckpt_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The UserError message of `f`, or a test failure if it does not throw one.
  template <typename F>
  std::string user_error(F&& f) {
    try {
      f();
    } catch (const UserError& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a UserError";
    return "";
  }

  static void expect_same_parameters(LlamaForCausalLM& a, LlamaForCausalLM& b) {
    auto pb = b.named_parameters();
    for (const auto& p : a.named_parameters()) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  }

  fs::path dir_;
};

TEST_F(CheckpointTest, SafetensorsRoundTripKeepsDtypesShapesAndMetadata) {
  fs::create_directories(dir_);
  std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"a", torch::randn({3, 5})},
      {"b", torch::randn({7}).to(torch::kBFloat16)},
      {"c", torch::arange(6, torch::kInt64).view({2, 3}).t()},  // non-contiguous on purpose
      {"empty", torch::zeros({0, 4})}};
  AtomicFileWriter writer(dir_ / "t.safetensors");
  write_safetensors(writer, tensors, {{"format", "pt"}});
  writer.commit();
  EXPECT_FALSE(fs::exists(dir_ / "t.safetensors.tmp"));
  SafetensorsFile file = SafetensorsFile::open(dir_ / "t.safetensors");
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file_crc32c(dir_ / "t.safetensors").crc32c, writer.crc32c());
  EXPECT_EQ(file.file_size(), writer.bytes_written());
  for (const auto& [name, t] : tensors) {
    torch::Tensor back = read_tensor(file, name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(back, t)) << name;
  }
}

TEST_F(CheckpointTest, SafetensorsStreamedInPartsMatchesWhole) {
  fs::create_directories(dir_);
  const torch::Tensor a = torch::randn({4, 6}), b = torch::randn({5});
  std::vector<SafetensorsEntry> entries = {{"a", SafetensorsDtype::F32, {4, 6}}, {"b", SafetensorsDtype::F32, {5}}};
  AtomicFileWriter parts_out(dir_ / "parts.safetensors");
  {
    SafetensorsStreamWriter writer(parts_out, entries);
    const torch::Tensor a_flat = a.view({-1});
    writer.write_part(a_flat.narrow(0, 0, 7));
    writer.write_part(a_flat.narrow(0, 7, 17));
    try {
      writer.write_part(torch::zeros({6}));  // b has 5 elements
      ADD_FAILURE() << "a part longer than its tensor was written";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("does not fit its remaining 20 of 20 bytes"), std::string::npos) << e.what();
    }
    writer.write_next(b);
    writer.finish();
  }
  parts_out.commit();
  AtomicFileWriter whole_out(dir_ / "whole.safetensors");
  write_safetensors(whole_out, {{"a", a}, {"b", b}});
  whole_out.commit();
  EXPECT_EQ(parts_out.crc32c(), whole_out.crc32c());
  EXPECT_EQ(parts_out.bytes_written(), whole_out.bytes_written());
  EXPECT_TRUE(torch::equal(read_tensor(SafetensorsFile::open(dir_ / "parts.safetensors"), "a"), a));
}

TEST_F(CheckpointTest, SaveLoadRoundTripIsExactAndHasHfLayout) {
  LlamaForCausalLM saved(small_config()), loaded(small_config());
  initialize_parameters(saved, 1);
  save_hf_checkpoint(dir_, saved);
  EXPECT_TRUE(is_complete_checkpoint(dir_));
  EXPECT_TRUE(fs::exists(dir_ / "config.json"));
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors.index.json"));
  EXPECT_EQ(read_hf_config(dir_), saved.config());
  verify_checkpoint_files(dir_);
  load_hf_checkpoint(dir_, loaded);
  expect_same_parameters(saved, loaded);
}

TEST_F(CheckpointTest, LargeCheckpointsAreShardedWithAnIndex) {
  LlamaForCausalLM saved(small_config()), loaded(small_config());
  initialize_parameters(saved, 2);
  save_hf_checkpoint(dir_, saved, {torch::kFloat32, /*max_shard_bytes=*/4096});
  std::ifstream in(dir_ / "model.safetensors.index.json");
  nlohmann::json index = nlohmann::json::parse(in);
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  EXPECT_GT(shards.size(), 2u);
  EXPECT_TRUE(shards.count(fmt::format("model-00001-of-{:05d}.safetensors", shards.size())));
  EXPECT_EQ(index["weight_map"].size(), saved.named_parameters().size());
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors"));
  load_hf_checkpoint(dir_, loaded);
  expect_same_parameters(saved, loaded);
}

TEST_F(CheckpointTest, Bf16CheckpointsLoadIntoFp32Parameters) {
  LlamaForCausalLM saved(small_config()), loaded(small_config());
  initialize_parameters(saved, 3);
  save_hf_checkpoint(dir_, saved, {torch::kBFloat16});
  SafetensorsFile file = SafetensorsFile::open(dir_ / "model.safetensors");
  EXPECT_EQ(file.entry("lm_head.weight").dtype, SafetensorsDtype::BF16);
  load_hf_checkpoint(dir_, loaded);
  auto pl = loaded.named_parameters();
  for (const auto& p : saved.named_parameters()) {
    EXPECT_EQ(pl[p.key()].scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(pl[p.key()], p.value().to(torch::kBFloat16).to(torch::kFloat32))) << p.key();
  }
}

TEST_F(CheckpointTest, TruncatedWeightsAreRefusedNamingFileAndCheck) {
  LlamaForCausalLM model(small_config());
  save_hf_checkpoint(dir_, model);
  fs::resize_file(dir_ / "model.safetensors", fs::file_size(dir_ / "model.safetensors") - 10);
  // The marker's size catches it first; the reader's own structural check (a Hugging Face directory has no marker).
  std::string message = user_error([&] { load_hf_checkpoint(dir_, model); });
  EXPECT_NE(message.find("model.safetensors: size check failed"), std::string::npos) << message;
  message = user_error([&] { SafetensorsFile::open(dir_ / "model.safetensors"); });
  EXPECT_NE(message.find("model.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

TEST_F(CheckpointTest, FlippedByteFailsTheChecksum) {
  LlamaForCausalLM model(small_config());
  initialize_parameters(model, 5);
  save_hf_checkpoint(dir_, model);
  {
    // Every bit of the byte flipped (writing a fixed value failed now and then: the byte could already hold it).
    std::fstream f(dir_ / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    const char byte = static_cast<char>(f.get());
    f.seekp(-3, std::ios::end);
    f.put(static_cast<char>(~byte));
  }
  std::string message = user_error([&] { load_hf_checkpoint(dir_, model); });
  EXPECT_NE(message.find("model.safetensors: checksum check failed"), std::string::npos) << message;
  EXPECT_NE(user_error([&] { verify_checkpoint_files(dir_); }).find("checksum"), std::string::npos);
}

TEST_F(CheckpointTest, InterruptedSaveIsRefused) {
  LlamaForCausalLM model(small_config());
  save_hf_weights(dir_, model);  // no completion marker
  EXPECT_FALSE(is_complete_checkpoint(dir_));
  std::string message = user_error([&] { load_hf_checkpoint(dir_, model); });
  EXPECT_NE(message.find("incomplete checkpoint"), std::string::npos) << message;
}

TEST_F(CheckpointTest, GarbageHeaderIsRefused) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "bad.safetensors") << "not a safetensors file at all";
  std::string message = user_error([&] { SafetensorsFile::open(dir_ / "bad.safetensors"); });
  EXPECT_NE(message.find("bad.safetensors: header length"), std::string::npos) << message;
}

TEST_F(CheckpointTest, OverflowingShapeIsRefused) {
  // 2^62 x 4 floats is 2^66 bytes, 0 in 64 bits: it matched an empty data range and reached torch::empty.
  fs::create_directories(dir_);
  const std::string header = R"({"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})";
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  std::ofstream(dir_ / "big.safetensors", std::ios::binary) << bytes << header;
  std::string message = user_error([&] { SafetensorsFile::open(dir_ / "big.safetensors"); });
  EXPECT_NE(message.find("big.safetensors: tensor 'x': shape check failed: the sizes [4611686018427387904, 4] "
                         "overflow a 64-bit byte count"), std::string::npos) << message;
}

TEST_F(CheckpointTest, MarkerAndIndexNamesMustBePlainFileNames) {
  LlamaConfig config = small_config();
  LlamaForCausalLM model(config);
  HfSaveOptions options;
  options.max_shard_bytes = 1;  // sharded: with an index
  save_hf_checkpoint(dir_, model, options);
  // A marker entry outside the directory was read (and its size and checksum compared) before names were checked.
  std::ofstream(dir_ / kCompletionMarker) << R"({"files": [{"name": "../outside.json", "bytes": 2, "crc32c": 0}]})";
  std::string message = user_error([&] { verify_checkpoint_files(dir_); });
  EXPECT_NE(message.find(kCompletionMarker + std::string(": file name check failed: name \"../outside.json\" must "
                                                         "be a plain file name")), std::string::npos) << message;
  std::ofstream(dir_ / kCompletionMarker) << R"({"files": [{"name": "config.json", "bytes": "2", "crc32c": 0}]})";
  message = user_error([&] { verify_checkpoint_files(dir_); });  // was a nlohmann type_error
  EXPECT_NE(message.find("a file entry lacks a name, a byte count or a 32-bit crc32c"), std::string::npos) << message;

  fs::remove(dir_ / kCompletionMarker);
  std::ofstream(dir_ / "config.json") << config.to_hf_json("float32").dump();  // as from Hugging Face
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"weight_map": {"model.norm.weight": "/etc/passwd"}})";
  message = user_error([&] { load_hf_checkpoint(dir_, model); });
  EXPECT_NE(message.find("model.safetensors.index.json: file name check failed: weight_map file \"/etc/passwd\""),
            std::string::npos) << message;
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": {"model.norm.weight": 3}})";
  message = user_error([&] { load_hf_checkpoint(dir_, model); });  // was a nlohmann type_error
  EXPECT_NE(message.find("weight_map file 3 is not a file name"), std::string::npos) << message;
}

TEST_F(CheckpointTest, ArchitectureMismatchNamesTheKey) {
  LlamaForCausalLM model(small_config());
  save_hf_checkpoint(dir_, model);
  LlamaConfig other = small_config();
  other.num_key_value_heads = 4;
  LlamaForCausalLM different(other);
  std::string message = user_error([&] { load_hf_checkpoint(dir_, different); });
  EXPECT_NE(message.find("num_key_value_heads"), std::string::npos) << message;
}

// Issue 34: a config.json of a huge model beside tiny weight files allocated the whole model before the weights were
// compared with it; wrong types and out-of-range numbers were misreported.
TEST_F(CheckpointTest, AHugeConfigIsRefusedBeforeAnythingIsAllocated) {
  LlamaConfig config = small_config();
  LlamaForCausalLM model(config);
  initialize_parameters(model, 3);
  save_hf_checkpoint(dir_, model);
  fs::remove(dir_ / kCompletionMarker);  // as a Hugging Face download: config.json may be edited
  nlohmann::json huge = config.to_hf_json("float32");
  huge["hidden_size"] = 16384;
  huge["intermediate_size"] = 65536;
  huge["head_dim"] = 16384 / huge["num_attention_heads"].get<int64_t>();
  std::ofstream(dir_ / "config.json") << huge.dump();
  const int64_t resident_before = peak_resident_bytes();
  std::string message = user_error([&] { load_hf_model(dir_); });
  EXPECT_NE(message.find("has shape"), std::string::npos) << message;
  // The model it describes would take tens of GB; nothing close to that was touched.
  EXPECT_LT(peak_resident_bytes() - resident_before, int64_t{256} << 20);

  huge = config.to_hf_json("float32");
  huge["vocab_size"] = 1e30;
  std::ofstream(dir_ / "config.json") << huge.dump();
  message = user_error([&] { load_hf_model(dir_); });
  EXPECT_NE(message.find("config.json: key 'vocab_size' must be an integer, got 1e+30"), std::string::npos) << message;
  huge["vocab_size"] = int64_t{1} << 40;
  std::ofstream(dir_ / "config.json") << huge.dump();
  message = user_error([&] { load_hf_model(dir_); });
  EXPECT_NE(message.find("vocab_size is 1099511627776, more than the 4194304 meshtrain accepts"), std::string::npos)
      << message;
  huge["vocab_size"] = "many";
  std::ofstream(dir_ / "config.json") << huge.dump();
  message = user_error([&] { load_hf_model(dir_); });
  EXPECT_NE(message.find("config.json: key 'vocab_size' must be an integer, got \"many\""), std::string::npos)
      << message;

  std::ofstream(dir_ / "config.json") << config.to_hf_json("float32").dump();
  const std::unique_ptr<LlamaForCausalLM> loaded = load_hf_model(dir_);
  expect_same_parameters(model, *loaded);
}

TEST_F(CheckpointTest, HuggingFaceDirectoryWithoutMarkerLoads) {
  // What a Hugging Face download looks like: no marker, no meshtrain key, an extra rotary buffer, a tied model.
  LlamaConfig config = small_config();
  config.tie_word_embeddings = true;
  LlamaForCausalLM saved(config), loaded(config);
  initialize_parameters(saved, 4);
  fs::create_directories(dir_);
  std::ofstream(dir_ / "config.json") << config.to_hf_json("float32").dump();
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : saved.named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
  tensors.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", torch::ones({2}));
  AtomicFileWriter writer(dir_ / "model.safetensors");
  write_safetensors(writer, tensors);
  writer.commit();
  load_hf_checkpoint(dir_, loaded);
  expect_same_parameters(saved, loaded);
}

}  // namespace
}  // namespace meshtrain::model
