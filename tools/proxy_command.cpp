#include "tools/proxy_command.h"

#include <CLI/CLI.hpp>

namespace dsfs::tools {

// Being written (issue 3); registered so src/main.cpp is final.
void register_proxy_command(CLI::App& app, cli::GlobalOptions&) {
  app.add_subcommand("proxy", "(not built yet)");
}

}  // namespace dsfs::tools
