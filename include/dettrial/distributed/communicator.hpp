// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The process group of a data-parallel job, on PyTorch's c10d: a TCPStore rendezvous and a
/// Gloo (CPU) or NCCL (CUDA) backend chosen by a policy type, with the few collectives dettrial uses.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <type_traits>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>
// The backends' base class and collectives' types; the stores and the Gloo and NCCL backends are
// needed only where the process group is made (the definitions below), so a trial's translation
// unit in separate-compilation mode does not parse them.
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
// Gloo comes with LibTorch's c10d when it was built with it (USE_C10D_GLOO) and its headers are
// installed (Debian: libgloo-dev); NCCL when LibTorch is CUDA-built and dettrial's CMake found nccl.h.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/algorithm.h>)
#define DETTRIAL_HAS_GLOO 1
#endif

#include "../error.hpp"
#include "../detail/text.hpp"
#include "../process/launch_environment.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// Distributed backends as policy types (`Communicator::create<backend::gloo>(...)`).
}  // namespace dettrial

namespace dettrial::backend {
/// Gloo over TCP: CPU tensors (any machine).
struct gloo {
  static constexpr const char* name = "gloo";
};
/// NCCL: CUDA tensors. Only when LibTorch is CUDA-built and dettrial was configured with NCCL.
struct nccl {
  static constexpr const char* name = "nccl";
};
/// NCCL where every rank of the job has a GPU of its own (compared across the job by the GPUs'
/// UUIDs, so two launchers' "nodes" on one machine are seen) and NCCL is built, Gloo otherwise: the
/// command line's default. Every rank decides alike, from what every rank reported.
struct gpu_or_gloo {
  static constexpr const char* name = "nccl-or-gloo";
};
/// Whether this build of dettrial has the Gloo backend.
inline constexpr bool has_gloo =
#if defined(DETTRIAL_HAS_GLOO)
    true;
#else
    false;
#endif
/// Whether this build of dettrial has the NCCL backend.
inline constexpr bool has_nccl =
#if defined(DETTRIAL_HAS_NCCL)
    true;
#else
    false;
#endif
}  // namespace dettrial::backend

namespace dettrial::detail {
// LibTorch 1.x backends derive from c10d::ProcessGroup; 2.x ones from c10d::Backend. Both have the
// same collective signatures, which are all dettrial calls.
#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

/// Why the NCCL backend cannot take a job whose ranks' GPUs are `gpu_of_rank` (in rank order: a
/// GPU's UUID, or "" where a rank has no GPU of its own): "rank 3 has no GPU of its own", "ranks 0
/// and 1 would both use GPU <uuid>"; empty when every rank has a GPU no other rank uses.
std::string why_not_one_gpu_per_rank(const std::vector<std::string>& gpu_of_rank);

/// The one device rule: the GPU a process's local rank picks (one per process), for the Context's
/// device and NCCL's alike.
DETTRIAL_INLINE c10::DeviceIndex local_gpu_index(const LaunchEnvironment& env);
}  // namespace dettrial::detail

namespace dettrial {
/**
 * @brief One process's handle on its job's process group. Every collective waits for its result and
 * turns a failure (a dead or hung peer, after `timeout`) into a DistributedError naming this rank.
 */
class Communicator {
 public:
  /// Joins the job `env` describes with backend `B` (rank 0 hosts the TCPStore unless torchrun's agent does).
  template <class B>
  static std::shared_ptr<Communicator> create(const LaunchEnvironment& env, std::chrono::milliseconds timeout, B = {}) {
    static_assert(std::is_same_v<B, backend::gloo> || std::is_same_v<B, backend::nccl> || std::is_same_v<B, backend::gpu_or_gloo>,
                  "dettrial: Communicator::create takes backend::gloo, backend::nccl or backend::gpu_or_gloo (adopt() takes a "
                  "backend of one's own)");
    return join(env, timeout, B::name);
  }

  /**
   * @brief A communicator over a c10d backend made elsewhere (one dettrial does not create, or a
   * test double), whose collectives take their tensors on `device`. `name` is the backend's name in
   * messages; the backend must be `env.size` ranks wide with this process as `env.rank`.
   */
  static std::shared_ptr<Communicator> adopt(c10::intrusive_ptr<detail::C10dBackend> backend, const LaunchEnvironment& env,
                                             std::chrono::milliseconds timeout, torch::Device device, const char* name);

