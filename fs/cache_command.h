#pragma once
// `dsfs cache show DIR [--json]` and `dsfs cache clear DIR`: what a disk cache (`dsfs mount
// --disk-cache DIR`) holds, per dataset and generation, and emptying it while no mount uses it.
#include <CLI/CLI.hpp>

namespace dsfs::fs {
void register_cache_command(CLI::App& app);
}  // namespace dsfs::fs
