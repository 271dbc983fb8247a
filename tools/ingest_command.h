#pragma once
#include "src/cli/common.h"

namespace dsfs::tools {
// `dsfs ingest SRC --dataset NAME [--labels auto|none] [--metadata FILE.jsonl] ...`.
void register_ingest_command(CLI::App& app, cli::GlobalOptions& global);
}  // namespace dsfs::tools
