#include "tests/fs/fake_engine.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>

#include "engine/core/shred.h"
#include "engine/store/manifest.h"

namespace kvfs::testing {

namespace {

constexpr std::string_view kExportMagic = "KVFSFAKE1\n";

uint64_t Fnv1a(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

kvfs::Status ErrnoStatus(const std::string& what) {
  int err = errno;
  std::string msg = what + ": " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return kvfs::Status(StatusCode::kNoSpace, msg);
  return IoError(msg);
}

// Writes `bytes` to `path` crash-safely: temp file, fsync, rename.
kvfs::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("open " + tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      kvfs::Status s = ErrnoStatus("write " + tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    kvfs::Status s = ErrnoStatus("fsync " + tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    kvfs::Status s = ErrnoStatus("rename " + tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  return kvfs::Status::Ok();
}

nlohmann::json ConversationJson(const std::vector<ConversationTurn>& conversation) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& t : conversation) out.push_back({{"role", t.role}, {"text", t.text}});
  return out;
}

Result<std::vector<ConversationTurn>> ConversationFromJson(const nlohmann::json& j) {
  if (!j.is_array()) return Corrupt("conversation must be an array");
  std::vector<ConversationTurn> out;
  for (const auto& t : j) {
    if (!t.is_object() || !t.contains("role") || !t.contains("text") || !t["role"].is_string() || !t["text"].is_string()) {
      return Corrupt("bad conversation entry");
    }
    out.push_back({t["role"].get<std::string>(), t["text"].get<std::string>()});
  }
  return out;
}

}  // namespace

std::string FakeEngine::ReplyFor(uint64_t turn_number, const std::string& text) {
  return fmt::format("reply {}: {}", turn_number, text);
}

Result<std::unique_ptr<FakeEngine>> FakeEngine::Open(FakeEngineOptions options) {
  auto engine = std::unique_ptr<FakeEngine>(new FakeEngine(std::move(options)));
  KVFS_RETURN_IF_ERROR(engine->Load());
  for (int i = 0; i < std::max(1, engine->options_.workers); ++i) engine->workers_.emplace_back([e = engine.get()] { e->Worker(); });
  return engine;
}

FakeEngine::FakeEngine(FakeEngineOptions options) : options_(std::move(options)), piece_delay_(options_.piece_delay) {}

FakeEngine::~FakeEngine() { Shutdown(); }

int64_t FakeEngine::NowMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string FakeEngine::AgentPath(const std::string& name) const { return options_.store_dir + "/fake-agents/" + name + ".json"; }

kvfs::Status FakeEngine::Load() {
  std::string model_bytes = "fake-model";
  if (!options_.model_path.empty()) {
    std::ifstream in(options_.model_path, std::ios::binary);
    if (!in) return NotFound("cannot read the model " + options_.model_path);
    std::stringstream ss;
    ss << in.rdbuf();
    model_bytes = ss.str();
  }
  fingerprint_ = fmt::format("{:016x}", Fnv1a(model_bytes));
  if (options_.store_dir.empty()) return kvfs::Status::Ok();
  std::error_code ec;
  std::filesystem::create_directories(options_.store_dir + "/fake-agents", ec);
  if (ec) return IoError("cannot create the store: " + ec.message());
  for (const auto& entry : std::filesystem::directory_iterator(options_.store_dir + "/fake-agents")) {
    std::string file = entry.path().filename().string();
    if (entry.path().extension() != ".json") {
      std::filesystem::remove(entry.path(), ec);  // a temp file a crash left behind
      continue;
    }
    std::ifstream in(entry.path());
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded()) return Corrupt("unreadable agent file " + file);
    auto agent = std::make_shared<Agent>();
    agent->info.name = j.value("name", "");
    agent->info.owner_uid = j.value("owner_uid", 0u);
    agent->info.system = j.value("system", "");
    agent->info.created_ms = j.value("created_ms", int64_t{0});
    agent->info.updated_ms = j.value("updated_ms", int64_t{0});
    agent->info.turns = j.value("turns", uint64_t{0});
    agent->has_cache = j.value("has_cache", false);
    KVFS_ASSIGN_OR_RETURN(agent->info.settings, ParseAgentSettings(j["settings"].dump(), AgentSettings{}));
    KVFS_ASSIGN_OR_RETURN(agent->conversation, ConversationFromJson(j["conversation"]));
    agent->info.context_tokens = ContextTokens(*agent);
    agent->info.state = AgentState::kCold;
    agents_[agent->info.name] = agent;
  }
  // Prefixes persist like the real engine's (one file for all of them).
  if (std::ifstream in(options_.store_dir + "/fake-prefixes.json"); in) {
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_object()) return Corrupt("unreadable fake-prefixes.json");
    for (auto it = j.begin(); it != j.end(); ++it) {
      prefixes_[it.key()] = it.value().value("text", "");
      prefix_owners_[it.key()] = it.value().value("owner_uid", 0u);
    }
  }
  return kvfs::Status::Ok();
}

kvfs::Status FakeEngine::PersistPrefixes() {
  if (options_.store_dir.empty()) return kvfs::Status::Ok();
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, text] : prefixes_) j[name] = {{"text", text}, {"owner_uid", prefix_owners_[name]}};
  return WriteFileAtomically(options_.store_dir + "/fake-prefixes.json", j.dump());
}

