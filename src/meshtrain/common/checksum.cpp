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
#define MT_SSE42 __attribute__((target("sse4.2")))

// The CRC register (no pre- or post-inversion) through n bytes, one crc32 instruction per 8 bytes: one dependency
// chain, so about 8 bytes per 3 cycles (the instruction's latency).
MT_SSE42 uint64_t crc32c_serial(const uint8_t* p, size_t n, uint64_t c) {
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}

// Three streams at once: a piece of 3 * kStreamBytes is three blocks whose registers advance side by side (the
// instruction's throughput is one per cycle), then are joined: the register is linear in its start and the data,
// so crc(A B) = advance(crc(A), |B| zero bytes) ^ crc_from_zero(B). `advance` over kStreamBytes zero bytes is a fixed
// 32 x 32 matrix over GF(2), applied a byte of the register at a time from four tables of 256 columns sums.
constexpr size_t kStreamBytes = 4096;

struct AdvanceTables {
  uint32_t by_byte[4][256];
};

MT_SSE42 AdvanceTables make_advance_tables() {
  static const uint8_t zeros[kStreamBytes] = {};
  uint32_t column[32];  // the register after kStreamBytes zero bytes from the single bit j
  for (int j = 0; j < 32; ++j) column[j] = static_cast<uint32_t>(crc32c_serial(zeros, kStreamBytes, 1ull << j));
  AdvanceTables tables;
  for (int k = 0; k < 4; ++k)
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t sum = 0;
      for (int bit = 0; bit < 8; ++bit)
        if (b & (1u << bit)) sum ^= column[8 * k + bit];
      tables.by_byte[k][b] = sum;
    }
  return tables;
}

uint32_t advance(const AdvanceTables& t, uint32_t c) {
  return t.by_byte[0][c & 0xff] ^ t.by_byte[1][(c >> 8) & 0xff] ^ t.by_byte[2][(c >> 16) & 0xff] ^
         t.by_byte[3][c >> 24];
}

MT_SSE42 uint32_t crc32c_sse42(const uint8_t* p, size_t n, uint32_t crc) {
  static const AdvanceTables tables = make_advance_tables();
  uint64_t c = crc;
  for (; n >= 3 * kStreamBytes; p += 3 * kStreamBytes, n -= 3 * kStreamBytes) {
    uint64_t a = c, b = 0, d = 0;
    for (size_t i = 0; i < kStreamBytes; i += 8) {
      uint64_t wa, wb, wd;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, p + kStreamBytes + i, 8);
      std::memcpy(&wd, p + 2 * kStreamBytes + i, 8);
      a = __builtin_ia32_crc32di(a, wa);
      b = __builtin_ia32_crc32di(b, wb);
      d = __builtin_ia32_crc32di(d, wd);
    }
    const uint32_t ab = advance(tables, static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b);
    c = advance(tables, ab) ^ static_cast<uint32_t>(d);
  }
  return static_cast<uint32_t>(crc32c_serial(p, n, c));
}
#undef MT_SSE42
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
