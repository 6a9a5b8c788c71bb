/* test_core.c - the loader suite: sampler, order, epochs, sharding, errors,
   timeouts, destroy at any moment, stats. Built as C11 (gcc, clang), C++17
   (g++), with ASan+UBSan and with TSan; and with -DTEST_SIM against the
   simulated CUDA runtime, where every batch is checked by a kernel stand-in
   on the consumer stream and every access is checked for ordering. */
#define _POSIX_C_SOURCE 200809L
#define PREFETCH_IMPLEMENTATION
/* pf_next loads a dear batch when the one it waits for is further off than
   that load less this: 20 ms here, not 200 us, so that a sanitizer's slow
   wake-up does not decide it (test_late_help) */
#define PF__HELP_LATE_NS 20000000u
/* The library's assertions count here instead of aborting, so a broken
   invariant fails the test that broke it (and the suite's last check) with
   the assertion's text; every other PF_ASSERT stays armed. */
static int t_asserts_failed;
static char t_assert_text[256];
#define PF_ASSERT(x) ((x) ? (void)0 : (void)(t_asserts_failed++, snprintf(t_assert_text, sizeof t_assert_text, "%s", #x)))
#include <stdio.h>
#include "../prefetch.h"
#include "util.h"

/* ---- sampler ---- */

/* The Feistel network run backwards, and its cycle walk: the inverse of
   the shuffle, to prove it a bijection at sizes too large to enumerate.
   Test-only, so it lives here and not in the header. */
static uint64_t feistel_inverse(const pf__perm *p, uint64_t y) {
    uint64_t l = y >> p->half, r = y & p->mask;
    for (int i = PF__FEISTEL_ROUNDS - 1; i >= 0; i--) {
        uint64_t t = r ^ (pf__mix(l ^ p->key[i]) & p->mask);
        r = l;
        l = t;
    }
    return (l << p->half) | r;
}

static uint64_t pf__perm_invert(const pf__perm *p, uint64_t y) {
    do y = feistel_inverse(p, y);
    while (y >= p->n);
    return y;
}

static void test_perm_small_sizes(void) {
    const uint64_t sizes[] = {1, 2, 3, 4, 5, 17, 1000, (1u << 20) + 3};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        uint64_t n = sizes[k];
        for (uint64_t seed = 0; seed < (n > 5000 ? 2u : 6u); seed++) {
            pf__perm p;
            unsigned char *seen = (unsigned char *)calloc(n, 1);
            uint64_t fixed = 0, bad = 0;
            pf__perm_init(&p, n, seed, seed * 7 + 1);
            for (uint64_t i = 0; i < n; i++) {
                uint64_t y = pf__perm_apply(&p, i);
                if (y >= n || seen[y]) bad++;
                else seen[y] = 1;
                fixed += y == i;
                if (pf__perm_invert(&p, y) != i) bad++;
            }
            CHECKF(bad == 0, "n=%llu seed=%llu: %llu collisions or bad inverses", (unsigned long long)n,
                   (unsigned long long)seed, (unsigned long long)bad);
            /* a real shuffle: few fixed points (expected about 1) */
            if (n >= 1000) CHECKF(fixed < 20, "n=%llu: %llu fixed points", (unsigned long long)n, (unsigned long long)fixed);
            free(seen);
        }
    }
}

/* The lanes that walk a run's values side by side give each value what
   one walk gives it, for every count (fewer than the lanes, a lane's
   worth, a ragged end), at sizes whose walks are long (n just above an
   even power of two: a domain near 4n) and short, and leave the values
   past cnt alone. */
static void test_perm_many_matches_one(void) {
    const uint64_t sizes[] = {1, 3, 5, 17, 4097, 1000003, (1u << 20) + 1};
    const uint32_t counts[] = {0, 1, 3, 4, 5, 7, 31, 32, 33, 500};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            uint64_t n = sizes[k], v[501], bad = 0;
            uint32_t cnt = counts[c];
            pf__perm p;
            pf__perm_init(&p, n, k + 11, c);
            for (uint32_t i = 0; i <= cnt; i++) v[i] = (i * UINT64_C(2654435761) + c) % n;
            pf__perm_apply_many(&p, v, cnt);
            for (uint32_t i = 0; i < cnt; i++) bad += v[i] != pf__perm_apply(&p, (i * UINT64_C(2654435761) + c) % n);
            CHECKF(bad == 0, "n=%llu, %u values: %llu differ from pf__perm_apply", (unsigned long long)n,
                   (unsigned)cnt, (unsigned long long)bad);
            CHECKF(v[cnt] == (cnt * UINT64_C(2654435761) + c) % n, "n=%llu, %u values: the value past them changed",
                   (unsigned long long)n, (unsigned)cnt);
        }
}

/* No GPU to use (built without CUDA; or, in the simulated-CUDA build, a
   machine without devices): PF_BACKEND_DEFAULT is the host backend, unless
   the config shows the loop expects device pointers: cfg.stream set fails
   with PF_ERR_NO_DEVICE and says why. */
#ifndef TEST_SIM
static int c_levels[PF_LOG_DEBUG + 1]; /* log lines by level (one thread: pf_create's) */
static void c_levels_log(void *user, int level, const char *msg) {
    (void)user, (void)msg;
    if (level >= PF_LOG_ERROR && level <= PF_LOG_DEBUG) c_levels[level]++;
}
#endif
static void test_default_backend_with_a_stream_and_no_gpu(void) {
    tload t;
    pf_config cfg;
    pf_loader *l = NULL;
    t_load_init(&t);
#ifdef TEST_SIM
    cudaSimReset(h_seed, 0, 0);
#endif
    cfg = t_config(&t, 40, 4, 1);
    cfg.backend = PF_BACKEND_DEFAULT;
    cfg.stream = (void *)&cfg; /* any non-NULL cudaStream_t: never used */
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_NO_DEVICE);
    CHECK(l == NULL);
#ifdef TEST_SIM
    CHECK_CONTAINS(pf_error(NULL), "finds no device");
#else
    CHECK_CONTAINS(pf_error(NULL), "compiled without CUDA");
#endif
    CHECK_CONTAINS(pf_error(NULL), "cfg.stream is set");
    cfg.stream = NULL;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    CHECK_EQ(pf_get_backend(l), PF_BACKEND_HOST);
    pf_destroy(l);
#ifndef TEST_SIM
    /* a CPU build: cfg.cuda_device (pf_shard_from_env's local rank) names
       nothing, so the fallback is said at INFO, as for local rank 0 (an
       outside trial: every other rank of a CPU torchrun job printed a
       warning on stderr) */
    cfg.cuda_device = 1;
    cfg.log = c_levels_log;
    memset(c_levels, 0, sizeof c_levels);
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    CHECK_EQ(pf_get_backend(l), PF_BACKEND_HOST);
    pf_destroy(l);
    CHECK_EQ(c_levels[PF_LOG_WARN], 0);
    CHECK(c_levels[PF_LOG_INFO] >= 1);
#endif
    t_load_free(&t);
}

static void test_perm_huge_spot_check(void) {
    const uint64_t n = 1000000000000ull; /* 10^12: no array could hold it */
    const size_t m = 100000;
    pf__perm p;
    uint64_t *out = (uint64_t *)malloc(m * sizeof(uint64_t));
    size_t bad = 0, dup = 0;
    CHECK(sizeof(pf__perm) <= 128); /* O(1) state */
    pf__perm_init(&p, n, 12345, 3);
    h_rng_state = 99;
    for (size_t i = 0; i < m; i++) {
        uint64_t x = h_rand() % n, y = pf__perm_apply(&p, x);
        out[i] = y;
        if (y >= n || pf__perm_invert(&p, y) != x) bad++;
    }
    qsort(out, m, sizeof(uint64_t), t_cmp_u64);
    for (size_t i = 1; i < m; i++) dup += out[i] == out[i - 1];
    CHECKF(bad == 0, "%zu out of range or not inverted", bad);
    CHECKF(dup < 5, "%zu collisions among %zu random inputs (expected ~0 from sampling)", dup, m);
    /* consecutive inputs scatter over the whole range */
    CHECK(out[0] < n / 100 && out[m - 1] > n - n / 100);
    free(out);
}

static void test_huge_dataset_loader_uses_little_memory(void) {
    tload t;
    tcons c;
    talloc a;
    trun r;
    pf_config cfg;
    t_open(&t, &c, &r);
    t_alloc_init(&a, 0);
    cfg = t_config(&t, 1000000000000ull, 8, 1);
    cfg.shuffle = true;
    cfg.allocator.alloc_fn = t_alloc;
    cfg.allocator.free_fn = t_free;
    cfg.allocator.user_data = &a;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_drain(&c, &r, 50), PF_OK);
    CHECK_EQ(r.n, 50);
    for (size_t i = 0; i < r.n; i++)
        for (uint32_t k = 0; k < r.v[i].count; k++) CHECK(r.v[i].idx[k] < 1000000000000ull);
    CHECKF(a.peak < (1u << 20), "peak bookkeeping %zu bytes", a.peak);
    t_end(&c);
    CHECK_EQ(a.live, 0);
    t_run_free(&r);
    t_load_free(&t);
}

