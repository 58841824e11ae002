// SPDX-License-Identifier: Apache-2.0
// nanoGPT's character-level Shakespeare through dettrial:
//   scripts/gpt-data && gpt --config examples/gpt/cpu.yaml
#include <dettrial/main.hpp>

#include "gpt_trial.hpp"

int main(int argc, char** argv) { return dettrial::main<gpt::GptTrial>(argc, argv); }
