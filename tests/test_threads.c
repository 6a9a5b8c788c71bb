/* test_threads.c - many threads, one loader. pf_next, pf_release,
   pf_batch_wait and pf_get_stats "may be called from any thread": 2-4
   consumer threads (with and without timeouts), releasers, a stats reader,
   in order and unordered, on both backends (-DTEST_SIM: the simulated CUDA
   runtime) and under TSan. Checks exactly-once delivery, that no waiter
   misses its wake-up, and stats consistent with the wall clock; and the
   defects a hostile tester found, each where it was seen. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <sched.h>
#include <time.h>

/* A thread start that can be made to fail (the nth, counted from the
   reset), to prove a pf_create failing after some threads exist has run no
   user callback. */
static int fail_thread_at, threads_started;
#define PF__THREAD_START(t, fn, arg) \
    (++threads_started == fail_thread_at ? -1 : pf__thread_start((t), (fn), (arg)))
/* pf_next loads by default when loads are cheap (under 50 us): here,
   whatever a sanitizer makes them cost, so that no timing decides it */
#define PF__HELP_MAX_NS 10000000000u
#define PF__HELP_DEAR_NS 50000000u /* and 50 ms, not 100 us, ending it for loads turned dear */
#define PF__PARK_TRY_S 1.0 /* and trying pf_next alone after a failed help trial */
static unsigned t_ncpu; /* not 0: the CPUs a loader made now believes it has */
#define PF__CPU_COUNT() (t_ncpu ? t_ncpu : pf__cpu_count())
/* not below 0: the share of the clock the caller's thread is said to use */
static double t_cpu_share = -1, t_proc_busy = -1;
#define PF__THREAD_CPU_NS() (t_cpu_share >= 0 ? (uint64_t)((double)pf__now_ns() * t_cpu_share) : pf__thread_cpu_ns())
#define PF__PROC_CPU_NS() (t_proc_busy >= 0 ? (uint64_t)((double)pf__now_ns() * t_proc_busy) : pf__cpu_ns())
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"
#include "util.h"

/* ---- the consumers ---- */

typedef struct shared {
    tcons *c;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pf_batch queue[64]; /* batches handed to the releaser threads */
    int qlen, consumers_done, timeouts, errors;
    uint64_t delivered;
    unsigned char *seen; /* per (epoch, batch): times delivered */
    uint64_t per_epoch;
    int stop_stats;
} shared;

