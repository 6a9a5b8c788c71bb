/* test_cuda_sim.c - the CUDA backend on the simulated runtime (tests/sim).
   First the rig proves it sees the three classic ordering bugs in
   hand-written sequences; then mutants of the library itself (its CUDA
   calls redirected to skip a wait or free a slot early) must be caught;
   then device selection, memory, flags, faults, and "no host sync". */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

/* Mutants: the library's own calls, bent. 0 = the real library. Each is
   one class of bug; every one must make a test below fail:
     1 the consumer reads before the copy landed (no wait on copied)
     2 a copy overwrites a slot the consumer may read (no wait on released)
     3 a host slot is refilled while its DMA may read it (retirer trusts
       hdone early)
     4 destroy skips the copy-stream drain
     5 destroy skips the wait for the consumer stream (the drain event)
     6 a hidden host sync on the hot path (pf_next waits for the copy)
     7 the caller's device is "restored" with cudaSetDevice(0) (the library
       cannot see that no context was current)
     8 a sticky error is swallowed (treated as success)
     9 a packed batch's device offsets are copied on another stream than
       the batch (not ordered before the consumer's kernels by copied) */
struct pf_loader;
static int mutant;
static cudaStream_t mutant_consumer;
/* read by the library's threads inside the wrappers: atomic */
static struct pf_loader *mutant_loader_;
static cudaStream_t mutant_side; /* mutant 9's stream for the offsets */
#define mutant_loader __atomic_load_n(&mutant_loader_, __ATOMIC_ACQUIRE)
#define set_mutant_loader(l) __atomic_store_n(&mutant_loader_, (l), __ATOMIC_RELEASE)
/* copies issued by the library, counted where it makes them, so a test
   can wait (on a condition variable) until copies are in flight */
static pthread_mutex_t copies_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t copies_cv = PTHREAD_COND_INITIALIZER;
static int copies_issued;
static cudaError_t mut_stream_wait_event(cudaStream_t s, cudaEvent_t e, unsigned f);
static cudaError_t mut_event_synchronize(cudaEvent_t e);
static cudaError_t mut_stream_synchronize(cudaStream_t s);
static cudaError_t mut_event_query(cudaEvent_t e);
static cudaError_t mut_event_record(cudaEvent_t e, cudaStream_t s);
static cudaError_t mut_memcpy_async(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st);
static cudaError_t mut_entry_point(const char *sym, void **fn, unsigned v, unsigned long long f,
                                   enum cudaDriverEntryPointQueryResult *q);
static cudaError_t mut_set_device(int d);
#define cudaStreamWaitEvent mut_stream_wait_event
#define cudaEventSynchronize mut_event_synchronize
#define cudaStreamSynchronize mut_stream_synchronize
#define cudaEventQuery mut_event_query
#define cudaEventRecord mut_event_record
#define cudaMemcpyAsync mut_memcpy_async
#define cudaGetDriverEntryPointByVersion mut_entry_point
#define cudaSetDevice mut_set_device
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"
#undef cudaStreamWaitEvent
#undef cudaEventSynchronize
#undef cudaStreamSynchronize
#undef cudaEventQuery
#undef cudaEventRecord
#undef cudaMemcpyAsync
#undef cudaGetDriverEntryPointByVersion
#undef cudaSetDevice
#include "util.h"

static int is_hdone(cudaEvent_t e) {
    if (!mutant_loader) return 0;
    for (uint32_t h = 0; h < mutant_loader->ring.nslots; h++)
        if (mutant_loader->cu->hdone[h] == e) return 1;
    return 0;
}
static cudaError_t swallow(cudaError_t e) { return mutant == 8 && e == cudaErrorIllegalAddress ? cudaSuccess : e; }

static cudaError_t mut_stream_wait_event(cudaStream_t s, cudaEvent_t e, unsigned f) {
    if (mutant == 1 && s == mutant_consumer) return cudaSuccess;
    if (mutant == 2 && s != mutant_consumer) return cudaSuccess;
    if (mutant == 6 && s == mutant_consumer) (void)cudaEventSynchronize(e); /* "just to be safe" */
    return swallow(cudaStreamWaitEvent(s, e, f));
}
static cudaError_t mut_event_synchronize(cudaEvent_t e) {
    if (mutant == 3 && is_hdone(e)) return cudaSuccess;
    if (mutant == 5 && mutant_loader && e == mutant_loader->cu->drain) return cudaSuccess;
    return swallow(cudaEventSynchronize(e));
}
static cudaError_t mut_stream_synchronize(cudaStream_t s) {
    if (mutant == 4 && mutant_loader && s == mutant_loader->cu->copy) return cudaSuccess;
    return swallow(cudaStreamSynchronize(s));
}
static cudaError_t mut_event_query(cudaEvent_t e) { return swallow(cudaEventQuery(e)); }
static cudaError_t mut_set_device(int d) { return swallow(cudaSetDevice(d)); }
/* A gate a release's cudaEventRecord can be held at (on the consumer
   stream only), to open the window between claiming a release and
   finishing it. */
static int hold_release, release_entered, release_open;
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;
static cudaError_t mut_event_record(cudaEvent_t e, cudaStream_t s) {
    pthread_mutex_lock(&hold_mu);
    if (hold_release && s == mutant_consumer) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 60;
        release_entered = 1;
        pthread_cond_broadcast(&hold_cv);
        while (!release_open)
            if (pthread_cond_timedwait(&hold_cv, &hold_mu, &dl) != 0) break;
    }
    pthread_mutex_unlock(&hold_mu);
    return swallow(cudaEventRecord(e, s));
}
static cudaError_t mut_memcpy_async(void *d, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    cudaError_t e;
    if (mutant == 9 && mutant_loader && mutant_side && (uint64_t *)d >= pf__dev_offsets(mutant_loader, 0))
        st = mutant_side; /* the device offsets tables follow the device slots */
    e = swallow(cudaMemcpyAsync(d, src, n, k, st));
    pthread_mutex_lock(&copies_mu);
    copies_issued++;
    pthread_cond_broadcast(&copies_cv);
    pthread_mutex_unlock(&copies_mu);
    return e;
}

/* Bounded wait until the library has issued n copies since the count was
   reset to 0. */
static int copies_wait(int n) {
    struct timespec dl;
    int ok;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    pthread_mutex_lock(&copies_mu);
    while (copies_issued < n)
        if (pthread_cond_timedwait(&copies_cv, &copies_mu, &dl) != 0) break;
    ok = copies_issued >= n;
    pthread_mutex_unlock(&copies_mu);
    return ok;
}
static cudaError_t mut_entry_point(const char *sym, void **fn, unsigned v, unsigned long long f,
                                   enum cudaDriverEntryPointQueryResult *q) {
    if (mutant == 7) { /* no driver entry points: the library falls back to cudaGetDevice's answer */
        *fn = NULL;
        if (q) *q = cudaDriverEntryPointSymbolNotFound;
        return cudaSuccess;
    }
    return cudaGetDriverEntryPointByVersion(sym, fn, v, f, q);
}

static void noop_kernel(void *arg) { (void)arg; }

typedef struct rig {
    void *host, *dev;
    cudaStream_t copy, consumer;
    cudaEvent_t copied, released;
} rig;

static void rig_open(rig *r, unsigned long long seed, unsigned delay_us) {
    cudaSimReset(seed, delay_us, 1);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaHostAlloc(&r->host, 4096, cudaHostAllocDefault) == cudaSuccess);
    CHECK(cudaMalloc(&r->dev, 4096) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&r->copy, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&r->consumer, cudaStreamNonBlocking) == cudaSuccess);
    cudaSimNameStream(r->copy, "the copy stream");
    cudaSimNameStream(r->consumer, "the consumer stream");
    CHECK(cudaEventCreateWithFlags(&r->copied, cudaEventDisableTiming) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&r->released, cudaEventDisableTiming) == cudaSuccess);
}

/* Drain and free; returns the violations the sequence caused. */
static int rig_close(rig *r, char *msg, size_t size) {
    int v;
    CHECK(cudaStreamSynchronize(r->copy) == cudaSuccess);
    CHECK(cudaStreamSynchronize(r->consumer) == cudaSuccess);
    v = cudaSimViolations(msg, size);
    cudaEventDestroy(r->copied);
    cudaEventDestroy(r->released);
    cudaStreamDestroy(r->copy);
    cudaStreamDestroy(r->consumer);
    cudaFree(r->dev);
    cudaFreeHost(r->host);
    return v;
}

/* (a) the consumer reads a device slot without waiting for its copy */
static void seq_consume(rig *r, int correct) {
    cudaSimHostWrite(r->host, 4096);
    memset(r->host, 1, 4096);
    CHECK(cudaMemcpyAsync(r->dev, r->host, 4096, cudaMemcpyHostToDevice, r->copy) == cudaSuccess);
    CHECK(cudaEventRecord(r->copied, r->copy) == cudaSuccess);
    if (correct) CHECK(cudaStreamWaitEvent(r->consumer, r->copied, 0) == cudaSuccess);
    CHECK(cudaSimLaunchKernel(r->consumer, noop_kernel, NULL, r->dev, 4096) == cudaSuccess);
}

/* (b) a copy overwrites a device slot the consumer may still read */
static void seq_overwrite(rig *r, int correct) {
    seq_consume(r, 1);
    CHECK(cudaEventRecord(r->released, r->consumer) == cudaSuccess); /* pf_release */
    if (correct) CHECK(cudaStreamWaitEvent(r->copy, r->released, 0) == cudaSuccess);
    CHECK(cudaMemcpyAsync(r->dev, r->host, 4096, cudaMemcpyHostToDevice, r->copy) == cudaSuccess);
}

/* (c) the host refills a pinned slot while its DMA may still read it */
static void seq_refill(rig *r, int correct) {
    CHECK(cudaMemcpyAsync(r->dev, r->host, 4096, cudaMemcpyHostToDevice, r->copy) == cudaSuccess);
    CHECK(cudaEventRecord(r->copied, r->copy) == cudaSuccess);
    if (correct) CHECK(cudaEventSynchronize(r->copied) == cudaSuccess);
    cudaSimHostWrite(r->host, 4096);
}

static void check_rig_flags(void (*seq)(rig *, int), const char *what) {
    /* flagged whatever the timing: no delay, small and large delays */
    const unsigned delays[] = {0, 50, 2000};
    for (int i = 0; i < 3; i++)
        for (unsigned long long seed = 1; seed <= 3; seed++) {
            rig r;
            char msg[768];
            int v;
            rig_open(&r, seed, delays[i]);
            seq(&r, 0);
            v = rig_close(&r, msg, sizeof msg);
            CHECKF(v > 0, "%s was not flagged (delay %u us, seed %llu)", what, delays[i], seed);
            CHECK_CONTAINS(msg, "race");
            if (h_verbose && seed == 1 && i == 0) printf("    %s: %s\n", what, msg);
            rig_open(&r, seed, delays[i]);
            seq(&r, 1); /* the same sequence done right is clean */
            v = rig_close(&r, msg, sizeof msg);
            CHECKF(v == 0, "correct %s flagged: %s", what, msg);
        }
}

static void test_rig_flags_consume_without_copy_wait(void) { check_rig_flags(seq_consume, "(a) consume before copy"); }
static void test_rig_flags_copy_before_release(void) { check_rig_flags(seq_overwrite, "(b) copy before release"); }
static void test_rig_flags_refill_during_dma(void) { check_rig_flags(seq_refill, "(c) refill during DMA"); }

static void test_rig_flags_pageable_source(void) {
    rig r;
    char msg[768], pageable[256];
    rig_open(&r, 1, 0);
    CHECK(cudaMemcpyAsync(r.dev, pageable, sizeof pageable, cudaMemcpyHostToDevice, r.copy) == cudaErrorInvalidValue);
    CHECK(rig_close(&r, msg, sizeof msg) == 1);
    CHECK_CONTAINS(msg, "not pinned");
}

/* ---- the library's own mistakes, planted ---- */

static int host_syncs(void);

/* A gate a kernel stand-in can block on: the GPU stays busy until the test
   opens it. Bounded: it opens by itself after 60 s. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, delivered, target, running;
} gate;

static void gate_init(gate *g, int target) {
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->target = target;
}

static void gate_kernel(void *arg) {
    gate *g = (gate *)arg;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    pthread_mutex_lock(&g->mu);
    g->running++;
    while (!g->open)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) != 0) break;
    g->running--;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Before a gate goes out of scope: no gate kernel may still be inside it
   (the stream thread wakes from its wait on its own time). */
static void gate_settle(gate *g) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    while (g->running)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) != 0) break;
    pthread_mutex_unlock(&g->mu);
}

/* Opens the gate once the consumer got `target` batches (the most it can
   get before the ring is full behind the gate). */
static void *gate_opener(void *arg) {
    gate *g = (gate *)arg;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    pthread_mutex_lock(&g->mu);
    while (g->delivered < g->target)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) != 0) break;
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

