// preemption.cpp — the signal handlers and the per-step agreement.
#include "meshtrain/runtime/preemption.hpp"

#include "meshtrain/runtime/comm.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

namespace meshtrain::runtime {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the flag is written from a signal handler");

void on_stop_signal(int signal_number) {
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, signal_number)) {
    static const char kMessage[] =
        "meshtrain: stop signal received; every host finishes its step, saves a checkpoint and exits "
        "(a second signal ends this host at once)\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    return;
  }
  static const char kNow[] = "meshtrain: second stop signal; ending this host now\n";
  (void)!::write(STDERR_FILENO, kNow, sizeof kNow - 1);
  ::_exit(128 + signal_number);
}

}  // namespace

void install_preemption_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGINT, &action, nullptr);
}

int preemption_signal() { return g_signal.load(); }

bool agree_on_preemption(Comm& world) {
  at::Tensor asked = at::tensor({preemption_signal() != 0 ? 1.0 : 0.0}, at::kDouble);
  world.allreduce_sum(asked);
  return asked.item<double>() > 0;
}

}  // namespace meshtrain::runtime
