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
#include <cstring>
#include <ctime>
#include <optional>
#include <string_view>

#include "cuda/view_service.h"
#include "fs/metrics.h"
#include "fs/virtual_files.h"
#include "src/store/errors.h"
#include "src/store/log_text.h"
#include "src/store/thread_name.h"

namespace dsfs::fs {
namespace {

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

store::ClientOptions client_options(const FilesystemOptions& options) {
  using std::chrono::milliseconds;
  // A stalled server must break a connection well within a read's retry budget.
  return store::ClientOptions{
      .connect = {.connect_timeout =
                      std::clamp(options.timeout, milliseconds{200}, milliseconds{2000}),
                  .io_timeout =
                      std::clamp(options.timeout, milliseconds{1000}, milliseconds{10000})},
      .connections_per_node = options.connections,
      .read_from = options.read_from,
      .retry_budget = options.timeout,
  };
}

Filesystem::Filesystem(std::shared_ptr<store::Client> client,
                       std::vector<prefetch::DatasetSnapshot> datasets, FilesystemOptions options)
    : options_(std::move(options)),
      tree_(std::move(datasets)),
      client_(std::move(client)),
      cache_(options_.cache_bytes),
      fetcher_(
          *client_, catalog::KeySchema(options_.ns),
          prefetch::FetcherOptions{.timeout = options_.timeout, .disk_tier = options_.disk_tier}),
      reader_(cache_, fetcher_, options_.verify),
      engine_(cache_, fetcher_, tree_.table(), *client_, options_.verify,
              prefetch::EngineOptions{.mode = options_.prefetch,
                                      .connections = options_.connections,
                                      .disk_stagers = options_.disk_stagers,
                                      .max_inflight = options_.max_inflight}),
      views_(reader_, cache_, options_.view_cache_bytes),
      root_node_(tree_),
      dataset_node_(tree_, reader_, counters_),
      meta_node_(tree_, options_.ns),
      view_node_(tree_, views_),
      control_node_(
          tree_, [this] { return stats_json(); }, engine_,
          [this](const std::vector<std::string>& names) { return watcher_.refresh(names); }),
      watcher_(tree_, options_.control_client ? *options_.control_client : *client_,
               catalog::KeySchema(options_.ns), options_.watch, options_.leases,
               [this](const std::vector<std::string>& names) { datasets_changed(names); }),
      trimmer_(
          [this] {
            return counters_.bytes_read.load(std::memory_order_relaxed) +
                   fetcher_.stats().bytes.load(std::memory_order_relaxed);
          },
          kDefaultTrimIdle) {
  using Kind = InodeRef::Kind;
  const auto route = [this](Kind kind, Node& node) { nodes_[static_cast<size_t>(kind)] = &node; };
  route(Kind::kRoot, root_node_);
  route(Kind::kEntry, dataset_node_);
  route(Kind::kMetaDir, meta_node_);
  route(Kind::kMeta, meta_node_);
  route(Kind::kViewsDir, view_node_);
  route(Kind::kViewSpec, view_node_);
  route(Kind::kViewEntry, view_node_);
  route(Kind::kControlDir, control_node_);
  route(Kind::kStats, control_node_);
  route(Kind::kStatsSnapshot, control_node_);
  route(Kind::kPlan, control_node_);
  route(Kind::kRefresh, control_node_);
  if (tree_.table().size() > kMaxViewDatasets) {
    spdlog::warn("only the first {} of {} datasets appear under {}", kMaxViewDatasets,
                 tree_.table().size(), kViewsDirName);
  }
  if (options_.prefetch != prefetch::PrefetchMode::kOff) reader_.set_engine(&engine_);
}

Filesystem::~Filesystem() {
  watcher_.stop();
  engine_.stop();
}

void Filesystem::drop_pages_later(uint64_t inode) {
  if (!refused_write_logged_.exchange(true)) {
    spdlog::warn(
        "refused a write to read-only inode {} of the mount: a process opened one of its files "
        "for writing (root may). Through a shared writable mapping (e.g. numpy's "
        "mmap_mode='r+') that changes the kernel's cached pages in place: they are dropped now, "
        "so that readers get the dataset's bytes again, but they may have read the changed ones "
        "until then. Open dataset files read-only, or mount with -o ro where no plan is "
        "written (logged once)",
        inode);
  }
  std::lock_guard lock(drop_mutex_);
  drop_pending_.insert(inode);
  if (!drop_thread_.joinable()) {
    drop_thread_ = std::jthread([this](std::stop_token stop) { drop_pages_loop(std::move(stop)); });
  }
  drop_work_.notify_one();
}

void Filesystem::drop_pages_loop(std::stop_token stop) {
  name_this_thread("drop-pages");
  for (;;) {
    std::set<uint64_t> inodes;
    {
      std::unique_lock lock(drop_mutex_);
      if (!drop_work_.wait(lock, stop, [&] { return !drop_pending_.empty(); })) return;
      inodes.swap(drop_pending_);
    }
    MutexLock lock(session_mutex_);
    if (session_ == nullptr) continue;
    for (const uint64_t inode : inodes) {
      const int error = fuse_lowlevel_notify_inval_inode(session_, inode, 0, 0);
      if (error != 0 && error != -ENOENT) {
        spdlog::warn("cannot drop the kernel's pages of inode {}: {}", inode,
                     std::strerror(-error));
      }
    }
  }
}

void Filesystem::attach_session(fuse_session* session) {
  MutexLock lock(session_mutex_);
  session_ = session;
}

void Filesystem::datasets_changed(const std::vector<std::string>& names) {
  std::vector<uint32_t> active;
  for (const prefetch::DatasetSnapshot* d : tree_.listing()->datasets) active.push_back(d->index);
  engine_.reshape(active);

  // Every directory that lists datasets by name: the root, .meta and each .views/SPEC in use.
  std::vector<uint64_t> parents = {kRootInode, kMetaDirInode};
  const ViewRegistry& registry = views_.registry();
  for (uint32_t slot = 0; slot < registry.max_slots() && registry.slot(slot); ++slot) {
    parents.push_back(view_spec_inode(slot));
  }
  MutexLock lock(session_mutex_);
  if (session_ == nullptr) return;
  for (const uint64_t parent : parents) {
    // Names first (a cached hit, or a cached miss of a dataset that now exists), then the
    // directory's attributes (its link count) and cached listing. ENOENT: nothing was cached.
    for (const std::string& name : names) {
      const int error =
          fuse_lowlevel_notify_inval_entry(session_, parent, name.data(), name.size());
      if (error != 0 && error != -ENOENT) {
        spdlog::debug("cannot invalidate the kernel's entry {}/{}: {}", parent,
                      store::log_text(name), std::strerror(-error));
      }
    }
    fuse_lowlevel_notify_inval_inode(session_, parent, 0, 0);
  }
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
  control_node_.plan().set_line_mapper([this](std::string_view line) {
    return views_.plan_source_path(line, tree_.listing()->datasets);
  });
  views_.start(std::move(service), ahead ? &engine_ : nullptr, options_.view_render_ahead_threads);
}

std::string Filesystem::stats_json() const {
  return render_snapshot(&render_stats_json);
}

std::string Filesystem::metrics_text() const {
  return render_snapshot(&render_metrics);
}

std::string Filesystem::render_snapshot(std::string (*render)(const StatsSources&)) const {
  // What the kernel was told: a switched dataset shows once its old names are invalidated.
  const std::shared_ptr<const MountTree::Listing> listing = watcher_.announced_listing();
  const WatchStats watch = watcher_.stats();
  return render(StatsSources{
      .fs = counters_,
      .fetcher = fetcher_.stats(),
      .cache = cache_.stats(),
      .disk_tier = options_.disk_tier ? std::optional(options_.disk_tier->stats()) : std::nullopt,
      .redis_connects = client_->connects(),
      .views = views_.stats(),
      .reads = reader_.stats(),
      .prefetch = engine_.stats(),
      .plan_unresolved = control_node_.plan().unresolved(),
      .datasets = listing->datasets,
      .watch = watch,
      .watch_options = watcher_.options(),
      .started = started_,
      .redis_endpoint = client_->describe(),
      .ns = options_.ns,
      .memory = trimmer_.stats(),
      .buffer_reuse = store::value_buffer_reuse_stats(),
      .resident_bytes = resident_bytes(),
  });
}

// The request handlers: decode the inode, ask its kind's Node, reply. Every one answers its
// request exactly once, exceptions included.
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