static void gate_count(gate *g) {
    pthread_mutex_lock(&g->mu);
    g->delivered++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Tear down a test whose device faulted: every call answers the sticky
   error, yet everything must be let go of. */
static void fault_end(tcons *c, talloc *a) {
    CHECK(cudaStreamDestroy(c->stream) == cudaErrorIllegalAddress);
    CHECK_EQ(cudaSimBytesLive(), 0);
    CHECK_EQ(cudaSimObjectsLive(), 0);
    if (a) CHECK_EQ(a->live, 0);
    pthread_mutex_destroy(&c->mu);
}

/* The compute-bound fault of the CUDA-fidelity issue: the host ran ahead
   until every host slot is COPYING behind the consumer's (gated) kernel,
   the consumer has taken every staged batch and waits in pf_next; then the
   kernel faults. Returns what pf_next finally said; *ended: it returned. */
static pf_result scen_fault_ring_full(unsigned long long seed, char *msg, size_t size) {
    tload t;
    tcons c;
    talloc a;
    pf_config cfg;
    pf_batch b;
    static gate g; /* outlives the stream thread that wakes in it */
    pthread_t opener;
    pf_result r = PF_OK;
    t_load_init(&t);
    t_begin(&c, seed);
    t_alloc_init(&a, 0);
    cfg = t_config(&t, 400, 4, 1);
    cfg.num_workers = 2;
    cfg.host_slots = 3;
    cfg.device_slots = 2;
    cfg.allocator.alloc_fn = t_alloc;
    cfg.allocator.free_fn = t_free;
    cfg.allocator.user_data = &a;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    set_mutant_loader(c.l);
    gate_init(&g, 5); /* device_slots + host_slots */
    pthread_create(&opener, NULL, gate_opener, &g);
    for (int step = 0; step < 1000; step++) {
        r = pf_next(c.l, &b);
        if (r != PF_OK) break;
        if (step == 0) {
            CHECK(cudaSimLaunchKernel(c.stream, gate_kernel, &g, b.data, b.bytes) == cudaSuccess);
            CHECK(cudaSimLaunchFault(c.stream) == cudaSuccess);
        }
        gate_count(&g);
        r = pf_release(c.l, &b);
        if (r != PF_OK) break;
    }
    pthread_join(opener, NULL);
    gate_settle(&g);
    snprintf(msg, size, "%s", pf_error(c.l));
    if (r == PF_ERR_CUDA) {
        CHECK_EQ(pf_next(c.l, &b), PF_ERR_CUDA); /* sticky */
        CHECK(b.data == NULL);                   /* nothing handed out with an error */
    }
    pf_destroy(c.l); /* prompt: every sync answers the sticky error */
    set_mutant_loader(NULL);
    if (cudaSimDeviceError(0) != cudaSuccess) fault_end(&c, &a);
    else t_end(&c);
    t_load_free(&t);
    return r;
}

/* After a destroy scenario: let the GPU stand-in finish, and return the
   violations the destroy caused; nothing may be left. */
static int scen_end(tload *t, tcons *c, char *msg, size_t size) {
    int v;
    set_mutant_loader(NULL);
    CHECK(cudaStreamSynchronize(c->stream) == cudaSuccess);
    CHECK(cudaStreamDestroy(c->stream) == cudaSuccess);
    v = cudaSimViolations(msg, size);
    CHECK_EQ(cudaSimBytesLive(), 0);
    CHECK_EQ(cudaSimObjectsLive(), 0);
    pthread_mutex_destroy(&c->mu);
    t_load_free(t);
    return v;
}

/* Destroy with two copies in flight on the timing model (150 ms each, so
   a loaded machine cannot finish the second before the free), nothing
   delivered. Returns the violations: freeing pinned memory that
   queued copies still read. */
static int scen_destroy_copies_in_flight(unsigned long long seed, char *msg, size_t size) {
    tload t;
    tcons c;
    pf_config cfg;
    t_load_init(&t);
    t_begin(&c, seed);
    /* 400 ms a copy: destroy runs once the retirer's wait for the first
       copy returns, and must reach the free before the second lands; on a
       loaded 2-core machine 150 ms was sometimes not enough. A copy moves
       the bytes the load wrote, not the slot's capacity: the model's rate
       is set from those (set from a 16 KiB capacity, each copy took 1 ms,
       and a loaded CI machine let both land before the free) */
    cudaSimSetTiming((double)t_batch_bytes(1) / 0.400);
    cfg = t_config(&t, 40, 1, 1);
    cfg.device_slots = 2; /* so at most two copies before a release */
    cfg.host_slots = 3;
    pthread_mutex_lock(&copies_mu);
    copies_issued = 0;
    pthread_mutex_unlock(&copies_mu);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    set_mutant_loader(c.l);
    CHECK(copies_wait(2));
    pf_destroy(c.l); /* the first copy ends at 400 ms, the second at 800 */
    return scen_end(&t, &c, msg, size);
}

/* Destroy while the consumer's 100 ms kernel still reads a released batch
   (a one-epoch run of two batches, so no later copy waits for it).
   Returns the violations: freeing device memory the kernel reads. */
static int scen_destroy_kernel_in_flight(unsigned long long seed, char *msg, size_t size) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_batch b;
    t_load_init(&t);
    t_begin(&c, seed);
    cudaSimSetTiming(1e12); /* copies take no time; the kernel its 100 ms */
    cfg = t_config(&t, 2, 1, 1);
    cfg.device_slots = 2;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    set_mutant_loader(c.l);
    CHECK_EQ(pf_next(c.l, &b), PF_OK);
    CHECK(cudaSimLaunchKernelFor(c.stream, 100000, NULL, NULL, b.data, b.bytes) == cudaSuccess);
    CHECK_EQ(pf_release(c.l, &b), PF_OK);
    pf_destroy(c.l);
    return scen_end(&t, &c, msg, size);
}

/* A whole epoch on the consumer thread: the host waits it made itself. */
static int scen_host_waits(unsigned long long seed) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    int n;
    unsigned saved = t_sim_delay_us;
    t_sim_delay_us = 500; /* copies are slow: a host wait would show */
    t_load_init(&t);
    t_begin(&c, seed);
    t_run_init(&r);
    mutant_consumer = c.stream;
    cfg = t_config(&t, 60, 6, 1);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    set_mutant_loader(c.l);
    CHECK_EQ(t_drain(&c, &r, 1000), PF_END_OF_DATA);
    CHECK_EQ(r.n, 10);
    n = host_syncs();
    set_mutant_loader(NULL);
    t_close(&t, &c, &r);
    t_sim_delay_us = saved;
    return n;
}

typedef struct torchrun_rank {
    pf_config cfg;
    tcons *c;
    int batches, ctx_after_call, waits;
    pf_result last;
} torchrun_rank;

/* A rank's training thread that never calls cudaSetDevice itself (it
   creates its loader first, as torchrun scripts often do). */
static void *torchrun_thread(void *arg) {
    torchrun_rank *k = (torchrun_rank *)arg;
    pf_stats st;
    k->last = pf_create(&k->cfg, &k->c->l);
    k->ctx_after_call += cudaSimThreadHasContext();
    if (k->last != PF_OK) return NULL;
    set_mutant_loader(k->c->l);
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(k->c->l, &b);
        k->ctx_after_call += cudaSimThreadHasContext();
        if (r == PF_END_OF_EPOCH) continue;
        k->last = r;
        if (r != PF_OK) break;
        k->batches++;
        if (k->batches % 3 == 0) {
            CHECK_EQ(pf_batch_wait(k->c->l, &b), PF_OK);
            k->waits++;
            k->ctx_after_call += cudaSimThreadHasContext();
        }
        pf_get_stats(k->c->l, &st);
        CHECK_EQ(pf_release(k->c->l, &b), PF_OK);
        k->ctx_after_call += cudaSimThreadHasContext();
    }
    pf_destroy(k->c->l);
    set_mutant_loader(NULL);
    k->ctx_after_call += cudaSimThreadHasContext();
    return NULL;
}

/* cuda_device = 1, like LOCAL_RANK=1, and no cudaSetDevice by the caller.
   Returns 1 when a context appeared on device 0 or was left current on the
   caller's thread. */
static int scen_torchrun_rank1(unsigned long long seed, int *batches) {
    tload t;
    tcons c;
    torchrun_rank k;
    pthread_t th;
    char msg[768];
    t_load_init(&t);
    t_cons_init(&c);
    cudaSimReset(seed, 30, 2);
    CHECK(cudaSetDevice(1) == cudaSuccess); /* the test's own stream lives on device 1 */
    CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking) == cudaSuccess);
    cudaSimForbidLegacyStream(1);
    memset(&k, 0, sizeof k);
    k.c = &c;
    k.cfg = t_config(&t, 60, 6, 1);
    k.cfg.cuda_device = 1;
    k.cfg.stream = c.stream;
    pthread_create(&th, NULL, torchrun_thread, &k);
    pthread_join(th, NULL);
    CHECK_EQ(k.last, PF_END_OF_DATA);
    CHECK(k.waits > 0);
    *batches = k.batches;
    CHECK(cudaStreamSynchronize(c.stream) == cudaSuccess);
    CHECK(cudaStreamDestroy(c.stream) == cudaSuccess);
    CHECKF(cudaSimViolations(msg, sizeof msg) == 0, "%s", msg);
    CHECK_EQ(cudaSimObjectsLive(), 0);
    pthread_mutex_destroy(&c.mu);
    t_load_free(&t);
    return cudaSimContextCreated(0) || k.ctx_after_call > 0;
}

/* The drain scenario of the first three mutants: a run with random delays. */
static int scen_drain(unsigned long long seed, char *msg, size_t size) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    int v;
    t_load_init(&t);
    t.max_delay_us = 100;
    t_begin(&c, seed);
    mutant_consumer = c.stream;
    cfg = t_config(&t, 400, 4, 2);
    cfg.device_slots = 2;
    cfg.host_slots = 3;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    set_mutant_loader(c.l);
    t_run_init(&r);
    (void)t_drain(&c, &r, 100000);
    pf_destroy(c.l);
    set_mutant_loader(NULL);
    CHECK(cudaStreamSynchronize(c.stream) == cudaSuccess);
    CHECK(cudaStreamDestroy(c.stream) == cudaSuccess);
    v = cudaSimViolations(msg, size) + c.bad;
    t_run_free(&r);
    t_load_free(&t);
    pthread_mutex_destroy(&c.mu);
    return v;
}

/* Packed batches of samples of different sizes; a kernel on the consumer
   stream reads each one's device offsets and checks them against the host
   ones (mutant 9). */
static int p9_load(void *user, pf_job *job) {
    (void)user;
    cudaSimHostWrite(job->host, job->capacity);
    for (uint32_t i = 0; i < job->count; i++) {
        size_t n = 8 * (size_t)(job->indices[i] % 7 + 1);
        uint64_t *w = (uint64_t *)pf_job_append(job, n), v = t_word(job->indices[i]);
        if (!w) return -1;
        for (size_t k = 0; k < n / 8; k++) w[k] = v;
    }
    return 0;
}
typedef struct p9_read {
    tcons *c;
    const uint64_t *dev;
    uint32_t count;
    uint64_t want[1];
} p9_read;
static void p9_kernel(void *arg) {
    p9_read *k = (p9_read *)arg;
    if (memcmp(k->dev, k->want, (k->count + 1) * sizeof(uint64_t)))
        t_bad(k->c, "device offsets differ from the host ones (%u samples)", (unsigned)k->count);
    free(k);
}
static int scen_packed_offsets(unsigned long long seed, char *msg, size_t size) {
    tload t;
    tcons c;
    pf_config cfg;
    int n = 0, v;
    t_load_init(&t);
    t_begin(&c, seed);
    mutant_consumer = c.stream;
    CHECK(cudaStreamCreateWithFlags(&mutant_side, cudaStreamNonBlocking) == cudaSuccess);
    cfg = t_config(&t, 200, 5, 1);
    cfg.load = p9_load;
    cfg.batch_bytes = 5 * 56;
    cfg.device_slots = 2;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    set_mutant_loader(c.l);
    for (;;) {
        pf_batch b;
        p9_read *k;
        pf_result r = pf_next(c.l, &b);
        if (r != PF_OK) break;
        CHECK(b.offsets != NULL && b.dev_offsets != NULL);
        k = (p9_read *)malloc(sizeof(p9_read) + b.count * sizeof(uint64_t));
        k->c = &c;
        k->dev = b.dev_offsets;
        k->count = b.count;
        memcpy(k->want, b.offsets, (b.count + 1) * sizeof(uint64_t));
        CHECK(cudaSimLaunchKernel(c.stream, p9_kernel, k, b.dev_offsets, (b.count + 1) * sizeof(uint64_t)) ==
              cudaSuccess);
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
        n++;
    }
    CHECK_EQ(n, 40);
    /* every kernel has run, so every read of device offsets was checked:
       the violations now are theirs (mutant 9 also races destroy's frees,
       which are not what this scenario is about) */
    CHECK(cudaStreamSynchronize(c.stream) == cudaSuccess);
    v = cudaSimViolations(msg, size);
    if (c.bad && !v) snprintf(msg, size, "%s", c.bad_msg);
    pf_destroy(c.l);
    CHECK(cudaStreamSynchronize(mutant_side) == cudaSuccess);
    CHECK(cudaStreamDestroy(mutant_side) == cudaSuccess);
    mutant_side = NULL;
    {
        char tail[768] = "";
        int all = scen_end(&t, &c, tail, sizeof tail); /* the real library: none at all */
        if (!v && mutant != 9 && all) snprintf(msg, size, "%s", tail);
        return v + c.bad + (mutant != 9 ? all : 0);
    }
}

/* Does the scenario aimed at mutant m flag it (seed)? 1 = caught. */
static int mutant_caught(int m, unsigned long long seed, char *msg, size_t size) {
    int n = 0;
    switch (m) {
    case 1: case 2: case 3:
        return scen_drain(seed, msg, size) > 0;
    case 4:
        return scen_destroy_copies_in_flight(seed, msg, size) > 0;
    case 5:
        return scen_destroy_kernel_in_flight(seed, msg, size) > 0;
    case 6:
        snprintf(msg, size, "host syncs on the consumer thread: %d", n = scen_host_waits(seed));
        return n > 0;
    case 7:
        return scen_torchrun_rank1(seed, &n);
    case 8:
        return scen_fault_ring_full(seed, msg, size) != PF_ERR_CUDA;
    case 9:
        return scen_packed_offsets(seed, msg, size) > 0;
    }
    return 0;
}

static void test_mutants_are_caught(void) {
    static const char *const what[] = {"",
        "skipping cudaStreamWaitEvent(consumer, copied)",
        "skipping cudaStreamWaitEvent(copy, released)",
        "freeing the host slot before its DMA finished",
        "skipping the copy-stream drain in destroy",
        "skipping the wait for the consumer stream in destroy",
        "a hidden host sync in pf_next",
        "restoring the device with cudaSetDevice(0)",
        "swallowing a sticky error",
        "copying a packed batch's offsets on another stream"};
    char msg[768];
    int first = 1, last = 9;
#if H_TSAN
    /* 1-3 and 9 make the simulated DMA and a kernel or worker touch the same
       bytes unordered: a real data race, which TSan reports (rightly) before
       the rig can. The gcc and ASan builds run them. */
    first = 4;
    last = 8;
#endif
    for (unsigned long long seed = h_seed; seed < h_seed + 3; seed++) {
        mutant = 0; /* the real library passes every scenario */
        for (int m = first; m <= last; m++)
            CHECKF(!mutant_caught(m, seed, msg, sizeof msg), "the unmodified library failed scenario %d: %s", m, msg);
        for (int m = first; m <= last; m++) {
            mutant = m;
            msg[0] = '\0';
            CHECKF(mutant_caught(m, seed, msg, sizeof msg), "mutant %d (%s) went unseen, seed %llu", m, what[m],
                   seed);
            if (h_verbose) printf("    mutant %d seed %llu: caught: %s\n", m, seed, msg);
            mutant = 0;
        }
    }
}

static int log_n;
static char log_msg[1024];
static void t_log(void *user, int level, const char *msg) {
    (void)user;
    (void)level;
    if (strstr(msg, "backend")) {
        size_t used = strlen(log_msg);
        log_n++;
        snprintf(log_msg + used, sizeof log_msg - used, "%s\n", msg);
    }
}

/* ---- the documented rules the simulator models (tests/sim/README.md) ---- */