kvfs::Status FakeEngine::Persist(const Agent& agent) {
  if (options_.store_dir.empty()) return kvfs::Status::Ok();
  nlohmann::json j = {{"name", agent.info.name},
                      {"owner_uid", agent.info.owner_uid},
                      {"system", agent.info.system},
                      {"settings", AgentSettingsToJson(agent.info.settings)},
                      {"conversation", ConversationJson(agent.conversation)},
                      {"created_ms", agent.info.created_ms},
                      {"updated_ms", agent.info.updated_ms},
                      {"turns", agent.info.turns},
                      {"has_cache", agent.has_cache}};
  std::string bytes = j.dump();
  // The fake KV cache: bytes_per_token per context token, so a small disk fills up.
  if (agent.has_cache) bytes += "\n" + std::string(static_cast<size_t>(agent.info.context_tokens * options_.kv_bytes_per_token), ' ');
  return WriteFileAtomically(AgentPath(agent.info.name), bytes);
}

std::shared_ptr<FakeEngine::Agent> FakeEngine::Find(const std::string& name) {
  auto it = agents_.find(name);
  return it == agents_.end() ? nullptr : it->second;
}

std::vector<ConversationTurn> FakeEngine::FullConversation(const Agent& agent) const {
  std::vector<ConversationTurn> out;
  if (!agent.info.system.empty()) out.push_back({"system", agent.info.system});
  out.insert(out.end(), agent.conversation.begin(), agent.conversation.end());
  return out;
}

int64_t FakeEngine::ContextTokens(const Agent& agent) const {
  int64_t n = static_cast<int64_t>(agent.info.system.size());
  for (const auto& t : agent.conversation) n += static_cast<int64_t>(t.text.size());
  return n;
}

std::vector<AgentInfo> FakeEngine::ListAgents() {
  std::lock_guard lock(mu_);
  std::vector<AgentInfo> out;
  for (const auto& [name, agent] : agents_) {
    out.push_back(agent->info);
    out.back().queued_turns = agent->queue.size() + (agent->running ? 1 : 0);
  }
  return out;
}

Result<AgentInfo> FakeEngine::GetAgent(const std::string& name) {
  std::lock_guard lock(mu_);
  auto agent = Find(name);
  if (agent == nullptr) return NotFound("no agent " + name);
  AgentInfo info = agent->info;
  info.queued_turns = agent->queue.size() + (agent->running ? 1 : 0);
  info.memory_bytes = agent->has_cache && info.state != AgentState::kCold ? info.context_tokens * options_.kv_bytes_per_token : 0;
  info.disk_bytes = agent->has_cache && !options_.store_dir.empty() ? info.context_tokens * options_.kv_bytes_per_token : 0;
  return info;
}

