/* test_data.c - your data without a hand-written load: per-worker state
   (worker_init/worker_stop on the worker's own thread, one stop per init),
   packed batches of different-sized samples (offsets, only the bytes used
   are copied), bad samples skipped, marked or stopping the run past a
   limit (deterministic), and the readers (records, token shards, tar).
   Host backend; with -DTEST_SIM the CUDA backend on the simulated runtime,
   where batches are read in a kernel stand-in on the consumer stream.
   Valid C11 and C++17. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#define PREFETCH_IMPLEMENTATION
#include <errno.h>
#include <fcntl.h>
#include <string.h>
/* the readers' open: a path with "nodirect" in it stands for a file on a
   file system that refuses O_DIRECT (EINVAL), as tmpfs did before Linux 6.6 */
static int rd_open(const char *path, int flags);
#define PF__OPEN(path, flags) rd_open((path), (flags))
/* pf_next loads by default when loads are cheap (under 50 us): here,
   whatever a sanitizer makes them cost, so that no timing decides it */
#define PF__HELP_MAX_NS 10000000000u
#include "../prefetch.h"
#include "util.h"
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- reading a batch where a kernel would (sim) or in place (host) ---- */
typedef struct dsnap {
    void (*fn)(const struct dsnap *d);
    void *user;
    const unsigned char *data;
    size_t bytes;
    uint64_t epoch, batch;
    uint32_t count, skipped;
    bool packed;
    uint64_t *offsets, *indices, *skipped_indices; /* copies: the batch's go at release */
} dsnap;

static void d_run(void *arg) {
    dsnap *d = (dsnap *)arg;
    d->fn(d);
    free(d->offsets);
    free(d->indices);
    free(d->skipped_indices);
    free(d);
}

#ifdef TEST_SIM
/* A packed batch's device offsets, read where a kernel would: they must be
   its host offsets (and the rig checks the read is ordered after their copy) */
typedef struct doffs {
    const uint64_t *dev;
    uint32_t count;
    uint64_t want[1];
} doffs;
static int d_offsets_read; /* kernels that read them: atomic */
static void d_offsets_check(void *arg) {
    doffs *o = (doffs *)arg;
    for (uint32_t i = 0; i <= o->count; i++)
        if (o->dev[i] != o->want[i]) {
            CHECKF(0, "device offsets[%u] = %llu, host %llu", i, (unsigned long long)o->dev[i],
                   (unsigned long long)o->want[i]);
            break;
        }
    __atomic_fetch_add(&d_offsets_read, 1, __ATOMIC_RELAXED);
    free(o);
}
#endif

static void d_read(tcons *c, const pf_batch *b, void (*fn)(const dsnap *), void *user) {
    dsnap *d = (dsnap *)calloc(1, sizeof *d);
    d->fn = fn;
    d->user = user;
    d->data = (const unsigned char *)b->data;
    d->bytes = b->bytes;
    d->epoch = b->epoch;
    d->batch = b->batch;
    d->count = b->count;
    d->skipped = b->skipped;
    d->packed = b->offsets != NULL;
    d->offsets = (uint64_t *)malloc((b->count + 1) * sizeof(uint64_t));
    d->indices = (uint64_t *)malloc((b->count + 1) * sizeof(uint64_t));
    d->skipped_indices = (uint64_t *)malloc((b->skipped + 1) * sizeof(uint64_t));
    if (b->offsets) memcpy(d->offsets, b->offsets, (b->count + 1) * sizeof(uint64_t));
    if (b->count) memcpy(d->indices, b->indices, b->count * sizeof(uint64_t));
    if (b->skipped) memcpy(d->skipped_indices, b->skipped_indices, b->skipped * sizeof(uint64_t));
#ifdef TEST_SIM
    if (b->offsets) { /* packed: the device has them too */
        doffs *o = (doffs *)malloc(sizeof(doffs) + b->count * sizeof(uint64_t));
        o->dev = b->dev_offsets;
        o->count = b->count;
        memcpy(o->want, b->offsets, (b->count + 1) * sizeof(uint64_t));
        CHECK(b->dev_offsets != NULL);
        if (b->dev_offsets)
            CHECK(cudaSimLaunchKernel(c->stream, d_offsets_check, o, b->dev_offsets,
                                      (b->count + 1) * sizeof(uint64_t)) == cudaSuccess);
        else
            free(o);
    } else {
        CHECK(b->dev_offsets == NULL);
    }
    CHECK(cudaSimLaunchKernel(c->stream, d_run, d, b->data, b->bytes) == cudaSuccess);
#else
    (void)c;
    CHECK(b->dev_offsets == NULL); /* host memory only: b->offsets */
    d_run(d);
#endif
}

/* Drain the loader, handing each batch to fn. Returns the final result. */
static pf_result d_drain(tcons *c, void (*fn)(const dsnap *), void *user, size_t max) {
    for (size_t i = 0; i < max; i++) {
        pf_batch b;
        pf_result r = pf_next(c->l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r != PF_OK) return r;
        if (fn) d_read(c, &b, fn, user);
        CHECK_EQ(pf_release(c->l, &b), PF_OK);
    }
    return PF_TIMEOUT;
}

/* A whole run on a fresh consumer: the loader from cfg, every batch to fn
   (if set) until PF_END_OF_DATA, then the teardown's checks; st (if set)
   gets the stats before the loader goes. */
static void d_run_all(pf_config *cfg, void (*fn)(const dsnap *), void *user, size_t max, pf_stats *st) {
    tcons t;
    t_begin(&t, h_seed);
    CHECK_EQ(t_create(&t, cfg), PF_OK);
    CHECK_EQ(d_drain(&t, fn, user, max), PF_END_OF_DATA);
    if (st) pf_get_stats(t.l, st);
    t_end(&t);
}

/* ======================= per-worker state ======================= */
typedef struct wstate {
    pthread_t thread;
    uint32_t worker;
    unsigned char *scratch; /* a thread-bound resource: ASan sees a leak */
} wstate;

typedef struct wcount {
    pthread_mutex_t mu;
    int inits, stops, bad, loads;
    uint32_t gate_batch; /* 0: none; else block the load of this batch until cancelled */
} wcount;

static void wc_begin(wcount *wc) {
    memset(wc, 0, sizeof *wc);
    pthread_mutex_init(&wc->mu, NULL);
}
/* every worker that was started was stopped once, on its own thread */
static void wc_end(wcount *wc) {
    CHECK(wc->inits >= 1);
    CHECK_EQ(wc->inits, wc->stops);
    CHECK_EQ(wc->bad, 0);
    pthread_mutex_destroy(&wc->mu);
}

static void *w_init(void *user, uint32_t worker) {
    wcount *wc = (wcount *)user;
    wstate *s = (wstate *)malloc(sizeof *s);
    s->thread = pthread_self();
    s->worker = worker;
    s->scratch = (unsigned char *)malloc(4096);
    pthread_mutex_lock(&wc->mu);
    wc->inits++;
    pthread_mutex_unlock(&wc->mu);
    return s;
}

static void w_stop(void *user, uint32_t worker, void *state) {
    wcount *wc = (wcount *)user;
    wstate *s = (wstate *)state;
    pthread_mutex_lock(&wc->mu);
    wc->stops++;
    if (!s || !pthread_equal(s->thread, pthread_self()) || s->worker != worker) wc->bad++;
    pthread_mutex_unlock(&wc->mu);
    if (s) free(s->scratch);
    free(s);
}

static int w_load(void *user, pf_job *job) {
    wcount *wc = (wcount *)user;
    wstate *s = (wstate *)job->worker_state;
    if (!s || !pthread_equal(s->thread, pthread_self()) || s->worker != job->worker) {
        pthread_mutex_lock(&wc->mu);
        wc->bad++;
        pthread_mutex_unlock(&wc->mu);
    }
    pthread_mutex_lock(&wc->mu);
    wc->loads++;
    pthread_mutex_unlock(&wc->mu);
    if (wc->gate_batch && job->batch == wc->gate_batch)
        while (!pf_job_cancelled(job)) t_sleep_us(200); /* released by pf_destroy only */
    memset(job->host, (int)(job->batch & 0xff), job->capacity);
    return 0;
}

static void run_worker_state(bool autotune, bool destroy_early, uint32_t workers) {
    tcons c;
    wcount wc;
    pf_config cfg = t_config_base(2000, 4, 64, 3);
    wc_begin(&wc);
    cfg.load = w_load;
    cfg.user = &wc;
    cfg.worker_init = w_init;
    cfg.worker_stop = w_stop;
    cfg.num_workers = workers;
    cfg.autotune = autotune;
    if (destroy_early) wc.gate_batch = 3;
    t_begin(&c, h_seed);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    if (destroy_early) {
        pf_batch b;
        CHECK_EQ(pf_next(c.l, &b), PF_OK); /* then destroy with a worker inside load and batches held */
    } else {
        CHECK_EQ(d_drain(&c, NULL, NULL, 100000), PF_END_OF_DATA);
    }
    t_end(&c);
    if (!destroy_early) CHECK(wc.inits <= (int)workers || autotune);
    wc_end(&wc);
}

static void test_worker_state_on_its_own_thread(void) { run_worker_state(false, false, 4); }
static void test_worker_state_stopped_on_destroy(void) { run_worker_state(false, true, 4); }
static void test_worker_state_with_autotune(void) { run_worker_state(true, false, 8); }

/* only a stop hook: it runs once per worker that loaded, with NULL */
static int stops_only;
static void w_stop_only(void *user, uint32_t worker, void *state) {
    (void)user, (void)worker;
    if (state == NULL) __atomic_fetch_add(&stops_only, 1, __ATOMIC_RELAXED);
}
static int w_plain(void *user, pf_job *job) {
    (void)user;
    CHECK(job->worker_state == NULL);
    job->bytes = 0;
    return 0;
}
static void test_worker_stop_without_init(void) {
    pf_config cfg = t_config_base(100, 4, 64, 1);
    cfg.load = w_plain;
    cfg.worker_stop = w_stop_only;
    cfg.num_workers = 2;
    stops_only = 0;
    d_run_all(&cfg, NULL, NULL, 1000, NULL);
    CHECK(stops_only >= 1 && stops_only <= 2);
}

/* ======================= packed batches ======================= */
static size_t p_size(uint64_t index) { return (size_t)(index % 13) + 1 + (index % 3 == 0 ? 100 : 0); }
static unsigned char p_byte(uint64_t index, size_t k) { return (unsigned char)(index * 31 + k); }

typedef struct pspec {
    pf_bad_policy policy;
    uint64_t bad_every; /* index % bad_every == bad_at is bad (0: none) */
    uint64_t bad_at;
    bool fixed;         /* write fixed-size samples (FIXED bytes) at i * FIXED, no append */
} pspec;
#define FIXED 16u
#define MARK_BYTE 0xEE

static bool p_bad(const pspec *p, uint64_t index) { return p->bad_every && index % p->bad_every == p->bad_at; }

static int p_load(void *user, pf_job *job) {
    const pspec *p = (const pspec *)user;
    for (uint32_t i = 0; i < job->count; i++) {
        uint64_t x = job->indices[i];
        size_t n = p->fixed ? FIXED : p_size(x);
        unsigned char *dst;
        if (p_bad(p, x)) {
            if (pf_job_skip(job, i, "index %llu is corrupt", (unsigned long long)x) != 0) return -1;
            continue;
        }
        dst = p->fixed ? (unsigned char *)job->host + (size_t)i * FIXED : (unsigned char *)pf_job_append(job, n);
        if (!dst) return -1;
        for (size_t k = 0; k < n; k++) dst[k] = p_byte(x, k);
    }
    if (p->fixed) job->bytes = (size_t)job->count * FIXED;
    return 0;
}

typedef struct ptally {
    const pspec *p;
    pthread_mutex_t mu;
    uint64_t samples, skipped, marked, bytes;
    uint64_t *seen; /* per index */
} ptally;

static void p_check(const dsnap *d) {
    ptally *t = (ptally *)d->user;
    const pspec *p = t->p;
    uint64_t bytes = 0, marked = 0;
    CHECK(d->packed != p->fixed || (p->fixed && d->count == 0));
    for (uint32_t i = 0; i < d->count; i++) {
        uint64_t x = d->indices[i];
        const unsigned char *s;
        size_t n;
        if (p->fixed) {
            s = d->data + (size_t)i * FIXED;
            n = FIXED;
        } else {
            s = d->data + d->offsets[i];
            n = (size_t)(d->offsets[i + 1] - d->offsets[i]);
        }
        if (p_bad(p, x)) {
            CHECKF(p->policy == PF_BAD_MARK, "bad index %llu delivered under policy %d", (unsigned long long)x,
                   (int)p->policy);
            CHECK_EQ(n, p->fixed ? FIXED : 3);
            for (size_t k = 0; k < n; k++) CHECK_EQ(s[k], MARK_BYTE);
            marked++;
        } else {
            CHECK_EQ(n, p->fixed ? FIXED : p_size(x));
            for (size_t k = 0; k < n; k++)
                if (s[k] != p_byte(x, k)) {
                    CHECKF(0, "index %llu byte %zu", (unsigned long long)x, k);
                    break;
                }
        }
        bytes += n;
    }
    if (!p->fixed && d->packed) {
        CHECK_EQ(d->offsets[0], 0);
        CHECK_EQ(d->offsets[d->count], d->bytes);
    }
    for (uint32_t i = 0; i < d->skipped; i++) CHECK(p_bad(p, d->skipped_indices[i]));
    pthread_mutex_lock(&t->mu);
    t->samples += d->count;
    t->skipped += d->skipped;
    t->marked += marked;
    t->bytes += p->fixed ? 0 : bytes;
    for (uint32_t i = 0; i < d->count; i++) t->seen[d->indices[i]]++;
    if (p->policy == PF_BAD_SKIP)
        for (uint32_t i = 0; i < d->skipped; i++) t->seen[d->skipped_indices[i]] += 1000;
    pthread_mutex_unlock(&t->mu);
}

/* One epoch over n samples with spec p: every index once (skipped ones
   listed instead), the contents right; returns the final result. */
/* what p_run's loader logged at PF_LOG_ERROR, from any thread */
static pthread_mutex_t p_log_mu = PTHREAD_MUTEX_INITIALIZER;
static int p_errors;
static char p_error_text[512];
static void p_log(void *user, int level, const char *msg) {
    (void)user;
    if (level != PF_LOG_ERROR) return;
    pthread_mutex_lock(&p_log_mu);
    if (!p_errors++) snprintf(p_error_text, sizeof p_error_text, "%s", msg);
    pthread_mutex_unlock(&p_log_mu);
}
static pf_result p_run(const pspec *p, uint64_t n, uint32_t bs, uint64_t limit, ptally *t, pf_stats *st, char *err,
                       size_t errn) {
    tcons c;
    pf_result r;
    static const unsigned char marker[FIXED] = {MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE,
                                                MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE,
                                                MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE};
    pf_config cfg = t_config_base(n, bs, (size_t)bs * 120, 1);
    cfg.load = p_load;
    cfg.user = (void *)p;
    cfg.shuffle = true;
    cfg.seed = 7;
    cfg.bad_samples = p->policy;
    cfg.bad_limit = limit;
    cfg.bad_marker = marker;
    cfg.bad_marker_bytes = p->fixed ? FIXED : 3;
    cfg.log = p_log;
    pthread_mutex_lock(&p_log_mu);
    p_errors = 0;
    p_error_text[0] = '\0';
    pthread_mutex_unlock(&p_log_mu);
    memset(t, 0, sizeof *t);
    t->p = p;
    pthread_mutex_init(&t->mu, NULL);
    t->seen = (uint64_t *)calloc(n, sizeof(uint64_t));
    t_begin(&c, h_seed);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    r = d_drain(&c, p_check, t, 100000);
    pf_get_stats(c.l, st);
    snprintf(err, errn, "%s", pf_error(c.l));
    t_end(&c);
    pthread_mutex_destroy(&t->mu);
    return r;
}

static void test_packed_variable_sizes(void) {
    pspec p = {PF_BAD_STOP, 0, 0, false};
    ptally t;
    pf_stats st;
    char err[512];
    uint64_t want = 0;
    CHECK_EQ(p_run(&p, 1000, 8, 0, &t, &st, err, sizeof err), PF_END_OF_DATA);
    for (uint64_t i = 0; i < 1000; i++) {
        CHECK_EQ(t.seen[i], 1);
        want += p_size(i);
    }
    CHECK_EQ(t.bytes, want);
    CHECK_EQ(st.bytes, want); /* only the bytes used are delivered... */
#ifdef TEST_SIM
    CHECK_EQ(st.copy_bytes, want); /* ...and copied */
#endif
    free(t.seen);
}

/* CUDA: a packed batch's offsets are on the device too (b.dev_offsets), the
   same as b.offsets, read by a kernel on the consumer stream ordered after
   their copy (t_end: the rig saw no race); NULL when not packed, and on
   the host backend (d_read checks each batch) */
static void test_packed_offsets_on_the_device(void) {
    pspec packed = {PF_BAD_SKIP, 9, 2, false}, fixed = {PF_BAD_STOP, 0, 0, true};
    ptally t;
    pf_stats st;
    char err[512];
#ifdef TEST_SIM
    __atomic_store_n(&d_offsets_read, 0, __ATOMIC_RELAXED);
#endif
    CHECK_EQ(p_run(&packed, 600, 8, 0, &t, &st, err, sizeof err), PF_END_OF_DATA); /* some skipped, some whole */
    CHECK(st.skipped > 0);
#ifdef TEST_SIM
    CHECK_EQ((uint64_t)__atomic_load_n(&d_offsets_read, __ATOMIC_RELAXED), st.batches);
#endif
    free(t.seen);
    CHECK_EQ(p_run(&fixed, 64, 8, 0, &t, &st, err, sizeof err), PF_END_OF_DATA); /* written in place: none */
    free(t.seen);
}

static void test_skip_drops_and_lists_bad_samples(void) {
    pspec p = {PF_BAD_SKIP, 7, 3, false};
    ptally t;
    pf_stats st;
    char err[512];
    uint64_t bad = 0;
    for (uint64_t i = 0; i < 1000; i++) bad += p_bad(&p, i);
    CHECK_EQ(p_run(&p, 1000, 8, 0, &t, &st, err, sizeof err), PF_END_OF_DATA);
    for (uint64_t i = 0; i < 1000; i++) CHECK_EQ(t.seen[i], p_bad(&p, i) ? 1000 : 1);
    CHECK_EQ(t.skipped, bad);
    CHECK_EQ(st.skipped, bad);
    CHECK_EQ(t.samples, 1000 - bad);
    CHECK_EQ(st.samples, 1000 - bad);
    free(t.seen);
}

