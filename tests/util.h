/* util.h - what the loader tests share: a load callback that writes a
   verifiable pattern (and can fail, oversize, sleep or block on a gate), a
   consumer that checks every batch where it is read (the host backend: in
   place; the simulated CUDA backend: in a kernel stand-in on the consumer
   stream, when the stream runs it), a recorder, and a counting allocator.
   Build with -DTEST_SIM (and -Itests/sim) for the simulated CUDA runtime.
   Valid C11 and C++17. */
#ifndef PF_TEST_UTIL_H
#define PF_TEST_UTIL_H

#include "harness.h"
#ifdef TEST_SIM
#include <cuda_runtime_api.h>
#endif

/* helpers a given suite may not use */
#define T_FN static __attribute__((unused))

#define T_MAGIC 0x5eed5eed00000000ull
#define T_HEADER 4 /* words before the indices */
#define T_WAIT_MS 60000u /* every pf_next in the tests is bounded by this */

T_FN size_t t_batch_bytes(uint32_t bs) { return (T_HEADER + (size_t)bs) * 8; }
T_FN uint64_t t_word(uint64_t index) { return index * 2654435761ull + 7; }

/* ---- load callback ---- */
typedef struct tload {
    unsigned max_delay_us;          /* sleep 0..max per batch, from job->rng */
    unsigned slow_every;            /* if set: 1 batch in this many sleeps max_delay_us, the rest none */
    long long fail_epoch, fail_batch; /* -1: none */
    int fail_silent;                /* fail without pf_job_fail             */
    int fail_empty;                 /* pf_job_fail with an empty message    */
    int fail_said_ok;               /* pf_job_fail, then return 0           */
    long long big_epoch, big_batch; /* set bytes = capacity + 1             */
    long long gate_epoch, gate_batch; /* block here until t_gate_open       */
    int gate_open, gate_entered;
    int gate_on_start;              /* on_worker_start blocks on the gate   */
    int loads, cancelled_seen;
    int worker_starts[64];
    uint64_t sizes[64];             /* num_samples_fn answers, by epoch     */
    int size_calls[64];
    pthread_mutex_t mu;
    pthread_cond_t cv;
} tload;

T_FN void t_load_init(tload *t) {
    memset(t, 0, sizeof *t);
    t->fail_epoch = t->fail_batch = -1;
    t->big_epoch = t->big_batch = -1;
    t->gate_epoch = t->gate_batch = -1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
}
T_FN void t_load_free(tload *t) {
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
}

T_FN void t_sleep_us(unsigned us) {
    struct timespec ts;
    ts.tv_sec = us / 1000000u;
    ts.tv_nsec = (long)(us % 1000000u) * 1000L;
    nanosleep(&ts, NULL);
}

/* Loads that need pf_next to load: a worker's (hold set) waits, at most
   max_ms, until pf_next has loaded 3 batches (or samples) on the caller's
   thread; each of pf_next's counts one. 1 on the caller's thread. */
typedef struct t_caller_gate {
    pthread_t caller;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned by_caller, timed_out, max_ms;
} t_caller_gate;
T_FN void t_caller_gate_init(t_caller_gate *g, unsigned max_ms) {
    memset(g, 0, sizeof *g);
    g->caller = pthread_self();
    g->max_ms = max_ms;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
}
T_FN void t_caller_gate_free(t_caller_gate *g) {
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}
T_FN int t_caller_gate_pass(t_caller_gate *g, bool hold) {
    int mine = pthread_equal(pthread_self(), g->caller) ? 1 : 0;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)(g->max_ms % 1000u) * 1000000L;
    until.tv_sec += g->max_ms / 1000u + until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&g->mu);
    if (mine) g->by_caller++, pthread_cond_broadcast(&g->cv);
    while (!mine && hold && g->by_caller < 3)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &until) != 0) {
            g->timed_out++;
            break;
        }
    pthread_mutex_unlock(&g->mu);
    return mine;
}

