/* test_stress.c - trying hard to break it: 16 workers on 2 cores with tiny
   batches, random release order and random timeouts; a soak of 10,000
   epochs in one loader and 1,000 create/destroy cycles with RSS, threads
   and file descriptors held flat; cooperative cancellation of a slow load;
   no allocation during a run. Host backend, or -DTEST_SIM for the CUDA
   backend on the simulated runtime. `-q` runs the short versions. */
#define _POSIX_C_SOURCE 200809L
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"
#include "util.h"

#include <dirent.h>

static int quick;

static long proc_status(const char *key) { /* VmRSS: kB, Threads: count */
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) v = atol(line + strlen(key));
    fclose(f);
    return v;
}

/* Threads, once the kernel has caught up: pthread_join returns when the
   thread's tid futex clears, which can be a moment before the task leaves
   the thread group. So a count above `want` is read again, a bounded few
   times 1 ms apart; a thread really left running still shows. */
static long threads_settled(long want) {
    long n = proc_status("Threads:");
    for (int i = 0; i < 200 && n > want; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        n = proc_status("Threads:");
    }
    return n;
}

static int open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n - 3; /* ".", "..", and the DIR's own */
}

/* Open descriptors once a worker's passing one has closed: a worker that
   started before the CPU cap asked opens its thread's schedstat for each
   read (pf__run_delay_ns), and may be between the open and the close when
   the count is taken (the soak read 9 against 8 once in many runs). The
   fewest of a few looks, or the first at or under want: a leak stays. */
static int fds_settled(int want) {
    int least = open_fds();
    for (int i = 0; i < 200 && least > want; i++) {
        struct timespec ts = {0, 1000000};
        int n;
        nanosleep(&ts, NULL);
        n = open_fds();
        if (n < least) least = n;
    }
    return least;
}

/* RSS is only meaningful without a sanitizer's shadow and quarantine. */
#if defined(__SANITIZE_ADDRESS__) || H_TSAN
#define MEASURE_RSS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MEASURE_RSS 0
#endif
#endif
#ifndef MEASURE_RSS
#define MEASURE_RSS 1
#endif

/* ---- stress ---- */

static void stress(bool unordered, uint64_t batches) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_batch held[32]; /* >= the consumer slots */
    uint32_t nheld = 0, limit;
    uint64_t got = 0, timeouts = 0, epochs_ended = 0, per_epoch, in_epoch = 0;
    unsigned char seen[512];
    h_rng_state = h_seed * 31 + unordered;
    t_load_init(&t);
    t.max_delay_us = 3000; /* one batch in 50 sleeps 3 ms: past the 1 ms timeout */
    t.slow_every = 50;
    t.gate_epoch = 0;      /* and batch 7 waits at a gate until the consumer has timed
                              out once, so a timeout happens however the machine is loaded */
    t.gate_batch = 7;
    t_begin(&c, h_seed);
    cfg = t_config(&t, 509, 2, 0);
    cfg.num_workers = 16;
    cfg.host_slots = 24;
    cfg.device_slots = 4;
    cfg.shuffle = true;
    cfg.unordered = unordered;
    cfg.timeout_ms = 1;
    limit = t_consumer_slots(&cfg);
    per_epoch = (509 + 1) / 2;
    memset(seen, 0, sizeof seen);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    while (got < batches) {
        pf_batch b;
        pf_result r;
        if (nheld && (nheld == limit || h_rand() % 3 == 0)) { /* release a random one */
            uint32_t k = (uint32_t)(h_rand() % nheld);
            t_release(&c, &held[k]);
            held[k] = held[--nheld];
            continue;
        }
        r = t_next(&c, &b);
        if (r == PF_TIMEOUT) {
            if (timeouts++ == 0) t_gate_open(&t);
            continue;
        }
        if (r == PF_END_OF_EPOCH) {
            CHECK_EQ(in_epoch, per_epoch);
            in_epoch = 0;
            epochs_ended++;
            memset(seen, 0, sizeof seen);
            continue;
        }
        if (r != PF_OK) {
            CHECKF(0, "pf_next: %d %s", (int)r, pf_error(c.l));
            break;
        }
        CHECK_EQ(b.epoch, epochs_ended);
        if (!unordered) CHECK_EQ(b.batch, in_epoch);
        CHECK(b.batch < per_epoch && !seen[b.batch]);
        seen[b.batch % 512] = 1;
        in_epoch++;
        got++;
        held[nheld++] = b;
    }
    while (nheld) t_release(&c, &held[--nheld]);
    if (h_verbose || !quick)
        printf("    %s: %llu batches, %llu epochs, %llu timeouts survived\n", unordered ? "unordered" : "in order",
               (unsigned long long)got, (unsigned long long)epochs_ended, (unsigned long long)timeouts);
    t_end(&c);
    /* the gated batch stalls the consumer: in order at once, unordered once
       every other batch it could take is taken; the timeouts really happened */
    CHECK(timeouts > 0);
    t_load_free(&t);
}

