// `tessera launch --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P]
//  -- COMMAND ARGS...`: starts N ranks of this binary on this node with torchrun's variables,
// prefixes every line they print with their rank (their stdout to its stdout, their stderr to its
// stderr, so a rank's result lines can be read apart from its log), forwards SIGINT/SIGTERM, and when one rank
// fails stops the others (SIGTERM, then SIGKILL after a grace period) and exits non-zero.
// A rank gets SIGTERM when the launcher dies (killed, or its output closed), so none outlives it.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/dll/runtime_symbol_info.hpp>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <iostream>

#include "commands.hpp"
#include "tessera/error.hpp"

namespace po = boost::program_options;

namespace tessera::cli {
namespace {

std::atomic<int> g_forward_signal{0};
extern "C" void remember_signal(int sig) { g_forward_signal.store(sig); }

// One of a rank's output streams: the read end of its pipe and the launcher's stream it goes to.
struct Output {
  int fd = -1;
  std::ostream* sink = nullptr;
  std::string pending;  // a line not yet finished
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  std::array<Output, 2> outputs;  // the rank's stdout, then its stderr
  bool running = true;
  int exit_code = 0;
};

// For a single-node run that names no port: a socket listening on a port the OS picks. Rank 0's
// store takes the socket over (TESSERA_STORE_LISTEN_FD), so the port stays held from the moment
// it is chosen: no other process can take it before the store serves it, as with a port that was
// only found free and then closed. Sets `port`; throws when the OS gives no socket.
int listening_socket(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error(std::string("launch: socket failed: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);  // where c10d's store listens when it binds itself
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, SOMAXCONN) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw Error("launch: could not open a listening socket for the store: " + why);
  }
  port = ntohs(addr.sin_port);
  return fd;
}

void flush_lines(int rank, Output& o, bool all) {
  size_t start = 0;
  for (size_t nl; (nl = o.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    *o.sink << "[rank " << rank << "] " << o.pending.substr(start, nl - start) << "\n";
  }
  o.pending.erase(0, start);
  if (all && !o.pending.empty()) {
    *o.sink << "[rank " << rank << "] " << o.pending << "\n";
    o.pending.clear();
  }
  o.sink->flush();
}

}  // namespace

int launch_command(const Args& all_args) {
  // Everything after "--" is the command each rank runs.
  auto dash = std::find(all_args.begin(), all_args.end(), "--");
  const Args args(all_args.begin(), dash);
  const Args command(dash == all_args.end() ? dash : dash + 1, all_args.end());

  int nproc = 1, nnodes = 1, node_rank = 0, master_port = 0;
  std::string master_addr = "127.0.0.1";
  double grace_s = 5;
  po::options_description visible(
      "usage: tessera launch --nproc-per-node N [options] -- COMMAND [ARGS...]\n"
      "e.g.   tessera launch --nproc-per-node 2 -- train configs/quickstart.yaml\n\noptions");
  visible.add_options()
      ("nproc-per-node", po::value<int>(&nproc), "ranks to start on this node")
      ("nnodes", po::value<int>(&nnodes), "nodes in the run (default 1)")
      ("node-rank", po::value<int>(&node_rank), "this node's index (default 0)")
      ("master-addr", po::value<std::string>(&master_addr), "address of rank 0 (default 127.0.0.1)")
      ("master-port", po::value<int>(&master_port), "port of rank 0's store (default: a free port; required with --nnodes > 1)")
      ("grace-s", po::value<double>(&grace_s), "seconds between SIGTERM and SIGKILL when stopping ranks (default 5)")
      ("help,h", "show this help");
  if (!parse_command_line(args, visible, po::options_description{}, po::positional_options_description{})) return 0;
  if (command.empty()) throw UsageError("expected -- COMMAND, e.g. -- train CONFIG");
  if (nproc < 1 || nnodes < 1 || node_rank < 0 || node_rank >= nnodes) {
    throw UsageError("need --nproc-per-node >= 1, --nnodes >= 1 and 0 <= --node-rank < --nnodes");
  }
  if (master_port < 0 || master_port > 65535) {
    throw UsageError("--master-port " + std::to_string(master_port) + " is not a port (1 to 65535)");
  }
  if (!std::isfinite(grace_s) || grace_s < 0 || grace_s > 3600) {
    throw UsageError("--grace-s must be between 0 and 3600 seconds");
  }
  int store_fd = -1;  // the store's listening socket, handed to rank 0; -1 when a port was given
  if (master_port == 0) {
    if (nnodes > 1) throw UsageError("--master-port is required with --nnodes > 1");
    store_fd = listening_socket(master_port);
  }
  const std::string self = boost::dll::program_location().string();
  const int world = nproc * nnodes;

  // A signal that comes while the ranks are being started waits (blocked) until every rank runs,
  // then is forwarded like any other; the ranks unblock it before they exec.
  sigset_t stop_signals, previous_mask;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &stop_signals, &previous_mask);
  std::signal(SIGINT, remember_signal);
  std::signal(SIGTERM, remember_signal);
  const pid_t launcher = ::getpid();