static void test_skip_every_sample_of_a_fixed_batch(void) {
    pspec p = {PF_BAD_SKIP, 1, 0, true}; /* all bad: empty batches are fine without append */
    ptally t;
    pf_stats st;
    char err[512];
    CHECK_EQ(p_run(&p, 64, 8, 0, &t, &st, err, sizeof err), PF_END_OF_DATA);
    CHECK_EQ(t.samples, 0);
    CHECK_EQ(st.skipped, 64);
    free(t.seen);
}

static void test_mark_packed_and_fixed(void) {
    for (int fixed = 0; fixed < 2; fixed++) {
        pspec p = {PF_BAD_MARK, 5, 1, fixed != 0};
        ptally t;
        pf_stats st;
        char err[512];
        uint64_t bad = 0;
        for (uint64_t i = 0; i < 600; i++) bad += p_bad(&p, i);
        CHECK_EQ(p_run(&p, 600, 8, 0, &t, &st, err, sizeof err), PF_END_OF_DATA);
        for (uint64_t i = 0; i < 600; i++) CHECK_EQ(t.seen[i], 1);
        CHECK_EQ(t.marked, bad);
        CHECK_EQ(t.skipped, bad);
        CHECK_EQ(st.skipped, bad);
        CHECK_EQ(t.samples, 600);
        free(t.seen);
    }
}

/* the limit stops the run at the same batch every time, with a message */
static void test_bad_limit_is_deterministic(void) {
    pspec p = {PF_BAD_SKIP, 11, 4, false};
    uint64_t first_samples = 0;
    for (int run = 0; run < 3; run++) {
        ptally t;
        pf_stats st;
        char err[512];
        CHECK_EQ(p_run(&p, 2000, 8, 20, &t, &st, err, sizeof err), PF_ERR_LOAD);
        CHECK_CONTAINS(err, "cfg.bad_limit (20)");
        CHECK_CONTAINS(err, "is corrupt");
        CHECK(t.skipped <= 20);
        /* the stats count the delivered batches' bad samples, as the token
           does: not the stopping batch's (an outside trial: 6 against 5) */
        CHECK_EQ(st.skipped, t.skipped);
        /* the failure is logged, once, at PF_LOG_ERROR, as a failed load is
           (it was returned, never logged) */
        pthread_mutex_lock(&p_log_mu);
        CHECK_EQ(p_errors, 1);
        CHECK_CONTAINS(p_error_text, "more than cfg.bad_limit (20)");
        pthread_mutex_unlock(&p_log_mu);
        if (run == 0) first_samples = t.samples;
        CHECK_EQ(t.samples, first_samples);
        free(t.seen);
    }
}

static void test_default_policy_stops_naming_the_sample(void) {
    pspec p = {PF_BAD_STOP, 50, 17, false};
    ptally t;
    pf_stats st;
    char err[512];
    CHECK_EQ(p_run(&p, 1000, 8, 0, &t, &st, err, sizeof err), PF_ERR_LOAD);
    CHECK_CONTAINS(err, "bad sample");
    CHECK_CONTAINS(err, "is corrupt");
    CHECK_EQ(st.skipped, 0);
    free(t.seen);
}

/* skipping is resume-safe: a run stopped at a checkpoint and resumed
   delivers the same batches, with the same samples skipped, as one that
   never stopped */
typedef struct sk_rec {
    uint64_t epoch, batch, sum, skipped_sum;
    uint32_t count, skipped;
} sk_rec;
/* how a run ended: its last result, pf_stats.skipped, pf_error */
typedef struct sk_end {
    pf_result r;
    uint64_t skipped;
    char err[512];
} sk_end;
/* the resume tests' loader: p's samples, bad ones skipped, 2 epochs shuffled */
static pf_config sk_config(const pspec *p) {
    pf_config cfg = t_config_base(500, 8, 8 * 120, 2);
    cfg.load = p_load;
    cfg.user = (void *)p;
    cfg.shuffle = true;
    cfg.seed = 11;
    cfg.bad_samples = PF_BAD_SKIP;
    return cfg;
}
static size_t sk_run(const pspec *p, const char *resume, size_t stop_after, sk_rec *out, size_t cap, char *token,
                     size_t token_n, uint64_t limit, sk_end *end) {
    tcons c;
    size_t n = 0;
    pf_stats st;
    pf_config cfg = sk_config(p);
    cfg.bad_limit = limit;
    cfg.resume = resume;
    t_begin(&c, h_seed);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    for (;;) {
        pf_batch b;
        pf_result r;
        if (n == stop_after) {
            CHECK_EQ(pf_checkpoint(c.l, token, token_n), PF_OK);
            if (end) end->r = PF_OK;
            break;
        }
        r = pf_next(c.l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r != PF_OK) {
            if (!limit) CHECK_EQ(r, PF_END_OF_DATA);
            if (end) {
                end->r = r;
                snprintf(end->err, sizeof end->err, "%s", pf_error(c.l));
            }
            break;
        }
        if (n < cap) {
            sk_rec *x = &out[n];
            memset(x, 0, sizeof *x);
            x->epoch = b.epoch;
            x->batch = b.batch;
            x->count = b.count;
            x->skipped = b.skipped;
            for (uint32_t i = 0; i < b.count; i++) x->sum = x->sum * 1000003u + b.indices[i];
            for (uint32_t i = 0; i < b.skipped; i++) x->skipped_sum = x->skipped_sum * 1000003u + b.skipped_indices[i];
        }
        n++;
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
    }
    pf_get_stats(c.l, &st);
    if (end) end->skipped = st.skipped;
    t_end(&c);
    return n;
}
static void test_skip_is_resume_safe(void) {
    pspec p = {PF_BAD_SKIP, 7, 2, false};
    static sk_rec a[256], b[256];
    char token[512];
    size_t na = sk_run(&p, NULL, (size_t)-1, a, 256, token, sizeof token, 0, NULL), nb, skipped = 0;
    for (size_t stop = 5; stop < na; stop += 37) {
        size_t first = sk_run(&p, NULL, stop, b, 256, token, sizeof token, 0, NULL);
        CHECK_EQ(first, stop);
        nb = sk_run(&p, token, (size_t)-1, b + first, 256 - first, token, sizeof token, 0, NULL);
        CHECK_EQ(first + nb, na);
        for (size_t i = 0; i < na && i < first + nb; i++)
            CHECKF(!memcmp(&a[i], &b[i], sizeof a[i]), "stop %zu: batch %zu differs", stop, i);
    }
    for (size_t i = 0; i < na; i++) skipped += a[i].skipped;
    CHECK(skipped > 0);
}

/* the count of bad samples is part of the checkpoint: a resumed run stops
   at the very batch (with the same message and pf_stats.skipped) an
   uninterrupted run stops at under cfg.bad_limit */
static void test_bad_limit_resumes_where_it_stopped(void) {
    pspec p = {PF_BAD_SKIP, 7, 2, false};
    static sk_rec a[256], b[256];
    char token[512];
    sk_end ea, e1, e2;
    uint64_t limit = 100, before;
    size_t na = sk_run(&p, NULL, (size_t)-1, a, 256, token, sizeof token, limit, &ea);
    CHECK_EQ(ea.r, PF_ERR_LOAD);
    CHECK_CONTAINS(ea.err, "more than cfg.bad_limit (100)");
    CHECK(na > 70 && na < 120); /* inside the second epoch: the count crosses an epoch end */
    for (size_t stop = 1; stop < na; stop += 23) {
        size_t first = sk_run(&p, NULL, stop, b, 256, token, sizeof token, limit, &e1), nb;
        CHECK_EQ(first, stop);
        before = 0;
        for (size_t i = 0; i < first; i++) before += b[i].skipped;
        if (before) {
            char want[40];
            snprintf(want, sizeof want, " skipped=%llu", (unsigned long long)before);
            CHECK_CONTAINS(token, want);
        } else {
            CHECK(strstr(token, "skipped=") == NULL); /* written only when there were some */
        }
        nb = sk_run(&p, token, (size_t)-1, b + first, 256 - first, NULL, 0, limit, &e2);
        CHECKF(first + nb == na, "stop %zu: the resumed run stopped after %zu batches, the whole run after %zu", stop,
               first + nb, na);
        for (size_t i = 0; i < na && i < first + nb; i++)
            CHECKF(!memcmp(&a[i], &b[i], sizeof a[i]), "stop %zu: batch %zu differs", stop, i);
        CHECK_EQ(e2.r, PF_ERR_LOAD);
        CHECK(!strcmp(e2.err, ea.err));
        CHECK_EQ(e2.skipped, ea.skipped);
    }
}

/* Unordered delivery applies cfg.bad_limit in batch order too: whichever
   loads finish first, the run stops at the batch an in-order run stops at,
   after exactly the batches before it, with the same message and count;
   and so does one stopped at a checkpoint and resumed on other timings */
typedef struct uspec {
    pspec p;
    int pattern; /* which loads are slow: 0 none, 1 every 4th, 2 the 4th-but-last of each 4, 3 random */
} uspec;
static int u_load(void *user, pf_job *job) {
    const uspec *u = (const uspec *)user;
    unsigned us = u->pattern == 1 ? (job->batch % 4 == 0 ? 3000u : 0u)
                : u->pattern == 2 ? (job->batch % 4 == 3 ? 3000u : 0u)
                : u->pattern == 3 ? (unsigned)(job->rng % 2000u) : 0u;
    if (us) t_sleep_us(us);
    return p_load((void *)&u->p, job);
}
#define UB_BATCHES 100 /* per epoch: 800 samples in batches of 8 */
typedef struct ub_end {
    pf_result r;
    uint64_t skipped;
    size_t n;
    char err[512];
} ub_end;
/* a run of 2 epochs (from resume, if set) until the limit stops it or
   stop_after batches (then *token); seen counts each (epoch, batch) */
static void ub_run(uspec *u, bool unordered, const char *resume, size_t stop_after, char *token, size_t token_n,
                   uint8_t *seen, ub_end *end) {
    tcons c;
    pf_stats st;
    pf_config cfg = t_config_base(800, 8, 8 * 120, 2);
    cfg.load = u_load;
    cfg.user = u;
    cfg.shuffle = true;
    cfg.seed = 5;
    cfg.num_workers = 4;
    cfg.unordered = unordered;
    cfg.bad_samples = PF_BAD_SKIP;
    cfg.bad_limit = 60; /* about 73 bad samples an epoch: it stops in the middle of the first */
    cfg.resume = resume;
    memset(end, 0, sizeof *end);
    t_begin(&c, h_seed);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    for (;;) {
        pf_batch b;
        pf_result r;
        if (end->n == stop_after) {
            CHECK_EQ(pf_checkpoint(c.l, token, token_n), PF_OK);
            end->r = PF_OK;
            break;
        }
        r = pf_next(c.l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r != PF_OK) {
            end->r = r;
            snprintf(end->err, sizeof end->err, "%s", pf_error(c.l));
            break;
        }
        CHECK(b.epoch < 2 && b.batch < UB_BATCHES);
        if (b.epoch < 2 && b.batch < UB_BATCHES) seen[b.epoch * UB_BATCHES + b.batch]++;
        end->n++;
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
    }
    pf_get_stats(c.l, &st);
    end->skipped = st.skipped;
    t_end(&c);
}
static void test_bad_limit_unordered_is_in_batch_order(void) {
    uspec u;
    uint8_t want[2 * UB_BATCHES], seen[2 * UB_BATCHES];
    char token[1024];
    ub_end ref, e, e2;
    size_t last = 0;
    memset(&u, 0, sizeof u);
    u.p.policy = PF_BAD_SKIP;
    u.p.bad_every = 11;
    u.p.bad_at = 4;
    memset(want, 0, sizeof want);
    ub_run(&u, false, NULL, (size_t)-1, NULL, 0, want, &ref); /* in order: the definition */
    CHECK_EQ(ref.r, PF_ERR_LOAD);
    CHECK_CONTAINS(ref.err, "more than cfg.bad_limit (60)");
    CHECK(ref.n > 20 && ref.n < UB_BATCHES); /* stopped inside the first epoch */
    for (size_t k = 0; k < 2 * UB_BATCHES; k++) {
        CHECK_EQ(want[k], k < ref.n ? 1 : 0); /* exactly the batches before the one that stops it */
        if (want[k]) last = k;
    }
    CHECK_EQ(last + 1, ref.n);
    for (int pattern = 0; pattern < 4; pattern++) {
        u.pattern = pattern;
        memset(seen, 0, sizeof seen);
        ub_run(&u, true, NULL, (size_t)-1, NULL, 0, seen, &e);
        CHECKF(e.r == PF_ERR_LOAD && !strcmp(e.err, ref.err), "timing %d: \"%s\", in order: \"%s\"", pattern, e.err,
               ref.err);
        CHECKF(!memcmp(seen, want, sizeof seen), "timing %d: %zu batches delivered, in order %zu", pattern, e.n, ref.n);
        CHECK_EQ(e.skipped, ref.skipped);
    }
    /* stopped at a checkpoint and resumed, each part on its own timings */
    for (size_t stop = 7; stop < ref.n; stop += 19) {
        memset(seen, 0, sizeof seen);
        u.pattern = 1;
        ub_run(&u, true, NULL, stop, token, sizeof token, seen, &e);
        CHECK_EQ(e.r, PF_OK);
        u.pattern = 2;
        ub_run(&u, true, token, (size_t)-1, NULL, 0, seen, &e2);
        CHECKF(e2.r == PF_ERR_LOAD && !strcmp(e2.err, ref.err), "stop %zu: \"%s\", in order: \"%s\"", stop, e2.err,
               ref.err);
        CHECKF(!memcmp(seen, want, sizeof seen), "stop %zu: %zu + %zu batches delivered, in order %zu", stop, e.n, e2.n,
               ref.n);
        CHECK_EQ(e2.skipped, ref.skipped);
    }
}

/* skipped= is read as strictly as every other field; a limit that the
   token's count is already past, or a limit STOP would never reach, is
   named at pf_create */
static void test_bad_limit_and_skipped_token_misuse(void) {
    pspec p = {PF_BAD_SKIP, 7, 2, false};
    static sk_rec b[64];
    static const struct {
        const char *tail;
        uint64_t limit;
        const char *want;
    } cases[] = {
        {" skipped=12x", 0, "skipped=12x is not a number"},
        {" skipped=-1", 0, "skipped=-1 is not a number"},
        {" skipped=", 0, "skipped= is not a number"},
        {" skipped=99999999999999999999", 0, "skipped=99999999999999999999 is not a number of at most 64 bits"},
        {" skipped=3 skipped=3", 0, "skipped appears twice"},
        {" skipped=101", 100, "skipped=101 bad samples already, more than cfg.bad_limit (100)"},
    };
    char token[512], bad[600];
    tcons c;
    pf_loader *l = NULL;
    pf_config cfg = sk_config(&p);
    sk_run(&p, NULL, 10, b, 64, token, sizeof token, 0, NULL);
    CHECKF(strstr(token, " skipped=") != NULL, "%s", token);
    if (strstr(token, " skipped=")) *strstr(token, " skipped=") = '\0'; /* the cases add their own */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(bad, sizeof bad, "%s%s", token, cases[i].tail);
        cfg.resume = bad;
        cfg.bad_limit = cases[i].limit;
        CHECKF(pf_create(&cfg, &l) == PF_ERR_INVALID_ARG, "case %zu accepted", i);
        CHECK(l == NULL);
        CHECK_CONTAINS(pf_error(NULL), cases[i].want);
    }
    snprintf(bad, sizeof bad, "%s skipped=100", token); /* exactly the limit: the run goes on */
    cfg.resume = bad;
    cfg.bad_limit = 100;
    t_begin(&c, h_seed);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    t_end(&c);
    cfg.resume = NULL;
    cfg.bad_samples = PF_BAD_STOP;
    cfg.bad_limit = 5;
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG);
    CHECK_CONTAINS(pf_error(NULL), "cfg.bad_limit is 5 but cfg.bad_samples is PF_BAD_STOP");
    CHECK(l == NULL);
}

/* misuse: each a clear PF_ERR_LOAD (or INVALID_ARG), destroyable */
static int bad_mode;
static int m_load(void *user, pf_job *job) {
    (void)user;
    switch (bad_mode) {
    case 0: /* too big */
        return pf_job_append(job, job->capacity + 1) ? 0 : -1;
    case 1: /* appends one sample short */
        for (uint32_t i = 0; i + 1 < job->count; i++) pf_job_append(job, 1);
        return 0;
    case 2: /* SKIP on a slot written in place */
        pf_job_skip(job, 0, "x");
        job->bytes = 8;
        return 0;
    case 3: /* skip out of range */
        return pf_job_skip(job, job->count, "x");
    case 4: /* a skipped sample appended too (an outside trial: the message did not say so) */
        for (uint32_t i = 0; i < job->count; i++) {
            if (i == 1) pf_job_skip(job, i, "x");
            pf_job_append(job, 1);
        }
        return 0;
    default: /* append past count: returns NULL, load says ok anyway */
        for (uint32_t i = 0; i <= job->count; i++) pf_job_append(job, 1);
        return 0;
    }
}
static void test_misuse_is_a_clear_load_error(void) {
    static const char *const want[] = {"does not fit", "appended 3 samples and skipped 0, for a batch of 4",
                                       "PF_BAD_SKIP drops samples from packed batches", "out of range",
                                       "(3 appended, 1 skipped): append only the samples pf_job_skip did not report",
                                       "already appended or skipped (4 appended, 0 skipped)"};
    for (bad_mode = 0; bad_mode < 6; bad_mode++) {
        tcons c;
        pf_batch b;
        pf_config cfg = t_config_base(40, 4, 64, 1);
        cfg.load = m_load;
        cfg.bad_samples = PF_BAD_SKIP;
        t_begin(&c, h_seed);
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
        CHECK_EQ(pf_next(c.l, &b), PF_ERR_LOAD);
        CHECK_CONTAINS(pf_error(c.l), want[bad_mode]);
        t_end(&c);
    }
    {
        pf_config cfg = t_config_base(40, 4, 64, 1);
        pf_loader *l = NULL;
        cfg.load = m_load;
        cfg.bad_samples = PF_BAD_MARK;
        CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG);
        CHECK_CONTAINS(pf_error(NULL), "cfg.bad_marker");
        cfg.bad_samples = (pf_bad_policy)9;
        CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG);
        CHECK_CONTAINS(pf_error(NULL), "cfg.bad_samples is 9");
        CHECK(l == NULL);
    }
}

