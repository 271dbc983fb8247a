#pragma once
// A second cache tier on local disk, below the RAM object cache and above Redis: objects fetched
// from Redis are written to DIR behind the read, and a RAM miss looks here before asking Redis.
// A disk problem never fails a read and never returns wrong bytes: every file carries its key,
// length and checksum, and anything that does not check out is dropped and reported as not found,
// so the caller goes to Redis.
#include <sys/types.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "prefetch/object_data.h"
#include "src/store/log_limiter.h"

namespace dsfs::prefetch {

// Which object: one chunk of one object of one generation of a dataset, by name (the RAM cache's
// dataset index means nothing to another mount). The generation is part of the key, so a
// re-ingested dataset never finds the old generation's bytes. A name and generation alone do
// not say which ingest made them (another namespace or Redis, or a dataset made again after
// Redis lost its data, has the same): `ingest` does (DatasetSnapshot::ingest_identity), and a
// file written for another is not served (dropped, counted in stale_drops, read from Redis).
struct DiskTierKey {
  std::string_view dataset;
  uint64_t generation = 0;
  uint64_t object_id = 0;
  uint32_t chunk = 0;
  uint64_t ingest = 0;  // 0: not checked (tests and benches of the tier alone)
};

struct DiskTierOptions {
  std::filesystem::path dir;
  // Bytes the tier's object files may take, each counted as its size rounded up to 4 KiB.
  uint64_t capacity_bytes = 0;
  // Payload bytes waiting to be written; past it, new writes are deferred (below).
  uint64_t queue_bytes = uint64_t{64} << 20;
  // Objects that found the queue full, remembered by weak reference (no bytes held): a writer
  // with nothing queued writes the oldest of them still in memory (the RAM cache, a reader),
  // which the RAM cache meanwhile keeps after its other objects already read.
  // Past this many, the oldest are forgotten (dropped, counted). Each costs about 170 bytes (the
  // entry, and the object's bookkeeping a weak reference keeps): 11 MiB at most.
  uint64_t deferred_limit = 65536;
  // Threads that write objects behind the reads (files are independent; a disk serves several
  // writes at once, and checksumming and copying are CPU work).
  unsigned writer_threads = 4;
  // Threads that list and stat the object files at open when there is no saved index.
  unsigned scan_threads = 16;
  // Read object files with O_DIRECT, around the page cache, unless the page cache holds the file
  // whole already (below). The tier's files would otherwise sit in the page cache beside their
  // copies in the RAM cache, and a cold read would pay for readahead into fresh pages and a copy
  // out of them. Turned off for the mount (one log line) where the filesystem refuses O_DIRECT.
  // False (`dsfs mount --disk-cache-page-cache`): every read goes through the page cache.
  bool direct_io = true;
  // Ask the kernel first (cachestat(2), Linux 6.5) whether the page cache holds the file whole,
  // and read it from there if so: a file written lately, or a host with memory to spare, costs no
  // disk read. False reads every file directly (tests of the direct path). Without cachestat
  // (Linux < 6.5, or a seccomp filter that refuses it) every read goes direct.
  bool page_cache_first = true;
  // The prefetch engine calls new_epoch() at each epoch's start (`--prefetch` auto or plan). A
  // full tier then trades only a file not read in this epoch or the last for a new one, and
  // declines a write when it has none (below). False (`--prefetch off`: no epochs known): the
  // least recently used file goes.
  bool follows_epochs = false;
  // Kept below the capacity for want of room (at open, or a full filesystem since), a write looks
  // at most this often whether the filesystem has room again (other files removed), and the tier
  // grows back towards its capacity.
  std::chrono::milliseconds room_check_interval{10'000};
  // Tests only: called with an object file's path just before get() opens it, on the reading
  // thread (a test holds a stager there). Null in dsfs.
  std::function<void(const std::filesystem::path&)> before_open_for_tests = nullptr;
};

struct DiskTierStats {
  // --disk-cache-size, or less where the filesystem has less room (at open, or full since).
  uint64_t capacity_bytes = 0;
  uint64_t bytes_used = 0;  // object files on disk, rounded up to 4 KiB each
  uint64_t entries = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t bytes_read = 0;  // payload bytes served from disk
  uint64_t writes = 0;      // objects written
  uint64_t bytes_written = 0;
  uint64_t writes_deferred = 0;  // found the queue full: left to be written if still in memory
  uint64_t writes_dropped = 0;   // deferred, and gone from memory before a writer was free
  // Not written: the tier was full of files read in this epoch or the last (follows_epochs).
  uint64_t writes_declined = 0;
  uint64_t write_errors = 0;       // ENOSPC, EIO, a vanished directory...
  uint64_t checksum_failures = 0;  // a file whose header, length or payload did not check out
  // Files of the object's name and generation written for another ingest (DiskTierKey::ingest),
  // or by a dsfs before ingests were told apart: dropped, the object read from Redis.
  uint64_t stale_drops = 0;
  uint64_t read_errors = 0;  // a file that vanished or could not be read
  // Each hit was read one of two ways: through the page cache (a file it held whole, or every
  // read when direct_io is off) or with O_DIRECT from the disk.
  uint64_t page_cache_reads = 0;
  uint64_t direct_reads = 0;
  bool direct_io = false;  // O_DIRECT reads are on (asked for, and the filesystem allows them)
  uint64_t evictions = 0;
  uint64_t files_reused = 0;  // evictions whose file (its inode) a write took over
  uint64_t too_large = 0;     // objects larger than the whole tier: not written
  uint64_t queued_bytes = 0;
  uint64_t stale_temp_files = 0;  // half-written files of a killed daemon, removed at open
  bool index_loaded = false;      // the open read DIR/index instead of listing the objects
  double open_seconds = 0;        // building the index at open
};

// Another dsfs mount holds the directory.
class DiskTierLocked : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a disk-cache directory holds, for `dsfs cache show`: read from the file names and one
// header per dataset, without the lock and without changing anything, so it works while a mount
// serves the directory.
struct DiskTierContents {
  struct Generation {
    std::string dataset;  // from a file's header; "?" when none could be read
    uint64_t generation = 0;
    uint64_t objects = 0;
    uint64_t bytes = 0;  // on disk, rounded up to 4 KiB each
  };
  std::vector<Generation> generations;  // by dataset name, then generation
  uint64_t objects = 0;
  uint64_t bytes = 0;
  uint64_t temp_files = 0;  // unfinished writes: a killed daemon's, or a mount's in progress
  // The pid a mount recorded in DIR/lock while it holds the directory; empty when none does.
  std::string held_by;
};

// Throws std::runtime_error naming `dir` when it is not a disk cache (no DIR/objects).
DiskTierContents inspect_disk_tier(const std::filesystem::path& dir);

// Removes every object file (and unfinished write) under DIR/objects, holding DIR's lock so that
// no mount opens it meanwhile; files that are not the tier's are left alone. Returns the objects
// removed. Throws DiskTierLocked while a mount holds DIR, std::runtime_error naming the path when
// DIR is not a disk cache or a file cannot be removed.
uint64_t clear_disk_tier(const std::filesystem::path& dir);

// A directory of object files, one per object: DIR/objects/XX/NAME, NAME = the key's fields and
// the file's size, holds a header (magic, version, the full key, payload length and XXH3, the
// header's own XXH3; XXH64 in version 1 files, still read) then the payload. Written as NAME.tmp
// and renamed, so a killed writer leaves only temp files, removed at the next open. A write into a
// full tier takes over the first file it evicts (renamed to its NAME.tmp, then rewritten): no
// inode created or freed. The index (key -> size, LRU order) lives in memory. A clean close saves
// it as DIR/index, which the next open reads (and removes at once, so that a daemon killed later
// leaves none that would miss its writes); without a whole one the index is rebuilt from the
// directory listing alone (names carry the sizes; the order of use is lost). No payload is read
// either way: the first read of each file checks it. A read is one pread of the whole file, with
// O_DIRECT unless the page cache holds the file (DiskTierOptions). An flock on DIR/lock keeps a
// second mount out. Bounded: bytes_used <= capacity_bytes. Eviction is epoch-aware: objects of a
// generation older than the newest one seen of the same dataset go first, then objects not read
// (nor written) in this epoch or the last, least recently used first. Those read in this epoch or
// the last are kept, and a write that would need one of them evicted is declined: an epoch reads
// every file, so a file read in the last epoch is read in this one, and trading it for a new file
// gains nothing in a shuffled order and loses every hit in a repeated one (each epoch in the same
// order: least-recently-used eviction evicts each file just before its next read). A tier smaller
// than the data thus keeps a stable part of it. new_epoch() comes from the prefetch engine, which
// tells epochs apart (DiskTierOptions::follows_epochs); without it (--prefetch off) the least
// recently used goes, whenever it was read.
//
// Thread safety: get(), put(), flush() and stats() may be called from any thread at once (FUSE
// workers, the engine). mutex_ guards the index, the queue and the counters (a std::mutex: the
// writer waits on it with work_/idle_); file reads run outside it, unlinks and renames inside
// it (so a file is never replaced between the index's answer and the unlink of a dropped entry).
// direct_io_ and cachestat_works_ are atomics: only ever turned off.
// Background writer threads (start(), options.writer_threads) do all writes and evictions,
// each reserving its file's bytes first so that the bound holds while several write.
class DiskTier {
 public:
  // Creates DIR (and DIR/objects) if needed, takes the lock, removes stale temp files and builds
  // the index, evicting down to the capacity if it was made with a larger one. Starts no thread
  // (so it can be opened before a fork). Throws DiskTierLocked when another process holds DIR,
  // std::runtime_error naming the path for any other failure.
  explicit DiskTier(DiskTierOptions options);
  // Finishes the queued writes (if started), stops the writers, saves the index as DIR/index (in
  // the process that started the writers, or opened the tier if none did), releases the lock.
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Starts the writer threads (after any fork: threads do not survive one). Idempotent.
  void start();

