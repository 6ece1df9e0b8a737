#include <cstdio>
#include "tools/commands.h"
namespace kvfs::cli {
int Run(int argc, char** argv) {
  std::fputs("kvfs run: not built yet\n", stderr);
  return 1;
}
}  // namespace kvfs::cli
