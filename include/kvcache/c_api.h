/* kvcache/c_api.h — the library's C interface.
 *
 * For callers that cannot use the C++ API: Rust (declare these functions in
 * an `extern "C"` block or run bindgen on this header), Go (cgo), Zig, C.
 * It is a thin layer over the C++ classes: the same lifecycle (claim ->
 * fetch -> store_kv / attention -> step -> ... -> release), the same checks
 * and the same guarantees. Plain C99; no C++ type crosses it.
 *
 * Errors. Every call that can fail returns a kvc_status and takes a
 * `kvc_error* err` last (may be NULL). On failure it fills err->status and
 * err->message (the C++ message: it names the bad value and the limit,
 * e.g. "seq 7 is not claimed"; truncated to 255 bytes) and returns the same
 * status; on success it sets err->status = KVC_OK and an empty message.
 * A call that fails changes nothing (the C++ strong guarantee): no page
 * leaked, no length changed, no other sequence's K/V touched. NULL handles
 * and NULL arrays that must hold data are refused with
 * KVC_INVALID_ARGUMENT naming the parameter. No call aborts or lets an
 * exception cross into C.
 *
 * Ownership. kvc_manager_create (and _create_prefix) / kvc_batch_create /
 * kvc_thread_pool_create hand out handles the caller frees with the matching _destroy (NULL is a
 * no-op); kvc_host_tier_create / kvc_disk_tier_create hand out tiers freed by
 * kvc_tier_destroy. A batch points into its manager's memory: destroy batches before
 * their manager, and do not use a batch's description after a later
 * kvc_fetch into it or a kvc_step / kvc_release / kvc_truncate of its
 * sequences. A manager keeps its own reference to each tier it was made with:
 * a tier handle may be destroyed before or after such a manager.
 *
 * Array lengths. Where a call takes a pointer and a count, the pointer must
 * hold that many elements. The kernels take arrays whose lengths follow from
 * the batch: row_offsets holds batch_size + 1 entries, k_new / v_new
 * row_offsets[batch_size] * n_kv_heads * head_dim floats, q / out
 * row_offsets[batch_size] * n_q_heads * head_dim floats. The library checks
 * every value it is given but cannot check a buffer's length.
 *
 * Thread-safety. Manager calls may run concurrently from any threads (one
 * mutex per manager). A batch or a thread pool is used by one thread at a
 * time.
 *
 * Memory layout of the cache (kvc_cache_desc.blocks), per block (a page, or
 * a sequence's slot with the continuous strategy), elements of `dtype`:
 *   [num_blocks][2 (K, V)][num_layers][page_size][n_kv_heads][head_dim]
 * with KVC_ARRANGEMENT_INTERLEAVED (the default) and KVC_LAYOUT_NHD;
 *   [num_layers][2 (K, V)][num_blocks][page_size][n_kv_heads][head_dim]
 * with KVC_ARRANGEMENT_PER_LAYER (each layer's K and V an array of its own);
 * KVC_LAYOUT_HND swaps [page_size][n_kv_heads] to [n_kv_heads][page_size].
 * Token t of batch entry b lives in block
 * lookup_table[b * lookup_stride + t / page_size] at position
 * t % page_size. kvc_store_kv and kvc_attention refuse rows past an
 * entry's reserved_lengths (KVC_INVALID_ARGUMENT, nothing written).
 */
#ifndef KVCACHE_C_API_H_
#define KVCACHE_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status -------------------------------------------------------------- */

typedef enum kvc_status {
  KVC_OK = 0,
  KVC_INVALID_ARGUMENT = 1,  /* malformed or inconsistent input */
  KVC_UNKNOWN_SEQUENCE = 2,  /* a sequence id that is not claimed */
  KVC_OUT_OF_PAGES = 3,      /* the paged pool has too few free or evictable pages */
  KVC_CAPACITY_EXCEEDED = 4, /* max_seq_len, max_batch_size or reserved room */
  KVC_OUT_OF_MEMORY = 5,     /* host memory could not be obtained */
  KVC_INTERNAL = 6           /* anything else; a bug: please report the message */
} kvc_status;

typedef struct kvc_error {
  kvc_status status;
  char message[256];
} kvc_error;

/* "ok", "invalid_argument", ...; "unknown" for values outside the enum. */
const char* kvc_status_name(int32_t status);

/* ---- parameters ---------------------------------------------------------- */

/* The 8-bit types (docs/quantization.md): fp8 with static per-(layer, KV
 * head) scales (all 1 unless set: kvc_manager_set_kv_scales), int8 with a
 * (token, KV head) scale stored in the page beside the values. */
typedef enum kvc_dtype {
  KVC_DTYPE_F32 = 0,
  KVC_DTYPE_F16 = 1,
  KVC_DTYPE_BF16 = 2,
  KVC_DTYPE_FP8_E4M3 = 3,
  KVC_DTYPE_FP8_E5M2 = 4,
  KVC_DTYPE_INT8 = 5
} kvc_dtype;

typedef enum kvc_strategy {
  KVC_STRATEGY_CONTINUOUS = 0, /* one max_seq_len slot per sequence */
  KVC_STRATEGY_PAGED = 1       /* a shared pool of fixed-size pages */
} kvc_strategy;

