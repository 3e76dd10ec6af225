// mutation_driver.cpp — main() for the fuzz targets when they are not built with clang's libFuzzer: runs every seed
// of the corpus, then mutated seeds for a bounded time, and stops at the first finding.
//
//   fuzz_<reader> [-max_total_time=S] [-seed=N] <corpus dir or input file>...
//
// The time bound is -max_total_time, else $MESHTRAIN_FUZZ_SECONDS, else 10 s; the seed is -seed, else
// $MESHTRAIN_FUZZ_SEED, else 1, and is printed at start: the same seed replays the same inputs in the same order.
// Given files rather than folders, the driver runs just those (to replay a finding). A finding is an exception other
// than the target's accepted ones escaping LLVMFuzzerTestOneInput, a crash, a sanitizer report, an input that runs
// longer than 20 s or grows the process past 2 GiB: its input is written to $MESHTRAIN_FUZZ_FINDINGS (default: the
// current folder) and the path printed; the exit status is then non-zero.
//
// Mutations (no coverage feedback): bit flips, bytes set to interesting values, truncation, insertion and deletion,
// chunk duplication, splicing two seeds, 8-byte fields overwritten with huge integers, and decimal numbers in text
// replaced by huge or negative ones.
#include "fuzz_target.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<uint8_t>;

constexpr unsigned kInputTimeoutSeconds = 20;
constexpr long kMaxRssKib = 2L << 20;  // 2 GiB

// The input being run and where it goes if it crashes the process; read by the signal handlers.
const Bytes* g_current = nullptr;
std::string g_crash_path;

void write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n <= 0) return;
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void write_text(int fd, const char* text) { write_all(fd, text, std::strlen(text)); }

// Async-signal-safe: saves the current input and names it, once.
void save_current_input(const char* why) {
  static volatile sig_atomic_t saved = 0;
  if (saved || !g_current) return;
  saved = 1;
  int fd = ::open(g_crash_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    write_all(fd, g_current->data(), g_current->size());
    ::close(fd);
  }
  write_text(2, "\nfuzz: FINDING (");
  write_text(2, why);
  write_text(2, "): input written to ");
  write_text(2, g_crash_path.c_str());
  write_text(2, "\n");
}

void on_fatal_signal(int signal_number) {
  save_current_input(signal_number == SIGALRM ? "the input ran too long" : "fatal signal");
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number == SIGALRM ? SIGABRT : signal_number);
}

// Called by the sanitizers before they end the process after a report (a weak symbol: absent without them).
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));
void on_sanitizer_death() { save_current_input("sanitizer report"); }

void install_crash_handlers() {
  // The handlers run on a stack of their own: a stack overflow (deep recursion on a nested input) leaves no room on
  // the thread's stack to save the input that caused it.
  static std::vector<char> signal_stack(1 << 16);
  stack_t alternate{};
  alternate.ss_sp = signal_stack.data();
  alternate.ss_size = signal_stack.size();
  ::sigaltstack(&alternate, nullptr);
  for (int s : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGALRM}) {
    struct sigaction action {};
    action.sa_handler = on_fatal_signal;
    action.sa_flags = SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    ::sigaction(s, &action, nullptr);
  }
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(on_sanitizer_death);
}

Bytes read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

long max_rss_kib() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

// Runs one input; returns an empty string, or what went wrong (the process may also end in a crash handler).
std::string run_one(const Bytes& input) {
  g_current = &input;
  ::alarm(kInputTimeoutSeconds);
  std::string failure;
  try {
    LLVMFuzzerTestOneInput(input.data(), input.size());
  } catch (const std::exception& e) {
    failure = std::string("uncaught exception: ") + e.what();
  } catch (...) {
    failure = "uncaught exception of an unknown type";
  }
  ::alarm(0);
  if (failure.empty() && max_rss_kib() > kMaxRssKib)
    failure = "the process grew to " + std::to_string(max_rss_kib() >> 10) + " MiB";
  return failure;
}

class Mutator {
 public:
  Mutator(uint64_t seed, const std::vector<Bytes>& seeds) : random_(seed), seeds_(seeds) {}

  Bytes next() {
    Bytes data = seeds_[below(seeds_.size())];
    const size_t mutations = 1 + below(4);
    for (size_t i = 0; i < mutations; ++i) mutate(data);
    return data;
  }