/* ---- order and epochs ---- */

static void test_sequential_order_and_epoch_ends(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    size_t k = 0;
    t_open(&t, &c, &r);
    t.max_delay_us = 300; /* completion order differs from batch order */
    cfg = t_config(&t, 103, 10, 3);
    cfg.num_workers = 4;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_drain(&c, &r, 1000), PF_END_OF_DATA);
    CHECK_EQ(r.n, 33);
    CHECK_EQ(r.eoe, 3);
    for (uint64_t e = 0; e < 3; e++) {
        CHECK_EQ(r.eoe_at[e], (e + 1) * 11);
        for (uint64_t b = 0; b < 11; b++, k++) {
            CHECK_EQ(r.v[k].epoch, e);
            CHECK_EQ(r.v[k].batch, b);
            CHECK_EQ(r.v[k].count, b == 10 ? 3 : 10);
            for (uint32_t i = 0; i < r.v[k].count; i++) CHECK_EQ(r.v[k].idx[i], b * 10 + i);
        }
    }
    for (int i = 0; i < 3; i++) { /* END_OF_DATA for ever */
        pf_batch b;
        CHECK_EQ(t_next(&c, &b), PF_END_OF_DATA);
    }
    t_close(&t, &c, &r);
}

static void check_epoch_is_permutation(const trun *r, uint64_t epoch, uint64_t n, bool *identity) {
    unsigned char *seen = (unsigned char *)calloc(n, 1);
    uint64_t got = 0, pos = 0;
    *identity = true;
    for (size_t k = 0; k < r->n; k++) {
        if (r->v[k].epoch != epoch) continue;
        for (uint32_t i = 0; i < r->v[k].count; i++, pos++) {
            uint64_t x = r->v[k].idx[i];
            CHECKF(x < n && !seen[x], "epoch %llu: index %llu repeated or out of range", (unsigned long long)epoch,
                   (unsigned long long)x);
            if (x < n) seen[x] = 1;
            if (x != pos) *identity = false;
            got++;
        }
    }
    CHECK_EQ(got, n);
    free(seen);
}

static void test_shuffle_each_sample_once_per_epoch(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    bool id0, id1, id2;
    t_open(&t, &c, &r);
    cfg = t_config(&t, 1000, 64, 3);
    cfg.shuffle = true;
    cfg.seed = 7;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_drain(&c, &r, 100000), PF_END_OF_DATA);
    CHECK_EQ(r.n, 3 * 16);
    check_epoch_is_permutation(&r, 0, 1000, &id0);
    check_epoch_is_permutation(&r, 1, 1000, &id1);
    check_epoch_is_permutation(&r, 2, 1000, &id2);
    CHECK(!id0 && !id1 && !id2);
    CHECK(r.v[0].idx[0] != r.v[16].idx[0] || r.v[0].idx[1] != r.v[16].idx[1]); /* a new order each epoch */
    t_close(&t, &c, &r);
}

static void run_recorded(uint32_t workers, bool unordered, trun *r) {
    tload t;
    tcons c;
    pf_config cfg;
    t_load_init(&t);
    t.max_delay_us = 200;
    t_begin(&c, h_seed + workers);
    cfg = t_config(&t, 517, 16, 2);
    cfg.shuffle = true;
    cfg.seed = 99;
    cfg.num_workers = workers;
    cfg.unordered = unordered;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    t_run_init(r);
    CHECK_EQ(t_drain(&c, r, 100000), PF_END_OF_DATA);
    t_end(&c);
    t_load_free(&t);
}

static bool same_run(const trun *a, const trun *b) {
    if (a->n != b->n) return false;
    for (size_t k = 0; k < a->n; k++) {
        if (a->v[k].epoch != b->v[k].epoch || a->v[k].batch != b->v[k].batch || a->v[k].rng != b->v[k].rng ||
            a->v[k].count != b->v[k].count)
            return false;
        if (memcmp(a->v[k].idx, b->v[k].idx, a->v[k].count * sizeof(uint64_t)) != 0) return false;
    }
    return true;
}

static void test_same_order_and_rng_for_1_2_7_workers(void) {
    trun r1, r2, r7;
    run_recorded(1, false, &r1);
    run_recorded(2, false, &r2);
    run_recorded(7, false, &r7);
    CHECK_EQ(r1.n, 2 * 33);
    CHECK(same_run(&r1, &r2));
    CHECK(same_run(&r1, &r7));
    /* rng differs between batches */
    CHECK(r1.v[0].rng != r1.v[1].rng && r1.v[0].rng != r1.v[33].rng);
    /* and is what it always was, from (seed, epoch, rank, batch): a run
       saved by an older version resumes with the same draws */
    for (size_t k = 0; k < r1.n; k++)
        CHECK_EQ(r1.v[k].rng, pf__mix(pf__mix(pf__mix(pf__mix(99) ^ r1.v[k].epoch) ^ 0) ^ r1.v[k].batch));
    t_run_free(&r1);
    t_run_free(&r2);
    t_run_free(&r7);
}

static void test_unordered_delivers_each_batch_once_within_its_epoch(void) {
    trun r, ref;
    size_t k;
    int out_of_order = 0;
    run_recorded(4, true, &r);
    run_recorded(1, false, &ref);
    CHECK_EQ(r.n, ref.n);
    CHECK_EQ(r.eoe, 2);
    CHECK_EQ(r.eoe_at[0], 33);
    for (k = 0; k < r.n; k++) {
        const trec *x = &r.v[k];
        CHECK_EQ(x->epoch, k < 33 ? 0 : 1); /* never a batch of the next epoch early */
        out_of_order += x->batch != k % 33;
        /* same content as the ordered run's batch of that number */
        const trec *y = &ref.v[x->epoch * 33 + x->batch];
        CHECK(x->count == y->count && x->rng == y->rng && memcmp(x->idx, y->idx, x->count * 8) == 0);
    }
    for (uint64_t e = 0; e < 2; e++) { /* each batch exactly once */
        int seen[33] = {0};
        for (k = 0; k < r.n; k++)
            if (r.v[k].epoch == e) seen[r.v[k].batch]++;
        for (int b = 0; b < 33; b++) CHECK_EQ(seen[b], 1);
    }
    if (h_verbose) printf("    unordered: %d of %zu batches out of order\n", out_of_order, r.n);
    t_run_free(&r);
    t_run_free(&ref);
}

static void test_drop_last(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    t_open(&t, &c, &r);
    cfg = t_config(&t, 103, 10, 2);
    cfg.drop_last = true;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_drain(&c, &r, 1000), PF_END_OF_DATA);
    CHECK_EQ(r.n, 20);
    CHECK_EQ(r.eoe, 2);
    for (size_t k = 0; k < r.n; k++) CHECK_EQ(r.v[k].count, 10);
    t_close(&t, &c, &r);
}

/* ---- sharding ---- */

static void test_shards_cover_disjoint_equal_counts(void) {
    const uint64_t sizes[] = {1, 7, 100, 101, 257};
    const uint32_t bs = 4;
    for (uint32_t w = 1; w <= 8; w++)
        for (int drop = 0; drop <= 1; drop++)
            for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                uint64_t n = sizes[si];
                uint64_t per = drop ? n / w : (n + w - 1) / w;
                uint64_t nb = drop ? per / bs : (per + bs - 1) / bs;
                uint32_t *hits = (uint32_t *)calloc(n, sizeof(uint32_t));
                uint64_t total = 0;
                for (uint32_t rank = 0; rank < w; rank++) {
                    tload t;
                    tcons c;
                    trun r;
                    pf_config cfg;
                    t_load_init(&t);
                    t_begin(&c, h_seed + rank);
                    cfg = t_config(&t, n, bs, 1);
                    cfg.shuffle = true;
                    cfg.seed = 5;
                    cfg.rank = rank;
                    cfg.world_size = w;
                    cfg.drop_last = drop != 0;
                    cfg.num_workers = 2;
                    CHECK_EQ(t_create(&c, &cfg), PF_OK);
                    t_run_init(&r);
                    CHECK_EQ(t_drain(&c, &r, 100000), PF_END_OF_DATA);
                    CHECKF(r.n == nb, "w=%u drop=%d n=%llu rank %u: %zu batches, expected %llu", w, drop,
                           (unsigned long long)n, rank, r.n, (unsigned long long)nb);
                    for (size_t k = 0; k < r.n; k++)
                        for (uint32_t i = 0; i < r.v[k].count; i++) {
                            CHECK(r.v[k].idx[i] < n);
                            if (r.v[k].idx[i] < n) hits[r.v[k].idx[i]]++;
                            total++;
                        }
                    t_end(&c);
                    t_run_free(&r);
                    t_load_free(&t);
                }
                if (drop) {
                    uint64_t covered = 0;
                    for (uint64_t i = 0; i < n; i++) {
                        CHECKF(hits[i] <= 1, "w=%u n=%llu: sample %llu on two ranks", w, (unsigned long long)n,
                               (unsigned long long)i);
                        covered += hits[i];
                    }
                    CHECK_EQ(total, nb * bs * w);
                    CHECK(covered == total);
                } else {
                    uint64_t dups = 0;
                    for (uint64_t i = 0; i < n; i++) {
                        CHECKF(hits[i] >= 1, "w=%u n=%llu: sample %llu on no rank", w, (unsigned long long)n,
                               (unsigned long long)i);
                        dups += hits[i] > 1 ? hits[i] - 1 : 0;
                    }
                    CHECK_EQ(total, per * w); /* padded by wrapping to equal counts */
                    CHECK_EQ(dups, per * w - n);
                }
                free(hits);
            }
}