typedef enum kvc_page_layout { KVC_LAYOUT_NHD = 0, KVC_LAYOUT_HND = 1 } kvc_page_layout;

/* kvcache::PoolArrangement: interleaved [blocks][2][layers][block] (MAX) or
 * per-layer [layers][2][blocks][block] (vLLM, FlashInfer, ferrum). */
typedef enum kvc_pool_arrangement {
  KVC_ARRANGEMENT_INTERLEAVED = 0,
  KVC_ARRANGEMENT_PER_LAYER = 1
} kvc_pool_arrangement;

/* kvcache::KVCacheParams (kvcache/params.h). Zero-initialise, then set the
 * fields: every value is validated by kvc_manager_create. Enum-valued fields
 * and parameters are fixed-width integers holding the enum's constants (a
 * layout other languages can rely on; a value outside the enum is refused
 * by name, where an enum-typed field would make it undefined behaviour in
 * C++). */
typedef struct kvc_params {
  int32_t dtype; /* kvc_dtype */
  uint32_t num_layers;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  int32_t strategy;              /* kvc_strategy */
  uint32_t page_size;            /* tokens per page; paged only (> 0 there) */
  int32_t enable_prefix_caching; /* 0 or 1; paged only */
  int32_t page_layout;           /* kvc_page_layout */
  int32_t pool_arrangement;      /* kvc_pool_arrangement (0: interleaved) */
} kvc_params;

/* Bytes of K and V a manager of this shape allocates: num_blocks pages
 * (paged; max_seq_len unused) or num_blocks slots of max_seq_len tokens
 * (continuous). */
kvc_status kvc_estimated_memory_size(const kvc_params* params, uint32_t num_blocks,
                                     uint32_t max_seq_len, size_t* bytes, kvc_error* err);

/* ---- manager --------------------------------------------------------------- */

typedef struct kvc_manager kvc_manager;

/* A manager of params->strategy. Paged: a pool of num_blocks pages;
 * max_batch_size caps the claimed sequences, max_seq_len one sequence.
 * Continuous: one slot of max_seq_len tokens per sequence, max_batch_size
 * slots; num_blocks must be 0 or max_batch_size. */
kvc_status kvc_manager_create(const kvc_params* params, uint32_t num_blocks,
                              uint32_t max_batch_size, uint32_t max_seq_len, kvc_manager** out,
                              kvc_error* err);
void kvc_manager_destroy(kvc_manager* manager);

/* n new sequences with cache length 0, their ids into seq_ids[0, n). */
kvc_status kvc_claim(kvc_manager* manager, uint32_t n, uint64_t* seq_ids, kvc_error* err);

typedef struct kvc_batch kvc_batch;

/* Room for this step: cache_length + num_new_tokens[b] + num_steps - 1
 * tokens for seq_ids[b], all or nothing (a continuous manager reserves its
 * whole max_seq_len slot); the batch is refilled (its buffers reused). New
 * token i of entry b is written at cache_length + i. */
kvc_status kvc_fetch(kvc_manager* manager, kvc_batch* batch, const uint64_t* seq_ids,
                     const uint32_t* num_new_tokens, uint32_t n, uint32_t num_steps,
                     kvc_error* err);

/* cache_length += valid_lengths[b] for seq_ids[b]. token_ids: NULL, or the
 * committed tokens' ids, sum(valid_lengths) of them in batch order (paged
 * with prefix caching publishes the pages they fill; there, NULL token_ids
 * for a sequence that commits tokens is KVC_INVALID_ARGUMENT: it would stop
 * publishing the sequence's pages). */
kvc_status kvc_step(kvc_manager* manager, const uint64_t* seq_ids, const uint32_t* valid_lengths,
                    uint32_t n, const uint32_t* token_ids, kvc_error* err);

/* kvcache::ReuseHint: whether a later request will start with this
 * sequence's tokens (only the paged `tiered` and `adaptive` eviction policies act on it). */
typedef enum kvc_reuse_hint {
  KVC_REUSE_UNKNOWN = 0,
  KVC_REUSE_UNLIKELY = 1,
  KVC_REUSE_LIKELY = 2
} kvc_reuse_hint;

/* Gives the sequence's memory back (paged with prefix caching: its
 * published pages stay cached). hint: a kvc_reuse_hint; one other than
 * KVC_REUSE_UNKNOWN needs the paged strategy. */
kvc_status kvc_release(kvc_manager* manager, uint64_t seq, int32_t hint, kvc_error* err);

kvc_status kvc_cache_length(const kvc_manager* manager, uint64_t seq, uint32_t* length,
                            kvc_error* err);

/* Paged only. match_prefix: attaches to a freshly claimed sequence the
 * cached pages of the longest cached prefix of full pages of tokens[0,
 * n_tokens) under extra_key (0: none), leaving at least one token to
 * compute; *reused = the tokens attached (also its new cache length).
 * Needs enable_prefix_caching. fork: a child sharing every committed page
 * (copy-on-write). truncate: rolls seq back to new_length tokens. */
