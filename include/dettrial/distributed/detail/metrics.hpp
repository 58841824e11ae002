// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Metrics across ranks, as Determined reduces them: training means averaged over ranks;
/// validation reduced per rank, then across ranks (avg weighted by each rank's batch count); user
/// reducers per slot, then across slots; record counts of the whole job. Every rank computes the
/// same result from the same gathered shares, so every decision taken on them is agreed.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "../../error.hpp"
#include "../../vocabulary/metrics.hpp"
#include "../../metrics/reducers.hpp"
#include "../communicator.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/// What one rank contributes at the end of a training workload or a validation.
struct RankShare {
  /// Per metric: the training mean (training), or the per-rank total of its reducer (validation).
  std::vector<ValidationReduction::Total> totals{};
  std::int64_t batches = 0;
  std::int64_t records = 0;
  /// The per-slot parts of the user reducers taking part, in registration order.
  std::vector<c10::IValue> reducer_parts{};
};

DETTRIAL_INLINE c10::IValue to_ivalue(const RankShare& share);

DETTRIAL_INLINE RankShare from_ivalue(const c10::IValue& v);

/// Every rank's share, in rank order, on every rank (one all-gather); one process: its own.
DETTRIAL_INLINE std::vector<RankShare> gather_shares(RankShare mine, Communicator* comm);

DETTRIAL_INLINE std::int64_t total_records(const std::vector<RankShare>& shares);
DETTRIAL_INLINE std::int64_t total_batches(const std::vector<RankShare>& shares);

/// Each metric any rank reported (in the order first seen, chief first), with its reducer and the
/// values of the ranks that reported it.
struct MetricAcrossRanks {
  std::string name;
  Reducer reducer;
  std::vector<double> values;
};
DETTRIAL_INLINE std::vector<MetricAcrossRanks> by_metric(const std::vector<RankShare>& shares);

/// Training: each metric's mean over the ranks that report it (every rank trains as many batches
/// per workload, so this is Determined's per-batch mean over ranks, then over batches).
DETTRIAL_INLINE MetricValues combine_training(const std::vector<RankShare>& shares);

/// Validation: avg = the sum over all batches of all ranks / all batches (Determined's mean weighted
/// by each rank's batch count), sum, max and min over the ranks that validated any batch; a NaN
/// anywhere gives NaN, like np.max / np.sum.
DETTRIAL_INLINE MetricValues combine_validation(const std::vector<RankShare>& shares);

/// The parts of reducer `index` (among those taking part), one per rank in rank order.
DETTRIAL_INLINE std::vector<c10::IValue> reducer_parts(const std::vector<RankShare>& shares, std::size_t index);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE c10::IValue to_ivalue(const RankShare& share) {
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

DETTRIAL_INLINE RankShare from_ivalue(const c10::IValue& v) {
  // Through an ArrayRef of checked size: indexing the tuple's elements directly past 3 (its inline
  // storage) is what GCC's -Warray-bounds cannot prove safe.
  const c10::ArrayRef<c10::IValue> e = v.toTupleRef().elements().asArrayRef();
  if (e.size() != 6)
    throw Error("a rank sent a metrics share of " + std::to_string(e.size()) +
                " fields, not 6 (ranks built from different dettrial versions?)");
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

DETTRIAL_INLINE std::vector<RankShare> gather_shares(RankShare mine, Communicator* comm) {
  if (comm == nullptr) return {std::move(mine)};
  std::vector<RankShare> out;
  for (const c10::IValue& v : comm->allgather_object(to_ivalue(mine))) out.push_back(from_ivalue(v));
  return out;
}

DETTRIAL_INLINE std::int64_t total_records(const std::vector<RankShare>& shares) {
  std::int64_t n = 0;
  for (const auto& s : shares) n += s.records;
  return n;
}

DETTRIAL_INLINE std::int64_t total_batches(const std::vector<RankShare>& shares) {
  std::int64_t n = 0;
  for (const auto& s : shares) n += s.batches;
  return n;
}

DETTRIAL_INLINE std::vector<MetricAcrossRanks> by_metric(const std::vector<RankShare>& shares) {
  std::vector<MetricAcrossRanks> out;
  for (const auto& share : shares)
    for (const auto& t : share.totals) {
      auto it = std::find_if(out.begin(), out.end(), [&](const MetricAcrossRanks& m) { return m.name == t.name; });
      if (it == out.end()) it = out.insert(out.end(), MetricAcrossRanks{t.name, t.reducer, {}});
      it->values.push_back(t.value);
    }
  return out;
}

DETTRIAL_INLINE MetricValues combine_training(const std::vector<RankShare>& shares) {
  MetricValues out;
  for (const auto& m : by_metric(shares))
    out.set(m.name, std::accumulate(m.values.begin(), m.values.end(), 0.0) / static_cast<double>(m.values.size()));
  return out;
}

DETTRIAL_INLINE MetricValues combine_validation(const std::vector<RankShare>& shares) {
  MetricValues out;
  const double all_batches = static_cast<double>(total_batches(shares));
  for (const auto& m : by_metric(shares)) {
    double value = m.reducer == Reducer::max   ? -std::numeric_limits<double>::infinity()
                   : m.reducer == Reducer::min ? std::numeric_limits<double>::infinity()
                                               : 0.0;
    for (const double v : m.values) {
      if (std::isnan(v) || std::isnan(value)) value = std::numeric_limits<double>::quiet_NaN();
      else value = m.reducer == Reducer::max ? std::max(value, v) : m.reducer == Reducer::min ? std::min(value, v) : value + v;
    }
    out.set(m.name, m.reducer == Reducer::avg ? value / all_batches : value);
  }
  return out;
}

DETTRIAL_INLINE std::vector<c10::IValue> reducer_parts(const std::vector<RankShare>& shares, std::size_t index) {
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
#endif  // DETTRIAL_HEADER_DEFINITIONS
