// visualize.cpp — drawing the sharding picture: tiles over the first two dimensions, replicas together, colours.
#include "meshtrain/sharding/visualize.hpp"

#include "meshtrain/common/log.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>

namespace meshtrain::sharding {
namespace {

// Matplotlib's tab20, the colour map JAX's picture uses.
constexpr std::array<std::array<int, 3>, 20> kTileColors = {{
    {31, 119, 180}, {174, 199, 232}, {255, 127, 14}, {255, 187, 120}, {44, 160, 44},  {152, 223, 138}, {214, 39, 40},
    {255, 152, 150}, {148, 103, 189}, {197, 176, 213}, {140, 86, 75},  {196, 156, 148}, {227, 119, 194}, {247, 182, 210},
    {127, 127, 127}, {199, 199, 199}, {188, 189, 34},  {219, 219, 141}, {23, 190, 207},  {158, 218, 229},
}};

// Background colour of tile `index`, with black or white text by luminance.
std::string color_on(int index) {
  const auto& rgb = kTileColors[index % kTileColors.size()];
  const double luminance = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2];
  const int text = luminance > 140 ? 0 : 255;
  return fmt::format("\x1b[48;2;{};{};{}m\x1b[38;2;{};{};{}m", rgb[0], rgb[1], rgb[2], text, text, text);
}
constexpr const char* kColorOff = "\x1b[0m";

std::string device_label(const mesh::Mesh& mesh, int device) {
  const mesh::DeviceInfo& info = mesh.device(device);
  std::string out = fmt::format("device {} (host {}", device, info.host);
  for (mesh::Axis axis : mesh::kAllAxes)
    if (mesh.size(axis) > 1) out += fmt::format(", {}={}", mesh::axis_name(axis), info.coords[static_cast<int>(axis)]);
  return out + ")";
}

std::string repeat(const std::string& piece, size_t times) {
  std::string out;
  for (size_t i = 0; i < times; ++i) out += piece;
  return out;
}

std::string centered(const std::string& text, size_t width) {
  const size_t left = (width - text.size()) / 2;
  return std::string(left, ' ') + text + std::string(width - text.size() - left, ' ');
}

// One tile: the text lines and the colour index of its first shard.
struct Tile {
  std::vector<std::string> lines;
  int color = 0;
};

}  // namespace

std::string render_sharding(const mesh::Mesh& mesh, const std::string& name, c10::ScalarType dtype,
                            const Shape& shape, const PartitionSpec& spec, const PictureOptions& options) {
  check_spec(mesh, shape, spec);
  const int rank = static_cast<int>(shape.size());
  static const std::vector<mesh::Axis> kNoAxes;
  const std::vector<mesh::Axis>& row_axes = rank >= 1 ? spec.dims[0] : kNoAxes;
  const std::vector<mesh::Axis>& col_axes = rank >= 2 ? spec.dims[1] : kNoAxes;
  const int rows = mesh.size_along(row_axes), cols = mesh.size_along(col_axes);

  // Devices grouped by tile, then by the shard they hold (ordered by its offset); shards numbered for colours.
  std::vector<std::map<Shape, std::vector<int>>> shards_by_tile(static_cast<size_t>(rows) * cols);
  for (const mesh::DeviceInfo& info : mesh.devices()) {
    const int tile = mesh.index_along(info.device, row_axes) * cols + mesh.index_along(info.device, col_axes);
    shards_by_tile[tile][shard_bounds(mesh, shape, spec, info.device).offset].push_back(info.device);
  }
  std::vector<Tile> tiles(shards_by_tile.size());
  int shard_number = 0;
  for (size_t t = 0; t < tiles.size(); ++t) {
    tiles[t].color = shard_number;
    for (const auto& [offset, devices] : shards_by_tile[t]) {
      tiles[t].lines.push_back(bounds_string(shard_bounds(mesh, shape, spec, devices.front())));
      for (int device : devices) tiles[t].lines.push_back(device_label(mesh, device));
      ++shard_number;
    }
  }
  size_t width = 0, height = 0;
  for (const Tile& tile : tiles) {
    height = std::max(height, tile.lines.size());
    for (const std::string& line : tile.lines) width = std::max(width, line.size());
  }
  width += 2;  // a space either side

  std::string out = fmt::format("{} {} on mesh {} ({} host{} x {} device{} per host)\n", name,
                                type_string(dtype, shape, spec), mesh.shape().equation(), mesh.hosts(),
                                mesh.hosts() == 1 ? "" : "s", mesh.devices_per_host(),
                                mesh.devices_per_host() == 1 ? "" : "s");
  const std::string bar = repeat("─", width);
  auto border = [&](const char* left, const char* middle, const char* right) {
    std::string line = left;
    for (int c = 0; c < cols; ++c) line += bar + (c + 1 < cols ? middle : right);
    return line + "\n";
  };
  out += border("┌", "┬", "┐");
  for (int r = 0; r < rows; ++r) {
    for (size_t l = 0; l < height; ++l) {
      std::string line = "│";
      for (int c = 0; c < cols; ++c) {
        const Tile& tile = tiles[static_cast<size_t>(r) * cols + c];
        const std::string text = centered(l < tile.lines.size() ? tile.lines[l] : "", width);
        line += options.color ? color_on(tile.color) + text + kColorOff : text;
        line += "│";
      }
      out += line + "\n";
    }
    out += r + 1 < rows ? border("├", "┼", "┤") : border("└", "┴", "┘");
  }

  std::vector<mesh::Axis> replica_axes;
  for (mesh::Axis axis : spec.replica_axes())
    if (mesh.size(axis) > 1) replica_axes.push_back(axis);
  if (!spec.partial.empty())
    out += fmt::format("Devices listed under one range hold addends of a pending sum over {}{}.\n",
                       mesh::axes_label(spec.partial),
                       !replica_axes.empty()
                           ? fmt::format(", and replicas along {}", mesh::axes_label(replica_axes))
                           : std::string());
  else if (!replica_axes.empty())
    out += fmt::format("Devices listed under one range hold the same shard (replicas along {}).\n",
                       mesh::axes_label(replica_axes));
  return out;
}

std::string render_sharding(const GlobalTensor& tensor, const std::string& name, const PictureOptions& options) {
  return render_sharding(tensor.mesh(), name, tensor.dtype(), tensor.global_shape(), tensor.spec(), options);
}

std::string render_input_batch(const mesh::Mesh& mesh, int64_t global_batch_size, int64_t block_size,
                               const PictureOptions& options, const PartitionSpec& spec) {
  return render_sharding(mesh, "input_ids", c10::ScalarType::Int, {global_batch_size, block_size}, spec, options);
}

bool wants_color(int fd) { return isatty(fd) && std::getenv("NO_COLOR") == nullptr; }

void print_sharding(const runtime::DeviceContext& ctx, const GlobalTensor& tensor, const std::string& name,
                    PrintScope scope) {
  const bool prints = scope == PrintScope::once_per_job ? ctx.device() == 0 : ctx.info().local == 0;
  if (prints) log::block(render_sharding(tensor, name, PictureOptions{wants_color(STDERR_FILENO)}));
}

}  // namespace meshtrain::sharding
