// EXPECT: <dettrial/src.hpp> belongs to separate-compilation mode: define DETTRIAL_SEPARATE_COMPILATION in every translation unit
// The source file of the compiled part, in a program that is header-only.
#include <dettrial/src.hpp>
int main() {}
