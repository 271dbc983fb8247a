#define FUSE_USE_VERSION 314
#include "fs/filesystem.h"

#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/limits.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <optional>
#include <string_view>

#include "cuda/view_service.h"
#include "fs/virtual_files.h"
#include "src/store/errors.h"
#include "src/store/log_text.h"

namespace dsfs::fs {
namespace {

// Data and tree are immutable for a mount's snapshot, so the kernel may cache them for a day.
constexpr double kImmutableTimeout = 86400.0;
constexpr blksize_t kPreferredIoSize = 128 * 1024;
// What directories report as their size, as on most local filesystems (du counts them).
constexpr off_t kDirectorySize = 4096;

constexpr std::string_view kUserXattrPrefix = "user.";
constexpr std::string_view kLabelXattr = "user.dsfs.label";
constexpr std::string_view kClassXattr = "user.dsfs.class";
constexpr std::string_view kMetaXattr = "user.dsfs.meta";

timespec to_timespec(int64_t unix_ns) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(unix_ns / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(unix_ns % 1'000'000'000);
  if (ts.tv_nsec < 0) {
    ts.tv_nsec += 1'000'000'000;
    ts.tv_sec -= 1;
  }
  return ts;
}

void set_times(struct stat& st, int64_t unix_ns) {
  st.st_mtim = st.st_atim = st.st_ctim = to_timespec(unix_ns);
}

// Read-only views of the ingested permission bits: write and set-id bits cleared, and the
// owner can always read (and enter directories).
mode_t file_permissions(uint32_t ingested) {
  const mode_t bits = ingested & 0555;
  return bits == 0 ? 0444 : (bits | 0400);
}
mode_t directory_permissions(uint32_t ingested) {
  const mode_t bits = ingested & 0555;
  return bits == 0 ? 0555 : (bits | 0500);
}

// The kernel passes at most this much of an xattr value (XATTR_SIZE_MAX); a longer one cannot
// be read (E2BIG), so it is not listed either: tools that copy every listed xattr
// (shutil.copy2, getfattr -d, cp --preserve=xattr) would fail on the file.
constexpr size_t kMaxXattrValue = XATTR_SIZE_MAX;

// Answers an xattr value or name-list request, honouring the size-probe protocol.
void reply_xattr_bytes(fuse_req_t req, std::string_view bytes, size_t size) {
  if (size == 0) {
    fuse_reply_xattr(req, bytes.size());
  } else if (size < bytes.size()) {
    fuse_reply_err(req, ERANGE);
  } else {
    fuse_reply_buf(req, bytes.data(), bytes.size());
  }
}

// Fills a readdir reply buffer of at most `size` bytes.
class DirectoryBuffer {
 public:
  DirectoryBuffer(fuse_req_t req, size_t size, bool plus) : req_(req), buf_(size), plus_(plus) {}

  // Adds one entry whose successor is at `next_offset`; false when it does not fit.
  bool add(std::string_view name, const fuse_entry_param& entry, off_t next_offset) {
    const std::string name_z(name);
    char* at = buf_.data() + used_;
    const size_t room = buf_.size() - used_;
    const size_t need =
        plus_ ? fuse_add_direntry_plus(req_, at, room, name_z.c_str(), &entry, next_offset)
              : fuse_add_direntry(req_, at, room, name_z.c_str(), &entry.attr, next_offset);
    if (need > room) return false;
    used_ += need;
    return true;
  }
  void reply() { fuse_reply_buf(req_, buf_.data(), used_); }
  bool plus() const { return plus_; }

 private:
  fuse_req_t req_;
  std::vector<char> buf_;
  size_t used_ = 0;
  bool plus_;
};

}  // namespace

uint64_t default_cache_bytes() {
  constexpr uint64_t kMaxDefault = 1ull << 30;
  constexpr uint64_t kMinDefault = 64ull << 20;
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return kMaxDefault;
  const uint64_t physical = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
  return std::clamp(physical / 8, kMinDefault, kMaxDefault);
}

namespace {
store::ConnectOptions connect_options(std::chrono::milliseconds timeout) {
  using std::chrono::milliseconds;
  // A stalled server must break a connection well within a read's retry budget.
  return store::ConnectOptions{
      .connect_timeout = std::clamp(timeout, milliseconds{200}, milliseconds{2000}),
      .io_timeout = std::clamp(timeout, milliseconds{1000}, milliseconds{10000}),
  };
}
}  // namespace

Filesystem::Filesystem(store::RedisEndpoint endpoint,
                       std::vector<prefetch::DatasetSnapshot> datasets, FilesystemOptions options)
    : options_(std::move(options)),
      datasets_(std::move(datasets)),
      pool_(std::move(endpoint), options_.connections, connect_options(options_.timeout)),
      cache_(options_.cache_bytes),
      fetcher_(pool_, catalog::KeySchema(options_.ns),
               prefetch::FetcherOptions{.timeout = options_.timeout}),
      reader_(cache_, fetcher_, options_.verify),
      engine_(cache_, fetcher_, datasets_, pool_.endpoint(), options_.verify,
              prefetch::EngineOptions{.mode = options_.prefetch,
                                      .connections = options_.connections,
                                      .max_inflight = options_.max_inflight,
                                      .connect = connect_options(options_.timeout)}),
      views_(reader_, cache_, options_.view_cache_bytes),
      mounted_unix_(static_cast<int64_t>(std::time(nullptr))),
      owner_uid_(getuid()),
      owner_gid_(getgid()) {
  if (datasets_.size() > kMaxDatasets) {
    throw std::invalid_argument(fmt::format("a mount can hold at most {} datasets", kMaxDatasets));
  }
  for (uint32_t i = 0; i < datasets_.size(); ++i) {
    datasets_[i].index = i;
    if (!datasets_[i].catalog) throw std::invalid_argument("dataset snapshot without a catalogue");
    if (datasets_[i].name() == kMetaDirName || datasets_[i].name() == kControlDirName ||
        datasets_[i].name() == kViewsDirName) {
      throw std::invalid_argument(
          fmt::format("a dataset named '{}' would hide the mount's own {} directory",
                      datasets_[i].name(), datasets_[i].name()));
    }
    if (!dataset_by_name_.emplace(datasets_[i].name(), i).second) {
      throw std::invalid_argument(fmt::format("dataset '{}' named twice", datasets_[i].name()));
    }
    meta_.push_back(std::make_unique<MetaContents>());
  }
  if (datasets_.size() > kMaxViewDatasets) {
    spdlog::warn("only the first {} of {} datasets appear under {}", kMaxViewDatasets,
                 datasets_.size(), kViewsDirName);
  }
  if (options_.prefetch != prefetch::PrefetchMode::kOff) reader_.set_engine(&engine_);
}

Filesystem::~Filesystem() {
  engine_.stop();
}

void Filesystem::start_views() {
  view::ViewServiceOptions service_options;
  service_options.max_pixels = options_.view_max_pixels;
  service_options.render_memory_bytes = options_.view_render_memory_bytes;
  auto service = std::make_unique<view::ViewService>(view::make_backend(options_.view_backend),
                                                     service_options);
  const bool ahead =
      options_.prefetch != prefetch::PrefetchMode::kOff && options_.view_render_ahead_threads > 0;
  spdlog::info(
      "view backend: {}{}; view cache {} MiB (files up to {} MiB); images up to {} pixels; "
      "render memory {} MiB; rendering ahead: {}",
      service->backend_name(), service->batched() ? " (batched)" : "",
      options_.view_cache_bytes >> 20, views_.registry().max_file_bytes() >> 20,
      options_.view_max_pixels, options_.view_render_memory_bytes >> 20,
      ahead ? fmt::format("{} threads", options_.view_render_ahead_threads) : "off");
  // Plans may name view files; they stand for their source images.
  engine_.set_plan_line_mapper(
      [this](std::string_view line) { return views_.plan_source_path(line, datasets_); });
  views_.start(std::move(service), ahead ? &engine_ : nullptr, options_.view_render_ahead_threads);
}

const std::string& Filesystem::meta_content(uint32_t dataset, MetaFile file) {
  const auto slot = static_cast<size_t>(file);
  MetaContents& contents = *meta_[dataset];
  std::call_once(contents.once[slot], [&] {
    const prefetch::DatasetSnapshot& d = datasets_[dataset];
    switch (file) {
      case MetaFile::kInfo:
        contents.text[slot] = render_info_json(d, options_.ns);
        break;
      case MetaFile::kClasses:
        contents.text[slot] = render_classes_txt(*d.catalog);
        break;
      case MetaFile::kLabels:
        contents.text[slot] = render_labels_csv(*d.catalog);
        break;
      case MetaFile::kMetadata:
        contents.text[slot] = render_metadata_jsonl(*d.catalog);
        break;
      case MetaFile::kDirectory:
        break;
    }
  });
  return contents.text[slot];
}

uint64_t Filesystem::new_stats_snapshot() {
  auto snapshot = std::make_shared<const std::string>(stats_json());
  MutexLock lock(stats_snapshots_mutex_);
  const uint64_t ino = ++last_stats_snapshot_;
  stats_snapshots_.emplace(ino, CountedSnapshot{std::move(snapshot), 1});
  return ino;
}

Filesystem::StatsSnapshot Filesystem::stats_snapshot(uint64_t ino) const {
  MutexLock lock(stats_snapshots_mutex_);
  const auto it = stats_snapshots_.find(ino);
  return it == stats_snapshots_.end() ? nullptr : it->second.text;
}

void Filesystem::forget_stats_snapshot(uint64_t ino, uint64_t lookups) {
  MutexLock lock(stats_snapshots_mutex_);
  const auto it = stats_snapshots_.find(ino);
  if (it == stats_snapshots_.end()) return;
  if (it->second.lookups <= lookups) {
    stats_snapshots_.erase(it);
  } else {
    it->second.lookups -= lookups;
  }
}

std::string Filesystem::stats_json() const {
  return render_stats_json(StatsSources{
      .fs = counters_,
      .fetcher = fetcher_.stats(),
      .cache = cache_.stats(),
      .redis_connects = pool_.connects(),
      .views = views_.stats(),
      .reads = reader_.stats(),
      .prefetch = engine_.stats(),
      .datasets = datasets_,
      .started = started_,
      .redis_endpoint = pool_.endpoint().describe(),
      .ns = options_.ns,
  });
}

// The request handlers. Every one answers its request exactly once, exceptions included.
struct Handlers {
  static Filesystem& self(fuse_req_t req) {
    return *static_cast<Filesystem*>(fuse_req_userdata(req));
  }

