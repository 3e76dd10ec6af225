// spec.cpp — partition specs: parsing, validation, shard bounds, host-local layouts and type strings.
#include "meshtrain/sharding/spec.hpp"

#include "meshtrain/common/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>

namespace meshtrain::sharding {
namespace {

std::string trim(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

bool wrapped_in(const std::string& text, char open, char close) {
  return text.size() >= 2 && text.front() == open && text.back() == close;
}

// Splits at the commas outside any brackets.
std::vector<std::string> split_top_level(const std::string& text) {
  std::vector<std::string> parts;
  std::string current;
  int depth = 0;
  for (char c : text) {
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(trim(current));
      current.clear();
    } else {
      current += c;
    }
  }
  parts.push_back(trim(current));
  return parts;
}

bool is_none(const std::string& entry) {
  return entry == "None" || entry == "none" || entry == "null" || entry == "~" || entry == "()" || entry == "[]";
}

mesh::Axis parse_axis(const std::string& name, const std::string& whole) {
  std::optional<mesh::Axis> axis = mesh::axis_from_name(name);
  MT_USER_CHECK(axis.has_value(), "partition spec \"{}\": unknown mesh axis \"{}\" (expected data, fsdp, tensor, "
                "expert or context, or None)", whole, name);
  return *axis;
}

std::string axes_text(const std::vector<mesh::Axis>& axes) { return axes.empty() ? "None" : mesh::axes_label(axes); }

}  // namespace

PartitionSpec PartitionSpec::replicated(int rank) {
  PartitionSpec spec;
  spec.dims.resize(rank);
  return spec;
}

PartitionSpec PartitionSpec::sharded_rows(int rank, const std::vector<mesh::Axis>& axes) {
  MT_CHECK(rank >= 1, "a spec sharding rows needs a tensor of rank 1 or more, got rank {}", rank);
  PartitionSpec spec = replicated(rank);
  spec.dims[0] = axes;
  return spec;
}

PartitionSpec PartitionSpec::parse(const std::string& text) {
  std::string body = trim(text);
  // An outer "[...]" around the whole list (torchprime's YAML form) is not itself a dimension.
  if (wrapped_in(body, '[', ']') && split_top_level(body).size() == 1) body = trim(body.substr(1, body.size() - 2));
  PartitionSpec spec;
  if (body.empty()) return spec;  // a scalar
  for (const std::string& entry : split_top_level(body)) {
    MT_USER_CHECK(!entry.empty(), "partition spec \"{}\": an empty entry (write None for a dimension that is not "
                  "sharded)", text);
    std::vector<mesh::Axis> axes;
    if (wrapped_in(entry, '(', ')') || wrapped_in(entry, '[', ']')) {
      const std::string inner = trim(entry.substr(1, entry.size() - 2));
      if (!inner.empty())
        for (const std::string& name : split_top_level(inner)) axes.push_back(parse_axis(name, text));
    } else if (!is_none(entry)) {
      axes.push_back(parse_axis(entry, text));
    }
    spec.dims.push_back(axes);
  }
  return spec;
}

std::vector<mesh::Axis> PartitionSpec::used_axes() const {
  std::vector<mesh::Axis> used;
  for (const auto& axes : dims) used.insert(used.end(), axes.begin(), axes.end());
  used.insert(used.end(), partial.begin(), partial.end());
  return used;
}

std::vector<mesh::Axis> PartitionSpec::replica_axes() const {
  const std::vector<mesh::Axis> used = used_axes();
  std::vector<mesh::Axis> rest;
  for (mesh::Axis axis : mesh::kAllAxes)
    if (std::find(used.begin(), used.end(), axis) == used.end()) rest.push_back(axis);
  return rest;
}

std::string PartitionSpec::to_string() const {
  std::string out = "[";
  for (size_t d = 0; d < dims.size(); ++d) out += (d ? ", " : "") + axes_text(dims[d]);
  out += "]";
  if (!partial.empty()) out += " partial over " + mesh::axes_label(partial);
  return out;
}

void check_spec(const mesh::Mesh& mesh, const Shape& shape, const PartitionSpec& spec) {
  MT_USER_CHECK(spec.rank() == static_cast<int>(shape.size()),
                "partition spec {} has {} entries but the tensor {} has {} dimensions (one entry per dimension)",
                spec.to_string(), spec.rank(), shape_text(shape), shape.size());
  std::set<mesh::Axis> seen;
  for (mesh::Axis axis : spec.used_axes())
    MT_USER_CHECK(seen.insert(axis).second, "partition spec {} uses mesh axis {} more than once", spec.to_string(),
                  mesh::axis_name(axis));
  for (size_t d = 0; d < shape.size(); ++d) {
    MT_USER_CHECK(shape[d] >= 0, "tensor shape {}: dimension {} has a negative size {}", shape_text(shape), d,
                  shape[d]);
    const int ways = mesh.size_along(spec.dims[d]);
    MT_USER_CHECK(shape[d] % ways == 0,
                  "cannot shard dimension {} of size {} over {}: {} = {} does not divide {} (tensor {}, spec {})", d,
                  shape[d], mesh::axes_label(spec.dims[d]), mesh::axes_label(spec.dims[d]), ways, shape[d],
                  shape_text(shape), spec.to_string());
  }
}

ShardBounds shard_bounds(const mesh::Mesh& mesh, const Shape& shape, const PartitionSpec& spec, int device) {
  ShardBounds bounds;
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t block = shape[d] / mesh.size_along(spec.dims[d]);
    bounds.offset.push_back(mesh.index_along(device, spec.dims[d]) * block);
    bounds.shape.push_back(block);
  }
  return bounds;
}

