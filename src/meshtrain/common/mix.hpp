// mix.hpp — SplitMix64's finalizer: a strong 64-bit mix, for counter-based randomness (the sampler's Feistel rounds,
// the parameter initializer). splitmix64(k + i * golden) for i = 0, 1, ... is the SplitMix64 sequence from k.
#pragma once

#include <cstdint>

namespace meshtrain {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace meshtrain