  // Runs `body`, turning an escaping exception into an error reply.
  template <typename Body>
  static void guarded(fuse_req_t req, Op op, Body&& body) {
    Filesystem& fs = self(req);
    fs.counters_.count(op);
    try {
      body(fs);
    } catch (const ViewRenderError&) {
      fuse_reply_err(req, EIO);  // already logged and counted, once per file
    } catch (const prefetch::IntegrityError&) {
      fs.counters_.count(ErrorKind::kIntegrity);  // already logged with the key
      fuse_reply_err(req, EIO);
    } catch (const store::ConnectionError&) {
      fs.counters_.count(ErrorKind::kUnavailable);
      fuse_reply_err(req, EIO);
    } catch (const store::ReplyError&) {
      fs.counters_.count(ErrorKind::kRedisError);
      fuse_reply_err(req, EIO);
    } catch (const std::exception& e) {
      fs.counters_.count(ErrorKind::kInternal);
      spdlog::error("{} request failed: {}", op_name(op), e.what());
      fuse_reply_err(req, EIO);
    }
  }

  // Answers with errno `error`, counting the ones stats.json reports.
  static void fail(Filesystem& fs, fuse_req_t req, int error) {
    if (error == EROFS) fs.counters_.count(ErrorKind::kReadOnly);
    if (error == ENOENT) fs.counters_.count(ErrorKind::kNotFound);
    fuse_reply_err(req, error);
  }

  // The dataset and entry an inode names, if it names an existing one.
  static const prefetch::DatasetSnapshot* dataset_of(Filesystem& fs, const InodeRef& ref) {
    if (ref.dataset >= fs.datasets_.size()) return nullptr;
    const prefetch::DatasetSnapshot& d = fs.datasets_[ref.dataset];
    if (ref.kind == InodeRef::Kind::kEntry && ref.entry >= d.catalog->entry_count()) return nullptr;
    return &d;
  }