static int hostfn_ran;
static pthread_mutex_t hostfn_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hostfn_cv = PTHREAD_COND_INITIALIZER;
static void mark_hostfn(void *arg) {
    (void)arg;
    pthread_mutex_lock(&hostfn_mu);
    hostfn_ran = 1;
    pthread_cond_broadcast(&hostfn_cv);
    pthread_mutex_unlock(&hostfn_mu);
}
/* Bounded wait until mark_hostfn ran (from a host function or a kernel
   stand-in: neither creates a host edge the test could lean on). */
static int hostfn_wait(void) {
    struct timespec dl;
    int ran;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    pthread_mutex_lock(&hostfn_mu);
    while (!hostfn_ran)
        if (pthread_cond_timedwait(&hostfn_cv, &hostfn_mu, &dl) != 0) break;
    ran = hostfn_ran;
    pthread_mutex_unlock(&hostfn_mu);
    return ran;
}

/* Sticky errors: after a fault every call answers it, queued work never
   runs, host functions are never called, syncs answer at once. */
static void test_rig_sticky_fault(void) {
    rig r;
    cudaEvent_t ev;
    char msg[768];
    void *other;
    rig_open(&r, h_seed, 200);
    memset(r.host, 7, 4096);
    CHECK(cudaSimLaunchFault(r.consumer) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess);
    CHECK(cudaEventRecord(ev, r.consumer) == cudaSuccess);
    hostfn_ran = 0;
    CHECK(cudaLaunchHostFunc(r.consumer, mark_hostfn, NULL) == cudaSuccess);
    CHECK(cudaMemcpyAsync(r.dev, r.host, 4096, cudaMemcpyHostToDevice, r.consumer) == cudaSuccess);
    /* the sync sees the fault (it does not wait for the record behind it) */
    CHECK(cudaStreamSynchronize(r.consumer) == cudaErrorIllegalAddress);
    CHECK(cudaEventSynchronize(ev) == cudaErrorIllegalAddress);
    CHECK(cudaEventQuery(ev) == cudaErrorIllegalAddress);
    CHECK(cudaStreamWaitEvent(r.copy, ev, 0) == cudaErrorIllegalAddress);
    CHECK(cudaEventRecord(ev, r.copy) == cudaErrorIllegalAddress);
    CHECK(cudaMalloc(&other, 256) == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress); /* not reset by reading it */
    CHECK(cudaStreamSynchronize(r.copy) == cudaErrorIllegalAddress);
    CHECK(__atomic_load_n(&hostfn_ran, __ATOMIC_ACQUIRE) == 0); /* never called */
    CHECK(((unsigned char *)r.dev)[0] == 0xcd);                /* the queued copy never ran */
    /* frees and destroys answer the error but let go */
    CHECK(cudaEventDestroy(ev) == cudaErrorIllegalAddress);
    CHECK(cudaEventDestroy(r.copied) == cudaErrorIllegalAddress);
    CHECK(cudaEventDestroy(r.released) == cudaErrorIllegalAddress);
    CHECK(cudaStreamDestroy(r.copy) == cudaErrorIllegalAddress);
    CHECK(cudaStreamDestroy(r.consumer) == cudaErrorIllegalAddress);
    CHECK(cudaFree(r.dev) == cudaErrorIllegalAddress);
    CHECK(cudaFreeHost(r.host) == cudaErrorIllegalAddress);
    CHECK_EQ(cudaSimObjectsLive(), 0);
    CHECK_EQ(cudaSimBytesLive(), 0);
    CHECKF(cudaSimViolations(msg, sizeof msg) == 0, "%s", msg);
}

/* A sync already waiting when another stream faults answers at once. */
static void *fault_later(void *arg) {
    gate *g = (gate *)arg;
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return NULL;
}
static void test_rig_sync_in_progress_answers_a_fault(void) {
    rig r;
    static gate g; /* outlives the stream thread that wakes in it */
    pthread_t th;
    rig_open(&r, h_seed, 0);
    gate_init(&g, 0);
    /* the copy stream is held by a kernel that waits on the gate; then the
       consumer stream faults behind a kernel that opens it */
    CHECK(cudaSimLaunchKernel(r.copy, gate_kernel, &g, NULL, 0) == cudaSuccess);
    CHECK(cudaEventRecord(r.copied, r.copy) == cudaSuccess);
    CHECK(cudaSimLaunchFault(r.consumer) == cudaSuccess);
    /* the gate kernel would hold the copy stream for 60 s; the fault comes
       first, and the sync must not wait for the gate */
    CHECK(cudaEventSynchronize(r.copied) == cudaErrorIllegalAddress);
    pthread_create(&th, NULL, fault_later, &g);
    pthread_join(th, NULL);
    gate_settle(&g);
    cudaEventDestroy(r.copied);
    cudaEventDestroy(r.released);
    cudaStreamDestroy(r.copy);
    cudaStreamDestroy(r.consumer);
    cudaFree(r.dev);
    cudaFreeHost(r.host);
    CHECK_EQ(cudaSimObjectsLive(), 0);
}

static void *fresh_thread_queries(void *arg) {
    int *out = (int *)arg, n = 0, d = -1;
    CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n == 2);
    CHECK(cudaGetDevice(&d) == cudaSuccess && d == 0);
    out[0] = cudaSimThreadHasContext();
    CHECK(cudaSetDevice(1) == cudaSuccess);
    out[1] = cudaSimThreadHasContext();
    return NULL;
}

/* Primary contexts: cudaSetDevice and any call needing one create it;
   cudaGetDevice and cudaGetDeviceCount do not. */
static void test_rig_primary_contexts(void) {
    pthread_t th;
    int seen[2] = {-1, -1};
    void *p;
    char msg[768];
    cudaSimReset(h_seed, 0, 2);
    pthread_create(&th, NULL, fresh_thread_queries, seen);
    pthread_join(th, NULL);
    CHECK_EQ(seen[0], 0);
    CHECK_EQ(seen[1], 1);
    CHECK_EQ(cudaSimContextCreated(0), 0); /* queries created nothing */
    CHECK_EQ(cudaSimContextCreated(1), 1);
    /* a call that needs a context on a thread with none: device 0's, made
       implicitly (and flagged: the library's threads always set a device) */
    CHECK(cudaMalloc(&p, 256) == cudaSuccess);
    CHECK_EQ(cudaSimContextCreated(0), 1);
    CHECK(cudaSimViolations(msg, sizeof msg) == 1);
    CHECK_CONTAINS(msg, "never called cudaSetDevice");
    CHECK(cudaFree(p) == cudaSuccess);
}

/* Teardown: cudaFree/cudaFreeHost "may" synchronise: the model does not,
   so a free not ordered after queued or unsynchronised work is flagged. */
static void test_rig_free_without_sync_is_flagged(void) {
    for (int variant = 0; variant < 3; variant++) {
        rig r;
        char msg[768];
        int v;
        rig_open(&r, h_seed, 3000);
        CHECK(cudaMemcpyAsync(r.dev, r.host, 4096, cudaMemcpyHostToDevice, r.copy) == cudaSuccess);
        CHECK(cudaEventRecord(r.copied, r.copy) == cudaSuccess);
        CHECK(cudaStreamWaitEvent(r.consumer, r.copied, 0) == cudaSuccess);
        CHECK(cudaSimLaunchKernel(r.consumer, noop_kernel, NULL, r.dev, 4096) == cudaSuccess);
        if (variant == 2) { /* done right: both streams synced before the frees */
            CHECK(cudaStreamSynchronize(r.copy) == cudaSuccess);
            CHECK(cudaStreamSynchronize(r.consumer) == cudaSuccess);
        }
        if (variant == 0) CHECK(cudaFreeHost(r.host) == cudaSuccess); /* the copy may still read it */
        else CHECK(cudaFree(r.dev) == cudaSuccess);                    /* the kernel may still read it */
        v = cudaSimViolations(msg, sizeof msg);
        if (variant < 2) {
            CHECKF(v == 1, "variant %d: %d violations", variant, v);
            CHECK_CONTAINS(msg, "queued operation");
        } else {
            CHECKF(v == 0, "%s", msg);
        }
        CHECK(cudaStreamSynchronize(r.copy) == cudaSuccess);
        CHECK(cudaStreamSynchronize(r.consumer) == cudaSuccess);
        cudaEventDestroy(r.copied);
        cudaEventDestroy(r.released);
        cudaStreamDestroy(r.copy);
        cudaStreamDestroy(r.consumer);
        if (variant == 0) cudaFree(r.dev);
        else cudaFreeHost(r.host);
        if (variant == 2) cudaFreeHost(r.host);
        CHECK_EQ(cudaSimObjectsLive(), 0);
    }
    { /* the kernel ran, but nothing ordered the host after it: a race */
        rig r;
        char msg[768];
        rig_open(&r, h_seed, 0);
        hostfn_ran = 0;
        CHECK(cudaSimLaunchKernel(r.consumer, mark_hostfn, NULL, r.dev, 4096) == cudaSuccess);
        CHECK(hostfn_wait());
        CHECK(cudaFree(r.dev) == cudaSuccess);
        CHECK(cudaSimViolations(msg, sizeof msg) == 1);
        CHECK_CONTAINS(msg, "race: cudaFree by the host");
        CHECK(cudaStreamSynchronize(r.consumer) == cudaSuccess);
        cudaEventDestroy(r.copied);
        cudaEventDestroy(r.released);
        cudaStreamDestroy(r.copy);
        cudaStreamDestroy(r.consumer);
        cudaFreeHost(r.host);
    }
}

/* cudaStreamDestroy returns at once with work queued, the work still runs,
   and a host function whose owner was freed meanwhile is flagged. */
static void test_rig_stream_destroy_with_queued_host_function(void) {
    rig r;
    talloc a;
    static gate g; /* outlives the stream thread that wakes in it */
    char msg[768];
    void *owner;
    pthread_t th;
    rig_open(&r, h_seed, 0);
    t_alloc_init(&a, 0);
    gate_init(&g, 0);
    owner = t_alloc(64, &a);
    CHECK(cudaSimLaunchKernel(r.copy, gate_kernel, &g, NULL, 0) == cudaSuccess);
    hostfn_ran = 0;
    CHECK(cudaLaunchHostFunc(r.copy, mark_hostfn, owner) == cudaSuccess);
    CHECK(cudaStreamDestroy(r.copy) == cudaSuccess); /* returns with both still queued */
    CHECK_EQ(hostfn_ran, 0);
    t_free(owner, &a); /* the owner goes while its host function is queued: a bug */
    pthread_create(&th, NULL, fault_later, &g); /* opens the gate */
    pthread_join(th, NULL);
    CHECK(hostfn_wait()); /* the destroyed stream still ran its work */
    gate_settle(&g);
    CHECK(cudaSimViolations(msg, sizeof msg) == 1);
    CHECK_CONTAINS(msg, "freed before it ran");
    CHECK(cudaStreamSynchronize(r.consumer) == cudaSuccess);
    cudaEventDestroy(r.copied);
    cudaEventDestroy(r.released);
    cudaStreamDestroy(r.consumer);
    cudaFree(r.dev);
    cudaFreeHost(r.host);
}

/* cudaDeviceSynchronize waits for a destroyed stream's queued work, and
   the stream's own thread frees it only after the waiting call has read
   it ("the resources associated with stream will be released
   automatically once the device has completed all work in stream"): an
   outside trial's destroy-then-synchronize was a use after free, caught
   by the ASan build of this suite. */
static void *open_gate_soon(void *arg) {
    struct timespec ts = {0, 20 * 1000 * 1000}; /* the synchronize is asleep by then */
    nanosleep(&ts, NULL);
    return fault_later(arg); /* opens the gate */
}
static void test_rig_device_synchronize_after_stream_destroy(void) {
    rig r;
    static gate g; /* outlives the stream thread that wakes in it */
    char msg[768];
    pthread_t th;
    rig_open(&r, h_seed, 0);
    gate_init(&g, 0);
    CHECK(cudaSimLaunchKernel(r.copy, gate_kernel, &g, NULL, 0) == cudaSuccess);
    CHECK(cudaStreamDestroy(r.copy) == cudaSuccess); /* returns with the kernel queued */
    pthread_create(&th, NULL, open_gate_soon, &g);
    CHECK(cudaDeviceSynchronize() == cudaSuccess); /* waits for it, then the stream goes */
    pthread_join(th, NULL);
    gate_settle(&g);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECKF(cudaSimViolations(msg, sizeof msg) == 0, "%s", msg);
    cudaEventDestroy(r.copied);
    cudaEventDestroy(r.released);
    cudaStreamDestroy(r.consumer);
    cudaFree(r.dev);
    cudaFreeHost(r.host);
}

/* Exclusive-process mode, held by another process: counted, not usable. */
static void test_rig_exclusive_process_device(void) {
    int n = 0;
    cudaSimReset(h_seed, 0, 2);
    cudaSimSetExclusiveBusy(0, 1);
    CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n == 2);
    CHECK(cudaSetDevice(0) == cudaErrorDevicesUnavailable);
    CHECK_EQ(cudaSimContextCreated(0), 0);
    CHECK(cudaSetDevice(1) == cudaSuccess);
}

/* The timing model: one H2D engine shared by all streams. A lower bound
   only (a loaded machine makes it slower, never faster). */
static void test_rig_timing_model_one_copy_engine(void) {
    rig r;
    char msg[768];
    double t0, dt;
    rig_open(&r, h_seed, 0);
    cudaSimSetTiming(4096 / 0.010); /* 4 KiB in 10 ms */
    t0 = h_now();
    CHECK(cudaMemcpyAsync(r.dev, r.host, 4096, cudaMemcpyHostToDevice, r.copy) == cudaSuccess);
    CHECK(cudaMemcpyAsync(r.dev, r.host, 4096, cudaMemcpyHostToDevice, r.consumer) == cudaSuccess);
    CHECK(cudaStreamSynchronize(r.copy) == cudaSuccess);
    CHECK(cudaStreamSynchronize(r.consumer) == cudaSuccess);
    dt = h_now() - t0;
    CHECKF(dt >= 0.0195, "two 10 ms copies on two streams took %.4f s: they must share one engine", dt);
    t0 = h_now();
    CHECK(cudaSimLaunchKernelFor(r.consumer, 20000, NULL, NULL, NULL, 0) == cudaSuccess);
    CHECK(cudaStreamSynchronize(r.consumer) == cudaSuccess);
    CHECKF(h_now() - t0 >= 0.0195, "a 20 ms kernel took %.4f s", h_now() - t0);
    /* the two copies wrote the same bytes unordered: the race detector
       still runs under the timing model */
    CHECK(rig_close(&r, msg, sizeof msg) == 1);
    CHECK_CONTAINS(msg, "race");
}

