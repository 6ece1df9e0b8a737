#include "engine/backend/fallback_backend.h"

#include <algorithm>
#include <chrono>

#include <spdlog/spdlog.h>

namespace kvfs {

namespace {

// A part of a pass: some of its steps (indices into the pass) and their logits.
struct Part {
  std::vector<size_t> index;
  std::vector<SequenceStep> steps;
  Logits logits;
};

}  // namespace

FallbackBackend::FallbackBackend(const Model& model, std::unique_ptr<Backend> device, CpuOptions cpu,
                                 DeviceRecovery recovery)
    : model_(model),
      device_(std::move(device)),
      cpu_options_(cpu),
      keeps_copies_(device_->KeepsBlockCopies()),
      recovery_(std::move(recovery)) {
  GiveBackMatrices();
}

void FallbackBackend::GiveBackMatrices() {
  if (device_ == nullptr || device_->ReadsModelMatrices() || cpu_ != nullptr) return;
  const ModelWeights& w = model_.weights();
  auto give_back = [&](const Matrix& m) {
    if (!m.empty()) model_.gguf().GiveBack(m.data, static_cast<size_t>(m.n_out * m.row_bytes));
  };
  give_back(w.token_embd);
  give_back(w.output);  // (the same bytes when tied: given back once)
  for (const LayerWeights& l : w.layers) {
    for (const Matrix* m : l.Matrices()) give_back(*m);
  }
}

Status FallbackBackend::SetVulkanTuning(const VulkanTuning& tuning) {
  if (device_ == nullptr) {
    return Unsupported("the Vulkan device is lost: passes run on the CPU until it is made again");
  }
  KVFS_RETURN_IF_ERROR(device_->SetVulkanTuning(tuning));
  tuning_ = tuning;
  return Status::Ok();
}

int64_t FallbackBackend::NowMs() const {
  if (recovery_.now_ms) return recovery_.now_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Status FallbackBackend::ForgetBlocks(std::span<const uint64_t> serials) {
  if (device_ == nullptr) return Status::Ok();
  const Status st = device_->ForgetBlocks(serials);
  if (st.ok() || !device_->Lost()) return st;
  DropDevice(st);  // the loss seen first here, between passes
  return Status::Ok();
}

Result<Backend*> FallbackBackend::Cpu() {
  if (cpu_ == nullptr) {
    KVFS_RETURN_IF_ERROR(model_.gguf().Refill());
    cpu_ = MakeCpuBackend(model_, cpu_options_);
  }
  return cpu_.get();
}

void FallbackBackend::DropDevice(const Status& why) {
  const std::string name = device_->name();
  device_.reset();  // its memory, KV copies included, goes with the device
  stats_.device_lost = true;
  ++stats_.device_losses;
  if (!recovery_.make) {
    spdlog::error("backend: the {} device was lost ({}); every pass runs on the CPU from now on", name, why.message());
    return;
  }
  // Lost again soon after it was made again: wait longer than last time.
  const int64_t now = NowMs();
  const bool again_soon = remade_at_ms_.has_value() && now - *remade_at_ms_ < recovery_.max_delay_ms;
  remake_delay_ms_ = again_soon ? std::min(2 * remake_delay_ms_, recovery_.max_delay_ms)
                                : std::max<int64_t>(1, recovery_.first_delay_ms);
  next_remake_ms_ = now + remake_delay_ms_;
  spdlog::error("backend: the {} device was lost ({}); passes run on the CPU, and the device is made again in {} ms",
                name, why.message(), remake_delay_ms_);
}

std::optional<int64_t> FallbackBackend::MaintenanceDueInMs() const {
  if (!Recovering()) return std::nullopt;
  return std::max<int64_t>(0, next_remake_ms_ - NowMs());
}

void FallbackBackend::TryRemakeDevice() {
  const int64_t now = NowMs();
  if (!Recovering() || now < next_remake_ms_) return;
  // The device is made from the model's bytes: the CPU's given-back ones are read back first,
  // and given back again when the device cannot be made (the CPU goes on with its own copies).
  std::vector<std::span<const uint8_t>> restored;
  const Status refilled = model_.gguf().Refill(&restored);
  Result<std::unique_ptr<Backend>> made =
      refilled.ok() ? recovery_.make() : Result<std::unique_ptr<Backend>>(refilled);
  Status why = made.ok() ? Status::Ok() : made.status();
  if (made.ok() && (*made)->KeepsBlockCopies() != keeps_copies_) {
    why = Internal("the remade device keeps KV copies differently");  // the engine fixed that at start
  }
  if (!why.ok()) {
    for (std::span<const uint8_t> r : restored) model_.gguf().GiveBack(r.data(), r.size());
    ++stats_.remake_failures;
    remake_delay_ms_ = std::min(2 * remake_delay_ms_, recovery_.max_delay_ms);
    next_remake_ms_ = now + remake_delay_ms_;
    spdlog::warn("backend: the lost device could not be made again ({}); next try in {} ms", why.message(),
                 remake_delay_ms_);
    return;
  }
  device_ = std::move(*made);
  if (tuning_.has_value()) {
    if (Status st = device_->SetVulkanTuning(*tuning_); !st.ok()) {  // it keeps the tuning it was made with
      spdlog::warn("backend: the remade device refused the tuning set before ({})", st.message());
    }
  }
  stats_.device_lost = false;
  ++stats_.device_remakes;
  remade_at_ms_ = now;
  // The CPU backend may hold repacked weights (as large as the model): made again on need
  // (steps over the device's KV budget), at the cost of packing them again.
  cpu_.reset();
  GiveBackMatrices();
  spdlog::info("backend: the {} device was made again; passes run on it (its KV copies are reloaded from host "
               "memory as passes need them)",
               device_->name());
}

Status FallbackBackend::RunOnCpu(std::span<const SequenceStep> steps, Logits& out, const std::string& why) {
  if (device_ != nullptr && keeps_copies_) {
    // The device may hold copies of the blocks these steps write, with rows past the
    // sequence's end (a truncated sequence) that it would trust again once the sequence has
    // grown back: drop them.
    std::vector<uint64_t> written;
    for (const SequenceStep& s : steps) {
      const int64_t B = s.kv->layout().block_tokens;
      const int64_t end = s.kv->n_tokens() + static_cast<int64_t>(s.tokens.size());
      for (int64_t b = s.kv->n_tokens() / B; b < std::min(s.kv->n_blocks(), (end + B - 1) / B); ++b) {
        written.push_back(s.kv->block(b)->serial);
      }
    }
    if (Status st = device_->ForgetBlocks(written); !st.ok()) {
      if (!device_->Lost()) return st;
      DropDevice(st);
    }
  }
  KVFS_ASSIGN_OR_RETURN(Backend * cpu, Cpu());
  if (device_ != nullptr) {  // (a loss is logged once, by DropDevice)
    cpu_steps_unsaid_ += static_cast<int64_t>(steps.size());
    const int64_t now = NowMs();
    if (!cpu_steps_said_at_ms_ || now - *cpu_steps_said_at_ms_ >= kCpuStepsLogEveryMs) {
      spdlog::warn("backend: {} step(s) on the CPU{}, the last because {} (said at most once a minute; "
                   "status.json counts them all)",
                   cpu_steps_unsaid_, cpu_steps_said_at_ms_ ? " since last said" : "", why);
      cpu_steps_said_at_ms_ = now;
      cpu_steps_unsaid_ = 0;
    }
  }
  KVFS_RETURN_IF_ERROR(cpu->Forward(steps, out));
  ++stats_.cpu_passes;
  stats_.cpu_steps += static_cast<int64_t>(steps.size());
  stats_.last_reason = why;
  return Status::Ok();
}

Status FallbackBackend::RunOnDevice(std::span<const SequenceStep> steps, Logits& out) {
  if (device_ == nullptr) return RunOnCpu(steps, out, "the device was lost");
  const Status st = device_->Forward(steps, out);
  if (st.ok()) {
    ++stats_.device_passes;
    return st;
  }
  if (st.code() != StatusCode::kUnavailable) return st;
  if (device_->Lost()) DropDevice(st);
  return RunOnCpu(steps, out, st.message());
}

Status FallbackBackend::Forward(std::span<const SequenceStep> steps, Logits& out) {
  // Every step's blocks first: a full host pool fails the pass here, before any part has run.
  for (const SequenceStep& s : steps) {
    if (s.kv == nullptr || s.tokens.empty()) return InvalidArgument("empty step in a batch");
    KVFS_RETURN_IF_ERROR(s.kv->Reserve(s.kv->n_tokens() + static_cast<int64_t>(s.tokens.size())));
  }
  if (device_ != nullptr && device_->Lost()) DropDevice(Unavailable("lost before this pass"));
  if (device_ == nullptr) TryRemakeDevice();
  // The usual pass: all on the device at once (or, the device lost, all on the CPU).
  if (device_ == nullptr || device_->Fits(steps)) return RunOnDevice(steps, out);

  // Parts: groups of consecutive steps that fit the device together, and the steps that do not
  // fit alone, for the CPU.
  std::vector<Part> parts;
  Part too_large;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!device_->Fits(steps.subspan(i, 1))) {
      too_large.index.push_back(i);
      too_large.steps.push_back(steps[i]);
      continue;
    }
    if (!parts.empty()) {
      Part& last = parts.back();
      last.steps.push_back(steps[i]);
      if (device_->Fits(last.steps)) {
        last.index.push_back(i);
        continue;
      }
      last.steps.pop_back();
    }
    parts.emplace_back();
    parts.back().index.push_back(i);
    parts.back().steps.push_back(steps[i]);
  }
  for (Part& part : parts) KVFS_RETURN_IF_ERROR(RunOnDevice(part.steps, part.logits));
  if (!too_large.index.empty()) {
    KVFS_RETURN_IF_ERROR(RunOnCpu(too_large.steps, too_large.logits,
                                  "its KV blocks do not fit the device's KV budget (kvfsd --kv-device-budget)"));
    parts.push_back(std::move(too_large));
  }

  // The logits in the pass's order of steps.
  out.n_vocab = model_.hparams().n_vocab;
  out.data.clear();
  out.first_row.assign(steps.size(), 0);
  std::vector<std::pair<const Part*, size_t>> where(steps.size());
  for (const Part& part : parts) {
    for (size_t k = 0; k < part.index.size(); ++k) where[part.index[k]] = {&part, k};
  }
  int64_t rows = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto [part, k] = where[i];
    const int64_t n = steps[i].all_logits ? static_cast<int64_t>(steps[i].tokens.size()) : 1;
    const float* from = part->logits.row(part->logits.first_row[k]);
    out.first_row[i] = rows;
    out.data.insert(out.data.end(), from, from + n * out.n_vocab);
    rows += n;
  }
  return Status::Ok();
}

}  // namespace kvfs