  int rank() const { return env_.rank; }
  int size() const { return env_.size; }
  const LaunchEnvironment& environment() const { return env_; }
  const char* backend_name() const { return backend_name_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// Sums (or takes the max of) `tensors` across ranks, in place.
  void allreduce(std::vector<torch::Tensor>& tensors, c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM);
  /// Starts an all-reduce and returns without waiting (see wait()).
  c10::intrusive_ptr<c10d::Work> allreduce_async(std::vector<torch::Tensor>& tensors);
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what = "all-reduce");
  /// Copies `tensors` from `root` to every rank.
  void broadcast(std::vector<torch::Tensor>& tensors, int root = 0);
  /// Every rank's `tensor` (same shape on all), gathered on every rank in rank order.
  std::vector<torch::Tensor> allgather(const torch::Tensor& tensor);
  /// Starts an all-gather of every rank's `inputs[0]` into `outputs[0][r]` (rank r's; the caller's
  /// tensors, kept alive until waited for) and returns without waiting (see wait()).
  c10::intrusive_ptr<c10d::Work> allgather_async(std::vector<std::vector<torch::Tensor>>& outputs, std::vector<torch::Tensor>& inputs);
  void barrier();

  /// Where this backend's collectives take their tensors: the CPU for Gloo, this rank's GPU for NCCL.
  /// Every collective dettrial issues passes tensors on this device.
  const torch::Device& device() const { return device_; }
  /// The c10d backend underneath, for collectives of one's own.
  const c10::intrusive_ptr<detail::C10dBackend>& backend() const { return backend_; }

  /// The chief's `values` on every rank (each rank passes as many).
  std::vector<std::int64_t> broadcast_values(const std::vector<std::int64_t>& values);
  /// The sum (or max, ...) of `values` over the ranks (each rank passes as many).
  std::vector<double> allreduce_values(const std::vector<double>& values, c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM);

  /**
   * @brief Every rank's `value`, in rank order, on every rank (Determined's object allgather). The
   * values are pickled with LibTorch's serialization, so they may differ in size and shape between
   * ranks: numbers, strings, tensors, and lists, tuples and dicts of them.
   */
  std::vector<c10::IValue> allgather_object(const c10::IValue& value);

 private:
  Communicator(LaunchEnvironment env, std::chrono::milliseconds timeout, const char* backend_name);

  /// Joins the job with the backend named `backend_name` (a backend policy's name).
  static std::shared_ptr<Communicator> join(const LaunchEnvironment& env, std::chrono::milliseconds timeout, const char* backend_name);

  template <class F>
  void run(const char* what, F&& start) {
    try {
      start()->wait(timeout_);
    } catch (const std::exception& e) {
      throw failure(what, e);
    }
  }

  DistributedError failure(const char* what, const std::exception& e) const;

