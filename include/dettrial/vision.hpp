// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Image data for dettrial: JPEG and PNG decoding, torchvision's ImageFolder and CIFAR
/// readers, torchvision's transforms and ResNets, and the ImageDataset that a DataLoader decodes and augments
/// in parallel, straight into batch tensors. Opt-in, next to <dettrial/dettrial.hpp>.
#pragma once

#include "dettrial.hpp"

#include "vision/auto_augment.hpp"
#include "vision/cifar.hpp"
#include "vision/decode.hpp"
#include "vision/image.hpp"
#include "vision/image_dataset.hpp"
#include "vision/image_folder.hpp"
#include "vision/image_ops.hpp"
#include "vision/mixing.hpp"
#include "vision/resnet.hpp"
#include "vision/transforms.hpp"