  std::vector<Rank> ranks(static_cast<size_t>(nproc));
  // Ranks already started when starting another fails are killed, not left waiting for it.
  auto abandon_started = [&](const std::string& what) {
    const int error = errno;
    for (auto& started : ranks) {
      if (started.pid <= 0) continue;
      ::kill(started.pid, SIGKILL);
      ::waitpid(started.pid, nullptr, 0);
      for (auto& o : started.outputs) {
        if (o.fd >= 0) ::close(o.fd);
      }
    }
    throw Error("launch: " + what + " failed: " + std::strerror(error));
  };
  for (int local = 0; local < nproc; ++local) {
    Rank& r = ranks[static_cast<size_t>(local)];
    r.rank = node_rank * nproc + local;
    int out_fds[2], err_fds[2];
    // Close-on-exec: a rank must not hold the other ranks' pipes (dup2 below clears it on 1 and 2).
    if (::pipe2(out_fds, O_CLOEXEC) != 0) abandon_started("pipe");
    if (::pipe2(err_fds, O_CLOEXEC) != 0) {
      const int error = errno;
      ::close(out_fds[0]);
      ::close(out_fds[1]);
      errno = error;
      abandon_started("pipe");
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int error = errno;
      for (int fd : {out_fds[0], out_fds[1], err_fds[0], err_fds[1]}) ::close(fd);
      errno = error;
      abandon_started("fork");
    }
    r.pid = pid;
    if (r.pid == 0) {
      // SIGTERM when the launcher dies; and it may have died before this line.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(128 + SIGTERM);
      std::signal(SIGINT, SIG_DFL);
      std::signal(SIGTERM, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &previous_mask, nullptr);
      ::dup2(out_fds[1], STDOUT_FILENO);
      ::dup2(err_fds[1], STDERR_FILENO);
      ::setenv("RANK", std::to_string(r.rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(master_port).c_str(), 1);
      if (store_fd >= 0 && r.rank == 0) {
        ::setenv("TESSERA_STORE_LISTEN_FD", std::to_string(store_fd).c_str(), 1);
      } else if (store_fd >= 0) {
        ::close(store_fd);
      }
      ::setenv("TESSERA_LAUNCHER", "1", 1);  // the launcher prefixes lines; ranks need not
      std::vector<char*> argv{const_cast<char*>(self.c_str())};
      for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(self.c_str(), argv.data());
      std::perror("launch: exec");
      ::_exit(127);
    }
    ::close(out_fds[1]);
    ::close(err_fds[1]);
    r.outputs[0] = Output{out_fds[0], &std::cout, {}};
    r.outputs[1] = Output{err_fds[0], &std::cerr, {}};
  }
  if (store_fd >= 0) ::close(store_fd);  // rank 0 holds it now
  ::sigprocmask(SIG_SETMASK, &previous_mask, nullptr);

  int first_failure = 0;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  auto signal_all = [&](int sig) {
    for (auto& r : ranks) {
      if (r.running) ::kill(r.pid, sig);
    }
  };

  size_t open_pipes = 2 * ranks.size();
  while (open_pipes > 0 || std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.running; })) {
    if (int sig = g_forward_signal.exchange(0)) {
      std::cerr << "launch: forwarding signal " << sig << " to every rank\n";
      signal_all(sig);
    }
    std::vector<pollfd> fds;
    std::vector<std::pair<int, Output*>> polled;  // the rank and output of each entry of fds
    for (auto& r : ranks) {
      for (auto& o : r.outputs) {
        if (o.fd < 0) continue;
        fds.push_back({o.fd, POLLIN, 0});
        polled.emplace_back(r.rank, &o);
      }
    }
    if (fds.empty()) {
      ::usleep(100 * 1000);
    } else if (::poll(fds.data(), fds.size(), 100) > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        Output& o = *polled[i].second;
        char buffer[4096];
        const ssize_t n = ::read(o.fd, buffer, sizeof buffer);
        if (n > 0) {
          o.pending.append(buffer, static_cast<size_t>(n));
          flush_lines(polled[i].first, o, false);
        } else if (n == 0 || errno != EINTR) {
          flush_lines(polled[i].first, o, true);
          ::close(o.fd);
          o.fd = -1;
          --open_pipes;
        }
      }
    }
    for (auto& r : ranks) {
      int status = 0;
      if (!r.running || ::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (r.exit_code != 0 && first_failure == 0 && !stopping) {
        first_failure = r.exit_code;
        std::cerr << "launch: rank " << r.rank << " exited with " << r.exit_code << "; stopping the other ranks\n";
        stopping = true;
        signal_all(SIGTERM);
        stop_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<long>(grace_s * 1000));
      }
    }
    if (stopping && std::chrono::steady_clock::now() > stop_deadline) {
      signal_all(SIGKILL);
      stop_deadline = std::chrono::steady_clock::time_point::max();
    }
  }
  return first_failure;
}

}  // namespace tessera::cli
