// Engine: shared prefixes (.prefixes/): pinned once in the pool, recorded in the store, shared
// by every agent whose context starts with them.
#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "engine/runtime/engine_impl.h"

namespace kvfs {

using engine_internal::kPrefixDomain;

std::vector<TokenId> Engine::PrefixTokens(std::string_view text) const {
  // A chat template's markup starts with the BOS token's text ("<s>[INST] ..."), which an agent's
  // context gets from the tokenizer, not from its text: a prefix spelled with it is the same
  // prefix, encoded as the context is.
  const Tokenizer& tok = model_->tokenizer();
  if (tok.add_bos() && tok.bos() != kNoToken) {
    const std::string_view bos_text = tok.token_text(tok.bos());
    if (!bos_text.empty() && text.starts_with(bos_text)) text.remove_prefix(bos_text.size());
  }
  return tok.Encode(text, true, true);
}

int64_t Engine::PinnedPrefixBytes(const std::string& except, int64_t more_blocks) {
  auto format = FormatFor(DefaultSettings());
  if (!format.ok()) return 0;
  const int64_t block_bytes = KvLayoutFor(model_->hparams(), *format, options_.block_tokens).block_bytes();
  // Sets: prefixes with a common start share their first blocks.
  std::set<BlockHash> blocks;
  std::map<uint32_t, std::pair<std::set<BlockHash>, int64_t>> copies;  // format -> blocks, bytes of one
  std::lock_guard lock(mu_);
  for (const auto& [name, p] : prefixes_) {
    if (name == except) continue;
    blocks.insert(p.blocks.begin(), p.blocks.end());
    for (const auto& [id, copy] : p.other_formats) {
      copies[id].first.insert(copy.blocks.begin(), copy.blocks.end());
      copies[id].second = copy.block_bytes;
    }
  }
  int64_t bytes = (static_cast<int64_t>(blocks.size()) + more_blocks) * block_bytes;
  for (const auto& [id, copy] : copies) bytes += static_cast<int64_t>(copy.first.size()) * copy.second;
  return bytes;
}

kvfs::Status Engine::PrefixPinFits(const std::string& except, int64_t more_blocks, int64_t more_bytes) {
  const int64_t budget = counters_.memory_budget_bytes;
  if (budget <= 0) return kvfs::Status::Ok();
  const int64_t pinned = PinnedPrefixBytes(except, more_blocks) + more_bytes;
  if (pinned <= budget / 2) return kvfs::Status::Ok();
  return kvfs::Status(StatusCode::kNoSpace,
                      fmt::format("prefixes would pin {} bytes of the KV budget of {} bytes: at most half of it may be "
                                  "pinned, so that turns have room (raise --kv-budget, or remove a prefix)",
                                  pinned, budget));
}

Result<std::vector<PoolBlock*>> Engine::PinPrefix(Prefix& p, PrefixSources* sources) {
  KVFS_ASSIGN_OR_RETURN(KvFormat format, FormatFor(DefaultSettings()));
  p.blocks.clear();
  p.other_formats.clear();
  const int64_t B = options_.block_tokens;
  if (static_cast<int64_t>(p.tokens.size()) > n_ctx_) return OutOfRange("the prefix is longer than the context");
  if (static_cast<int64_t>(p.tokens.size()) < B) {
    spdlog::warn("engine: a prefix of {} tokens is shorter than one KV block ({} tokens): agents share whole "
                 "blocks, so it saves no prefill",
                 p.tokens.size(), B);
  }
  return PinPrefixBlocks(p.tokens, format, &p.blocks, sources);
}

Result<std::vector<PoolBlock*>> Engine::PinPrefixBlocks(std::span<const TokenId> tokens, const KvFormat& format,
                                                        std::vector<BlockHash>* blocks, PrefixSources* sources) {
  const int64_t B = options_.block_tokens;
  const int64_t full = static_cast<int64_t>(tokens.size()) / B;
  const KvLayout layout = KvLayoutFor(model_->hparams(), format, B);
  std::optional<SequenceKv> seq(std::in_place, layout, n_ctx_, *pool_);
  std::vector<PoolBlock*> held;
  auto undo = [&](kvfs::Status why) -> kvfs::Status {
    seq.reset();  // its references go first, so the blocks can be dropped
    for (PoolBlock* b : held) pool_->Release(b);
    UnpinBlocks(*blocks, nullptr, nullptr);
    blocks->clear();
    return why;
  };
  BlockHash parent;
  for (int64_t i = 0; i < full; ++i) {
    const std::span<const TokenId> span(tokens.data() + i * B, static_cast<size_t>(B));
    const BlockHash h = ChainHash(parent, span, fingerprint_, format, kPrefixDomain);
    PoolBlock* b = pool_->Acquire(h);
    if (b != nullptr) {
      if (sources) ++sources->cached;
    } else if ((b = LoadBlock(h, layout)) != nullptr) {  // stored by an earlier run
      if (sources) ++sources->loaded;
    }
    if (b != nullptr) {
      seq->SetBlock(i, b);
      seq->SetTokens((i + 1) * B);
    } else {
      SequenceStep step{&*seq, span, false};
      Logits logits;
      const kvfs::Status st = backend_->Forward(std::span<const SequenceStep>(&step, 1), logits);
      NoteBackendHealth();
      if (!st.ok()) return undo(st);
      seq->NameBlock(i, h);
      if (sources) ++sources->prefilled;
    }
    pool_->Pin(h);
    blocks->push_back(h);
    PoolBlock* mine = seq->block(i);
    pool_->Retain(mine);
    held.push_back(mine);
    parent = h;
  }
  return held;
}

std::vector<std::string> Engine::PrefixesToCopy(const KvFormat& format, std::span<const TokenId> context) {
  std::vector<std::string> names;
  auto default_format = FormatFor(DefaultSettings());
  const uint32_t id = KvFormatId(format);
  if (!default_format.ok() || KvFormatId(*default_format) == id) return names;  // pinned with the prefix
  const size_t B = static_cast<size_t>(options_.block_tokens);
  std::vector<std::pair<std::string, int64_t>> candidates;  // name, full blocks
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, p] : prefixes_) {
      const size_t full = p.tokens.size() / B * B;  // (the context's last token is always computed)
      if (p.blocks.empty() || p.other_formats.count(id) || full == 0 || full >= context.size() ||
          !std::equal(p.tokens.begin(), p.tokens.begin() + static_cast<std::ptrdiff_t>(full), context.begin()))
        continue;
      candidates.emplace_back(name, static_cast<int64_t>(full / B));
    }
  }
  // Copies count against the prefixes' half of the budget too; one that would not fit is not
  // made (agents in this format then prefill the prefix themselves), and warned of once.
  const int64_t block_bytes = KvLayoutFor(model_->hparams(), format, options_.block_tokens).block_bytes();
  for (const auto& [name, blocks] : candidates) {
    const kvfs::Status fits = PrefixPinFits({}, 0, blocks * block_bytes);
    if (fits.ok()) {
      names.push_back(name);
      continue;
    }
    std::lock_guard lock(mu_);
    auto it = prefixes_.find(name);
    if (it != prefixes_.end() && it->second.formats_not_copied.insert(id).second)
      spdlog::warn("engine: prefix {} is not shared in KV format {}: its copy would not fit ({})", name, format.Name(),
                   fits.message());
  }
  return names;
}