  // The object, checked against `length` and its checksum; nullptr when it is not on disk or
  // did not check out (then it is dropped, logged once and counted). Never throws for a disk
  // problem.
  ObjectBuffer get(const DiskTierKey& key, uint64_t length);

  // Whether the index has the object (an index lookup: no disk access, nothing counted). A later
  // get() may still miss: the file can be evicted, or found damaged, meanwhile.
  bool holds(const DiskTierKey& key, uint64_t length) const;

  // Queues the object to be written behind the caller; when the queue is full, defers it (a weak
  // reference: written later only if the object is still in memory then, which is marked
  // ObjectData::awaiting_disk meanwhile). Returns false
  // (changing nothing) when it is already on disk or queued, larger than the tier, or would need
  // a file read in this epoch or the last evicted (follows_epochs). Never blocks on disk.
  bool put(const DiskTierKey& key, ObjectBuffer buffer);

  // The readers began a new epoch: the files read in the one before the last may go now (the
  // class comment).
  void new_epoch();

  // Waits until every write queued so far is done (tests, and a clean close).
  void flush();

  DiskTierStats stats() const;
  const DiskTierOptions& options() const { return options_; }
  // The file that holds `key`, whose payload has `length` bytes (whether or not it exists).
  std::filesystem::path path_of(const DiskTierKey& key, uint64_t length) const;