static void push_release(shared *sh, const pf_batch *b) {
    pthread_mutex_lock(&sh->mu);
    while (sh->qlen == 64) pthread_cond_wait(&sh->cv, &sh->mu); /* bounded by the releasers */
    sh->queue[sh->qlen++] = *b;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

static void *consumer(void *arg) {
    shared *sh = (shared *)arg;
#ifdef TEST_SIM
    CHECK(cudaSetDevice(0) == cudaSuccess); /* its kernel stand-ins run on device 0 */
#endif
    for (int n = 0;; n++) {
        pf_batch b;
        pf_result r = t_next(sh->c, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r == PF_TIMEOUT) {
            pthread_mutex_lock(&sh->mu);
            sh->timeouts++;
            pthread_mutex_unlock(&sh->mu);
            continue;
        }
        if (r == PF_ERR_INVALID_STATE) { /* every slot held, their releases queued for the releasers */
            sched_yield();
            continue;
        }
        if (r != PF_OK) {
            if (r != PF_END_OF_DATA) {
                pthread_mutex_lock(&sh->mu);
                sh->errors++;
                pthread_mutex_unlock(&sh->mu);
            }
            break;
        }
        pthread_mutex_lock(&sh->mu);
        sh->seen[b.epoch * sh->per_epoch + b.batch]++;
        sh->delivered++;
        pthread_mutex_unlock(&sh->mu);
        if (n % 2) push_release(sh, &b); /* half released by another thread */
        else t_release(sh->c, &b);
    }
    pthread_mutex_lock(&sh->mu);
    sh->consumers_done++;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    return NULL;
}

static int consumers_total;

static void *releaser(void *arg) {
    shared *sh = (shared *)arg;
    pthread_mutex_lock(&sh->mu);
    for (;;) {
        while (!sh->qlen && sh->consumers_done < consumers_total) pthread_cond_wait(&sh->cv, &sh->mu);
        if (!sh->qlen) break;
        pf_batch b = sh->queue[--sh->qlen];
        pthread_cond_broadcast(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
        t_release(sh->c, &b);
        pthread_mutex_lock(&sh->mu);
    }
    pthread_mutex_unlock(&sh->mu);
    return NULL;
}

static void *stats_reader(void *arg) {
    shared *sh = (shared *)arg;
    for (;;) {
        pf_stats st;
        char line[256];
        pthread_mutex_lock(&sh->mu);
        int stop = sh->stop_stats;
        pthread_mutex_unlock(&sh->mu);
        if (stop) break;
        pf_get_stats(sh->c->l, &st);
        CHECKF(st.wait_s <= st.elapsed_s + 1e-9, "waited %.6f s of %.6f", st.wait_s, st.elapsed_s);
        CHECK(st.held_slots + st.free_slots + st.loading_slots + st.ready_slots + st.copying_slots <= st.host_slots);
        (void)pf_stats_format(sh->c->l, line, sizeof line);
        sched_yield();
    }
    return NULL;
}

static void run_many(int consumers, bool unordered, uint32_t timeout_ms, unsigned long long seed, bool in_pf_next) {
    tload t;
    tcons c;
    shared sh;
    pf_config cfg;
    pthread_t cth[4], rth[2], sth;
    pf_stats st;
    const uint64_t n = 600, bs = 4, epochs = 3;
    double t0;
    t_load_init(&t);
    t.max_delay_us = 300;
    t_begin(&c, seed);
    memset(&sh, 0, sizeof sh);
    pthread_mutex_init(&sh.mu, NULL);
    pthread_cond_init(&sh.cv, NULL);
    sh.c = &c;
    sh.per_epoch = n / bs;
    sh.seen = (unsigned char *)calloc(epochs * sh.per_epoch, 1);
    cfg = t_config(&t, n, (uint32_t)bs, (uint32_t)epochs);
    cfg.unordered = unordered;
    cfg.shuffle = true;
    cfg.timeout_ms = timeout_ms ? timeout_ms : T_WAIT_MS;
    cfg.host_slots = 6;
    cfg.device_slots = 4;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    if (in_pf_next && pf_get_backend(c.l) == PF_BACKEND_HOST) { /* what autotune sets for cheap loads */
        pf__lock(&c.l->sync.mu);
        c.l->at.active = 0;
        pf__unlock(&c.l->sync.mu);
    }
    consumers_total = consumers;
    t0 = h_now();
    for (int i = 0; i < consumers; i++) pthread_create(&cth[i], NULL, consumer, &sh);
    for (int i = 0; i < 2; i++) pthread_create(&rth[i], NULL, releaser, &sh);
    pthread_create(&sth, NULL, stats_reader, &sh);
    for (int i = 0; i < consumers; i++) pthread_join(cth[i], NULL);
    for (int i = 0; i < 2; i++) pthread_join(rth[i], NULL);
    pthread_mutex_lock(&sh.mu);
    sh.stop_stats = 1;
    pthread_mutex_unlock(&sh.mu);
    pthread_join(sth, NULL);
    pf_get_stats(c.l, &st);
    /* exactly once: every batch of every epoch, by whichever thread */
    CHECK_EQ(sh.delivered, epochs * sh.per_epoch);
    for (uint64_t k = 0; k < epochs * sh.per_epoch; k++)
        CHECKF(sh.seen[k] == 1, "epoch %llu batch %llu delivered %d times", (unsigned long long)(k / sh.per_epoch),
               (unsigned long long)(k % sh.per_epoch), sh.seen[k]);
    CHECK_EQ(sh.errors, 0);
    /* stats against the wall clock */
    CHECK_EQ(st.batches, epochs * sh.per_epoch);
    CHECKF(st.wait_s <= st.elapsed_s, "waited %.6f s of %.6f s", st.wait_s, st.elapsed_s);
    CHECKF(st.elapsed_s <= h_now() - t0, "elapsed %.6f s, the run took %.6f s", st.elapsed_s, h_now() - t0);
    if (h_verbose)
        printf("    %d consumers, %s, timeout %u ms: %d timeouts, waited %.3f of %.3f s\n", consumers,
               unordered ? "unordered" : "in order", timeout_ms, sh.timeouts, st.wait_s, st.elapsed_s);
    t_end(&c);
    free(sh.seen);
    pthread_mutex_destroy(&sh.mu);
    pthread_cond_destroy(&sh.cv);
    t_load_free(&t);
}

static void test_two_to_four_consumers_exactly_once(void) {
    for (int consumers = 2; consumers <= 4; consumers++)
        for (int unordered = 0; unordered < 2; unordered++)
            run_many(consumers, unordered, 0, h_seed * 10 + (unsigned)consumers, false);
}

/* pf_next loading (no worker active) with several consumer threads: one
   loads at a time through the extra record, the others wait or take what
   it published; every batch exactly once. */
static void test_consumers_while_pf_next_loads_exactly_once(void) {
    for (int unordered = 0; unordered < 2; unordered++) run_many(3, unordered, 0, h_seed * 10 + 7, true);
}

static void test_consumers_with_short_timeouts_exactly_once(void) {
    for (int unordered = 0; unordered < 2; unordered++) run_many(3, unordered, 2, h_seed * 10 + 7, false);
}

/* ---- defect 1: a lost wake-up between two consumers ----
   A waits, B waits; A's timeout passes; then batch 0 becomes ready. B must
   be woken by it, not sleep to its own deadline (with a flag, A cleared
   "a consumer waits" on its way out and B was forgotten). */
typedef struct waiter {
    tcons *c;
    pf_result r;
    double returned;
} waiter;

static void *wait_one(void *arg) {
    waiter *w = (waiter *)arg;
    pf_batch b;
    w->r = pf_next(w->c->l, &b);
    w->returned = h_now();
    if (w->r == PF_OK) t_release(w->c, &b);
    return NULL;
}

static void test_no_lost_wakeup_between_two_consumers(void) {
    tload t;
    tcons c;
    pf_config cfg;
    waiter a, b;
    pthread_t ta, tb;
    double opened;
    t_load_init(&t);
    t.gate_epoch = 0;
    t.gate_batch = 0; /* batch 0 loads only when the gate opens */
    t_begin(&c, h_seed);
    c.on_host = 1; /* the waiters do not check batches in kernels: t_end checks the loader */
    cfg = t_config(&t, 40, 4, 1);
    cfg.timeout_ms = 1000;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.c = b.c = &c;
    pthread_create(&ta, NULL, wait_one, &a);
    t_sleep_us(500000); /* B starts half a timeout later: its deadline is 500 ms after A's */
    pthread_create(&tb, NULL, wait_one, &b);
    pthread_join(ta, NULL);
    CHECK_EQ(a.r, PF_TIMEOUT);
    t_gate_open(&t); /* batch 0 is ready now, B still waits */
    opened = h_now();
    pthread_join(tb, NULL);
    CHECKF(b.r == PF_OK, "B got %d", (int)b.r);
    /* B's own deadline is 500 ms after the gate opened: a lost wake-up
       shows as B sleeping to it (then finding the batch), so bound the
       wake-up well short of that */
    CHECKF(b.returned - opened < 0.35, "B returned %.0f ms after its batch was ready: its wake-up was lost",
           (b.returned - opened) * 1e3);
    if (h_verbose) printf("    B returned %.1f ms after the batch was ready\n", (b.returned - opened) * 1e3);
    t_end(&c);
    t_load_free(&t);
}

/* ---- defect 3: waits above 100% with two consumers ---- */
static void test_two_waiting_consumers_count_once(void) {
    tload t;
    tcons c;
    pf_config cfg;
    waiter a, b;
    pthread_t ta, tb;
    pf_stats st;
    t_load_init(&t);
    t.gate_epoch = 0;
    t.gate_batch = 0;
    t_begin(&c, h_seed);
    c.on_host = 1;
    cfg = t_config(&t, 40, 4, 1);
    cfg.timeout_ms = 300;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.c = b.c = &c;
    pthread_create(&ta, NULL, wait_one, &a); /* both wait the same 300 ms */
    pthread_create(&tb, NULL, wait_one, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK_EQ(a.r, PF_TIMEOUT);
    CHECK_EQ(b.r, PF_TIMEOUT);
    pf_get_stats(c.l, &st);
    CHECKF(st.wait_s <= st.elapsed_s, "waited %.3f s of %.3f s: the two waits were counted twice", st.wait_s,
           st.elapsed_s);
    CHECK(st.wait_s >= 0.25); /* and the overlap counted once, not dropped */
    t_gate_open(&t);
    t_end(&c);
    t_load_free(&t);
}

/* ---- defect 4: elapsed_s is the span to the latest pf_next ---- */
static void test_elapsed_runs_to_the_latest_pf_next(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    pf_batch b;
    pf_stats st;
    double t0 = 0, t_last = 0;
    int n = 0;
    t_open(&t, &c, &r);
    cfg = t_config(&t, 160, 4, 1); /* 40 batches: past the old every-16th refresh */
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    for (;;) {
        pf_result x;
        if (!t0) t0 = h_now(); /* before the first pf_next: its wait counts in elapsed_s */
        x = t_next(&c, &b);
        if (x != PF_OK) {
            CHECK_EQ(x, PF_END_OF_EPOCH);
            t_last = h_now();
            break;
        }
        t_release(&c, &b);
        n++;
        t_sleep_us(5000); /* a 5 ms step */
    }
    CHECK_EQ(n, 40);
    t_sleep_us(100000);
    CHECK_EQ(pf_next(c.l, &b), PF_END_OF_DATA); /* 100 ms after the end of the epoch */
    t_last = h_now();
    pf_get_stats(c.l, &st);
    /* from the first pf_next to the one that said END_OF_DATA: at least the
       40 steps and the 100 ms, at most the wall clock between them */
    CHECKF(st.elapsed_s >= 40 * 0.005 + 0.1, "elapsed %.3f s: stale", st.elapsed_s);
    CHECKF(st.elapsed_s <= t_last - t0 + 0.001, "elapsed %.3f s, wall %.3f s", st.elapsed_s, t_last - t0);
    t_close(&t, &c, &r);
}

/* ---- defect 10: a pf_create that fails after starting threads ---- */
static void test_failed_create_ran_no_callback(void) {
    int most = 3 + 2; /* workers, and on CUDA the stager and the retirer */
    for (int at = 1; at <= most; at++) {
        tload t;
        pf_config cfg;
        pf_loader *l = (pf_loader *)&cfg;
        tcons c;
        pf_result r;
        t_load_init(&t);
        t_begin(&c, h_seed);
        cfg = t_config(&t, 40, 4, 1);
        cfg.on_worker_start = t_worker_start;
        cfg.stream = NULL;
#ifdef TEST_SIM
        cfg.stream = c.stream;
#endif
        threads_started = 0;
        fail_thread_at = at;
        r = pf_create(&cfg, &l);
        fail_thread_at = 0;
        if (at > 3 && threads_started < at) { /* the host backend starts no stager or retirer */
            CHECK_EQ(r, PF_OK);
            pf_destroy(l);
        } else {
            CHECKF(r == PF_ERR_THREAD, "failing thread start %d: %d", at, (int)r);
            CHECK(l == NULL);
            CHECK_CONTAINS(pf_error(NULL), "could not start");
            CHECK_EQ(t.loads, 0); /* no load ran */
            for (int w = 0; w < 3; w++) CHECKF(t.worker_starts[w] == 0, "on_worker_start ran on worker %d", w);
        }
        t_end(&c);
        t_load_free(&t);
    }
}

/* ---- autotune ---- */

static double t_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct phased {
    int slow;            /* load sleeps 2 ms (a slow store) or returns at once */
    int gate_batch;      /* >= 0: this batch waits until cancelled             */
    int logged, grew, shrank, nomem, nomem_warned, reverted;
    int serial;          /* loads take turns on one lock: more workers cannot help */
    pthread_mutex_t one; /* that lock */
    pthread_mutex_t mu;
} phased;

static int phased_load(void *user, pf_job *job) {
    phased *p = (phased *)user;
    uint64_t *w = (uint64_t *)job->host;
    if ((int)job->batch == __atomic_load_n(&p->gate_batch, __ATOMIC_ACQUIRE) && job->epoch == 0)
        while (!pf_job_cancelled(job)) t_sleep_us(1000); /* a stuck read: only destroy ends it */
    if (p->serial) {
        pthread_mutex_lock(&p->one);
        t_sleep_us(1000);
        pthread_mutex_unlock(&p->one);
    }
    if (__atomic_load_n(&p->slow, __ATOMIC_ACQUIRE)) t_sleep_us(2000);
#ifdef TEST_SIM
    cudaSimHostWrite(job->host, 8 * (job->count + 1));
#endif
    w[0] = job->rng;
    for (uint32_t i = 0; i < job->count; i++) w[1 + i] = job->indices[i];
    job->bytes = 8 * (job->count + 1);
    return 0;
}

static void phased_log(void *user, int level, const char *msg) {
    phased *p = (phased *)user;
    if (strstr(msg, "could not allocate")) {
        pthread_mutex_lock(&p->mu);
        p->nomem++;
        p->nomem_warned += level == PF_LOG_WARN;
        pthread_mutex_unlock(&p->mu);
    }
    if (level != PF_LOG_DEBUG || strncmp(msg, "autotune: ", 10)) return;
    if (h_verbose > 1) printf("      %s\n", msg);
    pthread_mutex_lock(&p->mu);
    p->logged++;
    p->grew += strstr(msg, "input-bound") != NULL;
    p->shrank += strstr(msg, "compute-bound") != NULL;
    p->reverted += strstr(msg, "more workers did not help") != NULL; /* a worker trial; not pf_next loading */
    pthread_mutex_unlock(&p->mu);
}

static pf_config phased_config(phased *p, tcons *c, uint64_t batches) {
    pf_config cfg = t_config_base(batches * 4, 4, 8 * 5, 1);
    cfg.load = phased_load;
    cfg.user = p;
    cfg.num_workers = 8;
    cfg.host_slots = 17;
    cfg.autotune = true;
    cfg.log = phased_log;
    cfg.log_user = p;
#ifdef TEST_SIM
    cfg.stream = c->stream;
#else
    (void)c;
#endif
    return cfg;
}

/* ...with 1 MiB batches, the host copy checked: the ring is 2W+1, and
   autotune's grows with the workers (t_begin done here) */
static pf_config phased_big_config(phased *p, tcons *c, uint64_t batches) {
    pf_config cfg;
    t_begin(c, h_seed);
    c->on_host = 1;
    cfg = phased_config(p, c, batches);
    cfg.batch_bytes = (size_t)1 << 20;
    cfg.host_slots = 0;
    return cfg;
}

static void phased_init(phased *p) {
    memset(p, 0, sizeof *p);
    p->gate_batch = -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->one, NULL);
}

/* Starved, it grows; then compute-bound with idle workers, it shrinks; and
   it says so in the log, at debug level. The order never changes. */
static void test_autotune_grows_when_starved_and_shrinks_when_compute_bound(void) {
    phased p;
    tcons c;
    pf_config cfg;
    pf_stats st;
    uint32_t peak = 0;
    char line[256];
    phased_init(&p);
    p.slow = 1;
    t_begin(&c, h_seed);
    cfg = phased_config(&p, &c, 700);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    pf_get_stats(c.l, &st);
    CHECK_EQ(st.workers_active, 1); /* it starts small */
    for (int k = 0; k < 700; k++) {
        pf_batch b;
        CHECK_EQ(pf_next(c.l, &b), PF_OK);
        if (k == 200) { /* the slow phase ends; the consumer now computes 2 ms a batch */
            pf_get_stats(c.l, &st);
            peak = st.workers_active;
            __atomic_store_n(&p.slow, 0, __ATOMIC_RELEASE);
        }
        if (k > 200) t_sleep_us(2000);
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
    }
    pf_get_stats(c.l, &st);
    CHECKF(peak >= 4, "starved for 200 batches, it reached only %u workers", peak);
    CHECKF(st.workers_active < peak, "compute-bound for 500 batches, it kept %u of %u workers", st.workers_active, peak);
    CHECK(st.workers_active >= 1 && st.workers_active <= 8);
    pf_stats_format(c.l, line, sizeof line);
    CHECK_CONTAINS(line, st.workers_active == 1 ? " 1 worker (auto)" : " workers (auto)");
    CHECK(p.grew > 0);
    CHECK(p.shrank > 0);
    if (h_verbose) printf("    peak %u workers, then %u; %d changes logged; %s\n", peak, st.workers_active, p.logged, line);
    t_end(&c);
    pthread_mutex_destroy(&p.mu);
}

/* Memory follows what runs: with big batches the ring starts with what one
   worker needs (2W+1 = 3 slots) and grows as workers are added, never past
   what the most workers that ran need, nor the ceiling's ring; every batch still arrives once, in order. On the
   simulated runtime the grown slots are pinned blocks of their own,
   allocated on the consumer's thread and freed by destroy. */
static void test_autotune_ring_grows_with_workers(void) {
    phased p;
    tcons c;
    pf_config cfg;
    pf_stats st;
    uint32_t peak = 0, slots = 0, asked;
    phased_init(&p);
    p.slow = 1;
    cfg = phased_big_config(&p, &c, 240); /* the default ring: 2 * 8 + 1 = 17 at most */
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    pf_get_stats(c.l, &st);
    CHECK_EQ(st.workers_active, 1);
    CHECK_EQ(st.host_slots, 3);
    for (uint64_t k = 0; k < 240; k++) {
        pf_batch b;
        CHECK_EQ(pf_next(c.l, &b), PF_OK);
        CHECK_EQ(b.batch, k);
        pf_get_stats(c.l, &st);
        if (st.workers_active > peak) peak = st.workers_active;
        /* it shrinks only after a trial failed (on a busy machine one may) */
        CHECKF(st.host_slots >= slots || __atomic_load_n(&p.reverted, __ATOMIC_ACQUIRE) > 0,
               "the ring shrank from %u to %u slots with no failed trial", slots, st.host_slots);
        slots = st.host_slots;
        CHECK(slots <= 17);
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
    }
    CHECKF(peak >= 2, "starved for 240 batches, it ran only %u workers", peak);
    CHECKF(slots > 3, "%u workers ran and the ring stayed at %u slots", peak, slots);
    /* the ring it asked for (a worker may still be allocating it: under
       TSan touching 10 MiB takes a while): a count on trial gets at least
       a slot per worker, one held and one ready; a kept one 2W+1 */
    pf__lock(&c.l->sync.mu);
    asked = c.l->ring.grow_to > c.l->ring.nalloc ? c.l->ring.grow_to : c.l->ring.nalloc;
    pf__unlock(&c.l->sync.mu);
    pf_get_stats(c.l, &st);
    if (__atomic_load_n(&p.reverted, __ATOMIC_ACQUIRE) > 0) /* the peak was a failed trial: its slots went back */
        CHECKF(asked >= st.workers_active + 2 || asked == 17, "%u workers run with a ring of %u slots",
               st.workers_active, asked);
    else
        CHECKF(asked >= peak + 2 || asked == 17, "%u workers ran with a ring of %u slots", peak, asked);
    CHECKF(asked <= 2 * peak + 1, "at most %u workers ran, yet the ring grew to %u slots", peak, asked);
    if (h_verbose) printf("    peak %u workers, %u slots, %u asked for\n", peak, slots, asked);
    t_end(&c);
    pthread_mutex_destroy(&p.mu);
}

/* A trial that fails gives its slots back: the loads take turns on one
   lock, so a second worker cannot help; autotune tries one, sees no gain,
   goes back to one worker, and the slots grown for the trial are freed
   once they are free (host: cfg.allocator; simulated CUDA: cudaFreeHost).
   Every batch still arrives once, in order. */
/* The ring of W kept workers: 2W+1 slots, or one more where a kept
   trial's growth was rounded up to a whole huge page (two 1 MiB slots:
   under load, 1 -> 2 workers kept grew 4 -> 6, blocks [3,4) and [4,6),
   and the second block cannot go back by halves) */
static bool kept_ring(uint32_t slots, uint32_t workers) {
    uint32_t ring = 2 * workers + 1;
#ifdef PF__HUGE
    return slots == ring || slots == ring + 1;
#else
    return slots == ring;
#endif
}
static void test_autotune_failed_trial_gives_its_slots_back(void) {
    bool grew = false, reverted = false;
    /* a trial judged before its worker grew the ring (TSan on a loaded
       box: 1 run in 3; under make test's other suites, 4 in a row once)
       has no slots to give back: such a run is run again */
    for (int attempt = 0; attempt < 8 && !grew; attempt++) {
        phased p;
        tcons c;
        pf_config cfg;
        pf_stats st;
        uint32_t most = 0;
        uint64_t k = 0;
        phased_init(&p);
        p.serial = 1;
        cfg = phased_big_config(&p, &c, 1200);
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
        for (; k < 1200; k++) { /* bounded: 1200 batches of 1 ms */
            pf_batch b;
            CHECK_EQ(pf_next(c.l, &b), PF_OK);
            CHECK_EQ(b.batch, k);
            CHECK_EQ(pf_release(c.l, &b), PF_OK);
            pf_get_stats(c.l, &st);
            if (st.host_slots > most) most = st.host_slots;
            /* back to the ring of the workers it kept (a noisy first trial may
               keep 2, then fail with more) */
            if (__atomic_load_n(&p.reverted, __ATOMIC_ACQUIRE) && most > st.host_slots &&
                kept_ring(st.host_slots, st.workers_active))
                break;
        }
        /* on a loaded box more workers get more of the CPU, so a trial can
           pass (2 hogs beside it: 2 runs in 20): run again */
        reverted = p.reverted > 0;
        grew = reverted && most > st.host_slots;
        if (grew)
            CHECKF(kept_ring(st.host_slots, st.workers_active), "after the failed trial the ring kept %u slots for %u "
                   "workers (it grew to %u)", st.host_slots, st.workers_active, most);
        for (k++; k < 1200; k++) { /* the rest, still in order */
            pf_batch b;
            CHECK_EQ(pf_next(c.l, &b), PF_OK);
            CHECK_EQ(b.batch, k);
            CHECK_EQ(pf_release(c.l, &b), PF_OK);
        }
        if (h_verbose) printf("    run %d: grew to %u slots, back to %u; %d changes logged\n", attempt, most,
                              st.host_slots, p.logged);
        t_end(&c); /* every block freed once: no leak, no double free */
        pthread_mutex_destroy(&p.mu);
        pthread_mutex_destroy(&p.one);
    }
    CHECKF(reverted, "in 8 runs no trial failed");
    CHECKF(grew, "in 8 runs no failed trial grew slots to give back");
}

/* Autotune grows the host ring in whole huge pages where a slot or so
   more makes it so: one 1 MiB slot alone would be 256 page faults of
   4 KiB, two are one of 2 MiB. Slots that do not divide 2 MiB, or bigger
   ones, grow by what was asked; never past host_slots. */
static int nothing(void *user, pf_job *job);
/* The ring grows to `slots` (pf__ring_for), by this thread or a worker;
   lock held. */
static void ring_grow_to(pf_loader *l, uint32_t slots) {
    pf__ring_for(l, slots, false);
    for (int i = 0; i < 5000 && (l->ring.growing || l->ring.grow_to > l->ring.nalloc); i++) { /* bounded: 5 s */
        if (pf__grow_due(l)) {
            pf__grow(l); /* or a worker does, meanwhile */
            continue;
        }
        pf__unlock(&l->sync.mu);
        t_sleep_us(1000);
        pf__lock(&l->sync.mu);
    }
    CHECK(!l->ring.growing);
}
/* the slots a growth by `more` adds to the ring pf_create made */
static uint32_t grown_by(size_t batch_bytes, uint32_t host_slots, uint32_t more) {
    pf_config cfg = t_config_base(64, 1, batch_bytes, 1);
    pf_loader *l;
    uint32_t n0;
    cfg.load = nothing;
    cfg.autotune = 1;
    cfg.num_workers = 16; /* the ceiling: a ring of up to 33 slots */
    cfg.host_slots = host_slots;
    cfg.backend = PF_BACKEND_HOST;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    pf__lock(&l->sync.mu);
    n0 = l->ring.nalloc;
    ring_grow_to(l, n0 + more);
    n0 = l->ring.nalloc - n0;
    pf__unlock(&l->sync.mu);
    pf_destroy(l);
    return n0;
}
static void test_autotune_grows_in_huge_pages(void) {
#ifndef PF__HUGE /* no huge pages to fill: as asked */
    CHECK_EQ(grown_by((size_t)1 << 20, 0, 1), 1u);
    return;
#endif
    CHECK_EQ(grown_by((size_t)1 << 20, 0, 1), 2u);   /* 1 MiB slots: 1 -> 2 */
    CHECK_EQ(grown_by((size_t)1 << 20, 0, 3), 4u);   /* 3 -> 4 */
    CHECK_EQ(grown_by((size_t)1 << 20, 0, 2), 2u);   /* 2: as asked */
    CHECK_EQ(grown_by((size_t)512 << 10, 0, 1), 4u); /* 512 KiB: 1 -> 4 */
    CHECK_EQ(grown_by((size_t)1 << 20, 4, 1), 1u);   /* not past host_slots (pf_create made 3) */
    CHECK_EQ(grown_by((size_t)768 << 10, 0, 1), 1u); /* 768 KiB does not divide 2 MiB: as asked */
    CHECK_EQ(grown_by((size_t)4 << 20, 0, 1), 1u);   /* bigger than a huge page: as asked */
}

/* Memory follows the count down too: once it has settled
   (pf__ring_follow), the grown blocks above what it needs go back, a
   block with a held slot once that slot is released. A caller that then
   holds every slot left gets the block back (pf__take_host), where it
   used to wait for ever (the block's free slots were out of the free
   stack). */
/* as after PF__RING_SETTLE periods (and PF__RING_SETTLE_NS) at this count,
   the caller holding what it holds now throughout */
static bool ring_follow_now(pf_loader *l) {
    bool retired;
    pf__lock(&l->sync.mu);
    pf__take_released(l); /* as pf_next's frame has, before autotune looks: releases are counted */
    l->cons.held_most = l->cons.held;
    l->at.steady = 0;
    l->at.peak_n = l->at.held_peak = 0; /* no more workers ran lately, nor more held */
    for (uint32_t i = 0; i < PF__RING_SETTLE; i++)
        pf__ring_follow(l, i + 1 < PF__RING_SETTLE ? (uint64_t)i : (uint64_t)PF__RING_SETTLE_NS);
    retired = l->ring.retire_from != 0;
    pf__unlock(&l->sync.mu);
    return retired;
}
static void test_autotune_ring_follows_the_count_down(void) {
    pf_config cfg = t_config_base(1000, 1, (size_t)1 << 20, 1); /* big: the ring is 2W+1 */
    pf_loader *l;
    pf_batch held[4], b;
    pf_stats st;
    uint32_t n = 0, k;
    cfg.load = nothing;
    cfg.autotune = 1;
    cfg.num_workers = 4; /* a ring of up to 9 slots */
    cfg.timeout_ms = 10000; /* the old code's hang, bounded */
    cfg.backend = PF_BACKEND_HOST;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    pf__lock(&l->sync.mu);
    CHECK_EQ(l->ring.nalloc, 3u); /* one worker's */
    ring_grow_to(l, 9);
    CHECK_EQ(l->ring.nalloc, 9u);
    CHECK_EQ(l->ring.grown_from[l->ring.ngrown - 1], 3u);
    pf__unlock(&l->sync.mu);
    /* under 32 batches in all: autotune judges no period meanwhile */
    for (k = 0; k < 12 && !n; k++) { /* hold one batch in the grown block */
        CHECK_EQ(pf_next(l, &b), PF_OK);
        if (b.pf__slot >= 3) held[n++] = b;
        else CHECK_EQ(pf_release(l, &b), PF_OK);
    }
    CHECKF(n == 1, "12 batches and none in a slot autotune grew");
    {
        bool retired = ring_follow_now(l); /* 1 worker settled: 3 slots, with the held one's a 3rd */
        pf__lock(&l->sync.mu);
        CHECKF(retired, "no block retired: %u workers, %u held, newest block from slot %u of %u (%u asked), "
               "growing %d, trials %d %d %d", l->at.active, l->cons.held, l->ring.grown_from[l->ring.ngrown - 1],
               l->ring.nalloc, l->ring.grow_to, l->ring.growing, l->at.probing, l->at.help_trial, l->at.park_trial);
        pf__unlock(&l->sync.mu);
    }
    pf__lock(&l->sync.mu);
    CHECK_EQ(l->ring.retire_from, 3u);
    CHECK_EQ(l->ring.nalloc, 9u); /* not yet: a slot of it is held */
    pf__unlock(&l->sync.mu);
    for (k = 0; k < 16 && n < 4; k++) { /* the 3 slots that stay, held too */
        CHECK_EQ(pf_next(l, &b), PF_OK);
        if (b.pf__slot < 3) held[n++] = b;
        else CHECK_EQ(pf_release(l, &b), PF_OK); /* loaded before: it goes out once released */
    }
    CHECKF(n == 4, "the caller holds %u batches", n);
    CHECK_EQ(pf_next(l, &b), PF_OK); /* the block is wanted again: no hang */
    pf__lock(&l->sync.mu);
    CHECK_EQ(l->ring.retire_from, 0u);
    pf__unlock(&l->sync.mu);
    CHECK_EQ(pf_release(l, &b), PF_OK);
    for (k = 0; k < n; k++) CHECK_EQ(pf_release(l, &held[k]), PF_OK);
    CHECKF(ring_follow_now(l), "nothing held, and no block retired"); /* all of it goes, once its ready batches are taken */
    for (k = 0; k < 2000; k++) { /* bounded: 2000 batches, 2 s */
        pf_get_stats(l, &st);
        if (st.host_slots == 3) break;
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(b.batch, st.batches); /* in order throughout */
        CHECK_EQ(pf_release(l, &b), PF_OK);
        if (k % 8 == 7) t_sleep_us(1000); /* a worker frees it */
    }
    CHECKF(st.host_slots == 3, "the grown block was not given back: %u slots", st.host_slots);
    pf_destroy(l);
}

/* A worker's wait for a free slot counts while it lasts (pf_get_stats,
   and autotune's idle share, read through the same flush): counted only
   when it ended, 16 workers woken a batch of free slots at a time beside
   a 500 us step read 0% idle in most periods and 300% in some, never
   over half three periods in a row, and never parked (an outside trial:
   16 workers and 33 slots of 1 MiB where 4 do). */
static void test_worker_slot_wait_counts_while_it_lasts(void) {
    pf_config cfg = t_config_base(1000, 1, 4096, 1);
    pf_loader *l;
    pf_stats st;
    double w1, w2;
    int i;
    cfg.load = nothing;
    cfg.num_workers = 1;
    cfg.host_slots = 3;
    cfg.backend = PF_BACKEND_HOST;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    if (!l) return;
    /* nothing taken: the worker fills the 3 slots and waits for a fourth */
    for (i = 0; i < 500; i++) { /* bounded: 10 s */
        pf_get_stats(l, &st);
        if (st.worker_wait_s > 0) break;
        t_sleep_us(20000);
    }
    w1 = st.worker_wait_s;
    CHECKF(w1 > 0, "the worker has waited for a slot for %d ms and none of it is counted", i * 20);
    t_sleep_us(50000);
    pf_get_stats(l, &st);
    w2 = st.worker_wait_s;
    CHECKF(w2 - w1 >= 0.045, "50 ms more of the same wait counted as %.1f ms", (w2 - w1) * 1e3);
    pf_destroy(l);
}

/* A burst of held batches is kept in the ring for PF__RING_PEAK_NS, as
   the most workers are, and then given back: the most held was kept
   from the first period of a settled window until a look gave a block
   back, and with nothing else moving the window (pf_next loading alone,
   an outside trial) a caller that once held 20 batches of 1 MiB kept 21
   slots for good. Looks every 0.2 s, driven by hand. */
static void test_autotune_ring_forgets_a_burst_of_held_batches(void) {
    pf_config cfg = t_config_base(1000, 1, (size_t)1 << 20, 1);
    pf_loader *l;
    uint32_t k, given_back = 0;
    cfg.load = nothing;
    cfg.autotune = 1;
    cfg.num_workers = 4;
    cfg.host_slots = 9;
    cfg.backend = PF_BACKEND_HOST;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    if (!l) return;
    pf__lock(&l->sync.mu);
    ring_grow_to(l, 9); /* as a caller holding 6 at once grew it */
    CHECK_EQ(l->ring.grown_from[l->ring.ngrown - 1], 3u);
    l->at.active = 1;
    l->at.steady = 0;
    l->at.peak_n = l->at.held_peak = 0;
    for (k = 0; k < 60 && !given_back; k++) { /* 12 s of looks */
        uint64_t now = (uint64_t)k * 200000000u;
        l->cons.held_most = k == 0 ? 6u : 1u; /* 6 held at once in the first period, 1 since */
        pf__ring_follow(l, now);
        if (l->ring.retire_from) given_back = k;
        /* kept while the burst is recent: 6 held and a worker need 8 */
        CHECKF(l->ring.retire_from == 0 || now > PF__RING_PEAK_NS, "the burst's slots went back at %.1f s",
               (double)now / 1e9);
    }
    CHECKF(given_back, "held 6 once, 1 for 12 s since: the ring kept %u slots (newest block from %u)",
           l->ring.nalloc, l->ring.grown_from[l->ring.ngrown - 1]);
    CHECK_EQ(l->ring.retire_from, 3u);
    pf__unlock(&l->sync.mu);
    pf_destroy(l);
}

/* Spins that never pay back off for good: the budget stays at its least,
   and the full spins that probe whether spinning pays again come every
   8th, 16th ... 256th time while they fail (a failed probe used to restart
   the halving from 10 us: 5 us of CPU a wait); one that pays restores the
   full budget and the probes every 8th. */
static void test_failed_spin_probes_back_off(void) {
    pf_config cfg = t_config_base(64, 1, 64, 1);
    pf_loader *l;
    uint32_t probes = 0, first[8], spent = 0, k, budget;
    bool probe;
    const int role = PF__ROLE_CONSUMER;
    cfg.load = nothing;
    cfg.num_workers = 1;
    cfg.backend = PF_BACKEND_HOST;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    pf__lock(&l->sync.mu);
    l->sync.spin_ns[role] = PF_SPIN_MAX_NS;
    for (k = 0; k < 2000; k++) {
        budget = pf__spin_budget(l, role, &probe);
        if (probe) {
            CHECK_EQ(budget, (uint32_t)PF_SPIN_MAX_NS);
            if (probes < 8) first[probes] = k;
            probes++;
        } else if (k > 20) {
            CHECKF(budget == PF__SPIN_MIN_NS, "wait %u: a budget of %u ns after spins that never paid", k, budget);
        }
        spent += budget;
        pf__spin_adapt(l, role, budget, probe, false);
    }
    /* the halving from 20 us, then probes 8, 16, ... 256 waits apart: at
       waits 8, 24, 56, 120, 248, 504, then every 256th up to 1784 */
    CHECKF(probes == 11, "%u probes in 2000 waits", probes);
    CHECK(probes >= 2 && first[1] - first[0] == 16 && first[2] - first[1] == 32);
    CHECKF(spent / 2000 < 1500, "%u ns a wait spent spinning", spent / 2000);
    while (!probe) budget = pf__spin_budget(l, role, &probe);
    pf__spin_adapt(l, role, budget, probe, true); /* a probe that pays */
    CHECK_EQ(l->sync.spin_ns[role], (uint32_t)PF_SPIN_MAX_NS);
    CHECK_EQ(l->sync.spin_every[role], PF__SPIN_PROBE_MIN);
    pf__unlock(&l->sync.mu);
    pf_destroy(l);
}

/* With the default allocator a host slot block leaves the process when it
   is freed (pf__slots_alloc maps it): glibc's malloc kept a freed block of
   up to 32 MiB in its heap once its mmap threshold had risen (as freeing
   any big block raises it), so a ring autotune shrank stayed resident. */
static long rss_kib(void) {
    long pages = -1, resident = -1;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
    fclose(f);
    return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}
static void test_freed_slots_leave_the_process(void) {
#ifdef __linux__
    pf_config cfg = t_config_base(64, 1, (size_t)8 << 20, 1);
    pf_loader *l;
    long before, live, after;
    unsigned char *big = (unsigned char *)malloc((size_t)24 << 20);
    CHECK(big != NULL);
    memset(big, 1, (size_t)24 << 20);
    free(big); /* malloc's mmap threshold is 24 MiB now: a 16 MiB block would come from its heap */
    cfg.load = nothing;
    cfg.num_workers = 1;
    cfg.host_slots = 2; /* 16 MiB of slots, touched at pf_create */
    cfg.backend = PF_BACKEND_HOST;
    before = rss_kib();
    CHECK(before > 0);
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    live = rss_kib();
    pf_destroy(l);
    after = rss_kib();
    if (h_verbose) printf("    resident: %ld KiB, %ld with the loader, %ld after\n", before, live, after);
    CHECKF(live - before >= 15 * 1024, "16 MiB of slots made %ld KiB resident", live - before);
    CHECKF(live - after >= 15 * 1024, "pf_destroy left %ld of the loader's %ld KiB resident", after - before,
           live - before);
#endif
}

/* pf_next loading alone (no worker active) waits while a worker grows the
   ring, holding every slot: the growth's end wakes it. It used to wake the
   workers alone, who parked, and pf_next slept for ever (an outside
   trial, 4 runs in 5 under TSan; older than the shrinking ring). */
static void *finish_growth(void *arg) {
    pf_loader *l = (pf_loader *)arg;
    t_sleep_us(100000); /* pf_next is asleep by then, or soon */
    pf__lock(&l->sync.mu);
    l->ring.growing = false; /* as the worker that was growing ends, it grows */
    if (pf__grow_due(l)) pf__grow(l);
    pf__unlock_wake(l);
    return NULL;
}
static void test_pf_next_alone_wakes_when_the_ring_grows(void) {
    pf_config cfg = t_config_base(1000, 1, (size_t)1 << 20, 1);
    pf_loader *l;
    pf_batch held[3], b;
    pthread_t th;
    cfg.load = nothing;
    cfg.autotune = 1;
    cfg.num_workers = 4; /* a ring of up to 9 slots; pf_create makes 3 */
    cfg.timeout_ms = 0;  /* the old code's hang: the harness's watchdog bounds it (a deadline would end the
                            sleep, and the growth done by then would hide it) */
    cfg.backend = PF_BACKEND_HOST;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    for (int k = 0; k < 3; k++) CHECK_EQ(pf_next(l, &held[k]), PF_OK);
    pf__lock(&l->sync.mu);
    CHECK_EQ(l->ring.nalloc, 3u);
    l->at.active = 0;         /* pf_next loads alone: the workers park */
    l->ring.growing = true;   /* a worker is growing the ring */
    pf__ring_for(l, 4, false); /* and one more slot is asked for */
    pf__unlock(&l->sync.mu);
    CHECK_EQ(pthread_create(&th, NULL, finish_growth, l), 0);
    CHECK_EQ(pf_next(l, &b), PF_OK); /* waits for the growth, then loads into it */
    CHECK_EQ(b.batch, 3u);
    CHECK_EQ(pthread_join(th, NULL), 0);
    CHECK_EQ(pf_release(l, &b), PF_OK);
    for (int k = 0; k < 3; k++) CHECK_EQ(pf_release(l, &held[k]), PF_OK);
    pf_destroy(l);
}

/* End to end: starved, the ring grows with the workers; then loads turn
   free and the consumer computes, the count comes down, and the ring
   follows it (an outside trial: 23 slots of 16 MiB stayed for the rest of
   the run at 1 worker). */
static void test_autotune_ring_shrinks_when_the_count_settles_lower(void) {
    phased p;
    tcons c;
    pf_config cfg;
    pf_stats st;
    uint32_t peak = 0, k;
    phased_init(&p);
    p.slow = 1;
    cfg = phased_big_config(&p, &c, 5000);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    for (k = 0; k < 5000; k++) { /* bounded: 10 s of steps */
        pf_batch b;
        CHECK_EQ(pf_next(c.l, &b), PF_OK);
        CHECK_EQ(b.batch, k);
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
        pf_get_stats(c.l, &st);
        if (st.host_slots > peak) peak = st.host_slots;
        if (k == 300) __atomic_store_n(&p.slow, 0, __ATOMIC_RELEASE); /* starved until here */
        if (k > 300) {
            t_sleep_us(2000); /* compute-bound: the workers idle */
            if (st.host_slots < peak && st.host_slots <= 2 * st.workers_active + 2) break;
        }
    }
    CHECKF(peak > 3, "starved for 300 batches, the ring stayed at %u slots", peak);
    CHECKF(st.host_slots < peak && st.host_slots <= 2 * st.workers_active + 2,
           "the ring grew to %u slots and kept %u for %u workers", peak, st.host_slots, st.workers_active);
    if (h_verbose) printf("    ring %u -> %u slots (%u workers) after %u batches\n", peak, st.host_slots,
                          st.workers_active, k);
    t_end(&c);
    pthread_mutex_destroy(&p.mu);
    pthread_mutex_destroy(&p.one);
}

/* A loader of 2 ms loads into 1 MiB slots (batches of them) whose
   first growth fails, once: the allocator on the host, cudaHostAlloc on
   CUDA. And its end: nothing raced or leaked. */
static void failing_growth_begin(phased *p, tcons *c, talloc *a, uint64_t batches) {
    pf_config cfg;
    phased_init(p);
    p->slow = 1;
    cfg = phased_big_config(p, c, batches);
#ifdef TEST_SIM
    t_alloc_init(a, 0);
    cudaSimFailNth("cudaHostAlloc", 2, cudaErrorMemoryAllocation, 0);
#else
    t_alloc_init(a, 3); /* bookkeeping and slots in pf_create, then the first growth */
#endif
    cfg.allocator.alloc_fn = t_alloc;
    cfg.allocator.free_fn = t_free;
    cfg.allocator.user_data = a;
    CHECK_EQ(t_create(c, &cfg), PF_OK);
}
static void failing_growth_end(phased *p, tcons *c, talloc *a) {
    t_end(c);
#ifdef TEST_SIM
    cudaSimClearFaults();
#endif
    CHECK_EQ(a->live, 0);
    pthread_mutex_destroy(&a->mu);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->one);
}

/* A growth that failed once is tried again (after PF__AT_RETRY periods):
   the memory may come back, and one failed cudaHostAlloc held an outside
   trial's ring at 3 slots for good. */
static void test_autotune_ring_grows_again_after_a_failed_allocation(void) {
    phased p;
    tcons c;
    pf_stats st;
    talloc a;
    double until;
    failing_growth_begin(&p, &c, &a, 5000);
    until = t_now_s() + 20; /* bounded: 2 ms loads, 8 periods of 20 ms or more after the failure */
    for (uint64_t k = 0; k < 5000 && t_now_s() < until; k++) {
        pf_batch b;
        CHECK_EQ(pf_next(c.l, &b), PF_OK);
        CHECK_EQ(b.batch, k);
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
        pf_get_stats(c.l, &st);
        if (st.host_slots > 3) break;
    }
    pf_get_stats(c.l, &st);
    CHECK_EQ(p.nomem, 1);
    CHECKF(st.host_slots > 3, "the ring stayed at %u slots after one failed allocation", (unsigned)st.host_slots);
    failing_growth_end(&p, &c, &a);
}

/* The ring cannot grow (the allocator or cudaHostAlloc fails): it says so,
   keeps its 3 slots, autotune stays within the 2 workers they keep busy,
   and every batch still arrives once, in order. */
static void test_autotune_ring_that_cannot_grow(void) {
    phased p;
    tcons c;
    pf_stats st;
    talloc a;
    uint32_t peak = 0;
    failing_growth_begin(&p, &c, &a, 160);
    for (uint64_t k = 0; k < 160; k++) {
        pf_batch b;
        CHECK_EQ(pf_next(c.l, &b), PF_OK);
        CHECK_EQ(b.batch, k);
        pf_get_stats(c.l, &st);
        if (st.workers_active > peak) peak = st.workers_active;
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
    }
    pf_get_stats(c.l, &st);
    CHECK_EQ(st.host_slots, 3);
    CHECK(st.workers_active <= 2);
    CHECKF(peak >= 2, "starved, it tried only %u workers", peak);
    CHECK_EQ(p.nomem, 1); /* said once, then it stopped trying (for PF__AT_RETRY periods) */
    CHECK_EQ(p.nomem_warned, 1); /* at WARN: throughput is held back by memory */
    failing_growth_end(&p, &c, &a);
}

/* A host loader whose loads do nothing, for periods judged by hand
   (batches of `bytes`: judged_loader's are 64) */
static pf_loader *judged_loader_of(uint32_t workers, bool autotune, size_t bytes) {
    pf_config cfg = t_config_base(64, 1, bytes, 1);
    pf_loader *l = NULL;
    cfg.load = nothing;
    cfg.autotune = autotune;
    cfg.num_workers = workers;
    cfg.backend = PF_BACKEND_HOST;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    return l;
}
static pf_loader *judged_loader(uint32_t workers, bool autotune) { return judged_loader_of(workers, autotune, 64); }
/* One autotune period judged by hand, its figures set: 40 batches in 40
   ms, 32 of them waiting (input-bound), 1 ms loads, 2 CPUs. */
typedef struct judged {
    uint32_t workers, last_n; /* the count in the period, and in the one before */
    double thr_last;          /* the one before's batches/s */
    double load_last;         /* ...and its load per batch (0: this one's, 1 ms) */
    bool cpu;                 /* the loads never sleep (the CPU cap's verdict) */
    bool cheap;               /* cheap enough for pf_next: no worker more for it (cap_plus) */
    uint64_t next_loads;      /* pf_next's of the 40 */
    uint32_t trial_from;      /* not 0: the period is a trial's, from this count... */
    double trial_thr;         /* ...which made this many batches/s */
    uint32_t stage;           /* in: the trial's periods before it that did not pass (0-2); out: after it (0: judged) */
    unsigned ms;              /* the period's length (0: 40 ms) */
    double load;              /* its load per batch (0: 1 ms) */
    double busy;              /* the cores the process kept busy in it (0: not known) */
    double thr_before;        /* out: what an increase is judged against */
    uint32_t cap;             /* in: the count a failed trial holds (0: none); out: after */
    double idle;              /* the workers' time waiting for a free slot, a share of theirs */
    double behind;            /* the wait's share behind a late batch, the ring full */
    bool copy;                /* the wait was behind copies (CUDA), not for input */
    double most_ms;           /* the longest pf_next's wait behind a late batch (0: not measured) */
} judged;
static uint32_t judged_period(pf_loader *l, judged *p) {
    uint64_t now;
    uint32_t active;
    bool on;
    uint32_t was;
    pf__lock(&l->sync.mu);
    on = l->at.probing, was = l->at.behind_was; /* a trial the call before started */
    l->sync.ncpu = 2;
    l->ring.capped = p->cpu;
    l->ring.cap_plus = !p->cheap; /* 1 ms loads: a worker more than CPUs may, where pf_next does not load */
    l->ring.cap_flip = 0;
    l->ring.load_est = 1000000;
    l->at.active = p->workers;
    l->at.last_n = p->last_n;
    l->at.thr_last = p->thr_last;
    l->at.load_last = p->load_last > 0 ? p->load_last : 1e-3;
    l->at.probing = l->at.help = l->at.help_trial = l->at.park_trial = l->at.shrunk = false;
    if (p->trial_from) { /* started as autotune starts one, from trial_from */
        uint32_t seen = l->at.probe_stage; /* its periods judged by the calls before */
        l->at.active = p->trial_from;
        pf__trial_start(l, p->trial_thr, 1e-3 /* the same loads */, (double)p->workers / p->trial_from - 1);
        if (on) l->at.behind_was = was; /* what that one found before it */
        l->at.active = p->workers;
        if (p->stage == 2 && seen != 2) l->at.probe_n = 0, l->at.probe_s = 0; /* a second period not seen */
        l->at.probe_stage = p->stage;
    }
    l->at.inline_wait = 0;
    l->at.cap = p->cap ? p->cap : l->cfg.num_workers;
    l->at.floor = 1;
    l->at.cpu0 = 0; /* no verdict on the process's CPU time... */
    now = pf__now_ns();
    l->st.batches += 40;
    if (p->copy) l->st.wait_copy_ns += 32000000u;
    else l->st.wait_input_ns += 32000000u;
    l->st.load_ns += p->load > 0 ? (uint64_t)(p->load * 40e9) : 40000000u;
    l->st.call_ns += 40000000u;
    l->at.batches0 = l->st.batches - 40;
    l->at.wait0 = l->st.wait_input_ns + l->st.wait_copy_ns - 32000000u;
    l->at.input0 = l->st.wait_input_ns - (p->copy ? 0 : 32000000u);
    l->at.load0 = l->st.load_ns - (p->load > 0 ? (uint64_t)(p->load * 40e9) : 40000000u);
    l->at.call0 = l->st.call_ns - 40000000u;
    l->st.worker_wait_ns += (uint64_t)(p->idle * (p->ms ? p->ms : 40u) * 1e6 * l->at.active);
    l->at.wwait0 = l->st.worker_wait_ns - (uint64_t)(p->idle * (p->ms ? p->ms : 40u) * 1e6 * l->at.active);
    l->st.wait_behind_ns += (uint64_t)(p->behind * 32e6);
    l->at.behind0 = l->st.wait_behind_ns - (uint64_t)(p->behind * 32e6);
    l->at.behind_most = (uint64_t)(p->most_ms * 1e6);
    l->at.next0 = l->st.next_loads;
    l->st.next_loads += p->next_loads;
    l->at.t0 = now - (p->ms ? p->ms : 40u) * (uint64_t)1000000;
    l->st.last_ns = now;
    if (p->busy > 0) /* ...unless given: as much CPU time as that, by the next read */
        l->at.cpu0 = pf__cpu_ns() - (uint64_t)(p->busy * (p->ms ? p->ms : 40u) * 1e6);
    pf__autotune(l);
    active = l->at.active;
    p->thr_before = l->at.thr_before;
    p->stage = l->at.probing ? l->at.probe_stage : 0;
    p->cap = l->at.cap;
    pf__unlock(&l->sync.mu);
    return active;
}
#define JUDGED(...) judged_period(l, &(judged){__VA_ARGS__})

/* Past the CPUs, with loads that never sleep, autotune tries one more
   worker only from a period at its count that was not a trial's first
   (its new workers were starting; a trial passed on such a period, and 1
   ms CPU loads on 2 cores ran on 3 workers and 8 slots where 2 need 5),
   and judges the trial against the better of that period and the one
   before it. */
static void test_autotune_past_the_cpus_from_a_steady_period(void) {
    pf_loader *l = judged_loader(4, true);
    judged p = {.workers = 2, .last_n = 2, .thr_last = 1500, .cpu = true};
    /* the period after a trial (the one before ran 1 worker): 2 stay */
    CHECK_EQ(JUDGED(.workers = 2, .last_n = 1, .cpu = true), 2u);
    /* a period at 2 after one at 2: the third is tried, judged against the
       better of the two (about 1,000 batches/s here, 1,500 before) */
    CHECK_EQ(judged_period(l, &p), 3u);
    CHECKF(p.thr_before == 1500, "judged against %.0f batches/s", p.thr_before);
    /* a trial kept on its second period: the first is no period at
       the count, and no worker past the CPUs is tried on it */
    CHECK_EQ(JUDGED(.workers = 2, .last_n = 2, .cpu = true, .trial_from = 1, .trial_thr = 500, .stage = 2), 2u);
    CHECK_EQ(JUDGED(.workers = 2, .last_n = 2, .cpu = true), 3u); /* the next one is */
    /* the period before was slower: this one's */
    p.thr_last = 10;
    CHECK_EQ(judged_period(l, &p), 3u);
    CHECKF(p.thr_before > 500 && p.thr_before < 1100, "judged against %.0f batches/s", p.thr_before);
    /* pf_next loaded 20 of the 40 beside 2 workers, loads that never
       sleep: it takes a CPU, the one worker more (for a pf_next that does
       not load) is not given, and one worker is left beside it */
    CHECK_EQ(JUDGED(.workers = 2, .last_n = 2, .cpu = true, .next_loads = 20), 1u);
    CHECK_EQ(JUDGED(.workers = 3, .last_n = 3, .cpu = true, .next_loads = 20), 1u); /* the count a dear phase left */
    CHECK_EQ(JUDGED(.workers = 3, .last_n = 3, .cpu = true), 3u); /* it did not load: 3 stay */
    /* cheaper loads (the cap: as many as CPUs), the caller's CPU time
       not counted busy: the same */
    CHECK_EQ(JUDGED(.workers = 2, .last_n = 2, .cpu = true, .cheap = true, .next_loads = 20), 1u);
    CHECK_EQ(JUDGED(.workers = 2, .last_n = 2, .cpu = true, .cheap = true), 2u); /* it did not load: 2 stay */
    pf_destroy(l);
}

/* A ceiling a failed trial set while the loads never slept (not tried
   again while they do not) goes once they sleep: a first verdict on 8
   copies, then 1 load in 8 sleeping 5 ms, ran on 1 worker for good (an
   outside trial). */
static void test_autotune_cpu_ceiling_goes_when_loads_sleep(void) {
    pf_loader *l = judged_loader(16, true);
    judged p = {.workers = 2, .last_n = 2, .cpu = true, .trial_from = 1, .trial_thr = 1000, .stage = 2};
    CHECK_EQ(judged_period(l, &p), 1u); /* failed: back to 1, a ceiling at 1 */
    CHECK_EQ(p.cap, 1u);
    CHECK_EQ(JUDGED(.workers = 1, .last_n = 1, .cap = 1, .cpu = true), 1u); /* the loads never sleep: held */
    CHECK(JUDGED(.workers = 1, .last_n = 1, .cap = 1) > 1u);                /* they sleep: tried again */
    pf_destroy(l);
}

/* A ceiling goes once the load drifts from the one it was set at two
   periods in a row. One set by a failed trial while an older ceiling was
   held starts its count afresh: the older one's drifting period is not
   the new one's first (it kept its streak, and went after one). */
static void test_autotune_new_ceiling_counts_its_own_drift(void) {
    pf_loader *l = judged_loader(16, true);
    /* a ceiling of 8 held, its load unlike this period's; a trial of 2 ->
       4 in it fails: a ceiling at 2, set at the trial's load (1 ms) */
    judged p = {.workers = 4, .cpu = true, .trial_from = 2, .trial_thr = 1000, .stage = 2, .cap = 8, .load = 4e-3};
    CHECK_EQ(judged_period(l, &p), 2u);
    CHECK_EQ(p.cap, 2u);
    /* one period at twice its load: held */
    p = (judged){.workers = 2, .last_n = 2, .cpu = true, .cap = 2, .load = 2e-3};
    judged_period(l, &p);
    CHECKF(p.cap == 2u, "the ceiling went after one drifting period: %u", (unsigned)p.cap);
    /* the second in a row: it goes */
    p = (judged){.workers = 2, .last_n = 2, .cpu = true, .cap = 2, .load = 2e-3};
    judged_period(l, &p);
    CHECKF(p.cap == 16u, "the ceiling held after two drifting periods: %u", (unsigned)p.cap);
    pf_destroy(l);
}

/* A trial is judged against the better of its period and the one before
   only where the one before is of the same loads and not twice as fast: a
   memcpy phase's 700k batches/s before 1 ms loads undid every trial of
   more workers for the loads (an outside trial: 1 worker at 1841
   batches/s where 16 make 13k). */
static void test_autotune_baseline_of_the_same_loads(void) {
    pf_loader *l = judged_loader(16, true);
    judged p = {.workers = 1, .last_n = 1, .thr_last = 700000, .load_last = 1.4e-6};
    CHECK_EQ(judged_period(l, &p), 2u); /* input-bound: a trial */
    CHECKF(p.thr_before > 500 && p.thr_before < 1100, "judged against %.0f batches/s", p.thr_before);
    p = (judged){.workers = 1, .last_n = 1, .thr_last = 2500}; /* the same loads, 2.5x as fast */
    CHECK_EQ(judged_period(l, &p), 2u);
    CHECKF(p.thr_before > 500 && p.thr_before < 1100, "judged against %.0f batches/s", p.thr_before);
    p = (judged){.workers = 1, .last_n = 1, .thr_last = 1500, .load_last = 1.2e-3}; /* noise */
    CHECK_EQ(judged_period(l, &p), 2u);
    CHECKF(p.thr_before == 1500, "judged against %.0f batches/s", p.thr_before);
    pf_destroy(l);
}

/* A trial far above the count it comes from gets the full ring for its
   count where that is small (8 MiB or less), not b + n + 1 slots: 10 ->
   22 workers of 64 KiB batches ran short of slots (33, where 22 fixed
   workers have 45, and run at half the speed with 33); and a slot more
   where pf_next loads a loader's share */
static void test_autotune_trial_ring(void) {
    for (int big = 0; big < 2; big++) {
        pf_config cfg = t_config_base(64, 1, big ? (size_t)1 << 20 : (size_t)64 << 10, 1);
        pf_loader *l = NULL;
        cfg.load = nothing;
        cfg.autotune = true;
        cfg.num_workers = 64;
        cfg.backend = PF_BACKEND_HOST;
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        if (!l) return;
        pf__lock(&l->sync.mu);
        l->at.active = 10;
        CHECK_EQ(pf__trial_slots(l, 22), big ? 33u : 45u); /* 1 MiB: 45 would be 45 MiB */
        CHECK_EQ(pf__trial_slots(l, 11), big ? 22u : 32u); /* 64 KiB: the small ring's 32 (2 MiB) */
        l->at.caller_loads = true; /* pf_next loads a loader's share: a slot more */
        CHECK_EQ(pf__trial_slots(l, 11), big ? 23u : 32u);
        l->at.active = 1;
        CHECK_EQ(pf__trial_slots(l, 2), big ? 5u : 32u); /* 1 + 2 + 1 + 1: 2's full ring, no more */
        l->at.caller_loads = false;
        pf__unlock(&l->sync.mu);
        pf_destroy(l);
    }
}

/* In order, a load that stalls holds the consumer while the other
   workers fill every slot behind it: the ring, not the workers, bounds
   how far they get past it (1 load in 8 sleeping 5 ms among 1 MiB
   copies: 4 fixed workers make 2.7k batches/s with their 9 slots, 4.5k
   with 18, and autotune failed every trial from 1 worker, 0.20 of 16
   fixed: an outside trial). Where over half the consumer's wait was
   behind such a batch, or it waited over half the period while the
   workers waited for a slot over half of theirs, a trial gets the ring
   that would have lasted the period (this one over the share not stuck,
   up to 10 times; at least twice its count's ring; at most host_slots),
   keeps it if kept (until the load changes) and gives it back if not.
   1 MiB batches: 2n + 1 slots for n workers, 33 at most. */
static uint32_t ring_asked(pf_loader *l) {
    uint32_t n;
    pf__lock(&l->sync.mu);
    n = l->ring.grow_to > l->ring.keep_to ? l->ring.grow_to : l->ring.keep_to;
    l->ring.grow_to = l->ring.keep_to = l->ring.nalloc; /* the next ask shows alone */
    pf__unlock(&l->sync.mu);
    return n;
}
static uint32_t ring_now(pf_loader *l) {
    uint32_t n;
    pf__lock(&l->sync.mu);
    n = l->ring.nalloc;
    pf__unlock(&l->sync.mu);
    return n;
}
static void test_autotune_trial_behind_a_late_batch_gets_more_slots(void) {
    const size_t mib = (size_t)1 << 20;
    for (int why = 0; why < 4; why++) { /* none; behind a late batch; idle workers; idle nearly all the time */
        pf_loader *l = judged_loader_of(16, true, mib);
        judged p = {.workers = 2, .last_n = 2, .behind = why == 1 ? 0.75 : 0.3, .idle = why >= 2 ? (why == 3 ? 0.95 : 0.6) : 0.3};
        ring_asked(l);
        uint32_t want = why == 3 ? (uint32_t)(ring_now(l) / (1 - 0.95)) + 1 : 18u; /* the ring over 1 - 0.95 at most */
        if (want > 33) want = 33;
        CHECK_EQ(judged_period(l, &p), 4u); /* 1 ms loads over a 0.2 ms step: doubled */
        /* 2 + 4 + 1 slots (4's 9 MiB ring is no small one), or more */
        CHECKF(ring_asked(l) == (why ? want : 7u), "why %d: the trial's ring", why);
        p = (judged){.workers = 4, .last_n = 2, .trial_from = 2, .trial_thr = 500}; /* twice as fast: kept */
        CHECK(judged_period(l, &p) >= 4u);
        CHECKF(ring_asked(l) >= (why ? want : 9u), "why %d: the kept ring", why);
        if (why == 1) {
            /* held while the load stays: a later trial's ring is at least that */
            uint32_t n = JUDGED(.workers = 4, .last_n = 4);
            CHECK(n > 4);
            CHECK_EQ(ring_asked(l), 2 * n + 1 > 18u ? 2 * n + 1 : 18u);
            /* a failure gives the slots back only where that trial set them */
            p = (judged){.workers = 8, .last_n = 4, .trial_from = 4, .trial_thr = 5000, .stage = 2};
            CHECK_EQ(judged_period(l, &p), 4u);
            pf__lock(&l->sync.mu);
            CHECKF(l->at.behind == 18u && l->ring.shrink_to == 18u, "after a failure: behind %u, shrink to %u",
                   (unsigned)l->at.behind, (unsigned)l->ring.shrink_to);
            pf__unlock(&l->sync.mu);
            /* the load changes (2 ms, two periods): the ring is its count's again */
            JUDGED(.workers = 4, .last_n = 4, .load = 2e-3, .load_last = 2e-3, .cap = 4);
            JUDGED(.workers = 4, .last_n = 4, .load = 2e-3, .load_last = 2e-3, .cap = 4);
            pf__lock(&l->sync.mu);
            CHECKF(!l->at.behind, "the load changed: still %u slots", (unsigned)l->at.behind);
            l->at.active = 4;
            CHECK_EQ(pf__trial_slots(l, 8), 4u + 8u + 1u);
            pf__unlock(&l->sync.mu);
        }
        pf_destroy(l);
    }
    /* a trial that set it, failed: the count's own ring again */
    {
        pf_loader *l = judged_loader_of(16, true, mib);
        judged p = {.workers = 2, .last_n = 2, .behind = 0.75};
        CHECK_EQ(judged_period(l, &p), 4u);
        p = (judged){.workers = 4, .last_n = 2, .trial_from = 2, .trial_thr = 5000, .stage = 2};
        CHECK_EQ(judged_period(l, &p), 2u);
        pf__lock(&l->sync.mu);
        CHECKF(!l->at.behind && l->ring.shrink_to == 5u, "after its failure: behind %u, shrink to %u",
               (unsigned)l->at.behind, (unsigned)l->ring.shrink_to);
        pf__unlock(&l->sync.mu);
        pf_destroy(l);
    }
}

/* The ring for a stall is the one that would have lasted the period, or
   fewer: the one that covers the longest stall (this ring and what the
   consumer would have taken while it waited, at the pace kept while not
   stuck; many short stalls in a period: 4 MiB slots on CUDA, 1 load in 8
   sleeping 5 ms, got 26-37 slots at 3-4 workers where 3 with 17 make as
   much; an outside trial); at least the count's own ring (twice it where
   the longest stall is not known). */
static void test_autotune_slots_for_a_stall_cover_the_longest(void) {
    const size_t mib = (size_t)1 << 20;
    for (int measured = 0; measured <= 1; measured++) {
        pf_loader *l = judged_loader_of(16, true, mib);
        /* stuck 80% of a 40 ms period, 40 batches: 3 slots over 0.2 are
           15-16 (the period's clock runs a little past 40 ms); a longest
           stall of 1 ms covers the 3 slots and 1 / 8 ms of 40 batches, 5:
           8 (2 workers' own ring is 5, twice it 10) */
        judged p = {.workers = 2, .last_n = 1, .trial_from = 1, .trial_thr = 1000, .stage = 2, .behind = 1.0,
                    .most_ms = measured ? 1.0 : 0};
        uint32_t behind;
        CHECK_EQ(judged_period(l, &p), 1u);
        pf__lock(&l->sync.mu);
        behind = l->at.behind;
        CHECKF(pf__behind_slots(l, 0.8, 2, 12) == 13u && pf__behind_slots(l, 0.8, 2, 40) == 16u,
               "cover 12: %u, cover 40: %u", (unsigned)pf__behind_slots(l, 0.8, 2, 12),
               (unsigned)pf__behind_slots(l, 0.8, 2, 40));
        pf__unlock(&l->sync.mu);
        /* a retry needs a quarter more slots, at least 2: no creep a slot at a time */
        CHECK(pf__more_slots(5) == 7u && pf__more_slots(40) == 50u);
        CHECKF(measured ? behind >= 8u && behind <= 9u : behind >= 15u && behind <= 16u, "longest stall %s: %u slots", measured ? "1 ms" : "unknown",
               (unsigned)behind);
        pf_destroy(l);
    }
}

/* Waiting behind copies (CUDA, a copy engine at its limit) with the
   workers waiting for slots is no stall: more slots only pin more memory
   (an outside trial: 3 workers of 4 MiB batches went from 5 slots to
   129, 516 MiB pinned, for nothing). The same wait for input is. */
static void test_autotune_waits_behind_copies_get_no_more_slots(void) {
    const size_t mib = (size_t)1 << 20;
    for (int copy = 0; copy <= 1; copy++) {
        pf_loader *l = judged_loader_of(16, true, mib);
        judged p = {.workers = 2, .last_n = 2, .idle = 0.6, .copy = copy};
        ring_asked(l);
        CHECK_EQ(judged_period(l, &p), 4u); /* input-bound either way: doubled */
        CHECKF(copy ? ring_asked(l) == 7u : ring_asked(l) > 7u, "behind %s: the trial's ring", copy ? "copies" : "input");
        pf_destroy(l);
    }
}

/* A trial that waited behind a late batch with no slots for it failed
   for want of slots, not workers: tried again with the ring that would
   have lasted it, and no ceiling. From one worker nothing waits behind a
   late batch before a trial shows it (on CUDA, 1 load in 8 sleeping 5 ms
   into 4 MiB slots stayed at 1-2 workers for good: 0.4 of 8 fixed, an
   outside trial). With those slots and still behind, it is a failure. */
static void test_autotune_trial_short_of_slots_is_tried_with_more(void) {
    const size_t mib = (size_t)1 << 20;
    pf_loader *l = judged_loader_of(16, true, mib);
    judged p = {.workers = 2, .last_n = 1, .trial_from = 1, .trial_thr = 1000, .stage = 2, .behind = 0.75};
    uint32_t more;
    CHECK_EQ(judged_period(l, &p), 1u); /* not faster: back to 1... */
    CHECK_EQ(p.cap, 16u);               /* ...with no ceiling */
    pf__lock(&l->sync.mu);
    more = l->at.behind;
    pf__unlock(&l->sync.mu);
    CHECKF(more > 5u, "the ring for the next trial: %u slots (2 workers': 5)", (unsigned)more);
    ring_asked(l);
    CHECK(JUDGED(.workers = 1, .last_n = 1) > 1u); /* tried again... */
    CHECK(ring_asked(l) >= more);                  /* ...with them */
    /* not behind a late batch: a failure */
    p = (judged){.workers = 2, .last_n = 1, .trial_from = 1, .trial_thr = 1000, .stage = 2, .behind = 0.3};
    CHECK_EQ(judged_period(l, &p), 1u);
    CHECK_EQ(p.cap, 1u);
    /* behind one with every slot there is (host_slots): a failure too */
    pf__lock(&l->sync.mu);
    l->at.behind = l->ring.nslots;
    pf__unlock(&l->sync.mu);
    p = (judged){.workers = 2, .last_n = 1, .trial_from = 1, .trial_thr = 1000, .stage = 2, .behind = 0.75};
    CHECK_EQ(judged_period(l, &p), 1u);
    CHECK_EQ(p.cap, 1u);
    pf_destroy(l);
    /* every core busy: a late batch may be one whose worker the scheduler
       took off its core, and slots do not help; a failure (CPU loads with
       stalls past the CPUs took 129 slots for nothing: an outside trial) */
    l = judged_loader_of(16, true, mib);
    p = (judged){.workers = 2, .last_n = 1, .trial_from = 1, .trial_thr = 1000, .stage = 2, .behind = 0.75, .busy = 2};
    CHECK_EQ(judged_period(l, &p), 1u);
    CHECK_EQ(p.cap, 1u);
    pf_destroy(l);
}


/* The wait counted as behind a late batch (st.wait_behind_ns): in order,
   the next batch still loading while every slot is taken, later ones
   loaded. Batch 0's load waits for the test; the other 3 workers fill
   the ring (64 slots of 8 bytes) behind it; then pf_next waits until
   another thread lets batch 0 end, 20 ms later. */
static int late_first_load(void *user, pf_job *job) {
    int *go = (int *)user;
    double until = t_now_s() + 10; /* bounded */
    while (job->batch == 0 && !__atomic_load_n(go, __ATOMIC_ACQUIRE) && t_now_s() < until) t_sleep_us(200);
    job->bytes = 8;
    return 0;
}
static void *let_batch_0_go(void *arg) {
    t_sleep_us(20000);
    __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
    return NULL;
}
static void test_autotune_counts_the_wait_behind_a_late_batch(void) {
    pf_config cfg = t_config_base(1000, 1, 8, 1);
    tcons c;
    pf_stats st;
    pf_batch b;
    pthread_t th;
    int go = 0;
    double until = t_now_s() + 10;
    uint64_t behind;
    /* on both backends: on CUDA the stager stages in order, and waits
       behind batch 0 as pf_next does on the host (uncounted, autotune
       stayed at 1-2 workers of 4 MiB batches: an outside trial) */
    t_begin(&c, 1);
    cfg.load = late_first_load;
    cfg.user = &go;
    cfg.num_workers = 4;
    cfg.autotune = true;
    cfg.workers_only = true; /* pf_next loads nothing: it waits */
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    if (!c.l) return;
    pf__lock(&c.l->sync.mu);
    c.l->at.active = 4;
    pf__wake(c.l, PF__ROLE_PARKED);
    pf__unlock_wake(c.l);
    do pf_get_stats(c.l, &st);
    while ((st.free_slots || st.ready_slots + 1 < st.host_slots) && t_now_s() < until);
    CHECKF(!st.free_slots && st.ready_slots + 1 == st.host_slots, "the ring did not fill behind batch 0: %u free, %u ready",
           (unsigned)st.free_slots, (unsigned)st.ready_slots);
    CHECK_EQ(pthread_create(&th, NULL, let_batch_0_go, &go), 0);
    CHECK_EQ(pf_next(c.l, &b), PF_OK);
    CHECK_EQ(b.batch, 0);
    pthread_join(th, NULL);
    pf__lock(&c.l->sync.mu);
    behind = c.l->st.wait_behind_ns;
    pf__unlock(&c.l->sync.mu);
    CHECKF(behind > 0, "pf_next waited behind batch 0 with the ring full, and %llu ns of it were counted",
           (unsigned long long)behind);
    CHECK_EQ(pf_release(c.l, &b), PF_OK);
    t_end(&c);
}

/* A failed trial's count holds while the loads stay the same, but with
   loads that sleep only for PF__AT_RETRY periods, twice as many after
   each failure in a row: a trial judged on two periods of 20 ms failed on
   noise or its new block's page faults now and then, and the count stayed
   for the whole phase (an outside trial: 8 of 16 workers at 0.6-0.7).
   With loads that never sleep, past the CPUs, it holds. */
static void test_autotune_retries_a_failed_trial(void) {
    pf_loader *l = judged_loader(8, true);
    judged p;
    uint32_t k;
    for (uint32_t round = 0; round < 2; round++) {
        p = (judged){.workers = 4, .last_n = 2, .trial_from = 2, .trial_thr = 5000, .stage = 2};
        CHECK_EQ(judged_period(l, &p), 2u); /* failed: back to 2, held there */
        CHECK_EQ(p.cap, 2u);
        for (k = 1; k < (PF__AT_RETRY << round); k++) {
            p = (judged){.workers = 2, .last_n = 2, .cap = p.cap};
            CHECK_EQ(judged_period(l, &p), 2u);
        }
        /* by a quarter, not doubling: the same jump would land past the
           best count again */
        p = (judged){.workers = 2, .last_n = 2, .cap = p.cap};
        CHECKF(judged_period(l, &p) == 3u, "round %u: no trial of 3 after %u periods", round, k);
    }
    /* the loads change (2 ms, two periods in a row): the failure no longer
       says anything, and a trial may go to 4 again */
    p = (judged){.workers = 4, .last_n = 2, .trial_from = 2, .trial_thr = 5000, .stage = 2};
    CHECK_EQ(judged_period(l, &p), 2u);
    CHECK_EQ(JUDGED(.workers = 2, .last_n = 2, .load = 2e-3, .load_last = 2e-3, .cap = 2), 2u);
    CHECK_EQ(JUDGED(.workers = 2, .last_n = 2, .load = 2e-3, .load_last = 2e-3), 4u);
    p = (judged){.workers = 3, .last_n = 2, .trial_from = 2, .trial_thr = 5000, .stage = 2, .cpu = true};
    CHECK_EQ(judged_period(l, &p), 2u); /* past the CPUs, loads that never sleep: failed */
    for (k = 0; k < 4 * PF__AT_RETRY_MAX; k++) {
        p = (judged){.workers = 2, .last_n = 2, .cpu = true, .cap = p.cap};
        CHECK_EQ(judged_period(l, &p), 2u);
    }
    pf_destroy(l);
}

/* A trial whose first period does not show a clear gain (PF__AT_CLEAR)
   is judged on the two after it (the first runs while its workers start
   and the ring grows: 200 us CPU loads under a sleeping step ran it 10-40%
   under 2 workers' pace, and 1 -> 2 failed on it in 10 runs of 25, an
   outside trial), on both periods' batches over both periods' time: one
   period 15% faster and the next 10% slower is not a gain (a period's
   figure swings by a fifth on a shared machine: trials kept on a high
   one took an outside trial's 50 us sleeps to 43-56 workers where 32 run
   fastest). The second alone passes where its gain is clear. Periods of
   40 batches. */
static void test_autotune_trial_judged_on_two_periods(void) {
    pf_loader *l = judged_loader(8, true);
    judged p = {.workers = 4, .last_n = 2, .trial_from = 2, .trial_thr = 5000}; /* 4 make no more than 2 did */
    CHECK_EQ(judged_period(l, &p), 4u); /* not on the ramp */
    CHECK_EQ(p.stage, 1u);
    p.last_n = 4;
    CHECK_EQ(judged_period(l, &p), 4u); /* nor on one period */
    CHECK_EQ(p.stage, 2u);
    CHECK_EQ(judged_period(l, &p), 2u); /* the third: undone */
    p = (judged){.workers = 4, .last_n = 2, .trial_from = 2, .trial_thr = 100}; /* far better than 2 did */
    CHECK(judged_period(l, &p) >= 4u); /* kept on its first period */
    CHECK_EQ(p.stage, 0u);
    p = (judged){.workers = 4, .last_n = 2, .trial_from = 2, .trial_thr = 650, .ms = 80}; /* a slow ramp... */
    CHECK_EQ(judged_period(l, &p), 4u);
    p.ms = 0;
    CHECK(judged_period(l, &p) >= 4u); /* ...then 1000 a second, over 1.5x: kept on the second alone */
    CHECK_EQ(p.stage, 0u);
    /* 4 made 880 batches/s; 5 make 1000 (14% more: not clear), 1000,
       then 800: 80 batches in 90 ms, 889, 1% more */
    p = (judged){.workers = 5, .last_n = 4, .trial_from = 4, .trial_thr = 880};
    CHECK_EQ(judged_period(l, &p), 5u);
    p.last_n = 5;
    CHECK_EQ(judged_period(l, &p), 5u);
    CHECK_EQ(p.stage, 2u);
    p.ms = 50;
    CHECK_EQ(judged_period(l, &p), 4u);
    /* 14% more, then 14% more again: kept on the third */
    p = (judged){.workers = 5, .last_n = 4, .trial_from = 4, .trial_thr = 880};
    CHECK_EQ(judged_period(l, &p), 5u);
    p.last_n = 5;
    CHECK_EQ(judged_period(l, &p), 5u);
    CHECK(judged_period(l, &p) >= 5u);
    CHECK_EQ(p.stage, 0u);
    /* the ramp is not counted: 1 -> 2 asks 25% over 760 batches/s (950);
       a first period at 500 (40 in 80 ms), then 1000 and 1000, is kept
       (with the ramp, 667 on the first two, 750 on all three: failed) */
    p = (judged){.workers = 2, .last_n = 1, .trial_from = 1, .trial_thr = 760, .ms = 80};
    CHECK_EQ(judged_period(l, &p), 2u);
    p.last_n = 2;
    p.ms = 0;
    CHECK_EQ(judged_period(l, &p), 2u);
    CHECK_EQ(p.stage, 2u);
    CHECK(judged_period(l, &p) >= 2u);
    CHECK_EQ(p.stage, 0u);
    pf_destroy(l);
}

/* CPU loads with pf_next loading a share while it waits, beside a worker
   a CPU but one: a worker per CPU instead is tried, kept if 5% faster
   (then pf_next's share no longer takes a CPU from the count), else not
   tried again until the load changes. 1 ms CPU loads with a 100 us step
   ran 1 worker + pf_next at 0.74 of 2 workers in 1 bench run of 2, hi
   being 1 and the process's 1.5 of 2 cores counted busy. */
static void test_autotune_a_worker_per_cpu_for_pf_next_share(void) {
    for (int pass = 0; pass < 2; pass++) {
        pf_loader *l = judged_loader(8, true);
        judged p;
        /* 1 worker, pf_next loaded 20 of 40, the consumer waited 80% */
        CHECK_EQ(JUDGED(.workers = 1, .last_n = 1, .cpu = true, .next_loads = 20), 2u);
        p = (judged){.workers = 2, .last_n = 1, .cpu = true, .next_loads = 20, .trial_from = 1,
                     .trial_thr = pass ? 500 : 5000, .stage = pass ? 0u : 2u};
        if (pass) {
            CHECK_EQ(judged_period(l, &p), 2u); /* twice as fast: kept */
            /* and held, pf_next still loading a share */
            CHECK_EQ(JUDGED(.workers = 2, .last_n = 2, .cpu = true, .next_loads = 20), 2u);
            CHECK_EQ(JUDGED(.workers = 2, .last_n = 2, .cpu = true, .next_loads = 20), 2u);
        } else {
            CHECK_EQ(judged_period(l, &p), 1u); /* slower: undone... */
            CHECK_EQ(JUDGED(.workers = 1, .last_n = 1, .cpu = true, .next_loads = 20), 1u); /* ...for good */
            CHECK_EQ(JUDGED(.workers = 1, .last_n = 1, .cpu = true, .next_loads = 20), 1u);
        }
        pf_destroy(l);
        /* the consumer waited 32 of 100 ms: pf_next is a loader, not a
           fill-in while it waits; no trial... */
        l = judged_loader(8, true);
        CHECK_EQ(JUDGED(.workers = 1, .last_n = 1, .cpu = true, .next_loads = 20, .ms = 100), 1u);
        CHECK_EQ(JUDGED(.workers = 1, .last_n = 1, .cpu = true, .next_loads = 20, .ms = 100, .busy = 1.9), 1u);
        /* ...unless the process left over a quarter of a core idle (the
           caller's step sleeps: 200 us CPU loads under a 20 us sleeping
           step ran 1 worker + pf_next at 0.72-0.78 of 2 workers for good,
           an outside trial) */
        CHECK_EQ(JUDGED(.workers = 1, .last_n = 1, .cpu = true, .next_loads = 20, .ms = 100, .busy = 1.4), 2u);
        pf_destroy(l);
        /* nor where a trial of a worker per CPU failed (the count it set) */
        l = judged_loader(8, true);
        CHECK_EQ(JUDGED(.workers = 1, .last_n = 1, .cpu = true, .next_loads = 20, .ms = 100, .busy = 1.4, .cap = 1), 1u);
        pf_destroy(l);
    }
}

/* The rise a trial is asked a quarter of counts pf_next by the share of
   the batches it loaded, in workers (at most one): 1 worker + pf_next
   loading a quarter of them is 1.33 loaders, and 2 workers a rise of 0.5,
   not 1 (200 us CPU loads under a sleeping step: 2 workers made 30-35%
   more, and 1 -> 2 asking 25% failed on noise, an outside trial). */
static void test_autotune_trial_rise_counts_pf_next_by_its_share(void) {
    static const struct { uint64_t next_loads; double need; } c[] = {
        {0, 1.25},      /* 1 -> 2: twice the loaders */
        {8, 1.15},      /* 8 of 40: a quarter of the worker's 32, 1.25 loaders */
        {20, 1.25},     /* half: a loader, and 1 -> 4 (twice the loaders) twice them */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        pf_loader *l = judged_loader(8, true);
        uint32_t want = c[i].next_loads >= 20 ? 4u : 2u;
        CHECK_EQ(JUDGED(.workers = 1, .last_n = 1, .next_loads = c[i].next_loads), want);
        double off;
        pf__lock(&l->sync.mu);
        off = l->at.gain_need - c[i].need;
        CHECKF(l->at.probing && off < 1e-9 && off > -1e-9, "%llu of 40 by pf_next: %.4f asked, not %.4f",
               (unsigned long long)c[i].next_loads, l->at.gain_need, c[i].need);
        pf__unlock(&l->sync.mu);
        pf_destroy(l);
    }
}

/* A big step must show a big gain: a quarter of the loaders' rise (at
   least 5%), and twice that to pass on its first period. 50 us sleeps into
   64 KiB slots went 22 -> 42 workers for 10% more batches, and one such
   trial in three passed on noise (an outside trial: 32 run fastest). */
static void test_autotune_big_step_needs_a_big_gain(void) {
    pf_loader *l = judged_loader(8, true);
    /* 2 -> 4: 25% more asked; 20% more on both periods is not enough */
    judged p = {.workers = 4, .last_n = 2, .trial_from = 2, .trial_thr = 833};
    CHECK_EQ(judged_period(l, &p), 4u);
    CHECK_EQ(p.stage, 1u);
    p.last_n = 4;
    CHECK_EQ(judged_period(l, &p), 4u);
    CHECK_EQ(judged_period(l, &p), 2u);
    /* 30% more: kept (on the third period: 50% passes on one) */
    p = (judged){.workers = 4, .last_n = 2, .trial_from = 2, .trial_thr = 769};
    CHECK_EQ(judged_period(l, &p), 4u);
    p.last_n = 4;
    CHECK_EQ(judged_period(l, &p), 4u);
    CHECK(judged_period(l, &p) >= 4u);
    CHECK_EQ(p.stage, 0u);
    p = (judged){.workers = 4, .last_n = 2, .trial_from = 2, .trial_thr = 660};
    CHECK(judged_period(l, &p) >= 4u);
    CHECK_EQ(p.stage, 0u);
    /* a kept trial that gained under half its rise (2 -> 4 for 30%):
       the next steps by a quarter; one that scaled (2 -> 4 for 80%):
       doubling again. From 28 workers a quarter is 7, not 1 (one more
       worker is 3.6%, under what a trial must gain: an outside trial's
       1 ms sleeps stayed at 28 of 64 trying 29 for good) */
    p = (judged){.workers = 4, .last_n = 2, .trial_from = 2, .trial_thr = 769};
    CHECK_EQ(judged_period(l, &p), 4u);
    p.last_n = 4;
    CHECK_EQ(judged_period(l, &p), 4u);
    CHECK(judged_period(l, &p) >= 4u); /* kept on the third period, at 30% */
    CHECK_EQ(JUDGED(.workers = 4, .last_n = 4, .load = 2e-3, .load_last = 2e-3), 5u); /* 2 ms loads ask 8 */
    p = (judged){.workers = 4, .last_n = 2, .trial_from = 2, .trial_thr = 555};
    CHECK(judged_period(l, &p) >= 4u); /* 80%: kept at once */
    CHECK_EQ(JUDGED(.workers = 4, .last_n = 4, .load = 2e-3, .load_last = 2e-3), 8u);
    pf_destroy(l);
    l = judged_loader(64, true);
    p = (judged){.workers = 56, .last_n = 28, .trial_from = 28, .trial_thr = 980, .stage = 2};
    CHECK_EQ(judged_period(l, &p), 28u); /* failed */
    CHECK_EQ(JUDGED(.workers = 28, .last_n = 28, .load = 40e-3, .load_last = 40e-3), 35u);
    pf_destroy(l);
    /* no further than the CPUs can feed: 4 workers of 2 ms loads kept
       1.4 of the 2 cores busy, so 5.7 would keep both: 6, not the 8 the
       loads ask (10 workers, at most doubling) */
    l = judged_loader(8, true);
    CHECK_EQ(JUDGED(.workers = 4, .last_n = 4, .load = 2e-3, .load_last = 2e-3), 8u);
    CHECK_EQ(JUDGED(.workers = 4, .last_n = 4, .load = 2e-3, .load_last = 2e-3, .busy = 1.4), 6u);
    CHECK_EQ(JUDGED(.workers = 4, .last_n = 4, .load = 2e-3, .load_last = 2e-3, .busy = 0.5), 8u); /* room for 16 */
    /* every core busy (all but half of one): no trial at all */
    CHECK_EQ(JUDGED(.workers = 4, .last_n = 4, .load = 2e-3, .load_last = 2e-3, .busy = 1.9), 4u);
    /* the step the trial starts with asks it: 2 -> 4 needs 25% */
    p = (judged){.workers = 2, .last_n = 2};
    CHECK_EQ(judged_period(l, &p), 4u);
    pf__lock(&l->sync.mu);
    CHECKF(l->at.gain_need > 1.24 && l->at.gain_need < 1.26, "gain asked %.3f", l->at.gain_need);
    pf__unlock(&l->sync.mu);
    pf_destroy(l);
}

/* The CPU cap's count: the CPUs, one more where pf_next does not load
   (dear loads), one fewer where the caller keeps a CPU busy; both at once
   cancel (it gave 3 on 2 cores to a busy caller). */
static uint32_t cap_count(pf_loader *l, bool dear, bool busy) {
    uint32_t n;
    pf__lock(&l->sync.mu);
    l->sync.ncpu = 2;
    l->ring.load_est = dear ? 1000000u : 10000u;
    l->ring.cap_plus = dear;
    l->ring.cap_flip = 0;
    l->ring.cap_busy = busy;
    n = pf__cap_n(l);
    pf__unlock(&l->sync.mu);
    return n;
}
static void test_cpu_cap_count(void) {
    pf_loader *l = judged_loader(4, false);
    CHECK_EQ(cap_count(l, false, false), 2u);
    CHECK_EQ(cap_count(l, true, false), 3u);
    CHECK_EQ(cap_count(l, false, true), 1u);
    CHECK_EQ(cap_count(l, true, true), 2u);
    pf_destroy(l);
}

/* The cap's verdict goes by the time loads slept as well as by how many
   did: 1 load in 8 sleeping 5 ms among 80 us copies is off the CPU most
   of its time, and is never capped (by the count alone it flapped, and
   autotune went 15 -> 1 worker at 0.24-0.35 of 16 fixed: an outside
   trial), nor is 1 in 20 sleeping 1.6 ms; 1 in 2000 sleeping 20 us
   among 80 us loads is all CPU, capped (soon: by the gap since a load
   last slept) and kept so; loads that turn to sleeping half their time
   lift it. */
static bool cap_after(pf_loader *l, uint32_t loads, uint32_t sleep_every, uint64_t sleep_ns, uint32_t *flips) {
    pf__slot s;
    uint32_t k;
    bool was;
    memset(&s, 0, sizeof s);
    pf__lock(&l->sync.mu);
    was = l->ring.capped;
    for (k = 0; k < loads; k++) {
        bool slept = sleep_every && pf__mix(k) % sleep_every == 0; /* at random, as a page-cache miss comes */
        s.slept = slept ? 1 : 0;
        s.on_cpu_ns = 80000u;
        s.off_cpu_ns = slept ? sleep_ns : 0;
        pf__cpu_cap(l, &s);
        if (flips && l->ring.capped != was) ++*flips, was = l->ring.capped;
    }
    was = l->ring.capped;
    pf__unlock(&l->sync.mu);
    return was;
}
static void test_cpu_cap_weighs_the_time_slept(void) {
    for (int at = 0; at < 2; at++) { /* a fixed count (16 workers, 2 CPUs) and autotune's verdict */
        pf_loader *l = judged_loader(16, at == 1);
        uint32_t flips = 0;
        pf__lock(&l->sync.mu);
        l->sync.ncpu = 2;
        pf__unlock(&l->sync.mu);
        /* the first verdict comes after 8 loads, which may all be copies:
           lifted by the first sleep; none after that */
        cap_after(l, 200, 8, 5000000u, NULL);
        CHECKF(!cap_after(l, 20000, 8, 5000000u, &flips) && flips == 0,
               "1 load in 8 sleeping 5 ms: capped at the end %d, %u flips (autotune %d)", (int)l->ring.capped, flips, at);
        /* half the time asleep, sleeps 1 in 20: 46 loads in a row that do
           not sleep (1 in 10 sleeps has that) capped it when the time was
           smoothed over 32 asked loads */
        cap_after(l, 400, 20, 1600000u, NULL);
        flips = 0;
        CHECKF(!cap_after(l, 20000, 20, 1600000u, &flips) && flips == 0,
               "1 load in 20 sleeping 1.6 ms: capped at the end %d, %u flips (autotune %d)", (int)l->ring.capped, flips, at);
        CHECKF(cap_after(l, 2000, 2000, 20000u, NULL), "1 load in 2000 sleeping 20 us: not capped (autotune %d)", at);
        flips = 0;
        CHECKF(cap_after(l, 20000, 2000, 20000u, &flips) && flips == 0, "...and %u flips since (autotune %d)", flips, at);
        CHECKF(!cap_after(l, 200, 2, 80000u, NULL), "loads that sleep half their time stay capped (autotune %d)", at);
        pf_destroy(l);
    }
}

/* Rare long sleeps among cheap loads (1 load in 32 sleeping 10 ms among
   40 us copies, asleep 3/4 of the time): a sleep is counted up to 4 of
   the loads' usual sleeps (and 2 ms at least), not 4 of the cheap loads'
   estimate (160 us a sleep: the window read as all CPU whenever it held
   few sleeps), and the gap since the last sleep is weighed against the
   gaps seen, the first one whole (from 0, a gap of 70 asked loads after
   one of 70 capped it 6 ms after the first verdict lifted). 64 fixed
   workers flipped 4-9 times in 3 s, and autotune went from 31 workers to
   1 (an outside trial). */
static void test_cpu_cap_rare_long_sleeps_are_not_all_cpu(void) {
    for (int at = 0; at < 2; at++) {
        pf_loader *l = judged_loader(64, at == 1);
        pf__slot s;
        uint32_t k, flips = 0;
        bool was;
        memset(&s, 0, sizeof s);
        pf__lock(&l->sync.mu);
        l->sync.ncpu = 2;
        for (k = 0; k < 8; k++) { /* the first verdict, on 8 copies: all CPU */
            s.slept = 0;
            s.on_cpu_ns = 40000u;
            s.off_cpu_ns = 0;
            pf__cpu_cap(l, &s);
        }
        CHECKF(l->ring.capped, "8 copies: not capped (autotune %d)", at);
        was = true;
        for (k = 0; k < 20000; k++) {
            bool slept = k == 0 || pf__mix(k + 77) % 32 == 0; /* a sleep lifts it, then 1 in 32 at random */
            s.slept = slept ? 1 : 0;
            s.on_cpu_ns = 40000u;
            s.off_cpu_ns = slept ? pf__off_cpu_counted(l, 10000000u, 45000u) : 0; /* est: the copies' */
            pf__cpu_cap(l, &s);
            if (l->ring.capped != was) flips++, was = l->ring.capped;
        }
        CHECKF(flips == 1 && !l->ring.capped, "1 load in 32 sleeping 10 ms: %u flips after the first verdict, capped %d "
               "(autotune %d)", flips, (int)l->ring.capped, at);
        pf__unlock(&l->sync.mu);
        pf_destroy(l);
    }
}

/* pf_next loading beside the workers counts as a loader when autotune
   grows the count: 2 workers plus pf_next is 3 loaders, so the trial goes
   past 3 (up to 6), which would only take over pf_next's loads (I/O
   loads of 1 MiB stayed at 1 worker + pf_next for good: 2 workers made no
   more batches than 1 and pf_next). Under half a loader's share of the
   batches, it is not counted. */
static void test_autotune_counts_pf_next_as_a_loader(void) {
    pf_loader *l = judged_loader(8, true);
    /* 1 ms loads over 0.2 ms of step need 5 loaders; the count at most doubles */
    CHECK_EQ(JUDGED(.workers = 2, .last_n = 2), 4u);                   /* 2 loaders: to 4 */
    CHECK_EQ(JUDGED(.workers = 2, .last_n = 2, .next_loads = 20), 5u); /* 3 loaders: to 5 (up to 6) */
    CHECK_EQ(JUDGED(.workers = 2, .last_n = 2, .next_loads = 6), 4u);  /* 6 of 40: under half of a third */
    CHECK_EQ(JUDGED(.workers = 2, .last_n = 2, .next_loads = 7), 5u);  /* 7 of 40: over it */
    pf_destroy(l);
}

/* A worker's run reads the clock around its first load, every
   PF__RUN_TIMED-th and its last; the others take the worker's estimate
   (a clock read after each load kept the next copy from starting under
   the last one's tail). A worker with no estimate yet times every load. */
static void test_worker_run_times_some_loads(void) {
    pf__worker w;
    uint32_t k, timed = 0;
    memset(&w, 0, sizeof w);
    w.est_ns = 700;
    for (k = 0; k < 32; k++) {
        uint64_t est = pf__run_untimed(&w, k, 32);
        bool want_timed = k == 0 || k == 31 || k % PF__RUN_TIMED == PF__RUN_TIMED - 1;
        CHECKF(want_timed ? est == 0 : est == 700, "load %u of a run of 32: %llu", (unsigned)k, (unsigned long long)est);
        timed += est == 0;
    }
    CHECK_EQ(timed, 5u); /* 0, 7, 15, 23, 31 */
    CHECK_EQ(pf__run_untimed(&w, 0, 1), 0u);
    CHECK_EQ(pf__run_untimed(&w, 2, 3), 0u); /* a run's last */
    CHECK_EQ(pf__run_untimed(&w, 1, 3), 700u);
    w.est_ns = 0;
    CHECK_EQ(pf__run_untimed(&w, 1, 3), 0u);
}

/* The same batches, indices and rng as a fixed single worker, while the
   count changes under it. */
static void test_autotune_keeps_the_order(void) {
    uint64_t *want = NULL, *got = NULL;
    size_t nw = 0, ng = 0;
    for (int at = 0; at < 2; at++) {
        phased p;
        tcons c;
        pf_config cfg;
        uint64_t **v = at ? &got : &want;
        size_t *n = at ? &ng : &nw;
        phased_init(&p);
        p.slow = at; /* the autotuned run is starved, so it resizes */
        t_begin(&c, h_seed);
        c.on_host = 1;
        cfg = phased_config(&p, &c, 120);
        cfg.autotune = at != 0;
        cfg.num_workers = at ? 8 : 1;
        cfg.shuffle = true;
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
        *v = (uint64_t *)malloc(120 * 5 * sizeof(uint64_t));
        for (;;) {
            pf_batch b;
            pf_result r = pf_next(c.l, &b);
            if (r != PF_OK) break;
            (*v)[(*n)++] = b.rng;
            for (uint32_t i = 0; i < b.count; i++) (*v)[(*n)++] = b.indices[i];
            CHECK_EQ(pf_release(c.l, &b), PF_OK);
        }
        t_end(&c);
        pthread_mutex_destroy(&p.mu);
    }
    CHECK_EQ(ng, nw);
    CHECK(ng == nw && !memcmp(want, got, nw * sizeof(uint64_t)));
    free(want);
    free(got);
}

/* pf_next loads on the caller's thread, through the pool's extra record
   (job->worker == num_workers), in autotune's two modes, forced here so
   that no timing decides them (autotune's choice itself is measured in
   bench, cheap):
   - help: the workers load and pf_next loads beside them whenever the next
     batch is not ready, instead of sleeping until a worker wakes it. A
     worker's load waits here until pf_next has loaded three batches
     (bounded), so pf_next must load.
   - no worker active: pf_next loads every batch (past the few the workers
     had claimed before they parked).
   Either way the order holds, every batch comes once, a load ran on the
   caller's thread exactly when it ran through the extra record, and
   pf_stats.next_loads counts exactly those, as time waited for input. */
typedef struct helped {
    pthread_t consumer;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned by_caller;
} helped;
static int helped_load(void *user, pf_job *job) {
    helped *h = (helped *)user;
    uint64_t *w = (uint64_t *)job->host;
    int mine = pthread_equal(pthread_self(), h->consumer) ? 1 : 0;
    struct timespec until;
    w[0] = job->batch;
    w[1] = job->worker;
    w[2] = (uint64_t)mine;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30; /* bounded: a hang fails below instead */
    pthread_mutex_lock(&h->mu);
    if (mine) h->by_caller++, pthread_cond_broadcast(&h->cv);
    while (!mine && h->by_caller < 3)
        if (pthread_cond_timedwait(&h->cv, &h->mu, &until) != 0) break;
    pthread_mutex_unlock(&h->mu);
    job->bytes = 24;
    return 0;
}
static void run_pf_next_loads(bool help) {
    const uint32_t workers = help ? 1 : 2;
    helped h;
    pf_config cfg = t_config_base(300, 1, 24, 1);
    pf_loader *l;
    pf_stats st;
    uint64_t by_caller = 0;
    h.consumer = pthread_self();
    pthread_mutex_init(&h.mu, NULL);
    pthread_cond_init(&h.cv, NULL);
    h.by_caller = 0;
    cfg.load = helped_load;
    cfg.user = &h;
    cfg.num_workers = workers;
    cfg.host_slots = help ? 8 : 5;
    cfg.backend = PF_BACKEND_HOST;
    cfg.timeout_ms = 60000; /* bounded */
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    pf__lock(&l->sync.mu);
    if (help) l->at.help = true; /* what autotune sets when a load costs less than a handoff */
    else l->at.active = 0;       /* and when pf_next alone is faster still */
    pf__unlock(&l->sync.mu);
    for (uint64_t k = 0; k < 300; k++) {
        pf_batch b;
        const uint64_t *w = t_next_k(l, &b, k);
        if (!w) break;
        CHECK_EQ(w[2], (uint64_t)(w[1] == workers)); /* the caller's thread iff the extra record */
        if (!help && k >= 5) CHECK_EQ(w[2], 1); /* past what the workers claimed before they parked */
        by_caller += w[2];
        CHECK_EQ(pf_release(l, &b), PF_OK);
    }
    {
        pf_batch b;
        CHECK_EQ(pf_next(l, &b), PF_END_OF_EPOCH);
    }
    pf_get_stats(l, &st);
    CHECKF(by_caller >= (help ? 3u : 295u), "pf_next loaded %llu batches", (unsigned long long)by_caller);
    CHECK_EQ(st.next_loads, by_caller);
    CHECK(st.wait_input_s > 0); /* loading in pf_next is time not spent stepping */
    pf_destroy(l);
    pthread_cond_destroy(&h.cv);
    pthread_mutex_destroy(&h.mu);
}
static void test_pf_next_loads_when_no_worker_is_active(void) { run_pf_next_loads(false); }

/* A loader whose pf_next loads every batch (past the few its worker had
   claimed before it parked), forced, so that no timing decides it. */
static pf_loader *t_pf_next_loader_with(uint64_t n, size_t batch_bytes, pf_load_fn load, void *user, uint32_t slots,
                                        bool unordered) {
    pf_config cfg = t_config_base(n, 1, batch_bytes, 1);
    pf_loader *l = NULL;
    cfg.load = load;
    cfg.user = user;
    cfg.num_workers = 1;
    cfg.host_slots = slots;
    cfg.unordered = unordered;
    cfg.backend = PF_BACKEND_HOST;
    cfg.timeout_ms = 60000; /* bounded */
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    if (!l) return NULL;
    pf__lock(&l->sync.mu);
    l->at.active = 0;
    pf__unlock(&l->sync.mu);
    return l;
}
static pf_loader *t_pf_next_loader(uint64_t n, size_t batch_bytes, pf_load_fn load) {
    return t_pf_next_loader_with(n, batch_bytes, load, NULL, 3, false);
}

/* pf_next times only 1 of every PF__INLINE_TIMED loads it makes (a clock
   read waits for the copy the load just made); the others count as their
   smoothed duration. Each load here takes at least 200 us by the clock, so
   every batch pf_next loaded, timed or not, must show as at least that
   much input wait and load time, and no more wait than elapsed time. */
static void spin_ns(long long ns) { /* at least ns by the clock, on the CPU */
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000LL + (t.tv_nsec - t0.tv_nsec) < ns);
}
/* a load that spins ns on the CPU and delivers 8 bytes */
#define T_SPIN_LOAD(name, ns)                       \
    static int name(void *user, pf_job *job) {     \
        (void)user;                                 \
        spin_ns(ns);                                \
        job->bytes = 8;                             \
        return 0;                                   \
    }
