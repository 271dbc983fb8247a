#pragma once
#include "src/cli/common.h"

namespace dsfs::tools {
// `dsfs proxy --listen ADDR --upstream ADDR --rtt D [--jitter D] [--rate R]`.
void register_proxy_command(CLI::App& app, cli::GlobalOptions& global);
}  // namespace dsfs::tools