void Engine::CopyBlocksToPrefixes(const ActiveTurn& turn, const AgentRecord& a) {
  if (turn.prefix_copies.empty()) return;
  const uint32_t id = KvFormatId(a.format);
  const size_t B = static_cast<size_t>(options_.block_tokens);
  for (const std::string& name : turn.prefix_copies) {
    std::vector<TokenId> tokens;
    auto same_prefix = [&](const Prefix& p) {
      return !p.other_formats.count(id) && p.tokens.size() / B * B == tokens.size() &&
             std::equal(tokens.begin(), tokens.end(), p.tokens.begin());
    };
    {
      std::lock_guard lock(mu_);
      auto it = prefixes_.find(name);
      if (it == prefixes_.end() || it->second.other_formats.count(id)) continue;
      tokens.assign(it->second.tokens.begin(), it->second.tokens.begin() + it->second.tokens.size() / B * B);
    }
    if (tokens.size() > turn.context.size() || tokens.size() > static_cast<size_t>(turn.seq->n_tokens()) ||
        !std::equal(tokens.begin(), tokens.end(), turn.context.begin()))
      continue;  // (replaced meanwhile)
    // Copies, named in the prefix's domain: the turn's own blocks stay the agent's.
    std::vector<BlockHash> blocks;
    BlockHash parent;
    bool copied = true;
    for (size_t i = 0; i < tokens.size() / B; ++i) {
      const BlockHash h =
          ChainHash(parent, std::span<const TokenId>(tokens.data() + i * B, B), fingerprint_, a.format, kPrefixDomain);
      parent = h;
      // Pinned while held: an unreferenced block may be evicted or erased by another thread.
      PoolBlock* held = pool_->Hold(h);  // (no hit counted: this is no turn's lookup)
      if (held == nullptr) {
        const PoolBlock* source = turn.seq->block(static_cast<int64_t>(i));
        auto fresh = pool_->Allocate(source->bytes);
        if (!fresh.ok()) {
          copied = false;  // no room now: the next agent in this format that computes it copies it
          break;
        }
        std::memcpy((*fresh)->data, source->data, static_cast<size_t>(source->bytes));
        held = pool_->Name(*fresh, h);
      }
      pool_->Pin(h);
      pool_->Release(held);
      blocks.push_back(h);
    }
    // Checked again: another turn's copy or a new prefix may have been pinned since it began.
    if (copied && !blocks.empty())
      copied = PrefixPinFits({}, 0, static_cast<int64_t>(blocks.size()) * turn.seq->block(0)->bytes).ok();
    bool kept = false;
    if (copied) {
      std::lock_guard lock(mu_);
      auto it = prefixes_.find(name);
      if (it != prefixes_.end() && same_prefix(it->second)) {
        it->second.other_formats[id] = Prefix::FormatCopy{blocks, turn.seq->block(0)->bytes};
        kept = true;
      }
    }
    if (!kept) {
      UnpinBlocks(blocks, nullptr, nullptr);
      continue;
    }
    spdlog::info("engine: prefix {} is shared in KV format {} from now on ({} blocks, computed by agent {})", name,
                 a.format.Name(), blocks.size(), a.name);
  }
}

