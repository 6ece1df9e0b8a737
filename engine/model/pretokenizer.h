// Pre-tokenizers of byte-level BPE vocabularies: split text into words before the merges
// run, as the model's original tokenizer did with its regular expressions.
//
// Each pre-tokenizer is a list of stages named after llama.cpp's regex lists (llama-vocab.cpp)
// and applied the same way: every stage splits each piece left by the previous stage into
// the stage pattern's matches and the gaps between them. No regex engine is used; every
// pattern is a hand-written matcher over code points that reproduces the leftmost-first,
// backtracking semantics the original pattern has, including llama.cpp's quirks (the
// "collapsed" category view of std::regex for \p{..} patterns; see pretokenizer.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"

namespace kvfs {

enum class PreTokenizerKind {
  kDefault,        // tokenizer.ggml.pre missing or "default"
  kGpt2,           // gpt-2, mpt, olmo, jais, phi-2, ...
  kLlama3,         // llama-bpe / llama3 (and dbrx, smaug-bpe: same pattern)
  kQwen2,          // qwen2, stablelm2, ...
  kDeepseekLlm,
  kDeepseekCoder,
  kFalcon,
  kStarcoder,      // starcoder, refact, command-r, smollm, ...
  kPoro,           // poro-chat, bloom, gpt3-finnish
  kViking,
};

struct PreTokenizerConfig {
  PreTokenizerKind kind = PreTokenizerKind::kDefault;
  // llama.cpp's ignore_merges: a word that is already a vocabulary entry is emitted whole.
  bool ignore_merges = false;
  // The add_bos_token default when the metadata does not say (llama.cpp sets it per type).
  bool default_add_bos = false;
};

// Maps a tokenizer.ggml.pre value ("" when absent) to its pre-tokenizer.
// Errors: Unsupported naming the value when this build has no such pre-tokenizer.
Result<PreTokenizerConfig> PreTokenizerFromName(std::string_view name);

// Splits UTF-8 text into words and maps each word's bytes to the GPT-2 byte-level alphabet,
// ready for the BPE merges. Invalid UTF-8 bytes become U+FFFD first (as in llama.cpp).
// Words are appended to `out` (cleared first).
void PreTokenize(PreTokenizerKind kind, std::string_view text, std::vector<std::string>& out);

}  // namespace kvfs