/* ======================= readers ======================= */
static char tmpdir[256];
static void tmp_begin(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pf-data-XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL);
}
/* out: tmpdir/NAME, NAME printf-formatted */
static void tmp_path(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void tmp_path(char *out, size_t n, const char *fmt, ...) {
    size_t at = (size_t)snprintf(out, n, "%s/", tmpdir);
    va_list ap;
    CHECK(at < n);
    if (at >= n) return;
    va_start(ap, fmt);
    vsnprintf(out + at, n - at, fmt, ap);
    va_end(ap);
}
static void tmp_end(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    CHECK(system(cmd) == 0);
}

/* a cfg.log that keeps the warnings, from whichever thread logs them */
typedef struct logcap {
    pthread_mutex_t mu;
    int warns;
    char text[8192];
} logcap;
static void cap_log(void *user, int level, const char *msg) {
    logcap *c = (logcap *)user;
    size_t at;
    if (level != PF_LOG_WARN) return;
    pthread_mutex_lock(&c->mu);
    c->warns++;
    at = strlen(c->text);
    snprintf(c->text + at, sizeof c->text - at, "%s\n", msg);
    pthread_mutex_unlock(&c->mu);
}
static void cap_begin(logcap *c, pf_config *cfg) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    cfg->log = cap_log;
    cfg->log_user = c;
}
static void cap_end(logcap *c) { pthread_mutex_destroy(&c->mu); }

/* A token's skipped= is its own rank's count: another rank resuming from
   it counts its own from 0, says so when cfg.bad_limit is set, and is not
   refused for the other rank's count (an outside trial: rank 1 went on
   from rank 0's 25, not its own 32, and its limit stopped it 109 batches
   late) */
static void test_bad_limit_another_ranks_token(void) {
    pspec p = {PF_BAD_SKIP, 7, 2, false};
    char token[512];
    uint64_t own = 0, got = 0;
    unsigned long long theirs = 0;
    tcons c;
    logcap cap;
    pf_stats st;
    pf_config cfg = sk_config(&p);
    cfg.world_size = 2;
    cfg.rank = 0;
    t_begin(&c, h_seed);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    for (int i = 0; i < 12; i++) {
        pf_batch b;
        CHECK_EQ(pf_next(c.l, &b), PF_OK);
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
    }
    CHECK_EQ(pf_checkpoint(c.l, token, sizeof token), PF_OK);
    t_end(&c);
    CHECKF(strstr(token, " skipped=") && sscanf(strstr(token, " skipped="), " skipped=%llu", &theirs) == 1 && theirs > 1,
           "%s", token);
    cfg = sk_config(&p); /* afresh: t_create set the first run's stream in it */
    cfg.world_size = 2;
    cfg.rank = 1;
    cfg.resume = token;
    cfg.bad_limit = theirs - 1; /* rank 0's count is past it: not this rank's, so not refused */
    cap_begin(&cap, &cfg);
    t_begin(&c, h_seed);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    pthread_mutex_lock(&cap.mu);
    CHECK_CONTAINS(cap.text, "the token is another rank's");
    CHECK_CONTAINS(cap.text, "resume each rank from its own token");
    pthread_mutex_unlock(&cap.mu);
    pf_get_stats(c.l, &st);
    CHECK_EQ(st.skipped, 0); /* this rank's count, from 0 */
    for (int i = 0; i < 6; i++) {
        pf_batch b;
        pf_result r = pf_next(c.l, &b);
        if (r != PF_OK) break; /* this rank's own count may pass the small limit: that is its own verdict */
        own += b.skipped;
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
    }
    pf_get_stats(c.l, &st);
    got = st.skipped;
    CHECK_EQ(got, own);
    t_end(&c);
    cap_end(&cap);
    /* a token with no skipped= (rank 0 had skipped none) warns too: this
       rank's count is not in it either (an outside trial: no warning, and
       the limit stopped rank 1 10 batches late) */
    cfg = sk_config(&p);
    cfg.world_size = 2;
    t_begin(&c, h_seed);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(pf_checkpoint(c.l, token, sizeof token), PF_OK); /* before any batch */
    t_end(&c);
    CHECKF(strstr(token, "skipped=") == NULL, "%s", token);
    cfg = sk_config(&p);
    cfg.world_size = 2;
    cfg.rank = 1;
    cfg.resume = token;
    cfg.bad_limit = 5;
    cap_begin(&cap, &cfg);
    t_begin(&c, h_seed);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    pthread_mutex_lock(&cap.mu);
    CHECK_CONTAINS(cap.text, "the token is another rank's (or world size's): its skipped=0");
    pthread_mutex_unlock(&cap.mu);
    t_end(&c);
    cap_end(&cap);
}

/* ---- records: file f, record r holds bytes rec_byte(f, r, k) ---- */
#define RB 24u
#define RHDR 16u
static unsigned char rec_byte(uint32_t f, uint64_t r, size_t k) { return (unsigned char)(f * 97 + r * 13 + k * 7 + 1); }
static void write_records(const char *path, uint32_t f, uint64_t n, size_t tail) {
    FILE *fp = fopen(path, "wb");
    unsigned char b[RB];
    memset(b, 'H', RB);
    fwrite(b, 1, RHDR, fp);
    for (uint64_t r = 0; r < n; r++) {
        for (size_t k = 0; k < RB; k++) b[k] = rec_byte(f, r, k);
        fwrite(b, 1, RB, fp);
    }
    fwrite(b, 1, tail, fp); /* a partial record: not a sample */
    fclose(fp);
}
/* a reader of what write_records writes: the files in paths (or, with
   num_paths 0, those a path_fn the caller sets lists) */
static pf_records_config r_config(const char *const *paths, uint32_t num_paths) {
    pf_records_config rc;
    memset(&rc, 0, sizeof rc);
    rc.paths = paths;
    rc.num_paths = num_paths;
    rc.record_bytes = RB;
    rc.header_bytes = RHDR;
    return rc;
}

typedef struct rctx {
    uint32_t nfiles;
    uint64_t per[16];       /* records per file (in list order)   */
    uint32_t id[16];        /* file id of each list position       */
    bool stepped;           /* samples are 8-byte sums             */
    pthread_mutex_t mu;
    uint64_t samples, bad;
    uint64_t seen[4096];
} rctx;

static void r_locate(const rctx *c, uint64_t x, uint32_t *f, uint64_t *r) {
    uint32_t i = 0;
    while (x >= c->per[i]) x -= c->per[i++];
    *f = c->id[i];
    *r = x;
}
static uint64_t r_sum(uint32_t f, uint64_t r) {
    uint64_t s = 0;
    for (size_t k = 0; k < RB; k++) s += rec_byte(f, r, k);
    return s;
}

static void r_check(const dsnap *d) {
    rctx *c = (rctx *)d->user;
    uint64_t bad = 0;
    CHECK(d->packed);
    for (uint32_t i = 0; i < d->count; i++) {
        uint32_t f;
        uint64_t r, x = d->indices[i];
        const unsigned char *p = d->data + d->offsets[i];
        r_locate(c, x, &f, &r);
        if (c->stepped) {
            uint64_t v;
            CHECK_EQ(d->offsets[i + 1] - d->offsets[i], 8);
            memcpy(&v, p, 8);
            bad += v != r_sum(f, r);
        } else {
            CHECK_EQ(d->offsets[i + 1] - d->offsets[i], RB);
            for (size_t k = 0; k < RB; k++) bad += p[k] != rec_byte(f, r, k);
        }
    }
    pthread_mutex_lock(&c->mu);
    c->samples += d->count;
    c->bad += bad;
    for (uint32_t i = 0; i < d->count; i++) c->seen[d->indices[i]]++;
    pthread_mutex_unlock(&c->mu);
}

/* a step's end that delivers the record as it is */
static int r_as_is(pf_sample *s) {
    memcpy(s->out, s->data, s->bytes);
    s->out_bytes = s->bytes;
    return 0;
}
static int r_step(void *user, pf_sample *s) {
    uint64_t v = 0;
    (void)user;
    CHECK_EQ(s->bytes, RB);
    for (size_t k = 0; k < RB; k++) v += ((const unsigned char *)s->data)[k];
    CHECK(s->out_capacity >= 8);
    memcpy(s->out, &v, 8);
    s->out_bytes = 8;
    return 0;
}

static void run_records(bool shuffle, bool step, bool direct) {
    char paths[3][300];
    const char *pp[3];
    rctx c;
    pf_records *rd = NULL;
    pf_records_config rc;
    pf_config cfg = t_config_base(0, 7, 0, 2);
    uint64_t total = 0;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
    tmp_begin();
    for (uint32_t f = 0; f < 3; f++) {
        tmp_path(paths[f], sizeof paths[f], "r%u.bin", f);
        c.per[f] = 50 + 31 * f;
        c.id[f] = f;
        write_records(paths[f], f, c.per[f], f == 1 ? 5 : 0);
        pp[f] = paths[f];
        total += c.per[f];
    }
    c.nfiles = 3;
    c.stepped = step;
    rc = r_config(pp, 3);
    rc.direct = direct;
    if (step) {
        rc.step = r_step;
        rc.sample_bytes = 8;
    }
    cfg.shuffle = shuffle;
    CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
    CHECK_EQ(cfg.num_samples, total);
    CHECK_EQ(cfg.batch_bytes, 7 * (step ? 8 : RB));
    d_run_all(&cfg, r_check, &c, 100000, NULL);
    pf_records_close(rd);
    CHECK_EQ(c.bad, 0);
    CHECK_EQ(c.samples, 2 * total);
    for (uint64_t i = 0; i < total; i++) CHECK_EQ(c.seen[i], 2);
    tmp_end();
    pthread_mutex_destroy(&c.mu);
}
static void test_records_raw_in_order(void) { run_records(false, false, false); }
static void test_records_raw_shuffled(void) { run_records(true, false, false); }
static void test_records_step(void) { run_records(true, true, false); }
static void test_records_direct(void) { run_records(false, false, true); run_records(true, true, true); }

/* With a fixed sample_bytes a kernel finds sample i at i * sample_bytes:
   a step that writes another size fails its batch, naming both sizes,
   rather than shifting every later sample (an outside trial: a step wrote
   3 bytes of sample_bytes = 4, and data[i * 4] read the wrong samples
   with PF_OK). A slot with room to spare (batch_bytes set larger) does
   not hide it either. */
static size_t r_odd_bytes;
static int r_step_odd(void *user, pf_sample *s) {
    (void)user;
    memset(s->out, (int)(s->index & 0xff), r_odd_bytes);
    s->out_bytes = r_odd_bytes;
    return 0;
}
static void test_records_step_keeps_sample_bytes(void) {
    static const size_t wrote[3] = {3, 5, 4};
    char path[300];
    const char *pp[1];
    tmp_begin();
    tmp_path(path, sizeof path, "odd.bin");
    write_records(path, 0, 40, 0);
    pp[0] = path;
    for (int k = 0; k < 3; k++) {
        pf_records *rd = NULL;
        pf_records_config rc = r_config(pp, 1);
        pf_config cfg = t_config_base(0, 7, 7 * 8, 1);
        pf_loader *l = NULL;
        pf_batch b;
        pf_result r;
        r_odd_bytes = wrote[k];
        rc.step = r_step_odd;
        rc.sample_bytes = 4;
        CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        r = pf_next(l, &b);
        if (wrote[k] == 4) { /* the size it promised: samples at i * 4 */
            CHECK_EQ(r, PF_OK);
            if (r == PF_OK) {
                CHECK_EQ(b.bytes, 7 * 4);
                CHECK_EQ(pf_batch_wait(l, &b), PF_OK); /* CUDA: the copy has landed, readable here */
                for (uint32_t i = 0; i < b.count; i++)
                    CHECK_EQ(((const unsigned char *)b.data)[i * 4], (unsigned char)(b.indices[i] & 0xff));
                pf_release(l, &b);
            }
        } else {
            CHECK_EQ(r, PF_ERR_LOAD);
            CHECK_CONTAINS(pf_error(l), wrote[k] == 3 ? "wrote 3 bytes for sample 0" : "wrote 5 bytes for sample 0");
            CHECK_CONTAINS(pf_error(l), "sample_bytes is 4");
        }
        pf_destroy(l);
        pf_records_close(rd);
    }
    tmp_end();
}

/* A reader's own hooks (its read buffer) run on any thread: by default
   pf_next loads through a reader too, with the buffer made on its thread
   and freed at pf_destroy (ASan: no leak). The step holds the workers
   back (bounded) until pf_next has stepped three samples itself, so the
   run ends in time only if it does; every record still comes once. */
typedef struct rhelp {
    rctx c;
    t_caller_gate g;
} rhelp;
static int r_step_held(void *user, pf_sample *s) {
    rhelp *h = (rhelp *)user;
    t_caller_gate_pass(&h->g, s->job->batch > 0);
    return r_step(NULL, s);
}
static void test_records_pf_next_loads_through_the_reader(void) {
    char path[300];
    const char *pp[1];
    rhelp h;
    pf_records *rd = NULL;
    pf_records_config rc;
    pf_config cfg = t_config_base(0, 4, 0, 1);
    pf_loader *l = NULL;
    pf_stats st;
    memset(&h, 0, sizeof h);
    pthread_mutex_init(&h.c.mu, NULL);
    t_caller_gate_init(&h.g, 10000); /* bounded */
    tmp_begin();
    tmp_path(path, sizeof path, "r0.bin");
    h.c.per[0] = 200;
    h.c.nfiles = 1;
    h.c.stepped = true;
    write_records(path, 0, 200, 0);
    pp[0] = path;
    rc = r_config(pp, 1);
    rc.step = r_step_held;
    rc.user = &h;
    rc.sample_bytes = 8;
    cfg.num_workers = 1;
    cfg.host_slots = 16;
    cfg.backend = PF_BACKEND_HOST; /* where pf_next takes the loads (on CUDA the stager does) */
    cfg.timeout_ms = 0; /* pf_next loads only where its wait is unbounded; the step's waits are bounded */
    CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    for (int i = 0; l && i < 1000; i++) { /* host memory on every build: r_check reads it here */
        pf_batch b;
        dsnap d;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        CHECKF(r == PF_OK || r == PF_END_OF_DATA, "%s", pf_error(l));
        if (r != PF_OK) break;
        memset(&d, 0, sizeof d);
        d.user = &h.c;
        d.data = (const unsigned char *)b.data;
        d.count = b.count;
        d.packed = b.offsets != NULL;
        d.offsets = (uint64_t *)(uintptr_t)b.offsets;
        d.indices = (uint64_t *)(uintptr_t)b.indices;
        r_check(&d);
        CHECK_EQ(pf_release(l, &b), PF_OK);
    }
    pf_get_stats(l, &st);
    pf_destroy(l);
    pf_records_close(rd);
    CHECK_EQ(h.c.bad, 0);
    CHECK_EQ(h.c.samples, 200);
    for (uint64_t i = 0; i < 200; i++) CHECK_EQ(h.c.seen[i], 1);
    CHECKF(h.g.by_caller >= 3 && !h.g.timed_out, "pf_next stepped %u samples; %u worker waits ran out",
           h.g.by_caller, h.g.timed_out);
    CHECK(st.next_loads > 0);
    tmp_end();
    t_caller_gate_free(&h.g);
    pthread_mutex_destroy(&h.c.mu);
}

/* Drain l to the end, checking every record of every batch byte for byte:
   sample x is record x % per of file file0 + x / per (as write_records'
   rec_byte has it); seen (may be NULL) counts each x below nseen, and any
   x past it fails; page_aligned: each
   slot must start on a page. Returns the records delivered. */
static uint64_t rd_drain_checked(pf_loader *l, size_t rb, uint64_t per, uint32_t file0, uint32_t *seen,
                                 uint64_t nseen, bool page_aligned) {
    uint64_t got = 0;
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r != PF_OK) {
            CHECKF(r == PF_END_OF_DATA, "record %zu bytes: %s", rb, pf_error(l));
            break;
        }
        if (page_aligned) CHECK_EQ((uintptr_t)b.data % 4096, 0);
        CHECK_EQ(b.bytes, b.count * rb);
        for (uint32_t i = 0; i < b.count; i++) {
            const unsigned char *p = (const unsigned char *)b.data + i * rb;
            uint64_t x = b.indices[i];
            uint32_t f = file0 + (uint32_t)(x / per);
            size_t bad = rb;
            for (size_t k = 0; k < rb && bad == rb; k++)
                if (p[k] != rec_byte(f, x % per, k)) bad = k;
            CHECKF(bad == rb, "record %llu (%zu bytes) differs at byte %zu", (unsigned long long)x, rb, bad);
            if (seen) {
                CHECK(x < nseen);
                if (x < nseen) seen[x]++;
            }
            got++;
        }
        CHECK_EQ(pf_release(l, &b), PF_OK);
    }
    return got;
}

/* O_DIRECT with page-sized records: a slot whose stride is a whole number
   of pages is page-aligned, and a run of records at an aligned offset is
   read straight into it; at an offset that is not aligned (a 16-byte
   header) every run goes through the worker's buffer. Either way every
   record arrives whole, once per epoch, in order and shuffled. */
static void test_records_direct_into_the_slot(void) {
    for (int variant = 0; variant < 4; variant++) {
        const size_t rb = 4096, hdr = variant & 1 ? 16 : 0;
        const uint64_t n = 37;
        char path[300];
        const char *pp[1];
        pf_records *rd = NULL;
        pf_records_config rc;
        pf_config cfg = t_config_base(0, 5, 0, 2);
        pf_loader *l;
        unsigned char *rec = (unsigned char *)malloc(rb);
        uint32_t seen[37];
        uint64_t got = 0;
        FILE *fp;
        tmp_begin();
        tmp_path(path, sizeof path, "pages.bin");
        fp = fopen(path, "wb");
        memset(rec, 'H', rb);
        fwrite(rec, 1, hdr, fp);
        for (uint64_t r = 0; r < n; r++) {
            for (size_t k = 0; k < rb; k++) rec[k] = rec_byte(3, r, k);
            fwrite(rec, 1, rb, fp);
        }
        fclose(fp);
        pp[0] = path;
        memset(&rc, 0, sizeof rc);
        rc.paths = pp;
        rc.num_paths = 1;
        rc.record_bytes = rb;
        rc.header_bytes = hdr;
        rc.direct = true;
        cfg.shuffle = variant >= 2;
        cfg.backend = PF_BACKEND_HOST;
        cfg.num_workers = 2;
        cfg.timeout_ms = 60000; /* bounded */
        memset(seen, 0, sizeof seen);
        CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        got = rd_drain_checked(l, rb, n, 3, seen, n, true);
        pf_destroy(l);
        pf_records_close(rd);
        CHECK_EQ(got, 2 * n);
        for (uint64_t x = 0; x < n; x++) CHECK_EQ(seen[x], 2);
        free(rec);
        tmp_end();
    }
}

static int rd_open(const char *path, int flags) {
    if ((flags & PF__O_DIRECT) && strstr(path, "nodirect")) {
        errno = EINVAL;
        return -1;
    }
    return open(path, flags);
}

/* One file of a reader refuses O_DIRECT: that file reads through the page
   cache, and the others stay direct; every record arrives whole. (A
   reader-wide switch used to read the files already opened with O_DIRECT
   unaligned: every load failed.) Record sizes that go through the
   worker's buffer (1000) and straight into the slot (4096). */
