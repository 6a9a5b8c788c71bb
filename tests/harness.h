/* harness.h - the tests' tiny harness: checks, a per-test watchdog (a hang
   fails the run instead of freezing CI), and the tally that `make test` sums.
   Valid C11 and C++17. Include after <pthread.h>-capable feature macros. */
#ifndef PF_HARNESS_H
#define PF_HARNESS_H

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* H_TSAN: built with ThreadSanitizer (gcc or clang) */
#if defined(__SANITIZE_THREAD__)
#define H_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define H_TSAN 1
#endif
#endif
#ifndef H_TSAN
#define H_TSAN 0
#endif

typedef struct h_test {
    const char *name;
    void (*fn)(void);
} h_test;

static int h_checks_failed;
static const char *h_skip_reason; /* set by h_skip: the test did not run */
static const char *h_current = "";
static unsigned h_limit_s = 120;
static unsigned long long h_seed = 1;
static int h_verbose;

static pthread_mutex_t h_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t h_cv = PTHREAD_COND_INITIALIZER;
static unsigned long h_generation; /* bumps at each test start */
static int h_done;

static void h_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    char msg[1024] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_lock(&h_mu);
    h_checks_failed++;
    if (h_checks_failed < 200)
        fprintf(stderr, "    %s:%d: [%s] check failed: %s%s%s\n", file, line, h_current, cond, fmt ? " -- " : "",
                msg);
    pthread_mutex_unlock(&h_mu);
}

#define CHECK(cond)                                                     \
    do {                                                                \
        if (!(cond)) h_fail(__FILE__, __LINE__, #cond, NULL);           \
    } while (0)
#define CHECKF(cond, ...)                                               \
    do {                                                                \
        if (!(cond)) h_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);    \
    } while (0)
#define CHECK_EQ(a, b)                                                                      \
    do {                                                                                    \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);      \
        if (a_ != b_) h_fail(__FILE__, __LINE__, #a " == " #b, "%llu != %llu", a_, b_);     \
    } while (0)
#define CHECK_CONTAINS(hay, needle)                                                         \
    do {                                                                                    \
        const char *h_ = (hay), *n_ = (needle);                                             \
        if (!h_ || !strstr(h_, n_))                                                         \
            h_fail(__FILE__, __LINE__, "\"" #hay "\" contains \"" #needle "\"", "got \"%s\"", h_ ? h_ : "(null)"); \
    } while (0)

/* This test cannot run here (e.g. it needs a GPU): reported as skipped,
   never counted as passed. */
static __attribute__((unused)) void h_skip(const char *why) { h_skip_reason = why; }

static double h_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Aborts the process when one test runs past h_limit_s. */
static void *h_watchdog(void *arg) {
    (void)arg;
    pthread_mutex_lock(&h_mu);
    while (!h_done) {
        unsigned long gen = h_generation;
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += (time_t)h_limit_s;
        while (!h_done && gen == h_generation) {
            if (pthread_cond_timedwait(&h_cv, &h_mu, &dl) != 0 && !h_done && gen == h_generation) {
                fprintf(stderr, "HANG: test %s ran past %u s; aborting\nRESULT 0 1 0\n", h_current, h_limit_s);
                fflush(stderr);
                fflush(stdout);
                _Exit(3);
            }
        }
    }
    pthread_mutex_unlock(&h_mu);
    return NULL;
}

/* usage: binary [-v] [-s SEED] [name-substring ...] */
static int h_main(int argc, char **argv, const char *suite, const h_test *tests, size_t ntests) {
    pthread_t wd;
    int passed = 0, failed = 0, skipped = 0, named = 0, i;
    size_t t;
    const char *env = getenv("PF_TEST_SEED");
    if (env) h_seed = strtoull(env, NULL, 10);
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-v") == 0) h_verbose = 1;
        if (strcmp(argv[i], "-vv") == 0) h_verbose = 2; /* and what the suite logs, where it says */
        else if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) h_seed = strtoull(argv[++i], NULL, 10);
        else if (argv[i][0] != '-') named = 1;
    }
    pthread_create(&wd, NULL, h_watchdog, NULL);
    printf("%s (seed %llu)\n", suite, h_seed);
    for (t = 0; t < ntests; t++) {
        int selected = 1, before;
        double t0;
        for (i = 1; i < argc; i++) {
            if (argv[i][0] == '-') {
                if (strcmp(argv[i], "-s") == 0) i++;
                continue;
            }
            selected = 0;
            if (strstr(tests[t].name, argv[i])) {
                selected = 1;
                break;
            }
        }
        if (!selected) continue;
        pthread_mutex_lock(&h_mu);
        h_current = tests[t].name;
        h_generation++;
        before = h_checks_failed;
        pthread_cond_broadcast(&h_cv);
        pthread_mutex_unlock(&h_mu);
        t0 = h_now();
        h_skip_reason = NULL;
        tests[t].fn();
        pthread_mutex_lock(&h_mu);
        if (h_skip_reason && h_checks_failed == before) {
            skipped++;
            printf("  SKIP %-40s %s\n", tests[t].name, h_skip_reason);
        } else if (h_checks_failed == before) {
            passed++;
            printf("  ok   %-40s %6.2f s\n", tests[t].name, h_now() - t0);
        } else {
            failed++;
            printf("  FAIL %-40s %6.2f s\n", tests[t].name, h_now() - t0);
        }
        fflush(stdout);
        pthread_mutex_unlock(&h_mu);
    }
    if (named && passed + failed + skipped == 0) { /* a misspelt name must not pass by running nothing */
        failed++;
        printf("  FAIL no test matches the names given\n");
    }
    pthread_mutex_lock(&h_mu);
    h_done = 1;
    pthread_cond_broadcast(&h_cv);
    pthread_mutex_unlock(&h_mu);
    pthread_join(wd, NULL);
    printf("%s: %d passed, %d failed, %d skipped\nRESULT %d %d %d\n", suite, passed, failed, skipped, passed,
           failed, skipped);
    return failed ? 1 : 0;
}

/* Deterministic per-test randomness. */
static unsigned long long h_rng_state = 1;
static __attribute__((unused)) unsigned long long h_rand(void) {
    unsigned long long z = (h_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif
