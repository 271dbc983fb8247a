#include "src/cli/server_command.h"

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "src/store/embedded_server.h"

namespace dsfs::cli {
namespace {

void print_status(const store::EmbeddedServerStatus& status) {
  fmt::print("running: {}\n", status.running ? "yes" : "no");
  if (status.running) fmt::print("pid: {}\n", status.pid);
  fmt::print("socket: {}\n", status.socket.string());
  fmt::print("url: unix://{}\n", status.socket.string());
  fmt::print("data: {}\n", status.data_dir.string());
  fmt::print("log: {}\n", status.log_file.string());
}

}  // namespace

void register_server_command(CLI::App& app, GlobalOptions& global) {
  CLI::App* server = app.add_subcommand(
      "server",
      "Manage the embedded redis-server that dsfs uses when no --redis URL (or DSFS_REDIS) is "
      "given. It listens only on a unix socket in $DSFS_HOME/redis (default "
      "~/.local/share/dsfs/redis) and keeps its data there (append-only file plus snapshots), "
      "so datasets survive stop and start. Other commands start it on demand.");
  server->require_subcommand(1);

  CLI::App* start = server->add_subcommand(
      "start",
      "Start the embedded redis-server and wait until it answers. Does nothing (exit 0) when it "
      "is already running. Needs Debian's redis-server package.");
  add_log_level_option(*start, global);
  start->callback([&global] {
    apply_log_level(global);
    store::EmbeddedServer embedded;
    const bool started = embedded.start();
    const auto status = embedded.status();
    if (started) {
      fmt::print("started the embedded redis-server (pid {})\n", status.pid);
    } else {
      fmt::print("the embedded redis-server is already running (pid {})\n", status.pid);
    }
    print_status(status);
  });

  CLI::App* stop = server->add_subcommand(
      "stop",
      "Stop the embedded redis-server after saving its data (SHUTDOWN SAVE). Its data stays in "
      "$DSFS_HOME/redis/data for the next start. Exit 0 also when it was not running.");
  add_log_level_option(*stop, global);
  stop->callback([&global] {
    apply_log_level(global);
    store::EmbeddedServer embedded;
    if (embedded.stop()) {
      fmt::print("stopped the embedded redis-server; data kept in {}\n",
                 embedded.status().data_dir.string());
    } else {
      fmt::print("the embedded redis-server is not running\n");
    }
  });

  CLI::App* status = server->add_subcommand(
      "status",
      "Show whether the embedded redis-server is running, its pid, socket, data directory and "
      "log. Exit status: 0 when running, 3 when not.");
  add_log_level_option(*status, global);
  status->callback([&global] {
    apply_log_level(global);
    const auto current = store::EmbeddedServer().status();
    print_status(current);
    if (!current.running) throw ExitCode{3};
  });
}

}  // namespace dsfs::cli
