// Which torch release wrote a test's fixtures: Python's torch of this LibTorch's release computes
// with the same kernels, so its numbers must be matched bit for bit; another release's within the
// tolerance each test states.
#pragma once

#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>  // TORCH_VERSION_MAJOR, _MINOR

namespace test {

/// "2.15" of "2.15.0+cu132": the release whose kernels and random draws Python used.
inline std::string release_of(const std::string& version) { return version.substr(0, version.find('.', version.find('.') + 1)); }

/// Whether the fixtures' torch (the manifest's "torch") is this LibTorch's release.
inline bool same_release(const nlohmann::json& manifest) {
  return release_of(manifest["torch"].get<std::string>()) ==
         std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
}

}  // namespace test