T_SPIN_LOAD(slow_200us, 200000)
static void test_untimed_loads_in_pf_next_still_count(void) {
    const uint64_t n = 20 * PF__INLINE_TIMED;
    pf_loader *l = t_pf_next_loader(n, 8, slow_200us);
    pf_stats st;
    pf_batch b;
    if (!l) return;
    for (uint64_t k = 0; k < n; k++) {
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(b.batch, k);
        CHECK_EQ(pf_release(l, &b), PF_OK);
        if (k == n / 2) { /* mid-run, from the consumer's thread, as a progress callback would */
            pf_get_stats(l, &st);
            CHECK(st.wait_s <= st.elapsed_s);
            CHECKF(st.wait_input_s >= (double)st.next_loads * 200e-6, "%.6f s for %llu loads", st.wait_input_s,
                   (unsigned long long)st.next_loads);
        }
    }
    CHECK_EQ(pf_next(l, &b), PF_END_OF_EPOCH);
    pf_get_stats(l, &st);
    CHECKF(st.next_loads >= n - 3, "pf_next loaded %llu of %llu", (unsigned long long)st.next_loads,
           (unsigned long long)n);
    CHECKF(st.wait_input_s >= (double)st.next_loads * 200e-6, "%.6f s for %llu loads", st.wait_input_s,
           (unsigned long long)st.next_loads);
    CHECK(st.load_s >= (double)n * 200e-6);
    CHECKF(st.wait_s <= st.elapsed_s, "waited %.6f s of %.6f s", st.wait_s, st.elapsed_s);
    pf_destroy(l);
}

