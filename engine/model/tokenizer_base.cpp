// Vocabulary lookups shared by every tokenizer implementation.
#include <algorithm>

#include "engine/model/tokenizer.h"

namespace kvfs {

void Tokenizer::BuildIndex() {
  index_.clear();
  index_.reserve(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) index_.emplace(tokens_[i], static_cast<TokenId>(i));
}

TokenId Tokenizer::Find(std::string_view text) const {
  auto it = index_.find(text);
  return it == index_.end() ? kNoToken : it->second;
}

bool Tokenizer::IsEog(TokenId id) const {
  return std::find(eog_.begin(), eog_.end(), id) != eog_.end();
}

}  // namespace kvfs