/* Without shuffle the padding is visible: rank r's j-th sample is position
   j*w + r of the epoch, wrapped, exactly as DistributedSampler pads. */
static void test_shard_padding_wraps_like_distributed_sampler(void) {
    const uint64_t n = 10;
    const uint32_t w = 4, bs = 2;
    for (uint32_t rank = 0; rank < w; rank++) {
        tload t;
        tcons c;
        trun r;
        pf_config cfg;
        uint64_t j = 0;
        t_open(&t, &c, &r);
            cfg = t_config(&t, n, bs, 1);
        cfg.rank = rank;
        cfg.world_size = w;
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
            CHECK_EQ(t_drain(&c, &r, 1000), PF_END_OF_DATA);
        CHECK_EQ(r.n, 2); /* ceil(10/4) = 3 samples per rank: batches of 2 and 1 */
        for (size_t k = 0; k < r.n; k++)
            for (uint32_t i = 0; i < r.v[k].count; i++, j++) CHECK_EQ(r.v[k].idx[i], (j * w + rank) % n);
        CHECK_EQ(j, 3);
        t_end(&c);
        t_run_free(&r);
        t_load_free(&t);
    }
}

/* ---- growing datasets ---- */

static void test_growing_dataset_asks_once_per_epoch(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    const uint64_t sizes[5] = {10, 25, 0, 7, 40};
    uint64_t expect_batches = 0;
    t_open(&t, &c, &r);
    for (int e = 0; e < 5; e++) {
        t.sizes[e] = sizes[e];
        expect_batches += (sizes[e] + 3) / 4;
    }
    cfg = t_config(&t, 0, 4, 5);
    cfg.num_samples_fn = t_num_samples;
    cfg.shuffle = true;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_drain(&c, &r, 100000), PF_END_OF_DATA);
    CHECK_EQ(r.n, expect_batches);
    CHECK_EQ(r.eoe, 5);
    CHECK_EQ(r.eoe_at[1], r.eoe_at[2]); /* the empty epoch still ends once */
    for (int e = 0; e < 5; e++) {
        bool id;
        CHECK_EQ(t.size_calls[e], 1);
        if (sizes[e]) check_epoch_is_permutation(&r, (uint64_t)e, sizes[e], &id);
    }
    CHECK_EQ(t.size_calls[5], 0); /* never asked past the last epoch */
    t_close(&t, &c, &r);
}

/* An empty epoch at the end (or in the middle) ends once, whoever plans
   it: pf_next, loading beside the workers, may be the one that plans it
   and so wakes itself (an outside trial: 2 workers, 2 slots, an empty
   last epoch, and pf_next slept for ever after the first epoch's end) */
static void test_empty_epoch_planned_by_pf_next_ends(void) {
    static const uint64_t shapes[2][3] = {{50, 0, 0}, {50, 0, 30}};
    for (int shape = 0; shape < 2; shape++)
        for (uint32_t workers = 1; workers <= 3; workers++)
            for (uint32_t slots = 2; slots <= 4; slots++)
                for (int rep = 0; rep < 8; rep++) {
                    tload t;
                    tcons c;
                    trun r;
                    pf_config cfg;
                    uint32_t epochs = shape ? 3 : 2;
                    t_open(&t, &c, &r);
                    for (uint32_t e = 0; e < epochs; e++) t.sizes[e] = shapes[shape][e];
                    cfg = t_config(&t, 0, 4, epochs);
                    cfg.num_samples_fn = t_num_samples;
                    cfg.num_workers = workers;
                    cfg.host_slots = slots;
                    cfg.timeout_ms = 0; /* pf_next loads only without one; the harness's watchdog bounds a hang */
                    CHECK_EQ(t_create(&c, &cfg), PF_OK);
                    CHECK_EQ(t_drain(&c, &r, 1000), PF_END_OF_DATA);
                    CHECK_EQ(r.n, shape ? 13u + 8u : 13u);
                    CHECK_EQ(r.eoe, epochs);
                    t_close(&t, &c, &r);
                }
}

static void test_until_destroyed_when_epochs_is_zero(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    t_open(&t, &c, &r);
    cfg = t_config(&t, 20, 5, 0);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_drain(&c, &r, 42), PF_OK); /* 10 epochs and a bit, no end */
    CHECK_EQ(r.eoe, 10);
    CHECK_EQ(r.v[41].epoch, 10);
    t_close(&t, &c, &r);
}

/* ---- errors ---- */

typedef void (*cfg_mut)(pf_config *);
static void m_load(pf_config *c) { c->load = NULL; }
static void m_samples(pf_config *c) { c->num_samples = 0; }
static void m_samples_big(pf_config *c) { c->num_samples = (1ull << 62) + 1; }
static uint64_t m_fn(void *u, uint64_t e) { (void)u; return e + 1; }
static void m_both(pf_config *c) { c->num_samples_fn = m_fn; }
static void m_bs0(pf_config *c) { c->batch_size = 0; }
static void m_bs_big(pf_config *c) { c->batch_size = (1u << 24) + 1; }
static void m_bytes(pf_config *c) { c->batch_bytes = 0; }
static void m_bytes_huge(pf_config *c) { c->batch_bytes = SIZE_MAX / 2; }
static void m_workers(pf_config *c) { c->num_workers = 5000; }
static void m_hslots(pf_config *c) { c->host_slots = 5000; }
static void m_dslots(pf_config *c) { c->device_slots = 5000; }
static void m_world(pf_config *c) { c->world_size = 70000; }
static void m_rank(pf_config *c) { c->rank = 2; c->world_size = 2; }
static void m_rank_default_world(pf_config *c) { c->rank = 1; }
static void m_backend(pf_config *c) { c->backend = (pf_backend)7; }
static void m_device(pf_config *c) { c->cuda_device = -1; }
static void m_alloc(pf_config *c) { c->allocator.alloc_fn = t_alloc; }
static void m_free(pf_config *c) { c->allocator.free_fn = t_free; }

static void test_each_bad_field_is_named(void) {
    static const struct {
        cfg_mut mut;
        const char *field;
    } cases[] = {
        {m_load, "cfg.load"},           {m_samples, "cfg.num_samples is 0"}, {m_samples_big, "cfg.num_samples is"},
        {m_both, "num_samples_fn"},     {m_bs0, "cfg.batch_size is 0"},     {m_bs_big, "cfg.batch_size is 16777217"},
        {m_bytes, "cfg.batch_bytes is 0"}, {m_bytes_huge, "cfg.batch_bytes"}, {m_workers, "cfg.num_workers is 5000"},
        {m_hslots, "cfg.host_slots is 5000"}, {m_dslots, "cfg.device_slots is 5000"},
        {m_world, "cfg.world_size is 70000"}, {m_rank, "cfg.rank is 2"},   {m_rank_default_world, "cfg.rank is 1"},
        {m_backend, "cfg.backend is 7"}, {m_device, "cfg.cuda_device is -1"}, {m_alloc, "cfg.allocator"},
        {m_free, "cfg.allocator"},
    };
    tload t;
    pf_loader *l = (pf_loader *)&t; /* must be overwritten with NULL */
    t_load_init(&t);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pf_config cfg = t_config(&t, 100, 10, 1);
        cases[i].mut(&cfg);
        l = (pf_loader *)&t;
        CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG);
        CHECK(l == NULL);
        CHECK_CONTAINS(pf_error(NULL), cases[i].field);
    }
    {
        pf_config cfg = t_config(&t, 100, 10, 1);
        CHECK_EQ(pf_create(NULL, &l), PF_ERR_INVALID_ARG);
        CHECK_CONTAINS(pf_error(NULL), "cfg is NULL");
        CHECK_EQ(pf_create(&cfg, NULL), PF_ERR_INVALID_ARG);
        CHECK_CONTAINS(pf_error(NULL), "out is NULL");
    }
    CHECK_EQ(pf_next(NULL, NULL), PF_ERR_INVALID_ARG);
    CHECK_EQ(pf_release(NULL, NULL), PF_ERR_INVALID_ARG);
    pf_destroy(NULL);
    CHECK(strcmp(pf_result_string(PF_ERR_LOAD), "the load callback failed") == 0);
    CHECK(strcmp(pf_result_string((pf_result)-99), "unknown pf_result") == 0);
    CHECK(PF_OK == 0 && PF_END_OF_EPOCH > 0 && PF_TIMEOUT > 0 && PF_ERR_INVALID_ARG < 0 && PF_ERR_LOAD < 0);
    t_load_free(&t);
}