kvc_status kvc_match_prefix(kvc_manager* manager, uint64_t seq, const uint32_t* tokens,
                            size_t n_tokens, uint64_t extra_key, uint32_t* reused, kvc_error* err);
kvc_status kvc_fork(kvc_manager* manager, uint64_t seq, uint64_t* child, kvc_error* err);
kvc_status kvc_truncate(kvc_manager* manager, uint64_t seq, uint32_t new_length, kvc_error* err);

/* ---- the paged prefix cache: policy, events, pinning ---------------------- */

/* kvcache::EvictionPolicyKind (kvcache/prefix_cache.h). */
typedef enum kvc_eviction_policy {
  KVC_EVICT_LRU = 0,      /* least recently released first (vLLM) */
  KVC_EVICT_S3FIFO = 1,   /* S3-FIFO: probation, main and ghost FIFOs */
  KVC_EVICT_TIERED = 2,   /* pages used once before reused ones; acts on release hints */
  KVC_EVICT_INTERVAL = 3, /* each content's own reuse interval */
  KVC_EVICT_ADAPTIVE = 4  /* LRU or tiered, whichever shadow caches show winning */
} kvc_eviction_policy;

/* kvcache::PageEvent: a page entering (KVC_PAGE_STORED) or leaving
 * (KVC_PAGE_REMOVED) a medium, what KV-aware routers consume: medium
 * "device" for the device pool's hash index, a tier's name ("host",
 * "disk") for a page written back to that tier and stored there, found
 * lost by a load from it, or evicted by the tier for room (reported at the
 * manager's next call; only medium and key set, page the sentinel
 * total_num_pages, no tokens). tokens and medium (NUL-terminated) are valid
 * during the callback only. */
enum { KVC_PAGE_STORED = 0, KVC_PAGE_REMOVED = 1 };
typedef struct kvc_page_event {
  int32_t kind;
  uint32_t page;
  uint64_t hash;
  uint64_t parent_hash; /* 0 for a sequence's first page */
  uint64_t extra_key;
  const uint32_t* tokens;
  size_t n_tokens;
  const char* medium;
  uint64_t key_hi; /* the page's 128-bit tier key; 0, 0 without tiers */
  uint64_t key_lo;
} kvc_page_event;

/* Called under the manager's lock for every page stored in or removed from
 * a medium: it must return quickly and must not call the manager. */
typedef void (*kvc_page_event_fn)(const kvc_page_event* event, void* user_data);

/* A storage tier below the paged pool (kvc_host_tier_create,
 * kvc_disk_tier_create; section "storage tiers" below). */
typedef struct kvc_tier kvc_tier;

/* kvcache::OffloadAdmission: which pages the device pool evicts go down to
 * the first tier. */
typedef enum kvc_offload_admission {
  KVC_ADMIT_EVERY_PAGE = 0, /* every published page evicted */
  KVC_ADMIT_REUSED = 1      /* only pages a later request attached (or loaded from a tier) */
} kvc_offload_admission;

/* kvcache::PrefixCacheConfig. Start from kvc_prefix_config_default(). */
typedef struct kvc_prefix_config {
  int32_t policy;               /* kvc_eviction_policy */
  double s3fifo_small_fraction; /* S3-FIFO probation share, in (0, 1) */
  double ghost_factor;          /* ghost FIFO length in pool sizes, [0, 64] */
  kvc_page_event_fn on_event;   /* NULL: no events */
  void* user_data;              /* passed to on_event */
  /* kvcache::TierConfig (docs/tiers.md): the tiers below the device pool,
     nearest first (n_tiers handles, none NULL; NULL and 0: no tiers). Each
     tier's fingerprint (its params, model id and cache salt) must match the
     manager's params, model_id and cache_salt; tiers need
     params->n_devices 1 (the C params' only value). */
  kvc_tier* const* tiers;
  uint32_t n_tiers;
  int32_t admission;      /* kvc_offload_admission */
  uint32_t staging_pages; /* write-back staging slots, [1, 65536] */
  const char* model_id;   /* NULL: "" */
  const char* cache_salt; /* NULL: "" */
  /* 0 or 1 (kvcache::TierConfig::pool_apart): the K/V live in a pool of the
     caller's own (a GPU's, with the manager's shape and page ids); the
     manager's pool is only the loads' host bounce buffer and write-back and
     onboarding go through the caller: kvc_batch_block_offloads,
     kvc_complete_offloads, kvc_batch_block_loads. Needs n_tiers >= 1. */
  int32_t pool_apart;
  /* kvcache::TierConfig::offload_batch / offload_delay: staged write-backs
     go to the first tier once offload_batch of them wait (at most half the
     staging slots), once the oldest waited offload_delay_us microseconds
     (looked at by every manager call), or at kvc_wait_tiers / destruction.
     offload_batch in [1, 65536], offload_delay_us in [0, 1000000]; 1 or 0:
     every call's write-backs go at once. */
  uint32_t offload_batch;
  uint32_t offload_delay_us;
} kvc_prefix_config;

/* The C++ defaults: adaptive, 0.1, 16, no events, no tiers, every page
 * admitted, 16 staging pages, no pool apart, batches of 32 write-backs or
 * 1000 us. */