kvfs::Status FakeEngine::CreateAgent(const std::string& name, uint32_t owner_uid) {
  if (!store::IsValidAgentName(name)) return InvalidArgument("bad agent name " + name);
  std::lock_guard lock(mu_);
  if (stopping_) return Internal("shutting down");
  if (agents_.count(name)) return InvalidArgument("agent exists: " + name);
  auto agent = std::make_shared<Agent>();
  agent->info.name = name;
  agent->info.owner_uid = owner_uid;
  agent->info.created_ms = agent->info.updated_ms = NowMs();
  agent->info.state = AgentState::kHot;
  KVFS_RETURN_IF_ERROR(Persist(*agent));
  agents_[name] = agent;
  return kvfs::Status::Ok();
}

Result<std::vector<ConversationTurn>> FakeEngine::Conversation(const std::string& name) {
  std::lock_guard lock(mu_);
  auto agent = Find(name);
  if (agent == nullptr) return NotFound("no agent " + name);
  return FullConversation(*agent);
}

kvfs::Status FakeEngine::SetSystem(const std::string& name, std::string text) {
  std::lock_guard lock(mu_);
  auto agent = Find(name);
  if (agent == nullptr) return NotFound("no agent " + name);
  if (agent->info.system == text) return kvfs::Status::Ok();  // as the engine: no change, no commit
  std::string old = agent->info.system;
  const int64_t old_ms = agent->info.updated_ms;
  agent->info.system = std::move(text);
  agent->info.context_tokens = ContextTokens(*agent);
  agent->info.updated_ms = NowMs();
  kvfs::Status s = Persist(*agent);
  if (!s.ok()) {
    agent->info.system = old, agent->info.context_tokens = ContextTokens(*agent);
    agent->info.updated_ms = old_ms;
  }
  return s;
}

kvfs::Status FakeEngine::CheckSettings(const AgentSettings& settings) {
  for (const std::string& kv : options_.refused_kv) {
    if (settings.kv == kv) return InvalidArgument("kv \"" + kv + "\" is refused by this fake engine");
  }
  return kvfs::Status::Ok();
}

kvfs::Status FakeEngine::SetSettings(const std::string& name, const AgentSettings& settings) {
  KVFS_RETURN_IF_ERROR(CheckSettings(settings));
  std::lock_guard lock(mu_);
  auto agent = Find(name);
  if (agent == nullptr) return NotFound("no agent " + name);
  if (agent->info.settings == settings) return kvfs::Status::Ok();
  AgentSettings old = agent->info.settings;
  const int64_t old_ms = agent->info.updated_ms;
  agent->info.settings = settings;
  agent->info.updated_ms = NowMs();
  kvfs::Status s = Persist(*agent);
  if (!s.ok()) agent->info.settings = old, agent->info.updated_ms = old_ms;
  return s;
}

kvfs::Status FakeEngine::SubmitTurn(TurnRequest request) {
  std::lock_guard lock(mu_);
  if (stopping_) return Internal("the engine is shutting down");
  auto agent = Find(request.agent);
  if (agent == nullptr) return NotFound("no agent " + request.agent);
  size_t queued = agent->queue.size() + (agent->running ? 1 : 0);
  if (queued >= options_.max_queued_turns) {
    return kvfs::Status(StatusCode::kResourceExhausted, fmt::format("agent {} has {} queued turns", request.agent, queued));
  }
  agent->queue.push_back(std::move(request));
  if (!agent->running && agent->queue.size() == 1) ready_.push_back(agent);
  if (!agent->running) agent->info.state = AgentState::kQueued;
  work_cv_.notify_one();
  return kvfs::Status::Ok();
}