static void test_records_one_file_refuses_direct(void) {
    static const size_t sizes[2] = {1000, 4096};
    for (int v = 0; v < 2; v++) {
        const size_t rb = sizes[v];
        const uint64_t per = 9;
        char paths[2][300];
        const char *pp[2];
        unsigned char *rec = (unsigned char *)malloc(rb);
        pf_records *rd = NULL;
        pf_records_config rc;
        pf_config cfg = t_config_base(0, 4, 0, 1);
        pf_loader *l;
        uint64_t got = 0;
        tmp_begin();
        for (uint32_t f = 0; f < 2; f++) {
            FILE *fp;
            tmp_path(paths[f], sizeof paths[f], f ? "nodirect_b.bin" : "a.bin");
            fp = fopen(paths[f], "wb");
            for (uint64_t r = 0; r < per; r++) {
                for (size_t k = 0; k < rb; k++) rec[k] = rec_byte(f, r, k);
                fwrite(rec, 1, rb, fp);
            }
            fclose(fp);
            pp[f] = paths[f];
        }
        memset(&rc, 0, sizeof rc);
        rc.paths = pp;
        rc.num_paths = 2;
        rc.record_bytes = rb;
        rc.direct = true;
        cfg.backend = PF_BACKEND_HOST;
        cfg.num_workers = 1;
        cfg.timeout_ms = 60000; /* bounded */
        CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        got = rd_drain_checked(l, rb, per, 0, NULL, 0, false);
        CHECK_EQ(got, 2 * per);
        pf_destroy(l);
        pf_records_close(rd);
        free(rec);
        tmp_end();
    }
}

/* a growing list: epoch e reads files e .. e+2 (file f holds 20 + f records) */
static char grow_paths[8][300];
static const char *grow_path(void *user, uint64_t epoch, uint32_t k) {
    (void)user;
    return k < 3 ? grow_paths[epoch + k] : NULL;
}
typedef struct gctx {
    rctx per_epoch[5];
} gctx;
static void g_check(const dsnap *d) {
    gctx *g = (gctx *)d->user;
    dsnap e = *d;
    e.user = &g->per_epoch[d->epoch];
    r_check(&e);
}
/* the growing list's files under a fresh tmpdir, and what each of the 5
   epochs reads: files e .. e+2 */
static void grow_begin(gctx *g) {
    memset(g, 0, sizeof *g);
    tmp_begin();
    for (uint32_t f = 0; f < 7; f++) {
        tmp_path(grow_paths[f], sizeof grow_paths[f], "g%u.bin", f);
        write_records(grow_paths[f], f, 20 + f, 0);
    }
    for (uint32_t e = 0; e < 5; e++) {
        rctx *c = &g->per_epoch[e];
        pthread_mutex_init(&c->mu, NULL);
        c->nfiles = 3;
        for (uint32_t k = 0; k < 3; k++) c->id[k] = e + k, c->per[k] = 20 + e + k;
    }
}
/* each of the first `epochs` epochs delivered every record of its files
   once, each right */
static void g_check_epochs(gctx *g, uint32_t epochs) {
    for (uint32_t e = 0; e < epochs; e++) {
        rctx *c = &g->per_epoch[e];
        uint64_t n = 0;
        for (uint32_t k = 0; k < c->nfiles; k++) n += c->per[k];
        CHECKF(c->bad == 0, "epoch %u: %llu records wrong", e, (unsigned long long)c->bad);
        CHECKF(c->samples == n, "epoch %u: %llu records, want %llu", e, (unsigned long long)c->samples,
               (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) CHECK_EQ(c->seen[i], 1);
        pthread_mutex_destroy(&c->mu);
    }
}
static void test_records_growing_file_list(void) {
    gctx g;
    pf_records *rd = NULL;
    pf_records_config rc;
    pf_config cfg = t_config_base(0, 8, 0, 5);
    grow_begin(&g);
    rc = r_config(NULL, 0);
    rc.path_fn = grow_path;
    cfg.shuffle = true;
    cfg.num_workers = 3;
    CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
    CHECK(cfg.num_samples_fn != NULL);
    d_run_all(&cfg, g_check, &g, 100000, NULL);
    pf_records_close(rd);
    g_check_epochs(&g, 5);
    tmp_end();
}

/* A growing list keeps a view for every epoch a load may still need, by
   the config pf_create gets (helper-45: the open sized it before it set
   cfg.batch_bytes, for 2 * 4 + 1 slots where the loader made 64; epochs of
   one batch, planned while an old one was still loading, rebuilt its view
   under it, and its later samples came from another epoch's file). Here
   the load of epoch 0 waits, in its first sample's step, until the workers
   have planned 24 epochs past it, then reads its other three samples. */
/* n records of 16 bytes, {record, file}: which file and record a sample
   came from */
static void write_tagged(const char *path, uint64_t file, uint64_t n) {
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (!fp) return;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v[2] = {i, file};
        CHECK_EQ(fwrite(v, 8, 2, fp), 2);
    }
    fclose(fp);
}
/* files under the test's tmpdir this process has open */
static int tmp_files_open(void) {
    char link[64], target[512];
    int open_here = 0;
    for (int fd = 0; fd < 1024; fd++) {
        ssize_t k;
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        k = readlink(link, target, sizeof target - 1);
        if (k <= 0) continue;
        target[k] = '\0';
        open_here += strncmp(target, tmpdir, strlen(tmpdir)) == 0;
    }
    return open_here;
}
#define KV_FILES 40u
static char kv_paths[KV_FILES][300];
static pthread_mutex_t kv_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t kv_cv = PTHREAD_COND_INITIALIZER;
static uint64_t kv_planned; /* the highest epoch path_fn was asked for */
static const char *kv_path_fn(void *user, uint64_t epoch, uint32_t k) {
    (void)user;
    pthread_mutex_lock(&kv_mu);
    if (epoch > kv_planned) kv_planned = epoch;
    pthread_cond_broadcast(&kv_cv);
    pthread_mutex_unlock(&kv_mu);
    return k == 0 ? kv_paths[epoch % KV_FILES] : NULL;
}
static int kv_step(void *user, pf_sample *smp) {
    (void)user;
    if (smp->job->epoch == 0 && smp->i == 0) { /* bounded: a loader that plans no further fails below */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 10;
        pthread_mutex_lock(&kv_mu);
        while (kv_planned < 24 && pthread_cond_timedwait(&kv_cv, &kv_mu, &until) == 0) {
        }
        pthread_mutex_unlock(&kv_mu);
    }
    memcpy(smp->out, smp->data, 16);
    smp->out_bytes = 16;
    return 0;
}
static void test_records_growing_list_keeps_every_view_a_load_needs(void) {
    pf_records *rd = NULL;
    pf_records_config rc;
    pf_config cfg = PF_CONFIG_INIT;
    pf_loader *l = NULL;
    pf_batch b;
    pf_result r;
    uint64_t samples = 0, wrong = 0;
    tmp_begin();
    for (uint32_t f = 0; f < KV_FILES; f++) {
        tmp_path(kv_paths[f], sizeof kv_paths[f], "kv%u.bin", f);
        write_tagged(kv_paths[f], f, 4);
    }
    kv_planned = 0;
    memset(&rc, 0, sizeof rc);
    rc.path_fn = kv_path_fn;
    rc.record_bytes = 16;
    rc.step = kv_step;
    cfg.batch_size = 4; /* an epoch is one batch */
    cfg.num_workers = 4;
    cfg.epochs = 60;
    cfg.workers_only = true; /* the loads are the workers': pf_next waits for epoch 0 */
    cfg.backend = PF_BACKEND_HOST; /* the reader's views are the point: the batches are read in place */
    CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    while ((r = pf_next(l, &b)) == PF_OK || r == PF_END_OF_EPOCH) {
        if (r != PF_OK) continue;
        for (uint32_t i = 0; i < b.count; i++) {
            uint64_t v[2];
            memcpy(v, (const unsigned char *)b.data + b.offsets[i], sizeof v);
            if (v[0] != b.indices[i] || v[1] != b.epoch % KV_FILES) {
                if (!wrong) CHECKF(0, "epoch %llu sample %llu: record %llu of file %llu", (unsigned long long)b.epoch,
                                   (unsigned long long)b.indices[i], (unsigned long long)v[0],
                                   (unsigned long long)v[1]);
                wrong++;
            }
        }
        samples += b.count;
        CHECK_EQ(pf_release(l, &b), PF_OK);
    }
    CHECK_EQ(r, PF_END_OF_DATA);
    CHECK(kv_planned >= 24); /* the wait above ended because epochs were planned, not by its timeout */
    /* every epoch loaded: its files closed, not kept for host_slots + 3
       epochs (helper-47: a rolling cache's deleted shards stayed open) */
    CHECKF(tmp_files_open() == 0, "%d of the epochs' files still open", tmp_files_open());
    CHECK_EQ(wrong, 0);
    CHECK_EQ(samples, 60 * 4);
    {   /* a second loader on it while this one lives: refused; after it, fine */
        pf_loader *l2 = NULL;
        cfg.resume = NULL;
        CHECK_EQ(pf_create(&cfg, &l2), PF_ERR_INVALID_STATE);
        CHECK_CONTAINS(pf_error(NULL), "already serves a loader");
        pf_destroy(l);
        l = NULL;
        cfg.epochs = 1;
        CHECK_EQ(pf_create(&cfg, &l2), PF_OK);
        pf_destroy(l2);
    }
    pf_records_close(rd);
    tmp_end();
}

/* helper-48, against the growing list's lists: (1) a resume on the same
   reader reused the old loader's list of the resumed epoch, with its count
   of loads, and let it go while the new loader still read it: 8 samples of
   40 came from another listing; (2) two pf_create at once on one reader
   both succeeded; (3) with drop_last an epoch's count never reached what
   was loaded, and its files stayed open; (4) a large max_files wrapped the
   open-file cap to 0. */
static char gr_paths[2][300];
static int gr_listing; /* which file path_fn names: 0, then 1 after the checkpoint */
static unsigned gr_asked; /* path_fn's first-file calls */
static const char *gr_path_fn(void *user, uint64_t epoch, uint32_t k) {
    (void)user, (void)epoch;
    if (k) return NULL;
    __atomic_fetch_add(&gr_asked, 1u, __ATOMIC_SEQ_CST);
    return gr_paths[__atomic_load_n(&gr_listing, __ATOMIC_SEQ_CST)];
}
typedef struct gr_race {
    const pf_config *cfg;
    pf_loader *l;
    pf_result r;
} gr_race;
static void *gr_create(void *p) {
    gr_race *g = (gr_race *)p;
    g->r = pf_create(g->cfg, &g->l);
    return NULL;
}
static void test_records_growing_list_resume_race_and_drop_last(void) {
    pf_records *rd = NULL;
    pf_records_config rc;
    pf_config cfg = PF_CONFIG_INIT;
    pf_loader *l = NULL;
    pf_batch b;
    pf_result r;
    char tok[512];
    uint64_t got = 0;
    tmp_begin();
    for (uint32_t f = 0; f < 2; f++) {
        tmp_path(gr_paths[f], sizeof gr_paths[f], "gr%u.bin", f);
        write_tagged(gr_paths[f], f, 40);
    }
    memset(&rc, 0, sizeof rc);
    rc.path_fn = gr_path_fn;
    rc.record_bytes = 16;
    cfg.batch_size = 1;
    cfg.num_workers = 4;
    cfg.epochs = 1;
    cfg.backend = PF_BACKEND_HOST;
    gr_listing = 0;
    CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    for (int i = 0; i < 10; i++) { /* the workers load ahead, into the rest of the epoch */
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(pf_release(l, &b), PF_OK);
    }
    CHECK_EQ(pf_checkpoint(l, tok, sizeof tok), PF_OK);
    pf_destroy(l);
    gr_listing = 1; /* the resumed epoch reads the files listed when it resumes */
    gr_asked = 0;
    cfg.resume = tok;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    while ((r = pf_next(l, &b)) == PF_OK) {
        uint64_t v[2];
        memcpy(v, b.data, sizeof v);
        CHECKF(v[1] == 1 && v[0] == b.indices[0], "batch %llu: record %llu of file %llu", (unsigned long long)b.batch,
               (unsigned long long)v[0], (unsigned long long)v[1]);
        got++;
        CHECK_EQ(pf_release(l, &b), PF_OK);
    }
    CHECK_EQ(r, PF_END_OF_EPOCH);
    CHECK_EQ(got, 30);
    CHECK_EQ(gr_asked, 1); /* listed once, at the resume */
    /* the resumed epoch's 10 samples before count: its file closes with its
       last load (helper-49: it stayed open) */
    CHECKF(tmp_files_open() == 0, "%d of the resumed epoch's files still open", tmp_files_open());
    pf_destroy(l);
    cfg.resume = NULL;
    for (int round = 0; round < 20; round++) { /* two at once: one serves, one is refused */
        gr_race g[2];
        pthread_t th[2];
        int made = 0;
        for (int k = 0; k < 2; k++) {
            g[k].cfg = &cfg;
            g[k].l = NULL;
            CHECK(pthread_create(&th[k], NULL, gr_create, &g[k]) == 0);
        }
        for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
        for (int k = 0; k < 2; k++) {
            made += g[k].r == PF_OK;
            CHECK(g[k].r == PF_OK || g[k].r == PF_ERR_INVALID_STATE);
            pf_destroy(g[k].l);
        }
        CHECK_EQ(made, 1);
    }
    /* drop_last: 40 samples in batches of 3, 39 loaded: the epochs' files close */
    cfg.drop_last = true;
    cfg.batch_size = 3;
    cfg.batch_bytes = 3 * 16; /* the open sized it for batches of 1 */
    cfg.epochs = 5;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    got = 0;
    while ((r = pf_next(l, &b)) == PF_OK || r == PF_END_OF_EPOCH)
        if (r == PF_OK) got += b.count, pf_release(l, &b);
    CHECK_EQ(r, PF_END_OF_DATA);
    CHECKF(got == 5 * 39, "%llu samples: %s", (unsigned long long)got, pf_error(l));
    CHECKF(tmp_files_open() == 0, "%d of the epochs' files still open", tmp_files_open());
    pf_destroy(l);
    /* drop_last, batches of 41 from 40 samples: no batch, no load, and the
       files still close (helper-49) */
    cfg.batch_size = 41;
    cfg.batch_bytes = 41 * 16;
    cfg.epochs = 2;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    while ((r = pf_next(l, &b)) == PF_END_OF_EPOCH) {
    }
    CHECK_EQ(r, PF_END_OF_DATA);
    CHECKF(tmp_files_open() == 0, "%d of the empty epochs' files still open", tmp_files_open());
    pf_destroy(l);
    pf_records_close(rd);
    {   /* a max_files whose product with the lists' count passes 32 bits */
        rc.max_files = 0x40000000u;
        memset(&cfg, 0, sizeof cfg);
        cfg.batch_size = 4;
        cfg.epochs = 1;
        cfg.host_slots = 1; /* 4 lists of 2^30 files: 2^32, 0 in 32 bits */
        cfg.backend = PF_BACKEND_HOST;
        CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        CHECKF(pf_next(l, &b) == PF_OK, "%s", pf_error(l));
        pf_destroy(l);
        pf_records_close(rd);
    }
    tmp_end();
}

/* a growing list resumed from a checkpoint mid-epoch: every epoch still
   delivers each of its records once, across the two runs */
static void test_records_growing_list_resumes(void) {
    gctx g;
    char token[512];
    grow_begin(&g);
    for (int part = 0; part < 2; part++) {
        tcons t;
        pf_records *rd = NULL;
        pf_records_config rc;
        pf_config cfg = t_config_base(0, 8, 0, 5);
        rc = r_config(NULL, 0);
        rc.path_fn = grow_path;
        cfg.shuffle = true;
        cfg.resume = part ? token : NULL;
        CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
        t_begin(&t, h_seed);
        CHECK_EQ(t_create(&t, &cfg), PF_OK);
        if (part == 0) { /* into epoch 2, then a checkpoint */
            size_t got = 0;
            while (got < 22) {
                pf_batch b;
                pf_result r = pf_next(t.l, &b);
                if (r == PF_END_OF_EPOCH) continue;
                CHECK_EQ(r, PF_OK);
                if (r != PF_OK) break;
                d_read(&t, &b, g_check, &g);
                CHECK_EQ(pf_release(t.l, &b), PF_OK);
                got++;
            }
            CHECK_EQ(pf_checkpoint(t.l, token, sizeof token), PF_OK);
        } else {
            CHECK_EQ(d_drain(&t, g_check, &g, 100000), PF_END_OF_DATA);
        }
        t_end(&t);
        pf_records_close(rd);
    }
    g_check_epochs(&g, 5);
    tmp_end();
}

/* a file replaced under its path (written aside, renamed over it) is read
   from the next epoch planned; epochs planned before read the old one, also
   while the new one is there (their batches may still be loading) */
static char same_path[300], same_tmp[300];
static const char *same_path_fn(void *user, uint64_t epoch, uint32_t k) {
    (void)user;
    if (k) return NULL;
    if (epoch == 2) { /* asked as epoch 2 is planned: 0 and 1 were planned with the old file */
        write_records(same_tmp, 1, 13, 0);
        CHECK(rename(same_tmp, same_path) == 0);
    }
    return same_path;
}
static void test_records_file_replaced_under_its_path(void) {
    gctx g;
    pf_records *rd = NULL;
    pf_records_config rc;
    pf_config cfg = t_config_base(0, 4, 0, 4);
    memset(&g, 0, sizeof g);
    tmp_begin();
    tmp_path(same_path, sizeof same_path, "same.bin");
    tmp_path(same_tmp, sizeof same_tmp, "same.tmp");
    write_records(same_path, 0, 20, 0);
    for (uint32_t e = 0; e < 4; e++) {
        rctx *c = &g.per_epoch[e];
        pthread_mutex_init(&c->mu, NULL);
        c->nfiles = 1;
        c->id[0] = e < 2 ? 0 : 1;
        c->per[0] = e < 2 ? 20 : 13;
    }
    rc = r_config(NULL, 0);
    rc.path_fn = same_path_fn;
    cfg.shuffle = true;
    CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
    d_run_all(&cfg, g_check, &g, 100000, NULL);
    pf_records_close(rd);
    g_check_epochs(&g, 4);
    tmp_end();
}

/* an epoch path_fn lists no readable file for is an error naming it, after
   every batch before it, not an empty epoch (with epochs = 0 a loop spun
   on PF_END_OF_EPOCH for ever); a file that does not open is a warning */
