// libFuzzer target: the GGUF reader, then the model binding and tokenizer construction that
// consume its metadata, must reject or accept any byte string without crashing.
#include <cstddef>
#include <cstdint>
#include <span>

#include "engine/model/gguf.h"
#include "engine/model/hparams.h"
#include "engine/model/tokenizer.h"
#include "engine/model/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = kvfs::GgufFile::Parse(std::span<const uint8_t>(data, size));
  if (!file.ok()) return 0;
  const kvfs::GgufFile& f = **file;
  for (const auto& [key, value] : f.metadata()) (void)kvfs::GgufValueToString(value);
  for (const kvfs::GgufTensor& t : f.tensors()) {
    volatile uint8_t sink = t.n_bytes ? t.data[t.n_bytes - 1] : 0;  // in bounds by contract
    (void)sink;
  }
  auto hp = kvfs::ReadHParams(f);
  if (hp.ok()) {
    if (const auto* embd = f.FindTensor("token_embd.weight")) {
      hp->n_vocab = embd->ne[1];
      (void)kvfs::BindWeights(f, *hp);
    }
  }
  auto tok = kvfs::Tokenizer::FromGguf(f);
  if (tok.ok()) (void)(*tok)->Encode("Hello world! 123", true, true);
  return 0;
}
