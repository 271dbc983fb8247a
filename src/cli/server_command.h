#pragma once
#include "src/cli/common.h"

namespace dsfs::cli {
// `dsfs server start|stop|status`: the single embedded redis-server (the default), or with
// `start --shards N [--replicas R]` a local Redis Cluster in its place.
void register_server_command(CLI::App& app, GlobalOptions& global);
}  // namespace dsfs::cli
