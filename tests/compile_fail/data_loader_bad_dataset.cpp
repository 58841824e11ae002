// EXPECT: dettrial::DataLoader<D>: D must be a dettrial::BatchDataset
#include <dettrial/dettrial.hpp>
struct NotADataset {
  int records() const { return 3; }
};
int main() { dettrial::DataLoader<NotADataset> loader(NotADataset{}, {.batch_size = 1}); }