 private:
  // What the index knows of a file: its name's fields. `dataset` is the XXH64 of the name (the
  // header carries the name itself, checked on read, so a collision cannot serve wrong bytes).
  // `file_size` (header, name and payload) follows from the others (an object of one generation
  // never changes) and is not hashed: it is in the name so that a listing needs no stat.
  struct FileId {
    uint64_t dataset = 0;
    uint64_t generation = 0;
    uint64_t object_id = 0;
    uint32_t chunk = 0;
    uint64_t file_size = 0;
    bool operator==(const FileId&) const = default;
  };
  struct FileIdHash {
    size_t operator()(const FileId& id) const;
  };
  // When a file was last read or written, which is the list that holds it.
  enum Age : uint8_t { kEarlier, kLastEpoch, kThisEpoch, kAges };
  struct Entry {
    uint64_t bytes = 0;  // on disk, rounded up to 4 KiB
    Age age = kLastEpoch;
    std::list<FileId>::iterator place;  // in by_age_[age]
  };
  struct Write {
    FileId id;
    std::string dataset;
    uint64_t ingest = 0;
    ObjectBuffer buffer;
  };
  struct Deferred {
    FileId id;
    std::string dataset;
    uint64_t ingest = 0;
    std::weak_ptr<const ObjectData> buffer;
  };

  // An object file the index will hold, in eviction order.
  struct Found {
    FileId id;
    uint64_t bytes = 0;
  };

