// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Determined's `determined.pytorch.samplers` chain for loaders and batch samplers a trial
/// writes itself: `samplers::repeat`, `distribute` and `skip` as range-v3 views with O(1) random
/// access, and `BatchSampler::slices`, dettrial's own loader's chain as such a view. Opt-in, next to
/// <dettrial/dettrial.hpp> (which has the sampler functions and `samplers::ReproducibleShuffleSampler`):
/// a trial that reads none of the views does not compile range-v3.
#pragma once

#include "dettrial.hpp"

#include "data/sampler_views.hpp"