void Engine::UnpinBlocks(std::span<const BlockHash> blocks, const std::set<BlockHash>* others,
                         store::EraseReport* report) {
  std::set<BlockHash> named;
  if (others == nullptr) {
    named = NamedBlocks(nullptr, /*with_prefixes=*/false);
    others = &named;
  }
  for (const BlockHash& h : blocks) {
    pool_->Unpin(h);
    if (others->count(h)) {
      if (report) ++report->blocks_kept_shared;
    } else if (pool_->Drop(h)) {
      if (report) ++report->blocks_freed;
    }
  }
}

store::EraseReport Engine::UnpinPrefix(const Prefix& p) {
  store::EraseReport report;
  const std::set<BlockHash> others = NamedBlocks(nullptr, /*with_prefixes=*/false);
  UnpinBlocks(p.blocks, &others, &report);
  for (const auto& [id, copy] : p.other_formats) UnpinBlocks(copy.blocks, &others, &report);
  return report;
}

Status Engine::PersistPrefix(const std::string& name, const Prefix& p, std::vector<PoolBlock*> held,
                             store::EraseReport* replaced) {
  CommitJob job;
  job.held = std::move(held);  // released by the store thread after the write
  auto format = FormatFor(DefaultSettings());
  if (!store_ || !format.ok()) {
    for (PoolBlock* b : job.held) pool_->Release(b);
    return format.status();
  }
  const KvLayout layout = KvLayoutFor(model_->hparams(), *format, options_.block_tokens);
  store::PrefixRecord record;
  record.name = name;
  record.owner_uid = p.owner_uid;
  record.text = p.text;
  record.model_fingerprint = fingerprint_;
  record.kv_format = format->Name();
  record.block_size = static_cast<uint32_t>(options_.block_tokens);
  record.blocks = p.blocks;
  std::vector<store::NewBlock> fresh;
  for (size_t i = 0; i < p.blocks.size(); ++i) {
    if (store_->HasBlock(p.blocks[i])) continue;
    // Pinned and retained: immutable and alive until the store thread is done with them.
    fresh.push_back(store::NewBlock{p.blocks[i], KvFormatId(*format), record.block_size,
                                    std::span<const uint8_t>(job.held[i]->data, static_cast<size_t>(layout.block_bytes()))});
  }
  job.run = [this, &record, &fresh, replaced]() -> kvfs::Status {
    kvfs::Status st = store_->CommitPrefix(record, fresh, replaced);
    if (st.ok())
      for (const BlockHash& h : record.blocks) pool_->MarkPersisted(h);
    return st;
  };
  return CommitNow(std::move(job));
}