/* Wait (bounded) until the gate opens or the job is cancelled. */
T_FN void t_gate_wait(tload *t, const pf_job *job) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    pthread_mutex_lock(&t->mu);
    t->gate_entered++;
    pthread_cond_broadcast(&t->cv);
    while (!t->gate_open && !(job && pf_job_cancelled(job))) {
        struct timespec step;
        clock_gettime(CLOCK_REALTIME, &step);
        step.tv_nsec += 2000000; /* re-check cancellation every 2 ms */
        if (step.tv_nsec >= 1000000000L) {
            step.tv_sec++;
            step.tv_nsec -= 1000000000L;
        }
        if (step.tv_sec > dl.tv_sec || (step.tv_sec == dl.tv_sec && step.tv_nsec > dl.tv_nsec)) break;
        pthread_cond_timedwait(&t->cv, &t->mu, &step);
    }
    if (job && pf_job_cancelled(job)) t->cancelled_seen++;
    pthread_mutex_unlock(&t->mu);
}

T_FN void t_gate_open(tload *t) {
    pthread_mutex_lock(&t->mu);
    t->gate_open = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* Bounded wait until `n` loads sit at the gate. */
T_FN int t_gate_wait_entered(tload *t, int n) {
    struct timespec dl;
    int ok;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    pthread_mutex_lock(&t->mu);
    while (t->gate_entered < n)
        if (pthread_cond_timedwait(&t->cv, &t->mu, &dl) != 0) break;
    ok = t->gate_entered >= n;
    pthread_mutex_unlock(&t->mu);
    return ok;
}

T_FN int t_load(void *user, pf_job *job) {
    tload *t = (tload *)user;
    uint64_t *w = (uint64_t *)job->host;
    size_t bytes = t_batch_bytes(job->count);
    pthread_mutex_lock(&t->mu);
    t->loads++;
    pthread_mutex_unlock(&t->mu);
    if ((long long)job->epoch == t->gate_epoch && (long long)job->batch == t->gate_batch) t_gate_wait(t, job);
    if (t->slow_every && job->rng % t->slow_every == 0) t_sleep_us(t->max_delay_us);
    else if (t->max_delay_us && !t->slow_every) t_sleep_us((unsigned)(job->rng % (t->max_delay_us + 1u)));
    if ((long long)job->epoch == t->fail_epoch && (long long)job->batch == t->fail_batch) {
        if (t->fail_silent) return 7;
        if (t->fail_empty) return pf_job_fail(job, "%s", "");
        if (t->fail_said_ok) {
            (void)pf_job_fail(job, "synthetic failure reading shard %d", 42);
            (void)pf_job_fail(job, "a later consequence"); /* the first reason stands */
            return 0;
        }
        return pf_job_fail(job, "synthetic failure reading shard %d", 42);
    }
#ifdef TEST_SIM
    cudaSimHostWrite(job->host, bytes);
#endif
    w[0] = T_MAGIC ^ job->epoch;
    w[1] = job->batch;
    w[2] = job->count;
    w[3] = job->rng;
    for (uint32_t i = 0; i < job->count; i++) w[T_HEADER + i] = t_word(job->indices[i]);
    job->bytes = bytes;
    if ((long long)job->epoch == t->big_epoch && (long long)job->batch == t->big_batch)
        job->bytes = job->capacity + 1;
    return 0;
}

T_FN uint64_t t_num_samples(void *user, uint64_t epoch) {
    tload *t = (tload *)user;
    uint64_t n;
    pthread_mutex_lock(&t->mu);
    t->size_calls[epoch % 64]++;
    n = t->sizes[epoch % 64];
    pthread_mutex_unlock(&t->mu);
    return n;
}

T_FN void t_worker_start(void *user, uint32_t worker) {
    tload *t = (tload *)user;
    pthread_mutex_lock(&t->mu);
    t->worker_starts[worker % 64]++;
    pthread_mutex_unlock(&t->mu);
    if (t->gate_on_start) t_gate_wait(t, NULL);
}

/* ---- counting allocator: finds leaks, fails the nth allocation ---- */
typedef struct talloc {
    pthread_mutex_t mu;
    long live, total, fail_at; /* fail_at: 1-based, 0 never */
    size_t bytes, peak;
} talloc;

T_FN void *t_alloc(size_t size, void *user) {
    talloc *a = (talloc *)user;
    unsigned char *p;
    pthread_mutex_lock(&a->mu);
    a->total++;
    if (a->fail_at && a->total == a->fail_at) {
        pthread_mutex_unlock(&a->mu);
        return NULL;
    }
    pthread_mutex_unlock(&a->mu);
    p = (unsigned char *)malloc(size + 16);
    if (!p) return NULL;
    memcpy(p, &size, sizeof size);
    pthread_mutex_lock(&a->mu);
    a->live++;
    a->bytes += size;
    if (a->bytes > a->peak) a->peak = a->bytes;
    pthread_mutex_unlock(&a->mu);
#ifdef TEST_SIM
    cudaSimHostAllocated(p + 16, size);
#endif
    return p + 16;
}

T_FN void t_free(void *ptr, void *user) {
    talloc *a = (talloc *)user;
    size_t size;
    unsigned char *p = (unsigned char *)ptr - 16;
    memcpy(&size, p, sizeof size);
#ifdef TEST_SIM
    cudaSimHostFreed(ptr, size); /* a host function still queued must not touch it */
#endif
    pthread_mutex_lock(&a->mu);
    a->live--;
    a->bytes -= size;
    pthread_mutex_unlock(&a->mu);
    free(p);
}

T_FN void t_alloc_init(talloc *a, long fail_at) {
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->mu, NULL);
    a->fail_at = fail_at;
}

