#include "daemon/daemon.h"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <pthread.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "daemon/config.h"
#include "daemon/mount_util.h"
#include "daemon/store_lock.h"
#include "engine/core/read_file.h"
#include "engine/kv/kv_format.h"
#include "fs/agent_store.h"
#include "fs/fuse_server.h"

namespace kvfs::daemon {

namespace {

// Signals the signal thread takes: those that stop the daemon, SIGHUP, and stray ones whose
// default action would kill it without unmounting (logged and ignored). SIGUSR1 is also
// internal: the main thread sends it to the signal thread when an external unmount ended the loop.
constexpr int kHandledSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGALRM};

sigset_t HandledSignalSet() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : kHandledSignals) sigaddset(&set, s);
  return set;
}

Status MakeDirs(const std::string& path) {
  std::string partial;
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      partial = path.substr(0, i);
      if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
        return IoError("cannot create " + partial + ": " + std::strerror(errno));
      }
    }
  }
  return Status::Ok();
}

// Background mode: the parent waits until the child has mounted (or failed) and exits with its
// status, so `kvfsd --mount DIR && ls DIR` works.
class Daemonizer {
 public:
  // Returns in the child (or at once in foreground mode). In the parent it never returns.
  Status Fork() {
    if (::pipe(pipe_) != 0) return IoError(std::string("pipe: ") + std::strerror(errno));
    pid_t pid = ::fork();
    if (pid < 0) return IoError(std::string("fork: ") + std::strerror(errno));
    if (pid > 0) {
      ::close(pipe_[1]);
      char code = 1;
      ssize_t n = ::read(pipe_[0], &code, 1);
      ::_exit(n == 1 ? code : 1);
    }
    ::close(pipe_[0]);
    ::setsid();
    active_ = true;
    return Status::Ok();
  }
  // Child: report the start-up result to the waiting parent; on success detach stdio.
  void Report(int code, const std::string& log_file) {
    if (!active_) return;
    if (code == 0) {
      int null_fd = ::open("/dev/null", O_RDWR);
      int log_fd = ::open(log_file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
      if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
      int out = log_fd >= 0 ? log_fd : null_fd;
      if (out >= 0) ::dup2(out, STDOUT_FILENO), ::dup2(out, STDERR_FILENO);
      if (null_fd > 2) ::close(null_fd);
      if (log_fd > 2) ::close(log_fd);
      // Best effort: a daemon that cannot chdir or tell its parent still serves (the parent
      // then exits 1 when the pipe closes without a byte).
      [[maybe_unused]] int chdir_rc = ::chdir("/");
    }
    char c = static_cast<char>(code);
    [[maybe_unused]] ssize_t written = ::write(pipe_[1], &c, 1);
    ::close(pipe_[1]);
    active_ = false;
  }

 private:
  int pipe_[2] = {-1, -1};
  bool active_ = false;
};

// Logs go to stderr; a background kvfsd writes them to its log file, and shows on the terminal
// only its warnings and errors until it has detached (Logging::Detach): the start's progress is
// in the file, what went wrong on both.
class Logging {
 public:
  Status SetUp(const DaemonConfig& config) {
    dist_ = std::make_shared<spdlog::sinks::dist_sink_mt>();
    terminal_ = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    if (!config.foreground) terminal_->set_level(spdlog::level::warn);
    dist_->add_sink(terminal_);
    if (!config.foreground) {
      // spdlog reports a file it cannot open by throwing: caught here, returned as a value.
      log_file_ = config.log_file;
      // The log's directory must exist (spdlog would make it, anywhere), and a new log is made
      // private (0600) before spdlog opens it: messages may name agents and files.
      const std::string log_dir = std::filesystem::path(log_file_).parent_path().string();
      if (!log_dir.empty() && !std::filesystem::is_directory(log_dir))
        return IoError("cannot open the log file " + config.log_file + ": no directory " + log_dir);
      if (int fd = ::open(log_file_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600); fd >= 0) ::close(fd);
      try {
        file_ = std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_file_);
      } catch (const spdlog::spdlog_ex& e) {
        return IoError("cannot open the log file " + config.log_file + ": " + e.what());
      }
      dist_->add_sink(file_);
    }
    auto logger = std::make_shared<spdlog::logger>("kvfsd", dist_);
    logger->set_level(spdlog::level::from_str(config.log_level));
    logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [kvfsd] [%l] %v");
    // A background start shows on the terminal what went wrong as the command's message, as
    // its other errors read; the log file keeps the timestamps.
    if (!config.foreground) terminal_->set_pattern("kvfsd: %v");
    logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(logger);
    return Status::Ok();
  }
  void Detach() {
    if (dist_ && terminal_) dist_->remove_sink(terminal_);
  }
  // SIGHUP of a background daemon (logrotate moved the file away): the log goes on in a new file
  // at the same path, and so does what the process writes to stdout and stderr.
  void ReopenFile() {
    if (file_ == nullptr) return;
    if (int fd = ::open(log_file_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600); fd >= 0) ::close(fd);
    try {
      auto fresh = std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_file_);
      dist_->add_sink(fresh);
      dist_->remove_sink(file_);
      file_ = std::move(fresh);
    } catch (const spdlog::spdlog_ex& e) {
      spdlog::error("SIGHUP: cannot reopen the log file {} ({}); logging on to the old one", log_file_, e.what());
      return;
    }
    int fd = ::open(log_file_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO), ::dup2(fd, STDERR_FILENO);
      if (fd > 2) ::close(fd);
    }
    spdlog::info("SIGHUP: log file {} reopened", log_file_);
  }

 private:
  std::shared_ptr<spdlog::sinks::dist_sink_mt> dist_;
  spdlog::sink_ptr terminal_;
  spdlog::sink_ptr file_;  // background only
  std::string log_file_;
};

}  // namespace

