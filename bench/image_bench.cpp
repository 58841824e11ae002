// The image pipeline's throughput, beside torchvision's (bench/image_bench.py runs the same folders):
//   image_bench --png DIR --jpeg DIR --imagenet DIR [--quick]
// One case per process (--case NAME), so that each side's peak memory is its own:
//   png        one epoch of the PNG folder (28x28 gray): RandomCrop(28, padding=4), flip, ToFloat, Normalize
//   jpeg       one epoch of the JPEG folder (64x64 RGB): RandomResizedCrop(64), flip, ToFloat, Normalize
//   decode     the bare decode rate of each folder's files (read and decode, one thread, no transform)
//   imagenet   one epoch of the ImageNet-sized folder (bench/imagenet_jpegs.py): the guide's training
//              pipeline, RandomResizedCrop(224), flip, ToFloat, Normalize, each JPEG decoded only in
//              the crop's window; imagenet-whole: decoded whole (the same batches); imagenet-reduced:
//              at a reduced DCT scale where the window allows (opt-in); imagenet-160 and
//              imagenet-reduced-160: the same at RandomResizedCrop(160)
//   imagenet-val  the guide's validation pipeline on it: Resize(256), CenterCrop(224), ToFloat, Normalize
//   imagenet-decode  its bare decode rate, one thread (the limit, times the cores)
//   imagenet-stages  one image's time in the training pipeline, stage by stage, one thread
//   train      the example's ResNet trained on the PNG folder through the pipeline, and on the same
//              images decoded beforehand into a tensor: whether training waits on data
// Prints one JSON object per measurement (bench/table.py makes the table).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "image_folder/image_folder_trial.hpp"

namespace vision = dettrial::vision;
using Clock = std::chrono::steady_clock;

namespace {

/// This process's resident memory now and at its peak, in MiB.
double rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  double kib = 0;
  while (status >> key)
    if (key == "VmRSS:") {
      status >> kib;
      break;
    }
  return kib / 1024.0;
}
double peak_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

void print(const std::string& name, double value, const std::string& unit, nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json row{{"name", name}, {"value", value}, {"unit", unit}, {"spread", 1.0}};
  row.update(extra);
  std::cout << row.dump() << std::endl;
}

/// One epoch of `loader`: images per second, and the resident memory at a tenth and at the end.
template <class Loader>
void epoch(const std::string& name, const Loader& loader, std::int64_t limit) {
  std::int64_t images = 0, batches = 0;
  double rss_tenth = 0;
  const std::int64_t total = std::min(limit, loader.size());
  const auto start = Clock::now();
  for (auto& [x, y] : loader) {
    images += x.size(0);
    if (++batches == std::max<std::int64_t>(1, total / 10)) rss_tenth = rss_mib();
    if (batches == total) break;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  print(name, static_cast<double>(images) / seconds, "images/s",
        {{"peak_mib", peak_mib()},
         {"rss_tenth_mib", rss_tenth},
         {"rss_end_mib", rss_mib()},
         {"workers", loader.workers()},
         {"images", images}});
}

/// An ImageFolder without load_window: every file decoded whole, for the side-by-side row.
struct WholeFiles {
  vision::ImageFolder folder;
  std::int64_t size() const { return folder.size(); }
  std::int64_t label(std::int64_t i) const { return folder.label(i); }
  std::string name(std::int64_t i) const { return folder.name(i); }
  vision::Image load(std::int64_t i, vision::ImageMode mode) const { return folder.load(i, mode); }
};

const std::vector<double> imagenet_mean{0.485, 0.456, 0.406}, imagenet_std{0.229, 0.224, 0.225};

vision::Compose<vision::RandomCrop, vision::RandomHorizontalFlip, vision::ToFloat, vision::Normalize> png_pipeline() {
  return vision::Compose(vision::RandomCrop(28, {.padding = {4}}), vision::RandomHorizontalFlip{}, vision::ToFloat{},
                         vision::Normalize({0.2860}, {0.3530}));
}

}  // namespace