/* Threads in this process (Linux), to see that timing-only runs none per stream. */
static int process_threads(void) {
    int n = -1;
#ifdef __linux__
    char line[128];
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "Threads:", 8) == 0) n = atoi(line + 8);
    if (f) fclose(f);
#endif
    return n;
}

static double elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess);
    return ms;
}

/* Timing-only mode (the benchmarks'): no stream threads; every modelled
   end is fixed at enqueue, and the host sees it once the clock reaches it.
   Modelled times are exact from below; above, they include the host's own
   gaps between enqueues, so the bound there is loose. */
static void test_rig_timing_only_model(void) {
    cudaStream_t a, b;
    cudaEvent_t a0, a1, b0, b1;
    unsigned char *host, *dev;
    char msg[768];
    int threads;
    double t0;
    cudaSimReset(h_seed, 0, 1);
    cudaSimTimingOnly(1);
    cudaSimSetTiming(4096 / 0.100); /* 4 KiB in 100 ms */
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaHostAlloc((void **)&host, 8192, cudaHostAllocDefault) == cudaSuccess);
    CHECK(cudaMalloc((void **)&dev, 8192) == cudaSuccess);
    threads = process_threads();
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
    CHECKF(process_threads() == threads, "2 streams started %d threads", process_threads() - threads);
    CHECK(cudaEventCreate(&a0) == cudaSuccess);
    CHECK(cudaEventCreate(&a1) == cudaSuccess);
    CHECK(cudaEventCreate(&b0) == cudaSuccess);
    CHECK(cudaEventCreate(&b1) == cudaSuccess);
    t0 = h_now();
    /* stream a: one copy; stream b: waits for it, then a copy (the one
       engine is free by then) and a 50 ms kernel */
    CHECK(cudaEventRecord(a0, a) == cudaSuccess);
    CHECK(cudaMemcpyAsync(dev, host, 4096, cudaMemcpyHostToDevice, a) == cudaSuccess);
    CHECK(cudaEventRecord(a1, a) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(b, a1, 0) == cudaSuccess);
    CHECK(cudaEventRecord(b0, b) == cudaSuccess);
    CHECK(cudaMemcpyAsync(dev + 4096, host + 4096, 4096, cudaMemcpyHostToDevice, b) == cudaSuccess);
    CHECK(cudaSimLaunchKernelFor(b, 50000, NULL, NULL, dev, 4096) == cudaSuccess);
    CHECK(cudaEventRecord(b1, b) == cudaSuccess);
    if (h_now() - t0 < 0.090) { /* not yet reached: a loaded box may take longer to get here */
        CHECK(cudaEventQuery(a1) == cudaErrorNotReady);
        CHECK(cudaEventQuery(b1) == cudaErrorNotReady);
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a0, b1) == cudaErrorNotReady);
    }
    CHECK(cudaEventSynchronize(b1) == cudaSuccess);
    CHECKF(h_now() - t0 >= 0.2495, "the host saw the 250 ms of modelled work end after %.4f s", h_now() - t0);
    CHECK(cudaEventQuery(a1) == cudaSuccess);
    CHECK(cudaEventQuery(b1) == cudaSuccess);
    CHECKF(elapsed_ms(a0, a1) >= 99.99 && elapsed_ms(a0, a1) < 150, "one 100 ms copy: %.3f ms", elapsed_ms(a0, a1));
    CHECKF(elapsed_ms(a0, b0) >= 99.99, "b's wait ended %.3f ms after a's copy began", elapsed_ms(a0, b0));
    CHECKF(elapsed_ms(b0, b1) >= 149.99 && elapsed_ms(b0, b1) < 200, "a copy then a kernel: %.3f ms",
           elapsed_ms(b0, b1));
    /* two copies on two streams at once share the engine */
    CHECK(cudaEventRecord(a0, a) == cudaSuccess);
    CHECK(cudaMemcpyAsync(dev, host, 4096, cudaMemcpyHostToDevice, a) == cudaSuccess);
    CHECK(cudaMemcpyAsync(dev + 4096, host + 4096, 4096, cudaMemcpyHostToDevice, b) == cudaSuccess);
    CHECK(cudaEventRecord(b1, b) == cudaSuccess);
    CHECK(cudaStreamSynchronize(b) == cudaSuccess);
    CHECKF(elapsed_ms(a0, b1) >= 199.99, "two copies on two streams: %.3f ms", elapsed_ms(a0, b1));
    CHECK_EQ(cudaSimViolations(NULL, 0), 0);
    /* what the mode does not model is refused, not silently skipped */
    hostfn_ran = 0;
    CHECK(cudaLaunchHostFunc(a, mark_hostfn, NULL) != cudaSuccess);
    CHECK(cudaSimLaunchFault(a) != cudaSuccess);
    CHECK(cudaSimLaunchKernelFor(a, 10, mark_hostfn, NULL, NULL, 0) != cudaSuccess);
    CHECK(cudaSimDeviceError(0) == cudaSuccess);
    CHECK(cudaSimViolations(msg, sizeof msg) == 3);
    CHECK_CONTAINS(msg, "cudaSimTimingOnly");
    CHECK_EQ(hostfn_ran, 0);
    CHECK(cudaStreamSynchronize(a) == cudaSuccess);
    CHECK(cudaEventDestroy(a0) == cudaSuccess);
    CHECK(cudaEventDestroy(a1) == cudaSuccess);
    CHECK(cudaEventDestroy(b0) == cudaSuccess);
    CHECK(cudaEventDestroy(b1) == cudaSuccess);
    CHECK(cudaStreamDestroy(a) == cudaSuccess);
    /* switching modes with a stream alive is refused too */
    cudaSimTimingOnly(0);
    CHECK(cudaSimViolations(msg, sizeof msg) == 4);
    CHECK_CONTAINS(msg, "with streams alive");
    CHECK(cudaStreamDestroy(b) == cudaSuccess);
    CHECK(cudaFree(dev) == cudaSuccess);
    CHECK(cudaFreeHost(host) == cudaSuccess);
    CHECK_EQ(cudaSimObjectsLive(), 0);
    CHECK_EQ(cudaSimBytesLive(), 0);
}

/* ---- the library survives device faults, in every pipeline state ---- */

static void test_fault_with_the_ring_full_reaches_pf_next(void) {
    for (unsigned long long seed = h_seed; seed < h_seed + 3; seed++) {
        char msg[768];
        pf_result r = scen_fault_ring_full(seed, msg, sizeof msg);
        CHECKF(r == PF_ERR_CUDA, "seed %llu: pf_next said %d (%s)", seed, (int)r, msg);
        CHECK_CONTAINS(msg, "an illegal memory access was encountered");
        CHECK_CONTAINS(msg, "cudaErrorIllegalAddress");
    }
}

/* The pipeline is input-bound (the next load is stuck), the consumer's
   kernel faults: pf_next notices at the start of its wait. */
static void test_fault_while_input_bound_reaches_pf_next(void) {
    tload t;
    tcons c;
    talloc a;
    pf_config cfg;
    pf_batch b;
    t_load_init(&t);
    t.gate_epoch = 0;
    t.gate_batch = 3;
    t_begin(&c, h_seed);
    t_alloc_init(&a, 0);
    cfg = t_config(&t, 100, 5, 1);
    cfg.allocator.alloc_fn = t_alloc;
    cfg.allocator.free_fn = t_free;
    cfg.allocator.user_data = &a;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(t_next(&c, &b), PF_OK);
        t_release(&c, &b);
    }
    CHECK(cudaSimLaunchFault(c.stream) == cudaSuccess);
    CHECK(cudaStreamSynchronize(c.stream) == cudaErrorIllegalAddress); /* it has happened */
    CHECK_EQ(pf_next(c.l, &b), PF_ERR_CUDA); /* at once: batch 3 is still stuck in load */
    /* the call that answered it: pf_next's own (cudaSetDevice may), or the
       retirer's, when its event sync saw the sticky fault first (1 run in
       some hundreds under ASan in a full make test) */
    CHECKF(strstr(pf_error(c.l), "pf_next: cuda") || strstr(pf_error(c.l), "retirer: cuda"), "got \"%s\"",
           pf_error(c.l));
    CHECK_CONTAINS(pf_error(c.l), "illegal memory access");
    CHECK_EQ(pf_next(c.l, &b), PF_ERR_CUDA);
    t_gate_open(&t);
    pf_destroy(c.l);
    fault_end(&c, &a);
    t_load_free(&t);
}

/* A batch held across the fault; then pf_release and pf_next. */
static void test_fault_with_a_batch_held_and_during_release(void) {
    for (int order = 0; order < 2; order++) {
        tload t;
        tcons c;
        pf_config cfg;
        pf_batch held, b;
        pf_stats st;
        t_load_init(&t);
        t_begin(&c, h_seed + (unsigned)order);
        cfg = t_config(&t, 100, 5, 1);
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
        CHECK_EQ(t_next(&c, &held), PF_OK);
        CHECK(cudaSimLaunchFault(c.stream) == cudaSuccess);
        CHECK(cudaStreamSynchronize(c.stream) == cudaErrorIllegalAddress);
        if (order == 0) { /* pf_next first: the consumer stream's wait fails */
            CHECK_EQ(pf_next(c.l, &b), PF_ERR_CUDA);
            CHECK(b.data == NULL && b.pf__owner == NULL); /* the caller owns nothing new */
            CHECK_EQ(pf_release(c.l, &held), PF_ERR_CUDA); /* the held batch: its record fails */
            CHECK_CONTAINS(pf_error(c.l), "pf_release: cuda");
            CHECK_CONTAINS(pf_error(c.l), "illegal memory access");
        } else { /* pf_release first */
            CHECK_EQ(pf_release(c.l, &held), PF_ERR_CUDA);
            CHECK_CONTAINS(pf_error(c.l), "pf_release: cuda");
            CHECK_EQ(pf_next(c.l, &b), PF_ERR_CUDA);
        }
        CHECK_EQ(pf_release(c.l, &held), PF_ERR_INVALID_STATE); /* not twice */
        pf_get_stats(c.l, &st);
        CHECK_EQ(st.device_held, 0);
        CHECK_EQ(pf_next(c.l, &b), PF_ERR_CUDA); /* sticky */
        pf_destroy(c.l);
        fault_end(&c, NULL);
        t_load_free(&t);
    }
}

/* A pf_next racing a pf_release that is inside its cudaEventRecord: the
   released slot no longer counts as held, so pf_next waits for it (here,
   until its timeout) instead of failing with "you hold every slot". */
typedef struct releasing {
    tcons *c;
    pf_batch b;
    pf_result r;
} releasing;
static void *release_held(void *arg) {
    releasing *x = (releasing *)arg;
    x->r = pf_release(x->c->l, &x->b);
    return NULL;
}

static void test_next_racing_a_release_is_not_invalid_state(void) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_batch b1, b;
    releasing x;
    pthread_t th;
    struct timespec dl;
    t_load_init(&t);
    t_begin(&c, h_seed);
    mutant_consumer = c.stream;
    cfg = t_config(&t, 100, 5, 1);
    cfg.device_slots = 2;
    cfg.timeout_ms = 300;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    memset(&x, 0, sizeof x);
    x.c = &c;
    CHECK_EQ(t_next(&c, &x.b), PF_OK);
    CHECK_EQ(t_next(&c, &b1), PF_OK); /* both device slots held */
    pthread_mutex_lock(&hold_mu);
    hold_release = 1;
    release_entered = release_open = 0;
    pthread_mutex_unlock(&hold_mu);
    pthread_create(&th, NULL, release_held, &x);
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    pthread_mutex_lock(&hold_mu);
    while (!release_entered)
        if (pthread_cond_timedwait(&hold_cv, &hold_mu, &dl) != 0) break;
    pthread_mutex_unlock(&hold_mu);
    /* the release is half done: pf_next must wait for its slot */
    CHECK_EQ(pf_next(c.l, &b), PF_TIMEOUT);
    pthread_mutex_lock(&hold_mu);
    release_open = 1;
    hold_release = 0;
    pthread_cond_broadcast(&hold_cv);
    pthread_mutex_unlock(&hold_mu);
    pthread_join(th, NULL);
    CHECK_EQ(x.r, PF_OK);
    CHECK_EQ(t_next(&c, &b), PF_OK); /* and the slot it released comes back */
    t_release(&c, &b);
    t_release(&c, &b1);
    t_end(&c);
    t_load_free(&t);
}

/* When entering the loader's device fails, the message names cudaSetDevice,
   not the call that would have come next. The caller's thread enters with
   cudaSetDevice only where the driver lacks the primary-context calls. */
static void test_messages_name_the_call_that_failed(void) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_batch b;
    t_load_init(&t);
    t_begin(&c, h_seed);
    cudaSimDriverLacks("cuDevicePrimaryCtxRetain");
    cfg = t_config(&t, 100, 5, 1);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_next(&c, &b), PF_OK);
    CHECK(cudaSetDevice(1) == cudaSuccess); /* the caller works on the other GPU: the library must switch */
    cudaSimFailNth("cudaSetDevice", 1, cudaErrorInvalidDevice, 0);
    CHECK_EQ(pf_release(c.l, &b), PF_ERR_CUDA);
    CHECK_CONTAINS(pf_error(c.l), "pf_release: cudaSetDevice failed: invalid device ordinal");
    cudaSimClearFaults();
    CHECK_EQ(pf_next(c.l, &b), PF_ERR_CUDA); /* sticky, with the first message */
    CHECK_CONTAINS(pf_error(c.l), "cudaSetDevice failed");
    CHECK(cudaSetDevice(0) == cudaSuccess);
    t_end(&c);
    t_load_free(&t);
}

/* ---- contexts ---- */

static void test_torchrun_rank_creates_no_context_on_device_0(void) {
    int batches = 0;
    CHECK_EQ(scen_torchrun_rank1(h_seed, &batches), 0);
    CHECK_EQ(batches, 10);
}

/* The caller's CUDA state, after every public call, on a thread of its own
   (so its state is exactly what the test made it): the device cudaGetDevice
   answers and the depth of its context stack must be as they were, and no
   context may appear on a device but the caller's and the loader's (1).
   caller_dev -1: the caller never called cudaSetDevice. old_driver: the
   entry-point lookup answers "symbol not found" for the primary-context
   calls, so the library takes its fallback (cudaSetDevice for the span of
   a call); the runtime's device choice of a caller that never made one is
   then not kept (documented), everything else is. */
typedef struct caller_case {
    int caller_dev, old_driver;
    cudaStream_t stream; /* the consumer stream, on device 1 */
    tload *t;
    int wrong_dev, wrong_depth, calls, batches;
    char first[160];
} caller_case;