void FakeEngine::Worker() {
  std::unique_lock lock(mu_);
  while (true) {
    ScrubStack();  // as the real engine's threads: the last turn's text left below this frame
    work_cv_.wait(lock, [&] { return stopping_ || (!hold_ && !ready_.empty()); });
    if (ready_.empty() && stopping_) return;
    if (ready_.empty()) continue;
    auto agent = ready_.front();
    ready_.pop_front();
    if (agent->queue.empty() || agent->running) continue;
    TurnRequest request = std::move(agent->queue.front());
    agent->queue.pop_front();
    agent->running = true;
    agent->info.state = AgentState::kGenerating;
    lock.unlock();
    // As the real engine: the agent is no longer busy when its turn's on_done runs (a reader of
    // `response` woken by it may import or edit at once).
    request.on_done = [this, agent, done = std::move(request.on_done)](const Result<TurnStats>& result) {
      {
        std::lock_guard relock(mu_);
        agent->running = false;
      }
      if (done) done(result);
    };
    RunTurn(agent, std::move(request));  // (every path ends in on_done: running is false again)
    lock.lock();
    // Another worker may have started the agent's next turn since on_done: it is not ours to end.
    if (!agent->running && !agent->queue.empty()) {
      ready_.push_back(agent);
      agent->info.state = AgentState::kQueued;
      work_cv_.notify_one();
    }
    idle_cv_.notify_all();
  }
}

void FakeEngine::RunTurn(const std::shared_ptr<Agent>& agent, TurnRequest request) {
  auto started = std::chrono::steady_clock::now();
  std::optional<kvfs::Status> failure;
  uint64_t turn_number = 0;
  std::chrono::milliseconds delay;
  {
    std::lock_guard lock(mu_);
    if (fail_next_) failure = std::move(fail_next_), fail_next_.reset();
    turn_number = agent->info.turns + 1;
    delay = piece_delay_;
    int64_t needed = ContextTokens(*agent) + static_cast<int64_t>(request.text.size());
    if (!failure && needed > options_.n_ctx) {
      failure = OutOfRange(fmt::format("the prompt does not fit the context: {} tokens needed, the context holds {}",
                                       needed, options_.n_ctx));
    }
  }
  auto fail = [&](kvfs::Status s) {
    {
      std::lock_guard lock(mu_);
      agent->info.state = AgentState::kError;
      agent->info.last_error = s.message();
      ++counters_.turns_failed;
    }
    request.on_done(s);
  };
  if (failure) return fail(*failure);
  std::string reply = ReplyFor(turn_number, request.text);
  double ttft_ms = 0;
  // Streams whole UTF-8 characters, a few bytes per piece.
  for (size_t i = 0; i < reply.size();) {
    size_t end = std::min(reply.size(), i + 4);
    while (end < reply.size() && (static_cast<unsigned char>(reply[end]) & 0xC0) == 0x80) ++end;
    if (agent->cancel.load()) return fail(Cancelled("the turn was cancelled"));
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    if (i == 0) ttft_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    request.on_text(std::string_view(reply).substr(i, end - i));
    if (i == 0) {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [&] { return !hold_after_first_piece_ || stopping_ || agent->cancel.load(); });
    }
    i = end;
  }
  TurnStats stats;
  {
    std::lock_guard lock(mu_);
    if (agent->cancel.load()) {
      agent->info.state = AgentState::kError;
      ++counters_.turns_failed;
    } else {
      stats.match = agent->has_cache ? "extend" : "new";
      stats.reused_tokens = agent->has_cache ? ContextTokens(*agent) : 0;
      stats.prefilled_tokens = static_cast<int64_t>(request.text.size());
      stats.generated_tokens = static_cast<int64_t>(reply.size());
      stats.ttft_ms = ttft_ms;
      stats.decode_tokens_per_s = 1000.0;
      stats.stop_reason = "eog";
      AgentInfo before = agent->info;
      bool had_cache = agent->has_cache;
      agent->conversation.push_back({"user", request.text, request.tag});
      agent->conversation.push_back({"assistant", reply, request.tag});
      agent->info.turns = turn_number;
      agent->info.updated_ms = NowMs();
      agent->info.context_tokens = ContextTokens(*agent);
      agent->has_cache = true;
      kvfs::Status persisted = Persist(*agent);
      if (!persisted.ok()) {
        // The turn is not committed: the agent stays at its previous turn.
        agent->conversation.resize(agent->conversation.size() - 2);
        agent->info = before;
        agent->has_cache = had_cache;
        agent->info.state = AgentState::kError;
        agent->info.last_error = persisted.message();
        ++counters_.turns_failed;
        failure = persisted;
      } else {
        agent->info.state = AgentState::kHot;
        agent->info.last_error.clear();
        agent->info.last_turn = stats;
        ++counters_.turns_completed;
        counters_.tokens_generated += reply.size();
        counters_.tokens_reused += stats.reused_tokens;
        counters_.tokens_computed += stats.prefilled_tokens;
      }
    }
  }
  if (agent->cancel.load()) return request.on_done(Cancelled("the turn was cancelled"));
  if (failure) return request.on_done(*failure);
  {
    std::unique_lock lock(mu_);
    work_cv_.wait(lock, [&] { return !hold_before_done_ || stopping_ || agent->cancel.load(); });
  }
  request.on_done(stats);
}