static void *create_fail_thread(void *arg) {
    pf_loader *l;
    pf_config cfg;
    memset(&cfg, 0, sizeof cfg);
    (void)pf_create(&cfg, &l);
    snprintf((char *)arg, 512, "%s", pf_error(NULL));
    return NULL;
}

static void test_create_error_is_per_thread(void) {
    char other[512];
    pthread_t th;
    tload t;
    pf_loader *l;
    pf_config cfg;
    t_load_init(&t);
    cfg = t_config(&t, 100, 0, 1);
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG);
    pthread_create(&th, NULL, create_fail_thread, other);
    pthread_join(th, NULL);
    CHECK_CONTAINS(other, "cfg.load");
    CHECK_CONTAINS(pf_error(NULL), "cfg.batch_size"); /* ours, untouched by the other thread */
    t_load_free(&t);
}

/* How the failing load fails: pf_job_fail with a message, a bare non-zero
   return, pf_job_fail with an empty message, or pf_job_fail and then a
   return of 0 (an outside trial's: its batch was delivered as loaded). */
enum { FAIL_NAMED, FAIL_SILENT, FAIL_EMPTY, FAIL_SAID_OK };

static void check_load_failure(int how, bool unordered) {
    static const char *const says[] = {"synthetic failure reading shard 42", "returned non-zero",
                                       "pf_job_fail with an empty message", "synthetic failure reading shard 42"};
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    pf_batch b;
    t_open(&t, &c, &r);
    t.fail_epoch = 1;
    t.fail_batch = 5;
    t.fail_silent = how == FAIL_SILENT;
    t.fail_empty = how == FAIL_EMPTY;
    t.fail_said_ok = how == FAIL_SAID_OK;
    t.max_delay_us = 500; /* later batches finish before the failing one */
    cfg = t_config(&t, 80, 8, 3);
    cfg.num_workers = 4;
    cfg.unordered = unordered;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_drain(&c, &r, 100000), PF_ERR_LOAD);
    if (!unordered) {
        CHECK_EQ(r.n, 15); /* epoch 0 (10 batches) and batches 0..4 of epoch 1 */
        CHECK_EQ(r.eoe, 1);
        for (size_t k = 0; k < r.n; k++) CHECK_EQ(r.v[k].batch, k < 10 ? k : k - 10);
    } else {
        CHECK(r.n >= 10 && r.n < 20);
        for (size_t k = 0; k < r.n; k++) CHECK(!(r.v[k].epoch == 1 && r.v[k].batch == 5));
    }
    CHECK_CONTAINS(r.msg, "epoch 1 batch 5");
    CHECK_CONTAINS(r.msg, "(worker ");
    CHECK_CONTAINS(r.msg, says[how]);
    if (how != FAIL_SILENT) CHECKF(!strstr(r.msg, "without pf_job_fail"), "%s", r.msg);
    CHECKF(!strstr(r.msg, "a later consequence"), "%s", r.msg);
    CHECK_EQ(t_next(&c, &b), PF_ERR_LOAD); /* sticky */
    CHECK_CONTAINS(pf_error(c.l), "epoch 1 batch 5");
    t_close(&t, &c, &r);
}

static void test_load_failure_after_earlier_batches_sticky(void) {
    check_load_failure(FAIL_NAMED, false);
    check_load_failure(FAIL_SILENT, false);
    check_load_failure(FAIL_NAMED, true);
    check_load_failure(FAIL_SAID_OK, false);
    check_load_failure(FAIL_SAID_OK, true);
}

/* pf_job_fail with an empty message is still pf_job_fail: not reported as
   a callback that returned non-zero without it. */
static void test_empty_failure_message_is_not_misreported(void) { check_load_failure(FAIL_EMPTY, false); }

/* An allocator that refuses huge blocks without asking malloc (ASan would
   abort on the request itself). */
static void *refuse_huge(size_t size, void *user) {
    (void)user;
    return size > ((size_t)1 << 30) ? NULL : malloc(size);
}
static void free_plain(void *p, void *user) {
    (void)user;
    free(p);
}

/* The size check counts the slots the backend allocates: on the host
   backend host_slots only, not the unused default device_slots (3). One
   slot of SIZE_MAX/2 bytes fits the arithmetic (and then does not fit in
   memory: NO_MEMORY, naming the bytes); three would not. */
static void test_size_check_counts_the_backends_slots(void) {
    tload t;
    pf_config cfg;
    pf_loader *l = NULL;
    t_load_init(&t);
    cfg = t_config(&t, 40, 4, 1);
    cfg.host_slots = 1;
    cfg.batch_bytes = SIZE_MAX / 2;
    cfg.allocator.alloc_fn = refuse_huge;
    cfg.allocator.free_fn = free_plain;
#ifdef TEST_SIM
    cudaSimReset(h_seed, 0, 1);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG); /* CUDA: three device slots do not fit */
    CHECK_CONTAINS(pf_error(NULL), "device_slots (3) slots of it do not fit");
#else
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_NO_MEMORY);
    CHECK_CONTAINS(pf_error(NULL), "host_slots 1");
    CHECKF(!strstr(pf_error(NULL), "3 slots"), "%s", pf_error(NULL));
#endif
    CHECK(l == NULL);
    cfg.host_slots = 3; /* three host slots really do not fit */
    cfg.device_slots = 1;
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG);
    CHECK_CONTAINS(pf_error(NULL), "host_slots (3) slots of it do not fit");
    t_load_free(&t);
}

/* Bookkeeping sizes are checked as count x size before they are multiplied
   (a 32-bit size_t would wrap the product first). */
static void test_bookkeeping_product_overflow_is_caught(void) {
    pf__layout lay = {0, false};
    (void)pf__reserve(&lay, SIZE_MAX / 8 + 1, 16);
    CHECK(lay.overflow);
    lay.size = 0;
    lay.overflow = false;
    (void)pf__reserve(&lay, 1000, 16);
    CHECK(!lay.overflow);
}

/* After a failure nothing new is loaded: the one worker publishes the
   failure and would claim its next job under the same lock. */
static void test_load_failure_stops_loading(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    t_open(&t, &c, &r);
    t.fail_epoch = 0;
    t.fail_batch = 0;
    cfg = t_config(&t, 100, 5, 1);
    cfg.num_workers = 1;
    cfg.host_slots = 4;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_drain(&c, &r, 1000), PF_ERR_LOAD);
    t_end(&c); /* joins the worker */
    CHECK_EQ(t.loads, 1);
    t_run_free(&r);
    t_load_free(&t);
}

static void test_oversize_bytes_is_a_load_error(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    char expect[128];
    t_open(&t, &c, &r);
    t.big_epoch = 0;
    t.big_batch = 2;
    cfg = t_config(&t, 50, 5, 1);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_drain(&c, &r, 1000), PF_ERR_LOAD);
    CHECK_EQ(r.n, 2);
    snprintf(expect, sizeof expect, "job->bytes = %zu, more than the slot capacity of %zu", t_batch_bytes(5) + 1,
             t_batch_bytes(5));
    CHECK_CONTAINS(r.msg, expect);
    CHECK_CONTAINS(r.msg, "epoch 0 batch 2");
    t_close(&t, &c, &r);
}

static void test_timeout_names_late_batch_and_worker(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    pf_batch b;
    t_open(&t, &c, &r);
    t.gate_epoch = 0;
    t.gate_batch = 1;
    cfg = t_config(&t, 30, 5, 1);
    cfg.num_workers = 1;
    cfg.timeout_ms = 50;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_next(&c, &b), PF_OK);
    CHECK_EQ(b.batch, 0);
    t_release(&c, &b);
    CHECK(t_gate_wait_entered(&t, 1));
    CHECK_EQ(pf_next(c.l, &b), PF_TIMEOUT);
    CHECK_CONTAINS(pf_error(c.l), "timed out after 50 ms");
    CHECK_CONTAINS(pf_error(c.l), "epoch 0 batch 1 is late: worker 0 has been inside load");
    CHECK_EQ(pf_next(c.l, &b), PF_TIMEOUT); /* still waiting, still fine */
    t_gate_open(&t);
    /* the loader works on: the late batch and the rest arrive */
    pf__lock(&c.l->sync.mu); /* workers read it (pf__may_load) */
    c.l->cfg.timeout_ms = T_WAIT_MS;
    pf__unlock(&c.l->sync.mu);
    CHECK_EQ(t_drain(&c, &r, 1000), PF_END_OF_DATA);
    CHECK_EQ(r.n, 5);
    CHECK_EQ(r.v[0].batch, 1);
    t_close(&t, &c, &r);
}

