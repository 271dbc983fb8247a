#pragma once
#include "src/cli/common.h"

namespace dsfs::fs {
// `dsfs mount MOUNTPOINT [--dataset NAME ...] [-f] [-o opts] ...` and `dsfs umount MOUNTPOINT`.
void register_mount_commands(CLI::App& app, cli::GlobalOptions& global);
}  // namespace dsfs::fs