static int empty_mode;
static const char *empty_path_fn(void *user, uint64_t epoch, uint32_t k) {
    (void)user;
    if (epoch == 2 && empty_mode == 0) return NULL;                                 /* lists nothing */
    if (epoch == 2 && empty_mode == 1) return k ? NULL : "/nonexistent/pf-e2.bin";  /* none opens */
    if (epoch == 2 && empty_mode == 2) return k ? NULL : grow_paths[1];            /* no whole record */
    if (epoch == 0 && empty_mode == 3) return NULL;
    return k ? NULL : grow_paths[0];
}
static void test_records_epoch_without_files_is_an_error(void) {
    static const char *const want[4] = {"path_fn listed no readable file for epoch 2 (it listed none)",
                                        "path_fn listed no readable file for epoch 2 (1 listed, none opened",
                                        "the 1 files path_fn listed for epoch 2 hold no record of 24 bytes",
                                        "path_fn listed no readable file for epoch 0"};
    tmp_begin();
    tmp_path(grow_paths[0], sizeof grow_paths[0], "e0.bin");
    tmp_path(grow_paths[1], sizeof grow_paths[1], "e1.bin");
    write_records(grow_paths[0], 0, 20, 0);
    write_records(grow_paths[1], 1, 0, RB - 1);
    for (empty_mode = 0; empty_mode < 4; empty_mode++) {
        tcons t;
        logcap lc;
        pf_records *rd = NULL;
        pf_records_config rc;
        pf_config cfg = t_config_base(0, 4, 0, 0); /* epochs = 0: until destroyed */
        size_t batches = 0, ends = 0;
        pf_result r = PF_OK;
        rc = r_config(NULL, 0);
        rc.path_fn = empty_path_fn;
        cfg.shuffle = true;
        cfg.drop_last = true;
        cap_begin(&lc, &cfg);
        CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
        t_begin(&t, h_seed);
        CHECK_EQ(t_create(&t, &cfg), PF_OK);
        for (int i = 0; i < 200; i++) { /* bounded: an endless run of empty epochs is the bug */
            pf_batch b;
            r = pf_next(t.l, &b);
            if (r == PF_END_OF_EPOCH) {
                ends++;
                continue;
            }
            if (r != PF_OK) break;
            batches++;
            CHECK_EQ(pf_release(t.l, &b), PF_OK);
        }
        CHECKF(r == PF_ERR_LOAD, "mode %d: %s", empty_mode, pf_result_string(r));
        CHECK_CONTAINS(pf_error(t.l), want[empty_mode]);
        { /* the failed epoch has no size: no made-up one reaches a token */
            char tok[512];
            CHECK_EQ(pf_checkpoint(t.l, tok, sizeof tok), PF_OK);
            CHECK_CONTAINS(tok, " n=- ");
        }
        CHECK_EQ(batches, empty_mode == 3 ? 0 : 10); /* epochs 0 and 1 whole: 5 batches each */
        CHECK_EQ(ends, empty_mode == 3 ? 0 : 2);
        t_end(&t);
        pf_records_close(rd);
        CHECK_CONTAINS(lc.text, empty_mode == 3 ? "epoch 0" : "epoch 2");
        if (empty_mode == 1) CHECK_CONTAINS(lc.text, "cannot open /nonexistent/pf-e2.bin");
        cap_end(&lc);
    }
    tmp_end();
}

/* a step that skips another sample than its own would leave its own
   bytes in the batch under the other's index: a clear load error */
static int other_skip_step(void *user, pf_sample *s) {
    (void)user;
    if (s->i == 2) return pf_job_skip(s->job, s->i + 1, "the next one");
    return r_as_is(s);
}
static void test_reader_step_skips_only_its_own_sample(void) {
    char path[300];
    const char *pp[1] = {path};
    pf_records_config rc;
    pf_records *rd = NULL;
    pf_config cfg = t_config_base(0, 5, 0, 1);
    tcons t;
    pf_batch b;
    tmp_begin();
    tmp_path(path, sizeof path, "o.bin");
    write_records(path, 0, 10, 0);
    rc = r_config(pp, 1);
    rc.step = other_skip_step;
    cfg.bad_samples = PF_BAD_SKIP;
    CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
    t_begin(&t, h_seed);
    CHECK_EQ(t_create(&t, &cfg), PF_OK);
    CHECK_EQ(pf_next(t.l, &b), PF_ERR_LOAD);
    CHECK_CONTAINS(pf_error(t.l), "the step for sample 2 (index 2) skipped sample 3: a step skips only its own sample");
    t_end(&t);
    pf_records_close(rd);
    tmp_end();
}

/* a file whose size is not header + k records: its partial record is left
   out and logged once, naming the file and the bytes, also when a growing
   list names it every epoch */
static const char *tail_path_fn(void *user, uint64_t epoch, uint32_t k) {
    (void)user;
    (void)epoch;
    return k < 2 ? grow_paths[k] : NULL;
}
static void test_records_partial_record_warns_once(void) {
    char want[600];
    tmp_begin();
    tmp_path(grow_paths[0], sizeof grow_paths[0], "whole.bin");
    tmp_path(grow_paths[1], sizeof grow_paths[1], "cut.bin");
    write_records(grow_paths[0], 0, 10, 0);
    write_records(grow_paths[1], 1, 7, 5);
    snprintf(want, sizeof want, "pf_records: %s: 173 bytes after header_bytes (16) are not a whole number of records "
             "of 24 bytes: the last 5 bytes are left out", grow_paths[1]);
    for (int growing = 0; growing < 2; growing++) {
        const char *pp[2] = {grow_paths[0], grow_paths[1]};
        pf_stats st;
        logcap lc;
        pf_records *rd = NULL;
        pf_records_config rc;
        pf_config cfg = t_config_base(0, 4, 0, 3);
        rc = growing ? r_config(NULL, 0) : r_config(pp, 2);
        if (growing) rc.path_fn = tail_path_fn;
        cap_begin(&lc, &cfg);
        CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
        d_run_all(&cfg, NULL, NULL, 1000, &st);
        CHECK_EQ(st.samples, 3 * 17);
        pf_records_close(rd);
        CHECKF(lc.warns == 1, "%s list: %d warnings: %s", growing ? "growing" : "static", lc.warns, lc.text);
        CHECK_CONTAINS(lc.text, want);
        cap_end(&lc);
    }
    tmp_end();
}

/* ---- llm.c token shards, against llm.c's loader written plainly ---- */
static uint16_t tok_at(int shard, uint64_t pos) { return (uint16_t)(((uint64_t)shard * 1000003u + pos * 2654435761u) >> 7); }
static void write_tokens(const char *path, int id, uint64_t ntok, int32_t magic, long long cut) {
    FILE *f = fopen(path, "wb");
    int32_t h[256];
    memset(h, 0, sizeof h);
    h[0] = magic;
    h[1] = 1;
    h[2] = (int32_t)ntok;
    fwrite(h, sizeof h, 1, f);
    for (uint64_t i = 0; i < ntok; i++) {
        uint16_t v = tok_at(id, i);
        fwrite(&v, 2, 1, f);
    }
    fclose(f);
    if (cut) CHECK(truncate(path, (off_t)(1024 + 2 * ntok) - cut) == 0);
}
static pf_tokens_config k_config(const char *const *paths, uint32_t num_paths, uint32_t B, uint32_t T) {
    pf_tokens_config tc;
    memset(&tc, 0, sizeof tc);
    tc.paths = paths;
    tc.num_paths = num_paths;
    tc.B = B;
    tc.T = T;
    return tc;
}
typedef struct kctx {
    const uint64_t *ntok;
    int n;
    uint32_t B, T, world, rank;
    pthread_mutex_t mu;
    uint64_t bad, samples;
} kctx;
/* the reference: step x of rank r, as llm.c reads it */
static void k_ref(const kctx *k, uint64_t x, uint16_t *out) {
    uint64_t bt = (uint64_t)k->B * k->T;
    for (int s = 0; s < k->n; s++) {
        uint64_t nb = (k->ntok[s] - 1) / (k->world * bt);
        if (x < nb) {
            for (uint64_t j = 0; j <= bt; j++) out[j] = tok_at(s, (x * k->world + k->rank) * bt + j);
            return;
        }
        x -= nb;
    }
    CHECK(0);
}
static void k_check(const dsnap *d) {
    kctx *k = (kctx *)d->user;
    size_t bt = (size_t)k->B * k->T;
    uint16_t *want = (uint16_t *)malloc((bt + 1) * 2);
    uint64_t bad = 0;
    for (uint32_t i = 0; i < d->count; i++) {
        k_ref(k, d->indices[i], want);
        CHECK_EQ(d->offsets[i + 1] - d->offsets[i], (bt + 1) * 2);
        bad += memcmp(d->data + d->offsets[i], want, (bt + 1) * 2) != 0;
    }
    free(want);
    pthread_mutex_lock(&k->mu);
    k->bad += bad;
    k->samples += d->count;
    pthread_mutex_unlock(&k->mu);
}
static void test_tokens_match_llmc(void) {
    static const uint64_t ntok[3] = {1000, 333, 2049};
    char paths[3][300];
    const char *pp[3];
    tmp_begin();
    for (int s = 0; s < 3; s++) {
        tmp_path(paths[s], sizeof paths[s], "tok_%d.bin", s);
        write_tokens(paths[s], s, ntok[s], 20240520, 0);
        pp[s] = paths[s];
    }
    for (uint32_t world = 1; world <= 3; world += 2)
        for (uint32_t rank = 0; rank < world; rank++) {
            kctx k;
            pf_tokens *tk = NULL;
            pf_tokens_config tc;
            pf_config cfg = t_config_base(0, 2, 0, 2);
            uint64_t want = 0;
            memset(&k, 0, sizeof k);
            pthread_mutex_init(&k.mu, NULL);
            k.ntok = ntok, k.n = 3, k.B = 4, k.T = 16, k.world = world, k.rank = rank;
            for (int s = 0; s < 3; s++) want += (ntok[s] - 1) / (world * 64);
            tc = k_config(pp, 3, 4, 16);
            cfg.world_size = world;
            cfg.rank = rank;
            CHECK_EQ(pf_tokens_open(&tc, &cfg, &tk), PF_OK);
            CHECK_EQ(cfg.num_samples, want);
            CHECK_EQ(cfg.world_size, 1);
            d_run_all(&cfg, k_check, &k, 100000, NULL);
            pf_tokens_close(tk);
            CHECK_EQ(k.bad, 0);
            CHECK_EQ(k.samples, 2 * want);
            pthread_mutex_destroy(&k.mu);
        }
    {   /* a token of world size 1 on world size 3: refused, saying why
           (the step differs: positions would name other tokens; the loader
           itself is rank 0 of 1). The same step on another world size and
           B resumes; so does a token written before tokens= was (the count
           of steps then says what it can). helper-47: the steps' counts
           agreed, and world 8 went on at world 9, at other tokens. */
        pf_tokens *tk = NULL;
        pf_tokens_config tc = k_config(pp, 3, 4, 16);
        pf_config cfg = t_config_base(0, 2, 0, 2);
        pf_loader *l = NULL;
        pf_batch b;
        char tok[256];
        CHECK_EQ(pf_tokens_open(&tc, &cfg, &tk), PF_OK);
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(pf_release(l, &b), PF_OK);
        CHECK_EQ(pf_checkpoint(l, tok, sizeof tok), PF_OK);
        pf_destroy(l);
        pf_tokens_close(tk);
        cfg = t_config_base(0, 2, 0, 2);
        cfg.world_size = 3;
        cfg.rank = 1;
        CHECK_EQ(pf_tokens_open(&tc, &cfg, &tk), PF_OK);
        cfg.resume = tok;
        CHECK_CONTAINS(tok, " tokens=64");
        CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG);
        CHECK_CONTAINS(pf_error(NULL), "resume token is for steps of 64 tokens (world_size * B * T), this pf_tokens "
                                       "reader's are 192");
        pf_tokens_close(tk);
        {   /* world 2 of B = 2: the same 64-token step, the same position */
            pf_tokens_config tc2 = k_config(pp, 3, 2, 16);
            cfg = t_config_base(0, 2, 0, 2);
            cfg.world_size = 2;
            cfg.rank = 1;
            CHECK_EQ(pf_tokens_open(&tc2, &cfg, &tk), PF_OK);
            cfg.resume = tok;
            CHECKF(pf_create(&cfg, &l) == PF_OK, "%s", pf_error(NULL));
            CHECK_EQ(pf_next(l, &b), PF_OK);
            CHECK(b.batch == 1 && b.indices[0] == 2); /* steps 2 and 3, after the first run's 0 and 1 */
            CHECK_EQ(pf_release(l, &b), PF_OK);
            pf_destroy(l);
            pf_tokens_close(tk);
        }
        *strstr(tok, " tokens=") = '\0'; /* an older token: the count of steps differs, and says why */
        cfg = t_config_base(0, 2, 0, 2);
        cfg.world_size = 3;
        CHECK_EQ(pf_tokens_open(&tc, &cfg, &tk), PF_OK);
        cfg.resume = tok;
        CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG);
        CHECK_CONTAINS(pf_error(NULL), "a token written with another world_size, B or T does not resume here");
        pf_tokens_close(tk);
    }
    tmp_end();
}

static void expect_open_error(pf_result got, const char *want) {
    CHECK_EQ(got, PF_ERR_INVALID_ARG);
    CHECK_CONTAINS(pf_error(NULL), want);
}

static void test_tokens_bad_shards_are_named(void) {
    char path[300];
    const char *pp[1] = {path};
    pf_tokens_config tc;
    pf_tokens *tk = (pf_tokens *)1;
    pf_config cfg = t_config_base(0, 1, 0, 1);
    tc = k_config(pp, 1, 2, 8);
    tmp_begin();
    tmp_path(path, sizeof path, "bad.bin");
    write_tokens(path, 0, 500, 20240520, 3);
    expect_open_error(pf_tokens_open(&tc, &cfg, &tk), "truncated or corrupt");
    CHECK(tk == NULL);
    CHECK(cfg.load == NULL);
    write_tokens(path, 0, 500, 1234, 0);
    expect_open_error(pf_tokens_open(&tc, &cfg, &tk), "bad magic 1234");
    write_tokens(path, 0, 10, 20240520, 0);
    expect_open_error(pf_tokens_open(&tc, &cfg, &tk), "holds 10 tokens, fewer than world (1) * B * T (16) + 1");
    tc.B = 0;
    expect_open_error(pf_tokens_open(&tc, &cfg, &tk), "B is 0");
    tc.B = 2;
    pp[0] = "/nonexistent/x.bin";
    expect_open_error(pf_tokens_open(&tc, &cfg, &tk), "cannot open shard /nonexistent/x.bin");
    CHECK_CONTAINS(pf_error(NULL), strerror(ENOENT)); /* the C library's words for why */
    expect_open_error(pf_tokens_open(NULL, &cfg, &tk), "its config is NULL");
    expect_open_error(pf_tokens_open(&tc, NULL, &tk), "cfg is NULL");
    /* a rank past the world, whatever the world (the reader resets both, so
       pf_create would never see it) */
    write_tokens(path, 0, 500, 20240520, 0);
    pp[0] = path;
    cfg.rank = 1;
    cfg.world_size = 1;
    expect_open_error(pf_tokens_open(&tc, &cfg, &tk), "cfg.rank is 1: must be below cfg.world_size (1)");
    cfg.rank = 3;
    cfg.world_size = 0;
    expect_open_error(pf_tokens_open(&tc, &cfg, &tk), "cfg.rank is 3: must be below cfg.world_size (0, the default 1)");
    cfg.world_size = 2;
    expect_open_error(pf_tokens_open(&tc, &cfg, &tk), "cfg.rank is 3: must be below cfg.world_size (2)");
    CHECK(tk == NULL && cfg.load == NULL);
    cfg.rank = 1;
    CHECK_EQ(pf_tokens_open(&tc, &cfg, &tk), PF_OK);
    CHECK(cfg.rank == 0 && cfg.world_size == 1);
    pf_tokens_close(tk);
    /* sample_bytes says what a step writes: without one the raw tokens are
       the sample (an outside trial's sample_bytes = 3 sized slots too small
       for them, and the first pf_next failed) */
    cfg = t_config_base(0, 4, 0, 1);
    tc.sample_bytes = 3;
    CHECK_EQ(pf_tokens_open(&tc, &cfg, &tk), PF_OK);
    CHECK_EQ(cfg.batch_bytes, (size_t)4 * (2 * 8 + 1) * 2);
    pf_tokens_close(tk);
    tc.sample_bytes = 0;
    cfg = t_config_base(0, 4, 0, 1);
    pp[0] = tmpdir;
    expect_open_error(pf_tokens_open(&tc, &cfg, &tk), "is a directory");
    tmp_end();
}

static void test_records_bad_input_is_named(void) {
    char path[300];
    const char *pp[2] = {path, NULL};
    pf_records_config rc;
    pf_records *rd = (pf_records *)1;
    pf_config cfg = t_config_base(0, 4, 0, 1);
    tmp_begin();
    tmp_path(path, sizeof path, "r.bin");
    write_records(path, 0, 10, 0);
    memset(&rc, 0, sizeof rc);
    rc.paths = pp;
    rc.num_paths = 1;
    expect_open_error(pf_records_open(&rc, &cfg, &rd), "record_bytes is 0");
    CHECK(rd == NULL);
    rc.record_bytes = RB;
    rc.header_bytes = 1 << 20;
    expect_open_error(pf_records_open(&rc, &cfg, &rd), "shorter than header_bytes");
    rc.header_bytes = 0;
    rc.num_paths = 2;
    expect_open_error(pf_records_open(&rc, &cfg, &rd), "paths[1] is NULL");
    rc.num_paths = 1;
    rc.path_fn = grow_path;
    expect_open_error(pf_records_open(&rc, &cfg, &rd), "one of them");
    rc.path_fn = NULL;
    cfg.num_samples = 5;
    expect_open_error(pf_records_open(&rc, &cfg, &rd), "the reader counts the samples");
    cfg.num_samples = 0;
    cfg.batch_size = 0; /* set after the open, the slots would hold one sample */
    expect_open_error(pf_records_open(&rc, &cfg, &rd), "cfg.batch_size is 0: set it before the open");
    CHECK(cfg.load == NULL && cfg.batch_bytes == 0);
    cfg.batch_bytes = 10 * RB; /* sized by the caller: batch_size may come later */
    CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
    pf_records_close(rd);
    cfg = t_config_base(0, 4, 0, 1);
    cfg.batch_bytes = RB - 1; /* not one record: said at the open, not at the first load */
    expect_open_error(pf_records_open(&rc, &cfg, &rd), "no batch could hold one");
    CHECK(cfg.load == NULL);
    cfg = t_config_base(0, 4, 0, 1);
    pp[0] = tmpdir;
    expect_open_error(pf_records_open(&rc, &cfg, &rd), "it is a directory");
    cfg = t_config_base(0, 4, 0, 1);
    pp[0] = "/nonexistent/r.bin";
    expect_open_error(pf_records_open(&rc, &cfg, &rd), "cannot open /nonexistent/r.bin");
    CHECK_CONTAINS(pf_error(NULL), strerror(ENOENT));
    CHECK(cfg.load == NULL && cfg.user == NULL);
    tmp_end();
}