static void test_timeout_when_no_worker_started(void) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_batch b;
    t_load_init(&t);
    t.gate_on_start = 1; /* workers stuck in on_worker_start */
    t_begin(&c, h_seed);
    cfg = t_config(&t, 30, 5, 1);
    cfg.num_workers = 2;
    cfg.timeout_ms = 30;
    cfg.on_worker_start = t_worker_start;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(pf_next(c.l, &b), PF_TIMEOUT);
    CHECK_CONTAINS(pf_error(c.l), "epoch 0 batch 0 is late: no worker has started it");
    t_gate_open(&t);
    pf__lock(&c.l->sync.mu); /* workers read it (pf__may_load) */
    c.l->cfg.timeout_ms = T_WAIT_MS;
    pf__unlock(&c.l->sync.mu);
    CHECK_EQ(t_next(&c, &b), PF_OK);
    CHECK_EQ(b.batch, 0);
    t_release(&c, &b);
    t_end(&c);
    CHECK_EQ(t.worker_starts[0], 1);
    CHECK_EQ(t.worker_starts[1], 1);
    t_load_free(&t);
}

static void test_holding_every_slot_is_invalid_state(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    pf_batch held[8];
    uint32_t slots;
    t_open(&t, &c, &r);
    cfg = t_config(&t, 100, 4, 1);
    cfg.host_slots = 3;
    cfg.device_slots = 2;
    slots = t_consumer_slots(&cfg);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    for (uint32_t i = 0; i < slots; i++) CHECK_EQ(t_next(&c, &held[i]), PF_OK);
    {
        pf_batch b;
        CHECK_EQ(pf_next(c.l, &b), PF_ERR_INVALID_STATE);
        CHECK_CONTAINS(pf_error(c.l), "holds all");
    }
    t_release(&c, &held[0]);
    CHECK_EQ(t_next(&c, &held[0]), PF_OK);
    CHECK_EQ(held[0].batch, slots);
    for (uint32_t i = 0; i < slots; i++) t_release(&c, &held[i]);
    {
        /* holding every slot at an epoch's end: the end needs no slot */
        tcons c2;
        pf_batch h2[8];
        pf_config small = t_config(&t, 8, 4, 1); /* two batches, both held */
        small.host_slots = 2;
        small.device_slots = 2;
        t_cons_init(&c2); /* its own counters: c's kernels may still be counting into c */
#ifdef TEST_SIM
        c2.stream = c.stream;
#endif
        CHECK_EQ(t_create(&c2, &small), PF_OK);
        CHECK_EQ(t_next(&c2, &h2[0]), PF_OK);
        CHECK_EQ(t_next(&c2, &h2[1]), PF_OK);
        CHECK_EQ(pf_next(c2.l, &h2[2]), PF_END_OF_EPOCH);
        CHECK_EQ(pf_next(c2.l, &h2[2]), PF_END_OF_DATA);
        t_release(&c2, &h2[0]);
        t_release(&c2, &h2[1]);
        pf_destroy(c2.l);
#ifdef TEST_SIM
        CHECK(cudaStreamSynchronize(c2.stream) == cudaSuccess); /* c2's checks have run */
#endif
        CHECKF(c2.bad == 0, "%s", c2.bad_msg);
        pthread_mutex_destroy(&c2.mu);
    }
    CHECK_EQ(t_drain(&c, &r, 1000), PF_END_OF_DATA);
    CHECK_EQ(r.n, 25 - slots - 1);
    t_close(&t, &c, &r);
}

static void test_double_and_foreign_release_are_errors(void) {
    tload t;
    tcons c, c2;
    pf_config cfg;
    pf_batch b, copy, zero, other;
    t_load_init(&t);
    t_begin(&c, h_seed);
    cfg = t_config(&t, 100, 4, 1);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    c2 = c;
    cfg = t_config(&t, 100, 4, 1);
    CHECK_EQ(t_create(&c2, &cfg), PF_OK);
    CHECK_EQ(t_next(&c, &b), PF_OK);
    copy = b;
    t_release(&c, &b);
    CHECK_EQ(pf_release(c.l, &b), PF_ERR_INVALID_STATE);
    CHECK_CONTAINS(pf_error(c.l), "already released");
    CHECK_EQ(pf_release(c.l, &copy), PF_ERR_INVALID_STATE); /* a stale copy of the struct */
    CHECK_CONTAINS(pf_error(c.l), "epoch 0 batch 0 was already released");
    memset(&zero, 0, sizeof zero);
    CHECK_EQ(pf_release(c.l, &zero), PF_ERR_INVALID_ARG);
    CHECK_CONTAINS(pf_error(c.l), "not from this loader");
    CHECK_EQ(t_next(&c2, &other), PF_OK);
    CHECK_EQ(pf_release(c.l, &other), PF_ERR_INVALID_ARG); /* foreign */
    CHECK_EQ(pf_batch_wait(c2.l, &other), PF_OK);
    t_release(&c2, &other);
    CHECK_EQ(pf_batch_wait(c2.l, &other), PF_ERR_INVALID_STATE);
    CHECK_EQ(pf_next(c.l, NULL), PF_ERR_INVALID_ARG);
    CHECK_EQ(pf_release(c.l, NULL), PF_ERR_INVALID_ARG);
    CHECK_EQ(t_next(&c, &b), PF_OK); /* the loader is unharmed */
    CHECK_EQ(b.batch, 1);
    {
        /* a damaged ticket (another held batch's) on a batch still held:
           named as damage, not "already released" (an outside trial), and
           the batch stays releasable */
        pf_batch b2, bad;
        CHECK_EQ(t_next(&c, &b2), PF_OK);
        bad = b;
        bad.pf__ticket = b2.pf__ticket > b.pf__ticket ? b2.pf__ticket : b.pf__ticket + 1;
        CHECK_EQ(pf_release(c.l, &bad), PF_ERR_INVALID_ARG);
        CHECK_CONTAINS(pf_error(c.l), "the batch is corrupt (its ticket is newer than its slot's");
        CHECK_CONTAINS(pf_error(c.l), "epoch 0 batch 1 is still held");
        t_release(&c, &b2);
    }
    t_release(&c, &b);
    pf_destroy(c2.l);
    t_end(&c);
    t_load_free(&t);
}

/* A pf_batch kept past pf_destroy, released on a new loader that malloc
   put at the same address (simulated: its owner field set to the new
   loader): refused, and the new loader's own held batch stays its
   holder's (an outside trial: the old code took it for that batch, freed
   the slot and refilled it under its holder). Both loaders' first batch
   is batch 0 in the same slot with the same ticket there. */
static void test_a_destroyed_loaders_batch_is_refused(void) {
    tload t;
    tcons c, c2;
    pf_config cfg;
    pf_batch old, cur, next;
    t_load_init(&t);
    t_begin(&c, h_seed);
    cfg = t_config(&t, 100, 4, 1);
    cfg.num_workers = 1;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(pf_next(c.l, &old), PF_OK); /* held through the destroy */
    pf_destroy(c.l);
    c2 = c;
    cfg = t_config(&t, 100, 4, 1);
    cfg.num_workers = 1;
    CHECK_EQ(t_create(&c2, &cfg), PF_OK);
    CHECK_EQ(pf_next(c2.l, &cur), PF_OK);
    CHECK_EQ(cur.batch, old.batch);
    old.pf__owner = c2.l; /* as if at the same address */
    CHECK_EQ(pf_release(c2.l, &old), PF_ERR_INVALID_ARG);
    CHECK_CONTAINS(pf_error(c2.l), "not from this loader's pf_next (a pf_batch kept from a destroyed loader");
    CHECK_EQ(pf_batch_wait(c2.l, &old), PF_ERR_INVALID_ARG);
    CHECK_EQ(pf_batch_wait(c2.l, &cur), PF_OK); /* still held, still its holder's */
    CHECK_EQ(pf_next(c2.l, &next), PF_OK);
    CHECK_EQ(next.batch, 1);
    CHECK_EQ(pf_release(c2.l, &cur), PF_OK);
    CHECK_EQ(pf_release(c2.l, &next), PF_OK);
    c.l = c2.l;
    t_end(&c);
    t_load_free(&t);
}

/* ---- destroy at any moment ---- */