  LaunchEnvironment env_;
  std::chrono::milliseconds timeout_;
  const char* backend_name_;
  torch::Device device_{torch::kCPU};
  c10::intrusive_ptr<detail::C10dBackend> backend_;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(DETTRIAL_HAS_NCCL)
#include <ATen/cuda/CUDAContext.h>
#endif
#if defined(DETTRIAL_HAS_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if defined(DETTRIAL_HAS_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace dettrial::detail {
#if defined(DETTRIAL_HAS_GLOO)
/// Gloo's transport device: the interface GLOO_SOCKET_IFNAME names, loopback for a job on one
/// machine, else the host name's address.
DETTRIAL_INLINE std::shared_ptr<::gloo::transport::Device> gloo_device(const LaunchEnvironment& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  // One machine (the built-in launcher, a local torchrun): loopback needs no name resolution.
  if (env.master_addr == "127.0.0.1" || env.master_addr == "localhost") return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}
#endif

DETTRIAL_INLINE std::string why_not_one_gpu_per_rank(const std::vector<std::string>& gpu_of_rank) {
  std::map<std::string, std::size_t> first_rank_of;
  for (std::size_t r = 0; r < gpu_of_rank.size(); ++r) {
    if (gpu_of_rank[r].empty()) return "rank " + std::to_string(r) + " has no GPU of its own";
    const auto [seen, fresh] = first_rank_of.emplace(gpu_of_rank[r], r);
    if (!fresh) return "ranks " + std::to_string(seen->second) + " and " + std::to_string(r) + " would both use GPU " + gpu_of_rank[r];
  }
  return {};
}

DETTRIAL_INLINE c10::DeviceIndex local_gpu_index(const LaunchEnvironment& env) {
  return static_cast<c10::DeviceIndex>(env.local_rank % std::max<std::int64_t>(static_cast<std::int64_t>(torch::cuda::device_count()), 1));
}

#if defined(DETTRIAL_HAS_NCCL)
/// The UUID of the GPU this process's local rank picks, or "" where its node runs more ranks than it
/// has GPUs (or has none).
DETTRIAL_INLINE std::string this_ranks_gpu(const LaunchEnvironment& env) {
  const auto gpus = static_cast<std::int64_t>(torch::cuda::device_count());
  if (gpus == 0 || env.local_size > gpus) return {};
  const cudaDeviceProp* properties = at::cuda::getDeviceProperties(local_gpu_index(env));
  static constexpr char hex[] = "0123456789abcdef";
  std::string uuid = "GPU-";
  for (const char byte : properties->uuid.bytes) {
    uuid += hex[(static_cast<unsigned char>(byte) >> 4) & 0xF];
    uuid += hex[static_cast<unsigned char>(byte) & 0xF];
  }
  return uuid;
}

/// Every rank's GPU (this_ranks_gpu), in rank order, exchanged through the job's store: keys of this
/// attempt, so a restarted job does not read the last one's.
DETTRIAL_INLINE std::vector<std::string> gpus_of_ranks(c10d::Store& store, const LaunchEnvironment& env) {
  const std::string prefix = "dettrial/gpu/" + std::to_string(env.restart) + "/";
  static constexpr std::string_view none = "none";  // a rank without a GPU of its own (the store keeps no empty value)
  const std::string uuid = this_ranks_gpu(env);
  const std::string_view mine = uuid.empty() ? none : std::string_view(uuid);
  store.set(prefix + std::to_string(env.rank), std::vector<std::uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> all;
  for (int r = 0; r < env.size; ++r) {
    const std::vector<std::uint8_t> value = store.get(prefix + std::to_string(r));
    const std::string theirs(value.begin(), value.end());
    all.push_back(theirs == none ? std::string() : theirs);
  }
  return all;
}
#endif
}  // namespace dettrial::detail

namespace dettrial {

DETTRIAL_INLINE std::shared_ptr<Communicator> Communicator::join(const LaunchEnvironment& env, std::chrono::milliseconds timeout,
                                                                 const char* backend_name) {
  // NCCL cannot put two ranks on one GPU: say so before the rendezvous, not in NCCL's words after it.
  if (std::string_view(backend_name) == backend::nccl::name && backend::has_nccl) {
    const std::int64_t gpus = static_cast<std::int64_t>(torch::cuda::device_count());
    if (env.local_size > gpus)
      throw DistributedError("rank " + std::to_string(env.rank) + " of " + std::to_string(env.size) +
                             ": the NCCL backend takes one GPU per rank, and this node runs " + std::to_string(env.local_size) +
                             " rank(s) but sees " + (gpus == 0 ? std::string("no GPU") : std::to_string(gpus) + " GPU(s)") +
                             "; start at most one rank per GPU, or use the Gloo backend (--backend gloo)");
  }
  std::shared_ptr<Communicator> comm;
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(env.master_port);
    options.isServer = env.rank == 0 && !env.agent_store;
    if (!env.agent_store) options.numWorkers = static_cast<std::size_t>(env.size);
    options.waitWorkers = !env.agent_store;
    options.timeout = timeout;
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    if (!env.store_prefix.empty()) store = c10::make_intrusive<c10d::PrefixStore>(env.store_prefix, store);
    // A launcher counts the ranks of its own node only: two of its "nodes" on one machine (torchrun
    // --nnodes 2 on one host) would put two NCCL ranks on one GPU, which NCCL refuses only after the
    // rendezvous, as "invalid usage". The ranks compare their GPUs' UUIDs first.
    const bool automatic = std::string_view(backend_name) == backend::gpu_or_gloo::name;
    if (automatic) backend_name = backend::gloo::name;
#if defined(DETTRIAL_HAS_NCCL)
    if (automatic || std::string_view(backend_name) == backend::nccl::name) {
      const std::string why_not = detail::why_not_one_gpu_per_rank(detail::gpus_of_ranks(*store, env));
      if (automatic) backend_name = why_not.empty() ? backend::nccl::name : backend::gloo::name;
      else if (!why_not.empty())
        throw DistributedError("rank " + std::to_string(env.rank) + " of " + std::to_string(env.size) +
                               ": the NCCL backend takes one GPU per rank, but " + why_not +
                               " (two launchers' nodes on one machine?); give each rank a GPU of its own, or use the Gloo backend "
                               "(--backend gloo)");
    }
#endif
    comm = std::shared_ptr<Communicator>(new Communicator(env, timeout, backend_name));
    if (std::string_view(backend_name) == backend::gloo::name) {
#if defined(DETTRIAL_HAS_GLOO)
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
      gloo_options->devices.push_back(detail::gloo_device(env));
      comm->backend_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.size, gloo_options);
#else
      throw DistributedError(
          "the Gloo backend is not in this build: LibTorch lacks c10d Gloo, or the gloo headers "
          "(Debian: libgloo-dev) are not installed");
#endif
    } else {
#if defined(DETTRIAL_HAS_NCCL)
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = timeout;
      comm->backend_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, env.rank, env.size, nccl_options);
#else
      throw DistributedError(
          "the NCCL backend is not in this build: LibTorch is not CUDA-built, or dettrial was configured "
          "without NCCL (DETTRIAL_NCCL)");
#endif
    }
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& e) {
    // torchrun's agent hosts the store in its own release's protocol, which another release's client
    // does not speak (2.x's agent answers a 1.13 program with a broken pipe): the likely cause, named.
    const std::string agent_hint = env.agent_store
                                       ? "; torchrun's agent hosts the store here, so it must be the torchrun of this program's LibTorch " +
                                             std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
                                             " (PyTorch releases' stores speak different protocols)"
                                       : "";
    throw DistributedError("rank " + std::to_string(env.rank) + " of " + std::to_string(env.size) + ": cannot join the " + backend_name +
                           " process group at " + env.master_addr + ":" + std::to_string(env.master_port) + " (" +
                           launcher_name(env.launcher) + "): " + detail::first_line(e.what()) + agent_hint);
  }
  return comm;
}