kvc_prefix_config kvc_prefix_config_default(void);

/* kvc_manager_create for the paged strategy with prefix caching configured
 * (params->strategy must be KVC_STRATEGY_PAGED and
 * params->enable_prefix_caching 1). */
kvc_status kvc_manager_create_prefix(const kvc_params* params, uint32_t num_pages,
                                     uint32_t max_batch_size, uint32_t max_seq_len,
                                     const kvc_prefix_config* config, kvc_manager** out,
                                     kvc_error* err);

/* Host bytes of a paged manager's per-page bookkeeping beside its pool
 * (kvcache::PagedKVCacheManager::estimated_bookkeeping_size): ref counts and
 * free list; with params->enable_prefix_caching also the prefix index, the
 * eviction policy's arrays and ghost, and with tiers the write-back staging
 * (config->staging_pages) and a pool apart's flags. config: the
 * configuration kvc_manager_create_prefix would take (its tiers, n_tiers,
 * staging_pages and pool_apart count; the tiers are not otherwise used),
 * or NULL for the defaults. Not counted in kvc_estimated_memory_size. */
kvc_status kvc_estimated_bookkeeping_size(const kvc_params* params, uint32_t num_pages,
                                          const kvc_prefix_config* config, size_t* bytes,
                                          kvc_error* err);

/* ---- storage tiers below the paged pool (kvcache/tier.h, docs/tiers.md) ---- */

/* A tier keeps pages the device pool evicted, under content keys, for
 * kvc_match_prefix to load back. Tiers are made for one cache shape (params:
 * dtype, layout, page size, heads, head dim, layers; the strategy must be
 * KVC_STRATEGY_PAGED), a model_id and a cache_salt (NULL: ""), which form
 * its fingerprint; a manager takes only tiers whose fingerprint matches its
 * own. capacity_bytes counts page bytes (kvc_tier_page_bytes each);
 * KVC_TIER_UNLIMITED: as many pages as the medium holds (disk). Tiers are
 * thread-safe; their I/O runs on their own threads. */
#define KVC_TIER_UNLIMITED UINT64_MAX

/* Bytes of one page in a tier for params (every layer's K and V). */
kvc_status kvc_tier_page_bytes(const kvc_params* params, uint64_t* bytes, kvc_error* err);

/* kvcache::HostTierOptions. Start from kvc_host_tier_options_default(). */
typedef struct kvc_host_tier_options {
  uint32_t threads;     /* worker threads (>= 1 unless synchronous) */
  int32_t synchronous;  /* 1: work in the caller's thread (deterministic tests) */
  int32_t huge_pages;   /* 1: madvise the slot memory to 2 MiB pages */
  int32_t checksums;    /* 1: checksum each page at store, verify it at load */
  uint64_t chunk_bytes; /* host memory mapped at a time */
  /* kvcache::HostTierOptions::linger: a worker out of jobs naps this many
     microseconds before it sleeps, and a store while one naps wakes no
     thread; 0: every store wakes one. In [0, 1000000]. */
  uint32_t linger_us;
} kvc_host_tier_options;

/* The C++ defaults: 2 threads, asynchronous, huge pages, no checksums,
 * 256 MiB chunks, 1000 us linger. */
kvc_host_tier_options kvc_host_tier_options_default(void);

/* A host-memory tier of capacity_bytes (kvcache::HostTier). options NULL:
 * the defaults. */
kvc_status kvc_host_tier_create(const kvc_params* params, const char* model_id,
                                const char* cache_salt, uint64_t capacity_bytes,
                                const kvc_host_tier_options* options, kvc_tier** out,
                                kvc_error* err);

/* kvcache::DiskIo: how a disk tier reads and writes. */
typedef enum kvc_disk_io {
  KVC_DISK_IO_AUTOMATIC = 0, /* io_uring when the kernel grants a ring, else threads */
  KVC_DISK_IO_URING = 1,     /* io_uring, or KVC_INVALID_ARGUMENT at creation */
  KVC_DISK_IO_THREADS = 2    /* blocking preadv / pwritev on the worker threads */
} kvc_disk_io;

/* kvcache::DiskTierOptions. Start from kvc_disk_tier_options_default(). */
typedef struct kvc_disk_tier_options {
  int32_t io;                      /* kvc_disk_io */
  int32_t direct_io;               /* 1: O_DIRECT where the filesystem allows it */
  int32_t durable;                 /* 1: fdatasync before a page's manifest record */
  uint32_t threads;                /* worker threads, >= 1 */
  uint32_t queue_depth;            /* io_uring requests in flight at most */
  uint32_t max_consecutive_errors; /* I/O failures in a row that disable the tier */
  uint64_t slab_bytes;             /* bytes per slab file */
  uint64_t compact_min_records;    /* manifest compaction threshold */
  uint32_t linger_us; /* as kvc_host_tier_options.linger_us, in [0, 1000000] */
} kvc_disk_tier_options;

/* The C++ defaults: automatic, O_DIRECT, durable, 2 threads, depth 32, 8
 * errors, 1 GiB slabs, 4096 records, 1000 us linger. */
kvc_disk_tier_options kvc_disk_tier_options_default(void);