/* The same when the load's cost changes under pf_next: 64 dear batches
   (200 us), 400 cheap ones, 64 dear again, 72 cheap. Untimed loads take the timed
   ones' estimate, so an estimate from one phase must not carry into the
   next: the cheap phase counts at most its own wall time plus 2 us a
   load (loads under 2 us are the only ones left untimed), and the second
   dear phase undercounts at most the few before a timed load sees it.
   And elapsed_s stops at the last pf_next, untimed or not: a pause after
   it (an evaluation) is not loader time. */
static int dear_cheap_dear(void *user, pf_job *job) {
    (void)user;
    if (job->batch < 64 || (job->batch >= 464 && job->batch < 528)) return slow_200us(user, job);
    job->bytes = 8;
    return 0;
}
static void test_pf_next_load_stats_follow_a_changing_load(void) {
    pf_loader *l = t_pf_next_loader(600, 8, dear_cheap_dear);
    pf_stats st, prev;
    pf_batch b;
    uint64_t k = 0;
    double t0, t1, wall_b = 0;
    struct timespec pause = {0, 20000000};
    if (!l) return;
    memset(&prev, 0, sizeof prev);
    t0 = t_now_s();
    for (; k < 600; k++) {
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(pf_release(l, &b), PF_OK);
        if (k == 63 || k == 463 || k == 527) {
            pf_get_stats(l, &st);
            CHECKF(st.wait_s <= st.elapsed_s, "waited %.6f s of %.6f s", st.wait_s, st.elapsed_s);
            CHECK(st.elapsed_s >= prev.elapsed_s && st.wait_s >= prev.wait_s);
            if (k == 63) /* a worker may have loaded a few: pf_next's own count */
                CHECKF(st.wait_input_s >= (double)st.next_loads * 200e-6, "%.6f s for %llu loads", st.wait_input_s,
                       (unsigned long long)st.next_loads);
            if (k == 463) {
                double wall = t_now_s() - wall_b;
                CHECKF(st.load_s - prev.load_s <= wall + 400 * 2e-6, "400 cheap loads counted as %.6f s in %.6f s", st.load_s - prev.load_s, wall);
            }
            if (k == 527)
                CHECKF(st.wait_input_s - prev.wait_input_s >= (64.0 - PF__INLINE_TIMED) * 200e-6,
                       "64 dear loads counted as %.6f s of waiting", st.wait_input_s - prev.wait_input_s);
            prev = st;
            if (k == 63) wall_b = t_now_s(); /* the cheap phase starts */
        }
    }
    t1 = t_now_s();
    nanosleep(&pause, NULL); /* before the epoch's end is asked for: the last pf_next delivered a batch */
    pf_get_stats(l, &st);
    CHECKF(st.elapsed_s <= t1 - t0 + 1e-3, "elapsed %.6f s for a loop of %.6f s", st.elapsed_s, t1 - t0);
    CHECK_EQ(pf_next(l, &b), PF_END_OF_EPOCH);
    pf_destroy(l);
}