static void caller_check(caller_case *k, const char *after, int want_dev, int want_depth) {
    int d = -1, depth = cudaSimThreadContextDepth();
    k->calls++;
    CHECK(cudaGetDevice(&d) == cudaSuccess);
    if (d != want_dev && !(k->old_driver && k->caller_dev < 0)) {
        if (!k->wrong_dev++ && !k->wrong_depth)
            snprintf(k->first, sizeof k->first, "after %s: cudaGetDevice answers %d, not %d", after, d, want_dev);
    }
    if (depth != want_depth) {
        if (!k->wrong_depth++ && !k->wrong_dev)
            snprintf(k->first, sizeof k->first, "after %s: %d contexts current, not %d", after, depth, want_depth);
    }
}

static void *caller_thread(void *arg) {
    caller_case *k = (caller_case *)arg;
    int want_dev = k->caller_dev < 0 ? 0 : k->caller_dev, depth;
    pf_config cfg = t_config(k->t, 60, 6, 1);
    pf_loader *l = NULL;
    pf_stats st;
    char tok[256];
    if (k->caller_dev >= 0) CHECK(cudaSetDevice(k->caller_dev) == cudaSuccess);
    depth = cudaSimThreadContextDepth();
    cfg.cuda_device = 1;
    cfg.stream = k->stream;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    caller_check(k, "pf_create", want_dev, depth);
    if (!l) return NULL;
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        caller_check(k, "pf_next", want_dev, depth);
        if (r == PF_END_OF_EPOCH) continue;
        if (r != PF_OK) {
            CHECK_EQ(r, PF_END_OF_DATA);
            break;
        }
        k->batches++;
        if (k->batches % 2) {
            CHECK_EQ(pf_batch_wait(l, &b), PF_OK);
            caller_check(k, "pf_batch_wait", want_dev, depth);
        }
        pf_get_stats(l, &st);
        caller_check(k, "pf_get_stats", want_dev, depth);
        CHECK_EQ(pf_checkpoint(l, tok, sizeof tok), PF_OK);
        caller_check(k, "pf_checkpoint", want_dev, depth);
        CHECK_EQ(pf_release(l, &b), PF_OK);
        caller_check(k, "pf_release", want_dev, depth);
    }
    pf_destroy(l);
    caller_check(k, "pf_destroy", want_dev, depth);
    return NULL;
}

/* A fresh runtime with three GPUs, the consumer stream on device 1, and
   the caller on caller_dev (-1: none chosen). */
static void run_caller_case(caller_case *k) {
    tload t;
    pthread_t th;
    char msg[768];
    t_load_init(&t);
    cudaSimReset(h_seed, 30, 3);
    if (k->old_driver)
        cudaSimDriverLacks("cuDeviceGet cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRelease cuCtxPushCurrent "
                           "cuCtxPopCurrent");
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&k->stream, cudaStreamNonBlocking) == cudaSuccess);
    cudaSimForbidLegacyStream(1);
    k->t = &t;
    pthread_create(&th, NULL, caller_thread, k);
    pthread_join(th, NULL);
    CHECK_EQ(k->batches, 10);
    CHECK(k->calls > 40);
    CHECK(cudaStreamSynchronize(k->stream) == cudaSuccess);
    CHECK(cudaStreamDestroy(k->stream) == cudaSuccess);
    CHECKF(cudaSimViolations(msg, sizeof msg) == 0, "%s", msg);
    CHECK_EQ(cudaSimObjectsLive(), 0);
    CHECK_EQ(cudaSimPrimaryRetained(1), 0); /* pf_destroy released what pf_create retained */
    t_load_free(&t);
}

static void check_caller_state_kept(int old_driver) {
    static const int callers[] = {-1, 0, 2};
    for (size_t i = 0; i < sizeof callers / sizeof callers[0]; i++) {
        caller_case k;
        memset(&k, 0, sizeof k);
        k.caller_dev = callers[i];
        k.old_driver = old_driver;
        run_caller_case(&k);
        CHECKF(k.wrong_dev == 0 && k.wrong_depth == 0, "caller on %d%s: %s (%d of %d calls)", k.caller_dev,
               old_driver ? ", old driver" : "", k.first, k.wrong_dev + k.wrong_depth, k.calls);
        /* contexts only where the caller or the loader asked for one */
        CHECKF(cudaSimContextCreated(0) == (k.caller_dev == 0), "caller on %d: a context on device 0",
               k.caller_dev);
        CHECKF(cudaSimContextCreated(2) == (k.caller_dev == 2), "caller on %d: a context on device 2",
               k.caller_dev);
    }
}

/* Never chose a device, on device 0, on device 2; the loader on device 1:
   cudaGetDevice and the context stack read the same after every call. */
static void test_caller_state_kept_after_every_call(void) { check_caller_state_kept(0); }

/* A pending (non-sticky) error of the caller's survives the public calls
   that make no event query: it is the caller's to read with
   cudaGetLastError. pf_destroy used to clear it unconditionally. (pf_next,
   pf_batch_wait and pf_get_stats query events when they wait or settle a
   verdict, and the simulator records cudaErrorNotReady as the last error:
   whether they keep it depends on timing, so they are not checked here.) */
static void pend_error(void) {
    void *p;
    cudaSimFailNth("cudaMalloc", 1, cudaErrorMemoryAllocation, 0);
    CHECK(cudaMalloc(&p, 16) == cudaErrorMemoryAllocation);
}
static void still_pending(const char *after) {
    cudaError_t e = cudaGetLastError();
    CHECKF(e == cudaErrorMemoryAllocation, "after %s the caller's pending error is %s", after, cudaGetErrorName(e));
}

static void test_caller_pending_error_kept(void) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_batch b;
    char tok[512];
    t_load_init(&t);
    t_begin(&c, h_seed);
    cfg = t_config(&t, 40, 4, 1);
    cfg.device_slots = 2;
    pend_error();
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    still_pending("pf_create");
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(t_next(&c, &b), PF_OK);
        pend_error();
        CHECK_EQ(pf_checkpoint(c.l, tok, sizeof tok), PF_OK);
        still_pending("pf_checkpoint");
        pend_error();
        t_release(&c, &b);
        still_pending("pf_release");
    }
    pend_error();
    pf_destroy(c.l);
    c.l = NULL;
    still_pending("pf_destroy");
    t_end(&c);
    t_load_free(&t);
}

/* The same where the driver answers "symbol not found" for the primary-
   context calls: the fallback keeps the context rule (no context on device
   0, none left current), and a chosen device. */
static void test_caller_state_kept_with_an_old_driver(void) { check_caller_state_kept(1); }

/* Worker threads are bound to the loader's device: a load that calls CUDA
   (cuda_device = 1) finds device 1 current. */
static int load_dev_wrong;
static int load_checks_device(void *user, pf_job *job) {
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess || d != 1) __atomic_add_fetch(&load_dev_wrong, 1, __ATOMIC_RELAXED);
    return t_load(user, job);
}

static void test_load_runs_on_the_loaders_device(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    t_load_init(&t);
    t_cons_init(&c);
    cudaSimReset(h_seed, 30, 2);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking) == cudaSuccess);
    cudaSimForbidLegacyStream(1);
    load_dev_wrong = 0;
    cfg = t_config(&t, 60, 6, 1);
    cfg.load = load_checks_device;
    cfg.cuda_device = 1;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    t_run_init(&r);
    CHECK_EQ(t_drain(&c, &r, 1000), PF_END_OF_DATA);
    CHECK_EQ(r.n, 10);
    CHECK_EQ(__atomic_load_n(&load_dev_wrong, __ATOMIC_RELAXED), 0);
    t_end(&c);
    t_run_free(&r);
    t_load_free(&t);
}

/* cfg.stream made on device 0, cfg.cuda_device = 1 (the stream created
   before cudaSetDevice(local rank)): pf_create names it, leaves nothing
   behind and the caller's device as it was (an outside trial: created
   fine, then a cudaEventRecord failure at the first batch) */
static void test_a_stream_of_another_device_is_named(void) {
    tload t;
    pf_config cfg;
    pf_loader *l = NULL;
    cudaStream_t s0;
    int d = -1;
    char msg[768];
    t_load_init(&t);
    cudaSimReset(h_seed, 0, 2);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking) == cudaSuccess);
    cfg = t_config(&t, 60, 6, 1);
    cfg.stream = s0;
    cfg.cuda_device = 1;
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG);
    CHECK(l == NULL);
    CHECK_CONTAINS(pf_error(NULL), "cudaEventRecord(drain, cfg.stream) on device 1 (cfg.cuda_device)");
    CHECK_CONTAINS(pf_error(NULL), "is cfg.stream a stream of another GPU? Create it after cudaSetDevice(1)");
    CHECK(cudaGetDevice(&d) == cudaSuccess);
    CHECK_EQ(d, 0);
    CHECK(cudaGetLastError() == cudaSuccess); /* no error of ours left for the caller */
    CHECK(cudaSimViolations(msg, sizeof msg) == 1); /* the probe itself, which the simulator reports */
    CHECK_CONTAINS(msg, "cudaEventRecord");
    CHECK(cudaStreamDestroy(s0) == cudaSuccess);
    CHECK_EQ(cudaSimBytesLive(), 0);
    CHECK_EQ(cudaSimObjectsLive(), 0);
    cudaSimReset(h_seed, 0, 1);
    t_load_free(&t);
}

/* One device slot, slow modelled copies: batch k+1's copy into the slot
   is queued while batch k's is still in flight. Alternately released at
   once, and waited for (pf_batch_wait) then read on the host: a wait that
   trusted the earlier copy's completion would read the earlier batch. */
static void test_batch_wait_after_the_slot_was_reused(void) {
    tload t;
    tcons c;
    pf_config cfg;
    int n = 0;
    t_load_init(&t);
    t_begin(&c, h_seed);
    cfg = t_config(&t, 80, 4, 1);
    cfg.device_slots = 1;
    cfg.host_slots = 4;
    cudaSimSetTiming((double)cfg.batch_bytes / 0.002); /* 2 ms a copy */
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(c.l, &b);
        if (r != PF_OK) {
            CHECK_EQ(r, PF_END_OF_EPOCH);
            break;
        }
        if (n++ % 2) {
            CHECK_EQ(pf_batch_wait(c.l, &b), PF_OK);
            cudaSimHostRead(b.data, b.bytes);
            t_verify(&c, (const uint64_t *)b.data, b.bytes, b.epoch, b.batch, b.count, b.rng, b.indices);
        }
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
    }
    CHECK_EQ(n, 20);
    CHECK_EQ(c.checked, 10);
    t_end(&c); /* and no race: every host read was ordered after its copy */
    t_load_free(&t);
}

static void test_exclusive_process_device_falls_back_to_host(void) {
    tload t;
    pf_config cfg;
    pf_loader *l = NULL;
    pf_stats st;
    t_load_init(&t);
    cudaSimReset(h_seed, 0, 1);
    cudaSimSetExclusiveBusy(0, 1);
    cfg = t_config(&t, 50, 5, 1);
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_NO_DEVICE); /* asked for CUDA: a clear error */
    CHECK_CONTAINS(pf_error(NULL), "cudaSetDevice(0)");
    CHECK_CONTAINS(pf_error(NULL), "cudaErrorDevicesUnavailable");
    cfg.backend = PF_BACKEND_DEFAULT; /* the default falls back, and says why */
    cfg.log = t_log;
    log_n = 0;
    log_msg[0] = '\0';
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    CHECK_CONTAINS(log_msg, "cudaErrorDevicesUnavailable");
    CHECK_CONTAINS(log_msg, "using the host backend");
    pf_get_stats(l, &st);
    CHECK_EQ(st.backend, PF_BACKEND_HOST);
    pf_destroy(l);
    CHECK_EQ(cudaSimObjectsLive(), 0);
    CHECK_EQ(cudaSimBytesLive(), 0);
    t_load_free(&t);
}

/* ---- the verdict on the timing model ---- */

#define REGIME_BPS 32e6
/* long enough that the start-up (the first loads, the first copy) is a
   small part of the run: with 48 batches a few ms of it read as 6% of
   input wait in the slow-loads case on a busy box, past the 5% line */
#define REGIME_BATCHES 96
#define REGIME_MS(ms) ((size_t)((ms) * (REGIME_BPS / 1e3))) /* bytes of a copy taking ms */

typedef struct regime {
    unsigned load_us, kernel_us;
    size_t bytes;
} regime;

static int regime_load(void *user, pf_job *job) {
    const regime *g = (const regime *)user;
    if (g->load_us) t_sleep_us(g->load_us);
    cudaSimHostWrite(job->host, job->capacity);
    memset(job->host, (int)(job->batch & 0xff), 64);
    job->bytes = job->capacity;
    return 0;
}

/* timing_only: the simulator's benchmark mode, with no stream threads;
   serial_us: a GPU that runs all streams as one FIFO, each operation
   costing that much (0: copies and kernels overlap) */
static pf_bound run_regime_on(const regime *g, int timing_only, unsigned serial_us, pf_stats *st) {
    tcons c;
    pf_config cfg = t_config_base(REGIME_BATCHES, 1, g->bytes, 1);
    pf_batch b;
    int n = 0;
    t_begin_mode(&c, h_seed, timing_only);
    /* 32 MB/s: modelled copies take milliseconds while the simulator moves
       and race-checks few bytes (a sanitizer makes that per-byte work slow
       enough to be the real limit otherwise) */
    cudaSimSetTiming(REGIME_BPS);
    cudaSimSerialStreams(serial_us);
    cfg.load = regime_load;
    cfg.user = (void *)g;
    cfg.num_workers = 2;
    cfg.host_slots = 5; /* 2W+1: a ring by bytes would hold all 48 batches at once */
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    while (pf_next(c.l, &b) == PF_OK) {
        CHECK(cudaSimLaunchKernelFor(c.stream, g->kernel_us, NULL, NULL, b.data, b.bytes) == cudaSuccess);
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
        n++;
    }
    CHECK_EQ(n, REGIME_BATCHES);
    pf_get_stats(c.l, st);
    t_end(&c);
    return st->bound;
}

static pf_bound run_regime(const regime *g, int timing_only, pf_stats *st) {
    return run_regime_on(g, timing_only, 0, st);
}

/* got must be want; the failure (and, verbose, the line) names the case
   with what_fail (what_log) after it and gives the stats it was taken from */
static void check_verdict(pf_bound got, pf_bound want, const pf_stats *st, const char *name, const char *what_fail,
                          const char *what_log) {
    CHECKF(got == want, "%s%s: verdict \"%s\" (wait input %.3f copy %.3f gpu %.3f of %.3f s)", name, what_fail,
           st->verdict, st->wait_input_s, st->wait_copy_s, st->wait_gpu_s, st->elapsed_s);
    if (h_verbose)
        printf("    %s%s: %s (wait input %.3f copy %.3f gpu %.3f of %.3f s)\n", name, what_log, st->verdict,
               st->wait_input_s, st->wait_copy_s, st->wait_gpu_s, st->elapsed_s);
}

