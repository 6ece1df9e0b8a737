// kvfsd_fake: kvfsd over the FakeEngine, for the filesystem integration tests (they run before
// the real engine exists, and faster). Test knobs come from the environment:
// KVFS_FAKE_DELAY_MS (between streamed pieces), KVFS_FAKE_CONTEXT (tokens = bytes),
// KVFS_FAKE_KV_BYTES_PER_TOKEN.
#include <cstdlib>
#include <string>

#include "daemon/daemon.h"
#include "tests/fs/fake_engine.h"

namespace {

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoll(v, nullptr, 10) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  return kvfs::daemon::RunDaemon(argc, argv, [](const kvfs::EngineOptions& options) -> kvfs::Result<std::unique_ptr<kvfs::AgentEngine>> {
    kvfs::testing::FakeEngineOptions fake;
    fake.model_path = options.model_path;
    fake.store_dir = options.store_dir;
    fake.max_queued_turns = options.max_queued_turns;
    fake.n_ctx = options.n_ctx > 0 ? options.n_ctx : EnvInt("KVFS_FAKE_CONTEXT", 4096);
    fake.piece_delay = std::chrono::milliseconds(EnvInt("KVFS_FAKE_DELAY_MS", 0));
    fake.kv_bytes_per_token = EnvInt("KVFS_FAKE_KV_BYTES_PER_TOKEN", 64);
    fake.workers = 4;
    KVFS_ASSIGN_OR_RETURN(auto engine, kvfs::testing::FakeEngine::Open(std::move(fake)));
    return std::unique_ptr<kvfs::AgentEngine>(std::move(engine));
  });
}