Result<Engine::Prefix> Engine::PinAndPersistPrefix(const std::string& name, std::string text, uint32_t owner_uid,
                                                   store::EraseReport* replaced) {
  Prefix p;
  p.tokens = PrefixTokens(text);
  p.text = std::move(text);
  p.owner_uid = owner_uid;
  KVFS_RETURN_IF_ERROR(PrefixPinFits(name, static_cast<int64_t>(p.tokens.size()) / options_.block_tokens));
  KVFS_ASSIGN_OR_RETURN(std::vector<PoolBlock*> held,
                        RunOnEngine<Result<std::vector<PoolBlock*>>>([&] { return PinPrefix(p, nullptr); }));
  if (kvfs::Status st = PersistPrefix(name, p, std::move(held), replaced); !st.ok()) {
    (void)RunOnEngine<kvfs::Status>([&] {
      UnpinPrefix(p);
      ForgetFreedBlocks();
      return kvfs::Status::Ok();
    });
    return st.WithContext("storing prefix " + name);
  }
  return p;
}

Status Engine::AddPrefix(const std::string& name, std::string text, uint32_t owner_uid) {
  if (!store::IsValidPrefixName(name)) return InvalidArgument("invalid prefix name \"" + name + "\"");
  std::lock_guard serial(prefix_mu_);
  {
    std::lock_guard lock(mu_);
    if (prefixes_.count(name)) return InvalidArgument("prefix \"" + name + "\" exists");
  }
  KVFS_ASSIGN_OR_RETURN(Prefix p, PinAndPersistPrefix(name, std::move(text), owner_uid, nullptr));
  std::lock_guard lock(mu_);
  prefixes_[name] = std::move(p);
  return kvfs::Status::Ok();
}

Result<store::EraseReport> Engine::ReplacePrefix(const std::string& name, std::string text, uint32_t owner_uid) {
  std::lock_guard serial(prefix_mu_);
  {
    std::lock_guard lock(mu_);
    if (!prefixes_.count(name)) return NotFound("no prefix \"" + name + "\"");
  }
  // Blocks the old text shares with the new one are pinned twice for a while: the old
  // prefix's unpinning below leaves them to the new one. The store swaps the record in one
  // rename and erases the blocks only the old one named.
  store::EraseReport stored;
  KVFS_ASSIGN_OR_RETURN(Prefix p, PinAndPersistPrefix(name, std::move(text), owner_uid, &stored));
  return RunOnEngine<Result<store::EraseReport>>([&]() -> Result<store::EraseReport> {
    Prefix old;
    {
      std::lock_guard lock(mu_);
      old = std::exchange(prefixes_[name], std::move(p));
    }
    store::EraseReport r = UnpinPrefix(old);
    ForgetFreedBlocks();  // device copies of the dropped blocks, before the call returns
    r.bytes_freed += stored.bytes_freed;
    r.files_removed += stored.files_removed;
    return r;
  });
}

