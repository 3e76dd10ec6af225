// process_runner.cpp — fork/exec with a merged output pipe and a wall-clock limit, for multi-host tests.
#include "runtime/process_runner.hpp"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sstream>

namespace meshtrain::testing {

ProcessResult run_meshtrain(const std::vector<std::string>& args, double timeout_s,
                            const std::function<void(const std::string&)>& on_line) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    ::dup2(pipe_fds[1], STDERR_FILENO);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    ::setpgid(0, 0);
    std::vector<char*> argv{const_cast<char*>(MESHTRAIN_BINARY)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(MESHTRAIN_BINARY, argv.data());
    std::_Exit(127);
  }
  ::close(pipe_fds[1]);
  ProcessResult result;
  std::string partial;
  char buffer[4096];
  bool timed_out = false;
  while (true) {
    pollfd fd{pipe_fds[0], POLLIN, 0};
    ::poll(&fd, 1, 100);
    if (fd.revents & (POLLIN | POLLHUP)) {
      ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
      if (n <= 0) break;
      result.output.append(buffer, n);
      partial.append(buffer, n);
      size_t newline;
      while ((newline = partial.find('\n')) != std::string::npos) {
        if (on_line) on_line(partial.substr(0, newline));
        partial.erase(0, newline + 1);
      }
    }
    if (std::chrono::duration<double>(Clock::now() - start).count() > timeout_s) {
      timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
  }
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exit_code = timed_out ? -2 : (WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

nlohmann::json json_line(const std::string& output) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line.front() == '{') return nlohmann::json::parse(line);
  ADD_FAILURE() << "no JSON object in: " << output;
  return {};
}

}  // namespace meshtrain::testing