DETTRIAL_INLINE std::shared_ptr<Communicator> Communicator::adopt(c10::intrusive_ptr<detail::C10dBackend> backend,
                                                                  const LaunchEnvironment& env, std::chrono::milliseconds timeout,
                                                                  torch::Device device, const char* name) {
  if (!backend) throw DistributedError("Communicator::adopt was given no backend");
  if (backend->getRank() != env.rank || backend->getSize() != env.size)
    throw DistributedError(std::string("the ") + name + " backend is rank " + std::to_string(backend->getRank()) + " of " +
                           std::to_string(backend->getSize()) + ", but the launch environment says rank " + std::to_string(env.rank) +
                           " of " + std::to_string(env.size));
  auto comm = std::shared_ptr<Communicator>(new Communicator(env, timeout, name));
  comm->device_ = device;
  comm->backend_ = std::move(backend);
  return comm;
}

DETTRIAL_INLINE void Communicator::allreduce(std::vector<torch::Tensor>& tensors, c10d::ReduceOp::RedOpType op) {
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp(op);
  run("all-reduce", [&] { return backend_->allreduce(tensors, options); });
}

DETTRIAL_INLINE c10::intrusive_ptr<c10d::Work> Communicator::allreduce_async(std::vector<torch::Tensor>& tensors) {
  try {
    return backend_->allreduce(tensors);
  } catch (const std::exception& e) {
    throw failure("all-reduce", e);
  }
}

