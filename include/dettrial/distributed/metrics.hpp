// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Metrics across ranks, as Determined reduces them: training means averaged over ranks;
/// validation reduced per rank, then across ranks (avg weighted by each rank's batch count); user
/// reducers per slot, then across slots; record counts of the whole job. Every rank computes the
/// same result from the same gathered shares, so every decision taken on them is agreed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "../detail/error.hpp"
#include "../metrics/metrics.hpp"
#include "../metrics/reducers.hpp"
#include "communicator.hpp"

namespace dettrial::detail {

/// What one rank contributes at the end of a training workload or a validation.
struct RankShare {
  /// Per metric: the training mean (training), or the per-rank total of its reducer (validation).
  std::vector<ValidationReduction::Total> totals;
  std::int64_t batches = 0;
  std::int64_t records = 0;
  /// The per-slot parts of the user reducers taking part, in registration order.
  std::vector<c10::IValue> reducer_parts;
};

inline c10::IValue to_ivalue(const RankShare& share) {
  c10::List<std::string> names;
  c10::List<std::int64_t> kinds;
  c10::List<double> values;
  for (const auto& t : share.totals) {
    names.push_back(t.name);
    kinds.push_back(static_cast<std::int64_t>(t.reducer));
    values.push_back(t.value);
  }
  c10::impl::GenericList parts(c10::AnyType::get());
  for (const auto& p : share.reducer_parts) parts.push_back(p);
  return c10::ivalue::Tuple::create({names, kinds, values, share.batches, share.records, parts});
}

inline RankShare from_ivalue(const c10::IValue& v) {
  const auto& e = v.toTupleRef().elements();
  RankShare share;
  const auto names = e[0].toList();
  const auto kinds = e[1].toList();
  const auto values = e[2].toList();
  for (std::size_t i = 0; i < names.size(); ++i)
    share.totals.push_back({names.get(i).toStringRef(), static_cast<Reducer>(kinds.get(i).toInt()), values.get(i).toDouble()});
  share.batches = e[3].toInt();
  share.records = e[4].toInt();
  for (const auto& p : e[5].toList()) share.reducer_parts.push_back(p);
  return share;
}

/// Every rank's share, in rank order, on every rank (one all-gather); one process: its own.
inline std::vector<RankShare> gather_shares(RankShare mine, Communicator* comm) {
  if (comm == nullptr) return {std::move(mine)};
  std::vector<RankShare> out;
  for (const c10::IValue& v : comm->allgather_object(to_ivalue(mine))) out.push_back(from_ivalue(v));
  return out;
}

inline std::int64_t total_records(const std::vector<RankShare>& shares) {
  std::int64_t n = 0;
  for (const auto& s : shares) n += s.records;
  return n;
}
inline std::int64_t total_batches(const std::vector<RankShare>& shares) {
  std::int64_t n = 0;
  for (const auto& s : shares) n += s.batches;
  return n;
}

/// Training: each metric's mean over the ranks that report it (every rank trains as many batches
/// per workload, so this is Determined's per-batch mean over ranks, then over batches).
inline MetricValues combine_training(const std::vector<RankShare>& shares) {
  MetricValues out;
  for (const auto& share : shares)
    for (const auto& first : share.totals) {
    if (out.contains(first.name)) continue;
    double sum = 0;
    int ranks = 0;
    for (const auto& s : shares)
      for (const auto& t : s.totals)
        if (t.name == first.name) {
          sum += t.value;
          ++ranks;
        }
    out.set(first.name, sum / ranks);
    }
  return out;
}

/// Validation: avg = the sum over all batches of all ranks / all batches (Determined's mean weighted
/// by each rank's batch count), sum, max and min over the ranks that validated any batch.
inline MetricValues combine_validation(const std::vector<RankShare>& shares) {
  MetricValues out;
  const double all_batches = static_cast<double>(total_batches(shares));
  std::vector<std::string> seen;
  for (const auto& share : shares)
    for (const auto& first : share.totals) {
      if (std::find(seen.begin(), seen.end(), first.name) != seen.end()) continue;
      seen.push_back(first.name);
      double value = first.reducer == Reducer::max   ? -std::numeric_limits<double>::infinity()
                     : first.reducer == Reducer::min ? std::numeric_limits<double>::infinity()
                                                     : 0.0;
      for (const auto& s : shares)
        for (const auto& t : s.totals) {
          if (t.name != first.name) continue;
          if (std::isnan(t.value)) value = t.value;  // like np.max / np.sum
          else if (!std::isnan(value))
            value = first.reducer == Reducer::max ? std::max(value, t.value) : first.reducer == Reducer::min ? std::min(value, t.value) : value + t.value;
        }
      out.set(first.name, first.reducer == Reducer::avg ? value / all_batches : value);
    }
  return out;
}

/// The parts of reducer `index` (among those taking part), one per rank in rank order.
inline std::vector<c10::IValue> reducer_parts(const std::vector<RankShare>& shares, std::size_t index) {
  std::vector<c10::IValue> parts;
  parts.reserve(shares.size());
  for (const auto& s : shares) {
    if (index >= s.reducer_parts.size())
      throw DistributedError("the ranks wrapped different numbers of reducers; every rank must build the same trial");
    parts.push_back(s.reducer_parts[index]);
  }
  return parts;
}

}  // namespace dettrial::detail
