#pragma once
#include "src/cli/common.h"

namespace dsfs::cli {
// `dsfs server start|stop|status`.
void register_server_command(CLI::App& app, GlobalOptions& global);
}  // namespace dsfs::cli
