// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Metrics across ranks, as Determined reduces them: training means averaged over ranks;
/// validation reduced per rank, then across ranks (avg weighted by each rank's batch count).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "../metrics/metrics.hpp"
#include "../metrics/reducers.hpp"
#include "communicator.hpp"

namespace dettrial::detail {

/// Averages every metric but the counters (`batches`, `epochs`) over the ranks, in place.
inline void average_across_ranks(MetricValues& metrics, Communicator& comm) {
  std::vector<std::string> names;
  std::vector<double> values;
  for (const auto& [name, value] : metrics)
    if (name != "batches" && name != "epochs") {
      names.push_back(name);
      values.push_back(value);
    }
  if (values.empty()) return;
  std::vector<torch::Tensor> t{torch::tensor(values, torch::kDouble)};
  comm.allreduce(t);
  const auto* sums = t[0].data_ptr<double>();
  for (std::size_t i = 0; i < names.size(); ++i) metrics.set(names[i], sums[i] / comm.size());
}

/// Combines per-rank validation totals: avg = sum over all batches / all batches; sum; max; min.
inline MetricValues reduce_validation_across_ranks(const std::vector<ValidationReduction::Total>& totals, std::int64_t batches,
                                                   Communicator& comm) {
  std::vector<double> sums{static_cast<double>(batches)}, extremes;
  for (const auto& t : totals) {
    if (t.reducer == Reducer::avg || t.reducer == Reducer::sum) sums.push_back(t.value);
    else extremes.push_back(t.reducer == Reducer::max ? t.value : -t.value);  // min as the max of negatives
  }
  std::vector<torch::Tensor> s{torch::tensor(sums, torch::kDouble)};
  comm.allreduce(s);
  std::vector<torch::Tensor> e{torch::tensor(extremes.empty() ? std::vector<double>{0.0} : extremes, torch::kDouble)};
  if (!extremes.empty()) comm.allreduce(e, c10d::ReduceOp::MAX);
  const auto* sum = s[0].data_ptr<double>();
  const auto* ext = e[0].data_ptr<double>();
  const double all_batches = sum[0];
  MetricValues out;
  std::size_t si = 1, ei = 0;
  for (const auto& t : totals) {
    switch (t.reducer) {
      case Reducer::avg: out.set(t.name, sum[si++] / all_batches); break;
      case Reducer::sum: out.set(t.name, sum[si++]); break;
      case Reducer::max: out.set(t.name, ext[ei++]); break;
      case Reducer::min: out.set(t.name, -ext[ei++]); break;
    }
  }
  return out;
}

/// Sends the chief's metrics (names and values) to every rank.
inline MetricValues broadcast_metrics(const MetricValues& metrics, Communicator& comm) {
  std::string text;
  std::vector<double> values;
  for (const auto& [name, value] : metrics) {
    text += name;
    text += '\n';
    values.push_back(value);
  }
  std::vector<torch::Tensor> sizes{torch::tensor({static_cast<std::int64_t>(text.size()), static_cast<std::int64_t>(values.size())})};
  comm.broadcast(sizes);
  const auto text_size = sizes[0][0].item<std::int64_t>();
  const auto count = sizes[0][1].item<std::int64_t>();
  std::vector<torch::Tensor> payload{torch::zeros({text_size}, torch::kUInt8), torch::zeros({count}, torch::kDouble)};
  if (comm.rank() == 0) {
    std::memcpy(payload[0].data_ptr<std::uint8_t>(), text.data(), text.size());
    std::memcpy(payload[1].data_ptr<double>(), values.data(), values.size() * sizeof(double));
  }
  comm.broadcast(payload);
  MetricValues out;
  const std::string names(reinterpret_cast<const char*>(payload[0].data_ptr<std::uint8_t>()), static_cast<std::size_t>(text_size));
  std::size_t start = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::size_t end = names.find('\n', start);
    out.set(names.substr(start, end - start), payload[1].data_ptr<double>()[i]);
    start = end + 1;
  }
  return out;
}

}  // namespace dettrial::detail