 private:
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(random_() % n); }

  void mutate(Bytes& data) {
    static const uint8_t kInterestingBytes[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '0', '9', '-', '"', '\\', '{',
                                                '}',  '[',  ']',  ',',  ':',  ' ', '\n', '.', 'e', '/'};
    static const uint64_t kHugeIntegers[] = {~0ull, 1ull << 63, (1ull << 63) - 1, 0xffffffffull, 1ull << 32,
                                             1ull << 31, 1ull << 56, 0x7fffffffull, 0xfffffffffffff000ull};
    static const char* const kNumberTexts[] = {"18446744073709551615", "18446744073709551616", "9223372036854775807",
                                               "4294967295", "4294967296", "2147483648", "-1", "-9223372036854775808",
                                               "1e308", "-0", "0", "99999999999999999999999999", "1.5"};
    const size_t n = data.size();
    switch (below(n == 0 ? 1 : 10)) {
      case 0:  // insert 1-8 random bytes (the only mutation of an empty input)
        data.insert(data.begin() + below(n + 1), 1 + below(8), uint8_t(random_()));
        break;
      case 1:
        data[below(n)] ^= uint8_t(1u << below(8));
        break;
      case 2:
        data[below(n)] = kInterestingBytes[below(sizeof(kInterestingBytes))];
        break;
      case 3:
        data.resize(below(n));
        break;
      case 4: {  // delete a chunk
        size_t at = below(n), count = 1 + below(std::min<size_t>(n - at, 64));
        data.erase(data.begin() + at, data.begin() + at + count);
        break;
      }
      case 5: {  // duplicate a chunk somewhere
        size_t at = below(n), count = 1 + below(std::min<size_t>(n - at, 256));
        Bytes chunk(data.begin() + at, data.begin() + at + count);
        data.insert(data.begin() + below(n + 1), chunk.begin(), chunk.end());
        break;
      }
      case 6: {  // splice: a prefix of this input, a suffix of another seed
        const Bytes& other = seeds_[below(seeds_.size())];
        size_t keep = below(n + 1), from = below(other.size() + 1);
        data.resize(keep);
        data.insert(data.end(), other.begin() + from, other.end());
        break;
      }
      case 7: {  // an 8-byte (or shorter, at the end) field set to a huge integer
        uint64_t value = kHugeIntegers[below(sizeof(kHugeIntegers) / sizeof(kHugeIntegers[0]))];
        size_t at = below(n);
        std::memcpy(data.data() + at, &value, std::min<size_t>(8, n - at));
        break;
      }
      case 8:
      case 9: {  // a decimal number in text replaced by a huge, negative or fractional one
        size_t at = below(n);
        while (at < n && !(data[at] >= '0' && data[at] <= '9')) ++at;
        size_t end = at;
        while (end < n && data[end] >= '0' && data[end] <= '9') ++end;
        const char* text = kNumberTexts[below(sizeof(kNumberTexts) / sizeof(kNumberTexts[0]))];
        data.erase(data.begin() + std::min(at, n), data.begin() + end);
        data.insert(data.begin() + std::min(at, n), text, text + std::strlen(text));
        break;
      }
    }
  }

  std::mt19937_64 random_;
  const std::vector<Bytes>& seeds_;
};

uint64_t flag_or_env(const std::vector<std::string>& args, const std::string& flag, const char* env,
                     uint64_t fallback) {
  for (const std::string& arg : args)
    if (arg.rfind(flag, 0) == 0) return std::strtoull(arg.c_str() + flag.size(), nullptr, 10);
  const char* value = std::getenv(env);
  return value && *value ? std::strtoull(value, nullptr, 10) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string name = fs::path(argv[0]).filename().string();
  std::vector<std::string> args(argv + 1, argv + argc);
  const uint64_t seconds = flag_or_env(args, "-max_total_time=", "MESHTRAIN_FUZZ_SECONDS", 10);
  const uint64_t seed = flag_or_env(args, "-seed=", "MESHTRAIN_FUZZ_SEED", 1);
  const char* findings_env = std::getenv("MESHTRAIN_FUZZ_FINDINGS");
  const fs::path findings = findings_env && *findings_env ? fs::path(findings_env) : fs::current_path();

  std::vector<Bytes> seeds;
  bool replay_files = false;
  for (const std::string& arg : args) {
    if (arg.rfind("-", 0) == 0) continue;
    if (fs::is_directory(arg)) {
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(arg))
        if (entry.is_regular_file()) files.push_back(entry.path());
      std::sort(files.begin(), files.end());
      for (const fs::path& file : files) seeds.push_back(read_bytes(file));
    } else if (fs::is_regular_file(arg)) {
      seeds.push_back(read_bytes(arg));
      replay_files = true;
    } else {
      std::fprintf(stderr, "%s: %s is neither a corpus folder nor an input file\n", name.c_str(), arg.c_str());
      return 2;
    }
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "usage: %s [-max_total_time=S] [-seed=N] <corpus dir or input file>... (no seeds found)\n",
                 name.c_str());
    return 2;
  }
  std::printf("%s: seed %llu, %zu seed inputs, %llu s (replay with -seed=%llu)\n", name.c_str(),
              static_cast<unsigned long long>(seed), seeds.size(), static_cast<unsigned long long>(seconds),
              static_cast<unsigned long long>(seed));
  std::fflush(stdout);

  fs::create_directories(findings);
  g_crash_path = (findings / (name + "-crash-seed" + std::to_string(seed))).string();
  install_crash_handlers();

  auto report = [&](const Bytes& input, uint64_t execution, const std::string& failure) {
    const fs::path path = findings / (name + "-finding-seed" + std::to_string(seed) + "-" + std::to_string(execution));
    meshtrain::fuzz::write_input(path, input.data(), input.size());
    std::fprintf(stderr, "%s: FINDING at execution %llu: %s\ninput written to %s\n", name.c_str(),
                 static_cast<unsigned long long>(execution), failure.c_str(), path.string().c_str());
    return 1;
  };

  uint64_t executions = 0;
  for (const Bytes& input : seeds) {
    if (std::string failure = run_one(input); !failure.empty()) return report(input, executions, failure);
    ++executions;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(seconds);
  if (!replay_files) {
    Mutator mutator(seed, seeds);
    while (std::chrono::steady_clock::now() < deadline) {
      Bytes input = mutator.next();
      if (std::string failure = run_one(input); !failure.empty()) return report(input, executions, failure);
      ++executions;
    }
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %llu executions (%zu seeds) in %.1f s, %.0f/s, no findings\n", name.c_str(),
              static_cast<unsigned long long>(executions), seeds.size(), elapsed,
              elapsed > 0 ? (executions - seeds.size()) / elapsed : 0.0);
  return 0;
}
