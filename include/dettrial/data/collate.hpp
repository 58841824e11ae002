// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Per-example datasets: `get(index)` one record at a time, stacked into batches by a collate
/// function (nested tensors, tuples, vectors, string-keyed maps, numbers, strings).
#pragma once

#include <concepts>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../vocabulary/data.hpp"
#include "to_device.hpp"
#include "../error.hpp"

namespace dettrial {

/**
 * @brief The default collate: stacks a vector of examples into one batch of the same shape.
 * Tensors are stacked along a new first dimension; tuples, pairs, vectors and string-keyed maps are
 * collated element by element; numbers become a 1-D tensor; strings a vector of strings.
 */
struct collate_fn {
  template <class Example>
  auto operator()(const std::vector<Example>& examples) const {
    using E = std::remove_cvref_t<Example>;
    if constexpr (std::is_same_v<E, torch::Tensor>) {
      return torch::stack(examples);
    } else if constexpr (detail::is_tuple_like<E>::value) {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::tuple{(*this)(field<I>(examples))...};
      }(std::make_index_sequence<std::tuple_size_v<E>>{});
    } else if constexpr (detail::is_vector<E>::value) {
      using Inner = typename E::value_type;
      std::vector<decltype((*this)(std::declval<const std::vector<Inner>&>()))> out;
      const std::size_t width = examples.empty() ? 0 : examples.front().size();
      for (std::size_t j = 0; j < width; ++j) {
        std::vector<Inner> column;
        column.reserve(examples.size());
        for (const auto& e : examples) {
          if (e.size() != width) throw DataError("collate: examples are vectors of different lengths");
          column.push_back(e[j]);
        }
        out.push_back((*this)(column));
      }
      return out;
    } else if constexpr (detail::is_string_map<E>::value) {
      using Inner = typename E::mapped_type;
      std::map<std::string, decltype((*this)(std::declval<const std::vector<Inner>&>()))> out;
      if (examples.empty()) return out;
      for (const auto& [key, unused] : examples.front()) {
        std::vector<Inner> column;
        column.reserve(examples.size());
        for (const auto& e : examples) {
          auto it = e.find(key);
          if (it == e.end()) throw DataError("collate: an example has no key '" + key + "'");
          column.push_back(it->second);
        }
        out.emplace(key, (*this)(column));
      }
      return out;
    } else if constexpr (std::is_arithmetic_v<E>) {
      return torch::tensor(
                 std::vector<std::conditional_t<std::is_floating_point_v<E>, double, std::int64_t>>(examples.begin(), examples.end()))
          .to(std::is_floating_point_v<E> ? torch::kFloat : torch::kLong);
    } else {
      return examples;  // strings and other values: the list of them
    }
  }

 private:
  template <std::size_t I, class E>
  static auto field(const std::vector<E>& examples) {
    std::vector<std::remove_cvref_t<std::tuple_element_t<I, E>>> out;
    out.reserve(examples.size());
    for (const auto& e : examples) out.push_back(std::get<I>(e));
    return out;
  }
};

/// Turns a per-example dataset into a batch-level one: gathers the records of a batch and collates them.
template <class D, class Collate = collate_fn>
class ExampleBatches {
  static_assert(ExampleDataset<D>, "dettrial::ExampleBatches<D>: D must have size() and get(index) (a dettrial::ExampleDataset)");

 public:
  explicit ExampleBatches(D dataset, Collate collate = {}) : dataset_(std::move(dataset)), collate_(std::move(collate)) {}
  std::int64_t size() const { return static_cast<std::int64_t>(dataset_.size()); }
  auto get_batch(const torch::Tensor& indices) const {
    using Example = std::remove_cvref_t<decltype(dataset_.get(std::int64_t{}))>;
    std::vector<Example> examples;
    examples.reserve(static_cast<std::size_t>(indices.numel()));
    const torch::Tensor order = indices.to(torch::kLong).contiguous();
    const auto* idx = order.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < indices.numel(); ++i) examples.push_back(dataset_.get(idx[i]));
    return collate_(examples);
  }
  const D& dataset() const { return dataset_; }

 private:
  D dataset_;
  Collate collate_;
};

/// A per-example dataset with a custom collate function, for DataLoader.
template <class D, class Collate>
ExampleBatches<D, Collate> with_collate(D dataset, Collate collate) {
  return ExampleBatches<D, Collate>(std::move(dataset), std::move(collate));
}

}  // namespace dettrial
