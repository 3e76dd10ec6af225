// launcher.cpp — fork/exec of host processes, line-prefixed output relay, first-failure exit code.
#include "meshtrain/runtime/launcher.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/control/protocol.hpp"
#include "meshtrain/control/secret.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>

namespace meshtrain::runtime {
namespace {

struct HostProcess {
  int host = 0;
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;
  std::string out_partial, err_partial;
  bool exited = false;
  int exit_code = 0;
};

// Stop signals (SIGTERM, SIGINT) received: the first is passed on to every host as SIGTERM (they save and exit 0,
// runtime/preemption.hpp); a second kills them.
volatile sig_atomic_t g_stop_signals = 0;
void on_signal(int) { g_stop_signals = g_stop_signals + 1; }

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Moves the complete lines of `partial` (plus `chunk`) to `fd`, each prefixed; keeps the unfinished tail.
void relay_lines(std::string& partial, const char* chunk, size_t n, const std::string& prefix, int fd) {
  partial.append(chunk, n);
  std::string out;
  size_t start = 0, newline;
  while ((newline = partial.find('\n', start)) != std::string::npos) {
    out += prefix;
    out.append(partial, start, newline - start + 1);
    start = newline + 1;
  }
  partial.erase(0, start);
  if (!out.empty()) write_all(fd, out);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::vector<char*> to_argv(const std::string& executable, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(executable.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  return argv;
}

void set_identity_environment(const HostIdentity& id) {
  ::setenv("MESHTRAIN_HOST", std::to_string(id.host).c_str(), 1);
  ::setenv("MESHTRAIN_HOSTS", std::to_string(id.hosts).c_str(), 1);
  ::setenv("MESHTRAIN_DEVICES_PER_HOST", std::to_string(id.devices_per_host).c_str(), 1);
  ::setenv("MESHTRAIN_MASTER_ADDR", id.master_addr.c_str(), 1);
  ::setenv("MESHTRAIN_MASTER_PORT", std::to_string(id.master_port).c_str(), 1);
  if (!id.iface.empty()) ::setenv("MESHTRAIN_IFACE", id.iface.c_str(), 1);
  if (!id.job_secret.empty()) ::setenv("MESHTRAIN_JOB_SECRET", id.job_secret.c_str(), 1);
}

}  // namespace

std::string self_executable() {
  char path[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  MT_CHECK(n > 0, "cannot read /proc/self/exe");
  path[n] = '\0';
  return path;
}

void exec_as_host(const HostIdentity& identity, const std::string& executable,
                  const std::vector<std::string>& verb_args) {
  MT_USER_CHECK(!verb_args.empty(), "meshtrain run: give the verb to run after `--`, e.g. `-- commcheck`");
  set_identity_environment(identity);
  std::vector<char*> argv = to_argv(executable, verb_args);
  ::execv(executable.c_str(), argv.data());
  throw Error(fmt::format("cannot start {}: {}", executable, std::strerror(errno)));
}

int launch_local(const LocalLaunch& launch) {
  MT_USER_CHECK(launch.hosts >= 1, "--hosts must be at least 1, got {}", launch.hosts);
  MT_USER_CHECK(launch.devices_per_host >= 1, "--devices-per-host must be at least 1, got {}", launch.devices_per_host);
  MT_USER_CHECK(!launch.verb_args.empty(), "meshtrain run: give the verb to run after `--`, e.g. `-- commcheck`");
  HostIdentity identity;
  identity.hosts = launch.hosts;
  identity.devices_per_host = launch.devices_per_host;
  identity.master_addr = "127.0.0.1";
  identity.master_port = launch.master_port > 0 ? launch.master_port : find_free_port();
  identity.iface = launch.iface;
  identity.job_secret = control::make_secret();  // fresh for this job's hosts; they get it in their environment

  std::vector<HostProcess> hosts(launch.hosts);
  const pid_t launcher = ::getpid();
  for (int h = 0; h < launch.hosts; ++h) {
    int out_pipe[2], err_pipe[2];
    MT_CHECK(::pipe(out_pipe) == 0 && ::pipe(err_pipe) == 0, "pipe() failed: {}", std::strerror(errno));
    pid_t pid = ::fork();
    MT_CHECK(pid >= 0, "fork() failed: {}", std::strerror(errno));
    if (pid == 0) {
      ::dup2(out_pipe[1], STDOUT_FILENO);
      ::dup2(err_pipe[1], STDERR_FILENO);
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
      ::setpgid(0, 0);  // its own process group, so a kill reaches what it starts
      // A launcher that dies without stopping its hosts (SIGKILL) takes them with it: each gets SIGTERM, which a
      // training host takes as a preemption (it saves and stops). Kept across exec; the launcher may have died
      // before this line, and then the host stops at once.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) std::_Exit(128 + SIGTERM);
      identity.host = h;
      set_identity_environment(identity);
      std::vector<char*> argv = to_argv(launch.executable, launch.verb_args);
      ::execv(launch.executable.c_str(), argv.data());
      std::fprintf(stderr, "cannot start %s: %s\n", launch.executable.c_str(), std::strerror(errno));
      std::_Exit(127);
    }
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    hosts[h].host = h;
    hosts[h].pid = pid;
    hosts[h].out_fd = out_pipe[0];
    hosts[h].err_fd = err_pipe[0];
  }

  struct sigaction action {};
  action.sa_handler = on_signal;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);

  using Clock = std::chrono::steady_clock;
  int first_failure = 0;
  Clock::time_point failure_time;
  bool killed = false;
  bool passed_on = false;  // the first stop signal, to the hosts
  char buffer[65536];
  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::pair<HostProcess*, bool>> owners;  // (host, is_stderr)
    for (HostProcess& p : hosts) {
      if (p.out_fd >= 0) fds.push_back({p.out_fd, POLLIN, 0}), owners.emplace_back(&p, false);
      if (p.err_fd >= 0) fds.push_back({p.err_fd, POLLIN, 0}), owners.emplace_back(&p, true);
    }
    bool all_exited = true;
    for (HostProcess& p : hosts) all_exited &= p.exited;
    if (fds.empty() && all_exited) break;

    if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
    else ::usleep(50 * 1000);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      HostProcess& p = *owners[i].first;
      const bool is_err = owners[i].second;
      ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      const std::string prefix = fmt::format("[host {}] ", p.host);
      std::string& partial = is_err ? p.err_partial : p.out_partial;
      if (n > 0) {
        relay_lines(partial, buffer, static_cast<size_t>(n), prefix, is_err ? STDERR_FILENO : STDOUT_FILENO);
      } else {
        if (!partial.empty()) relay_lines(partial, "\n", 1, prefix, is_err ? STDERR_FILENO : STDOUT_FILENO);
        ::close(fds[i].fd);
        (is_err ? p.err_fd : p.out_fd) = -1;
      }
    }
    for (HostProcess& p : hosts) {
      if (p.exited) continue;
      int status = 0;
      if (::waitpid(p.pid, &status, WNOHANG) == p.pid) {
        p.exited = true;
        p.exit_code = exit_code_of(status);
        if (p.exit_code != 0) {
          write_all(STDERR_FILENO, fmt::format("[meshtrain run] host {} exited with code {}\n", p.host, p.exit_code));
          if (first_failure == 0) {
            first_failure = p.exit_code;
            failure_time = Clock::now();
          }
        }
      }
    }
    const bool grace_over = first_failure != 0 && Clock::now() - failure_time > control::to_ms(launch.kill_grace_s);
    if (g_stop_signals >= 1 && !passed_on) {
      passed_on = true;
      write_all(STDERR_FILENO, "[meshtrain run] stop signal: every host saves a checkpoint after its current step and "
                               "exits (a second signal kills them now)\n");
      for (HostProcess& p : hosts)
        if (!p.exited) ::kill(-p.pid, SIGTERM);
    }
    if (!killed && (g_stop_signals >= 2 || grace_over)) {
      killed = true;
      for (HostProcess& p : hosts)
        if (!p.exited) {
          write_all(STDERR_FILENO, fmt::format("[meshtrain run] stopping host {}\n", p.host));
          ::kill(-p.pid, SIGKILL);
        }
      if (first_failure == 0) first_failure = 130;
    }
  }
  return first_failure;
}

}  // namespace meshtrain::runtime
