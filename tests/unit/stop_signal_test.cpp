// SIGINT/SIGTERM ask for a stop after the current step. The same request often arrives twice
// at once (a Ctrl-C or a scheduler signals the process group, and `tessera launch` forwards it
// too): a second signal within two seconds is that duplicate and must not kill the rank; one
// that comes later still does, so a stuck process can be killed. Each case runs in a child
// process, whose death is the thing observed.
#include "tessera/core/process/stop_signal.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

namespace tessera::core {
namespace stop_signal_test {

// Runs `body` in a forked child; returns its wait status.
template <class Body>
int in_child(Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    body();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(StopSignal, ASecondSignalAtOnceIsTheSameRequest) {
  const int status = in_child([] {
    install_stop_signal_handlers();
    std::raise(SIGINT);
    if (stop_signal_received() != SIGINT) ::_exit(3);
    std::raise(SIGTERM);  // the forwarded copy, or a second way the same stop came
    std::raise(SIGINT);
    ::_exit(stop_signal_received() == SIGINT ? 0 : 4);
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the duplicate signal killed the process (signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(StopSignal, ASignalLaterThanTwoSecondsStillKills) {
  const int status = in_child([] {
    install_stop_signal_handlers();
    std::raise(SIGTERM);
    ::usleep(2'200'000);
    std::raise(SIGTERM);
    ::_exit(5);  // not reached: the second request takes the default action
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "exited with " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

}  // namespace stop_signal_test
}  // namespace tessera::core
