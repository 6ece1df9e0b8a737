// kvfs: the command-line tool. Subcommands live in cmd_*.cpp; this file only dispatches.
#include <cstdio>
#include <cstring>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "tools/commands.h"

namespace {
void Usage(FILE* out) {
  std::fputs(
      "usage: kvfs COMMAND [ARGS]\n"
      "commands:\n"
      "  run         generate a continuation:  kvfs run -m MODEL (-p TEXT | -f FILE) [-n N] ...\n"
      "  perplexity  quality of a KV format:  kvfs perplexity -m MODEL -f TEXT [-c 512] [--kv f16|q8|q4|q4k]\n"
      "              [--kv-rotate on|off] [--kl-divergence] [--chunks N] [--json]\n"
      "  bench       speed: kvfs bench -m MODEL [-p 512] [-n 128] [-d DEPTH] [-t N] [-r 3] [--json]\n"
      "              [--backend cpu|vulkan] [--device N]\n"
      "  devices     list the Vulkan devices (--device N of run, bench and perplexity)\n"
      "  tune        the fastest Vulkan settings for a device and model:  kvfs tune -m MODEL [-o FILE]\n"
      "  shaders     the compiler's statistics of a model's Vulkan matrix shaders:  kvfs shaders -m MODEL\n"
      "  inspect     print a GGUF file's metadata and tensor table:  kvfs inspect MODEL\n"
      "  status      cache status of a mounted kvfs:  kvfs status [--mount DIR] [--json]\n"
      "  bench fs    filesystem overhead:  kvfs bench fs -m MODEL [--turns 20] [--agents 10000]\n"
      "  bench resume / bench agents / bench batched   resume, many agents, batched forward pass\n"
      "  bench dispatch   a Vulkan device's cost per dispatch and barrier:  kvfs bench dispatch\n"
      "run 'kvfs COMMAND --help' for a command's options\n",
      out);
}
}  // namespace

int main(int argc, char** argv) {
  // Diagnostics go to stderr: stdout carries what a command prints for programs (generated text,
  // --token-ids, --json), which a warning must not break.
  spdlog::set_default_logger(spdlog::stderr_color_mt("kvfs"));
  if (argc < 2) {
    Usage(stderr);
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    Usage(stdout);
    return 0;
  }
  if (cmd == "inspect") return kvfs::cli::Inspect(argc - 1, argv + 1);
  if (cmd == "run") return kvfs::cli::Run(argc - 1, argv + 1);
  if (cmd == "bench") return kvfs::cli::Bench(argc - 1, argv + 1);
  if (cmd == "perplexity") return kvfs::cli::Perplexity(argc - 1, argv + 1);
  if (cmd == "status") return kvfs::cli::ShowStatus(argc - 1, argv + 1);
  if (cmd == "devices") return kvfs::cli::Devices(argc - 1, argv + 1);
  if (cmd == "tune") return kvfs::cli::Tune(argc - 1, argv + 1);
  if (cmd == "shaders") return kvfs::cli::Shaders(argc - 1, argv + 1);
  std::fprintf(stderr, "kvfs: unknown command '%s'\n", cmd.c_str());
  Usage(stderr);
  return 2;
}