Status Engine::RestorePrefixes() {
  if (!store_) return kvfs::Status::Ok();
  std::lock_guard serial(prefix_mu_);
  for (const store::PrefixRecord& r : store_->ListPrefixes()) {
    Prefix p;
    p.text = r.text;
    p.tokens = PrefixTokens(p.text);
    p.owner_uid = r.owner_uid;
    PrefixSources sources;
    // A daemon started with a smaller KV budget than the one that pinned them keeps prefixes
    // within half of it too: the first ones in name order are shared, the rest kept unshared.
    const kvfs::Status fits = PrefixPinFits(r.name, static_cast<int64_t>(p.tokens.size()) / options_.block_tokens);
    Result<std::vector<PoolBlock*>> held =
        fits.ok() ? RunOnEngine<Result<std::vector<PoolBlock*>>>([&] { return PinPrefix(p, &sources); })
                  : Result<std::vector<PoolBlock*>>(fits);
    if (!held.ok()) {
      // Kept, record and text: it is the user's, and only rm erases it (with an audit line). With
      // no tokens or blocks, no agent shares it until a daemon that can hold it starts.
      spdlog::warn("engine: prefix {} is kept but not shared: this daemon cannot hold it ({}); a daemon that can "
                   "(a larger -c or --kv-budget) uses it again",
                   r.name, held.status().message());
      Prefix kept;
      kept.text = r.text;
      kept.owner_uid = r.owner_uid;
      std::lock_guard lock(mu_);
      prefixes_[r.name] = std::move(kept);
      continue;
    }
    if (sources.prefilled > 0 || p.blocks != r.blocks) {
      // Another model or format, or blocks gone from the store: the record follows what is pinned now.
      if (kvfs::Status st = PersistPrefix(r.name, p, std::move(*held)); !st.ok())
        spdlog::warn("engine: prefix {}: storing its new blocks failed: {}", r.name, st.message());
    } else {
      for (PoolBlock* b : *held) pool_->Release(b);
    }
    spdlog::info("engine: prefix {} restored ({} tokens; blocks: {} loaded, {} prefilled, {} cached)", r.name,
                 p.tokens.size(), sources.loaded, sources.prefilled, sources.cached);
    std::lock_guard lock(mu_);
    prefixes_[r.name] = std::move(p);
  }
  for (auto& [name, why] : store_->UnreadablePrefixes()) {
    spdlog::warn("engine: prefix {} is unreadable and can only be erased or written anew: {}", name, why);
    Prefix p;
    p.unreadable = std::move(why);
    std::lock_guard lock(mu_);
    prefixes_[name] = std::move(p);
  }
  return kvfs::Status::Ok();
}

Result<store::EraseReport> Engine::RemovePrefix(const std::string& name) {
  std::lock_guard serial(prefix_mu_);
  auto report = RunOnEngine<Result<store::EraseReport>>([&]() -> Result<store::EraseReport> {
    Prefix p;
    {
      std::lock_guard lock(mu_);
      auto it = prefixes_.find(name);
      if (it == prefixes_.end()) return NotFound("no prefix \"" + name + "\"");
      p = std::move(it->second);
      prefixes_.erase(it);
    }
    store::EraseReport r = UnpinPrefix(p);
    ForgetFreedBlocks();  // device copies of the dropped blocks, before the erasure returns
    return r;
  });
  if (!report.ok() || !store_) return report;
  // The persisted record and the blocks only it named (store thread, after any queued commit).
  Result<store::EraseReport> erased = NotFound("");
  CommitJob job;
  job.run = [&]() -> kvfs::Status {
    erased = store_->ErasePrefix(name);
    return erased.ok() || erased.status().code() == StatusCode::kNotFound ? kvfs::Status::Ok() : erased.status();
  };
  kvfs::Status st = CommitNow(std::move(job));
  if (!st.ok()) return st.WithContext("erasing prefix " + name);
  if (erased.ok()) {
    report->bytes_freed += erased->bytes_freed;
    report->files_removed += erased->files_removed;
  }
  return report;
}

}  // namespace kvfs