/* ---- tar: ustar, GNU long names and pax paths, grouped by key ---- */
static int tar_gnu; /* headers as old GNU tar writes them: "ustar  " and times where POSIX has the prefix */
static void tar_header(FILE *f, const char *name, uint64_t size, char type, const char *prefix) {
    unsigned char h[512];
    unsigned sum = 0;
    memset(h, 0, sizeof h);
    snprintf((char *)h, 100, "%s", name);
    memcpy(h + 100, "0000644", 7);
    memcpy(h + 108, "0000000", 7);
    memcpy(h + 116, "0000000", 7);
    snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
    memcpy(h + 136, "00000000000", 11);
    memset(h + 148, ' ', 8);
    h[156] = (unsigned char)type;
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    if (tar_gnu) { /* tar -G: atime and ctime at 345 and 357 */
        memcpy(h + 257, "ustar  ", 8);
        memcpy(h + 345, "15300705415", 12);
        memcpy(h + 357, "15300705415", 12);
    }
    if (prefix) snprintf((char *)h + 345, 155, "%s", prefix);
    for (int i = 0; i < 512; i++) sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    fwrite(h, 1, 512, f);
}
static void tar_data(FILE *f, const void *p, size_t n) {
    static const unsigned char zero[512] = {0};
    fwrite(p, 1, n, f);
    fwrite(zero, 1, (512 - n % 512) % 512, f);
}
/* The two zero blocks that end an archive, and the file. */
static void tar_end(FILE *f) {
    static const unsigned char zero[1024] = {0};
    fwrite(zero, 1, sizeof zero, f);
    fclose(f);
}
static void tar_file(FILE *f, const char *name, const void *p, size_t n) {
    if (strlen(name) >= 100) { /* GNU long name */
        tar_header(f, "././@LongLink", strlen(name) + 1, 'L', NULL);
        tar_data(f, name, strlen(name) + 1);
    }
    tar_header(f, name, n, '0', NULL);
    tar_data(f, p, n);
}
static void tar_pax_file(FILE *f, const char *name, const void *p, size_t n) {
    char rec[600];
    int len = (int)strlen(name) + 7, total = len + (len + 1 >= 10 ? 2 : 1);
    if (total >= 100) total++;
    snprintf(rec, sizeof rec, "%d path=%s\n", total, name);
    tar_header(f, "PaxHeader", strlen(rec), 'x', NULL);
    tar_data(f, rec, strlen(rec));
    tar_header(f, "short", n, '0', NULL);
    tar_data(f, p, n);
}

/* sample s: "d/s%03u.txt" of s+1 bytes 'a'+s%26 and "d/s%03u.cls" of 4 bytes (s) */
#define NTAR 40
static void tar_key(char *out, size_t n, uint32_t s) {
    if (s % 10 == 7)
        snprintf(out, n, "deep/%s/s%03u", "a-directory-name-long-enough-to-need-a-gnu-long-name-record-in-the-archive-xxxxxxxx", s);
    else if (s % 10 == 3)
        snprintf(out, n, "pax/s%03u", s);
    else
        snprintf(out, n, "d/s%03u", s);
}
static void write_tar(const char *path, uint32_t first, uint32_t n) {
    FILE *f = fopen(path, "wb");
    static const unsigned char zero[1024] = {0};
    tar_header(f, "d", 0, '5', NULL); /* a directory: not a sample */
    for (uint32_t s = first; s < first + n; s++) {
        char key[300], name[320];
        unsigned char txt[64];
        uint32_t cls = s;
        memset(txt, 'a' + (int)(s % 26), sizeof txt);
        tar_key(key, sizeof key, s);
        snprintf(name, sizeof name, "%s.txt", key);
        if (s % 10 == 3) tar_pax_file(f, name, txt, s % 60 + 1);
        else tar_file(f, name, txt, s % 60 + 1);
        snprintf(name, sizeof name, "%s.cls", key);
        tar_file(f, name, &cls, 4);
    }
    fwrite(zero, 1, sizeof zero, f);
    fclose(f);
}
static pf_tar_config tar_config(const char *const *paths, uint32_t num_paths) {
    pf_tar_config tc;
    memset(&tc, 0, sizeof tc);
    tc.paths = paths;
    tc.num_paths = num_paths;
    return tc;
}
typedef struct tctx {
    bool stepped;
    pthread_mutex_t mu;
    uint64_t bad, samples, skipped;
    uint32_t seen[2 * NTAR];
} tctx;
static int t_step(void *user, pf_sample *s) {
    uint32_t cls;
    char key[300];
    (void)user;
    if (s->num_parts != 2 || strcmp(s->parts[0].name, "txt") || strcmp(s->parts[1].name, "cls") ||
        s->parts[1].bytes != 4)
        return pf_job_fail(s->job, "sample %llu: parts wrong", (unsigned long long)s->index);
    memcpy(&cls, s->parts[1].data, 4);
    tar_key(key, sizeof key, cls);
    if (strcmp(s->key, key)) return pf_job_fail(s->job, "key %s, want %s", s->key, key);
    if (cls % 13 == 5) return pf_job_skip(s->job, s->i, "class %u is unwanted", cls);
    if (s->parts[0].bytes != cls % 60 + 1) return pf_job_fail(s->job, "sample %u: txt size", cls);
    /* out: the class, then the text's first byte */
    memcpy(s->out, &cls, 4);
    ((unsigned char *)s->out)[4] = ((const unsigned char *)s->parts[0].data)[0];
    s->out_bytes = 5;
    return 0;
}
static void tar_check(const dsnap *d) {
    tctx *c = (tctx *)d->user;
    uint64_t bad = 0;
    for (uint32_t i = 0; i < d->count; i++) {
        const unsigned char *p = d->data + d->offsets[i];
        size_t n = (size_t)(d->offsets[i + 1] - d->offsets[i]);
        uint32_t cls;
        if (c->stepped) {
            memcpy(&cls, p, 4);
            bad += n != 5 || p[4] != 'a' + cls % 26 || cls % 13 == 5;
        } else {
            memcpy(&cls, p + n - 4, 4);
            bad += n != cls % 60 + 1 + 4 || p[0] != 'a' + cls % 26;
        }
        if (cls < 2 * NTAR) {
            pthread_mutex_lock(&c->mu);
            c->seen[cls]++;
            pthread_mutex_unlock(&c->mu);
        }
    }
    pthread_mutex_lock(&c->mu);
    c->bad += bad;
    c->samples += d->count;
    c->skipped += d->skipped;
    pthread_mutex_unlock(&c->mu);
}
static void run_tar(bool step) {
    char paths[2][300];
    const char *pp[2] = {paths[0], paths[1]};
    tctx c;
    pf_tar *tr = NULL;
    pf_tar_config tc;
    pf_config cfg = t_config_base(0, 6, 0, 1);
    uint32_t unwanted = 0;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
    c.stepped = step;
    tmp_begin();
    tmp_path(paths[0], sizeof paths[0], "a.tar");
    tmp_path(paths[1], sizeof paths[1], "b.tar");
    write_tar(paths[0], 0, NTAR);
    write_tar(paths[1], NTAR, NTAR);
    tc = tar_config(pp, 2);
    if (step) {
        tc.step = t_step;
        tc.sample_bytes = 5;
        cfg.bad_samples = PF_BAD_SKIP;
    }
    cfg.shuffle = true;
    CHECK_EQ(pf_tar_open(&tc, &cfg, &tr), PF_OK);
    CHECK_EQ(pf_tar_samples(tr), 2 * NTAR);
    CHECK_EQ(cfg.num_samples, 2 * NTAR);
    d_run_all(&cfg, tar_check, &c, 100000, NULL);
    pf_tar_close(tr);
    for (uint32_t s = 0; s < 2 * NTAR; s++) {
        bool skip = step && s % 13 == 5;
        unwanted += skip;
        CHECK_EQ(c.seen[s], skip ? 0 : 1);
    }
    CHECK_EQ(c.bad, 0);
    CHECK_EQ(c.samples, 2 * NTAR - unwanted);
    CHECK_EQ(c.skipped, unwanted);
    tmp_end();
    pthread_mutex_destroy(&c.mu);
}
static void test_tar_raw_grouped_by_key(void) { run_tar(false); }
static void test_tar_step_with_skips(void) { run_tar(true); }

static void test_tar_corrupt_and_truncated_are_named(void) {
    char path[300];
    const char *pp[1] = {path};
    pf_tar_config tc;
    pf_tar *tr = (pf_tar *)1;
    pf_config cfg = t_config_base(0, 4, 0, 1);
    FILE *f;
    tc = tar_config(pp, 1);
    tmp_begin();
    tmp_path(path, sizeof path, "c.tar");
    write_tar(path, 0, 5);
    f = fopen(path, "r+b");
    fseek(f, 512 + 3, SEEK_SET); /* the first file's name: its checksum no longer holds */
    fputc('#', f);
    fclose(f);
    expect_open_error(pf_tar_open(&tc, &cfg, &tr), "fails its checksum");
    CHECK(tr == NULL);
    write_tar(path, 0, 5);
    CHECK(truncate(path, 512 * 4 + 2) == 0); /* inside the data of sample 0's .cls (4 bytes at 2048) */
    expect_open_error(pf_tar_open(&tc, &cfg, &tr), "is truncated: the entry at byte 1536 needs 4 bytes of data");
    f = fopen(path, "wb");
    fclose(f);
    expect_open_error(pf_tar_open(&tc, &cfg, &tr), "hold no file");
    pp[0] = tmpdir;
    expect_open_error(pf_tar_open(&tc, &cfg, &tr), "is a directory, not a tar shard");
    pp[0] = "/nonexistent.tar";
    expect_open_error(pf_tar_open(&tc, &cfg, &tr), "cannot open /nonexistent.tar");
    CHECK_CONTAINS(pf_error(NULL), strerror(ENOENT));
    {   /* a step without sample_bytes and without batch_bytes */
        tc.step = t_step;
        pp[0] = path;
        write_tar(path, 0, 5);
        expect_open_error(pf_tar_open(&tc, &cfg, &tr), "cfg.batch_bytes is 0");
    }
    CHECK(cfg.load == NULL);
    tmp_end();
}

/* damaged archives: every byte flip and every truncation either opens
   (and then every sample loads or fails as PF_ERR_LOAD) or is refused with
   PF_ERR_INVALID_ARG; never a crash, a hang or a leak (ASan) */
