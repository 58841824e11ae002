// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The exceptions dettrial throws. Every message names the thing at fault.
#pragma once

#include <stdexcept>
#include <string>

namespace dettrial::detail {
/// The one sentence for an argument outside its rule: "<owner>: <argument> must be <rule>, not <value>"
/// (the optimizers' and schedulers' checks, as Python's constructors check them).
[[noreturn]] inline void throw_invalid_argument(const std::string& owner, const std::string& argument, const std::string& rule,
                                                const std::string& value);
}  // namespace dettrial::detail

namespace dettrial {
/// Base of every error dettrial reports; `what()` is one readable sentence.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// A broken, unreadable or inconsistent experiment configuration.
struct ConfigError : Error {
  using Error::Error;
};
/// A hyperparameter that is missing or has the wrong type.
struct HyperparameterError : Error {
  using Error::Error;
};
/// Data that cannot be read or does not have the expected shape.
struct DataError : Error {
  using Error::Error;
};
/// An image file that cannot be decoded: unreadable, truncated, corrupt, not an image, or of a kind
/// this build has no decoder for. The message names the file and the decoder's reason.
struct ImageError : DataError {
  using DataError::DataError;
};
/// A checkpoint that cannot be written or read: missing, truncated, corrupt, from another model or
/// from a newer dettrial. The message names the file and, for a mismatch, the entry.
struct CheckpointError : Error {
  using Error::Error;
};
/// A trial that breaks the contract at run time (metrics without `loss`, an unwrapped optimizer, ...).
struct TrialError : Error {
  using Error::Error;
};
/// A collective that failed or timed out: another rank died, hung or is unreachable.
struct DistributedError : Error {
  using Error::Error;
};
/// A run or experiment folder that another live process is writing into (it holds the folder's
/// lock); the message names that process's pid and host.
struct FolderInUseError : Error {
  using Error::Error;
};

[[noreturn]] inline void detail::throw_invalid_argument(const std::string& owner, const std::string& argument, const std::string& rule,
                                                        const std::string& value) {
  throw ConfigError(owner + ": " + argument + " must be " + rule + ", not " + value);
}

}  // namespace dettrial