  // The inode `ino` names and the node answering for it (nullptr: it names nothing).
  struct Target {
    InodeRef ref;
    Node* node = nullptr;
  };
  static Target target(Filesystem& fs, uint64_t ino) {
    const InodeRef ref = decode_inode(ino);
    return {ref, fs.node(ref.kind)};
  }

  // The process a request came from (its ctx names the thread): the writer whose plan a write
  // to .dsfs/plan is part of.
  static uint64_t writer_of(fuse_req_t req) {
    const fuse_ctx* context = fuse_req_ctx(req);
    return context != nullptr && context->pid > 0
               ? PlanFile::process_of_thread(static_cast<uint64_t>(context->pid))
               : 0;
  }

  static std::optional<Attributes> stat(Filesystem& fs, uint64_t ino) {
    const Target t = target(fs, ino);
    return t.node ? t.node->stat(t.ref) : std::nullopt;
  }

  static fuse_entry_param entry_param(Filesystem& fs, const Found& found) {
    fuse_entry_param entry{};
    entry.attr_timeout = kImmutableTimeout;
    // Names never appear later in a mount, so a miss is cached as long as a hit.
    entry.entry_timeout = found.cacheable ? kImmutableTimeout : 0;
    if (found.ino == 0) return entry;
    if (const std::optional<Attributes> a = stat(fs, found.ino)) {
      entry.ino = found.ino;
      entry.attr = a->st;
      entry.attr_timeout = a->timeout;
    }
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
      // No entry has a longer name (ingest refuses one): say so as local filesystems do.
      if (std::strlen(name) > NAME_MAX) return fail(fs, req, ENAMETOOLONG);
      const Target dir = target(fs, parent);
      const Found found = dir.node ? dir.node->lookup(dir.ref, name) : Found{};
      if (found.ino == 0) fs.counters_.count(ErrorKind::kNotFound);
      const fuse_entry_param entry = entry_param(fs, found);
      // A lookup the kernel never got (the caller gave up) is forgotten here: no FORGET comes.
      if (fuse_reply_entry(req, &entry) != 0 && entry.ino != 0) {
        target(fs, entry.ino).node->forget(entry.ino, 1);
      }
    });
  }

  static void getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
    guarded(req, Op::kGetattr, [&](Filesystem& fs) {
      const std::optional<Attributes> a = stat(fs, ino);
      if (!a) return fail(fs, req, ENOENT);
      fuse_reply_attr(req, &a->st, a->timeout);
    });
  }

  static void open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
    guarded(req, Op::kOpen, [&](Filesystem& fs) {
      const Target t = target(fs, ino);
      if (t.ref.kind == InodeRef::Kind::kPlan || t.ref.kind == InodeRef::Kind::kRefresh) {
        // A writable file: every write must reach the node, so no page cache.
        if (fs.no_open_) return (void)fuse_reply_err(req, ENOSYS);
        fi->direct_io = 1;
        return (void)fuse_reply_open(req, fi);
      }
      if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
        return fail(fs, req, EROFS);
      }
      // See init: this reply makes it the last OPEN the kernel sends.
      if (fs.no_open_) return (void)fuse_reply_err(req, ENOSYS);
      const int error = t.node ? t.node->open(t.ref) : ENOENT;
      if (error != 0) return fail(fs, req, error);
      // Contents are immutable for the mount: keep the page cache across opens.
      fi->keep_cache = 1;
      fi->noflush = 1;
      fuse_reply_open(req, fi);
    });
  }

  static void read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
    guarded(req, Op::kRead, [&](Filesystem& fs) {
      if (off < 0) return fail(fs, req, EINVAL);
      const Target t = target(fs, ino);
      if (!t.node) return fail(fs, req, ENOENT);
      ReadReply reply;
      const int error = t.node->read(t.ref, static_cast<uint64_t>(off), size, reply);
      if (error != 0) return fail(fs, req, error);
      if (reply.pieces.empty()) return (void)fuse_reply_buf(req, nullptr, 0);
      // reply.owners keeps the bytes alive until the kernel has them.
      fuse_reply_iov(req, reply.pieces.data(), static_cast<int>(reply.pieces.size()));
    });
  }

  static void forget_one(Filesystem& fs, uint64_t ino, uint64_t lookups) {
    fs.counters_.count(Op::kForget);
    const Target t = target(fs, ino);
    if (t.node) t.node->forget(ino, lookups);
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
      const Target t = target(fs, ino);
      if (!t.node || !t.node->stat(t.ref)) return fail(fs, req, ENOENT);
      if (!t.node->is_directory(t.ref)) return fail(fs, req, ENOTDIR);
      // Listings never change under a mount.
      fi->cache_readdir = 1;
      fi->keep_cache = 1;
      fuse_reply_open(req, fi);
    });
  }

  // Fills a READDIR(PLUS) reply of at most `size` bytes; "." and ".." are offsets 0 and 1, a
  // node's child at position p is offset p + 2.
  class DirectoryReply final : public DirectorySink {
   public:
    DirectoryReply(Filesystem& fs, fuse_req_t req, size_t size, bool plus)
        : fs_(fs), req_(req), buf_(size), plus_(plus) {}

    bool add(std::string_view name, uint64_t ino, uint64_t position, bool cacheable) override {
      return add_at_offset(name, ino, position + 2, cacheable);
    }

    bool add_at_offset(std::string_view name, uint64_t ino, uint64_t offset, bool cacheable) {
      fuse_entry_param entry{};
      entry.entry_timeout = kImmutableTimeout;
      if (plus_) {
        const std::optional<Attributes> a = stat(fs_, ino);
        if (!a) return true;  // vanished: not listed
        entry.attr = a->st;
        entry.attr_timeout = a->timeout;
        // An entry the kernel must look up itself (ino 0 caches nothing).
        entry.ino = cacheable ? ino : 0;
      } else {
        // Plain readdir only needs the inode and the file type.
        const Target t = target(fs_, ino);
        entry.attr.st_ino = ino;
        entry.attr.st_mode = t.node && t.node->is_directory(t.ref) ? S_IFDIR : S_IFREG;
      }
      const std::string name_z(name);
      char* at = buf_.data() + used_;
      const size_t room = buf_.size() - used_;
      const auto next = static_cast<off_t>(offset + 1);
      const size_t need =
          plus_ ? fuse_add_direntry_plus(req_, at, room, name_z.c_str(), &entry, next)
                : fuse_add_direntry(req_, at, room, name_z.c_str(), &entry.attr, next);
      if (need > room) return false;
      used_ += need;
      return true;
    }

    void reply() { fuse_reply_buf(req_, buf_.data(), used_); }

   private:
    Filesystem& fs_;
    fuse_req_t req_;
    std::vector<char> buf_;
    size_t used_ = 0;
    bool plus_;
  };

  // Lists directory `ino` from offset `off`.
  static void list(Filesystem& fs, fuse_req_t req, fuse_ino_t ino, off_t off, size_t size,
                   bool plus) {
    const Target t = target(fs, ino);
    if (!t.node || !t.node->stat(t.ref)) return fail(fs, req, ENOENT);
    if (!t.node->is_directory(t.ref)) return fail(fs, req, ENOTDIR);
    DirectoryReply out(fs, req, size, plus);
    bool room = true;
    if (off <= 0) room = out.add_at_offset(".", ino, 0, true);
    if (room && off <= 1) room = out.add_at_offset("..", t.node->parent(t.ref), 1, true);
    if (room) {
      const uint64_t from = off <= 2 ? 0 : static_cast<uint64_t>(off) - 2;
      if (const int error = t.node->list(t.ref, from, out); error != 0) {
        return fail(fs, req, error);
      }
    }
    out.reply();
  }

  static void readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
    guarded(req, Op::kReaddir, [&](Filesystem& fs) { list(fs, req, ino, off, size, false); });
  }

  static void readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
    guarded(req, Op::kReaddirplus, [&](Filesystem& fs) { list(fs, req, ino, off, size, true); });
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
      for (const prefetch::DatasetSnapshot* d : fs.tree_.listing()->datasets) {
        bytes += d->catalog->total_bytes();
        entries += d->catalog->entry_count() + 1 + std::size(kMetaFiles);
      }
      st.f_bsize = kBlock;
      st.f_frsize = kBlock;
      st.f_blocks = (bytes + kBlock - 1) / kBlock;
      st.f_files = entries;
      st.f_namemax = 255;
      fuse_reply_statfs(req, &st);
    });
  }

  static void getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
    guarded(req, Op::kGetxattr, [&](Filesystem& fs) {
      // Only user.* attributes exist here. EOPNOTSUPP, not ENODATA, for the others (ACLs,
      // security labels): tools such as `ls -l` then stop asking for every other file of this
      // filesystem, instead of paying two round trips per file listed.
      if (!std::string_view(name).starts_with(kUserXattrPrefix)) {
        return fail(fs, req, EOPNOTSUPP);
      }
      const Target t = target(fs, ino);
      std::string value;
      const int error = t.node ? t.node->xattr(t.ref, name, value) : ENOENT;
      if (error != 0) return fail(fs, req, error);
      reply_xattr_bytes(req, value, size);
    });
  }

  static void listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
    guarded(req, Op::kListxattr, [&](Filesystem& fs) {
      const Target t = target(fs, ino);
      std::string names;  // each name NUL-terminated
      const int error = t.node ? t.node->xattr_names(t.ref, names) : ENOENT;
      if (error != 0) return fail(fs, req, error);
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

  // The writer is the requesting process; libfuse passes the open flags in fi->flags.
  static void write(fuse_req_t req, fuse_ino_t ino, const char* data, size_t size, off_t off,
                    fuse_file_info* fi) {
    guarded(req, Op::kWrite, [&](Filesystem& fs) {
      if (off < 0) return fail(fs, req, EINVAL);
      const Target t = target(fs, ino);
      const WriteContext context{.writer = writer_of(req),
                                 .append = fi != nullptr && (fi->flags & O_APPEND) != 0};
      const int error = t.node ? t.node->write(t.ref, static_cast<uint64_t>(off),
                                               std::string_view(data, size), context)
                               : EROFS;
      if (error != 0) {
        fail(fs, req, error);
        // A writable open of a read-only file (root's): if this is a shared mapping's
        // writeback, the page cache holds its bytes now (drop_pages_later).
        if (error == EROFS) fs.drop_pages_later(ino);
        return;
      }
      fuse_reply_write(req, size);
    });
  }

  // Only truncation, and only of a writable file (O_TRUNC, truncate(1)); times and modes are not
  // stored.
  static void setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                      fuse_file_info*) {
    guarded(req, Op::kWrite, [&](Filesystem& fs) {
      const Target t = target(fs, ino);
      if (t.ref.kind != InodeRef::Kind::kPlan && t.ref.kind != InodeRef::Kind::kRefresh) {
        return fail(fs, req, EROFS);
      }
      if (to_set & FUSE_SET_ATTR_SIZE) {
        if (attr->st_size < 0) return fail(fs, req, EINVAL);
        const int error = t.node->truncate(t.ref, static_cast<uint64_t>(attr->st_size),
                                           WriteContext{.writer = writer_of(req)});
        if (error != 0) return fail(fs, req, error);
      }
      const std::optional<Attributes> a = t.node->stat(t.ref);
      fuse_reply_attr(req, &a->st, 0);
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
