// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Moving nested batches to a device: tensors, tuples, pairs, vectors, string-keyed maps, and
/// user types that teach dettrial how.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace dettrial::detail {
template <class T>
struct is_tuple_like : std::false_type {};
template <class... Ts>
struct is_tuple_like<std::tuple<Ts...>> : std::true_type {};
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_string_map : std::false_type {};
template <class V, class C, class A>
struct is_string_map<std::map<std::string, V, C, A>> : std::true_type {};
template <class V, class H, class E, class A>
struct is_string_map<std::unordered_map<std::string, V, H, E, A>> : std::true_type {};

/// Calls `f(tensor&)` on every tensor inside a nested batch (tuples, pairs, vectors, string-keyed maps);
/// other values are skipped.
template <class T, class F>
void for_each_tensor(T& batch, F&& f) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, torch::Tensor>) {
    f(batch);
  } else if constexpr (is_tuple_like<U>::value) {
    std::apply([&](auto&... parts) { (for_each_tensor(parts, f), ...); }, batch);
  } else if constexpr (is_vector<U>::value) {
    for (auto& part : batch) for_each_tensor(part, f);
  } else if constexpr (is_string_map<U>::value) {
    for (auto& kv : batch) for_each_tensor(kv.second, f);
  }
}

/// A batch of tensors in tuples, pairs, vectors and string-keyed maps, and nothing else: every value
/// in it is a tensor that for_each_tensor reaches (what a CUDA graph can take as input, where a number
/// would be frozen at the captured batch's value, and what a side-stream copy can hand over safely).
template <class B>
constexpr bool tensors_only_batch() {
  using U = std::remove_cvref_t<B>;
  if constexpr (std::is_same_v<U, torch::Tensor>) return true;
  else if constexpr (is_tuple_like<U>::value)
    return []<class... Ts>(std::type_identity<std::tuple<Ts...>>) {
      return (tensors_only_batch<Ts>() && ...);
    }(std::type_identity<decltype(std::tuple_cat(std::declval<U>()))>{});
  else if constexpr (is_vector<U>::value) return tensors_only_batch<typename U::value_type>();
  else if constexpr (is_string_map<U>::value) return tensors_only_batch<typename U::mapped_type>();
  else return false;
}

}  // namespace dettrial::detail

namespace dettrial {
/**
 * @brief Moves every tensor inside `batch` to `device`, in place.
 *
 * Recurses through std::tuple, std::pair, std::vector and string-keyed std::map / std::unordered_map.
 * A user type is moved by its member `to_device(device, non_blocking)` if it has one, else by its
 * member `to(device)` (Determined moves "anything with .to"); anything else is left as it is.
 * Tensors already on `device` are not copied.
 */
struct to_device_in_place_fn {
  template <class T>
  void operator()(T& batch, const torch::Device& device, bool non_blocking = false) const {
    using U = std::remove_cvref_t<T>;
    if constexpr (std::is_same_v<U, torch::Tensor>) {
      if (batch.defined() && batch.device() != device) batch = batch.to(device, non_blocking);
    } else if constexpr (detail::is_tuple_like<U>::value) {
      std::apply([&](auto&... parts) { ((*this)(parts, device, non_blocking), ...); }, batch);
    } else if constexpr (detail::is_vector<U>::value) {
      for (auto& part : batch) (*this)(part, device, non_blocking);
    } else if constexpr (detail::is_string_map<U>::value) {
      for (auto& kv : batch) (*this)(kv.second, device, non_blocking);
    } else if constexpr (requires { batch.to_device(device, non_blocking); }) {
      batch.to_device(device, non_blocking);
    } else if constexpr (requires { batch = batch.to(device); }) {
      batch = batch.to(device);
    }
  }
};
inline constexpr to_device_in_place_fn to_device_in_place{};

/// Moves every tensor inside `batch` to `device` and returns it (see to_device_in_place).
template <class T>
std::remove_cvref_t<T> to_device(T&& batch, const torch::Device& device, bool non_blocking = false) {
  std::remove_cvref_t<T> moved(std::forward<T>(batch));
  to_device_in_place(moved, device, non_blocking);
  return moved;
}

/// The number of records in a batch: the first dimension of its first tensor (Determined's data_length).
template <class T>
std::int64_t batch_length(const T& batch) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, torch::Tensor>) {
    return batch.defined() && batch.dim() > 0 ? batch.size(0) : 1;
  } else if constexpr (detail::is_tuple_like<U>::value) {
    return batch_length(std::get<0>(batch));
  } else if constexpr (detail::is_vector<U>::value || detail::is_string_map<U>::value) {
    if (batch.empty()) return 0;
    if constexpr (detail::is_vector<U>::value) return batch_length(batch.front());
    else return batch_length(batch.begin()->second);
  } else if constexpr (requires {
                         { batch.size() } -> std::convertible_to<std::int64_t>;
                       }) {
    return static_cast<std::int64_t>(batch.size());
  } else {
    return 1;
  }
}

}  // namespace dettrial