/* ---- consumer ---- */
typedef struct tcons {
    pf_loader *l;
    pthread_mutex_t mu;
    int bad, checked;
    char bad_msg[512];
    int on_host; /* batches are host memory (the host backend, or a fallback) */
#ifdef TEST_SIM
    cudaStream_t stream;
#endif
} tcons;

T_FN void t_bad(tcons *c, const char *fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&c->mu);
    c->bad++;
    va_start(ap, fmt);
    vsnprintf(c->bad_msg, sizeof c->bad_msg, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&c->mu);
}

/* What a batch must contain, from its metadata. */
T_FN void t_verify(tcons *c, const uint64_t *w, size_t bytes, uint64_t epoch, uint64_t batch, uint32_t count,
                     uint64_t rng, const uint64_t *indices) {
    if (bytes != t_batch_bytes(count)) {
        t_bad(c, "epoch %llu batch %llu: %zu bytes, expected %zu", (unsigned long long)epoch,
              (unsigned long long)batch, bytes, t_batch_bytes(count));
        return;
    }
    if (w[0] != (T_MAGIC ^ epoch) || w[1] != batch || w[2] != count || w[3] != rng) {
        t_bad(c, "epoch %llu batch %llu: header holds epoch %llx batch %llu count %llu", (unsigned long long)epoch,
              (unsigned long long)batch, (unsigned long long)(w[0] ^ T_MAGIC), (unsigned long long)w[1],
              (unsigned long long)w[2]);
        return;
    }
    for (uint32_t i = 0; i < count; i++)
        if (w[T_HEADER + i] != t_word(indices[i])) {
            t_bad(c, "epoch %llu batch %llu: sample %u is wrong", (unsigned long long)epoch,
                  (unsigned long long)batch, i);
            return;
        }
    pthread_mutex_lock(&c->mu);
    c->checked++;
    pthread_mutex_unlock(&c->mu);
}

#ifdef TEST_SIM
typedef struct tcheck {
    tcons *c;
    const uint64_t *data;
    size_t bytes;
    uint64_t epoch, batch, rng;
    uint32_t count;
    uint64_t indices[1];
} tcheck;