/* pf_get_stats from another thread while pf_next loads: elapsed_s and
   wait_s never go back. pf_next reads a load's end before it locks; a
   pf_get_stats in between used to flush the wait span past it, and the
   span's close then wrapped below zero and moved elapsed_s back. */
typedef struct watcher {
    pf_loader *l;
    int stop; /* __atomic */
    unsigned back, reads;
    double worst;
} watcher;
static void *watch_stats(void *arg) {
    watcher *w = (watcher *)arg;
    pf_stats prev, st;
    memset(&prev, 0, sizeof prev);
    while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
        pf_get_stats(w->l, &st);
        w->reads++;
        if (st.elapsed_s < prev.elapsed_s || st.wait_s < prev.wait_s || st.wait_s > st.elapsed_s) {
            w->back++;
            if (prev.elapsed_s - st.elapsed_s > w->worst) w->worst = prev.elapsed_s - st.elapsed_s;
        }
        prev = st;
    }
    return NULL;
}
static int copy_4k(void *user, pf_job *job) {
    static const unsigned char src[4096];
    (void)user;
    memcpy(job->host, src, sizeof src);
    job->bytes = sizeof src;
    return 0;
}
static void test_stats_never_go_back_while_pf_next_loads(void) {
    const uint64_t n = 50000;
    pf_loader *l = t_pf_next_loader(n, 4096, copy_4k);
    pthread_t th;
    watcher w;
    if (!l) return;
    memset(&w, 0, sizeof w);
    w.l = l;
    CHECK_EQ(pthread_create(&th, NULL, watch_stats, &w), 0);
    for (uint64_t k = 0; k < n; k++) {
        pf_batch b;
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(pf_release(l, &b), PF_OK);
    }
    __atomic_store_n(&w.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    CHECK(w.reads > 0);
    CHECKF(w.back == 0, "%u of %u reads went back (by up to %.9f s) or waited longer than elapsed", w.back, w.reads,
           w.worst);
    pf_destroy(l);
}

/* A load that fails on the caller's thread says so: the message names
   pf_next, not a worker that does not exist (worker num_workers). */
static int failing_at_20(void *user, pf_job *job) {
    (void)user;
    job->bytes = 8;
    return job->batch == 20 ? pf_job_fail(job, "bad batch %llu", (unsigned long long)job->batch) : 0;
}
static void test_a_failed_load_in_pf_next_names_pf_next(void) {
    pf_loader *l = t_pf_next_loader(100, 8, failing_at_20);
    pf_result r = PF_OK;
    uint64_t k = 0;
    if (!l) return;
    for (; k < 100; k++) {
        pf_batch b;
        r = pf_next(l, &b);
        if (r != PF_OK) break;
        CHECK_EQ(pf_release(l, &b), PF_OK);
    }
    CHECK_EQ(r, PF_ERR_LOAD);
    CHECK_EQ(k, 20);
    CHECK_CONTAINS(pf_error(l), "load failed for epoch 0 batch 20 (pf_next, on the caller's thread): bad batch 20");
    pf_destroy(l);
}
static void test_pf_next_helps_the_workers(void) { run_pf_next_loads(true); }

/* pf_next loads cheap batches in runs, as a worker does (pf__load_inline):
   its share of the free slots claimed at once, loaded, then published
   together. Every batch still comes once with its own bytes, in order
   (or, unordered, once each); a failure inside a run is that batch's own
   error, and the run's batches after it never come. The loads are made
   cheap by hand (inline_est, before every pf_next), so that no timing on
   a loaded machine or under a sanitizer decides whether runs happen. */
typedef struct fail_at {
    uint64_t batch;
    unsigned after; /* loads of batches past it (atomic) */
} fail_at;
static int id_or_fail_load(void *user, pf_job *job) {
    fail_at *f = (fail_at *)user;
    memcpy(job->host, &job->batch, sizeof job->batch);
    job->bytes = sizeof job->batch;
    if (job->batch > f->batch) __atomic_add_fetch(&f->after, 1u, __ATOMIC_RELAXED);
    return job->batch == f->batch ? pf_job_fail(job, "bad batch %llu", (unsigned long long)job->batch) : 0;
}
/* A loader whose pf_next loads every batch past the few its worker claimed
   first, and, with t_run_next, in runs (its loads cheap by the estimate,
   forced before every pf_next): no timing on a loaded machine or under a
   sanitizer decides it. */
static pf_loader *t_runs_loader(uint64_t n, pf_load_fn load, void *user, bool unordered) {
    return t_pf_next_loader_with(n, 8, load, user, 16, unordered);
}
/* pf_next on such a loader, the batch checked: its own bytes (its number),
   once (seen[], n of them), in order unless unordered; then released. */
static pf_result t_run_next(pf_loader *l, unsigned char *seen, uint64_t n, uint64_t *got) {
    pf_batch b;
    uint64_t id;
    pf_result r;
    pf__lock(&l->sync.mu);
    l->at.inline_est = 1; /* cheap, says the estimate: a run */
    pf__unlock(&l->sync.mu);
    r = pf_next(l, &b);
    if (r != PF_OK) return r;
    memcpy(&id, b.data, sizeof id);
    CHECK_EQ(id, b.batch);
    CHECK(b.batch < n && !seen[b.batch]);
    if (b.batch < n) seen[b.batch] = 1;
    if (!l->cfg.unordered) CHECK_EQ(b.batch, *got);
    ++*got;
    CHECK_EQ(pf_release(l, &b), PF_OK);
    return r;
}
static void run_pf_next_runs(bool unordered, uint64_t fail_batch) {
    enum { N = 400 };
    fail_at f = {fail_batch, 0};
    pf_loader *l = t_runs_loader(N, id_or_fail_load, &f, unordered);
    pf_stats st;
    pf_result r;
    unsigned char seen[N] = {0};
    uint64_t got = 0, runs;
    if (!l) return;
    while ((r = t_run_next(l, seen, N, &got)) == PF_OK) {
    }
    pf_get_stats(l, &st);
    pf__lock(&l->sync.mu);
    runs = l->st.runs;
    pf__unlock(&l->sync.mu);
    CHECKF(runs > 0, "pf_next made no run in %llu loads", (unsigned long long)st.next_loads);
    if (fail_batch >= N) {
        CHECK_EQ(r, PF_END_OF_EPOCH);
        CHECK_EQ(got, N);
        CHECKF(st.next_loads >= N - 16, "pf_next loaded %llu of %u", (unsigned long long)st.next_loads, (unsigned)N);
    } else {
        char want[96];
        CHECK_EQ(r, PF_ERR_LOAD);
        snprintf(want, sizeof want, "load failed for epoch 0 batch %llu (pf_next", (unsigned long long)fail_batch);
        CHECK_CONTAINS(pf_error(l), want);
        CHECK(!seen[fail_batch]);
        /* the run stops at the failure: no load after it (the worker parked before it) */
        CHECK_EQ(__atomic_load_n(&f.after, __ATOMIC_RELAXED), 0u);
        if (!unordered) CHECK_EQ(got, fail_batch);
        else CHECKF(got <= fail_batch + 16, "%llu batches came, the failure was at %llu", (unsigned long long)got,
                    (unsigned long long)fail_batch);
    }
    pf_destroy(l);
}
static void test_pf_next_loads_in_runs(void) {
    run_pf_next_runs(false, UINT64_MAX);
    run_pf_next_runs(true, UINT64_MAX);
    run_pf_next_runs(false, 150);
    run_pf_next_runs(true, 150);
}

/* How many batches a run claims: pf_next asks before its first claim, a
   worker after it (pf_next counted one slot too many: a single free slot
   made a "run", read the clock twice a load); pf_next loading alone keeps
   a run within PF__ALONE_RUN_BYTES (a run's copies, a slot each, leave
   the L1 cache; a single load goes to the slot just released). */
static void test_run_len_counts_what_is_free(void) {
    fail_at f = {UINT64_MAX, 0};
    pf_loader *l = t_runs_loader(100, id_or_fail_load, &f, false); /* 8-byte batches: a 256-byte stride */
    pf_loader *big = t_pf_next_loader_with(100, 4096, id_or_fail_load, &f, 16, false);
    uint32_t nfree, want;
    if (!l || !big) return;
    CHECK_EQ(l->stride, 256u);
    /* the free count is set here, whatever the worker claimed before it
       parked (pf__run_len only reads it; it is put back before the lock
       is let go) */
    pf__lock(&l->sync.mu);
    nfree = l->ring.nfree;
    l->ring.nfree = 7;
    CHECK_EQ(pf__run_len(l, 1, true), 7u); /* alone: every free slot... */
    l->ring.nfree = 20;
    CHECK_EQ(pf__run_len(l, 1, true), 16u); /* ...up to 4 KiB of them */
    l->ring.nfree = 1;
    CHECK_EQ(pf__run_len(l, 1, true), 1u); /* not 2 */
    l->ring.nfree = 20;
    l->at.active = 1; /* a worker beside it: half each, pf_next's counted before its claim */
    CHECK_EQ(pf__run_len(l, 1, true), 10u);
    want = 21u / (pf__may_load(l) ? 2u : 1u); /* the worker's, its first slot claimed */
    CHECK_EQ(pf__run_len(l, 1, false), want);
    l->at.active = 0;
    l->ring.nfree = nfree;
    pf__unlock(&l->sync.mu);
    pf__lock(&big->sync.mu);
    nfree = big->ring.nfree;
    big->ring.nfree = 12;
    CHECK_EQ(pf__run_len(big, 1, true), 1u); /* alone, 4 KiB batches: one at a time */
    big->at.active = 1;
    CHECK_EQ(pf__run_len(big, 1, true), 6u);
    big->at.active = 0;
    big->ring.nfree = nfree;
    pf__unlock(&big->sync.mu);
    pf_destroy(big);
    pf_destroy(l);
}

/* Loads that turn dear in the middle of pf_next's run end the run: one
   pf_next waits for at most 4 of them (the clock is read after a run's
   first two loads and every fourth), and what the run claimed but did not
   load goes back, to be loaded later as it is: every batch still comes
   once, with its own bytes, in order. Runs forced as above; the worker
   stays parked, so every dear load is pf_next's. */
typedef struct turns_dear {
    uint64_t from;      /* batches from here sleep 1 ms */
    unsigned dear_here; /* dear loads since the caller reset it (the caller's thread only) */
} turns_dear;
static int turns_dear_load(void *user, pf_job *job) {
    turns_dear *t = (turns_dear *)user;
    memcpy(job->host, &job->batch, sizeof job->batch);
    job->bytes = sizeof job->batch;
    if (job->batch >= t->from) {
        struct timespec d = {0, 1000000};
        nanosleep(&d, NULL);
        t->dear_here++;
    }
    return 0;
}
static void run_turns_dear(bool unordered) {
    enum { N = 140 };
    turns_dear t = {100, 0};
    pf_loader *l = t_runs_loader(N, turns_dear_load, &t, unordered);
    unsigned char seen[N] = {0};
    unsigned most = 0;
    uint64_t got = 0;
    pf_result r;
    if (!l) return;
    do {
        t.dear_here = 0;
        r = t_run_next(l, seen, N, &got);
        if (t.dear_here > most) most = t.dear_here;
    } while (r == PF_OK);
    CHECK_EQ(r, PF_END_OF_EPOCH);
    CHECK_EQ(got, N);
    CHECKF(most >= 1 && most <= 4, "one pf_next waited for %u dear loads", most);
    pf_destroy(l);
}
static void test_loads_that_turn_dear_end_pf_next_s_run(void) {
    run_turns_dear(false);
    run_turns_dear(true);
}

/* What pf_next's run hands back is loaded even when no worker will. The
   run that claims the epoch's last batches turns dear at its first load
   (5 ms), and before that load ends, the parked worker is let in, finds
   the claims done and leaves (it holds the lock from its wake until it
   has left, so the test sees it gone once it no longer waits). The run
   ends there and hands the rest back. pf_next does not help a worker
   here (cfg.timeout_ms), yet must load the rest itself: an outside
   trial's loader hung there, waiting for batches no thread would load. */
typedef struct left_alone {
    pf_loader *l;        /* set once pf_create returns (atomic) */
    bool let_in;         /* the worker was let in (the caller's thread only) */
    uint32_t run;        /* pf_next's run then: its loads not yet published */
    unsigned waited_out; /* a bounded wait ran out */
} left_alone;
static bool parked_are(pf_loader *l, uint32_t n) {
    double until = t_now_s() + 10; /* bounded */
    for (;;) {
        bool is;
        pf__lock(&l->sync.mu);
        is = l->sync.waiting[PF__ROLE_PARKED] == n;
        pf__unlock(&l->sync.mu);
        if (is || t_now_s() > until) return is;
    }
}
static int left_alone_load(void *user, pf_job *job) {
    left_alone *a = (left_alone *)user;
    pf_loader *l = __atomic_load_n(&a->l, __ATOMIC_ACQUIRE);
    bool all_claimed;
    memcpy(job->host, &job->batch, sizeof job->batch);
    job->bytes = sizeof job->batch;
    if (!l || job->worker != l->cfg.num_workers) return 0;
    pf__lock(&l->sync.mu);
    all_claimed = l->claim.done || l->claim.batch == l->claim.nbatches;
    if (all_claimed && !a->let_in) a->run = l->ring.nloading;
    pf__unlock(&l->sync.mu);
    if (!all_claimed) return 0;
    if (!a->let_in) {
        a->let_in = true;
        if (!parked_are(l, 1)) a->waited_out++;
        pf__lock(&l->sync.mu);
        l->at.active = 1;
        pf__wake(l, PF__ROLE_PARKED);
        pf__unlock_wake(l);
        if (!parked_are(l, 0)) a->waited_out++;
    }
    t_sleep_us(5000);
    return 0;
}
static void test_handed_back_batches_load_when_no_worker_will(void) {
    enum { N = 200 };
    uint32_t most = 0;
    /* the last run may hold a single batch (TSan: 1 run in 30, on the old
       header too): then nothing was handed back and the run proved
       nothing, so it is run again */
    for (int attempt = 0; attempt < 6 && most < 2; attempt++) {
        left_alone a = {NULL, false, 0, 0};
        pf_loader *l = t_runs_loader(N, left_alone_load, &a, false);
        unsigned char seen[N] = {0};
        uint64_t got = 0;
        pf_result r;
        if (!l) return;
        __atomic_store_n(&a.l, l, __ATOMIC_RELEASE);
        while ((r = t_run_next(l, seen, N, &got)) == PF_OK) {
        }
        CHECKF(r == PF_END_OF_EPOCH, "%s after %llu batches: %s", pf_result_string(r), (unsigned long long)got,
               pf_error(l));
        CHECK_EQ(got, N);
        CHECK(a.let_in);
        CHECK_EQ(a.waited_out, 0u);
        if (a.run > most) most = a.run;
        pf_destroy(l);
    }
    CHECKF(most >= 2, "in 6 runs the last run held %u batches at most: nothing was handed back, the test proved "
           "nothing", (unsigned)most);
}

/* Once a load fails, no load of a later batch starts, on any thread: in
   order none of them would be delivered. pf_next alone loads a run of 32
   (of 48 slots) with batch 3 in it; as batch 3 loads, the worker is let
   in, claims a run of later batches, and its first load waits (bounded)
   until batch 3 has failed: the rest of its run must not load. */
typedef struct fail_seen {
    pf_loader *l;        /* set once pf_create returns (atomic) */
    uint64_t fail;       /* the batch that fails, on the caller's thread */
    unsigned worker_in;  /* the worker began a load past it (atomic) */
    unsigned late;       /* loads of batches past it begun once it had failed (atomic) */
    unsigned waited_out; /* a bounded wait ran out (atomic) */
} fail_seen;
static void fail_seen_wait(fail_seen *f, const unsigned *flag, const uint64_t *seq) {
    double until = t_now_s() + 10; /* bounded */
    while ((flag ? !__atomic_load_n(flag, __ATOMIC_ACQUIRE) : PF__LOAD_RELAXED(seq) == UINT64_MAX) &&
           t_now_s() < until) {
    }
    if (flag ? !__atomic_load_n(flag, __ATOMIC_ACQUIRE) : PF__LOAD_RELAXED(seq) == UINT64_MAX)
        __atomic_add_fetch(&f->waited_out, 1u, __ATOMIC_RELAXED);
}
static int fail_seen_load(void *user, pf_job *job) {
    fail_seen *f = (fail_seen *)user;
    pf_loader *l;
    double until = t_now_s() + 10; /* bounded */
    memcpy(job->host, &job->batch, sizeof job->batch);
    job->bytes = sizeof job->batch;
    while (!(l = __atomic_load_n(&f->l, __ATOMIC_ACQUIRE)) && t_now_s() < until) {
    }
    if (!l) return pf_job_fail(job, "the test never set its loader");
    if (job->batch > f->fail && PF__LOAD_RELAXED(&l->sync.fail_seq) != UINT64_MAX)
        __atomic_add_fetch(&f->late, 1u, __ATOMIC_RELAXED);
    if (job->batch == f->fail) { /* pf_next's run: the worker comes in, and its run begins */
        pf__lock(&l->sync.mu);
        l->at.active = 1;
        l->pool.w[0].est_ns = 1; /* its loads look cheap: its claim is a run */
        pf__wake(l, PF__ROLE_PARKED);
        pf__unlock_wake(l); /* the wake goes out as the lock drops */
        fail_seen_wait(f, &f->worker_in, NULL);
        return pf_job_fail(job, "bad batch %llu", (unsigned long long)job->batch);
    }
    if (job->batch > f->fail && job->worker < l->cfg.num_workers && !__atomic_load_n(&f->worker_in, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&f->worker_in, 1u, __ATOMIC_RELEASE);
        fail_seen_wait(f, NULL, &l->sync.fail_seq); /* the rest of its run is after the failure */
    }
    return 0;
}
static void test_no_load_begins_after_a_failure(void) {
    fail_seen f;
    pf_config cfg = t_config_base(400, 1, 8, 1);
    pf_loader *l;
    pf_result r;
    uint64_t got = 0;
    memset(&f, 0, sizeof f);
    f.fail = 3;
    cfg.load = fail_seen_load;
    cfg.user = &f;
    cfg.num_workers = 1;
    cfg.host_slots = 48;
    cfg.backend = PF_BACKEND_HOST;
    cfg.timeout_ms = 60000; /* bounded */
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    if (!l) return;
    pf__lock(&l->sync.mu);
    l->at.active = 0; /* pf_next alone, until batch 3 loads */
    l->at.help = true; /* and beside the worker after that */
    pf__unlock(&l->sync.mu);
    __atomic_store_n(&f.l, l, __ATOMIC_RELEASE);
    for (;;) {
        pf_batch b;
        pf__lock(&l->sync.mu);
        l->at.inline_est = 1; /* a run */
        pf__unlock(&l->sync.mu);
        r = pf_next(l, &b);
        if (r != PF_OK) break;
        CHECK_EQ(b.batch, got);
        got++;
        CHECK_EQ(pf_release(l, &b), PF_OK);
    }
    CHECK_EQ(r, PF_ERR_LOAD);
    CHECK_EQ(got, f.fail);
    CHECK_CONTAINS(pf_error(l), "load failed for epoch 0 batch 3 (pf_next");
    pf_destroy(l); /* every load has ended */
    CHECK_EQ(__atomic_load_n(&f.waited_out, __ATOMIC_RELAXED), 0u);
    CHECKF(__atomic_load_n(&f.late, __ATOMIC_RELAXED) == 0, "%u loads of later batches began after the failure",
           __atomic_load_n(&f.late, __ATOMIC_RELAXED));
}


/* Autotune's first period leaves out the batches loaded before the first
   pf_next (the consumer started late): taken at once, they made one
   worker look 7x faster than it can be (3,438 batches/s for loads of 2 ms
   and more), and a second worker then "did not help". One worker cannot
   beat 1 / 2 ms, so the first rate autotune reports stays near 500/s
   (one load in flight at the period's start may end early: 600). */
typedef struct first_rate {
    pthread_mutex_t mu;
    double rate; /* the first autotune message's batches/s, or -1 */
} first_rate;
static void first_rate_log(void *user, int level, const char *msg) {
    first_rate *f = (first_rate *)user;
    const char *p = strstr(msg, " batches/s)");
    (void)level;
    if (strncmp(msg, "autotune: ", 10) || !p) return;
    while (p > msg && (p[-1] == '.' || (p[-1] >= '0' && p[-1] <= '9'))) p--;
    pthread_mutex_lock(&f->mu);
    if (f->rate < 0) f->rate = atof(p);
    pthread_mutex_unlock(&f->mu);
}
static int slow_load(void *user, pf_job *job) {
    struct timespec ts = {0, 2000000};
    (void)user;
    nanosleep(&ts, NULL);
    job->bytes = 8;
    return 0;
}
static void test_autotune_leaves_out_what_loaded_before_the_first_pf_next(void) {
    pf_config cfg = t_config_base(400, 1, 8, 1);
    pf_loader *l;
    first_rate f;
    double rate;
    struct timespec late = {0, 200000000};
    pthread_mutex_init(&f.mu, NULL);
    f.rate = -1;
    cfg.load = slow_load;
    cfg.num_workers = 8;
    cfg.autotune = 1;
    cfg.backend = PF_BACKEND_HOST;
    cfg.log = first_rate_log;
    cfg.log_user = &f;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    nanosleep(&late, NULL); /* the first worker fills the ring meanwhile */
    for (uint64_t k = 0; k < 400; k++) { /* bounded: 400 loads of 2 ms, 1-8 workers */
        pf_batch b;
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(pf_release(l, &b), PF_OK);
        pthread_mutex_lock(&f.mu);
        rate = f.rate;
        pthread_mutex_unlock(&f.mu);
        if (rate >= 0) break;
    }
    CHECKF(rate > 0 && rate <= 600, "autotune's first period read %.0f batches/s from one worker of loads of 2 ms", rate);
    pf_destroy(l);
    pthread_mutex_destroy(&f.mu);
}

/* A trial of pf_next helping cannot be judged while the consumer never
   waits (the workers keep the ring full): it must not stay on trial for
   good, skipping the worker rules meanwhile (an outside trial saw 8
   workers kept for as long as the run lasted). Here the loads cost
   nothing and each step 200 us, so no period waits: after four such
   periods (20 ms each at least) help ends. Bounded: 4000 steps, 0.8 s. */
static int nothing(void *user, pf_job *job) {
    (void)user;
    job->bytes = 8;
    return 0;
}
/* pf_next loading on trial, as if a starved period had started it with
   the workers active now; a trial judged fails (1e9 batches/s before it).
   Lock held. */
static void t_help_on_trial(pf_loader *l) {
    l->at.help = l->at.help_trial = true;
    l->at.thr_before = 1e9;
    l->at.before = l->at.active;
}
/* `workers` active of 2 under autotune, with pf_next loading on trial, as
   if a starved period had started it; a trial judged fails (1e9
   batches/s before it) */
static pf_loader *on_help_trial(uint64_t n, int (*load)(void *, pf_job *), uint32_t workers) {
    pf_config cfg = t_config_base(n, 1, 8, 1);
    pf_loader *l;
    cfg.load = load;
    cfg.num_workers = 2;
    cfg.autotune = 1;
    cfg.backend = PF_BACKEND_HOST;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    pf__lock(&l->sync.mu);
    pf__set_active(l, workers, "test", 0, 0);
    t_help_on_trial(l);
    pf__unlock(&l->sync.mu);
    return l;
}
static void test_a_help_trial_ends_when_nothing_waits(void) {
    pf_loader *l = on_help_trial(4000, nothing, 2);
    bool on_trial = true, helping = true;
    uint64_t k = 0;
    /* the loads are cheap next to the step, so a quiet trial goes to 1
       worker beside pf_next and tries pf_next loading every batch from
       there; with a 200 us step that is about as fast, so help ends (or
       stays beside that 1 worker), or (5% faster by noise, on a busy
       machine) pf_next loads every batch with the workers parked: settled
       either way, and not on trial, nor loading beside 2 workers */
    for (; k < 4000 && on_trial; k++) {
        pf_batch b;
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(b.batch, k);
        CHECK_EQ(pf_release(l, &b), PF_OK);
        spin_ns(200000); /* the step */
        pf__lock(&l->sync.mu);
        on_trial = l->at.help_trial || l->at.park_trial;
        helping = l->at.help;
        pf__unlock(&l->sync.mu);
    }
    CHECKF(!on_trial, "help still on trial after %llu batches", (unsigned long long)k);
    CHECKF(!helping || l->at.active <= 1, "help %d with %u workers active", (int)helping, (unsigned)l->at.active);
    pf_destroy(l);
}

/* A help trial (beside 1 worker) that fails with loads as cheap as a
   handoff tries pf_next alone next (the workers parked: with them beside it every load looks
   dearer than it is, so only a trial tells), and when that fails too,
   help ends as the first failure would have ended it: the workers are
   back, and no trial comes again until the backoff has passed. Both
   verdicts are forced (a throughput before of 1e9 batches/s), so no
   timing decides them; loads of 200 us keep the consumer waiting, so
   every period is judged (with 1 us loads, under TSan and the simulated
   CUDA runtime the workers kept up, and the quiet-trial rule ended help
   instead; with 20 us loads, so did a TSan consumer under make test's
   load, at 27 us a batch). PF__PARK_TRY_S is raised for the suite: a load
   that cheap. Bounded: 10 s by the clock. */
T_SPIN_LOAD(spin_20us, 20000)
static void test_a_failed_help_trial_tries_pf_next_alone(void) {
    pf_loader *l = on_help_trial(UINT64_C(1) << 40, slow_200us, 1); /* every trial fails */
    bool parked_last = false, ended = false;
    uint64_t k = 0;
    double t0 = t_now_s();
    while (!ended && t_now_s() - t0 < 10) {
        pf_batch b;
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(b.batch, k);
        CHECK_EQ(pf_release(l, &b), PF_OK);
        k++;
        pf__lock(&l->sync.mu);
        if (l->at.park_trial && l->at.park_last) {
            CHECK_EQ(l->at.active, 0u);
            CHECK(l->at.help);
            parked_last = true;
        }
        ended = !l->at.help && !l->at.help_trial && !l->at.park_trial;
        pf__unlock(&l->sync.mu);
    }
    CHECKF(parked_last, "no trial of pf_next alone after help failed (%llu batches)", (unsigned long long)k);
    CHECKF(ended, "help did not end after pf_next alone failed too (%llu batches)", (unsigned long long)k);
    pf__lock(&l->sync.mu);
    CHECK_EQ(l->at.active, 1u);
    CHECK(l->at.inline_failed);
    CHECK(l->at.inline_wait > 0);
    CHECK(!l->at.park_last);
    pf__unlock(&l->sync.mu);
    pf_destroy(l);
}

/* Autotune tries pf_next alone (the workers parked) when they keep up with
   a consumer whose step is short and loads cost about what a handoff does
   (4 KiB memcpy loads on the 2-core VM: a consumer whose workers keep up
   hardly waits, so no help trial started, and runs stayed at a worker's
   0.9 us a batch where pf_next alone takes 0.3). Periods are made up
   under the lock, so no timing decides them: 20000 batches in 25 ms with
   no wait and 0.3 us loads start the trial; the same throughput after it
   fails it (the workers come back, and no trial until the loads change);
   a step of 100 us a batch never starts one. And a help trial that ends
   quiet (the workers kept up) with loads of 0.7 us, a step of 0.9 us,
   tries pf_next alone too (it ended help for loads over half the step:
   an outside trial saw 1 run in 35 stay at 1 worker). From more than 1
   worker, each goes to 1 worker beside pf_next first, and alone is tried
   from there, from a steady period (alone beating 16 workers, or the
   first period after 16 -> 1, says nothing of 1). */
static void t_period(pf_loader *l, uint64_t batches, uint64_t ns, uint64_t load_ns, double idle) { /* lock held */
    uint64_t now = pf__now_ns();
    pf__at_period_start(l, now - ns, l->st.wait_input_ns + l->st.wait_copy_ns);
    l->st.batches += batches;
    l->st.call_ns += batches * load_ns;
    l->st.load_ns += batches * load_ns;
    l->st.worker_wait_ns += (uint64_t)(idle * (double)ns * l->at.active);
    l->st.last_ns = now;
    pf__autotune(l);
}
static pf_loader *t_autotuned(uint32_t workers, bool workers_only) {
    pf_config cfg = t_config_base(UINT64_C(1) << 40, 1, 8, 1);
    pf_loader *l = NULL;
    cfg.load = nothing;
    cfg.num_workers = workers;
    cfg.autotune = 1;
    cfg.workers_only = workers_only;
    cfg.timeout_ms = 0; /* else pf_next may not load (no pf_next is called here) */
    cfg.backend = PF_BACKEND_HOST;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    if (l) {
        pf__lock(&l->sync.mu);
        pf__set_active(l, workers, "test", 0, 0);
        pf__unlock(&l->sync.mu);
    }
    return l;
}
static void test_autotune_tries_pf_next_alone_when_workers_keep_up(void) {
    for (int kind = 0; kind < 5; kind++) {
        pf_loader *l = t_autotuned(kind == 1 || kind >= 3 ? 2 : 1, false);
        if (!l) return;
        pf__lock(&l->sync.mu);
        if (kind == 0) {
            t_period(l, 20000, 25000000, 300, 0);
            CHECK_EQ(l->at.active, 0u);
            CHECK(l->at.help && l->at.park_trial && l->at.park_last);
            t_period(l, 20000, 25000000, 300, 0); /* not 5% faster: failed */
            CHECK_EQ(l->at.active, 1u);
            CHECK(!l->at.help && !l->at.park_trial && l->at.inline_failed && l->at.inline_wait > 0);
            for (int k = 0; k < 300; k++) t_period(l, 20000, 25000000, 300, 0); /* the backoff passes */
            CHECK_EQ(l->at.active, 1u); /* the same loads: not again */
            CHECK(!l->at.help);
        } else if (kind == 1) {
            t_period(l, 250, 25000000, 300, 0); /* a step of 100 us */
            CHECK_EQ(l->at.active, 2u);
            CHECK(!l->at.help && !l->at.park_trial);
        } else if (kind == 2) {
            t_help_on_trial(l);
            for (int k = 0; k < 4; k++) t_period(l, 27778, 25000000, 700, 0); /* quiet: 0.9 us a batch */
            CHECK_EQ(l->at.active, 0u);
            CHECK(l->at.help && l->at.park_trial && l->at.park_quiet);
        } else {
            /* from 2 workers: 1 worker beside pf_next, no trial yet */
            if (kind == 3) {
                t_period(l, 20000, 25000000, 300, 0);
            } else { /* a quiet help trial */
                t_help_on_trial(l);
                for (int k = 0; k < 4; k++) t_period(l, 27778, 25000000, 700, 0);
            }
            CHECK_EQ(l->at.active, 1u);
            CHECK(l->at.help && !l->at.help_trial && !l->at.park_trial);
            /* then pf_next alone, judged against 1 worker beside it, from
               a steady period: not the first at 1 (the workers leaving:
               400k batches/s), the next (800k) */
            t_period(l, 10000, 25000000, 300, 0);
            CHECK_EQ(l->at.active, 1u);
            CHECK(!l->at.park_trial);
            t_period(l, 20000, 25000000, 300, 0);
            CHECK_EQ(l->at.active, 0u);
            CHECK(l->at.help && l->at.park_trial);
            CHECK(l->at.thr_before > 700000 && l->at.thr_before < 900000); /* 800k batches/s */
            CHECK_EQ(l->at.before, 1u); /* and back to it if not faster */
        }
        pf__unlock(&l->sync.mu);
        pf_destroy(l);
    }
}

/* Workers left idle (loads turned cheap, workers_only: pf_next alone is no
   answer) park down to what their busy share needs, at most halving each
   time, not one at a time: an outside trial's 16 workers took 2.4 s to get
   to 8 at 0.26-0.36 of 1 worker. Made-up periods, 90% idle, three in a
   row for each step: 16 -> 8 -> 4. */
static void test_idle_workers_park_by_what_they_need(void) {
    pf_loader *l = t_autotuned(16, true);
    if (!l) return;
    pf__lock(&l->sync.mu);
    for (int k = 0; k < 3; k++) t_period(l, 1000, 25000000, 300, 0.9);
    CHECK_EQ(l->at.active, 8u);
    for (int k = 0; k < 3; k++) t_period(l, 1000, 25000000, 300, 0.9);
    CHECK_EQ(l->at.active, 4u);
    CHECK(!l->at.help);
    pf__unlock(&l->sync.mu);
    pf_destroy(l);
}

/* cfg.workers_only holds under autotune too: its trial of pf_next loading
   (loads cheaper than a handoff, the consumer waiting) once ignored it,
   and a load that waits for the caller's next step then waited for
   itself (an outside trial: a hang). 20 us loads, a consumer that only
   takes: without workers_only, every period here would start that trial.
   No timeout_ms (it too keeps pf_next from loading); bounded by the
   suite's watchdog, and 3000 loads of 20 us. */
typedef struct own_threads {
    uint32_t num_workers;
    uint32_t on_caller; /* loads on pf_next's record; atomic */
} own_threads;
static int spin_20us_where(void *user, pf_job *job) {
    own_threads *o = (own_threads *)user;
    if (job->worker >= o->num_workers) __atomic_add_fetch(&o->on_caller, 1u, __ATOMIC_RELAXED);
    return spin_20us(NULL, job);
}
static void test_autotune_keeps_workers_only(void) {
    pf_config cfg = t_config_base(3000, 1, 8, 1);
    own_threads o = {2, 0};
    pf_loader *l;
    pf_stats st;
    bool helped = false;
    cfg.load = spin_20us_where;
    cfg.user = &o;
    cfg.num_workers = 2;
    cfg.autotune = 1;
    cfg.workers_only = true;
    cfg.timeout_ms = 0;
    cfg.backend = PF_BACKEND_HOST;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    t_take_in_order(l, 3000);
    pf__lock(&l->sync.mu);
    helped = l->at.help || l->at.help_trial || l->at.active == 0;
    pf__unlock(&l->sync.mu);
    pf_get_stats(l, &st);
    CHECK(!helped);
    CHECK_EQ(st.next_loads, 0);
    CHECK_EQ(__atomic_load_n(&o.on_caller, __ATOMIC_RELAXED), 0u);
    pf_destroy(l);
}

/* Autotune's pf_next loading ends at once when loads turn dear (two
   timed loads in a row over PF__HELP_DEAR_NS, 50 ms here), not at the end
   of its period: here pf_next loads every batch with the workers parked,
   and every load sleeps 60 ms. The workers are back after pf_next's
   second load (a third may start before the workers' first is ready);
   waiting for the period (32 batches and 20 ms) it loaded all 20.
   Bounded: 20 loads of 60 ms, 2 workers. */
typedef struct dear_run {
    uint32_t by_next; /* loads on the caller's thread: only it writes */
} dear_run;
static int dear_60ms(void *user, pf_job *job) {
    dear_run *d = (dear_run *)user;
    if (job->worker == 2) d->by_next++; /* num_workers: pf_next's record */
    t_sleep_us(60000);
    job->bytes = 8;
    return 0;
}
static void test_pf_next_stops_loading_when_loads_turn_dear(void) {
    pf_config cfg = t_config_base(20, 1, 8, 1);
    dear_run d = {0};
    pf_loader *l;
    pf_stats st;
    cfg.load = dear_60ms;
    cfg.user = &d;
    cfg.num_workers = 2;
    cfg.autotune = 1;
    cfg.backend = PF_BACKEND_HOST;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    pf__lock(&l->sync.mu);
    pf__set_active(l, 0, "test", 0, 0); /* pf_next alone, as if cheap loads had led there */
    l->at.help = true;
    l->at.before = 2;
    l->at.inline_load = 1e-7;
    pf__unlock(&l->sync.mu);
    t_take_in_order(l, 20);
    pf_get_stats(l, &st);
    pf_destroy(l);
    CHECKF(d.by_next <= 4, "pf_next loaded %u of 20 dear batches itself", d.by_next);
    CHECKF(st.workers_active == 2, "%u workers active after help ended", st.workers_active);
}

/* Consumers that wait back to back (several threads in pf_next on a slow
   load) never let the wait span close: the waiting still shows as it
   happens, in pf_get_stats and in autotune's periods, not 0 until the
   end (nor all of it at once, thousands of percent, when the span closes). */
typedef struct overlap {
    pf_loader *l;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned delivered;
} overlap;
static void *overlap_consumer(void *arg) {
    overlap *o = (overlap *)arg;
    for (;;) {
        pf_batch b;
        if (pf_next(o->l, &b) != PF_OK) break;
        CHECK_EQ(pf_release(o->l, &b), PF_OK);
        pthread_mutex_lock(&o->mu);
        o->delivered++;
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
    }
    return NULL;
}
static void test_overlapping_waits_show_as_they_happen(void) {
    overlap o;
    pthread_t th[3];
    pf_config cfg = t_config_base(120, 1, 8, 1);
    pf_stats st;
    struct timespec until;
    cfg.load = slow_load;
    cfg.num_workers = 1;
    cfg.backend = PF_BACKEND_HOST;
    cfg.timeout_ms = 60000; /* bounded */
    memset(&o, 0, sizeof o);
    pthread_mutex_init(&o.mu, NULL);
    pthread_cond_init(&o.cv, NULL);
    CHECK_EQ(pf_create(&cfg, &o.l), PF_OK);
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, overlap_consumer, &o);
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30; /* bounded */
    pthread_mutex_lock(&o.mu);
    while (o.delivered < 40)
        if (pthread_cond_timedwait(&o.cv, &o.mu, &until) != 0) break;
    pthread_mutex_unlock(&o.mu);
    pf_get_stats(o.l, &st); /* mid-run: three consumers wait in turn for each 2 ms load */
    CHECKF(st.wait_input_s > 0.25 * st.elapsed_s, "waited %.4f s of %.4f s", st.wait_input_s, st.elapsed_s);
    CHECK(st.wait_s <= st.elapsed_s + 1e-9);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    pf_destroy(o.l);
    pthread_cond_destroy(&o.cv);
    pthread_mutex_destroy(&o.mu);
}

