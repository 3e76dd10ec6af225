// checksum.cpp — CRC-32C with a hardware path (x86 SSE4.2) chosen at run time and a portable table path.
#include "meshtrain/common/checksum.hpp"

#include "meshtrain/common/error.hpp"

#include <array>
#include <cstring>
#include <fstream>
#include <vector>

namespace meshtrain {
namespace {

constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;

std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCastagnoliReflected : c >> 1;
    table[i] = c;
  }
  return table;
}

uint32_t crc32c_table(const uint8_t* p, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t previous) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t crc = ~previous;
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  crc = has_sse42 ? crc32c_sse42(p, size, crc) : crc32c_table(p, size, crc);
#else
  crc = crc32c_table(p, size, crc);
#endif
  return ~crc;
}

FileChecksum file_crc32c(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MT_USER_CHECK(in, "cannot open {}", path.string());
  std::vector<char> buffer(4 << 20);
  FileChecksum sum;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto got = static_cast<size_t>(in.gcount());
    sum.crc32c = crc32c(buffer.data(), got, sum.crc32c);
    sum.bytes += got;
  }
  MT_USER_CHECK(in.eof(), "reading {} failed", path.string());
  return sum;
}

}  // namespace meshtrain
