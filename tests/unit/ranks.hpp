// What the data-parallel test cases share: a reducer that is exact across ranks, and running a
// test case of this program as the ranks of a job.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "test_trials.hpp"  // LibTorch before doctest: Debian's brings glog, whose CHECK must not win

#include <doctest/doctest.h>

namespace test {

/// Mean squared error over records, reduced across ranks by its (sum, count) parts: the value one
/// process computes over the whole set, however the records are split.
struct SquaredError {
  double sum = 0, count = 0;
  void update(const torch::Tensor& squared_errors) {
    sum += squared_errors.sum().item<double>();
    count += static_cast<double>(squared_errors.numel());
  }
  void reset() { sum = count = 0; }
  std::vector<double> per_slot_reduce() const { return {sum, count}; }
  double cross_slot_reduce(const std::vector<std::vector<double>>& parts) const {
    double s = 0, c = 0;
    for (const auto& p : parts) {
      s += p[0];
      c += p[1];
    }
    return s / c;
  }
};

/// Runs `test_case` of this program as the `n` ranks of a job (RANK/WORLD_SIZE on 127.0.0.1, a port
/// of its own), with DETTRIAL_CHILD_DIR=`dir` and `extra_env` in their environment (a variable of
/// its replaces the one given here: LOCAL_RANK=0, say) and rank r's output in `dir`/rank<r>.log;
/// requires that every rank ends with status 0 within 150 s.
inline void run_ranks(const std::string& test_case, int n, const std::filesystem::path& dir,
                      const std::vector<std::string>& extra_env = {}) {
  // A port the kernel says is free now: a fixed range would meet the ephemeral ports (32768 and
  // up) that other tests' connections hold.
  const std::string port = std::to_string(dettrial::detail::free_local_port());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < n; ++rank) {
    std::vector<std::string> env = {
        "RANK=" + std::to_string(rank),          "WORLD_SIZE=" + std::to_string(n), "LOCAL_RANK=" + std::to_string(rank),
        "LOCAL_WORLD_SIZE=" + std::to_string(n), "MASTER_ADDR=127.0.0.1",           "MASTER_PORT=" + port,
        "DETTRIAL_CHILD_DIR=" + dir.string()};
    const auto name_of = [](const std::string& assignment) { return assignment.substr(0, assignment.find('=')); };
    std::erase_if(env, [&](const std::string& given) {
      return std::any_of(extra_env.begin(), extra_env.end(), [&](const std::string& extra) { return name_of(extra) == name_of(given); });
    });
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    pids.push_back(spawn_self(test_case, env, (dir / ("rank" + std::to_string(rank) + ".log")).string()));
  }
  for (int rank = 0; rank < n; ++rank) {
    bool in_time = false;
    const int status = wait_for(pids[static_cast<std::size_t>(rank)], std::chrono::seconds(150), in_time);
    CAPTURE(rank);
    CAPTURE(read_text(dir / ("rank" + std::to_string(rank) + ".log")));
    REQUIRE(in_time);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
  }
}

}  // namespace test
