// The dsfs command: registers each subcommand and maps failures to exit statuses.
#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

#include "fs/cache_command.h"
#include "fs/mount_command.h"
#include "fs/mount_helper.h"
#include "src/cli/common.h"
#include "src/cli/server_command.h"
#include "src/store/log_text.h"
#include "tools/admin_commands.h"
#include "tools/bench_command.h"
#include "tools/ingest_command.h"
#include "tools/plan_command.h"
#include "tools/proxy_command.h"
#include "tools/stats_command.h"
#include "tools/synth_command.h"

int main(int argc, char** argv) {
  CLI::App app{
      "dsfs serves deep-learning datasets stored in Redis as a read-only FUSE filesystem.\n"
      "Without --redis (or DSFS_REDIS) every command uses the embedded redis-server under\n"
      "$DSFS_HOME (default ~/.local/share/dsfs), starting it when needed.",
      "dsfs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dsfs 0.1.0");
  dsfs::cli::GlobalOptions global;

  dsfs::cli::register_server_command(app, global);
  dsfs::tools::register_synth_command(app, global);
  dsfs::tools::register_ingest_command(app, global);
  dsfs::tools::register_admin_commands(app, global);
  dsfs::fs::register_mount_commands(app, global);
  dsfs::fs::register_cache_command(app);
  dsfs::tools::register_bench_command(app, global);
  dsfs::tools::register_proxy_command(app, global);
  dsfs::tools::register_plan_command(app, global);
  dsfs::tools::register_stats_command(app, global);

  // `dsfs SOURCE MOUNTPOINT -o OPTIONS`, as mount(8) runs it for type fuse.dsfs (fstab), is
  // parsed as the `dsfs mount ...` it translates to.
  std::optional<std::vector<std::string>> helper_form;
  try {
    helper_form = dsfs::fs::mount_helper_argv(app, argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dsfs: error: {}\n", e.what());
    return 1;
  }
  // CLI11 parses a copy; the process's own argv, which `ps` shows, loses its passwords first.
  std::vector<std::string> arguments =
      helper_form ? *helper_form : std::vector<std::string>(argv, argv + argc);
  std::vector<char*> argument_pointers;
  for (std::string& argument : arguments) argument_pointers.push_back(argument.data());
  dsfs::cli::scrub_secrets_from_argv(argc, argv);
  // CLI11 answers a first word that is no subcommand with "A subcommand is required".
  if (arguments.size() > 1 && !arguments[1].empty() && arguments[1][0] != '-') {
    try {
      app.get_subcommand(arguments[1]);
    } catch (const CLI::OptionNotFound&) {
      fmt::print(stderr, "dsfs: error: unknown command '{}'; `dsfs --help` lists them\n",
                 dsfs::store::log_text(arguments[1]));
      return 1;
    }
  }
  try {
    app.parse(static_cast<int>(argument_pointers.size()), argument_pointers.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dsfs::cli::ExitCode& e) {
    return e.code;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dsfs: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