static void test_destroy_at_random_points(void) {
    const int runs = 120;
    h_rng_state = h_seed * 1000 + 17;
    for (int run = 0; run < runs; run++) {
        tload t;
        tcons c;
        talloc a;
        pf_config cfg;
        pf_batch held[8];
        uint32_t nheld = 0, limit;
        int steps = (int)(h_rand() % 40);
        t_load_init(&t);
        t_alloc_init(&a, 0);
        t.max_delay_us = (unsigned)(h_rand() % 300);
        if (h_rand() % 4 == 0) {
            t.fail_epoch = (long long)(h_rand() % 2);
            t.fail_batch = (long long)(h_rand() % 6);
        }
        if (h_rand() % 4 == 0) { /* a worker is stuck inside load at destroy */
            t.gate_epoch = 0;
            t.gate_batch = (long long)(h_rand() % 3);
        }
        t_begin(&c, h_seed + (unsigned long long)run);
        cfg = t_config(&t, 1 + h_rand() % 60, 1 + (uint32_t)(h_rand() % 6), (uint32_t)(h_rand() % 4));
        cfg.num_workers = 1 + (uint32_t)(h_rand() % 6);
        cfg.host_slots = 1 + (uint32_t)(h_rand() % 8);
        cfg.device_slots = 1 + (uint32_t)(h_rand() % 4);
        cfg.shuffle = h_rand() % 2;
        cfg.unordered = h_rand() % 3 == 0;
        cfg.timeout_ms = 20; /* a gated batch must not stall the test */
        cfg.allocator.alloc_fn = t_alloc;
        cfg.allocator.free_fn = t_free;
        cfg.allocator.user_data = &a;
        limit = t_consumer_slots(&cfg);
        CHECK_EQ(t_create(&c, &cfg), PF_OK);
        for (int s = 0; s < steps; s++) {
            pf_batch b;
            pf_result r;
            if (nheld && (nheld == limit || h_rand() % 2)) {
                uint32_t k = (uint32_t)(h_rand() % nheld);
                t_release(&c, &held[k]);
                held[k] = held[--nheld];
                continue;
            }
            r = t_next(&c, &b);
            if (r == PF_OK) held[nheld++] = b;
            else if (r != PF_END_OF_EPOCH) break; /* an error, the end, or a gated batch: destroy now */
        }
        t_end(&c); /* with nheld batches still held */
        CHECKF(a.live == 0, "run %d: %ld allocations leaked", run, a.live);
        t_load_free(&t);
    }
}

/* ---- stats ---- */

static void test_stats_count_and_verdict(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    pf_stats s;
    t_open(&t, &c, &r);
    cfg = t_config(&t, 100, 8, 2);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_drain(&c, &r, 1000), PF_END_OF_DATA);
    pf_get_stats(c.l, &s);
    CHECK_EQ(s.batches, 26);
    CHECK_EQ(s.samples, 200);
    CHECK_EQ(s.bytes, 2 * (12 * t_batch_bytes(8) + t_batch_bytes(4)));
    CHECK_EQ(s.num_workers, 3);
    CHECK_EQ(s.host_slots, pf_config_defaults(&cfg).host_slots); /* small batches: the ring by bytes */
    CHECK_EQ(s.epoch, 2);
    CHECK(s.load_s > 0);
    CHECK(s.elapsed_s > 0);
    /* one consumer: its waits lie inside the span from the first pf_next
       to the latest */
    CHECKF(s.wait_s <= s.elapsed_s, "waited %.6f s of %.6f s", s.wait_s, s.elapsed_s);
    CHECK(s.verdict != NULL && s.bound != PF_BOUND_UNKNOWN);
#ifdef TEST_SIM
    CHECK_EQ(s.backend, PF_BACKEND_CUDA);
    CHECK_EQ(s.copies, 26);
    CHECK_EQ(s.copy_bytes, s.bytes);
    CHECK_EQ(s.device_slots, 3);
#else
    CHECK_EQ(s.backend, PF_BACKEND_HOST);
    CHECK_EQ(s.copies, 0);
    CHECK(s.wait_copy_s == 0 && s.wait_gpu_s == 0); /* nothing to copy, no GPU to wait for */
    CHECK_EQ(s.free_slots, s.host_slots);           /* every slot back after the last release */
#endif
    t_close(&t, &c, &r);
}

/* The CPUs to spin on are the ones this process may use: the affinity
   mask's list as /proc/self/status writes it, and under a mask of one CPU
   (taskset -c N) one, whatever the machine has (where the test can set a
   mask: sched_setaffinity needs _GNU_SOURCE, as in the C++ build). */
static void test_cpu_count_follows_the_affinity_mask(void) {
    CHECK_EQ(pf__cpus_in_list("0-3,8,10-11\n"), 7);
    CHECK_EQ(pf__cpus_in_list("\t5\n"), 1);
    CHECK_EQ(pf__cpus_in_list("0-63"), 64);
    CHECK_EQ(pf__cpus_in_list("3-1"), 0);
    CHECK_EQ(pf__cpus_in_list("x"), 0);
    CHECK(pf__cpu_count() >= 1);
#if defined(__linux__) && defined(CPU_COUNT)
    {
        cpu_set_t was, one;
        int first = -1;
        CHECK_EQ(sched_getaffinity(0, sizeof was, &was), 0);
        for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
            if (CPU_ISSET(c, &was)) first = c;
        CPU_ZERO(&one);
        CPU_SET(first, &one);
        CHECK_EQ(sched_setaffinity(0, sizeof one, &one), 0);
        CHECK_EQ(pf__cpu_count(), 1);
        CHECK_EQ(sched_setaffinity(0, sizeof was, &was), 0);
    }
#endif
}

static void test_verdict_from_numbers(void) {
    pf_stats s;
    memset(&s, 0, sizeof s);
    pf__verdict(&s, false);
    CHECK_EQ(s.bound, PF_BOUND_UNKNOWN);
    s.batches = 100;
    s.elapsed_s = 10;
    s.wait_s = s.wait_input_s = 0.2;
    pf__verdict(&s, false);
    CHECK_EQ(s.bound, PF_BOUND_COMPUTE);
    CHECK_CONTAINS(s.verdict, "compute-bound");
    s.wait_s = s.wait_input_s = 3;
    pf__verdict(&s, false);
    CHECK_EQ(s.bound, PF_BOUND_INPUT);
    CHECK_CONTAINS(s.verdict, "add workers");
    s.next_loads = 20; /* pf_next loaded a fifth of them itself, and loads now: more workers are not the answer */
    pf__verdict(&s, true);
    CHECK_EQ(s.bound, PF_BOUND_INPUT);
    CHECK_CONTAINS(s.verdict, "more workers do not help");
    pf__verdict(&s, false); /* it did, earlier: autotune has gone back to the workers (the loads got dearer) */
    CHECK_EQ(s.bound, PF_BOUND_INPUT);
    CHECK_CONTAINS(s.verdict, "add workers");
    s.next_loads = 0;
    s.wait_copy_s = 4;
    s.wait_s = 7;
    pf__verdict(&s, false);
    CHECK_EQ(s.bound, PF_BOUND_COPY);
}

static void test_config_defaults_are_visible(void) {
    pf_config in, d;
    memset(&in, 0, sizeof in);
    d = pf_config_defaults(&in);
    CHECK_EQ(d.num_workers, 4);
    CHECK_EQ(d.host_slots, 9);
    CHECK_EQ(d.device_slots, 3);
    CHECK_EQ(d.world_size, 1);
    CHECK_EQ(d.progress_every, 100);
    CHECK_EQ(d.shuffle_block, 1); /* every zero field gets its default, these too */
    CHECK_EQ(d.shuffle_window, 8);
    CHECK(d.allocator.alloc_fn != NULL && d.allocator.free_fn != NULL);
    in.num_workers = 2;
    CHECK_EQ(pf_config_defaults(&in).host_slots, 5);
    /* small batches: more slots, up to 64 within 2 MiB; big ones 2W+1 */
    in.batch_bytes = 4096;
    CHECK_EQ(pf_config_defaults(&in).host_slots, 64);
    in.batch_bytes = 256 << 10;
    CHECK_EQ(pf_config_defaults(&in).host_slots, 8);
    in.batch_bytes = 1 << 20;
    CHECK_EQ(pf_config_defaults(&in).host_slots, 5);
    in.num_workers = 8;
    in.batch_bytes = 256 << 10;
    CHECK_EQ(pf_config_defaults(&in).host_slots, 17);
    /* a slot's bookkeeping, 3 words a sample, counts with its bytes: 2^20
       samples of 1 byte were 64 slots, 1.5 GiB of it (an outside trial) */
    in.num_workers = 4;
    in.batch_size = 1u << 20;
    in.batch_bytes = 1;
    CHECK_EQ(pf_config_defaults(&in).host_slots, 9);
    in.batch_size = 8192; /* 196616 bytes of bookkeeping a slot: 10 in 2 MiB */
    CHECK_EQ(pf_config_defaults(&in).host_slots, 10);
    in.batch_size = 1024; /* 24584: 85 fit, 64 at most */
    CHECK_EQ(pf_config_defaults(&in).host_slots, 64);
}

