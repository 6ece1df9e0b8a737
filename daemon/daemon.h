// kvfsd's body: configuration, wiring of engine + AgentStore + FUSE, daemonizing, signals and
// an orderly shutdown. The engine comes from a factory so that a test daemon can run the same
// code over a fake engine (tests/fs/kvfsd_fake_main.cpp).
#pragma once

#include <functional>
#include <memory>

#include "engine/core/status.h"
#include "engine/runtime/agent_engine.h"
#include "engine/runtime/engine.h"

namespace kvfs::daemon {

using EngineFactory = std::function<Result<std::unique_ptr<AgentEngine>>(const EngineOptions&)>;

// Returns the process exit status: 0 after a clean shutdown, 2 for bad options or input, 1 for
// other failures.
int RunDaemon(int argc, char** argv, const EngineFactory& make_engine);

}  // namespace kvfs::daemon
