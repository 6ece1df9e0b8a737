// kvfsd: the kvfs daemon on the real inference engine.
#include "daemon/daemon.h"

int main(int argc, char** argv) {
  return kvfs::daemon::RunDaemon(argc, argv, [](const kvfs::EngineOptions& options) {
    return kvfs::CreateEngine(options);
  });
}