static uint64_t stress_batches(void) {
#ifdef TEST_SIM
    return quick ? 5000 : 30000;
#else
    return 100000;
#endif
}

static void test_stress_in_order(void) { stress(false, stress_batches()); }
static void test_stress_unordered(void) { stress(true, stress_batches()); }

/* ---- soak ---- */

static void test_soak_many_epochs_one_loader(void) {
    tload t;
    tcons c;
    talloc a;
    pf_config cfg;
    const uint64_t epochs = quick ? 2000 : 10000;
    long rss0 = 0, thr0 = -1, fd0 = -1, allocs;
    uint64_t e = 0, batches = 0;
    t_load_init(&t);
    t_alloc_init(&a, 0);
    t_begin(&c, h_seed);
    cfg = t_config(&t, 9, 4, 0); /* 3 short batches per epoch, for ever */
    cfg.num_workers = 4;
    cfg.shuffle = true;
    cfg.allocator.alloc_fn = t_alloc;
    cfg.allocator.free_fn = t_free;
    cfg.allocator.user_data = &a;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    allocs = a.total;
    while (e < epochs) {
        pf_batch b;
        pf_result r = t_next(&c, &b);
        if (r == PF_END_OF_EPOCH) {
            if (++e == 100) { /* warmed up: from here on nothing may grow */
                rss0 = proc_status("VmRSS:");
                thr0 = proc_status("Threads:");
                fd0 = fds_settled(0); /* the fewest of 200 looks, 1 ms apart (0: none is that few) */
            }
            continue;
        }
        if (r != PF_OK) {
            CHECKF(0, "pf_next: %s", pf_error(c.l));
            break;
        }
        CHECK_EQ(b.epoch, e);
        batches++;
        t_release(&c, &b);
    }
    CHECK_EQ(batches, epochs * 3);
    CHECK_EQ(a.total, allocs); /* nothing allocated while running */
    CHECK_EQ(threads_settled(thr0), thr0);
    CHECK_EQ(fds_settled(fd0), fd0);
    if (MEASURE_RSS) {
        long grew = proc_status("VmRSS:") - rss0;
        CHECKF(grew < 512, "RSS grew by %ld KiB over %llu epochs", grew, (unsigned long long)epochs);
        printf("    %llu epochs (%llu batches): RSS %ld -> %ld KiB, threads %ld, fds %d, no allocation\n",
               (unsigned long long)epochs, (unsigned long long)batches, rss0, rss0 + grew, thr0, open_fds());
    }
    t_end(&c);
    CHECK_EQ(a.live, 0);
    t_load_free(&t);
}

