#pragma once
#include "src/cli/common.h"

namespace dsfs::tools {
// `dsfs synth DIR --classes C --per-class N --seed S`.
void register_synth_command(CLI::App& app, cli::GlobalOptions& global);
}  // namespace dsfs::tools