/* A disk tier in directory dir (created if missing; kvcache::DiskTier):
 * pages a tier of the same fingerprint stored there before, in this process
 * or an earlier one, are found again (kvc_disk_tier_info). One tier at a
 * time per directory: a second is refused (KVC_INVALID_ARGUMENT naming the
 * path) until the first is destroyed along with every manager using it.
 * options NULL: the defaults. */
kvc_status kvc_disk_tier_create(const kvc_params* params, const char* model_id,
                                const char* cache_salt, const char* dir, uint64_t capacity_bytes,
                                const kvc_disk_tier_options* options, kvc_tier** out,
                                kvc_error* err);

/* NULL is a no-op. A manager using the tier keeps it alive. */
void kvc_tier_destroy(kvc_tier* tier);

/* "host", "disk": the tier's label in events and metrics; valid as long as
 * the handle. NULL for a NULL tier. */
const char* kvc_tier_name(const kvc_tier* tier);

/* kvcache::TierStats: counters since the tier opened; gauges are now. */
typedef struct kvc_tier_stats {
  uint64_t pages_held;     /* gauge */
  uint64_t bytes_held;     /* gauge (page bytes) */
  uint64_t capacity_bytes; /* gauge; KVC_TIER_UNLIMITED for unlimited */
  uint64_t lookups;        /* keys asked about */
  uint64_t hits;
  uint64_t pages_stored;
  uint64_t pages_loaded;
  uint64_t bytes_stored;
  uint64_t bytes_loaded;
  uint64_t evictions; /* pages the tier dropped for room */
  uint64_t rejected;  /* stores not admitted */
  uint64_t corrupt;   /* loads or recoveries refused by the checksum */
  uint64_t io_errors;
  uint64_t load_nanoseconds; /* summed over loads */
  int32_t enabled;           /* 0 once the tier disabled itself */
} kvc_tier_stats;

kvc_status kvc_tier_stats_get(const kvc_tier* tier, kvc_tier_stats* out, kvc_error* err);

/* What a disk tier found when it opened its directory, and how it does I/O. */
typedef struct kvc_disk_tier_info {
  int32_t io;                   /* KVC_DISK_IO_URING or KVC_DISK_IO_THREADS */
  int32_t direct_io;            /* 1: O_DIRECT in use */
  int32_t fresh;                /* 1: no usable manifest, started empty */
  uint64_t pages_recovered;     /* pages found again */
  uint64_t pages_dropped;       /* records whose slot the slabs do not cover */
  uint64_t torn_manifest_bytes; /* ignored at the manifest's end */
  uint64_t slot_bytes;          /* bytes a page takes on disk */
} kvc_disk_tier_info;

/* KVC_INVALID_ARGUMENT for a tier that is not a disk tier. */
kvc_status kvc_disk_tier_info_get(const kvc_tier* tier, kvc_disk_tier_info* out, kvc_error* err);

/* With tiers, kvc_match_prefix goes on past the device index into the tiers
 * and starts loads into device pages; its count includes those tokens. Until
 * the manager finishes the loads, the sequence is pending: kvc_fetch,
 * kvc_fork and kvc_truncate refuse it (KVC_INVALID_ARGUMENT naming it,
 * nothing changed). A load that fails truncates the sequence before the
 * failed page (the caller computes the rest: read kvc_cache_length once it
 * is no longer pending). Write-backs finish in the same calls.
 *
 * kvc_has_pending_loads: *pending = 1 while seq has loads to finish (0
 * without tiers). kvc_poll_loads: finishes every load that is done, never
 * waits; the sequences it finished go to seq_ids[0, *count), which must
 * hold the manager's max_batch_size entries (checked first), or be NULL
 * with cap 0 (then only *count is set). kvc_wait_loads: waits (outside the
 * manager's lock) until seq's loads are done, then finishes them.
 * kvc_wait_tiers: waits for every load and write-back in flight. All are
 * paged-only. */
kvc_status kvc_has_pending_loads(const kvc_manager* manager, uint64_t seq, int32_t* pending,
                                 kvc_error* err);
kvc_status kvc_poll_loads(kvc_manager* manager, uint64_t* seq_ids, uint32_t cap, uint32_t* count,
                          kvc_error* err);
kvc_status kvc_wait_loads(kvc_manager* manager, uint64_t seq, kvc_error* err);
kvc_status kvc_wait_tiers(kvc_manager* manager, kvc_error* err);

/* A pool apart (kvc_prefix_config.pool_apart): hands the write-backs a
 * kvc_fetch of this manager put in batch (kvc_batch_block_offloads) to the
 * first tier, once the caller has copied their pages into the slots;
 * *completed (may be NULL) = how many, 0 for a batch without offloads or one
 * completed already. Slots never completed stay reserved: later evictions
 * that find no free slot skip their write-back (offload_dropped), never
 * wait. KVC_INVALID_ARGUMENT, nothing changed, for a batch with offloads
 * fetched from another manager, or one never fetched into. */
kvc_status kvc_complete_offloads(kvc_manager* manager, const kvc_batch* batch, uint32_t* completed,
                                 kvc_error* err);

