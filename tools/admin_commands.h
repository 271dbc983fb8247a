#pragma once
#include "src/cli/common.h"

namespace dsfs::tools {
// `dsfs list`, `dsfs info NAME`, `dsfs rm NAME`.
void register_admin_commands(CLI::App& app, cli::GlobalOptions& global);
}  // namespace dsfs::tools