  // What a .views/SPEC/NAME/... inode names, if it exists: a directory, or an image file.
  struct ViewTarget {
    const ViewRegistry::Slot* slot = nullptr;
    const prefetch::DatasetSnapshot* dataset = nullptr;
    const catalog::CatalogEntry* entry = nullptr;
    explicit operator bool() const { return entry != nullptr; }
  };
  static ViewTarget view_target(Filesystem& fs, const InodeRef& ref) {
    if (ref.kind != InodeRef::Kind::kViewEntry) return {};
    const ViewRegistry::Slot* slot = fs.views_.registry().slot(ref.view_slot);
    if (!slot || ref.dataset >= fs.datasets_.size()) return {};
    const prefetch::DatasetSnapshot& d = fs.datasets_[ref.dataset];
    if (ref.entry >= d.catalog->entry_count()) return {};
    const catalog::CatalogEntry& e = d.catalog->entry(ref.entry);
    if (!e.is_dir && !is_image_name(d.catalog->name(ref.entry))) return {};
    return ViewTarget{slot, &d, &e};
  }

  // The name and inode under which child `index` of a .views directory is listed; nullopt for a
  // file that is not an image, and for an image whose .npy name a sibling directory already has
  // (lookup finds the directory).
  static std::optional<std::pair<std::string, uint64_t>> view_child(const InodeRef& dir,
                                                                    const ViewTarget& target,
                                                                    uint32_t index) {
    const catalog::Catalog& catalog = *target.dataset->catalog;
    const std::string_view name = catalog.name(index);
    if (catalog.entry(index).is_dir) {
      return std::pair{std::string(name), view_entry_inode(dir.view_slot, dir.dataset, index)};
    }
    if (!is_image_name(name)) return std::nullopt;
    std::string view_name = view_file_name(name);
    if (const auto same = catalog.lookup(dir.entry, view_name);
        same && catalog.entry(*same).is_dir) {
      return std::nullopt;
    }
    return std::pair{std::move(view_name),
                     view_entry_inode(target.slot->canonical, dir.dataset, index)};
  }

  static void stat_entry(Filesystem& fs, const prefetch::DatasetSnapshot& d, uint32_t index,
                         struct stat& st) {
    stat_catalog_entry(fs, d, index, entry_inode(d.index, index), std::nullopt, st);
  }

  // Attributes of catalogue entry `index` shown as inode `ino`: the entry's own, or for a view
  // file the size of its .npy (`view_size`).
  static void stat_catalog_entry(Filesystem& fs, const prefetch::DatasetSnapshot& d, uint32_t index,
                                 uint64_t ino, std::optional<uint64_t> view_size, struct stat& st) {
    const catalog::Catalog& catalog = *d.catalog;
    const catalog::CatalogEntry& e = catalog.entry(index);
    st.st_ino = ino;
    st.st_uid = fs.owner_uid_;
    st.st_gid = fs.owner_gid_;
    st.st_blksize = kPreferredIoSize;
    set_times(st, e.mtime_ns);
    if (e.is_dir) {
      st.st_mode = S_IFDIR | directory_permissions(e.mode);
      nlink_t subdirectories = 0;
      for (uint32_t c = e.first_child; c < e.first_child + e.child_count; ++c) {
        subdirectories += catalog.entry(c).is_dir;
      }
      st.st_nlink = 2 + subdirectories;
      st.st_size = kDirectorySize;
      st.st_blocks = kDirectorySize / 512;
    } else {
      const uint64_t size = view_size.value_or(e.size);
      st.st_mode = S_IFREG | file_permissions(e.mode);
      st.st_nlink = 1;
      st.st_size = static_cast<off_t>(size);
      st.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
    }
  }

