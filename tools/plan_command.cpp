// `dsfs plan MOUNT FILE|-`: checks and normalizes the paths, then writes them to .dsfs/plan.
#include "tools/plan_command.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <system_error>

#include "src/cli/common.h"
#include "tools/progress.h"
#include "tools/scoped_fd.h"

namespace dsfs::tools {
namespace {

namespace fs = std::filesystem;

// Absolute and lexically normal, without a trailing separator ("/mnt/" -> "/mnt").
fs::path normal_directory(const fs::path& directory) {
  fs::path normal = fs::absolute(directory).lexically_normal();
  if (!normal.has_filename() && normal != normal.root_path()) normal = normal.parent_path();
  return normal;
}

// True when `line` is relative and already normal: no empty, "." or ".." component.
bool is_plain_relative(std::string_view line) {
  if (line.empty() || line.front() == '/' || line.back() == '/') return false;
  size_t start = 0;
  while (start <= line.size()) {
    size_t end = line.find('/', start);
    if (end == std::string_view::npos) end = line.size();
    const std::string_view part = line.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

std::string plan_write_error(const fs::path& plan, int error) {
  switch (error) {
    case EROFS:
      return fmt::format(
          "cannot open {} for writing: {}; the mount was made read-only (-o ro), which takes no "
          "plan: remount it without -o ro to write one",
          plan.string(), std::strerror(error));
    case ENOENT:
      return fmt::format(
          "cannot open {} for writing: {}; this mount takes no plan (its dsfs predates the "
          "prefetch engine): remount it with this dsfs",
          plan.string(), std::strerror(error));
    case EACCES:
    case EPERM:
      return fmt::format(
          "cannot open {} for writing: {}; only the user who mounted it can write the plan "
          "(run dsfs plan as that user)",
          plan.string(), std::strerror(error));
    default:
      return fmt::format("cannot open {} for writing: {}", plan.string(), std::strerror(error));
  }
}

}  // namespace

void check_dsfs_mount(const fs::path& mount) {
  std::error_code error;
  const fs::file_status status = fs::status(mount, error);
  if (error && error != std::errc::no_such_file_or_directory) {
    throw PlanInputError(fmt::format(
        "cannot look into {}: {} (a dsfs mount whose daemon died? `dsfs umount {}` clears it)",
        mount.string(), error.message(), mount.string()));
  }
  if (!fs::is_directory(status)) {
    throw PlanInputError(
        fmt::format("{} is not a directory; give the directory `dsfs mount` "
                    "mounted",
                    mount.string()));
  }
  if (fs::is_regular_file(mount / kStatsFile, error)) return;
  if (error && error != std::errc::no_such_file_or_directory) {
    throw PlanInputError(
        cli::unreadable_in_mount((mount / kStatsFile).string(), mount.string(), error.value()));
  }

  std::string hint;
  const fs::path normal = normal_directory(mount);
  for (fs::path parent = normal.parent_path(); parent != normal.root_path();
       parent = parent.parent_path()) {
    if (fs::is_regular_file(parent / kStatsFile, error)) {
      hint = fmt::format("; it is inside the dsfs mount {}: give that instead", parent.string());
      break;
    }
  }
  throw PlanInputError(
      fmt::format("{} is not a dsfs mount (it has no {}){}", mount.string(), kStatsFile,
                  hint.empty() ? "; give the directory `dsfs mount` mounted" : hint));
}

std::vector<fs::path> mount_root_spellings(const fs::path& mount) {
  std::vector<fs::path> roots{normal_directory(mount)};
  std::error_code error;
  const fs::path real = fs::canonical(mount, error);
  if (!error && real != roots.front()) roots.push_back(real);
  return roots;
}

PlanPathNormalizer::PlanPathNormalizer(std::vector<fs::path> mount_roots) {
  for (const fs::path& root : mount_roots) mount_roots_.push_back(normal_directory(root));
}

std::optional<std::string> PlanPathNormalizer::normalize(std::string_view line,
                                                         uint64_t line_number) const {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty()) return std::nullopt;
  if (line.find('\0') != std::string_view::npos) {
    throw PlanInputError(
        fmt::format("line {}: contains a NUL byte; give one path per line", line_number));
  }
  if (is_plain_relative(line)) return std::string(line);  // the common case, kept cheap

  const fs::path normal = fs::path(line).lexically_normal();
  if (normal.is_absolute()) {
    const fs::path target = normal_directory(normal);  // without a trailing '/'
    bool is_mount_root = false;
    for (const fs::path& root : mount_roots_) {
      const fs::path relative = target.lexically_relative(root);
      if (relative.empty() || *relative.begin() == "..") continue;
      if (relative == ".") {
        is_mount_root = true;
        break;
      }
      return relative.string();
    }
    if (is_mount_root) {
      throw PlanInputError(fmt::format(
          "line {}: {} is the mount itself; give the files to read under it", line_number, line));
    }
    throw PlanInputError(
        fmt::format("line {}: {} is not under the mount {}; give paths relative to the mount (e.g. "
                    "NAME/dir/file.jpg) or absolute paths inside it",
                    line_number, line, mount_roots_.front().string()));
  }
  if (normal.empty() || normal == ".") {
    throw PlanInputError(fmt::format(
        "line {}: {} is the mount itself; give the files to read under it", line_number, line));
  }
  if (*normal.begin() == "..") {
    throw PlanInputError(
        fmt::format("line {}: {} climbs out of the mount; give paths relative to the mount root",
                    line_number, line));
  }
  return normal.string();
}

PlanText read_plan_input(std::istream& input, const PlanPathNormalizer& normalizer,
                         std::string_view source) {
  PlanText plan;
  std::string line;
  uint64_t line_number = 0;
  while (std::getline(input, line)) {
    ++line_number;
    std::optional<std::string> path = normalizer.normalize(line, line_number);
    if (!path) continue;
    plan.text += *path;
    plan.text += '\n';
    ++plan.paths;
  }
  if (input.bad()) {
    throw PlanInputError(
        fmt::format("cannot read {} after line {}: {}", source, line_number, std::strerror(errno)));
  }
  return plan;
}

void write_plan_text(int fd, std::string_view text, size_t chunk) {
  if (chunk == 0) chunk = 1;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = std::min(text.size(), start + chunk);
    if (end < text.size()) {
      // Cut after the last line end in the chunk, or after the one long line it starts.
      const size_t last = text.rfind('\n', end - 1);
      if (last != std::string_view::npos && last >= start) {
        end = last + 1;
      } else {
        const size_t next = text.find('\n', end);
        end = next == std::string_view::npos ? text.size() : next + 1;
      }
    }
    while (start < end) {
      const ssize_t written = ::write(fd, text.data() + start, end - start);
      if (written < 0) {
        if (errno == EINTR) continue;
        throw std::system_error(errno, std::generic_category(),
                                fmt::format("write after {} of {} bytes", start, text.size()));
      }
      start += static_cast<size_t>(written);
    }
  }
}

void write_plan_file(const fs::path& mount, std::string_view text, bool append) {
  const fs::path plan = mount / kPlanFile;
  ScopedFd fd(::open(plan.c_str(), O_WRONLY | O_CLOEXEC | (append ? O_APPEND : O_TRUNC)));
  if (fd.get() < 0) throw std::runtime_error(plan_write_error(plan, errno));
  // An empty plan has no write to replace the old one with, and when the kernel passes O_TRUNC
  // along with an OPEN the mount skips, the truncation never arrives: truncate explicitly.
  if (!append && text.empty() && ::ftruncate(fd.get(), 0) != 0) {
    throw std::runtime_error(
        fmt::format("cannot clear {}: {}", plan.string(), std::strerror(errno)));
  }
  try {
    write_plan_text(fd.get(), text);
  } catch (const std::system_error& e) {
    throw std::runtime_error(fmt::format("writing {} failed: {}", plan.string(), e.what()));
  }
  if (const int error = fd.close(); error != 0) {
    throw std::runtime_error(
        fmt::format("writing {} failed on close: {}", plan.string(), std::strerror(error)));
  }
}

namespace {

struct PlanCommandState {
  std::string mount;
  std::string input = "-";
  bool append = false;
};

void run_plan_command(const PlanCommandState& state) {
  PlanText plan;
  try {
    check_dsfs_mount(state.mount);
    const PlanPathNormalizer normalizer(mount_root_spellings(state.mount));
    if (state.input == "-") {
      plan = read_plan_input(std::cin, normalizer, "standard input");
    } else {
      std::ifstream file(state.input, std::ios::binary);
      if (!file) {
        throw PlanInputError(fmt::format("cannot read {}: {}", state.input, std::strerror(errno)));
      }
      plan = read_plan_input(file, normalizer, state.input);
    }
  } catch (const PlanInputError& e) {
    fmt::print(stderr, "dsfs: error: {}\n", e.what());
    throw cli::ExitCode{2};
  }

  if (state.append && plan.paths == 0) {
    fmt::print("dsfs plan: no paths in {}: the plan is unchanged\n",
               state.input == "-" ? "standard input" : state.input);
    return;
  }
  write_plan_file(state.mount, plan.text, state.append);
  const std::string plan_file = (fs::path(state.mount) / kPlanFile).string();
  if (plan.paths == 0) {
    fmt::print("dsfs plan: cleared the plan of {}\n", state.mount);
  } else {
    fmt::print("dsfs plan: {} {} path(s) {} {}\n", state.append ? "appended" : "wrote",
               format_count(plan.paths), state.append ? "to" : "as the new plan in", plan_file);
  }
}

}  // namespace

void register_plan_command(CLI::App& app, cli::GlobalOptions& global) {
  auto state = std::make_shared<PlanCommandState>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "Tell a mount's prefetch engine the exact order of the coming reads: copy the paths in\n"
      "FILE (or standard input for '-'), one per line, to MOUNT/.dsfs/plan. Paths are relative\n"
      "to MOUNT (NAME/dir/file.jpg) or absolute paths inside it; CRs and empty lines are\n"
      "dropped; lines naming no file are counted as unresolved in .dsfs/stats.json. Replaces\n"
      "the plan (an empty FILE clears it) unless --append. Only the user who mounted MOUNT may\n"
      "write its plan. Exits 2 if MOUNT is not a dsfs mount or a line lies outside it (the plan\n"
      "is then untouched), 1 if the plan could not be written.");
  sub->add_option("MOUNT", state->mount, "Root of a dsfs mount (where `dsfs mount` mounted it)")
      ->required();
  sub->add_option("FILE", state->input, "File of paths, one per line; '-': standard input")
      ->required();
  sub->add_flag("--append,-a", state->append,
                "Add the paths to the end of the current plan instead of replacing it");
  cli::add_log_level_option(*sub, global);
  sub->callback([state, &global] {
    cli::apply_log_level(global);
    run_plan_command(*state);
  });
}

}  // namespace dsfs::tools