Result<store::EraseReport> FakeEngine::EraseAgent(const std::string& name) {
  std::unique_lock lock(mu_);
  auto agent = Find(name);
  if (agent == nullptr) return NotFound("no agent " + name);
  agent->cancel = true;
  work_cv_.notify_all();  // a turn held after its first piece sees the cancel
  std::deque<TurnRequest> queued = std::move(agent->queue);
  agent->queue.clear();
  counters_.turns_cancelled += queued.size();  // as the engine: dropped unstarted
  idle_cv_.wait(lock, [&] { return !agent->running; });
  if (fail_next_erase_) {
    const kvfs::Status failure = *std::exchange(fail_next_erase_, std::nullopt);
    agent->cancel = false;
    lock.unlock();
    for (auto& request : queued) request.on_done(Cancelled("the turn was cancelled"));
    return failure;
  }
  store::EraseReport report;
  report.bytes_freed = static_cast<uint64_t>(agent->info.context_tokens * options_.kv_bytes_per_token);
  report.blocks_freed = agent->has_cache ? 1 : 0;
  if (!options_.store_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove(AgentPath(name), ec);
    report.files_removed = 1;
  }
  agents_.erase(name);
  ++counters_.erasures;
  lock.unlock();
  for (auto& request : queued) request.on_done(Cancelled("the agent was erased"));
  return report;
}

Result<store::EraseReport> FakeEngine::EraseCache(const std::string& name) {
  std::lock_guard lock(mu_);
  auto agent = Find(name);
  if (agent == nullptr) return NotFound("no agent " + name);
  store::EraseReport report;
  if (agent->has_cache) {
    report.bytes_freed = static_cast<uint64_t>(agent->info.context_tokens * options_.kv_bytes_per_token);
    report.blocks_freed = 1;
  }
  if (!agent->has_cache) return report;  // nothing stored to erase: no write (a full disk)
  agent->has_cache = false;
  agent->info.state = AgentState::kCold;
  kvfs::Status persisted = Persist(*agent);
  if (persisted.code() == StatusCode::kNoSpace) {
    // As the real store does on a full disk: the cache's bytes go first, to make room for the
    // record without them (here: the padding after the JSON line, cut off in place).
    std::ifstream in(AgentPath(name));
    std::string record;
    std::getline(in, record);
    std::error_code ec;
    if (in) std::filesystem::resize_file(AgentPath(name), record.size(), ec);
    persisted = Persist(*agent);
  }
  KVFS_RETURN_IF_ERROR(persisted);
  return report;
}

std::string FakeEngine::ExportOf(const Agent& agent) const {
  nlohmann::json header = {{"fingerprint", fingerprint_},
                           {"kv_format", agent.info.settings.kv},
                           {"tokens", agent.info.context_tokens},
                           {"system", agent.info.system},
                           {"conversation", ConversationJson(agent.conversation)}};
  std::string out(kExportMagic);
  out += header.dump() + "\n";
  out += std::string(static_cast<size_t>(agent.info.context_tokens * options_.kv_bytes_per_token), 'k');
  return out;
}

Result<std::string> FakeEngine::ExportCache(const std::string& name) {
  std::lock_guard lock(mu_);
  auto agent = Find(name);
  if (agent == nullptr) return NotFound("no agent " + name);
  return ExportOf(*agent);
}

