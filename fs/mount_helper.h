#pragma once
// The mount-helper form of the command line: for a filesystem of type fuse.dsfs (`mount -t
// fuse.dsfs`, /etc/fstab, systemd .mount units), mount(8) runs fuse3's mount.fuse3, which runs
// `dsfs SOURCE MOUNTPOINT -o OPTIONS`. This turns that argv into the `dsfs mount` argv that does
// the same mount.
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace dsfs::fs {

// A long option of `dsfs mount` as CLI11 names it ("cache-size"); a flag takes no value.
struct MountOptionName {
  std::string name;
  bool takes_value = true;
};

// What the translation needs to know of the command line and the filesystem.
struct MountHelperContext {
  // argv[1] naming one of these is that subcommand, never a SOURCE.
  std::vector<std::string> subcommands;
  // The long options of `dsfs mount`: what -o name[=value] may set, spelled with - or _.
  std::vector<MountOptionName> mount_options;
  // Whether a path names a directory (the MOUNTPOINT).
  std::function<bool(const std::string&)> is_directory;
};

// Returns nullopt unless `argv` is `dsfs SOURCE MOUNTPOINT [-o OPTIONS]...` (also -oOPTIONS):
// SOURCE neither a subcommand nor an option, MOUNTPOINT a directory. Else the argv of the same
// mount as `dsfs mount MOUNTPOINT ...` (argv[0] kept), where
//   SOURCE `dsfs`                 mounts every dataset of the default Redis (as `dsfs mount`);
//   SOURCE `SCHEME://...`         every dataset of that Redis (--redis SOURCE);
//   any other SOURCE              that one dataset (--dataset SOURCE) on the default Redis;
//   -o name[=value]               a `dsfs mount` long option (--name[=value], _ read as -);
//   -o allow_other, ro, nodev...  FUSE and kernel mount options libfuse takes: -o of dsfs mount;
//   -o _netdev, defaults, x-*...  options for mount(8), mount.fuse3 or systemd, and atime
//                                 variants (no effect on a read-only FUSE filesystem): dropped.
// Throws std::invalid_argument naming the culprit and what to do for an unknown option, a
// `dsfs mount` option without its value, SOURCE conflicting with dataset= or redis=, or an
// argument other than -o after MOUNTPOINT.
std::optional<std::vector<std::string>> translate_mount_helper_argv(
    const std::vector<std::string>& argv, const MountHelperContext& context);

// The context of the real command line: `app`'s subcommands, the options of its "mount"
// subcommand, and is_directory from the filesystem.
MountHelperContext mount_helper_context(const CLI::App& app);

// Refuses (std::invalid_argument) a Redis password file that users other than its owner may
// read: mount(8) runs dsfs as root, so an fstab line's redis_password_file= must be 0600 or 0400.
// A file that cannot be stat()ed passes: reading it later names the error.
void check_password_file_mode(const std::string& path);

// main()'s entry: translate_mount_helper_argv with mount_helper_context(app), and for the
// translated form check_password_file_mode of its --redis-password-file. Throws like both.
std::optional<std::vector<std::string>> mount_helper_argv(const CLI::App& app, int argc,
                                                          char** argv);

}  // namespace dsfs::fs