int main(int argc, char** argv) {
  // The process as a trial's runs (dettrial::main applies its Context's settings): here only glibc's
  // malloc keeping freed memory; threads, determinism and seeds are left as they are.
  dettrial::ProcessSettings{}.apply();
  std::string png, jpeg, imagenet, which = "png";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--png" && i + 1 < argc) png = argv[++i];
    else if (arg == "--jpeg" && i + 1 < argc) jpeg = argv[++i];
    else if (arg == "--imagenet" && i + 1 < argc) imagenet = argv[++i];
    else if (arg == "--case" && i + 1 < argc) which = argv[++i];
    else if (arg == "--quick") quick = true;
  }
  const std::int64_t limit = quick ? 20 : std::numeric_limits<std::int64_t>::max();
  if (which == "png") {
    const vision::ImageDataset data(vision::ImageFolder(png), png_pipeline(), {.mode = vision::ImageMode::gray});
    epoch("image pipeline, PNG folder 28x28: dettrial", dettrial::DataLoader(data, {.batch_size = 64, .shuffle = true, .seed = 1}), limit);
  } else if (which == "jpeg") {
    const vision::ImageDataset data(vision::ImageFolder(jpeg),
                                    vision::Compose(vision::RandomResizedCrop(64), vision::RandomHorizontalFlip{}, vision::ToFloat{},
                                                    vision::Normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225})));
    epoch("image pipeline, JPEG folder 64x64: dettrial", dettrial::DataLoader(data, {.batch_size = 64, .shuffle = true, .seed = 1}), limit);
  } else if (which == "decode") {
    // The decoder alone, one thread: read each file and decode it, nothing else. Times the cores
    // this process may use, it is the most any pipeline could deliver here.
    const int cores = dettrial::CoreCount::of_this_process().available;
    for (const auto& [label, dir, mode] :
         {std::tuple{"PNG folder 28x28", png, vision::ImageMode::gray}, std::tuple{"JPEG folder 64x64", jpeg, vision::ImageMode::rgb}}) {
      const vision::ImageFolder folder(dir);
      const std::int64_t n = std::min<std::int64_t>(folder.size(), quick ? 500 : 20000);
      const auto start = Clock::now();
      std::int64_t checksum = 0;
      for (std::int64_t i = 0; i < n; ++i) checksum += folder.load(i, mode).pixels[0];
      const double rate = static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - start).count();
      print(std::string("image decode alone, ") + label + ": one thread x " + std::to_string(cores) + " cores (the limit)", rate * cores,
            "images/s", {{"one_thread", rate}, {"checksum", checksum}});
    }
  } else if (which == "imagenet" || which == "imagenet-whole" || which == "imagenet-reduced" || which == "imagenet-160" ||
             which == "imagenet-reduced-160") {
    // imagenet[-whole|-reduced][-160]: the guide's training pipeline at 224 (or 160, the
    // low-resolution phase of fast ImageNet recipes), the crop's window decoded; -reduced with
    // reduced_decode, -whole through a source without load_window (the same batches as the window's).
    const std::int64_t size = which.ends_with("-160") ? 160 : 224;
    const bool reduce = which.find("-reduced") != std::string::npos, whole = which.find("-whole") != std::string::npos;
    const auto pipeline = vision::Compose(vision::RandomResizedCrop(size, {.reduced_decode = reduce}), vision::RandomHorizontalFlip{},
                                          vision::ToFloat{}, vision::Normalize(imagenet_mean, imagenet_std));
    const std::string name = "image pipeline, ImageNet-sized JPEGs, RandomResizedCrop(" + std::to_string(size) + "): dettrial, " +
                             (whole    ? "decoded whole"
                              : reduce ? "reduced_decode (not torchvision's pixels)"
                                       : "the crop's window decoded");
    const dettrial::DataLoaderOptions options{.batch_size = 64, .shuffle = true, .seed = 1};
    if (whole) epoch(name, dettrial::DataLoader(vision::ImageDataset(WholeFiles{vision::ImageFolder(imagenet)}, pipeline), options), limit);
    else epoch(name, dettrial::DataLoader(vision::ImageDataset(vision::ImageFolder(imagenet), pipeline), options), limit);
  } else if (which == "imagenet-val") {
    const vision::ImageDataset data(
        vision::ImageFolder(imagenet),
        vision::Compose(vision::Resize(256), vision::CenterCrop(224), vision::ToFloat{}, vision::Normalize(imagenet_mean, imagenet_std)));
    epoch("image pipeline, ImageNet-sized JPEGs, Resize(256) CenterCrop(224): dettrial",
          dettrial::DataLoader(data, {.batch_size = 64, .seed = 1}), limit);
  } else if (which == "imagenet-decode") {
    const int cores = dettrial::CoreCount::of_this_process().available;
    const vision::ImageFolder folder(imagenet);
    const std::int64_t n = std::min<std::int64_t>(folder.size(), quick ? 100 : 2000);
    const auto start = Clock::now();
    std::int64_t checksum = 0;
    for (std::int64_t i = 0; i < n; ++i) checksum += folder.load(i, vision::ImageMode::rgb).pixels[0];
    const double rate = static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - start).count();
    print("image decode alone, ImageNet-sized JPEGs: one thread x " + std::to_string(cores) + " cores (the limit)", rate * cores,
          "images/s", {{"one_thread", rate}, {"checksum", checksum}});
  } else if (which == "imagenet-stages") {
    // Where one image's time goes in the training pipeline, one thread: the window decoded, the
    // whole image decoded (for comparison), the resize to 224, the flip, the write into the batch,
    // and the write that mirrors as it goes (what ImageDataset does with a last flip) instead of both.
    const vision::ImageFolder folder(imagenet);
    const auto pipeline = vision::Compose(vision::RandomResizedCrop(224), vision::RandomHorizontalFlip{1.0}, vision::ToFloat{},
                                          vision::Normalize(imagenet_mean, imagenet_std));
    const vision::RandomResizedCrop crop(224);
    const std::int64_t n = std::min<std::int64_t>(folder.size(), quick ? 50 : 1000);
    std::vector<float> out(3 * 224 * 224);
    double window_s = 0, whole_s = 0, resize_s = 0, flip_s = 0, write_s = 0, mirrored_write_s = 0;
    std::int64_t window_pixels = 0, image_pixels = 0;
    const auto seconds = [](Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); };
    for (std::int64_t i = 0; i < n; ++i) {
      vision::RecordRandom random(1, 0, i);
      auto t = Clock::now();
      vision::Image window = folder.load_window(i, vision::ImageMode::rgb, [&](std::int64_t h, std::int64_t w) {
        image_pixels += h * w;
        return crop.window_in(h, w, random).value();
      });
      window_s += seconds(t);
      window_pixels += window.height * window.width;
      t = Clock::now();
      static_cast<void>(folder.load(i, vision::ImageMode::rgb));
      whole_s += seconds(t);
      t = Clock::now();
      vision::Image resized = crop.finish_window(std::move(window));
      resize_s += seconds(t);
      const vision::PreparedImage to_mirror{resized, /*mirrored=*/true};  // a copy, not timed
      t = Clock::now();
      pipeline.write(to_mirror, out.data(), random);
      mirrored_write_s += seconds(t);
      t = Clock::now();
      resized = vision::RandomHorizontalFlip{1.0}(std::move(resized), random);
      flip_s += seconds(t);
      t = Clock::now();
      pipeline.write(resized, out.data(), random);
      write_s += seconds(t);
    }
    const auto ms = [&](double s) { return 1000.0 * s / static_cast<double>(n); };
    print("ImageNet training pipeline, one image, one thread: the crop's window decoded", ms(window_s), "ms",
          {{"window_share_of_pixels", static_cast<double>(window_pixels) / static_cast<double>(image_pixels)}});
    print("ImageNet training pipeline, one image, one thread: the whole image decoded", ms(whole_s), "ms");
    print("ImageNet training pipeline, one image, one thread: the window resized to 224x224", ms(resize_s), "ms");
    print("ImageNet training pipeline, one image, one thread: the flip", ms(flip_s), "ms");
    print("ImageNet training pipeline, one image, one thread: ToFloat and Normalize into the batch", ms(write_s), "ms");
    print("ImageNet training pipeline, one image, one thread: the flip done by the write (ImageDataset's way), and ToFloat and Normalize",
          ms(mirrored_write_s), "ms");
  } else if (which == "train") {
    // The example's ResNet-8 on the PNG folder: batches from the pipeline (decoded and augmented on
    // the workers while the model trains) against the same images decoded once into a tensor.
    torch::manual_seed(0);
    const std::int64_t batches = quick ? 5 : 150;
    const vision::ImageDataset data(vision::ImageFolder(png), png_pipeline(), {.mode = vision::ImageMode::gray});
    const dettrial::DataLoader pipeline(data, {.batch_size = 128, .shuffle = true, .seed = 1});
    auto [all_x, all_y] = data.get_batch(torch::arange(0, batches * 128, torch::kLong));
    const dettrial::DataLoader decoded(dettrial::TensorDataset(all_x, all_y), {.batch_size = 128, .shuffle = true, .seed = 1});
    const auto train = [&](const auto& loader) {
      image_folder::ResNet model(1, 10, 1, 16);
      torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      std::int64_t n = 0, images = 0;
      const auto start = Clock::now();
      for (auto& [x, y] : loader) {
        sgd.zero_grad();
        torch::cross_entropy_loss(model->forward(x), y).backward();
        sgd.step();
        images += x.size(0);
        if (++n == batches) break;
      }
      return static_cast<double>(images) / std::chrono::duration<double>(Clock::now() - start).count();
    };
    const double from_decoded = train(decoded);
    const double from_pipeline = train(pipeline);
    print("image example training, ResNet-8 on PNG: batches from the pipeline", from_pipeline, "images/s",
          {{"workers", pipeline.workers()}, {"batches", batches}});
    print("image example training, ResNet-8 on PNG: batches decoded beforehand", from_decoded, "images/s", {{"batches", batches}});
  } else {
    std::cerr << "image_bench: unknown --case " << which << "\n";
    return 2;
  }
}
