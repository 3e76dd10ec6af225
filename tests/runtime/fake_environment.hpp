// fake_environment.hpp — test helper: an EnvLookup over a fixed set of variables, in place of the process environment.
#pragma once

#include "meshtrain/runtime/host_identity.hpp"

#include <map>
#include <optional>
#include <string>

namespace meshtrain::runtime {

inline EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace meshtrain::runtime
