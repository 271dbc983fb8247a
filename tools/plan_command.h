#pragma once
// `dsfs plan MOUNT FILE|-`: hands a mount's prefetch engine the exact order of the coming reads
// by writing paths, one per line, to MOUNT/.dsfs/plan. Also the checks `dsfs stats` shares.
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "src/cli/common.h"

namespace dsfs::tools {

// Input or a mount that a plan cannot be made from: not a dsfs mount, an unreadable FILE, a line
// naming a path outside the mount. `dsfs plan` exits 2 on it, before the plan is touched.
class PlanInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr std::string_view kPlanFile = ".dsfs/plan";
inline constexpr std::string_view kStatsFile = ".dsfs/stats.json";
// Writes end on line boundaries and are at most this long (unless one line is longer).
inline constexpr size_t kPlanWriteChunk = size_t{1} << 20;

// Throws PlanInputError unless `mount` is a directory holding .dsfs/stats.json; when it is inside
// a dsfs mount (e.g. a dataset's directory), the message names the mount's root.
void check_dsfs_mount(const std::filesystem::path& mount);

// Turns each input line into the path relative to the mount root that the plan holds.
class PlanPathNormalizer {
 public:
  // `mount_roots`: absolute, lexically normal spellings of the mount's root (see
  // mount_root_spellings); an absolute line under any of them becomes relative to it.
  explicit PlanPathNormalizer(std::vector<std::filesystem::path> mount_roots);

  // The line without a trailing CR, relative and lexically normal (no ".", "..", "//"); nullopt
  // for an empty line. Throws PlanInputError naming `line_number` (1-based) for an absolute
  // path outside the mount, a relative one climbing out of it with "..", the mount root itself,
  // or a NUL byte.
  std::optional<std::string> normalize(std::string_view line, uint64_t line_number) const;

 private:
  std::vector<std::filesystem::path> mount_roots_;
};

// The mount as given made absolute, and its realpath when that differs (a symlinked spelling):
// lines may use either.
std::vector<std::filesystem::path> mount_root_spellings(const std::filesystem::path& mount);

// The plan's text: every non-empty line of `input`, normalized, newline-terminated, in order.
// `source` names the input in errors. Throws PlanInputError.
struct PlanText {
  std::string text;
  uint64_t paths = 0;
};
PlanText read_plan_input(std::istream& input, const PlanPathNormalizer& normalizer,
                         std::string_view source);

// Writes `text` (whole lines) to `fd` in writes of at most `chunk` bytes that each end at a line
// end, so the engine never sees a path cut in two by a write boundary. Throws
// std::system_error on a failed write.
void write_plan_text(int fd, std::string_view text, size_t chunk = kPlanWriteChunk);

// Opens MOUNT/.dsfs/plan (O_TRUNC: replaces the plan; `append`: O_APPEND, extends it) and
// writes `text`. Throws std::runtime_error saying why the plan could not be written and what to
// do (the mount predates the engine, only its owner may write it, ...).
void write_plan_file(const std::filesystem::path& mount, std::string_view text, bool append);

// `dsfs plan MOUNT FILE|- [--append]`.
void register_plan_command(CLI::App& app, cli::GlobalOptions& global);

}  // namespace dsfs::tools