static void test_soak_create_destroy_cycles(void) {
    const int cycles = quick ? 200 : 1000;
    long rss_first = 0, rss_max = 0, thr0;
    int fd0;
    tload t;
#ifdef TEST_SIM
    cudaSimReset(h_seed, 0, 2); /* earlier tests' stream threads joined first */
#endif
    thr0 = proc_status("Threads:");
    fd0 = open_fds();
    t_load_init(&t);
    for (int i = 0; i < cycles; i++) {
        tcons c;
        trun r;
        pf_config cfg;
        t_begin(&c, h_seed + (unsigned long long)i);
        cfg = t_config(&t, 40, 4, 1);
        cfg.num_workers = 1 + (uint32_t)(i % 4);
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
        t_run_init(&r);
        /* stop at a varying point: before the end (10 batches), or past it */
        CHECK_EQ(t_drain(&c, &r, (size_t)(i % 12)), i % 12 <= 10 ? PF_OK : PF_END_OF_DATA);
        t_end(&c);
        t_run_free(&r);
        if (i == 50) rss_first = proc_status("VmRSS:");
        if (i > 50) {
            long rss = proc_status("VmRSS:");
            if (rss > rss_max) rss_max = rss;
        }
    }
#ifdef TEST_SIM
    cudaSimReset(h_seed, 0, 2); /* a destroyed stream's thread exits after cudaStreamDestroy returns */
#endif
    CHECK_EQ(threads_settled(thr0), thr0); /* every thread joined */
    CHECK_EQ(open_fds(), fd0);
    if (MEASURE_RSS) {
        CHECKF(rss_max - rss_first < 1024, "RSS grew from %ld to %ld KiB over %d cycles", rss_first, rss_max, cycles);
        printf("    %d create/destroy cycles: RSS %ld KiB after 50, at most %ld KiB after; threads %ld, fds %d\n",
               cycles, rss_first, rss_max, proc_status("Threads:"), open_fds());
    }
    t_load_free(&t);
}

/* ---- cancellation ---- */

static int slow_load(void *user, pf_job *job) { /* a long decode that checks in every millisecond */
    tload *t = (tload *)user;
    if (job->batch == 1) {
        pthread_mutex_lock(&t->mu);
        t->gate_entered++;
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        for (int ms = 0; ms < 60000 && !pf_job_cancelled(job); ms++) t_sleep_us(1000);
        pthread_mutex_lock(&t->mu);
        t->cancelled_seen += pf_job_cancelled(job);
        pthread_mutex_unlock(&t->mu);
        return pf_job_fail(job, "cancelled");
    }
    return t_load(user, job);
}

static void test_destroy_returns_when_a_slow_load_notices(void) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_batch b;
    t_load_init(&t);
    t_begin(&c, h_seed);
    cfg = t_config(&t, 100, 4, 1);
    cfg.load = slow_load;
    cfg.num_workers = 2;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_next(&c, &b), PF_OK);
    t_release(&c, &b);
    CHECK(t_gate_wait_entered(&t, 1)); /* a worker is deep inside the slow load */
    {
        double t0 = h_now();
        t_end(&c); /* returns once the load sees pf_job_cancelled */
        if (h_verbose) printf("    destroy took %.1f ms\n", (h_now() - t0) * 1e3);
    }
    CHECK_EQ(t.cancelled_seen, 1);
    t_load_free(&t);
}

static const h_test tests[] = {
    {"stress_16_workers_in_order", test_stress_in_order},
    {"stress_16_workers_unordered", test_stress_unordered},
    {"soak_many_epochs_one_loader", test_soak_many_epochs_one_loader},
    {"soak_create_destroy_cycles", test_soak_create_destroy_cycles},
    {"destroy_returns_when_a_slow_load_notices", test_destroy_returns_when_a_slow_load_notices},
};

int main(int argc, char **argv) {
#ifdef TEST_SIM
    const char *suite = "stress and soak (simulated CUDA backend)";
    t_sim_delay_us = 0;
#else
    const char *suite = "stress and soak (host backend)";
#endif
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-q")) quick = 1;
    return h_main(argc, argv, suite, tests, sizeof tests / sizeof tests[0]);
}