  static FileId id_of(const DiskTierKey& key, uint64_t length);
  std::filesystem::path path_of(const FileId& id) const;
  // Builds the index at open: from DIR/index when a clean close left a whole one, else from the
  // directory listing (removing unfinished writes); then evicts down to the capacity.
  void rebuild_index();
  // DIR/index's entries, removing the file; nullopt (logged) when there is none or it does not
  // check out.
  std::optional<std::vector<Found>> load_index();
  // Every object file in DIR/objects, oldest written first; removes unfinished writes.
  std::vector<Found> scan_objects();
  // Writes DIR/index (temp file + rename); logs and leaves none on failure.
  void save_index() const;
  void writer_loop();
  // The next write for a writer: the queue's oldest, else the oldest deferred object still in
  // memory and not on disk (forgotten ones counted as dropped); nullopt when there is none.
  // mutex_ held.
  std::optional<Write> next_write_locked();
  // Writes one object (evicting first so that it fits); false after logging on failure.
  void write_one(const Write& write);
  // Drops `id` from the index and unlinks its file; mutex_ held.
  // By value: callers pass a list's front, which the erase frees.
  void erase_locked(FileId id);
  // Drops `id` from the index, leaving its file; false when the index lacks it. mutex_ held.
  bool forget_locked(const FileId& id);
  // Evicts `victim` by renaming its file to `temp` for a write to reuse (true); where that fails
  // the file is removed (false). mutex_ held.
  bool recycle_locked(FileId victim, const std::filesystem::path& temp);
  // The next object to evict; nullopt when none may go (follows_epochs). mutex_ held.
  std::optional<FileId> victim_locked() const;
  // The bytes the tier could take on its filesystem now (its files, those being written and the
  // room left); nullopt where the filesystem does not say. mutex_ held.
  std::optional<uint64_t> room_locked() const;
  // Below the capacity asked for for want of room: raises the bound to what the filesystem has
  // room for now (at most every room_check_interval). mutex_ held.
  void grow_to_room_locked();
  std::chrono::steady_clock::time_point room_checked_{};  // mutex_
  bool told_filesystem_full_ = false;                     // mutex_
  // Makes `entry` the most recently used of this epoch; mutex_ held.
  void touch_locked(Entry& entry);
  // Whether the file read through `fd` is no longer the one under its name: it was evicted and
  // taken over by a write (then what was read can be another object's bytes), and the name may
  // hold a new copy since. Then a failed check says nothing of the disk.
  bool replaced_since_read(const FileId& id, int fd) const;
  // A file of the object's name and generation written for another ingest, or in a format that
  // does not say (old_format): dropped, counted, logged once per kind. Nothing counted if it was
  // replaced meanwhile (as drop_bad).
  void drop_stale(const FileId& id, std::string_view dataset, bool old_format, int fd);
  bool told_old_format_ = false;    // mutex_
  bool told_other_ingest_ = false;  // mutex_
  // A newer generation of `dataset` exists: its older generations' files go first; mutex_ held.
  void note_generation_locked(uint64_t dataset, uint64_t generation);
  // Whether to read the open file `fd` (`file_size` bytes) with O_DIRECT: direct reads are on
  // and the page cache does not hold it whole. Sets O_DIRECT on `fd` if so.
  bool read_directly(int fd, uint64_t file_size);
  // Direct reads are not possible here (`why`): every later read goes through the page cache.
  void turn_direct_io_off(const char* why);
  // Whether a failed open or read says nothing of the file: the process or the system is short of
  // descriptors or memory now, or a signal came.
  static bool is_transient(int error);
  // A read that failed for such a reason (`error`): a miss, counted and logged (limited); the
  // file is kept (before, running out of descriptors dropped a good tier file by file).
  void keep_unread(const std::filesystem::path& path, int error);
  store::LogLimiter unread_log_;
  store::LogLimiter drop_log_;  // drop_bad's lines: a disk that fails fails every read
  // Drops an entry whose file did not check out: logs one line (limited), counts it. Not when it
  // was evicted meanwhile, or when `fd` (the file read, if given) is no longer the file under its
  // name: a write took it over.
  void drop_bad(const FileId& id, std::string_view dataset, const std::string& why, bool checksum,
                int fd = -1);

  const DiskTierOptions options_;
  const std::filesystem::path objects_dir_;
  int lock_fd_ = -1;
  pid_t owner_pid_ = ::getpid();  // who saves the index: not a parent that forked the daemon

  mutable std::mutex mutex_;
  std::condition_variable work_;  // writers wait for queued writes or stop
  std::condition_variable idle_;  // flush() waits for the queue to drain
  std::unordered_map<FileId, Entry, FileIdHash> index_;
  // By Age; front: least recently used (an older generation's files first in kEarlier).
  std::array<std::list<FileId>, kAges> by_age_;
  std::unordered_map<uint64_t, uint64_t> newest_generation_;  // by dataset hash
  std::deque<Write> queue_;
  std::deque<Deferred> deferred_;  // front: oldest
  // Queued or being written (so one file is never written by two writers at once).
  std::unordered_set<FileId, FileIdHash> queued_;
  unsigned writing_ = 0;         // writes taken off the queue and not finished
  uint64_t reserved_bytes_ = 0;  // on-disk bytes of the files being written
  bool stopping_ = false;
  DiskTierStats stats_;
  std::vector<int> write_errnos_logged_;  // a write failure is logged once per errno
  std::atomic<bool> direct_io_{false};
  std::atomic<bool> cachestat_works_{true};  // until the kernel says it has no cachestat
  std::vector<std::thread> writers_;
};

}  // namespace dsfs::prefetch