Result<uint64_t> FakeEngine::ExportSize(const std::string& name) {
  std::lock_guard lock(mu_);
  auto agent = Find(name);
  if (agent == nullptr) return NotFound("no agent " + name);
  return ExportOf(*agent).size();
}

kvfs::Status FakeEngine::ImportCache(const std::string& name, std::string_view bytes) {
  if (bytes.substr(0, kExportMagic.size()) != kExportMagic) return InvalidArgument("not a kv cache file");
  bytes.remove_prefix(kExportMagic.size());
  size_t eol = bytes.find('\n');
  if (eol == std::string_view::npos) return InvalidArgument("truncated kv cache file");
  nlohmann::json header = nlohmann::json::parse(bytes.substr(0, eol), nullptr, false);
  if (header.is_discarded() || !header.is_object()) return InvalidArgument("bad kv cache header");
  if (header.value("fingerprint", "") != fingerprint_) return InvalidArgument("the cache is for another model");
  int64_t tokens = header.value("tokens", int64_t{-1});
  if (tokens < 0 || bytes.size() - eol - 1 != static_cast<size_t>(tokens * options_.kv_bytes_per_token)) {
    return InvalidArgument("truncated kv cache file");
  }
  KVFS_ASSIGN_OR_RETURN(auto conversation, ConversationFromJson(header["conversation"]));
  std::lock_guard lock(mu_);
  auto agent = Find(name);
  if (agent == nullptr) return NotFound("no agent " + name);
  if (agent->running || !agent->queue.empty()) return kvfs::Status(StatusCode::kResourceExhausted, "the agent is busy");
  auto before = agent->conversation;
  std::string before_system = agent->info.system;
  agent->conversation = std::move(conversation);
  agent->info.system = header.value("system", "");
  agent->info.context_tokens = ContextTokens(*agent);
  agent->has_cache = true;
  kvfs::Status s = Persist(*agent);
  if (!s.ok()) {
    agent->conversation = std::move(before);
    agent->info.system = before_system;
    agent->info.context_tokens = ContextTokens(*agent);
  }
  return s;
}

void FakeEngine::Prefetch(const std::string& name) {
  std::lock_guard lock(mu_);
  ++prefetches_;
  auto agent = Find(name);
  if (agent != nullptr && agent->info.state == AgentState::kCold && agent->has_cache) agent->info.state = AgentState::kHot;
}

kvfs::Status FakeEngine::AddPrefix(const std::string& name, std::string text, uint32_t owner_uid) {
  std::this_thread::sleep_for(options_.prefix_delay);
  std::lock_guard lock(mu_);
  if (prefixes_.count(name)) return InvalidArgument("prefix exists: " + name);
  if (static_cast<int64_t>(text.size()) > options_.n_ctx) return OutOfRange("the prefix is longer than the context");
  prefixes_[name] = std::move(text);
  prefix_owners_[name] = owner_uid;
  if (kvfs::Status st = PersistPrefixes(); !st.ok()) {
    prefixes_.erase(name);
    prefix_owners_.erase(name);
    return st;
  }
  return kvfs::Status::Ok();
}

Result<store::EraseReport> FakeEngine::RemovePrefix(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = prefixes_.find(name);
  if (it == prefixes_.end()) return NotFound("no prefix " + name);
  store::EraseReport report;
  report.bytes_freed = it->second.size() * static_cast<uint64_t>(options_.kv_bytes_per_token);
  prefixes_.erase(it);
  prefix_owners_.erase(name);
  KVFS_RETURN_IF_ERROR(PersistPrefixes());
  return report;
}

