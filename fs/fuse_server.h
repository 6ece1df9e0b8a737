// FuseServer: mounts AgentStore as a FUSE filesystem (low-level API, multi-threaded loop) and
// unmounts it. No FUSE types in this header.
#pragma once

#include <memory>
#include <string>

#include "engine/core/status.h"
#include "fs/agent_store.h"

namespace kvfs::fs {

struct FuseServerOptions {
  std::string mountpoint;
  bool allow_other = true;    // needs root (or user_allow_other in /etc/fuse.conf)
  int max_threads = 64;       // blocked `response` readers each hold one
  bool debug = false;         // libfuse's request log on stderr
};

class FuseServer {
 public:
  // Mounts. The store must outlive the server.
  static Result<std::unique_ptr<FuseServer>> Mount(AgentStore& store, const FuseServerOptions& options);
  ~FuseServer();  // unmounts

  // Serves requests until RequestExit() or an external unmount.
  Status Run();
  // Any thread, once the store's readers have been woken (blocked requests must finish for the
  // loop to end).
  void RequestExit();
  const std::string& mountpoint() const { return mountpoint_; }

  struct State;  // fuse_ops.cpp

 private:
  FuseServer() = default;
  std::unique_ptr<State> state_;
  std::string mountpoint_;
  int max_threads_ = 64;
};

}  // namespace kvfs::fs
