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
#include "../prefetch.h"
#include "util.h"
#include <fcntl.h>
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
    CHECK(cudaSimLaunchKernel(c->stream, d_run, d, b->data, b->bytes) == cudaSuccess);
#else
    (void)c;
    d_run(d);
#endif
}

static pf_config d_config(uint64_t n, uint32_t bs, size_t batch_bytes, uint32_t epochs) {
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
    pf_config cfg = d_config(2000, 4, 64, 3);
    memset(&wc, 0, sizeof wc);
    pthread_mutex_init(&wc.mu, NULL);
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
    CHECK(wc.inits >= 1);
    CHECK_EQ(wc.inits, wc.stops);
    CHECK_EQ(wc.bad, 0);
    if (!destroy_early) CHECK(wc.inits <= (int)workers || autotune);
    pthread_mutex_destroy(&wc.mu);
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
    tcons c;
    pf_config cfg = d_config(100, 4, 64, 1);
    cfg.load = w_plain;
    cfg.worker_stop = w_stop_only;
    cfg.num_workers = 2;
    stops_only = 0;
    t_begin(&c, h_seed);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(d_drain(&c, NULL, NULL, 1000), PF_END_OF_DATA);
    t_end(&c);
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
static pf_result p_run(const pspec *p, uint64_t n, uint32_t bs, uint64_t limit, ptally *t, pf_stats *st, char *err,
                       size_t errn) {
    tcons c;
    pf_result r;
    static const unsigned char marker[FIXED] = {MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE,
                                                MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE,
                                                MARK_BYTE, MARK_BYTE, MARK_BYTE, MARK_BYTE};
    pf_config cfg = d_config(n, bs, (size_t)bs * 120, 1);
    cfg.load = p_load;
    cfg.user = (void *)p;
    cfg.shuffle = true;
    cfg.seed = 7;
    cfg.bad_samples = p->policy;
    cfg.bad_limit = limit;
    cfg.bad_marker = marker;
    cfg.bad_marker_bytes = p->fixed ? FIXED : 3;
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
    default: /* append past count: returns NULL, load says ok anyway */
        for (uint32_t i = 0; i <= job->count; i++) pf_job_append(job, 1);
        return 0;
    }
}
static void test_misuse_is_a_clear_load_error(void) {
    static const char *const want[] = {"does not fit", "appended 3 samples and skipped 0, for a batch of 4",
                                       "PF_BAD_SKIP drops samples from packed batches", "out of range",
                                       "already appended or skipped"};
    for (bad_mode = 0; bad_mode < 5; bad_mode++) {
        tcons c;
        pf_batch b;
        pf_config cfg = d_config(40, 4, 64, 1);
        cfg.load = m_load;
        cfg.bad_samples = PF_BAD_SKIP;
        t_begin(&c, h_seed);
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
        CHECK_EQ(pf_next(c.l, &b), PF_ERR_LOAD);
        CHECK_CONTAINS(pf_error(c.l), want[bad_mode]);
        t_end(&c);
    }
    {
        pf_config cfg = d_config(40, 4, 64, 1);
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

static const h_test tests[] = {
    {"worker_state_on_its_own_thread", test_worker_state_on_its_own_thread},
    {"worker_state_stopped_on_destroy", test_worker_state_stopped_on_destroy},
    {"worker_state_with_autotune", test_worker_state_with_autotune},
    {"worker_stop_without_init", test_worker_stop_without_init},
    {"packed_variable_sizes", test_packed_variable_sizes},
    {"skip_drops_and_lists_bad_samples", test_skip_drops_and_lists_bad_samples},
    {"skip_every_sample_of_a_fixed_batch", test_skip_every_sample_of_a_fixed_batch},
    {"mark_packed_and_fixed", test_mark_packed_and_fixed},
    {"bad_limit_is_deterministic", test_bad_limit_is_deterministic},
    {"default_policy_stops_naming_the_sample", test_default_policy_stops_naming_the_sample},
    {"misuse_is_a_clear_load_error", test_misuse_is_a_clear_load_error},
};

int main(int argc, char **argv) {
#ifdef TEST_SIM
    const char *suite = "your data: worker state, packed batches, bad samples, readers (simulated CUDA backend)";
#else
    const char *suite = "your data: worker state, packed batches, bad samples, readers (host backend)";
#endif
    return h_main(argc, argv, suite, tests, sizeof tests / sizeof tests[0]);
}