/* More workers than CPUs and loads that never sleep (all CPU): only as
   many workers as CPUs load at a time, the others park; once the loads
   sleep (I/O) they all load again; once they stop, the cap is back. In
   order throughout. The test says the machine has 2 CPUs (sync.ncpu), so
   that it does not depend on the one it runs on. Where pf_next does not
   load (cfg.timeout_ms), one worker more than CPUs may load, 3 of 4;
   where it does, a worker a CPU, 2 of 4, and one less while the caller's
   thread keeps a CPU busy (said so here: t_cpu_share), 1. Loads spin 200 us (1 in 8 is asked whether it slept)
   or sleep 100 us by the clock; after the sleeping ones the cap takes
   some 54 loads asked to come back (smoothed over 16), so the last CPU
   phase is longer. Bounded: 2 x 2000 loads, 0.6 s of spinning. */
static void spin_ns(long long ns);
typedef struct cap_run {
    uint32_t by[2000]; /* the worker that loaded each batch: each written once, no lock (a
                          lock a load waits for is a sleep, which would lift the cap) */
} cap_run;
static int spin_or_sleep(void *user, pf_job *job) {
    cap_run *r = (cap_run *)user;
    if (job->batch >= 500 && job->batch < 1000) t_sleep_us(100); /* I/O */
    else spin_ns(200000);                                        /* CPU */
    r->by[job->batch] = job->worker;
    job->bytes = 8;
    return 0;
}
/* pf_create, the loader told the machine has 2 CPUs (PF__CPU_COUNT) */
static pf_loader *t_create_2cpus(const pf_config *cfg) {
    pf_loader *l = NULL;
    t_ncpu = 2;
    CHECK_EQ(pf_create(cfg, &l), PF_OK);
    t_ncpu = 0;
    return l;
}
/* expect: the workers loading while loads are all CPU */
static void cap_phases(bool next_loads, double caller_share, uint32_t expect) {
    pf_config cfg = t_config_base(2000, 1, 8, 1);
    cap_run r;
    pf_loader *l;
    pf_stats st;
    uint32_t active[3] = {0, 0, 0};
    unsigned late_by_parked = 0, io_by_parked = 0;
    char want[64];
    memset(&r, 0, sizeof r);
    cfg.load = spin_or_sleep;
    cfg.user = &r;
    cfg.num_workers = 4;
    cfg.backend = PF_BACKEND_HOST;
    /* loads run at most 9 batches ahead of pf_next: at the verdict of
       batch 480 none of the sleeping loads (500 ..) has run. With the
       default ring for 8-byte batches (64 slots) a consumer preempted on
       a loaded box let them run before it, and their sleeps lifted the cap
       before it looked */
    cfg.host_slots = 9;
    if (next_loads) cfg.timeout_ms = 0; /* the harness's watchdog bounds it */
    snprintf(want, sizeof want, "%u of 4 workers (CPU loads)", (unsigned)expect);
    l = t_create_2cpus(&cfg);
    /* the guesses alone: pf_next's loads as measured
       (test_cpu_cap_counts_pf_next_by_its_loads) would take a CPU from
       the workers where it loads a loader's share, as it may on a busy box */
    pf__lock(&l->sync.mu);
    l->ring.loads_hold = UINT32_MAX;
    pf__unlock(&l->sync.mu);
    t_cpu_share = caller_share;
    for (uint64_t k = 0; k < 2000; k++) {
        pf_batch b;
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(b.batch, k);
        CHECK_EQ(pf_release(l, &b), PF_OK);
        if (k == 480 || k == 980 || k == 1999) {
            char line[256];
            int at = k == 480 ? 0 : k == 980 ? 1 : 2;
            pf_get_stats(l, &st);
            active[at] = st.workers_active;
            pf_stats_format(l, line, sizeof line);
            CHECKF((strstr(line, want) != NULL) == (st.workers_active == expect), "%u active: %s", st.workers_active,
                   line);
            pf__lock(&l->sync.mu);
            if (h_verbose || active[at] != (at == 1 ? 4u : expect))
                printf("    batch %u: %u active, %u loads asked, slept %u/1024\n", (unsigned)k, active[at],
                       (unsigned)l->ring.cap_samples, (unsigned)l->ring.slept_share);
            pf__unlock(&l->sync.mu);
        }
    }
    pf_destroy(l);
    t_cpu_share = -1;
    CHECKF(active[0] == expect, "CPU loads: %u workers active, not %u", active[0], expect);
    CHECKF(active[1] == 4, "sleeping loads: %u workers active of 4", active[1]);
    CHECKF(active[2] == expect, "CPU loads again: %u workers active, not %u", active[2], expect);
    /* parked workers loaded none of the last CPU batches before the first
       verdict (a worker mid-load when the cap came finishes that one) */
    for (uint32_t k = 300; k < 480; k++) late_by_parked += r.by[k] >= expect && r.by[k] < 4;
    for (uint32_t k = 700; k < 980; k++) io_by_parked += r.by[k] == 3;
    CHECKF(late_by_parked <= 2, "%u of batches 300-479 loaded by parked workers", late_by_parked);
    CHECKF(io_by_parked > 0, "worker 3 loaded none of batches 700-979 (sleeping loads)");
}
/* With autotune, loads that never sleep bound the count it grows to by the
   CPUs (pf__cap_n): its verdict comes from the loads themselves, asked as
   without autotune, whatever the process's CPU time says (on a machine
   another process keeps busy it said a core was free, and 50 us CPU loads
   ran on 4-8 workers at 0.8 of 1 fixed worker: an outside trial). Told 2
   CPUs; pf_next does not load (timeout_ms): 3 at most. */
static int cpu_load(void *user, pf_job *job) {
    (void)user;
    spin_ns(200000);
    job->bytes = 8;
    return 0;
}
static void test_autotune_cpu_loads_stay_within_the_cpus(void) {
    pf_config cfg = t_config_base(1000, 1, 8, 1);
    pf_loader *l;
    pf_stats st;
    uint32_t most = 0;
    bool capped;
    cfg.load = cpu_load;
    cfg.autotune = 1;
    cfg.num_workers = 8;
    cfg.backend = PF_BACKEND_HOST;
    l = t_create_2cpus(&cfg);
    for (uint64_t k = 0; k < 1000; k++) { /* bounded: 1000 loads of 200 us */
        pf_batch b;
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(b.batch, k);
        CHECK_EQ(pf_release(l, &b), PF_OK);
        pf_get_stats(l, &st);
        if (k >= 500 && st.workers_active > most) most = st.workers_active; /* the verdict long in */
    }
    pf__lock(&l->sync.mu);
    capped = l->ring.capped;
    pf__unlock(&l->sync.mu);
    CHECKF(capped, "1000 loads of 200 us on the CPU and no verdict that they never sleep");
    CHECKF(most <= 3, "CPU loads on 2 CPUs ran on %u workers", most);
    if (h_verbose) printf("    at most %u workers after batch 500\n", most);
    pf_destroy(l);
}