/* kvcache::TierFigures: one tier below a manager, its own figures and what
 * the manager did with it (counters since the manager was made). */
typedef struct kvc_tier_figures {
  char name[32]; /* NUL-terminated; truncated past 31 bytes */
  int32_t enabled;
  uint64_t pages_held;
  uint64_t bytes_held;
  uint64_t capacity_bytes;
  uint64_t lookups;
  uint64_t hits;
  uint64_t pages_stored;
  uint64_t bytes_stored;
  uint64_t pages_loaded;
  uint64_t bytes_loaded;
  uint64_t evictions;
  uint64_t corrupt;
  uint64_t io_errors;
  uint64_t load_nanoseconds;
  uint64_t pages_offloaded; /* evicted device pages the tier stored */
  uint64_t offload_dropped; /* evicted pages not written: staging full, refused, failed */
  uint64_t pages_onboarded; /* pages loaded back into the device pool */
  uint64_t load_failures;   /* loads that came back missing, mismatch, corrupt or failed */
} kvc_tier_figures;

/* The manager's tiers, nearest first, read in one reading with
 * *pending_loads (pages loading now; may be NULL). *count (may be NULL)
 * receives the number of tiers. With figures NULL and cap 0 the call only
 * sets the counts; otherwise figures[0, n) is written if the n tiers fit in
 * cap, else KVC_INVALID_ARGUMENT naming both, nothing written but the
 * counts. A manager without tiers (or a continuous one) has 0. */
kvc_status kvc_manager_tier_figures(const kvc_manager* manager, kvc_tier_figures* figures,
                                    uint32_t cap, uint32_t* count, uint32_t* pending_loads,
                                    kvc_error* err);

/* Pins the cached full pages of this prefix with priority > 0 (evicted only
 * when no unpinned page is evictable, lowest priority first); priority 0
 * unpins. *covered = the tokens the pinned pages hold. */
kvc_status kvc_pin_prefix(kvc_manager* manager, const uint32_t* tokens, size_t n_tokens,
                          uint32_t priority, uint64_t extra_key, uint32_t* covered, kvc_error* err);

/* Drops every cache entry (pages in use stay with their sequences). */
kvc_status kvc_reset_prefix_cache(kvc_manager* manager, kvc_error* err);

/* Zeroes the counters of kvc_manager_stats (the gauges stay). */
kvc_status kvc_reset_metrics(kvc_manager* manager, kvc_error* err);

typedef struct kvc_manager_stats {
  uint32_t total_blocks;     /* pages or slots */
  uint32_t free_blocks;      /* on the free list */
  uint32_t active_sequences; /* claimed and not released */
  /* Paged prefix cache (zero otherwise): */
  uint32_t pages_cached; /* ref count 0, evictable */
  uint32_t pages_pinned;
  uint64_t match_calls;
  uint64_t prompt_tokens; /* sum of n_tokens passed to kvc_match_prefix */
  uint64_t reused_tokens; /* sum of tokens it attached */
  uint64_t pages_published;
  uint64_t evictions;
  uint64_t cow_copies;
} kvc_manager_stats;

/* The counts are read one after the other: under concurrent calls they need
 * not describe a single instant. */
kvc_status kvc_manager_stats_get(const kvc_manager* manager, kvc_manager_stats* out,
                                 kvc_error* err);

/* fp8 caches: the static K and V scales, each [num_layers][n_kv_heads]
 * (kvcache::KVCacheManager::set_kv_scales). KVC_INVALID_ARGUMENT, nothing
 * changed, for another dtype, n != num_layers * n_kv_heads, a scale that is
 * zero, negative or not finite, or while a sequence is active. */
kvc_status kvc_manager_set_kv_scales(kvc_manager* manager, const float* k_scales,
                                     const float* v_scales, size_t n, kvc_error* err);

/* Audits the manager's bookkeeping (tests, debugging); KVC_INTERNAL with the
 * first inconsistency found. */
kvc_status kvc_check_invariants(const kvc_manager* manager, kvc_error* err);

/* ---- metrics and logging (kvcache/metrics.h, kvcache/log.h; docs/metrics.md) */

/* The manager's figures as Prometheus text (kvcache::metrics_text): every
 * metric name starts with `prefix` and an underscore (NULL: "kvcache"; it
 * must match [a-zA-Z_:][a-zA-Z0-9_:]*). *needed (may be NULL) receives the
 * bytes the text takes with its terminating NUL. With buf NULL and cap 0
 * the call only sets *needed (KVC_OK). Otherwise the text and its NUL are
 * written to buf if they fit in cap bytes; if not, the call fails with
 * KVC_INVALID_ARGUMENT naming both sizes, sets *needed and writes nothing
 * to buf. Figures move between calls: size buf with some slack, or retry. */
kvc_status kvc_metrics_text(const kvc_manager* manager, const char* prefix, char* buf, size_t cap,
                            size_t* needed, kvc_error* err);

/* kvcache::LogLevel. */
typedef enum kvc_log_level {
  KVC_LOG_TRACE = 0,
  KVC_LOG_DEBUG = 1,
  KVC_LOG_INFO = 2,
  KVC_LOG_WARN = 3,
  KVC_LOG_ERROR = 4,
  KVC_LOG_OFF = 5
} kvc_log_level;