DETTRIAL_INLINE void Communicator::wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  try {
    work->wait(timeout_);
  } catch (const std::exception& e) {
    throw failure(what, e);
  }
}

DETTRIAL_INLINE void Communicator::broadcast(std::vector<torch::Tensor>& tensors, int root) {
  c10d::BroadcastOptions options;
  options.rootRank = root;
  run("broadcast", [&] { return backend_->broadcast(tensors, options); });
}

DETTRIAL_INLINE std::vector<torch::Tensor> Communicator::allgather(const torch::Tensor& tensor) {
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < size(); ++r) out[0].push_back(torch::empty_like(tensor));
  std::vector<torch::Tensor> in{tensor};
  run("all-gather", [&] { return backend_->allgather(out, in); });
  return out[0];
}

DETTRIAL_INLINE c10::intrusive_ptr<c10d::Work> Communicator::allgather_async(std::vector<std::vector<torch::Tensor>>& outputs,
                                                                             std::vector<torch::Tensor>& inputs) {
  try {
    return backend_->allgather(outputs, inputs);
  } catch (const std::exception& e) {
    throw failure("all-gather", e);
  }
}

DETTRIAL_INLINE void Communicator::barrier() {
  run("barrier", [&] { return backend_->barrier(); });
}

DETTRIAL_INLINE std::vector<std::int64_t> Communicator::broadcast_values(const std::vector<std::int64_t>& values) {
  std::vector<torch::Tensor> t{torch::tensor(values, torch::kLong).to(device_)};
  broadcast(t);
  const torch::Tensor host = t[0].cpu();
  return {host.data_ptr<std::int64_t>(), host.data_ptr<std::int64_t>() + host.numel()};
}

DETTRIAL_INLINE std::vector<double> Communicator::allreduce_values(const std::vector<double>& values, c10d::ReduceOp::RedOpType op) {
  std::vector<torch::Tensor> t{torch::tensor(values, torch::kDouble).to(device_)};
  allreduce(t, op);
  const torch::Tensor host = t[0].cpu();
  return {host.data_ptr<double>(), host.data_ptr<double>() + host.numel()};
}

DETTRIAL_INLINE std::vector<c10::IValue> Communicator::allgather_object(const c10::IValue& value) {
  const std::vector<char> bytes = torch::pickle_save(value);
  const torch::Tensor size = torch::tensor({static_cast<std::int64_t>(bytes.size())}, torch::kLong);
  std::vector<std::int64_t> sizes;
  std::int64_t longest = 0;
  for (const torch::Tensor& s : allgather(size.to(device_))) {
    sizes.push_back(s.cpu().item<std::int64_t>());
    longest = std::max(longest, sizes.back());
  }
  torch::Tensor padded = torch::zeros({longest}, torch::kUInt8);
  std::memcpy(padded.data_ptr<std::uint8_t>(), bytes.data(), bytes.size());
  const std::vector<torch::Tensor> all = allgather(padded.to(device_));
  std::vector<c10::IValue> out;
  out.reserve(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    const torch::Tensor host = all[r].cpu();
    const auto* data = reinterpret_cast<const char*>(host.data_ptr<std::uint8_t>());
    out.push_back(torch::pickle_load(std::vector<char>(data, data + sizes[r])));
  }
  return out;
}

DETTRIAL_INLINE Communicator::Communicator(LaunchEnvironment env, std::chrono::milliseconds timeout, const char* backend_name)
    : env_(std::move(env)), timeout_(timeout), backend_name_(backend_name) {
  // NCCL: one GPU per process, picked by the local rank (as the Context picks its device).
  if (std::string_view(backend_name_) == backend::nccl::name) device_ = torch::Device(torch::kCUDA, detail::local_gpu_index(env_));
}

DETTRIAL_INLINE DistributedError Communicator::failure(const char* what, const std::exception& e) const {
  return DistributedError("rank " + std::to_string(env_.rank) + " of " + std::to_string(env_.size) + ": " + what + " over " +
                          backend_name_ + " failed; another rank has died, hung past the " + std::to_string(timeout_.count() / 1000) +
                          " s timeout, or is unreachable (" + detail::first_line(e.what()) + ")");
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