static void test_allocation_failures_are_clean(void) {
    tload t;
    t_load_init(&t);
    for (long n = 1; n <= 3; n++) {
        talloc a;
        pf_config cfg = t_config(&t, 100, 10, 1);
        pf_loader *l = (pf_loader *)&t;
        pf_result r;
        t_alloc_init(&a, n);
        cfg.allocator.alloc_fn = t_alloc;
        cfg.allocator.free_fn = t_free;
        cfg.allocator.user_data = &a;
#ifdef TEST_SIM
        cudaSimReset(h_seed, 0, 1);
        CHECK(cudaSetDevice(0) == cudaSuccess);
#endif
        r = pf_create(&cfg, &l);
        if (a.total < n) { /* fewer allocations than n: it must have worked */
            CHECK_EQ(r, PF_OK);
            pf_destroy(l);
        } else {
            CHECK_EQ(r, PF_ERR_NO_MEMORY);
            CHECK(l == NULL);
            CHECK_CONTAINS(pf_error(NULL), "out of memory");
            CHECK_CONTAINS(pf_error(NULL), "bytes");
        }
        CHECK_EQ(a.live, 0);
#ifdef TEST_SIM
        CHECK_EQ(cudaSimBytesLive(), 0);
        CHECK_EQ(cudaSimObjectsLive(), 0);
#endif
    }
    t_load_free(&t);
}

static void test_worker_start_hook_runs_once_per_worker(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    t_open(&t, &c, &r);
    cfg = t_config(&t, 40, 4, 1);
    cfg.num_workers = 5;
    cfg.on_worker_start = t_worker_start;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_drain(&c, &r, 1000), PF_END_OF_DATA);
    t_end(&c);
    for (int w = 0; w < 5; w++) CHECK_EQ(t.worker_starts[w], 1);
    CHECK_EQ(t.worker_starts[5], 0);
    t_run_free(&r);
    t_load_free(&t);
}

static int log_count, log_failure_seen;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static void t_log(void *user, int level, const char *msg) { /* any library thread may call it */
    (void)user;
    (void)level;
    pthread_mutex_lock(&log_mu);
    log_count++;
    if (strstr(msg, "load failed for epoch 0 batch 0 (worker 0): synthetic failure")) log_failure_seen++;
    pthread_mutex_unlock(&log_mu);
}

static void test_load_failure_is_logged(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    t_open(&t, &c, &r);
    t.fail_epoch = 0;
    t.fail_batch = 0;
    cfg = t_config(&t, 40, 4, 1);
    cfg.num_workers = 1;
    cfg.log = t_log;
    log_count = log_failure_seen = 0;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(t_drain(&c, &r, 1000), PF_ERR_LOAD);
    t_end(&c);
    pthread_mutex_lock(&log_mu);
    CHECK(log_count >= 2); /* created, and the failure */
    CHECK_EQ(log_failure_seen, 1);
    pthread_mutex_unlock(&log_mu);
    t_run_free(&r);
    t_load_free(&t);
}


typedef struct progress_log {
    int calls;
    uint64_t at[16];
    char line[256];
} progress_log;

static void on_progress(void *user, pf_loader *l) {
    progress_log *p = (progress_log *)user;
    pf_stats s;
    pf_get_stats(l, &s); /* allowed: no lock is held during the callback */
    if (p->calls < 16) p->at[p->calls] = s.batches;
    p->calls++;
    pf_stats_format(l, p->line, sizeof p->line);
}

static void test_stats_line_and_progress_callback(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    progress_log p;
    char line[256], tiny[12];
    int n;
    memset(&p, 0, sizeof p);
    t_open(&t, &c, &r);
    cfg = t_config(&t, 46, 2, 2); /* 23 batches per epoch, 46 in all */
    cfg.progress = on_progress;
    cfg.progress_user = &p;
    cfg.progress_every = 10;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    pf_stats_format(c.l, line, sizeof line);
    CHECK_CONTAINS(line, "epoch 0 \xc2\xb7 batch 0 \xc2\xb7"); /* nothing yet */
    CHECK_EQ(t_drain(&c, &r, 30), PF_OK); /* stop inside epoch 1, at its 7th batch */
    CHECK_EQ(p.calls, 3);                 /* every 10 batches, across the epoch boundary */
    CHECK(p.at[0] == 10 && p.at[1] == 20 && p.at[2] == 30);
    CHECK_CONTAINS(p.line, "epoch 1 \xc2\xb7 batch 7/23 \xc2\xb7 ");
    n = pf_stats_format(c.l, line, sizeof line);
    CHECK_EQ((size_t)n, strlen(line));
    CHECK_CONTAINS(line, "epoch 1 \xc2\xb7 batch 7/23 \xc2\xb7 ");
    CHECK(strstr(line, " GB/s \xc2\xb7 ") || strstr(line, " MB/s \xc2\xb7 "));
    CHECK_CONTAINS(line, " batches/s \xc2\xb7 waited ");
    CHECK(strstr(line, "-bound") != NULL);
    CHECK_EQ(pf_stats_format(c.l, tiny, sizeof tiny), (int)strlen(line)); /* cut to fit, length as snprintf */
    CHECK(strlen(tiny) + 1 >= sizeof tiny - 1 && strlen(tiny) < sizeof tiny); /* less one where a dot was cut */
    for (size_t size = 1; size <= strlen(line) + 1; size++) { /* cut anywhere: a prefix, never half a dot */
        char cut[256];
        size_t k;
        CHECK_EQ(pf_stats_format(c.l, cut, size), (int)strlen(line));
        k = strlen(cut);
        CHECKF(k < size && !memcmp(cut, line, k), "size %u: \"%s\"", (unsigned)size, cut);
        CHECKF(((unsigned char)line[k] & 0xC0) != 0x80, "size %u: cut inside a character", (unsigned)size);
        CHECKF(k + 2 >= size, "size %u: %u bytes kept", (unsigned)size, (unsigned)k); /* at most a dot's first byte dropped */
    }
    { /* (NULL, 0) gives the full length, the usual way to size a buffer */
        char full[512];
        int need = pf_stats_format(c.l, NULL, 0);
        CHECK(need > 0);
        CHECK_EQ(pf_stats_format(c.l, full, sizeof full), need);
        CHECK_EQ(strlen(full), (size_t)need);
    }
    { /* once an epoch has ended the line names it, not "epoch 2 · batch 0" (here: the last one) */
        trun rest;
        t_run_init(&rest);
        while (rest.eoe == 0 && t_drain(&c, &rest, rest.n + 1) == PF_OK) {}
        CHECK_EQ(rest.eoe, 1);
        pf_stats_format(c.l, line, sizeof line);
        CHECK_CONTAINS(line, "epoch 1 done \xc2\xb7 ");
        t_run_free(&rest);
    }
    if (h_verbose) printf("    %s\n", line);
    t_close(&t, &c, &r);
}

/* cfg.poison: past job->bytes the slot reads 0xA5 on the host backend (as
   a GPU slot would hold whatever an earlier copy left), so a loop that
   reads more than load declared breaks on a CPU box too. */
static int poison_load(void *user, pf_job *job) {
    (void)user;
    memset(job->host, 0x11, job->capacity); /* all of it written... */
    job->bytes = 40;                         /* ...but only 40 bytes declared */
    return 0;
}

static void test_poison_marks_bytes_past_job_bytes(void) {
    for (int poison = 0; poison < 2; poison++) {
        pf_config cfg;
        pf_loader *l = NULL;
        pf_batch b;
        int batches = 0;
        memset(&cfg, 0, sizeof cfg);
        cfg.load = poison_load;
        cfg.num_samples = 12;
        cfg.batch_size = 3;
        cfg.batch_bytes = 1000;
        cfg.epochs = 1;
        cfg.num_workers = 2;
        cfg.backend = PF_BACKEND_HOST;
        cfg.poison = poison;
        cfg.timeout_ms = T_WAIT_MS;
        CHECK_EQ(pf_create(&cfg, &l), PF_OK);
        while (pf_next(l, &b) == PF_OK) {
            const unsigned char *p = (const unsigned char *)b.data;
            size_t bad = 0;
            CHECK_EQ(b.bytes, 40);
            for (size_t i = 0; i < 40; i++) bad += p[i] != 0x11;
            for (size_t i = 40; i < 1000; i++) bad += p[i] != (poison ? 0xA5 : 0x11);
            CHECKF(bad == 0, "poison %d: %zu bytes wrong", poison, bad);
            CHECK_EQ(pf_release(l, &b), PF_OK);
            batches++;
        }
        CHECK_EQ(batches, 4);
        pf_destroy(l);
    }
}

/* ---- an idle loader sleeps ---- */