/* Runs when the consumer stream reaches it: where a GPU kernel would read. */
T_FN void t_kernel(void *arg) {
    tcheck *k = (tcheck *)arg;
    t_verify(k->c, k->data, k->bytes, k->epoch, k->batch, k->count, k->rng, k->indices);
    free(k);
}
#endif

T_FN void t_cons_init(tcons *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
}

/* The tests' config with no load set: n samples in batches of bs, each slot
   batch_bytes; the CUDA backend under TEST_SIM, else the host backend. */
T_FN pf_config t_config_base(uint64_t n, uint32_t bs, size_t batch_bytes, uint32_t epochs) {
    pf_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.num_samples = n;
    cfg.batch_size = bs;
    cfg.batch_bytes = batch_bytes;
    cfg.epochs = epochs;
    cfg.num_workers = 3;
    cfg.timeout_ms = T_WAIT_MS;
#ifdef TEST_SIM
    cfg.backend = PF_BACKEND_CUDA;
#else
    cfg.backend = PF_BACKEND_HOST;
#endif
    return cfg;
}

/* ...with t_load writing the pattern t_verify checks */
T_FN pf_config t_config(tload *t, uint64_t n, uint32_t bs, uint32_t epochs) {
    pf_config cfg = t_config_base(n, bs, t_batch_bytes(bs), epochs);
    cfg.load = t_load;
    cfg.user = t;
    cfg.poison = true; /* a test that reads past job->bytes fails on the host backend too */
    return cfg;
}

/* The consumer's view of slots: device slots on CUDA, host slots on host. */
T_FN uint32_t t_consumer_slots(const pf_config *cfg) {
    pf_config d = pf_config_defaults(cfg);
#ifdef TEST_SIM
    return d.device_slots;
#else
    return d.host_slots;
#endif
}

#ifdef TEST_SIM
static unsigned t_sim_delay_us = 40;
#endif

/* Per test: a fresh simulated runtime and a named consumer stream;
   timing_only: the simulator's benchmark mode (no stream threads). */
T_FN void t_begin_mode(tcons *c, unsigned long long seed, int timing_only) {
    t_cons_init(c);
#ifdef TEST_SIM
    cudaSimReset(seed, t_sim_delay_us, 2);
    if (timing_only) cudaSimTimingOnly(1);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) == cudaSuccess);
    cudaSimNameStream(c->stream, "the consumer stream");
    cudaSimForbidLegacyStream(1);
#else
    (void)seed, (void)timing_only;
#endif
}

T_FN void t_begin(tcons *c, unsigned long long seed) { t_begin_mode(c, seed, 0); }

T_FN pf_result t_create(tcons *c, pf_config *cfg) {
#ifdef TEST_SIM
    if (!cfg->stream) cfg->stream = c->stream;
#endif
    return pf_create(cfg, &c->l);
}

T_FN pf_result t_next(tcons *c, pf_batch *b) {
    pf_result r = pf_next(c->l, b);
    if (r != PF_OK) return r;
#ifdef TEST_SIM
    if (!c->on_host) {
        tcheck *k = (tcheck *)malloc(sizeof(tcheck) + b->count * sizeof(uint64_t));
        k->c = c;
        k->data = (const uint64_t *)b->data;
        k->bytes = b->bytes;
        k->epoch = b->epoch;
        k->batch = b->batch;
        k->rng = b->rng;
        k->count = b->count;
        memcpy(k->indices, b->indices, b->count * sizeof(uint64_t));
        CHECK(cudaSimLaunchKernel(c->stream, t_kernel, k, b->data, b->bytes) == cudaSuccess);
        return r;
    }
#endif
    t_verify(c, (const uint64_t *)b->data, b->bytes, b->epoch, b->batch, b->count, b->rng, b->indices);
    return r;
}

T_FN void t_release(tcons *c, pf_batch *b) { CHECK_EQ(pf_release(c->l, b), PF_OK); }