  static void stat_virtual(Filesystem& fs, uint64_t ino, mode_t mode, nlink_t nlink, uint64_t size,
                           int64_t mtime_unix, struct stat& st) {
    st.st_ino = ino;
    st.st_mode = mode;
    st.st_nlink = nlink;
    st.st_uid = fs.owner_uid_;
    st.st_gid = fs.owner_gid_;
    st.st_size = static_cast<off_t>(size);
    st.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
    st.st_blksize = kPreferredIoSize;
    set_times(st, mtime_unix * 1'000'000'000);
  }

  // Attributes of any inode; false if it names nothing. `timeout` is how long they may be cached.
  static bool stat_inode(Filesystem& fs, uint64_t ino, struct stat& st, double& timeout) {
    st = {};
    timeout = kImmutableTimeout;
    const InodeRef ref = decode_inode(ino);
    const auto dataset_count = static_cast<nlink_t>(fs.datasets_.size());
    switch (ref.kind) {
      case InodeRef::Kind::kInvalid:
        return false;
      case InodeRef::Kind::kRoot:
        stat_virtual(fs, ino, S_IFDIR | 0555, 2 + 3 + dataset_count, kDirectorySize,
                     fs.mounted_unix_, st);
        return true;
      case InodeRef::Kind::kViewsDir:
        stat_virtual(fs, ino, S_IFDIR | 0555, 2 + fs.views_.registry().preset_count(),
                     kDirectorySize, fs.mounted_unix_, st);
        return true;
      case InodeRef::Kind::kViewSpec:
        if (!fs.views_.registry().slot(ref.view_slot)) return false;
        stat_virtual(fs, ino, S_IFDIR | 0555,
                     2 + std::min<nlink_t>(dataset_count, kMaxViewDatasets), kDirectorySize,
                     fs.mounted_unix_, st);
        return true;
      case InodeRef::Kind::kViewEntry: {
        const ViewTarget target = view_target(fs, ref);
        if (!target) return false;
        stat_catalog_entry(
            fs, *target.dataset, ref.entry, ino,
            target.entry->is_dir ? std::nullopt : std::optional(target.slot->file_size), st);
        return true;
      }
      case InodeRef::Kind::kMetaDir:
        stat_virtual(fs, ino, S_IFDIR | 0555, 2 + dataset_count, kDirectorySize, fs.mounted_unix_,
                     st);
        return true;
      case InodeRef::Kind::kControlDir:
        stat_virtual(fs, ino, S_IFDIR | 0555, 2, kDirectorySize, fs.mounted_unix_, st);
        return true;
      case InodeRef::Kind::kPlan:
        // Write-only for the owner, and its size changes with every write.
        timeout = 0;
        stat_virtual(fs, ino, S_IFREG | 0200, 1, fs.engine_.plan_size(), std::time(nullptr), st);
        return true;
      case InodeRef::Kind::kStats:
        // Only a name: lookups answer with a snapshot inode, so nothing reads this one.
        timeout = 0;
        stat_virtual(fs, ino, S_IFREG | 0444, 1, 0, std::time(nullptr), st);
        return true;
      case InodeRef::Kind::kStatsSnapshot: {
        const Filesystem::StatsSnapshot snapshot = fs.stats_snapshot(ino);
        if (!snapshot) return false;
        stat_virtual(fs, ino, S_IFREG | 0444, 1, snapshot->size(), std::time(nullptr), st);
        return true;
      }
      case InodeRef::Kind::kMeta: {
        const prefetch::DatasetSnapshot* d = dataset_of(fs, ref);
        if (!d) return false;
        if (ref.meta == MetaFile::kDirectory) {
          stat_virtual(fs, ino, S_IFDIR | 0555, 2, kDirectorySize, d->info.created_unix, st);
        } else {
          const uint64_t size = fs.meta_content(ref.dataset, ref.meta).size();
          stat_virtual(fs, ino, S_IFREG | 0444, 1, size, d->info.created_unix, st);
        }
        return true;
      }
      case InodeRef::Kind::kEntry: {
        const prefetch::DatasetSnapshot* d = dataset_of(fs, ref);
        if (!d) return false;
        stat_entry(fs, *d, ref.entry, st);
        return true;
      }
    }
    return false;
  }

  static bool is_directory(const InodeRef& ref, Filesystem& fs) {
    switch (ref.kind) {
      case InodeRef::Kind::kRoot:
      case InodeRef::Kind::kMetaDir:
      case InodeRef::Kind::kControlDir:
      case InodeRef::Kind::kViewsDir:
        return true;
      case InodeRef::Kind::kViewSpec:
        return fs.views_.registry().slot(ref.view_slot) != nullptr;
      case InodeRef::Kind::kViewEntry: {
        const ViewTarget target = view_target(fs, ref);
        return target && target.entry->is_dir;
      }
      case InodeRef::Kind::kMeta:
        return ref.meta == MetaFile::kDirectory;
      case InodeRef::Kind::kEntry: {
        const prefetch::DatasetSnapshot* d = dataset_of(fs, ref);
        return d && d->catalog->entry(ref.entry).is_dir;
      }
      default:
        return false;
    }
  }

  // The child of directory `parent` called `name`: its inode, or 0 if there is none.
  static uint64_t find_child(Filesystem& fs, uint64_t parent, std::string_view name) {
    const InodeRef ref = decode_inode(parent);
    switch (ref.kind) {
      case InodeRef::Kind::kRoot: {
        if (name == kMetaDirName) return kMetaDirInode;
        if (name == kControlDirName) return kControlDirInode;
        if (name == kViewsDirName) return kViewsDirInode;
        const auto it = fs.dataset_by_name_.find(std::string(name));
        return it == fs.dataset_by_name_.end() ? 0 : entry_inode(it->second, catalog::kRootIndex);
      }
      case InodeRef::Kind::kMetaDir: {
        const auto it = fs.dataset_by_name_.find(std::string(name));
        return it == fs.dataset_by_name_.end() ? 0 : meta_inode(it->second, MetaFile::kDirectory);
      }
      case InodeRef::Kind::kControlDir:
        if (name == kPlanFileName) return kPlanInode;
        return name == kStatsFileName ? kStatsInode : 0;
      case InodeRef::Kind::kMeta: {
        if (ref.meta != MetaFile::kDirectory || !dataset_of(fs, ref)) return 0;
        const std::optional<MetaFile> file = meta_file_by_name(name);
        return file ? meta_inode(ref.dataset, *file) : 0;
      }
      case InodeRef::Kind::kEntry: {
        const prefetch::DatasetSnapshot* d = dataset_of(fs, ref);
        if (!d || !d->catalog->entry(ref.entry).is_dir) return 0;
        const std::optional<uint32_t> child = d->catalog->lookup(ref.entry, name);
        return child ? entry_inode(ref.dataset, *child) : 0;
      }
      case InodeRef::Kind::kViewsDir: {
        // Any valid SPEC can be entered; an invalid one is ENOENT with the reason in the log
        // (the kernel caches the miss, so it is logged about once per name).
        const ViewRegistry::Found found = fs.views_.registry().find_or_add(name);
        if (!found.slot) {
          spdlog::warn("{}/{}: {} (ENOENT)", kViewsDirName, store::log_text(name), found.error);
          return 0;
        }
        return view_spec_inode(*found.slot);
      }
      case InodeRef::Kind::kViewSpec: {
        if (!fs.views_.registry().slot(ref.view_slot)) return 0;
        const auto it = fs.dataset_by_name_.find(std::string(name));
        if (it == fs.dataset_by_name_.end() || it->second >= kMaxViewDatasets) return 0;
        return view_entry_inode(ref.view_slot, it->second, catalog::kRootIndex);
      }
      case InodeRef::Kind::kViewEntry: {
        const ViewTarget target = view_target(fs, ref);
        if (!target || !target.entry->is_dir) return 0;
        const catalog::Catalog& catalog = *target.dataset->catalog;
        // A directory keeps its name; an image x.jpg is x.jpg.npy.
        if (const auto child = catalog.lookup(ref.entry, name);
            child && catalog.entry(*child).is_dir) {
          return view_entry_inode(ref.view_slot, ref.dataset, *child);
        }
        const std::optional<std::string_view> source = view_source_name(name);
        if (!source) return 0;
        const auto child = catalog.lookup(ref.entry, *source);
        if (!child || catalog.entry(*child).is_dir) return 0;
        return view_entry_inode(target.slot->canonical, ref.dataset, *child);
      }
      default:
        return 0;
    }
  }

  static fuse_entry_param entry_param(Filesystem& fs, uint64_t ino) {
    fuse_entry_param entry{};
    double timeout = kImmutableTimeout;
    if (ino != 0 && stat_inode(fs, ino, entry.attr, timeout)) entry.ino = ino;
    entry.attr_timeout = timeout;
    entry.entry_timeout = kImmutableTimeout;
    return entry;
  }

  // ---- requests ----

  static void init(void* userdata, fuse_conn_info* conn) {
    Filesystem& fs = *static_cast<Filesystem*>(userdata);
    fs.counters_.count(Op::kInit);
    if (fs.max_read_ != 0) conn->max_read = fs.max_read_;
    const auto want = [conn](unsigned capability) {
      if (conn->capable & capability) conn->want |= capability;
    };
    want(FUSE_CAP_READDIRPLUS);
    // Always READDIRPLUS, never the kernel's guess (READDIRPLUS_AUTO answers a listing's later
    // batches with plain READDIR): each entry's attributes come with the listing, so `ls -l`,
    // `find -ls` or `du` then stat every entry without a LOOKUP each.
    conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
    want(FUSE_CAP_PARALLEL_DIROPS);
    want(FUSE_CAP_ASYNC_READ);
    // Files never change under a mount, so OPEN and RELEASE carry nothing: answering the first
    // OPEN with ENOSYS tells the kernel to skip both for every later open (and keep the page
    // cache across opens), which removes two round trips per file read.
    want(FUSE_CAP_NO_OPEN_SUPPORT);
    fs.no_open_ = (conn->want & FUSE_CAP_NO_OPEN_SUPPORT) != 0;
    // Likewise for directories: listings never change, so OPENDIR and RELEASEDIR carry nothing
    // and the kernel keeps cached listings without them (two round trips per `ls` saved).
    want(FUSE_CAP_NO_OPENDIR_SUPPORT);
    fs.no_opendir_ = (conn->want & FUSE_CAP_NO_OPENDIR_SUPPORT) != 0;
    // Data never changes under a mount, so there is nothing to invalidate on attribute changes.
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
    // O_TRUNC must arrive as a SETATTR: with atomic O_TRUNC it would ride on the OPEN the
    // kernel no longer sends, and `: > .dsfs/plan` would not clear the plan.
    conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC;
    conn->time_gran = 1;
  }

  static void lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
    guarded(req, Op::kLookup, [&](Filesystem& fs) {
      uint64_t ino = find_child(fs, parent, name);
      // Names never appear later in a mount, so a miss is cached as long as a hit.
      if (ino == 0) fs.counters_.count(ErrorKind::kNotFound);
      const bool stats_snapshot = ino == kStatsInode;
      if (stats_snapshot) ino = fs.new_stats_snapshot();
      fuse_entry_param entry = entry_param(fs, ino);
      // Every path walk to stats.json comes back here for a fresh snapshot.
      if (stats_snapshot) entry.entry_timeout = 0;
      // If the kernel never got the snapshot, no FORGET will come for it.
      if (fuse_reply_entry(req, &entry) != 0 && stats_snapshot) fs.forget_stats_snapshot(ino, 1);
    });
  }