int RunDaemon(int argc, char** argv, const EngineFactory& make_engine) {
  // Until it detaches, the daemon logs to the terminal or pipe that started it: one closed early
  // (`kvfsd ... | head -1`, an ssh session gone) must not kill it with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv, argv + argc);
  Result<DaemonConfig> parsed = ParseDaemonArgs(args);
  if (!parsed.ok()) {
    std::fprintf(stderr, "kvfsd: %s\n", parsed.status().message().c_str());
    return 2;
  }
  DaemonConfig config = std::move(parsed).value();
  if (config.help) {
    std::fputs(DaemonUsage().c_str(), stdout);
    return 0;
  }
  Status resolved = ResolveDefaults(config, Environment::FromProcess());
  if (!resolved.ok()) {
    std::fprintf(stderr, "kvfsd: %s\n", resolved.message().c_str());
    return 2;
  }
  // Absolute before a background daemon's chdir("/"): a SIGHUP reopens the log by this path.
  config.mountpoint = AbsolutePath(config.mountpoint);
  config.store_dir = AbsolutePath(config.store_dir);
  config.log_file = AbsolutePath(config.log_file);
  config.model_path = AbsolutePath(config.model_path);
  if (!config.vulkan_tuning.empty()) config.vulkan_tuning = AbsolutePath(config.vulkan_tuning);
  // kvfsd writes its store and its log while it serves the mount: inside the mount, each write
  // would wait on kvfsd itself (a hang in D state that only kill -9 ends).
  for (const auto& [what, path] : {std::pair<const char*, std::string>{"store", config.store_dir},
                                   std::pair<const char*, std::string>{"log file", config.log_file}}) {
    if (!path.empty() && PathIsWithin(path, config.mountpoint)) {
      std::fprintf(stderr, "kvfsd: the %s %s is inside the mount point %s: kvfsd would wait on its own mount; "
                   "choose a %s outside it (--%s)\n",
                   what, path.c_str(), config.mountpoint.c_str(), what, what == std::string("store") ? "store" : "log-file");
      return 2;
    }
  }
  // Nor inside another kvfsd's mount: a directory made there is an agent (the store's, or a
  // mount point's), and writes there are turns and edits, not files.
  for (const std::string& other : KvfsMountpoints()) {
    for (const auto& [what, path] : {std::pair<const char*, std::string>{"mount point", config.mountpoint},
                                     std::pair<const char*, std::string>{"store", config.store_dir},
                                     std::pair<const char*, std::string>{"log file", config.log_file}}) {
      // (The mount point itself: PrepareMountpoint says whether a kvfsd still serves it.)
      if (path.empty() || (path == other && what == std::string("mount point")) || !PathIsWithin(path, other)) continue;
      std::fprintf(stderr, "kvfsd: the %s %s is inside the kvfs mount at %s: choose one outside it\n", what,
                   path.c_str(), other.c_str());
      return 2;
    }
  }
  // The log is appended to: inside the store it may only be a file of its own at the top (the
  // default STORE/kvfsd.log), never one of the store's files or directories (an agent's
  // manifest, the audit trail), and never the model.
  if (!config.log_file.empty()) {
    const std::filesystem::path log(config.log_file);
    const std::string name = log.filename().string();
    // Compared resolved (a store reached through a link), and the log itself must be no link
    // (STORE/x.log -> an agent's manifest).
    std::error_code ec1, ec2, ec3;
    const bool own_file_at_top =
        std::filesystem::weakly_canonical(log.parent_path(), ec1) == std::filesystem::weakly_canonical(config.store_dir, ec2) &&
        !ec1 && !ec2 && log.extension() == ".log" && name != "audit.log" && !std::filesystem::is_symlink(log, ec3);
    if (PathIsWithin(config.log_file, config.store_dir) && !own_file_at_top) {
      std::fprintf(stderr, "kvfsd: the log file %s is inside the store %s, among the files kvfsd keeps there; "
                   "choose another path (--log-file; STORE/kvfsd.log, the default, is fine)\n",
                   config.log_file.c_str(), config.store_dir.c_str());
      return 2;
    }
    if (SameFile(config.log_file, config.model_path)) {
      std::fprintf(stderr, "kvfsd: the log file %s is the model file: choose another path (--log-file)\n",
                   config.log_file.c_str());
      return 2;
    }
  }
  // A mount point another kvfsd serves is refused before the store is made: a new store
  // directory would be left behind.
  if (Status s = CheckMountpointFree(config.mountpoint); !s.ok()) {
    std::fprintf(stderr, "kvfsd: %s\n", s.message().c_str());
    return 2;
  }
  if (Status s = MakeDirs(config.store_dir); !s.ok()) {
    std::fprintf(stderr, "kvfsd: %s\n", s.message().c_str());
    return 1;
  }
  Logging logging;
  if (Status s = logging.SetUp(config); !s.ok()) {
    std::fprintf(stderr, "kvfsd: %s\n", s.message().c_str());
    return 1;
  }

  // Before the fork, so that a second daemon on this store says so on the terminal.
  Result<StoreLock> store_lock = StoreLock::Acquire(config.store_dir);
  if (!store_lock.ok()) {
    std::fprintf(stderr, "kvfsd: %s\n", store_lock.status().message().c_str());
    return 1;
  }

  Daemonizer daemonizer;
  if (!config.foreground) {
    if (Status s = daemonizer.Fork(); !s.ok()) {
      std::fprintf(stderr, "kvfsd: %s\n", s.message().c_str());
      return 1;
    }
  }
  store_lock->RecordPid();
  auto fail = [&](int code, const Status& s) {
    spdlog::critical("{}", s.message());
    daemonizer.Report(code, config.log_file);
    logging.Detach();
    return code;
  };

  // Every thread created from here on (engine, FUSE workers) inherits the blocked stop
  // signals; only the signal thread receives them, with sigwait.
  sigset_t handled_signals = HandledSignalSet();
  pthread_sigmask(SIG_BLOCK, &handled_signals, nullptr);

  Result<bool> created_mountpoint = PrepareMountpoint(config.mountpoint);
  if (!created_mountpoint.ok()) return fail(2, created_mountpoint.status());
  // Declared before the server: the directory goes after the unmount.
  CreatedMountpoint mountpoint_guard(AbsolutePath(config.mountpoint), *created_mountpoint);

  EngineOptions engine_options;
  engine_options.model_path = config.model_path;
  engine_options.store_dir = config.store_dir;
  engine_options.n_threads = config.threads > 0 ? config.threads : static_cast<int>(std::thread::hardware_concurrency());
  // Default q4k, unless blocks are not whole 64-token K chunks: q4 then.
  const bool q4k_fits = config.block_tokens % kQ4KChunkTokens == 0;
  engine_options.kv = !config.kv.empty() ? config.kv : q4k_fits ? "q4k" : "q4";
  engine_options.kv_budget_bytes = config.kv_budget_bytes;
  engine_options.backend = config.backend;
  engine_options.device = config.device;
  engine_options.kv_device_bytes = config.kv_device_budget_bytes;
  engine_options.vulkan_tuning = config.vulkan_tuning;
  engine_options.block_tokens = config.block_tokens;
  engine_options.n_ctx = config.context_tokens;
  engine_options.max_queued_turns = static_cast<size_t>(config.max_queued_turns);
  spdlog::info("loading {} (store {}, kv {}, {} threads)", config.model_path, config.store_dir, engine_options.kv,
               engine_options.n_threads);
  Result<std::unique_ptr<AgentEngine>> engine = make_engine(engine_options);
  if (!engine.ok()) return fail(engine.status().code() == StatusCode::kInternal ? 1 : 2, engine.status());

  fs::StoreConfig store_config;
  store_config.max_prompt_bytes = static_cast<size_t>(config.max_prompt_bytes);
  store_config.audit_log_path = config.store_dir + "/audit.log";
  store_config.import_spill_dir = config.store_dir;  // large kv.safetensors imports wait on disk
  store_config.store_dir = config.store_dir;         // what statfs (df) of the mount reports
  store_config.root_uid = ::geteuid();
  store_config.root_gid = ::getegid();
  Result<std::unique_ptr<fs::AgentStore>> store = fs::AgentStore::Create(**engine, store_config);
  if (!store.ok()) {
    (*engine)->Shutdown();
    return fail(1, store.status());
  }

  fs::FuseServerOptions fuse_options;
  fuse_options.mountpoint = config.mountpoint;
  fuse_options.allow_other = ::geteuid() == 0;
  fuse_options.max_threads = config.fuse_threads;
  fuse_options.debug = config.log_level == "trace";
  Result<std::unique_ptr<fs::FuseServer>> server = fs::FuseServer::Mount(**store, fuse_options);
  if (!server.ok()) {
    (*engine)->Shutdown();
    return fail(1, server.status());
  }
  spdlog::info("mounted at {} ({} agents)", config.mountpoint, (*engine)->ListAgents().size());
  if (!config.foreground) logging.Detach();  // from here on the log file only
  daemonizer.Report(0, config.log_file);

  // The shutdown sequence runs on the signal thread: refuse new turns, let the engine finish or
  // cancel the running ones and flush the store, wake blocked readers, then end the FUSE loop
  // (unmounting happens when the server is destroyed).
  std::atomic<bool> loop_ended{false};
  std::thread signal_thread([&] {
    int signal = 0;
    for (;;) {
      sigwait(&handled_signals, &signal);
      if (signal == SIGUSR1 && loop_ended.load()) break;
      if (signal == SIGUSR1 || signal == SIGUSR2 || signal == SIGALRM) {
        spdlog::warn("{}: ignored (SIGTERM stops kvfsd{})", strsignal(signal),
                     config.foreground ? "" : ", SIGHUP reopens its log file");
        continue;
      }
      // A background daemon has no terminal to hang up: its SIGHUP is logrotate's, or a user's.
      if (signal != SIGHUP || config.foreground) break;
      logging.ReopenFile();
    }
    if (signal != SIGUSR1) spdlog::info("{}: shutting down", strsignal(signal));
    (*store)->BeginShutdown();
    (*engine)->Shutdown();
    (*store)->WakeAllReaders();
    (*server)->RequestExit();
  });
  Status served = (*server)->Run();
  // An external unmount ends the loop without a signal: run the same sequence.
  loop_ended.store(true);
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  server->reset();  // unmount
  store->reset();
  engine->reset();
  if (!served.ok()) {
    spdlog::error("{}", served.message());
    return 1;
  }
  spdlog::info("stopped");
  return 0;
}

}  // namespace kvfs::daemon
