// A loaded model: the GGUF mapping, hyper-parameters, weight views, tokenizer and chat template.
#pragma once

#include <memory>
#include <string>

#include "engine/core/status.h"
#include "engine/model/chat_template.h"
#include "engine/model/gguf.h"
#include "engine/model/hparams.h"
#include "engine/model/tokenizer.h"
#include "engine/model/weights.h"

namespace kvfs {

class Model {
 public:
  // Opens, validates and binds everything; errors name the file and the problem.
  // `how`: see GgufLoad (kvfsd holds a private copy; one-shot tools map the file).
  static Result<std::unique_ptr<Model>> Load(const std::string& path, GgufLoad how = GgufLoad::kMapped);
  // kPrivateCopy, unless the file is larger than the memory available now (MemAvailable): then
  // kMapped, with a warning that the file must not be changed in place while kvfsd runs.
  static GgufLoad PrivateCopyIfItFits(const std::string& path);

  const std::string& path() const { return path_; }
  const GgufFile& gguf() const { return *gguf_; }
  const HParams& hparams() const { return hparams_; }
  const ModelWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ChatTemplate& chat_template() const { return *chat_template_; }
  std::string name() const;

 private:
  Model() = default;
  std::string path_;
  std::unique_ptr<GgufFile> gguf_;
  HParams hparams_;
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
};

}  // namespace kvfs