  static void getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
    guarded(req, Op::kGetattr, [&](Filesystem& fs) {
      struct stat st {};
      double timeout = 0;
      if (!stat_inode(fs, ino, st, timeout)) return fail(fs, req, ENOENT);
      fuse_reply_attr(req, &st, timeout);
    });
  }

  static void open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    guarded(req, Op::kOpen, [&](Filesystem& fs) {
      if (ino == kPlanInode) {
        if (fs.no_open_) return (void)fuse_reply_err(req, ENOSYS);
        fi->direct_io = 1;
        return (void)fuse_reply_open(req, fi);
      }
      if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
        return fail(fs, req, EROFS);
      }
      // See init: this reply makes it the last OPEN the kernel sends.
      if (fs.no_open_) return (void)fuse_reply_err(req, ENOSYS);
      const InodeRef ref = decode_inode(ino);
      switch (ref.kind) {
        case InodeRef::Kind::kStatsSnapshot:
          if (!fs.stats_snapshot(ino)) return fail(fs, req, ENOENT);
          break;
        case InodeRef::Kind::kMeta:
          if (ref.meta == MetaFile::kDirectory) return fail(fs, req, EISDIR);
          if (!dataset_of(fs, ref)) return fail(fs, req, ENOENT);
          break;
        case InodeRef::Kind::kEntry: {
          const prefetch::DatasetSnapshot* d = dataset_of(fs, ref);
          if (!d) return fail(fs, req, ENOENT);
          if (d->catalog->entry(ref.entry).is_dir) return fail(fs, req, EISDIR);
          break;
        }
        case InodeRef::Kind::kViewEntry: {
          const ViewTarget target = view_target(fs, ref);
          if (!target) return fail(fs, req, ENOENT);
          if (target.entry->is_dir) return fail(fs, req, EISDIR);
          break;
        }
        case InodeRef::Kind::kInvalid:
          return fail(fs, req, ENOENT);
        default:
          return fail(fs, req, EISDIR);
      }
      // Contents are immutable for the mount: keep the page cache across opens.
      fi->keep_cache = 1;
      fi->noflush = 1;
      fuse_reply_open(req, fi);
    });
  }

  static void read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
    guarded(req, Op::kRead, [&](Filesystem& fs) {
      if (off < 0) return fail(fs, req, EINVAL);
      const InodeRef ref = decode_inode(ino);
      const auto reply_text = [&](std::string_view text) {
        const auto from = std::min<size_t>(static_cast<size_t>(off), text.size());
        const size_t length = std::min(size, text.size() - from);
        fuse_reply_buf(req, text.data() + from, length);
      };
      switch (ref.kind) {
        case InodeRef::Kind::kStatsSnapshot: {
          // Our own reference: FORGET may drop the snapshot on another thread as soon as the
          // reader has the bytes, while this thread is still inside fuse_reply_buf.
          const Filesystem::StatsSnapshot snapshot = fs.stats_snapshot(ino);
          if (!snapshot) return fail(fs, req, ESTALE);
          return reply_text(*snapshot);
        }
        case InodeRef::Kind::kMeta:
          if (!dataset_of(fs, ref) || ref.meta == MetaFile::kDirectory) {
            return fail(fs, req, EISDIR);
          }
          return reply_text(fs.meta_content(ref.dataset, ref.meta));
        case InodeRef::Kind::kViewEntry:
          return read_view(fs, req, ref, size, static_cast<uint64_t>(off));
        case InodeRef::Kind::kPlan:
          return reply_text("");  // write-only: stats.json reports what the plan holds
        case InodeRef::Kind::kEntry:
          break;
        default:
          return fail(fs, req, EISDIR);
      }
      const prefetch::DatasetSnapshot* d = dataset_of(fs, ref);
      if (!d) return fail(fs, req, ENOENT);
      if (d->catalog->entry(ref.entry).is_dir) return fail(fs, req, EISDIR);

      if (off == 0) fs.counters_.files_read.fetch_add(1, std::memory_order_relaxed);
      const std::vector<prefetch::Slice> slices =
          fs.reader_.read(*d, ref.entry, static_cast<uint64_t>(off), size);
      std::vector<iovec> iov;
      iov.reserve(slices.size());
      size_t total = 0;
      for (const prefetch::Slice& s : slices) {
        // The kernel only reads these bytes; fuse_reply_iov takes non-const pointers.
        iov.push_back(iovec{const_cast<char*>(s.buffer->bytes().data() + s.offset), s.length});
        total += s.length;
      }
      fs.counters_.bytes_read.fetch_add(total, std::memory_order_relaxed);
      if (iov.empty()) {
        fuse_reply_buf(req, nullptr, 0);
        return;
      }
      fuse_reply_iov(req, iov.data(), static_cast<int>(iov.size()));
    });
  }

  // A READ of a .views file: the header straight from the spec; anything past it from the
  // rendered file (rendered on the first such READ, then cached for the others).
  static void read_view(Filesystem& fs, fuse_req_t req, const InodeRef& ref, size_t size,
                        uint64_t off) {
    const ViewTarget target = view_target(fs, ref);
    if (!target) return fail(fs, req, ENOENT);
    if (target.entry->is_dir) return fail(fs, req, EISDIR);
    const ViewRegistry::Slot& slot = *target.slot;
    if (off >= slot.file_size || size == 0) return (void)fuse_reply_buf(req, nullptr, 0);
    const size_t length = static_cast<size_t>(std::min<uint64_t>(size, slot.file_size - off));
    const prefetch::ObjectBuffer file =
        fs.views_.read(*target.dataset, ref.entry, slot.canonical, off, length);
    if (!file) return (void)fuse_reply_buf(req, slot.header.data() + off, length);
    fuse_reply_buf(req, file->bytes().data() + off, length);
  }

  // Inodes are computed, not stored; only stats.json snapshots have lookups to count.
  static void forget_one(Filesystem& fs, uint64_t ino, uint64_t lookups) {
    fs.counters_.count(Op::kForget);
    if (decode_inode(ino).kind == InodeRef::Kind::kStatsSnapshot) {
      fs.forget_stats_snapshot(ino, lookups);
    }
  }

  static void forget(fuse_req_t req, fuse_ino_t ino, uint64_t lookups) {
    forget_one(self(req), ino, lookups);
    fuse_reply_none(req);
  }

  static void forget_multi(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
    Filesystem& fs = self(req);
    for (size_t i = 0; i < count; ++i) forget_one(fs, forgets[i].ino, forgets[i].nlookup);
    fuse_reply_none(req);
  }

  static void opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    guarded(req, Op::kOpendir, [&](Filesystem& fs) {
      // See init: this reply makes it the last OPENDIR the kernel sends; READDIR checks the inode.
      if (fs.no_opendir_) return (void)fuse_reply_err(req, ENOSYS);
      const InodeRef ref = decode_inode(ino);
      if (ref.kind == InodeRef::Kind::kInvalid ||
          ((ref.kind == InodeRef::Kind::kEntry || ref.kind == InodeRef::Kind::kMeta) &&
           !dataset_of(fs, ref)) ||
          (ref.kind == InodeRef::Kind::kViewSpec && !fs.views_.registry().slot(ref.view_slot)) ||
          (ref.kind == InodeRef::Kind::kViewEntry && !view_target(fs, ref))) {
        return fail(fs, req, ENOENT);
      }
      if (!is_directory(ref, fs)) return fail(fs, req, ENOTDIR);
      // Listings never change under a mount.
      fi->cache_readdir = 1;
      fi->keep_cache = 1;
      fuse_reply_open(req, fi);
    });
  }

  // Lists directory `ino` from position `off` (0 ".", 1 "..", 2... the children).
  static void list(Filesystem& fs, fuse_req_t req, fuse_ino_t ino, off_t off,
                   DirectoryBuffer& out) {
    const InodeRef ref = decode_inode(ino);
    uint64_t parent = kRootInode;
    std::vector<std::pair<std::string, uint64_t>> fixed;  // children of the virtual directories
    const auto is_dir_inode = [&](uint64_t child) { return is_directory(decode_inode(child), fs); };
    const prefetch::DatasetSnapshot* d = nullptr;  // a catalogue directory (in a view or not)
    ViewTarget view;                               // set for a directory under .views/SPEC/NAME
    switch (ref.kind) {
      case InodeRef::Kind::kRoot:
        fixed.emplace_back(kControlDirName, kControlDirInode);
        fixed.emplace_back(kMetaDirName, kMetaDirInode);
        fixed.emplace_back(kViewsDirName, kViewsDirInode);
        for (const prefetch::DatasetSnapshot& ds : fs.datasets_) {
          fixed.emplace_back(ds.name(), entry_inode(ds.index, catalog::kRootIndex));
        }
        break;
      case InodeRef::Kind::kMetaDir:
        for (const prefetch::DatasetSnapshot& ds : fs.datasets_) {
          fixed.emplace_back(ds.name(), meta_inode(ds.index, MetaFile::kDirectory));
        }
        break;
      case InodeRef::Kind::kControlDir:
        fixed.emplace_back(kStatsFileName, kStatsInode);
        fixed.emplace_back(kPlanFileName, kPlanInode);
        break;
      case InodeRef::Kind::kMeta:
        if (!dataset_of(fs, ref) || ref.meta != MetaFile::kDirectory) {
          return fail(fs, req, ENOTDIR);
        }
        parent = kMetaDirInode;
        for (const MetaFile file : kMetaFiles) {
          fixed.emplace_back(meta_file_name(file), meta_inode(ref.dataset, file));
        }
        break;
      case InodeRef::Kind::kEntry: {
        d = dataset_of(fs, ref);
        if (!d) return fail(fs, req, ENOENT);
        const catalog::CatalogEntry& e = d->catalog->entry(ref.entry);
        if (!e.is_dir) return fail(fs, req, ENOTDIR);
        parent = ref.entry == catalog::kRootIndex ? kRootInode : entry_inode(ref.dataset, e.parent);
        break;
      }
      case InodeRef::Kind::kViewsDir: {
        // The presets; any other valid SPEC is entered by name.
        const ViewRegistry& registry = fs.views_.registry();
        for (uint32_t slot = 0; slot < registry.preset_count(); ++slot) {
          fixed.emplace_back(registry.slot(slot)->name, view_spec_inode(slot));
        }
        break;
      }
      case InodeRef::Kind::kViewSpec:
        if (!fs.views_.registry().slot(ref.view_slot)) return fail(fs, req, ENOENT);
        parent = kViewsDirInode;
        for (const prefetch::DatasetSnapshot& ds : fs.datasets_) {
          if (ds.index >= kMaxViewDatasets) break;
          fixed.emplace_back(ds.name(),
                             view_entry_inode(ref.view_slot, ds.index, catalog::kRootIndex));
        }
        break;
      case InodeRef::Kind::kViewEntry: {
        view = view_target(fs, ref);
        if (!view) return fail(fs, req, ENOENT);
        if (!view.entry->is_dir) return fail(fs, req, ENOTDIR);
        d = view.dataset;
        parent = ref.entry == catalog::kRootIndex
                     ? view_spec_inode(ref.view_slot)
                     : view_entry_inode(ref.view_slot, ref.dataset, view.entry->parent);
        break;
      }
      default:
        return fail(fs, req, ENOENT);
    }

    const uint64_t child_count =
        d ? d->catalog->entry(ref.entry).child_count : static_cast<uint64_t>(fixed.size());
    std::string view_name;  // storage for a listed .npy name
    for (uint64_t position = static_cast<uint64_t>(off); position < 2 + child_count; ++position) {
      std::string_view name;
      uint64_t child_ino = 0;
      if (position == 0) {
        name = ".";
        child_ino = ino;
      } else if (position == 1) {
        name = "..";
        child_ino = parent;
      } else if (view) {
        const uint32_t index =
            d->catalog->entry(ref.entry).first_child + static_cast<uint32_t>(position - 2);
        auto child = view_child(ref, view, index);
        if (!child) continue;  // not an image: not in the view
        view_name = std::move(child->first);
        name = view_name;
        child_ino = child->second;
      } else if (d) {
        const uint32_t index =
            d->catalog->entry(ref.entry).first_child + static_cast<uint32_t>(position - 2);
        name = d->catalog->name(index);
        child_ino = entry_inode(ref.dataset, index);
      } else {
        name = fixed[position - 2].first;
        child_ino = fixed[position - 2].second;
      }
      fuse_entry_param entry{};
      double timeout = kImmutableTimeout;
      if (out.plus()) {
        if (!stat_inode(fs, child_ino, entry.attr, timeout)) continue;
      } else {
        // Plain readdir only needs the inode and the file type.
        entry.attr.st_ino = child_ino;
        entry.attr.st_mode = position < 2 || is_dir_inode(child_ino) ? S_IFDIR : S_IFREG;
      }
      // A stats.json entry must not be cached: only a lookup hands out its snapshot inode.
      entry.ino = out.plus() && child_ino == kStatsInode ? 0 : child_ino;
      entry.attr_timeout = timeout;
      entry.entry_timeout = kImmutableTimeout;
      if (!out.add(name, entry, static_cast<off_t>(position + 1))) break;
    }
    out.reply();
  }

  static void readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
    guarded(req, Op::kReaddir, [&](Filesystem& fs) {
      DirectoryBuffer out(req, size, /*plus=*/false);
      list(fs, req, ino, off, out);
    });
  }

  static void readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
    guarded(req, Op::kReaddirplus, [&](Filesystem& fs) {
      DirectoryBuffer out(req, size, /*plus=*/true);
      list(fs, req, ino, off, out);
    });
  }

  static void releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info*) {
    guarded(req, Op::kReleasedir, [&](Filesystem&) { fuse_reply_err(req, 0); });
  }

  static void statfs(fuse_req_t req, fuse_ino_t) {
    guarded(req, Op::kStatfs, [&](Filesystem& fs) {
      constexpr unsigned long kBlock = 4096;
      struct statvfs st {};
      uint64_t bytes = 0;
      uint64_t entries = 4;
      for (const prefetch::DatasetSnapshot& d : fs.datasets_) {
        bytes += d.catalog->total_bytes();
        entries += d.catalog->entry_count() + 1 + std::size(kMetaFiles);
      }
      st.f_bsize = kBlock;
      st.f_frsize = kBlock;
      st.f_blocks = (bytes + kBlock - 1) / kBlock;
      st.f_files = entries;
      st.f_namemax = 255;
      fuse_reply_statfs(req, &st);
    });
  }

  // The value of a dsfs xattr of a dataset file, if it has one.
  static std::optional<std::string> xattr_value(const prefetch::DatasetSnapshot& d, uint32_t entry,
                                                std::string_view name) {
    const catalog::Catalog& catalog = *d.catalog;
    const catalog::CatalogEntry& e = catalog.entry(entry);
    if (e.is_dir) return std::nullopt;
    if (name == kLabelXattr && e.label != catalog::kNoLabel) return std::to_string(e.label);
    if (name == kClassXattr && e.label < catalog.classes().size()) {
      return catalog.classes()[e.label];
    }
    if (name == kMetaXattr && !catalog.metadata(entry).empty()) {
      return std::string(catalog.metadata(entry));
    }
    return std::nullopt;
  }

  // The dataset of an entry or view entry (a view file carries its image's label and metadata).
  static const prefetch::DatasetSnapshot* xattr_dataset(Filesystem& fs, const InodeRef& ref) {
    if (ref.kind == InodeRef::Kind::kViewEntry) return view_target(fs, ref).dataset;
    return dataset_of(fs, ref);
  }

  static void getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
    guarded(req, Op::kGetxattr, [&](Filesystem& fs) {
      // Only user.* attributes exist here. EOPNOTSUPP, not ENODATA, for the others (ACLs,
      // security labels): tools such as `ls -l` then stop asking for every other file of this
      // filesystem, instead of paying two round trips per file listed.
      if (!std::string_view(name).starts_with(kUserXattrPrefix)) {
        return fail(fs, req, EOPNOTSUPP);
      }
      const InodeRef ref = decode_inode(ino);
      std::optional<std::string> value;
      if (ref.kind == InodeRef::Kind::kEntry || ref.kind == InodeRef::Kind::kViewEntry) {
        const prefetch::DatasetSnapshot* d = xattr_dataset(fs, ref);
        if (!d) return fail(fs, req, ENOENT);
        value = xattr_value(*d, ref.entry, name);
      }
      if (!value) return fail(fs, req, ENODATA);
      if (value->size() > kMaxXattrValue) return fail(fs, req, E2BIG);
      reply_xattr_bytes(req, *value, size);
    });
  }

  static void listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
    guarded(req, Op::kListxattr, [&](Filesystem& fs) {
      const InodeRef ref = decode_inode(ino);
      std::string names;  // each name NUL-terminated
      if (ref.kind == InodeRef::Kind::kEntry || ref.kind == InodeRef::Kind::kViewEntry) {
        const prefetch::DatasetSnapshot* d = xattr_dataset(fs, ref);
        if (!d) return fail(fs, req, ENOENT);
        for (const std::string_view name : {kLabelXattr, kClassXattr, kMetaXattr}) {
          if (const auto value = xattr_value(*d, ref.entry, name);
              value && value->size() <= kMaxXattrValue) {
            names += name;
            names += '\0';
          }
        }
      }
      reply_xattr_bytes(req, names, size);
    });
  }

  // No file here is a device. Python before 3.14 asks isatty() (an ioctl) of every file it
  // opens with default buffering, and Linux sends each ioctl to the daemon even after an
  // ENOSYS, so this is answered at once and counted: it is the one round trip a warm read
  // by a Python loader still pays (see docs/architecture.md).
  static void ioctl(fuse_req_t req, fuse_ino_t, unsigned int, void*, fuse_file_info*, unsigned,
                    const void*, size_t, size_t) {
    guarded(req, Op::kIoctl, [&](Filesystem&) { fuse_reply_err(req, ENOTTY); });
  }

  // Nothing is ever written back; ENOSYS tells the kernel to send no more FLUSH on close.
  static void flush(fuse_req_t req, fuse_ino_t, fuse_file_info*) {
    guarded(req, Op::kFlush, [&](Filesystem&) { fuse_reply_err(req, ENOSYS); });
  }

  // .dsfs/plan: writing at 0 replaces the plan, at its end extends it.
  static void write(fuse_req_t req, fuse_ino_t ino, const char* data, size_t size, off_t off,
                    fuse_file_info*) {
    guarded(req, Op::kWrite, [&](Filesystem& fs) {
      if (ino != kPlanInode) return fail(fs, req, EROFS);
      if (off < 0) return fail(fs, req, EINVAL);
      const int error =
          fs.engine_.plan_write(static_cast<uint64_t>(off), std::string_view(data, size));
      if (error != 0) return fail(fs, req, error);
      fuse_reply_write(req, size);
    });
  }

  // Only truncating .dsfs/plan (O_TRUNC, truncate(1)); times and modes are not stored.
  static void setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                      fuse_file_info*) {
    guarded(req, Op::kWrite, [&](Filesystem& fs) {
      if (ino != kPlanInode) return fail(fs, req, EROFS);
      if (to_set & FUSE_SET_ATTR_SIZE) {
        if (attr->st_size < 0) return fail(fs, req, EINVAL);
        const int error = fs.engine_.plan_truncate(static_cast<uint64_t>(attr->st_size));
        if (error != 0) return fail(fs, req, error);
      }
      struct stat st {};
      double timeout = 0;
      stat_inode(fs, ino, st, timeout);
      fuse_reply_attr(req, &st, 0);
    });
  }

  // The mount is read-only but for .dsfs/plan; these answer every other change.
  // A template so one definition fits every operation's signature (deduced on assignment).
  template <typename... Ignored>
  static void refuse(fuse_req_t req, Ignored...) {
    guarded(req, Op::kWrite, [&](Filesystem& fs) { fail(fs, req, EROFS); });
  }
};

