// bf16_path.hpp — sets the process's bf16 matmul path (model/compute_matmul.hpp) for a test's scope, so that a test
// runs both paths on any CPU.
#pragma once

#include "meshtrain/model/compute_matmul.hpp"

namespace meshtrain::testing {

class Bf16PathScope {
 public:
  explicit Bf16PathScope(model::Bf16Matmul path) : previous_(model::bf16_matmul()) { model::set_bf16_matmul(path); }
  ~Bf16PathScope() { model::set_bf16_matmul(previous_); }
  Bf16PathScope(const Bf16PathScope&) = delete;
  Bf16PathScope& operator=(const Bf16PathScope&) = delete;

 private:
  model::Bf16Matmul previous_;
};

}  // namespace meshtrain::testing
