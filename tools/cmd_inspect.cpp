// kvfs inspect MODEL: metadata and tensor table of a GGUF file.
#include <cstdio>
#include <string>

#include <spdlog/fmt/fmt.h>

#include "engine/model/gguf.h"
#include "tools/commands.h"

namespace kvfs::cli {

int Inspect(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help") {
    std::fputs("usage: kvfs inspect MODEL.gguf\n", argc == 2 ? stdout : stderr);
    return argc == 2 ? 0 : 2;
  }
  if (argv[1][0] == '-' && argv[1][1] != '\0') {  // (a file named so: ./-x)
    std::fprintf(stderr, "kvfs inspect: unknown option %s (usage: kvfs inspect MODEL.gguf)\n", argv[1]);
    return 2;
  }
  auto file = GgufFile::Open(argv[1]);
  if (!file.ok()) {
    std::fprintf(stderr, "kvfs inspect: %s\n", file.status().message().c_str());
    return 2;
  }
  const GgufFile& f = **file;
  fmt::print("GGUF v{}  alignment {}  data at byte {}  {} metadata entries  {} tensors\n",
             f.version(), f.alignment(), f.data_offset(), f.metadata().size(), f.tensors().size());
  fmt::print("\nmetadata:\n");
  for (const auto& [key, value] : f.metadata()) {
    fmt::print("  {:<44} {:<7} {}\n", key, GgufValueTypeName(value.type), GgufValueToString(value));
  }
  fmt::print("\ntensors:\n");
  fmt::print("  {:<36} {:<6} {:>30} {:>14} {:>12}\n", "name", "type", "shape (ne0 first)", "offset", "bytes");
  uint64_t total = 0;
  for (const GgufTensor& t : f.tensors()) {
    std::string shape;
    for (int d = 0; d < t.n_dims; ++d) shape += (d ? " x " : "") + std::to_string(t.ne[d]);
    const GgmlTypeTraits* traits = GgmlTypeInfo(static_cast<uint32_t>(t.type));
    fmt::print("  {:<36} {:<6} {:>30} {:>14} {:>12}\n", t.name, traits->name, shape, t.file_offset,
               t.n_bytes);
    total += t.n_bytes;
  }
  fmt::print("\n{} tensors, {} bytes ({:.1f} MiB) of weights\n", f.tensors().size(), total,
             total / 1048576.0);
  return 0;
}

}  // namespace kvfs::cli
