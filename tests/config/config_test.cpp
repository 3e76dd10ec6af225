// config_test.cpp — loading with groups, typed overrides, and the errors for unknown keys and wrong types.
#include "meshtrain/common/error.hpp"
#include "meshtrain/config/config.hpp"

#include <gtest/gtest.h>

#include "scratch_dir.hpp"

#include <chrono>
#include <filesystem>
#include <fstream>

namespace meshtrain::config {
namespace {

namespace fs = std::filesystem;

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_ / "model");
    write("defaults.yaml",
          "defaults:\n  - model: small\nseed: 42\nlearning_rate: 0.001\nname: run\nflag: false\nsizes: [1, 2]\n"
          "ici_mesh:\n  data: 1\n  fsdp: -1\n");
    write("model/small.yaml", "hidden_size: 64\nnum_hidden_layers: 2\n");
    write("model/big.yaml", "hidden_size: 4096\nnum_hidden_layers: 32\n");
  }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }

  std::string error_of(const std::vector<std::string>& overrides) {
    try {
      Config::load(dir_, overrides);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }

  meshtrain::testing::ScratchDir scratch_{"meshtrain_config_test"};
  const fs::path& dir_ = scratch_.path();
};

TEST_F(ConfigTest, DefaultsAndGroups) {
  Config c = Config::load(dir_, {});
  EXPECT_EQ(c.get_int("seed"), 42);
  EXPECT_EQ(c.get_int("model.hidden_size"), 64);
  EXPECT_EQ(c.get_string("model.name"), "small");
  EXPECT_FALSE(c.has("defaults"));
  Config big = Config::load(dir_, {"model=big", "model.num_hidden_layers=4"});
  EXPECT_EQ(big.get_int("model.hidden_size"), 4096);
  EXPECT_EQ(big.get_int("model.num_hidden_layers"), 4);
}