/* a load that sleeps once in 50 (an outside trial's: with one asked load
   that slept lifting the cap, the workers parked and came back 100 times
   a second, each time their state stopped and made again) */
static int rarely_sleeps(void *user, pf_job *job) {
    (void)user;
    spin_ns(200000);
    if (job->batch % 50 == 49) t_sleep_us(300);
    job->bytes = 8;
    return 0;
}
/* pf_next loading a loader's share (half a worker's), as measured over
   pf__cap_caller's windows, takes a CPU from the workers whatever the
   guesses by the loads' cost and the caller's CPU time say: a fixed 2
   workers of 200 us CPU loads into 5 slots of 1 MiB on 2 cores ran beside
   a pf_next loading a third of the batches at 0.78 of 1 worker, 3 workers
   at 0.58 (its caller's thread at half a CPU, in the busy rule's
   hysteresis). Not where that leaves half a core idle (the caller's step
   sleeps): back to the count before, not again for 4 windows, then 8. One
   window judged by hand: 64 batches in 6 ms. */
static void cap_window(pf_loader *l, uint64_t next_loads, double busy) {
    uint64_t t0 = pf__now_ns() - 6000000u;
    t_proc_busy = busy;
    l->ring.caller = &pf__thread_tag;
    l->ring.caller_t0 = t0;
    l->ring.caller_cpu0 = (uint64_t)((double)t0 * t_cpu_share);
    l->ring.caller_pcpu0 = (uint64_t)((double)t0 * busy);
    l->ring.caller_b0 = l->st.batches;
    l->ring.caller_nl0 = l->st.next_loads;
    l->st.batches += 64;
    l->st.next_loads += next_loads;
    pf__cap_caller(l);
}
/* 4 workers told 2 CPUs, a ring of 64 slots, loads that do nothing (the
   tests below judge the cap by hand) unless `load` is given; next_loads:
   pf_next may load */
static pf_loader *cap_loader(bool next_loads, int (*load)(void *, pf_job *)) {
    pf_config cfg = t_config_base(64, 1, 8, 1);
    cfg.load = load ? load : nothing;
    cfg.num_workers = 4;
    cfg.host_slots = 64;
    cfg.backend = PF_BACKEND_HOST;
    if (next_loads) cfg.timeout_ms = 0;
    return t_create_2cpus(&cfg);
}
/* The cap takes a load's time waiting for a CPU out of its time asleep
   (a short sleep woken late on a busy machine is a wait for a core: a 0.1
   ms sleep among 50 us loads beside a busy loop lifted the cap 1-5 times
   in 6 s, an outside trial). pf__run_delay_ns reads the calling thread's
   run delay: through the file a worker among the first PF__SCHED_KEPT
   keeps open from its start, where the cap asks, or opened for the read
   (pf_next's record, the other workers): never more files than that. */
static int fds_open(void) {
    int n = 0;
    for (int fd = 0; fd < 4096; fd++) n += fcntl(fd, F_GETFD) != -1;
    return n;
}
static void test_cpu_cap_reads_the_run_delay(void) {
    pf__worker w;
    uint64_t a, b;
    int fd0 = fds_open();
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    bool known = f != NULL;
    if (f) fclose(f);
    memset(&w, 0, sizeof w);
    a = pf__run_delay_ns(&w); /* opened for the read */
    CHECK_EQ(w.sched_fd1, 0);
    CHECK_EQ(fds_open(), fd0);
    pf__sched_keep(&w); /* kept */
    b = pf__run_delay_ns(&w);
    if (known) {
        CHECKF(a != UINT64_MAX && b != UINT64_MAX && b >= a, "run delay %llu then %llu", (unsigned long long)a,
               (unsigned long long)b);
        CHECK(w.sched_fd1 > 0);
        CHECK_EQ(fds_open(), fd0 + 1);
        close(w.sched_fd1 - 1);
    } else { /* no schedstat here: unknown either way */
        CHECK(a == UINT64_MAX && b == UINT64_MAX);
    }
    /* a loader whose cap asks: a file for each of its first 16 workers, all
       closed by pf_destroy */
    {
        pf_config cfg = t_config_base(64, 1, 8, 1);
        pf_loader *l;
        cfg.load = nothing;
        cfg.num_workers = 24;
        cfg.backend = PF_BACKEND_HOST;
        l = t_create_2cpus(&cfg);
        if (l) {
            double until = t_now_s() + 10;
            int n;
            while ((n = fds_open()) < fd0 + (known ? 16 : 0) && t_now_s() < until) t_sleep_us(1000); /* bounded */
            CHECKF(n == fd0 + (known ? 16 : 0), "%d files open beside the %d before", n - fd0, fd0);
            pf_destroy(l);
            CHECK_EQ(fds_open(), fd0);
        }
    }
}

/* pf_next's own loads are asked whether they slept, as a worker's are:
   1 load in 8 sleeping 5 ms among 1 MiB copies, pf_next took every
   sleeping one (the next batch, while the worker waited for a slot), the
   worker's asked loads were all copies, the cap said the loads never
   sleep and held autotune at 1 worker, 0.20 of 16 fixed (an outside
   trial). Here the workers' loads hang until destroy and are never
   asked (no estimate yet); one load on the caller's thread sleeps 2 ms. */
static pthread_t caller_thread;
static int sleeps_on_the_caller(void *user, pf_job *job) {
    (void)user;
    if (pthread_equal(pthread_self(), caller_thread)) t_sleep_us(2000);
    else
        while (!pf_job_cancelled(job)) t_sleep_us(1000);
    return 0;
}
static void test_cpu_cap_asks_pf_next_s_loads(void) {
    pf_loader *l;
    caller_thread = pthread_self();
    l = cap_loader(true, sleeps_on_the_caller);
    if (!l) return;
    pf__lock(&l->sync.mu);
    l->ring.capped = true;
    l->at.inline_est = 1000000; /* 1 ms loads: asked, at least the first few */
    CHECK(pf__load_inline(l));
    CHECKF(!l->ring.capped, "pf_next's load slept 2 ms, and the cap still says the loads never sleep");
    pf__unlock(&l->sync.mu);
    pf_destroy(l);
}

static void test_cpu_cap_counts_pf_next_by_its_loads(void) {
    pf_loader *l = cap_loader(true, NULL);
    uint32_t k;
    t_cpu_share = 0.3; /* the caller's thread: not busy */
    pf__lock(&l->sync.mu);
    l->st.batches = 640;
    l->ring.load_est = 100000; /* cheap enough for pf_next: a worker a CPU */
    l->at.active = 2;
    cap_window(l, 0, 2.0); /* the first window starts the count */
    CHECK_EQ(pf__cap_n(l), 2u);
    cap_window(l, 5, 2.0); /* 5 of 64: under a loader's share (64 / 6) */
    CHECK_EQ(pf__cap_n(l), 2u);
    cap_window(l, 22, 2.0); /* a third: a CPU is pf_next's */
    CHECK_EQ(pf__cap_n(l), 1u);
    l->at.active = 1;
    for (k = 0; k < 8; k++) { /* every core busy at 1: it stays */
        cap_window(l, 32, 1.95);
        CHECK_EQ(pf__cap_n(l), 1u);
    }
    for (k = 0; k < 16 && l->ring.cap_loads; k++) cap_window(l, 32, 1.2); /* the step sleeps: a core idle */
    CHECKF(!l->ring.cap_loads && k > 1, "%u windows with a core idle: %s", k, l->ring.cap_loads ? "held" : "let go at once");
    CHECK_EQ(pf__cap_n(l), 2u);
    l->at.active = 2;
    for (k = 0; k < 3; k++) { /* held off for 4 windows, whatever pf_next loads */
        cap_window(l, 22, 2.0);
        CHECK_EQ(pf__cap_n(l), 2u);
    }
    cap_window(l, 22, 2.0);
    CHECK_EQ(pf__cap_n(l), 1u); /* then it may */
    l->at.active = 1;
    for (k = 0; k < 16 && l->ring.cap_loads; k++) cap_window(l, 32, 1.2);
    CHECK(!l->ring.cap_loads);
    l->at.active = 2;
    for (k = 0; k < 7; k++) cap_window(l, 22, 2.0); /* twice as long the second time */
    CHECK_EQ(pf__cap_n(l), 2u);
    cap_window(l, 22, 2.0);
    CHECK_EQ(pf__cap_n(l), 1u);
    pf__unlock(&l->sync.mu);
    t_cpu_share = t_proc_busy = -1;
    pf_destroy(l);
}

/* Where pf_next does not load (loads too dear for it, 1 ms), one worker
   more than CPUs fills a core while a worker waits, only where the ring
   holds PF__CAP_PLUS_SLOTS a loader: with fewer it runs full behind a
   worker the scheduler took off its core (200 us CPU loads into 1 MiB
   slots under a sleeping step: 3 workers and 7 slots at 0.57 of 1 worker,
   an outside trial). */
static void test_cpu_cap_one_more_needs_room_in_the_ring(void) {
    pf_loader *l = cap_loader(false, NULL);
    uint32_t k, had;
    pf__lock(&l->sync.mu);
    l->ring.load_est = 1000000;
    for (k = 0; k <= PF__CAP_SAMPLES; k++) (void)pf__cap_n(l); /* the guess turns: pf_next does not load */
    CHECK(l->ring.cap_plus);
    CHECK_EQ(pf__cap_n(l), 3u); /* 64 slots: room for one more */
    had = l->ring.nslots;
    l->ring.nslots = PF__CAP_PLUS_SLOTS * 3 - 1;
    CHECK_EQ(pf__cap_n(l), 2u);
    l->ring.nslots = PF__CAP_PLUS_SLOTS * 3;
    CHECK_EQ(pf__cap_n(l), 3u);
    l->ring.nslots = had;
    pf__unlock(&l->sync.mu);
    pf_destroy(l);
}

static void test_cpu_loads_run_no_more_workers_than_cpus(void) {
    pf_config cfg = t_config_base(2000, 1, 8, 1);
    pf_loader *l;
    uint32_t changes = 0, last = 0;
    cap_phases(false, 1.0, 2); /* cfg.timeout_ms: pf_next does not load; 9 slots, too few for one more */
    cap_phases(true, 0.0, 2);  /* pf_next loads too: a worker a CPU */
    cap_phases(true, 1.0, 1);  /* ...and the caller keeps a CPU busy: one less */
    cfg.load = rarely_sleeps;
    cfg.num_workers = 4;
    cfg.backend = PF_BACKEND_HOST;
    l = t_create_2cpus(&cfg);
    for (uint64_t k = 0; k < 2000; k++) {
        pf_batch b;
        pf_stats st;
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(pf_release(l, &b), PF_OK);
        if (k < 600 || k % 10) continue;
        pf_get_stats(l, &st);
        changes += last && st.workers_active != last;
        last = st.workers_active;
    }
    pf_destroy(l);
    CHECKF(last == 3, "loads sleeping 1 in 50: %u workers active, not 3", last);
    CHECKF(changes == 0, "loads sleeping 1 in 50: the worker count changed %u times after batch 600", changes);
}

/* The caller counts as a loader under the cap only while its thread keeps
   a CPU busy, as its own CPU clock says: said busy first (t_cpu_share),
   1 of 4 workers load; then, on its real clock, with a step that sleeps
   (a GPU sync), its core goes back to the workers: 2 of 4, within a few
   of its windows (64 batches, smoothed over 4: some 350 batches here). The loads spin 200 us; 2 CPUs; pf_next loads. */
static uint32_t cap_until(pf_loader *l, uint64_t *k, uint64_t most, unsigned step_us, uint32_t want) {
    pf_stats st;
    memset(&st, 0, sizeof st);
    for (uint64_t end = *k + most; *k < end;) {
        pf_batch b;
        CHECK_EQ(pf_next(l, &b), PF_OK);
        CHECK_EQ(b.batch, *k);
        ++*k;
        if (step_us) t_sleep_us(step_us);
        CHECK_EQ(pf_release(l, &b), PF_OK);
        pf_get_stats(l, &st);
        if (st.workers_active == want) break;
    }
    return st.workers_active;
}
static void test_a_caller_whose_step_sleeps_leaves_its_core_to_the_workers(void) {
    pf_config cfg = t_config_base(3000, 1, 8, 1);
    pf_loader *l;
    uint64_t k = 0;
    uint32_t got;
    cfg.load = slow_200us;
    cfg.num_workers = 4;
    cfg.timeout_ms = 0; /* pf_next loads; the harness's watchdog bounds it */
    cfg.backend = PF_BACKEND_HOST;
    l = t_create_2cpus(&cfg);
    t_cpu_share = 1.0;
    got = cap_until(l, &k, 1500, 0, 1);
    t_cpu_share = -1;
    CHECKF(got == 1, "a busy caller, %llu batches: %u workers active, not 1", (unsigned long long)k, got);
    if (h_verbose) printf("    1 worker at batch %llu\n", (unsigned long long)k);
    got = cap_until(l, &k, 1500, 400, 2);
    CHECKF(got == 2, "a caller sleeping 400 us a step, %llu batches in: %u workers active, not 2",
           (unsigned long long)k, got);
    if (h_verbose) printf("    back to 2 workers at batch %llu\n", (unsigned long long)k);
    pf__lock(&l->sync.mu);
    CHECKF(!l->ring.cap_busy, "the caller's thread still counted busy at batch %llu", (unsigned long long)k);
    pf__unlock(&l->sync.mu);
    pf_destroy(l);
}

/* Cheap CPU loads (5 us): the cap comes within each worker's first few
   loads, not after hundreds (at 1 in 256 asked, 8 asked loads took 2048:
   4 workers of 3-5 us token windows ran uncapped through most of a run),
   even where one worker makes all 300 in its time slice (a loaded box).
   cfg.timeout_ms: the workers load every batch, one more than CPUs. */
T_SPIN_LOAD(cheap_spin, 5000)
static void test_cpu_cap_comes_early_for_cheap_loads(void) {
    pf_config cfg = t_config_base(400, 1, 8, 1);
    pf_loader *l;
    pf_stats st;
    cfg.load = cheap_spin;
    cfg.num_workers = 4;
    cfg.backend = PF_BACKEND_HOST;
    l = t_create_2cpus(&cfg);
    t_take_in_order(l, 300);
    pf_get_stats(l, &st);
    CHECKF(st.workers_active == 3, "300 cheap CPU loads: %u workers active, not 3", st.workers_active);
    pf_destroy(l);
}

/* Workers parked by the cap while waiting for a slot: one free slot wakes
   one waiting worker, any of them, and one that must now park used to
   take the wake with it, leaving the workers that may claim asleep beside
   the free slot (the fuzz corpus hung so on the simulated CUDA backend).
   7 workers capped to 3, a ring of 1 slot; a hang times out. */
static void test_a_parking_worker_passes_its_wake_on(void) {
    for (int run = 0; run < 5; run++) {
        pf_config cfg = t_config_base(400, 1, 8, 1);
        pf_loader *l;
        cfg.load = cheap_spin;
        cfg.num_workers = 7;
        cfg.host_slots = 1;
        cfg.timeout_ms = 10000; /* a lost wake-up fails here, not in the watchdog */
        l = t_create_2cpus(&cfg);
        for (uint64_t k = 0; k < 400; k++) {
            pf_batch b;
            pf_result r = pf_next(l, &b);
            CHECKF(r == PF_OK, "batch %llu: %s", (unsigned long long)k, pf_error(l));
            if (r != PF_OK) break;
            CHECK_EQ(b.batch, k);
            CHECK_EQ(pf_release(l, &b), PF_OK);
        }
        pf_destroy(l);
    }
}

/* Three threads in pf_next and a load that fails: every one of them
   returns the load's error, and every pf_next after it too. One used to
   sleep for ever: showing the error to one consumer woke no other, and a
   waiting pf_next did not look for it before waiting again. Bounded:
   cfg.timeout_ms turns such a sleep into PF_ERR_TIMEOUT, which fails. */
typedef struct failing_run {
    pf_loader *l;
    pf_result got[3];
    pf_result again[3];
} failing_run;
static int fail_at_700(void *user, pf_job *job) {
    (void)user;
    if (job->epoch == 1 && job->batch == 700) return pf_job_fail(job, "corrupt sample %llu", (unsigned long long)job->batch);
    job->bytes = 8;
    return 0;
}
static void *failing_consumer(void *arg) {
    failing_run *f = (failing_run *)arg;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static int next_id;
    int id;
    pf_result r;
    pf_batch b;
    pthread_mutex_lock(&mu);
    id = next_id++ % 3;
    pthread_mutex_unlock(&mu);
    for (;;) {
        r = pf_next(f->l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r != PF_OK) break;
        if (pf_release(f->l, &b) != PF_OK) break;
    }
    f->got[id] = r;
    f->again[id] = pf_next(f->l, &b);
    return NULL;
}
static void test_a_failed_load_reaches_every_consumer(void) {
#ifdef TEST_SIM
    const int runs = 2; /* the CUDA backend (simulated, slower) */
#else
    const int runs = 6; /* with pf_next loading, and with autotune */
#endif
    for (int run = 0; run < runs; run++) {
        pf_config cfg = t_config_base(3000, 1, 8, 3);
        failing_run f;
        pthread_t th[3];
        tcons c;
        memset(&f, 0, sizeof f);
        t_begin(&c, h_seed);
        c.on_host = 1; /* the batches are not checked: t_end checks the loader */
        cfg.load = fail_at_700;
        cfg.shuffle = true;
        cfg.autotune = run % 2;
        cfg.num_workers = run % 2 ? 0 : 2;
        cfg.timeout_ms = 20000;
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
        f.l = c.l;
        for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, failing_consumer, &f);
        for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 3; i++) {
            CHECKF(f.got[i] == PF_ERR_LOAD, "run %d consumer %d: %s (%s)", run, i, pf_result_string(f.got[i]), pf_error(f.l));
            CHECK_EQ(f.again[i], PF_ERR_LOAD);
        }
        CHECKF(strstr(pf_error(f.l), "corrupt sample 700") != NULL, "%s", pf_error(f.l));
        t_end(&c);
    }
}

/* With autotune the ring starts small (3 slots for big batches), but the
   caller may still hold host_slots batches: pf_next grows the ring itself
   instead of waiting for a slot nobody will free; one more is
   PF_ERR_INVALID_STATE, at once. (It used to time out, or hang without
   cfg.timeout_ms.) */
static void test_autotune_caller_may_hold_every_slot(void) {
    phased p;
    tcons c;
    pf_config cfg;
    pf_batch held[8], b;
    pf_stats st;
    phased_init(&p);
    t_begin(&c, h_seed);
    c.on_host = 1;
    cfg = phased_config(&p, &c, 40);
    cfg.batch_bytes = (size_t)1 << 20; /* big: the ring starts at 2W+1 = 3 */
    cfg.host_slots = 8;
    cfg.num_workers = 4;
    cfg.device_slots = 8; /* simulated CUDA: the caller holds device slots */
    cfg.timeout_ms = 60000; /* bounded */
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    pf_get_stats(c.l, &st);
    if (pf_get_backend(c.l) == PF_BACKEND_HOST) CHECK_EQ(st.host_slots, 3);
    for (int i = 0; i < 8; i++) {
        CHECK_EQ(pf_next(c.l, &held[i]), PF_OK);
        CHECK_EQ(held[i].batch, (uint64_t)i);
    }
    CHECK_EQ(pf_next(c.l, &b), PF_ERR_INVALID_STATE);
    CHECK_CONTAINS(pf_error(c.l), "holds all 8");
    for (int i = 0; i < 8; i++) CHECK_EQ(pf_release(c.l, &held[i]), PF_OK);
    for (uint64_t k = 8; k < 40; k++) { /* and on, in order */
        CHECK_EQ(pf_next(c.l, &b), PF_OK);
        CHECK_EQ(b.batch, k);
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
    }
    t_end(&c);
    pthread_mutex_destroy(&p.mu);
    pthread_mutex_destroy(&p.one);
}

/* Destroy while it resizes, and with workers parked and one stuck in its
   load: pf_job_cancelled still ends the stuck load, parked workers wake
   and leave, nothing hangs or leaks. */
static void test_autotune_destroy_while_resizing_and_parked(void) {
    for (int k = 0; k < 12; k++) {
        phased p;
        tcons c;
        pf_config cfg;
        phased_init(&p);
        p.slow = 1;
        if (k % 2) p.gate_batch = 40 + k; /* a worker stuck in load at destroy */
        t_begin(&c, h_seed + (unsigned)k);
        c.on_host = 1;
        cfg = phased_config(&p, &c, 200);
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
        for (int i = 0; i < 20 + k; i++) { /* short of the stuck batch */
            pf_batch b;
            if (pf_next(c.l, &b) != PF_OK) break;
            CHECK_EQ(pf_release(c.l, &b), PF_OK);
        }
        t_end(&c); /* mid-resize, parked workers, maybe a stuck load */
        pthread_mutex_destroy(&p.mu);
    }
}

/* ---- the handoff: runs of cheap batches, pf_release without the lock ---- */

/* t_config_base's one epoch of n single-sample batches, on the host
   backend in every build (the handshakes below are the host's). */
static pf_config host_config(pf_load_fn load, void *user, uint64_t n, size_t batch_bytes, uint32_t workers) {
    pf_config cfg = t_config_base(n, 1, batch_bytes, 1);
    cfg.load = load;
    cfg.user = user;
    cfg.num_workers = workers;
    cfg.backend = PF_BACKEND_HOST;
    return cfg;
}

/* Cheap loads (a worker claims them in runs and publishes a run at its
   end), except batch `gate`, whose load waits (at most 10 s) until the
   consumer has received batch gate - 1. If a run held gate - 1 back
   behind gate's load, the two would wait for each other; so would a
   consumer asleep whose wake a ready batch held for more to come
   (pf__wake_taker_ready: the 64-slot ring's consumer is woken 32 ready
   batches at a time, or when its sleep of at most 200 us ends). A load
   that waits for the consumer needs cfg.workers_only: pf_next must never
   run it. */
typedef struct gated_run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t gate;
    int open, timed_out;
} gated_run;

static int gated_run_load(void *user, pf_job *job) {
    gated_run *g = (gated_run *)user;
    memset(job->host, (int)(job->batch & 0xff), 64);
    memcpy(job->host, &job->batch, sizeof job->batch);
    job->bytes = 64;
    if (job->epoch == 0 && job->batch == g->gate) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 10;
        pthread_mutex_lock(&g->mu);
        while (!g->open && !g->timed_out)
            if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) != 0) g->timed_out = 1;
        pthread_mutex_unlock(&g->mu);
    }
    return 0;
}

static void test_a_run_never_holds_back_a_loaded_batch(void) {
    uint64_t runs = 0;
    for (int k = 0; k < 16; k++) {
        gated_run g;
        pf_config cfg;
        pf_loader *l;
        uint64_t next = 0, got = 0;
        memset(&g, 0, sizeof g);
        pthread_mutex_init(&g.mu, NULL);
        pthread_cond_init(&g.cv, NULL);
        g.gate = 300 + (uint64_t)(k % 8); /* somewhere inside a run of up to 8 */
        cfg = host_config(gated_run_load, &g, 400, 64, 1 + (uint32_t)(k % 2));
        cfg.unordered = k >= 8;
        cfg.workers_only = true;
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        for (;;) {
            pf_batch b;
            uint64_t id;
            pf_result r = pf_next(l, &b);
            if (r == PF_END_OF_EPOCH) continue;
            if (r == PF_END_OF_DATA) break;
            CHECKF(r == PF_OK, "k %d: %s", k, pf_error(l));
            if (r != PF_OK) break;
            memcpy(&id, b.data, sizeof id);
            CHECK_EQ(id, b.batch); /* the batch's own bytes */
            if (!cfg.unordered) CHECK_EQ(b.batch, next);
            next = b.batch + 1;
            got++;
            if (b.batch == g.gate - 1) {
                pthread_mutex_lock(&g.mu);
                g.open = 1;
                pthread_cond_broadcast(&g.cv);
                pthread_mutex_unlock(&g.mu);
            }
            CHECK_EQ(pf_release(l, &b), PF_OK);
        }
        CHECK_EQ(got, 400);
        CHECKF(!g.timed_out, "k %d: batch %llu waited 10 s for batch %llu, which was loaded and held back",
               k, (unsigned long long)g.gate, (unsigned long long)g.gate - 1);
        runs += l->st.runs;
        pf_destroy(l);
        pthread_cond_destroy(&g.cv);
        pthread_mutex_destroy(&g.mu);
    }
    CHECKF(runs > 0, "no worker loaded a run: the test proved nothing"); /* loads of 64 bytes: runs, unless every one was preempted */
}

/* A load that takes long holds back no batch of its run that has not
   begun: another worker with nothing to claim takes it (>>runs). The
   first load (past batch 100: loads are known cheap, runs form) whose
   run has batches after it waits, bounded, until those batches were
   loaded by another thread; without the taking they wait for it, and the
   wait runs out (an outside trial: a 1 s load delivered the 9 batches of
   its run after it, unordered, 1 s late, with 2 workers idle). In order
   and unordered, 2 and 3 workers with workers_only; and 1 worker with
   pf_next loading, which takes from the worker's run as it waits (a
   second outside trial: with 1 worker the run's 28 batches came 1 s
   late while pf_next sat idle). */