std::string range_string(int64_t offset, int64_t size) { return fmt::format("{}:{}", offset, offset + size); }

std::string ranges_string(const std::vector<mesh::TokenRange>& ranges) {
  std::string out;
  for (const mesh::TokenRange& range : ranges)
    out += (out.empty() ? "" : ", ") + range_string(range.begin, range.size());
  return out;
}

std::string bounds_string(const ShardBounds& bounds) {
  std::string out = "[";
  for (size_t d = 0; d < bounds.shape.size(); ++d)
    out += (d ? ", " : "") + range_string(bounds.offset[d], bounds.shape[d]);
  return out + "]";
}

Shape HostLocalLayout::shape() const {
  Shape out;
  for (size_t d = 0; d < block_shape.size(); ++d)
    out.push_back(static_cast<int64_t>(block_indices[d].size()) * block_shape[d]);
  return out;
}

std::vector<int64_t> HostLocalLayout::global_indices(int dim) const {
  std::vector<int64_t> indices;
  for (int64_t block : block_indices.at(dim))
    for (int64_t i = 0; i < block_shape[dim]; ++i) indices.push_back(block * block_shape[dim] + i);
  return indices;
}

Shape HostLocalLayout::local_offset(const ShardBounds& bounds) const {
  Shape offset;
  for (size_t d = 0; d < block_shape.size(); ++d) {
    const int64_t block = block_shape[d] == 0 ? 0 : bounds.offset[d] / block_shape[d];
    const auto& blocks = block_indices[d];
    const auto at = std::lower_bound(blocks.begin(), blocks.end(), block);
    MT_CHECK(at != blocks.end() && *at == block, "shard {} is not held by this host (dimension {})",
             bounds_string(bounds), d);
    offset.push_back((at - blocks.begin()) * block_shape[d]);
  }
  return offset;
}

HostLocalLayout host_local_layout(const mesh::Mesh& mesh, const Shape& shape, const PartitionSpec& spec, int host) {
  check_spec(mesh, shape, spec);
  MT_CHECK(host >= 0 && host < mesh.hosts(), "host {} is out of range [0, {})", host, mesh.hosts());
  HostLocalLayout layout;
  std::vector<std::set<int64_t>> blocks(shape.size());
  for (int device : mesh.devices_of_host(host)) {
    const ShardBounds bounds = shard_bounds(mesh, shape, spec, device);
    layout.block_shape = bounds.shape;
    for (size_t d = 0; d < shape.size(); ++d)
      blocks[d].insert(bounds.shape[d] == 0 ? 0 : bounds.offset[d] / bounds.shape[d]);
  }
  for (const auto& dim_blocks : blocks) layout.block_indices.emplace_back(dim_blocks.begin(), dim_blocks.end());
  return layout;
}

std::string dtype_short_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float: return "f32";
    case c10::ScalarType::Double: return "f64";
    case c10::ScalarType::Half: return "f16";
    case c10::ScalarType::BFloat16: return "bf16";
    case c10::ScalarType::Long: return "i64";
    case c10::ScalarType::Int: return "i32";
    case c10::ScalarType::Short: return "i16";
    case c10::ScalarType::Char: return "i8";
    case c10::ScalarType::Byte: return "u8";
    case c10::ScalarType::Bool: return "bool";
    default: return c10::toString(dtype);
  }
}

std::string type_string(c10::ScalarType dtype, const Shape& shape, const PartitionSpec& spec) {
  MT_CHECK(spec.rank() == static_cast<int>(shape.size()), "spec {} does not match shape {}", spec.to_string(),
           shape_text(shape));
  std::string out = dtype_short_name(dtype) + "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    out += fmt::format("{}{}", d ? ", " : "", shape[d]);
    if (!spec.dims[d].empty()) out += "@" + mesh::axes_label(spec.dims[d]);
  }
  out += "]";
  if (!spec.partial.empty()) out += " partial over " + mesh::axes_label(spec.partial);
  return out;
}

Shape parse_shape(const std::string& text) {
  std::string body = trim(text);
  if (wrapped_in(body, '[', ']') || wrapped_in(body, '(', ')')) body = trim(body.substr(1, body.size() - 2));
  Shape shape;
  if (body.empty()) return shape;
  for (const std::string& entry : split_top_level(body)) {
    size_t used = 0;
    long long size = -1;
    try {
      size = std::stoll(entry, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MT_USER_CHECK(used == entry.size() && !entry.empty() && size >= 0,
                  "tensor shape \"{}\": \"{}\" is not a size (expected non-negative integers, e.g. 8,4096)", text, entry);
    shape.push_back(size);
  }
  return shape;
}

}  // namespace meshtrain::sharding
