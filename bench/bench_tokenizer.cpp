// Tokenizer speed: encode 100 KB of the shared WikiText excerpt with several vocabularies and
// print ms and MB/s (median of 5). Usage: bench_tokenizer [SHARED_DIR]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/gguf.h"
#include "engine/model/tokenizer.h"

int main(int argc, char** argv) {
  const std::string shared = argc > 1 ? argv[1] : "../shared";
  std::ifstream in(shared + "/corpus/wiki.test.head256k.txt", std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "bench_tokenizer: cannot read the corpus under %s\n", shared.c_str());
    return 2;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str().substr(0, 100 * 1024);
  std::printf("| vocab | tokens | median ms | MB/s |\n|---|---|---|---|\n");
  for (const char* name : {"llama-spm", "gpt-2", "deepseek-llm", "mpt", "falcon"}) {
    auto gguf = kvfs::GgufFile::Open(shared + "/models/vocab/ggml-vocab-" + name + ".gguf");
    if (!gguf.ok()) continue;
    auto tok = kvfs::Tokenizer::FromGguf(**gguf);
    if (!tok.ok()) continue;
    std::vector<double> ms;
    size_t n = 0;
    for (int r = 0; r < 5; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      n = (*tok)->Encode(text, false, false).size();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("| %s | %zu | %.1f | %.1f |\n", name, n, ms[2], text.size() / 1e3 / ms[2]);
  }
  return 0;
}
