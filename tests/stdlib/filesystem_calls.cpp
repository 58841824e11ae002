// A program that links LibTorch and makes the std::filesystem calls dettrial's checkpoints make
// (create_directories, status, rename, directory_iterator, remove_all, ...). Built twice: linked
// through dettrial::dettrial, and against LibTorch alone as the control that shows what binds
// where without dettrial's link order. tests/stdlib/bindings.sh reads the dynamic linker's bindings.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <torch/torch.h>
#ifdef DETTRIAL_STDLIB_CHECK_WITH_DETTRIAL
#include <dettrial/dettrial.hpp>
#endif

namespace fs = std::filesystem;

static int fail(const std::string& what) {
  std::fprintf(stderr, "filesystem_calls: %s\n", what.c_str());
  return 1;
}

int main(int argc, char** argv) {
  const fs::path root = fs::absolute(argc > 1 ? fs::path(argv[1]) : fs::temp_directory_path() / "dettrial-filesystem-calls");
  std::error_code ec;
  fs::remove_all(root, ec);
  fs::create_directories(root / "a" / "b");
  torch::save(torch::arange(6), (root / "a" / "b" / "t.pt").string());
  if (fs::status(root / "a" / "b" / "t.pt").type() != fs::file_type::regular) return fail("status of a written file");
  fs::rename(root / "a", root / "c");
  if (fs::exists(root / "a") || !fs::is_directory(root / "c" / "b")) return fail("rename of a directory");
  fs::copy_file(root / "c" / "b" / "t.pt", root / "copy.pt");
  torch::Tensor back;
  torch::load(back, (root / "copy.pt").string());
  if (!back.equal(torch::arange(6))) return fail("the copied tensor differs");
  int entries = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root)) entries += entry.is_regular_file() ? 1 : 0;
  if (entries != 2) return fail("recursive_directory_iterator saw " + std::to_string(entries) + " files, not 2");
#ifdef DETTRIAL_STDLIB_CHECK_WITH_DETTRIAL
  // A checkpoint written and deleted as a trial's retention does.
  {
    dettrial::CheckpointWriter writer(root / "checkpoints", "0b7e2c56-0000-4000-8000-000000000001");
    writer.add_file("state.bin", "bytes");
    writer.commit({{"uuid", "0b7e2c56-0000-4000-8000-000000000001"}, {"sequence", 1}});
  }
  dettrial::CheckpointInfo written;
  written.uuid = "0b7e2c56-0000-4000-8000-000000000001";
  written.path = root / "checkpoints" / written.uuid;
  if (!fs::exists(written.path / "metadata.json") || !fs::exists(written.path / "state.bin"))
    return fail("the checkpoint was not committed");
  dettrial::delete_checkpoint(written);
  if (fs::exists(written.path) || !fs::is_empty(root / "checkpoints")) return fail("delete_checkpoint left the checkpoint");
#endif
  const auto removed = fs::remove_all(root);
  if (removed < 5 || fs::exists(root)) return fail("remove_all removed " + std::to_string(removed) + " entries");
  std::printf("filesystem calls ok\n");
  return 0;
}