/* batches 0 .. n-1 from pf_next, in order, each released at once */
T_FN void t_take_in_order(pf_loader *l, uint64_t n) {
    for (uint64_t k = 0; k < n; k++) {
        pf_batch b;
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(b.batch, k);
        CHECK_EQ(pf_release(l, &b), PF_OK);
    }
}

/* pf_next's batch k, in order, whose first word the load set to k: its
   words (NULL where pf_next failed) */
T_FN const uint64_t *t_next_k(pf_loader *l, pf_batch *b, uint64_t k) {
    const uint64_t *w;
    CHECK_EQ(pf_next(l, b), PF_OK);
    w = (const uint64_t *)b->data;
    CHECK_EQ(b->batch, k);
    if (w) CHECK_EQ(w[0], k);
    return w;
}

/* Destroy, let the GPU stand-in finish, and check that nothing was wrong,
   raced or leaked. */
T_FN void t_end(tcons *c) {
    pf_destroy(c->l);
    c->l = NULL;
#ifdef TEST_SIM
    {
        char msg[768];
        CHECK(cudaStreamSynchronize(c->stream) == cudaSuccess);
        CHECK(cudaStreamDestroy(c->stream) == cudaSuccess);
        CHECKF(cudaSimViolations(msg, sizeof msg) == 0, "%s", msg);
        CHECK_EQ(cudaSimBytesLive(), 0);
        CHECK_EQ(cudaSimObjectsLive(), 0);
    }
#endif
    CHECKF(c->bad == 0, "%d bad batches, last: %s", c->bad, c->bad_msg);
    pthread_mutex_destroy(&c->mu);
}

/* ---- recorder ---- */
typedef struct trec {
    uint64_t epoch, batch, rng;
    uint32_t count;
    uint64_t *idx;
} trec;

typedef struct trun {
    trec *v;
    size_t n, cap;
    uint64_t eoe;        /* PF_END_OF_EPOCH seen           */
    uint64_t eoe_at[64]; /* batches delivered at each one  */
    int eod;
    pf_result last;
    char msg[512];
} trun;

T_FN void t_run_init(trun *r) { memset(r, 0, sizeof *r); }
T_FN void t_run_free(trun *r) {
    for (size_t i = 0; i < r->n; i++) free(r->v[i].idx);
    free(r->v);
    memset(r, 0, sizeof *r);
}

T_FN void t_record(trun *r, const pf_batch *b) {
    trec *e;
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->v = (trec *)realloc(r->v, r->cap * sizeof(trec));
    }
    e = &r->v[r->n++];
    e->epoch = b->epoch;
    e->batch = b->batch;
    e->rng = b->rng;
    e->count = b->count;
    e->idx = (uint64_t *)malloc((b->count ? b->count : 1) * sizeof(uint64_t));
    memcpy(e->idx, b->indices, b->count * sizeof(uint64_t));
}

/* Consume until END_OF_DATA, an error, or `max` batches. */
T_FN pf_result t_drain(tcons *c, trun *r, size_t max) {
    for (;;) {
        pf_batch b;
        pf_result x;
        if (r->n >= max) return PF_OK;
        x = t_next(c, &b);
        r->last = x;
        if (x == PF_OK) {
            t_record(r, &b);
            t_release(c, &b);
        } else if (x == PF_END_OF_EPOCH) {
            r->eoe_at[r->eoe % 64] = r->n;
            r->eoe++;
        } else {
            if (x == PF_END_OF_DATA) r->eod = 1;
            snprintf(r->msg, sizeof r->msg, "%s", pf_error(c->l));
            return x;
        }
    }
}

/* The usual test's setup and teardown: a load callback, a consumer (a fresh
   simulated runtime under TEST_SIM), a recorder. */
T_FN void t_open(tload *t, tcons *c, trun *r) {
    t_load_init(t);
    t_begin(c, h_seed);
    t_run_init(r);
}
T_FN void t_close(tload *t, tcons *c, trun *r) {
    t_end(c);
    t_run_free(r);
    t_load_free(t);
}

T_FN int t_cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

#endif