static double cpu_s(void) { /* every thread of the process */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds the process uses in `ms` of wall time, after `settle_ms` in
   which any spin before a wait (microseconds) has long ended. */
static double cpu_over(unsigned settle_ms, unsigned ms) {
    double c0;
    t_sleep_us(settle_ms * 1000u);
    c0 = cpu_s();
    t_sleep_us(ms * 1000u);
    return cpu_s() - c0;
}

static void *next_one(void *arg) {
    tcons *c = (tcons *)arg;
    pf_batch b;
#ifdef TEST_SIM
    CHECK(cudaSetDevice(0) == cudaSuccess); /* its kernel stand-in runs on device 0 */
#endif
    CHECK_EQ(t_next(c, &b), PF_OK);
    t_release(c, &b);
    return NULL;
}

/* Workers spin a little before they wait, and so does pf_next: once the
   spin is over, an idle loader's threads must be asleep. Two idle states:
   the ring is full and nobody calls pf_next (the workers wait for slots),
   and pf_next waits for a load that is stuck (the consumer and the other
   workers wait). The bound is generous (10% of one core): a thread that
   kept spinning would use 100%. */
static void test_idle_loader_uses_no_cpu(void) {
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    pthread_t th;
    double used;
    t_open(&t, &c, &r);
    cfg = t_config(&t, 1000, 4, 1);
    t.gate_epoch = 0;
    t.gate_batch = 6;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    for (int i = 0; i < 6; i++) {
        pf_batch b;
        CHECK_EQ(t_next(&c, &b), PF_OK);
        t_release(&c, &b);
    }
    used = cpu_over(50, 300);
    CHECKF(used < 0.03, "idle (nobody calls pf_next), the process used %.1f ms of CPU in 300 ms", used * 1e3);
    CHECK(pthread_create(&th, NULL, next_one, &c) == 0); /* waits for batch 6, stuck in load */
    CHECK(t_gate_wait_entered(&t, 1));
    used = cpu_over(50, 300);
    CHECKF(used < 0.03, "pf_next waiting for a stuck load, the process used %.1f ms of CPU in 300 ms", used * 1e3);
    t_gate_open(&t);
    CHECK(pthread_join(th, NULL) == 0);
    t_close(&t, &c, &r);
}

/* Slot states move only through pf__move, which names the states a move
   may come from: a move from any other state is caught. And none was
   caught in the tests before this one (they run first). */
static void test_slot_moves_are_checked(void) {
    int st = PF__SLOT_READY, before = t_asserts_failed;
    CHECK_EQ(before, 0);
    if (before) printf("    an earlier test broke a slot invariant: %s\n", t_assert_text);
    pf__move(&st, PF__FROM(PF__SLOT_READY), PF__SLOT_HELD); /* legal */
    CHECK_EQ(t_asserts_failed, 0);
    CHECK_EQ(st, PF__SLOT_HELD);
    pf__move(&st, PF__FROM(PF__SLOT_FREE), PF__SLOT_LOADING); /* HELD is not FREE */
    CHECK_EQ(t_asserts_failed, 1);
    CHECK(strstr(t_assert_text, "from") != NULL);
    t_asserts_failed = 0;
}

/* Loads dearer than PF__HELP_MAX_NS (60 ms, against 200 us) are the
   workers' alone, unless the batch pf_next waits for is further off than a load less
   PF__HELP_LATE_NS (20 ms here): then pf_next loads the next unclaimed
   one, and the batch it waits for is late by no more than that. A
   consumer asking at once finds its next batch just begun (the worker
   claims it as it publishes the last), so pf_next loads some; one that
   steps 40 ms first finds it 20 ms off at most, and pf_next loads none.
   Host backend: the CUDA backend's pf_next never loads. */
typedef struct late_help {
    pthread_t consumer;
} late_help;
static int late_help_load(void *user, pf_job *job) {
    late_help *h = (late_help *)user;
    uint64_t *w = (uint64_t *)job->host;
    w[0] = job->batch;
    w[1] = pthread_equal(pthread_self(), h->consumer) ? 1u : 0u;
    t_sleep_us(60000);
    job->bytes = 16;
    return 0;
}
static void run_late_help(unsigned step_ms) {
    const uint64_t n = 12;
    late_help h;
    pf_config cfg = t_config_base(n, 1, 16, 1);
    pf_loader *l;
    pf_stats st;
    uint64_t by_caller = 0;
    h.consumer = pthread_self();
    cfg.load = late_help_load;
    cfg.user = &h;
    cfg.num_workers = 1;
    cfg.host_slots = 8; /* the worker never waits for a slot: it has claimed each batch pf_next waits for */
    cfg.backend = PF_BACKEND_HOST;
    cfg.timeout_ms = 0; /* pf_next loads only without one; the harness's watchdog bounds the run */
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    for (uint64_t k = 0; k < n; k++) {
        pf_batch b;
        const uint64_t *w = t_next_k(l, &b, k);
        if (!w) break;
        by_caller += w[1];
        if (step_ms) t_sleep_us(step_ms * 1000u);
        CHECK_EQ(pf_release(l, &b), PF_OK);
    }
    pf_get_stats(l, &st);
    CHECK_EQ(st.next_loads, by_caller);
    if (step_ms) CHECKF(by_caller == 0, "pf_next loaded %llu batches", (unsigned long long)by_caller);
    else CHECKF(by_caller >= 1, "pf_next loaded %llu batches", (unsigned long long)by_caller);
    pf_destroy(l);
}
static void test_late_help(void) {
    run_late_help(0);
    run_late_help(40);
}

static const h_test tests[] = {
    {"pf_next_loads_dear_batches_only_when_not_late", test_late_help},
    {"cpu_count_follows_the_affinity_mask", test_cpu_count_follows_the_affinity_mask},
    {"empty_failure_message_is_not_misreported", test_empty_failure_message_is_not_misreported},
    {"empty_epoch_planned_by_pf_next_ends", test_empty_epoch_planned_by_pf_next_ends},
    {"size_check_counts_the_backends_slots", test_size_check_counts_the_backends_slots},
    {"bookkeeping_product_overflow_is_caught", test_bookkeeping_product_overflow_is_caught},
    {"perm_small_sizes", test_perm_small_sizes},
    {"perm_many_matches_one", test_perm_many_matches_one},
    {"perm_huge_spot_check", test_perm_huge_spot_check},
    {"default_backend_with_a_stream_and_no_gpu", test_default_backend_with_a_stream_and_no_gpu},
    {"huge_dataset_loader_uses_little_memory", test_huge_dataset_loader_uses_little_memory},
    {"sequential_order_and_epoch_ends", test_sequential_order_and_epoch_ends},
    {"shuffle_each_sample_once_per_epoch", test_shuffle_each_sample_once_per_epoch},
    {"same_order_and_rng_for_1_2_7_workers", test_same_order_and_rng_for_1_2_7_workers},
    {"unordered_each_batch_once_in_its_epoch", test_unordered_delivers_each_batch_once_within_its_epoch},
    {"drop_last", test_drop_last},
    {"shards_cover_disjoint_equal_counts", test_shards_cover_disjoint_equal_counts},
    {"shard_padding_wraps_like_distributed_sampler", test_shard_padding_wraps_like_distributed_sampler},
    {"growing_dataset_asks_once_per_epoch", test_growing_dataset_asks_once_per_epoch},
    {"until_destroyed_when_epochs_is_zero", test_until_destroyed_when_epochs_is_zero},
    {"each_bad_field_is_named", test_each_bad_field_is_named},
    {"create_error_is_per_thread", test_create_error_is_per_thread},
    {"load_failure_after_earlier_batches", test_load_failure_after_earlier_batches_sticky},
    {"load_failure_stops_loading", test_load_failure_stops_loading},
    {"oversize_bytes_is_a_load_error", test_oversize_bytes_is_a_load_error},
    {"timeout_names_late_batch_and_worker", test_timeout_names_late_batch_and_worker},
    {"timeout_when_no_worker_started", test_timeout_when_no_worker_started},
    {"holding_every_slot_is_invalid_state", test_holding_every_slot_is_invalid_state},
    {"double_and_foreign_release", test_double_and_foreign_release_are_errors},
    {"a_destroyed_loaders_batch_is_refused", test_a_destroyed_loaders_batch_is_refused},
    {"destroy_at_random_points", test_destroy_at_random_points},
    {"stats_count_and_verdict", test_stats_count_and_verdict},
    {"verdict_from_numbers", test_verdict_from_numbers},
    {"stats_line_and_progress_callback", test_stats_line_and_progress_callback},
    {"config_defaults_are_visible", test_config_defaults_are_visible},
    {"allocation_failures_are_clean", test_allocation_failures_are_clean},
    {"worker_start_hook_once_per_worker", test_worker_start_hook_runs_once_per_worker},
    {"load_failure_is_logged", test_load_failure_is_logged},
    {"poison_marks_bytes_past_job_bytes", test_poison_marks_bytes_past_job_bytes},
    {"idle_loader_uses_no_cpu", test_idle_loader_uses_no_cpu},
    {"slot_moves_are_checked", test_slot_moves_are_checked},
};

int main(int argc, char **argv) {
#ifdef TEST_SIM
    const char *suite = "core suite (simulated CUDA backend)";
#else
    const char *suite = "core suite (host backend)";
#endif
    return h_main(argc, argv, suite, tests, sizeof tests / sizeof tests[0]);
}