/* A GPU that serialises streams: a compute-bound loop (3 ms kernels, fast
   loads, 64 us copies) on a device that runs every stream's work in one
   FIFO, each operation costing it 20 us. The consumer stream's wait for a
   copy that landed long before still spans two operations of the device's
   own latency (and whatever other streams queued between the marks): that
   is not a copy, and the verdict must not say copy-bound. (Twice: with a
   thread per stream, where the FIFO is the order the threads time their
   operations in, and timing-only, where it is exactly enqueue order.) */
static void test_verdict_on_a_gpu_that_serialises_streams(void) {
    static const struct {
        regime g;
        pf_bound want;
        const char *name;
    } cases[] = {
        {{0, 3000, REGIME_MS(0.064)}, PF_BOUND_COMPUTE, "compute-bound (3 ms kernels, 64 us copies, fast loads)"},
    };
    for (int mode = 0; mode < 2; mode++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            pf_stats st;
            pf_bound got = run_regime_on(&cases[i].g, mode, 20, &st);
            check_verdict(got, cases[i].want, &st, cases[i].name,
                          mode ? ", serial streams, timing-only" : ", serial streams",
                          mode ? ", serial, timing-only" : ", serial");
        }
}

static void test_verdict_right_in_three_modelled_regimes(void) {
    /* Each regime's limit is 10x, then 2x, the others: milliseconds, so
       scheduling noise on a loaded machine cannot flip it. The slow-load
       case is the one a verdict taken when a wait begins got wrong: each
       wait begins a load (3 ms) after a copy landed, when the next copy,
       held back by the GPU until then, is already running. */
    static const struct {
        regime g;
        pf_bound want;
        const char *name;
    } cases[] = {
        {{0, 8000, REGIME_MS(0.064)}, PF_BOUND_COMPUTE, "compute-bound (8 ms kernels, 64 us copies)"},
        {{0, 300, REGIME_MS(8)}, PF_BOUND_COPY, "copy-bound (8 ms copies, 0.3 ms kernels)"},
        {{16000, 300, REGIME_MS(0.064)}, PF_BOUND_INPUT, "input-bound (16 ms loads on 2 workers, 0.3 ms kernels)"},
        {{0, 4000, REGIME_MS(2)}, PF_BOUND_COMPUTE, "compute-bound at 2x (4 ms kernels, 2 ms copies)"},
        {{0, 2000, REGIME_MS(4)}, PF_BOUND_COPY, "copy-bound at 2x (4 ms copies, 2 ms kernels)"},
        {{8000, 2000, REGIME_MS(1)}, PF_BOUND_INPUT,
         "input-bound at 2x (8 ms loads on 2 workers, 1 ms copies, 2 ms kernels)"},
        {{3000, 4000, REGIME_MS(2)}, PF_BOUND_COMPUTE,
         "compute-bound, slow loads keeping up (3 ms loads on 2 workers, 2 ms copies, 4 ms kernels)"},
    };
    /* A loaded 2-core box can still flip one run in a few hundred: a wrong
       verdict is run twice more and the majority of the three counts, as
       gpu_bench's verdict is the majority of its trials. */
    for (int mode = 0; mode < 2; mode++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            pf_stats st;
            pf_bound got = run_regime(&cases[i].g, mode, &st);
            if (got != cases[i].want) {
                pf_stats st2;
                int right = (run_regime(&cases[i].g, mode, &st2) == cases[i].want) +
                            (run_regime(&cases[i].g, mode, &st2) == cases[i].want);
                if (right == 2) got = cases[i].want;
            }
            check_verdict(got, cases[i].want, &st, cases[i].name, mode ? ", timing-only" : "",
                          mode ? ", timing-only" : "");
    }
}

/* ---- selection ---- */

static void test_no_device(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    pf_loader *l = NULL;
    pf_stats s;
    t_load_init(&t);
    cudaSimReset(h_seed, 0, 0); /* a machine without GPUs */
    cfg = t_config(&t, 50, 5, 2);
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_NO_DEVICE);
    CHECK(l == NULL);
    CHECK_CONTAINS(pf_error(NULL), "no CUDA-capable device is detected");
    CHECK_CONTAINS(pf_error(NULL), "cudaGetDeviceCount");
    cfg.backend = PF_BACKEND_DEFAULT; /* falls back, says why, delivers everything */
    cfg.log = t_log;
    log_n = 0;
    log_msg[0] = '\0';
    t_cons_init(&c);
    c.on_host = 1;
    CHECK_EQ(pf_create(&cfg, &c.l), PF_OK);
    CHECK_EQ(log_n, 2);
    CHECK_CONTAINS(log_msg, "no usable CUDA device: the NVIDIA driver (CUDA 13.0) finds no device");
    CHECK_CONTAINS(log_msg, "cudaGetDeviceCount failed: no CUDA-capable device");
    CHECK_CONTAINS(log_msg, "using the host backend");
    pf_get_stats(c.l, &s);
    CHECK_EQ(s.backend, PF_BACKEND_HOST);
    t_run_init(&r);
    CHECK_EQ(t_drain(&c, &r, 1000), PF_END_OF_DATA);
    CHECK_EQ(r.n, 20);
    CHECK_EQ(c.checked, 20);
    pf_destroy(c.l);
    t_run_free(&r);

    cudaSimReset(h_seed, 0, 1);
    cudaSimSetGlobalError(cudaErrorInsufficientDriver); /* no driver at all */
    cudaSimSetDriverVersion(0);
    cfg.backend = PF_BACKEND_CUDA;
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_NO_DEVICE);
    CHECK_CONTAINS(pf_error(NULL), "no NVIDIA driver is installed");
    CHECK_CONTAINS(pf_error(NULL), "CUDA driver version is insufficient");
    CHECK_CONTAINS(pf_error(NULL), "cudaErrorInsufficientDriver");
    cfg.backend = PF_BACKEND_DEFAULT;
    log_n = 0;
    log_msg[0] = '\0';
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    CHECK_CONTAINS(log_msg, "using the host backend");
    pf_destroy(l);
    cudaSimReset(h_seed, 0, 1);
    t_load_free(&t);
}

/* PF_BACKEND_DEFAULT without a usable GPU: a config with a stream fails
   (kernels would get host pointers), one naming only a device falls back
   with a warning (on stderr without cfg.log), and the message says what
   was found: no driver, a driver too old, or no device. */
static int warn_n;
static char warn_msg[1024];
static void warn_log(void *user, int level, const char *msg) {
    (void)user;
    if (level == PF_LOG_WARN) {
        warn_n++;
        snprintf(warn_msg, sizeof warn_msg, "%s", msg);
    }
}

/* cfg makes a loader on the host backend, with one warning through
   cfg.log that says what was found and holds want */
static void host_with_one_warning(pf_config *cfg, const char *found, const char *want) {
    pf_loader *l = NULL;
    cfg->log = warn_log;
    warn_n = 0;
    CHECK_EQ(pf_create(cfg, &l), PF_OK);
    CHECK_EQ(warn_n, 1);
    CHECK_CONTAINS(warn_msg, found);
    CHECK_CONTAINS(warn_msg, want);
    CHECK_EQ(pf_get_backend(l), PF_BACKEND_HOST);
    pf_destroy(l);
}

static void test_default_backend_never_silently_host(void) {
    static const struct {
        int devices, driver;
        cudaError_t err;
        const char *found;
    } machines[] = {
        {0, 13000, cudaSuccess, "the NVIDIA driver (CUDA 13.0) finds no device"},
        {1, 0, cudaErrorInsufficientDriver, "no NVIDIA driver is installed"},
        {1, 11080, cudaErrorInsufficientDriver,
         "the NVIDIA driver's version is insufficient: it supports CUDA 11.8, this program's runtime is CUDA 13.0"},
    };
    tload t;
    t_load_init(&t);
    for (size_t i = 0; i < sizeof machines / sizeof machines[0]; i++) {
        pf_config cfg = t_config(&t, 50, 5, 1);
        pf_loader *l = (pf_loader *)&t;
        char err[128] = "";
        FILE *cap;
        int saved;
        cudaSimReset(h_seed, 0, machines[i].devices);
        cudaSimSetDriverVersion(machines[i].driver);
        if (machines[i].err != cudaSuccess) cudaSimSetGlobalError(machines[i].err);
        cfg.backend = PF_BACKEND_DEFAULT;
        cfg.stream = (void *)&cfg; /* any stream: pf_create must refuse before using it */
        CHECK_EQ(pf_create(&cfg, &l), PF_ERR_NO_DEVICE);
        CHECK(l == NULL);
        CHECK_CONTAINS(pf_error(NULL), machines[i].found);
        CHECK_CONTAINS(pf_error(NULL), "cfg.stream is set");
        CHECK_CONTAINS(pf_error(NULL), "PF_BACKEND_HOST");
        /* a device named, no stream: the host backend, with a warning */
        cfg.stream = NULL;
        cfg.cuda_device = 1;
        host_with_one_warning(&cfg, machines[i].found, "cfg.cuda_device is 1, but using the host backend");
        /* ... on stderr when there is no cfg.log */
        cfg.log = NULL;
        fflush(stderr);
        cap = tmpfile();
        saved = dup(2);
        CHECK(cap && saved >= 0 && dup2(fileno(cap), 2) >= 0);
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        rewind(cap);
        if (!fgets(err, sizeof err, cap)) err[0] = '\0';
        fclose(cap);
        CHECK_CONTAINS(err, "prefetch.h: warning: backend: no usable CUDA device");
        pf_destroy(l);
        /* neither: the fallback DEFAULT promises, as a warning through cfg.log only */
        cfg.cuda_device = 0;
        host_with_one_warning(&cfg, machines[i].found, "using the host backend");
        CHECK_EQ(pf_get_backend(NULL), PF_BACKEND_DEFAULT);
    }
    cudaSimReset(h_seed, 0, 1);
    t_load_free(&t);
}

/* pf_get_backend on a working GPU. */
static void test_get_backend_on_a_gpu(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    t_open(&t, &c, &r);
    cfg = t_config(&t, 20, 5, 1);
    cfg.backend = PF_BACKEND_DEFAULT;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(pf_get_backend(c.l), PF_BACKEND_CUDA);
    CHECK_EQ(t_drain(&c, &r, 100), PF_END_OF_DATA);
    t_close(&t, &c, &r);
}

static void test_device_out_of_range(void) {
    tload t;
    pf_config cfg;
    pf_loader *l;
    t_load_init(&t);
    cudaSimReset(h_seed, 0, 2);
    cfg = t_config(&t, 50, 5, 1);
    cfg.cuda_device = 5;
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG);
    CHECK_CONTAINS(pf_error(NULL), "cfg.cuda_device is 5: must be 0 .. 1");
    cfg.backend = PF_BACKEND_DEFAULT; /* not silently the host: the GPU exists */
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG);
    t_load_free(&t);
}

static void test_second_device_and_caller_device_kept(void) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_batch b;
    int dev = -1, n = 0;
    char msg[768];
    t_load_init(&t);
    t_cons_init(&c);
    cudaSimReset(h_seed, 30, 2);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaSetDevice(0) == cudaSuccess); /* the caller works on device 0 */
    cudaSimForbidLegacyStream(1);
    cfg = t_config(&t, 60, 6, 1);
    cfg.cuda_device = 1;
    cfg.stream = c.stream;
    CHECK_EQ(pf_create(&cfg, &c.l), PF_OK);
    CHECK(cudaGetDevice(&dev) == cudaSuccess && dev == 0);
    for (;;) {
        pf_result r = pf_next(c.l, &b);
        if (r != PF_OK) {
            CHECK_EQ(r, PF_END_OF_EPOCH);
            break;
        }
        CHECK(cudaGetDevice(&dev) == cudaSuccess && dev == 0);
        CHECK(cudaSetDevice(1) == cudaSuccess); /* our "kernel" runs on device 1 */
        {
            tcheck *k = (tcheck *)malloc(sizeof(tcheck) + b.count * sizeof(uint64_t));
            k->c = &c;
            k->data = (const uint64_t *)b.data;
            k->bytes = b.bytes;
            k->epoch = b.epoch;
            k->batch = b.batch;
            k->rng = b.rng;
            k->count = b.count;
            memcpy(k->indices, b.indices, b.count * sizeof(uint64_t));
            CHECK(cudaSimLaunchKernel(c.stream, t_kernel, k, b.data, b.bytes) == cudaSuccess);
        }
        CHECK(cudaSetDevice(0) == cudaSuccess);
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
        CHECK(cudaGetDevice(&dev) == cudaSuccess && dev == 0);
        n++;
    }
    CHECK_EQ(n, 10);
    pf_destroy(c.l);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaStreamSynchronize(c.stream) == cudaSuccess);
    CHECK(cudaStreamDestroy(c.stream) == cudaSuccess);
    CHECKF(cudaSimViolations(msg, sizeof msg) == 0, "%s", msg);
    CHECK_EQ(c.checked, 10);
    CHECK_EQ(c.bad, 0);
    CHECK_EQ(cudaSimObjectsLive(), 0);
    t_load_free(&t);
}

static void test_legacy_default_stream_when_stream_is_null(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    t_open(&t, &c, &r);
    cudaSimForbidLegacyStream(0);
    cfg = t_config(&t, 40, 4, 1);
    cfg.stream = NULL;
    CHECK_EQ(pf_create(&cfg, &c.l), PF_OK);
    /* our kernels stay on c.stream; only the library's waits and records use
       the legacy stream, and the race detector still sees them ordered */
    {
        pf_batch b;
        int n = 0;
        while (pf_next(c.l, &b) == PF_OK) {
            CHECK(cudaSimLaunchKernel(NULL, noop_kernel, NULL, b.data, b.bytes) == cudaSuccess);
            CHECK_EQ(pf_release(c.l, &b), PF_OK);
            n++;
        }
        CHECK_EQ(n, 10);
    }
    CHECK(cudaStreamSynchronize(NULL) == cudaSuccess);
    t_close(&t, &c, &r);
}

/* ---- memory, flags, calls ---- */

