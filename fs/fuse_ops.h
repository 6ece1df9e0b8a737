// The FUSE low-level operations over AgentStore (private to fs/: includes libfuse).
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "fs/agent_store.h"
#include "fs/fuse_server.h"
#include "fs/interrupt.h"

namespace kvfs::fs {

// What the callbacks reach through fuse_req_userdata().
struct FuseServer::State {
  explicit State(AgentStore& s) : store(s) {}
  AgentStore& store;
  fuse_session* session = nullptr;

  // Interrupts of requests in flight, by id. libfuse may call the interrupt callback after the
  // request was answered, so the callback gets an id (not a pointer) and looks it up here.
  std::mutex interrupts_mu;
  std::unordered_map<uint64_t, std::shared_ptr<Interrupt>> interrupts;
  uint64_t next_interrupt = 1;
};

const fuse_lowlevel_ops& KvfsOperations();

}  // namespace kvfs::fs
