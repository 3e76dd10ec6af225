// regex.cpp — PCRE2 compilation with JIT, and match iteration with one JIT stack and match block per thread.
#include "meshtrain/tokenizer/regex.hpp"

#include "meshtrain/common/error.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace meshtrain::tokenizer {

struct RegexPattern::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
};

namespace {

// Per-thread matching state: long whitespace runs backtrack deeply through `\s+(?!\S)`, so the JIT stack may grow
// well beyond PCRE2's 32 KiB default.
struct MatchState {
  pcre2_jit_stack* jit_stack = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_match_data* data = nullptr;
  MatchState() {
    jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
    data = pcre2_match_data_create(1, nullptr);
  }
  ~MatchState() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  }
};

MatchState& thread_match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

RegexPattern::RegexPattern(const std::string& pattern) : pattern_(pattern), compiled_(std::make_unique<Compiled>()) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                  &error_code, &error_offset, nullptr);
  if (!compiled_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    throw UserError(fmt::format("pre-tokenizer regex does not compile at offset {}: {} (pattern: {})", error_offset,
                                reinterpret_cast<const char*>(message), pattern));
  }
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

RegexPattern::~RegexPattern() { pcre2_code_free(compiled_->code); }

std::pair<size_t, size_t> RegexPattern::find(std::string_view text, size_t start) const {
  MatchState& state = thread_match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc =
      compiled_->jit
          ? pcre2_jit_match(compiled_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, state.data, state.context)
          : pcre2_match(compiled_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, state.data, state.context);
  if (rc == PCRE2_ERROR_NOMATCH) return {std::string_view::npos, std::string_view::npos};
  MT_CHECK(rc >= 0, "PCRE2 match failed with code {} (pattern: {})", rc, pattern_);
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
  return {ovector[0], ovector[1]};
}

std::string regex_quote(std::string_view literal) {
  std::string quoted;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos) quoted += '\\';
    quoted += c;
  }
  return quoted;
}

}  // namespace meshtrain::tokenizer