static void test_memory_exact_and_flags(void) {
    tload t;
    tcons c;
    pf_config cfg;
    t_load_init(&t);
    t_begin(&c, h_seed);
    cfg = t_config(&t, 60, 6, 1);
    cfg.batch_bytes = 1000; /* stride 1024: each slot 256-byte aligned */
    cfg.host_slots = 5;
    cfg.device_slots = 3;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    /* the slots, and an offsets table per slot for packed batches: 7 words
       (batch_size + 1), rounded up to 256 bytes */
    CHECK_EQ(cudaSimBytesLive(), 5 * (1024 + 256) + 3 * (1024 + 256));
    CHECK_EQ(cudaSimCalls("cudaHostAlloc"), 1);
    CHECK_EQ(cudaSimCalls("cudaMalloc"), 1);
    /* copied, released; hdone (2 * host_slots + device_slots: each outlives
       its copy for the verdict); 2 marks; drain */
    CHECK_EQ(cudaSimCalls("cudaEventCreateWithFlags"), 2 * 3 + (2 * 5 + 3) + 2 * 5 + 1);
    CHECK_EQ(cudaSimCalls("cudaStreamCreateWithFlags"), 2); /* ours (the test's) and the copy stream */
    CHECK_EQ(cudaSimLastFlags("cudaStreamCreateWithFlags"), cudaStreamNonBlocking);
    /* per-batch events only ever waited on by streams or queried: no
       BlockingSync; the ones a host thread sleeps on: BlockingSync; the
       verdict's marks keep timing */
    CHECK_EQ(cudaSimEventsWithFlags(cudaEventDisableTiming), 2 * 3);
    CHECK_EQ(cudaSimEventsWithFlags(cudaEventDisableTiming | cudaEventBlockingSync), 1); /* drain */
    CHECK_EQ(cudaSimEventsWithFlags(cudaEventBlockingSync), 2 * 5 + 3); /* hdone: also the copy's end, timed */
    CHECK_EQ(cudaSimEventsWithFlags(cudaEventDefault), 2 * 5);
    CHECK_EQ(cudaSimLastFlags("cudaHostAlloc"), cudaHostAllocDefault);
    pf_destroy(c.l);
    c.l = NULL;
    CHECK_EQ(cudaSimCalls("cudaHostAlloc"), 1); /* nothing allocated during the run */
    cudaStreamDestroy(c.stream);
    CHECK_EQ(cudaSimBytesLive(), 0);
    CHECK_EQ(cudaSimObjectsLive(), 0);
    pthread_mutex_destroy(&c.mu);
    t_load_free(&t);
}

/* Host waits made on the calling (consumer's) thread. The retirer's
   cudaEventSynchronize runs on its own thread: that is the design. */
static int host_syncs(void) {
    return cudaSimThreadCalls("cudaEventSynchronize") + cudaSimThreadCalls("cudaStreamSynchronize") +
           cudaSimThreadCalls("cudaDeviceSynchronize");
}

static void test_pf_next_never_waits_for_the_copy_on_the_host(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    pf_batch b;
    t_sim_delay_us = 500; /* copies are slow: a host wait would show (set before t_open resets the sim) */
    t_open(&t, &c, &r);
    cfg = t_config(&t, 60, 6, 1);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_drain(&c, &r, 1000), PF_END_OF_DATA);
    CHECK_EQ(r.n, 10);
    CHECK_EQ(host_syncs(), 0); /* not one host wait on the consumer's thread in a whole epoch */
    CHECK_EQ(cudaSimCalls("cudaMemcpyAsync"), 10);
    CHECK_EQ(cudaSimCalls("cudaLaunchHostFunc"), 0); /* nothing but GPU work in the copy stream */
    CHECK_EQ(pf_next(c.l, &b), PF_END_OF_DATA);
    t_end(&c);
    t_sim_delay_us = 40;
    t_run_free(&r);
    t_load_free(&t);
}

/* The consumer's CUDA calls per batch: a batch whose copy landed before
   pf_next took it cannot be waited for, so it gets no timing marks (two
   timed records, 3 us on an H100); its stream wait stays (the fault path
   needs a call). One still copying gets both marks around the wait. */
static void test_landed_batch_gets_no_marks(void) {
    for (int slow = 0; slow < 2; slow++) {
        tload t;
        tcons c;
        pf_config cfg;
        pf_batch b[3];
        pf_stats st;
        double until = h_now() + 60;
        int rec, waits;
        t_load_init(&t);
        t_begin(&c, h_seed);
        cfg = t_config(&t, 9, 3, 1); /* three batches, three device slots */
        cfg.device_slots = 3;
        /* slow: a copy takes 300 ms, and pf_next returns as soon as the
           batch is staged, long before that */
        if (slow) cudaSimSetTiming((double)cfg.batch_bytes / 0.3);
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
        while (!slow) { /* bounded: all three copies land and are retired */
            pf_get_stats(c.l, &st);
            if ((st.device_ready == 3 && st.copying_slots == 0) || h_now() > until) break;
            t_sleep_us(1000);
        }
        CHECK(slow || (st.device_ready == 3 && st.copying_slots == 0));
        for (int i = 0; i < 3; i++) {
            rec = cudaSimThreadCalls("cudaEventRecord");
            waits = cudaSimThreadCalls("cudaStreamWaitEvent");
            CHECK_EQ(pf_next(c.l, &b[i]), PF_OK);
            CHECK_EQ(b[i].batch, (uint64_t)i);
            CHECK_EQ(cudaSimThreadCalls("cudaEventRecord") - rec, slow ? 2 : 0);
            CHECK_EQ(cudaSimThreadCalls("cudaStreamWaitEvent") - waits, 1);
        }
        for (int i = 0; i < 3; i++) CHECK_EQ(pf_release(c.l, &b[i]), PF_OK);
        t_end(&c); /* and no race either way */
        t_load_free(&t);
    }
}

static void test_batch_wait_lands_the_copy_for_the_host(void) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_batch b;
    int n = 0;
    t_load_init(&t);
    t_sim_delay_us = 800;
    t_begin(&c, h_seed);
    cfg = t_config(&t, 30, 3, 1);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    while (pf_next(c.l, &b) == PF_OK) {
        CHECK_EQ(pf_batch_wait(c.l, &b), PF_OK);
        /* the host's read is checked against the copy's write: ordered only
           if pf_batch_wait really waited for it */
        cudaSimHostRead(b.data, b.bytes);
        /* the simulated device memory is host-visible: the bytes are there */
        t_verify(&c, (const uint64_t *)b.data, b.bytes, b.epoch, b.batch, b.count, b.rng, b.indices);
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
        n++;
    }
    CHECK_EQ(n, 10);
    CHECK_EQ(c.checked, 10);
    CHECK_EQ(host_syncs(), 0); /* it slept on a condition variable, not on an event */
    t_end(&c);
    t_sim_delay_us = 40;
    t_load_free(&t);
}

/* A failed load stops the pipeline, not the copies already in flight: a
   batch the caller holds can still be waited for and read on the host
   (an outside trial: pf_batch_wait on batch 0 failed for ever with batch
   1's load error, the retirer having stopped at it). */
static void test_batch_wait_after_a_later_load_failed(void) {
    for (int rep = 0; rep < 6; rep++) {
        tload t;
        tcons c;
        pf_config cfg;
        pf_batch held, b;
        t_load_init(&t);
        t.fail_epoch = 0;
        t.fail_batch = 1;
        t_sim_delay_us = rep % 2 ? 2000 : 200; /* the copy of batch 0 still in flight, or landed */
        t_begin(&c, h_seed + (uint64_t)rep);
        cfg = t_config(&t, 40, 4, 2);
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
        CHECK_EQ(pf_next(c.l, &held), PF_OK);
        CHECK_EQ(pf_next(c.l, &b), PF_ERR_LOAD);
        CHECK(strstr(pf_error(c.l), "synthetic failure") != NULL);
        CHECK_EQ(pf_batch_wait(c.l, &held), PF_OK);
        cudaSimHostRead(held.data, held.bytes); /* ordered after the copy only if it really waited */
        t_verify(&c, (const uint64_t *)held.data, held.bytes, held.epoch, held.batch, held.count, held.rng, held.indices);
        CHECK_EQ(pf_release(c.l, &held), PF_OK);
        CHECK_EQ(pf_next(c.l, &b), PF_ERR_LOAD); /* the error stays */
        t_end(&c);
        t_load_free(&t);
    }
    t_sim_delay_us = 40;
}

/* ---- faults ---- */

static void test_runtime_cuda_failures_surface_from_pf_next(void) {
    /* most: how many batches can be delivered before the failing call, at
       most (each delivered batch needed one such call first; the retirer's
       syncs gate host slots: host_slots + failed-1 batches at most) */
    static const struct {
        const char *fn;
        int nth, most;
    } cases[] = {{"cudaMemcpyAsync", 5, 4}, {"cudaEventRecord", 6, 5}, {"cudaStreamWaitEvent", 4, 3},
                 {"cudaEventSynchronize", 3, 7 + 2}, {"cudaMemcpyAsync", 1, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tload t;
        tcons c;
        pf_config cfg;
        pf_batch b;
        pf_result r = PF_OK;
        int delivered = 0, failed_at = -1;
        char msg[1024] = "";
        t_load_init(&t);
        t_begin(&c, h_seed + i);
        cfg = t_config(&t, 100, 5, 1);
        cfg.host_slots = 7; /* 2W+1, which `most` counts on (not the ring by bytes) */
        /* armed before create: pf_create itself makes none of these calls,
           so the count starts with the pipeline's first */
        cudaSimFailNth(cases[i].fn, cases[i].nth, cudaErrorLaunchFailure, 0);
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
        /* the retirer polls cudaEventQuery before it syncs, and a poll that
           sees the event done makes no cudaEventSynchronize call: `most`
           counts one sync per slot reuse, so no polling here (nothing to
           retire yet: it has not polled) */
        pf__lock(&c.l->sync.mu);
        c.l->sync.spin_ns[PF__ROLE_RETIRER] = 0;
        pf__unlock(&c.l->sync.mu);
        for (int step = 0; step < 100; step++) {
            r = t_next(&c, &b);
            if (r != PF_OK) break;
            delivered++;
            r = pf_release(c.l, &b);
            if (r != PF_OK) break;
        }
        snprintf(msg, sizeof msg, "%s", pf_error(c.l));
        failed_at = delivered;
        CHECKF(r == PF_ERR_CUDA, "%s #%d: got %d (%s)", cases[i].fn, cases[i].nth, (int)r, msg);
        CHECK_CONTAINS(msg, cases[i].fn);
        CHECK_CONTAINS(msg, "unspecified launch failure");
        CHECKF(failed_at <= cases[i].most, "%s #%d: %d batches delivered first", cases[i].fn, cases[i].nth, failed_at);
        CHECK_EQ(pf_next(c.l, &b), PF_ERR_CUDA); /* sticky */
        CHECK_CONTAINS(pf_error(c.l), cases[i].fn);
        cudaSimClearFaults();
        t_end(&c); /* destroyable, nothing leaked, no races */
        t_load_free(&t);
    }
}

/* pf_next took a batch (counted it delivered) but its stream wait failed,
   so the caller never got it: a token written now would skip that batch
   on resume. pf_checkpoint refuses instead, naming it. */
static void test_no_token_after_a_batch_lost_to_a_cuda_error(void) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_batch b;
    pf_stats st;
    char tok[512] = "x";
    double until = h_now() + 60;
    t_load_init(&t);
    t_begin(&c, h_seed);
    cfg = t_config(&t, 9, 3, 1); /* three batches, three device slots: the stager ends */
    cfg.device_slots = 3;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    for (;;) { /* bounded: everything staged and landed, the stager idle */
        pf_get_stats(c.l, &st);
        if ((st.device_ready == 3 && st.copying_slots == 0) || h_now() > until) break;
        t_sleep_us(1000);
    }
    CHECK_EQ(pf_checkpoint(c.l, tok, sizeof tok), PF_OK); /* at batch 0: fine */
    CHECK_CONTAINS(tok, " batch=0 ");
    /* the consumer's next CUDA call is the stream wait of batch 0 */
    cudaSimFailNth("cudaStreamWaitEvent", 1, cudaErrorLaunchFailure, 0);
    CHECK_EQ(pf_next(c.l, &b), PF_ERR_CUDA);
    CHECK(b.data == NULL);
    CHECK_EQ(pf_checkpoint(c.l, tok, sizeof tok), PF_ERR_CUDA);
    CHECK_EQ(tok[0], 0);
    CHECK_CONTAINS(pf_error(c.l), "epoch 0 batch 0");
    CHECK_CONTAINS(pf_error(c.l), "last token");
    cudaSimClearFaults();
    t_end(&c);
    t_load_free(&t);
}

static void test_every_create_call_can_fail_cleanly(void) {
    static const char *const fns[] = {"cudaGetDeviceCount", "cudaSetDevice", "cudaHostAlloc", "cudaMalloc",
                                      "cudaStreamCreateWithFlags", "cudaEventCreateWithFlags"};
    tload t;
    pf_config cfg;
    t_load_init(&t);
    cfg = t_config(&t, 100, 5, 1);
    cfg.num_workers = 2;
    cfg.device_slots = 3;
    for (size_t f = 0; f < sizeof fns / sizeof fns[0]; f++) {
        int calls;
        pf_loader *l = NULL;
        cudaSimReset(h_seed, 0, 2);
        /* the caller's thread calls cudaSetDevice only on the fallback path */
        if (strcmp(fns[f], "cudaSetDevice") == 0) cudaSimDriverLacks("cuDevicePrimaryCtxRetain");
        CHECK(cudaSetDevice(1) == cudaSuccess); /* the caller on the other GPU: pf_create must switch */
        {
            int before = cudaSimCalls(fns[f]);
            CHECK_EQ(pf_create(&cfg, &l), PF_OK);
            calls = cudaSimCalls(fns[f]) - before; /* made by pf_create itself */
            pf_destroy(l);
        }
        if (strcmp(fns[f], "cudaSetDevice") == 0) calls = 1; /* later ones run on library threads */
        CHECK(calls >= 1);
        for (int n = 1; n <= calls; n++) {
            talloc a;
            cudaError_t err = strstr(fns[f], "Alloc") || strstr(fns[f], "Malloc") ? cudaErrorMemoryAllocation
                                                                                  : cudaErrorUnknown;
            pf_result r;
            cudaSimReset(h_seed, 0, 2);
            if (strcmp(fns[f], "cudaSetDevice") == 0) cudaSimDriverLacks("cuDevicePrimaryCtxRetain");
            CHECK(cudaSetDevice(1) == cudaSuccess);
            t_alloc_init(&a, 0);
            cfg.allocator.alloc_fn = t_alloc;
            cfg.allocator.free_fn = t_free;
            cfg.allocator.user_data = &a;
            cudaSimFailNth(fns[f], n, err, 0);
            l = (pf_loader *)&a;
            r = pf_create(&cfg, &l);
            CHECKF(r == (err == cudaErrorMemoryAllocation ? PF_ERR_NO_MEMORY : PF_ERR_CUDA), "%s #%d: %d (%s)",
                   fns[f], n, (int)r, pf_error(NULL));
            CHECK(l == NULL);
            CHECK_CONTAINS(pf_error(NULL), fns[f]);
            if (err == cudaErrorMemoryAllocation) CHECK_CONTAINS(pf_error(NULL), "bytes");
            CHECK_EQ(a.live, 0);
            CHECK_EQ(cudaSimBytesLive(), 0);
            CHECK_EQ(cudaSimObjectsLive(), 0);
            cfg.allocator.alloc_fn = NULL;
            cfg.allocator.free_fn = NULL;
        }
    }
    cudaSimReset(h_seed, 0, 1);
    t_load_free(&t);
}

