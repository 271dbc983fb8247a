#pragma once
#include "src/cli/common.h"

namespace dsfs::tools {
// `dsfs bench PATH [--pattern seq|shuffle|epochs] [--jobs N] ... [--json FILE]`.
void register_bench_command(CLI::App& app, cli::GlobalOptions& global);
}  // namespace dsfs::tools
