// SPDX-License-Identifier: Apache-2.0
// Text from a trained GPT example (nanoGPT's sample.py): the trial rebuilt from a checkpoint (its
// config and vocabulary, its weights), then tokens sampled after a prompt.
//   gpt_sample CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]
// CHECKPOINT: a checkpoint directory, or a run's checkpoints folder (its latest is taken).
#include <cstdint>
#include <iostream>
#include <string>

#include <dettrial/dettrial.hpp>

#include "gpt_trial.hpp"

int main(int argc, char** argv) {
  std::string checkpoint, prompt = "\n";
  std::int64_t tokens = 500, top_k = 200;
  std::uint64_t seed = 1337;
  double temperature = 0.8;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw dettrial::ConfigError(a + " needs a value");
        return argv[++i];
      };
      if (a == "--prompt") prompt = value();
      else if (a == "--tokens") tokens = std::stoll(value());
      else if (a == "--temperature") temperature = std::stod(value());
      else if (a == "--top-k") top_k = std::stoll(value());
      else if (a == "--seed") seed = std::stoull(value());
      else if (!a.starts_with("--") && checkpoint.empty()) checkpoint = a;
      else throw dettrial::ConfigError("unknown argument '" + a + "'");
    }
    if (checkpoint.empty())
      throw dettrial::ConfigError("usage: gpt_sample CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]");
    auto loaded = dettrial::load_trial_from_checkpoint_path<gpt::GptTrial>(checkpoint);
    std::cout << loaded.trial().sample(prompt, tokens, seed, temperature, top_k) << "\n";
    return 0;
  } catch (const std::logic_error& e) {  // std::stoll's and std::stod's
    std::cerr << "gpt_sample: a number was expected: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "gpt_sample: " << e.what() << "\n";
  }
  return 1;
}