Result<store::EraseReport> FakeEngine::ReplacePrefix(const std::string& name, std::string text, uint32_t owner_uid) {
  std::lock_guard lock(mu_);
  auto it = prefixes_.find(name);
  if (it == prefixes_.end()) return NotFound("no prefix " + name);
  if (static_cast<int64_t>(text.size()) > options_.n_ctx) return OutOfRange("the prefix is longer than the context");
  store::EraseReport report;
  report.bytes_freed = it->second.size() * static_cast<uint64_t>(options_.kv_bytes_per_token);
  std::string old = std::exchange(it->second, std::move(text));
  const uint32_t old_owner = std::exchange(prefix_owners_[name], owner_uid);
  if (kvfs::Status st = PersistPrefixes(); !st.ok()) {
    prefixes_[name] = std::move(old);
    prefix_owners_[name] = old_owner;
    return st;
  }
  return report;
}

std::vector<std::string> FakeEngine::ListPrefixes() {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, text] : prefixes_) out.push_back(name);
  return out;
}

uint32_t FakeEngine::PrefixOwner(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = prefix_owners_.find(name);
  return it == prefix_owners_.end() ? 0 : it->second;
}

Result<std::string> FakeEngine::PrefixText(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = prefixes_.find(name);
  if (it == prefixes_.end()) return NotFound("no prefix " + name);
  return it->second;
}

EngineStatus FakeEngine::Stats() {
  std::lock_guard lock(mu_);
  EngineStatus s = counters_;
  s.memory_budget_bytes = 1 << 30;
  for (const auto& [name, agent] : agents_) {
    int64_t bytes = agent->has_cache ? agent->info.context_tokens * options_.kv_bytes_per_token : 0;
    s.CountAgent(agent->info.state);  // as the engine: by the state status.json shows
    if (agent->info.state != AgentState::kCold) s.memory_used_bytes += bytes;
    s.turns_in_flight += agent->queue.size() + (agent->running ? 1 : 0);
    s.top_entries.push_back({name, agent->info.state == AgentState::kCold ? 0 : bytes, bytes, agent->info.turns});
  }
  std::sort(s.top_entries.begin(), s.top_entries.end(),
            [](const CacheEntryStatus& a, const CacheEntryStatus& b) { return a.disk_bytes > b.disk_bytes; });
  if (s.top_entries.size() > 10) s.top_entries.resize(10);
  s.batch_sizes = {1, 1, 2};
  s.agent_records = agents_.size();
  return s;
}

nlohmann::json FakeEngine::ModelInfo() {
  return {{"architecture", "fake"}, {"fingerprint", fingerprint_}, {"n_ctx", options_.n_ctx}, {"kv_formats", {"q4"}}};
}

void FakeEngine::Shutdown() {
  std::vector<TurnRequest> dropped;
  {
    std::lock_guard lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
    hold_ = false;
    // Queued turns are cancelled; running ones finish.
    for (auto& [name, agent] : agents_) {
      for (auto& r : agent->queue) dropped.push_back(std::move(r));
      agent->queue.clear();
    }
    counters_.turns_cancelled += dropped.size();
    ready_.clear();
    work_cv_.notify_all();
  }
  for (auto& r : dropped) r.on_done(Cancelled("kvfsd is shutting down"));
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
  workers_.clear();
}

void FakeEngine::HoldTurns(bool hold) {
  std::lock_guard lock(mu_);
  hold_ = hold;
  work_cv_.notify_all();
}

void FakeEngine::HoldBeforeDone(bool hold) {
  std::lock_guard lock(mu_);
  hold_before_done_ = hold;
  work_cv_.notify_all();
}

void FakeEngine::HoldAfterFirstPiece(bool hold) {
  std::lock_guard lock(mu_);
  hold_after_first_piece_ = hold;
  work_cv_.notify_all();
}

void FakeEngine::FailNextTurn(kvfs::Status failure) {
  std::lock_guard lock(mu_);
  fail_next_ = std::move(failure);
}

void FakeEngine::FailNextErase(kvfs::Status failure) {
  std::lock_guard lock(mu_);
  fail_next_erase_ = std::move(failure);
}

void FakeEngine::SetPieceDelay(std::chrono::milliseconds delay) {
  std::lock_guard lock(mu_);
  piece_delay_ = delay;
}

size_t FakeEngine::PrefetchCount() {
  std::lock_guard lock(mu_);
  return prefetches_;
}

}  // namespace kvfs::testing
