// A Python reference script serving a test's requests (tools/interop/serve.py SCRIPT: one JSON
// list of arguments per line in, one JSON reply {"rc", "out"} per line out), so that the test
// imports torch and transformers once rather than once per request: each import costs seconds,
// and the interop tests ask for several models, losses and trainings each.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace tessera::testing {

// Whether `python` has these modules, asked without importing them (importing transformers, peft
// or datasets costs seconds).
inline bool python_has(const std::string& python, const std::vector<std::string>& modules) {
  std::string list;
  for (const auto& m : modules) list += "'" + m + "',";
  const std::string command = python + " -c \"import importlib.util, sys; sys.exit(0 if all(importlib.util.find_spec(m) "
                                       "for m in (" + list + ")) else 1)\" >/dev/null 2>&1";
  return std::system(command.c_str()) == 0;
}

class ReferenceProcess {
 public:
  // Starts `python serve.py script` (`serve` the path of tools/interop/serve.py), its stderr
  // appended to `stderr_file`.
  ReferenceProcess(const std::string& python, const std::string& serve, const std::string& script,
                   const std::string& stderr_file) {
    ::signal(SIGPIPE, SIG_IGN);  // a process that died answers a write with EPIPE, not a signal
    int to_child[2], from_child[2];
    if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) return;
    const std::vector<std::string> argv_strings{python, serve, script};
    std::vector<char*> argv;
    for (const auto& a : argv_strings) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {  // only async-signal-safe calls until exec
      ::dup2(to_child[0], 0);
      ::dup2(from_child[1], 1);
      const int err = ::open(stderr_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (err >= 0) ::dup2(err, 2);
      ::close(to_child[1]);
      ::close(from_child[0]);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    to_ = to_child[1];
    from_ = ::fdopen(from_child[0], "r");
  }

  ~ReferenceProcess() {
    if (to_ >= 0) ::close(to_);  // end of input: the script returns
    if (from_) std::fclose(from_);
    if (pid_ > 0) {
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }

  ReferenceProcess(const ReferenceProcess&) = delete;
  ReferenceProcess& operator=(const ReferenceProcess&) = delete;

  // Runs one command, `args` separated by spaces (no argument holds one); its exit status and
  // what it printed, or -1 and why where the process is gone.
  int run(const std::string& args, std::string& out) {
    if (pid_ <= 0 || to_ < 0 || !from_) {
      out = "the reference process did not start";
      return -1;
    }
    nlohmann::json request = nlohmann::json::array();
    std::istringstream words(args);
    for (std::string w; words >> w;) request.push_back(w);
    const std::string line = request.dump() + "\n";
    for (std::size_t written = 0; written < line.size();) {
      const ssize_t n = ::write(to_, line.data() + written, line.size() - written);
      if (n <= 0) {
        out = "the reference process is gone (it stopped reading)";
        return -1;
      }
      written += static_cast<std::size_t>(n);
    }
    std::string reply;
    char buffer[4096];
    while (std::fgets(buffer, sizeof buffer, from_)) {
      reply += buffer;
      if (reply == "\n") reply.clear();  // not a reply
      if (!reply.empty() && reply.back() == '\n') break;
    }
    const nlohmann::json parsed = nlohmann::json::parse(reply, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object()) {
      out = "the reference process ended without a reply: " + reply;
      return -1;
    }
    out = parsed.value("out", "");
    return parsed.value("rc", -1);
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  std::FILE* from_ = nullptr;
};

}  // namespace tessera::testing