/* A log message: level is a kvc_log_level; message (NUL-terminated, length
 * bytes without the NUL, no trailing newline) is valid during the call only. */
typedef void (*kvc_log_fn)(int32_t level, const char* message, size_t length, void* user_data);

/* Routes the library's log messages to fn (called with user_data) from
 * whichever thread logs, possibly several at once: fn must be thread-safe
 * and must not call kvc_ functions (the library does not promise to log
 * outside the managers' locks). NULL restores the default sink (one line a message on stderr).
 * Process-wide, like the level. Logging is off until kvc_set_log_level or
 * the KVCACHE_LOG_LEVEL environment variable turns it on; failed calls are
 * logged at KVC_LOG_DEBUG with their status and message. */
kvc_status kvc_set_log_callback(kvc_log_fn fn, void* user_data, kvc_error* err);

/* Messages at `level` and above reach the sink; KVC_LOG_OFF silences it.
 * A value outside kvc_log_level is refused with the value. */
kvc_status kvc_set_log_level(int32_t level, kvc_error* err);

/* The current level (KVCACHE_LOG_LEVEL read at the first logging call). */
int32_t kvc_get_log_level(void);

/* ---- batch ----------------------------------------------------------------- */

kvc_status kvc_batch_create(kvc_batch** out, kvc_error* err);
void kvc_batch_destroy(kvc_batch* batch);

/* A fetched batch as plain data (FlashInfer's paged_kv_t, MAX's collection):
 * everything a kernel of the caller's own needs, field for field the C++
 * kvcache::CacheDesc (kvcache/cache_desc.h) plus seq_ids and strategy.
 * Pointers stay valid as the header comment says. Strides are in elements:
 * element (layer, kv, block, row, head, d) is at
 *   blocks + layer * layer_stride + kv * kv_stride + block * block_stride
 *          + row * token_stride + head * head_stride + d. */
typedef struct kvc_cache_desc {
  void* blocks;                  /* the whole block buffer (layout above) */
  const uint32_t* cache_lengths; /* [batch_size] committed tokens */
  const uint32_t* lookup_table;  /* [batch_size][lookup_stride] block ids;
                                    unused entries hold num_blocks */
  const uint64_t* seq_ids;       /* [batch_size] */
  uint32_t lookup_stride;
  uint32_t batch_size;
  uint32_t max_seq_length;   /* most new tokens of an entry this step */
  uint32_t max_cache_length; /* most committed tokens of an entry (MAX) */
  uint32_t num_layers;
  uint32_t page_size; /* tokens per block: page_size, or max_seq_len (continuous) */
  uint32_t n_kv_heads;
  uint32_t head_dim;
  uint32_t num_blocks;
  int32_t dtype;    /* kvc_dtype */
  int32_t strategy; /* kvc_strategy */
  int32_t layout;   /* kvc_page_layout */
  /* [batch_size] tokens the fetch reserved room for per entry (cache_length
     + new tokens + num_steps - 1): a kernel must not touch rows past it. */
  const uint32_t* reserved_lengths;
  uint32_t max_full_context_length; /* most cache_length + new tokens of an entry */
  int32_t arrangement;              /* kvc_pool_arrangement */
  uint64_t block_stride;            /* block j to j + 1 of one layer's K (or V) */
  uint64_t layer_stride;            /* layer l to l + 1 */
  uint64_t kv_stride;               /* a layer's K to its V */
  uint64_t token_stride;            /* row r to r + 1 of one head in a block */
  uint64_t head_stride;             /* head h to h + 1 of one row */
  /* fp8: [num_layers][2 (K, V)][n_kv_heads] static scales of this device's
     heads (number = code * scale); NULL for other dtypes. int8 keeps one
     float scale per (row, head) after each block's values (docs/quantization.md). */
  const float* head_scales;
} kvc_cache_desc;

/* KVC_INVALID_ARGUMENT for a batch never fetched into. */
kvc_status kvc_batch_describe(const kvc_batch* batch, kvc_cache_desc* out, kvc_error* err);

/* One copy-on-write copy the last kvc_fetch into a batch made in the
 * manager's blocks: block dst now holds what block src held (every layer, K
 * and V). */
typedef struct kvc_block_copy {
  uint32_t src;
  uint32_t dst;
} kvc_block_copy;

/* The copies the last kvc_fetch into this batch made, in order (*copies may
 * be NULL when *count is 0). Kernels on the manager's blocks need do
 * nothing; a pool the caller keeps elsewhere with the same block ids (a GPU
 * pool) must make the same copies, in order, before this step writes into
 * it. A write into a page shared after kvc_fork, or cut by kvc_truncate,
 * goes to a private copy. Valid as the batch description is.
 * KVC_INVALID_ARGUMENT for a batch never fetched into. */
kvc_status kvc_batch_block_copies(const kvc_batch* batch, const kvc_block_copy** copies,
                                  uint32_t* count, kvc_error* err);

