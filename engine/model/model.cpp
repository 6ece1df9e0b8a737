#include "engine/model/model.h"

#include <sys/stat.h>

#include <fstream>
#include <limits>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

namespace kvfs {

Result<std::unique_ptr<Model>> Model::Load(const std::string& path, GgufLoad how) {
  std::unique_ptr<Model> m(new Model());
  m->path_ = path;
  KVFS_ASSIGN_OR_RETURN(m->gguf_, GgufFile::Open(path, how));
  auto with_path = [&](const Status& s) { return s.WithContext(path); };

  auto hp = ReadHParams(*m->gguf_);
  if (!hp.ok()) return with_path(hp.status());
  m->hparams_ = *hp;
  const GgufTensor* embd = m->gguf_->FindTensor("token_embd.weight");
  if (embd == nullptr) return with_path(Corrupt("missing tensor token_embd.weight"));
  m->hparams_.n_vocab = embd->ne[1];

  auto weights = BindWeights(*m->gguf_, m->hparams_);
  if (!weights.ok()) return with_path(weights.status());
  m->weights_ = std::move(weights).value();

  auto tok = Tokenizer::FromGguf(*m->gguf_);
  if (!tok.ok()) return with_path(tok.status());
  m->tokenizer_ = std::move(tok).value();
  if (m->tokenizer_->n_vocab() > m->hparams_.n_vocab) {
    return with_path(Corrupt(fmt::format("the tokenizer has {} tokens but token_embd.weight only {} rows",
                                         m->tokenizer_->n_vocab(), m->hparams_.n_vocab)));
  }
  m->chat_template_ = std::make_unique<ChatTemplate>(ChatTemplate::FromGguf(*m->gguf_, *m->tokenizer_));
  return m;
}

GgufLoad Model::PrivateCopyIfItFits(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return GgufLoad::kPrivateCopy;  // Load says what is wrong
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") break;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    kib = 0;
  }
  if (kib <= 0 || st.st_size <= kib * 1024) return GgufLoad::kPrivateCopy;
  spdlog::warn("engine: the model ({} MiB) is larger than the memory available now ({} MiB): it is mapped, not "
               "copied, so replacing it in place (cp over it, truncate) while kvfsd runs would fault; write a new "
               "file and rename it over the old one instead",
               st.st_size >> 20, kib >> 10);
  return GgufLoad::kMapped;
}

std::string Model::name() const {
  if (auto n = gguf_->GetString("general.name")) return std::string(*n);
  return path_;
}

}  // namespace kvfs