/* pf_destroy with a batch held under a 100 ms kernel, the calls named
   failing with err from now on (not a device fault: the context lives).
   Returns with the faults cleared, the kernel's reads checked against
   every free (no simulator violation), the stream synchronised; *kept:
   the warnings that the blocks were left allocated. */
static void d_noop(void *arg) { (void)arg; }
static int d_kept_warnings;
static void d_log(void *user, int level, const char *msg) {
    (void)user;
    if (level == PF_LOG_WARN && strstr(msg, "pf_destroy: could not wait for the GPU") &&
        strstr(msg, "left allocated"))
        __atomic_add_fetch(&d_kept_warnings, 1, __ATOMIC_RELAXED);
}
static void d_destroy_under_a_kernel(tcons *c, tload *t, const char *const *fns, size_t nfns, cudaError_t err,
                                     int *kept) {
    pf_config cfg;
    pf_batch b;
    char msg[768];
    t_load_init(t);
    t_begin(c, h_seed);
    cfg = t_config(t, 100, 4, 1);
    cfg.log = d_log;
    __atomic_store_n(&d_kept_warnings, 0, __ATOMIC_RELAXED);
    CHECK_EQ(t_create(c, &cfg), PF_OK);
    CHECK_EQ(pf_next(c->l, &b), PF_OK);
    CHECK(cudaSimLaunchKernelFor(c->stream, 100000, d_noop, NULL, b.data, b.bytes) == cudaSuccess);
    for (size_t i = 0; i < nfns; i++) cudaSimFailNth(fns[i], 1, err, 1); /* this call and every later one */
    pf_destroy(c->l);
    c->l = NULL;
    cudaSimClearFaults();
    CHECK(cudaStreamSynchronize(c->stream) == cudaSuccess); /* the kernel ends: then nothing reads them */
    CHECKF(cudaSimViolations(msg, sizeof msg) == 0, "%s", msg);
    *kept = __atomic_load_n(&d_kept_warnings, __ATOMIC_RELAXED);
}

/* every cudaEventSynchronize failing: it waits for the caller's stream
   another way before the device block goes (an outside trial: cudaFree
   raced the kernel's reads) */
static void test_destroy_waits_when_event_sync_fails(void) {
    static const char *const fns[] = {"cudaEventSynchronize"};
    tload t;
    tcons c;
    int kept;
    d_destroy_under_a_kernel(&c, &t, fns, 1, cudaErrorInvalidResourceHandle, &kept);
    CHECK_EQ(kept, 0);
    t_end(&c); /* and everything was freed */
    t_load_free(&t);
}

/* every wait failing: the blocks stay allocated, said in a warning,
   rather than freed under the kernel (an outside trial: cudaEventRecord,
   cudaStreamSynchronize and cudaDeviceSynchronize all failing, and
   cudaFree raced it) */
static void test_destroy_keeps_the_blocks_when_no_wait_succeeds(void) {
    static const char *const fns[] = {"cudaEventRecord", "cudaStreamSynchronize", "cudaDeviceSynchronize"};
    tload t;
    tcons c;
    int kept;
    d_destroy_under_a_kernel(&c, &t, fns, 3, cudaErrorUnknown, &kept);
    CHECK_EQ(kept, 1);
    CHECK(cudaSimBytesLive() > 0); /* kept */
    CHECK(cudaStreamDestroy(c.stream) == cudaSuccess);
    cudaSimReset(h_seed, 0, 1); /* drops what was kept */
    pthread_mutex_destroy(&c.mu);
    t_load_free(&t);
}

/* Any one cudaSetDevice of a run failing, a worker's included (a load
   that calls CUDA would run on another GPU; it was a warning, and the run
   went on), ends in PF_ERR_CUDA naming the call: from pf_create when it
   is the caller's thread's, else from pf_next; never a silent run. */
static void test_a_thread_that_cannot_set_its_device_stops_the_run(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    int base, total;
    t_load_init(&t);
    t_begin(&c, h_seed);
    base = cudaSimCalls("cudaSetDevice");
    cfg = t_config(&t, 100, 5, 1);
    cfg.num_workers = 2;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    pf_destroy(c.l); /* joins every thread: each has made its call (a loaded box may start one late) */
    c.l = NULL;
    total = cudaSimCalls("cudaSetDevice") - base; /* pf_create's, 2 workers', the stager's, the retirer's */
    t_end(&c);
    CHECK(total >= 4);
    for (int n = 1; n <= total; n++) {
        pf_result cr;
        t_begin(&c, h_seed);
        cudaSimFailNth("cudaSetDevice", n, cudaErrorUnknown, 0); /* the n-th from now */
        cfg.stream = NULL;
        cr = t_create(&c, &cfg);
        if (cr != PF_OK) {
            CHECKF(cr == PF_ERR_CUDA, "call %d: pf_create %d", n, (int)cr);
            CHECK_CONTAINS(pf_error(NULL), "cudaSetDevice");
            c.l = NULL;
        } else {
            int failed = 0;
            /* the failing thread may start after the run's last batch on a
               loaded box: wait (bounded) for its verdict, then drain */
            for (int ms = 0; ms < 10000 && !failed; ms++) {
                pf__lock(&c.l->sync.mu);
                failed = c.l->error.code != 0;
                pf__unlock(&c.l->sync.mu);
                if (!failed) t_sleep_us(1000);
            }
            CHECKF(failed, "call %d: no error 10 s after it failed", n);
            t_run_init(&r);
            CHECKF(t_drain(&c, &r, 100000) == PF_ERR_CUDA, "call %d: the run went on (%u batches)", n,
                   (unsigned)r.n);
            CHECK_CONTAINS(pf_error(c.l), "cudaSetDevice");
            t_run_free(&r);
        }
        cudaSimClearFaults();
        t_end(&c);
    }
    t_load_free(&t);
}

/* ---- the loader over many seeds and shapes ---- */

static void test_many_seeds_no_race_no_wrong_batch(void) {
    for (unsigned long long seed = 1; seed <= 24; seed++) {
        tload t;
        tcons c;
        trun r;
        pf_config cfg;
        h_rng_state = h_seed * 7919 + seed;
        t_load_init(&t);
        t.max_delay_us = (unsigned)(h_rand() % 200);
        t_sim_delay_us = (unsigned)(h_rand() % 150);
        t_begin(&c, h_seed * 100 + seed);
        cfg = t_config(&t, 20 + h_rand() % 200, 1 + (uint32_t)(h_rand() % 9), 1 + (uint32_t)(h_rand() % 3));
        cfg.num_workers = 1 + (uint32_t)(h_rand() % 5);
        cfg.host_slots = 1 + (uint32_t)(h_rand() % 6);
        cfg.device_slots = 1 + (uint32_t)(h_rand() % 4);
        cfg.shuffle = h_rand() % 2;
        cfg.unordered = h_rand() % 2;
        cfg.drop_last = h_rand() % 2;
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
        t_run_init(&r);
        CHECK_EQ(t_drain(&c, &r, 100000), PF_END_OF_DATA);
        t_end(&c);
        CHECK_EQ((size_t)c.checked, r.n);
        t_run_free(&r);
        t_load_free(&t);
    }
    t_sim_delay_us = 40;
}

/* ---- one loader per GPU in one process ---- */

typedef struct gpu_run {
    int device;
    tcons c;
    tload t;
    int batches;
    pf_result last;
} gpu_run;

static void *drive_gpu(void *arg) { /* a training thread per GPU */
    gpu_run *g = (gpu_run *)arg;
    pf_config cfg;
    CHECK(cudaSetDevice(g->device) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&g->c.stream, cudaStreamNonBlocking) == cudaSuccess);
    cfg = t_config(&g->t, 300, 5, 2);
    cfg.cuda_device = g->device;
    cfg.shuffle = true;
    cfg.stream = g->c.stream;
    CHECK_EQ(pf_create(&cfg, &g->c.l), PF_OK);
    for (;;) {
        pf_batch b;
        pf_result r = t_next(&g->c, &b);
        if (r == PF_END_OF_EPOCH) continue;
        g->last = r;
        if (r != PF_OK) break;
        g->batches++;
        t_release(&g->c, &b);
    }
    pf_destroy(g->c.l);
    CHECK(cudaStreamSynchronize(g->c.stream) == cudaSuccess);
    CHECK(cudaStreamDestroy(g->c.stream) == cudaSuccess);
    return NULL;
}

static void test_one_loader_per_gpu_in_one_process(void) {
    gpu_run g[2];
    pthread_t th[2];
    char msg[768];
    cudaSimReset(h_seed, 30, 2);
    cudaSimForbidLegacyStream(1);
    for (int d = 0; d < 2; d++) {
        memset(&g[d], 0, sizeof g[d]);
        g[d].device = d;
        t_load_init(&g[d].t);
        t_cons_init(&g[d].c);
        g[d].t.max_delay_us = 100;
        pthread_create(&th[d], NULL, drive_gpu, &g[d]);
    }
    for (int d = 0; d < 2; d++) pthread_join(th[d], NULL);
    for (int d = 0; d < 2; d++) {
        CHECK_EQ(g[d].last, PF_END_OF_DATA);
        CHECK_EQ(g[d].batches, 120);
        CHECK_EQ(g[d].c.checked, 120); /* every batch checked on its own GPU's stream */
        CHECK_EQ(g[d].c.bad, 0);
        t_load_free(&g[d].t);
    }
    /* any call on the wrong device, any race between the loaders: a violation */
    CHECKF(cudaSimViolations(msg, sizeof msg) == 0, "%s", msg);
    CHECK_EQ(cudaSimObjectsLive(), 0);
    CHECK_EQ(cudaSimBytesLive(), 0);
}

static const h_test tests[] = {
    {"rig_flags_consume_without_copy_wait", test_rig_flags_consume_without_copy_wait},
    {"batch_wait_after_a_later_load_failed", test_batch_wait_after_a_later_load_failed},
    {"rig_flags_copy_before_release", test_rig_flags_copy_before_release},
    {"rig_flags_refill_during_dma", test_rig_flags_refill_during_dma},
    {"rig_flags_pageable_source", test_rig_flags_pageable_source},
    {"rig_sticky_fault", test_rig_sticky_fault},
    {"rig_sync_in_progress_answers_a_fault", test_rig_sync_in_progress_answers_a_fault},
    {"rig_primary_contexts", test_rig_primary_contexts},
    {"rig_free_without_sync_is_flagged", test_rig_free_without_sync_is_flagged},
    {"rig_stream_destroy_with_queued_work", test_rig_stream_destroy_with_queued_host_function},
    {"rig_device_synchronize_after_stream_destroy", test_rig_device_synchronize_after_stream_destroy},
    {"rig_exclusive_process_device", test_rig_exclusive_process_device},
    {"rig_timing_model_one_copy_engine", test_rig_timing_model_one_copy_engine},
    {"rig_timing_only_model", test_rig_timing_only_model},
    {"mutants_are_caught", test_mutants_are_caught},
    {"fault_with_the_ring_full", test_fault_with_the_ring_full_reaches_pf_next},
    {"fault_while_input_bound", test_fault_while_input_bound_reaches_pf_next},
    {"fault_with_a_batch_held_and_during_release", test_fault_with_a_batch_held_and_during_release},
    {"messages_name_the_call_that_failed", test_messages_name_the_call_that_failed},
    {"next_racing_a_release_is_not_invalid_state", test_next_racing_a_release_is_not_invalid_state},
    {"torchrun_rank_no_context_on_device_0", test_torchrun_rank_creates_no_context_on_device_0},
    {"caller_state_kept_after_every_call", test_caller_state_kept_after_every_call},
    {"caller_pending_error_kept", test_caller_pending_error_kept},
    {"caller_state_kept_with_an_old_driver", test_caller_state_kept_with_an_old_driver},
    {"load_runs_on_the_loaders_device", test_load_runs_on_the_loaders_device},
    {"batch_wait_after_the_slot_was_reused", test_batch_wait_after_the_slot_was_reused},
    {"exclusive_process_device_falls_back", test_exclusive_process_device_falls_back_to_host},
    {"verdict_right_in_three_modelled_regimes", test_verdict_right_in_three_modelled_regimes},
    {"verdict_on_a_gpu_that_serialises_streams", test_verdict_on_a_gpu_that_serialises_streams},
    {"no_device", test_no_device},
    {"default_backend_never_silently_host", test_default_backend_never_silently_host},
    {"get_backend_on_a_gpu", test_get_backend_on_a_gpu},
    {"device_out_of_range", test_device_out_of_range},
    {"second_device_and_caller_device_kept", test_second_device_and_caller_device_kept},
    {"one_loader_per_gpu_in_one_process", test_one_loader_per_gpu_in_one_process},
    {"legacy_default_stream_when_stream_is_null", test_legacy_default_stream_when_stream_is_null},
    {"memory_exact_and_flags", test_memory_exact_and_flags},
    {"pf_next_never_waits_on_the_host", test_pf_next_never_waits_for_the_copy_on_the_host},
    {"batch_wait_lands_the_copy", test_batch_wait_lands_the_copy_for_the_host},
    {"landed_batch_gets_no_marks", test_landed_batch_gets_no_marks},
    {"runtime_cuda_failures_surface", test_runtime_cuda_failures_surface_from_pf_next},
    {"no_token_after_a_lost_batch", test_no_token_after_a_batch_lost_to_a_cuda_error},
    {"every_create_call_can_fail_cleanly", test_every_create_call_can_fail_cleanly},
    {"a_stream_of_another_device_is_named", test_a_stream_of_another_device_is_named},
    {"destroy_waits_when_event_sync_fails", test_destroy_waits_when_event_sync_fails},
    {"destroy_keeps_the_blocks_when_no_wait_succeeds", test_destroy_keeps_the_blocks_when_no_wait_succeeds},
    {"a_thread_that_cannot_set_its_device_stops_the_run", test_a_thread_that_cannot_set_its_device_stops_the_run},
    {"many_seeds_no_race_no_wrong_batch", test_many_seeds_no_race_no_wrong_batch},
};

int main(int argc, char **argv) {
    return h_main(argc, argv, "CUDA backend suite (simulated runtime)", tests, sizeof tests / sizeof tests[0]);
}
