#include "fs/fuse_server.h"

#include <cstring>
#include <sys/stat.h>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "fs/fuse_ops.h"

namespace kvfs::fs {

Result<std::unique_ptr<FuseServer>> FuseServer::Mount(AgentStore& store, const FuseServerOptions& options) {
  auto server = std::unique_ptr<FuseServer>(new FuseServer());
  server->state_ = std::make_unique<State>(store);
  server->mountpoint_ = options.mountpoint;
  server->max_threads_ = options.max_threads;
  // default_permissions: the kernel checks modes and owners (agents are 0700); allow_other:
  // other users reach the mount at all.
  std::vector<std::string> args = {"kvfsd", "-o", "default_permissions,fsname=kvfs,subtype=kvfs"};
  if (options.allow_other) args.insert(args.end(), {"-o", "allow_other"});
  if (options.debug) args.push_back("-d");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse_session* se = fuse_session_new(&fargs, &KvfsOperations(), sizeof(fuse_lowlevel_ops), server->state_.get());
  fuse_opt_free_args(&fargs);
  if (se == nullptr) return Internal("fuse_session_new failed (see the message above)");
  if (fuse_session_mount(se, options.mountpoint.c_str()) != 0) {
    fuse_session_destroy(se);
    return IoError("cannot mount kvfs at " + options.mountpoint + " (see the message above)");
  }
  server->state_->session = se;
  return server;
}

FuseServer::~FuseServer() {
  if (state_ && state_->session != nullptr) {
    fuse_session_unmount(state_->session);
    fuse_session_destroy(state_->session);
    state_->session = nullptr;
  }
}

Status FuseServer::Run() {
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(config, static_cast<unsigned>(max_threads_));
  fuse_loop_cfg_set_idle_threads(config, 8);
  int rc = fuse_session_loop_mt(state_->session, config);
  fuse_loop_cfg_destroy(config);
  if (rc != 0 && rc != -EINTR) return IoError("the FUSE loop failed: " + std::string(std::strerror(rc < 0 ? -rc : rc)));
  return Status::Ok();
}

void FuseServer::RequestExit() {
  fuse_session_exit(state_->session);
  // The loop notices the exit flag only when a worker wakes: a lookup of a name that cannot
  // exist sends one request through the mount (from a thread of its own: it returns when a
  // worker answers it, or with ENOTCONN once unmounted).
  std::string probe = mountpoint_ + "/.kvfsd-exit";
  std::thread([probe] {
    struct stat st {};
    ::stat(probe.c_str(), &st);
  }).detach();
}

}  // namespace kvfs::fs