TEST_F(ConfigTest, TypedOverrides) {
  Config c = Config::load(dir_, {"ici_mesh.fsdp=4", "learning_rate=3", "name=other", "flag=true", "sizes=[4, 5, 6]"});
  EXPECT_EQ(c.get_int("ici_mesh.fsdp"), 4);
  EXPECT_DOUBLE_EQ(c.get_float("learning_rate"), 3.0);
  EXPECT_EQ(c.get_string("name"), "other");
  EXPECT_TRUE(c.get_bool("flag"));
  EXPECT_EQ(c.get_int_list("sizes"), (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(Config::load(dir_, {"name=123"}).get_string("name"), "123");
}

TEST_F(ConfigTest, UnknownKeySuggestsTheClosest) {
  std::string msg = error_of({"ici_mesh.fdsp=4"});
  EXPECT_NE(msg.find("unknown config key 'ici_mesh.fdsp'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ici_mesh.fsdp"), std::string::npos) << msg;
  msg = error_of({"learning_rte=1"});
  EXPECT_NE(msg.find("learning_rate"), std::string::npos) << msg;
}

TEST_F(ConfigTest, WrongTypeNamesKeyValueAndType) {
  std::string msg = error_of({"ici_mesh.fsdp=four"});
  EXPECT_NE(msg.find("'ici_mesh.fsdp'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'four'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("an integer"), std::string::npos) << msg;
  EXPECT_NE(error_of({"flag=maybe"}).find("a boolean"), std::string::npos);
  EXPECT_NE(error_of({"seed=1.5"}).find("an integer"), std::string::npos);
  EXPECT_NE(error_of({"sizes=3"}).find("a list"), std::string::npos);
}

TEST_F(ConfigTest, BadGroupOptionListsTheOptions) {
  std::string msg = error_of({"model=huge"});
  EXPECT_NE(msg.find("model=huge"), std::string::npos) << msg;
  EXPECT_NE(msg.find("big, small"), std::string::npos) << msg;
  EXPECT_NE(error_of({"seed"}).find("key=value"), std::string::npos);
}

TEST_F(ConfigTest, YamlTextReloads) {
  Config c = Config::load(dir_, {"seed=7"});
  Config reloaded = Config::from_yaml(c.to_yaml());
  EXPECT_EQ(reloaded.get_int("seed"), 7);
  EXPECT_EQ(reloaded.get_int("model.hidden_size"), 64);
  EXPECT_EQ(reloaded.leaf_keys(), c.leaf_keys());
}

TEST_F(ConfigTest, LeafValuesAreEveryLeafAsYamlText) {
  Config c = Config::load(dir_, {"seed=7"});
  const std::map<std::string, std::string> values = c.leaf_values();
  EXPECT_EQ(values.size(), c.leaf_keys().size());
  EXPECT_EQ(values.at("seed"), "7");
  EXPECT_EQ(values.at("model.hidden_size"), "64");
}

// Each input crashed, hung or said `internal error` before the limits (issue 34): the error must name the file or
// key and the limit, and come at once.
TEST_F(ConfigTest, HostileYamlIsRefusedNamingTheFileAndTheLimit) {
  const auto refused = [&](const std::string& text) {
    write("model/hostile.yaml", text);
    const auto start = std::chrono::steady_clock::now();
    const std::string error = error_of({"model=hostile"});
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
    EXPECT_NE(error.find("hostile.yaml"), std::string::npos) << error;
    return error;
  };
  EXPECT_NE(refused(std::string(100000, '[') + std::string(100000, ']')).find("nested deeper than the limit of 32"),
            std::string::npos);
  std::string block;
  for (int i = 0; i < 40; ++i) block += std::string(2 * i, ' ') + "k" + std::to_string(i) + ":\n";
  EXPECT_NE(refused(block + std::string(80, ' ') + "x: 1\n").find("nested deeper"), std::string::npos);
  // The billion laughs: 9 levels of 10 aliases each.
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; ++i) {
    bomb += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int j = 0; j < 10; ++j) bomb += std::string(j ? ", " : "") + "*a" + std::to_string(i - 1);
    bomb += "]\n";
  }
  EXPECT_NE(refused(bomb).find("aliases are expanded"), std::string::npos);
  const std::string huge_value = refused("hidden_size: " + std::string(100000, '7') + "\n");
  EXPECT_NE(huge_value.find("more than the 65536"), std::string::npos) << huge_value;
  EXPECT_LT(huge_value.size(), 400u) << "the message quotes the value whole";
  // A 50,000-byte key: its "closest known keys" took minutes of edit distances.
  const std::string long_key = refused("? " + std::string(50000, 'k') + "\n: 1\n");  // an explicit key: any length
  EXPECT_NE(long_key.find("a key of 50000 bytes"), std::string::npos) << long_key.substr(0, 300);
  EXPECT_NE(error_of({std::string(50000, 'k') + "=1"}).find("unknown config key"), std::string::npos);

  write("defaults.yaml", "defaults:\n  - model: [small, big]\nseed: 42\n");
  const std::string defaults = error_of({});
  EXPECT_NE(defaults.find("`defaults:` entry"), std::string::npos) << defaults;
  EXPECT_NE(defaults.find("defaults.yaml"), std::string::npos) << defaults;
}

TEST_F(ConfigTest, AnOverrideValueIsBoundedToo) {
  const std::string error = error_of({"name=" + std::string(70000, 'x')});
  EXPECT_NE(error.find("config key 'name'"), std::string::npos) << error.substr(0, 300);
  EXPECT_LT(error.size(), 400u);
}

TEST(ShippedConfigTest, DefaultsLoadWithEveryModel) {
  const fs::path dir = default_config_dir();
  for (const auto& entry : fs::directory_iterator(dir / "model")) {
    std::string name = entry.path().stem().string();
    Config c = Config::load(dir, {"model=" + name});
    EXPECT_EQ(c.get_string("model.name"), name);
    EXPECT_GT(c.get_int("model.hidden_size"), 0) << name;
  }
}

}  // namespace
}  // namespace meshtrain::config
