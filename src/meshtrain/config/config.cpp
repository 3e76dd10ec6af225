// config.cpp — loading, group selection, typed overrides with "did you mean" errors, typed getters.
#include "meshtrain/config/config.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/json_read.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace meshtrain::config {
namespace {

// What YAML input may hold (config files, saved configs, override values): meshtrain's own configs are a few KB and
// nest 3 levels.
constexpr size_t kMaxYamlBytes = 1 << 20;
constexpr size_t kMaxYamlValueBytes = 64 << 10;
constexpr size_t kMaxYamlKeyBytes = 256;
constexpr size_t kMaxDottedKeyBytes = 1024;  // a whole dotted key, as closest_keys compares them
constexpr int kMaxYamlDepth = 32;
constexpr size_t kMaxYamlNodes = 100000;

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream ss(key);
  std::string part;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  return parts;
}

// Walks `root` along the dotted key; returns an invalid node where a component is missing.
YAML::Node find(const YAML::Node& root, const std::string& key) {
  YAML::Node current = root;  // reset() rebinds the handle; nothing in the tree changes
  for (const std::string& part : split_key(key)) {
    if (!current.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    YAML::Node next = current[part];
    if (!next.IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
    current.reset(next);
  }
  return current;
}

void collect_leaves(const YAML::Node& node, const std::string& prefix, std::vector<std::string>& out) {
  if (node.IsMap() && node.size() > 0) {
    for (const auto& kv : node) {
      std::string k = kv.first.as<std::string>();
      collect_leaves(kv.second, prefix.empty() ? k : prefix + "." + k, out);
    }
  } else if (!prefix.empty()) {
    out.push_back(prefix);
  }
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string last_component(const std::string& key) {
  auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

enum class Kind { integer, floating, boolean, string, list, null, map };

Kind kind_of(const YAML::Node& node) {
  if (node.IsNull()) return Kind::null;
  if (node.IsSequence()) return Kind::list;
  if (node.IsMap()) return Kind::map;
  const std::string& s = node.Scalar();
  if (node.Tag() == "!") return Kind::string;  // quoted in the file
  int64_t i;
  double d;
  bool b;
  if (YAML::convert<int64_t>::decode(node, i)) return Kind::integer;
  if (YAML::convert<double>::decode(node, d)) return Kind::floating;
  if ((s == "true" || s == "false") && YAML::convert<bool>::decode(node, b)) return Kind::boolean;
  return Kind::string;
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::integer: return "an integer";
    case Kind::floating: return "a number";
    case Kind::boolean: return "a boolean (true or false)";
    case Kind::string: return "a string";
    case Kind::list: return "a list such as [1, 2]";
    case Kind::null: return "any value";
    case Kind::map: return "a group of keys";
  }
  return "?";
}

// Flow collections ([...], {...}) nested deeper than kMaxYamlDepth, found before yaml-cpp's recursive parser sees
// them. Brackets inside quotes and comments are skipped; a stray bracket in a plain scalar can only count too many.
void check_flow_depth(const std::string& text, const std::string& source) {
  int depth = 0;
  char quote = 0;
  bool comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (comment) {
      comment = c != '\n';
    } else if (quote) {
      if (c == '\\' && quote == '"') ++i;
      else if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\n')) {
      comment = true;
    } else if (c == '[' || c == '{') {
      MT_USER_CHECK(++depth <= kMaxYamlDepth, "{}: nested deeper than the limit of {} levels", source, kMaxYamlDepth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

// Walks the parsed tree without recursion: nesting, scalar sizes, and the nodes visited with every alias expanded
// (a few lines of anchors and aliases can stand for billions of nodes, which later copies would build).
void check_tree(const YAML::Node& root, const std::string& source) {
  std::vector<std::pair<YAML::Node, int>> pending{{root, 0}};
  size_t visited = 0;
  while (!pending.empty()) {
    auto [node, depth] = pending.back();
    pending.pop_back();
    MT_USER_CHECK(++visited <= kMaxYamlNodes,
                  "{}: more than {} values once its aliases are expanded (an alias bomb?)", source, kMaxYamlNodes);
    MT_USER_CHECK(depth <= kMaxYamlDepth, "{}: nested deeper than the limit of {} levels", source, kMaxYamlDepth);
    if (node.IsScalar()) {
      MT_USER_CHECK(node.Scalar().size() <= kMaxYamlValueBytes, "{}: a value of {} bytes ('{}'), more than the {} a "
                    "config value may have", source, node.Scalar().size(), bounded_text(node.Scalar(), 40),
                    kMaxYamlValueBytes);
    } else if (node.IsSequence()) {
      for (const auto& item : node) pending.emplace_back(item, depth + 1);
    } else if (node.IsMap()) {
      for (const auto& kv : node) {
        MT_USER_CHECK(!kv.first.IsScalar() || kv.first.Scalar().size() <= kMaxYamlKeyBytes,
                      "{}: a key of {} bytes ('{}'), more than the {} a config key may have", source,
                      kv.first.Scalar().size(), bounded_text(kv.first.Scalar(), 40), kMaxYamlKeyBytes);
        pending.emplace_back(kv.first, depth + 1);
        pending.emplace_back(kv.second, depth + 1);
      }
    }
  }
}

// Every YAML text meshtrain reads (files, saved configs, override values) goes through here.
YAML::Node parse_yaml(const std::string& text, const std::string& source) {
  MT_USER_CHECK(text.size() <= kMaxYamlBytes, "{}: {} bytes, more than the {} a config may have", source, text.size(),
                kMaxYamlBytes);
  check_flow_depth(text, source);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw UserError(fmt::format("{} is not valid YAML: {}", source, bounded_text(e.what())));
  }
  check_tree(root, source);
  return root;
}

YAML::Node load_file(const fs::path& path) {
  MT_USER_CHECK(fs::exists(path), "config file {} does not exist", path.string());
  std::error_code error;
  const uintmax_t bytes = fs::file_size(path, error);
  MT_USER_CHECK(!error, "config file {}: cannot read it: {}", path.string(), error.message());
  MT_USER_CHECK(bytes <= kMaxYamlBytes, "config file {}: {} bytes, more than the {} a config may have", path.string(),
                bytes, kMaxYamlBytes);
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  MT_USER_CHECK(!in.bad(), "config file {}: cannot read it", path.string());
  return parse_yaml(text, "config file " + path.string());
}

// The `defaults:` list of `file`: one `<group>: <name>` pair per entry.
std::vector<std::pair<std::string, std::string>> group_selections(const YAML::Node& defaults, const fs::path& file) {
  MT_USER_CHECK(defaults.IsSequence(), "config file {}: `defaults:` must be a list of `- <group>: <name>` entries",
                file.string());
  std::vector<std::pair<std::string, std::string>> groups;
  for (const auto& item : defaults) {
    MT_USER_CHECK(item.IsMap(), "config file {}: `defaults:` entry '{}' is not `<group>: <name>`", file.string(),
                  bounded_text(YAML::Dump(item), 60));
    for (const auto& kv : item) {
      MT_USER_CHECK(kv.first.IsScalar() && kv.second.IsScalar(),
                    "config file {}: `defaults:` entry '{}' is not `<group>: <name>` (both plain names)",
                    file.string(), bounded_text(YAML::Dump(item), 60));
      groups.emplace_back(kv.first.Scalar(), kv.second.Scalar());
    }
  }
  return groups;
}

std::vector<std::string> group_options(const fs::path& dir) {
  std::vector<std::string> names;
  if (!fs::is_directory(dir)) return names;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".yaml") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

}  // namespace

fs::path default_config_dir() {
  if (const char* env = std::getenv("MESHTRAIN_CONFIG_DIR"); env && *env) return env;
  return fs::path(MESHTRAIN_SOURCE_DIR) / "configs";
}

std::vector<std::string> closest_keys(const std::string& key, const std::vector<std::string>& known, size_t max) {
  std::vector<std::pair<size_t, std::string>> scored;
  // Edit distances cost length x length: no suggestion for a key no config could hold.
  if (key.size() > kMaxDottedKeyBytes) return {};
  const std::string tail = last_component(key);
  for (const std::string& k : known) {
    if (k.size() > kMaxDottedKeyBytes) continue;
    size_t full = edit_distance(key, k);
    size_t part = edit_distance(tail, last_component(k));
    size_t score = std::min(full, part + 1);
    size_t limit = std::max<size_t>(2, tail.size() / 3);
    if (score <= limit + 1) scored.emplace_back(score, k);
  }
  std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && out.size() < max; ++i) out.push_back(scored[i].second);
  return out;
}

Config Config::from_yaml(const std::string& text) {
  Config config;
  config.root_ = parse_yaml(text, "the config text");
  return config;
}

Config Config::load(const fs::path& config_dir, const std::vector<std::string>& overrides) {
  Config config;
  config.root_ = load_file(config_dir / "defaults.yaml");

  // Group selections: the `defaults:` list, then `<group>=<name>` overrides.
  std::vector<std::pair<std::string, std::string>> groups;
  if (YAML::Node defaults = config.root_["defaults"]) {
    groups = group_selections(defaults, config_dir / "defaults.yaml");
    config.root_.remove("defaults");
  }
  std::vector<std::pair<std::string, std::string>> key_overrides;
  for (const std::string& text : overrides) {
    auto eq = text.find('=');
    MT_USER_CHECK(eq != std::string::npos && eq > 0, "override '{}' is not of the form key=value (e.g. ici_mesh.fsdp=4)",
                  text);
    std::string key = text.substr(0, eq), value = text.substr(eq + 1);
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
    if (group != groups.end())
      group->second = value;
    else
      key_overrides.emplace_back(key, value);
  }
  for (const auto& [group, name] : groups) {
    fs::path file = config_dir / group / (name + ".yaml");
    if (!fs::exists(file)) {
      auto options = group_options(config_dir / group);
      throw UserError(fmt::format("{}={}: no such {} config; the options are: {}", group, name, group, join(options)));
    }
    YAML::Node content = load_file(file);
    content["name"] = name;
    config.root_[group] = content;
  }
  for (const auto& [key, value] : key_overrides) config.set_from_text(key, value);
  return config;
}

bool Config::has(const std::string& key) const { return find(root_, key).IsDefined(); }

YAML::Node Config::node(const std::string& key) const {
  YAML::Node n = find(root_, key);
  if (!n.IsDefined()) {
    auto near = closest_keys(key, leaf_keys());
    throw UserError(fmt::format("config key '{}' is not set{}", key,
                                near.empty() ? "" : fmt::format("; closest known keys: {}", join(near))));
  }
  return YAML::Clone(n);
}

int64_t Config::get_int(const std::string& key) const {
  YAML::Node n = node(key);
  int64_t v;
  MT_USER_CHECK(n.IsScalar() && YAML::convert<int64_t>::decode(n, v), "config key '{}' must be an integer, got '{}'",
                key, YAML::Dump(n));
  return v;
}

double Config::get_float(const std::string& key) const {
  YAML::Node n = node(key);
  double v;
  MT_USER_CHECK(n.IsScalar() && YAML::convert<double>::decode(n, v), "config key '{}' must be a number, got '{}'", key,
                YAML::Dump(n));
  return v;
}

bool Config::get_bool(const std::string& key) const {
  YAML::Node n = node(key);
  MT_USER_CHECK(n.IsScalar() && (n.Scalar() == "true" || n.Scalar() == "false"),
                "config key '{}' must be true or false, got '{}'", key, YAML::Dump(n));
  return n.Scalar() == "true";
}

std::string Config::get_string(const std::string& key) const {
  YAML::Node n = node(key);
  if (n.IsNull()) return "";
  MT_USER_CHECK(n.IsScalar(), "config key '{}' must be a single value, got '{}'", key, YAML::Dump(n));
  return n.Scalar();
}

std::vector<int64_t> Config::get_int_list(const std::string& key) const {
  YAML::Node n = node(key);
  MT_USER_CHECK(n.IsSequence(), "config key '{}' must be a list of integers such as [1, 2], got '{}'", key,
                YAML::Dump(n));
  std::vector<int64_t> out;
  for (const auto& item : n) {
    int64_t v;
    MT_USER_CHECK(YAML::convert<int64_t>::decode(item, v), "config key '{}' must be a list of integers, got '{}'", key,
                  YAML::Dump(n));
    out.push_back(v);
  }
  return out;
}

void Config::set_from_text(const std::string& key, const std::string& value_text) {
  YAML::Node current = find(root_, key);
  if (!current.IsDefined()) {
    auto near = closest_keys(key, leaf_keys());
    throw UserError(fmt::format("unknown config key '{}'{}", key,
                                near.empty() ? "" : fmt::format("; did you mean: {}?", join(near, " or "))));
  }
  YAML::Node value =
      parse_yaml(value_text, fmt::format("config key '{}': value '{}'", key, bounded_text(value_text, 60)));
  if (!value.IsDefined() || value_text.empty()) value = YAML::Node(YAML::NodeType::Null);
  const Kind expected = kind_of(current), got = kind_of(value);
  const bool ok = expected == Kind::null || got == expected || (expected == Kind::floating && got == Kind::integer) ||
                  (expected == Kind::string && got != Kind::list && got != Kind::map) ||
                  (got == Kind::null && expected != Kind::map);
  MT_USER_CHECK(ok, "config key '{}': value '{}' is not {} (the default is '{}')", key, bounded_text(value_text, 60),
                kind_name(expected), bounded_text(YAML::Dump(current), 60));
  if (expected == Kind::string && got != Kind::null) value = YAML::Node(value_text);
  // Assign through the parent so the tree (not a detached handle) changes.
  auto parts = split_key(key);
  YAML::Node parent = root_;
  for (size_t i = 0; i + 1 < parts.size(); ++i) parent.reset(parent[parts[i]]);
  parent[parts.back()] = value;
}

std::vector<std::string> Config::leaf_keys() const {
  std::vector<std::string> out;
  collect_leaves(root_, "", out);
  return out;
}

std::map<std::string, std::string> Config::leaf_values() const {
  std::map<std::string, std::string> out;
  for (const std::string& key : leaf_keys()) out[key] = YAML::Dump(find(root_, key));
  return out;
}

std::string Config::to_yaml() const {
  YAML::Emitter emitter;
  emitter << root_;
  return std::string(emitter.c_str()) + "\n";
}

}  // namespace meshtrain::config
