#include "fs/mount_helper.h"

#include <fmt/core.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <stdexcept>
#include <string_view>

#include "src/catalog/names.h"

namespace dsfs::fs {
namespace {

// The SOURCE that means "every dataset on the default Redis" (also what `mount` shows as the
// source of every dsfs mount).
constexpr std::string_view kAllDatasetsSource = "dsfs";

// Kernel and libfuse mount options libfuse 3.14's fuse_session_new takes: passed on.
constexpr std::string_view kFuseFlags[] = {
    "ro",      "suid",        "nosuid",     "dev",          "nodev",
    "exec",    "noexec",      "async",      "sync",         "dirsync",
    "noatime", "allow_other", "allow_root", "auto_unmount", "default_permissions"};
constexpr std::string_view kFuseValued[] = {"max_read",  "fsname",     "context",
                                            "fscontext", "defcontext", "rootcontext"};
// Dropped: mount(8), mount.fuse3 or systemd act on them (mount.fuse3 strips some itself, but
// `dsfs SOURCE DIR -o ...` may be typed by hand), `rw` is the default, and the atime variants,
// iversion, nomand and (no)symfollow change nothing on dsfs: its files never change and it has
// no symlinks (libfuse 3.14 refuses nodiratime and nosymfollow).
constexpr std::string_view kDropped[] = {
    "rw",          "defaults",      "auto",       "noauto",     "user",     "nouser",
    "users",       "owner",         "group",      "_netdev",    "nofail",   "loud",
    "silent",      "atime",         "diratime",   "nodiratime", "relatime", "norelatime",
    "strictatime", "nostrictatime", "lazytime",   "nolazytime", "iversion", "noiversion",
    "nomand",      "symfollow",     "nosymfollow"};
constexpr std::string_view kDroppedPrefixes[] = {"x-", "comment="};

template <typename List>
bool contains(const List& list, std::string_view word) {
  return std::find(std::begin(list), std::end(list), word) != std::end(list);
}

// Whether `text` starts with "SCHEME://" (RFC 3986 scheme).
bool starts_with_url_scheme(std::string_view text) {
  if (text.empty() || !std::isalpha(static_cast<unsigned char>(text[0]))) return false;
  size_t i = 1;
  while (i < text.size() && (std::isalnum(static_cast<unsigned char>(text[i])) || text[i] == '+' ||
                             text[i] == '-' || text[i] == '.')) {
    ++i;
  }
  return text.substr(i).starts_with("://");
}

// Splits -o's comma-separated list; a piece that starts with SCHEME:// belongs to the one before
// (redis=redis://a:7000,redis://b:7000 names the seed nodes of one cluster).
std::vector<std::string> split_options(std::string_view list) {
  std::vector<std::string> options;
  size_t begin = 0;
  while (begin <= list.size()) {
    size_t comma = list.find(',', begin);
    if (comma == std::string_view::npos) comma = list.size();
    const std::string_view piece = list.substr(begin, comma - begin);
    if (!options.empty() && starts_with_url_scheme(piece)) {
      options.back() += ',';
      options.back() += piece;
    } else if (!piece.empty()) {
      options.emplace_back(piece);
    }
    begin = comma + 1;
  }
  return options;
}

std::string unknown_option_message(std::string_view option) {
  return fmt::format(
      "unknown mount option '{}': -o takes the long options of `dsfs mount` with - or _ "
      "(e.g. cache_size=2G, dataset=NAME, prefetch=off, redis_password_file=FILE; `dsfs mount "
      "--help` lists them), FUSE options (allow_other, allow_root, auto_unmount, max_read=N, "
      "fsname=NAME) and generic ones (ro, rw, nodev, nosuid, noexec, noatime, _netdev, x-*)",
      option);
}

}  // namespace

std::optional<std::vector<std::string>> translate_mount_helper_argv(
    const std::vector<std::string>& argv, const MountHelperContext& context) {
  if (argv.size() < 3) return std::nullopt;
  const std::string& source = argv[1];
  const std::string& mountpoint = argv[2];
  if (source.empty() || source.starts_with('-') || mountpoint.starts_with('-') ||
      contains(context.subcommands, source) || !context.is_directory(mountpoint)) {
    return std::nullopt;
  }

  std::vector<std::string> option_lists;
  for (size_t i = 3; i < argv.size(); ++i) {
    if (argv[i] == "-o") {
      if (i + 1 == argv.size()) {
        throw std::invalid_argument("-o needs a value: dsfs SOURCE MOUNTPOINT -o OPTION,...");
      }
      option_lists.push_back(argv[++i]);
    } else if (argv[i].starts_with("-o")) {
      option_lists.push_back(argv[i].substr(2));
    } else {
      throw std::invalid_argument(fmt::format(
          "unexpected argument '{}': '{}' is not a subcommand (`dsfs --help` lists them), so "
          "dsfs took the command for the mount-helper form, SOURCE MOUNTPOINT [-o OPTION,...]",
          argv[i], source));
    }
  }

  std::vector<std::string> dsfs_options;
  std::string fuse_options;
  bool names_dataset = false;
  bool names_redis = false;
  for (const std::string& list : option_lists) {
    for (const std::string& option : split_options(list)) {
      const size_t equals = option.find('=');
      const std::string key = option.substr(0, equals);
      std::string name = key;
      std::replace(name.begin(), name.end(), '_', '-');
      const auto dsfs_option =
          std::find_if(context.mount_options.begin(), context.mount_options.end(),
                       [&](const MountOptionName& known) { return known.name == name; });
      if (dsfs_option != context.mount_options.end()) {
        if (dsfs_option->takes_value && equals == std::string::npos) {
          throw std::invalid_argument(
              fmt::format("mount option '{}' needs a value: {}=VALUE", key, key));
        }
        names_dataset = names_dataset || name == "dataset";
        names_redis = names_redis || name == "redis";
        dsfs_options.push_back("--" + name +
                               (equals == std::string::npos ? "" : option.substr(equals)));
      } else if (contains(kDropped, option) ||
                 std::any_of(std::begin(kDroppedPrefixes), std::end(kDroppedPrefixes),
                             [&](std::string_view prefix) { return option.starts_with(prefix); })) {
        continue;
      } else if ((equals == std::string::npos && contains(kFuseFlags, option)) ||
                 (equals != std::string::npos && contains(kFuseValued, key))) {
        fuse_options += (fuse_options.empty() ? "" : ",") + option;
      } else {
        throw std::invalid_argument(unknown_option_message(option));
      }
    }
  }

  std::vector<std::string> translated = {argv[0], "mount", mountpoint};
  if (starts_with_url_scheme(source)) {
    if (names_redis) {
      throw std::invalid_argument(fmt::format(
          "SOURCE is a Redis URL and -o names redis= too: give the Redis once (SOURCE {} "
          "with -o redis=...)",
          kAllDatasetsSource));
    }
    translated.push_back("--redis=" + source);
  } else if (source != kAllDatasetsSource) {
    if (names_dataset) {
      throw std::invalid_argument(fmt::format(
          "SOURCE '{}' names a dataset and -o names dataset= too: use SOURCE {} (or a Redis "
          "URL) with dataset=NAME for each dataset",
          source, kAllDatasetsSource));
    }
    if (!catalog::is_valid_dataset_name(source)) {
      throw std::invalid_argument(
          fmt::format("SOURCE '{}' is neither {} (every dataset), a Redis URL (redis://HOST:PORT, "
                      "unix:///PATH.sock) nor a dataset name (1-128 of A-Z a-z 0-9 . _ -)",
                      source, kAllDatasetsSource));
    }
    translated.push_back("--dataset=" + source);
  }
  translated.insert(translated.end(), dsfs_options.begin(), dsfs_options.end());
  if (!fuse_options.empty()) {
    translated.push_back("-o");
    translated.push_back(fuse_options);
  }
  return translated;
}

MountHelperContext mount_helper_context(const CLI::App& app) {
  MountHelperContext context;
  const CLI::App* mount = nullptr;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    context.subcommands.push_back(sub->get_name());
    if (sub->get_name() == "mount") mount = sub;
  }
  if (mount != nullptr) {
    for (const CLI::Option* option : mount->get_options()) {
      for (const std::string& name : option->get_lnames()) {
        if (name == "help" || name == "version") continue;
        context.mount_options.push_back({name, option->get_expected_min() > 0});
      }
    }
  }
  context.is_directory = [](const std::string& path) {
    std::error_code error;
    return std::filesystem::is_directory(path, error);
  };
  return context;
}

void check_password_file_mode(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;
  if ((st.st_mode & (S_IRGRP | S_IROTH)) != 0) {
    throw std::invalid_argument(fmt::format(
        "the Redis password file {} is readable by other users (mode {:04o}): make it readable "
        "by its owner only, `chmod 600 {}`",
        path, st.st_mode & 07777, path));
  }
}

std::optional<std::vector<std::string>> mount_helper_argv(const CLI::App& app, int argc,
                                                          char** argv) {
  std::optional<std::vector<std::string>> translated = translate_mount_helper_argv(
      std::vector<std::string>(argv, argv + argc), mount_helper_context(app));
  if (translated) {
    constexpr std::string_view kPasswordFile = "--redis-password-file=";
    for (const std::string& argument : *translated) {
      if (argument.starts_with(kPasswordFile)) {
        check_password_file_mode(argument.substr(kPasswordFile.size()));
      }
    }
  }
  return translated;
}

}  // namespace dsfs::fs