const fuse_lowlevel_ops& Filesystem::operations() {
  static const fuse_lowlevel_ops ops = [] {
    fuse_lowlevel_ops o{};
    o.init = &Handlers::init;
    o.lookup = &Handlers::lookup;
    o.getattr = &Handlers::getattr;
    o.open = &Handlers::open;
    o.read = &Handlers::read;
    o.forget = &Handlers::forget;
    o.forget_multi = &Handlers::forget_multi;
    o.opendir = &Handlers::opendir;
    o.readdir = &Handlers::readdir;
    o.readdirplus = &Handlers::readdirplus;
    o.releasedir = &Handlers::releasedir;
    o.statfs = &Handlers::statfs;
    o.getxattr = &Handlers::getxattr;
    o.listxattr = &Handlers::listxattr;
    o.ioctl = &Handlers::ioctl;
    o.flush = &Handlers::flush;
    o.setattr = &Handlers::setattr;
    o.mknod = &Handlers::refuse;
    o.mkdir = &Handlers::refuse;
    o.unlink = &Handlers::refuse;
    o.rmdir = &Handlers::refuse;
    o.symlink = &Handlers::refuse;
    o.rename = &Handlers::refuse;
    o.link = &Handlers::refuse;
    o.write = &Handlers::write;
    o.create = &Handlers::refuse;
    o.setxattr = &Handlers::refuse;
    o.removexattr = &Handlers::refuse;
    o.fallocate = &Handlers::refuse;
    return o;
  }();
  return ops;
}

}  // namespace dsfs::fs