static void test_tar_damage_never_crashes(void) {
    char path[300], good[300];
    const char *pp[1] = {path};
    FILE *f;
    long size;
    unsigned char *orig;
    int opened = 0, refused = 0;
    tmp_begin();
    tmp_path(good, sizeof good, "good.tar");
    tmp_path(path, sizeof path, "bad.tar");
    write_tar(good, 0, 12);
    f = fopen(good, "rb");
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fseek(f, 0, SEEK_SET);
    orig = (unsigned char *)malloc((size_t)size);
    CHECK(fread(orig, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    h_rng_state = h_seed;
    for (int trial = 0; trial < 300; trial++) {
        pf_tar_config tc;
        pf_tar *tr = NULL;
        pf_config cfg = t_config_base(0, 4, 0, 1);
        pf_result r;
        long len = size;
        f = fopen(path, "wb");
        if (trial < 200) { /* flip a few bytes, mostly in headers */
            unsigned char *m = (unsigned char *)malloc((size_t)size);
            memcpy(m, orig, (size_t)size);
            for (int k = 0; k < 1 + trial % 3; k++) {
                long at = (long)(h_rand() % (unsigned long long)size);
                if (trial % 2) at = at / 512 * 512 + (long)(h_rand() % 160); /* names, sizes, checksums */
                m[at] ^= (unsigned char)(1u << (h_rand() % 8));
            }
            fwrite(m, 1, (size_t)size, f);
            free(m);
        } else { /* truncated anywhere */
            len = (long)(h_rand() % (unsigned long long)size);
            fwrite(orig, 1, (size_t)len, f);
        }
        fclose(f);
        tc = tar_config(pp, 1);
        cfg.batch_bytes = 1 << 16;
        r = pf_tar_open(&tc, &cfg, &tr);
        if (r == PF_OK) {
            tcons t;
            pf_result e;
            opened++;
            t_begin(&t, h_seed);
            CHECK_EQ(t_create(&t, &cfg), PF_OK);
            e = d_drain(&t, NULL, NULL, 10000);
            CHECKF(e == PF_END_OF_DATA || e == PF_ERR_LOAD, "trial %d: %s", trial, pf_error(t.l));
            t_end(&t);
            pf_tar_close(tr);
        } else {
            refused++;
            CHECKF(r == PF_ERR_INVALID_ARG, "trial %d: %d %s", trial, (int)r, pf_error(NULL));
            CHECK(tr == NULL);
        }
    }
    CHECK(opened > 0 && refused > 0);
    free(orig);
    tmp_end();
}

/* pax "LEN key=value\n" records, appended to out */
static void pax_add(char *out, size_t cap, const char *key, const char *value) {
    size_t body = strlen(key) + strlen(value) + 3, len = body + 1, at = strlen(out); /* ' ', '=', '\n' */
    char num[24];
    while ((size_t)snprintf(num, sizeof num, "%zu", len) + body != len) len++;
    snprintf(out + at, cap - at, "%zu %s=%s\n", len, key, value);
}
static void tar_meta(FILE *f, const char *name, char type, const char *data, size_t n) {
    tar_header(f, name, n, type, NULL);
    tar_data(f, data, n);
}
/* each sample's key and part names, "key:jpg,cls", in batch order */
typedef struct tnames {
    pthread_mutex_t mu;
    char got[8][128];
    uint32_t n;
} tnames;
static int tn_step(void *user, pf_sample *s) {
    char line[128];
    size_t at;
    (void)user;
    at = (size_t)snprintf(line, sizeof line, "%s:", s->key);
    for (uint32_t k = 0; k < s->num_parts && at < sizeof line; k++)
        at += (size_t)snprintf(line + at, sizeof line - at, "%s%s/%zu", k ? "," : "", s->parts[k].name,
                               s->parts[k].bytes);
    if (at >= sizeof line) return pf_job_fail(s->job, "names too long");
    memcpy(s->out, line, at + 1);
    s->out_bytes = at + 1;
    return 0;
}
static void tn_check(const dsnap *d) {
    tnames *t = (tnames *)d->user;
    pthread_mutex_lock(&t->mu);
    for (uint32_t i = 0; i < d->count && t->n < 8; i++)
        snprintf(t->got[t->n++], sizeof t->got[0], "%s", (const char *)d->data + d->offsets[i]);
    pthread_mutex_unlock(&t->mu);
}
/* the shard in pp through tn_step: it opens, with nsamples samples */
static void tn_open(const char *const *pp, pf_config *cfg, pf_tar **tr, uint64_t nsamples) {
    pf_tar_config tc = tar_config(pp, 1);
    tc.step = tn_step;
    CHECKF(pf_tar_open(&tc, cfg, tr) == PF_OK, "%s", pf_error(NULL));
    CHECK_EQ(pf_tar_samples(*tr), nsamples);
}
/* run it to the end and close it: exactly the n samples of want, in order */
static void tn_run(pf_config *cfg, pf_tar *tr, tnames *tn, const char *const *want, uint32_t n) {
    tn->n = 0;
    d_run_all(cfg, tn_check, tn, 100, NULL);
    pf_tar_close(tr);
    CHECK_EQ(tn->n, n);
    for (uint32_t i = 0; i < n && i < tn->n; i++)
        CHECKF(!strcmp(tn->got[i], want[i]), "sample %u: %s, want %s", i, tn->got[i], want[i]);
}

/* what `tar --format=posix` writes: a pax header before entries holding
   only times (the first before any name was seen). A pax path or GNU long
   name names the next entry only; globals ('g') change nothing; hidden
   files are no samples (WebDataset skips them); a pax header with nothing
   after it is ignored, with a warning */
static void test_tar_pax_and_long_names_name_one_entry(void) {
    char path[300], rec[512];
    const char *pp[1] = {path};
    static const char *const want[4] = {"k0:jpg/300,cls/1", "k1:jpg/7,cls/1", "d/k2:jpg/5,cls/1", "k3:jpg/2"};
    unsigned char big[300];
    pf_tar *tr = NULL;
    pf_config cfg = t_config_base(0, 4, 4 * 128, 1);
    logcap lc;
    tnames tn;
    FILE *f;
    memset(big, 'A', sizeof big);
    memset(&tn, 0, sizeof tn);
    pthread_mutex_init(&tn.mu, NULL);
    tmp_begin();
    tmp_path(path, sizeof path, "posix.tar");
    f = fopen(path, "wb");
    rec[0] = '\0';
    pax_add(rec, sizeof rec, "mtime", "1700000000.123456789");
    pax_add(rec, sizeof rec, "atime", "1700000001.5");
    pax_add(rec, sizeof rec, "ctime", "1700000002.25");
    tar_meta(f, "./PaxHeaders/k0.jpg", 'x', rec, strlen(rec));
    tar_file(f, "k0.jpg", big, 300);
    tar_meta(f, "./PaxHeaders/k0.cls", 'x', rec, strlen(rec));
    tar_file(f, "k0.cls", "0", 1);
    rec[0] = '\0';
    pax_add(rec, sizeof rec, "comment", "made by a test");
    tar_meta(f, "GlobalHead.0", 'g', rec, strlen(rec));
    rec[0] = '\0';
    pax_add(rec, sizeof rec, "mtime", "1");
    pax_add(rec, sizeof rec, "path", "k1.jpg");
    tar_meta(f, "./PaxHeaders/x", 'x', rec, strlen(rec));
    tar_file(f, "not-this-name.jpg", big, 7);
    tar_file(f, "k1.cls", "1", 1); /* its own name: the pax path was the previous entry's */
    tar_file(f, ".hidden.jpg", big, 3);
    tar_file(f, "d/._k2.jpg", big, 4); /* macOS's resource forks */
    tar_file(f, "d/k2.jpg", big, 5);
    tar_meta(f, "././@LongLink", 'L', "d/k2.cls", 9);
    tar_file(f, "garbage.cls", "2", 1);
    tar_file(f, "k3.jpg", big, 2); /* its own name again */
    rec[0] = '\0';
    pax_add(rec, sizeof rec, "path", "zz.jpg");
    tar_meta(f, "./PaxHeaders/zz", 'x', rec, strlen(rec)); /* dangling */
    tar_end(f);
    cap_begin(&lc, &cfg);
    tn_open(pp, &cfg, &tr, 4);
    CHECK_EQ(lc.warns, 1);
    CHECK_CONTAINS(lc.text, "has no entry after it");
    tn_run(&cfg, tr, &tn, want, 4);
    cap_end(&lc);
    pthread_mutex_destroy(&tn.mu);
    tmp_end();
}

/* WebDataset refuses a sample with two parts of one name; an empty GNU
   long name is damage; an archive of empty files says so; a missing end
   of archive is read, with a warning */
/* The shards open, with `samples` samples and one warning that says `says`. */
static void tar_opens_with_a_warning(const pf_tar_config *tc, uint64_t samples, const char *says) {
    pf_config cfg = t_config_base(0, 4, 0, 1);
    pf_tar *tr = NULL;
    logcap lc;
    cap_begin(&lc, &cfg);
    CHECKF(pf_tar_open(tc, &cfg, &tr) == PF_OK, "%s", pf_error(NULL));
    CHECK_EQ(pf_tar_samples(tr), samples);
    CHECK_EQ(lc.warns, 1);
    CHECK_CONTAINS(lc.text, says);
    pf_tar_close(tr);
    cap_end(&lc);
}
static void test_tar_duplicates_and_odd_archives_are_named(void) {
    char path[300];
    const char *pp[1] = {path};
    pf_tar_config tc;
    pf_tar *tr = (pf_tar *)1;
    pf_config cfg = t_config_base(0, 4, 0, 1);
    FILE *f;
    tc = tar_config(pp, 1);
    tmp_begin();
    tmp_path(path, sizeof path, "odd.tar");
    f = fopen(path, "wb");
    tar_file(f, "a.jpg", "aaa", 3);
    tar_file(f, "a.jpg", "AAA", 3);
    tar_file(f, "a.cls", "1", 1);
    fclose(f);
    expect_open_error(pf_tar_open(&tc, &cfg, &tr), "duplicate file name a.jpg");
    CHECK_CONTAINS(pf_error(NULL), path);
    CHECK_CONTAINS(pf_error(NULL), "sample a already has a part named \"jpg\"");
    CHECK(tr == NULL);
    f = fopen(path, "wb");
    tar_header(f, "././@LongLink", 0, 'L', NULL);
    tar_file(f, "a.jpg", "a", 1);
    fclose(f);
    expect_open_error(pf_tar_open(&tc, &cfg, &tr), "the GNU long name at byte 0 is empty");
    f = fopen(path, "wb");
    tar_file(f, "a.jpg", "", 0);
    tar_file(f, "b.jpg", "", 0);
    fclose(f);
    expect_open_error(pf_tar_open(&tc, &cfg, &tr), "every file in the 1 shards is empty");
    write_tar(path, 0, 3);
    {
        struct stat st;
        CHECK(stat(path, &st) == 0);
        CHECK(truncate(path, st.st_size - 1024) == 0); /* write_tar ends with 1024 zero bytes */
    }
    tar_opens_with_a_warning(&tc, 3, "without the end-of-archive blocks");
    { /* cut 100 bytes into the first end block: zeros, not a header (an
         outside trial's was refused; GNU tar lists it) */
        struct stat st;
        write_tar(path, 0, 3);
        CHECK(stat(path, &st) == 0);
        CHECK(truncate(path, st.st_size - 1024 + 100) == 0);
        tar_opens_with_a_warning(&tc, 3, "without the end-of-archive blocks");
        CHECK(truncate(path, st.st_size - 1024) == 0); /* as the cases below expect */
    }
    { /* cut inside the last entry's padding, its 4 bytes of data whole: read
         too, the warning at the file's end (an outside trial's message said
         "18446744073709551292 are left") */
        struct stat st;
        char at[64];
        CHECK(stat(path, &st) == 0);
        CHECK(truncate(path, st.st_size - 500) == 0);
        snprintf(at, sizeof at, "ends at byte %llu without", (unsigned long long)st.st_size - 500);
        tar_opens_with_a_warning(&tc, 3, at);
    }
    /* a hard link (tar writes one for a file added twice) and a symbolic
       one: no data of their own, left out with one warning naming the first */
    f = fopen(path, "wb");
    tar_file(f, "a.jpg", "aaa", 3);
    tar_file(f, "a.cls", "1", 1);
    tar_header(f, "b.jpg", 0, '1', NULL);
    tar_header(f, "c.jpg", 0, '2', NULL);
    tar_end(f);
    tar_opens_with_a_warning(&tc, 1, "2 links (hard or symbolic: the first is b.jpg, at byte 2048) left out");
    { /* a pax header that names neither path nor size, with no entry after
         it: said too (an outside trial's mtime-only one was not) */
        char rec[128] = "";
        f = fopen(path, "wb");
        tar_file(f, "a.jpg", "aaa", 3);
        pax_add(rec, sizeof rec, "mtime", "1700000000");
        tar_meta(f, "./PaxHeaders/a", 'x', rec, strlen(rec));
        tar_end(f);
        tar_opens_with_a_warning(&tc, 1, "the pax header at byte 1024 has no entry after it");
    }
    tmp_end();
}

/* WebDataset's key/extension split: a file without a dot in its name (the
   last path component's) has no extension to name its part, and is left
   out without ending the sample around it, with one warning per shard; a
   trailing dot is an empty extension; the key ends at the basename's
   first dot, so the rest (dots included) names the part */
/* Names as tar writes them in two formats the index must not misread: an
   old GNU header (magic "ustar  ", its atime where POSIX keeps the name
   prefix) gives the plain name, not "15300705415/..."; a pax path too long
   for the index is refused as too long, not as corrupt. */
static void test_tar_gnu_headers_and_long_pax_paths(void) {
    char path[300], rec[6000], longp[5001];
    const char *pp[1] = {path};
    static const char *const gnu_want[1] = {"sub.dir/k:jpg/3,cls/1"};
    pf_tar_config tc;
    pf_tar *tr = NULL;
    pf_config cfg = t_config_base(0, 4, 4 * 128, 1);
    tnames tn;
    FILE *f;
    memset(&tn, 0, sizeof tn);
    pthread_mutex_init(&tn.mu, NULL);
    tmp_begin();
    tmp_path(path, sizeof path, "gnu.tar");
    f = fopen(path, "wb");
    tar_gnu = 1;
    tar_file(f, "sub.dir/k.jpg", "kkk", 3);
    tar_file(f, "sub.dir/k.cls", "1", 1);
    tar_gnu = 0;
    tar_end(f);
    tn_open(pp, &cfg, &tr, 1);
    tn_run(&cfg, tr, &tn, gnu_want, 1);
    /* a pax path of 5000 bytes */
    memset(longp, 'p', 4990);
    memcpy(longp + 4990, "/k.jpg", 7);
    rec[0] = '\0';
    pax_add(rec, sizeof rec, "path", longp);
    f = fopen(path, "wb");
    tar_meta(f, "PaxHeader", 'x', rec, strlen(rec));
    tar_header(f, "short", 3, '0', NULL);
    tar_data(f, "kkk", 3);
    fclose(f);
    cfg = t_config_base(0, 4, 4 * 128, 1);
    tc = tar_config(pp, 1);
    tc.step = tn_step;
    tr = (pf_tar *)1;
    expect_open_error(pf_tar_open(&tc, &cfg, &tr), "longer than 4095");
    CHECK_CONTAINS(pf_error(NULL), "the pax path at byte 0 is 4996 bytes");
    CHECK(tr == NULL);
    tmp_end();
    pthread_mutex_destroy(&tn.mu);
}

static void test_tar_files_without_an_extension_are_left_out(void) {
    char path[300];
    const char *pp[1] = {path};
    static const char *const want[3] = {"a:jpg/3,cls/1", "d.v1/b:txt/2", "c:/1,seg.png/2"};
    pf_tar_config tc;
    pf_tar *tr = NULL;
    pf_config cfg = t_config_base(0, 4, 4 * 128, 1);
    logcap lc;
    tnames tn;
    FILE *f;
    memset(&tn, 0, sizeof tn);
    pthread_mutex_init(&tn.mu, NULL);
    tmp_begin();
    tmp_path(path, sizeof path, "noext.tar");
    f = fopen(path, "wb");
    tar_file(f, "a.jpg", "aaa", 3);
    tar_file(f, "README", "hello", 5); /* between two parts of a: a stays one sample */
    tar_file(f, "a.cls", "1", 1);
    tar_file(f, "d.v1/LICENSE", "MIT!", 4); /* the directory's dot is not the file's */
    tar_file(f, "d.v1/b.txt", "bb", 2);
    tar_file(f, "c.", "c", 1);
    tar_file(f, "c.seg.png", "cc", 2);
    tar_end(f);
    cap_begin(&lc, &cfg);
    tn_open(pp, &cfg, &tr, 3);
    CHECK_EQ(lc.warns, 1);
    CHECK_CONTAINS(lc.text, "2 files without an extension");
    CHECK_CONTAINS(lc.text, "the first is README, at byte 1024");
    CHECK_CONTAINS(lc.text, path);
    tn_run(&cfg, tr, &tn, want, 3);
    /* a shard of nothing but such files holds no sample: refused, saying why */
    f = fopen(path, "wb");
    tar_file(f, "README", "hello", 5);
    tar_file(f, "Makefile", "all:", 4);
    fclose(f);
    cfg = t_config_base(0, 4, 4 * 128, 1);
    tc = tar_config(pp, 1);
    tc.step = tn_step;
    tr = (pf_tar *)1;
    expect_open_error(pf_tar_open(&tc, &cfg, &tr), "hold no file that is part of a sample");
    CHECK_CONTAINS(pf_error(NULL), "names without an extension");
    CHECK(tr == NULL);
    cap_end(&lc);
    pthread_mutex_destroy(&tn.mu);
    tmp_end();
}

/* ---- every byte a reader allocates goes through cfg.allocator ---- */
enum { AR_RECORDS, AR_RECORDS_GROWING, AR_RECORDS_DIRECT, AR_TOKENS, AR_TAR, AR_KINDS };
static const char *const ar_names[AR_KINDS] = {"records", "records (growing list)", "records (O_DIRECT)", "tokens",
                                               "tar"};
static char ar_files[4][300];
static const char *ar_pp[4];
/* every reader's files, under a fresh tmpdir (tmp_end removes them) */
static void ar_begin(void) {
    tmp_begin();
    for (uint32_t f = 0; f < 2; f++) {
        tmp_path(ar_files[f], sizeof ar_files[f], "r%u.bin", f);
        write_records(ar_files[f], f, 30 + f, 5);
        ar_pp[f] = ar_files[f];
    }
    for (uint32_t f = 0; f < 7; f++) { /* grow_path's */
        tmp_path(grow_paths[f], sizeof grow_paths[f], "g%u.bin", f);
        write_records(grow_paths[f], f, 20 + f, 0);
    }
    tmp_path(ar_files[2], sizeof ar_files[2], "tok.bin");
    write_tokens(ar_files[2], 0, 700, 20240520, 0);
    ar_pp[2] = ar_files[2];
    tmp_path(ar_files[3], sizeof ar_files[3], "s.tar");
    write_tar(ar_files[3], 0, NTAR);
    ar_pp[3] = ar_files[3];
}
static int k_as_is(void *user, pf_sample *s) { return (void)user, r_as_is(s); }
static int r_as_is_step(void *user, pf_sample *s) { return (void)user, r_as_is(s); }
/* open reader `kind` on cfg; *reader for ar_close */
static pf_result ar_open(int kind, pf_config *cfg, void **reader) {
    pf_result r;
    *reader = NULL;
    if (kind == AR_TOKENS) {
        pf_tokens_config tc = k_config(ar_pp + 2, 1, 2, 16);
        pf_tokens *t = NULL;
        tc.step = k_as_is;
        r = pf_tokens_open(&tc, cfg, &t);
        *reader = t;
    } else if (kind == AR_TAR) {
        pf_tar_config tc = tar_config(ar_pp + 3, 1);
        pf_tar *t = NULL;
        tc.step = t_step; /* skips a few: cfg.bad_samples = PF_BAD_SKIP */
        tc.sample_bytes = 5;
        r = pf_tar_open(&tc, cfg, &t);
        *reader = t;
    } else {
        pf_records_config rc = r_config(ar_pp, 2);
        pf_records *rd = NULL;
        if (kind == AR_RECORDS_GROWING) {
            rc = r_config(NULL, 0);
            rc.path_fn = grow_path; /* a view per epoch, files opened as epochs are planned */
        }
        rc.direct = kind == AR_RECORDS_DIRECT;
        if (kind != AR_RECORDS_DIRECT) rc.step = r_as_is_step; /* a per-worker buffer */
        r = pf_records_open(&rc, cfg, &rd);
        *reader = rd;
    }
    return r;
}
static void ar_close(int kind, void *reader) {
    if (kind == AR_TOKENS) pf_tokens_close((pf_tokens *)reader);
    else if (kind == AR_TAR) pf_tar_close((pf_tar *)reader);
    else pf_records_close((pf_records *)reader);
}
/* t_alloc, counting the allocations made on the library's threads (the
   workers': their read buffers, a growing list's next epoch) */
static pthread_t ar_main;
static long ar_off_thread;
static void *ar_alloc(size_t size, void *user) {
    if (!pthread_equal(pthread_self(), ar_main)) __atomic_fetch_add(&ar_off_thread, 1, __ATOMIC_RELAXED);
    return t_alloc(size, user);
}
/* one whole run of reader `kind` on allocator a: how each step ended, and
   what a held and had counted along the way */
typedef struct ar_out {
    pf_result open, create, run;
    char err[512];
    long live_open, live_destroyed, off_thread;
} ar_out;
static void ar_run(int kind, talloc *a, ar_out *o) {
    pf_config cfg = t_config_base(0, 4, 0, 3);
    void *rd = NULL;
    tcons t;
    memset(o, 0, sizeof *o);
    cfg.allocator.alloc_fn = ar_alloc;
    cfg.allocator.free_fn = t_free;
    cfg.allocator.user_data = a;
    cfg.bad_samples = PF_BAD_SKIP;
    cfg.num_workers = 2;
    ar_main = pthread_self();
    __atomic_store_n(&ar_off_thread, 0, __ATOMIC_RELAXED);
    o->create = o->run = PF_TIMEOUT; /* not reached */
    o->open = ar_open(kind, &cfg, &rd);
    o->live_open = a->live;
    if (o->open != PF_OK) {
        snprintf(o->err, sizeof o->err, "%s", pf_error(NULL));
        CHECK(rd == NULL);
        CHECK(cfg.load == NULL); /* cfg as it was */
        return;
    }
    t_begin(&t, h_seed);
    o->create = t_create(&t, &cfg);
    if (o->create == PF_OK) {
        o->run = d_drain(&t, NULL, NULL, 100000);
        snprintf(o->err, sizeof o->err, "%s", pf_error(t.l));
    } else {
        snprintf(o->err, sizeof o->err, "%s", pf_error(NULL));
    }
    t_end(&t); /* the workers' buffers go with the loader */
    o->off_thread = __atomic_load_n(&ar_off_thread, __ATOMIC_RELAXED);
    o->live_destroyed = a->live;
    ar_close(kind, rd);
}

/* Entries and blocks an outside trial (helper-45) found read wrong or not
   at all: a pax length of 20 digits (a hang, a read before the buffer), a
   lone zero block (the rest of the shard dropped without a word), GNU
   sparse files (read as their map, as another sample), a pax record of
   20 KB (refused). Each shard here: two samples "a" and "b" around what is
   tested, unless it says otherwise. */
static void tar_two_around(const char *path, void (*middle)(FILE *f), bool end) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    tar_file(f, "a.txt", "aaaa", 4);
    middle(f);
    tar_file(f, "b.txt", "bbbb", 4);
    if (end) tar_end(f);
    else fclose(f);
}
static void mid_pax_wraps(FILE *f) { tar_meta(f, "x1", 'x', "6 a=b\n6 c=d\n18446744073709551610 x=y\n", 38); }
static void mid_pax_before(FILE *f) { tar_meta(f, "x2", 'x', "12 size=123\n18446744073709551604 x=y\n", 38); }
static void mid_lone_zero(FILE *f) {
    static const unsigned char zero[512] = {0};
    fwrite(zero, 1, sizeof zero, f);
}
static void mid_lone_zero_then_data(FILE *f) {
    static const unsigned char zero[512] = {0};
    fwrite(zero, 1, sizeof zero, f); /* a header zeroed: its data follows */
    tar_data(f, "cccc", 4);
}
static void mid_concatenated(FILE *f) {
    static const unsigned char zero[10240 - 2048] = {0}; /* tar's end, padded to its 10 KiB record */
    fwrite(zero, 1, sizeof zero, f);
}
static void mid_sparse_gnu(FILE *f) {
    tar_header(f, "s.txt", 512, 'S', NULL);
    tar_data(f, "sparse pieces", 13);
}
static void mid_sparse_pax(FILE *f) {
    char rec[256] = "";
    pax_add(rec, sizeof rec, "GNU.sparse.major", "1");
    pax_add(rec, sizeof rec, "GNU.sparse.minor", "0");
    pax_add(rec, sizeof rec, "GNU.sparse.name", "s.txt");
    pax_add(rec, sizeof rec, "GNU.sparse.realsize", "1048576");
    tar_meta(f, "./PaxHeaders/s.txt", 'x', rec, strlen(rec));
    tar_file(f, "./GNUSparseFile.1/s.txt", "3\n0\n4096\n", 9);
}
/* An old GNU sparse header whose map goes on in an extension block
   (helper-47: more than 4 regions; counted as data, the index landed in it
   and refused the shard as corrupt), and one of a file all hole (size 0). */
static void mid_sparse_gnu_extended(FILE *f) {
    unsigned char h[512], ext[512], piece[512];
    unsigned sum = 0;
    memset(h, 0, sizeof h);
    snprintf((char *)h, 100, "m.bin");
    memcpy(h + 100, "0000644", 7);
    snprintf((char *)h + 124, 12, "%011o", 512u);
    memset(h + 148, ' ', 8);
    h[156] = 'S';
    memcpy(h + 257, "ustar  ", 8);
    h[482] = 1; /* isextended: a map block follows */
    for (int i = 0; i < 512; i++) sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    fwrite(h, 1, sizeof h, f);
    memset(ext, 0, sizeof ext);
    memcpy(ext, "00000200000", 11); /* an entry; ext[504] = 0: the last map block */
    fwrite(ext, 1, sizeof ext, f);
    memset(piece, 'Z', sizeof piece);
    fwrite(piece, 1, sizeof piece, f);
}
static void mid_sparse_hole(FILE *f) { tar_header(f, "hole.bin", 0, 'S', NULL); }
static void mid_unknown_kind(FILE *f) {
    tar_header(f, "v.txt", 5, 'V', NULL);
    tar_data(f, "label", 5);
}
static char big_pax[20100];
static void mid_big_pax(FILE *f) {
    char value[20000];
    memset(value, 'x', sizeof value - 1);
    value[sizeof value - 1] = '\0';
    big_pax[0] = '\0';
    pax_add(big_pax, sizeof big_pax, "SCHILY.xattr.user.big", value);
    pax_add(big_pax, sizeof big_pax, "path", "c.txt");
    tar_meta(f, "./PaxHeaders/c", 'x', big_pax, strlen(big_pax));
    tar_file(f, "ignored-name.txt", "cccc", 4);
}
static void test_tar_odd_blocks_and_entries_are_read_or_said(void) {
    char path[300];
    const char *pp[1] = {path};
    pf_tar_config tc = tar_config(pp, 1);
    pf_config cfg = t_config_base(0, 4, 0, 1);
    pf_tar *tr = (pf_tar *)1;
    tmp_begin();
    tmp_path(path, sizeof path, "odd.tar");
    tar_two_around(path, mid_pax_wraps, true);
    expect_open_error(pf_tar_open(&tc, &cfg, &tr), "the pax header at byte 1024 is malformed");
    tar_two_around(path, mid_pax_before, true);
    expect_open_error(pf_tar_open(&tc, &cfg, &tr), "the pax header at byte 1024 is malformed");
    CHECK(tr == NULL);
    tar_two_around(path, mid_lone_zero, true);
    tar_opens_with_a_warning(&tc, 2, "zero blocks (an end of archive) at byte 1024, with entries after them: read on");
    tar_two_around(path, mid_concatenated, true);
    tar_opens_with_a_warning(&tc, 2, "archives concatenated with cat are read whole");
    tar_two_around(path, mid_lone_zero_then_data, true);
    tar_opens_with_a_warning(&tc, 1, "a lone zero block at byte 1024, and no header after it");
    tar_two_around(path, mid_sparse_gnu, true);
    tar_opens_with_a_warning(&tc, 2, "1 entry with data that is not a regular file's (the first is s.txt, a GNU "
                                     "sparse file, at byte 1024) left out");
    tar_two_around(path, mid_sparse_pax, true);
    tar_opens_with_a_warning(&tc, 2, "(the first is ./GNUSparseFile.1/s.txt, a GNU sparse file");
    tar_two_around(path, mid_sparse_gnu_extended, true);
    tar_opens_with_a_warning(&tc, 2, "(the first is m.bin, a GNU sparse file, at byte 1024)");
    tar_two_around(path, mid_sparse_hole, true);
    tar_opens_with_a_warning(&tc, 2, "(the first is hole.bin, a GNU sparse file");
    tar_two_around(path, mid_unknown_kind, true);
    tar_opens_with_a_warning(&tc, 2, "an entry of type 'V'");
    {   /* one end block of two (helper-48: read, but not said) */
        static const unsigned char zero[512] = {0};
        FILE *f;
        tar_two_around(path, mid_unknown_kind, false);
        f = fopen(path, "ab");
        fwrite(zero, 1, sizeof zero, f);
        fclose(f);
        cfg = t_config_base(0, 4, 0, 1);
        {
            logcap lc;
            cap_begin(&lc, &cfg);
            CHECKF(pf_tar_open(&tc, &cfg, &tr) == PF_OK, "%s", pf_error(NULL));
            CHECK_EQ(pf_tar_samples(tr), 2);
            CHECK_CONTAINS(lc.text, "ends with one zero block at byte 3072, not the two of an end of archive");
            pf_tar_close(tr);
            cap_end(&lc);
        }
    }
    {   /* under a block of bytes after the end: said too */
        FILE *f;
        tar_two_around(path, mid_lone_zero_then_data, false);
        f = fopen(path, "ab");
        fputs("300 bytes or so of something", f);
        fclose(f);
        tar_opens_with_a_warning(&tc, 1, "a lone zero block at byte 1024, and no header after it");
        tar_two_around(path, mid_lone_zero, true);
        f = fopen(path, "ab");
        fputs("a header cut short", f);
        fclose(f);
        {
            logcap lc;
            cfg = t_config_base(0, 4, 0, 1);
            cap_begin(&lc, &cfg);
            CHECKF(pf_tar_open(&tc, &cfg, &tr) == PF_OK, "%s", pf_error(NULL));
            CHECK_EQ(pf_tar_samples(tr), 2);
            CHECK_EQ(lc.warns, 2); /* the zero block read past, and the bytes after the end */
            CHECK_CONTAINS(lc.text, "is followed by bytes that are not a tar header: left out");
            pf_tar_close(tr);
            cap_end(&lc);
        }
    }
    {   /* garbage after a proper end */
        FILE *f;
        tar_two_around(path, mid_unknown_kind, true);
        f = fopen(path, "ab");
        fputs("not a tar header", f);
        for (int i = 0; i < 600; i++) fputc('#', f);
        fclose(f);
        cfg = t_config_base(0, 4, 0, 1);
        {
            logcap lc;
            cap_begin(&lc, &cfg);
            CHECKF(pf_tar_open(&tc, &cfg, &tr) == PF_OK, "%s", pf_error(NULL));
            CHECK_EQ(pf_tar_samples(tr), 2);
            CHECK_EQ(lc.warns, 2); /* the 'V' entry, and the bytes after the end */
            CHECK_CONTAINS(lc.text, "is followed by bytes that are not a tar header: left out");
            pf_tar_close(tr);
            cap_end(&lc);
        }
    }
    {   /* a pax record of 20 KB: its path names the entry after it */
        tnames tn;
        static const char *const want[3] = {"a:txt/4", "c:txt/4", "b:txt/4"};
        memset(&tn, 0, sizeof tn);
        pthread_mutex_init(&tn.mu, NULL);
        tar_two_around(path, mid_big_pax, true);
        cfg = t_config_base(0, 4, 4 * 128, 1);
        tn_open(pp, &cfg, &tr, 3);
        tn_run(&cfg, tr, &tn, want, 3);
        pthread_mutex_destroy(&tn.mu);
    }
    tmp_end();
}

/* What helper-45 found at the readers' opens: a FIFO named as a data file
   hung its open for ever; out of descriptors, a growing list left its
   files out and its epochs came out smaller without an error; B * T *
   world_size wrapped to 0 and divided by it. */
#define FD_FILES 48u
static char fd_paths[FD_FILES][300];
static const char *fd_path_fn(void *user, uint64_t epoch, uint32_t k) {
    (void)user, (void)epoch;
    return k < FD_FILES ? fd_paths[k] : NULL;
}
static void test_readers_refuse_fifos_and_say_when_descriptors_run_out(void) {
    char fifo[300], shard[300];
    const char *pp[1] = {fifo};
    pf_config cfg = t_config_base(0, 4, 0, 1);
    pf_records_config rc = r_config(pp, 1);
    pf_tokens_config kc = k_config(pp, 1, 2, 8);
    pf_tar_config tc = tar_config(pp, 1);
    pf_records *rd = (pf_records *)1;
    pf_tokens *tk = (pf_tokens *)1;
    pf_tar *tr = (pf_tar *)1;
    tmp_begin();
    tmp_path(fifo, sizeof fifo, "fifo");
    CHECK(mkfifo(fifo, 0600) == 0);
    expect_open_error(pf_records_open(&rc, &cfg, &rd), "it is a FIFO, not a regular file");
    expect_open_error(pf_tokens_open(&kc, &cfg, &tk), "is a FIFO, not a regular file");
    expect_open_error(pf_tar_open(&tc, &cfg, &tr), "is a FIFO, not a regular file, not a tar shard");
    CHECK(rd == NULL && tk == NULL && tr == NULL);
    /* B * T * world_size past what a shard's header can count */
    tmp_path(shard, sizeof shard, "t.bin");
    write_tokens(shard, 0, 500, 20240520, 0);
    pp[0] = shard;
    kc = k_config(pp, 1, 1u << 24, 1u << 24);
    cfg.world_size = 65536;
    expect_open_error(pf_tokens_open(&kc, &cfg, &tk), "tokens a step is more than any shard holds");
    cfg.world_size = 65537; /* the open sets it to 1: said there, as pf_create would */
    expect_open_error(pf_tokens_open(&kc, &cfg, &tk), "cfg.world_size is 65537: at most 65536");
    cfg.world_size = 0;
    {   /* a growing list of 48 files, with 20 descriptors to spare: the
           epoch fails, naming why, instead of coming out smaller */
        struct rlimit was, low;
        pf_loader *l = NULL;
        pf_batch b;
        pf_result r;
        int spare = 0;
        for (uint32_t f = 0; f < FD_FILES; f++) {
            tmp_path(fd_paths[f], sizeof fd_paths[f], "fd%u.bin", f);
            write_records(fd_paths[f], f, 2, 0);
        }
        rc = r_config(NULL, 0);
        rc.path_fn = fd_path_fn;
        cfg = t_config_base(0, 4, 0, 1);
        cfg.num_workers = 1;
        CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
        CHECK(getrlimit(RLIMIT_NOFILE, &was) == 0);
        for (int fd = 0, free_fds = 0; free_fds < 20; fd++) /* a new descriptor is the lowest free one */
            if (fcntl(fd, F_GETFD) == -1) free_fds++, spare = fd + 1;
        low = was;
        low.rlim_cur = (rlim_t)spare; /* 20 free below it */
        CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0); /* the first epoch's files are opened as it is planned */
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        r = pf_next(l, &b);
        CHECK(setrlimit(RLIMIT_NOFILE, &was) == 0);
        CHECK_EQ(r, PF_ERR_LOAD);
        CHECK_CONTAINS(pf_error(l), "ulimit -n");
        if (r == PF_OK) pf_release(l, &b);
        pf_destroy(l);
        pf_records_close(rd);
    }
    tmp_end();
}

