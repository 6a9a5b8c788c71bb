/* prefetch.h - v0.2.0 - MIT or public domain - a GPU input pipeline in one header

   Keeps a GPU (or a CPU training loop) from ever waiting for its next batch:
   worker threads load batches straight into a ring of pinned host slots, a
   side CUDA stream copies batch k+1 to the device while the GPU computes on
   batch k, events (never host syncs) order everything, and a slot is reused
   only when the GPU is provably done with it. Without CUDA, or without a GPU,
   the same header is a fast multi-threaded CPU data loader.

   USAGE

     Do this:
        #define PREFETCH_IMPLEMENTATION
     before you include this file in *one* C or C++ (or .cu) file to create
     the implementation. Every other file just includes "prefetch.h".

        gcc -std=c11 train.c -lcudart -DPREFETCH_CUDA    (CUDA backend, gcc)
        nvcc train.cu                                    (PREFETCH_CUDA is automatic)
        gcc -std=c11 train.c                             (host backend only)

     The public half includes only <stddef.h>, <stdint.h> and <stdbool.h>;
     CUDA objects cross the API as void *, so any file can include it.
     CUDA toolkits: 11.8 and newer (12.x, 13.x); the calls that changed
     between them are chosen by CUDART_VERSION.

   STEP BY STEP

     1. Write a load callback. It fills one batch into job->host (capacity
        bytes, pinned on the CUDA backend) from the sample indices it is
        given, and returns 0; on failure it returns pf_job_fail(job, ...).

            static int load(void *user, pf_job *job) {
                for (uint32_t i = 0; i < job->count; i++)
                    read_sample(user, job->indices[i],
                                (char *)job->host + i * SAMPLE_BYTES);
                job->bytes = job->count * SAMPLE_BYTES;   // default: capacity
                return 0;
            }

     2. Describe the dataset and create the loader (zero = default):

            pf_config cfg = {0};
            cfg.load = load;  cfg.user = &my_dataset;
            cfg.num_samples = 50000;  cfg.batch_size = 256;
            cfg.batch_bytes = 256 * SAMPLE_BYTES;
            cfg.shuffle = true;  cfg.epochs = 90;  cfg.stream = my_stream;
            pf_loader *loader;
            if (pf_create(&cfg, &loader) != PF_OK)
                fprintf(stderr, "%s\n", pf_error(NULL));

     3. The training loop:

            for (;;) {
                pf_batch b;
                pf_result r = pf_next(loader, &b);
                if (r == PF_END_OF_EPOCH) { evaluate(); continue; }
                if (r == PF_END_OF_DATA) break;
                if (r != PF_OK) { fprintf(stderr, "%s\n", pf_error(loader)); break; }
                train_step<<<grid, block, 0, my_stream>>>(b.data, b.count);
                pf_release(loader, &b);   // records an event; no host sync
            }
            pf_destroy(loader);

   BACKENDS

     PF_BACKEND_DEFAULT  CUDA when compiled in and a device is usable, else
                         host (logged through cfg.log, saying what was
                         found: no driver, a driver too old, no device).
                         Never silently where device pointers are expected:
                         with cfg.stream set, pf_create fails instead with
                         PF_ERR_NO_DEVICE (kernels would get host pointers;
                         ask for PF_BACKEND_HOST to run on the CPU), and with
                         only cfg.cuda_device set it warns (on stderr when
                         there is no cfg.log). pf_get_backend(l) says which
                         backend a loader runs on.
     PF_BACKEND_HOST     pf_next hands out the filled host slot itself (zero
                         copy); pf_release returns it to the ring.
     PF_BACKEND_CUDA     host slots are one cudaHostAlloc block; a stager
                         thread copies each batch on its own non-blocking
                         stream into one of device_slots slots (one cudaMalloc
                         block); b.data is a device pointer. pf_next makes
                         cfg.stream wait for the copy with cudaStreamWaitEvent
                         (no host wait); pf_release records an event on
                         cfg.stream, and the next copy into that slot waits for
                         it on the GPU. A retirer thread sleeps on an event
                         behind each copy and gives the host slot back; the
                         copy stream holds GPU work only. No library call uses
                         the legacy default stream, except cfg.stream when you
                         leave it NULL. Without a usable device pf_create fails
                         with PF_ERR_NO_DEVICE and the runtime's own message.

   CUDA RULES

     Contexts   the library creates a context only on cfg.cuda_device, and
                every call leaves the calling thread's CUDA state exactly as
                it found it: its current context (or none) and the device
                cudaSetDevice chose (or none). pf_create retains the primary
                context of cfg.cuda_device (driver entry points through the
                runtime, no libcuda link), each call on your thread pushes
                and pops it, pf_destroy releases it. A driver without those
                entry points gets cudaSetDevice for the span of a call,
                then no context current again if none was. Its own threads
                call cudaSetDevice first.
     Faults     a sticky context error (your kernel's illegal address)
                reaches you as PF_ERR_CUDA from pf_next in bounded time,
                whatever the pipeline was doing, naming the call that saw it;
                it is sticky, and pf_destroy still returns promptly.
     On error   pf_next zeroes *out on anything but PF_OK: you own nothing
                new. Batches you hold stay yours to release (or destroy).
     Destroy    drains the copy stream, then waits (on an event) for
                cfg.stream to pass the point of the call, so kernels still
                reading a batch you hold finish before the memory goes.

   CONFIG MACROS

     PREFETCH_IMPLEMENTATION  compile the implementation into this file
     PREFETCH_CUDA            compile the CUDA backend in (automatic under nvcc)
     PREFETCH_STATIC          make every function static to this file
     PREFETCH_USE_PTHREADS    use pthreads instead of C11 <threads.h> (automatic
                              under ThreadSanitizer, which cannot see C11
                              threads on glibc, and on Apple, which lacks them)
     PREFETCH_NVTX            NVTX ranges around load, stage and wait, and named
                              streams, so Nsight Systems shows the pipeline
                              (the toolkit's header-only nvtx3; CUDA builds)
     PF_ASSERT(x)             your assert (default: assert from <assert.h>)
     PF_SPIN_MAX_NS           the longest spin before a wait (default 20000;
                              0 never spins)

   THREADING MODEL

     num_workers threads call load, each on its own slot; never two at once
     on one slot (on CUDA a stager and a retirer thread run beside them). A
     worker first needs a free slot, then takes the next batch in order, so
     the oldest undelivered batch always has a slot and in-order delivery
     cannot deadlock. pf_next, pf_release, pf_batch_wait and
     pf_get_stats may be called from any thread (they lock); pf_destroy must
     not race with any other call on the same loader. A thread with
     nothing to do (a worker, pf_next, the stager; the retirer polls its
     copy's event) spins briefly first (up to PF_SPIN_MAX_NS, only while a
     CPU is free for it, less when spins do not pay), because a sleep and a
     wake cost 10-40 us on a VM; then it sleeps on a condition variable (the
     retirer: a blocking event sync): an idle loader uses no CPU after that
     spin. One loader per GPU; loaders share nothing but the process-wide
     count of spinning threads.

     Inside (for maintainers): struct pf_loader is cut into parts, and one
     mutex, sync.mu, guards every part unless a line below says otherwise.
       cfg, ops, stride   fixed in pf_create; any thread reads them.
       sync    the lock, conditions, owed wakes (>>waiting). sync.pulse is
               read by spinners without the lock, sync.stopping by
               pf_job_cancelled and by threads deciding whether to go on;
               both are written under it.
       ring    host slots and their queues (>>ring). A slot and its
               descriptor belong to whoever its state names, who may use
               them without the lock: LOADING its worker, READY nobody,
               HELD the caller, STAGING the stager, COPYING the copy
               engine until the retirer frees it; a device slot likewise
               (COPYING the stager, READY nobody, HELD the caller). States
               move only through pf__move, which asserts the move. Growth
               (autotune): the worker that set ring.growing writes the new
               slots' memory and ring.grown without the lock, and frees a
               failed trial's block, or one the settled count no longer needs
               (ring.retire_from), the same way.
       claim   the epochs' plans and the workers' claim cursor (>>claim):
               workers claim and plan (dropping the lock around
               cfg.num_samples_fn), the taker retires plans.
       take    the taker's cursor: the consumer's (host) or the stager's
               (CUDA) (pf__take, >>ring).
       cons    what pf_next has handed out (>>consumer); cons.err is the
               latest failed call's text (pf__fail), copied out by pf_error.
       ck      the checkpoint: the consumer's position, moved by each
               delivery (pf__note_delivery, >>consumer) and read by the
               claim's lead cap and pf_checkpoint; the parsed resume token
               (>>resume).
       error   the pipeline's first failure (>>errors).
       pool    the worker threads; a worker's job fields are its own. The
               extra record pool.w[num_workers] is pf_next's own
               (pf__load_inline): one caller at a time loads through it
               (at.inline_busy).
       at      autotune (>>autotune), changed only inside pf_next.
       st      the stats.
       cu      the CUDA backend (>>backend cuda): handles fixed in
               pf_create, queues under sync.mu. No call that queues or
               waits for GPU work is made with the lock held (error
               strings are read under it).

   MEMORY

     Allocated once in pf_create, never during the run:
       host:  host_slots * stride   (pinned on CUDA, cfg.allocator on host;
                                   touched once in pf_create, so resident;
                                   page-aligned when stride is a page
                                   multiple, and blocks of 2 MiB or more in
                                   transparent huge pages on Linux)
       GPU:   device_slots * stride (CUDA backend)
       and on CUDA an offsets table per slot, host (pinned) and device:
       (batch_size + 1) * 8 bytes rounded up to 256, for packed batches
     except with autotune, where host slots follow the active workers: the
     ring starts with what one worker needs and grows (a block per growth,
     allocated by a worker) as autotune adds workers, up to host_slots;
     when a trial of more workers fails, its block is given back once all
     its slots are free. pf_stats.host_slots counts the slots with memory.
     where stride = batch_bytes rounded up to 256, so that every slot starts
     256-byte aligned for vector loads. Plus small bookkeeping through
     cfg.allocator: (3 * batch_size + 1) * 8 bytes per slot, host and
     device (its indices, and its packed samples' offsets and bad ones;
     the default host_slots adds slots past 2 * num_workers + 1 only while
     these too fit in 2 MiB). A reader
     (pf_records_open, ...) allocates through the cfg.allocator it is
     opened with as well: its index at the open, a growing file list's
     files as epochs are planned, a read buffer per worker.

   ERRORS AND LOGGING

     Every call returns a pf_result: 0 is PF_OK, > 0 is information
     (end of epoch, end of data, timeout), < 0 an error. pf_error(loader)
     says what went wrong in words; pf_error(NULL) says why this thread's last
     pf_create failed. Pipeline errors (a failing load, a CUDA error) are
     sticky: every later pf_next returns them; in order mode they surface
     only after every earlier batch was delivered. The library logs through
     cfg.log when set and prints nothing, with one exception: a DEFAULT
     backend that names cfg.cuda_device and falls back to the host warns
     on stderr when there is no cfg.log. pf_destroy is always safe.

   DATA-PARALLEL TRAINING

     pf_shard_from_env(&cfg) fills rank, world_size and cuda_device from
     the launcher (torchrun, Open MPI, MPICH/PMI or SLURM variables); every
     rank then gets a disjoint share and the same number of batches. One
     loader per GPU in one process also works: each binds its threads to
     its cuda_device.

   WHERE THE TIME GOES

     pf_stats_format(loader, buf, size) writes a line such as
       epoch 3 · batch 120/390 · 5.1 GB/s · 812 batches/s · waited 2% · compute-bound
     and cfg.progress, when set, is called every cfg.progress_every
     batches on the thread that calls pf_next.

   YOUR DATA

     Per-worker state: cfg.worker_init returns a pointer each job carries
     as job->worker_state; cfg.worker_stop frees it on the same thread
     (when the worker exits, is destroyed, or parks: autotune, or more
     workers than CPUs for loads that never sleep).
     Samples of different sizes: pf_job_append(job, bytes) packs them; the
     batch carries offsets (b.offsets, host memory; on CUDA also
     b.dev_offsets, the same on the device for your kernels) and only the
     bytes used are copied.
     Bad samples: pf_job_skip(job, i, why) with cfg.bad_samples SKIP or
     MARK goes on, listed in the batch (skipped_indices) and counted in
     pf_stats.skipped, until cfg.bad_limit; the default stops the run.
     Readers fill the config for you: pf_records_open (fixed-size records
     in files, a list that may grow each epoch), pf_tokens_open (llm.c's
     token shards) and pf_tar_open (WebDataset-style tar shards), each
     with an optional per-sample step (decode, augment).

   LICENSE at the end of the file.
*/
#ifndef PREFETCH_H_INCLUDED
#define PREFETCH_H_INCLUDED

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define PREFETCH_VERSION_MAJOR 0
#define PREFETCH_VERSION_MINOR 2
#define PREFETCH_VERSION_PATCH 0

#if defined(__CUDACC__) && !defined(PREFETCH_CUDA)
#define PREFETCH_CUDA
#endif

#ifndef PF_API
#if defined(PREFETCH_STATIC) && defined(__GNUC__)
#define PF_API static __attribute__((unused))
#elif defined(PREFETCH_STATIC)
#define PF_API static
#else
#define PF_API extern
#endif
#endif

#if defined(__GNUC__) || defined(__clang__)
#define PF__PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define PF__PRINTF(fmt, args)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Results. One list makes both the enum and pf_result_string, so the two
   never drift apart. 0 ok, > 0 not an error, < 0 an error. */
#define PF_RESULT_LIST(X)                                                      \
    X(PF_OK, 0, "ok")                                                          \
    X(PF_END_OF_EPOCH, 1, "end of epoch: every batch of this epoch was delivered") \
    X(PF_END_OF_DATA, 2, "end of data: every configured epoch was delivered")  \
    X(PF_TIMEOUT, 3, "timeout: the next batch was not ready within timeout_ms") \
    X(PF_ERR_INVALID_ARG, -1, "invalid argument")                              \
    X(PF_ERR_INVALID_STATE, -2, "invalid state")                               \
    X(PF_ERR_NO_MEMORY, -3, "out of memory")                                   \
    X(PF_ERR_NO_DEVICE, -4, "no usable CUDA device")                           \
    X(PF_ERR_CUDA, -5, "a CUDA call failed")                                   \
    X(PF_ERR_THREAD, -6, "a thread primitive failed")                          \
    X(PF_ERR_LOAD, -7, "the load callback failed")

typedef enum pf_result {
#define PF__RESULT_ENUM(name, value, text) name = (value),
    PF_RESULT_LIST(PF__RESULT_ENUM)
#undef PF__RESULT_ENUM
    PF__RESULT_FORCE_INT = 0x7fffffff
} pf_result;

typedef enum pf_backend {
    PF_BACKEND_DEFAULT = 0, /* CUDA if compiled in and a device is usable, else host */
    PF_BACKEND_HOST,
    PF_BACKEND_CUDA
} pf_backend;

typedef enum pf_log_level { PF_LOG_ERROR = 1, PF_LOG_WARN, PF_LOG_INFO, PF_LOG_DEBUG } pf_log_level;

/* What the pipeline is bound by, from pf_get_stats. */
typedef enum pf_bound {
    PF_BOUND_UNKNOWN = 0, /* too few batches to say                          */
    PF_BOUND_INPUT,       /* the consumer waits for loads: add workers, make
                             load cheaper                                    */
    PF_BOUND_COPY,        /* the consumer waits for host-to-device copies    */
    PF_BOUND_COMPUTE      /* the loader keeps up: the consumer rarely waits  */
} pf_bound;

typedef struct pf_loader pf_loader;

/* One batch for a worker to fill. */
typedef struct pf_job {
    uint64_t epoch, batch;     /* batch: 0-based within the epoch (of this rank) */
    const uint64_t *indices;   /* count sample indices, in batch order          */
    uint32_t count;            /* samples in this batch (the last may be short) */
    uint32_t worker;           /* 0 .. num_workers-1; num_workers when pf_next
                                  loads the batch itself, on the caller's
                                  thread (never with cfg.workers_only): such
                                  a load must not wait for the caller's next
                                  steps                                        */
    void *host;                /* the slot: capacity bytes (pinned on CUDA)     */
    size_t capacity;           /* = cfg.batch_bytes                             */
    size_t bytes;              /* load sets the bytes it wrote; default capacity */
    uint64_t rng;              /* seed from (seed, epoch, rank, batch): the same
                                  augmentation whichever worker runs the batch  */
    void *worker_state;        /* what cfg.worker_init returned on this worker  */
    void *pf__worker;          /* private                                       */
} pf_job;

/* Fill job->host; return 0 on success, non-zero (best: pf_job_fail) on failure. */
typedef int (*pf_load_fn)(void *user, pf_job *job);

/* What happens to a sample the load reports bad with pf_job_skip. */
typedef enum pf_bad_policy {
    PF_BAD_STOP = 0, /* the batch fails: pf_next returns PF_ERR_LOAD naming it  */
    PF_BAD_SKIP,     /* the sample is left out of its (packed) batch            */
    PF_BAD_MARK      /* cfg.bad_marker takes the sample's place                 */
} pf_bad_policy;

/* Host bookkeeping memory, the host backend's slots, and everything the
   readers allocate. Both or neither. Called from the library's threads
   too (workers, as they start or grow the ring): it must be thread-safe. */
typedef struct pf_allocator {
    void *(*alloc_fn)(size_t size, void *user_data);
    void (*free_fn)(void *ptr, void *user_data);
    void *user_data;
} pf_allocator;

/* Zero-initialised fields take the defaults in brackets. */
typedef struct pf_config {
    pf_load_fn load;           /* required                                      */
    void *user;                /* passed to load, num_samples_fn, on_worker_start */
    uint64_t num_samples;      /* required unless num_samples_fn (1 .. 2^62)    */
    uint64_t (*num_samples_fn)(void *user, uint64_t epoch); /* asked once per
                                  epoch, when planning it starts: datasets that
                                  grow during training                          */
    uint32_t batch_size;       /* required, samples per batch (1 .. 2^24)       */
    size_t batch_bytes;        /* required, slot capacity in bytes              */
    uint32_t epochs;           /* [0 = until pf_destroy]                        */
    uint32_t num_workers;      /* [4, or 16 with autotune] load threads (1 .. 1024);
                                  with autotune, the most it may use. More
                                  loaders than CPUs (pf_next is one where it
                                  may load), with loads that never sleep
                                  (all CPU): as many as CPUs load at a time
                                  (one fewer while your thread keeps a CPU
                                  busy, one more where pf_next does not
                                  load), the rest park until loads sleep
                                  again (pf_stats.workers_active)             */
    uint32_t host_slots;       /* [2 * num_workers + 1, or up to 64 while they
                                  and their bookkeeping each fit in 2 MiB]
                                  (1 .. 4096); with autotune
                                  the most the ring grows to                   */
    uint32_t device_slots;     /* [3] CUDA backend (1 .. 4096)                  */
    bool shuffle;              /* [false] a new permutation each epoch          */
    bool drop_last;            /* [false] drop the short last batch (per rank)  */
    bool unordered;            /* [false] deliver batches as they complete      */
    uint64_t seed;             /* [0] shuffle and job->rng                       */
    uint32_t rank, world_size; /* [0, 1] data-parallel sharding                  */
    pf_backend backend;        /* [PF_BACKEND_DEFAULT]                          */
    int cuda_device;           /* [0]                                           */
    void *stream;              /* [NULL = legacy default stream] consumer
                                  cudaStream_t                                  */
    uint32_t timeout_ms;       /* [0 = wait forever] pf_next gives up after it  */
    void (*log)(void *log_user, int level, const char *msg); /* [none]          */
    void *log_user;
    void (*on_worker_start)(void *user, uint32_t worker); /* [none] per-thread
                                  setup, run on the worker before its first load */
    pf_allocator allocator;    /* [malloc/free]                                  */
    void (*progress)(void *progress_user, pf_loader *loader); /* [none] called
                                  every progress_every batches, from pf_next, on
                                  its caller's thread: print pf_stats_format    */
    void *progress_user;
    uint32_t progress_every;   /* [100]                                         */
    const char *resume;        /* [NULL = from the start] a pf_checkpoint token:
                                  continue exactly where it was taken (in order
                                  mode, also on another world_size)            */
    uint32_t shuffle_block;    /* [0 = 1] with shuffle: keep runs of this many
                                  consecutive indices together (block shuffle,
                                  for data read past the page cache)          */
    uint32_t shuffle_window;   /* [8] with shuffle_block > 1: how many blocks
                                  have their samples mixed together           */
    bool autotune;             /* [false] size the active workers from the
                                  loader's own measurements, up to num_workers;
                                  host backend without worker_init/stop,
                                  on_worker_start or timeout_ms: when a load
                                  costs less than handing a batch over,
                                  pf_next also loads, on your thread, when
                                  the next batch is not ready (next_loads) */
    bool workers_only;         /* [false] loads run on worker threads only.
                                  Else, on the host backend, when the next
                                  batch is not ready and loads are cheap
                                  (under 200 us), pf_next loads one itself, on
                                  your thread, instead of sleeping (next_loads);
                                  never with your own per-thread hooks
                                  (worker_init/stop, on_worker_start) or
                                  timeout_ms. Such a load must not wait for
                                  your next steps                              */
    bool poison;               /* [false] debug: the host backend fills each slot
                                  past job->bytes with 0xA5 before pf_next
                                  returns it, so a loop that reads past what
                                  load declared sees garbage on a CPU box too,
                                  as it would on a GPU (CUDA copies only
                                  job->bytes)                                 */
    void *(*worker_init)(void *user, uint32_t worker); /* [none] per-worker
                                  state: runs on the worker thread before its
                                  first load (again after autotune parked it);
                                  each job carries the result as worker_state */
    void (*worker_stop)(void *user, uint32_t worker, void *state); /* [none]
                                  on the same thread, once per worker_init: as
                                  the worker parks, stops or is destroyed      */
    pf_bad_policy bad_samples; /* [PF_BAD_STOP] a sample pf_job_skip reports    */
    uint64_t bad_limit;        /* [0 = no limit] with SKIP or MARK (with STOP:
                                  PF_ERR_INVALID_ARG): the run stops
                                  (PF_ERR_LOAD) once more samples than this
                                  were skipped, counted in batch order and
                                  across resumes (the token carries the count):
                                  it stops at the first batch, in batch order,
                                  that takes the count past the limit, after
                                  every batch before it and none after it.
                                  Unordered too, whatever order loads finish
                                  in: near the limit a batch waits for the
                                  loads before it to know its place        */
    const void *bad_marker;    /* PF_BAD_MARK: the bytes that replace a bad    */
    size_t bad_marker_bytes;   /* sample (one sample's worth; kept by pointer,
                                  valid while the loader lives)               */
} pf_config;

/* A zeroed config, every field at its default, without a warning in C11,
   C++11 and later, or nvcc with -Wall -Wextra:
       pf_config cfg = PF_CONFIG_INIT;
   (C's {0} is a -Wmissing-field-initializers warning in C++; C's {} is not
   C11.) */
#ifdef __cplusplus
#define PF_CONFIG_INIT pf_config()
#else
#define PF_CONFIG_INIT {0}
#endif

typedef struct pf_batch {
    void *data;                /* device pointer (CUDA) or host pointer (host)  */
    size_t bytes;
    uint64_t epoch, batch;
    const uint64_t *indices;   /* count sample indices; valid until pf_release  */
    uint32_t count;
    uint64_t rng;              /* the job's rng, for augmentation on the GPU    */
    const uint64_t *offsets;   /* packed batches (pf_job_append, readers): count
                                  + 1 byte offsets into data, sample i is
                                  [offsets[i], offsets[i+1]); host memory.
                                  NULL when the load wrote the slot itself    */
    const uint64_t *dev_offsets; /* CUDA, packed batches: the same count + 1
                                  offsets in device memory, for a kernel on
                                  cfg.stream (copied behind the batch on the
                                  copy stream: ordered before your kernels as
                                  data is). NULL on the host backend and for
                                  batches that are not packed. Valid until
                                  pf_release, like data                      */
    uint32_t skipped;          /* bad samples skipped or marked in this batch  */
    const uint64_t *skipped_indices; /* their sample indices (skipped of them) */
    /* private: lets pf_release tell a live batch from a stale or foreign one */
    const pf_loader *pf__owner;
    uint64_t pf__ticket;
    uint32_t pf__slot;
} pf_batch;

typedef struct pf_stats {
    pf_backend backend;        /* the backend in use (never DEFAULT)             */
    uint32_t num_workers, host_slots, device_slots;
    uint64_t epoch;            /* the consumer's current epoch                   */
    uint64_t batch;            /* batches delivered in it so far                 */
    uint64_t batches_in_epoch; /* its batch count (0 until known)                */
    uint64_t batches, samples, bytes; /* delivered by pf_next, all epochs        */
    uint64_t copies, copy_bytes; /* host-to-device copies issued (CUDA)          */
    double elapsed_s;          /* from the first pf_next to the latest one       */
    double wait_s;             /* consumer time blocked in pf_next               */
    double wait_input_s;       /*   of which the next batch was still loading
                                  (CUDA: and the GPU had run dry)               */
    double wait_copy_s;        /*   of which the GPU had run dry waiting for a
                                  copy (CUDA)                                    */
    double wait_gpu_s;         /*   of which the GPU was still busy with batches
                                  already handed out: backpressure, the GPU is
                                  the limit (CUDA)                              */
    double load_s;             /* worker time inside load, summed                */
    double worker_wait_s;      /* worker time blocked on a free slot, summed (a
                                  wait counts as it lasts): the consumer (or
                                  the copy) is the bottleneck                    */
    double occupancy;          /* mean fraction of host slots filled and waiting,
                                  seen at each pf_next                           */
    uint32_t workers_active;   /* workers allowed to load now (autotune: its choice;
                                  0: pf_next loads each batch itself; fewer
                                  than num_workers without autotune: loads
                                  never sleep, a worker a CPU, see num_workers) */
    uint64_t next_loads;       /* batches pf_next loaded itself (by default when
                                  the next batch is late and loads are cheap,
                                  and on autotune's trials; never with
                                  cfg.workers_only); counted in wait_input_s
                                  (loads under 2 us come in runs, each run
                                  timed as a whole, its loads at its mean;
                                  single ones 1 in 16 timed)                   */
    uint64_t skipped;          /* bad samples skipped or marked (cfg.bad_samples),
                                  in the batches pf_next returned: their
                                  b.skipped summed, from the run's start (a
                                  resumed run's token included)               */
    uint32_t free_slots, loading_slots, ready_slots, held_slots, copying_slots;
    uint32_t device_ready, device_held;
    pf_bound bound;
    const char *verdict;       /* one sentence: what bounds the loop, what to do */
} pf_stats;

/* pf_create: validate cfg, allocate everything, start the threads.
   Returns PF_OK and *out, or an error with *out = NULL and pf_error(NULL)
   naming what was wrong. Thread safety: any thread; cfg is copied. */
PF_API pf_result pf_create(const pf_config *cfg, pf_loader **out);

/* pf_next: the next batch (in order unless cfg.unordered), PF_END_OF_EPOCH
   once after each epoch's last batch, then PF_END_OF_DATA for ever after the
   last epoch (save a CUDA error that comes after it, a device fault in
   your last kernels: that is returned instead, and sticks). Waits
   (sleeping) until the batch is ready, at most
   cfg.timeout_ms when set (PF_TIMEOUT; the loader still works). CUDA: the
   consumer stream is made to wait for the copy; the host does not wait.
   Holding every slot and asking for more is PF_ERR_INVALID_STATE.
   Thread safety: any thread, serialised internally. */
PF_API pf_result pf_next(pf_loader *l, pf_batch *out);

/* pf_release: give a batch back. CUDA: records an event on the consumer
   stream; the slot is overwritten only after the GPU has passed it. A
   batch released twice, or from another loader, is an error (not a crash).
   Thread safety: any thread. */
PF_API pf_result pf_release(pf_loader *l, pf_batch *b);

/* pf_batch_wait: block the calling host thread until b's data has landed
   (CUDA: the copy finished; host: returns at once). For consumers that
   read the batch on the CPU. Thread safety: any thread. */
PF_API pf_result pf_batch_wait(pf_loader *l, const pf_batch *b);

/* pf_destroy: stop and join every thread, free every byte. Safe at any
   moment: mid-epoch, batches held, workers inside load (it waits for each
   running load to return; a long load can poll pf_job_cancelled), after
   an error. NULL is fine. Must not race with other calls on l. */
PF_API void pf_destroy(pf_loader *l);

/* pf_error: the last failure on l in words (with several threads calling
   into l, the latest of any of them); the text stays valid until this
   thread calls pf_error again. pf_error(NULL): why this thread's last
   pf_create failed. Never NULL. Thread safety: any thread. */
PF_API const char *pf_error(const pf_loader *l);

PF_API const char *pf_result_string(pf_result r);

/* pf_get_stats: a snapshot of counters and the verdict. Any thread. */
PF_API void pf_get_stats(const pf_loader *l, pf_stats *out);

/* pf_get_backend: the backend l runs on, PF_BACKEND_CUDA (b.data is device
   memory) or PF_BACKEND_HOST (host memory); never DEFAULT, which pf_create
   resolves. NULL: PF_BACKEND_DEFAULT. Thread safety: any thread. */
PF_API pf_backend pf_get_backend(const pf_loader *l);

/* pf_config_defaults: cfg with every zero field replaced by its default. */
PF_API pf_config pf_config_defaults(const pf_config *cfg);

/* pf_shard_from_env: fill cfg->rank, cfg->world_size and (from the local
   rank) cfg->cuda_device from the launcher's environment, looked for in
   this order: torchrun (RANK, WORLD_SIZE, LOCAL_RANK), Open MPI
   (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK), MPICH/PMI (PMI_RANK,
   PMI_SIZE, MPI_LOCALRANKID), SLURM (SLURM_PROCID, SLURM_NTASKS,
   SLURM_LOCALID). The local rank picks the GPU; when CUDA_VISIBLE_DEVICES
   lists k devices it is taken modulo k (a launcher that gives each process
   one GPU makes it device 0). No launcher: cfg is left as it is, PF_OK.
   A malformed or contradictory value (not a number, a rank not below the
   size, a rank without a size) is PF_ERR_INVALID_ARG and pf_error(NULL)
   names the variable. Thread safety: reads the environment with getenv;
   call it at startup, not while another thread may call setenv. */
PF_API pf_result pf_shard_from_env(pf_config *cfg);

/* pf_checkpoint: a short text token (NUL-terminated, printable) for the
   position after the last batch pf_next returned on l. Put it in your
   training checkpoint; cfg.resume = token continues from there exactly:
   the same indices, job->rng, epoch ends and end of data as a run that was
   never stopped, and the same count of bad samples skipped so far (the
   token's skipped=N, written when not 0), so cfg.bad_limit stops it at the
   batch an uninterrupted run stops at and pf_stats.skipped goes on. In
   order mode the ranks step in lockstep, so one rank's token serves them
   all, also on another world_size (the rest of the epoch is spread over
   the new ranks, each sample once, plus the usual padding); its skipped=
   is its own rank's, so another rank (or world size) counts from 0, with
   a warning when cfg.bad_limit is set.
   Unordered, the token also lists the batches delivered past the first
   missing one, and resuming needs the same world_size and rank. A buffer
   too small (or NULL) is PF_ERR_INVALID_ARG, pf_error saying the size
   needed, and buf holds "" (never a cut token). After
   a CUDA error that kept a batch pf_next had taken from the caller,
   PF_ERR_CUDA: no token is exact any more; keep the last one taken before.
   Thread safety: any thread; stop calling pf_next first for a token that
   means "everything I trained on". */
PF_API pf_result pf_checkpoint(pf_loader *l, char *buf, size_t size);

/* pf_stats_format: one line a person reads at a glance, e.g.
   "epoch 3 · batch 120/390 · 5.1 GB/s · 812 batches/s · waited 2% · compute-bound".
   Returns the length snprintf would (the line is cut to fit size, never
   inside a character). */
PF_API int pf_stats_format(const pf_loader *l, char *buf, size_t size);

/* For load callbacks. pf_job_fail records why the batch failed (printf
   format) and returns -1, so `return pf_job_fail(job, "...", ...);` works;
   the batch fails with that message even if load then returns 0 (called
   twice, the first message stands).
   pf_job_cancelled is true once pf_destroy has begun: a slow load may stop
   early (its batch is discarded). */
PF_API int pf_job_fail(pf_job *job, const char *fmt, ...) PF__PRINTF(2, 3);
PF_API bool pf_job_cancelled(const pf_job *job);

/* Packed batches (samples of different sizes). pf_job_append reserves the
   next sample's bytes right after the previous one and returns where to
   write them (NULL: it does not fit in the slot, or every sample is already
   there; the job has failed, return non-zero). The batch then carries
   offsets (b.offsets; CUDA: b.dev_offsets too, copied behind the batch, so
   a kernel on cfg.stream finds sample i at data + dev_offsets[i]);
   job->bytes is kept at the bytes used, and only those are copied
   to the GPU. Append one per sample of job->indices, in order, except the
   ones pf_job_skip reported. */
PF_API void *pf_job_append(pf_job *job, size_t bytes);

/* pf_job_skip: sample i (0 .. count-1 of job->indices) is bad. With
   cfg.bad_samples = PF_BAD_STOP (default) this is pf_job_fail naming the
   sample, and returns -1: return it. With PF_BAD_SKIP or PF_BAD_MARK it
   is logged (PF_LOG_WARN), counted, and returns 0: go on with the next
   sample (do not append this one). SKIP drops it from the batch (count
   shrinks; needs packed batches, or every sample skipped); MARK puts
   cfg.bad_marker in its place (packed: in sequence; otherwise at host +
   i * bad_marker_bytes). The batch lists them in skipped_indices. */
PF_API int pf_job_skip(pf_job *job, uint32_t i, const char *fmt, ...) PF__PRINTF(3, 4);

/* ---- Readers: your data without a load callback (POSIX: pread) ----------

   Each reader fills the pf_config it is given (load, user, num_samples or
   num_samples_fn, and batch_bytes when it is 0) and owns what it opened
   until its close, which goes after pf_destroy. Set cfg.batch_size before
   the open: with cfg.batch_bytes 0 the open sizes the slots from it
   (batch_size samples; 0 is refused then). Set cfg.worker_init and
   cfg.worker_stop (and cfg.user for them) before the open: the reader keeps
   them and runs them as you would expect. So with cfg.allocator: every byte
   a reader allocates goes through the one set at the open (its index and
   bookkeeping then, a growing list's files as epochs are planned, each
   worker's read buffer on that worker's thread; a failure is
   PF_ERR_NO_MEMORY from the open, or PF_ERR_LOAD from pf_next, saying "out
   of memory"), and all of it is back by the close (the buffers by
   pf_destroy). Every batch is packed (offsets, and dev_offsets on CUDA);
   each sample is either the raw bytes, or what your step writes from them:
   decode, augment. A step returns 0, or the result of pf_job_fail /
   pf_job_skip(s->job, s->i, ...) to fail or drop the sample. The readers
   need POSIX: with -std=c11 define _POSIX_C_SOURCE 200809L before the
   implementation (or build with -std=gnu11, g++, nvcc); without it the
   opens return PF_ERR_INVALID_ARG saying so. */
typedef struct pf_part {       /* one named part of a sample (tar: one file) */
    const char *name;          /* tar: the extension after the key ("jpg", "cls") */
    const void *data;
    size_t bytes;
} pf_part;

typedef struct pf_sample {     /* one sample, for your step                  */
    uint64_t index;            /* its sample index                           */
    uint32_t i;                /* its place in job->indices                  */
    const char *key;           /* tar: the sample's key; else NULL           */
    const void *data;          /* its bytes (tar: the first part's); they and
                                  parts are valid only during the step (a
                                  per-worker buffer, reused): copy to keep   */
    size_t bytes;
    const pf_part *parts;      /* tar: every part, in archive order          */
    uint32_t num_parts;
    void *out;                 /* where to write the sample into the slot:
                                  packed right after the previous sample, so
                                  aligned only as far as every earlier
                                  out_bytes is a multiple of the alignment
                                  (the slot itself starts 256-aligned)       */
    size_t out_capacity;       /* the rest of the slot (cfg.batch_bytes less
                                  the samples before), not one sample's share */
    size_t out_bytes;          /* set it to what you wrote [sample_bytes]    */
    pf_job *job;               /* rng, worker_state (yours), skip and fail   */
} pf_sample;

typedef int (*pf_step_fn)(void *user, pf_sample *s);

/* Fixed-size records in one or many files. Sample k is the k-th record of
   the files in order (each file: header_bytes, then records; a partial
   record at the end is not a sample, and is logged, PF_LOG_WARN, once per
   file). A file list that grows: set path_fn instead of paths; it is
   asked once per epoch as planning starts (k = 0, 1, ... until NULL) and
   each epoch reads the files present then; a file
   dropped from the list is closed once no batch in flight needs it, and a
   file replaced under the same path (written aside and renamed over it:
   another inode) is opened anew for the epochs planned from then on, while
   batches of earlier epochs still read the file they were planned with. An
   epoch resumed from a checkpoint reads the files listed when it resumes
   (its size is the token's: keep the files it had). A listed file that
   cannot be opened, or is shorter than header_bytes, is left out with a
   PF_LOG_WARN naming it and the epoch. An epoch with no record at all
   (path_fn listed no file, none that opened, or none holding a whole
   record) is an error, not an empty epoch: pf_next returns PF_ERR_LOAD
   when it reaches that epoch, after every batch before it, saying "path_fn
   listed no readable file for epoch E" (or that the files hold no record). */
typedef struct pf_records_config {
    const char *const *paths;  /* the files, in order ...                    */
    uint32_t num_paths;
    const char *(*path_fn)(void *user, uint64_t epoch, uint32_t k); /* ... or
                                  a list asked each epoch (user: this user)  */
    size_t record_bytes;       /* required                                   */
    size_t header_bytes;       /* [0] skipped at the start of every file      */
    bool direct;               /* [false] O_DIRECT: past the page cache, read
                                  4096-aligned through a per-worker buffer
                                  (falls back to buffered reads, logged, where
                                  the file system refuses it)                 */
    pf_step_fn step;           /* [none: the raw records]                    */
    void *user;                /* for step and path_fn                       */
    size_t sample_bytes;       /* [record_bytes] what step writes per sample
                                  (without a step: record_bytes)            */
    uint32_t max_files;        /* [4096] the most files path_fn may list     */
} pf_records_config;
typedef struct pf_records pf_records;
PF_API pf_result pf_records_open(const pf_records_config *rc, pf_config *cfg, pf_records **out);
PF_API void pf_records_close(pf_records *r); /* after pf_destroy; NULL is fine */

/* llm.c's token shards: a header of 256 int32 (magic 20240520, version 1,
   token count), then uint16 tokens. One sample is one training step of
   this rank: B*T+1 tokens (inputs are the first B*T, targets the last B*T)
   read exactly as llm.c's DataLoader does: shards in the order given, in
   each floor((ntok - 1) / (world * B * T)) steps, step k of rank r at token
   (k * world + r) * B * T. The reader takes cfg->rank and cfg->world_size
   (pf_shard_from_env) and sets them to 0 and 1: every rank runs the same
   sample order over its own tokens. Unshuffled, like llm.c, unless you set
   cfg.shuffle. Every shard is checked at open. */
typedef struct pf_tokens_config {
    const char *const *paths;  /* the shards, in order (llm.c: sorted glob)  */
    uint32_t num_paths;
    uint32_t B, T;             /* required                                   */
    pf_step_fn step;           /* [none: the raw uint16 tokens]              */
    void *user;
    size_t sample_bytes;       /* [(B*T+1)*2] what step writes per sample
                                  (without a step: the raw tokens' size)    */
} pf_tokens_config;
typedef struct pf_tokens pf_tokens;
PF_API pf_result pf_tokens_open(const pf_tokens_config *tc, pf_config *cfg, pf_tokens **out);
PF_API void pf_tokens_close(pf_tokens *t);

/* Tar shards of files, grouped like WebDataset: consecutive files with the
   same key (the path up to the first dot of its last component) are one
   sample, its parts named by the rest, the extension ("KEY.jpg" +
   "KEY.cls"; "d/KEY.seg.png" is part "seg.png" of key "d/KEY"). ustar, pax
   (path, size) and GNU long names, each naming the next entry only (what
   tar --format=posix writes); indexed once at open (headers only). As in
   WebDataset (whose key/extension split yields nothing for them):
     - a file whose name starts with '.' is left out;
     - a file without a dot in its name ("README", "d.v1/LICENSE": the
       last component counts) has no extension to name its part: it is left
       out, and it does not end the sample around it; one PF_LOG_WARN per
       shard counts them and names the first;
     - a name ending in a dot ("KEY.") is a part named "" (an empty
       extension);
     - two parts of one name in a sample ("a.jpg" twice) refuse the open
       naming the shard and the key.
   A shard cut after a whole entry's data (no end-of-archive blocks, part
   of them, or part of the last entry's padding) is read up to there, with a
   PF_LOG_WARN through cfg.log; so are links (hard or symbolic: no data of
   their own), which are left out. Without a step a sample is
   its parts' bytes back to back. */
typedef struct pf_tar_config {
    const char *const *paths;  /* the shards, in order                       */
    uint32_t num_paths;
    pf_step_fn step;           /* [none: the parts, concatenated]            */
    void *user;
    size_t sample_bytes;       /* [0: step sets out_bytes] with a step; the
                                  slot is batch_size * this when set         */
} pf_tar_config;
typedef struct pf_tar pf_tar;
PF_API pf_result pf_tar_open(const pf_tar_config *tc, pf_config *cfg, pf_tar **out);
PF_API void pf_tar_close(pf_tar *t);
PF_API uint64_t pf_tar_samples(const pf_tar *t); /* samples indexed */

#ifdef __cplusplus
}
#endif
#endif /* PREFETCH_H_INCLUDED */

/* ======================================================================== */
/*                            IMPLEMENTATION                                */
/* ======================================================================== */
#if defined(PREFETCH_IMPLEMENTATION) && !defined(PREFETCH_IMPLEMENTATION_INCLUDED)
#define PREFETCH_IMPLEMENTATION_INCLUDED

/* The sections, in order (grep ">>name"):
     platform, threads, util   includes, the thread wrapper, clocks, formatting
     sampler                   the epoch's order: permutation, blocks, shards
     types                     slots, the batch descriptor, the loader's parts,
                               the backend interface
     errors                    logging; the pipeline's one error record
     config                    defaults and checks
     waiting                   the lock, conditions, wakes, bounded spins
     claim                     plans and the workers' claim cursor
     ring                      publish, take, free: a slot's way round
     autotune                  how many workers, and the ring that follows
     workers                   the worker threads
     consumer                  pf_next's frame, waits, delivery bookkeeping
     backend host              pf__host_ops
     backend cuda              pf__cuda_ops: stager, retirer, events, contexts
     launcher                  pf_shard_from_env
     resume                    checkpoint tokens: write, read, check
     public                    pf_create (build, start), the public calls
     worker state, samples     per-worker state; packed and skipped samples
     readers, records, tokens, tar   the built-in readers */

/* Said plainly, instead of a page of errors about timespec_get and
   thrd_create: the implementation needs C11 (or C++11). */
#if !defined(__cplusplus) && (!defined(__STDC_VERSION__) || __STDC_VERSION__ < 201112L)
#error "prefetch.h: the implementation (PREFETCH_IMPLEMENTATION) needs C11 or later: compile this file with -std=c11, gnu11 or c17 (or as C++11 or later)"
#endif

/* >>platform -------------------------------------------------------------- */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef PF_ASSERT
#include <assert.h>
#define PF_ASSERT(x) assert(x)
#endif

#if !defined(PREFETCH_USE_PTHREADS)
#if defined(__SANITIZE_THREAD__) || defined(__APPLE__)
#define PREFETCH_USE_PTHREADS
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PREFETCH_USE_PTHREADS
#endif
#endif
#endif

#if !defined(PREFETCH_USE_PTHREADS) && !defined(__cplusplus) && defined(__STDC_NO_THREADS__)
#error "prefetch.h: this C library has no <threads.h> (__STDC_NO_THREADS__): define PREFETCH_USE_PTHREADS and link -lpthread"
#endif

#ifdef PREFETCH_CUDA
#include <cuda_runtime_api.h>
#define PF__HAVE_CUDA 1
#else
#define PF__HAVE_CUDA 0
#endif

/* NVTX: ranges cost a call each, so they exist only when asked for. */
#ifdef PREFETCH_NVTX
#if defined(__GNUC__) || defined(__clang__) /* nvtx3 casts dlsym's pointer: -Wpedantic in its own code */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#endif
#include <nvtx3/nvToolsExt.h>
#ifdef PREFETCH_CUDA
#include <nvtx3/nvToolsExtCudaRt.h>
#endif
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
#define PF__RANGE_PUSH(...)                                  \
    do {                                                     \
        char pf__range_name[64];                             \
        snprintf(pf__range_name, sizeof pf__range_name, __VA_ARGS__); \
        nvtxRangePushA(pf__range_name);                      \
    } while (0)
#define PF__RANGE_POP() nvtxRangePop()
#else
#define PF__RANGE_PUSH(...) ((void)0)
#define PF__RANGE_POP() ((void)0)
#endif

#if defined(__cplusplus)
#define PF__THREAD_LOCAL thread_local
#elif defined(_MSC_VER) && !defined(__clang__)
#define PF__THREAD_LOCAL __declspec(thread)
#else
#define PF__THREAD_LOCAL _Thread_local
#endif

#if defined(__GNUC__) || defined(__clang__)
#define PF__MAYBE_UNUSED __attribute__((unused))
#else
#define PF__MAYBE_UNUSED
#endif

#define PF__MSG_SIZE 512
#define PF__MAX_SAMPLES (UINT64_C(1) << 62)
#define PF__MAX_BATCH_SIZE (UINT32_C(1) << 24)
#define PF__MAX_WORKERS 1024u
#define PF__MAX_SLOTS 4096u
#define PF__MAX_WINDOW 8192u /* unordered: batches in flight, host + device slots (2 * PF__MAX_SLOTS) */
#define PF__MAX_WORLD 65536u
#define PF__MAX_EPOCH (UINT64_C(1) << 62)
#define PF__ALIGN 256u
#define PF__LINE 64 /* a cache line */
#define PF__DEFAULT_WORKERS 4u
#define PF__DEFAULT_DEVICE_SLOTS 3u
#define PF__DEFAULT_WINDOW 8u
#define PF__DEFAULT_AUTOTUNE_WORKERS 16u /* I/O-bound loads scale past the cores */
#define PF__WAIT 100 /* internal: nothing to take yet */
#define PF__RUN_MAX 32u /* batches in a run, at most (>>workers) */

/* Atomics only for what is read without the lock: the cancel flag (load
   callbacks) and the pulses and spinner count of >>waiting. gcc/clang
   builtins work the same in C and C++. Without them there is no spinning
   (PF__SPIN_OK 0): every wait blocks at once, as in v0.2. */
#if defined(__GNUC__) || defined(__clang__)
#define PF__LOAD_FLAG(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define PF__STORE_FLAG(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define PF__ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_ACQ_REL)
/* pf_release's lock-free hand-back (>>backend host): sequentially
   consistent, for the handshake with a worker about to sleep */
#define PF__ADD_SC(p, v) __atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST)
#define PF__LOAD_SC(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define PF__STORE_SC(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define PF__CAS_SC(p, expect, v) __atomic_compare_exchange_n((p), (expect), (v), false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)
#define PF__SWAP(p, v) __atomic_exchange_n((p), (v), __ATOMIC_ACQ_REL)
#define PF__LOAD_RELAXED(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define PF__STORE_RELAXED(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define PF__SPIN_OK 1
#if defined(__x86_64__) || defined(__i386__)
#define PF__CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define PF__CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define PF__CPU_RELAX() ((void)0)
#endif
#else
#define PF__LOAD_FLAG(p) (*(volatile int *)(p))
#define PF__STORE_FLAG(p, v) (*(volatile int *)(p) = (v))
#define PF__ADD(p, v) (*(p) += (v))
#define PF__LOAD_RELAXED(p) (*(p))
#define PF__STORE_RELAXED(p, v) (*(p) = (v))
#define PF__SPIN_OK 0
#define PF__CPU_RELAX() ((void)0)
#endif

/* Spinning before a wait (see >>waiting): the longest spin, the shortest
   one adaptive backoff goes down to. A wake of a sleeping thread costs
   10-40 us on a VM (a futex call, then a halted vCPU coming back), so a
   spin up to about that long pays whenever the other side is that close. */
#ifndef PF_SPIN_MAX_NS
#define PF_SPIN_MAX_NS 20000u
#endif
#define PF__SPIN_MIN_NS 500u

#if (defined(__unix__) || defined(__APPLE__)) && !defined(_WIN32)
#include <unistd.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>     /* huge pages for host slots (pf__slot_block) */
#include <sys/resource.h> /* a load that slept (pf__sleeps) */
#include <fcntl.h>        /* and how long it waited for a CPU (pf__run_delay_ns) */
#endif

/* >>threads --------------------------------------------------------------- */
/* One thin wrapper, two mappings: C11 <threads.h> normally, pthreads under
   ThreadSanitizer (its glibc interceptors do not cover thrd_/mtx_/cnd_, so a
   thrd_create thread crashes inside TSan and its locks are invisible). */
#ifdef PREFETCH_USE_PTHREADS
#include <pthread.h>
typedef pthread_t pf__thread;
typedef pthread_mutex_t pf__mutex;
typedef pthread_cond_t pf__cond;
#define PF__THREAD_FN void *
#define PF__THREAD_RETURN return NULL
static int pf__thread_start(pf__thread *t, void *(*fn)(void *), void *arg) {
    return pthread_create(t, NULL, fn, arg) == 0 ? 0 : -1;
}
static void pf__thread_join(pf__thread t) { pthread_join(t, NULL); }
static int pf__mutex_init(pf__mutex *m) { return pthread_mutex_init(m, NULL) == 0 ? 0 : -1; }
static void pf__mutex_destroy(pf__mutex *m) { pthread_mutex_destroy(m); }
static bool pf__trylock(pf__mutex *m) { return pthread_mutex_trylock(m) == 0; }
static void pf__lock_wait(pf__mutex *m) { pthread_mutex_lock(m); }
static void pf__unlock(pf__mutex *m) { pthread_mutex_unlock(m); }
static int pf__cond_init(pf__cond *c) { return pthread_cond_init(c, NULL) == 0 ? 0 : -1; }
static void pf__cond_destroy(pf__cond *c) { pthread_cond_destroy(c); }
static void pf__cond_wait(pf__cond *c, pf__mutex *m) { pthread_cond_wait(c, m); }
static void pf__signal(pf__cond *c) { pthread_cond_signal(c); }
static void pf__broadcast(pf__cond *c) { pthread_cond_broadcast(c); }
/* 0 woken, 1 deadline passed. Deadline in TIME_UTC (CLOCK_REALTIME). */
static int pf__cond_timedwait(pf__cond *c, pf__mutex *m, const struct timespec *abs) {
    return pthread_cond_timedwait(c, m, abs) == 0 ? 0 : 1;
}
#else
#include <threads.h>
typedef thrd_t pf__thread;
typedef mtx_t pf__mutex;
typedef cnd_t pf__cond;
#define PF__THREAD_FN int
#define PF__THREAD_RETURN return 0
static int pf__thread_start(pf__thread *t, int (*fn)(void *), void *arg) {
    return thrd_create(t, fn, arg) == thrd_success ? 0 : -1;
}
static void pf__thread_join(pf__thread t) { thrd_join(t, NULL); }
static int pf__mutex_init(pf__mutex *m) { return mtx_init(m, mtx_plain) == thrd_success ? 0 : -1; }
static void pf__mutex_destroy(pf__mutex *m) { mtx_destroy(m); }
static bool pf__trylock(pf__mutex *m) { return mtx_trylock(m) == thrd_success; }
static void pf__lock_wait(pf__mutex *m) { mtx_lock(m); }
static void pf__unlock(pf__mutex *m) { mtx_unlock(m); }
static int pf__cond_init(pf__cond *c) { return cnd_init(c) == thrd_success ? 0 : -1; }
static void pf__cond_destroy(pf__cond *c) { cnd_destroy(c); }
static void pf__cond_wait(pf__cond *c, pf__mutex *m) { cnd_wait(c, m); }
static void pf__signal(pf__cond *c) { cnd_signal(c); }
static void pf__broadcast(pf__cond *c) { cnd_broadcast(c); }
static int pf__cond_timedwait(pf__cond *c, pf__mutex *m, const struct timespec *abs) {
    return cnd_timedwait(c, m, abs) == thrd_success ? 0 : 1;
}
#endif

/* The loader's lock is held for well under a microsecond (no user code
   runs under it), so a thread that finds it taken retries a few times,
   backing off (254 pauses in all: 5 us on this 2-core AMD VM), before it
   sleeps in the kernel: on a VM that sleep and the wake cost 10-40 us.
   Eight tries: four (30 pauses) let the handoff's two threads race into
   futex sleeps (1.7 us a batch there; 0.8-1.2 with eight, and 100x fewer
   futex calls); twelve with longer backoffs were slower than none on an
   oversubscribed machine (load 5 on 2 cores), where eight measured the
   same as four. Not on one CPU, where the holder cannot run while we spin
   (pf__lock_spins is set by pf_create). */
static uint32_t pf__lock_spins;
static void pf__lock(pf__mutex *m) {
    uint32_t k, j, n = PF__LOAD_FLAG(&pf__lock_spins);
    for (k = 0; k < n; k++) {
        if (pf__trylock(m)) return;
        for (j = 0; j < (2u << (k < 5 ? k : 5)); j++) PF__CPU_RELAX();
    }
    pf__lock_wait(m);
}

/* Tests define it to fail a chosen thread start. */
#ifndef PF__THREAD_START
#define PF__THREAD_START(t, fn, arg) pf__thread_start((t), (fn), (arg))
#endif

/* >>util ------------------------------------------------------------------ */
/* CPU clocks: the process's, all threads (0: unknown here), and this
   thread's (UINT64_MAX: unknown here). */
#if defined(CLOCK_PROCESS_CPUTIME_ID) || defined(CLOCK_THREAD_CPUTIME_ID)
static uint64_t pf__clock_read(clockid_t id, uint64_t unknown) {
    struct timespec ts;
    if (clock_gettime(id, &ts) != 0) return unknown;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#endif
static uint64_t pf__cpu_ns(void) {
#if defined(CLOCK_PROCESS_CPUTIME_ID)
    return pf__clock_read(CLOCK_PROCESS_CPUTIME_ID, 0);
#else
    return 0;
#endif
}
static uint64_t pf__thread_cpu_ns(void) {
#if defined(CLOCK_THREAD_CPUTIME_ID)
    return pf__clock_read(CLOCK_THREAD_CPUTIME_ID, UINT64_MAX);
#else
    return UINT64_MAX;
#endif
}

/* Monotonic when the POSIX clock is visible (it is not under strict -std=c11
   unless the including file asked for POSIX); C11 timespec_get otherwise. */
static uint64_t pf__now_ns(void) {
    struct timespec ts;
#if defined(CLOCK_MONOTONIC)
    clock_gettime(CLOCK_MONOTONIC, &ts);
#else
    timespec_get(&ts, TIME_UTC);
#endif
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static struct timespec pf__deadline_ns(uint64_t ns) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec += (long)(ns % 1000000000u);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec += 1;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}
static struct timespec pf__deadline(uint32_t ms) { return pf__deadline_ns((uint64_t)ms * 1000000u); }
static bool pf__before(const struct timespec *a, const struct timespec *b) {
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

static double pf__sec(uint64_t ns) { return (double)ns * 1e-9; }

static void pf__vformat(char *dst, size_t size, const char *fmt, va_list ap) {
    int n = vsnprintf(dst, size, fmt, ap);
    if (n < 0) dst[0] = '\0';
}

static void pf__format(char *dst, size_t size, const char *fmt, ...) PF__PRINTF(3, 4);
static void pf__format(char *dst, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pf__vformat(dst, size, fmt, ap);
    va_end(ap);
}

static PF__THREAD_LOCAL char pf__create_error[PF__MSG_SIZE];
/* A reader's num_samples_fn that cannot size an epoch (a growing file list
   that lists nothing readable) says why here and returns PF__PLAN_FAILED:
   the epoch then fails with PF_ERR_LOAD and that message once every batch
   planned before it was delivered (see pf__plan_next). Per thread: the
   planner calls the function on the worker that plans. */
static PF__THREAD_LOCAL char pf__plan_why[PF__MSG_SIZE];
#define PF__PLAN_FAILED UINT64_MAX

static void *pf__malloc_default(size_t size, void *user) {
    (void)user;
    return malloc(size);
}
static void pf__free_default(void *ptr, void *user) {
    (void)user;
    free(ptr);
}

/* 64-bit mixer (splitmix64's finaliser): the one hash behind the shuffle
   keys, the Feistel rounds and job->rng. */
static uint64_t pf__mix(uint64_t z) {
    z += UINT64_C(0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* >>sampler --------------------------------------------------------------- */
/* Shuffle = a keyed bijection on [0, n): a balanced Feistel network over the
   smallest even-bit power of two >= n, with cycle walking (apply again until
   the value lands below n). O(1) memory for any n, the same permutation on
   every rank and run for the same (seed, epoch), no randperm array. The
   domain is < 4n, so a walk takes under 4 steps on average. */
#define PF__FEISTEL_ROUNDS 6

typedef struct pf__perm {
    uint64_t n, mask;
    unsigned half;
    uint64_t key[PF__FEISTEL_ROUNDS];
} pf__perm;

static void pf__perm_init(pf__perm *p, uint64_t n, uint64_t seed, uint64_t epoch) {
    unsigned bits = 2;
    while (bits < 64 && (UINT64_C(1) << bits) < n) bits += 2;
    p->n = n;
    p->half = bits / 2;
    p->mask = (UINT64_C(1) << p->half) - 1;
    for (int i = 0; i < PF__FEISTEL_ROUNDS; i++)
        p->key[i] = pf__mix(pf__mix(seed ^ UINT64_C(0x5f3759df)) + pf__mix(epoch) * 31u + (uint64_t)i);
}

static uint64_t pf__feistel(const pf__perm *p, uint64_t x) {
    uint64_t l = x >> p->half, r = x & p->mask;
    for (int i = 0; i < PF__FEISTEL_ROUNDS; i++) {
        uint64_t t = l ^ (pf__mix(r ^ p->key[i]) & p->mask);
        l = r;
        r = t;
    }
    return (l << p->half) | r;
}

/* i in [0, n) -> a unique value in [0, n) */
static uint64_t pf__perm_apply(const pf__perm *p, uint64_t i) {
    do i = pf__feistel(p, i);
    while (i >= p->n);
    return i;
}

/* pf__perm_apply on each of v[0..cnt), in place, the same values. One
   value is a chain of dependent multiplies, 2.6 Feistel passes on average
   where n is 1.6M (a 4M domain); PF__PERM_LANES values walk side by side,
   each lane taking the next value as soon as its own lands below n, so
   the chains overlap and no lane idles while there is work. 1-sample
   batches' runs of 32 and larger batches: 74 -> 45 ns a value on the
   2-core VM (2026-11-25). */
#define PF__PERM_LANES 4
static void pf__perm_apply_many(const pf__perm *p, uint64_t *v, uint32_t cnt) {
    uint64_t x[PF__PERM_LANES];
    uint32_t at[PF__PERM_LANES], next = 0, live = 0, j;
    int i;
    if (cnt < PF__PERM_LANES) { /* too few to overlap */
        for (j = 0; j < cnt; j++) v[j] = pf__perm_apply(p, v[j]);
        return;
    }
    for (j = 0; j < PF__PERM_LANES; j++, live++) x[j] = v[at[j] = next++];
    while (live) {
        uint64_t l[PF__PERM_LANES], r[PF__PERM_LANES];
        for (j = 0; j < PF__PERM_LANES; j++) {
            l[j] = x[j] >> p->half;
            r[j] = x[j] & p->mask;
        }
        for (i = 0; i < PF__FEISTEL_ROUNDS; i++) /* lanes innermost: their chains interleave */
            for (j = 0; j < PF__PERM_LANES; j++) {
                uint64_t t = l[j] ^ (pf__mix(r[j] ^ p->key[i]) & p->mask);
                l[j] = r[j];
                r[j] = t;
            }
        for (j = 0; j < PF__PERM_LANES; j++) {
            uint64_t y = (l[j] << p->half) | r[j];
            if (at[j] == cnt) continue; /* idle: the values ran out */
            if (y >= p->n) { /* walks on */
                x[j] = y;
                continue;
            }
            v[at[j]] = y;
            if (next < cnt) x[j] = v[at[j] = next++];
            else at[j] = cnt, live--;
        }
    }
}

/* An epoch's plan: fixed when its planning starts (num_samples_fn is asked
   then, once). Sharding follows DistributedSampler: rank r takes positions
   r, r+w, r+2w, ... of the epoch's order; without drop_last the order is
   padded by wrapping to ceil(n/w)*w positions, with drop_last cut to
   floor(n/w)*w, so every rank has the same number of batches. */
/* A resumed epoch starts at global position `start` of its order, with
   this rank's sample `first` (= its first batch x batch_size): the ranks
   take start + r, start + w + r, ... of what is left, so on the same world
   size it is exactly the uninterrupted epoch, and on another it spreads the
   rest of the epoch over the new ranks. */
typedef struct pf__plan {
    uint64_t epoch, n;
    uint64_t per_rank;  /* samples of this rank (from the epoch's start)      */
    uint64_t nbatches;  /* batches of this rank                               */
    uint64_t start, first; /* resumed: global position, and this rank's sample */
    uint64_t blocks;    /* block shuffle: full blocks (the tail block stays last) */
    pf__perm perm;      /* samples, or blocks with block shuffle              */
    pf__perm tail;      /* block shuffle: the short last block                */
    uint64_t rng_key;   /* job->rng's part fixed for the epoch (pf__job_rng)  */
} pf__plan;

static void pf__plan_init(pf__plan *p, const pf_config *c, uint64_t epoch, uint64_t n, uint64_t start,
                          uint64_t first_batch) {
    uint64_t w = c->world_size, rest = n > start ? n - start : 0, b = c->shuffle_block;
    p->epoch = epoch;
    p->n = n;
    p->start = start;
    /* three of job->rng's four mixes, once an epoch: a chain of them per
       batch was 5% of a 4 KiB batch loaded by pf_next alone */
    p->rng_key = pf__mix(pf__mix(pf__mix(c->seed) ^ epoch) ^ c->rank);
    p->first = first_batch * c->batch_size;
    p->per_rank = p->first + (c->drop_last ? rest / w : (rest + w - 1) / w);
    p->nbatches = c->drop_last ? p->per_rank / c->batch_size
                               : (p->per_rank + c->batch_size - 1) / c->batch_size;
    if (b > 1) {
        p->blocks = n / b;
        pf__perm_init(&p->perm, p->blocks, c->seed, epoch);
        pf__perm_init(&p->tail, n % b, c->seed ^ UINT64_C(0x7a11), epoch);
    } else {
        pf__perm_init(&p->perm, n, c->seed, epoch);
    }
}

/* Block shuffle: position -> index. Blocks of B consecutive indices are
   permuted, and the samples of each window of K consecutive (permuted)
   blocks are mixed by a bijection of their own; the short last block
   (n % B) stays last, mixed within itself. O(1) memory, as the sample
   shuffle. */
static uint64_t pf__block_order(const pf__plan *p, const pf_config *c, uint64_t pos) {
    uint64_t b = c->shuffle_block, k = c->shuffle_window, full = p->blocks * b;
    uint64_t win, first_block, nblocks, o;
    pf__perm mix;
    if (pos >= full) return full + pf__perm_apply(&p->tail, pos - full);
    win = pos / (k * b);
    first_block = win * k;
    nblocks = p->blocks - first_block < k ? p->blocks - first_block : k;
    pf__perm_init(&mix, nblocks * b, c->seed ^ pf__mix(win + UINT64_C(0x51ed)), p->epoch);
    o = pf__perm_apply(&mix, pos - first_block * b);
    return pf__perm_apply(&p->perm, first_block + o / b) * b + o % b;
}

/* Position in the epoch's order of this rank's j-th sample. */
static uint64_t pf__plan_pos(const pf__plan *p, const pf_config *c, uint64_t j) {
    uint64_t pos = p->start + (j - p->first) * c->world_size + c->rank;
    if (pos >= p->n) pos %= p->n; /* wrap = padding (a division only there: it costs as much as a 4 KiB copy's
                                     first line) */
    return pos;
}

/* The order is a sample shuffle (pf__perm_apply on the position), not
   none or blocks */
static bool pf__sample_shuffle(const pf_config *c) { return c->shuffle && c->shuffle_block <= 1; }

/* Sample index of this rank's j-th sample in the plan's epoch. */
static uint64_t pf__plan_index(const pf__plan *p, const pf_config *c, uint64_t j) {
    uint64_t pos = pf__plan_pos(p, c, j);
    if (!c->shuffle) return pos;
    return c->shuffle_block > 1 ? pf__block_order(p, c, pos) : pf__perm_apply(&p->perm, pos);
}

/* The sample shuffle's indices of the rank's samples first..first+cnt-1
   (pf__perm_apply_many), the same as pf__plan_index's: false where the
   order is not a sample shuffle (none, or blocks). */
static bool pf__plan_indices(const pf__plan *p, const pf_config *c, uint64_t first, uint32_t cnt, uint64_t *out) {
    uint32_t i;
    if (!pf__sample_shuffle(c)) return false;
    for (i = 0; i < cnt; i++) out[i] = pf__plan_pos(p, c, first + i);
    pf__perm_apply_many(&p->perm, out, cnt);
    return true;
}

static uint64_t pf__job_rng(const pf__plan *p, uint64_t batch) { return pf__mix(p->rng_key ^ batch); }

/* >>types ----------------------------------------------------------------- */
enum {
    PF__SLOT_FREE = 0,
    PF__SLOT_LOADING, /* a worker is inside load                      */
    PF__SLOT_READY,   /* filled (or failed), waiting to be taken      */
    PF__SLOT_HELD,    /* host backend: the consumer has it            */
    PF__SLOT_STAGING, /* CUDA: taken by the stager, waiting for a device slot */
    PF__SLOT_COPYING, /* CUDA: its DMA may still read it              */
    PF__SLOT_WRITTEN_OFF /* CUDA device slot: out of circulation after a
                            failed CUDA call (the pipeline has stopped) */
};
#define PF__FROM(st) (1u << (st))

/* Slot states move only here (host and device slots alike): each move
   names the states it may come from, and PF_ASSERT holds it to that. */
static void pf__move(int *state, unsigned from, int to) {
    PF_ASSERT((from >> *state) & 1u);
    *state = to;
}

/* A batch's packed samples and bad ones (see >>samples): 2 * batch_size + 1
   words, the offsets then the skipped samples' indices. */
typedef struct pf__samples {
    uint64_t *mem;
    bool packed;      /* mem[0 .. count] are the offsets */
    uint32_t skipped; /* mem[batch_size + 1 ..] lists them */
} pf__samples;

/* What a batch is, from the worker that fills it to pf_next: one
   descriptor in the host slot and, on CUDA, in the device slot it is
   copied to; the stager moves it in one assignment. indices and sm.mem are
   buffers their slot owns: the stager exchanges them with the device
   slot's, so a batch's lists travel with it and are never copied. */
typedef struct pf__desc {
    uint64_t epoch, batch, rng;
    uint64_t nbatches, n; /* its epoch's batches and samples */
    uint64_t *indices;
    size_t bytes;
    uint32_t count;
    pf__samples sm;
} pf__desc;

typedef struct pf__slot {
    pf__desc b;
    const pf__plan *plan; /* its epoch's plan, alive until the slot is taken */
    unsigned char *data;
    uint64_t seq, ticket, started_ns;
    uint64_t call_ns;     /* cfg.load itself, for autotune's inline choice */
    signed char slept;    /* that load slept: 1, did not: 0, not asked: -1 (pf__cpu_cap) */
    uint64_t on_cpu_ns, off_cpu_ns; /* an asked load's CPU time, and the time it slept */
    bool indexed;         /* b's indices are in (pf__index_run): its claim's batch */
    uint32_t worker, index;
    uint32_t next_released; /* the released stack below it (pf__release_host) */
    uint32_t early;         /* loaded in a run, not yet published (pf__adopt_early) */
    uint64_t run_start, run_end; /* that load's times, for whoever publishes it */
    int state;
    int result; /* PF_OK, or the error a READY slot carries */
    char *msg;  /* PF__MSG_SIZE bytes: the failure message  */
} pf__slot;

typedef struct pf__worker {
    pf_loader *owner;
    uint32_t id;
    char name[40];          /* in messages: "worker 3", or "pf_next" (the extra record) */
    pf__thread thread;
    bool failed;            /* pf_job_fail was called for the current job */
    char msg[PF__MSG_SIZE]; /* pf_job_fail writes here */
    void *state;            /* cfg.worker_init's answer (>>worker state)  */
    bool live;              /* worker_init ran, worker_stop is owed       */
    pf__slot *slot;         /* the current job's slot (>>samples)         */
    uint64_t est_ns;        /* its loads' smoothed duration (pf__run_len) */
    uint64_t slot_wait_t0;  /* its wait for a free slot began (0: none), counted up to here (pf__wait_flush) */
    uint32_t nloads;        /* loads it made: some are asked if they slept (pf__cap_ask) */
    int sched_fd1;          /* its thread's /proc/thread-self/schedstat + 1, kept open (pf__run_delay_ns) */
    uint32_t appends, nskip;
    size_t used;
    bool pack;              /* a reader runs the job: the batch is packed */
    bool refused;           /* pf_job_append or pf_job_skip failed the job */
    /* its run (>>runs): the slots it claimed together, and which of them
       are still its own: next (high half) begun, end (low half) not taken
       by another thread. Written under the lock (the run) or by CAS. */
    pf__slot *run[PF__RUN_MAX];
    uint64_t run_word;
} pf__worker;

/* A checkpoint token, read (see >>resume). */
typedef struct pf__resume {
    bool active;             /* the first epoch planned starts here      */
    bool has_n;              /* the token knew its epoch's size, n       */
    uint64_t epoch, batch, pos, n;
    uint32_t nskip;
    uint64_t *skip;          /* unordered: batches already delivered (NULL:
                                only counted)                           */
    uint64_t skip_max;       /* the largest of them (nskip > 0)          */
    uint64_t skipped;        /* bad samples in the batches delivered before
                                (skipped=, 0 when absent)               */
    bool others;             /* another rank's (or world size's) token:
                                its skipped= is not this rank's count  */
} pf__resume;

/* The roles a thread waits in (see >>waiting). */
enum { PF__ROLE_WORKER, PF__ROLE_CONSUMER, PF__ROLE_STAGER, PF__ROLE_RETIRER, PF__ROLE_PARKED, PF__ROLES };

/* The pipeline's one error record (see >>errors): its first failure, who
   hit it, for which batch, and whether the consumer has been told. */
enum { PF__BY_PLANNING = 1, PF__BY_LOAD, PF__BY_STAGER, PF__BY_RETIRER, PF__BY_CONSUMER };
typedef struct pf__error {
    int code;              /* 0, or the failure's pf_result                      */
    int by;                /* PF__BY_*                                           */
    bool at_once;          /* due at the next pf_next, before anything staged
                              (CUDA failures); otherwise in batch order          */
    bool shown;            /* pf_next returned it: every later call returns it   */
    bool log_owed;         /* no thread logged it: pf_next does when it shows it
                              (a taker's own verdict, cfg.bad_limit)             */
    uint64_t seq;          /* planning: due once this many batches were taken    */
    uint64_t epoch, batch; /* the batch it concerns                              */
    char msg[PF__MSG_SIZE];
} pf__error;

/* The CUDA backend's state and its types live in >>backend cuda. */
typedef struct pf__cuda pf__cuda;

/* The loader's state, in parts named for what they hold. Who may touch
   each part, and under which lock, is listed in THREADING MODEL (top of
   the file); in short: everything is under sync.mu except cfg, backend,
   stride (fixed at pf_create), sync.pulse and sync.stopping (read by
   spinners and pf_job_cancelled without it), cons.err (the consumer's own)
   and the CUDA handles (fixed at pf_create). */

/* (>>waiting) one lock; per role a condition and a count of the threads
   waiting on it; the pulses spinners watch */
typedef struct pf__sync {
    pf__mutex mu;
    pf__cond cv[PF__ROLES];
    uint32_t waiting[PF__ROLES];
    uint32_t woken[PF__ROLES]; /* of those, sent a wake and not yet back from
                                  their wait: runnable, for pf__cpu_free     */
    unsigned wake;   /* wakes owed once the lock drops                     */
    bool mu_ok;
    uint32_t cv_ok;  /* how many of cv[] were initialised                  */
    bool started;    /* every thread exists: workers may run user code     */
    /* read without the lock, each on a cache line of its own, away from
       the lock's and from what it guards: stopping by every worker's run
       for every batch (on the lock's line it cost cheap 4 KiB loads ~20%
       of a worker's time), the pulses by spinning threads */
    char pf__pad0[PF__LINE];
    int stopping;    /* pf_destroy began; read by pf_job_cancelled without the lock */
    uint64_t fail_seq; /* in order: the first load that failed (claim seq; UINT64_MAX: none),
                          set as it fails: runs load nothing after it (pf__after_failure) */
    char pf__pad3[PF__LINE];
    uint32_t pulse[PF__ROLES];   /* bumped, under the lock, by every pf__wake of the role */
    char pf__pad2[PF__LINE];
    unsigned pulse_owed;         /* pulses to give as the lock drops */
    char pf__pad1[PF__LINE];
    uint32_t spin_ns[PF__ROLES]; /* each role's spin budget, adapted */
    uint32_t spin_probe[PF__ROLES]; /* backed off: spins since the last full one */
    uint32_t spin_every[PF__ROLES]; /* ...and every this many is one (pf__spin_budget) */
    uint32_t spinning[PF__ROLES];   /* threads spinning in each role */
    uint32_t ncpu;               /* online CPUs: no more spinners than this */
    bool cap_may;                /* the CPU cap can matter (pf__cap_may) */
    bool cap_ask;                /* loads are asked if they slept (pf__cap_ask) */
} pf__sync;

/* (>>ring) the host slots and the queues between workers and the taker */
typedef struct pf__ring {
    /* fixed at pf_create, read by every thread for every batch: on lines
       of their own, away from the counters below that both sides write
       under the lock (each such write took these pointers' line from the
       other core: pf__claim's read of `order` was a third of its time) */
    char line_fixed[PF__LINE];
    uint32_t nslots;
    uint32_t order_mask;         /* the power of two at or over nslots, less 1 */
    pf__slot *slots;
    uint32_t *free_stack;
    uint32_t *order;             /* in order: order[seq & order_mask] = slot + 1,
                                    from its claim until it is taken (a mask,
                                    not % nslots: two divisions a batch were
                                    a few % of a 4 KiB batch pf_next loaded) */
    uint32_t *ready_fifo;        /* unordered: ready slots, as finished */
    char *msgs;
    uint64_t *index_mem;         /* each slot's indices, host then device slots */
    uint64_t *sample_mem;        /* each slot's pf__samples words, likewise */
    char line_hot[PF__LINE];
    void *host_raw;              /* host backend block, unaligned (for free) */
    /* slots 0 .. nalloc-1 have memory; with autotune the ring grows with
       the active workers (>>autotune), up to nslots, a block per growth */
    uint32_t nalloc, grow_to, ngrown;
    uint32_t shrink_to;          /* a trial failed: give back the blocks above this (0: none) */
    uint32_t keep_to;            /* the ring of the worker count last kept: grown as
                                    a block of its own, apart from a trial's     */
    uint32_t retire_from;        /* the block going back: its slots, once free, stay
                                    out of the free stack (0: none)               */
    bool growing, grow_failed;   /* growing: a worker is (de)allocating a block */
    void **grown;                /* the blocks grown, as the backend allocated them */
    uint32_t *grown_from;        /* the first slot of each */
    uint32_t nfree;              /* free_stack's: LIFO, the warmest slot is refilled first */
    uint32_t runs_open;          /* runs claimed and not yet published: pf__steal
                                    looks at the runs only while there are some */
    uint32_t orphans[2 * PF__RUN_MAX], norphans; /* claimed by a run, handed back
                                    unloaded (pf__load_inline) or taken from it
                                    (pf__steal): claimed first, lowest batch on top
                                    (pf__claim). Taken only when there are none, at
                                    most a run's half; handed back, a run's rest */
    uint32_t ready_head, ready_count; /* ready_fifo's (unordered) */
    uint32_t nready;             /* slots READY */
    uint32_t nloading;           /* slots LOADING: loads that will still publish */
    uint32_t wake_batch;         /* free slots that wake waiting workers; ready
                                    batches that wake a sleeping host consumer */
    uint64_t taker_slept;        /* when the host consumer last began to sleep */
    uint64_t load_est;           /* a load's time (call_ns), smoothed: pf__may_help */
    uint32_t cap_samples;        /* loads asked if they slept (pf__cpu_cap)... */
    uint32_t slept_share;        /* ...and the share that did, smoothed, of 1024 */
    uint64_t on_cpu_ns, off_cpu_ns; /* ...their CPU time and the time they slept, smoothed */
    uint64_t sleep_est;          /* ...a sleep's time as counted, smoothed (pf__off_cpu_counted) */
    uint32_t awake_run, gap16;   /* ...asked loads since one slept, and 16x that at a sleep, smoothed over 16 */
    bool capped;                 /* only ncpu workers load: the loads never sleep */
    bool cap_plus;               /* ...and one more, pf_next not loading (pf__cap_n) */
    bool cap_busy;               /* ...or one less: the caller keeps a CPU busy */
    bool cap_loads;              /* ...or a worker a CPU but one: pf_next loads a
                                    loader's share (pf__cap_caller)... */
    uint32_t loads_age, loads_hold, loads_back; /* ...windows since, windows it
                                    may not come back, and the next such hold */
    const void *caller;          /* the caller's thread (pf__thread_tag), as last
                                    measured (pf__cap_caller)... */
    uint64_t caller_t0, caller_cpu0; /* ...when, and its CPU time then */
    uint64_t caller_b0, caller_nl0, caller_pcpu0; /* ...the batches, pf_next's loads
                                    and the process's CPU time then */
    double caller_share;         /* its CPU time over the clock, smoothed */
    double proc_busy;            /* the process's CPU time over the clock, smoothed */
    uint32_t cap_flip;           /* asked loads in a row that would turn cap_plus */
    uint32_t timed_sleepers;     /* host consumers in a sleep of at most PF__TAKER_HOLD_NS */
    bool taker_held;             /* a ready batch did not wake it (pf__wake_taker_ready) */
    bool hold_expired;           /* such a sleep ended with nothing ready: the next
                                    is untimed, until a batch is delivered */
    /* Each group of atomics below on its own cache line: the consumer
       writes the first for every batch it releases, a worker the second
       for every batch of its runs (unordered), and on a line of their own
       neither moves the other's, nor the fields above that the lock
       guards. Sharing one line cost cheap 4 KiB loads ~12% (the line went
       back and forth twice a batch). */
    char line0[PF__LINE];
    /* host backend: slots pf_release handed back without the lock, a stack
       (slot + 1, linked by next_released) taken under it; and the workers
       about to sleep or asleep for want of a free slot (>>backend host) */
    uint32_t released, slot_sleepers;
    char line1[PF__LINE];
    /* unordered: batches loaded in a worker's run and not yet published
       (in order each slot's own flag says it, pf__adopt_early); and the
       takers about to sleep or asleep; atomic */
    uint32_t early, taker_sleepers;
    char line2[PF__LINE];
} pf__ring;

/* (>>claim) the workers' cursor, and the plans of the epochs between the
   taker and it */
typedef struct pf__claimer {
    pf__plan *plans;
    uint32_t plan_cap, plan_head, plan_count;
    uint64_t epoch, batch, nbatches, next_seq;
    uint64_t plans_made;  /* epochs planned (or failed to plan) so far */
    bool planned, planning, done;
} pf__claimer;

/* the taker's cursor (the consumer on the host backend, the stager on CUDA) */
typedef struct pf__taker {
    uint64_t epoch, done, taken;
    uint64_t ended_n;            /* the n of the epoch the taker ended last */
} pf__taker;

/* (>>consumer) what pf_next has handed out */
typedef struct pf__consumer {
    uint32_t held;
    uint32_t held_most;    /* the most held at once since autotune last looked (pf__ring_follow) */
    uint32_t slot_waits;   /* pf_next calls, the only loader, waiting for a slot (pf__take_host) */
    uint64_t ticket;       /* the last batch's; counts up from ticket0     */
    uint64_t ticket0;      /* this loader's own start (pf__ticket_start)   */
    uint64_t epoch, nbatches;
    uint64_t batch;        /* batches of epoch delivered so far (unordered:
                              not the last one's index + 1)                  */
    char err[PF__MSG_SIZE]; /* pf_error's text: the consumer's latest failed call */
} pf__consumer;

/* (>>resume) the consumer's checkpoint position in its epoch, and where
   cfg.resume said to start */
typedef struct pf__checkpoint {
    uint64_t low;            /* the first batch of cons.epoch not yet delivered */
    uint64_t n;              /* the epoch's samples, once known (n_known)    */
    uint64_t start, first;   /* the epoch's resume offsets (pf__plan)        */
    bool n_known;
    bool lead_capped;        /* unordered: a claim waits for low to move     */
    unsigned char *done;     /* unordered: delivered past low, by batch % win */
    uint32_t win;            /* unordered: every batch claimed in an epoch the
                                consumer has not finished lies below its first
                                undelivered batch + win (see pf__claim)     */
    uint64_t skipped;        /* bad samples in every batch pf_next returned
                                (since the start, the token's included): the
                                token's skipped=, where bad_limit resumes  */
    pf__resume rs;           /* where cfg.resume says to start (the first epoch planned) */
    uint64_t lost_epoch, lost_batch; /* CUDA: a batch pf_next took but could not
                                hand out (epoch + 1; 0: none): no token after it */
} pf__checkpoint;

/* (>>workers) the threads */
typedef struct pf__pool {
    pf__worker *w;
    uint32_t started;
} pf__pool;

/* (>>autotune) a verdict held while the load per batch stays what it was
   decided at (pf__hold, pf__load_moved) */
typedef struct pf__held {
    double load;     /* the load per batch it was decided at          */
    uint32_t streak; /* periods in a row whose load drifted from it   */
} pf__held;

/* (>>autotune) workers 0 .. active-1 load, the rest park */
typedef struct pf__tuner {
    uint32_t active;
    uint64_t t0, batches0, wait0, load0, wwait0, call0, cpu0, next0, input0; /* the period's start */
    uint64_t batches_prev; /* the start of the period just measured       */
    double thr_before;     /* throughput before the last increase         */
    double load_before;    /* and the load time per batch then            */
    double thr_last;       /* the period before this one's throughput...    */
    uint32_t last_n;       /* ...its workers...                             */
    double load_last;      /* ...and its load time per batch               */
    uint32_t before;       /* active before it                             */
    uint32_t cap;          /* more did not help: stay at or below...       */
    pf__held cap_held;     /* ...while the load per batch stays near this  */
    uint32_t cap_wait;     /* ...or, loads that sleep, for this many periods */
    uint32_t cap_backoff;  /* ...doubling with each failed trial in a row   */
    uint32_t grow_wait;    /* periods until a failed growth may be tried again... */
    uint32_t grow_backoff; /* ...doubling with each failure in a row         */
    bool cap_cpu;          /* ...set while the loads never slept (ring.capped) */
    uint32_t behind;       /* trials and the ring get at least these slots (0:
                              their count's): the consumer waited behind a
                              late batch with the ring full (pf__autotune)... */
    uint32_t behind_was;   /* ...as it was before the trial on               */
    pf__held behind_held;  /* ...while the load per batch stays near this    */
    uint64_t behind0;      /* the period's start: st.wait_behind_ns          */
    uint64_t behind_most;  /* the longest pf_next's wait behind a late batch in
                              the period (pf__take_host, pf__take_cuda)     */
    bool small_steps;      /* the last trial failed or gained under half its
                              rise: trials step by a quarter, not doubling... */
    pf__held steps_held;   /* ...while the load per batch stays near this  */
    uint32_t swap;         /* PF__SWAP_*: a worker per CPU for pf_next's share */
    pf__held swap_held;    /* ...while the load per batch stays near this  */
    bool caller_loads;     /* pf_next loaded a loader's share (pf__trial_slots) */
    bool probing;          /* the last change was an increase, on trial    */
    uint32_t probe_stage;  /* ...periods of it that did not pass (0-2)     */
    double gain_need;      /* ...the throughput it must gain, as a ratio   */
    double trial_rise;     /* ...its rise in loaders, as a ratio less one  */
    uint64_t probe_n;      /* ...and its batches...                        */
    double probe_s;        /* ...in this many seconds                      */
    bool shrunk;           /* the last change was a decrease               */
    uint32_t idle_streak;  /* periods in a row that asked for fewer        */
    uint32_t floor;        /* fewer starved it: stay at or above...        */
    double floor_step;     /* ...while the consumer's time per batch stays near this */
    uint64_t changes, last_change_batch;
    uint32_t steady;       /* periods since the count or the ring last changed (pf__ring_follow) */
    uint64_t steady_t0;    /* ...the first of them began */
    uint32_t peak_n;       /* the most workers a period ended with, lately... */
    uint64_t peak_t;       /* ...the last time it did (PF__RING_PEAK_NS) */
    uint32_t held_peak;    /* the most the caller held at once, lately... */
    uint64_t held_t;       /* ...the last time it did */
    double inline_load;    /* the load per batch when pf_next took the loads
                              over (or when that did not pay: inline_failed) */
    bool inline_failed;
    bool help;             /* pf_next loads when the next batch is not ready */
    bool help_trial;       /* help is on trial                                */
    uint32_t help_quiet;   /* periods in a row that could not judge the trial */
    bool park_trial;       /* with help: no workers at all, on trial           */
    bool park_quiet;       /* ...after a help trial the workers kept up with */
    bool park_failed;      /* that was not faster (until help ends)           */
    bool park_last;        /* ...on trial because help beside the workers
                              did not pay: a failure ends help              */
    uint32_t inline_wait, inline_backoff; /* periods before the next trial; its doubling */
    bool inline_busy;      /* a pf_next is loading through the extra record:
                              pf_next from other threads waits meanwhile */
    uint32_t inline_n;     /* pf__load_inline calls (a load or a run): 1 in PF__INLINE_TIMED timed */
    uint64_t inline_est;   /* the timed ones' duration, smoothed (ns)          */
    uint32_t dear_loads;   /* timed ones in a row over PF__HELP_DEAR_NS (pf__help_dear) */
    char msg[PF__MSG_SIZE]; /* the latest change, logged outside the lock   */
} pf__tuner;

/* pf_get_stats' counters */
typedef struct pf__counters {
    uint64_t batches, samples, bytes, copies, copy_bytes;
    uint64_t first_ns, last_ns, wait_input_ns, wait_copy_ns, wait_gpu_ns;
    uint64_t load_ns, worker_wait_ns, ready_sum;
    uint64_t wait_behind_ns; /* of wait_input_ns: in order, behind a late batch
                              with the ring full of later ones (autotune)  */
    uint64_t call_ns;      /* inside cfg.load alone (load_ns adds the claim) */
    uint64_t skipped;      /* bad samples in batches taken (>>samples) */
    uint64_t next_loads;   /* batches pf_next loaded itself (pf__load_inline) */
    uint64_t runs;         /* runs of two batches or more a worker or pf_next claimed (pf__run_len) */
    uint64_t stolen;       /* batches of a run another thread took to load (pf__steal) */
    bool last_fresh;       /* a wait's end just set last_ns */
    uint64_t untimed_ns;   /* untimed loads in pf_next: input wait not yet credited */
    uint32_t waiters;      /* pf_next calls waiting: their waits are counted once */
    uint64_t wait_since;
} pf__counters;

/* Bookkeeping is one allocation: the loader, then its arrays. One place to
   fail, one to free. */
typedef struct pf__layout {
    size_t size;
    bool overflow;
} pf__layout;

static size_t pf__reserve(pf__layout *lay, size_t count, size_t elem) {
    size_t off = (lay->size + 63) & ~(size_t)63, bytes;
    if (off < lay->size || (elem && count > SIZE_MAX / elem)) lay->overflow = true;
    bytes = count * elem;
    if (off + bytes < off) lay->overflow = true;
    lay->size = off + bytes;
    return off;
}

/* The backend interface: each backend fills one table (pf__host_ops at
   the end of >>backend host, pf__cuda_ops at the end of >>backend cuda),
   pf_create picks one (pf__choose_gpu), and shared code calls through
   l->ops, never asking which backend it is on. An entry not marked
   required may be NULL: nothing to do on that backend. */
#define PF__USE_HOST 1000 /* pf__choose_gpu: run on the host backend */
#define PF__BACKEND_OFFSETS 12 /* the most arrays a backend reserves in the block */
typedef struct pf__backend_ops {
    pf_backend backend;
    int taker;        /* the role that takes loaded batches (PF__ROLE_*)  */
    uint32_t helpers; /* threads of its own beside the workers          */
    /* batches it holds beyond the host slots (CUDA: the device slots);
       each gets indices and sample lists after the host slots' */
    uint32_t (*extra_slots)(const pf_config *c);
    /* pf_create: reserve the backend's state and arrays in the loader's
       one block (off: up to PF__BACKEND_OFFSETS offsets), then point
       l->cu (or its own) into it */
    void (*reserve)(pf__layout *lay, const pf_config *c, uint32_t nslots, uint32_t plan_cap, size_t *off);
    void (*place)(pf_loader *l, unsigned char *base, const size_t *off);
    pf_result (*alloc_slots)(pf_loader *l, char *why, size_t n); /* required */
    bool (*grow_slots)(pf_loader *l, uint32_t from, uint32_t to); /* required: autotune */
    void (*shrink_slots)(pf_loader *l, void *block);               /* required: autotune */
    pf_result (*start_helpers)(pf_loader *l, char *why, size_t n);
    void (*bind_thread)(pf_loader *l); /* each worker, as it starts */
    /* the public calls: required */
    pf_result (*next)(pf_loader *l, pf_batch *out);
    pf_result (*release)(pf_loader *l, pf_batch *b);
    pf_result (*batch_wait)(pf_loader *l, const pf_batch *b);
    void (*stats)(pf_loader *l, pf_stats *out); /* its own fields, lock held */
    /* the consumer's epoch size once its plan is gone (>>resume) */
    bool (*staged_epoch_n)(const pf_loader *l, uint64_t *n);
    /* pf_destroy, after the workers stopped */
    void (*join_helpers)(pf_loader *l);
    void (*free_slots)(pf_loader *l); /* required */
} pf__backend_ops;

struct pf_loader {
    pf_config cfg;      /* defaults filled in; fixed after pf_create */
    const pf__backend_ops *ops; /* its backend (ops->backend), chosen in pf_create */
    size_t stride;      /* a slot's bytes, aligned */
    uint32_t alone_run; /* the slots in PF__ALONE_RUN_BYTES (pf__run_len) */
    /* the fields above are read for every load (cfg.load, cfg.user, the
       bad-sample fields at its end): not on the lock's line, which the
       block's alignment (malloc's 16 bytes) could otherwise give them; the
       workers' reads of cfg.bad_marker_bytes took most of pf__worker_load */
    char pf__pad_cfg[PF__LINE];
    pf__sync sync;
    pf__ring ring;
    pf__claimer claim;
    pf__taker take;
    pf__consumer cons;
    pf__checkpoint ck;
    pf__error error;    /* the pipeline's first failure (>>errors) */
    pf__pool pool;
    pf__tuner at;
    pf__counters st;
    pf__cuda *cu;       /* the CUDA backend's state, in the same block (>>backend cuda) */
};

/* Defined in >>samples and >>worker state, after the core. */
static void pf__job_begin(pf_loader *l, pf__slot *s, pf__worker *w, pf_job *job);
static void pf__job_end(pf_loader *l, pf__slot *s, pf__worker *w, pf_job *job);
static void pf__skip_account(pf_loader *l, pf__slot *s);
static bool pf__skip_may_take(const pf_loader *l, const pf__slot *s);
static void pf__batch_samples(pf_loader *l, pf_batch *out, const pf__samples *sm);
static void pf__worker_up(pf_loader *l, pf__worker *w);
static void pf__worker_down(pf_loader *l, pf__worker *w);


/* >>errors ---------------------------------------------------------------- */
/* Logging through cfg.log, and the consumer's own error text (pf_error). */
static void pf__log(const pf_config *c, int level, const char *fmt, ...) PF__PRINTF(3, 4);
static void pf__log(const pf_config *c, int level, const char *fmt, ...) {
    char msg[PF__MSG_SIZE];
    va_list ap;
    if (!c->log) return;
    va_start(ap, fmt);
    pf__vformat(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->log(c->log_user, level, msg);
}

/* Record an error the caller will see in pf_error (lock held, or the
   loader not yet handed out). Returns r, for `return pf__fail(...)`. */
static pf_result pf__fail(pf_loader *l, pf_result r, const char *fmt, ...) PF__PRINTF(3, 4);
static pf_result pf__fail(pf_loader *l, pf_result r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pf__vformat(l->cons.err, sizeof l->cons.err, fmt, ap);
    va_end(ap);
    return r;
}

/* One record per loader. Any thread that hits a pipeline failure (planning,
   a load, the stager, the retirer, the consumer's own CUDA calls) sets it;
   the first failure wins and later ones are dropped (they are usually its
   consequences). The consumer shows it: a load or planning failure in batch
   order (after every earlier batch), a CUDA failure at once. Once shown it
   is sticky. Lock held. */
static void pf__set_error(pf_loader *l, int code, int by, bool at_once, uint64_t epoch, uint64_t batch,
                          const char *fmt, ...) PF__PRINTF(7, 8);
static void pf__set_error(pf_loader *l, int code, int by, bool at_once, uint64_t epoch, uint64_t batch,
                          const char *fmt, ...) {
    va_list ap;
    if (l->error.code) return;
    l->error.code = code;
    l->error.by = by;
    l->error.at_once = at_once;
    l->error.seq = l->claim.next_seq;
    l->error.epoch = epoch;
    l->error.batch = batch;
    va_start(ap, fmt);
    pf__vformat(l->error.msg, sizeof l->error.msg, fmt, ap);
    va_end(ap);
    l->claim.done = true; /* nothing after it will be delivered */
}

static void pf__wake(pf_loader *l, int role); /* >>waiting */

/* The consumer returns the record (and from now on, always): so must
   every other pf_next waiting meanwhile, for a batch that will not come
   now; they are woken to see it (three consumers and a failed load: one
   slept for ever). */
static pf_result pf__show_error(pf_loader *l) {
    if (!l->error.shown) pf__wake(l, PF__ROLE_CONSUMER);
    l->error.shown = true;
    return pf__fail(l, (pf_result)l->error.code, "%s", l->error.msg);
}

/* Must the consumer's next call return the error now? */
static bool pf__error_due(const pf_loader *l) { return l->error.shown || (l->error.code && l->error.at_once); }

/* >>config ---------------------------------------------------------------- */
/* The default ring for `workers` loading threads: 2 * workers + 1 slots (one
   loading and one ready per worker, and the one the consumer holds), and
   more while they are small: up to PF__SMALL_RING_SLOTS slots within
   PF__SMALL_RING_BYTES, and their bookkeeping (3 words a sample) within
   as much again (an outside trial's 2^20 samples of 1 byte each made 64
   slots, 1.5 GiB of bookkeeping for a 2 MiB ring). A cheap batch then is
   not a sleep and a wake: the workers run ahead by many batches, and are
   woken a batch of free slots at a time (pf__wake_workers). */
#define PF__SMALL_RING_BYTES ((size_t)2 << 20)
#define PF__SMALL_RING_SLOTS 64u
/* n bytes rounded up to PF__ALIGN (a slot's stride); less than n where it wraps */
static size_t pf__align_up(size_t n) { return (n + (PF__ALIGN - 1)) & ~(size_t)(PF__ALIGN - 1); }
static uint32_t pf__ring_slots(uint32_t workers, const pf_config *c) {
    uint64_t n = 2 * (uint64_t)workers + 1;
    size_t stride = pf__align_up(c->batch_bytes);
    uint64_t fit = stride ? PF__SMALL_RING_BYTES / stride : 0;
    uint64_t words = PF__SMALL_RING_BYTES / ((3 * (uint64_t)c->batch_size + 1) * 8); /* bookkeeping */
    if (words < fit) fit = words;
    if (c->batch_bytes && stride >= c->batch_bytes && fit > n)
        n = fit < PF__SMALL_RING_SLOTS ? fit : PF__SMALL_RING_SLOTS;
    if (n < 2 * (uint64_t)workers + 1) n = 2 * (uint64_t)workers + 1;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

PF_API pf_config pf_config_defaults(const pf_config *cfg) {
    pf_config c;
    memset(&c, 0, sizeof c);
    if (cfg) c = *cfg;
    if (!c.num_workers) c.num_workers = c.autotune ? PF__DEFAULT_AUTOTUNE_WORKERS : PF__DEFAULT_WORKERS;
    if (!c.host_slots) c.host_slots = pf__ring_slots(c.num_workers, &c);
    if (c.host_slots > PF__MAX_SLOTS && !(cfg && cfg->host_slots)) c.host_slots = PF__MAX_SLOTS;
    if (!c.device_slots) c.device_slots = PF__DEFAULT_DEVICE_SLOTS;
    if (!c.world_size) c.world_size = 1;
    if (!c.progress_every) c.progress_every = 100;
    if (!c.shuffle_block) c.shuffle_block = 1;
    if (!c.shuffle_window) c.shuffle_window = PF__DEFAULT_WINDOW;
    if (!c.allocator.alloc_fn && !c.allocator.free_fn) {
        c.allocator.alloc_fn = pf__malloc_default;
        c.allocator.free_fn = pf__free_default;
        c.allocator.user_data = NULL;
    }
    return c;
}

/* Do `slots` slots of `bytes`, each rounded up to PF__ALIGN, overflow? */
static bool pf__slots_overflow(size_t bytes, uint32_t slots) {
    size_t stride = pf__align_up(bytes);
    return stride < bytes || stride > (SIZE_MAX - PF__ALIGN) / (slots ? slots : 1);
}

/* Every field checked, each failure naming the field and what is accepted. */
static pf_result pf__check_config(const pf_config *in, const pf_config *c, char *why, size_t n) {
#define PF__BAD(...) return (pf__format(why, n, __VA_ARGS__), PF_ERR_INVALID_ARG)
    if (!c->load) PF__BAD("cfg.load is NULL: a load callback is required");
    if (c->num_samples_fn && c->num_samples)
        PF__BAD("cfg.num_samples (%llu) and cfg.num_samples_fn are both set: set one",
                (unsigned long long)c->num_samples);
    if (!c->num_samples_fn && c->num_samples == 0)
        PF__BAD("cfg.num_samples is 0: must be 1 .. 2^62 (or set cfg.num_samples_fn)");
    if (c->num_samples > PF__MAX_SAMPLES)
        PF__BAD("cfg.num_samples is %llu: must be 1 .. 2^62", (unsigned long long)c->num_samples);
    if (c->batch_size == 0 || c->batch_size > PF__MAX_BATCH_SIZE)
        PF__BAD("cfg.batch_size is %u: must be 1 .. %u", (unsigned)c->batch_size,
                (unsigned)PF__MAX_BATCH_SIZE);
    if (c->batch_bytes == 0) PF__BAD("cfg.batch_bytes is 0: must be at least 1 (the slot capacity)");
    if (c->num_workers > PF__MAX_WORKERS)
        PF__BAD("cfg.num_workers is %u: must be 0 (default %u) or 1 .. %u", (unsigned)c->num_workers,
                PF__DEFAULT_WORKERS, PF__MAX_WORKERS);
    if (c->host_slots > PF__MAX_SLOTS)
        PF__BAD("cfg.host_slots is %u: must be 0 (default 2 * num_workers + 1) or 1 .. %u",
                (unsigned)c->host_slots, PF__MAX_SLOTS);
    if (c->device_slots > PF__MAX_SLOTS)
        PF__BAD("cfg.device_slots is %u: must be 0 (default %u) or 1 .. %u", (unsigned)c->device_slots,
                PF__DEFAULT_DEVICE_SLOTS, PF__MAX_SLOTS);
    if (c->world_size > PF__MAX_WORLD)
        PF__BAD("cfg.world_size is %u: must be 0 (= 1) or 1 .. %u", (unsigned)c->world_size, PF__MAX_WORLD);
    if (c->rank >= c->world_size)
        PF__BAD("cfg.rank is %u: must be 0 .. world_size-1 = %u", (unsigned)c->rank,
                (unsigned)(c->world_size - 1));
    if (c->backend != PF_BACKEND_DEFAULT && c->backend != PF_BACKEND_HOST && c->backend != PF_BACKEND_CUDA)
        PF__BAD("cfg.backend is %d: must be PF_BACKEND_DEFAULT (0), PF_BACKEND_HOST (1) or PF_BACKEND_CUDA (2)",
                (int)c->backend);
    if (c->cuda_device < 0) PF__BAD("cfg.cuda_device is %d: must be >= 0", c->cuda_device);
    if (!in->allocator.alloc_fn != !in->allocator.free_fn)
        PF__BAD("cfg.allocator: set both alloc_fn and free_fn, or neither");
    if (c->shuffle_block > 1 && !c->shuffle)
        PF__BAD("cfg.shuffle_block is %u but cfg.shuffle is false: a block shuffle is a shuffle; set both",
                (unsigned)c->shuffle_block);
    if (c->bad_samples != PF_BAD_STOP && c->bad_samples != PF_BAD_SKIP && c->bad_samples != PF_BAD_MARK)
        PF__BAD("cfg.bad_samples is %d: must be PF_BAD_STOP (0), PF_BAD_SKIP (1) or PF_BAD_MARK (2)",
                (int)c->bad_samples);
    if (c->bad_samples == PF_BAD_MARK && (!c->bad_marker || !c->bad_marker_bytes))
        PF__BAD("cfg.bad_samples is PF_BAD_MARK but cfg.bad_marker is %s and cfg.bad_marker_bytes is %llu: set "
                "both (the bytes that replace a bad sample)", c->bad_marker ? "set" : "NULL",
                (unsigned long long)c->bad_marker_bytes);
    if (c->bad_limit && c->bad_samples == PF_BAD_STOP) /* the first bad sample stops it: the limit would never count */
        PF__BAD("cfg.bad_limit is %llu but cfg.bad_samples is PF_BAD_STOP, which stops at the first bad sample: set "
                "PF_BAD_SKIP or PF_BAD_MARK to go on up to the limit", (unsigned long long)c->bad_limit);
    if (pf__slots_overflow(c->batch_bytes, c->host_slots)) /* device_slots: once the CUDA backend is chosen */
        PF__BAD("cfg.batch_bytes is %llu: host_slots (%u) slots of it do not fit in memory",
                (unsigned long long)c->batch_bytes, (unsigned)c->host_slots);
    return PF_OK;
#undef PF__BAD
}

static bool pf__rd_hooks_any_thread(const pf_config *c); /* >>readers */
static pf_result pf__rd_fit(const pf_config *c, char *why, size_t n); /* >>readers */
static const char *pf__rd_token_hint(const pf_config *c);            /* >>readers */
static uint64_t pf__rd_token_step(const pf_config *c);               /* >>readers */
static void pf__rd_serve(const pf_config *c, int delta);              /* >>readers */
static void pf__rd_resumed(const pf_config *c, const pf__resume *rs); /* >>readers */

/* May a load run on pf_next's thread? Not with the caller's own per-thread
   hooks: their state belongs to worker threads. A reader's own (its read
   buffer) may be made on any thread. */
static bool pf__hooks_any_thread(const pf_config *c) {
    if (c->on_worker_start) return false;
    return (!c->worker_init && !c->worker_stop) || pf__rd_hooks_any_thread(c);
}

/* >>waiting --------------------------------------------------------------- */
/* The waiting protocol, in one place. Every thread waits in a role: worker
   (a free slot and a job), consumer (pf_next, pf_batch_wait), stager and
   retirer (CUDA). The rules:
   1. All shared state lives under l->sync.mu (two exceptions, each with
      its handshake beside it: the host backend's released stack,
      pf__release_host, and a run's early marks, pf__adopt_early). A
      waiter checks its condition and,
      if it must wait, counts itself in waiting[role] and waits on cv[role]
      in the same critical section: while (!cond) pf__wait(l, role, ...).
   2. Whoever changes state that can make a role's condition true does so
      under l->sync.mu and, in the same critical section, calls pf__wake (or
      pf__wake_workers), which owes that role a wake if any thread of it is
      counted as waiting.
   3. Owed wakes are sent right after the lock drops (pf__unlock_wake), or
      before a thread that owes them blocks (pf__wait flushes first). One
      wake may be owed later by design: a host consumer's, held until more
      batches are ready (pf__wake_taker_ready), only while its sleep is a
      timed one of at most PF__TAKER_HOLD_NS; held, never lost.
   Why no wake-up is lost: a waiter is counted before cnd_wait releases the
   lock atomically, so a state change made after that happens under the
   lock, sees the count and owes a wake, and the wake is sent after the
   waiter is already blocked; a change made before the waiter locked is
   seen by its check. Counts, not flags: a waiter that leaves (a timeout)
   subtracts only itself, so another still waiting stays owed (two threads
   in pf_next lost a wake-up when this was a flag). The consumer role is
   woken with a broadcast, since its waiters wait for different things
   (the next batch, a batch's copy); the stager and retirer are one thread
   each; workers get one signal or a broadcast, see pf__wake_workers. A
   signal wakes any one worker, and not all may claim (one past the active
   count must park): one woken that parks passes it on (pf__worker_main),
   or a free slot waits beside workers that may claim it.
   4. Before it waits, a consumer, the stager, or a worker on a ring under 8 slots
      (larger ones wake workers a batch of slots at a time), may spin a
      little (pf__spin), because a sleep and a wake cost 10-40 us on a VM
      while the other side is often a microsecond away (a cheap load, a
      consumer that releases at once). The spinner drops the lock and
      watches pulse[role], a counter bumped whenever a waiter of that role
      would be owed a wake (pf__wake, pf__wake_workers with its hysteresis,
      pf__wake_all_workers), whether or not one is counted as waiting; the
      bump is owed like a wake and given under the lock just before it
      drops, at rule 3's two exits. A spinner is not counted in waiting[],
      so nobody owes it a wake; it rechecks its condition when the pulse
      moves.
   Why spinning loses no wake-up either: the spin is only a delay before the
   rules above. A spinner reads the pulse in the critical section where its
   condition was found false; after the spin it takes the lock again and
   either the pulse moved (or the loader is stopping), and it rechecks its
   condition, or the pulse did not move, so no change since that check
   would have owed a waiter of its role a wake, and it waits by rule 1 in
   that same critical section, exactly as if it had never spun (a worker
   may then sleep with a free slot below the wake batch, as a worker that
   never spun does, until the batch or a starving consumer wakes it).
   Spins are bounded (spin_ns, at most PF_SPIN_MAX_NS), taken only while a
   CPU is free for them (this loader's threads not blocked, the spinner
   included, fit on the online CPUs, and the process has no more spinners
   than CPUs), and adaptive (a spin that ends without a pulse halves the
   role's budget, down to PF__SPIN_MIN_NS, one that is pulsed doubles it;
   a backed-off role still spins in full every 8th time, to notice that
   spinning pays again, and every 16th, 32nd ... 256th while those do
   not), so an idle loader spins once, briefly, and then sleeps. */
enum { PF__WAKE_WORKER = 1u << 8, PF__WAKE_WORKERS = 1u << 9 };

/* A pulse is owed like a wake and given as the critical section ends
   (still under the lock): a spinner that sees it then finds the lock free. */
static void pf__pulse(pf_loader *l, int role) { l->sync.pulse_owed |= 1u << role; }

static void pf__give_pulses(pf_loader *l) {
    unsigned p = l->sync.pulse_owed;
    int r;
    l->sync.pulse_owed = 0;
    for (r = 0; p; r++, p >>= 1)
        if (p & 1u) PF__STORE_FLAG(&l->sync.pulse[r], l->sync.pulse[r] + 1u);
}

static void pf__wake(pf_loader *l, int role) {
    pf__pulse(l, role);
    if (!l->sync.waiting[role]) return;
    l->sync.wake |= 1u << role;
    l->sync.woken[role] = l->sync.waiting[role]; /* a broadcast, or the role's one thread */
}

static void pf__send_wakes(pf_loader *l, unsigned w) {
    if (w & PF__WAKE_WORKERS) pf__broadcast(&l->sync.cv[PF__ROLE_WORKER]);
    else if (w & PF__WAKE_WORKER) pf__signal(&l->sync.cv[PF__ROLE_WORKER]);
    if (w & (1u << PF__ROLE_CONSUMER)) pf__broadcast(&l->sync.cv[PF__ROLE_CONSUMER]);
    if (w & (1u << PF__ROLE_STAGER)) pf__signal(&l->sync.cv[PF__ROLE_STAGER]);
    if (w & (1u << PF__ROLE_RETIRER)) pf__signal(&l->sync.cv[PF__ROLE_RETIRER]);
    if (w & (1u << PF__ROLE_PARKED)) pf__broadcast(&l->sync.cv[PF__ROLE_PARKED]);
}

static void pf__unlock_wake(pf_loader *l) {
    unsigned w = l->sync.wake;
    l->sync.wake = 0;
    if (l->sync.pulse_owed) pf__give_pulses(l);
    pf__unlock(&l->sync.mu);
    if (w) pf__send_wakes(l, w);
}

static void pf__flush_wakes(pf_loader *l) {
    if (l->sync.pulse_owed) pf__give_pulses(l);
    if (l->sync.wake) pf__send_wakes(l, l->sync.wake);
    l->sync.wake = 0;
}

/* Wait in `role` until woken, or until the deadline when one is given.
   0 woken (or a spurious wake-up: recheck), 1 the deadline passed. */
static int pf__wait(pf_loader *l, int role, const struct timespec *deadline) {
    int r = 0;
    l->sync.waiting[role]++;
    pf__flush_wakes(l);
    if (deadline)
        r = pf__cond_timedwait(&l->sync.cv[role], &l->sync.mu, deadline);
    else
        pf__cond_wait(&l->sync.cv[role], &l->sync.mu);
    l->sync.waiting[role]--;
    if (l->sync.woken[role]) l->sync.woken[role]--;
    return r;
}

/* pf__wait, the sleeper's side of a lock-free handshake (rule 1's two
   exceptions): counted in *sleepers first, then it waits only if *news
   is still 0; else 0 at once, look again. The other side sets *news and
   then looks at *sleepers (pf__release_host: released / slot_sleepers;
   pf__mark_early: early / taker_sleepers). */
static int pf__wait_unless(pf_loader *l, int role, const struct timespec *deadline, uint32_t *sleepers,
                           const uint32_t *news) {
    int r = 0;
#if PF__SPIN_OK
    PF__ADD_SC(sleepers, 1u);
    if (!PF__LOAD_SC(news)) r = pf__wait(l, role, deadline);
    PF__ADD_SC(sleepers, (uint32_t)-1);
#else
    (void)sleepers, (void)news; /* nothing is set without the lock here */
    r = pf__wait(l, role, deadline);
#endif
    return r;
}

static const uint32_t *pf__early_news(const pf_loader *l); /* >>ring */
/* The taker waits for a batch, unless a run's batch was loaded since it
   looked (pf__adopt_early). */
static int pf__taker_wait(pf_loader *l, int role, const struct timespec *deadline) {
    return pf__wait_unless(l, role, deadline, &l->ring.taker_sleepers, pf__early_news(l));
}

/* Threads spinning in pf__spin, all loaders of the process together. */
static uint32_t pf__spinners;

/* How many CPUs a list such as "0-3,8,10-11" names (0: none, or not a list). */
static uint32_t pf__cpus_in_list(const char *p) {
    uint32_t n = 0;
    for (;;) {
        char *end;
        unsigned long a, b;
        while (*p == ' ' || *p == '\t') p++;
        a = strtoul(p, &end, 10);
        if (end == p) return n;
        b = a;
        p = end;
        if (*p == '-') {
            b = strtoul(p + 1, &end, 10);
            if (end == p + 1 || b < a) return 0;
            p = end;
        }
        n += (uint32_t)(b - a + 1);
        if (*p != ',') return n;
        p++;
    }
}

#ifndef PF__CPU_COUNT /* tests may say how many */
#define PF__CPU_COUNT pf__cpu_count
#endif
/* The CPUs this process may run on: online, within its affinity mask
   (taskset, as /proc/self/status lists it) and its container's CPU
   quota (cgroup v2 cpu.max, "quota period", rounded up). A loader under
   `docker --cpus 2` on a 64-core host must not spin as if it had 64. */
static uint32_t pf__cpu_count(void) {
    long n = 1; /* unknown: never spin */
#if defined(_SC_NPROCESSORS_ONLN)
    n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
#endif
#if defined(__linux__)
    {
        /* the mask as /proc shows it: sched_getaffinity is declared only
           with _GNU_SOURCE */
        FILE *f = fopen("/proc/self/status", "r");
        char line[512];
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "Cpus_allowed_list:", 18)) {
                long k = (long)pf__cpus_in_list(line + 18);
                if (k > 0 && k < n) n = k;
                break;
            }
        if (f) fclose(f);
    }
    {
        FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
        long long quota = 0, period = 0;
        if (f) {
            if (fscanf(f, "%lld %lld", &quota, &period) == 2 && quota > 0 && period > 0 &&
                (quota + period - 1) / period < n)
                n = (long)((quota + period - 1) / period);
            fclose(f);
        }
    }
#endif
    return (uint32_t)n;
}

/* May a thread spin now? Only while the loader runs and a CPU is free
   for it: this loader's threads that are not blocked fit on the online
   CPUs. A thread sent a wake counts as running: on the 2-core VM a
   consumer that spun right after its pf_release woke a worker short of
   a slot took that worker's CPU, the worker waited a time slice to run,
   the other worker filled the ring meanwhile and slept too, and 2
   workers loaded 16 KiB batches no faster than 1. Lock held. */
static bool pf__cpu_free(const pf_loader *l) {
    uint32_t threads = l->at.active + 1u + l->ops->helpers, blocked = 0; /* workers, a consumer, helpers */
    int r;
    for (r = PF__ROLE_WORKER; r <= PF__ROLE_RETIRER; r++) /* woken: about to run, not blocked */
        blocked += l->sync.waiting[r] > l->sync.woken[r] ? l->sync.waiting[r] - l->sync.woken[r] : 0;
    return !l->sync.stopping && threads <= blocked + l->sync.ncpu;
}

/* How many times this thread has slept (its voluntary context switches,
   as the kernel counts them); -1: unknown. Read before and after a load:
   one that never sleeps is all CPU (a decode, a read from the page
   cache), and more of them at once than cores only take turns
   (pf__cpu_cap). (Its CPU times are the scheduler's as of its last tick
   or switch: 0 for most loads under a tick, so a load's CPU time is
   read from the thread's CPU clock, which brings it up to date.) */
static long pf__sleeps(void) {
#if defined(__linux__)
    struct rusage ru;
    /* 1 is RUSAGE_THREAD in the kernel's ABI (declared only with
       _GNU_SOURCE), since Linux 2.6.26 */
    return getrusage(1, &ru) == 0 ? ru.ru_nvcsw : -1;
#else
    return -1;
#endif
}

/* A thread-local whose address names the thread that reads it. */
static PF__THREAD_LOCAL char pf__thread_tag;

/* The calling thread's time runnable but waiting for a CPU, in ns (the
   scheduler's run delay: /proc/thread-self/schedstat's second field), or
   UINT64_MAX where unknown. A worker among the first PF__SCHED_KEPT keeps
   the file open from its start (pf__sched_keep, where the CPU cap asks:
   an lseek and a read, 1 us here, where opening it costs 5 us); the
   others, and pf_next's record (any thread may load through it), open
   it for each read. Never more files than that while the loader runs;
   pf__teardown closes them. */
#define PF__SCHED_KEPT 16u
#if defined(__linux__)
static uint64_t pf__sched_read(int fd) {
    char buf[96], *end;
    long n = lseek(fd, 0, SEEK_SET) == 0 ? (long)read(fd, buf, sizeof buf - 1) : -1;
    if (n <= 0) return UINT64_MAX;
    buf[n] = '\0';
    (void)strtoull(buf, &end, 10); /* time on a CPU */
    return end == buf ? UINT64_MAX : (uint64_t)strtoull(end, NULL, 10);
}
static int pf__sched_open(void) {
#ifdef O_CLOEXEC
    return open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
#else
    return open("/proc/thread-self/schedstat", O_RDONLY | 02000000); /* <fcntl.h> shows it only with POSIX 2008 */
#endif
}
#endif
static void pf__sched_keep(pf__worker *w) { /* on w's own thread, at its start */
#if defined(__linux__)
    int fd = pf__sched_open();
    w->sched_fd1 = fd >= 0 ? fd + 1 : 0;
#else
    (void)w;
#endif
}
static uint64_t pf__run_delay_ns(const pf__worker *w) {
#if defined(__linux__)
    uint64_t v;
    int fd;
    if (w->sched_fd1 > 0) return pf__sched_read(w->sched_fd1 - 1);
    fd = pf__sched_open();
    if (fd < 0) return UINT64_MAX;
    v = pf__sched_read(fd);
    close(fd);
    return v;
#else
    (void)w;
    return UINT64_MAX;
#endif
}
#ifndef PF__THREAD_CPU_NS /* tests may say what it reads */
#define PF__THREAD_CPU_NS pf__thread_cpu_ns
#endif
#ifndef PF__PROC_CPU_NS /* ...and this (the process's; 0: unknown) */
#define PF__PROC_CPU_NS pf__cpu_ns
#endif

/* A role's budget for this spin. Backed off, every spin_every-th is a full
   one, a probe: is the other side closer now? A probe that fails doubles
   that interval (up to PF__SPIN_PROBE_MAX) and leaves the backed-off budget
   as it was: an outside trial's 130 us loads, whose spins never paid, cost
   the consumer 5.8 us of CPU a batch when a failed probe (20 us) made the
   budget 10 us and the halving started again from there. *probe: this is
   one. */
#define PF__SPIN_PROBE_MIN 8u
#define PF__SPIN_PROBE_MAX 256u
static uint32_t pf__spin_budget(pf_loader *l, int role, bool *probe) {
    uint32_t budget = l->sync.spin_ns[role];
    *probe = false;
    if (!budget || budget == PF_SPIN_MAX_NS || ++l->sync.spin_probe[role] < l->sync.spin_every[role]) return budget;
    l->sync.spin_probe[role] = 0;
    *probe = true;
    return PF_SPIN_MAX_NS;
}

/* A spin that paid doubles the role's budget, one that did not halves it;
   a probe that paid restores the full budget. */
static void pf__spin_adapt(pf_loader *l, int role, uint32_t budget, bool probe, bool paid) {
    if (probe) {
        if (paid) l->sync.spin_ns[role] = PF_SPIN_MAX_NS, l->sync.spin_every[role] = PF__SPIN_PROBE_MIN;
        else if (l->sync.spin_every[role] < PF__SPIN_PROBE_MAX) l->sync.spin_every[role] *= 2;
        return;
    }
    if (paid) l->sync.spin_ns[role] = budget > PF_SPIN_MAX_NS / 2 ? PF_SPIN_MAX_NS : 2 * budget;
    else l->sync.spin_ns[role] = budget / 2 < PF__SPIN_MIN_NS ? PF__SPIN_MIN_NS : budget / 2;
}

/* Spin with the lock dropped until `role` is pulsed, the loader stops or
   the role's budget runs out (rule 4), or *also (when given) is not 0.
   Lock held on entry and on return.
   true: something changed, recheck the condition; false: nothing did (or
   no CPU was free to spin on), wait now, in this critical section. */
static bool pf__spin(pf_loader *l, int role, const uint32_t *also) {
#if PF__SPIN_OK
    uint32_t seen, budget;
    uint64_t t0;
    bool pulsed = false, probe;
    unsigned i;
    if (!l->sync.spin_ns[role] || !pf__cpu_free(l)) return false;
    budget = pf__spin_budget(l, role, &probe);
    if (PF__ADD(&pf__spinners, 1u) > l->sync.ncpu) {
        PF__ADD(&pf__spinners, (uint32_t)-1);
        return false;
    }
    seen = l->sync.pulse[role];
    l->sync.spinning[role]++;
    pf__unlock_wake(l); /* owed wakes first: the other side may be what we wait for */
    t0 = pf__now_ns();
    for (i = 1;; i++) {
        PF__CPU_RELAX();
        if (PF__LOAD_FLAG(&l->sync.pulse[role]) != seen || PF__LOAD_FLAG(&l->sync.stopping) ||
            (also && PF__LOAD_FLAG(also))) {
            pulsed = true;
            break;
        }
        if (i % 16u == 0 && pf__now_ns() - t0 >= budget) break;
    }
    PF__ADD(&pf__spinners, (uint32_t)-1);
    pf__lock(&l->sync.mu);
    l->sync.spinning[role]--;
    if (!pulsed) /* between the last look and the lock */
        pulsed = l->sync.pulse[role] != seen || l->sync.stopping || (also && PF__LOAD_FLAG(also));
    pf__spin_adapt(l, role, budget, probe, pulsed);
    return pulsed;
#else
    (void)l, (void)role, (void)also;
    return false;
#endif
}

/* Something every waiting worker must look at (a plan, the lead cap, a
   stop): wake them all. */
static void pf__wake_all_workers(pf_loader *l) {
    pf__pulse(l, PF__ROLE_WORKER);
    if (!l->sync.waiting[PF__ROLE_WORKER]) return;
    l->sync.wake |= PF__WAKE_WORKERS;
    l->sync.woken[PF__ROLE_WORKER] = l->sync.waiting[PF__ROLE_WORKER];
}

/* A block going back is freed by a worker (pf__shrink), a parked one too:
   with pf_next loading alone every worker is parked. */
static void pf__wake_shrinker(pf_loader *l) {
    pf__wake_all_workers(l);
    pf__wake(l, PF__ROLE_PARKED);
}

/* A loaded batch (or an end, or an error) may unblock the taker. */
static void pf__wake_takers(pf_loader *l) {
    l->ring.taker_held = false;
    pf__wake(l, l->ops->taker);
}

/* The taker's next batch is ready (lock held). A host consumer asleep is
   woken a batch of ready batches at a time (ring.wake_batch), as workers
   are woken a batch of free slots at a time: each wake is a futex call
   in the publishing worker and two more in the consumer (its sleep, and
   the unlock after it: glibc's condition variable hands the mutex back
   marked contended), and the consumer's sleep and wake took 20-40 us of
   CPU from the workers on the 2-core VM, where a 256 KiB batch loads in
   25 (2 workers and 16 slots: 0.64 of plain preads, 0.77 with the
   consumer woken 4 batches at a time). It is held only while every consumer
   asleep sleeps at most PF__TAKER_HOLD_NS (pf__taker_sleep: so a held
   batch is late by no more, whatever the loads after it do, even wait
   for this consumer), the loading goes on (the publishing worker claims
   again, with a slot free; a worker that cannot wakes it, see
   pf__worker_main), the batch just loaded says the rest will come within
   PF__TAKER_HOLD_NS of the sleep's start (load_ns: its load), and that is
   not past: a consumer faster than its loads waits as long in all (it
   waits for the loads either way), in fewer, longer sleeps; one slower
   than them never sleeps. A spinning consumer is pulsed at once. */
#define PF__TAKER_HOLD_NS 200000u
/* pf_next loads below this (pf__may_help, >>backend host) */
#ifndef PF__HELP_MAX_NS /* tests raise it: under a sanitizer no load is cheap */
#define PF__HELP_MAX_NS PF__TAKER_HOLD_NS
#endif
/* ...or when the batch it waits for is further off than a load less this */
#ifndef PF__HELP_LATE_NS /* tests raise it: a sanitizer's wake-up takes longer */
#define PF__HELP_LATE_NS PF__TAKER_HOLD_NS
#endif
static void pf__wake_taker_ready(pf_loader *l, uint64_t now, uint64_t load_ns) {
    uint32_t want = l->ring.wake_batch;
    if (l->ops->taker == PF__ROLE_CONSUMER && l->sync.waiting[PF__ROLE_CONSUMER] &&
        l->ring.timed_sleepers == l->sync.waiting[PF__ROLE_CONSUMER] && l->ring.nready < want && l->ring.nfree &&
        !l->claim.done &&
        now - l->ring.taker_slept + load_ns * (want - l->ring.nready) / (l->ring.nloading + 1) < PF__TAKER_HOLD_NS) {
        pf__pulse(l, PF__ROLE_CONSUMER);
        l->ring.taker_held = true;
        return;
    }
    pf__wake_takers(l);
}

/* Waiting workers are woken in batches, a quarter of the ring at a time,
   unless the ring runs low or the taker is starving: one wakeup then buys
   several loads instead of one. Half the ring when it has 32 slots or
   more: such a ring holds small batches (PF__SMALL_RING_BYTES), whose
   loads cost less than the wake (a futex call, and glibc's condition
   variable hands the mutex back marked contended, so the next unlock
   makes a second one); the handoff with the 64-slot ring went from
   0.51-0.54 to 0.36 us a batch on the 2-core VM. Under 8 slots, every
   free slot wakes (a worker spins there instead, pf__spin). */
static uint32_t pf__wake_batch(uint32_t slots) { return slots >= 32 ? slots / 2 : slots >= 8 ? slots / 4 : 1; }

static void pf__wake_workers(pf_loader *l, bool urgent) {
    int taker = l->ops->taker;
    if (!l->ring.nfree) return;
    if (!urgent && l->ring.nfree < l->ring.wake_batch && l->ring.nready > l->at.active && !l->sync.waiting[taker] &&
        !l->sync.spinning[taker])
        return;
    pf__pulse(l, PF__ROLE_WORKER); /* spinning workers: the same hysteresis */
    if (!l->sync.waiting[PF__ROLE_WORKER]) return;
    if (l->ring.nfree > 1) {
        l->sync.wake |= PF__WAKE_WORKERS;
        l->sync.woken[PF__ROLE_WORKER] = l->sync.waiting[PF__ROLE_WORKER];
    } else {
        l->sync.wake |= PF__WAKE_WORKER;
        if (l->sync.woken[PF__ROLE_WORKER] < l->sync.waiting[PF__ROLE_WORKER]) l->sync.woken[PF__ROLE_WORKER]++;
    }
}

/* >>claim ----------------------------------------------------------------- */
/* The workers' side: plan epochs, claim the next batch. */
/* Plans live in a small ring from the take cursor's epoch to the claim
   cursor's; a plan retires when the taker passes its end. */
static pf__plan *pf__plan_find(pf_loader *l, uint64_t epoch) {
    uint64_t first;
    if (l->claim.plan_count == 0) return NULL;
    first = l->claim.plans[l->claim.plan_head].epoch;
    if (epoch < first || epoch - first >= l->claim.plan_count) return NULL;
    return &l->claim.plans[(l->claim.plan_head + (uint32_t)(epoch - first)) % l->claim.plan_cap];
}

/* Plan the claim cursor's epoch. Called with the lock held and returns with
   it held, but drops it around num_samples_fn: user code never runs under
   the loader's lock. */
static void pf__plan_next(pf_loader *l) {
    uint64_t e = l->claim.epoch, n;
    pf__plan *p;
    uint64_t start = 0, first_batch = 0;
    bool resumed = l->ck.rs.active && e == l->ck.rs.epoch;
    l->claim.planning = true;
    if (resumed && l->ck.rs.has_n) { /* the token's epoch keeps the size it had */
        n = l->ck.rs.n;
    } else if (l->cfg.num_samples_fn) {
        pf__unlock_wake(l);
        pf__plan_why[0] = '\0';
        n = l->cfg.num_samples_fn(l->cfg.user, e);
        pf__lock(&l->sync.mu);
    } else {
        n = l->cfg.num_samples;
    }
    l->claim.planning = false;
    l->claim.plans_made++;
    pf__wake_all_workers(l);
    if (n == PF__PLAN_FAILED && pf__plan_why[0]) { /* a reader could not size it: due as below */
        pf__set_error(l, PF_ERR_LOAD, PF__BY_PLANNING, false, e, 0, "%s", pf__plan_why);
        pf__wake_takers(l);
        return;
    }
    if (n > PF__MAX_SAMPLES) { /* due once every batch planned before it was taken */
        pf__set_error(l, PF_ERR_INVALID_ARG, PF__BY_PLANNING, false, e, 0,
                      "cfg.num_samples_fn returned %llu for epoch %llu: must be 0 .. 2^62", (unsigned long long)n,
                      (unsigned long long)e);
        pf__wake_takers(l);
        return;
    }
    if (resumed) {
        start = l->ck.rs.pos;
        first_batch = l->ck.rs.batch;
        l->ck.rs.active = false;
    }
    p = &l->claim.plans[(l->claim.plan_head + l->claim.plan_count) % l->claim.plan_cap];
    pf__plan_init(p, &l->cfg, e, n, start, first_batch);
    l->claim.plan_count++;
    l->claim.planned = true;
    l->claim.batch = first_batch;
    l->claim.nbatches = p->nbatches;
    pf__wake_takers(l); /* a taker may be waiting for this epoch's plan */
}

enum { PF__CLAIM_OK, PF__CLAIM_NO_SLOT, PF__CLAIM_NO_JOB, PF__CLAIM_DONE, PF__CLAIM_PARKED };

/* Was batch `batch` of `epoch` delivered before the checkpoint resumed
   from (unordered)? */
static bool pf__resume_skips(const pf_loader *l, uint64_t epoch, uint64_t batch) {
    uint32_t i;
    if (!l->ck.rs.nskip || epoch != l->ck.rs.epoch) return false;
    for (i = 0; i < l->ck.rs.nskip; i++)
        if (l->ck.rs.skip[i] == batch) return true;
    return false;
}

static void pf__take_released(pf_loader *l); /* >>ring */

/* >>runs ------------------------------------------------------------------ */
/* A run (pf__run_len) claims up to PF__RUN_MAX batches at once, loaded
   one after the other by the thread that claimed them. A load that
   takes long among cheap ones held the rest of its run behind it while
   the other workers idled: an outside trial's 1 s load among instant
   ones delivered the 9 batches after it, unordered, 1 s late with 2
   workers free and 64 slots empty. So the part of a run not yet begun
   may be taken: a thread with nothing to claim (pf__claim) takes the
   later half of the longest such part and hands it to the claims as
   batches claimed already (ring.orphans, as pf_next's run hands back
   what it leaves). The run's owner begins each batch only by moving
   `next` up while it is below `end` (pf__run_own), the taker moves `end`
   down while it stays above `next`: one CAS on one word each way, so a
   batch is begun by one of them, never by both or neither. */
static void pf__run_open(pf__worker *w, pf__slot *const *run, uint32_t nrun) {
#if PF__SPIN_OK
    uint32_t k;
    for (k = 0; k < nrun; k++) w->run[k] = run[k];
    PF__STORE_SC(&w->run_word, ((uint64_t)1 << 32) | nrun); /* the first is begun */
#else
    (void)w, (void)run, (void)nrun;
#endif
}
/* Batch k (k >= 1, the next) of the owner's run: true, it is the owner's
   to load; false, it and the rest were taken. */
static bool pf__run_own(pf__worker *w, uint32_t k) {
#if PF__SPIN_OK
    uint64_t old = PF__LOAD_SC(&w->run_word);
    for (;;) {
        uint32_t end = (uint32_t)old;
        PF_ASSERT((uint32_t)(old >> 32) == k);
        if (k >= end) return false;
        if (PF__CAS_SC(&w->run_word, &old, ((uint64_t)(k + 1) << 32) | end)) return true;
    }
#else
    (void)w, (void)k;
    return true;
#endif
}
/* The run ends (the owner, with `nrun` claimed): nothing more may be
   taken. Returns its end, where the batches taken begin: the owner's
   are below it. */
static uint32_t pf__run_close(pf__worker *w, uint32_t nrun) {
#if PF__SPIN_OK
    uint64_t old = __atomic_exchange_n(&w->run_word, 0, __ATOMIC_SEQ_CST);
    (void)nrun;
    return (uint32_t)old;
#else
    (void)w;
    return nrun;
#endif
}
/* Thread `by` has nothing to claim (no batch, or no free slot): the later
   half of the longest part of a run not begun goes to ring.orphans, to be
   claimed. true: some did. Lock held. */
static bool pf__steal(pf_loader *l, const pf__worker *by) {
#if PF__SPIN_OK
    pf__worker *v = NULL;
    uint32_t most = 0, k, i;
    uint64_t old;
    /* pf__claim takes the orphans first: there are none, and half a run
       fits beside a run's rest handed back (ring.orphans) */
    PF_ASSERT(!l->ring.norphans);
    if (!l->ring.runs_open) return false;
    for (i = 0; i <= l->cfg.num_workers; i++) { /* the workers, and pf_next's record */
        pf__worker *o = &l->pool.w[i];
        uint64_t word = PF__LOAD_SC(&o->run_word);
        uint32_t begun = (uint32_t)(word >> 32), end = (uint32_t)word;
        if (o != by && end > begun && end - begun > most) most = end - begun, v = o;
    }
    if (!v) return false;
    old = PF__LOAD_SC(&v->run_word);
    for (;;) {
        uint32_t begun = (uint32_t)(old >> 32), end = (uint32_t)old, take;
        if (end <= begun) return false; /* begun meanwhile, or closed */
        take = (end - begun + 1) / 2;
        if (!PF__CAS_SC(&v->run_word, &old, (old & ~(uint64_t)UINT32_MAX) | (end - take))) continue;
        /* the lowest on top: claimed first */
        for (k = end; k-- > end - take;) l->ring.orphans[l->ring.norphans++] = v->run[k]->index;
        l->st.stolen += take;
        return true;
    }
#else
    (void)l, (void)by;
    return false;
#endif
}

/* A worker takes a free slot and the next job together, under the lock.
   `takes`: with nothing to claim, it takes what another's run holds back
   (pf__steal: a worker's first claim, or pf_next's where it loads; not to
   make a run longer, which would split runs whenever the ring is full). */
static int pf__claim(pf_loader *l, pf__worker *w, uint64_t now, pf__slot **out, bool takes) {
    for (;;) {
        pf__slot *s;
        if (l->sync.stopping) return PF__CLAIM_DONE;
        if (w->id >= l->at.active && w->id < l->cfg.num_workers) return PF__CLAIM_PARKED; /* autotune: not needed now */
        if (l->ring.norphans) { /* claimed already, slot and all: loaded before anything new */
            s = &l->ring.slots[l->ring.orphans[--l->ring.norphans]];
            s->worker = w->id;
            s->started_ns = now;
            *out = s;
            return PF__CLAIM_OK;
        }
        if (l->claim.done) {
            if (takes && pf__steal(l, w)) continue;
            return PF__CLAIM_DONE;
        }
        if (l->ring.nfree == 0) pf__take_released(l);
        if (l->ring.nfree == 0) {
            if (takes && pf__steal(l, w)) continue;
            return PF__CLAIM_NO_SLOT;
        }
        if (!l->claim.planned) {
            if (l->cfg.epochs && l->claim.epoch >= l->cfg.epochs) {
                l->claim.done = true;
                continue; /* done: what runs hold back may still be taken */
            }
            if (l->claim.planning || l->claim.plan_count == l->claim.plan_cap) {
                if (takes && pf__steal(l, w)) continue;
                return PF__CLAIM_NO_JOB;
            }
            pf__plan_next(l);
            continue; /* the lock was dropped: look again */
        }
        if (l->claim.batch < l->claim.nbatches && pf__resume_skips(l, l->claim.epoch, l->claim.batch)) {
            l->claim.batch++; /* delivered before the checkpoint */
            continue;
        }
        if (l->claim.batch == l->claim.nbatches) { /* epoch fully claimed */
            l->claim.epoch++;
            l->claim.planned = false;
            continue;
        }
        /* unordered: no claim at or past the first undelivered batch of its
           epoch + ck.win, so the batches delivered past it (a checkpoint's
           done list) fit in ck.done without aliasing. An epoch the consumer
           has not reached counts from 0: on CUDA the stager runs ahead
           across the epoch end, so without the cap a next epoch could have
           more than ck.win batches in flight when the consumer gets there.
           It cannot deadlock: every batch below the cap is claimed already,
           so the consumer reaches and delivers its first undelivered one,
           which moves the cap (pf__note_delivery wakes the claim). */
        if (l->cfg.unordered &&
            l->claim.batch >= (l->claim.epoch == l->cons.epoch ? l->ck.low : 0) + l->ck.win) {
            if (takes && pf__steal(l, w)) continue;
            l->ck.lead_capped = true; /* woken when the consumer moves ck.low */
            return PF__CLAIM_NO_JOB;
        }
        s = &l->ring.slots[l->ring.free_stack[--l->ring.nfree]];
        pf__move(&s->state, PF__FROM(PF__SLOT_FREE), PF__SLOT_LOADING);
        l->ring.nloading++;
        s->seq = l->claim.next_seq++;
        s->b.epoch = l->claim.epoch;
        s->b.batch = l->claim.batch++;
        s->b.nbatches = l->claim.nbatches;
        s->indexed = false;
        s->plan = pf__plan_find(l, l->claim.epoch);
        s->b.n = s->plan->n;
        s->worker = w->id;
        s->result = PF_OK;
        s->started_ns = now;
        if (!l->cfg.unordered) {
            l->ring.order[s->seq & l->ring.order_mask] = s->index + 1;
            /* a taker spinning for this very batch watched no flag (there
               was no slot yet, pf__early_news): it looks again */
            if (s->seq == l->take.taken && l->sync.spinning[l->ops->taker]) pf__pulse(l, l->ops->taker);
        }
        *out = s;
        return PF__CLAIM_OK;
    }
}

/* >>ring ------------------------------------------------------------------ */
/* A slot's way round the ring: published by its worker, taken in order
   (or as finished), freed. */
/* In order: the slot of batch `seq` (from the next to take), if claimed
   and in `state` (lock held). Its order entry is written at the claim:
   seqs from the next taken to the last claimed each hold a slot, so no two
   of them share an entry. */
static pf__slot *pf__in_order_slot(const pf_loader *l, uint64_t seq, int state) {
    uint32_t o = l->ring.order[seq & l->ring.order_mask];
    pf__slot *s = o ? &l->ring.slots[o - 1] : NULL;
    return s && s->state == state && s->seq == seq ? s : NULL;
}
static pf__slot *pf__in_order_next(const pf_loader *l, int state) { return pf__in_order_slot(l, l->take.taken, state); }
/* A worker finished slot s (lock held). */
static void pf__publish(pf_loader *l, pf__slot *s, uint64_t now) {
    pf__move(&s->state, PF__FROM(PF__SLOT_LOADING), PF__SLOT_READY);
    l->ring.nready++;
    l->ring.nloading--;
    if (s->result != PF_OK) l->claim.done = true; /* stop loading: nothing after it is delivered in order */
    if (l->cfg.unordered)
        l->ring.ready_fifo[(l->ring.ready_head + l->ring.ready_count++) % l->ring.nslots] = s->index;
    /* in order, the taker waits for one batch, the next: a batch behind it
       does not let it go on, and waking it for one costs a context switch
       that a busy machine pays out of the loads */
    if (l->cfg.unordered || pf__in_order_next(l, PF__SLOT_READY)) pf__wake_taker_ready(l, now, now - s->started_ns);
}

static bool pf__shrink_due(const pf_loader *l); /* >>autotune */

/* Back to the free stack: a failed batch the taker dropped, a batch the
   consumer released (host), a copy the retirer saw end (CUDA). */
static void pf__slot_free(pf_loader *l, pf__slot *s) {
    pf__move(&s->state, PF__FROM(PF__SLOT_READY) | PF__FROM(PF__SLOT_HELD) | PF__FROM(PF__SLOT_COPYING),
             PF__SLOT_FREE);
    PF__STORE_RELAXED(&s->ticket, 0);
    if (l->ring.retire_from && s->index >= l->ring.retire_from) { /* going back (pf__shrink) */
        /* the block's last busy slot: a worker gives it back now, even if
           every worker sleeps for want of a slot (the caller may hold all
           the others, and wait in pf_next for the ring to grow again) */
        if (pf__shrink_due(l)) pf__wake_shrinker(l);
        return;
    }
    l->ring.free_stack[l->ring.nfree++] = s->index;
    pf__wake_workers(l, false);
    if (l->cons.slot_waits) pf__wake_takers(l); /* pf_next, the one loader, waits for it */
}

/* The slots pf_release handed back since the last look, freed now (lock
   held): by pf_next, by a worker short of a free slot, by pf_get_stats. */
static void pf__take_released(pf_loader *l) {
#if PF__SPIN_OK
    uint32_t i;
    if (!PF__LOAD_RELAXED(&l->ring.released)) return; /* the common case: no store to a shared line */
    for (i = PF__SWAP(&l->ring.released, 0u); i;) {
        pf__slot *s = &l->ring.slots[i - 1];
        i = s->next_released;
        l->cons.held--;
        pf__slot_free(l, s);
    }
#else
    (void)l;
#endif
}

static void pf__loaded(pf_loader *l, pf__slot *s, uint64_t end); /* >>worker */

/* A run's batches are published together when the run ends, but each is
   marked `early` as soon as it is loaded: the taker that finds the next
   batch not published looks for marked ones and publishes them itself
   (lock held), so a batch is never held back behind a slower load in
   the same run (a load stuck on I/O, or on something the consumer is yet
   to do). In order the taker needs one batch, the next: it looks at that
   slot's flag alone (and publishes the marked ones after it, in a row);
   unordered any batch will do, and ring.early counts them. The handshake
   with a taker about to sleep is the one of pf__release_host: the worker
   marks (and counts, unordered), then looks at ring.taker_sleepers; the
   taker counts itself there, then looks at what pf__early_news names
   (pf__taker_wait, pf__wait_unless); both sequentially consistent, so one
   of them sees the other. A taker asleep in order for a batch no worker
   has claimed yet is counted before the claim (which needs the lock its
   sleep holds until it waits): that batch's mark sees it. A marked batch
   counted in ring.early per batch, in order too, cost cheap 4 KiB loads
   most of a worker's own time: the taker's spin read that line, and each
   count had to take it back. */
/* A marked slot's mark taken off, by whoever publishes it (lock held). */
static void pf__unmark(pf_loader *l, pf__slot *s) {
    PF__STORE_RELAXED(&s->early, 0u);
    if (l->cfg.unordered) PF__ADD_SC(&l->ring.early, (uint32_t)-1); /* may go below 0 for a moment: the worker adds after marking */
}
static void pf__adopt(pf_loader *l, pf__slot *s) {
    pf__unmark(l, s);
    s->started_ns = s->run_start;
    pf__loaded(l, s, s->run_end);
}
static void pf__adopt_early(pf_loader *l) {
#if PF__SPIN_OK
    uint32_t i;
    if (!l->cfg.unordered) {
        uint64_t seq = l->take.taken;
        for (i = 0; i < l->ring.nslots; i++, seq++) { /* the next batch, and the marked ones right after it */
            pf__slot *s = pf__in_order_slot(l, seq, PF__SLOT_LOADING);
            if (!s || !PF__LOAD_FLAG(&s->early)) break;
            pf__adopt(l, s);
        }
        return;
    }
    if (!PF__LOAD_RELAXED(&l->ring.early)) return;
    for (i = 0; i < l->ring.nalloc; i++) {
        pf__slot *s = &l->ring.slots[i];
        if (s->state == PF__SLOT_LOADING && PF__LOAD_FLAG(&s->early)) pf__adopt(l, s);
    }
#else
    (void)l;
#endif
}

/* What a taker about to wait watches for a run's early batch: the next
   batch's flag in order (a flag always 0 where no worker has claimed it
   yet), else ring.early. Lock held. */
static const uint32_t pf__no_news = 0;
static const uint32_t *pf__early_news(const pf_loader *l) {
    const pf__slot *s;
    if (l->cfg.unordered) return &l->ring.early;
    s = pf__in_order_next(l, PF__SLOT_LOADING);
    return s ? &s->early : &pf__no_news;
}

/* The taker's next step (lock held): PF_OK with *out, PF_END_OF_EPOCH,
   PF_END_OF_DATA, PF__WAIT, or the pipeline's error (now in l->error);
   among what is published. */
static int pf__take_ready(pf_loader *l, pf__slot **out) {
    pf__plan *p;
    pf__slot *s = NULL;
    p = pf__plan_find(l, l->take.epoch);
    if (!p) {
        if (l->cfg.epochs && l->take.epoch >= l->cfg.epochs) return PF_END_OF_DATA;
        if (l->error.by == PF__BY_PLANNING && l->take.taken >= l->error.seq) return l->error.code;
        return PF__WAIT;
    }
    if (l->take.done == p->nbatches) {
        l->take.ended_n = p->n;
        l->take.epoch++;
        l->take.done = 0;
        l->claim.plan_head = (l->claim.plan_head + 1) % l->claim.plan_cap;
        l->claim.plan_count--;
        pf__wake_all_workers(l); /* room for another plan */
        return PF_END_OF_EPOCH;
    }
    if (!l->cfg.unordered) {
        s = pf__in_order_next(l, PF__SLOT_READY);
        if (!s) return PF__WAIT; /* not claimed yet, or loading */
        l->ring.order[l->take.taken & l->ring.order_mask] = 0;
    } else {
        uint32_t i;
        for (i = 0; i < l->ring.ready_count; i++) {
            uint32_t k = (l->ring.ready_head + i) % l->ring.nslots;
            if (l->ring.slots[l->ring.ready_fifo[k]].b.epoch == l->take.epoch &&
                pf__skip_may_take(l, &l->ring.slots[l->ring.ready_fifo[k]]))
                break;
        }
        if (i == l->ring.ready_count) return PF__WAIT;
        s = &l->ring.slots[l->ring.ready_fifo[(l->ring.ready_head + i) % l->ring.nslots]];
        for (; i > 0; i--) /* close the gap, keeping completion order */
            l->ring.ready_fifo[(l->ring.ready_head + i) % l->ring.nslots] = l->ring.ready_fifo[(l->ring.ready_head + i - 1) % l->ring.nslots];
        l->ring.ready_head = (l->ring.ready_head + 1) % l->ring.nslots;
        l->ring.ready_count--;
    }
    l->ring.nready--;
    pf__wake_workers(l, false);
    if (s->result == PF_OK && s->b.sm.skipped) pf__skip_account(l, s);
    if (s->result != PF_OK) {
        int code = s->result;
        pf__set_error(l, code, PF__BY_LOAD, false, s->b.epoch, s->b.batch, "%s", s->msg);
        pf__slot_free(l, s);
        return code;
    }
    l->take.taken++;
    l->take.done++;
    *out = s;
    return PF_OK;
}

/* The taker's next step, a run's loaded batches included (only when
   nothing is published: unordered, the look costs a pass over the
   slots). */
static int pf__take(pf_loader *l, pf__slot **out) {
    int r = pf__take_ready(l, out);
    if (r == PF__WAIT && PF__LOAD_RELAXED(pf__early_news(l))) {
        pf__adopt_early(l);
        r = pf__take_ready(l, out);
    }
    return r;
}

static bool pf__may_load(const pf_loader *l); /* >>backend host */

/* >>autotune -------------------------------------------------------------- */
/* cfg.autotune: workers 0 .. active-1 load, the others park on their own
   condition (created once, up to num_workers: no thread churn). Every
   PF__AT_PERIOD batches (and at least PF__AT_MIN_NS: cheap batches come
   a microsecond apart, and 32 of them measure only noise) the consumer's
   pf_next measures the period that just ended, under the lock: throughput, the share of time it waited for
   loads (waits for a busy GPU do not count), the worker time per batch in
   load and the consumer's own time per batch.
   - Input-bound with cheap loads (under PF__INLINE_MAX_S, host backend):
     pf_next helps (loads when the next batch is not ready), on trial;
     once kept, the workers park on trial; back to the workers alone when
     loads get dearer.
   - The workers keep up with a short step (under PF__ALONE_STEP_S) and
     loads under PF__PARK_TRY_S: the workers park on trial, pf_next alone.
   - Input-bound (waited > 5%): grow towards load time / consumer time per
     batch (the workers needed to keep pace), at most doubling, no
     further than the CPUs can feed, and put the increase on trial: unless
     it gains a quarter of its rise in loaders (at least 5%: gain_need) on
     its first two periods together (twice that on the first alone) while
     the consumer still waited for loads (over 1%), go back and keep that
     as a ceiling (a CPU-bound load on a saturated machine: more workers
     stop helping); after a failure, or a gain under half the rise, trials
     step by a quarter (small_steps) until the load changes. Not while the
     process's CPU time says every core is busy. Where the consumer
     waited behind a late batch with the ring full of later ones (in
     order), or while the workers waited for a slot, slots are what is
     short: the trial, and the count it leaves, get a ring sized by how
     long that lasted (at.behind, pf__at_ring) until the load changes.
   - Compute-bound (waited < 1%) with the active workers idle more than
     half of the time (waiting for a free slot) three periods in a row:
     park down to what their busy share needs, one more, at most half of
     them at a time, and if that
     starves the consumer, the count it grows back to is a floor.
   A ceiling holds while the load time per batch stays within a third of
   what it was when it was set (with loads that sleep, for PF__AT_RETRY
   periods, doubling up to PF__AT_RETRY_MAX with each failure in a row), a
   floor while the consumer's time per batch does: a steady workload
   settles and stays; one that changes (a slow phase, then a fast one) is
   followed. Never more than num_workers, nor than the slot ring can keep
   busy. */
#define PF__AT_PERIOD 32u
#define PF__AT_MIN_NS 20000000u /* and at least 20 ms */
#define PF__AT_RETRY 8u         /* a failed trial's count holds 8 periods (160 ms or more)... */
#define PF__AT_RETRY_MAX 256u   /* ...up to 256 (5 s or more) after failures in a row */
#define PF__AT_CLEAR 1.25       /* a trial's first period this much faster: kept at once */
/* The dearest load pf_next may take on: a batch that gets ready while
   pf_next loads another waits for it, so this bounds that delay; a
   handoff between threads costs 0.3-40 us (a spin, or a sleep and a wake
   on a VM). */
#define PF__INLINE_MAX_S 50e-6
#define PF__INLINE_TIMED 16u /* pf_next times 1 of this many of its loads... */
#ifndef PF__PARK_TRY_S /* tests raise it, as PF__HELP_MAX_NS */
#define PF__PARK_TRY_S 2e-6 /* loads under this, as dear as a handoff: pf_next alone may pay */
#endif
#define PF__INLINE_UNTIMED_NS 2000u /* ...when they take less than this */
#define PF__ALONE_STEP_S 32e-6 /* a consumer's step under this: a handoff's cost may show */

/* CPU loads with pf_next loading a share beside a worker a CPU but one:
   a worker per CPU instead is tried once (until the load changes) */
#define PF__SWAP_TRIAL 1u
#define PF__SWAP_KEPT 2u
#define PF__SWAP_FAILED 3u

/* An increase goes on trial (judged in pf__autotune's probing branch),
   from the period's throughput and load per batch, its rise in loaders
   a ratio less one. A big step must show a big gain: 22 -> 42 workers
   that made 10% more batches (40 sleeping 50 us into 64 KiB slots take
   the same two cores as 22) is memory for nothing, and on a shared
   machine one such trial in three passed on noise. Lock held. */
static void pf__trial_start(pf_loader *l, double thr_base, double load_pb, double rise) {
    l->at.shrunk = false;
    l->at.thr_before = thr_base;
    l->at.load_before = load_pb;
    l->at.before = l->at.active;
    l->at.trial_rise = rise;
    l->at.gain_need = 1 + rise / 4;
    if (l->at.gain_need < 1.05) l->at.gain_need = 1.05;
    l->at.probing = true;
    l->at.probe_stage = 0;
    l->at.behind_was = l->at.behind; /* a failure puts it back (pf__autotune) */
}

static bool pf__drifted(double now, double then) { return now > then * 1.33 || now < then * 0.75; }

/* A verdict (at.cap, small_steps, behind, swap) held while the load
   stays what it was decided at: pf__hold when it is taken; pf__load_moved
   is true once the period's load per batch (now) drifted from it two
   periods in a row, not one noisy one (h->streak counts them, 0 while
   the verdict is not held). */
static void pf__hold(pf__held *h, double load) {
    h->load = load;
    h->streak = 0;
}
static bool pf__load_moved(pf__held *h, bool held, double now) {
    h->streak = held && pf__drifted(now, h->load) ? h->streak + 1 : 0;
    return h->streak >= 2;
}

/* Behind a late batch (pf__autotune): the ring that would have lasted
   the period, 1 / (1 - stuck) times this one (at most 20 times), or, if
   fewer, the one that covers the longest stall (cover: this ring and the
   batches the consumer would have taken in the part of that stall it
   waited, at the pace it kept while not stuck), at least n workers' own
   ring; at most host_slots. Without cover, at least twice n workers'
   ring. The first alone overshoots where many short stalls fill a period:
   1 load in 8 sleeping 5 ms into 4 MiB slots on CUDA (simulated GPU
   (model)) got 26-37 slots at 3-4 workers, where 3 workers with 17 make
   as much, and twice the ring took 1 ms stalls in 4 to 14-18 slots where
   2 workers make as much with 5 (outside trials). */
static uint32_t pf__behind_slots(const pf_loader *l, double stuck, uint32_t n, double cover) {
    double slots = (double)l->ring.nalloc / (1 - (stuck < 0.95 ? stuck : 0.95));
    uint32_t least = (cover > 0 ? 1 : 2) * pf__ring_slots(n, &l->cfg);
    if (cover > 0 && cover < slots) slots = cover;
    return slots < (double)least ? least : slots < (double)l->ring.nslots ? (uint32_t)slots + 1 : l->ring.nslots;
}

/* The consumer is about to wait behind a late batch: in order, with
   autotune, every slot taken and later batches loaded (the take's lock
   held). pf__count_behind adds a wait's d ns of it: to st.wait_behind_ns,
   and to *run, this pf_next's, whose most in the period is at.behind_most
   (the longest stall, pf__behind_slots). Both backends' takes. */
static bool pf__behind_late(const pf_loader *l) {
    return l->cfg.autotune && !l->cfg.unordered && l->at.active && !l->ring.nfree && l->ring.nready;
}
static void pf__count_behind(pf_loader *l, uint64_t d, uint64_t *run) {
    l->st.wait_behind_ns += d;
    *run += d;
    if (*run > l->at.behind_most) l->at.behind_most = *run;
}

/* A ring worth a retry of a trial short of slots: a quarter more, at
   least 2 (no creep a slot at a time, a few periods each) */
static uint32_t pf__more_slots(uint32_t r) { return r + (r / 4 > 2 ? r / 4 : 2); }

/* The ring autotune gives n workers: their default ring, or more where
   batches wait behind a late one (at.behind: in order, a load that stalls
   holds the consumer while the others fill every slot after it, and the
   ring, not the workers, bounds how far they get; pf__autotune). At most
   host_slots. */
static uint32_t pf__at_ring(const pf_loader *l, uint32_t n) {
    uint32_t r = pf__ring_slots(n, &l->cfg);
    if (r < l->at.behind) r = l->at.behind;
    return r > l->ring.nslots ? l->ring.nslots : r;
}

/* A failed trial's slots go back: memory follows what runs down as well
   as up. The newest grown block, when it lies wholly above shrink_to, is
   retired: its free slots leave the free stack, and each slot of it that
   is freed later stays out, so no batch starts in it again. Once every
   slot of it is FREE (none loading, ready, held or copying), a worker
   frees the block outside the lock, one block at a time (`growing`), like
   a growth, and the next block is looked at. A growth asked for meanwhile
   cancels it all: the retired slots rejoin the free stack. Lock held. */
static void pf__shrink_next(pf_loader *l) {
    uint32_t i, k = 0, from;
    l->ring.retire_from = 0;
    if (!l->ring.shrink_to || !l->ring.ngrown) return;
    from = l->ring.grown_from[l->ring.ngrown - 1];
    if (from < l->ring.shrink_to) return;
    l->ring.retire_from = from;
    for (i = 0; i < l->ring.nfree; i++) /* keep the others, in their order */
        if (l->ring.free_stack[i] < from) l->ring.free_stack[k++] = l->ring.free_stack[i];
    l->ring.nfree = k;
    if (pf__shrink_due(l)) pf__wake_shrinker(l); /* all free already: no slot_free will say so */
}

static void pf__shrink_cancel(pf_loader *l) {
    if (l->ring.retire_from) {
        uint32_t i;
        l->at.steady = 0; /* wanted again: kept a while (pf__ring_follow) */
        for (i = l->ring.retire_from; i < l->ring.nalloc; i++)
            if (l->ring.slots[i].state == PF__SLOT_FREE) l->ring.free_stack[l->ring.nfree++] = i;
        pf__wake_workers(l, false);
    }
    l->ring.retire_from = l->ring.shrink_to = 0;
}

static bool pf__shrink_due(const pf_loader *l) {
    uint32_t i;
    if (!l->ring.retire_from || l->ring.growing || l->sync.stopping) return false;
    for (i = l->ring.retire_from; i < l->ring.nalloc; i++)
        if (l->ring.slots[i].state != PF__SLOT_FREE) return false;
    return true;
}

static void pf__shrink(pf_loader *l) {
    uint32_t from = l->ring.retire_from;
    void *block = l->ring.grown[--l->ring.ngrown];
    l->ring.nalloc = l->ring.grow_to = from;
    l->ring.wake_batch = pf__wake_batch(from);
    l->ring.retire_from = 0;
    l->ring.growing = true;
    pf__unlock_wake(l);
    l->ops->shrink_slots(l, block);
    pf__lock(&l->sync.mu);
    l->ring.growing = false;
    pf__shrink_next(l);
    pf__wake_takers(l); /* a caller holding every slot left grows the ring (pf__take_host) */
}

/* Memory follows what runs down, too: once the worker count and the ring
   have held for PF__RING_SETTLE periods and PF__RING_SETTLE_NS with no
   trial on, the grown blocks above what that count needs (its default
   ring, and a slot a worker beyond the most the caller held at once
   lately) go back, newest first, as a failed trial's do. An outside
   trial: 16 MiB batches whose loads slept 10 ms grew the ring to 23 slots
   for 11 workers, then loads turned free and 1 worker did as well, and the
   23 slots (368 MiB) stayed for the rest of the run, against 3 for 1 fixed
   worker. Settled, and by the most held: with the count at the end of one
   period and the caller's holding at that moment, a caller that takes 10
   batches of 64 MiB before releasing them had a block freed and grown
   again every 20-40 ms (0.7x the throughput), and a count flipping
   between 1 and 2 workers freed and grew one every few periods (a second
   outside trial). And by the most workers that ran lately, not the count
   alone: with CPU loads flipping it between 1 and 3 every second or two,
   the ring went 7 -> 3 -> 7 slots of 4 MiB each time, the shrink itself
   (a worker unmapping 16 MiB) making the consumer wait, which grew the
   count again. Both the most workers and the most held are kept for
   PF__RING_PEAK_NS, and then follow what periods end with: the most held
   was once kept from the first period of a settled window until a look
   gave a block back, and a caller that held 20 batches of 1 MiB once,
   then one at a time with pf_next loading alone (nothing else moves the
   window), kept 21 slots for good (an outside trial). Lock held. */
#define PF__RING_SETTLE 8u
#define PF__RING_SETTLE_NS 1000000000u
#define PF__RING_PEAK_NS ((uint64_t)4000000000u)
/* The most of v lately: *most, set at *t, holds for PF__RING_PEAK_NS
   unless v passes it, then follows v. */
static uint32_t pf__lately(uint32_t *most, uint64_t *t, uint32_t v, uint64_t now) {
    if (v >= *most || now - *t > PF__RING_PEAK_NS) {
        *most = v;
        *t = now;
    }
    return *most;
}
static void pf__ring_follow(pf_loader *l, uint64_t now) {
    uint32_t n = pf__lately(&l->at.peak_n, &l->at.peak_t, l->at.active ? l->at.active : 1u, now), want;
    uint32_t held = pf__lately(&l->at.held_peak, &l->at.held_t, l->cons.held_most, now);
    l->cons.held_most = l->cons.held;
    if (l->at.steady++ == 0) l->at.steady_t0 = now; /* a window starts */
    if (l->at.steady < PF__RING_SETTLE || now - l->at.steady_t0 < PF__RING_SETTLE_NS || l->at.probing ||
        l->at.help_trial || l->at.park_trial)
        return;
    /* growing first: the growing worker writes ngrown and grown unlocked */
    if (l->ring.growing || !l->ring.ngrown || l->ring.retire_from || l->ring.grow_to > l->ring.nalloc) return;
    want = pf__at_ring(l, n);
    if (want < held + n + 1) want = held + n + 1;
    if (l->ring.grown_from[l->ring.ngrown - 1] < want) return; /* the newest block is needed */
    l->ring.shrink_to = want;
    if (l->ring.keep_to > want) l->ring.keep_to = want;
    l->at.steady = 0; /* the next look, after as long again */
    pf__shrink_next(l);
}

/* The ring should hold `slots` (at most nslots): grow it (pf__grow). */
static void pf__ring_for(pf_loader *l, uint32_t slots, bool trial) {
    if (slots > l->ring.nslots) slots = l->ring.nslots;
    if (!trial && slots > l->ring.keep_to) l->ring.keep_to = slots;
    pf__shrink_cancel(l); /* wanted again: whatever a failed trial left stays */
    if (!l->ring.grow_failed && slots > l->ring.grow_to && slots > l->ring.nalloc) l->ring.grow_to = slots;
}

/* The ring while an increase to n workers is on trial: b + n + 1 (see
   above), one more where pf_next loads a loader's share (a slot to load
   into too), or where the full ring for n takes PF__TRIAL_FULL_BYTES or
   less, that: a trial far above b, with b + n + 1 slots, fails for want of
   them, and a few MiB is no memory to save. 10 -> 22 workers of 55 us
   sleeps and 64 KiB batches had 33 slots, ran at 44k batches/s against
   74k, and was undone; 22 fixed workers run at 46-50k with 33 slots and
   105-134k with their 45. 1 -> 2 workers of 1 ms sleeps into 4 MiB slots,
   pf_next loading half the batches, had 4 slots and made 2-3% more than
   1 (2 fixed workers: 15% more with 5), failing every trial (outside
   trials). */
#define PF__TRIAL_FULL_BYTES ((uint64_t)8 << 20)
static uint32_t pf__trial_slots(const pf_loader *l, uint32_t n) {
    uint32_t part = l->at.active + n + 1 + (l->at.caller_loads ? 1u : 0u), full = pf__at_ring(l, n);
    if (part > full || l->at.behind) part = full; /* behind a late batch, slots are what the trial is for */
    return part < full && (uint64_t)full * pf__align_up(l->cfg.batch_bytes) <= PF__TRIAL_FULL_BYTES ? full : part;
}

static void pf__set_active(pf_loader *l, uint32_t n, const char *why, double waited, double thr) {
    char count[48];
    if (n == l->at.active) pf__format(count, sizeof count, "%u worker%s stay", (unsigned)n, n == 1 ? "" : "s");
    else pf__format(count, sizeof count, "%u -> %u workers", (unsigned)l->at.active, (unsigned)n);
    pf__format(l->at.msg, sizeof l->at.msg, "autotune: %s: %s (waited %.0f%% of the last %llu batches, "
               "%.0f batches/s)", count, why, waited * 100, (unsigned long long)(l->st.batches - l->at.batches_prev),
               thr);
    if (n > l->at.active) pf__wake(l, PF__ROLE_PARKED); /* they claim again */
    if (n > l->at.active) pf__ring_for(l, pf__trial_slots(l, n), true); /* on trial: see pf__grow */
    l->at.active = n;
    l->at.changes++;
    l->at.steady = 0;
    l->at.last_change_batch = l->st.batches;
    l->at.inline_est = 0; /* pf_next's next load is timed afresh */
}

/* A measuring period starts now: the counters it is measured against. */
static void pf__at_period_start(pf_loader *l, uint64_t now, uint64_t waits) {
    l->at.batches_prev = l->at.batches0;
    l->at.t0 = now;
    l->at.batches0 = l->st.batches;
    l->at.wait0 = waits;
    l->at.load0 = l->st.load_ns;
    l->at.wwait0 = l->st.worker_wait_ns;
    l->at.call0 = l->st.call_ns;
    l->at.cpu0 = pf__cpu_ns();
    l->at.next0 = l->st.next_loads;
    l->at.behind0 = l->st.wait_behind_ns;
    l->at.input0 = l->st.wait_input_ns;
    l->at.behind_most = 0;
}


/* Memory follows what runs: with autotune the ring holds what the active
   workers need, not what the ceiling would, and grows when they do, by one
   block of the slots it lacks: while an increase from b to n workers is
   on trial, the ring of the b (2b + 1) and a slot to load into for each
   new one (b + n + 1: in order, a late batch holds back the ready ones,
   and a trial without that slack fails for want of slots; the full ring
   where it is small, pf__trial_slots); once it is kept, the default ring
   for n (pf__ring_slots; more behind a late batch, pf__at_ring). A
   trial that fails so costs fewer slots. A worker allocates it (and
   touches it: page faults cost milliseconds here), outside the lock, one at
   a time (`growing`), so the consumer never pays for it; the new slots join
   the free stack and the workers are told. A failed trial's block goes
   back once every slot in it is free (pf__shrink), and so do the blocks a
   count that came down and settled no longer needs (pf__ring_follow). If
   the allocation fails the ring stays as it is, autotune keeps within
   what it can keep busy, and growth is tried again after PF__AT_RETRY
   periods (doubling up to PF__AT_RETRY_MAX). Lock held on entry and
   return. */
static bool pf__grow_due(const pf_loader *l) { return l->ring.grow_to > l->ring.nalloc && !l->ring.growing && !l->sync.stopping; }

static uint32_t pf__grow_whole(const pf_loader *l, uint32_t from, uint32_t to); /* >>backend host */

/* A backoff after another failure in a row: first, then twice the last,
   up to most */
static uint32_t pf__backoff(uint32_t last, uint32_t first, uint32_t most) {
    return !last ? first : last >= most / 2 ? most : 2 * last;
}

static void pf__grow(pf_loader *l) {
    uint32_t from = l->ring.nalloc, to = l->ring.grow_to;
    bool ok;
    if (l->ring.keep_to > from && l->ring.keep_to < to) to = l->ring.keep_to; /* a trial's block stands apart */
    /* a kept count's block in whole huge pages; a trial's as asked: a slot
       more for it was 7 slots against 2 fixed workers' 5 at the trial's
       peak (1.4x; 6 is 1.2x), in the bench's CPU-bound profile */
    if (to <= l->ring.keep_to) to = pf__grow_whole(l, from, to);
    if (to > l->ring.grow_to) l->ring.grow_to = to;
    l->ring.growing = true;
    pf__unlock_wake(l);
    ok = l->ops->grow_slots(l, from, to);
    pf__lock(&l->sync.mu);
    l->ring.growing = false;
    if (!ok) {
        l->ring.grow_failed = true;
        l->ring.grow_to = l->ring.nalloc;
        l->at.grow_backoff = pf__backoff(l->at.grow_backoff, PF__AT_RETRY, PF__AT_RETRY_MAX);
        l->at.grow_wait = l->at.grow_backoff;
    } else {
        uint32_t i;
        l->at.grow_backoff = 0;
        l->ring.grown_from[l->ring.ngrown - 1] = from;
        for (i = from; i < to; i++) l->ring.free_stack[l->ring.nfree++] = i;
        l->ring.nalloc = to;
        l->ring.wake_batch = pf__wake_batch(to);
        l->at.steady = 0; /* grown: wanted now, kept a while (pf__ring_follow) */
        pf__wake_all_workers(l);
        if (l->ring.shrink_to) pf__shrink_next(l); /* its trial failed meanwhile */
    }
    pf__wake_takers(l); /* a pf_next that waited for this growth (no worker may wake it) */
    if (!ok) {
        /* said at WARN the first time (throughput is held back by memory),
           and tried again after PF__AT_RETRY periods, twice as many after
           each failure in a row (pf__autotune): pinned memory another
           process held may come back, and one failed cudaHostAlloc left
           an outside trial's ring at 3 slots for good, 0.4-0.5 of what it
           made once it could grow */
        uint32_t wait = l->at.grow_wait;
        pf__unlock_wake(l);
        pf__log(&l->cfg, wait == PF__AT_RETRY ? PF_LOG_WARN : PF_LOG_INFO,
                "autotune: could not allocate %u more slots of %llu bytes; the ring stays at %u (tried again in %u "
                "periods)", (unsigned)(to - from), (unsigned long long)l->stride, (unsigned)from, (unsigned)wait);
        pf__lock(&l->sync.mu);
    }
}

static void pf__wait_flush(pf_loader *l, uint64_t now); /* >>consumer */

/* pf_next loaded a loader's share of `batches` beside `active` workers:
   half a worker's or more (autotune's periods, the CPU cap's windows) */
static bool pf__next_loads_a_share(uint64_t next, uint64_t batches, uint32_t active) {
    return batches && next * 2 * ((uint64_t)active + 1) >= batches;
}

/* a smoothed figure: over some 4 readings (*avg < 0: none yet) */
static void pf__smooth4(double *avg, double v) { *avg = *avg >= 0 ? *avg * 0.75 + v * 0.25 : v; }

/* pf_next loading did not pay: not again until the loads change
   (inline_load, measured on trial), and not before twice as many periods
   as last time have passed (a noisy load looks changed every so often;
   each trial costs a few periods) */
static void pf__help_failed(pf_loader *l) {
    l->at.inline_failed = true;
    l->at.inline_backoff = pf__backoff(l->at.inline_backoff, 4, 256);
    l->at.inline_wait = l->at.inline_backoff;
    l->at.help = false;
}

/* pf_next alone is tried from 1 worker beside it, never from more: a
   trial is judged against the period before it, and alone beating 16
   workers says nothing of 1. After 1 ms sleep loads (16 workers), 64 KiB
   memcpy loads went 16 -> 0 and stayed there at 630k batches/s, where 1
   worker beside pf_next makes 700k-990k (an outside trial; a fresh start
   tries alone from 1 and goes back to it). From more, the count goes to
   1 with pf_next loading, and alone is tried from there (at.help, the
   next period, judged against this load: call_pb). true: done for this
   period. */
static bool pf__alone_from_one(pf_loader *l, double call_pb, double waited, double thr) {
    if (l->at.active <= 1) return false;
    l->at.help = true;
    l->at.inline_load = call_pb;
    l->at.help_trial = l->at.park_trial = l->at.park_quiet = l->at.park_last = l->at.park_failed = false;
    pf__set_active(l, 1, "loads are cheap: 1 worker beside pf_next, pf_next alone tried from there", waited, thr);
    return true;
}

/* pf_next alone, with no handoff, may be faster than the workers that
   keep up (only a trial tells): a load costs under half of the consumer's
   time per batch, handoffs included; or loads cost about what a handoff
   does and the consumer's step is short (with a worker beside it, a load
   looks dearer than it is, so the first test alone missed 4 KiB copies
   now and then: an outside trial saw 1 run in 35 stay at 1 worker, 0.54
   of the others). */
static bool pf__as_dear_as_a_handoff(double call_pb, double step_pb) {
    return call_pb < PF__PARK_TRY_S && step_pb < PF__ALONE_STEP_S;
}
static bool pf__alone_may_pay(double call_pb, double step_pb) {
    return 2 * call_pb < step_pb || pf__as_dear_as_a_handoff(call_pb, step_pb);
}

/* A trial of pf_next loading (help, or alone from the workers alone) may
   start: where pf_next may load, with no increase of workers on trial,
   the backoff passed, and not the loads a trial last failed with. */
static bool pf__inline_may_try(const pf_loader *l, double call_pb) {
    return pf__may_load(l) && !l->at.probing && !l->at.inline_wait &&
           !(l->at.inline_failed && !pf__drifted(call_pb, l->at.inline_load));
}
/* ...and starts, judged against this period's throughput */
static void pf__inline_try(pf_loader *l, double call_pb, double thr) {
    l->at.inline_failed = false;
    l->at.inline_load = call_pb;
    l->at.thr_before = thr;
    l->at.before = l->at.active;
}

static uint32_t pf__cap_n(pf_loader *l); /* >>workers */
static void pf__autotune(pf_loader *l) {
    uint64_t now, waits, db = l->st.batches - l->at.batches0;
    uint32_t ring = l->ring.grow_failed ? l->ring.nalloc : l->ring.nslots; /* what the ring can grow to */
    uint32_t limit = l->cfg.num_workers < ring ? l->cfg.num_workers : (ring > 1 ? ring - 1 : 1), hi;
    double dt, thr, thr_base, waited, waited_in, load_pb, step_pb, idle, call_pb, busy, eff, behind, behind_t, stuck, cover;
    uint64_t cpu0 = l->at.cpu0, next_n = l->st.next_loads - l->at.next0;
    bool saturated, alike;
    uint32_t loaders;
    if (l->at.t0 && db < PF__AT_PERIOD) return;
    /* cheap batches: 32 of them are noise. The period's time is judged by
       the clock pf_next last read (this call's, or a load of pf_next's at
       most PF__INLINE_TIMED ago): a read here for each batch until 20 ms
       are up cost as much as a 4 KiB batch */
    if (l->at.t0 && (l->st.last_ns <= l->at.t0 || l->st.last_ns - l->at.t0 < PF__AT_MIN_NS)) return;
    now = pf__now_ns();
    pf__wait_flush(l, now);
    waits = l->st.wait_input_ns + l->st.wait_copy_ns;
    if (!l->at.t0) { /* the first period starts with the first batch */
        pf__at_period_start(l, now, waits);
        /* and leaves out the batches loaded before it: taken at once, they
           would make one worker look faster than it can be */
        l->at.batches0 += l->ring.nready;
        l->at.cap = limit;
        return;
    }
    dt = pf__sec(now - l->at.t0);
    if (dt <= 0) return;
    thr = (double)db / dt;
    waited = pf__sec(waits - l->at.wait0) / dt;
    waited_in = pf__sec(l->st.wait_input_ns - l->at.input0) / dt; /* for input alone, not behind copies */
    load_pb = pf__sec(l->st.load_ns - l->at.load0) / (double)db;
    /* an increase is judged against the better of this period and the one
       before it at the same count: a slow period (the machine shared) is
       no baseline. CPU-bound 1 ms loads on 2 cores, one period read 1421
       batches/s where 2 workers make 1950, and a third worker passed its
       trial on it (1 run in 20): 3 workers, 8 slots where 2 need 5. Nor is
       a period of other loads, or twice as fast: 64 KiB memcpy loads
       (706k batches/s) then 1 ms sleeps judged the 1 -> 4 trial of the
       sleeps (4582 against 1690 before it) against the memcpy period,
       undid it, and 1 worker ran the sleeps at 1841 batches/s where 16
       make 13k (an outside trial, 3 runs in 20) */
    alike = l->at.last_n == l->at.active && !pf__drifted(load_pb, l->at.load_last) && l->at.thr_last < 2 * thr;
    thr_base = alike && l->at.thr_last > thr ? l->at.thr_last : thr;
    l->at.thr_last = thr;
    l->at.last_n = l->at.active;
    l->at.load_last = load_pb;
    call_pb = pf__sec(l->st.call_ns - l->at.call0) / (double)db;
    step_pb = (dt - pf__sec(waits - l->at.wait0)) / (double)db;
    idle = l->at.active ? pf__sec(l->st.worker_wait_ns - l->at.wwait0) / (dt * l->at.active) : 0;
    behind_t = pf__sec(l->st.wait_behind_ns - l->at.behind0) / dt;
    behind = waits > l->at.wait0 ? (double)(l->st.wait_behind_ns - l->at.behind0) / (double)(waits - l->at.wait0) : 0;
    /* slots, not workers, were short (behind a late batch, below): the
       share of the period they were */
    stuck = behind > 0.5 || (waited_in > 0.5 && idle > 0.5) ? (behind_t > idle ? behind_t : idle) : 0;
    cover = l->at.behind_most ? l->ring.nalloc + pf__sec(l->at.behind_most) * (double)db / (dt * (1 - (behind_t < 0.95 ? behind_t : 0.95))) : 0;
    pf__at_period_start(l, now, waits);
    pf__ring_follow(l, now);
    /* every core busy (the process's CPU time, all its threads): more
       workers cannot make loads faster, only take turns on the cores */
    busy = cpu0 && l->at.cpu0 ? pf__sec(l->at.cpu0 - cpu0) / dt : 0;
    saturated = busy >= 0.9 * (double)l->sync.ncpu || busy >= (double)l->sync.ncpu - 0.5; /* no half a core free */
    /* the load changed (pf__load_moved): the verdicts taken on it go */
    if (pf__load_moved(&l->at.cap_held, l->at.cap < limit, load_pb))
        l->at.cap = limit, l->at.cap_backoff = 0;
    /* a ceiling set while the loads never slept, never tried again, goes
       once they sleep: 1 load in 8 sleeping 5 ms among 1 MiB copies had
       its first 8 asked loads all copies, failed a trial of 2 workers on
       that verdict, and ran on 1 worker for good (0.22 of 16 fixed, 1 run
       in 8), the cap long lifted */
    if (l->at.cap < limit && l->at.cap_cpu && !l->ring.capped) l->at.cap = limit, l->at.cap_cpu = false;
    if (pf__load_moved(&l->at.steps_held, l->at.small_steps, load_pb)) l->at.small_steps = false;
    if (pf__load_moved(&l->at.behind_held, l->at.behind && !l->at.probing, load_pb))
        l->at.behind = 0; /* pf__ring_follow gives the slots back once settled */
    if (pf__load_moved(&l->at.swap_held, l->at.swap && l->at.swap != PF__SWAP_TRIAL, load_pb))
        l->at.swap = 0;
    if (l->at.cap < limit && l->at.cap_wait && --l->at.cap_wait == 0) l->at.cap = limit; /* tried again */
    if (l->ring.grow_failed && l->at.grow_wait && --l->at.grow_wait == 0) l->ring.grow_failed = false; /* (pf__grow) */
    if (l->at.floor > 1 && pf__drifted(step_pb, l->at.floor_step)) l->at.floor = 1;  /* the step changed */
    /* a period in which the consumer hardly waited (a pause in the loop,
       an evaluation) judges no trial of pf_next loading: it stays on
       trial (a trial of help, four such periods at most) */
    /* park_quiet: the consumer did not wait before either; park_last: with
       the workers parked the waits are pf_next's own loads, none when they
       cost nothing next to the step, and a trial that waits for a wait
       would stay on for good, the worker rules skipped */
    if (l->at.park_trial && !l->at.park_quiet && !l->at.park_last && waited <= 0.01) return;
    if (l->at.help_trial && waited <= 0.01) {
        /* pf_next found every batch ready: nothing to judge. Four such
           periods in a row (the workers keep the ring full, or a long
           pause): help ends with no verdict, and the worker rules, which
           help skips, take over again (it comes back when the consumer
           waits); else a full ring kept it on trial for good, with every
           worker running */
        if (++l->at.help_quiet < 4) return;
        l->at.help_trial = false;
        if (l->at.active && !l->at.park_failed && pf__alone_may_pay(call_pb, step_pb)) {
            /* the consumer never waited, yet a load costs under half
               of what it spends on a batch, handoffs included: pf_next
               loading every batch, with no handoff, may be faster (with
               runs of cheap batches, pf_next finds one ready, or
               publishes a loaded one itself, nearly every time, so
               help alone had nothing to do) */
            if (pf__alone_from_one(l, call_pb, waited, thr)) return;
            l->at.thr_before = thr;
            l->at.before = l->at.active;
            l->at.park_trial = l->at.park_quiet = true;
            pf__set_active(l, 0, "the workers keep up, loads are cheap: pf_next loads every batch", waited, thr);
            return;
        }
        l->at.help = false;
        l->at.inline_wait = 8; /* not straight back: a consumer on the edge flaps */
        pf__set_active(l, l->at.active, "the workers keep up: pf_next stops loading", waited, thr);
        return;
    }
    l->at.help_quiet = 0;
    if (l->at.help_trial) { /* pf_next loading on trial */
        l->at.help_trial = false;
        l->at.inline_load = call_pb; /* as measured with pf_next loading too */
        if (thr < l->at.thr_before * 1.05 && l->at.before && call_pb < PF__PARK_TRY_S) {
            /* loading beside the workers did not pay, yet loads cost
               about what a handoff between threads does: pf_next alone,
               with no handoff, may go faster. Only a trial tells: with a
               worker beside it, every load looks dearer than it is (the
               lines it writes and the lock go from core to core). 4 KiB
               memcpy loads on the 2-core VM: 0.89 us a batch with a
               worker, pf_next helping or not, its loads timed at 0.6 us;
               0.26-0.33 with pf_next alone. A failure ends help, as this
               trial's would have. */
            if (pf__alone_from_one(l, call_pb, waited, thr)) return;
            if (thr > l->at.thr_before) l->at.thr_before = thr; /* the better of the two */
            l->at.park_trial = l->at.park_last = true;
            l->at.park_quiet = false;
            pf__set_active(l, 0, "loading beside the workers did not help, loads are cheap: pf_next loads every batch",
                           waited, thr);
        } else if (thr < l->at.thr_before * 1.05) {
            pf__help_failed(l);
            pf__set_active(l, l->at.before, "loading in pf_next did not help", waited, thr);
        }
        return;
    }
    if (l->at.help) {
        if (l->at.park_trial) { /* pf_next alone, on trial */
            l->at.park_trial = false;
            if (thr < l->at.thr_before * 1.05) {
                l->at.park_failed = true;
                if (l->at.park_last) pf__help_failed(l);
                else if (l->at.park_quiet) { /* the workers kept up: help ends, as it would have */
                    l->at.help = false;
                    l->at.inline_wait = 8;
                }
                pf__set_active(l, l->at.before, "pf_next alone was not faster", waited, thr);
            }
            l->at.park_quiet = l->at.park_last = false;
            return;
        }
        if (call_pb > 2 * l->at.inline_load || call_pb >= PF__INLINE_MAX_S) { /* back to the workers alone */
            l->at.help = l->at.park_failed = false;
            pf__set_active(l, l->at.active ? l->at.active : 1, "loads got dearer", waited, thr);
        } else if (l->at.active && !l->at.park_failed && alike) {
            /* loads this cheap may go faster with no handoff at all: the
               workers park and pf_next loads every batch; kept only if 5%
               faster (once: until help ends). From a period alike the one
               before it: the first at 1 worker after 16 -> 1 ran at 478k
               batches/s where 1 worker makes 0.94-0.99M, and alone
               (622-689k) passed on it (an outside trial, 4 runs in 6) */
            if (pf__alone_from_one(l, call_pb, waited, thr)) return;
            l->at.thr_before = thr_base;
            l->at.before = l->at.active;
            l->at.park_trial = true;
            pf__set_active(l, 0, "pf_next loads every batch", waited, thr);
        }
        return;
    }
    if (l->at.inline_wait) l->at.inline_wait--;
    /* Input-bound with cheap loads (under PF__INLINE_MAX_S: a load pf_next
       starts delays a batch that gets ready meanwhile by at most that):
       pf_next tries loading when the next batch is not ready, instead of
       sleeping (the workers go on beside it; with a single CPU there are
       none, it loads every batch). That pays twice: no handoff for the
       batches it loads, and a thread that waited loads too. Kept only if
       5% faster, and tried again after a failure only once the load has
       changed and the backoff has passed. Where pf_next may load at all
       (pf__may_load): the host backend; not with per-thread setup
       (worker_init/stop, on_worker_start: loads would run where it never
       ran), cfg.timeout_ms (a load inside pf_next is not bounded by it) or
       cfg.workers_only (the trial ignored it, and a load that waits for
       the caller's next step hung, found by an outside trial). */
    if (waited > 0.05 && call_pb < PF__INLINE_MAX_S && pf__inline_may_try(l, call_pb)) {
        pf__inline_try(l, call_pb, thr);
        l->at.help = l->at.help_trial = true;
        l->at.help_quiet = 0;
        pf__set_active(l, l->sync.ncpu > 1 ? l->at.active : 0, "loads cheaper than a handoff: pf_next loads too",
                       waited, thr);
        return;
    }
    /* The workers keep up, the consumer's step is short, and a load costs
       about what a handoff does: pf_next alone, with no handoff, may be
       faster, and only a trial tells (with a worker beside it every load
       looks dearer than it is). Before, only a help trial led there, and it
       starts when the consumer waits: a consumer whose workers hand batches
       over faster than it takes them hardly waits, and 4 KiB memcpy loads on the
       2-core VM ran 200-300 ms at 1 worker's 0.9 us a batch before a noisy
       period started it (in 3 runs of 6 at 400k batches: 0.68-1.00 us a
       batch over the run, 0.29-0.32 once there). A failure backs off as a
       help trial's does. */
    if (l->at.active && waited <= 0.05 && pf__as_dear_as_a_handoff(call_pb, step_pb) && pf__inline_may_try(l, call_pb)) {
        if (pf__alone_from_one(l, call_pb, waited, thr)) return;
        pf__inline_try(l, call_pb, thr);
        l->at.help = l->at.park_trial = l->at.park_last = true; /* judged next period, failed as a help trial */
        l->at.help_trial = l->at.park_quiet = l->at.park_failed = false;
        pf__set_active(l, 0, "the workers keep up with a short step, loads are cheap: pf_next loads every batch",
                       waited, thr);
        return;
    }
    if (l->at.probing) {
        /* not 5% better while the consumer still waited for loads: more
           workers did not help. A consumer that no longer waits is what
           the increase was for, whatever its throughput says (a step that
           ran long, a stalled period on a shared machine). A trial's
           first period runs while its workers start and the ring grows:
           one that does not pass is judged again on the next (an outside
           trial's 0.5 ms sleep + 0.5 ms CPU loads: 4 -> 8 undone on 52
           batches, 2598 against 2595 batches/s, and never tried again:
           0.85-0.88x of 8 fixed workers). Only a clear gain
           (PF__AT_CLEAR) passes on the first period or the second alone;
           the third judges its batches and the second's over their time,
           not one period: a period's figure swings by a fifth on a shared
           machine, and a trial kept on whichever period read 5% high took
           50 us sleeps into 64 KiB slots to 43-56 workers and 93-129
           slots, where 32 workers (65 slots) run fastest and 48 are 10%
           slower (an outside trial, ceiling 64). Not the first's: its
           ramp ran 10-40% under the count's pace, and 200 us CPU loads
           under a 20 us sleeping step failed 1 -> 2 workers on it in 10
           runs of 25 (a 1.20-1.24 gain on the first two periods, 1.35 at
           2 workers; 0.72-0.78 of them for good: an outside trial). The
           gain asked grows with the step (gain_need): a quarter of the
           loaders' rise, at least 5% */
        bool failed;
        double gain = thr;
        uint32_t more; /* slots for a retry short of them (below) */
        if (l->at.probe_stage < 2) {
            double clear = 1 + 2 * (l->at.gain_need - 1);
            failed = thr < l->at.thr_before * (clear > PF__AT_CLEAR ? clear : PF__AT_CLEAR) && waited > 0.01;
            if (failed) {
                l->at.probe_n = l->at.probe_stage ? db : 0; /* the second period's, not the ramp's */
                l->at.probe_s = l->at.probe_stage ? dt : 0;
                l->at.probe_stage++;
                return;
            }
        } else {
            gain = (double)(db + l->at.probe_n) / (dt + l->at.probe_s);
            failed = gain < l->at.thr_before * l->at.gain_need && waited > 0.01;
        }
        gain = l->at.thr_before > 0 ? gain / l->at.thr_before - 1 : 1;
        /* a failure, or a gain under half the rise (the loads stop
           scaling): the next trials step by a quarter, not doubling, so a
           trial lands at most a quarter past the best count (its ring is
           memory too: 50 us sleeps into 64 KiB slots, best at 32, tried
           22 -> 46 and peaked at 93-111 slots, 1.4-1.7x of 32's 65). Not
           by one: at 28 workers one more is 3.6%, under what a trial must
           gain, and 1 ms sleeps that 64 workers run twice as fast stayed
           at 28-56 for good (an outside trial, 5 runs in 27) */
        /* A trial that waited behind a late batch over half its wait
           (or over half its time, its workers waiting for a slot half of
           theirs) failed for want of slots, not workers, where the ring
           that covers it (pf__behind_slots) is a quarter larger than the
           one it had (pf__more_slots): it is tried again with that ring
           (at.behind), and sets no ceiling (each time with a larger ring,
           up to host_slots). Not with every core busy: a late batch may
           be one whose worker the scheduler took off its core (CPU loads
           with stalls, past the CPUs, took 129 slots for nothing: an
           outside trial). From one worker, or with pf_next loading,
           nothing waits behind a late batch before a trial shows it: on
           CUDA (pf_next does not load), 1 load in 8 sleeping 5 ms, the
           rest free, into 4 MiB slots, tried 1 -> 2 with 4 slots, failed,
           and stayed at 1-2 for good: 1.1k batches/s where 8 fixed make
           2.9k with 17 (an outside trial) */
        more = failed && stuck > 0 && !saturated && l->at.swap != PF__SWAP_TRIAL
                   ? pf__behind_slots(l, stuck, l->at.active, cover) : 0;
        if (more && more >= pf__more_slots(pf__at_ring(l, l->at.active))) {
            l->at.probing = false;
            l->at.behind = more;
            pf__hold(&l->at.behind_held, load_pb);
            pf__set_active(l, l->at.before, "more workers waited behind a late batch: more slots", waited, thr);
            return;
        }
        l->at.small_steps = failed || (waited > 0.01 && gain < 0.5 * l->at.trial_rise);
        pf__hold(&l->at.steps_held, l->at.load_before);
        if (l->at.swap == PF__SWAP_TRIAL) l->at.swap = failed ? PF__SWAP_FAILED : PF__SWAP_KEPT;
        /* judged on its second period: the one before was the trial's
           first, no baseline for what follows in this one (a worker past
           the CPUs was tried on it, 59 ms after a worker per CPU was
           kept, and kept on a contended period: an outside trial) */
        if (l->at.probe_stage) alike = false, thr_base = thr;
        l->at.probing = false;
        if (failed) {
            l->at.cap = l->at.before;
            pf__hold(&l->at.cap_held, l->at.load_before); /* measured at that count: more workers stretch it */
            /* with loads that sleep, tried again after PF__AT_RETRY
               periods, twice as many after each failure in a row: a trial
               judged on two periods of 20 ms fails on noise or on its new
               block's page faults now and then, and the count stayed for
               the whole phase (8 of 16 workers of 300 us sleeps and 1 MiB
               copies at 0.6-0.7 of 16, 1 run in 5: an outside trial).
               Never past the CPUs with loads that never sleep (each
               retry's block would show in the memory a run peaks at) */
            l->at.cap_backoff = l->ring.capped ? 0 : pf__backoff(l->at.cap_backoff, PF__AT_RETRY, PF__AT_RETRY_MAX);
            l->at.cap_cpu = l->ring.capped;
            l->at.cap_wait = l->at.cap_backoff;
            /* and the slots the trial added go back (pf__shrink) */
            if (l->ring.grow_to > l->ring.nalloc && !l->ring.growing) l->ring.grow_to = l->ring.nalloc;
            l->at.behind = l->at.behind_was;
            l->ring.shrink_to = pf__at_ring(l, l->at.before);
            if (!l->ring.growing) pf__shrink_next(l); /* else pf__grow looks once it is done */
            pf__set_active(l, l->at.before, "more workers did not help", waited, thr);
            return;
        }
        pf__ring_for(l, pf__at_ring(l, l->at.active), false); /* kept: the full ring */
        l->at.cap_backoff = 0;
    }
    /* pf_next loading beside the workers (pf__may_help: dear loads when
       the batch it waits for is further off than a load) is a loader too,
       where it made at least half a loader's share of the period's
       batches: a trial adds workers beyond it. Else one worker more only
       takes over pf_next's loads: I/O-like 2 ms loads of 1 MiB ran 1
       worker + pf_next at 903 batches/s, 2 workers at 906, the trial
       failed, and the count stayed at 1 for good (8 outside runs in 14;
       16 workers make 7030) */
    loaders = l->at.active;
    if (!l->at.help && pf__next_loads_a_share(next_n, db, l->at.active)) loaders++;
    l->at.caller_loads = loaders > l->at.active;
    /* the loaders, pf_next by its share in workers (at most one): what a
       trial's rise is of. 200 us CPU loads under a sleeping step ran 1
       worker + pf_next loading a quarter of the batches; 1 -> 2 counted
       as doubling asked 25% more, 2 workers made 30-35% more, and the
       trial failed on noise in 2 runs of 20, once its ramp was left
       out (an outside trial) */
    eff = l->at.active;
    if (!l->at.help && l->at.active && db > next_n) {
        double share = (double)next_n * l->at.active / (double)(db - next_n);
        eff += share < 1 ? share : 1;
    }
    if (eff < 1) eff = 1;
    hi = limit < l->at.cap ? limit : l->at.cap;
    if (l->ring.capped) { /* loads never sleep: no more loading at once than CPUs (pf__cap_n) */
        uint32_t n = pf__cap_n(l), m = l->sync.ncpu > 1 ? l->sync.ncpu - 1 : 1;
        /* a pf_next that loaded (as measured, whatever the cap's guesses
           from the loads' cost and the caller's CPU time say) takes a CPU.
           1 ms CPU loads on 2 cores went 1 -> 3 workers beside it (7 slots
           where 2 need 5); 100 us ones after dear ones ran 3 workers and
           pf_next, 4 loads at once; 120 us ones kept 2 workers beside a
           pf_next loading 27% of the batches, its caller's CPU time in
           the busy rule's hysteresis (outside trials) */
        bool swap = l->at.swap == PF__SWAP_TRIAL || l->at.swap == PF__SWAP_KEPT;
        if (loaders > l->at.active && n > m) n = swap ? l->sync.ncpu : m;
        if (n < hi) hi = n; /* at least 1: pf__cap_n never says 0 */
        if (l->at.active > hi) {
            l->at.probing = false;
            pf__set_active(l, hi, "loads never sleep: no more workers than CPUs", waited, thr);
            return;
        }
        /* ...but where pf_next loads only while it waits for the next
           batch (a share, not a loader's whole time), a worker per CPU
           may do better, and only a trial tells: 1 ms CPU loads with a
           100 us step ran 1 worker + pf_next at 1440 batches/s (pf_next
           loading a third, the process at 1.5 of 2 cores) where 2
           workers make 1960, in 1 bench run of 2; never tried, as hi
           was 1 and every core counted busy. Also where the process
           left over a quarter of a core idle, whatever pf_next waited:
           200 us CPU loads under a 20 us sleeping step ran 1 worker +
           pf_next (a quarter of the batches, the process at 1.48 of 2
           cores) at 0.72-0.78 of 2 workers for good (an outside trial).
           Not for loads under half pf_next's limit (100 us, as
           PF__TAKER_HOLD_NS: tests raise the limit): 20 us ones into 1
           MiB slots went to 2 workers at 0.6-0.7 of 1 on it.
           Kept if 5% faster, else not tried again until the load
           changes; not where a trial of as many workers failed (at.cap) */
        if (loaders > l->at.active && !l->at.swap && !l->at.probing && l->at.active == m && m < l->sync.ncpu &&
            l->sync.ncpu <= limit && l->sync.ncpu <= l->at.cap &&
            (waited > 0.5 || (busy > 0 && busy < l->sync.ncpu - 0.25 && call_pb >= 0.5e-9 * PF__TAKER_HOLD_NS)) && alike) {
            l->at.swap = PF__SWAP_TRIAL;
            pf__hold(&l->at.swap_held, load_pb);
            pf__trial_start(l, thr_base, load_pb, 0); /* as many loaders, one a worker */
            pf__set_active(l, l->sync.ncpu, "pf_next loads a share of CPU loads while it waits: a worker per CPU instead",
                           waited, thr);
            return;
        }
    }
    if (waited > 0.05 && l->at.active < hi && !saturated) {
        double need = step_pb > 1e-9 ? load_pb / step_pb : (double)hi;
        uint32_t want = need > (double)hi ? hi : (uint32_t)need + 1;
        if (want > 2 * loaders) want = 2 * loaders;
        if (want <= loaders) want = loaders + 1;
        if (want > hi) want = hi;
        /* by a quarter after a failure or a small gain (small_steps),
           at least one */
        if (l->at.small_steps && want > loaders + (loaders + 3) / 4) want = loaders + (loaders + 3) / 4;
        /* no further than the CPUs can feed: the period's batches took
           `busy` cores, so all of them make at most ncpu / busy times as
           many, and as many times the loaders make them. The same loads
           went 22 -> 46 on the loads' time over the step (1 in 3 such
           jumps passed on noise: 46 was 7% faster than 22 that run), where
           the CPUs ran out at about 30 */
        if (busy > 0) {
            double room = (double)loaders * (double)l->sync.ncpu / busy;
            if ((double)want > room + 1) want = room + 1 > (double)(loaders + 1) ? (uint32_t)room + 1 : loaders + 1;
        }
        /* past the CPUs with loads that never sleep, only from a period
           alike the one before it (at this count, of the same loads), not
           a trial's first: a trial's first period
           runs while its new workers start, and the next trial passed on
           it. 1 ms CPU loads on 2 cores went 2 -> 3 workers on a 2-worker
           trial's 1299 batches/s (2 workers make 1950) in 2 runs of 22;
           none of 60 since */
        if (l->ring.capped && want > l->sync.ncpu && !alike) {
            l->at.idle_streak = 0;
            return;
        }
        if (l->at.shrunk) { /* fewer starved the consumer: not below this */
            l->at.floor = want;
            l->at.floor_step = step_pb;
        }
        pf__trial_start(l, thr_base, load_pb, want > eff ? (double)want / eff - 1 : 0);
        /* Behind a late batch: over half the consumer's wait was for a
           batch still loading while every slot was taken, later batches
           loaded (in order), or it waited over half the period while the
           workers waited for a slot over half of theirs (pf_next itself
           in such a load). For input: behind copies (CUDA) the workers
           wait for a slot too, and more slots only pin more memory (an
           outside trial saw 3 workers of 4 MiB batches go from 5 slots
           to 129, 516 MiB pinned, for nothing). The ring bounds how far
           the workers get past such a stall, whatever their count: they
           filled it in the part of the period not spent stuck, so the
           trial gets the ring that would have lasted the period, or the
           one that covers the longest stall where that is fewer
           (pf__behind_slots), and keeps it if kept, until the load changes. 1
           load in 8 sleeping 5 ms among 1 MiB copies: 4 fixed workers make
           2.7k batches/s with their 9 slots, 4.5k with 18; 8 make 4.5k
           with 17, 7.3k with 33; 1 in 32 sleeping 10 ms: 1-8 workers 2.9k
           with their rings, 16 with 33 slots 5.1k. Autotune failed every
           trial from 1 worker (7 slots for 4; then twice the ring, 14 for
           3, 6-8% more; then 10 times 3, 31 slots, short of the 32 batches
           from one stall to the next) and stayed there (outside trials) */
        if (stuck > 0) {
            l->at.behind = pf__behind_slots(l, stuck, want, cover);
            pf__hold(&l->at.behind_held, load_pb);
        }
        pf__set_active(l, want, l->at.behind > l->at.behind_was ? "input-bound, behind a late batch: more slots" : "input-bound",
                       waited, thr);
    } else if (waited < 0.01 && idle > 0.5 && l->at.active > 1 && l->at.active > l->at.floor) {
        /* down to what the busy share needs, one more for slack, at most
           halving (as growth at most doubles), not below the floor: one
           at a time, 16 workers left idle by loads that turned cheap
           (workers_only, where pf_next alone is not an answer) took 2.4 s
           to get to 8, at 0.26-0.36 of 1 worker (an outside trial) */
        uint32_t want = (uint32_t)((double)l->at.active * (idle < 1 ? 1 - idle : 0)) + 2; /* idle over 1: clock skew */
        if (++l->at.idle_streak < 3) return; /* three periods in a row, not one noisy one */
        if (want < (l->at.active + 1) / 2) want = (l->at.active + 1) / 2;
        if (want < l->at.floor) want = l->at.floor;
        if (want >= l->at.active) want = l->at.active - 1;
        l->at.idle_streak = 0;
        l->at.shrunk = true;
        pf__set_active(l, want, "compute-bound, workers idle", waited, thr);
        return;
    }
    l->at.idle_streak = 0;
}

/* >>workers --------------------------------------------------------------- */
/* More loaders than cores (pf_next is one where it may load), and loads
   that never sleep (all CPU: a decode, a read from the page cache): only
   as many workers as cores load at a time (one fewer while the caller
   keeps a CPU busy, one more where pf_next does not load: pf__cap_n), the
   others park
   (as autotune parks them) until loads sleep again
   (a disk, a network). More would only take turns on the cores, and in
   order the next batch waits for a worker the scheduler took off its core
   while the others fill the ring: 4 workers reading shuffled records from
   the page cache on the 2-core VM ran at 0.79-0.87 of 4 threads of plain
   preads, 2 at 0.92-0.93 of 2. Decided on the loads' own word (they slept
   or not, pf__sleeps), smoothed over 16 and with hysteresis: capped under
   1 in 32 loads asked sleeping, lifted over 1 in 4 (a read from the page
   cache here slept once in 2000; an outside trial's load sleeping 1 in 50
   flapped 100 times a second when one sleep in 8 lifted it). Not with
   autotune, which counts its own workers. Lock held. */
#define PF__CAP_ASK_NS 2000u   /* asking costs four system calls, 2 us in all here: */
#define PF__CAP_EVERY 8u       /* 1 load in 8 is asked, of 1 in 10 times the  */
#define PF__CAP_DEAR_NS ((uint64_t)10 * PF__CAP_EVERY * PF__CAP_ASK_NS) /* asking or more; cheaper, rarer */
#define PF__CAP_SAMPLES 8u     /* loads asked before the first verdict     */
/* How many may load at once: a worker a CPU where pf_next loads too (the
   caller is the one more loader that fills a core while a worker waits
   for the lock, a slot or the scheduler), else one more than CPUs. On the
   2-core VM, 8 workers of 50 us CPU loads with pf_next loading: 30.4-30.6k
   batches/s uncapped, 36.2-38.6k at 2, 35.0-37.4k at 3; 256 KiB preads
   from the page cache 5.2-8.2 GB/s, 17.8-18.5 at 2, 13.3-14.9 at 3. With
   worker_init set (pf_next never loads) and 200 us loads: 9.4-9.6k, 8.7-
   8.8k at 2 (a worker's wait left a core idle), 9.5-9.8k at 3. Whether
   pf_next loads turns on the loads' cost (PF__HELP_MAX_NS), itself
   stretched by the cap (loads sharing a core take longer by the clock),
   so this turns to one more at the limit but back only under half of it,
   and only after PF__CAP_SAMPLES asked loads in a row say so (cap_plus,
   cap_flip): loads near the limit flipped 2 and 3 workers a hundred
   times a second in an outside trial, each time waking the parked ones,
   2.8% slower than no cap. Where pf_next loads and the caller's thread
   keeps a CPU busy (pf__cap_caller: it loads in pf_next, or its step
   computes), it is a loader too: a worker a CPU but one. On the 2-core
   VM, 4 workers with pf_next, three runs each: shuffled 4 KiB records
   0.84-0.95 of 4 threads of plain preads -> 0.97-1.02, in order
   0.90-1.03 -> 0.95-0.99, llm.c token windows 0.76-0.80 -> 0.83-0.85
   (reader_bench); 50 us CPU loads under a
   30 us computing step 21.4k -> 23.5k batches/s (2 workers: 20.3k ->
   23.6k, 5 us loads alone 281k -> 314k). A caller whose step sleeps (a
   GPU sync) leaves its core to the workers: 180 us loads under such a
   step ran at 9.6k with 2 loading, 7.0k with 1. The one more only where
   the ring holds PF__CAP_PLUS_SLOTS a loader: with fewer, the ring runs
   full behind a worker the scheduler took off its core. 200 us CPU loads
   into 1 MiB slots under a 20 us sleeping step, fixed 8 workers (17
   slots): 7.6-8.4k batches/s with the one more, 9.1k without; 13 and 25
   slots alike, 33 even; 3 workers (7 slots) 7.0-7.2k -> 8.6-8.7k, with a
   100 us sleeping step 3.5k -> 5.7k (1 worker: 5.0k; an outside trial).
   Where it pays, the small rings of small batches (32-64 slots: workers
   only, no step, 8-byte batches, 8 workers: 33.1k -> 38.4k batches/s
   with it), it stays. With autotune, by the ring of that count: 1 ms CPU
   loads into 1 MiB slots tried 2 -> 3 workers (7 slots) past the CPUs, and
   failed (make bench). Lock held. */
#define PF__CAP_PLUS_SLOTS 10u
static uint32_t pf__cap_n(pf_loader *l) {
    uint32_t n, ring;
    uint64_t limit = l->ring.cap_plus ? PF__HELP_MAX_NS / 2 : PF__HELP_MAX_NS;
    bool plus = !(pf__may_load(l) && l->ring.load_est < limit);
    if (plus == l->ring.cap_plus) l->ring.cap_flip = 0;
    else if (++l->ring.cap_flip >= PF__CAP_SAMPLES) l->ring.cap_plus = plus, l->ring.cap_flip = 0;
    /* both at once: a busy caller takes the CPU the one more was for (a
       fixed 4 workers ran 3 beside pf_next loading 100 us CPU loads on 2
       cores, 4 loads at once: an outside trial) */
    n = l->sync.ncpu;
    /* with autotune, the ring that count of workers runs with */
    ring = l->cfg.autotune ? pf__ring_slots(n + 1, &l->cfg) : l->ring.nslots;
    if (l->ring.cap_plus && ring >= PF__CAP_PLUS_SLOTS * (n + 1)) n++;
    if (l->ring.cap_busy && n > 1) n--;
    /* pf_next loads a loader's share as measured, whatever the guesses
       above say (pf__cap_caller): a CPU is its own */
    if (l->ring.cap_loads && l->sync.ncpu > 1 && n > l->sync.ncpu - 1) n = l->sync.ncpu - 1;
    return n;
}
/* Where the cap can matter: more loaders than CPUs, pf_next one of them
   where it may load. Found once, at pf_create (workers read it without
   the lock). */
static bool pf__cap_may(const pf_loader *l) { return l->sync.cap_may; }
/* With autotune the loads are asked too, and the verdict (ring.capped)
   bounds the count autotune may grow to (pf__autotune): on the 2-core VM
   with another process busy on one core, the process's CPU time said a
   core was free, trials passed on the noise, and 50 us CPU loads ran on 4-8
   workers at 0.79-0.80 of 1 fixed worker (an outside trial). */
static void pf__cap_init(pf_loader *l) {
    bool more = l->cfg.num_workers + (pf__may_load(l) ? 1u : 0u) > l->sync.ncpu;
    l->sync.cap_may = !l->cfg.autotune && more;
    l->sync.cap_ask = more;
}
/* Does the caller keep a CPU busy? Its thread's CPU time over the clock,
   every 64 batches over a window of at least PF__CAP_CALLER_NS (two clock
   reads, a few hundred ns), smoothed over 4 windows: busy over 0.6, no
   longer under 0.4. Another process taking turns on the cores lowers it,
   as it should: the caller then keeps less than a CPU busy (an outside
   trial's busy loop beside a computing caller flapped it between 1 and 2
   workers window by window before the smoothing). A window begun on
   another thread (several call pf_next) is started afresh. pf_next's
   frame calls it, lock held.
   And does pf_next load a loader's share (half a worker's, as autotune
   counts it)? Then it takes a CPU (cap_loads), whatever the guesses by
   the loads' cost and the caller's CPU time say: a fixed 2 workers of 200
   us CPU loads into 1 MiB slots (5) on 2 cores ran beside a pf_next
   loading a third of the batches, its thread at half a CPU (in the busy
   rule's hysteresis), at 0.78 of 1 worker; 3 at 0.58 (the ring ran full
   behind a worker the scheduler took off its core). Not where that
   leaves a core idle (the process's CPU time over the clock, smoothed,
   under the CPUs less a half, from the second window on): a caller whose
   step sleeps (a GPU sync) leaves its core to a worker (1 worker + pf_next
   under a 20 us sleeping step ran at 0.75 of 2 workers, with autotune).
   Then it does not come back for 4 windows, twice as many each time
   after (up to 256): pf_next may load a share at one count and leave a
   core idle at the next. */
#define PF__CAP_CALLER_NS 5000000u
static void pf__cap_caller(pf_loader *l) {
    uint64_t now, cpu, pcpu;
    bool same = l->ring.caller == &pf__thread_tag;
    if (l->st.batches % 64) return;
    now = pf__now_ns();
    if (same && now - l->ring.caller_t0 < PF__CAP_CALLER_NS) return;
    cpu = PF__THREAD_CPU_NS();
    if (cpu == UINT64_MAX) return; /* unknown: the cap counts workers alone */
    pcpu = PF__PROC_CPU_NS();
    if (same && cpu >= l->ring.caller_cpu0) {
        double share = (double)(cpu - l->ring.caller_cpu0) / (double)(now - l->ring.caller_t0);
        pf__smooth4(&l->ring.caller_share, share);
        l->ring.cap_busy = l->ring.cap_busy ? l->ring.caller_share > 0.4 : l->ring.caller_share > 0.6;
        uint64_t db = l->st.batches - l->ring.caller_b0, dn = l->st.next_loads - l->ring.caller_nl0;
        /* cppcheck-suppress knownConditionTrueFalse ; 0 only where the process's CPU clock is unknown */
        if (pcpu && l->ring.caller_pcpu0 && pcpu >= l->ring.caller_pcpu0)
            pf__smooth4(&l->ring.proc_busy, (double)(pcpu - l->ring.caller_pcpu0) / (double)(now - l->ring.caller_t0));
        if (l->ring.loads_hold) l->ring.loads_hold--;
        if (!l->ring.cap_loads && !l->ring.loads_hold && pf__next_loads_a_share(dn, db, l->at.active)) {
            l->ring.cap_loads = true;
            l->ring.loads_age = 0;
            l->ring.proc_busy = -1; /* measured afresh at the new count */
        } else if (l->ring.cap_loads && ++l->ring.loads_age >= 2 && l->ring.proc_busy >= 0 &&
                   l->ring.proc_busy < (double)l->sync.ncpu - 0.5) {
            l->ring.cap_loads = false;
            l->ring.loads_back = pf__backoff(l->ring.loads_back, 4, 256);
            l->ring.loads_hold = l->ring.loads_back;
        }
    }
    l->ring.caller = &pf__thread_tag;
    l->ring.caller_t0 = now;
    l->ring.caller_cpu0 = cpu;
    l->ring.caller_pcpu0 = pcpu;
    l->ring.caller_b0 = l->st.batches;
    l->ring.caller_nl0 = l->st.next_loads;
}
/* This loader's next load is asked (where it can matter: more workers
   than cores, none set by autotune): 1 in 8 loads of 160 us or more, so
   the asking costs under 1/80 of the loads; cheaper ones as rarely as
   keeps it so (a 4 us load, 1 in 400); none under 2 us. A worker's first
   PF__CAP_SAMPLES are all asked, so that the verdict comes in a few loads,
   not hundreds (even where one worker makes them all, as one can in its
   time slice): at 1 in 400, 4 workers of llm.c token windows (3-5 us
   loads) ran uncapped through most of reader_bench's run. pf_next's
   loads are asked too (its record's est_ns is set by pf__load_inline):
   1 load in 8 sleeping 5 ms among 1 MiB copies, pf_next took every
   sleeping one (the next batch, while the worker waited for a slot), the
   worker's asked loads were all copies, the verdict said the loads never
   sleep, and autotune stayed at 1 worker, 0.20 of 16 fixed, in 2 runs of
   3 (an outside trial). */
static bool pf__cap_ask(const pf_loader *l, pf__worker *w) {
    uint64_t every;
    uint32_t n;
    if (!l->sync.cap_ask || w->est_ns < PF__CAP_ASK_NS) return false;
    every = w->est_ns >= PF__CAP_DEAR_NS ? PF__CAP_EVERY : (uint64_t)PF__CAP_EVERY * PF__CAP_DEAR_NS / w->est_ns;
    n = w->nloads++;
    return n < PF__CAP_SAMPLES || n % every == 0;
}
/* The verdict goes by the loads that slept and by the time they slept:
   1 load in 8 sleeping 5 ms (a page-cache miss) among 1 MiB copies is
   off the CPU 9/10 of its time, yet by the count alone it flapped (a
   share of 1 in 8 smoothed over 16 loads passed under 1 in 32 now and
   then, and rarely over 1 in 4): autotune went 15 -> 1 worker at 0.24-
   0.35x of 16 fixed ones (an outside trial). Capped only where under 1 in
   32 loads slept and they slept under 1/8 of their time (CPU time and
   sleep); lifted where over 1 in 4 slept or they slept over a third of
   it. The times are smoothed over some 128 asked loads, so one long
   sleep counts for many short copies: over 32, 1 load in 20 sleeping 10
   ms among 500 us CPU loads was capped and lifted 12-21 times in 10 s,
   whenever 46 asked loads in a row had not slept. Loads that turned all
   CPU are capped sooner by the gap since the last sleep. */
static void pf__cpu_cap(pf_loader *l, const pf__slot *s) {
    uint32_t share = l->ring.slept_share, n = pf__cap_n(l);
    bool never, sleeps;
    share = share - share / 16 + (s->slept > 0 ? 1024u / 16 : 0);
    l->ring.slept_share = share;
    l->ring.on_cpu_ns = l->ring.on_cpu_ns - l->ring.on_cpu_ns / 128 + s->on_cpu_ns;
    l->ring.off_cpu_ns = l->ring.off_cpu_ns - l->ring.off_cpu_ns / 128 + s->off_cpu_ns;
    if (s->slept > 0) {
        /* the first gap seeds it whole: from 0, the gaps after the first
           sleeps read as 1/16 of themselves, and 1 load in 32 sleeping 10
           ms at random was capped 6 ms after the first verdict lifted, on
           a gap of 70 asked loads after one of 70 (an outside trial) */
        PF__STORE_RELAXED(&l->ring.sleep_est, l->ring.sleep_est - l->ring.sleep_est / 8 + s->off_cpu_ns / 8);
        l->ring.gap16 = l->ring.gap16 ? l->ring.gap16 - l->ring.gap16 / 16 + l->ring.awake_run : 16 * l->ring.awake_run;
        l->ring.awake_run = 0;
    } else if (l->ring.awake_run < UINT32_MAX / 16) {
        l->ring.awake_run++;
    }
    /* all CPU: 1/8 of the time asleep at most, or no sleep for 16 times
       the usual gap between sleeps (and 16 loads): loads that turned all
       CPU are capped in some 16 asked loads, not the hundreds the time's
       smoothing takes */
    never = share < 1024u / 32 && (7 * l->ring.off_cpu_ns <= l->ring.on_cpu_ns ||
                                   (l->ring.awake_run >= 2 * PF__CAP_SAMPLES && l->ring.awake_run >= l->ring.gap16));
    sleeps = share > 1024u / 4 || 2 * l->ring.off_cpu_ns > l->ring.on_cpu_ns; /* over 1/3 asleep */
    if (n > l->cfg.num_workers) n = l->cfg.num_workers;
    if (l->ring.cap_samples < PF__CAP_SAMPLES) l->ring.cap_samples++;
    if (l->cfg.autotune) { /* the verdict alone: autotune counts its workers */
        if (l->ring.cap_samples >= PF__CAP_SAMPLES && never) l->ring.capped = true;
        else if (sleeps) l->ring.capped = false;
        return;
    }
    if (!l->ring.capped && l->ring.cap_samples >= PF__CAP_SAMPLES && never) {
        l->ring.capped = true;
        l->at.active = n; /* the rest park at their next claim */
        if (n < l->cfg.num_workers)
            pf__format(l->at.msg, sizeof l->at.msg, "workers: loads never sleep and %u CPUs: %u of %u workers load at a time",
                       (unsigned)l->sync.ncpu, (unsigned)n, (unsigned)l->cfg.num_workers);
    } else if (l->ring.capped && !sleeps && n != l->at.active) { /* pf_next or the caller changed */
        if (n > l->at.active) pf__wake(l, PF__ROLE_PARKED);
        l->at.active = n;
    } else if (l->ring.capped && sleeps) {
        l->ring.capped = false;
        l->at.active = l->cfg.num_workers;
        pf__wake(l, PF__ROLE_PARKED);
        pf__format(l->at.msg, sizeof l->at.msg, "workers: loads sleep again: all %u workers load",
                   (unsigned)l->cfg.num_workers);
    }
}

/* A load's time asleep as the cap counts it (see pf__worker_load): up to
   4 of the loader's loads (est, smoothed), or of the loads' sleeps as
   counted (ring.sleep_est), or PF__CAP_OFF_MIN_NS, whichever is most. A
   rare long sleep among cheap loads finds est at the cheap ones': 1 load
   in 32 sleeping 10 ms among 1 MiB copies (40 us) counted 160 us a
   sleep, the loads read as all CPU whenever a window of asked loads held
   few sleeps, and the cap flipped 4-9 times in 3 s with 64 fixed workers
   and took autotune from 31 workers to 1 (an outside trial; the loads
   were asleep 3/4 of their time). A late wake (a short sleep on a busy
   machine, PF__CAP_OFF_MIN_NS and 4 of its kind at most) moves
   sleep_est by an eighth of that. */
#define PF__CAP_OFF_MIN_NS 2000000u
static uint64_t pf__off_cpu_counted(const pf_loader *l, uint64_t off, uint64_t est) {
    uint64_t most = 4 * est, usual = 4 * PF__LOAD_RELAXED(&l->ring.sleep_est);
    if (most < usual) most = usual;
    if (most < PF__CAP_OFF_MIN_NS) most = PF__CAP_OFF_MIN_NS;
    return est && off > most ? most : off;
}

/* Claimed slot s's sample count (lock not held) */
static uint32_t pf__batch_count(const pf_loader *l, const pf__slot *s) {
    uint64_t first = s->b.batch * l->cfg.batch_size, left = s->plan->per_rank - first;
    return (uint32_t)(left < l->cfg.batch_size ? left : l->cfg.batch_size);
}
/* Claimed slot s's sample indices and rng (lock not held). */
static void pf__index_batch(pf_loader *l, pf__slot *s) {
    const pf__plan *p = s->plan; /* alive: the taker has not passed batch s */
    uint64_t first = s->b.batch * l->cfg.batch_size;
    PF_ASSERT(p->epoch == s->b.epoch); /* planned before it was claimed: never NULL */
    s->b.count = pf__batch_count(l, s);
    if (!pf__plan_indices(p, &l->cfg, first, s->b.count, s->b.indices))
        for (uint32_t i = 0; i < s->b.count; i++) s->b.indices[i] = pf__plan_index(p, &l->cfg, first + i);
    s->b.rng = pf__job_rng(p, s->b.batch);
    s->indexed = true;
}
/* A run's indices, all before its first load. A shuffled index is a chain
   of some 16 dependent multiplies (pf__perm_apply), and a load's copy
   waits for it: computed one per load, 1-sample batches of cheap loads
   paid that chain between every two copies, and the copies no longer
   overlapped. The run's chains are independent of each other: with
   1-sample batches a plan's run walks them side by side
   (pf__perm_apply_many), as a larger batch does its own. Shuffled
   4 KiB batches loaded by pf_next alone on the 2-core VM: see
   bench/README.md (2026-11-24, thirteenth session); pf_next alone now
   loads those one at a time (PF__ALONE_RUN_BYTES), as fast. */
static void pf__index_run(pf_loader *l, pf__slot *const *run, uint32_t nrun) {
    uint64_t v[PF__RUN_MAX];
    uint32_t k, m, n;
    if (nrun < 2) return; /* a single load computes its own (pf__fill_job) */
    if (l->cfg.batch_size > 1 || !pf__sample_shuffle(&l->cfg)) {
        for (k = 0; k < nrun; k++)
            if (!run[k]->indexed) pf__index_batch(l, run[k]);
        return;
    }
    for (k = 0; k < nrun; k = m) { /* a run may cross into the next epoch: a plan at a time */
        const pf__plan *p = run[k]->plan;
        for (m = k, n = 0; m < nrun && run[m]->plan == p; m++)
            if (!run[m]->indexed) v[n++] = pf__plan_pos(p, &l->cfg, run[m]->b.batch);
        pf__perm_apply_many(&p->perm, v, n);
        for (m = k, n = 0; m < nrun && run[m]->plan == p; m++) {
            pf__slot *s = run[m];
            if (s->indexed) continue;
            PF_ASSERT(p->epoch == s->b.epoch && pf__batch_count(l, s) == 1);
            s->b.count = 1;
            s->b.indices[0] = v[n++];
            s->b.rng = pf__job_rng(p, s->b.batch);
            s->indexed = true;
        }
    }
}

static void pf__fill_job(pf_loader *l, pf__slot *s, pf__worker *w, pf_job *job) {
    if (!s->indexed) pf__index_batch(l, s);
    memset(job, 0, sizeof *job);
    job->epoch = s->b.epoch;
    job->batch = s->b.batch;
    job->indices = s->b.indices;
    job->count = s->b.count;
    job->worker = w->id;
    job->host = s->data;
    job->capacity = l->cfg.batch_bytes;
    job->bytes = l->cfg.batch_bytes;
    job->rng = s->b.rng;
    job->pf__worker = w;
    pf__job_begin(l, s, w, job);
}


/* No user code before pf_create has everything: a create that fails after
   starting some threads must not have run callbacks. false: it failed. */
static bool pf__worker_gate(pf_loader *l) {
    bool go;
    pf__lock(&l->sync.mu);
    while (!l->sync.started && !l->sync.stopping) pf__wait(l, PF__ROLE_WORKER, NULL);
    go = l->sync.started;
    pf__unlock(&l->sync.mu);
    return go;
}

/* In order nothing after a failed batch is delivered (pf__publish stops
   the claims), so a run loads nothing after it either: the loader that
   saw it fail says so at once, without the lock, and every run looks
   before each load. Runs of 32 went on loading batches after it (an
   outside trial saw the load callback run for 1-13 of them after pf_next
   had returned the failure). Unordered, the batches before and after it
   are all delivered until it is taken: left as they were. */
static void pf__note_failure(pf_loader *l, const pf__slot *s) {
#if PF__SPIN_OK
    uint64_t seen = PF__LOAD_RELAXED(&l->sync.fail_seq);
    if (l->cfg.unordered) return;
    while (s->seq < seen && !PF__CAS_SC(&l->sync.fail_seq, &seen, s->seq)) {
    }
#else
    (void)l, (void)s;
#endif
}
static bool pf__after_failure(pf_loader *l, const pf__slot *s) {
#if PF__SPIN_OK
    return s->seq > PF__LOAD_RELAXED(&l->sync.fail_seq);
#else
    (void)l, (void)s;
    return false;
#endif
}

/* A run's batch that is not loaded (an earlier one failed, the loader
   stopped): it carries code and says why, as a failed load would. */
static void pf__not_loaded(pf__slot *s, int code, const char *why) {
    pf__format(s->msg, PF__MSG_SIZE, "epoch %llu batch %llu was not loaded: %s", (unsigned long long)s->b.epoch,
               (unsigned long long)s->b.batch, why);
    s->result = code;
    s->call_ns = 0;
}

/* Run cfg.load for claimed slot s, unlocked, and judge what it did: a
   failure or an overflowing job->bytes becomes the slot's result and
   message. start: the clock just before (0: read it here; a clock read
   costs some 30 ns on a VM, a tenth of a cheap batch). est: not 0, the
   load is not timed and takes est (pf__load_inline, pf__run_untimed).
   Returns the clock at its end. */
static uint64_t pf__worker_load(pf_loader *l, pf__worker *w, pf__slot *s, uint64_t start, uint64_t est) {
    pf_job job;
    int rc;
    long sleeps;
    uint64_t now, cpu0 = 0, asked_t0 = 0, delay0 = UINT64_MAX;
    pf__worker_up(l, w);
    pf__fill_job(l, s, w, &job);
    w->msg[0] = '\0';
    w->failed = false;
    PF__RANGE_PUSH("load epoch %llu batch %llu", (unsigned long long)s->b.epoch, (unsigned long long)s->b.batch);
    sleeps = pf__cap_ask(l, w) ? pf__sleeps() : -1; /* did this load sleep? (pf__cpu_cap) */
    if (sleeps >= 0) { /* and for how long: start and est may be a run's estimates */
        cpu0 = pf__thread_cpu_ns();
        delay0 = pf__run_delay_ns(w);
        asked_t0 = pf__now_ns();
    }
    now = start ? start : pf__now_ns();
    rc = l->cfg.load(l->cfg.user, &job);
    if (w->failed && rc == 0) rc = -1; /* pf_job_fail said so: the batch failed, whatever load returned */
    if (rc != 0) pf__note_failure(l, s); /* before the clock: the other runs look at once */
    s->call_ns = est ? est : pf__now_ns() - now;
    s->slept = -1;
    if (sleeps >= 0) {
        long after = pf__sleeps();
        uint64_t took = pf__now_ns() - asked_t0, cpu1 = pf__thread_cpu_ns(), delay1 = pf__run_delay_ns(w);
        /* cppcheck-suppress knownConditionTrueFalse ; -1 only where getrusage cannot say */
        if (after >= 0 && cpu0 != UINT64_MAX && cpu1 != UINT64_MAX && cpu1 >= cpu0) {
            s->slept = (signed char)(after > sleeps ? 1 : 0);
            /* its CPU time, and where it slept, the rest of its time (the
               CPU time's microseconds are noise under that) less its time
               runnable but waiting for a CPU: on a busy machine a 300 us
               sleep among 200 us CPU loads woke 10 ms late now and then,
               and such a wait is for a core, not a disk. Where that time
               is unknown, up to what pf__off_cpu_counted allows (a 0.1 ms
               sleep among 50 us loads, woken late beside a busy loop,
               counted 2 ms by its floor, and the cap lifted 1-5 times in
               6 s: an outside trial). Not the load's time on the clock:
               CPU loads sharing the cores take longer by it, and the share
               of time asleep went down as more workers loaded and up as
               fewer did (1 load in 20 sleeping 10 ms among 500 us CPU
               loads, 16 workers: capped and lifted 4-22 times in 10 s, an
               outside trial) */
            uint64_t off = s->slept && took > cpu1 - cpu0 ? took - (cpu1 - cpu0) : 0;
            s->on_cpu_ns = cpu1 - cpu0;
            if (delay0 != UINT64_MAX && delay1 != UINT64_MAX && delay1 >= delay0)
                s->off_cpu_ns = off > delay1 - delay0 ? off - (delay1 - delay0) : 0;
            else
                s->off_cpu_ns = pf__off_cpu_counted(l, off, w->est_ns);
        }
    }
    now += s->call_ns;
    PF__RANGE_POP();
    if (rc != 0) {
        pf__format(s->msg, PF__MSG_SIZE, "load failed for epoch %llu batch %llu (%s): %s",
                   (unsigned long long)s->b.epoch, (unsigned long long)s->b.batch, w->name,
                   !w->failed ? "the callback returned non-zero without pf_job_fail"
                   : w->msg[0] ? w->msg : "(pf_job_fail with an empty message)");
        s->result = PF_ERR_LOAD;
    } else if (job.bytes > job.capacity) {
        pf__format(s->msg, PF__MSG_SIZE,
                   "load for epoch %llu batch %llu (%s) set job->bytes = %llu, more than "
                   "the slot capacity of %llu bytes (cfg.batch_bytes)",
                   (unsigned long long)s->b.epoch, (unsigned long long)s->b.batch, w->name,
                   (unsigned long long)job.bytes, (unsigned long long)job.capacity);
        s->result = PF_ERR_LOAD;
        pf__note_failure(l, s);
    } else {
        pf__job_end(l, s, w, &job);
    }
    s->b.bytes = job.bytes;
    if (s->result != PF_OK && !PF__LOAD_FLAG(&l->sync.stopping)) pf__log(&l->cfg, PF_LOG_ERROR, "%s", s->msg);
    return now;
}

/* Slot s loaded, ending at `end`: its time into the stats (from the claim:
   index computation counts as loading), then published. Lock held. */
static void pf__loaded(pf_loader *l, pf__slot *s, uint64_t end) {
    l->st.load_ns += end - s->started_ns;
    l->st.call_ns += s->call_ns;
    l->ring.load_est = l->ring.load_est ? l->ring.load_est - l->ring.load_est / 8 + s->call_ns / 8 : s->call_ns + 1;
    if (s->slept >= 0) pf__cpu_cap(l, s);
    pf__publish(l, s, end);
}

/* A worker claims a run of batches at once when its loads are cheap:
   loads under PF__RUN_LOAD_NS come in runs of up to PF__RUN_MAX, loaded
   one after the other and published together, so the lock (which the
   consumer takes for every batch) is taken once per run, not once per
   batch. Measured on this project's 2-core VM, a contended lock costs
   0.3-0.5 us there, more than a 4 KiB load. A run takes at most its share
   of the free slots (the other active workers, and pf_next where it may
   load, need theirs), and no batch waits behind a slower load of its run:
   each is marked as soon as it is loaded (pf__mark_early). Runs of up to
   32, not 8: cheap 4 KiB loads with 1 worker and 64 slots went from 0.75
   to 0.60 us a batch on the 2-core VM (16: 0.66), 16 KiB from 1.15 to
   0.96-1.04. Lock held. */
#define PF__RUN_LOAD_NS 2000u
/* pf_next loading alone (no worker active) takes the lock uncontended,
   and a single load goes to the slot the caller just released, still in
   its cache; a run's copies go to a slot each, out of the L1 cache with
   the source streaming beside them. 4 KiB batches in order, pf_next
   alone on the 2-core VM, alternated: runs of up to 32 0.36-0.58 us a
   batch, one at a time 0.19-0.24 (autotune 0.34-0.48 -> 0.20-0.29; the
   inline loop 0.14-0.15); 256-byte batches 0.10-0.15 either way, shuffled
   4 KiB 0.84-0.89 either way. A run of PF__ALONE_RUN_BYTES at most: one
   4 KiB batch, 16 of 256 bytes. */
#define PF__ALONE_RUN_BYTES 4096u
static uint32_t pf__run_len(const pf_loader *l, uint64_t est, bool by_caller) {
    uint32_t share, loaders;
    if (!est || est >= PF__RUN_LOAD_NS) return 1;
    /* the active workers share the slots, and pf_next where it may load
       (or where it is the one loading) */
    loaders = by_caller ? l->at.active + 1u : (l->at.active ? l->at.active : 1u) + (pf__may_load(l) ? 1u : 0u);
    /* a worker asks with its first slot claimed (+ 1), pf_next before its
       claim (it counted its own slot in: one free slot asked for a run of
       two, timed as a run, two clock reads every load where 1 load in 16
       reads two) */
    share = (l->ring.nfree + !by_caller) / loaders;
    /* pf_next loading alone: PF__ALONE_RUN_BYTES (above) */
    if (by_caller && !l->at.active && share > l->alone_run) share = l->alone_run;
    return share < 1 ? 1 : share > PF__RUN_MAX ? PF__RUN_MAX : share;
}

/* Slot s of a run is loaded (lock not held): mark it for the taker
   (pf__adopt_early), and if a taker sleeps, publish it now. */
static void pf__mark_early(pf_loader *l, pf__slot *s, uint64_t start, uint64_t end) {
#if PF__SPIN_OK
    s->run_start = start;
    s->run_end = end;
    if (l->cfg.unordered) {
        PF__STORE_FLAG(&s->early, 1u);
        PF__ADD_SC(&l->ring.early, 1u);
    } else {
        PF__STORE_SC(&s->early, 1u);
    }
    if (PF__LOAD_SC(&l->ring.taker_sleepers)) {
        pf__lock(&l->sync.mu);
        pf__adopt_early(l);
        pf__unlock_wake(l);
    }
#else
    (void)l, (void)s, (void)start, (void)end; /* never called: runs need atomics (pf__run_len) */
#endif
}

/* A load of a worker's run is timed (0) or takes the worker's smoothed
   load time (w->est_ns): the run's first load, every PF__RUN_TIMED-th and
   its last are timed (a clock read before and after), and only they move
   the estimate. A clock read waits for the copy before it to finish,
   where the next copy's misses would have started under its tail.
   Shuffled 4 KiB
   batches on the 2-core VM, 1 worker, 6 runs each alternated, a busy
   stretch: workers_only 0.92-1.24 -> 0.70-0.89 us a batch, with pf_next
   loading too 0.87-0.91 -> 0.82-0.85 (a lean loop, the load called with
   nothing around it, 0.60-0.81). Runs are of loads under
   PF__RUN_LOAD_NS, so an untimed load's figures are off by less than
   that, until a timed one. */
#define PF__RUN_TIMED 8u
static uint64_t pf__run_untimed(const pf__worker *w, uint32_t k, uint32_t nrun) {
    return k == 0 || k + 1 == nrun || k % PF__RUN_TIMED == PF__RUN_TIMED - 1 ? 0 : w->est_ns;
}

/* A worker: claim, load, publish, until the claims are done; parked while
   autotune does not want it; growing the ring when autotune asks. */
static PF__THREAD_FN pf__worker_main(void *arg) {
    pf__worker *w = (pf__worker *)arg;
    pf_loader *l = w->owner;
    uint64_t now, est, starts[PF__RUN_MAX], ends[PF__RUN_MAX], seqs[PF__RUN_MAX];
    pf__slot *run[PF__RUN_MAX];
    uint32_t nrun, k;
    bool open;
    int prev; /* the result of the run's last load */
    if (l->ops->bind_thread) l->ops->bind_thread(l); /* a load that calls CUDA uses the loader's GPU */
    if (!pf__worker_gate(l)) PF__THREAD_RETURN;
    if (l->sync.cap_ask && w->id < PF__SCHED_KEPT) pf__sched_keep(w); /* the CPU cap asks its loads */
    if (l->cfg.on_worker_start) l->cfg.on_worker_start(l->cfg.user, w->id);
    /* One clock read per batch: the end of a load is the start of the next
       claim (or the wakeup after a wait). */
    now = pf__now_ns();
    pf__lock(&l->sync.mu);
    for (;;) {
        pf__slot *s = NULL;
        int claim;
        if (l->ring.retire_from) pf__take_released(l); /* a block going back waits for them */
        if (pf__grow_due(l)) { /* autotune added workers: their slots first (>>autotune) */
            pf__grow(l);
            now = pf__now_ns();
        } else if (pf__shrink_due(l)) { /* a failed trial's slots go back */
            pf__shrink(l);
            now = pf__now_ns();
        }
        claim = pf__claim(l, w, now, &s, true);
        if (claim != PF__CLAIM_OK && l->ring.taker_held) pf__wake_takers(l); /* it waited for this worker's next */
        if (claim == PF__CLAIM_DONE) break;
        if (claim == PF__CLAIM_PARKED) { /* until autotune (or the CPU cap) wants this worker again */
            /* The wake that brought it here may have been meant for a
               worker that claims: one free slot wakes one waiting worker,
               any of them, and the count just went down. Passed on, or
               the workers that may claim sleep beside a free slot (the
               fuzz corpus: 7 workers capped to 3, 1 slot, a hang). */
            pf__wake_workers(l, true);
            if (w->live) { /* its state goes while it is parked, on its own thread */
                pf__unlock_wake(l);
                pf__worker_down(l, w);
                pf__lock(&l->sync.mu);
                continue;
            }
            pf__wait(l, PF__ROLE_PARKED, NULL);
            now = pf__now_ns();
            continue;
        }
        if (claim != PF__CLAIM_OK) {
            /* a worker spins only on a small ring: on one of 8 slots or more
               it is woken a batch of free slots at a time (pf__wake_workers),
               a wake that many loads share, while its spin would take a CPU
               from the consumer on a busy machine */
            if (claim == PF__CLAIM_NO_SLOT) { /* pf_release's handshake (pf__release_host) */
                w->slot_wait_t0 = now;
                if (!(l->ring.wake_batch == 1 && pf__spin(l, PF__ROLE_WORKER, &l->ring.released)))
                    pf__wait_unless(l, PF__ROLE_WORKER, NULL, &l->ring.slot_sleepers, &l->ring.released);
            } else if (!(l->ring.wake_batch == 1 && pf__spin(l, PF__ROLE_WORKER, NULL))) {
                pf__wait(l, PF__ROLE_WORKER, NULL);
            }
            now = pf__now_ns();
            if (claim == PF__CLAIM_NO_SLOT) {
                if (now > w->slot_wait_t0) l->st.worker_wait_ns += now - w->slot_wait_t0;
                w->slot_wait_t0 = 0;
            }
            continue;
        }
        run[0] = s;
        nrun = 1;
        /* a worker's runs need atomics (pf__mark_early) */
        for (k = PF__SPIN_OK ? pf__run_len(l, w->est_ns, false) : 1; nrun < k && pf__claim(l, w, now, &run[nrun], false) == PF__CLAIM_OK;) nrun++;
        for (k = 0; k < nrun; k++) seqs[k] = run[k]->seq;
        l->st.runs += nrun > 1;
        l->ring.runs_open += nrun > 1;
        pf__unlock_wake(l);
        pf__index_run(l, run, nrun);
        /* from here its later batches may be taken (>>runs), indexed: a
           taker reads what the run wrote into their slots */
        if (nrun > 1) pf__run_open(w, run, nrun);
        for (k = 0, prev = PF_OK; k < nrun; k++) {
            bool after;
            if (k && !pf__run_own(w, k)) break; /* taken, and the rest after it */
            s = run[k];
            starts[k] = now;
            after = pf__after_failure(l, s);
            if (prev != PF_OK || (k && PF__LOAD_FLAG(&l->sync.stopping)) || after) {
                /* a failed batch stops the loading (pf__publish), a stop
                   stops it too: the rest of the run is not loaded */
                pf__not_loaded(s, prev != PF_OK ? prev : PF_ERR_LOAD,
                               prev != PF_OK ? "the batch before it in this worker's run failed"
                               : after ? "a batch before it failed" : "the loader stopped");
                ends[k] = now;
                continue;
            }
            est = pf__run_untimed(w, k, nrun);
            if (k && !est) now = starts[k] = pf__now_ns(); /* from the clock: the estimates may have run ahead */
            now = pf__worker_load(l, w, s, k ? now : 0, est);
            ends[k] = now;
            if (!est) w->est_ns = w->est_ns ? w->est_ns - w->est_ns / 4 + s->call_ns / 4 : s->call_ns + 1;
            prev = s->result; /* read now: once marked, the taker may publish it, and the slot go round again */
            if (k + 1 < nrun) pf__mark_early(l, s, starts[k], now);
        }
        open = nrun > 1;
        if (open) nrun = pf__run_close(w, nrun); /* the batches taken are another's to publish */
        pf__lock(&l->sync.mu);
        l->ring.runs_open -= open;
        for (k = 0; k < nrun; k++) {
            s = run[k];
            if (s->state != PF__SLOT_LOADING || s->seq != seqs[k]) continue; /* the taker published it */
            if (PF__LOAD_FLAG(&s->early)) pf__unmark(l, s);
            s->started_ns = starts[k]; /* its own load, not the wait behind the run */
            pf__loaded(l, s, ends[k]);
        }
    }
    pf__unlock_wake(l);
    pf__worker_down(l, w);
    PF__THREAD_RETURN;
}

/* >>consumer -------------------------------------------------------------- */
/* The load the taker waits for: the next batch in order (or, unordered,
   the oldest load of its epoch); NULL where no worker has begun it. Lock
   held. */
static const pf__slot *pf__awaited(const pf_loader *l) {
    const pf__slot *late = NULL;
    uint32_t i;
    for (i = 0; i < l->ring.nslots; i++) {
        const pf__slot *s = &l->ring.slots[i];
        if (s->state == PF__SLOT_LOADING && s->b.epoch == l->take.epoch &&
            (l->cfg.unordered ? !late || s->started_ns < late->started_ns : s->seq == l->take.taken))
            late = s;
    }
    return late;
}

/* Why is the next batch late? For PF_TIMEOUT messages (lock held). The
   consumer waits for the stager's slot if one is staging (CUDA), else for
   pf__awaited's load. */
static void pf__describe_late(pf_loader *l, char *dst, size_t size) {
    uint32_t loading = 0, ready = 0, copying = 0, i;
    const pf__slot *late = pf__awaited(l), *staging = NULL;
    uint64_t now = pf__now_ns();
    for (i = 0; i < l->ring.nslots; i++) {
        const pf__slot *s = &l->ring.slots[i];
        loading += s->state == PF__SLOT_LOADING;
        ready += s->state == PF__SLOT_READY;
        copying += s->state == PF__SLOT_COPYING;
        if (s->state == PF__SLOT_STAGING) staging = s;
    }
    if (staging) { /* CUDA only: loaded, waiting for a device slot */
        pf__format(dst, size, "epoch %llu batch %llu is loaded and waits for a free device slot (the consumer "
                   "holds every one of cfg.device_slots = %u)", (unsigned long long)staging->b.epoch,
                   (unsigned long long)staging->b.batch, (unsigned)l->cfg.device_slots);
        return;
    }
    if (late)
        pf__format(dst, size, "epoch %llu batch %llu is late: %s has been inside load for %llu ms",
                   (unsigned long long)late->b.epoch, (unsigned long long)late->b.batch, l->pool.w[late->worker].name,
                   (unsigned long long)((now - late->started_ns) / 1000000u));
    else
        pf__format(dst, size,
                   "epoch %llu batch %llu is late: no worker has started it (%u of %u host slots "
                   "loading, %u ready, %u copying, %u held by the consumer)",
                   (unsigned long long)l->take.epoch, (unsigned long long)l->take.done, (unsigned)loading,
                   (unsigned)l->ring.nslots, (unsigned)ready, (unsigned)copying, (unsigned)l->cons.held);
}

/* Why the consumer waited. On CUDA the host runs ahead of the GPU, so a
   wait is often backpressure, not starvation: the GPU is still busy with
   batches already handed out. Only the rest is the loader's fault: the
   GPU sat idle for a copy (copy-bound) or while the next batch loaded
   (input-bound). See pf__cuda_wait_on and pf__cuda_settle. */
enum { PF__WAIT_INPUT, PF__WAIT_COPY, PF__WAIT_GPU };

/* What one pf_next waits on: a PF__WAIT_* kind as the wait begins and, for
   a wait behind copies, the batch (its staging seq) it is behind. */
typedef struct pf__wait_on {
    int kind;
    uint64_t seq;
} pf__wait_on;

/* The untimed loads pf_next made since the clock was last read (last_ns)
   waited for input about their estimate each: credited now, never more
   than the clock moved since then, so wait_s stays within elapsed_s, and
   elapsed_s runs on by as much (those calls were after last_ns, but when
   is not known: not to now, which may be a pause later). */
static void pf__settle_untimed(pf_loader *l, uint64_t now) {
    uint64_t moved, credit;
    if (!l->st.untimed_ns) return;
    moved = now > l->st.last_ns ? now - l->st.last_ns : 0;
    credit = l->st.untimed_ns < moved ? l->st.untimed_ns : moved;
    l->st.wait_input_ns += credit;
    l->st.last_ns += credit; /* those pf_next calls ran at least this long after it */
    l->st.untimed_ns = 0;
}

/* Waits are counted as wall-clock time during which at least one pf_next
   waited, so two consumers waiting together count once and wait_s never
   exceeds elapsed_s. The span takes the kind of the wait that closes it:
   a wait's kind may be settled only when it ends. */
static void pf__wait_begins(pf_loader *l, uint64_t now) {
    pf__settle_untimed(l, now);
    if (l->st.waiters++ == 0) l->st.wait_since = now;
}

/* Consumers that wait one after another without a gap (several threads
   in pf_next on a slow load) never close the span: credit what has run of
   it so far, so autotune's periods and pf_get_stats see the waiting as it
   happens (else a period reads 0%, and the span's close reads thousands of
   percent). Host backend only: there every wait is for input, while on
   CUDA a span's kind is settled when it ends. And so for the workers'
   waits for a free slot, which autotune reads as their idle share: a
   wait was counted when it ended, and woken a batch of free slots at a
   time, 16 workers of 1 ms loads beside a 500 us step waited for whole
   periods, which read 0% idle and then 300%, never three in a row over
   half: the workers never parked (an outside trial). Lock held. */
static void pf__wait_flush(pf_loader *l, uint64_t now) {
    uint32_t i;
    for (i = 0; i < l->cfg.num_workers; i++) {
        pf__worker *w = &l->pool.w[i];
        if (w->slot_wait_t0 && now > w->slot_wait_t0) {
            l->st.worker_wait_ns += now - w->slot_wait_t0;
            w->slot_wait_t0 = now;
        }
    }
    pf__settle_untimed(l, now);
    if (!l->st.waiters || l->ops->taker != PF__ROLE_CONSUMER || now <= l->st.wait_since) return;
    l->st.wait_input_ns += now - l->st.wait_since;
    l->st.wait_since = now;
    if (l->st.last_ns < now) l->st.last_ns = now; /* a pf_next still waiting is the latest, up to now */
}

static void pf__wait_ends(pf_loader *l, int kind, uint64_t now) {
    uint64_t dt;
    /* now may be older than the lock: pf__load_inline reads it before it
       locks, and a pf_get_stats in between may have flushed the span past
       it (and moved last_ns): neither goes back */
    if (l->st.last_ns < now) l->st.last_ns = now; /* a pf_next that waits again still counts as latest */
    l->st.last_fresh = true;
    if (--l->st.waiters) return;
    dt = now > l->st.wait_since ? now - l->st.wait_since : 0;
    if (kind == PF__WAIT_COPY)
        l->st.wait_copy_ns += dt;
    else if (kind == PF__WAIT_GPU)
        l->st.wait_gpu_ns += dt;
    else
        l->st.wait_input_ns += dt;
}

/* The host consumer sleeps for a batch. While loads are quick, a ready
   batch may hold its wake for more (pf__wake_taker_ready), so the sleep
   then lasts at most PF__TAKER_HOLD_NS: a held batch is taken by then.
   One such sleep that ends with nothing held makes the next ones untimed,
   until a batch is delivered: a stalled loader's consumer sleeps, it does
   not wake every 200 us. 0 woken (or the hold's time is up), 1 the
   caller's deadline passed (lock held). */
static int pf__taker_sleep(pf_loader *l, const struct timespec *deadline) {
    struct timespec hold;
    int r;
    if (l->ring.wake_batch < 2 || l->ring.hold_expired || !l->ring.load_est ||
        l->ring.load_est * l->ring.wake_batch >= PF__TAKER_HOLD_NS)
        return pf__taker_wait(l, PF__ROLE_CONSUMER, deadline);
    hold = pf__deadline_ns(PF__TAKER_HOLD_NS);
    if (deadline && pf__before(deadline, &hold)) return pf__taker_wait(l, PF__ROLE_CONSUMER, deadline);
    l->ring.taker_slept = pf__now_ns(); /* the hold counts from here */
    l->ring.timed_sleepers++;
    r = pf__taker_wait(l, PF__ROLE_CONSUMER, &hold);
    l->ring.timed_sleepers--;
    if (r && !l->ring.taker_held) l->ring.hold_expired = true; /* the loads are slower than they were */
    l->ring.taker_held = false; /* awake: it looks for itself */
    return 0;
}

/* The consumer waits (optional deadline): 0 woken, 1 timed out (lock held). */
static int pf__consumer_wait(pf_loader *l, const struct timespec *deadline) {
    bool taker = l->ops->taker == PF__ROLE_CONSUMER; /* host: it waits for loads, a run's among them */
    pf__wake_workers(l, true); /* the consumer starves: every free slot must fill */
    if (pf__spin(l, PF__ROLE_CONSUMER, taker ? pf__early_news(l) : NULL)) { /* recheck; a spin pulsed again and again still times out */
        struct timespec now;
        if (!deadline) return 0;
        timespec_get(&now, TIME_UTC);
        return now.tv_sec > deadline->tv_sec || (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
    }
    return taker ? pf__taker_sleep(l, deadline) : pf__wait(l, PF__ROLE_CONSUMER, deadline);
}

static void pf__note_delivery(pf_loader *l, const pf__desc *b) {
    uint64_t batch = b->batch;
    l->st.batches++;
    l->st.samples += b->count;
    l->st.bytes += b->bytes;
    l->st.ready_sum += l->ring.nready;
    l->cons.epoch = b->epoch;
    l->cons.batch++;
    l->cons.nbatches = b->nbatches;
    /* the checkpoint position: the first batch not yet delivered */
    l->ck.n = b->n;
    l->ck.n_known = true;
    PF_ASSERT(batch >= l->ck.low && batch < l->ck.low + l->ck.win);
    if (batch == l->ck.low) {
        do l->ck.done[l->ck.low++ % l->ck.win] = 0;
        while (l->ck.done[l->ck.low % l->ck.win]);
        if (l->ck.lead_capped) { /* a worker stopped at the lead cap: it moved */
            l->ck.lead_capped = false;
            pf__wake_all_workers(l);
        }
    } else {
        l->ck.done[batch % l->ck.win] = 1;
    }
}

static void pf__note_epoch_end(pf_loader *l) {
    l->cons.epoch++;
    l->cons.batch = 0;
    l->cons.nbatches = 0;
    l->ck.low = l->ck.start = l->ck.first = 0;
    l->ck.n_known = false;
    memset(l->ck.done, 0, l->ck.win);
}

/* What pf_next, pf_release and pf_batch_wait share on both backends. */
/* Hand batch b, whose bytes are at data, to the caller as *out: the
   delivery's bookkeeping (pf__note_delivery), then the pf_batch (lock
   held). */
static void pf__deliver(pf_loader *l, pf_batch *out, const pf__desc *b, void *data, uint64_t ticket, uint32_t slot) {
    pf__note_delivery(l, b);
    out->data = data;
    out->bytes = b->bytes;
    out->epoch = b->epoch;
    out->batch = b->batch;
    out->indices = b->indices;
    out->count = b->count;
    out->rng = b->rng;
    out->pf__owner = l;
    out->pf__ticket = ticket;
    out->pf__slot = slot;
    pf__batch_samples(l, out, &b->sm);
}

/* A consumer wait that may time out: returns PF_TIMEOUT with the reason, or
   PF_OK after being woken (lock held on entry and return; the wait, and
   settle's CUDA queries, drop it). on: what it waits on, for the stats,
   as seen when the wait begins; settle (may be NULL) gives the final kind
   when it ends. */
typedef int (*pf__settle_fn)(pf_loader *l, const pf__wait_on *on);
static pf_result pf__wait_or_timeout(pf_loader *l, const struct timespec *deadline, bool *timed_out,
                                     const pf__wait_on *on, pf__settle_fn settle) {
    static const char *const kinds[] = {"input", "behind copies", "GPU busy"};
    int kind = on->kind;
    if (*timed_out) {
        char why[PF__MSG_SIZE];
        pf__describe_late(l, why, sizeof why);
        return pf__fail(l, PF_TIMEOUT, "pf_next: timed out after %u ms: %s", (unsigned)l->cfg.timeout_ms, why);
    }
    PF__RANGE_PUSH("pf_next waits (%s)", kinds[kind]);
    (void)kinds;
    pf__wait_begins(l, pf__now_ns());
    *timed_out = pf__consumer_wait(l, deadline) != 0;
    if (settle && !*timed_out) kind = settle(l, on);
    pf__wait_ends(l, kind, pf__now_ns());
    PF__RANGE_POP();
    return PF_OK;
}

/* A batch handed back by pf_release or pf_batch_wait: from this loader,
   not released yet, its slot's ticket still its own (lock held). */
static pf_result pf__check_batch(pf_loader *l, const pf_batch *b, const char *fn, uint32_t nslots,
                                 uint64_t (*ticket_of)(pf_loader *, uint32_t)) {
    uint64_t held;
    if (b->pf__owner != l)
        return pf__fail(l, PF_ERR_INVALID_ARG, "%s: this batch is not from this loader's pf_next", fn);
    if (b->pf__ticket == 0)
        return pf__fail(l, PF_ERR_INVALID_STATE, "%s: this batch was already released", fn);
    if (b->pf__ticket <= l->cons.ticket0 || b->pf__ticket > l->cons.ticket) /* never given out here */
        return pf__fail(l, PF_ERR_INVALID_ARG, "%s: this batch is not from this loader's pf_next (a pf_batch kept "
                        "from a destroyed loader, or a damaged one)", fn);
    if (b->pf__slot >= nslots)
        return pf__fail(l, PF_ERR_INVALID_ARG, "%s: the batch is corrupt (slot %u of %u)", fn,
                        (unsigned)b->pf__slot, (unsigned)nslots);
    held = ticket_of(l, b->pf__slot);
    if (held != b->pf__ticket) {
        if (held && held < b->pf__ticket) /* a slot's batch is never older than a copy of one it held */
            return pf__fail(l, PF_ERR_INVALID_ARG, "%s: the batch is corrupt (its ticket is newer than its slot's: a "
                            "damaged pf_batch; epoch %llu batch %llu is still held)", fn,
                            (unsigned long long)b->epoch, (unsigned long long)b->batch);
        return pf__fail(l, PF_ERR_INVALID_STATE, "%s: epoch %llu batch %llu was already released", fn,
                        (unsigned long long)b->epoch, (unsigned long long)b->batch);
    }
    return PF_OK;
}

/* pf_next's frame, shared: the lock, the stats clock, the sticky error,
   then the backend's take (lock held throughout), then the progress
   callback outside the lock. *progress: it is due. */
typedef pf_result (*pf__take_fn)(pf_loader *l, pf_batch *out, const struct timespec *deadline);
static pf_result pf__next_frame(pf_loader *l, pf_batch *out, pf__take_fn take, bool *progress) {
    struct timespec deadline;
    char msg[PF__MSG_SIZE], errlog[PF__MSG_SIZE];
    pf_result r;
    if (l->cfg.timeout_ms) deadline = pf__deadline(l->cfg.timeout_ms);
    pf__lock(&l->sync.mu);
    if (!l->st.first_ns) l->st.first_ns = l->st.last_ns = pf__now_ns(); /* waits count from the first call */
    if (!out) r = pf__fail(l, PF_ERR_INVALID_ARG, "pf_next: out is NULL");
    else if (pf__error_due(l)) r = pf__show_error(l);
    else r = take(l, out, l->cfg.timeout_ms ? &deadline : NULL);
    /* elapsed_s runs to the latest pf_next, whatever it returned (a wait
       that just ended set it already: one clock read less per batch) */
    if (!l->st.last_fresh) {
        uint64_t now = pf__now_ns();
        pf__settle_untimed(l, now);
        l->st.last_ns = now;
    }
    l->st.last_fresh = false;
    errlog[0] = '\0';
    if (l->error.shown && l->error.log_owed) { /* a failure no worker logged (pf__skip_account) */
        memcpy(errlog, l->error.msg, sizeof errlog);
        l->error.log_owed = false;
    }
    *progress = r == PF_OK && l->cfg.progress && l->st.batches % l->cfg.progress_every == 0;
    if (r == PF_OK && l->cfg.autotune) pf__autotune(l);
    else if (r == PF_OK && pf__cap_may(l) && pf__may_load(l)) pf__cap_caller(l);
    msg[0] = '\0';
    if (l->at.msg[0]) { /* autotune changed the worker count: say so */
        memcpy(msg, l->at.msg, sizeof msg);
        l->at.msg[0] = '\0';
    }
    pf__unlock_wake(l);
    if (errlog[0]) pf__log(&l->cfg, PF_LOG_ERROR, "%s", errlog); /* user code: never under the lock */
    if (msg[0]) pf__log(&l->cfg, PF_LOG_DEBUG, "%s", msg);
    return r;
}

static pf_result pf__next_done(pf_loader *l, pf_result r, bool progress) {
    if (progress && r == PF_OK) l->cfg.progress(l->cfg.progress_user, l); /* unlocked: it may call pf_get_stats */
    return r;
}

/* >>backend host ---------------------------------------------------------- */
/* pf_next hands out the filled host slot itself; pf_release frees it. */
/* pf_next loads when the next batch is not ready and loads are cheap
   (cfg.workers_only says never): a sleep and a wake cost more than such a
   load. On the 2-core VM a system call costs 1 us and a consumer's sleep
   and wake 20-40 us of CPU, taken from the workers: 2 workers reading
   256 KiB records from the page cache ran at 0.77 of 2 threads of plain
   preads with pf_next sleeping, 0.90-0.96 with it loading; 16 KiB token
   windows at 0.38 and 0.79. Cheap means under PF__TAKER_HOLD_NS: a batch
   that gets ready while pf_next loads another is late by no more than the
   load, and a held consumer may be late by as much (>>waiting, rule 3).
   Shuffled 4 KiB records, 64 preads a batch (100-150 us), were left to
   the workers at a limit of 50 us: 2 workers ran at 0.73-0.79 of plain
   preads, autotune at 0.52-0.56; with pf_next loading them, 0.92-0.93
   and 0.86-0.88. Unknown loads (none finished yet) are not cheap. A
   dearer load is taken on when the batch pf_next waits for is further off
   than that load less PF__HELP_LATE_NS (its worker began it just now, or
   no worker has): that batch is late by no more, as with a cheap one.
   With 2 and 4 workers the consumer otherwise slept through loads its
   workers had just begun: tar shards of 100 KiB samples (1.6 MB, 200-400
   us a batch) went from 0.79-0.87 and 0.81-0.86 of plain preads to
   0.88-0.97 and 0.85-0.94, autotune from 0.75-1.00 to 0.95-1.04. With
   autotune too; its trial (at.help) goes further, loading whenever it
   pays, or with no workers at all. */
static bool pf__may_load(const pf_loader *l) { /* whatever the loads cost */
    return !l->cfg.workers_only && !l->cfg.timeout_ms && l->ops->taker == PF__ROLE_CONSUMER && pf__hooks_any_thread(&l->cfg);
}
/* How long until the batch the caller waits for is loaded (pf__awaited),
   by its worker's start and the loads' smoothed time; UINT64_MAX where no
   worker has it (pf_next would claim that very batch). Lock held. */
static uint64_t pf__next_due(const pf_loader *l, uint64_t now) {
    const pf__slot *s = pf__awaited(l);
    uint64_t end;
    if (!s) return UINT64_MAX;
    end = s->started_ns + l->ring.load_est;
    return end > now ? end - now : 0;
}
static bool pf__may_help(const pf_loader *l) {
    uint64_t due;
    if (!pf__may_load(l) || !l->ring.load_est) return false;
    if (l->ring.load_est < PF__HELP_MAX_NS) return true;
    due = pf__next_due(l, pf__now_ns());
    return due == UINT64_MAX || l->ring.load_est < due + PF__HELP_LATE_NS;
}

/* Autotune's pf_next loading (at.help) ends at once when two timed loads
   in a row take over twice what it is for (PF__HELP_DEAR_NS: twice
   PF__INLINE_MAX_S), not at the end of the period: an outside trial saw
   pf_next load 17-30 batches of 2 ms after the loads turned dear (60 ms
   of the caller's time), as the period ran out. Two: one can be a page fault or a preemption. The
   workers come back (the ones before a trial of pf_next alone, else at
   least one) and the period starts afresh. Lock held. */
#ifndef PF__HELP_DEAR_NS /* tests raise it: under a sanitizer a load may take that */
#define PF__HELP_DEAR_NS ((uint64_t)(2 * PF__INLINE_MAX_S * 1e9))
#endif
static void pf__help_dear(pf_loader *l, uint64_t end, uint64_t took) {
    uint32_t n;
    if (!l->at.help) return;
    if (took < PF__HELP_DEAR_NS) {
        l->at.dear_loads = 0;
        return;
    }
    if (++l->at.dear_loads < 2) return;
    l->at.dear_loads = 0;
    n = l->at.active ? l->at.active : l->at.before ? l->at.before : 1;
    l->at.help = l->at.help_trial = l->at.park_trial = l->at.park_last = l->at.park_failed = false;
    l->at.park_quiet = false;
    pf__set_active(l, n, "", 0, 0); /* its message, with no period's figures to give, is replaced: */
    pf__format(l->at.msg, sizeof l->at.msg, "autotune: %u workers: loads got dearer (pf_next's last two took %.0f us "
               "and more): pf_next stops loading", (unsigned)n, pf__sec(took) * 1e6);
    pf__at_period_start(l, end, l->st.wait_input_ns + l->st.wait_copy_ns); /* one starts afresh */
}

/* pf_next loads (pf__may_help, or autotune found a load cheaper than
   handing a batch over between threads, at.help): when the next batch is
   not ready, pf_next claims the next unclaimed batch and loads it itself,
   through the pool's extra record (id num_workers), as a worker would,
   instead of sleeping until a worker wakes it; the workers load beside
   it. Never with the caller's worker_init or worker_stop (their state
   belongs to worker threads). The time counts as waiting for input: the
   consumer was not stepping. true: a batch was loaded, or an epoch
   planned (take again); false: nothing to claim now, wait. Lock held on
   entry and return, dropped around the load.
   Loads under PF__RUN_LOAD_NS come in runs, as a worker's do
   (pf__run_len: its share of the free slots, up to PF__RUN_MAX): one
   claim and one publish under the lock for the run. With
   1 worker on the 2-core VM, alternated A/B, 3 runs each: shuffled 4 KiB
   loads 1.02-1.04 -> 0.95-0.98 us a batch, 16 KiB in order 0.98-1.05 ->
   0.94-0.96, shuffled 1.33-1.45 -> 1.27-1.29; autotune's 16 KiB in order
   0.80-0.98 -> 0.71-0.74. A run is late by at most its loads, as a
   worker's run is: the batch pf_next waits for is not held back by it
   (it was claimed before, by a worker). A run is timed as a whole, and
   loads that turn dear during it end it (below), and the runs after it
   (inline_est, pf__help_dear). */
#define PF__RUN_DEAR_NS ((uint64_t)4 * PF__RUN_LOAD_NS) /* a run's loads, on average, that end it */
static bool pf__load_inline(pf_loader *l) {
    pf__worker *w = &l->pool.w[l->cfg.num_workers];
    pf__slot *run[PF__RUN_MAX];
    uint32_t nrun = 1, want, k, kept, loaded = 0, upto;
    int prev = PF_OK;
    /* Single loads under PF__INLINE_UNTIMED_NS: 1 in PF__INLINE_TIMED reads
       the clock, before and after; the others take the timed ones'
       smoothed duration. A clock read waits for the copy the load just
       made: two per batch made a 4 KiB batch in order 40% slower than the
       same load without them. Dearer loads are all timed (the reads are
       noise there), so an untimed load is off by under
       PF__INLINE_UNTIMED_NS, except the few before a timed one sees loads
       turn dear. */
    uint64_t est = l->at.inline_n % PF__INLINE_TIMED && l->at.inline_est < PF__INLINE_UNTIMED_NS ? l->at.inline_est : 0;
    uint64_t now, t0, end, span, per, plans = l->claim.plans_made;
    if (l->at.inline_busy) return false;
    want = pf__run_len(l, l->at.inline_est, true);
    if (want > 1) est = 0; /* a run is timed as a whole */
    now = t0 = est ? l->st.last_ns : pf__now_ns();
    /* a claim that planned an epoch woke the taker, this very caller, and
       dropped the lock to do it: take again, or that wake is lost (an
       outside trial: an empty last epoch, planned here, hung pf_next) */
    if (pf__claim(l, w, now, &run[0], true) != PF__CLAIM_OK) return l->claim.plans_made != plans;
    while (nrun < want && pf__claim(l, w, now, &run[nrun], false) == PF__CLAIM_OK) nrun++;
    l->st.runs += nrun > 1;
    l->ring.runs_open += nrun > 1;
    l->at.inline_busy = true; /* one record: one loading caller at a time */
    l->at.inline_n++;
    w->est_ns = l->at.inline_est; /* read unlocked below (pf__cap_ask): pf_next's loads are asked too */
    if (!est) pf__wait_begins(l, now);
    pf__unlock_wake(l);
    pf__index_run(l, run, nrun);
    if (nrun > 1) pf__run_open(w, run, nrun); /* a worker may take what is not begun (>>runs) */
    for (k = 0, kept = nrun; k < kept; k++) {
        pf__slot *s = run[k];
        if (k && !pf__run_own(w, k)) {
            kept = k; /* taken, with the rest */
            break;
        }
        if (prev != PF_OK || pf__after_failure(l, s)) { /* nothing after a failed batch is delivered */
            pf__not_loaded(s, prev != PF_OK ? prev : PF_ERR_LOAD,
                           prev != PF_OK ? "the batch before it in pf_next's run failed" : "a batch before it failed");
            continue;
        }
        /* from the claim: the job's indices count as the load; a run's
           loads are untimed, the run is timed after them */
        now = pf__worker_load(l, w, s, now, nrun > 1 ? l->at.inline_est : est);
        prev = s->result;
        loaded++;
        /* loads that turned dear end the run: the clock after the first
           two and every fourth, so a caller waits for at most four dear
           loads (an outside trial's 2 ms loads, after 1000 cheap ones, held
           one pf_next for 32 of them: 64 ms). What is left goes back to be
           claimed as it is (pf__claim), by a worker or by the next pf_next
           that waits: the workers may have left, the claims done. */
        if (nrun > 1 && k + 1 < kept && (k < 2 || k % 4 == 3)) {
            now = pf__now_ns();
            if (now - t0 > (uint64_t)(k + 1) * PF__RUN_DEAR_NS) kept = k + 1;
        }
    }
    end = nrun > 1 ? pf__now_ns() : now;
    /* what a worker took is its own; what is left (loads turned dear) goes back below */
    upto = nrun > 1 ? pf__run_close(w, nrun) : nrun;
    span = (end - t0) / kept;
    per = loaded ? (end - t0) / loaded : 0;
    pf__lock(&l->sync.mu);
    l->ring.runs_open -= nrun > 1;
    l->at.inline_busy = false;
    l->st.next_loads += loaded;
    if (!est) {
        if (loaded) { /* a claim skipped after a failure times nothing */
            l->at.inline_est = l->at.inline_est ? l->at.inline_est - l->at.inline_est / 4 + per / 4 : per;
            if (!l->at.inline_est) l->at.inline_est = 1;
        }
        pf__wait_ends(l, PF__WAIT_INPUT, end);
        pf__help_dear(l, end, per);
    } else {
        if (!l->st.waiters) l->st.untimed_ns += end - t0; /* else a waiting pf_next's span covers it */
        l->st.last_fresh = true; /* no clock read in pf_next's frame either */
    }
    for (k = 0; k < kept; k++) { /* each load takes the run's mean (one load: its own time) */
        run[k]->started_ns = t0 + k * span;
        if (nrun > 1) run[k]->call_ns = run[k]->result == PF_OK ? span : 0;
        pf__loaded(l, run[k], t0 + (k + 1) * span);
    }
    if (kept < upto) {
        /* a run's rest, beside at most half a run taken (pf__steal) */
        PF_ASSERT(l->ring.norphans + (upto - kept) <= 2 * PF__RUN_MAX);
        for (k = upto; k-- > kept;) l->ring.orphans[l->ring.norphans++] = run[k]->index; /* the lowest on top */
        pf__wake_all_workers(l);
    }
    pf__wake_takers(l); /* another pf_next waiting for the record gets its turn */
    return true;
}

/* pf_next waits for a slot as the one loader (pf__take_host): false, a
   release came meanwhile (take again). */
static bool pf__slot_wait_begins(pf_loader *l) {
#if PF__SPIN_OK
    PF__ADD_SC(&l->ring.slot_sleepers, 1u);
    if (PF__LOAD_SC(&l->ring.released)) {
        PF__ADD_SC(&l->ring.slot_sleepers, (uint32_t)-1);
        return false;
    }
#endif
    l->cons.slot_waits++;
    return true;
}
static void pf__slot_wait_ends(pf_loader *l) {
    l->cons.slot_waits--;
#if PF__SPIN_OK
    PF__ADD_SC(&l->ring.slot_sleepers, (uint32_t)-1);
#endif
}

static pf_result pf__take_host(pf_loader *l, pf_batch *out, const struct timespec *deadline) {
    static const pf__wait_on input = {PF__WAIT_INPUT, 0};
    bool timed_out = false;
    uint64_t behind_run = 0;
    for (;;) {
        pf__slot *s = NULL;
        pf_result w;
        int r;
        bool slot_wait, behind;
        uint64_t t0;
        pf__take_released(l); /* before the held count below is read */
        if (pf__error_due(l)) return pf__show_error(l); /* another pf_next showed it while this one waited */
        r = pf__take(l, &s);
        if (r == PF_OK) {
            pf__move(&s->state, PF__FROM(PF__SLOT_READY), PF__SLOT_HELD);
            l->ring.hold_expired = false; /* batches come again: pf__taker_sleep may hold */
            PF__STORE_RELAXED(&s->ticket, ++l->cons.ticket);
            if (++l->cons.held > l->cons.held_most) l->cons.held_most = l->cons.held;
            pf__deliver(l, out, &s->b, s->data, s->ticket, s->index);
            return PF_OK;
        }
        if (r == PF_END_OF_EPOCH) {
            pf__note_epoch_end(l);
            return PF_END_OF_EPOCH;
        }
        if (r == PF_END_OF_DATA) return PF_END_OF_DATA;
        if (r != PF__WAIT) return pf__show_error(l);
        /* pf_next loads where it may (pf__may_load), and then always what
           a run handed back or another thread took from one (ring.orphans):
           the workers may have left (the claims were done) or parked. Not
           with workers_only, hooks or timeout_ms: a worker took those and
           loads them (an outside trial: orphans alone made pf_next load
           with workers_only, past the caller's num_workers-sized array) */
        if (((l->ring.norphans && pf__may_load(l)) || l->at.help || !l->at.active || pf__may_help(l)) &&
            pf__load_inline(l))
            continue;
        /* the caller holds as many slots as stay while a block goes back
           (pf__ring_follow): that block is wanted again, or no batch may
           come (its free slots are out of the free stack) */
        if (l->ring.retire_from && l->cons.held >= l->ring.retire_from) {
            pf__shrink_cancel(l);
            continue;
        }
        /* the caller holds every slot with memory, and autotune's ring is
           still below host_slots: it may hold host_slots, so the ring grows
           now, by pf_next itself (a worker may be parked, or busy) */
        if (l->cons.held >= l->ring.nalloc && l->ring.nalloc < l->ring.nslots && !l->ring.grow_failed) {
            pf__ring_for(l, l->ring.nalloc + 1, false);
            if (pf__grow_due(l)) {
                pf__grow(l);
                continue;
            }
        }
        /* no worker loads (pf_next alone): a growth that is due is this
           caller's to make, as a worker's would be (an outside trial: a
           growth asked for while a worker was growing one, then the
           workers parked, and pf_next slept for ever) */
        if (!l->at.active && pf__grow_due(l)) {
            pf__grow(l);
            continue;
        }
        /* an epoch's end needs no slot; a batch does, and none can come */
        if (l->cons.held == l->ring.nslots ||
            (l->cons.held >= l->ring.nalloc && l->ring.grow_failed && !l->ring.growing))
            return pf__fail(l, PF_ERR_INVALID_STATE,
                            "pf_next: the caller holds all %u host slots (batches pf_next returned, on any "
                            "thread, not yet released); release one first (or raise cfg.host_slots: at least "
                            "one per thread calling pf_next)", (unsigned)l->cons.held);
        /* no worker loads, and no slot is free: pf_next itself waits for
           one, so a release on another thread must wake it, as it wakes
           a worker short of a slot (pf__release_host's handshake: counted
           in slot_sleepers, then it looks at the released stack) */
        slot_wait = !l->at.active && !l->ring.nfree;
        if (slot_wait && !pf__slot_wait_begins(l)) continue;
        /* behind a late batch, the ring full of later ones: autotune's
           trials then need slots, not only workers (at.behind) */
        behind = pf__behind_late(l);
        t0 = behind ? pf__now_ns() : 0;
        w = pf__wait_or_timeout(l, deadline, &timed_out, &input, NULL);
        if (behind) pf__count_behind(l, pf__now_ns() - t0, &behind_run);
        if (slot_wait) pf__slot_wait_ends(l);
        if (w != PF_OK) return w;
    }
}

static uint64_t pf__host_ticket(pf_loader *l, uint32_t slot) { return PF__LOAD_RELAXED(&l->ring.slots[slot].ticket); }

#define PF__POISON 0xA5

static pf_result pf__next_host(pf_loader *l, pf_batch *out) {
    bool progress;
    pf_result r = pf__next_frame(l, out, pf__take_host, &progress);
    if (r == PF_OK && l->cfg.poison) /* the caller owns the slot now: no lock needed */
        memset((unsigned char *)out->data + out->bytes, PF__POISON, l->stride - out->bytes);
    return pf__next_done(l, r, progress);
}

/* pf_release takes no lock when it can: the batch's ticket, swapped for
   0, says this call is the one that releases it (a second one, or a
   copy of the batch released on another thread, finds 0 or a newer
   ticket), and the slot goes on the `released` stack, which pf_next
   (under its lock anyway) empties; so does a worker that finds no free
   slot. The consumer then takes the lock once per batch, not twice; the
   lock is what a worker's publish and claim contend for. A worker that
   is going to sleep for want of a slot counts itself in slot_sleepers
   and then looks at the stack; the releaser pushes and then looks at the
   count, and if it is not zero frees the slots itself, under the lock,
   and owes the wake (pf__wake_workers). Both sides use sequentially
   consistent operations, so at least one sees the other: the worker
   finds the slot, or the releaser finds the sleeper (which, counted
   before its last look, sleeps only in pf__wait_unless, so the
   releaser's lock waits for the wait to begin, as rule 1 of >>waiting
   has it). A worker
   spinning for a slot watches the stack too (pf__spin). Errors take the
   lock, as they always did. */
static pf_result pf__release_host(pf_loader *l, pf_batch *b) {
    pf_result r;
#if PF__SPIN_OK
    uint64_t t = b->pf__ticket;
    if (b->pf__owner == l && t && b->pf__slot < l->ring.nslots &&
        PF__CAS_SC(&l->ring.slots[b->pf__slot].ticket, &t, (uint64_t)0)) {
        pf__slot *s = &l->ring.slots[b->pf__slot];
        uint32_t top = PF__LOAD_RELAXED(&l->ring.released);
        do s->next_released = top;
        while (!PF__CAS_SC(&l->ring.released, &top, s->index + 1));
        b->pf__ticket = 0;
        if (PF__LOAD_SC(&l->ring.slot_sleepers)) {
            pf__lock(&l->sync.mu);
            pf__take_released(l);
            pf__unlock_wake(l);
        }
        return PF_OK;
    }
#endif
    pf__lock(&l->sync.mu);
    r = pf__check_batch(l, b, "pf_release", l->ring.nslots, pf__host_ticket);
    if (r == PF_OK) { /* no atomics here (PF__SPIN_OK 0): every release is under the lock */
        l->cons.held--;
        pf__slot_free(l, &l->ring.slots[b->pf__slot]);
        b->pf__ticket = 0;
    }
    pf__unlock_wake(l);
    return r;
}

/* The batch is the host slot: nothing to wait for but a valid batch. */
static pf_result pf__batch_wait_host(pf_loader *l, const pf_batch *b) {
    pf_result r;
    pf__lock(&l->sync.mu);
    r = pf__check_batch(l, b, "pf_batch_wait", l->ring.nslots, pf__host_ticket);
    pf__unlock_wake(l);
    return r;
}

/* Slot blocks with the default allocator are mapped and unmapped by the
   loader itself on Linux: glibc's malloc keeps a freed block of up to
   32 MiB in its heap (its mmap threshold rises to the size of a mapped
   block once one is freed), so a ring autotune shrank stayed resident at
   its peak (an outside trial: 23 MiB resident for 5 slots of 1 MiB after
   a grow and a shrink). The mapping's size is in its first bytes. */
#if defined(__linux__) && defined(MAP_ANONYMOUS)
#define PF__MAP_ANON MAP_ANONYMOUS
#elif defined(__linux__) && (defined(__x86_64__) || defined(__i386__) || defined(__aarch64__) || \
                             defined(__arm__) || defined(__riscv) || defined(__powerpc__) || defined(__s390__))
#define PF__MAP_ANON 0x20 /* <sys/mman.h> shows it only with _DEFAULT_SOURCE: asm-generic's value on these */
#endif
#ifdef PF__MAP_ANON
#define PF__MAP_HEAD ((size_t)PF__ALIGN)
static void *pf__slots_alloc(const pf_loader *l, size_t size) {
    unsigned char *p;
    if (l->cfg.allocator.alloc_fn != pf__malloc_default)
        return l->cfg.allocator.alloc_fn(size, l->cfg.allocator.user_data);
    if (size > SIZE_MAX - PF__MAP_HEAD) return NULL;
    p = (unsigned char *)mmap(NULL, size + PF__MAP_HEAD, PROT_READ | PROT_WRITE, MAP_PRIVATE | PF__MAP_ANON, -1, 0);
    if ((void *)p == MAP_FAILED) return NULL;
    memcpy(p, &size, sizeof size);
    return p + PF__MAP_HEAD;
}
static void pf__slots_free(const pf_loader *l, void *raw) {
    unsigned char *p = (unsigned char *)raw - PF__MAP_HEAD;
    size_t size;
    if (l->cfg.allocator.free_fn != pf__free_default) {
        l->cfg.allocator.free_fn(raw, l->cfg.allocator.user_data);
        return;
    }
    memcpy(&size, p, sizeof size);
    (void)munmap(p, size + PF__MAP_HEAD);
}
#else
static void *pf__slots_alloc(const pf_loader *l, size_t size) { return l->cfg.allocator.alloc_fn(size, l->cfg.allocator.user_data); }
static void pf__slots_free(const pf_loader *l, void *raw) { l->cfg.allocator.free_fn(raw, l->cfg.allocator.user_data); }
#endif

/* A block of host slots from cfg.allocator (by default, mapped:
   pf__slots_alloc), slots from .. to-1, each
   PF__ALIGN-aligned (page-aligned when the stride is a page multiple, so
   O_DIRECT reads land in them); *raw: what to free. Every page is touched now:
   memory use is exact from the start and the first epoch pays no page
   faults (pinned memory is resident already). Not with zeros: some
   hypervisors back zeroed pages lazily and charge the first real write
   instead. On Linux a block of 2 MiB or more starts on a 2 MiB boundary
   (the padding is address space, never touched) and asks for
   transparent huge pages: one fault per 2 MiB instead of 512. Measured
   on this project's 2-core VM, touching 20 MiB costs 55 ms of CPU in
   4 KiB pages and under 1 ms in huge ones; autotune grows the ring while
   the run goes on, so that was CPU taken from the run. Advice only:
   memory the kernel cannot back so (THP off, a user allocator's) is
   touched as before. NULL: out of memory, *asked: the bytes asked for. */
#if defined(__linux__) && (defined(MADV_HUGEPAGE) || defined(POSIX_MADV_NORMAL))
#define PF__HUGE ((size_t)2 << 20)
#endif
static unsigned char *pf__slot_block(pf_loader *l, uint32_t from, uint32_t to, void **raw, size_t *asked) {
    size_t bytes = (size_t)(to - from) * l->stride, align = PF__ALIGN;
    unsigned char *p;
    uint32_t i;
    if (l->stride % 4096u == 0) align = 4096u; /* page-aligned slots: O_DIRECT reads land in them (>>readers) */
#ifdef PF__HUGE
    if (bytes >= PF__HUGE && bytes <= SIZE_MAX - PF__HUGE) align = PF__HUGE;
#endif
    *asked = bytes + align;
    *raw = pf__slots_alloc(l, *asked);
    if (!*raw) return NULL;
    p = (unsigned char *)*raw + (align - (uintptr_t)*raw % align) % align;
#if defined(PF__HUGE) && defined(MADV_HUGEPAGE)
    if (align == PF__HUGE) (void)madvise(p, bytes & ~(PF__HUGE - 1), MADV_HUGEPAGE);
#elif defined(PF__HUGE)
    /* madvise is declared only with _DEFAULT_SOURCE; Linux's posix_madvise
       (glibc, musl) hands the advice to madvise(2) as it is, and 14 is
       MADV_HUGEPAGE in the kernel's ABI on every architecture */
    if (align == PF__HUGE) (void)posix_madvise(p, bytes & ~(PF__HUGE - 1), 14);
#endif
    memset(p, 0xa5, bytes);
    for (i = from; i < to; i++) l->ring.slots[i].data = p + (size_t)(i - from) * l->stride;
    return p;
}

/* A block grown by autotune holds whole huge pages where a few more
   slots make it so: one 1 MiB slot is 256 page faults of 4 KiB (3 ms of
   CPU on the 2-core VM, in the middle of the run), two are one fault of
   2 MiB. With autotune growing 1 MiB slots one and two at a time, the
   I/O-like bench took 1418 page faults against 385 for 16 fixed workers
   (CPU 1.8-2.6x theirs). At most a huge page's worth of slots more. */
static uint32_t pf__grow_whole(const pf_loader *l, uint32_t from, uint32_t to) {
#ifdef PF__HUGE
    if (l->ops->backend == PF_BACKEND_HOST && l->stride < PF__HUGE && PF__HUGE % l->stride == 0) {
        uint32_t per = (uint32_t)(PF__HUGE / l->stride), n = (to - from + per - 1) / per * per;
        if (n - (to - from) < per && from + n <= l->ring.nslots) to = from + n;
    }
#else
    (void)l;
    (void)from;
#endif
    return to;
}

static pf_result pf__alloc_slots_host(pf_loader *l, char *why, size_t n) {
    size_t asked;
    if (!pf__slot_block(l, 0, l->ring.nalloc, &l->ring.host_raw, &asked)) {
        pf__format(why, n, "pf_create: out of memory: %llu bytes for host_slots %u x %llu (cfg.allocator)",
                   (unsigned long long)asked, (unsigned)l->ring.nalloc, (unsigned long long)l->stride);
        return PF_ERR_NO_MEMORY;
    }
    return PF_OK;
}

/* Autotune grew the ring: memory for slots from .. to-1, one block, as in
   pf_create (called without the lock, by the worker that set
   ring.growing). */
static bool pf__grow_slots_host(pf_loader *l, uint32_t from, uint32_t to) {
    size_t asked;
    void *raw;
    if (!pf__slot_block(l, from, to, &raw, &asked)) return false;
    l->ring.grown[l->ring.ngrown++] = raw;
    return true;
}

static void pf__shrink_slots_host(pf_loader *l, void *block) { pf__slots_free(l, block); }

static void pf__free_slots_host(pf_loader *l) {
    uint32_t i;
    if (l->ring.host_raw) pf__slots_free(l, l->ring.host_raw);
    for (i = 0; i < l->ring.ngrown; i++) pf__slots_free(l, l->ring.grown[i]);
}

/* The host backend: the consumer takes batches itself; no bookkeeping of
   its own, no helper threads, nothing to bind a worker to, and it keeps a
   plan until the consumer passes its end (staged_epoch_n). */
static const pf__backend_ops pf__host_ops = {
    /* backend, taker, helpers */ PF_BACKEND_HOST, PF__ROLE_CONSUMER, 0,
    /* extra_slots */ NULL,
    /* reserve, place */ NULL, NULL,
    /* alloc_slots, grow_slots, shrink_slots */ pf__alloc_slots_host, pf__grow_slots_host, pf__shrink_slots_host,
    /* start_helpers, bind_thread */ NULL, NULL,
    /* next, release, batch_wait */ pf__next_host, pf__release_host, pf__batch_wait_host,
    /* stats, staged_epoch_n */ NULL, NULL,
    /* join_helpers, free_slots */ NULL, pf__free_slots_host};

/* >>backend cuda ---------------------------------------------------------- */
#ifdef PREFETCH_CUDA
enum { PF__ITEM_BATCH, PF__ITEM_EPOCH_END, PF__ITEM_DATA_END, PF__ITEM_ERROR };
typedef struct pf__item {
    int kind;
    uint32_t slot;
    uint64_t n; /* EPOCH_END: the ended epoch's samples (its plan is gone) */
} pf__item;

typedef struct pf__dslot {
    pf__desc b;
    uint64_t ticket;
    uint64_t seq;  /* the batch's place in staging order (from 1)       */
    bool landed;   /* the retirer saw this seq's copy complete          */
    bool marked;   /* delivered before it landed: timing marks around the
                      consumer stream's wait for it (pf__cuda_consume) */
    int state; /* PF__SLOT_FREE, COPYING (being staged), READY (queued),
                  HELD, WRITTEN_OFF */
} pf__dslot;

/* A copy in flight: host slot h into device slot d, of the seq-th batch
   staged. */
typedef struct pf__flight {
    uint32_t h, d;
    uint64_t seq;
} pf__flight;

/* Driver functions, reached through the runtime's entry-point lookup so
   nothing links libcuda (see pf__driver_fn): CUresult is an int-sized enum,
   CUcontext a pointer, CUdevice an int. */
typedef int (*pf__ctx_get_fn)(void **ctx);         /* cuCtxGetCurrent          */
typedef int (*pf__ctx_set_fn)(void *ctx);          /* cuCtxSetCurrent          */
typedef int (*pf__ctx_push_fn)(void *ctx);         /* cuCtxPushCurrent         */
typedef int (*pf__ctx_pop_fn)(void **ctx);         /* cuCtxPopCurrent          */
typedef int (*pf__dev_get_fn)(int *dev, int ordinal); /* cuDeviceGet           */
typedef int (*pf__primary_retain_fn)(void **ctx, int dev); /* cuDevicePrimaryCtxRetain */
typedef int (*pf__primary_release_fn)(int dev);    /* cuDevicePrimaryCtxRelease */

/* What the calling thread had current before a library call. */
typedef struct pf__ctx_saved {
    bool pushed; /* the primary context was pushed: pop it  */
    int device;  /* -1: unknown                             */
    bool none;   /* no context was current at all           */
} pf__ctx_saved;

struct pf__cuda {
    int device;
    cudaStream_t consumer, copy; /* copy and the events below: NULL until created */
    unsigned char *pinned, *dev;
    cudaEvent_t *copied, *released; /* per device slot; GPU-side waits only   */
    cudaEvent_t *hdone;             /* behind batch seq's copy, at seq % nhdone
                                       (copies in flight are consecutive seqs,
                                       at most host_slots of them): the
                                       retirer sleeps on it; timed, it is also
                                       the copy's end for the verdict, so it
                                       outlives the copy for a while          */
    uint32_t nhdone;                /* 2 * host_slots + device_slots          */
    cudaEvent_t *reached, *fed;     /* the verdict's marks, batch seq's at
                                       seq % host_slots: recorded on the consumer
                                       stream as pf_next hands it out, before
                                       and after its wait for the copy          */
    uint64_t *mark_seq;             /* the seq each pair holds; 0 none          */
    uint64_t *hdone_seq;            /* the seq each hdone was last recorded
                                       behind; 0 none                           */
    cudaEvent_t drain;              /* destroy: the consumer stream passed us  */
    void *primary;                  /* cfg.cuda_device's primary context,
                                       retained in pf_create; NULL: the
                                       fallback (pf__cuda_enter)              */
    int cudev;                      /* its CUdevice                           */
    pf__ctx_push_fn ctx_push;
    pf__ctx_pop_fn ctx_pop;
    pf__primary_release_fn primary_release;
    pf__ctx_get_fn ctx_get;         /* the fallback's: both or neither        */
    pf__ctx_set_fn ctx_set;
    pf__dslot *dslots;
    uint32_t *dfree;            /* FIFO: the longest-released slot is reused first */
    uint32_t dfree_head, dfree_count;
    pf__item *fifo;             /* staged batches and markers, in delivery order   */
    uint32_t fifo_cap, fifo_head, fifo_count;
    pf__flight *flights;        /* copies in flight, in copy-stream order          */
    uint32_t flight_head, flight_count;
    uint32_t held;
    uint64_t staged;            /* batches staged so far: the next one's seq - 1   */
    int64_t last_released;      /* device slot, for fault checks at a wait; -1 none */
    pf__thread stager, retirer;
    bool stager_started, retirer_started, stager_done;
};

/* Every answer of the runtime that means "there is no GPU to use here",
   including a device in exclusive-process mode that another process holds
   (cudaErrorDevicesUnavailable, from cudaSetDevice). */
static bool pf__cuda_no_device(cudaError_t e) {
    switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorInitializationError:
    case cudaErrorSystemNotReady:
    case cudaErrorStubLibrary:
    case cudaErrorCallRequiresNewerDriver:
        return true;
    default:
        return false;
    }
}

static pf_result pf__cuda_code(cudaError_t e) {
    if (pf__cuda_no_device(e)) return PF_ERR_NO_DEVICE;
    if (e == cudaErrorMemoryAllocation) return PF_ERR_NO_MEMORY;
    return PF_ERR_CUDA;
}

/* "call failed: message (cudaErrorName)" */
static void pf__cuda_msg(char *dst, size_t size, const char *call, cudaError_t e) {
    pf__format(dst, size, "%s failed: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Driver entry points. The lookup's shape follows the toolkit this file is
   compiled against (CUDART_VERSION), from CUDA 11.8 on:
     11.x       cudaGetDriverEntryPoint(symbol, &fn, flags); a symbol the
                driver lacks is an error (cudaErrorSymbolNotFound)
     12.0-12.4  cudaGetDriverEntryPoint(symbol, &fn, flags, &status); a
                missing symbol is cudaSuccess, fn NULL and a status
     12.5 on    cudaGetDriverEntryPointByVersion(symbol, &fn, version, flags,
                &status), asking for the ABI declared above (11.8's); the
                version-less lookup is deprecated from 13.0
   NULL when the driver does not offer it; no error is left behind. */
#define PF__DRIVER_ABI 11080
static void *pf__driver_fn(const char *symbol) {
    void *fn = NULL;
    cudaError_t e;
#if CUDART_VERSION >= 12050
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    e = cudaGetDriverEntryPointByVersion(symbol, &fn, PF__DRIVER_ABI, cudaEnableDefault, &q);
    if (q != cudaDriverEntryPointSuccess) fn = NULL;
#elif CUDART_VERSION >= 12000
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    e = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &q);
    if (q != cudaDriverEntryPointSuccess) fn = NULL;
#else
    e = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault);
#endif
    if (e != cudaSuccess) {
        fn = NULL;
        (void)cudaGetLastError(); /* "not found" is an answer, not an error to leave behind */
    }
    return fn;
}

/* Contexts. The rule: the library creates a context only on cfg.cuda_device,
   and every public call leaves the calling thread's CUDA state exactly as it
   found it: its current context (or lack of one) and the runtime's own
   per-thread device choice, which cudaSetDevice sets and nothing but
   cudaSetDevice gives back (a caller that never chose a device would find
   its next cudaMalloc on the loader's GPU).
   So pf_create retains the primary context of cfg.cuda_device once, each
   call on a caller's thread pushes it and pops it again (the runtime works
   on the context current to the thread), and pf_destroy releases it: the
   caller's cudaSetDevice state is never touched. Where the driver lacks
   those entry points, the fallback: cudaSetDevice for the span of the call,
   then either no context current again (cuCtxGetCurrent said none was;
   the runtime's device choice is then left at cfg.cuda_device), or
   cudaSetDevice back to the device cudaGetDevice reported. cudaGetDevice
   alone cannot tell "device 0 chosen" from "nothing chosen yet", and
   cudaSetDevice(0) would create device 0's context: the classic "every
   rank shows up on GPU 0". */
static void pf__cuda_ctx_init(pf__cuda *cu) {
    pf__dev_get_fn dev_get = (pf__dev_get_fn)(uintptr_t)pf__driver_fn("cuDeviceGet");
    pf__primary_retain_fn retain = (pf__primary_retain_fn)(uintptr_t)pf__driver_fn("cuDevicePrimaryCtxRetain");
    cu->primary_release = (pf__primary_release_fn)(uintptr_t)pf__driver_fn("cuDevicePrimaryCtxRelease");
    cu->ctx_push = (pf__ctx_push_fn)(uintptr_t)pf__driver_fn("cuCtxPushCurrent");
    cu->ctx_pop = (pf__ctx_pop_fn)(uintptr_t)pf__driver_fn("cuCtxPopCurrent");
    if (dev_get && retain && cu->primary_release && cu->ctx_push && cu->ctx_pop &&
        dev_get(&cu->cudev, cu->device) == 0 && retain(&cu->primary, cu->cudev) == 0 && cu->primary)
        return;
    /* e.g. an exclusive-process device another process holds: the
       fallback's cudaSetDevice then says so in the runtime's words */
    cu->primary = NULL;
    cu->ctx_get = (pf__ctx_get_fn)(uintptr_t)pf__driver_fn("cuCtxGetCurrent");
    cu->ctx_set = (pf__ctx_set_fn)(uintptr_t)pf__driver_fn("cuCtxSetCurrent");
    if (!cu->ctx_get || !cu->ctx_set) cu->ctx_get = NULL, cu->ctx_set = NULL;
}

/* pf_destroy: after the last CUDA call. */
static void pf__cuda_ctx_release(pf__cuda *cu) {
    if (cu->primary) (void)cu->primary_release(cu->cudev);
    cu->primary = NULL;
}

/* The calling thread works on the loader's device for the span of a call
   and gets its own state back afterwards (pf__cuda_leave). */
static cudaError_t pf__cuda_enter(pf_loader *l, pf__ctx_saved *sv) {
    void *ctx = NULL;
    sv->pushed = false;
    sv->none = false;
    sv->device = -1;
    if (l->cu->primary && l->cu->ctx_push(l->cu->primary) == 0) {
        sv->pushed = true;
        return cudaSuccess;
    }
    if (l->cu->ctx_get && l->cu->ctx_get(&ctx) == 0 && !ctx) sv->none = true;
    else if (cudaGetDevice(&sv->device) != cudaSuccess) sv->device = -1;
    /* already there (the usual training thread): nothing to switch */
    return sv->device == l->cu->device ? cudaSuccess : cudaSetDevice(l->cu->device);
}
static void pf__cuda_leave(pf_loader *l, const pf__ctx_saved *sv) {
    void *popped = NULL;
    if (sv->pushed) (void)l->cu->ctx_pop(&popped); /* the caller's stack as it was */
    else if (sv->none) (void)l->cu->ctx_set(NULL); /* as found: no context current */
    else if (sv->device >= 0 && sv->device != l->cu->device) (void)cudaSetDevice(sv->device);
}

/* The library's own threads (workers, stager, retirer) live on its device.
   A worker that cannot get there stops the pipeline, as the stager and
   the retirer do, through the same start (pf__helper_begin): a load that
   calls CUDA would run on another GPU (an outside trial saw only a
   warning, and the run go on). */
static void pf__helper_begin(pf_loader *l, int by, const char *who, char *logmsg, size_t n);
static void pf__bind_thread_cuda(pf_loader *l) {
    char m[PF__MSG_SIZE] = "";
    pf__helper_begin(l, PF__BY_LOAD, "worker thread", m, sizeof m);
    pf__unlock_wake(l);
    if (m[0]) pf__log(&l->cfg, PF_LOG_ERROR, "%s", m);
}

/* What the machine has, in words, for a "no usable device" message: no
   driver at all, a driver too old for this runtime, or a driver that sees
   no device. DOC (cudaDriverGetVersion): "If no driver is installed, then 0
   is returned as the driver version." */
static void pf__cuda_found(char *dst, size_t n, cudaError_t e, int count) {
    int drv = 0, rt = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = -1;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = 0;
    (void)cudaGetLastError();
    if (drv == 0)
        pf__format(dst, n, "no NVIDIA driver is installed (cudaDriverGetVersion reports none)");
    else if (drv > 0 && (e == cudaErrorInsufficientDriver || (rt > 0 && drv < rt)))
        pf__format(dst, n, "the NVIDIA driver's version is insufficient: it supports CUDA %d.%d, this program's "
                   "runtime is CUDA %d.%d (update the driver)", drv / 1000, drv % 1000 / 10, rt / 1000,
                   rt % 1000 / 10);
    else if (drv > 0 && (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)))
        pf__format(dst, n, "the NVIDIA driver (CUDA %d.%d) finds no device (check CUDA_VISIBLE_DEVICES)",
                   drv / 1000, drv % 1000 / 10);
    else
        pf__format(dst, n, "the CUDA runtime cannot use a device");
}

/* Is there a device to use? PF_OK, PF_ERR_NO_DEVICE (what was found, and
   the runtime's message) or PF_ERR_INVALID_ARG (cuda_device out of range).
   Creates no context: cudaGetDeviceCount does not. */
static pf_result pf__cuda_probe(const pf_config *c, char *why, size_t n) {
    int count = 0;
    char found[PF__MSG_SIZE];
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        char m[PF__MSG_SIZE];
        pf__cuda_msg(m, sizeof m, "cudaGetDeviceCount", e);
        (void)cudaGetLastError();
        pf__cuda_found(found, sizeof found, e, 0);
        pf__format(why, n, "no usable CUDA device: %s; %s", found, m);
        return pf__cuda_no_device(e) ? PF_ERR_NO_DEVICE : PF_ERR_CUDA;
    }
    if (count <= 0) {
        pf__cuda_found(found, sizeof found, e, 0);
        pf__format(why, n, "no usable CUDA device: %s; cudaGetDeviceCount reports 0 devices", found);
        return PF_ERR_NO_DEVICE;
    }
    if (c->cuda_device >= count) {
        pf__format(why, n, "cfg.cuda_device is %d: must be 0 .. %d (the runtime reports %d device%s)",
                   c->cuda_device, count - 1, count, count == 1 ? "" : "s");
        return PF_ERR_INVALID_ARG;
    }
    return PF_OK;
}

/* Packed batches' offsets (>>samples) on the device: count + 1 words, in a
   table per device slot after the device slots, staged through a pinned
   table per host slot (the host slot's, so it is reused only once the
   retirer saw the copy that read it, as the slot is), all host_slots of
   them before the first pinned slot: autotune grows the slots, in blocks
   of their own, and the tables stay where they are. */
static size_t pf__offsets_stride(const pf_loader *l) {
    return pf__align_up(((size_t)l->cfg.batch_size + 1) * sizeof(uint64_t));
}
static uint64_t *pf__dev_offsets(const pf_loader *l, uint32_t d) {
    return (uint64_t *)(l->cu->dev + (size_t)l->cfg.device_slots * l->stride + (size_t)d * pf__offsets_stride(l));
}
static uint64_t *pf__pinned_offsets(const pf_loader *l, uint32_t h) {
    return (uint64_t *)(l->cu->pinned + (size_t)h * pf__offsets_stride(l));
}

/* Pinned block, device block, copy stream, and the events. Flags: the
   per-batch events (copied, released) are only waited on by streams and
   queried, so DisableTiming alone, which the runtime says performs best for
   cudaStreamWaitEvent and cudaEventQuery; BlockingSync only on the events a
   host thread sleeps on (hdone for the retirer, drain for destroy), so a
   waiting thread sleeps instead of spinning a core. The marks keep timing:
   the verdict reads the GPU's time between them, and hdone's, the copy's
   end (one timed event per batch, where an extra mark would be a second
   record). */
static pf_result pf__cuda_create(pf_loader *l, char *why, size_t n) {
    pf__cuda *cu = l->cu;
    size_t host_bytes = (size_t)l->ring.nalloc * l->stride, dev_bytes = (size_t)l->cfg.device_slots * l->stride;
    size_t host_off = (size_t)l->ring.nslots * pf__offsets_stride(l);
    size_t dev_off = (size_t)l->cfg.device_slots * pf__offsets_stride(l);
    const unsigned per_batch = cudaEventDisableTiming, host_wait = cudaEventDisableTiming | cudaEventBlockingSync,
                   timed = cudaEventDefault, timed_wait = cudaEventBlockingSync;
    char m[PF__MSG_SIZE];
    cudaError_t e;
    pf_result r = PF_OK;
    pf__ctx_saved sv;
    uint32_t d;
    cu->device = l->cfg.cuda_device;
    cu->consumer = (cudaStream_t)l->cfg.stream;
    cu->last_released = -1;
    if (host_bytes > SIZE_MAX - host_off || dev_bytes > SIZE_MAX - dev_off) {
        pf__format(why, n, "pf_create: host_slots and device_slots of %llu bytes and their offsets tables do not "
                   "fit in memory", (unsigned long long)l->stride);
        return PF_ERR_NO_MEMORY;
    }
    host_bytes += host_off;
    dev_bytes += dev_off;
    pf__cuda_ctx_init(cu);
#define PF__CUDA_TRY(call, code, ...)                                                                     \
    if ((e = (call)) != cudaSuccess) {                                                                    \
        char what[PF__MSG_SIZE];                                                                          \
        pf__format(what, sizeof what, __VA_ARGS__);                                                       \
        pf__cuda_msg(m, sizeof m, what, e);                                                               \
        pf__format(why, n, "pf_create: %s", m);                                                           \
        r = (code);                                                                                       \
        goto done;                                                                                        \
    }
    PF__CUDA_TRY(pf__cuda_enter(l, &sv), pf__cuda_code(e), "cudaSetDevice(%d)", cu->device)
    PF__CUDA_TRY(cudaHostAlloc((void **)&cu->pinned, host_bytes, cudaHostAllocDefault),
                 pf__cuda_code(e) == PF_ERR_CUDA ? PF_ERR_NO_MEMORY : pf__cuda_code(e),
                 "cudaHostAlloc of %llu pinned bytes (host_slots %u x %llu, and %u offsets tables)",
                 (unsigned long long)host_bytes, (unsigned)l->ring.nalloc, (unsigned long long)l->stride,
                 (unsigned)l->ring.nslots)
    PF__CUDA_TRY(cudaMalloc((void **)&cu->dev, dev_bytes),
                 pf__cuda_code(e) == PF_ERR_CUDA ? PF_ERR_NO_MEMORY : pf__cuda_code(e),
                 "cudaMalloc of %llu device bytes (device_slots %u x %llu, and their offsets tables)",
                 (unsigned long long)dev_bytes, (unsigned)l->cfg.device_slots, (unsigned long long)l->stride)
    PF__CUDA_TRY(cudaStreamCreateWithFlags(&cu->copy, cudaStreamNonBlocking), pf__cuda_code(e),
                 "cudaStreamCreateWithFlags(copy stream, cudaStreamNonBlocking)")
#ifdef PREFETCH_NVTX
    nvtxNameCudaStreamA(cu->copy, "prefetch.h copy");
#endif
    for (d = 0; d < l->cfg.device_slots; d++) {
        PF__CUDA_TRY(cudaEventCreateWithFlags(&cu->copied[d], per_batch), pf__cuda_code(e),
                     "cudaEventCreateWithFlags(copied[%u])", (unsigned)d)
        PF__CUDA_TRY(cudaEventCreateWithFlags(&cu->released[d], per_batch), pf__cuda_code(e),
                     "cudaEventCreateWithFlags(released[%u])", (unsigned)d)
    }
    for (d = 0; d < cu->nhdone; d++)
        PF__CUDA_TRY(cudaEventCreateWithFlags(&cu->hdone[d], timed_wait), pf__cuda_code(e),
                     "cudaEventCreateWithFlags(hdone[%u])", (unsigned)d)
    for (d = 0; d < l->ring.nslots; d++) {
        PF__CUDA_TRY(cudaEventCreateWithFlags(&cu->reached[d], timed), pf__cuda_code(e),
                     "cudaEventCreateWithFlags(reached[%u])", (unsigned)d)
        PF__CUDA_TRY(cudaEventCreateWithFlags(&cu->fed[d], timed), pf__cuda_code(e),
                     "cudaEventCreateWithFlags(fed[%u])", (unsigned)d)
    }
    PF__CUDA_TRY(cudaEventCreateWithFlags(&cu->drain, host_wait), pf__cuda_code(e),
                 "cudaEventCreateWithFlags(drain)")
    /* "cudaEventRecord() will fail if the input event and input stream are
       associated to different devices" (CUDA C Programming Guide, "Stream
       and Event Behavior"): a cfg.stream of another GPU than cfg.cuda_device
       is named now, not a failed call at the first batch (an outside trial:
       the stream made before cudaSetDevice(local rank)). Harmless on the
       right one: drain is recorded again at pf_destroy. */
    PF__CUDA_TRY(cudaEventRecord(cu->drain, cu->consumer), PF_ERR_INVALID_ARG,
                 "cudaEventRecord(drain, cfg.stream) on device %d (cfg.cuda_device): is cfg.stream a stream of "
                 "another GPU? Create it after cudaSetDevice(%d)", l->cfg.cuda_device, l->cfg.cuda_device)
#undef PF__CUDA_TRY
    for (d = 0; d < l->ring.nalloc; d++) l->ring.slots[d].data = cu->pinned + host_off + (size_t)d * l->stride;
done:
    if (r != PF_OK) (void)cudaGetLastError(); /* leave no error behind for the caller's next call */
    pf__cuda_leave(l, &sv);
    return r;
}

/* The errors after which, in NVIDIA's words, "This leaves the process in
   an inconsistent state and any further CUDA work will return the same
   error. To continue using CUDA, the process must be terminated and
   relaunched." (CUDA Runtime API, enum cudaError: 700 illegal address,
   702 launch timeout, 714-719 the other exceptions in a kernel, 911 an
   external device's); and 710, an assert in device code: "The device
   cannot be used again. All existing allocations are invalid." Numbers,
   not names: every toolkit this header builds against knows them by
   number. After one of them no work of the context runs any more. */
static bool pf__cuda_dead(cudaError_t e) {
    int c = (int)e;
    return c == 700 || c == 702 || c == 710 || (c >= 714 && c <= 719) || c == 911;
}
/* Wait for stream s's work; a wait that failed proves nothing about the
   work it waited for, so the device's next (an outside trial: a
   cudaEventSynchronize that kept failing, and cudaFree raced a kernel of
   the caller's still reading a held batch). true: one of them succeeded;
   else *last is the error. */
static bool pf__cuda_drain_stream(cudaStream_t s, cudaError_t *last) {
    cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) *last = e;
    return e == cudaSuccess;
}

/* After the threads are joined. Nothing here may wait for ever: after a
   device fault every sync answers the sticky error at once.
   1. Drain the copy stream: its copies read the pinned block, and
      cudaFreeHost documents no implicit synchronisation (cudaFree only
      "may perform" one).
   2. Record `drain` on the consumer stream and wait for it: the GPU has
      then passed every release and every kernel the caller queued on a
      batch it still holds, so the device block is free to go. This is why
      destroy with batches held is fine on both backends.
   A wait that fails is followed by the next way (pf__cuda_drain_stream); if
   none succeeds on a context that still runs, the blocks are left
   allocated, with a warning, rather than freed under work that may use
   them.
   3. Destroy the events and the stream, free both blocks. */
static void pf__cuda_destroy(pf_loader *l) {
    pf__cuda *cu = l->cu;
    pf__ctx_saved sv;
    uint32_t d;
    /* a pending error of the caller's is theirs to read: clear only ours */
    cudaError_t theirs = cudaPeekAtLastError(), e = pf__cuda_enter(l, &sv), last = cudaSuccess;
    bool copied = !cu->copy || pf__cuda_drain_stream(cu->copy, &last), drained = !l->st.batches, keep;
    (void)e; /* even without the device, free what we can */
    if (!drained && cu->drain && cudaEventRecord(cu->drain, cu->consumer) == cudaSuccess)
        drained = cudaEventSynchronize(cu->drain) == cudaSuccess;
    if (!drained) drained = pf__cuda_drain_stream(cu->consumer, &last); /* NULL: the default stream */
    /* no wait succeeded on a context that still runs: what the blocks
       hold may still be read, so they stay (a leak, said), not freed
       under it; after a device fault nothing runs any more */
    keep = (!copied || !drained) && !pf__cuda_dead(last);
    if (keep)
        pf__log(&l->cfg, PF_LOG_WARN, "pf_destroy: could not wait for the GPU to finish with the loader's memory "
                "(%s: %s): its pinned and device blocks are left allocated, not freed under work that may still "
                "use them", copied ? "the consumer stream" : "the copy stream", cudaGetErrorString(last));
    for (d = 0; d < l->cfg.device_slots; d++) {
        if (cu->copied && cu->copied[d]) (void)cudaEventDestroy(cu->copied[d]);
        if (cu->released && cu->released[d]) (void)cudaEventDestroy(cu->released[d]);
    }
    for (d = 0; cu->hdone && d < cu->nhdone; d++)
        if (cu->hdone[d]) (void)cudaEventDestroy(cu->hdone[d]);
    for (d = 0; cu->reached && d < l->ring.nslots; d++) {
        if (cu->reached[d]) (void)cudaEventDestroy(cu->reached[d]);
        if (cu->fed[d]) (void)cudaEventDestroy(cu->fed[d]);
    }
    if (cu->drain) (void)cudaEventDestroy(cu->drain);
    if (cu->copy) (void)cudaStreamDestroy(cu->copy);
    if (cu->dev && !keep) (void)cudaFree(cu->dev);
    if (cu->pinned && !keep) (void)cudaFreeHost(cu->pinned);
    for (d = 0; d < l->ring.ngrown && !keep; d++) (void)cudaFreeHost(l->ring.grown[d]); /* autotune's growth */
    if (cudaPeekAtLastError() != theirs) (void)cudaGetLastError(); /* one of the calls above failed */
    pf__cuda_leave(l, &sv);
    pf__cuda_ctx_release(cu);
}

static void pf__push_item(pf_loader *l, int kind, uint32_t slot) {
    pf__cuda *cu = l->cu;
    pf__item *it = &cu->fifo[(cu->fifo_head + cu->fifo_count++) % cu->fifo_cap];
    it->kind = kind;
    it->slot = slot;
    it->n = kind == PF__ITEM_EPOCH_END ? l->take.ended_n : 0;
    pf__wake(l, PF__ROLE_CONSUMER);
}

/* A CUDA failure is final for the pipeline: every later pf_next returns it
   at once, before any batch still staged (after a device fault their copies
   may never have happened). The first failure's message is kept; every
   thread that might wait on it is woken. Only the consumer's own calls
   write pf_error's text (lock held, any thread). */
/* A CUDA error: no copy in flight can be trusted to land (CUDA backend). */
static bool pf__copies_dead(const pf_loader *l) { return l->error.code == PF_ERR_CUDA; }
static void pf__cuda_fatal(pf_loader *l, int by, const char *msg) {
    pf__set_error(l, PF_ERR_CUDA, by, true, l->cons.epoch, l->cons.batch, "%s", msg);
    l->cu->stager_done = true;
    pf__wake(l, PF__ROLE_CONSUMER);
    pf__wake(l, PF__ROLE_STAGER);
    pf__wake(l, PF__ROLE_RETIRER);
    pf__wake_all_workers(l);
}

/* One of the consumer's own CUDA calls (in fn, a public call) failed: the
   pipeline stops and m gets "fn: call failed: ..." (lock held; clearing
   the runtime's last error only reads this thread's state). */
static void pf__cuda_consumer_failed(pf_loader *l, const char *fn, const char *call, cudaError_t e, char *m,
                                     size_t n) {
    char what[96];
    (void)cudaGetLastError();
    pf__format(what, sizeof what, "%s: %s", fn, call);
    pf__cuda_msg(m, n, what, e);
    pf__cuda_fatal(l, PF__BY_CONSUMER, m);
}

/* Copy host slot s into device slot d, ordered on the GPU after the
   consumer's release of d, then a packed batch's offsets into d's table
   (through s's pinned one: the stager owns s until the copy is queued, and
   the retirer frees s only after hdone), then record copied[d], which
   pf_next makes the consumer stream wait for, and hdone[seq % nhdone] for
   the retirer. Nothing
   but GPU work goes into the copy stream: no host function, so consecutive
   copies run back to back. No lock held: d's dslot is the stager's until
   it is queued. */
static int pf__stage_copy(pf_loader *l, pf__slot *s, uint32_t d, size_t bytes, uint64_t seq, char *why,
                          size_t n) {
    pf__cuda *cu = l->cu;
    const pf__dslot *ds = &cu->dslots[d];
    size_t obytes = ((size_t)ds->b.count + 1) * sizeof(uint64_t);
    uint32_t k = (uint32_t)(seq % cu->nhdone);
    cudaError_t e;
    char what[PF__MSG_SIZE];
    if (ds->b.sm.packed) memcpy(pf__pinned_offsets(l, s->index), ds->b.sm.mem, obytes);
    if ((e = cudaStreamWaitEvent(cu->copy, cu->released[d], 0)) != cudaSuccess) {
        pf__format(what, sizeof what, "stager: cudaStreamWaitEvent(copy stream, released[%u])", (unsigned)d);
    } else if ((e = cudaMemcpyAsync(cu->dev + (size_t)d * l->stride, s->data, bytes, cudaMemcpyHostToDevice,
                                    cu->copy)) != cudaSuccess) {
        pf__format(what, sizeof what, "stager: cudaMemcpyAsync(%llu bytes, host slot %u -> device slot %u)",
                   (unsigned long long)bytes, (unsigned)s->index, (unsigned)d);
    } else if (ds->b.sm.packed &&
               (e = cudaMemcpyAsync(pf__dev_offsets(l, d), pf__pinned_offsets(l, s->index), obytes,
                                    cudaMemcpyHostToDevice, cu->copy)) != cudaSuccess) {
        pf__format(what, sizeof what, "stager: cudaMemcpyAsync(%llu bytes of offsets, host slot %u -> device slot %u)",
                   (unsigned long long)obytes, (unsigned)s->index, (unsigned)d);
    } else if ((e = cudaEventRecord(cu->copied[d], cu->copy)) != cudaSuccess) {
        pf__format(what, sizeof what, "stager: cudaEventRecord(copied[%u], copy stream)", (unsigned)d);
    } else if ((e = cudaEventRecord(cu->hdone[k], cu->copy)) != cudaSuccess) {
        pf__format(what, sizeof what, "stager: cudaEventRecord(hdone[%u], copy stream)", (unsigned)k);
    } else {
        return PF_OK;
    }
    pf__cuda_msg(why, n, what, e);
    return pf__cuda_code(e);
}

/* A library thread (stager, retirer, worker) starts on the loader's
   device; if it cannot, the pipeline stops with that call named. Returns
   with the lock held. */
static void pf__helper_begin(pf_loader *l, int by, const char *who, char *logmsg, size_t n) {
    cudaError_t e = cudaSetDevice(l->cu->device);
    pf__lock(&l->sync.mu);
    if (e != cudaSuccess) {
        char what[64];
        pf__format(what, sizeof what, "%s: cudaSetDevice(%d)", who, l->cu->device);
        pf__cuda_msg(logmsg, n, what, e);
        pf__cuda_fatal(l, by, logmsg);
    }
}

/* The stager's take: the next loaded batch in delivery order, or a
   marker pushed in its place (an epoch's end, the end of data, the
   pipeline's error). Returns the slot, now STAGING, or NULL: look again
   (it waited, or pushed a marker). Lock held. */
static pf__slot *pf__stager_take(pf_loader *l, char *logmsg, size_t n) {
    pf__cuda *cu = l->cu;
    pf__slot *s = NULL;
    int r;
    if (cu->fifo_count == cu->fifo_cap) {
        if (!pf__spin(l, PF__ROLE_STAGER, NULL)) pf__wait(l, PF__ROLE_STAGER, NULL);
        return NULL;
    }
    r = pf__take(l, &s);
    if (r == PF__WAIT) {
        pf__wake_workers(l, true); /* the taker starves */
        if (!pf__spin(l, PF__ROLE_STAGER, pf__early_news(l))) pf__taker_wait(l, PF__ROLE_STAGER, NULL);
        return NULL;
    }
    if (r == PF_END_OF_EPOCH || r == PF_END_OF_DATA) {
        pf__push_item(l, r == PF_END_OF_EPOCH ? PF__ITEM_EPOCH_END : PF__ITEM_DATA_END, 0);
        cu->stager_done = r == PF_END_OF_DATA;
        return NULL;
    }
    if (r != PF_OK) { /* a load or planning failure: after every batch staged before it */
        pf__push_item(l, PF__ITEM_ERROR, 0);
        cu->stager_done = true;
        if (r != PF_ERR_LOAD) pf__format(logmsg, n, "%s", l->error.msg);
        return NULL;
    }
    pf__move(&s->state, PF__FROM(PF__SLOT_READY), PF__SLOT_STAGING);
    return s;
}

/* The stager's stage: host slot s into the longest-free device slot (it
   waits for one), the copy queued unlocked, then the batch is pushed for
   pf_next and its flight for the retirer. false: stopping, or the copy
   failed (logmsg says why). Lock held. */
static bool pf__stager_stage(pf_loader *l, pf__slot *s, char *logmsg, size_t n) {
    pf__cuda *cu = l->cu;
    pf__dslot *ds;
    pf__flight *f;
    uint32_t d;
    int r;
    char why[PF__MSG_SIZE];
    while (cu->dfree_count == 0 && !l->sync.stopping && !cu->stager_done)
        if (!pf__spin(l, PF__ROLE_STAGER, NULL)) pf__wait(l, PF__ROLE_STAGER, NULL);
    if (l->sync.stopping || cu->stager_done) return false;
    d = cu->dfree[cu->dfree_head];
    cu->dfree_head = (cu->dfree_head + 1) % l->cfg.device_slots;
    cu->dfree_count--;
    ds = &cu->dslots[d];
    pf__move(&ds->state, PF__FROM(PF__SLOT_FREE), PF__SLOT_COPYING);
    { /* the batch moves; the slots trade their lists (pf__desc) */
        pf__desc old = ds->b;
        ds->b = s->b;
        s->b.indices = old.indices;
        s->b.sm = old.sm;
    }
    ds->seq = ++cu->staged;
    ds->landed = false;
    cu->hdone_seq[ds->seq % cu->nhdone] = ds->seq;
    pf__move(&s->state, PF__FROM(PF__SLOT_STAGING), PF__SLOT_COPYING);
    pf__unlock_wake(l);
    PF__RANGE_PUSH("stage epoch %llu batch %llu", (unsigned long long)ds->b.epoch, (unsigned long long)ds->b.batch);
    r = pf__stage_copy(l, s, d, ds->b.bytes, ds->seq, why, sizeof why);
    PF__RANGE_POP();
    pf__lock(&l->sync.mu);
    if (r != PF_OK) { /* d may be half written: out of circulation, like the host slot */
        pf__move(&ds->state, PF__FROM(PF__SLOT_COPYING), PF__SLOT_WRITTEN_OFF);
        pf__cuda_fatal(l, PF__BY_STAGER, why);
        pf__format(logmsg, n, "%s", why);
        return false;
    }
    f = &cu->flights[(cu->flight_head + cu->flight_count++) % l->ring.nslots];
    f->h = s->index;
    f->d = d;
    f->seq = ds->seq;
    pf__wake(l, PF__ROLE_RETIRER);
    pf__move(&ds->state, PF__FROM(PF__SLOT_COPYING), PF__SLOT_READY);
    l->st.copies++;
    l->st.copy_bytes += ds->b.bytes;
    pf__push_item(l, PF__ITEM_BATCH, d);
    return true;
}

static PF__THREAD_FN pf__stager_main(void *arg) {
    pf_loader *l = (pf_loader *)arg;
    char logmsg[PF__MSG_SIZE] = "";
    pf__helper_begin(l, PF__BY_STAGER, "stager", logmsg, sizeof logmsg);
    while (!l->sync.stopping && !l->cu->stager_done) {
        pf__slot *s = pf__stager_take(l, logmsg, sizeof logmsg);
        if (s && !pf__stager_stage(l, s, logmsg, sizeof logmsg)) break;
    }
    pf__unlock_wake(l);
    if (logmsg[0] && !PF__LOAD_FLAG(&l->sync.stopping)) pf__log(&l->cfg, PF_LOG_ERROR, "%s", logmsg);
    PF__THREAD_RETURN;
}

/* Wait for a copy's event. A blocking sync's wake-up costs tens of us,
   as long as a whole 1 MiB copy, and the host slot waits for it: on an
   H100 the 1 MiB copy path ran at 0.4-0.77 of a plain cudaMemcpyAsync loop
   with the sync alone. So first a bounded poll (cudaEventQuery, about
   0.3 us), budgeted and adapted like pf__spin's (a poll that saw the copy
   end doubles the budget, one that did not halves it), and only where a
   CPU is free for it. Lock held on entry and on return, dropped around the
   CUDA calls. */
static cudaError_t pf__retire_wait(pf_loader *l, cudaEvent_t ev) {
    bool seen = false, probe = false;
    uint32_t budget = pf__cpu_free(l) ? pf__spin_budget(l, PF__ROLE_RETIRER, &probe) : 0;
    cudaError_t e = cudaErrorNotReady;
    pf__unlock_wake(l);
    if (budget) {
        uint64_t t0 = pf__now_ns();
        unsigned i;
        while ((e = cudaEventQuery(ev)) == cudaErrorNotReady && pf__now_ns() - t0 < budget)
            for (i = 0; i < 64; i++) PF__CPU_RELAX();
        seen = e != cudaErrorNotReady;
        if (!seen) (void)cudaGetLastError(); /* not ready is an answer, not an error to keep */
    }
    if (!seen) e = cudaEventSynchronize(ev);
    pf__lock(&l->sync.mu);
    if (budget) pf__spin_adapt(l, PF__ROLE_RETIRER, budget, probe, seen);
    return e;
}

/* The retirer gives host slots back. Copies complete in the copy stream's
   order, so it waits for the oldest copy's hdone event (a bounded poll,
   then a BlockingSync sleep: pf__retire_wait), then frees that slot and marks its batch landed for
   pf_batch_wait. This is also how a device fault surfaces when the ring is
   full and the consumer waits: the sync answers the sticky error at once,
   where a host function would simply never run. */
static PF__THREAD_FN pf__retire_main(void *arg) {
    pf_loader *l = (pf_loader *)arg;
    pf__cuda *cu = l->cu;
    char logmsg[PF__MSG_SIZE] = "";
    cudaError_t e;
    pf__helper_begin(l, PF__BY_RETIRER, "retirer", logmsg, sizeof logmsg);
    /* A failed load stops the pipeline, but copies already in flight still
       land, and a batch the caller holds may be waited for (pf_batch_wait):
       only a CUDA error (the copies cannot be trusted) ends the retiring.
       An outside trial held batch 0, saw batch 1 fail, and pf_batch_wait
       on batch 0 failed for ever with batch 1's error. */
    while (!l->sync.stopping && !pf__copies_dead(l)) {
        pf__flight f;
        if (cu->flight_count == 0) {
            pf__wait(l, PF__ROLE_RETIRER, NULL);
            continue;
        }
        f = cu->flights[cu->flight_head];
        e = pf__retire_wait(l, cu->hdone[f.seq % cu->nhdone]);
        if (e != cudaSuccess) {
            char what[96];
            pf__format(what, sizeof what, "retirer: cudaEventSynchronize(copy of host slot %u to device slot %u)",
                       (unsigned)f.h, (unsigned)f.d);
            pf__cuda_msg(logmsg, sizeof logmsg, what, e);
            pf__cuda_fatal(l, PF__BY_RETIRER, logmsg);
            break;
        }
        cu->flight_head = (cu->flight_head + 1) % l->ring.nslots;
        cu->flight_count--;
        if (cu->dslots[f.d].seq == f.seq && !cu->dslots[f.d].landed) {
            cu->dslots[f.d].landed = true;
            pf__wake(l, PF__ROLE_CONSUMER); /* pf_batch_wait */
        }
        pf__slot_free(l, &l->ring.slots[f.h]);
    }
    pf__unlock_wake(l);
    if (logmsg[0] && !PF__LOAD_FLAG(&l->sync.stopping)) pf__log(&l->cfg, PF_LOG_ERROR, "%s", logmsg);
    PF__THREAD_RETURN;
}

/* The GPU time a stream spent waiting for a copy, below which it did not
   wait at all (an already-landed copy still costs the wait a moment). */
#define PF__STREAM_WAITED_US 2.0
#define PF__US_UNKNOWN (-1e300) /* an interval not known (yet); intervals may be negative */

/* Ask the GPU, unlocked (no CUDA call under the lock), about event a, and
   if b is given and a complete, the GPU time from a to b. Returns
   1 a pending; 0 a complete (*us: a to b, negative when b came first, or PF__US_UNKNOWN). An
   error (a sticky device fault) stops the pipeline, named as pf_next's.
   Returns with the lock held. */
static int pf__cuda_ask(pf_loader *l, cudaEvent_t a, cudaEvent_t b, double *us) {
    const char *call = "cudaSetDevice";
    pf__ctx_saved sv;
    cudaError_t e;
    int pending = 0;
    pf__unlock_wake(l);
    e = pf__cuda_enter(l, &sv);
    if (e == cudaSuccess) {
        call = "cudaEventQuery";
        e = cudaEventQuery(a);
        if (e == cudaErrorNotReady) pending = 1, e = cudaSuccess;
    }
    if (e == cudaSuccess && !pending && b) {
        float ms = 0;
        cudaError_t t = cudaEventElapsedTime(&ms, a, b);
        *us = t == cudaSuccess ? (double)ms * 1e3 : PF__US_UNKNOWN;
        if (t != cudaSuccess) (void)cudaGetLastError(); /* b not landed yet: no error left behind */
    }
    pf__cuda_leave(l, &sv);
    pf__lock(&l->sync.mu);
    if (e != cudaSuccess) {
        char m[PF__MSG_SIZE];
        pf__cuda_consumer_failed(l, "pf_next", call, e, m, sizeof m);
    }
    return pending;
}

/* What pf_next waits on, as it begins (see PF__WAIT_*): the next batch is
   loading (INPUT), or every host slot is behind a copy (COPY, seq: the
   oldest batch whose copy is in flight); either is settled by
   pf__cuda_settle when the wait ends. On the input path a query of the
   latest release is also how a device fault is noticed while a load is
   stuck and no copy is in flight. Lock held on entry and return, dropped
   around that query (pf__cuda_ask). */
static pf__wait_on pf__cuda_wait_on(pf_loader *l) {
    pf__cuda *cu = l->cu;
    pf__wait_on on = {PF__WAIT_COPY, cu->flight_count ? cu->flights[cu->flight_head].seq : 0};
    uint32_t i;
    for (i = 0; on.seq && i < l->ring.nslots; i++)
        if (l->ring.slots[i].state == PF__SLOT_FREE || l->ring.slots[i].state == PF__SLOT_LOADING) on.seq = 0;
    if (on.seq) return on;
    if (cu->last_released >= 0) (void)pf__cuda_ask(l, cu->released[cu->last_released], NULL, NULL);
    on.kind = PF__WAIT_INPUT;
    return on;
}

/* A wait ended: was the GPU still busy with batches already handed out?
   Then neither the load nor the copy waited for was what it lacked: the
   wait was backpressure (the GPU is the limit). Settled when the wait
   ends, from the GPU's own record where it can be: at the beginning the
   answer depends on where in the GPU's step the host happens to arrive,
   and whether the copy waited for has started says nothing either (a copy
   held back by the GPU starts late and is seen running).
   - behind copies: the marks pf_next recorded around batch on->seq's wait
     for its copy. The first still pending: the GPU has not even reached
     that batch (GPU). Otherwise the GPU time between the two is how long
     the consumer stream sat waiting for the copy: a wait is copy-bound,
     none is GPU. Read from GPU timestamps, so a host thread scheduled late
     on a busy machine does not change the answer.
   - loading: the latest release, recorded after the work of the batch
     released last. Complete: the GPU sat idle while the batch loaded
     (input-bound).
   Lock held on entry and return, dropped around each query (pf__cuda_ask). */
static int pf__cuda_settle(pf_loader *l, const pf__wait_on *on) {
    pf__cuda *cu = l->cu;
    uint32_t m = (uint32_t)(on->seq % l->ring.nslots), k = (uint32_t)(on->seq % cu->nhdone);
    double us = PF__US_UNKNOWN, copy_us = PF__US_UNKNOWN;
    if (on->kind == PF__WAIT_COPY && cu->mark_seq[m] == on->seq) {
        if (pf__cuda_ask(l, cu->reached[m], cu->fed[m], &us)) return PF__WAIT_GPU;
        if (us > PF__US_UNKNOWN && us < PF__STREAM_WAITED_US) return PF__WAIT_GPU;
        /* The stream sat between the marks, but was that its copy? On a GPU
           that runs streams one after another the gap is also the device's
           own per-operation latency and other streams' work ("Any number of
           other different stream operations could execute in between the
           two measured events", cudaEventElapsedTime). So only the part of
           it the copy was still running counts: from reaching the batch to
           the copy's end (hdone, recorded right behind it). */
        if (cu->hdone_seq[k] == on->seq) {
            (void)pf__cuda_ask(l, cu->reached[m], cu->hdone[k], &copy_us);
            /* unknown: the copy has not ended, and the stream waits for it */
            if (cu->hdone_seq[k] == on->seq && copy_us > PF__US_UNKNOWN)
                return copy_us < PF__STREAM_WAITED_US ? PF__WAIT_GPU : PF__WAIT_COPY;
        }
        return PF__WAIT_COPY;
    }
    if (on->kind == PF__WAIT_INPUT && cu->last_released >= 0 &&
        pf__cuda_ask(l, cu->released[cu->last_released], NULL, NULL))
        return PF__WAIT_GPU;
    return on->kind;
}

static pf_result pf__take_cuda(pf_loader *l, pf_batch *out, const struct timespec *deadline) {
    pf__cuda *cu = l->cu;
    bool timed_out = false;
    pf__wait_on on = {-1, 0};
    uint64_t behind_run = 0;
    for (;;) {
        if (pf__error_due(l)) return pf__show_error(l);
        if (cu->fifo_count) {
            pf__item it = cu->fifo[cu->fifo_head];
            pf__dslot *ds;
            if (it.kind == PF__ITEM_DATA_END) return PF_END_OF_DATA;
            cu->fifo_head = (cu->fifo_head + 1) % cu->fifo_cap;
            cu->fifo_count--;
            pf__wake(l, PF__ROLE_STAGER);
            if (it.kind == PF__ITEM_EPOCH_END) {
                pf__note_epoch_end(l);
                return PF_END_OF_EPOCH;
            }
            if (it.kind == PF__ITEM_ERROR) return pf__show_error(l);
            ds = &cu->dslots[it.slot];
            pf__move(&ds->state, PF__FROM(PF__SLOT_READY), PF__SLOT_HELD);
            ds->ticket = ++l->cons.ticket;
            /* a copy the retirer saw complete cannot be waited for: no marks */
            ds->marked = !ds->landed;
            if (ds->marked) cu->mark_seq[ds->seq % l->ring.nslots] = ds->seq; /* recorded next, in pf__cuda_consume */
            cu->held++;
            pf__deliver(l, out, &ds->b, cu->dev + (size_t)it.slot * l->stride, ds->ticket, it.slot);
            if (ds->b.sm.packed) out->dev_offsets = pf__dev_offsets(l, it.slot);
            return PF_OK;
        }
        /* nothing staged: with every device slot held, nothing can be */
        if (cu->held == l->cfg.device_slots)
            return pf__fail(l, PF_ERR_INVALID_STATE,
                            "pf_next: the caller holds all %u device slots (batches pf_next returned, on any "
                            "thread, not yet released); release one first (or raise cfg.device_slots: at least "
                            "one per thread calling pf_next)", (unsigned)l->cfg.device_slots);
        if (on.kind < 0) { /* once per call, and look again: the lock was dropped */
            on = pf__cuda_wait_on(l);
            continue;
        }
        {
            /* behind a late batch, the host ring full of later ones: the
               stager stages in order, so what this wait credits to input
               counts behind it, as on the host (pf__take_host; without it
               stalls left autotune at 1-2 workers of 4 host slots: 0.4 of
               8 fixed, an outside trial) */
            bool behind = pf__behind_late(l);
            uint64_t input0 = l->st.wait_input_ns;
            pf_result w = pf__wait_or_timeout(l, deadline, &timed_out, &on, pf__cuda_settle);
            if (behind) pf__count_behind(l, l->st.wait_input_ns - input0, &behind_run);
            if (w != PF_OK) return w;
        }
    }
}

static uint64_t pf__device_ticket(pf_loader *l, uint32_t slot) { return l->cu->dslots[slot].ticket; }

/* The consumer stream waits for the copy on the GPU; the host goes on. If
   that fails the batch is not handed out: it is taken back, *out is zeroed
   and the caller owns nothing (the error is sticky). */
static pf_result pf__cuda_consume(pf_loader *l, pf_batch *b) {
    const char *call = "cudaSetDevice";
    pf__ctx_saved sv;
    uint64_t seq = l->cu->dslots[b->pf__slot].seq; /* fixed while the caller holds the batch */
    uint32_t k = (uint32_t)(seq % l->ring.nslots);
    bool marked = l->cu->dslots[b->pf__slot].marked;
    cudaError_t e = pf__cuda_enter(l, &sv);
    /* the marks: the consumer stream reached this batch, then its copy had
       landed too; the GPU time between them is the stream's wait for it.
       A batch that landed before delivery has none: timed records cost
       1.6 us each on an H100, on the training thread. Its stream wait
       stays: it costs 0.3 us and is how pf_next hears of a device fault. */
    if (e == cudaSuccess && marked) {
        call = "cudaEventRecord(reached, consumer stream)";
        e = cudaEventRecord(l->cu->reached[k], l->cu->consumer);
    }
    if (e == cudaSuccess) {
        call = "cudaStreamWaitEvent(consumer stream, copied)";
        e = cudaStreamWaitEvent(l->cu->consumer, l->cu->copied[b->pf__slot], 0);
    }
    if (e == cudaSuccess && marked) {
        call = "cudaEventRecord(fed, consumer stream)";
        e = cudaEventRecord(l->cu->fed[k], l->cu->consumer);
    }
    pf__cuda_leave(l, &sv);
    if (e != cudaSuccess) {
        char m[PF__MSG_SIZE];
        pf__dslot *ds = &l->cu->dslots[b->pf__slot];
        pf__lock(&l->sync.mu);
        pf__cuda_consumer_failed(l, "pf_next", call, e, m, sizeof m);
        pf__fail(l, PF_ERR_CUDA, "%s", m);
        pf__move(&ds->state, PF__FROM(PF__SLOT_HELD), PF__SLOT_WRITTEN_OFF); /* the pipeline is stopped */
        ds->ticket = 0;
        l->cu->held--;
        /* counted as delivered (pf__deliver) but never handed out: from
           here no token can say where the caller is */
        l->ck.lost_epoch = ds->b.epoch + 1;
        l->ck.lost_batch = ds->b.batch;
        pf__unlock_wake(l);
        memset(b, 0, sizeof *b);
        pf__log(&l->cfg, PF_LOG_ERROR, "%s", m);
        return PF_ERR_CUDA;
    }
    return PF_OK;
}

static pf_result pf__next_cuda(pf_loader *l, pf_batch *out) {
    bool progress;
    pf_result r = pf__next_frame(l, out, pf__take_cuda, &progress);
    if (r == PF_OK) r = pf__cuda_consume(l, out); /* unlocked: a CUDA call */
    return pf__next_done(l, r, progress);
}

/* Record released[d] on the consumer stream, then hand d to the stager,
   whose next copy into d waits for that event on the GPU. Claimed under
   the lock first: the ticket (a racing second release of the batch fails)
   and the held count (a racing pf_next waits for d instead of calling
   itself stuck with every slot held); d reaches the stager only after the
   record. */
static pf_result pf__release_cuda(pf_loader *l, pf_batch *b) {
    pf__cuda *cu = l->cu;
    uint32_t d;
    pf__ctx_saved sv;
    const char *call = "cudaSetDevice";
    cudaError_t e;
    pf_result r;
    pf__lock(&l->sync.mu);
    r = pf__check_batch(l, b, "pf_release", l->cfg.device_slots, pf__device_ticket);
    if (r != PF_OK) {
        pf__unlock_wake(l);
        return r;
    }
    d = b->pf__slot;
    cu->dslots[d].ticket = 0; /* claimed by this release: a racing second release fails */
    cu->held--;
    b->pf__ticket = 0;
    pf__unlock_wake(l);
    e = pf__cuda_enter(l, &sv);
    if (e == cudaSuccess) {
        call = "cudaEventRecord(released, consumer stream)";
        e = cudaEventRecord(cu->released[d], cu->consumer);
    }
    pf__cuda_leave(l, &sv);
    pf__lock(&l->sync.mu);
    if (e != cudaSuccess) {
        /* the GPU may still read d and nothing orders the next copy after
           it: keep d out of circulation, stop the pipeline */
        char m[PF__MSG_SIZE];
        pf__move(&cu->dslots[d].state, PF__FROM(PF__SLOT_HELD), PF__SLOT_WRITTEN_OFF); /* the pipeline stops */
        pf__cuda_consumer_failed(l, "pf_release", call, e, m, sizeof m);
        r = pf__fail(l, PF_ERR_CUDA, "%s", m);
    } else {
        pf__move(&cu->dslots[d].state, PF__FROM(PF__SLOT_HELD), PF__SLOT_FREE);
        cu->dfree[(cu->dfree_head + cu->dfree_count++) % l->cfg.device_slots] = d;
        cu->last_released = d;
        pf__wake(l, PF__ROLE_STAGER);
    }
    pf__unlock_wake(l);
    return r;
}

/* The batch's copy has landed once the retirer saw its hdone event: wait on
   the consumer condition for that (bounded by timeout_ms like pf_next), so
   no thread spins on an event. */
static pf_result pf__batch_wait_cuda(pf_loader *l, const pf_batch *b) {
    struct timespec deadline;
    bool timed_out = false;
    pf_result r;
    if (l->cfg.timeout_ms) deadline = pf__deadline(l->cfg.timeout_ms);
    pf__lock(&l->sync.mu);
    r = pf__check_batch(l, b, "pf_batch_wait", l->cfg.device_slots, pf__device_ticket);
    while (r == PF_OK && !l->cu->dslots[b->pf__slot].landed) {
        if (pf__copies_dead(l)) { /* else it lands (the retirer goes on: pf__retire_main) */
            r = pf__fail(l, (pf_result)l->error.code, "pf_batch_wait: %s", l->error.msg);
            break;
        }
        if (timed_out) {
            r = pf__fail(l, PF_TIMEOUT, "pf_batch_wait: timed out after %u ms: the copy of epoch %llu batch %llu "
                         "has not landed", (unsigned)l->cfg.timeout_ms, (unsigned long long)b->epoch,
                         (unsigned long long)b->batch);
            break;
        }
        timed_out = pf__consumer_wait(l, l->cfg.timeout_ms ? &deadline : NULL) != 0;
    }
    pf__unlock_wake(l);
    return r;
}

/* The consumer's epoch, once the stager retired its plan: every batch of
   it is staged, so the first item of it in the FIFO says its size (an
   epoch of no batches: its end marker). Lock held. */
static bool pf__staged_epoch_n_cuda(const pf_loader *l, uint64_t *n) {
    const pf__cuda *cu = l->cu;
    uint32_t i;
    for (i = 0; i < cu->fifo_count; i++) {
        const pf__item *it = &cu->fifo[(cu->fifo_head + i) % cu->fifo_cap];
        if (it->kind == PF__ITEM_EPOCH_END) return *n = it->n, true;
        if (it->kind == PF__ITEM_BATCH && cu->dslots[it->slot].b.epoch == l->cons.epoch)
            return *n = cu->dslots[it->slot].b.n, true;
        if (it->kind != PF__ITEM_BATCH) break;
    }
    return false;
}

static void pf__stats_cuda(pf_loader *l, pf_stats *out) { /* lock held */
    uint32_t i;
    out->device_slots = l->cfg.device_slots;
    for (i = 0; i < l->cfg.device_slots; i++) {
        out->device_ready += l->cu->dslots[i].state == PF__SLOT_READY;
        out->device_held += l->cu->dslots[i].state == PF__SLOT_HELD;
    }
}


/* Autotune grew the ring: pinned memory for slots from .. to-1, one more
   block (called without the lock, by the worker that set ring.growing, on
   the loader's device like every worker). Their events exist from
   pf_create. */
static bool pf__grow_slots_cuda(pf_loader *l, uint32_t from, uint32_t to) {
    pf__ctx_saved sv;
    unsigned char *p = NULL;
    uint32_t i;
    bool ok = pf__cuda_enter(l, &sv) == cudaSuccess &&
              cudaHostAlloc((void **)&p, (size_t)(to - from) * l->stride, cudaHostAllocDefault) == cudaSuccess;
    if (!ok) (void)cudaGetLastError();
    pf__cuda_leave(l, &sv);
    if (!ok) return false;
    l->ring.grown[l->ring.ngrown++] = p;
    for (i = from; i < to; i++) l->ring.slots[i].data = p + (size_t)(i - from) * l->stride;
    return true;
}

/* Autotune gave a block back: every slot in it is FREE, so no copy reads
   it (the retirer saw each one end). */
static void pf__shrink_slots_cuda(pf_loader *l, void *block) {
    pf__ctx_saved sv;
    if (pf__cuda_enter(l, &sv) == cudaSuccess && cudaFreeHost(block) != cudaSuccess) (void)cudaGetLastError();
    pf__cuda_leave(l, &sv);
}

static pf_result pf__start_helpers_cuda(pf_loader *l, char *why, size_t n) {
    if (PF__THREAD_START(&l->cu->stager, pf__stager_main, l) != 0) {
        pf__format(why, n, "pf_create: could not start the stager thread");
        return PF_ERR_THREAD;
    }
    l->cu->stager_started = true;
    if (PF__THREAD_START(&l->cu->retirer, pf__retire_main, l) != 0) {
        pf__format(why, n, "pf_create: could not start the retirer thread");
        return PF_ERR_THREAD;
    }
    l->cu->retirer_started = true;
    return PF_OK;
}

static void pf__join_helpers_cuda(pf_loader *l) {
    if (l->cu->stager_started) pf__thread_join(l->cu->stager);
    if (l->cu->retirer_started) pf__thread_join(l->cu->retirer);
}

/* The CUDA backend's bookkeeping, in the loader's one block: device
   slots, their free list, the staged FIFO, the events and the flights. */
enum { PF__OFF_STATE, PF__OFF_DSLOTS, PF__OFF_DFREE, PF__OFF_ITEMS, PF__OFF_COPIED, PF__OFF_RELEASED,
       PF__OFF_EVENTS, PF__OFF_MARKSEQ, PF__OFF_FLIGHTS, PF__OFF_COUNT };
typedef char pf__off_fits[PF__OFF_COUNT <= PF__BACKEND_OFFSETS ? 1 : -1]; /* pf__build's o_backend */
static uint32_t pf__extra_slots_cuda(const pf_config *c) { return c->device_slots; }
static uint32_t pf__fifo_cap(const pf_config *c, uint32_t plan_cap) { return c->device_slots + plan_cap + 2; }
static void pf__reserve_cuda(pf__layout *lay, const pf_config *c, uint32_t nslots, uint32_t plan_cap, size_t *off) {
    uint32_t dslots = c->device_slots;
    off[PF__OFF_STATE] = pf__reserve(lay, 1, sizeof(pf__cuda));
    off[PF__OFF_DSLOTS] = pf__reserve(lay, dslots, sizeof(pf__dslot));
    off[PF__OFF_DFREE] = pf__reserve(lay, dslots, sizeof(uint32_t));
    off[PF__OFF_ITEMS] = pf__reserve(lay, pf__fifo_cap(c, plan_cap), sizeof(pf__item));
    off[PF__OFF_COPIED] = pf__reserve(lay, dslots, sizeof(cudaEvent_t));
    off[PF__OFF_RELEASED] = pf__reserve(lay, dslots, sizeof(cudaEvent_t));
    off[PF__OFF_EVENTS] = pf__reserve(lay, 4 * (size_t)nslots + dslots, sizeof(cudaEvent_t)); /* reached, fed, hdone */
    off[PF__OFF_MARKSEQ] = pf__reserve(lay, 3 * (size_t)nslots + dslots, sizeof(uint64_t));
    off[PF__OFF_FLIGHTS] = pf__reserve(lay, nslots, sizeof(pf__flight));
}
static void pf__place_cuda(pf_loader *l, unsigned char *base, const size_t *off) {
    pf__cuda *cu = l->cu = (pf__cuda *)(base + off[PF__OFF_STATE]);
    uint32_t i, nslots = l->ring.nslots, dslots = l->cfg.device_slots;
    cu->dslots = (pf__dslot *)(base + off[PF__OFF_DSLOTS]);
    cu->dfree = (uint32_t *)(base + off[PF__OFF_DFREE]);
    cu->fifo = (pf__item *)(base + off[PF__OFF_ITEMS]);
    cu->fifo_cap = pf__fifo_cap(&l->cfg, l->claim.plan_cap);
    cu->copied = (cudaEvent_t *)(base + off[PF__OFF_COPIED]);
    cu->released = (cudaEvent_t *)(base + off[PF__OFF_RELEASED]);
    cu->reached = (cudaEvent_t *)(base + off[PF__OFF_EVENTS]);
    cu->fed = cu->reached + nslots;
    cu->hdone = cu->fed + nslots;
    cu->nhdone = 2 * nslots + dslots;
    cu->mark_seq = (uint64_t *)(base + off[PF__OFF_MARKSEQ]);
    cu->hdone_seq = cu->mark_seq + nslots;
    cu->flights = (pf__flight *)(base + off[PF__OFF_FLIGHTS]);
    for (i = 0; i < dslots; i++) { /* a device slot's lists: after the host slots' (pf__build) */
        cu->dslots[i].b.indices = l->ring.index_mem + (size_t)(nslots + i) * l->cfg.batch_size;
        cu->dslots[i].b.sm.mem = l->ring.sample_mem + (size_t)(nslots + i) * (2 * (size_t)l->cfg.batch_size + 1);
        cu->dfree[i] = i;
    }
    cu->dfree_count = dslots;
}

static const pf__backend_ops pf__cuda_ops = {
    /* backend, taker, helpers */ PF_BACKEND_CUDA, PF__ROLE_STAGER, 2,
    /* extra_slots */ pf__extra_slots_cuda,
    /* reserve, place */ pf__reserve_cuda, pf__place_cuda,
    /* alloc_slots, grow_slots, shrink_slots */ pf__cuda_create, pf__grow_slots_cuda, pf__shrink_slots_cuda,
    /* start_helpers, bind_thread */ pf__start_helpers_cuda, pf__bind_thread_cuda,
    /* next, release, batch_wait */ pf__next_cuda, pf__release_cuda, pf__batch_wait_cuda,
    /* stats, staged_epoch_n */ pf__stats_cuda, pf__staged_epoch_n_cuda,
    /* join_helpers, free_slots */ pf__join_helpers_cuda, pf__cuda_destroy};

/* Which backend a config gets, when it did not ask for the host: *ops the
   CUDA backend, or PF__USE_HOST (DEFAULT found no usable GPU; why says
   what it found), or the error that ends pf_create. */
static int pf__choose_gpu(const pf_config *c, const pf__backend_ops **ops, char *why, size_t n) {
    pf_result r = pf__cuda_probe(c, why, n);
    if (r == PF_OK && pf__slots_overflow(c->batch_bytes, c->device_slots)) {
        pf__format(why, n, "cfg.batch_bytes is %llu: device_slots (%u) slots of it do not fit in memory",
                   (unsigned long long)c->batch_bytes, (unsigned)c->device_slots);
        return PF_ERR_INVALID_ARG;
    }
    if (r == PF_OK) {
        *ops = &pf__cuda_ops;
        return PF_OK;
    }
    (void)cudaGetLastError();
    return c->backend == PF_BACKEND_CUDA || r == PF_ERR_INVALID_ARG ? r : PF__USE_HOST;
}
#else
static int pf__choose_gpu(const pf_config *c, const pf__backend_ops **ops, char *why, size_t n) {
    (void)ops;
    if (c->backend == PF_BACKEND_CUDA) {
        pf__format(why, n, "cfg.backend is PF_BACKEND_CUDA, but prefetch.h was compiled without CUDA: "
                           "define PREFETCH_CUDA and link -lcudart, or build with nvcc");
        return PF_ERR_NO_DEVICE;
    }
    pf__format(why, n, "prefetch.h was compiled without CUDA (define PREFETCH_CUDA and link -lcudart, "
                       "or build with nvcc)");
    return PF__USE_HOST;
}
#endif /* PREFETCH_CUDA */

/* >>launcher -------------------------------------------------------------- */
/* A decimal number and nothing else; -1 when absent, -2 when malformed. */
static long long pf__env_number(const char *name, const char **text) {
    /* reading the launcher's environment is the point: call it once at
       startup, not against a concurrent setenv */
    const char *v = getenv(name); /* NOLINT(concurrency-mt-unsafe) */
    char *end;
    unsigned long long n;
    *text = v;
    if (!v) return -1;
    if (*v < '0' || *v > '9') return -2;
    n = strtoull(v, &end, 10);
    if (*end || n > PF__MAX_WORLD * 16ull) return -2;
    return (long long)n;
}

/* How many devices CUDA_VISIBLE_DEVICES makes visible, read as the runtime
   reads it: entries up to the first one that is not a device (an index, or
   a GPU-/MIG- UUID) count, the rest is ignored. So "0,1," is two devices,
   "0,,1" one, "-1" none. */
static long long pf__visible_devices(const char *v) {
    long long k = 0;
    for (;;) {
        const char *e = v;
        while (*e == ' ') e++;
        if (*e >= '0' && *e <= '9') {
            while (*e >= '0' && *e <= '9') e++;
        } else if (!strncmp(e, "GPU-", 4) || !strncmp(e, "MIG-", 4)) {
            while (*e && *e != ',') e++;
        } else {
            return k;
        }
        while (*e == ' ') e++;
        if (*e != ',' && *e) return k; /* "1x": not a device, and nothing after it counts */
        k++;
        if (!*e) return k;
        v = e + 1;
    }
}

PF_API pf_result pf_shard_from_env(pf_config *cfg) {
    static const struct {
        const char *launcher, *rank, *size, *local;
    } env[] = {
        {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
        {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"MPICH/PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
        {"SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    };
    char *why = pf__create_error;
    size_t n = sizeof pf__create_error, i;
#define PF__ENV_BAD(...) return (pf__format(why, n, __VA_ARGS__), PF_ERR_INVALID_ARG)
    if (!cfg) PF__ENV_BAD("pf_shard_from_env: cfg is NULL");
    for (i = 0; i < sizeof env / sizeof env[0]; i++) {
        const char *tr, *ts, *tl;
        long long rank = pf__env_number(env[i].rank, &tr), size = pf__env_number(env[i].size, &ts);
        long long local = pf__env_number(env[i].local, &tl);
        if (rank == -1 && size == -1) continue; /* not this launcher */
        if (rank == -2)
            PF__ENV_BAD("%s=\"%s\" (%s) is not a rank: expected a number from 0 to %u", env[i].rank, tr,
                        env[i].launcher, PF__MAX_WORLD - 1);
        if (size == -2 || size == 0)
            PF__ENV_BAD("%s=\"%s\" (%s) is not a world size: expected a number from 1 to %u", env[i].size, ts,
                        env[i].launcher, PF__MAX_WORLD);
        if (rank == -1) PF__ENV_BAD("%s is set (%s) but %s is not", env[i].size, env[i].launcher, env[i].rank);
        if (size == -1) PF__ENV_BAD("%s is set (%s) but %s is not", env[i].rank, env[i].launcher, env[i].size);
        if (size > (long long)PF__MAX_WORLD)
            PF__ENV_BAD("%s=%lld (%s): at most %u ranks are supported", env[i].size, size, env[i].launcher,
                        PF__MAX_WORLD);
        if (rank >= size)
            PF__ENV_BAD("%s=%lld is not below %s=%lld (%s)", env[i].rank, rank, env[i].size, size, env[i].launcher);
        if (local == -2)
            PF__ENV_BAD("%s=\"%s\" (%s) is not a local rank: expected a number from 0 to %u", env[i].local, tl,
                        env[i].launcher, PF__MAX_WORLD - 1);
        if (local >= size)
            PF__ENV_BAD("%s=%lld is not below %s=%lld (%s)", env[i].local, local, env[i].size, size, env[i].launcher);
        cfg->rank = (uint32_t)rank;
        cfg->world_size = (uint32_t)size;
        if (local >= 0) {
            /* with CUDA_VISIBLE_DEVICES the process sees only its own list */
            const char *vis = getenv("CUDA_VISIBLE_DEVICES"); /* NOLINT(concurrency-mt-unsafe): as above */
            long long k = vis ? pf__visible_devices(vis) : 0;
            cfg->cuda_device = (int)(k ? local % k : local);
        }
        return PF_OK;
    }
    return PF_OK; /* no launcher: a single process */
#undef PF__ENV_BAD
}

/* >>resume ---------------------------------------------------------------- */
/* A checkpoint is a position, not a state: the order is a pure function of
   (seed, epoch, rank, position), so "the first batch of epoch E not yet
   delivered" (plus, unordered, the few delivered past it) and the global
   position it stands for are enough to continue exactly. The token also
   carries what the order depends on, so a config it does not fit is named
   instead of silently giving another order. */
#define PF__TOKEN_MAGIC "pf1"

static bool pf__checkpoint_n(const pf_loader *l, uint64_t *n) {
    const pf__plan *p;
    if (l->ck.n_known) return *n = l->ck.n, true;
    if (!l->cfg.num_samples_fn) return *n = l->cfg.num_samples, true;
    p = pf__plan_find((pf_loader *)l, l->cons.epoch); /* planned, not yet delivered from */
    if (p) return *n = p->n, true;
    /* CUDA: the stager may have taken the whole epoch and retired its plan.
       false: not planned yet; resuming asks num_samples_fn, as the run would have */
    return l->ops->staged_epoch_n && l->ops->staged_epoch_n(l, n);
}

/* Append to buf (as much as fits) and count the full length in *len, so
   one pass both writes the token and says how long it is. */
static void pf__append(char *buf, size_t size, size_t *len, const char *fmt, ...) PF__PRINTF(4, 5);
static void pf__append(char *buf, size_t size, size_t *len, const char *fmt, ...) {
    va_list ap;
    int m;
    va_start(ap, fmt);
    m = vsnprintf(buf && *len < size ? buf + *len : NULL, buf && *len < size ? size - *len : 0, fmt, ap);
    va_end(ap);
    if (m > 0) *len += (size_t)m;
}

PF_API pf_result pf_checkpoint(pf_loader *l, char *buf, size_t size) {
    char nbuf[24] = "-";
    size_t len = 0;
    uint64_t n, k, pos;
    int listed = 0;
    pf_result r = PF_OK;
    if (!l) return PF_ERR_INVALID_ARG;
    if (!buf) size = 0;
    pf__lock(&l->sync.mu);
    if (l->ck.lost_epoch) {
        r = pf__fail(l, PF_ERR_CUDA, "pf_checkpoint: no token: pf_next took epoch %llu batch %llu but a CUDA error "
                     "kept it from the caller (%s), so no position covers exactly what was trained on; resume from "
                     "the last token taken before the error", (unsigned long long)(l->ck.lost_epoch - 1),
                     (unsigned long long)l->ck.lost_batch, l->error.msg);
        pf__unlock(&l->sync.mu);
        if (buf && size) buf[0] = '\0';
        return r;
    }
    if (pf__checkpoint_n(l, &n)) pf__format(nbuf, sizeof nbuf, "%llu", (unsigned long long)n);
    pos = l->ck.start + (l->ck.low * l->cfg.batch_size - l->ck.first) * l->cfg.world_size;
    pf__append(buf, size, &len,
               PF__TOKEN_MAGIC " epoch=%llu batch=%llu pos=%llu n=%s seed=%llu batch_size=%u shuffle=%d block=%u "
               "window=%u drop_last=%d world=%u rank=%u unordered=%d done=",
               (unsigned long long)l->cons.epoch, (unsigned long long)l->ck.low, (unsigned long long)pos, nbuf,
               (unsigned long long)l->cfg.seed, (unsigned)l->cfg.batch_size, (int)l->cfg.shuffle,
               (unsigned)(l->cfg.shuffle_block > 1 ? l->cfg.shuffle_block : 1),
               (unsigned)(l->cfg.shuffle_block > 1 ? l->cfg.shuffle_window : 0), (int)l->cfg.drop_last,
               (unsigned)l->cfg.world_size, (unsigned)l->cfg.rank, (int)l->cfg.unordered);
    for (k = 1; l->cfg.unordered && k < l->ck.win; k++) /* delivered past the first missing batch */
        if (l->ck.done[(l->ck.low + k) % l->ck.win]) {
            uint64_t b = l->ck.low + k;
            pf__append(buf, size, &len, "%s%llu", listed++ ? "," : "", (unsigned long long)b);
        }
    if (!listed) pf__append(buf, size, &len, "-");
    /* an epoch resumed on another world size numbers its batches from that
       point: say where, so the next resume can check batch against pos */
    if (l->ck.start != l->ck.first * l->cfg.world_size)
        pf__append(buf, size, &len, " from=%llu:%llu", (unsigned long long)(l->ck.first / l->cfg.batch_size),
                   (unsigned long long)l->ck.start);
    /* bad samples so far (written when there were any): a resumed run goes
       on counting from here, so cfg.bad_limit stops it where an
       uninterrupted run stops, and pf_stats.skipped goes on */
    if (l->ck.skipped) pf__append(buf, size, &len, " skipped=%llu", (unsigned long long)l->ck.skipped);
    if (pf__rd_token_step(&l->cfg))
        pf__append(buf, size, &len, " tokens=%llu", (unsigned long long)pf__rd_token_step(&l->cfg));
    if (!buf)
        r = pf__fail(l, PF_ERR_INVALID_ARG, "pf_checkpoint: buf is NULL (the token needs %llu bytes, with its NUL)",
                     (unsigned long long)len + 1);
    else if (len >= size) {
        r = pf__fail(l, PF_ERR_INVALID_ARG, "pf_checkpoint: the token needs %llu bytes (with its NUL), the buffer has %llu",
                     (unsigned long long)len + 1, (unsigned long long)size);
        /* no cut token: one cut in its done list resumes (an outside
           trial: it did), and delivers again the batches it lost */
        if (size) buf[0] = '\0';
    }
    pf__unlock(&l->sync.mu);
    return r;
}

/* A decimal number of at most 64 bits, digits only. false: none, or too
   big (strtoull would clamp it silently). */
static bool pf__parse_u64(const char *p, const char **end, uint64_t *v) {
    uint64_t x = 0;
    const char *q = p;
    for (; *q >= '0' && *q <= '9'; q++) {
        uint64_t d = (uint64_t)(*q - '0');
        if (x > (UINT64_MAX - d) / 10) return false;
        x = x * 10 + d;
    }
    *end = q;
    *v = x;
    return q != p;
}

enum { PF__K_EPOCH, PF__K_BATCH, PF__K_POS, PF__K_N, PF__K_SEED, PF__K_BS, PF__K_SHUFFLE, PF__K_BLOCK,
       PF__K_WINDOW, PF__K_DROP, PF__K_WORLD, PF__K_RANK, PF__K_UNORD, PF__K_DONE, PF__K_COUNT };

/* The token's fields, read but not yet checked against anything. */
typedef struct pf__token {
    uint64_t v[PF__K_COUNT];
    bool has_n;       /* n is a number, not "-"               */
    const char *done; /* the done list's text: "-" or "3,5,9" */
    bool has_from;    /* from=B:P, optional: the epoch was resumed at batch B,
                         position P on another world size         */
    uint64_t from_batch, from_pos;
    bool has_skipped; /* skipped=N, optional: bad samples delivered so far */
    uint64_t skipped;
    uint64_t tokens;  /* tokens=N, optional: the token reader's step (pf__rd_token_step) */
} pf__token;

/* A field's text for a message: at most 20 bytes, non-printable bytes as
   '?', so a token read with fgets (its newline) or binary junk prints as
   one readable line. */
static const char *pf__shown(const char *p, char *dst, size_t size) {
    size_t i;
    for (i = 0; i + 1 < size && i < 20 && p[i] && p[i] != ' '; i++)
        dst[i] = (char)(p[i] >= 0x20 && p[i] < 0x7f ? p[i] : '?');
    dst[i] = '\0';
    return dst;
}

static bool pf__token_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

/* The token's refusals, in pf__read_token and pf__parse_resume: the
   message into why, PF_ERR_INVALID_ARG out. */
#define PF__RBAD(...) return (pf__format(why, wn, __VA_ARGS__), PF_ERR_INVALID_ARG)

/* Split a token into its fields: each once, numbers strictly decimal.
   Fields are separated by blanks; a trailing newline (a token read back
   with fgets) is a blank too. */
static pf_result pf__read_token(const char *tok, pf__token *t, char *why, size_t wn) {
    static const char *const keys[] = {"epoch", "batch", "pos", "n", "seed", "batch_size", "shuffle", "block",
                                       "window", "drop_last", "world", "rank", "unordered", "done"};
    bool seen[PF__K_COUNT] = {false};
    const char *p = tok;
    char shown[24];
    int i;
    memset(t, 0, sizeof *t);
    if (strncmp(p, PF__TOKEN_MAGIC " ", 4) != 0)
        PF__RBAD("cfg.resume is not a prefetch.h checkpoint token (it should start \"" PF__TOKEN_MAGIC " \")");
    p += 4;
    while (*p) {
        const char *eq, *end, *e2;
        size_t klen;
        while (pf__token_space(*p)) p++;
        if (!*p) break;
        for (end = p; *end && !pf__token_space(*end); end++) {}
        eq = (const char *)memchr(p, '=', (size_t)(end - p));
        if (!eq) PF__RBAD("cfg.resume: malformed token near \"%s\"", pf__shown(p, shown, sizeof shown));
        klen = (size_t)(eq - p);
        if (!klen) PF__RBAD("cfg.resume: malformed token: a value without a field name, \"%s\"", pf__shown(p, shown, sizeof shown));
        if (klen == 4 && !strncmp(p, "from", 4)) { /* optional: B:P */
            if (t->has_from) PF__RBAD("cfg.resume: malformed token: from appears twice");
            t->has_from = true;
            if (!pf__parse_u64(eq + 1, &e2, &t->from_batch) || *e2 != ':' ||
                !pf__parse_u64(e2 + 1, &e2, &t->from_pos) || e2 != end)
                PF__RBAD("cfg.resume: malformed token: from=%s is not batch:pos", pf__shown(eq + 1, shown, sizeof shown));
            p = end;
            continue;
        }
        if (klen == 6 && !strncmp(p, "tokens", 6)) { /* optional: the token reader's */
            if (t->tokens) PF__RBAD("cfg.resume: malformed token: tokens appears twice");
            if (!pf__parse_u64(eq + 1, &e2, &t->tokens) || e2 != end || !t->tokens)
                PF__RBAD("cfg.resume: malformed token: tokens=%s is not a step of at least 1 token",
                         pf__shown(eq + 1, shown, sizeof shown));
            p = end;
            continue;
        }
        if (klen == 7 && !strncmp(p, "skipped", 7)) { /* optional: written when not 0 */
            if (t->has_skipped) PF__RBAD("cfg.resume: malformed token: skipped appears twice");
            t->has_skipped = true;
            if (!pf__parse_u64(eq + 1, &e2, &t->skipped) || e2 != end)
                PF__RBAD("cfg.resume: malformed token: skipped=%s is not a number of at most 64 bits",
                         pf__shown(eq + 1, shown, sizeof shown));
            p = end;
            continue;
        }
        for (i = 0; i < PF__K_COUNT; i++)
            if (strlen(keys[i]) == klen && !strncmp(p, keys[i], klen)) break;
        if (i == PF__K_COUNT)
            PF__RBAD("cfg.resume: malformed token: unknown field \"%.*s\"", (int)(klen < 20 ? klen : 20),
                     pf__shown(p, shown, sizeof shown));
        if (seen[i]) PF__RBAD("cfg.resume: malformed token: %s appears twice", keys[i]);
        seen[i] = true;
        if (i == PF__K_DONE) {
            t->done = eq + 1;
        } else if (i == PF__K_N && eq[1] == '-' && end == eq + 2) {
            t->v[i] = 0;
        } else {
            if (!pf__parse_u64(eq + 1, &e2, &t->v[i]) || e2 != end)
                PF__RBAD("cfg.resume: malformed token: %s=%s is not a number of at most 64 bits", keys[i],
                         pf__shown(eq + 1, shown, sizeof shown));
            if (i == PF__K_N) t->has_n = true;
        }
        p = end;
    }
    for (i = 0; i < PF__K_COUNT; i++)
        if (!seen[i]) PF__RBAD("cfg.resume: malformed token: no %s", keys[i]);
    return PF_OK;
}

/* This rank's own token (the same rank of the same world size)? Only its
   skipped= is this rank's count of bad samples: each rank counts its own
   batches' (an outside trial resumed rank 1 from rank 0's token: its
   count went on from rank 0's 25, not its own 32, and cfg.bad_limit
   stopped it 109 batches late). */
static bool pf__token_own(const pf_config *c, const pf__token *t) {
    return t->v[PF__K_WORLD] == c->world_size && t->v[PF__K_RANK] == c->rank;
}

/* A token's fields against the config: the run it continues must be this
   one (seed, batch size, shuffle, drop_last, mode, sizes in range). */
static pf_result pf__check_token_config(const pf_config *c, const pf__token *t, char *why, size_t wn) {
    const uint64_t *v = t->v;
    uint32_t block = c->shuffle_block > 1 ? c->shuffle_block : 1, window = c->shuffle_block > 1 ? c->shuffle_window : 0;
    if (c->bad_limit && pf__token_own(c, t) && t->skipped > c->bad_limit)
        PF__RBAD("resume token has skipped=%llu bad samples already, more than cfg.bad_limit (%llu): the run it "
                 "continues would have stopped", (unsigned long long)t->skipped, (unsigned long long)c->bad_limit);
    if (v[PF__K_SHUFFLE] > 1 || v[PF__K_DROP] > 1 || v[PF__K_UNORD] > 1)
        PF__RBAD("cfg.resume: malformed token: shuffle, drop_last and unordered are 0 or 1");
    if (v[PF__K_SEED] != c->seed)
        PF__RBAD("resume token is for seed %llu, cfg.seed is %llu", (unsigned long long)v[PF__K_SEED],
                 (unsigned long long)c->seed);
    if (v[PF__K_BS] != c->batch_size)
        PF__RBAD("resume token is for batch_size %llu, cfg.batch_size is %u", (unsigned long long)v[PF__K_BS],
                 (unsigned)c->batch_size);
    if (v[PF__K_SHUFFLE] != (uint64_t)c->shuffle)
        PF__RBAD("resume token is for shuffle %s, cfg.shuffle is %s", v[PF__K_SHUFFLE] ? "true" : "false",
                 c->shuffle ? "true" : "false");
    /* the window counts only with a block shuffle (a token then says 0) */
    if (v[PF__K_BLOCK] != block || (block > 1 && v[PF__K_WINDOW] != window))
        PF__RBAD("resume token is for shuffle_block %llu and shuffle_window %llu, the config has %u and %u",
                 (unsigned long long)v[PF__K_BLOCK], (unsigned long long)v[PF__K_WINDOW], (unsigned)block,
                 (unsigned)(block > 1 ? window : c->shuffle_window));
    if (v[PF__K_DROP] != (uint64_t)c->drop_last)
        PF__RBAD("resume token is for drop_last %s, cfg.drop_last is %s", v[PF__K_DROP] ? "true" : "false",
                 c->drop_last ? "true" : "false");
    if (t->tokens && t->tokens != pf__rd_token_step(c)) { /* a token without it: written before it was */
        if (!pf__rd_token_step(c))
            PF__RBAD("resume token is pf_tokens' (steps of %llu tokens), and cfg.load is not pf_tokens'",
                     (unsigned long long)t->tokens);
        PF__RBAD("resume token is for steps of %llu tokens (world_size * B * T), this pf_tokens reader's are %llu: "
                 "its positions would name other tokens", (unsigned long long)t->tokens,
                 (unsigned long long)pf__rd_token_step(c));
    }
    if (t->has_n && !c->num_samples_fn && v[PF__K_N] != c->num_samples)
        PF__RBAD("resume token is for num_samples %llu, cfg.num_samples is %llu%s", (unsigned long long)v[PF__K_N],
                 (unsigned long long)c->num_samples, pf__rd_token_hint(c));
    if (t->has_n && v[PF__K_N] > PF__MAX_SAMPLES) PF__RBAD("cfg.resume: malformed token: n is above 2^62");
    if (v[PF__K_UNORD] != (uint64_t)c->unordered)
        PF__RBAD("resume token is from %s mode, cfg.unordered is %s", v[PF__K_UNORD] ? "unordered" : "in-order",
                 c->unordered ? "true" : "false");
    if (v[PF__K_WORLD] == 0 || v[PF__K_WORLD] > PF__MAX_WORLD)
        PF__RBAD("cfg.resume: malformed token: world=%llu must be 1 .. %u", (unsigned long long)v[PF__K_WORLD],
                 PF__MAX_WORLD);
    if (v[PF__K_RANK] >= v[PF__K_WORLD])
        PF__RBAD("cfg.resume: malformed token: rank=%llu must be below world=%llu", (unsigned long long)v[PF__K_RANK],
                 (unsigned long long)v[PF__K_WORLD]);
    if (c->unordered && (v[PF__K_WORLD] != c->world_size || v[PF__K_RANK] != c->rank))
        PF__RBAD("resume token is from rank %llu of %llu in unordered mode, which resumes only on the same rank and "
                 "world size (cfg: rank %u of %u): use each rank's own token",
                 (unsigned long long)v[PF__K_RANK], (unsigned long long)v[PF__K_WORLD], (unsigned)c->rank,
                 (unsigned)c->world_size);
    if (c->epochs && v[PF__K_EPOCH] > c->epochs)
        PF__RBAD("resume token is at epoch %llu, past cfg.epochs = %u", (unsigned long long)v[PF__K_EPOCH],
                 (unsigned)c->epochs);
    if (v[PF__K_EPOCH] >= PF__MAX_EPOCH)
        PF__RBAD("cfg.resume: malformed token: epoch=%llu must be below 2^62", (unsigned long long)v[PF__K_EPOCH]);
    return PF_OK;
}

/* The position inside its epoch. A run of world w numbers its batches
   from an origin (0:0, or from=B0:P0 where it was resumed on another world
   size) and is then at pos = P0 + (batch - B0) * batch_size * w: batch and
   pos must agree, and batch must lie inside the epoch such a run has.
   Overflow-checked: every product stays below 2^64. *nbatches: the
   epoch's batches as the resumed run will plan it (0: n unknown). */
static pf_result pf__check_token_position(const pf_config *c, const pf__token *t, bool no_done, uint64_t *nbatches,
                                          char *why, size_t wn) {
    const uint64_t *v = t->v;
    char shown[24];
    if (!t->has_n) {
        if (v[PF__K_BATCH] || v[PF__K_POS] || !no_done || t->has_from) /* written only at an epoch's start */
            PF__RBAD("cfg.resume: malformed token: n=- (the epoch's size unknown) with batch=%llu pos=%llu done=%s: "
                     "such a token is written only at an epoch's start", (unsigned long long)v[PF__K_BATCH],
                     (unsigned long long)v[PF__K_POS], pf__shown(t->done, shown, sizeof shown));
    } else {
        uint64_t w = v[PF__K_WORLD], bs = c->batch_size, b = v[PF__K_BATCH], pos = v[PF__K_POS];
        uint64_t b0 = t->has_from ? t->from_batch : 0, p0 = t->has_from ? t->from_pos : 0, rest, per_rank, nb, n;
        bool past;
        pf__plan pl;
        n = t->has_n ? v[PF__K_N] : c->num_samples;
        if (t->has_from && (p0 > n + (uint64_t)PF__MAX_WORLD * bs || b0 > p0 / bs || b0 > b))
            PF__RBAD("cfg.resume: malformed token: from=%llu:%llu is not where an epoch of %llu samples in batches of "
                     "%llu can be resumed before batch=%llu", (unsigned long long)b0, (unsigned long long)p0,
                     (unsigned long long)n, (unsigned long long)bs, (unsigned long long)b);
        past = b - b0 > (UINT64_MAX - p0) / (bs * w);
        if (past || pos != p0 + (b - b0) * bs * w) {
            if (past) pf__format(shown, sizeof shown, "past 2^64");
            else {
                uint64_t at = p0 + (b - b0) * bs * w;
                pf__format(shown, sizeof shown, "%llu", (unsigned long long)at);
            }
            PF__RBAD("cfg.resume: malformed token: pos=%llu does not match batch=%llu: world=%llu ranks at that batch "
                     "(batches of %llu%s) are at position %s", (unsigned long long)pos, (unsigned long long)b,
                     (unsigned long long)w, (unsigned long long)bs, t->has_from ? ", numbered from the from= point" : "",
                     shown);
        }
        rest = n > p0 ? n - p0 : 0;
        per_rank = b0 * bs + (c->drop_last ? rest / w : (rest + w - 1) / w);
        nb = c->drop_last ? per_rank / bs : (per_rank + bs - 1) / bs;
        if (b > nb)
            PF__RBAD("cfg.resume: malformed token: batch=%llu is past the end of epoch %llu, which has %llu batches "
                     "(%llu samples, batches of %llu, world=%llu)", (unsigned long long)b,
                     (unsigned long long)v[PF__K_EPOCH], (unsigned long long)nb, (unsigned long long)n,
                     (unsigned long long)bs, (unsigned long long)w);
        pf__plan_init(&pl, c, v[PF__K_EPOCH], n, pos, b); /* as the resumed run will plan it */
        *nbatches = pl.nbatches;
    }
    return PF_OK;
}

/* An unordered token's done list: the batches delivered past `batch`,
   increasing, inside the window a run can have in flight and inside the
   epoch. Stored into rs->skip (at most cap, when given), counted always. */
static pf_result pf__read_done(const pf_config *c, const pf__token *t, uint64_t nbatches, pf__resume *rs, uint32_t cap,
                               char *why, size_t wn) {
    const uint64_t *v = t->v;
    char shown[24];
    const char *d = t->done;
    uint64_t last = v[PF__K_BATCH];
    if (*d == '-') /* "-" with more after it: a token cut or glued to something */
        PF__RBAD("cfg.resume: malformed token: done=%s is neither - (none) nor a list of batch numbers",
                 pf__shown(t->done, shown, sizeof shown));
    if (!c->unordered)
        PF__RBAD("cfg.resume: malformed token: done=%s in an in-order token (only unordered runs list batches)",
                 pf__shown(t->done, shown, sizeof shown));
    for (;;) {
        const char *e2;
        uint64_t b;
        if (!pf__parse_u64(d, &e2, &b) || (*e2 && *e2 != ',' && !pf__token_space(*e2)))
            PF__RBAD("cfg.resume: malformed token: done=%s is not a list of batch numbers",
                     pf__shown(t->done, shown, sizeof shown));
        if (b <= last)
            PF__RBAD("cfg.resume: malformed token: done lists %llu after %llu (it lists batches past batch=%llu, "
                     "each once, increasing)", (unsigned long long)b, (unsigned long long)last,
                     (unsigned long long)v[PF__K_BATCH]);
        if (b - v[PF__K_BATCH] >= PF__MAX_WINDOW)
            PF__RBAD("cfg.resume: malformed token: done lists %llu, %llu batches past batch=%llu: no run has more "
                     "than %u in flight", (unsigned long long)b, (unsigned long long)(b - v[PF__K_BATCH]),
                     (unsigned long long)v[PF__K_BATCH], PF__MAX_WINDOW);
        if (b >= nbatches)
            PF__RBAD("cfg.resume: malformed token: done lists batch %llu, but epoch %llu has %llu batches",
                     (unsigned long long)b, (unsigned long long)v[PF__K_EPOCH], (unsigned long long)nbatches);
        if (rs->skip && rs->nskip < cap) rs->skip[rs->nskip] = b;
        rs->nskip++;
        rs->skip_max = last = b;
        if (*e2 != ',') break;
        d = e2 + 1;
    }
    return PF_OK;
}

/* Read a token into rs (its done list too when rs->skip is given, at most
   cap entries), checking it against the config and against the epoch it
   names: every field is either what this config would write or a position
   this config can reach. PF_OK, or PF_ERR_INVALID_ARG naming the field. */
static pf_result pf__parse_resume(const pf_config *c, const char *tok, pf__resume *rs, uint32_t cap, char *why,
                                  size_t wn) {
    pf__token t;
    const uint64_t *v = t.v;
    uint64_t nbatches = 0;
    bool no_done;
    pf_result r = pf__read_token(tok, &t, why, wn);
    if (r == PF_OK) r = pf__check_token_config(c, &t, why, wn);
    if (r != PF_OK) return r;
    rs->has_n = t.has_n;
    rs->nskip = 0;
    rs->skip_max = 0;
    rs->others = !pf__token_own(c, &t);
    rs->skipped = t.skipped;
    no_done = t.done[0] == '-' && (t.done[1] == '\0' || pf__token_space(t.done[1]));
    if (c->epochs && v[PF__K_EPOCH] == c->epochs && (v[PF__K_BATCH] || v[PF__K_POS] || !no_done || t.has_from))
        PF__RBAD("resume token is inside epoch %llu (batch=%llu), past the end of data at cfg.epochs = %u: a token "
                 "from a run of more epochs (a token of this run there says batch=0 pos=0 done=-)",
                 (unsigned long long)v[PF__K_EPOCH], (unsigned long long)v[PF__K_BATCH], (unsigned)c->epochs);
    r = pf__check_token_position(c, &t, no_done, &nbatches, why, wn);
    if (r == PF_OK && !no_done) r = pf__read_done(c, &t, nbatches, rs, cap, why, wn);
    if (r != PF_OK) return r;
    rs->epoch = v[PF__K_EPOCH];
    rs->batch = v[PF__K_BATCH];
    rs->pos = v[PF__K_POS];
    rs->n = v[PF__K_N];
    return PF_OK;
#undef PF__RBAD
}

/* Start every cursor at the token's position (it was checked in pf_create). */
static void pf__resume_at(pf_loader *l, const char *tok) {
    char why[PF__MSG_SIZE];
    uint32_t i;
    uint32_t cap = l->ck.rs.nskip; /* pf__build reserved this many */
    if (pf__parse_resume(&l->cfg, tok, &l->ck.rs, cap, why, sizeof why) != PF_OK) return;
    PF_ASSERT(l->ck.rs.nskip == cap);
    l->ck.rs.active = true;
    l->claim.epoch = l->take.epoch = l->cons.epoch = l->ck.rs.epoch;
    l->take.done = l->ck.rs.batch + l->ck.rs.nskip;
    l->ck.low = l->ck.rs.batch;
    l->cons.batch = l->ck.rs.batch + l->ck.rs.nskip;
    l->ck.start = l->ck.rs.pos;
    l->ck.first = l->ck.rs.batch * l->cfg.batch_size;
    l->ck.n = l->ck.rs.n;
    l->ck.n_known = l->ck.rs.has_n;
    /* bad_limit and pf_stats.skipped go on from there: this rank's count,
       which another rank's token does not hold */
    l->ck.skipped = l->st.skipped = l->ck.rs.others ? 0 : l->ck.rs.skipped;
    for (i = 0; i < l->ck.rs.nskip; i++) l->ck.done[l->ck.rs.skip[i] % l->ck.win] = 1;
}

/* >>public ---------------------------------------------------------------- */
static void pf__teardown(pf_loader *l) {
    uint32_t i;
    pf_allocator a = l->cfg.allocator;
    if (l->sync.mu_ok) {
        pf__lock(&l->sync.mu);
        PF__STORE_FLAG(&l->sync.stopping, 1);
        for (i = 0; i < l->sync.cv_ok; i++) pf__broadcast(&l->sync.cv[i]);
        pf__unlock(&l->sync.mu);
    }
    if (l->ops && l->ops->join_helpers) l->ops->join_helpers(l);
    for (i = 0; i < l->pool.started; i++) pf__thread_join(l->pool.w[i].thread);
    /* pf_next's own record: a reader's state, made where pf_next loaded */
    if (l->pool.w && l->pool.w[l->cfg.num_workers].owner) pf__worker_down(l, &l->pool.w[l->cfg.num_workers]);
#if defined(__linux__)
    for (i = 0; l->pool.w && i <= l->cfg.num_workers; i++) /* pf__run_delay_ns's files */
        if (l->pool.w[i].sched_fd1 > 0) close(l->pool.w[i].sched_fd1 - 1);
#endif
    if (l->ops) l->ops->free_slots(l);
    for (i = 0; i < l->sync.cv_ok; i++) pf__cond_destroy(&l->sync.cv[i]);
    if (l->sync.mu_ok) pf__mutex_destroy(&l->sync.mu);
    a.free_fn(l, a.user_data);
}

/* Where a loader's tickets start: its own range, not 1. A pf_batch kept
   past pf_destroy named a slot and a ticket that a new loader, created at
   the same address (malloc reuses it), was giving out too: pf_release
   took it for one of the new loader's held batches and freed that slot
   under its holder (an outside trial). A start mixed from the clock and
   the address puts two loaders' tickets 2^40 apart but for a 2^-21
   chance, and stays below 2^62, so 2^40 batches never wrap to 0
   ("released"). */
static uint64_t pf__ticket_start(const pf_loader *l) {
    uint64_t z = pf__mix(pf__now_ns() ^ (uint64_t)(uintptr_t)l);
    return ((UINT64_C(1) << 61) | (z >> 3)) & ~((UINT64_C(1) << 40) - 1);
}

/* rs0: the token pf_create read (its done list counted, not stored), or
   NULL; it sizes the done set and the skip list. */
static pf_result pf__build(const pf_config *c, const pf__resume *rs0, const pf__backend_ops *ops, pf_loader **out,
                           char *why, size_t n) {
    pf__layout lay = {0, false};
    size_t o_slots, o_free, o_order, o_fifo, o_msgs, o_index, o_plans, o_workers, o_ckdone, o_skip, o_samples, o_grown;
    size_t e_index, e_samples; /* where the index and sample words end */
    size_t o_backend[PF__BACKEND_OFFSETS] = {0};
    uint32_t nslots = c->host_slots, plan_cap = c->host_slots + 2, i, order_n = 1;
    uint32_t dslots = ops->extra_slots ? ops->extra_slots(c) : 0;
    /* unordered: the lead cap and done set span what this backend can have
       in flight (a host slot or a device slot each), or the token's done
       list if it reaches further (it was written with more slots) */
    uint32_t ck_win = nslots + dslots, nskip = rs0 ? rs0->nskip : 0;
    size_t stride = pf__align_up(c->batch_bytes);
    unsigned char *base;
    pf_loader *l;
    if (nskip && rs0->skip_max - rs0->batch >= ck_win) ck_win = (uint32_t)(rs0->skip_max - rs0->batch + 1);
    pf__reserve(&lay, 1, sizeof(pf_loader));
    o_slots = pf__reserve(&lay, nslots, sizeof(pf__slot));
    o_free = pf__reserve(&lay, nslots, sizeof(uint32_t));
    while (order_n < nslots) order_n *= 2; /* nslots <= PF__MAX_SLOTS */
    o_order = pf__reserve(&lay, order_n, sizeof(uint32_t));
    o_fifo = pf__reserve(&lay, nslots, sizeof(uint32_t));
    o_msgs = pf__reserve(&lay, nslots, PF__MSG_SIZE);
    /* count and element size apart: pf__reserve checks the product (a
       32-bit size_t could wrap it before) */
    o_index = pf__reserve(&lay, (size_t)nslots + dslots, (size_t)c->batch_size * sizeof(uint64_t));
    e_index = lay.size;
    o_plans = pf__reserve(&lay, plan_cap, sizeof(pf__plan));
    o_workers = pf__reserve(&lay, (size_t)c->num_workers + 1, sizeof(pf__worker)); /* + pf_next's own (inline) */
    o_ckdone = pf__reserve(&lay, ck_win, 1);
    o_skip = pf__reserve(&lay, nskip, sizeof(uint64_t));
    o_samples = pf__reserve(&lay, (size_t)nslots + dslots, (2 * (size_t)c->batch_size + 1) * sizeof(uint64_t));
    e_samples = lay.size;
    o_grown = pf__reserve(&lay, nslots, sizeof(void *) + sizeof(uint32_t));
    if (ops->reserve) ops->reserve(&lay, c, nslots, plan_cap, o_backend);
    if (lay.overflow) {
        pf__format(why, n, "pf_create: bookkeeping for %u slots of batch_size %u does not fit in memory",
                   (unsigned)(nslots + dslots), (unsigned)c->batch_size);
        return PF_ERR_NO_MEMORY;
    }
    base = (unsigned char *)c->allocator.alloc_fn(lay.size, c->allocator.user_data);
    if (!base) {
        pf__format(why, n, "pf_create: out of memory: %llu bytes of bookkeeping (cfg.allocator)",
                   (unsigned long long)lay.size);
        return PF_ERR_NO_MEMORY;
    }
    /* zeroed but for the slots' index and sample words, written before
       they are read: their pages are touched only by the slots that come to
       be used (with autotune, 3 of 33 slots of 2^24 samples zeroed 12 GiB
       of them at pf_create in an outside trial) */
    memset(base, 0, o_index);
    memset(base + e_index, 0, o_samples - e_index);
    memset(base + e_samples, 0, lay.size - e_samples);
    l = (pf_loader *)base;
    l->cfg = *c;
    l->ops = ops;
    l->cons.ticket = l->cons.ticket0 = pf__ticket_start(l);
    l->stride = stride;
    l->alone_run = (uint32_t)(PF__ALONE_RUN_BYTES / stride); /* once, not a division a load */
    l->ring.nslots = nslots;
    l->sync.fail_seq = UINT64_MAX;
    l->claim.plan_cap = plan_cap;
    l->ring.slots = (pf__slot *)(base + o_slots);
    l->ring.free_stack = (uint32_t *)(base + o_free);
    l->ring.order = (uint32_t *)(base + o_order);
    l->ring.order_mask = order_n - 1;
    l->ring.ready_fifo = (uint32_t *)(base + o_fifo);
    l->ring.msgs = (char *)(base + o_msgs);
    l->ring.index_mem = (uint64_t *)(base + o_index);
    l->ring.sample_mem = (uint64_t *)(base + o_samples);
    l->claim.plans = (pf__plan *)(base + o_plans);
    l->pool.w = (pf__worker *)(base + o_workers);
    l->ck.done = base + o_ckdone;
    l->ck.win = ck_win;
    l->ck.rs.skip = (uint64_t *)(base + o_skip);
    l->ck.rs.nskip = nskip;
    l->ring.grown = (void **)(base + o_grown);
    l->ring.grown_from = (uint32_t *)(l->ring.grown + nslots);
    /* autotune: memory for the ring one worker needs; it grows with them */
    l->ring.nalloc = c->autotune ? pf__ring_slots(1, c) : nslots;
    if (l->ring.nalloc > nslots) l->ring.nalloc = nslots;
    if (c->resume) pf__resume_at(l, c->resume);
    l->cfg.resume = NULL; /* the caller's string: read once, here */
    for (i = 0; i < nslots; i++) {
        pf__slot *s = &l->ring.slots[i];
        s->index = i;
        s->b.indices = l->ring.index_mem + (size_t)i * c->batch_size;
        s->msg = l->ring.msgs + (size_t)i * PF__MSG_SIZE;
        s->b.sm.mem = l->ring.sample_mem + (size_t)i * (2 * (size_t)c->batch_size + 1);
        if (i < l->ring.nalloc) l->ring.free_stack[i] = l->ring.nalloc - 1 - i; /* slot 0 on top */
    }
    l->ring.nfree = l->ring.nalloc;
    l->at.active = c->autotune ? 1 : c->num_workers; /* autotune starts small */
    l->at.floor = 1;
    l->ring.wake_batch = pf__wake_batch(l->ring.nalloc);
    l->sync.ncpu = PF__CPU_COUNT();
    pf__cap_init(l);
    l->ring.caller_share = l->ring.proc_busy = -1; /* none measured yet */
    PF__STORE_FLAG(&pf__lock_spins, l->sync.ncpu > 1 ? 8u : 0u);
    for (i = 0; i < PF__ROLES; i++) {
        l->sync.spin_ns[i] = l->sync.ncpu > 1 ? PF_SPIN_MAX_NS : 0;
        l->sync.spin_every[i] = PF__SPIN_PROBE_MIN;
    }
    *out = l;
    if (ops->place) ops->place(l, base, o_backend);
    return l->ops->alloc_slots(l, why, n);
}

static pf_result pf__start(pf_loader *l, char *why, size_t n) {
    uint32_t i;
    pf_result r;
    if (pf__mutex_init(&l->sync.mu) != 0) goto thread_fail;
    l->sync.mu_ok = true;
    for (l->sync.cv_ok = 0; l->sync.cv_ok < PF__ROLES; l->sync.cv_ok++)
        if (pf__cond_init(&l->sync.cv[l->sync.cv_ok]) != 0) goto thread_fail;
    l->pool.w[l->cfg.num_workers].owner = l; /* the record pf_next loads through (pf__load_inline) */
    l->pool.w[l->cfg.num_workers].id = l->cfg.num_workers;
    pf__format(l->pool.w[l->cfg.num_workers].name, sizeof l->pool.w[0].name, "pf_next, on the caller's thread");
    for (i = 0; i < l->cfg.num_workers; i++) {
        pf__worker *w = &l->pool.w[i];
        w->owner = l;
        w->id = i;
        pf__format(w->name, sizeof w->name, "worker %u", (unsigned)i);
        if (PF__THREAD_START(&w->thread, pf__worker_main, w) != 0) {
            pf__format(why, n, "pf_create: could not start worker thread %u of %u", (unsigned)i,
                       (unsigned)l->cfg.num_workers);
            return PF_ERR_THREAD;
        }
        l->pool.started++;
    }
    r = l->ops->start_helpers ? l->ops->start_helpers(l, why, n) : PF_OK;
    if (r != PF_OK) return r;
    pf__lock(&l->sync.mu); /* everything exists: the workers may start calling user code */
    l->sync.started = true;
    pf__broadcast(&l->sync.cv[PF__ROLE_WORKER]);
    pf__unlock(&l->sync.mu);
    return PF_OK;
thread_fail:
    pf__format(why, n, "pf_create: could not initialise a mutex or condition variable");
    return PF_ERR_THREAD;
}

/* PF_BACKEND_DEFAULT found no usable GPU; why says what was found. What a
   user expects decides what happens next:
   - cfg.stream set: the loop launches kernels on the batches, and host
     pointers would fail in every one of them, far from the cause. So
     pf_create fails with PF_ERR_NO_DEVICE and the reason (set cfg.backend
     = PF_BACKEND_HOST to run on the CPU on purpose).
   - cfg.cuda_device set (not 0) and no stream: the host backend, loudly: a
     warning through cfg.log, or on stderr when there is none (the one
     thing the library ever prints), since the config named a GPU.
   - neither: the fallback DEFAULT promises (the same binary runs on a
     laptop), logged through cfg.log: at WARN when CUDA was compiled in (a
     GPU build running on the CPU is worth a line in any log that shows
     warnings), at INFO when it was not (the CPU was the plan).
   pf_get_backend tells a loop which one it got. Clears why on PF_OK. */
static pf_result pf__host_fallback(const pf_config *c, char *why, size_t n) {
    char found[PF__MSG_SIZE];
    pf__format(found, sizeof found, "%s", why);
    if (c->stream) {
        pf__format(why, n, "%s; cfg.stream is set, so the loop expects device pointers: not falling back to "
                   "the host backend (set cfg.backend = PF_BACKEND_HOST to run on the CPU)", found);
        return PF_ERR_NO_DEVICE;
    }
    why[0] = '\0';
    /* only where a GPU was possible: a CPU build's cuda_device (from
       pf_shard_from_env's local rank, say) names nothing (an outside trial:
       every rank but local rank 0 of a CPU torchrun job printed this) */
    if (c->cuda_device != 0 && PF__HAVE_CUDA) {
        char m[PF__MSG_SIZE];
        pf__format(m, sizeof m, "backend: %s; cfg.cuda_device is %d, but using the host backend: batches are "
                   "host memory (pf_get_backend says PF_BACKEND_HOST)", found, c->cuda_device);
        if (c->log) c->log(c->log_user, PF_LOG_WARN, m);
        else fprintf(stderr, "prefetch.h: warning: %s\n", m);
        return PF_OK;
    }
    pf__log(c, PF__HAVE_CUDA ? PF_LOG_WARN : PF_LOG_INFO, "backend: %s; using the host backend", found);
    return PF_OK;
}

/* pf_create past its checks and the reader's word: c is the config with
   its defaults. */
static pf_result pf__create(pf_config c, pf_loader **out, char *why, size_t n) {
    const pf__backend_ops *ops = &pf__host_ops;
    pf_loader *l = NULL;
    pf__resume rs;
    pf_result r;
    memset(&rs, 0, sizeof rs);
    if (c.resume) { /* checked before anything is allocated; read again into the loader (pf__resume_at) */
        r = pf__parse_resume(&c, c.resume, &rs, 0, why, n);
        if (r != PF_OK) return r;
        pf__rd_resumed(&c, &rs);
        /* whatever the token's count, 0 included: this rank's is not in it
           (an outside trial: rank 0 had skipped none, rank 1 twelve) */
        if (rs.others && c.bad_limit)
            pf__log(&c, PF_LOG_WARN, "cfg.resume: the token is another rank's (or world size's): its skipped=%llu "
                    "counts that rank's bad samples, not this one's, so cfg.bad_limit (%llu) counts this rank's "
                    "from 0 here; to stop exactly where an uninterrupted run stops, resume each rank from its own "
                    "token", (unsigned long long)rs.skipped, (unsigned long long)c.bad_limit);
    }
    if (c.backend == PF_BACKEND_HOST && c.stream) /* asked for the CPU: said, not refused */
        pf__log(&c, PF_LOG_WARN, "cfg.stream is set but cfg.backend is PF_BACKEND_HOST: batches are host memory "
                "and the stream is not used");
    if (c.backend != PF_BACKEND_HOST) {
        int g = pf__choose_gpu(&c, &ops, why, n);
        if (g == PF__USE_HOST) g = pf__host_fallback(&c, why, n);
        if (g != PF_OK) return (pf_result)g;
    }
    r = pf__build(&c, c.resume ? &rs : NULL, ops, &l, why, n);
    if (r == PF_ERR_NO_DEVICE && ops->backend == PF_BACKEND_CUDA && c.backend == PF_BACKEND_DEFAULT) {
        /* counted but not usable: e.g. exclusive-process mode, held by
           another process (cudaSetDevice says so, cudaGetDeviceCount not) */
        pf__teardown(l);
        l = NULL;
        r = pf__host_fallback(&c, why, n);
        if (r != PF_OK) return r;
        ops = &pf__host_ops;
        r = pf__build(&c, c.resume ? &rs : NULL, ops, &l, why, n);
    }
    if (r == PF_OK) r = pf__start(l, why, n);
    if (r != PF_OK) {
        if (l) pf__teardown(l);
        return r;
    }
    pf__log(&c, PF_LOG_INFO, "created: %s backend, %u workers, %u host slots%s of %llu bytes",
            l->ops->backend == PF_BACKEND_CUDA ? "CUDA" : "host", (unsigned)c.num_workers, (unsigned)c.host_slots,
            l->ops->backend == PF_BACKEND_CUDA ? " (pinned)" : "", (unsigned long long)l->stride);
    *out = l;
    return PF_OK;
}

PF_API pf_result pf_create(const pf_config *cfg, pf_loader **out) {
    char *why = pf__create_error;
    size_t n = sizeof pf__create_error;
    pf_config c;
    pf_result r;
    why[0] = '\0';
    if (!out) return (pf__format(why, n, "pf_create: out is NULL"), PF_ERR_INVALID_ARG);
    *out = NULL;
    if (!cfg) return (pf__format(why, n, "pf_create: cfg is NULL"), PF_ERR_INVALID_ARG);
    c = pf_config_defaults(cfg);
    r = pf__check_config(cfg, &c, why, n);
    if (r == PF_OK) r = pf__rd_fit(&c, why, n); /* a reader's bookkeeping for this config; it serves it now */
    if (r != PF_OK) return r;
    r = pf__create(c, out, why, n);
    if (r != PF_OK) pf__rd_serve(&c, -1);
    return r;
}

PF_API pf_backend pf_get_backend(const pf_loader *l) { return l ? l->ops->backend : PF_BACKEND_DEFAULT; }

PF_API void pf_destroy(pf_loader *l) {
    pf_config c;
    if (!l) return;
    c = l->cfg; /* the reader is told once no load of this loader runs */
    pf__teardown(l);
    pf__rd_serve(&c, -1);
}

PF_API pf_result pf_next(pf_loader *l, pf_batch *out) {
    if (!l) return PF_ERR_INVALID_ARG;
    if (out) memset(out, 0, sizeof *out); /* on anything but PF_OK the caller owns nothing */
    return l->ops->next(l, out);
}

/* A NULL batch, for pf_release and pf_batch_wait. */
static pf_result pf__null_batch(pf_loader *l, const char *fn) {
    pf_result r;
    pf__lock(&l->sync.mu);
    r = pf__fail(l, PF_ERR_INVALID_ARG, "%s: batch is NULL", fn);
    pf__unlock(&l->sync.mu);
    return r;
}

PF_API pf_result pf_release(pf_loader *l, pf_batch *b) {
    if (!l) return PF_ERR_INVALID_ARG;
    if (!b) return pf__null_batch(l, "pf_release");
    return l->ops->release(l, b);
}

PF_API pf_result pf_batch_wait(pf_loader *l, const pf_batch *b) {
    if (!l) return PF_ERR_INVALID_ARG;
    if (!b) return pf__null_batch(l, "pf_batch_wait");
    return l->ops->batch_wait(l, b);
}

/* The loader's text is copied under its lock into this thread's own
   buffer: another thread's failing call cannot tear it while it is read. */
static PF__THREAD_LOCAL char pf__error_copy[PF__MSG_SIZE];
PF_API const char *pf_error(const pf_loader *l) {
    const char *m = pf__create_error;
    if (l) {
        pf_loader *w = (pf_loader *)(uintptr_t)l; /* the lock only: nothing else is written */
        pf__lock(&w->sync.mu);
        memcpy(pf__error_copy, l->cons.err, sizeof pf__error_copy);
        pf__unlock(&w->sync.mu);
        m = pf__error_copy;
    }
    return m[0] ? m : "no error";
}

PF_API const char *pf_result_string(pf_result r) {
    switch (r) {
#define PF__RESULT_CASE(name, value, text) \
    case name:                             \
        return text;
        PF_RESULT_LIST(PF__RESULT_CASE)
#undef PF__RESULT_CASE
    default:
        return "unknown pf_result";
    }
}

/* The verdict from the counters alone, so it can be tested on numbers.
   Waiting for a busy GPU is the GPU being the limit, not the loader: only
   the input and copy waits count against the loader. */
/* helping: pf_next loads now (autotune), not only at some time before */
static void pf__verdict(pf_stats *s, bool helping) {
    double waited = s->elapsed_s > 0 ? (s->wait_input_s + s->wait_copy_s) / s->elapsed_s : 0;
    if (s->batches < 2 || s->elapsed_s <= 0) {
        s->bound = PF_BOUND_UNKNOWN;
        s->verdict = "unknown: too few batches delivered to tell";
    } else if (waited < 0.05) {
        s->bound = PF_BOUND_COMPUTE;
        s->verdict = "compute-bound: the loader keeps up; your step is the limit (on CUDA, waits for the GPU to "
                     "finish earlier batches do not count against the loader)";
    } else if (s->wait_copy_s > s->wait_input_s) {
        s->bound = PF_BOUND_COPY;
        s->verdict = "copy-bound: the consumer waits for host-to-device copies; send fewer bytes "
                     "(e.g. uint8, normalise on the GPU)";
    } else if (helping && s->next_loads * 10 > s->batches) {
        s->bound = PF_BOUND_INPUT;
        s->verdict = "input-bound: loads cost less than a handoff between threads, so pf_next loads batches "
                     "itself when none is ready (autotune); more workers do not help, only a cheaper load does";
    } else {
        s->bound = PF_BOUND_INPUT;
        s->verdict = "input-bound: the consumer waits for loads; add workers or make load cheaper";
    }
}

PF_API void pf_get_stats(const pf_loader *cl, pf_stats *out) {
    pf_loader *l = (pf_loader *)cl; /* the lock is not part of the loader's value */
    uint32_t i;
    bool helping;
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!l) {
        pf__verdict(out, false);
        return;
    }
    pf__lock(&l->sync.mu);
    pf__take_released(l); /* held_slots counts only what the caller holds */
    pf__wait_flush(l, pf__now_ns());
    out->backend = l->ops->backend;
    out->num_workers = l->cfg.num_workers;
    out->workers_active = l->at.active;
    out->skipped = l->ck.skipped; /* delivered (st.skipped counts at the take: on CUDA the stager's, ahead) */
    out->next_loads = l->st.next_loads;
    out->host_slots = l->ring.nalloc; /* with memory (autotune grows the ring) */
    out->device_slots = 0; /* the backend's part below */
    out->epoch = l->cons.epoch;
    out->batch = l->cons.batch;
    out->batches_in_epoch = l->cons.nbatches;
    out->batches = l->st.batches;
    out->samples = l->st.samples;
    out->bytes = l->st.bytes;
    out->copies = l->st.copies;
    out->copy_bytes = l->st.copy_bytes;
    out->elapsed_s = pf__sec(l->st.last_ns - l->st.first_ns);
    out->wait_input_s = pf__sec(l->st.wait_input_ns);
    out->wait_copy_s = pf__sec(l->st.wait_copy_ns);
    out->wait_gpu_s = pf__sec(l->st.wait_gpu_ns);
    out->wait_s = out->wait_input_s + out->wait_copy_s + out->wait_gpu_s;
    out->load_s = pf__sec(l->st.load_ns);
    out->worker_wait_s = pf__sec(l->st.worker_wait_ns);
    out->occupancy = l->st.batches ? (double)l->st.ready_sum / ((double)l->st.batches * l->ring.nalloc) : 0;
    for (i = 0; i < l->ring.nalloc; i++) {
        int st = l->ring.slots[i].state;
        out->free_slots += st == PF__SLOT_FREE;
        out->loading_slots += st == PF__SLOT_LOADING;
        out->ready_slots += st == PF__SLOT_READY;
        out->held_slots += st == PF__SLOT_HELD;
        out->copying_slots += st == PF__SLOT_COPYING || st == PF__SLOT_STAGING;
    }
    if (l->ops->stats) l->ops->stats(l, out);
    helping = l->cfg.autotune && (l->at.help || !l->at.active);
    pf__unlock_wake(l); /* the released slots may owe a worker a wake */
    pf__verdict(out, helping);
}

PF_API int pf_stats_format(const pf_loader *l, char *buf, size_t size) {
    static const char *const bound[] = {"warming up", "input-bound", "copy-bound", "compute-bound"};
    pf_stats s;
    double el, rate;
    char of[32] = "", workers[48] = "", at[96];
    bool help = false;
    int n;
    pf_get_stats(l, &s);
    if (l) { /* autotune's help flag, read as pf_get_stats reads: under the lock */
        pf_loader *ml = (pf_loader *)l;
        pf__lock(&ml->sync.mu);
        help = ml->at.help;
        pf__unlock(&ml->sync.mu);
    }
    el = s.elapsed_s > 0 ? s.elapsed_s : 0;
    rate = el > 0 ? (double)s.bytes / el : 0;
    if (s.batches_in_epoch) pf__format(of, sizeof of, "/%llu", (unsigned long long)s.batches_in_epoch);
    /* "\xc2\xb7" is a UTF-8 middle dot */
    if (!buf) size = 0; /* (NULL, 0): just the length, to size a buffer */
    if (l && l->cfg.autotune && !s.workers_active)
        pf__format(workers, sizeof workers, " \xc2\xb7 pf_next loads (auto)");
    else if (l && l->cfg.autotune && help)
        pf__format(workers, sizeof workers, " \xc2\xb7 %u worker%s + pf_next (auto)", (unsigned)s.workers_active,
                   s.workers_active == 1 ? "" : "s");
    else if (l && l->cfg.autotune)
        pf__format(workers, sizeof workers, " \xc2\xb7 %u worker%s (auto)", (unsigned)s.workers_active,
                   s.workers_active == 1 ? "" : "s");
    else if (l && s.workers_active < s.num_workers) /* the CPU cap (pf__cpu_cap) */
        pf__format(workers, sizeof workers, " \xc2\xb7 %u of %u workers (CPU loads)", (unsigned)s.workers_active,
                   (unsigned)s.num_workers);
    /* right after PF_END_OF_EPOCH the consumer's epoch is the next one, with
       nothing of it delivered: name the epoch that ended */
    if (s.batch == 0 && s.epoch > 0)
        pf__format(at, sizeof at, "epoch %llu done", (unsigned long long)(s.epoch - 1));
    else
        pf__format(at, sizeof at, "epoch %llu \xc2\xb7 batch %llu%s", (unsigned long long)s.epoch,
                   (unsigned long long)s.batch, of);
    n = snprintf(size ? buf : NULL, size,
                 "%s \xc2\xb7 %.1f %s \xc2\xb7 %.0f batches/s \xc2\xb7 waited %.0f%% "
                 "\xc2\xb7 %s%s",
                 at, rate >= 1e9 ? rate / 1e9 : rate / 1e6,
                 rate >= 1e9 ? "GB/s" : "MB/s", el > 0 ? (double)s.batches / el : 0.0, el > 0 ? 100.0 * s.wait_s / el : 0.0,
                 bound[s.bound], workers);
    if (n >= 0 && size && (size_t)n >= size) { /* cut: not inside a UTF-8 dot (a lone 0xC2 is not text) */
        size_t end = size - 1, lead = end;
        while (lead > 0 && ((unsigned char)buf[lead - 1] & 0xC0) == 0x80) lead--; /* back over continuation bytes */
        if (lead > 0 && (unsigned char)buf[lead - 1] >= 0xC0) { /* the last character's first byte */
            unsigned char c = (unsigned char)buf[lead - 1];
            size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            if (end - (lead - 1) < need) buf[lead - 1] = '\0'; /* cut from its rest: dropped */
        }
    }
    return n < 0 ? 0 : n;
}

PF_API int pf_job_fail(pf_job *job, const char *fmt, ...) {
    pf__worker *w = job ? (pf__worker *)job->pf__worker : NULL;
    va_list ap;
    if (!w) return -1;
    /* the first reason stands: later calls are usually its consequences
       (a pf_job_skip under PF_BAD_STOP, a second look at the same fault) */
    if (w->failed && w->msg[0]) return -1;
    w->failed = true;
    if (!fmt) return -1;
    va_start(ap, fmt);
    pf__vformat(w->msg, sizeof w->msg, fmt, ap);
    va_end(ap);
    return -1;
}

PF_API bool pf_job_cancelled(const pf_job *job) {
    const pf__worker *w = job ? (const pf__worker *)job->pf__worker : NULL;
    return w ? PF__LOAD_FLAG(&w->owner->sync.stopping) != 0 : false;
}

/* >>worker state ---------------------------------------------------------- */
/* cfg.worker_init runs lazily, on the worker's own thread, just before the
   first load it will run (so a worker autotune never wakes makes nothing);
   cfg.worker_stop runs on the same thread when the worker parks, stops or
   is destroyed. Exactly one stop per init. No lock held. */
static void pf__worker_up(pf_loader *l, pf__worker *w) {
    if (w->live || (!l->cfg.worker_init && !l->cfg.worker_stop)) return;
    w->state = l->cfg.worker_init ? l->cfg.worker_init(l->cfg.user, w->id) : NULL;
    w->live = true;
}

static void pf__worker_down(pf_loader *l, pf__worker *w) {
    if (!w->live) return;
    w->live = false;
    if (l->cfg.worker_stop) l->cfg.worker_stop(l->cfg.user, w->id, w->state);
    w->state = NULL;
}

/* >>samples --------------------------------------------------------------- */
/* Packed batches and bad samples. While a load runs its worker keeps the
   append cursor (appends, used) and the bad samples' positions (in the
   slot's skip list); pf__job_end then settles the batch on the worker
   thread: sorts the positions, checks that every sample was appended or
   skipped, drops (SKIP) or inserts markers (MARK, moving the packed bytes
   up from the end), and turns positions into sample indices. Everything it
   decides depends on the batch alone, never on timing: the same batches
   with the same skips on every run, and a resumed run (its token counts
   batches, not samples) sees the same.
   cfg.bad_limit, defined in batch order: the run stops at batch B, the
   first (in batch order, across epochs) at which the bad samples of B and
   of every batch before it pass the limit; every batch before B is
   delivered, B and every batch after it are not, and pf_next returns
   PF_ERR_LOAD naming B. In order the taker meets the batches in that order
   and counts as it takes (pf__skip_account). Unordered it takes them as
   they complete, so it takes a batch only once it is sure the batch lies
   before B (pf__skip_may_take): counted so far, plus the batch, plus every
   batch of the epoch before it not yet taken (loaded: its count; loading:
   batch_size, the most it can have) is within the limit; or the batch is
   the first not yet taken, so its count is exact and it is B if it passes.
   Far from the limit that holds at once and batches flow as they complete;
   near it a batch waits for the loads before it. So which batch stops the
   run, and the batches delivered before it, depend on the data alone, as
   in order. The count goes on from the token's skipped= after a resume
   (pf__batch_samples counts the delivered ones for it); the batches a
   token lists as delivered past its first missing one all lie before B,
   so the count a resumed run reaches at B is the uninterrupted run's. */
static void pf__job_begin(pf_loader *l, pf__slot *s, pf__worker *w, pf_job *job) {
    (void)l;
    w->slot = s;
    w->appends = w->nskip = 0;
    w->used = 0;
    w->pack = w->refused = false;
    s->b.sm.packed = false;
    s->b.sm.skipped = 0;
    s->b.sm.mem[0] = 0;
    job->worker_state = w->state;
}

static void pf__sort_u64(uint64_t *v, uint32_t n) { /* insertion sort: a few bad samples */
    uint32_t i, j;
    for (i = 1; i < n; i++) {
        uint64_t x = v[i];
        for (j = i; j > 0 && v[j - 1] > x; j--) v[j] = v[j - 1];
        v[j] = x;
    }
}

#define PF__JOB_BAD(...) \
    do { pf__format(s->msg, PF__MSG_SIZE, __VA_ARGS__); s->result = PF_ERR_LOAD; return; } while (0)

static void pf__job_end(pf_loader *l, pf__slot *s, pf__worker *w, pf_job *job) {
    uint64_t *off = s->b.sm.mem, *bad = s->b.sm.mem + l->cfg.batch_size + 1;
    uint32_t n = w->nskip, count = s->b.count, i, b;
    size_t mb = l->cfg.bad_marker_bytes;
    const unsigned char *marker = (const unsigned char *)l->cfg.bad_marker;
    unsigned char *host = s->data;
    if (w->refused) /* pf_job_skip under PF_BAD_STOP, or pf_job_append, and the load went on */
        PF__JOB_BAD("load failed for epoch %llu batch %llu (%s): %s", (unsigned long long)s->b.epoch,
                    (unsigned long long)s->b.batch, w->name, w->msg);
    if (!w->appends && !n && !w->pack) return; /* the load wrote the slot itself */
    pf__sort_u64(bad, n);
    if (w->appends || w->pack) {
        if (w->appends + n != count)
            PF__JOB_BAD("load for epoch %llu batch %llu (%s) appended %u samples and skipped %u, for a "
                        "batch of %u: append each sample that is not skipped", (unsigned long long)s->b.epoch,
                        (unsigned long long)s->b.batch, w->name, (unsigned)w->appends, (unsigned)n,
                        (unsigned)count);
        if (n && l->cfg.bad_samples == PF_BAD_MARK) {
            size_t end = w->used + (size_t)n * mb;
            if (end > job->capacity || end < w->used)
                PF__JOB_BAD("load for epoch %llu batch %llu (%s): %u bad samples' markers (%llu bytes each) "
                            "do not fit in the slot after %llu bytes of samples (cfg.batch_bytes %llu)",
                            (unsigned long long)s->b.epoch, (unsigned long long)s->b.batch, w->name,
                            (unsigned)n, (unsigned long long)mb, (unsigned long long)w->used,
                            (unsigned long long)job->capacity);
            /* from the end: sample k-1 of the appended ones moves up to its
               place i; off[i+1] is written only after off[k] was read (i >= k-1) */
            uint32_t k;
            for (i = count, k = w->appends, b = n; i-- > 0;) {
                size_t start;
                if (b && bad[b - 1] == i) {
                    start = end - mb;
                    memcpy(host + start, marker, mb);
                    b--;
                } else {
                    size_t len = (size_t)(off[k] - off[k - 1]);
                    start = end - len;
                    memmove(host + start, host + off[k - 1], len);
                    k--;
                }
                off[i + 1] = end;
                end = start;
            }
            off[0] = 0;
            job->bytes = w->used + (size_t)n * mb;
        } else {
            job->bytes = w->used;
        }
        s->b.sm.packed = true;
    } else if (l->cfg.bad_samples == PF_BAD_MARK) { /* fixed-size samples: the marker is one */
        for (i = 0; i < n; i++) {
            if ((bad[i] + 1) * mb > job->capacity)
                PF__JOB_BAD("load for epoch %llu batch %llu (%s): the marker for sample %llu would end at "
                            "byte %llu, past the slot (cfg.batch_bytes %llu)", (unsigned long long)s->b.epoch,
                            (unsigned long long)s->b.batch, w->name, (unsigned long long)bad[i],
                            (unsigned long long)((bad[i] + 1) * mb), (unsigned long long)job->capacity);
            memcpy(host + bad[i] * mb, marker, mb);
        }
    } else if (n == count) { /* SKIP, every sample bad: an empty batch */
        s->b.sm.packed = true;
        job->bytes = 0;
    } else {
        PF__JOB_BAD("load for epoch %llu batch %llu (%s) skipped %u of %u samples but wrote the slot itself: "
                    "PF_BAD_SKIP drops samples from packed batches; write them with pf_job_append (or use "
                    "PF_BAD_MARK)", (unsigned long long)s->b.epoch, (unsigned long long)s->b.batch, w->name,
                    (unsigned)n, (unsigned)count);
    }
    /* positions to sample indices; SKIP: the batch keeps the others, in order */
    if (l->cfg.bad_samples == PF_BAD_SKIP) {
        uint32_t j;
        for (i = 0, j = 0, b = 0; i < count; i++) {
            if (b < n && bad[b] == i) bad[b++] = s->b.indices[i];
            else s->b.indices[j++] = s->b.indices[i];
        }
        s->b.count = count - n;
    } else {
        for (i = 0; i < n; i++) bad[i] = s->b.indices[bad[i]];
    }
    s->b.sm.skipped = n;
}
#undef PF__JOB_BAD

/* A batch with bad samples is taken, in batch order (lock held): count
   them; past cfg.bad_limit the batch fails instead. */
static void pf__skip_account(pf_loader *l, pf__slot *s) {
    uint64_t total = l->st.skipped + s->b.sm.skipped;
    if (l->cfg.bad_limit && total > l->cfg.bad_limit) {
        /* not delivered, so not counted: pf_stats.skipped stays the sum of
           the delivered batches' b.skipped, as the token's skipped= is */
        char first[PF__MSG_SIZE];
        memcpy(first, s->msg, sizeof first);
        pf__format(s->msg, PF__MSG_SIZE, "epoch %llu batch %llu: %llu bad samples so far, more than cfg.bad_limit "
                   "(%llu); this batch's first: %s", (unsigned long long)s->b.epoch, (unsigned long long)s->b.batch,
                   (unsigned long long)total, (unsigned long long)l->cfg.bad_limit, first);
        s->result = PF_ERR_LOAD;
        if (!l->error.code) l->error.log_owed = true; /* its message becomes the error (pf__take_ready) */
        return;
    }
    l->st.skipped = total;
}

/* Unordered, with cfg.bad_limit (lock held): may the taker take s, a
   loaded batch of its epoch, now? Yes when s lies before the batch that
   stops the run whatever the loads still running hold, or s is the first
   batch of the epoch not yet taken (pf__skip_account then decides). Every
   batch of the epoch before s is claimed (claims go in batch order; those
   a resume token lists were delivered, and are in st.skipped), so the
   ones not yet taken are in slots, loading or loaded; their epoch and
   batch are set under the lock at the claim, their count at the publish. */
static bool pf__skip_may_take(const pf_loader *l, const pf__slot *s) {
    uint64_t bound;
    uint32_t i;
    bool first = true;
    if (!l->cfg.bad_limit) return true;
    bound = l->st.skipped + (s->result == PF_OK ? s->b.sm.skipped : 0);
    for (i = 0; i < l->ring.nslots; i++) {
        const pf__slot *o = &l->ring.slots[i];
        if ((o->state != PF__SLOT_LOADING && o->state != PF__SLOT_READY) || o->b.epoch != s->b.epoch ||
            o->b.batch >= s->b.batch)
            continue;
        first = false;
        if (o->state == PF__SLOT_LOADING) bound += l->cfg.batch_size;
        else if (o->result == PF_OK) bound += o->b.sm.skipped;
    }
    return first || bound <= l->cfg.bad_limit;
}

/* A batch is delivered (lock held): its packed offsets and bad samples,
   which the checkpoint counts. */
static void pf__batch_samples(pf_loader *l, pf_batch *out, const pf__samples *sm) {
    l->ck.skipped += sm->skipped;
    out->offsets = sm->packed ? sm->mem : NULL;
    out->dev_offsets = NULL; /* the CUDA backend's take sets it */
    out->skipped = sm->skipped;
    out->skipped_indices = sm->skipped ? sm->mem + l->cfg.batch_size + 1 : NULL;
}

PF_API void *pf_job_append(pf_job *job, size_t bytes) {
    pf__worker *w = job ? (pf__worker *)job->pf__worker : NULL;
    pf__slot *s;
    uint64_t *off;
    size_t at;
    if (!w) return NULL;
    s = w->slot;
    off = s->b.sm.mem;
    at = w->used;
    if (w->appends + w->nskip >= job->count) {
        pf_job_fail(job, "pf_job_append: the batch has %u samples and all of them were already appended or "
                    "skipped (%u appended, %u skipped)%s", (unsigned)job->count, (unsigned)w->appends,
                    (unsigned)w->nskip, w->nskip ? ": append only the samples pf_job_skip did not report" : "");
        w->refused = true;
        return NULL;
    }
    if (bytes > job->capacity - at) {
        w->refused = true;
        pf_job_fail(job, "pf_job_append: sample %u of %llu bytes does not fit: %llu of the slot's %llu bytes "
                    "(cfg.batch_bytes) are used", (unsigned)(w->appends + w->nskip), (unsigned long long)bytes,
                    (unsigned long long)at, (unsigned long long)job->capacity);
        return NULL;
    }
    off[w->appends] = at;
    off[++w->appends] = at + bytes;
    w->used = at + bytes;
    job->bytes = w->used;
    return (unsigned char *)job->host + at;
}

PF_API int pf_job_skip(pf_job *job, uint32_t i, const char *fmt, ...) {
    pf__worker *w = job ? (pf__worker *)job->pf__worker : NULL;
    pf_loader *l;
    pf__slot *s;
    char why[PF__MSG_SIZE], msg[PF__MSG_SIZE];
    uint64_t *bad;
    uint32_t k;
    if (!w) return -1;
    l = w->owner;
    s = w->slot;
    why[0] = '\0';
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        pf__vformat(why, sizeof why, fmt, ap);
        va_end(ap);
    }
    if (i >= job->count || l->cfg.bad_samples == PF_BAD_STOP) w->refused = true;
    if (i >= job->count)
        return pf_job_fail(job, "pf_job_skip: sample %u is out of range (the batch has %u samples)", (unsigned)i,
                           (unsigned)job->count);
    pf__format(msg, sizeof msg, "bad sample %u (index %llu) of epoch %llu batch %llu: %s", (unsigned)i,
               (unsigned long long)job->indices[i], (unsigned long long)job->epoch, (unsigned long long)job->batch,
               why[0] ? why : "(no reason given)");
    if (l->cfg.bad_samples == PF_BAD_STOP) return pf_job_fail(job, "%s", msg);
    bad = s->b.sm.mem + l->cfg.batch_size + 1;
    for (k = 0; k < w->nskip; k++)
        if (bad[k] == i) return 0; /* reported twice: once is enough */
    if (w->appends + w->nskip >= job->count) {
        w->refused = true;
        return pf_job_fail(job, "pf_job_skip: sample %u: all %u samples were already appended or skipped",
                           (unsigned)i, (unsigned)job->count);
    }
    if (!w->nskip) memcpy(s->msg, msg, sizeof msg); /* quoted if the limit stops the run */
    bad[w->nskip++] = i;
    pf__log(&l->cfg, PF_LOG_WARN, "%s (%s)", msg, l->cfg.bad_samples == PF_BAD_SKIP ? "skipped" : "marked");
    return 0;
}

/* >>readers --------------------------------------------------------------- */
/* What the three readers share: they are a load callback over the core
   (cfg.user is the reader), a per-worker buffer made and freed on the
   worker's thread through worker_init/worker_stop (the caller's own hooks
   run inside them, with the caller's user), and pf__rd_step, which hands
   one sample to the caller's step at the slot's append cursor. POSIX only
   (pread, open, fstat): elsewhere the readers are declared, not defined. */
#if !defined(PREFETCH_NO_READERS) && ((defined(_POSIX_C_SOURCE) && _POSIX_C_SOURCE >= 200809L) || \
                                      defined(_GNU_SOURCE) || defined(__APPLE__))
#define PF__READERS 1
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(O_DIRECT)
#define PF__O_DIRECT O_DIRECT
#elif defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
#define PF__O_DIRECT 040000 /* <fcntl.h> shows O_DIRECT only with _GNU_SOURCE */
#elif defined(__linux__) && defined(__aarch64__)
#define PF__O_DIRECT 0200000
#else
#define PF__O_DIRECT 0 /* not here: direct reads fall back to buffered ones */
#endif
#define PF__RD_ALIGN 4096u /* O_DIRECT: offsets, lengths and buffers */
/* how the readers open a file: a test stands a file system that refuses
   O_DIRECT in here (tests/test_data.c) */
#ifndef PF__OPEN
#define PF__OPEN(path, flags) open((path), (flags))
#endif
/* Data files are opened without blocking (a FIFO's open waits for a
   writer: an outside trial's hung for ever) and must be regular files (a
   FIFO's reads wait too, a device's size says nothing). NULL: st is a
   regular file; else what it is, for the message. */
#define PF__RD_FLAGS (O_RDONLY | O_NONBLOCK)
static const char *pf__rd_not_file(const struct stat *st) {
    if (S_ISREG(st->st_mode)) return NULL;
    if (S_ISDIR(st->st_mode)) return "a directory";
    if (S_ISFIFO(st->st_mode)) return "a FIFO, not a regular file";
    return "not a regular file (a device or a socket)";
}
/* Running out of descriptors (or kernel memory) is not the file's fault:
   a growing list must not leave the file out for it (pf__rec_build). */
static bool pf__rd_scarce(int e) { return e == EMFILE || e == ENFILE || e == ENOMEM; }

/* strerror(e) without its shared buffer, which another thread's strerror
   may overwrite: the text in buf (n bytes), or one of the C library's own.
   strerror_r comes in two kinds: POSIX's fills buf and returns 0 or an
   error; glibc's with _GNU_SOURCE (__USE_GNU; g++ defines _GNU_SOURCE)
   returns the text, in buf or not. */
#define PF__ERRNO_TEXT 128
static const char *pf__errno_text(int e, char *buf, size_t n) {
#if defined(__GLIBC__) && defined(__USE_GNU)
    return strerror_r(e, buf, n);
#else
    if (strerror_r(e, buf, n) != 0) pf__format(buf, n, "errno %d", e);
    return buf;
#endif
}

/* Memory. Every byte a reader allocates goes through the cfg.allocator it
   was opened with (malloc and free when unset), kept in the reader: its
   bookkeeping and index at the open, a growing list's files as epochs are
   planned, each worker's read buffer on that worker's thread. All of it
   is given back by the close (the buffers by pf_destroy). */
/* The size of this thread's latest refused reader allocation, for the
   out-of-memory messages (PF__RD_OOM). */
static PF__THREAD_LOCAL unsigned long long pf__rd_refused;
#define PF__RD_OOM "out of memory (cfg.allocator refused %llu bytes)"
static void *pf__rd_alloc(const pf_allocator *a, size_t n) {
    void *p = a->alloc_fn(n ? n : 1, a->user_data);
    if (!p) pf__rd_refused = (unsigned long long)n;
    return p;
}
static void *pf__rd_calloc(const pf_allocator *a, size_t count, size_t size) {
    void *p;
    if (size && count > SIZE_MAX / size) {
        pf__rd_refused = (unsigned long long)-1; /* more than a size_t holds */
        return NULL;
    }
    p = pf__rd_alloc(a, count * size);
    if (p) memset(p, 0, count * size);
    return p;
}
static void pf__rd_free(const pf_allocator *a, void *p) {
    if (p) a->free_fn(p, a->user_data);
}
static char *pf__rd_strdup(const pf_allocator *a, const char *p) {
    size_t n = strlen(p) + 1;
    char *d = (char *)pf__rd_alloc(a, n);
    if (d) memcpy(d, p, n);
    return d;
}

typedef struct pf__rd {
    pf_allocator al;  /* cfg.allocator at the open: everything the reader allocates */
    pf_step_fn step;
    void *step_user;
    size_t sample_bytes;
    size_t buf_bytes; /* per-worker buffer, PF__RD_ALIGN-aligned (0: none) */
    void *user;       /* the caller's cfg.user and hooks, run inside ours */
    void *(*user_init)(void *user, uint32_t worker);
    void (*user_stop)(void *user, uint32_t worker, void *state);
    void (*user_start)(void *user, uint32_t worker);
    void (*log)(void *log_user, int level, const char *msg);
    void *log_user;
} pf__rd;

typedef struct pf__rd_ws { /* a worker's: its buffer, and the caller's state */
    void *raw;
    unsigned char *buf;
    void *user_state;
} pf__rd_ws;

static void *pf__rd_init(void *user, uint32_t worker) {
    pf__rd *rd = (pf__rd *)user;
    pf__rd_ws *ws = (pf__rd_ws *)pf__rd_calloc(&rd->al, 1, sizeof *ws);
    if (!ws) return NULL; /* the load says so; the caller's init is not run */
    if (rd->buf_bytes && rd->buf_bytes <= SIZE_MAX - PF__RD_ALIGN) {
        ws->raw = pf__rd_alloc(&rd->al, rd->buf_bytes + PF__RD_ALIGN);
        if (ws->raw)
            ws->buf = (unsigned char *)ws->raw + (PF__RD_ALIGN - (uintptr_t)ws->raw % PF__RD_ALIGN) % PF__RD_ALIGN;
    }
    if (rd->user_init) ws->user_state = rd->user_init(rd->user, worker);
    return ws;
}

static void pf__rd_stop(void *user, uint32_t worker, void *state) {
    pf__rd *rd = (pf__rd *)user;
    pf__rd_ws *ws = (pf__rd_ws *)state;
    if (!ws) return;
    if (rd->user_stop) rd->user_stop(rd->user, worker, ws->user_state);
    pf__rd_free(&rd->al, ws->raw);
    pf__rd_free(&rd->al, ws);
}

static void pf__rd_start(void *user, uint32_t worker) {
    pf__rd *rd = (pf__rd *)user;
    rd->user_start(rd->user, worker);
}

/* The hooks are a reader's and the caller gave it none of its own
   (pf__hooks_any_thread). */
static bool pf__rd_hooks_any_thread(const pf_config *c) {
    const pf__rd *rd = (const pf__rd *)c->user;
    return c->worker_init == pf__rd_init && c->worker_stop == pf__rd_stop && !rd->user_init && !rd->user_stop &&
           !rd->user_start;
}

static void pf__rd_log(const pf__rd *rd, int level, const char *fmt, ...) PF__PRINTF(3, 4);
static void pf__rd_log(const pf__rd *rd, int level, const char *fmt, ...) {
    char msg[PF__MSG_SIZE];
    va_list ap;
    if (!rd->log) return;
    va_start(ap, fmt);
    pf__vformat(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rd->log(rd->log_user, level, msg);
}

/* The open's checks shared by every reader; `who` names it. */
static pf_result pf__rd_check(const void *rc, const pf_config *cfg, const void *out, const char *who) {
    char *why = pf__create_error;
    size_t n = sizeof pf__create_error;
    why[0] = '\0';
    if (!rc) return (pf__format(why, n, "%s_open: its config is NULL", who), PF_ERR_INVALID_ARG);
    if (!cfg) return (pf__format(why, n, "%s_open: cfg is NULL", who), PF_ERR_INVALID_ARG);
    if (!out) return (pf__format(why, n, "%s_open: out is NULL", who), PF_ERR_INVALID_ARG);
    if (!cfg->allocator.alloc_fn != !cfg->allocator.free_fn)
        return (pf__format(why, n, "%s_open: cfg.allocator: set both alloc_fn and free_fn, or neither", who),
                PF_ERR_INVALID_ARG);
    if (cfg->load)
        return (pf__format(why, n, "%s_open: cfg.load is set: the reader is the load (use its step for your "
                                   "per-sample work)", who), PF_ERR_INVALID_ARG);
    if (cfg->num_samples || cfg->num_samples_fn)
        return (pf__format(why, n, "%s_open: cfg.num_samples or cfg.num_samples_fn is set: the reader counts the "
                                   "samples", who), PF_ERR_INVALID_ARG);
    return PF_OK;
}

/* Take over cfg: the reader is its load and user; the caller's hooks run
   inside the reader's. batch_bytes: batch_size samples of `sample` bytes
   when the caller left it 0 (0 sample: the caller must set it). */
static pf_result pf__rd_attach(pf__rd *rd, pf_config *cfg, pf_load_fn load, size_t sample, const char *who) {
    rd->user = cfg->user;
    rd->user_init = cfg->worker_init;
    rd->user_stop = cfg->worker_stop;
    rd->user_start = cfg->on_worker_start;
    rd->log = cfg->log;
    rd->log_user = cfg->log_user;
    if (!cfg->batch_bytes) {
        uint32_t bs = cfg->batch_size;
        if (!bs) /* sized for one sample, every batch but a 1-sample one would fail at its load */
            return (pf__format(pf__create_error, sizeof pf__create_error,
                               "%s_open: cfg.batch_size is 0: set it before the open, which sizes the slots "
                               "(cfg.batch_bytes = batch_size samples), or set cfg.batch_bytes yourself", who),
                    PF_ERR_INVALID_ARG);
        if (!sample)
            return (pf__format(pf__create_error, sizeof pf__create_error,
                               "%s_open: cfg.batch_bytes is 0 and samples have no fixed size: set cfg.batch_bytes "
                               "(or sample_bytes)", who), PF_ERR_INVALID_ARG);
        if (sample > SIZE_MAX / bs)
            return (pf__format(pf__create_error, sizeof pf__create_error,
                               "%s_open: batch_size %u samples of %llu bytes do not fit in memory", who,
                               (unsigned)bs, (unsigned long long)sample), PF_ERR_INVALID_ARG);
        cfg->batch_bytes = (size_t)bs * sample;
    } else if (sample && cfg->batch_bytes < sample) { /* no batch could hold even one: say so now, not at a load */
        return (pf__format(pf__create_error, sizeof pf__create_error,
                           "%s_open: cfg.batch_bytes is %llu, but a sample takes up to %llu bytes: no batch "
                           "could hold one", who,
                           (unsigned long long)cfg->batch_bytes, (unsigned long long)sample),
                PF_ERR_INVALID_ARG);
    }
    cfg->load = load;
    cfg->user = rd;
    cfg->worker_init = pf__rd_init;
    cfg->worker_stop = pf__rd_stop;
    if (cfg->on_worker_start) cfg->on_worker_start = pf__rd_start;
    return PF_OK;
}

/* The job's buffer; the job then carries the caller's own state. */
static pf__rd_ws *pf__rd_begin(const pf__rd *rd, pf_job *job) {
    pf__rd_ws *ws = (pf__rd_ws *)job->worker_state;
    if (!ws || (rd->buf_bytes && !ws->buf)) {
        pf_job_fail(job, "reader: out of memory (cfg.allocator) for worker %u's state and %llu-byte read buffer",
                    (unsigned)job->worker, (unsigned long long)rd->buf_bytes);
        return NULL;
    }
    ((pf__worker *)job->pf__worker)->pack = true;
    job->worker_state = ws->user_state;
    return ws;
}

/* One sample through the caller's step, written at the append cursor.
   0, or -1 with the job failed. A sample the step skipped is not appended. */
static int pf__rd_step(const pf__rd *rd, pf_job *job, pf_sample *smp) {
    pf__worker *w = (pf__worker *)job->pf__worker;
    uint32_t nskip = w->nskip;
    int rc;
    smp->out = (unsigned char *)job->host + w->used;
    smp->out_capacity = job->capacity - w->used;
    smp->out_bytes = rd->sample_bytes;
    smp->job = job;
    rc = rd->step(rd->step_user, smp);
    if (rc != 0) {
        if (!w->failed)
            pf_job_fail(job, "the step returned %d for sample %u (index %llu) without pf_job_fail", rc,
                        (unsigned)smp->i, (unsigned long long)smp->index);
        return -1;
    }
    /* The step can call pf_job_skip, which moves w->nskip: cppcheck does not
       see through the callback and thinks the count is still nskip here */
    /* cppcheck-suppress knownConditionTrueFalse */
    if (w->nskip != nskip) { /* its own sample only: else one sample's bytes would go as another's */
        const uint64_t *bad = w->slot->b.sm.mem + w->owner->cfg.batch_size + 1;
        if (w->nskip != nskip + 1 || bad[nskip] != smp->i)
            return pf_job_fail(job, "the step for sample %u (index %llu) skipped sample %u: a step skips only its "
                               "own sample, pf_job_skip(s->job, s->i, ...)", (unsigned)smp->i,
                               (unsigned long long)smp->index, (unsigned)bad[w->nskip - 1]);
        return 0;
    }
    if (smp->out_bytes > smp->out_capacity)
        return pf_job_fail(job, "the step says it wrote %llu bytes for sample %u (index %llu), more than the %llu "
                           "left in the slot (cfg.batch_bytes)", (unsigned long long)smp->out_bytes,
                           (unsigned)smp->i, (unsigned long long)smp->index,
                           (unsigned long long)smp->out_capacity);
    /* a fixed size is a promise to the kernel: sample i at i * sample_bytes
       (an outside trial's step wrote 3 of 4, and every later sample was
       read from the wrong place, silently) */
    if (rd->sample_bytes && smp->out_bytes != rd->sample_bytes)
        return pf_job_fail(job, "the step says it wrote %llu bytes for sample %u (index %llu), but sample_bytes is "
                           "%llu: with a fixed sample_bytes every sample is that size, sample i at i * sample_bytes "
                           "(a tar reader's sample_bytes = 0 lets the step say per sample)",
                           (unsigned long long)smp->out_bytes, (unsigned)smp->i, (unsigned long long)smp->index,
                           (unsigned long long)rd->sample_bytes);
    return pf_job_append(job, smp->out_bytes) ? 0 : -1;
}

/* pread until n bytes, end of file or an error: the bytes read, or -1. */
static long long pf__pread_full(int fd, void *buf, size_t n, uint64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (unsigned char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (long long)got;
}

/* O_DIRECT: len bytes at off into dst, through buf (bufsize, aligned) in
   aligned reads. 0, or -1 (short or failed). */
static int pf__pread_direct(int fd, unsigned char *buf, size_t bufsize, unsigned char *dst, size_t len, uint64_t off) {
    while (len) {
        uint64_t a0 = off & ~(uint64_t)(PF__RD_ALIGN - 1);
        size_t skew = (size_t)(off - a0), take = len < bufsize - skew ? len : bufsize - skew;
        size_t need = skew + take; /* the wanted bytes' end in the aligned read */
        size_t span = (need + PF__RD_ALIGN - 1) & ~(size_t)(PF__RD_ALIGN - 1);
        long long got = pf__pread_full(fd, buf, span, a0);
        if (got < (long long)need) return -1;
        memcpy(dst, buf + skew, take);
        dst += take;
        off += take;
        len -= take;
    }
    return 0;
}

/* Room for need elements in *p (cap of them now), doubling; the allocator
   has no realloc: a new block, the old one copied and freed. */
static bool pf__grow_array(const pf_allocator *a, void **p, uint64_t *cap, uint64_t need, size_t elem) {
    uint64_t c = *cap ? *cap : 64;
    void *q;
    if (need <= *cap) return true;
    while (c < need) c *= 2;
    if (c > SIZE_MAX / elem) return false;
    q = pf__rd_alloc(a, (size_t)(c * elem));
    if (!q) return false;
    if (*p) memcpy(q, *p, (size_t)(*cap * elem));
    pf__rd_free(a, *p);
    *p = q;
    *cap = c;
    return true;
}

/* >>records --------------------------------------------------------------- */
/* A view is one epoch's file list: the files, and the first sample of each.
   Static lists have one view for every epoch. A growing list (path_fn)
   keeps `keep` views in a ring by epoch: a batch of epoch e can still be
   claimed, not yet loaded, while at most host_slots + 2 later epochs are
   planned (the core's plan ring), so keep = host_slots + 3 never drops a
   view a load may still need. Files are shared between views by path and
   identity (device, inode), counted, and closed when no view holds them: a
   file replaced under its path (written aside, renamed over it) is another
   file, opened for the views built from then on, while the older views keep
   reading the one they were built with. */
typedef struct pf__rec_file {
    char *path;
    int fd;
    bool direct; /* opened with O_DIRECT (its file system may refuse it; the reader's other files not) */
    uint32_t refs;
    dev_t dev; /* what fd is: a path now naming another file is opened anew */
    ino_t ino;
    bool warned; /* its partial last record was logged (once per file: pf__rec_warn_once) */
} pf__rec_file;

typedef struct pf__rec_view {
    uint64_t epoch;
    bool used;
    uint32_t n, listed; /* files in it; files the list named */
    pf__rec_file **files;
    uint64_t *first; /* n + 1: sample index of each file's first record, then the total */
    uint64_t cap;    /* files' room (first's is one more): grown as lists grow */
    uint64_t loaded; /* samples whose load ended: all of this rank's, the view goes */
} pf__rec_view;

struct pf_records {
    pf__rd rd; /* first: cfg.user points here */
    pf_records_config c;
    pf__mutex mu;
    bool mu_ok, direct;
    pf__rec_file **cache;
    uint32_t ncache, cache_cap; /* cache_cap: files open at once, at most */
    uint64_t cache_room;        /* the cache array's (grown as files open) */
    pf__rec_view *views;
    uint32_t keep;
    uint32_t world, batch_size; /* pf_create's, with drop_last: a rank's samples of an epoch it loads */
    bool drop_last;
    uint32_t serving;           /* loaders made with it and not destroyed (pf__rd_serve) */
    bool resumed;               /* the loader resumed resume_epoch with resume_done samples loaded before */
    uint64_t resume_epoch, resume_done;
    struct {
        uint64_t dev, ino;
    } warned[32];            /* the last 32 files said to be cut: once each, though a growing list's file
                                closes and opens again */
    uint32_t nwarned;
};

static void pf__rec_unref(pf_records *r, pf__rec_file *f) {
    uint32_t i;
    if (--f->refs) return;
    for (i = 0; i < r->ncache; i++)
        if (r->cache[i] == f) {
            r->cache[i] = r->cache[--r->ncache];
            break;
        }
    if (f->fd >= 0) close(f->fd);
    pf__rd_free(&r->rd.al, f->path);
    pf__rd_free(&r->rd.al, f);
}

static void pf__rec_view_clear(pf_records *r, pf__rec_view *v) {
    uint32_t i;
    for (i = 0; i < v->n; i++) pf__rec_unref(r, v->files[i]);
    v->n = 0;
    v->used = false;
}

/* The file at path, opened once while path names it (refs counted by the
   caller). NULL, and why, when it cannot be opened; *oom: because memory
   ran out, *scarce: descriptors (neither the file's fault). */
static pf__rec_file *pf__rec_get(pf_records *r, const char *path, char *why, size_t n, bool *oom, bool *scarce) {
    pf__rec_file *f;
    struct stat st;
    char err[PF__ERRNO_TEXT];
    int fd;
    bool direct, stat_ok;
    if (stat(path, &st) == 0) { /* else the open below says why */
        uint32_t i;
        for (i = 0; i < r->ncache; i++)
            if (r->cache[i]->dev == st.st_dev && r->cache[i]->ino == st.st_ino && strcmp(r->cache[i]->path, path) == 0)
                return r->cache[i];
    }
    if (r->ncache == r->cache_cap) {
        pf__format(why, n, "too many files open at once (%u) to open %s", (unsigned)r->cache_cap, path);
        return NULL;
    }
    if (!pf__grow_array(&r->rd.al, (void **)&r->cache, &r->cache_room, (uint64_t)r->ncache + 1, sizeof(pf__rec_file *))) {
        pf__format(why, n, PF__RD_OOM " opening %s", pf__rd_refused, path);
        *oom = true;
        return NULL;
    }
    direct = r->direct;
    fd = PF__OPEN(path, PF__RD_FLAGS | (direct ? PF__O_DIRECT : 0));
    if (fd < 0 && direct && errno == EINVAL) { /* this file system refuses O_DIRECT: this file reads buffered */
        direct = false;
        pf__rd_log(&r->rd, PF_LOG_INFO, "pf_records: %s refuses O_DIRECT; reading it through the page cache", path);
        fd = PF__OPEN(path, PF__RD_FLAGS);
    }
    if (fd < 0) {
        *scarce = pf__rd_scarce(errno);
        pf__format(why, n, "cannot open %s: %s%s", path, pf__errno_text(errno, err, sizeof err),
                   errno == EMFILE ? " (the process's file descriptors: raise `ulimit -n`; a growing list holds the "
                                     "files of the epochs still loading)" : "");
        return NULL;
    }
    stat_ok = fstat(fd, &st) == 0; /* what was opened, should path have changed since the stat */
    if (!stat_ok || pf__rd_not_file(&st)) {
        if (stat_ok) pf__format(why, n, "cannot read %s: it is %s", path, pf__rd_not_file(&st));
        else pf__format(why, n, "cannot stat %s: %s", path, pf__errno_text(errno, err, sizeof err));
        close(fd);
        return NULL;
    }
    f = (pf__rec_file *)pf__rd_calloc(&r->rd.al, 1, sizeof *f);
    if (f) f->path = pf__rd_strdup(&r->rd.al, path);
    if (!f || !f->path) {
        close(fd);
        pf__rd_free(&r->rd.al, f);
        pf__format(why, n, PF__RD_OOM " opening %s", pf__rd_refused, path);
        *oom = true;
        return NULL;
    }
    f->fd = fd;
    f->direct = direct;
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    r->cache[r->ncache++] = f;
    return f;
}

/* A cut file is said once, not each time a growing list opens it again:
   false, it was (and f remembers). */
static bool pf__rec_warn_once(pf_records *r, pf__rec_file *f) {
    uint32_t i, k = r->nwarned % 32;
    f->warned = true;
    for (i = 0; i < r->nwarned && i < 32; i++)
        if (r->warned[i].dev == (uint64_t)f->dev && r->warned[i].ino == (uint64_t)f->ino) return false;
    r->warned[k].dev = (uint64_t)f->dev; /* no memory asked for a warning: the oldest goes */
    r->warned[k].ino = (uint64_t)f->ino;
    r->nwarned++;
    return true;
}

/* Room for need files in v's list: the lists are as long as path_fn makes
   them, not max_files each (host_slots + 3 views of 4096 files each took
   400 MB with host_slots 4096, an outside trial). false: out of memory. */
static bool pf__rec_view_room(pf_records *r, pf__rec_view *v, uint64_t need) {
    uint64_t cap = v->cap, fcap = v->cap ? v->cap + 1 : 0;
    if (need <= v->cap) return true;
    if (!pf__grow_array(&r->rd.al, (void **)&v->files, &cap, need, sizeof(pf__rec_file *)) ||
        !pf__grow_array(&r->rd.al, (void **)&v->first, &fcap, cap + 1, sizeof(uint64_t)))
        return false;
    v->cap = cap; /* first holds cap + 1 or more */
    return true;
}

/* Fill v from the path list (strict: a file that cannot be opened or is
   shorter than its header is an error; else it is left out, as a file
   evicted between the listing and now). Out of memory is an error either
   way (PF_ERR_NO_MEMORY), and so is out of descriptors: a view without a
   file that is there would be a silently smaller epoch. Lock held for
   growing lists. */
static pf_result pf__rec_build(pf_records *r, pf__rec_view *v, uint64_t epoch, bool strict, char *why, size_t n) {
    uint32_t k;
    v->epoch = epoch;
    v->n = v->listed = 0;
    v->loaded = r->resumed && epoch == r->resume_epoch ? r->resume_done : 0; /* loaded by the run before */
    if (!pf__rec_view_room(r, v, 1)) {
        pf__format(why, n, PF__RD_OOM " for epoch %llu's file list", pf__rd_refused, (unsigned long long)epoch);
        return PF_ERR_NO_MEMORY;
    }
    v->used = true; /* its first[] is there */
    v->first[0] = 0;
    for (k = 0;; k++) {
        const char *path = r->c.path_fn ? r->c.path_fn(r->c.user, epoch, k) : k < r->c.num_paths ? r->c.paths[k] : NULL;
        pf__rec_file *f;
        struct stat st;
        uint64_t size;
        bool oom = false, scarce = false;
        if (!path) break;
        v->listed = k + 1;
        if (k >= r->c.max_files) {
            pf__format(why, n, "pf_records: the file list of epoch %llu has more than max_files (%u) files",
                       (unsigned long long)epoch, (unsigned)r->c.max_files);
            if (strict) return PF_ERR_INVALID_ARG;
            pf__rd_log(&r->rd, PF_LOG_WARN, "%s; the rest are left out", why);
            break;
        }
        f = pf__rec_get(r, path, why, n, &oom, &scarce);
        if (!f) {
            if (oom) return PF_ERR_NO_MEMORY;
            /* a file left out for want of descriptors: a silently smaller
               epoch (an outside trial: 120 of 200 samples, at ulimit -n 64) */
            if (strict || scarce) return PF_ERR_INVALID_ARG;
            pf__rd_log(&r->rd, PF_LOG_WARN, "pf_records: epoch %llu: %s; left out", (unsigned long long)epoch, why);
            continue;
        }
        f->refs++;
        if (fstat(f->fd, &st) != 0 || (uint64_t)st.st_size < r->c.header_bytes) {
            pf__format(why, n, "pf_records: %s is %lld bytes, shorter than header_bytes (%llu)", path,
                       (long long)st.st_size, (unsigned long long)r->c.header_bytes);
            pf__rec_unref(r, f);
            if (strict) return PF_ERR_INVALID_ARG;
            pf__rd_log(&r->rd, PF_LOG_WARN, "%s; left out", why);
            continue;
        }
        size = (uint64_t)st.st_size - r->c.header_bytes;
        if (size % r->c.record_bytes && !f->warned && pf__rec_warn_once(r, f)) { /* cut short, or the wrong record_bytes? */
            pf__rd_log(&r->rd, PF_LOG_WARN, "pf_records: %s: %llu bytes after header_bytes (%llu) are not a whole "
                       "number of records of %llu bytes: the last %llu bytes are left out", path,
                       (unsigned long long)size, (unsigned long long)r->c.header_bytes,
                       (unsigned long long)r->c.record_bytes, (unsigned long long)(size % r->c.record_bytes));
        }
        if (!pf__rec_view_room(r, v, (uint64_t)v->n + 1)) {
            pf__rec_unref(r, f);
            pf__format(why, n, PF__RD_OOM " for epoch %llu's file list", pf__rd_refused, (unsigned long long)epoch);
            return PF_ERR_NO_MEMORY;
        }
        v->files[v->n] = f;
        v->first[v->n + 1] = v->first[v->n] + size / r->c.record_bytes;
        v->n++;
    }
    return PF_OK;
}

/* Why a view has no record, for the load that fails on it (see below). */
static void pf__rec_empty_why(const pf_records *r, const pf__rec_view *v, char *dst, size_t size) {
    if (!v->listed)
        pf__format(dst, size, "pf_records: path_fn listed no readable file for epoch %llu (it listed none)",
                   (unsigned long long)v->epoch);
    else if (!v->n)
        pf__format(dst, size, "pf_records: path_fn listed no readable file for epoch %llu (%u listed, none opened: "
                   "see the warnings)", (unsigned long long)v->epoch, (unsigned)v->listed);
    else
        pf__format(dst, size, "pf_records: the %u files path_fn listed for epoch %llu hold no record of %llu bytes "
                   "(after header_bytes %llu)", (unsigned)v->n, (unsigned long long)v->epoch,
                   (unsigned long long)r->c.record_bytes, (unsigned long long)r->c.header_bytes);
}

/* This rank's samples of an epoch of n that its loads load, as
   pf__plan_init counts them (drop_last drops the short batch too). */
static uint64_t pf__rec_mine(const pf_records *r, uint64_t n) {
    return r->drop_last ? n / r->world / r->batch_size * r->batch_size : (n + r->world - 1) / r->world;
}

/* cfg.num_samples_fn for a growing list: this epoch's view. */
static uint64_t pf__rec_count(void *user, uint64_t epoch) {
    pf_records *r = (pf_records *)user;
    pf__rec_view *v = &r->views[epoch % r->keep];
    char why[PF__MSG_SIZE];
    uint64_t total;
    pf_result res;
    pf__lock(&r->mu);
    pf__rec_view_clear(r, v);
    res = pf__rec_build(r, v, epoch, false, why, sizeof why);
    total = res == PF_OK ? v->first[v->n] : 0;
    /* built again, should a load need it; an epoch with no batch for this
       rank (drop_last) has no load to let its files go (helper-49) */
    if (res != PF_OK || (total && !pf__rec_mine(r, total))) pf__rec_view_clear(r, v);
    else if (!total) pf__rec_empty_why(r, v, why, sizeof why);
    pf__unlock(&r->mu);
    if (total) return total;
    if (res != PF_OK) {
        char m[PF__MSG_SIZE];
        memcpy(m, why, sizeof m);
        pf__format(why, sizeof why, "pf_records: epoch %llu: %s", (unsigned long long)epoch, m);
    }
    pf__rd_log(&r->rd, PF_LOG_WARN, "%s: pf_next fails (PF_ERR_LOAD) at that epoch", why);
    /* an error, not an empty epoch: that would end at once, and with
       epochs = 0 a loop would spin on PF_END_OF_EPOCH for ever */
    pf__format(pf__plan_why, sizeof pf__plan_why, "%s", why);
    return PF__PLAN_FAILED;
}

static uint32_t pf__rec_find(const pf__rec_view *v, uint64_t x) { /* the last file whose first <= x */
    uint32_t lo = 0, hi = v->n - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (v->first[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* A growing list's view of the job's epoch. Normally built when the epoch
   was planned; an epoch resumed from a checkpoint keeps the size in its
   token and is not counted again, so its view is built here, from the
   files listed now. Under the lock: a view is written only under it.
   NULL, and why, when memory ran out building it (the next load of the
   epoch tries again). */
static pf__rec_view *pf__rec_view_of(pf_records *r, uint64_t epoch, char *why, size_t n) {
    pf__rec_view *v = &r->views[epoch % r->keep];
    if (!r->c.path_fn) return &r->views[0];
    pf__lock(&r->mu);
    if (!v->used || v->epoch != epoch) {
        pf__rec_view_clear(r, v);
        if (pf__rec_build(r, v, epoch, false, why, n) != PF_OK) {
            pf__rec_view_clear(r, v);
            v = NULL;
        }
    }
    pf__unlock(&r->mu);
    return v;
}

static int pf__rec_read(pf_records *r, pf_job *job, pf__rd_ws *ws, const pf__rec_view *v);

/* A growing list's view goes once this rank's every sample of its epoch
   was loaded (the load of each ended, whatever it did; none is loaded
   twice): its files close then, not host_slots + 3 epochs later (an
   outside trial's rolling cache deleted each epoch's shard, and 34 stayed
   open, their disk space held; at ulimit -n 64 the run failed at epoch
   55). A resumed epoch's, whose first samples are never loaded, goes as
   the ring comes round. */
static void pf__rec_loaded(pf_records *r, pf__rec_view *v, uint64_t epoch, uint32_t count) {
    uint64_t n, mine;
    pf__lock(&r->mu);
    n = v->used && v->epoch == epoch ? v->first[v->n] : 0;
    mine = pf__rec_mine(r, n);
    if (n && (v->loaded += count) >= mine) pf__rec_view_clear(r, v);
    pf__unlock(&r->mu);
}

static int pf__rec_load(void *user, pf_job *job) {
    pf_records *r = (pf_records *)user;
    pf__rd_ws *ws = pf__rd_begin(&r->rd, job);
    pf__rec_view *v;
    char why[PF__MSG_SIZE];
    int rc;
    if (!ws) return -1;
    v = pf__rec_view_of(r, job->epoch, why, sizeof why);
    if (!v) return pf_job_fail(job, "pf_records: epoch %llu: %s", (unsigned long long)job->epoch, why);
    rc = pf__rec_read(r, job, ws, v);
    if (r->c.path_fn) pf__rec_loaded(r, v, job->epoch, job->count);
    return rc;
}

/* The job's records, from view v (not written while its epoch loads). */
static int pf__rec_read(pf_records *r, pf_job *job, pf__rd_ws *ws, const pf__rec_view *v) {
    size_t rb = r->c.record_bytes;
    uint32_t i = 0;
    if (!v->first[v->n]) {
        char why[PF__MSG_SIZE];
        pf__rec_empty_why(r, v, why, sizeof why);
        return pf_job_fail(job, "%s", why);
    }
    while (i < job->count) {
        uint64_t x = job->indices[i], rec, off;
        uint32_t f = pf__rec_find(v, x), run = 1;
        const pf__rec_file *file = v->files[f];
        if (x >= v->first[v->n])
            return pf_job_fail(job, "pf_records: sample %llu is past the %llu records of epoch %llu",
                               (unsigned long long)x, (unsigned long long)v->first[v->n],
                               (unsigned long long)job->epoch);
        rec = x - v->first[f];
        off = r->c.header_bytes + rec * rb;
        if (!r->rd.step) { /* raw: consecutive records of one file in one read, straight into the slot */
            unsigned char *dst;
            size_t bytes;
            uint32_t k;
            bool bounce;
            while (i + run < job->count && job->indices[i + run] == x + run && x + run < v->first[f + 1]) run++;
            bytes = (size_t)run * rb;
            dst = (unsigned char *)pf_job_append(job, rb);
            for (k = 1; dst && k < run; k++)
                if (!pf_job_append(job, rb)) dst = NULL;
            if (!dst) return -1;
            /* O_DIRECT straight into the slot when it and the read are
               aligned (page-aligned slots, 4 KiB records), else through
               the worker's buffer */
            bounce = file->direct && ((uint64_t)(uintptr_t)dst | off | (uint64_t)bytes) % PF__RD_ALIGN != 0;
            if (bounce ? pf__pread_direct(file->fd, ws->buf, r->rd.buf_bytes, dst, bytes, off) != 0
                       : pf__pread_full(file->fd, dst, bytes, off) != (long long)bytes)
                return pf_job_fail(job, "pf_records: short read of %u records at record %llu of %s", (unsigned)run,
                                   (unsigned long long)rec, file->path);
        } else {
            pf_sample smp;
            memset(&smp, 0, sizeof smp);
            smp.data = ws->buf;
            if (file->direct) {
                uint64_t a0 = off & ~(uint64_t)(PF__RD_ALIGN - 1);
                size_t need = (size_t)(off - a0) + rb; /* the record's end in the aligned read */
                size_t span = (need + PF__RD_ALIGN - 1) & ~(size_t)(PF__RD_ALIGN - 1);
                if (pf__pread_full(file->fd, ws->buf, span, a0) < (long long)need)
                    return pf_job_fail(job, "pf_records: short read of record %llu of %s", (unsigned long long)rec,
                                       file->path);
                smp.data = ws->buf + (off - a0);
            } else if (pf__pread_full(file->fd, ws->buf, rb, off) != (long long)rb) {
                return pf_job_fail(job, "pf_records: short read of record %llu of %s", (unsigned long long)rec,
                                   file->path);
            }
            smp.index = x;
            smp.i = i;
            smp.bytes = rb;
            if (pf__rd_step(&r->rd, job, &smp) != 0) return -1;
        }
        i += run;
    }
    return 0;
}

/* Every view let go of (a file closes as the last view holding it lets
   go), and the ring and the file cache freed. */
static void pf__rec_views_free(pf_records *r) {
    const pf_allocator *al = &r->rd.al;
    uint32_t i;
    for (i = 0; r->views && i < r->keep; i++) {
        if (r->views[i].files) pf__rec_view_clear(r, &r->views[i]);
        pf__rd_free(al, r->views[i].files);
        pf__rd_free(al, r->views[i].first);
    }
    while (r->ncache) { /* none left normally: each view let go of its own */
        pf__rec_file *f = r->cache[--r->ncache];
        if (f->fd >= 0) close(f->fd);
        pf__rd_free(al, f->path);
        pf__rd_free(al, f);
    }
    pf__rd_free(al, r->cache);
    pf__rd_free(al, r->views);
    r->views = NULL;
    r->cache = NULL;
    r->keep = r->cache_cap = 0;
    r->cache_room = 0;
}

/* A ring of keep views, and a file cache every view's files fit in (all
   different at worst), in place of the ones there, whose views are let go
   of: at the open, and at pf_create before the loader plans an epoch.
   false: out of memory, the ring as it was. */
static bool pf__rec_ring(pf_records *r, uint32_t keep) {
    const pf_allocator *al = &r->rd.al;
    pf__rec_view *views = (pf__rec_view *)pf__rd_calloc(al, keep, sizeof *views); /* lists: pf__rec_view_room */
    if (!views) return false;
    pf__rec_views_free(r);
    r->views = views;
    r->keep = keep;
    {   /* every view's files, all different at worst (a 64-bit product: max_files may be large) */
        uint64_t cap = (uint64_t)keep * r->c.max_files;
        r->cache_cap = cap > UINT32_MAX ? UINT32_MAX : (uint32_t)cap;
    }
    return true;
}

PF_API void pf_records_close(pf_records *r) {
    pf_allocator al;
    if (!r) return;
    al = r->rd.al;
    pf__rec_views_free(r);
    if (r->mu_ok) pf__mutex_destroy(&r->mu);
    pf__rd_free(&al, r);
}

/* The reader of c when it is a growing record list (path_fn), whose
   lists are by epoch and serve one loader at a time; else NULL. */
static pf_records *pf__rd_growing(const pf_config *c) {
    pf_records *r = (pf_records *)c->user;
    return c->load == pf__rec_load && r->c.path_fn ? r : NULL;
}

/* A loader made with the reader (+1), or destroyed (-1): a growing list
   serves one at a time (an outside trial: a second pf_create on a reader
   a live loader used freed the views under that loader's loads). */
static void pf__rd_serve(const pf_config *c, int delta) {
    pf_records *r = pf__rd_growing(c);
    if (!r) return;
    pf__lock(&r->mu);
    r->serving = (uint32_t)((int)r->serving + delta);
    pf__unlock(&r->mu);
}

/* The loader resumes rs: the samples of its epoch this rank loaded before
   (its batches before rs->batch, all whole) count as loaded, or the
   epoch's list would wait for them (helper-49: its files stayed open).
   Only on the same rank and world size: an elastic resume's shares differ,
   and a count past the true one would let the list go under its loads;
   short of it, the list goes as the ring comes round. */
static void pf__rd_resumed(const pf_config *c, const pf__resume *rs) {
    pf_records *r = pf__rd_growing(c);
    uint64_t per = (uint64_t)c->batch_size * (c->world_size ? c->world_size : 1);
    if (!r || rs->others) return;
    /* and its epoch never resumed on another world size (a from= origin
       moves pos off batch * batch_size * world: its shares differ too) */
    if (rs->batch > rs->pos / per || rs->pos != rs->batch * per) return;
    pf__lock(&r->mu);
    r->resumed = true;
    r->resume_epoch = rs->epoch;
    r->resume_done = rs->batch * c->batch_size;
    pf__unlock(&r->mu);
}

/* pf_create's word with a reader, before anything is planned (a loader
   it serves from here: pf_create tells it if it fails after, and
   pf_destroy when it ends, pf__rd_serve): a growing
   record list keeps a view for every epoch a load may still need, and that
   is host_slots + 3 of the config pf_create got (pf__rec_view's comment).
   The open sized the ring by the config as it was then: before it set
   cfg.batch_bytes (a small batch's ring holds up to 64 slots, not
   2 * workers + 1), or before the caller set host_slots or the workers.
   With too few views an outside trial's epochs of one batch read files
   of another epoch (30-87 wrong samples a run, no error), and a view was
   rebuilt under a load still reading it. The ring is made anew, or a
   loader's before it let go of (with nothing planned, no view is in use).
   One loader at a time per reader. */
static pf_result pf__rd_fit(const pf_config *c, char *why, size_t n) {
    pf_records *r = pf__rd_growing(c);
    uint32_t keep = c->host_slots + 3;
    bool ok;
    if (!r) return PF_OK;
    pf__lock(&r->mu);
    if (r->serving) { /* its views are by epoch: a second loader's epochs would rebuild the first's under its loads */
        pf__unlock(&r->mu);
        return (pf__format(why, n, "pf_create: this pf_records reader (a growing list, path_fn) already serves a "
                                   "loader: destroy that one first, or open a reader for each loader"),
                PF_ERR_INVALID_STATE);
    }
    r->world = c->world_size ? c->world_size : 1;
    r->drop_last = c->drop_last;
    r->batch_size = c->batch_size;
    r->resumed = false; /* pf__rd_resumed says, after */
    if (r->keep >= keep) { /* a loader before this one left its lists, and their counts of loads: let go */
        uint32_t i;
        for (i = 0; i < r->keep; i++) pf__rec_view_clear(r, &r->views[i]);
        ok = true;
    } else {
        ok = pf__rec_ring(r, keep);
    }
    r->serving += ok; /* now, not at the end of pf_create: two at once, one is refused */
    pf__unlock(&r->mu);
    if (!ok)
        return (pf__format(why, n, "pf_create: pf_records: " PF__RD_OOM " for %u epochs' file lists of up to %u files "
                                   "(host_slots + 3 of them)", pf__rd_refused, (unsigned)keep, (unsigned)r->c.max_files),
                PF_ERR_NO_MEMORY);
    return PF_OK;
}

PF_API pf_result pf_records_open(const pf_records_config *rc, pf_config *cfg, pf_records **out) {
    char *why = pf__create_error;
    size_t n = sizeof pf__create_error;
    pf_records *r;
    pf_result res = pf__rd_check(rc, cfg, out, "pf_records");
    pf_config before;
    pf_allocator al;
    uint32_t i, files;
    if (res != PF_OK) return res;
    before = *cfg;
    *out = NULL;
    if (!rc->record_bytes) return (pf__format(why, n, "pf_records_open: record_bytes is 0: required"), PF_ERR_INVALID_ARG);
    if (!rc->paths == !rc->path_fn)
        return (pf__format(why, n, "pf_records_open: set paths (with num_paths) or path_fn, one of them"),
                PF_ERR_INVALID_ARG);
    if (rc->paths && !rc->num_paths)
        return (pf__format(why, n, "pf_records_open: num_paths is 0: list at least one file"), PF_ERR_INVALID_ARG);
    for (i = 0; rc->paths && i < rc->num_paths; i++)
        if (!rc->paths[i]) return (pf__format(why, n, "pf_records_open: paths[%u] is NULL", (unsigned)i), PF_ERR_INVALID_ARG);
    al = pf_config_defaults(cfg).allocator;
    r = (pf_records *)pf__rd_calloc(&al, 1, sizeof *r);
    if (!r) return (pf__format(why, n, "pf_records_open: " PF__RD_OOM, pf__rd_refused), PF_ERR_NO_MEMORY);
    r->rd.al = al;
    r->c = *rc;
    if (!r->c.max_files) r->c.max_files = 4096;
    r->world = r->batch_size = 1; /* pf_create says (pf__rd_fit) */
    if (r->c.paths) r->c.max_files = r->c.num_paths;
    if (!r->c.sample_bytes) r->c.sample_bytes = r->c.step ? r->c.record_bytes : 0;
    r->direct = r->c.direct && PF__O_DIRECT != 0;
    r->rd.log = cfg->log;
    r->rd.log_user = cfg->log_user;
    if (r->c.direct && !r->direct) pf__rd_log(&r->rd, PF_LOG_INFO, "pf_records: no O_DIRECT here; reading through the page cache");
    files = r->c.max_files;
    /* pf_create makes it host_slots + 3 views as the config is then (pf__rd_fit) */
    if (!pf__rec_ring(r, r->c.path_fn ? pf_config_defaults(cfg).host_slots + 3 : 1)) goto no_memory;
    if (pf__mutex_init(&r->mu) != 0) {
        pf_records_close(r);
        return (pf__format(why, n, "pf_records_open: could not initialise a mutex"), PF_ERR_THREAD);
    }
    r->mu_ok = true;
    r->rd.step = r->c.step;
    r->rd.step_user = r->c.user;
    r->rd.sample_bytes = r->c.sample_bytes;
    if (r->direct) { /* aligned reads of up to a MiB, or of one record and its edges */
        size_t need = (r->c.record_bytes + 2 * (size_t)PF__RD_ALIGN) & ~(size_t)(PF__RD_ALIGN - 1);
        r->rd.buf_bytes = need > ((size_t)1 << 20) ? need : (size_t)1 << 20;
    } else if (r->c.step) {
        r->rd.buf_bytes = r->c.record_bytes;
    }
    res = pf__rd_attach(&r->rd, cfg, pf__rec_load, r->c.step ? r->c.sample_bytes : r->c.record_bytes, "pf_records");
    if (res == PF_OK && r->c.paths) {
        char msg[PF__MSG_SIZE];
        res = pf__rec_build(r, &r->views[0], 0, true, msg, sizeof msg);
        if (res != PF_OK) pf__format(why, n, "pf_records_open: %s", msg);
        else if (!r->views[0].first[r->views[0].n]) {
            pf__format(why, n, "pf_records_open: the %u files hold no record of %llu bytes (after header_bytes %llu)",
                       (unsigned)r->c.num_paths, (unsigned long long)r->c.record_bytes,
                       (unsigned long long)r->c.header_bytes);
            res = PF_ERR_INVALID_ARG;
        } else {
            cfg->num_samples = r->views[0].first[r->views[0].n];
        }
    } else if (res == PF_OK) {
        cfg->num_samples_fn = pf__rec_count;
    }
    if (res != PF_OK) {
        *cfg = before; /* as it was */
        pf_records_close(r);
        return res;
    }
    *out = r;
    return PF_OK;
no_memory:
    pf_records_close(r);
    return (pf__format(why, n, "pf_records_open: " PF__RD_OOM " for %u files' bookkeeping",
                       pf__rd_refused, (unsigned)files),
            PF_ERR_NO_MEMORY);
}

/* >>tokens ---------------------------------------------------------------- */
/* llm.c's DataLoader, as a reader: sample k of the epoch is the k-th step
   of this rank over the shards in order, so a run matches llm.c's own
   batches token for token. */
#define PF__TOK_MAGIC 20240520
#define PF__TOK_VERSION 1
#define PF__TOK_HEADER 1024u /* 256 int32 */

typedef struct pf__tok_shard {
    char *path;
    int fd;
    uint64_t ntok, steps, first;
} pf__tok_shard;

struct pf_tokens {
    pf__rd rd; /* first: cfg.user points here */
    pf__tok_shard *sh;
    uint32_t n;
    uint64_t bt, world, rank, total;
};

static int pf__tok_load(void *user, pf_job *job) {
    pf_tokens *t = (pf_tokens *)user;
    pf__rd_ws *ws = pf__rd_begin(&t->rd, job);
    size_t bytes = (size_t)(t->bt + 1) * 2;
    uint32_t i;
    if (!ws) return -1;
    for (i = 0; i < job->count; i++) {
        uint64_t x = job->indices[i], k, off;
        uint32_t lo = 0, hi = t->n - 1;
        const pf__tok_shard *s;
        unsigned char *dst;
        while (lo < hi) { /* the last shard whose first <= x */
            uint32_t mid = (lo + hi + 1) / 2;
            if (t->sh[mid].first <= x) lo = mid;
            else hi = mid - 1;
        }
        s = &t->sh[lo];
        k = x - s->first;
        off = PF__TOK_HEADER + (k * t->world + t->rank) * t->bt * 2;
        dst = t->rd.step ? ws->buf : (unsigned char *)pf_job_append(job, bytes);
        if (!dst) return -1;
        if (pf__pread_full(s->fd, dst, bytes, off) != (long long)bytes) {
            uint64_t tok = (off - PF__TOK_HEADER) / 2, end = tok + t->bt; /* the step's first and last token */
            return pf_job_fail(job, "pf_tokens: %s: short read of step %llu (tokens %llu..%llu of %llu): the shard "
                               "changed since it was opened", s->path, (unsigned long long)k, (unsigned long long)tok,
                               (unsigned long long)end, (unsigned long long)s->ntok);
        }
        if (t->rd.step) {
            pf_sample smp;
            memset(&smp, 0, sizeof smp);
            smp.index = x;
            smp.i = i;
            smp.data = dst;
            smp.bytes = bytes;
            if (pf__rd_step(&t->rd, job, &smp) != 0) return -1;
        }
    }
    return 0;
}

PF_API void pf_tokens_close(pf_tokens *t) {
    pf_allocator al;
    uint32_t i;
    if (!t) return;
    al = t->rd.al;
    for (i = 0; t->sh && i < t->n; i++) {
        if (t->sh[i].fd >= 0) close(t->sh[i].fd);
        pf__rd_free(&al, t->sh[i].path);
    }
    pf__rd_free(&al, t->sh);
    pf__rd_free(&al, t);
}

/* One shard's header and size, checked: PF_OK, or why not. */
static pf_result pf__tok_shard_open(pf_tokens *t, pf__tok_shard *s, const char *path, char *why, size_t n) {
    int32_t h[256];
    struct stat st;
    s->path = pf__rd_strdup(&t->rd.al, path);
    if (!s->path) return (pf__format(why, n, "pf_tokens_open: " PF__RD_OOM, pf__rd_refused), PF_ERR_NO_MEMORY);
    s->fd = PF__OPEN(path, PF__RD_FLAGS);
    if (s->fd < 0 || fstat(s->fd, &st) != 0) {
        char err[PF__ERRNO_TEXT];
        return (pf__format(why, n, "pf_tokens_open: cannot open shard %s: %s", path,
                           pf__errno_text(errno, err, sizeof err)),
                PF_ERR_INVALID_ARG);
    }
    if (pf__rd_not_file(&st))
        return (pf__format(why, n, "pf_tokens_open: shard %s is %s", path, pf__rd_not_file(&st)), PF_ERR_INVALID_ARG);
    if (pf__pread_full(s->fd, h, sizeof h, 0) != (long long)sizeof h)
        return (pf__format(why, n, "pf_tokens_open: shard %s is %lld bytes, shorter than its %u-byte header", path,
                           (long long)st.st_size, PF__TOK_HEADER), PF_ERR_INVALID_ARG);
    if (h[0] != PF__TOK_MAGIC)
        return (pf__format(why, n, "pf_tokens_open: shard %s: bad magic %d (llm.c's is %d)", path, (int)h[0],
                           PF__TOK_MAGIC), PF_ERR_INVALID_ARG);
    if (h[1] != PF__TOK_VERSION)
        return (pf__format(why, n, "pf_tokens_open: shard %s: bad version %d (expected %d)", path, (int)h[1],
                           PF__TOK_VERSION), PF_ERR_INVALID_ARG);
    s->ntok = (uint64_t)(uint32_t)h[2];
    if ((uint64_t)st.st_size != PF__TOK_HEADER + 2 * s->ntok)
        return (pf__format(why, n, "pf_tokens_open: shard %s is %lld bytes, but its header says %llu tokens (%llu "
                                   "bytes): truncated or corrupt", path, (long long)st.st_size,
                           (unsigned long long)s->ntok, (unsigned long long)(PF__TOK_HEADER + 2 * s->ntok)),
                PF_ERR_INVALID_ARG);
    /* llm.c's loader asserts this of every shard at init; a shard skipped
       without a word would be data silently left out */
    if (s->ntok < t->world * t->bt + 1)
        return (pf__format(why, n, "pf_tokens_open: shard %s holds %llu tokens, fewer than world (%llu) * B * T "
                                   "(%llu) + 1: not one step (llm.c's loader stops at such a shard too)",
                           path, (unsigned long long)s->ntok, (unsigned long long)t->world,
                           (unsigned long long)t->bt), PF_ERR_INVALID_ARG);
    s->steps = (s->ntok - 1) / (t->world * t->bt);
    return PF_OK;
}

PF_API pf_result pf_tokens_open(const pf_tokens_config *tc, pf_config *cfg, pf_tokens **out) {
    char *why = pf__create_error;
    size_t n = sizeof pf__create_error;
    pf_result res = pf__rd_check(tc, cfg, out, "pf_tokens");
    pf_config before;
    pf_allocator al;
    pf_tokens *t;
    uint32_t i;
    if (res != PF_OK) return res;
    *out = NULL;
    before = *cfg;
    if (!tc->B || !tc->T)
        return (pf__format(why, n, "pf_tokens_open: B is %u and T is %u: both are required (>= 1)", (unsigned)tc->B,
                           (unsigned)tc->T), PF_ERR_INVALID_ARG);
    if (!tc->paths || !tc->num_paths)
        return (pf__format(why, n, "pf_tokens_open: no shards: set paths and num_paths"), PF_ERR_INVALID_ARG);
    if (cfg->rank >= (cfg->world_size ? cfg->world_size : 1)) /* 0 is the default, 1 */
        return (pf__format(why, n, "pf_tokens_open: cfg.rank is %u: must be below cfg.world_size (%u%s)",
                           (unsigned)cfg->rank, (unsigned)cfg->world_size, cfg->world_size ? "" : ", the default 1"),
                PF_ERR_INVALID_ARG);
    if (cfg->world_size > PF__MAX_WORLD) /* pf_create would say so, but the open sets it to 1 */
        return (pf__format(why, n, "pf_tokens_open: cfg.world_size is %u: at most %u", (unsigned)cfg->world_size,
                           (unsigned)PF__MAX_WORLD), PF_ERR_INVALID_ARG);
    /* a step of every rank's B * T tokens, and the one after: a shard's
       header counts at most 2^32 - 1 (and world * B * T wrapped to 0 made
       the shard check pass, then divided by it: an outside trial's
       SIGFPE) */
    if ((uint64_t)tc->B * tc->T >= UINT32_MAX / (cfg->world_size ? cfg->world_size : 1))
        return (pf__format(why, n, "pf_tokens_open: B (%u) * T (%u) * cfg.world_size (%u) tokens a step is more than "
                                   "any shard holds (its header counts at most 2^32 - 1 tokens)",
                           (unsigned)tc->B, (unsigned)tc->T, (unsigned)(cfg->world_size ? cfg->world_size : 1)),
                PF_ERR_INVALID_ARG);
    al = pf_config_defaults(cfg).allocator;
    t = (pf_tokens *)pf__rd_calloc(&al, 1, sizeof *t);
    if (t) t->sh = (pf__tok_shard *)pf__rd_calloc(&al, tc->num_paths, sizeof *t->sh);
    if (!t || !t->sh) {
        pf__rd_free(&al, t);
        return (pf__format(why, n, "pf_tokens_open: " PF__RD_OOM, pf__rd_refused), PF_ERR_NO_MEMORY);
    }
    t->rd.al = al;
    t->bt = (uint64_t)tc->B * tc->T;
    t->world = cfg->world_size ? cfg->world_size : 1;
    t->rank = cfg->rank;
    for (i = 0; i < tc->num_paths; i++) t->sh[i].fd = -1;
    for (i = 0; i < tc->num_paths && res == PF_OK; i++) {
        if (!tc->paths[i]) {
            pf__format(why, n, "pf_tokens_open: paths[%u] is NULL", (unsigned)i);
            res = PF_ERR_INVALID_ARG;
            break;
        }
        t->n++;
        res = pf__tok_shard_open(t, &t->sh[i], tc->paths[i], why, n);
        t->sh[i].first = t->total;
        t->total += t->sh[i].steps;
    }
    t->rd.step = tc->step;
    t->rd.step_user = tc->user;
    t->rd.sample_bytes = tc->step && tc->sample_bytes ? tc->sample_bytes : (size_t)(t->bt + 1) * 2;
    t->rd.buf_bytes = tc->step ? (size_t)(t->bt + 1) * 2 : 0;
    if (res == PF_OK) res = pf__rd_attach(&t->rd, cfg, pf__tok_load, t->rd.sample_bytes, "pf_tokens");
    if (res != PF_OK) {
        *cfg = before;
        pf_tokens_close(t);
        return res;
    }
    cfg->num_samples = t->total;
    cfg->rank = 0; /* the reader shards llm.c's way: every rank the same order */
    cfg->world_size = 1;
    *out = t;
    return PF_OK;
}

/* The token reader's step, world_size * B * T tokens: what its positions
   count in, written in its tokens (tokens=) and checked at a resume. n
   alone let a token of another world size or B resume when the counts
   of steps happened to agree (an outside trial's small shard: world 8 to
   9 went on at token 18 of 16). The same step on another world size and
   B, T is the same position: resumed, as llm.c's loader would. */
static uint64_t pf__rd_token_step(const pf_config *c) {
    return c->load == pf__tok_load ? ((const pf_tokens *)c->user)->world * ((const pf_tokens *)c->user)->bt : 0;
}
/* The token reader runs the loader as rank 0 of 1 (every rank at the same
   step, as llm.c's loader): a token's n is the steps, which world_size, B
   and T decide, so an older token (no tokens=) of another world size is
   refused as an n that differs. Said why. */
static const char *pf__rd_token_hint(const pf_config *c) {
    return c->load == pf__tok_load ? " (pf_tokens: a sample is a step of world_size * B * T tokens: a token written "
                                     "with another world_size, B or T does not resume here)"
                                   : "";
}

/* >>tar ------------------------------------------------------------------- */
/* The index: every regular file's data (shard, offset, size, extension),
   and samples as runs of consecutive files with one key. Built at open
   from the 512-byte headers alone (pread; the data is never read then). */
typedef struct pf__tar_part {
    uint64_t off, size;
    uint32_t name; /* into names: the extension */
} pf__tar_part;

typedef struct pf__tar_sample {
    uint64_t first; /* its first part */
    uint64_t span;  /* bytes from its first part's data to its last part's end */
    uint64_t bytes; /* its parts' bytes */
    uint32_t nparts, shard, key;
} pf__tar_sample;

struct pf_tar {
    pf__rd rd; /* first: cfg.user points here */
    char **paths;
    int *fds;
    uint32_t nshards;
    pf__tar_part *parts;
    uint64_t nparts, parts_cap;
    pf__tar_sample *samples;
    uint64_t nsamples, samples_cap;
    char *names;
    size_t names_len, names_cap;
    uint64_t max_span, max_bytes;
    uint32_t max_parts;
};

static uint32_t pf__tar_name(pf_tar *t, const char *s, size_t len) { /* into the name pool; UINT32_MAX: no memory */
    uint64_t cap = t->names_cap;
    size_t at = t->names_len;
    void *p = t->names;
    if (!pf__grow_array(&t->rd.al, &p, &cap, (uint64_t)at + len + 1, 1) || at + len + 1 > UINT32_MAX)
        return UINT32_MAX;
    t->names = (char *)p;
    t->names_cap = (size_t)cap;
    memcpy(t->names + at, s, len);
    t->names[at + len] = '\0';
    t->names_len = at + len + 1;
    return (uint32_t)at;
}

/* A numeric header field: octal (NUL/space padded), or base-256 (GNU). */
static bool pf__tar_number(const unsigned char *f, size_t len, uint64_t *out) {
    uint64_t v = 0;
    size_t i = 0;
    if (f[0] & 0x80) { /* base-256: big-endian, the high bit is the flag */
        if (f[0] & 0x40) return false; /* negative */
        v = f[0] & 0x3f;
        for (i = 1; i < len; i++) {
            if (v >> 55) return false;
            v = v << 8 | f[i];
        }
        *out = v;
        return true;
    }
    while (i < len && f[i] == ' ') i++;
    if (i == len || f[i] < '0' || f[i] > '7') return false;
    for (; i < len && f[i] >= '0' && f[i] <= '7'; i++) {
        if (v >> 60) return false;
        v = v * 8 + (uint64_t)(f[i] - '0');
    }
    for (; i < len; i++)
        if (f[i] != ' ' && f[i] != '\0') return false;
    *out = v;
    return true;
}

/* pax records "LEN key=value\n": path and size override the next header.
   *has_path says whether a path record was there (an empty value, as POSIX
   says, leaves the header's own name in force). */
/* false: malformed, or (*too_long set to its length) a path of path_cap
   bytes or more. *sparse: GNU sparse records (GNU.sparse.*): the entry's
   data is a sparse map and its pieces, not the file. */
static bool pf__tar_pax(const char *p, size_t n, char *path, size_t path_cap, bool *has_path, uint64_t *size,
                        bool *has_size, size_t *too_long, bool *sparse) {
    size_t at = 0;
    while (at < n) {
        size_t len = 0, k = at, eq;
        /* a length past the record's end ends the parse before it can
           wrap (an outside trial's 20-digit lengths moved `at` back: a
           hang, or a read before the buffer) */
        while (k < n && p[k] >= '0' && p[k] <= '9' && len <= n) len = len * 10 + (size_t)(p[k++] - '0');
        if (len > n || k == at || k >= n || p[k] != ' ' || len < k - at + 3 || at + len > n || p[at + len - 1] != '\n')
            return false;
        k++;
        for (eq = k; eq < at + len && p[eq] != '='; eq++) {}
        if (eq == at + len) return false;
        if (eq - k == 4 && !memcmp(p + k, "path", 4)) {
            size_t vl = at + len - 1 - (eq + 1);
            if (vl >= path_cap) return (*too_long = vl), false;
            memcpy(path, p + eq + 1, vl);
            path[vl] = '\0';
            *has_path = vl > 0;
        } else if (eq - k == 4 && !memcmp(p + k, "size", 4)) {
            uint64_t v = 0;
            size_t j;
            for (j = eq + 1; j < at + len - 1; j++) {
                if (p[j] < '0' || p[j] > '9' || v > UINT64_MAX / 10 - 9) return false;
                v = v * 10 + (uint64_t)(p[j] - '0');
            }
            *size = v;
            *has_size = j > eq + 1; /* empty: the header's own size stands (POSIX) */
        } else if (eq - k > 11 && !memcmp(p + k, "GNU.sparse.", 11)) {
            *sparse = true;
        }
        at += len;
    }
    return true;
}

#define PF__TAR_PATH 4096
#define PF__TAR_PAX_MAX ((uint64_t)1 << 20) /* a pax record's bytes: xattrs make them long */

static bool pf__tar_zeros(const unsigned char *p, size_t n) { /* all n bytes 0: end-of-archive padding */
    size_t i;
    for (i = 0; i < n && !p[i]; i++) {}
    return i == n;
}

/* A header block's checksum holds (the sum of its bytes, the field itself
   counted as spaces). */
static bool pf__tar_sum_ok(const unsigned char *h) {
    uint64_t sum, want = 0;
    size_t i;
    for (i = 0; i < 512; i++) want += (i >= 148 && i < 156) ? (uint64_t)' ' : h[i];
    return pf__tar_number(h + 148, 8, &sum) && sum == want;
}

static pf_result pf__tar_index(pf_tar *t, uint32_t shard, char *why, size_t n) {
    const char *path = t->paths[shard];
    int fd = t->fds[shard];
    struct stat st;
    uint64_t pos = 0, fsize, pax_size = 0, meta_at = 0, noext = 0, noext_at = 0, links = 0, link_at = 0, odd = 0,
             odd_at = 0, zeros_at = 0, zeros = 0;
    /* the first file without an extension, link, or entry of another kind
       with data: for the warnings */
    char noext_name[256], link_name[256], odd_name[256], odd_kind[48];
    /* longname: the next entry's name from a GNU long name or a pax path
       record (has_long, has_pax_path); it and the pax size apply to the next
       entry only, and are cleared by it */
    char *name = (char *)pf__rd_alloc(&t->rd.al, PF__TAR_PATH), *meta = NULL;
    char *longname = (char *)pf__rd_calloc(&t->rd.al, 1, PF__TAR_PATH);
    bool has_long = false, has_pax_path = false, has_pax_size = false, same_key_run = false, ended = false,
         meta_pending = false, /* an L or x record read, its entry not yet */
         pax_sparse = false, sparse, trailing = false, lone = false, one_end = false;
    uint32_t prev_key_len = 0;
    pf_result res = PF_OK;
#define PF__TAR_BAD(...) do { pf__format(why, n, __VA_ARGS__); res = PF_ERR_INVALID_ARG; goto done; } while (0)
#define PF__TAR_OOM() \
    do { pf__format(why, n, "pf_tar_open: " PF__RD_OOM " indexing %s", pf__rd_refused, path); \
         res = PF_ERR_NO_MEMORY; goto done; } while (0)
    if (!name || !longname) {
        pf__format(why, n, "pf_tar_open: " PF__RD_OOM, pf__rd_refused);
        res = PF_ERR_NO_MEMORY;
        goto done;
    }
    if (fstat(fd, &st) != 0) {
        char err[PF__ERRNO_TEXT];
        PF__TAR_BAD("pf_tar_open: cannot stat %s: %s", path, pf__errno_text(errno, err, sizeof err));
    }
    if (pf__rd_not_file(&st)) PF__TAR_BAD("pf_tar_open: %s is %s, not a tar shard", path, pf__rd_not_file(&st));
    fsize = (uint64_t)st.st_size;
    for (;;) {
        unsigned char h[512];
        uint64_t size, data, next;
        unsigned type;
        /* no end blocks, or the last entry's data whole and its padding
           cut: accepted, as tar does, with a warning (below) */
        if (pos >= fsize) break;
        if (pos + 512 > fsize) {
            unsigned char tail[512];
            size_t left = (size_t)(fsize - pos);
            /* zeros: the first end block, cut (an outside trial's; GNU tar lists it) */
            if (pf__pread_full(fd, tail, left, pos) == (long long)left && pf__tar_zeros(tail, left)) break;
            PF__TAR_BAD("pf_tar_open: %s is truncated: a header at byte %llu needs 512 bytes, %llu are left", path,
                        (unsigned long long)pos, (unsigned long long)(fsize - pos));
        }
        if (pf__pread_full(fd, h, 512, pos) != 512)
            PF__TAR_BAD("pf_tar_open: %s: cannot read the header at byte %llu", path, (unsigned long long)pos);
        if (pf__tar_zeros(h, 512)) {
            /* The end of the archive (two zero blocks), unless a header
               follows the zeros: a lone zero block in the middle (damage),
               or archives concatenated. tar stops at the first; an outside
               trial's shard lost half its samples there without a word.
               Read on, and say so; what follows an end that is not a
               header is left, and said. */
            uint64_t q = pos + 512;
            for (; q + 512 <= fsize; q += 512) {
                if (pf__pread_full(fd, h, 512, q) != 512)
                    PF__TAR_BAD("pf_tar_open: %s: cannot read the block at byte %llu", path, (unsigned long long)q);
                if (!pf__tar_zeros(h, 512)) break;
            }
            if (q + 512 > fsize) { /* zeros to the end, and a tail under a block: zeros too, or said */
                size_t left = (size_t)(fsize - q);
                ended = true;
                /* a header cut, or bytes after the end (an outside trial's were silent) */
                if (left && pf__pread_full(fd, h, left, q) == (long long)left && !pf__tar_zeros(h, left)) {
                    trailing = true;
                    lone = q == pos + 512;
                    zeros_at = pos;
                }
                if (!trailing && q == pos + 512) { /* one end block of two: cut (tar: "a lone zero block") */
                    one_end = true;
                    zeros_at = pos;
                }
                break;
            }
            if (!pf__tar_sum_ok(h)) {
                trailing = true;
                lone = q == pos + 512; /* damage: a real end is two blocks */
                zeros_at = pos;
                ended = true;
                break;
            }
            if (!zeros++) zeros_at = pos;
            pos = q;
            continue;
        }
        if (!pf__tar_sum_ok(h))
            PF__TAR_BAD("pf_tar_open: %s is corrupt: the header at byte %llu fails its checksum (not a tar file, or "
                        "damaged)", path, (unsigned long long)pos);
        if (!pf__tar_number(h + 124, 12, &size))
            PF__TAR_BAD("pf_tar_open: %s is corrupt: the header at byte %llu has a bad size field", path,
                        (unsigned long long)pos);
        type = h[156];
        if (type == 'x' || type == 'L' || type == 'g' || type == 'K') { /* these sizes are their own */
        } else if (has_pax_size) {
            size = pax_size;
        }
        data = pos + 512;
        if (type == 'S' && h[482]) { /* an old GNU sparse file's map goes on in blocks of its own, before the
                                        data (an outside trial: counted as data, the index landed in it) */
            unsigned char ext[512];
            do {
                if (data + 512 > fsize || pf__pread_full(fd, ext, 512, data) != 512)
                    PF__TAR_BAD("pf_tar_open: %s is truncated: the sparse map of the entry at byte %llu goes past "
                                "its end", path, (unsigned long long)pos);
                data += 512;
            } while (ext[504]);
        }
        next = data + ((size + 511) & ~(uint64_t)511);
        if (size > fsize || next > fsize + 511 || data + size > fsize)
            PF__TAR_BAD("pf_tar_open: %s is truncated: the entry at byte %llu needs %llu bytes of data, the file ends "
                        "at %llu", path, (unsigned long long)pos, (unsigned long long)size, (unsigned long long)fsize);
        if (type == 'L' || type == 'x') {
            uint64_t most = type == 'L' ? (uint64_t)PF__TAR_PATH * 4 : PF__TAR_PAX_MAX;
            if (size >= most)
                PF__TAR_BAD("pf_tar_open: %s: the %s record at byte %llu is %llu bytes, too long (under %llu read)",
                            path, type == 'L' ? "GNU long name" : "pax", (unsigned long long)pos,
                            (unsigned long long)size, (unsigned long long)most);
            pf__rd_free(&t->rd.al, meta);
            meta = (char *)pf__rd_alloc(&t->rd.al, (size_t)size + 1);
            if (!meta) PF__TAR_OOM();
            if (pf__pread_full(fd, meta, (size_t)size, data) != (long long)size)
                PF__TAR_BAD("pf_tar_open: %s: cannot read the record at byte %llu", path, (unsigned long long)pos);
            meta[size] = '\0';
            meta_at = pos;
            meta_pending = true; /* whatever it says, it is for an entry that must follow */
            if (type == 'L') {
                size_t len = strnlen(meta, (size_t)size);
                if (!len)
                    PF__TAR_BAD("pf_tar_open: %s is corrupt: the GNU long name at byte %llu is empty", path,
                                (unsigned long long)pos);
                if (len >= PF__TAR_PATH)
                    PF__TAR_BAD("pf_tar_open: %s: the long name at byte %llu is longer than %u", path,
                                (unsigned long long)pos, PF__TAR_PATH);
                memcpy(longname, meta, len + 1);
                has_long = true;
            } else {
                size_t too_long = 0;
                if (!pf__tar_pax(meta, (size_t)size, longname, PF__TAR_PATH, &has_pax_path, &pax_size,
                                 &has_pax_size, &too_long, &pax_sparse)) {
                    if (too_long)
                        PF__TAR_BAD("pf_tar_open: %s: the pax path at byte %llu is %llu bytes, longer than %u", path,
                                    (unsigned long long)pos, (unsigned long long)too_long, PF__TAR_PATH - 1);
                    PF__TAR_BAD("pf_tar_open: %s is corrupt: the pax header at byte %llu is malformed", path,
                                (unsigned long long)pos);
                }
            }
            pos = next;
            continue;
        }
        if (type == 'g' || type == 'K') { /* pax globals, GNU long link names: nothing here, and the
                                             next entry's name and size still stand */
            pos = next;
            continue;
        }
        if (has_long || has_pax_path) {
            snprintf(name, PF__TAR_PATH, "%s", longname);
        } else {
            size_t pl = strnlen((const char *)h + 345, 155), nl = strnlen((const char *)h, 100);
            /* the name prefix is POSIX ustar's ("ustar\0"); an old GNU
               header ("ustar  \0") keeps its atime and ctime there */
            if (!memcmp(h + 257, "ustar", 6) && pl)
                snprintf(name, PF__TAR_PATH, "%.*s/%.*s", (int)pl, (const char *)h + 345, (int)nl, (const char *)h);
            else
                snprintf(name, PF__TAR_PATH, "%.*s", (int)nl, (const char *)h);
        }
        has_long = has_pax_path = has_pax_size = meta_pending = false;
        longname[0] = '\0';
        sparse = pax_sparse || type == 'S';
        pax_sparse = false; /* like the pax size: the next entry's only */
        if (sparse || (size && type != '\0' && (type < '0' || type > '7'))) {
            /* data that is not the file's bytes as they are: a GNU sparse
               file (type S, or pax GNU.sparse records: a map, then the
               pieces; all hole, no data at all, and still not an empty
               file), or a kind this reader does not know with data (GNU's
               D, M, V, a vendor's): left out, and said (an outside trial's
               sparse files came out as their map, or as 0 bytes) */
            if (!odd++) {
                snprintf(odd_name, sizeof odd_name, "%s", name);
                odd_at = pos;
                if (sparse) snprintf(odd_kind, sizeof odd_kind, "a GNU sparse file");
                else snprintf(odd_kind, sizeof odd_kind, "an entry of type '%c'", type >= 32 && type < 127 ? (char)type : '?');
            }
            pos = next;
            continue;
        }
        if (type == '0' || type == '\0' || type == '7') { /* a regular file: a part */
            const char *base = strrchr(name, '/'), *dot;
            size_t key_len;
            pf__tar_part *p;
            base = base ? base + 1 : name;
            dot = strchr(base, '.');
            if (!*base || *base == '.') { pos = next; continue; } /* hidden files: WebDataset skips them too */
            if (!dot) { /* no extension to name a part by: WebDataset's keys() gives None, and it skips it */
                if (!noext++) {
                    snprintf(noext_name, sizeof noext_name, "%s", name);
                    noext_at = pos;
                }
                pos = next;
                continue;
            }
            key_len = (size_t)(dot - name);
            same_key_run = t->nsamples && t->samples[t->nsamples - 1].shard == shard && prev_key_len == key_len &&
                           !memcmp(t->names + t->samples[t->nsamples - 1].key, name, key_len);
            if (same_key_run) { /* two parts of one name: which one would a step get? */
                const pf__tar_sample *s = &t->samples[t->nsamples - 1];
                uint64_t k;
                for (k = s->first; k < s->first + s->nparts; k++)
                    if (!strcmp(t->names + t->parts[k].name, dot + 1))
                        PF__TAR_BAD("pf_tar_open: %s: duplicate file name %s (entry at byte %llu): sample %.*s "
                                    "already has a part named \"%s\"", path, name, (unsigned long long)pos,
                                    (int)key_len, name, dot + 1);
            }
            if (!pf__grow_array(&t->rd.al, (void **)&t->parts, &t->parts_cap, t->nparts + 1, sizeof *t->parts))
                PF__TAR_OOM();
            p = &t->parts[t->nparts];
            p->off = data;
            p->size = size;
            p->name = pf__tar_name(t, dot + 1, strlen(dot + 1));
            if (p->name == UINT32_MAX) PF__TAR_OOM();
            if (!same_key_run) {
                pf__tar_sample *s;
                if (!pf__grow_array(&t->rd.al, (void **)&t->samples, &t->samples_cap, t->nsamples + 1,
                                    sizeof *t->samples))
                    PF__TAR_OOM();
                s = &t->samples[t->nsamples++];
                memset(s, 0, sizeof *s);
                s->first = t->nparts;
                s->shard = shard;
                s->key = pf__tar_name(t, name, key_len);
                if (s->key == UINT32_MAX) PF__TAR_OOM();
                prev_key_len = (uint32_t)key_len;
            }
            {
                pf__tar_sample *s = &t->samples[t->nsamples - 1];
                s->nparts++;
                s->bytes += size;
                s->span = data + size - t->parts[s->first].off;
                if (s->span > t->max_span) t->max_span = s->span;
                if (s->bytes > t->max_bytes) t->max_bytes = s->bytes;
                if (s->nparts > t->max_parts) t->max_parts = s->nparts;
            }
            t->nparts++;
        } else if (type == '1' || type == '2') { /* a link has no data here: said, not read */
            if (!links++) {
                snprintf(link_name, sizeof link_name, "%s", name);
                link_at = pos;
            }
        }
        pos = next;
    }
    if (meta_pending)
        pf__rd_log(&t->rd, PF_LOG_WARN, "pf_tar: %s: the %s header at byte %llu has no entry after it; ignored",
                   path, has_long ? "GNU long name" : "pax", (unsigned long long)meta_at);
    if (noext)
        pf__rd_log(&t->rd, PF_LOG_WARN, "pf_tar: %s: %llu file%s without an extension (no dot in the file name: "
                   "the first is %s, at byte %llu) left out: a sample's parts are named by their extensions, and "
                   "WebDataset leaves such files out too", path, (unsigned long long)noext, noext == 1 ? "" : "s",
                   noext_name, (unsigned long long)noext_at);
    if (links)
        pf__rd_log(&t->rd, PF_LOG_WARN, "pf_tar: %s: %llu link%s (hard or symbolic: the first is %s, at byte %llu) "
                   "left out: a link has no data of its own in the shard (tar writes a hard link for a file added "
                   "twice), and WebDataset reads regular files only", path, (unsigned long long)links,
                   links == 1 ? "" : "s", link_name, (unsigned long long)link_at);
    if (odd)
        pf__rd_log(&t->rd, PF_LOG_WARN, "pf_tar: %s: %llu entr%s with data that is not a regular file's (the first "
                   "is %s, %s, at byte %llu) left out: extract and re-create the shard to read %s", path,
                   (unsigned long long)odd, odd == 1 ? "y" : "ies", odd_name, odd_kind, (unsigned long long)odd_at,
                   odd == 1 ? "it" : "them");
    if (zeros)
        pf__rd_log(&t->rd, PF_LOG_WARN, "pf_tar: %s: zero blocks (an end of archive) at byte %llu%s, with entries "
                   "after them: read on (a lone zero block is damage; tar stops there; archives concatenated with "
                   "cat are read whole)", path, (unsigned long long)zeros_at, zeros > 1 ? " and further on" : "");
    if (one_end)
        pf__rd_log(&t->rd, PF_LOG_WARN, "pf_tar: %s ends with one zero block at byte %llu, not the two of an end of "
                   "archive (cut?); its entries up to there are read", path, (unsigned long long)zeros_at);
    if (trailing && lone)
        pf__rd_log(&t->rd, PF_LOG_WARN, "pf_tar: %s: a lone zero block at byte %llu, and no header after it "
                   "(damaged?): the %llu bytes from there on are left out, as tar leaves them", path,
                   (unsigned long long)zeros_at, (unsigned long long)(fsize - zeros_at));
    else if (trailing)
        pf__rd_log(&t->rd, PF_LOG_WARN, "pf_tar: %s: the end of the archive at byte %llu is followed by bytes that "
                   "are not a tar header: left out", path, (unsigned long long)zeros_at);
    if (!ended && pos)
        pf__rd_log(&t->rd, PF_LOG_WARN, "pf_tar: %s ends at byte %llu without the end-of-archive blocks (truncated "
                   "after a whole entry, in its padding or in the end blocks?); its entries up to there are read",
                   path, (unsigned long long)fsize);
done:
    pf__rd_free(&t->rd.al, name);
    pf__rd_free(&t->rd.al, longname);
    pf__rd_free(&t->rd.al, meta);
    return res;
#undef PF__TAR_BAD
#undef PF__TAR_OOM
}

static int pf__tar_load(void *user, pf_job *job) {
    pf_tar *t = (pf_tar *)user;
    pf__rd_ws *ws = pf__rd_begin(&t->rd, job);
    uint32_t i, k;
    if (!ws) return -1;
    for (i = 0; i < job->count; i++) {
        uint64_t x = job->indices[i];
        const pf__tar_sample *s = &t->samples[x];
        const pf__tar_part *p = &t->parts[s->first];
        int fd = t->fds[s->shard];
        if (!t->rd.step) { /* raw: the parts back to back, each read straight into the slot */
            unsigned char *dst = (unsigned char *)pf_job_append(job, (size_t)s->bytes);
            if (!dst) return -1;
            for (k = 0; k < s->nparts; k++) {
                if (pf__pread_full(fd, dst, (size_t)p[k].size, p[k].off) != (long long)p[k].size)
                    return pf_job_fail(job, "pf_tar: %s: short read of %s.%s (the file changed since it was "
                                       "indexed?)", t->paths[s->shard], t->names + s->key, t->names + p[k].name);
                dst += p[k].size;
            }
        } else { /* the sample's span in one read; the parts point into it */
            pf_part *parts = (pf_part *)(ws->buf + ((t->max_span + 15) & ~(uint64_t)15));
            pf_sample smp;
            if (pf__pread_full(fd, ws->buf, (size_t)s->span, p[0].off) != (long long)s->span)
                return pf_job_fail(job, "pf_tar: %s: short read of sample %s (the file changed since it was "
                                   "indexed?)", t->paths[s->shard], t->names + s->key);
            for (k = 0; k < s->nparts; k++) {
                parts[k].name = t->names + p[k].name;
                parts[k].data = ws->buf + (p[k].off - p[0].off);
                parts[k].bytes = (size_t)p[k].size;
            }
            memset(&smp, 0, sizeof smp);
            smp.index = x;
            smp.i = i;
            smp.key = t->names + s->key;
            smp.data = parts[0].data;
            smp.bytes = parts[0].bytes;
            smp.parts = parts;
            smp.num_parts = s->nparts;
            if (pf__rd_step(&t->rd, job, &smp) != 0) return -1;
        }
    }
    return 0;
}

PF_API uint64_t pf_tar_samples(const pf_tar *t) { return t ? t->nsamples : 0; }

PF_API void pf_tar_close(pf_tar *t) {
    pf_allocator al;
    uint32_t i;
    if (!t) return;
    al = t->rd.al;
    for (i = 0; i < t->nshards; i++) {
        if (t->fds && t->fds[i] >= 0) close(t->fds[i]);
        if (t->paths) pf__rd_free(&al, t->paths[i]);
    }
    pf__rd_free(&al, t->fds);
    pf__rd_free(&al, t->paths);
    pf__rd_free(&al, t->parts);
    pf__rd_free(&al, t->samples);
    pf__rd_free(&al, t->names);
    pf__rd_free(&al, t);
}

PF_API pf_result pf_tar_open(const pf_tar_config *tc, pf_config *cfg, pf_tar **out) {
    char *why = pf__create_error;
    size_t n = sizeof pf__create_error;
    pf_result res = pf__rd_check(tc, cfg, out, "pf_tar");
    pf_config before;
    pf_allocator al;
    pf_tar *t;
    uint32_t i;
    if (res != PF_OK) return res;
    *out = NULL;
    before = *cfg;
    if (!tc->paths || !tc->num_paths)
        return (pf__format(why, n, "pf_tar_open: no shards: set paths and num_paths"), PF_ERR_INVALID_ARG);
    al = pf_config_defaults(cfg).allocator;
    t = (pf_tar *)pf__rd_calloc(&al, 1, sizeof *t);
    if (t) {
        t->rd.al = al;
        t->paths = (char **)pf__rd_calloc(&al, tc->num_paths, sizeof(char *));
        t->fds = (int *)pf__rd_calloc(&al, tc->num_paths, sizeof(int));
    }
    if (!t || !t->paths || !t->fds) {
        pf_tar_close(t);
        return (pf__format(why, n, "pf_tar_open: " PF__RD_OOM, pf__rd_refused), PF_ERR_NO_MEMORY);
    }
    t->rd.log = cfg->log; /* the index warns through it */
    t->rd.log_user = cfg->log_user;
    for (i = 0; i < tc->num_paths && res == PF_OK; i++) {
        t->fds[i] = -1;
        t->nshards++;
        if (!tc->paths[i]) {
            pf__format(why, n, "pf_tar_open: paths[%u] is NULL", (unsigned)i);
            res = PF_ERR_INVALID_ARG;
            break;
        }
        t->paths[i] = pf__rd_strdup(&al, tc->paths[i]);
        if (!t->paths[i]) {
            pf__format(why, n, "pf_tar_open: " PF__RD_OOM, pf__rd_refused);
            res = PF_ERR_NO_MEMORY;
            break;
        }
        t->fds[i] = PF__OPEN(tc->paths[i], PF__RD_FLAGS);
        if (t->fds[i] < 0) {
            char err[PF__ERRNO_TEXT];
            pf__format(why, n, "pf_tar_open: cannot open %s: %s", tc->paths[i], pf__errno_text(errno, err, sizeof err));
            res = PF_ERR_INVALID_ARG;
            break;
        }
        res = pf__tar_index(t, i, why, n);
    }
    if (res == PF_OK && !t->nsamples) {
        pf__format(why, n, "pf_tar_open: the %u shards hold no file that is part of a sample (directories, links, "
                   "names starting with '.' and names without an extension are not)", (unsigned)t->nshards);
        res = PF_ERR_INVALID_ARG;
    }
    if (res == PF_OK && !t->max_bytes && !tc->step && !cfg->batch_bytes) {
        pf__format(why, n, "pf_tar_open: every file in the %u shards is empty (%llu samples of 0 bytes): nothing to "
                   "read (set cfg.batch_bytes to read them anyway)", (unsigned)t->nshards,
                   (unsigned long long)t->nsamples);
        res = PF_ERR_INVALID_ARG;
    }
    if (res == PF_OK && t->max_span > SIZE_MAX / 2) {
        pf__format(why, n, "pf_tar_open: a sample spans %llu bytes: too big", (unsigned long long)t->max_span);
        res = PF_ERR_INVALID_ARG;
    }
    t->rd.step = tc->step;
    t->rd.step_user = tc->user;
    t->rd.sample_bytes = tc->sample_bytes;
    if (tc->step) t->rd.buf_bytes = (size_t)((t->max_span + 15) & ~(uint64_t)15) + t->max_parts * sizeof(pf_part);
    if (res == PF_OK)
        res = pf__rd_attach(&t->rd, cfg, pf__tar_load, tc->step ? tc->sample_bytes : (size_t)t->max_bytes, "pf_tar");
    if (res != PF_OK) {
        *cfg = before;
        pf_tar_close(t);
        return res;
    }
    cfg->num_samples = t->nsamples;
    *out = t;
    return PF_OK;
}
#else /* no POSIX here: the readers are there, and say what they need */
static bool pf__rd_hooks_any_thread(const pf_config *c) { return (void)c, false; }
static pf_result pf__rd_fit(const pf_config *c, char *why, size_t n) { return (void)c, (void)why, (void)n, PF_OK; }
static const char *pf__rd_token_hint(const pf_config *c) { return (void)c, ""; }
static uint64_t pf__rd_token_step(const pf_config *c) { return (void)c, 0; }
static void pf__rd_serve(const pf_config *c, int delta) { (void)c, (void)delta; }
static void pf__rd_resumed(const pf_config *c, const pf__resume *rs) { (void)c, (void)rs; }
static pf_result pf__rd_none(const char *who) {
    pf__format(pf__create_error, sizeof pf__create_error,
               "%s: the readers need POSIX (pread, open): define _POSIX_C_SOURCE 200809L before including "
               "prefetch.h (or build with -std=gnu11, g++ or nvcc)", who);
    return PF_ERR_INVALID_ARG;
}
PF_API pf_result pf_records_open(const pf_records_config *rc, pf_config *cfg, pf_records **out) {
    (void)rc, (void)cfg;
    if (out) *out = NULL;
    return pf__rd_none("pf_records_open");
}
PF_API void pf_records_close(pf_records *r) { (void)r; }
PF_API pf_result pf_tokens_open(const pf_tokens_config *tc, pf_config *cfg, pf_tokens **out) {
    (void)tc, (void)cfg;
    if (out) *out = NULL;
    return pf__rd_none("pf_tokens_open");
}
PF_API void pf_tokens_close(pf_tokens *t) { (void)t; }
PF_API pf_result pf_tar_open(const pf_tar_config *tc, pf_config *cfg, pf_tar **out) {
    (void)tc, (void)cfg;
    if (out) *out = NULL;
    return pf__rd_none("pf_tar_open");
}
PF_API void pf_tar_close(pf_tar *t) { (void)t; }
PF_API uint64_t pf_tar_samples(const pf_tar *t) { return (void)t, 0; }
#endif /* PF__READERS */

#endif /* PREFETCH_IMPLEMENTATION */

/*
   REVISION HISTORY

     0.2.0 (2026-11-22)  host slots come back through events a retirer thread
                         sleeps on, not a host function in the copy stream
                         (no bubble between copies; a device fault no longer
                         hangs pf_next); contexts only on cuda_device and the
                         caller's device kept, "none" included; destroy waits
                         for the consumer stream (holding batches is fine);
                         pf_next zeroes *out on errors; the verdict tells a
                         busy GPU (wait_gpu_s) from starvation, settled as
                         each wait ends; per-batch events without
                         BlockingSync; exclusive-process devices fall back
                         to the host backend
     0.1.0 (2026-11-21)  first release
*/

/*
------------------------------------------------------------------------------
This software is available under 2 licenses -- choose whichever you prefer.
------------------------------------------------------------------------------
ALTERNATIVE A - MIT License
Copyright (c) 2026 the prefetch.h authors
Permission is hereby granted, free of charge, to any person obtaining a copy of
this software and associated documentation files (the "Software"), to deal in
the Software without restriction, including without limitation the rights to
use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies
of the Software, and to permit persons to whom the Software is furnished to do
so, subject to the following conditions:
The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.
THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
ALTERNATIVE B - Public Domain (www.unlicense.org)
This is free and unencumbered software released into the public domain.
Anyone is free to copy, modify, publish, use, compile, sell, or distribute this
software, either in source code form or as a compiled binary, for any purpose,
commercial or non-commercial, and by any means.
In jurisdictions that recognize copyright laws, the author or authors of this
software dedicate any and all copyright interest in the software to the public
domain. We make this dedication in recognition of the continuing development of
software and to the benefit of the public at large. We make this dedication to
the detriment of our heirs and successors and all present and future rights to
said software under copyright law.
THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN
ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION
WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
------------------------------------------------------------------------------
*/
