// EXPECT: <dettrial/src.hpp> must be the first dettrial header of its source file
// A dettrial header before <dettrial/src.hpp> was read without its definitions.
#define DETTRIAL_SEPARATE_COMPILATION
#include <dettrial/dettrial.hpp>
#include <dettrial/src.hpp>
int main() {}