/* the readers' index, bookkeeping, file records and per-worker buffers are
   all the caller's allocator's, and all of it comes back: the loader's by
   pf_destroy, the reader's by its close */
static void test_readers_allocate_through_cfg_allocator(void) {
    ar_begin();
    for (int kind = 0; kind < AR_KINDS; kind++) {
        talloc a;
        ar_out o;
        t_alloc_init(&a, 0);
        ar_run(kind, &a, &o);
        CHECKF(o.open == PF_OK && o.create == PF_OK && o.run == PF_END_OF_DATA, "%s: %s", ar_names[kind], o.err);
        CHECKF(o.live_open > 0, "%s: the open allocated nothing through cfg.allocator", ar_names[kind]);
        CHECKF(o.off_thread >= 1, "%s: no worker state through cfg.allocator", ar_names[kind]);
        /* the loader's and the workers' came back with pf_destroy (a growing
           list keeps the files of its latest epochs until the close) */
        if (kind == AR_RECORDS_GROWING)
            CHECK(o.live_destroyed >= o.live_open);
        else
            CHECKF(o.live_destroyed == o.live_open, "%s: %ld blocks after pf_destroy, %ld after the open",
                   ar_names[kind], o.live_destroyed, o.live_open);
        CHECKF(a.live == 0 && a.bytes == 0, "%s: %ld blocks (%zu bytes) not given back", ar_names[kind], a.live,
               a.bytes);
        pthread_mutex_destroy(&a.mu);
    }
    tmp_end();
}

/* an allocator that fails once, at every allocation a whole run makes in
   turn: the open, pf_create or pf_next fails, saying "out of memory", and
   every block comes back (ASan: nothing else leaks either) */
static void test_readers_fail_cleanly_without_memory(void) {
    ar_begin();
    for (int kind = 0; kind < AR_KINDS; kind++) {
        talloc a;
        ar_out o;
        long total;
        int failed = 0;
        t_alloc_init(&a, 0);
        ar_run(kind, &a, &o);
        total = a.total;
        pthread_mutex_destroy(&a.mu);
        for (long n = 1; n <= total + 4; n++) {
            t_alloc_init(&a, n);
            ar_run(kind, &a, &o);
            if (a.total >= n) { /* it was asked for, and failed */
                bool clean = o.open == PF_ERR_NO_MEMORY || o.create == PF_ERR_NO_MEMORY || o.run == PF_ERR_LOAD;
                failed++;
                CHECKF(clean, "%s, allocation %ld failing: open %d, create %d, run %d: %s", ar_names[kind], n,
                       (int)o.open, (int)o.create, (int)o.run, o.err);
                CHECKF(strstr(o.err, "out of memory") != NULL, "%s, allocation %ld failing: %s", ar_names[kind], n,
                       o.err);
                /* and how much: every such message names its bytes */
                CHECKF(strstr(o.err, " byte") != NULL || strstr(o.err, "-byte") != NULL,
                       "%s, allocation %ld failing, says no size: %s", ar_names[kind], n, o.err);
            } else {
                CHECKF(o.run == PF_END_OF_DATA, "%s: %s", ar_names[kind], o.err);
            }
            CHECKF(a.live == 0, "%s, allocation %ld failing: %ld blocks not given back", ar_names[kind], n, a.live);
            pthread_mutex_destroy(&a.mu);
        }
        CHECK(failed >= 5);
    }
    tmp_end();
}

/* the caller's worker hooks run inside the reader's, with the caller's user */
static int rs_step(void *user, pf_sample *s) {
    wcount *wc = (wcount *)user;
    wstate *st = (wstate *)s->job->worker_state;
    if (!st || !pthread_equal(st->thread, pthread_self())) {
        pthread_mutex_lock(&wc->mu);
        wc->bad++;
        pthread_mutex_unlock(&wc->mu);
    }
    return r_as_is(s);
}
static void test_reader_keeps_your_worker_state(void) {
    char path[300];
    const char *pp[1] = {path};
    pf_records_config rc;
    pf_records *rd = NULL;
    pf_config cfg = t_config_base(0, 4, 0, 2);
    wcount wc;
    wc_begin(&wc);
    tmp_begin();
    tmp_path(path, sizeof path, "w.bin");
    write_records(path, 0, 100, 0);
    rc = r_config(pp, 1);
    rc.step = rs_step;
    rc.user = &wc;
    cfg.user = &wc;
    cfg.worker_init = w_init;
    cfg.worker_stop = w_stop;
    CHECK_EQ(pf_records_open(&rc, &cfg, &rd), PF_OK);
    d_run_all(&cfg, NULL, NULL, 100000, NULL);
    pf_records_close(rd);
    wc_end(&wc);
    tmp_end();
}

static const h_test tests[] = {
    {"worker_state_on_its_own_thread", test_worker_state_on_its_own_thread},
    {"worker_state_stopped_on_destroy", test_worker_state_stopped_on_destroy},
    {"worker_state_with_autotune", test_worker_state_with_autotune},
    {"worker_stop_without_init", test_worker_stop_without_init},
    {"packed_variable_sizes", test_packed_variable_sizes},
    {"packed_offsets_on_the_device", test_packed_offsets_on_the_device},
    {"skip_drops_and_lists_bad_samples", test_skip_drops_and_lists_bad_samples},
    {"skip_every_sample_of_a_fixed_batch", test_skip_every_sample_of_a_fixed_batch},
    {"mark_packed_and_fixed", test_mark_packed_and_fixed},
    {"bad_limit_is_deterministic", test_bad_limit_is_deterministic},
    {"default_policy_stops_naming_the_sample", test_default_policy_stops_naming_the_sample},
    {"skip_is_resume_safe", test_skip_is_resume_safe},
    {"bad_limit_resumes_where_it_stopped", test_bad_limit_resumes_where_it_stopped},
    {"bad_limit_and_skipped_token_misuse", test_bad_limit_and_skipped_token_misuse},
    {"bad_limit_unordered_is_in_batch_order", test_bad_limit_unordered_is_in_batch_order},
    {"bad_limit_another_ranks_token", test_bad_limit_another_ranks_token},
    {"misuse_is_a_clear_load_error", test_misuse_is_a_clear_load_error},
    {"records_raw_in_order", test_records_raw_in_order},
    {"records_raw_shuffled", test_records_raw_shuffled},
    {"records_step", test_records_step},
    {"records_direct", test_records_direct},
    {"records_step_keeps_sample_bytes", test_records_step_keeps_sample_bytes},
    {"records_pf_next_loads_through_the_reader", test_records_pf_next_loads_through_the_reader},
    {"records_direct_into_the_slot", test_records_direct_into_the_slot},
    {"records_one_file_refuses_direct", test_records_one_file_refuses_direct},
    {"records_growing_file_list", test_records_growing_file_list},
    {"records_growing_list_keeps_every_view_a_load_needs", test_records_growing_list_keeps_every_view_a_load_needs},
    {"records_growing_list_resume_race_and_drop_last", test_records_growing_list_resume_race_and_drop_last},
    {"records_growing_list_resumes", test_records_growing_list_resumes},
    {"records_file_replaced_under_its_path", test_records_file_replaced_under_its_path},
    {"records_epoch_without_files_is_an_error", test_records_epoch_without_files_is_an_error},
    {"records_partial_record_warns_once", test_records_partial_record_warns_once},
    {"reader_step_skips_only_its_own_sample", test_reader_step_skips_only_its_own_sample},
    {"records_bad_input_is_named", test_records_bad_input_is_named},
    {"tokens_match_llmc", test_tokens_match_llmc},
    {"tokens_bad_shards_are_named", test_tokens_bad_shards_are_named},
    {"tar_raw_grouped_by_key", test_tar_raw_grouped_by_key},
    {"tar_odd_blocks_and_entries_are_read_or_said", test_tar_odd_blocks_and_entries_are_read_or_said},
    {"readers_refuse_fifos_and_say_when_descriptors_run_out", test_readers_refuse_fifos_and_say_when_descriptors_run_out},
    {"tar_step_with_skips", test_tar_step_with_skips},
    {"tar_corrupt_and_truncated_are_named", test_tar_corrupt_and_truncated_are_named},
    {"tar_damage_never_crashes", test_tar_damage_never_crashes},
    {"tar_pax_and_long_names_name_one_entry", test_tar_pax_and_long_names_name_one_entry},
    {"tar_duplicates_and_odd_archives_are_named", test_tar_duplicates_and_odd_archives_are_named},
    {"tar_files_without_an_extension_are_left_out", test_tar_files_without_an_extension_are_left_out},
    {"tar_gnu_headers_and_long_pax_paths", test_tar_gnu_headers_and_long_pax_paths},
    {"readers_allocate_through_cfg_allocator", test_readers_allocate_through_cfg_allocator},
    {"readers_fail_cleanly_without_memory", test_readers_fail_cleanly_without_memory},
    {"reader_keeps_your_worker_state", test_reader_keeps_your_worker_state},
};

int main(int argc, char **argv) {
#ifdef TEST_SIM
    const char *suite = "your data: worker state, packed batches, bad samples, readers (simulated CUDA backend)";
#else
    const char *suite = "your data: worker state, packed batches, bad samples, readers (host backend)";
#endif
    return h_main(argc, argv, suite, tests, sizeof tests / sizeof tests[0]);
}