/* One write-back the last kvc_fetch into a batch asks of a caller whose pool
 * is apart (kvc_prefix_config.pool_apart): copy page `page` of the caller's
 * pool into `bytes`, a staging slot of the manager of `size` bytes (one
 * page), packed [2 (K, V)][num_layers][block] whatever the pool's
 * arrangement (a block: one layer's K or V of the page, as in the cache's
 * memory layout above). */
typedef struct kvc_block_offload {
  uint32_t page;
  void* bytes;
  size_t size;
} kvc_block_offload;

/* A pool apart's transfers from the last kvc_fetch into this batch (empty
 * otherwise; the arrays may be NULL when *count is 0). The caller applies
 * them to its pool before the batch's kernels, in this order:
 * 1. kvc_batch_block_offloads: each page, from its pool into `bytes`;
 * 2. kvc_batch_block_loads: each page id, from the manager's pool (the
 *    host pool: kvc_batch_describe's blocks, same arrangement and page ids)
 *    into its pool (pages a tier loaded);
 * 3. kvc_batch_block_copies, in order;
 * then calls kvc_complete_offloads(manager, batch) once the copies of 1.
 * have completed. The host pages of 2. must be read before the manager's
 * next kvc_fetch or kvc_match_prefix. A slot's bytes stay valid until it
 * is completed or the manager is destroyed; the arrays are valid as the
 * batch description is. KVC_INVALID_ARGUMENT for a batch never fetched
 * into. */
kvc_status kvc_batch_block_offloads(const kvc_batch* batch, const kvc_block_offload** offloads,
                                    uint32_t* count, kvc_error* err);
kvc_status kvc_batch_block_loads(const kvc_batch* batch, const uint32_t** pages, uint32_t* count,
                                 kvc_error* err);

/* Multistep decoding (MAX increment_cache_lengths): advances every entry's
 * cache length by the tokens it processed last step, given as that step's
 * row offsets (batch_size + 1 of them), for a decode step of one token per
 * entry. Touches no manager state. */
kvc_status kvc_batch_increment_cache_lengths(kvc_batch* batch, const uint32_t* prev_row_offsets,
                                             uint32_t n_offsets, kvc_error* err);

/* ---- kernels (CPU) --------------------------------------------------------- */

typedef struct kvc_thread_pool kvc_thread_pool;

/* num_threads counts the calling thread (1: no workers; 0: one per core; at most 1024, else
 * KVC_INVALID_ARGUMENT). KVC_OUT_OF_MEMORY when the system refuses a thread part-way: the
 * threads already started are joined and *out is left unchanged. */
kvc_status kvc_thread_pool_create(uint32_t num_threads, kvc_thread_pool** out, kvc_error* err);
void kvc_thread_pool_destroy(kvc_thread_pool* pool);

typedef struct kvc_store_options {
  int32_t rope_k;      /* 1: rotate K by its position (RoPE, rotate-half) on the way in */
  float rope_theta;    /* 0: 10000 */
  uint32_t rotary_dim; /* 0: head_dim */
} kvc_store_options;

/* Writes the batch's new K and V rows of `layer` (fp32, [tokens][n_kv_heads]
 * [head_dim], converted to the cache dtype) at positions cache_length + i.
 * options and pool may be NULL. */
kvc_status kvc_store_kv(const kvc_batch* batch, uint32_t layer, const float* k_new,
                        const float* v_new, const uint32_t* row_offsets,
                        const kvc_store_options* options, kvc_thread_pool* pool, kvc_error* err);

/* kvcache::AttentionPrecision (kvcache/kernels/options.h): KVC_PRECISION_BF16
 * rounds the scaled query and the probabilities to bf16 on a bf16 cache (as
 * GPU kernels do; multiplied as bf16 pairs where the CPU has AVX512-BF16). */
enum { KVC_PRECISION_FP32 = 0, KVC_PRECISION_BF16 = 1 };
/* kvcache::AttentionPrefetch: the kernel's software prefetch (automatic: the
 * one measured fastest on the running processor). */
enum {
  KVC_PREFETCH_AUTOMATIC = 0,
  KVC_PREFETCH_NEXT_STEP_L1 = 1,
  KVC_PREFETCH_NEXT_TILE_L2 = 2,
  KVC_PREFETCH_NONE = 3,
  KVC_PREFETCH_NEXT_TILE_L1 = 4
};

/* Zero-initialised: the defaults. */
typedef struct kvc_attention_options {
  float scale;       /* 0: 1 / sqrt(head_dim) */
  int32_t precision; /* KVC_PRECISION_* */
  int32_t prefetch;  /* KVC_PREFETCH_* */
} kvc_attention_options;

/* Causal attention of the batch's new tokens' queries (fp32, [tokens]
 * [n_q_heads][head_dim]; n_q_heads a multiple of n_kv_heads: GQA) over
 * `layer`'s cache (the committed tokens and this step's, stored first),
 * into out (same shape). options and pool may be NULL. */
kvc_status kvc_attention(const kvc_batch* batch, uint32_t layer, const float* q, uint32_t n_q_heads,
                         const uint32_t* row_offsets, float* out,
                         const kvc_attention_options* options, kvc_thread_pool* pool,
                         kvc_error* err);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVCACHE_C_API_H_ */