typedef struct held_run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int triggered, timed_out;
    uint64_t held[PF__RUN_MAX];
    uint32_t nheld, left;     /* of them, not yet loaded */
    uint32_t left_then;       /* when the wait ran out */
    uint32_t workers, by_caller; /* loads pf_next ran (job->worker == num_workers) */
    unsigned char loaded[600]; /* batch -> loaded by a thread */
} held_run;
static int held_run_load(void *user, pf_job *job) {
    held_run *h = (held_run *)user;
    pf__worker *w = (pf__worker *)job->pf__worker;
    uint64_t word = PF__LOAD_SC(&w->run_word);
    uint32_t begun = (uint32_t)(word >> 32), end = (uint32_t)word;
    int wait = 0;
    memcpy(job->host, &job->batch, sizeof job->batch);
    job->bytes = 8;
    pthread_mutex_lock(&h->mu);
    h->by_caller += job->worker == h->workers;
    if (h->loaded[job->batch]++ == 0 && h->nheld) {
        for (uint32_t i = 0; i < h->nheld; i++)
            if (h->held[i] == job->batch) h->left--;
        pthread_cond_broadcast(&h->cv);
    }
    if (!h->triggered && job->batch >= 100 && end > begun) { /* this load is begun - 1 of its run */
        h->triggered = 1;
        for (uint32_t k = begun; k < end; k++) h->held[h->nheld++] = w->run[k]->b.batch;
        h->left = h->nheld;
        wait = 1;
    }
    if (wait) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 10;
        while (h->left && !h->timed_out)
            if (pthread_cond_timedwait(&h->cv, &h->mu, &dl) != 0) h->timed_out = 1, h->left_then = h->left;
    }
    pthread_mutex_unlock(&h->mu);
    return 0;
}
static void test_a_slow_load_holds_back_no_batch_of_its_run(void) {
    for (int k = 0, attempt = 0; k < 6; k++) {
        held_run *h = (held_run *)calloc(1, sizeof *h);
        pf_config cfg = host_config(held_run_load, h, 600, 8, k < 4 ? 2 + (uint32_t)(k % 2) : 1);
        pf_loader *l;
        uint64_t got = 0;
        pthread_mutex_init(&h->mu, NULL);
        pthread_cond_init(&h->cv, NULL);
        cfg.unordered = k % 4 >= 2 || k == 5;
        cfg.workers_only = k < 4; /* pf_next loads nothing: only a worker can take them */
        if (k >= 4) cfg.timeout_ms = 0; /* pf_next loads only where its wait is unbounded (the gate's is) */
        h->workers = cfg.num_workers;
        cfg.epochs = 1;
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        for (;;) {
            pf_batch b;
            uint64_t id;
            pf_result r = pf_next(l, &b);
            if (r == PF_END_OF_EPOCH || r == PF_END_OF_DATA) break;
            CHECKF(r == PF_OK, "k %d: %s", k, pf_error(l));
            if (r != PF_OK) break;
            memcpy(&id, b.data, sizeof id);
            CHECK_EQ(id, b.batch);
            if (!cfg.unordered) CHECK_EQ(b.batch, got);
            got++;
            CHECK_EQ(pf_release(l, &b), PF_OK);
        }
        CHECK_EQ(got, 600);
        if (!h->triggered && ++attempt < 3) { /* no run left batches unbegun (TSan on a loaded box, once): again */
            pf_destroy(l);
            pthread_cond_destroy(&h->cv);
            pthread_mutex_destroy(&h->mu);
            free(h);
            k--;
            continue;
        }
        attempt = 0;
        CHECKF(h->triggered, "k %d: no load ran with batches of its run not begun in 3 loaders: the test proved nothing", k);
        CHECKF(!h->timed_out, "k %d (%s, %u workers): %u of the %u batches after a slow load in its run were "
               "still not loaded after 10 s", k, cfg.unordered ? "unordered" : "in order", cfg.num_workers,
               h->left_then, h->nheld);
        CHECKF(l->st.stolen >= h->nheld, "k %d: %llu batches taken from runs, %u held", k,
               (unsigned long long)l->st.stolen, h->nheld);
        for (uint64_t i = 0; i < 600; i++) CHECK_EQ(h->loaded[i], 1); /* each loaded once */
        /* and what was taken from a run, with workers_only, a worker loaded
           (a second outside trial: pf_next loaded it, with job->worker past
           the caller's num_workers-sized array) */
        if (cfg.workers_only) CHECKF(h->by_caller == 0, "k %d: pf_next loaded %u batches with workers_only", k, h->by_caller);
        pf_destroy(l);
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
    }
}

/* What a worker took from another's run (ring.orphans) is loaded by a
   worker where pf_next may not load: with workers_only, with per-thread
   hooks, with timeout_ms (a second outside trial: pf_next loaded such
   batches in all three, 10 of 10 runs, past a num_workers-sized array
   and a 10 ms timeout). 4 workers, cheap loads, 3 in 100 of them 5 ms. */
typedef struct orphan_load {
    pthread_t caller;
    uint32_t workers;
    int by_caller; /* under mu */
    pthread_mutex_t mu;
} orphan_load;
static int orphan_load_fn(void *user, pf_job *job) {
    orphan_load *o = (orphan_load *)user;
    pthread_mutex_lock(&o->mu);
    o->by_caller += job->worker >= o->workers || pthread_equal(pthread_self(), o->caller);
    pthread_mutex_unlock(&o->mu);
    if ((job->batch * UINT64_C(0x9e3779b97f4a7c15) >> 40) % 100 < 3) t_sleep_us(5000);
    memcpy(job->host, &job->batch, sizeof job->batch);
    job->bytes = 8;
    return 0;
}
static void *orphan_init(void *user, uint32_t worker) { return (void)user, (void *)(uintptr_t)(worker + 1); }
static void orphan_stop(void *user, uint32_t worker, void *state) { (void)user, (void)worker, (void)state; }
static void test_what_is_taken_from_a_run_stays_on_the_workers(void) {
    for (int mode = 0; mode < 3; mode++) {
        orphan_load o;
        pf_config cfg = host_config(orphan_load_fn, &o, 2000, 8, 4);
        pf_loader *l;
        uint64_t got = 0;
        memset(&o, 0, sizeof o);
        pthread_mutex_init(&o.mu, NULL);
        o.caller = pthread_self();
        o.workers = 4;
        cfg.host_slots = 64;
        cfg.timeout_ms = mode == 2 ? 60000 : 0;
        cfg.workers_only = mode == 0;
        if (mode == 1) cfg.worker_init = orphan_init, cfg.worker_stop = orphan_stop;
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        for (;;) {
            pf_batch b;
            pf_result r = pf_next(l, &b);
            if (r == PF_END_OF_EPOCH || r == PF_END_OF_DATA) break;
            CHECKF(r == PF_OK, "mode %d: %s", mode, pf_error(l));
            if (r != PF_OK) break;
            CHECK_EQ(b.batch, got);
            got++;
            CHECK_EQ(pf_release(l, &b), PF_OK);
        }
        CHECK_EQ(got, 2000);
        CHECKF(o.by_caller == 0, "mode %d (%s): pf_next loaded %d batches", mode,
               mode == 0 ? "workers_only" : mode == 1 ? "worker hooks" : "timeout_ms", o.by_caller);
        CHECKF(l->st.stolen > 0 || mode > 0, "mode %d: nothing was taken from a run: the test proved nothing", mode);
        pf_destroy(l);
        pthread_mutex_destroy(&o.mu);
    }
}

/* Without autotune too, by default: cheap loads, no per-thread hooks, no
   timeout_ms. Batch 0 loads at once (so loads are known to be cheap);
   every later load on a worker waits (bounded) until pf_next has loaded
   three batches itself, so the run ends in time only if pf_next loads.
   With cfg.workers_only it never does: every load runs on a worker, the
   workers' waits run out (short, here), next_loads stays 0. */
typedef struct caller_gate {
    t_caller_gate g;
    uint32_t num_workers;
    unsigned bad_worker_id; /* under g.mu */
} caller_gate;
static int caller_gate_load(void *user, pf_job *job) {
    caller_gate *c = (caller_gate *)user;
    int mine;
    memcpy(job->host, &job->batch, sizeof job->batch);
    job->bytes = 8;
    mine = t_caller_gate_pass(&c->g, job->batch > 0);
    pthread_mutex_lock(&c->g.mu);
    if (mine != (job->worker == c->num_workers)) c->bad_worker_id++;
    pthread_mutex_unlock(&c->g.mu);
    return 0;
}
static void run_caller_gate(bool workers_only) {
    caller_gate c;
    pf_config cfg = host_config(caller_gate_load, &c, 40, 8, 1);
    pf_loader *l;
    pf_stats st;
    t_caller_gate_init(&c.g, workers_only ? 20 : 10000); /* bounded either way */
    c.num_workers = 1;
    c.bad_worker_id = 0;
    cfg.host_slots = 16;
    cfg.workers_only = workers_only;
    cfg.timeout_ms = 0; /* pf_next loads only where its wait is unbounded; the loads' waits are bounded */
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    for (uint64_t k = 0; k < 40; k++) {
        pf_batch b;
        uint64_t id;
        CHECK_EQ(pf_next(l, &b), PF_OK);
        memcpy(&id, b.data, sizeof id);
        CHECK_EQ(b.batch, k);
        CHECK_EQ(id, k);
        CHECK_EQ(pf_release(l, &b), PF_OK);
    }
    pf_get_stats(l, &st);
    CHECK_EQ(c.bad_worker_id, 0); /* the caller's thread iff worker == num_workers */
    CHECK_EQ(st.next_loads, c.g.by_caller);
    if (workers_only) {
        CHECK_EQ(c.g.by_caller, 0);
        CHECK(c.g.timed_out > 0); /* the workers waited in vain: nobody else loads */
    } else {
        CHECKF(c.g.by_caller >= 3 && !c.g.timed_out, "pf_next loaded %u batches; %u worker waits ran out",
               c.g.by_caller, c.g.timed_out);
    }
    pf_destroy(l);
    t_caller_gate_free(&c.g);
}
static void test_pf_next_helps_by_default(void) { run_caller_gate(false); }
static void test_workers_only_keeps_loads_on_workers(void) { run_caller_gate(true); }

/* Two threads release the same batch (copies of one pf_batch) at once:
   pf_release takes no lock, so exactly one of them must win and the other
   be told; the slot goes back once, and pf_get_stats counts it free. */
typedef struct release_race {
    pf_loader *l;
    pf_batch b;
    pthread_barrier_t go, done;
    pf_result r;
    int quit;
} release_race;

static void *race_releaser(void *arg) {
    release_race *rr = (release_race *)arg;
    for (;;) {
        pf_batch mine;
        pthread_barrier_wait(&rr->go);
        if (rr->quit) return NULL;
        mine = rr->b;
        rr->r = pf_release(rr->l, &mine);
        pthread_barrier_wait(&rr->done);
    }
}

static int copy_64(void *user, pf_job *job) {
    (void)user;
    memcpy(job->host, &job->indices[0], sizeof job->indices[0]);
    job->bytes = 64;
    return 0;
}

static void test_two_releases_of_one_batch_one_wins(void) {
    release_race rr;
    pthread_t t;
    pf_config cfg;
    uint64_t got = 0;
    const uint64_t n = 3000;
    memset(&rr, 0, sizeof rr);
    cfg = host_config(copy_64, NULL, n, 64, 2);
    cfg.host_slots = 4;
    CHECK_EQ(pf_create(&cfg, &rr.l), PF_OK);
    pthread_barrier_init(&rr.go, NULL, 2);
    pthread_barrier_init(&rr.done, NULL, 2);
    CHECK_EQ(pthread_create(&t, NULL, race_releaser, &rr), 0);
    for (;;) {
        pf_batch mine;
        pf_result r = pf_next(rr.l, &rr.b), mr;
        pf_stats st;
        if (r == PF_END_OF_EPOCH) continue;
        if (r != PF_OK) {
            CHECKF(r == PF_END_OF_DATA, "%s", pf_error(rr.l));
            break;
        }
        got++;
        mine = rr.b;
        pthread_barrier_wait(&rr.go);
        mr = pf_release(rr.l, &mine);
        pthread_barrier_wait(&rr.done);
        CHECKF((mr == PF_OK) != (rr.r == PF_OK), "batch %llu: the two releases said %d and %d",
               (unsigned long long)got, (int)mr, (int)rr.r);
        CHECK(mr == PF_OK || mr == PF_ERR_INVALID_STATE);
        CHECK(rr.r == PF_OK || rr.r == PF_ERR_INVALID_STATE);
        if (got % 64 == 0) {
            pf_get_stats(rr.l, &st);
            CHECK_EQ(st.held_slots, 0); /* released means free to the stats at once */
        }
    }
    CHECK_EQ(got, n);
    rr.quit = 1;
    pthread_barrier_wait(&rr.go);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&rr.go);
    pthread_barrier_destroy(&rr.done);
    pf_destroy(rr.l);
}

/* Found from the outside: autotune on, the caller keeps the last 3
   batches, loads cheap, then 5 ms, then cheap. A trial fails, its block
   is retired, and its last busy slot is freed by a release while the
   caller holds every other slot: the workers slept for a slot, pf_next
   for a batch, and nobody gave the block back or grew the ring. Bounded
   by cfg.timeout_ms: a hang is a PF_TIMEOUT here. */
static int cheap_dear_cheap(void *user, pf_job *job) {
    (void)user;
    if (job->batch >= 76 && job->batch < 106) {
        struct timespec d = {0, 5000000};
        nanosleep(&d, NULL);
    }
    memset(job->host, (int)(job->batch & 0xff), 64);
    job->bytes = 64;
    return 0;
}

static void test_autotune_shrink_while_the_caller_holds_three(void) {
    for (int run = 0; run < 3; run++) {
        pf_config cfg;
        pf_loader *l;
        pf_batch held[3], b;
        int nheld = 0;
        uint64_t got = 0;
        pf_result r;
        cfg = host_config(cheap_dear_cheap, NULL, 228 * 16, 1 << 20, 4);
        cfg.batch_size = 16;
        cfg.autotune = true;
        cfg.timeout_ms = 10000;
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        while ((r = pf_next(l, &b)) == PF_OK) {
            CHECK_EQ(b.batch, got);
            got++;
            if (nheld == 3) {
                CHECK_EQ(pf_release(l, &held[0]), PF_OK);
                held[0] = held[1];
                held[1] = held[2];
                nheld--;
            }
            held[nheld++] = b;
        }
        CHECKF(r == PF_END_OF_EPOCH, "run %d, after %llu batches: %s", run, (unsigned long long)got, pf_error(l));
        CHECK_EQ(got, 228);
        while (nheld) CHECK_EQ(pf_release(l, &held[--nheld]), PF_OK);
        pf_destroy(l);
    }
}

/* Found from the outside: a worker read the result of its run's previous
   batch after the consumer could have published it, taken it, released
   it and another worker claimed the slot again; when that worker's load
   failed, the first one took it for its own run's failure, and pf_next
   stopped before batches that had loaded fine (TSan: a race between
   pf__claim and pf__worker_main). Worker 1's first load past batch 200
   into the slot worker 0 loaded last fails: pf_next must deliver every
   batch before it, then the error. */
typedef struct slot_fail {
    pthread_mutex_t mu;
    void *last0;
    uint64_t failed;
} slot_fail;

static int fail_in_a_reused_slot(void *user, pf_job *job) {
    slot_fail *f = (slot_fail *)user;
    int fail = 0;
    memcpy(job->host, &job->batch, sizeof job->batch);
    job->bytes = 8;
    pthread_mutex_lock(&f->mu);
    if (job->worker == 0) f->last0 = job->host;
    if (job->worker == 1 && job->batch >= 200 && job->host == f->last0 &&
        (f->failed == UINT64_MAX || f->failed == job->batch)) {
        f->failed = job->batch;
        fail = 1;
    }
    pthread_mutex_unlock(&f->mu);
    return fail ? pf_job_fail(job, "injected failure of batch %llu", (unsigned long long)job->batch) : 0;
}

static void test_a_failure_in_a_reused_slot_is_its_own(void) {
    int injected = 0;
    for (int it = 0; it < 300; it++) {
        slot_fail f;
        pf_config cfg;
        pf_loader *l;
        pf_batch b;
        pf_result r;
        uint64_t got = 0;
        pthread_mutex_init(&f.mu, NULL);
        f.last0 = NULL;
        f.failed = UINT64_MAX;
        cfg = host_config(fail_in_a_reused_slot, &f, 100000, 64, 2);
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        while ((r = pf_next(l, &b)) == PF_OK) {
            CHECK_EQ(b.batch, got);
            got++;
            CHECK_EQ(pf_release(l, &b), PF_OK);
        }
        pthread_mutex_lock(&f.mu);
        if (f.failed == UINT64_MAX) /* worker 1 never loaded into worker 0's last slot: every batch, then the end */
            CHECKF(r == PF_END_OF_EPOCH && got == 100000, "iteration %d: no batch failed, pf_next delivered %llu and "
                   "said %d: %s", it, (unsigned long long)got, (int)r, pf_error(l));
        else
            CHECKF(r == PF_ERR_LOAD && got == f.failed, "iteration %d: batch %llu failed, pf_next delivered %llu and "
                   "said %d: %s", it, (unsigned long long)f.failed, (unsigned long long)got, (int)r, pf_error(l));
        injected += f.failed != UINT64_MAX;
        pthread_mutex_unlock(&f.mu);
        pf_destroy(l);
        pthread_mutex_destroy(&f.mu);
    }
    /* the scheduler decides whether worker 1 reuses worker 0's slot (2 runs
       in 300 under TSan on a busy box it did not); most runs must */
    if (h_verbose) printf("    the failure was injected in %d runs of 300\n", injected);
    CHECKF(injected >= 150, "the failure was injected in %d runs of 300", injected);
}

static const h_test tests[] = {
    {"autotune_grows_when_starved_and_shrinks", test_autotune_grows_when_starved_and_shrinks_when_compute_bound},
    {"autotune_keeps_the_order", test_autotune_keeps_the_order},
    {"autotune_ring_grows_with_workers", test_autotune_ring_grows_with_workers},
    {"autotune_ring_that_cannot_grow", test_autotune_ring_that_cannot_grow},
    {"autotune_ring_grows_again_after_a_failed_allocation", test_autotune_ring_grows_again_after_a_failed_allocation},
    {"autotune_past_the_cpus_from_a_steady_period", test_autotune_past_the_cpus_from_a_steady_period},
    {"autotune_counts_pf_next_as_a_loader", test_autotune_counts_pf_next_as_a_loader},
    {"cpu_cap_count", test_cpu_cap_count},
    {"cpu_cap_weighs_the_time_slept", test_cpu_cap_weighs_the_time_slept},
    {"autotune_a_worker_per_cpu_for_pf_next_share", test_autotune_a_worker_per_cpu_for_pf_next_share},
    {"autotune_big_step_needs_a_big_gain", test_autotune_big_step_needs_a_big_gain},
    {"autotune_trial_rise_counts_pf_next_by_its_share", test_autotune_trial_rise_counts_pf_next_by_its_share},
    {"autotune_trial_judged_on_two_periods", test_autotune_trial_judged_on_two_periods},
    {"autotune_baseline_of_the_same_loads", test_autotune_baseline_of_the_same_loads},
    {"autotune_cpu_ceiling_goes_when_loads_sleep", test_autotune_cpu_ceiling_goes_when_loads_sleep},
    {"autotune_new_ceiling_counts_its_own_drift", test_autotune_new_ceiling_counts_its_own_drift},
    {"autotune_retries_a_failed_trial", test_autotune_retries_a_failed_trial},
    {"autotune_trial_ring", test_autotune_trial_ring},
    {"autotune_trial_behind_a_late_batch_gets_more_slots", test_autotune_trial_behind_a_late_batch_gets_more_slots},
    {"autotune_counts_the_wait_behind_a_late_batch", test_autotune_counts_the_wait_behind_a_late_batch},
    {"autotune_waits_behind_copies_get_no_more_slots", test_autotune_waits_behind_copies_get_no_more_slots},
    {"autotune_trial_short_of_slots_is_tried_with_more", test_autotune_trial_short_of_slots_is_tried_with_more},
    {"autotune_slots_for_a_stall_cover_the_longest", test_autotune_slots_for_a_stall_cover_the_longest},
    {"worker_run_times_some_loads", test_worker_run_times_some_loads},
    {"autotune_failed_trial_gives_slots_back", test_autotune_failed_trial_gives_its_slots_back},
    {"pf_next_loads_when_no_worker_is_active", test_pf_next_loads_when_no_worker_is_active},
    {"a_caller_whose_step_sleeps_leaves_its_core_to_the_workers", test_a_caller_whose_step_sleeps_leaves_its_core_to_the_workers},
    {"cpu_cap_comes_early_for_cheap_loads", test_cpu_cap_comes_early_for_cheap_loads},
    {"autotune_cpu_loads_stay_within_the_cpus", test_autotune_cpu_loads_stay_within_the_cpus},
    {"a_parking_worker_passes_its_wake_on", test_a_parking_worker_passes_its_wake_on},
    {"consumers_while_pf_next_loads", test_consumers_while_pf_next_loads_exactly_once},
    {"pf_next_helps_the_workers", test_pf_next_helps_the_workers},
    {"autotune_leaves_out_what_loaded_before_the_first_pf_next", test_autotune_leaves_out_what_loaded_before_the_first_pf_next},
    {"a_help_trial_ends_when_nothing_waits", test_a_help_trial_ends_when_nothing_waits},
    {"untimed_loads_in_pf_next_still_count", test_untimed_loads_in_pf_next_still_count},
    {"pf_next_load_stats_follow_a_changing_load", test_pf_next_load_stats_follow_a_changing_load},
    {"stats_never_go_back_while_pf_next_loads", test_stats_never_go_back_while_pf_next_loads},
    {"a_failed_load_in_pf_next_names_pf_next", test_a_failed_load_in_pf_next_names_pf_next},
    {"pf_next_loads_in_runs", test_pf_next_loads_in_runs},
    {"loads_that_turn_dear_end_pf_next_s_run", test_loads_that_turn_dear_end_pf_next_s_run},
    {"handed_back_batches_load_when_no_worker_will", test_handed_back_batches_load_when_no_worker_will},
    {"no_load_begins_after_a_failure", test_no_load_begins_after_a_failure},
    {"overlapping_waits_show_as_they_happen", test_overlapping_waits_show_as_they_happen},
    {"autotune_caller_may_hold_every_slot", test_autotune_caller_may_hold_every_slot},
    {"pf_next_stops_loading_when_loads_turn_dear", test_pf_next_stops_loading_when_loads_turn_dear},
    {"cpu_loads_run_no_more_workers_than_cpus", test_cpu_loads_run_no_more_workers_than_cpus},
    {"cpu_cap_counts_pf_next_by_its_loads", test_cpu_cap_counts_pf_next_by_its_loads},
    {"cpu_cap_asks_pf_next_s_loads", test_cpu_cap_asks_pf_next_s_loads},
    {"cpu_cap_rare_long_sleeps_are_not_all_cpu", test_cpu_cap_rare_long_sleeps_are_not_all_cpu},
    {"cpu_cap_reads_the_run_delay", test_cpu_cap_reads_the_run_delay},
    {"cpu_cap_one_more_needs_room_in_the_ring", test_cpu_cap_one_more_needs_room_in_the_ring},
    {"autotune_grows_in_huge_pages", test_autotune_grows_in_huge_pages},
    {"autotune_ring_follows_the_count_down", test_autotune_ring_follows_the_count_down},
    {"worker_slot_wait_counts_while_it_lasts", test_worker_slot_wait_counts_while_it_lasts},
    {"autotune_ring_forgets_a_burst_of_held_batches", test_autotune_ring_forgets_a_burst_of_held_batches},
    {"freed_slots_leave_the_process", test_freed_slots_leave_the_process},
    {"pf_next_alone_wakes_when_the_ring_grows", test_pf_next_alone_wakes_when_the_ring_grows},
    {"run_len_counts_what_is_free", test_run_len_counts_what_is_free},
    {"failed_spin_probes_back_off", test_failed_spin_probes_back_off},
    {"autotune_ring_shrinks_when_the_count_settles_lower", test_autotune_ring_shrinks_when_the_count_settles_lower},
    {"a_failed_load_reaches_every_consumer", test_a_failed_load_reaches_every_consumer},
    {"a_failed_help_trial_tries_pf_next_alone", test_a_failed_help_trial_tries_pf_next_alone},
    {"autotune_destroy_while_resizing_and_parked", test_autotune_destroy_while_resizing_and_parked},
    {"two_to_four_consumers_exactly_once", test_two_to_four_consumers_exactly_once},
    {"consumers_with_short_timeouts_exactly_once", test_consumers_with_short_timeouts_exactly_once},
    {"no_lost_wakeup_between_two_consumers", test_no_lost_wakeup_between_two_consumers},
    {"two_waiting_consumers_count_once", test_two_waiting_consumers_count_once},
    {"elapsed_runs_to_the_latest_pf_next", test_elapsed_runs_to_the_latest_pf_next},
    {"failed_create_ran_no_callback", test_failed_create_ran_no_callback},
    {"a_run_never_holds_back_a_loaded_batch", test_a_run_never_holds_back_a_loaded_batch},
    {"a_slow_load_holds_back_no_batch_of_its_run", test_a_slow_load_holds_back_no_batch_of_its_run},
    {"what_is_taken_from_a_run_stays_on_the_workers", test_what_is_taken_from_a_run_stays_on_the_workers},
    {"pf_next_helps_by_default", test_pf_next_helps_by_default},
    {"workers_only_keeps_loads_on_workers", test_workers_only_keeps_loads_on_workers},
    {"autotune_keeps_workers_only", test_autotune_keeps_workers_only},
    {"autotune_tries_pf_next_alone_when_workers_keep_up", test_autotune_tries_pf_next_alone_when_workers_keep_up},
    {"idle_workers_park_by_what_they_need", test_idle_workers_park_by_what_they_need},
    {"two_releases_of_one_batch_one_wins", test_two_releases_of_one_batch_one_wins},
    {"autotune_shrink_while_the_caller_holds_three", test_autotune_shrink_while_the_caller_holds_three},
    {"a_failure_in_a_reused_slot_is_its_own", test_a_failure_in_a_reused_slot_is_its_own},
};

int main(int argc, char **argv) {
#ifdef TEST_SIM
    const char *suite = "threads suite (simulated CUDA backend)";
#else
    const char *suite = "threads suite (host backend)";
#endif
    return h_main(argc, argv, suite, tests, sizeof tests / sizeof tests[0]);
}
