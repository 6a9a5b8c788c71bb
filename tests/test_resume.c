/* test_resume.c - checkpoint and resume, and the block shuffle, as property
   tests over random configs. A resumed run must continue an uninterrupted
   one exactly (in order), or deliver each remaining batch exactly once
   (unordered); elastic resume must cover the rest of the epoch exactly once
   with equal batch counts; the block shuffle must be a bijection that keeps
   blocks together within windows. Host backend, and with -DTEST_SIM the
   CUDA backend on the simulated runtime. */
#define _POSIX_C_SOURCE 200809L
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"
#include "util.h"

/* One pf_next result: a batch (with its indices), an epoch end, the end. */
enum { EV_BATCH, EV_EPOCH, EV_DATA };
typedef struct ev {
    int kind;
    uint64_t epoch, batch, rng;
    uint32_t count;
    uint64_t idx[32];
} ev;

typedef struct evs {
    ev *v;
    size_t n, cap;
} evs;

static void ev_push(evs *e, int kind, const pf_batch *b) {
    ev *x;
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 256;
        e->v = (ev *)realloc(e->v, e->cap * sizeof(ev));
    }
    x = &e->v[e->n++];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    if (b) {
        x->epoch = b->epoch;
        x->batch = b->batch;
        x->rng = b->rng;
        x->count = b->count;
        memcpy(x->idx, b->indices, b->count * sizeof(uint64_t));
    }
}

/* Take up to `max` results (stopping after END_OF_DATA). */
static pf_result run(tcons *c, evs *e, size_t max) {
    for (size_t k = 0; k < max; k++) {
        pf_batch b;
        pf_result r = t_next(c, &b);
        if (r == PF_OK) {
            ev_push(e, EV_BATCH, &b);
            t_release(c, &b);
        } else if (r == PF_END_OF_EPOCH) {
            ev_push(e, EV_EPOCH, NULL);
        } else if (r == PF_END_OF_DATA) {
            ev_push(e, EV_DATA, NULL);
            return r;
        } else {
            return r;
        }
    }
    return PF_OK;
}

static int ev_same(const ev *a, const ev *b) {
    if (a->kind != b->kind) return 0;
    if (a->kind != EV_BATCH) return 1;
    return a->epoch == b->epoch && a->batch == b->batch && a->rng == b->rng && a->count == b->count &&
           !memcmp(a->idx, b->idx, a->count * sizeof(uint64_t));
}

typedef struct rcfg {
    uint64_t n;
    uint32_t bs, world, rank, epochs, block, window;
    bool shuffle, drop_last, unordered, growing;
} rcfg;

static pf_config make_cfg(tload *t, const rcfg *r) {
    pf_config cfg = t_config(t, r->growing ? 0 : r->n, r->bs, r->epochs);
    cfg.world_size = r->world;
    cfg.rank = r->rank;
    cfg.shuffle = r->shuffle;
    cfg.drop_last = r->drop_last;
    cfg.unordered = r->unordered;
    cfg.shuffle_block = r->block;
    cfg.shuffle_window = r->window;
    cfg.seed = 1234;
    cfg.num_workers = 2;
    cfg.host_slots = 4;
    if (r->growing) {
        cfg.num_samples_fn = t_num_samples;
        for (int e = 0; e < 64; e++) t->sizes[e] = r->n + (uint64_t)e * 7; /* the cache grows each epoch */
    }
    return cfg;
}

/* The whole run, never stopped. */
static void reference(const rcfg *r, evs *out) {
    tload t;
    tcons c;
    pf_config cfg;
    t_load_init(&t);
    t_begin(&c, h_seed);
    cfg = make_cfg(&t, r);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(run(&c, out, 100000), PF_END_OF_DATA);
    t_end(&c);
    t_load_free(&t);
}

/* k results, a checkpoint, destroy; resume from the token to the end. */
static void stopped_at(const rcfg *r, size_t k, evs *out, char *tok, size_t toksize) {
    tload t;
    tcons c;
    pf_config cfg;
    t_load_init(&t);
    t_begin(&c, h_seed + k);
    cfg = make_cfg(&t, r);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    (void)run(&c, out, k);
    CHECK_EQ(pf_checkpoint(c.l, tok, toksize), PF_OK);
    t_end(&c);
    t_load_free(&t);
    t_load_init(&t);
    t_begin(&c, h_seed + k + 1000);
    cfg = make_cfg(&t, r);
    cfg.num_workers = 3; /* the worker count never matters */
    cfg.resume = tok;
    CHECKF(t_create(&c, &cfg) == PF_OK, "resume from \"%s\": %s", tok, pf_error(NULL));
    if (c.l && out->n && out->v[out->n - 1].kind == EV_DATA) {
        evs more = {0, 0, 0}; /* stopped after the end: still the end, for ever */
        CHECK_EQ(run(&c, &more, 100000), PF_END_OF_DATA);
        CHECK_EQ(more.n, 1);
        free(more.v);
    } else if (c.l) {
        CHECK_EQ(run(&c, out, 100000), PF_END_OF_DATA);
    }
    t_end(&c);
    t_load_free(&t);
}

static int cmp_ev(const void *a, const void *b) {
    const ev *x = (const ev *)a, *y = (const ev *)b;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    if (x->epoch != y->epoch) return x->epoch < y->epoch ? -1 : 1;
    return x->batch < y->batch ? -1 : x->batch > y->batch;
}

static void test_resume_continues_exactly(void) {
    h_rng_state = h_seed * 31 + 5;
    for (int trial = 0; trial < 40; trial++) {
        rcfg r;
        evs ref = {0, 0, 0};
        memset(&r, 0, sizeof r);
        r.n = 20 + h_rand() % 120;
        r.bs = 1 + (uint32_t)(h_rand() % 8);
        r.world = 1 + (uint32_t)(h_rand() % 3);
        r.rank = (uint32_t)(h_rand() % r.world);
        r.epochs = 1 + (uint32_t)(h_rand() % 3);
        r.shuffle = h_rand() % 3 != 0;
        r.drop_last = h_rand() % 2;
        r.unordered = h_rand() % 3 == 0;
        r.growing = h_rand() % 4 == 0;
        if (r.shuffle && h_rand() % 2) {
            r.block = 2 + (uint32_t)(h_rand() % 9);
            r.window = 1 + (uint32_t)(h_rand() % 4);
        }
        reference(&r, &ref);
        for (int cut = 0; cut < 4; cut++) {
            evs got = {0, 0, 0};
            char tok[512];
            size_t k = (size_t)(h_rand() % (ref.n + 1)); /* anywhere, the very start and end included */
            if (cut == 0) k = 0;
            if (cut == 1) k = ref.n; /* after END_OF_DATA */
            if (cut == 2) /* right after the first END_OF_EPOCH */
                for (k = 0; k < ref.n; k++)
                    if (ref.v[k].kind == EV_EPOCH) {
                        k++;
                        break;
                    }
            stopped_at(&r, k, &got, tok, sizeof tok);
            if (!r.unordered) {
                int same = got.n == ref.n;
                for (size_t i = 0; same && i < ref.n; i++) same = ev_same(&got.v[i], &ref.v[i]);
                CHECKF(same, "trial %d: n %llu bs %u world %u/%u epochs %u shuffle %d block %u/%u drop %d grow %d: "
                       "stopped after %zu of %zu, resumed from \"%s\": %zu results differ from the run never stopped",
                       trial, (unsigned long long)r.n, r.bs, r.rank, r.world, r.epochs, r.shuffle, r.block, r.window,
                       r.drop_last, r.growing, k, ref.n, tok, got.n);
            } else { /* each batch exactly once, the same batches; the ends where they belong */
                int same = got.n == ref.n;
                qsort(ref.v, ref.n, sizeof(ev), cmp_ev);
                qsort(got.v, got.n, sizeof(ev), cmp_ev);
                for (size_t i = 0; same && i < ref.n; i++) same = ev_same(&got.v[i], &ref.v[i]);
                CHECKF(same, "trial %d (unordered): stopped after %zu, resumed from \"%s\": not exactly once", trial,
                       k, tok);
            }
            free(got.v);
        }
        free(ref.v);
    }
}

/* 8 GPUs become 6 (and other pairs), in order: rank 0's token serves all.
   The rest of the epoch goes to the new ranks, each sample once (plus
   padding), every rank the same number of batches; later epochs are
   ordinary epochs on the new world size. */
static void test_elastic_resume_covers_the_rest_once(void) {
    static const uint32_t pairs[][2] = {{8, 6}, {2, 3}, {4, 1}, {1, 4}, {3, 3}};
    h_rng_state = h_seed * 77 + 1;
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
        for (int drop = 0; drop < 2; drop++) {
            uint32_t w = pairs[p][0], w2 = pairs[p][1], bs = 3;
            uint64_t n = 200 + h_rand() % 100, cut = 1 + h_rand() % 5;
            unsigned *seen = (unsigned *)calloc(n, sizeof(unsigned));
            char tok[512] = "";
            uint64_t after[8] = {0}, later[8] = {0};
            for (uint32_t rank = 0; rank < w; rank++) { /* every old rank: cut batches, in lockstep */
                tload t;
                tcons c;
                pf_config cfg;
                evs e = {0, 0, 0};
                rcfg r = {n, bs, w, rank, 2, 0, 0, true, drop != 0, false, false};
                t_load_init(&t);
                t_begin(&c, h_seed);
                cfg = make_cfg(&t, &r);
                CHECK_EQ(t_create(&c, &cfg), PF_OK);
                CHECK_EQ(run(&c, &e, cut), PF_OK);
                for (size_t i = 0; i < e.n; i++)
                    for (uint32_t j = 0; j < e.v[i].count; j++) seen[e.v[i].idx[j]]++;
                if (rank == 0) CHECK_EQ(pf_checkpoint(c.l, tok, sizeof tok), PF_OK);
                t_end(&c);
                t_load_free(&t);
                free(e.v);
            }
            for (uint32_t rank = 0; rank < w2; rank++) { /* the new ranks, from rank 0's token */
                tload t;
                tcons c;
                pf_config cfg;
                evs e = {0, 0, 0};
                rcfg r = {n, bs, w2, rank, 2, 0, 0, true, drop != 0, false, false};
                t_load_init(&t);
                t_begin(&c, h_seed + rank);
                cfg = make_cfg(&t, &r);
                cfg.resume = tok;
                CHECKF(t_create(&c, &cfg) == PF_OK, "%s", pf_error(NULL));
                CHECK_EQ(run(&c, &e, 100000), PF_END_OF_DATA);
                for (size_t i = 0; i < e.n; i++) {
                    if (e.v[i].kind != EV_BATCH) continue;
                    if (e.v[i].epoch == 0) {
                        after[rank]++;
                        for (uint32_t j = 0; j < e.v[i].count; j++) seen[e.v[i].idx[j]]++;
                    } else {
                        later[rank]++;
                    }
                }
                t_end(&c);
                t_load_free(&t);
                free(e.v);
            }
            for (uint32_t rank = 1; rank < w2; rank++) {
                CHECKF(after[rank] == after[0], "%u -> %u: rank %u got %llu batches of the rest, rank 0 %llu", w, w2,
                       rank, (unsigned long long)after[rank], (unsigned long long)after[0]);
                CHECK_EQ(later[rank], later[0]);
            }
            {
                uint64_t missing = 0, twice = 0;
                for (uint64_t i = 0; i < n; i++) {
                    missing += seen[i] == 0;
                    twice += seen[i] > 1;
                }
                /* before the cut every old rank took cut full batches; the
                   rest of the epoch goes to the new ranks under the usual
                   rule: drop_last drops the remainder, padding repeats */
                uint64_t rest = n - cut * bs * w, per = drop ? rest / w2 : (rest + w2 - 1) / w2;
                uint64_t got = drop ? (per / bs) * bs * w2 : per * w2;
                CHECKF(missing == (got < rest ? rest - got : 0), "%u -> %u drop %d: %llu samples never delivered", w,
                       w2, drop, (unsigned long long)missing);
                CHECKF(twice == (got > rest ? got - rest : 0), "%u -> %u drop %d: %llu samples twice", w, w2, drop,
                       (unsigned long long)twice);
            }
            /* later epochs are ordinary epochs of the new world size */
            {
                uint64_t per = drop ? n / w2 : (n + w2 - 1) / w2;
                CHECK_EQ(later[0], drop ? per / bs : (per + bs - 1) / bs);
            }
            free(seen);
        }
}

/* Two elastic hops in one epoch: 8 ranks -> 6 -> 3 (and 2 -> 5 -> 1). The
   middle run numbers its batches from where it was resumed, so its token
   says so (from=B:P) and the last resume checks batch against pos from
   there: every sample once, plus the last world's padding. */
static void test_elastic_chain_through_two_world_sizes(void) {
    static const uint32_t chains[][3] = {{8, 6, 3}, {2, 5, 1}, {3, 3, 2}};
    for (size_t ch = 0; ch < sizeof chains / sizeof chains[0]; ch++) {
        uint32_t bs = 3;
        uint64_t n = 300, cut = 2, consumed = 0;
        unsigned *seen = (unsigned *)calloc(n, sizeof(unsigned));
        char tok[512] = "";
        for (int hop = 0; hop < 3; hop++) {
            uint32_t w = chains[ch][hop];
            char next[512] = "";
            for (uint32_t rank = 0; rank < w; rank++) {
                tload t;
                tcons c;
                pf_config cfg;
                evs e = {0, 0, 0};
                rcfg r = {n, bs, w, rank, 1, 0, 0, true, false, false, false};
                t_load_init(&t);
                t_begin(&c, h_seed + rank);
                cfg = make_cfg(&t, &r);
                if (tok[0]) cfg.resume = tok;
                CHECKF(t_create(&c, &cfg) == PF_OK, "hop %d world %u from \"%s\": %s", hop, w, tok, pf_error(NULL));
                if (!c.l) break;
                if (hop < 2) CHECK_EQ(run(&c, &e, cut), PF_OK);
                else CHECK_EQ(run(&c, &e, 100000), PF_END_OF_DATA);
                for (size_t i = 0; i < e.n; i++)
                    if (e.v[i].kind == EV_BATCH)
                        for (uint32_t j = 0; j < e.v[i].count; j++) seen[e.v[i].idx[j]]++;
                if (rank == 0 && hop < 2) CHECK_EQ(pf_checkpoint(c.l, next, sizeof next), PF_OK);
                t_end(&c);
                t_load_free(&t);
                free(e.v);
            }
            if (hop < 2) {
                consumed += cut * bs * w;
                if (hop == 1 && chains[ch][0] != chains[ch][1]) CHECK_CONTAINS(next, " from=");
                if (hop == 1 && chains[ch][0] == chains[ch][1]) CHECK(strstr(next, " from=") == NULL);
                memcpy(tok, next, sizeof tok);
            }
        }
        {
            uint32_t w = chains[ch][2];
            uint64_t missing = 0, twice = 0, rest = n - consumed, got = (rest + w - 1) / w * w;
            for (uint64_t i = 0; i < n; i++) {
                missing += seen[i] == 0;
                twice += seen[i] > 1;
            }
            CHECKF(missing == 0, "chain %zu: %llu samples never delivered", ch, (unsigned long long)missing);
            CHECKF(twice == got - rest, "chain %zu: %llu samples twice, padding explains %llu", ch,
                   (unsigned long long)twice, (unsigned long long)(got - rest));
        }
        free(seen);
    }
}

static void test_token_edge_cases_and_mismatches(void) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_batch b;
    char tok[512], small[8];
    pf_loader *l = NULL;
    rcfg r = {40, 4, 1, 0, 2, 0, 0, true, false, false, false};
    t_load_init(&t);
    t_begin(&c, h_seed);
    cfg = make_cfg(&t, &r);
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    CHECK_EQ(pf_checkpoint(c.l, tok, sizeof tok), PF_OK); /* before the first batch */
    CHECK_CONTAINS(tok, "epoch=0 batch=0 ");
    { /* without a block shuffle the window counts for nothing: a token that
         names one is the same run (an outside trial's was refused, "the
         config has 1 and 0", while pf_config_defaults says 8) */
        char alt[512];
        const char *w = strstr(tok, "window=0");
        pf_config c2 = cfg;
        pf_loader *l2 = NULL;
        CHECK(w != NULL);
        if (w) {
            snprintf(alt, sizeof alt, "%.*swindow=8%s", (int)(w - tok), tok, w + 8);
            c2.resume = alt;
            CHECKF(pf_create(&c2, &l2) == PF_OK, "%s", pf_error(NULL));
            pf_destroy(l2);
        }
    }
    CHECK_EQ(pf_checkpoint(c.l, small, sizeof small), PF_ERR_INVALID_ARG);
    CHECK_CONTAINS(pf_error(c.l), "the token needs");
    { /* the size it names is exactly enough */
        unsigned long long need = 0;
        char *exact;
        CHECK_EQ(pf_checkpoint(c.l, NULL, 0), PF_ERR_INVALID_ARG);
        CHECK_CONTAINS(pf_error(c.l), "buf is NULL");
        CHECK(sscanf(strstr(pf_error(c.l), "needs "), "needs %llu", &need) == 1);
        exact = (char *)malloc(need);
        CHECK_EQ(pf_checkpoint(c.l, exact, need), PF_OK);
        CHECK_EQ(strlen(exact) + 1, need);
        CHECK_EQ(pf_checkpoint(c.l, exact, need - 1), PF_ERR_INVALID_ARG);
        /* and a buffer one byte short holds nothing: a token cut short
           (in an unordered done list) would resume, and deliver again the
           batches it lost (an outside trial) */
        CHECKF(exact[0] == '\0', "a failed pf_checkpoint left \"%.40s...\" in the buffer", exact);
        free(exact);
    }
    CHECK_EQ(t_next(&c, &b), PF_OK);
    t_release(&c, &b);
    CHECK_EQ(pf_checkpoint(c.l, tok, sizeof tok), PF_OK);
    CHECK_CONTAINS(tok, "epoch=0 batch=1 pos=4 n=40 seed=1234 batch_size=4 shuffle=1");
    t_end(&c);
    t_load_free(&t);
    /* mismatches are named */
    {
        static const struct {
            int field;
            const char *want;
        } cases[] = {{0, "resume token is for seed 1234, cfg.seed is 8"},
                     {1, "resume token is for num_samples 40, cfg.num_samples is 41"},
                     {2, "resume token is for batch_size 4, cfg.batch_size is 5"},
                     {3, "resume token is for shuffle true, cfg.shuffle is false"},
                     {4, "resume token is for drop_last false, cfg.drop_last is true"},
                     {5, "resume token is from in-order mode"},
                     {6, "not a prefetch.h checkpoint token"},
                     {7, "malformed token"}};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            t_load_init(&t);
            cfg = make_cfg(&t, &r);
            cfg.resume = tok;
            switch (cases[i].field) {
            case 0: cfg.seed = 8; break;
            case 1: cfg.num_samples = 41; break;
            case 2: cfg.batch_size = 5; cfg.batch_bytes = t_batch_bytes(5); break;
            case 3: cfg.shuffle = false; break;
            case 4: cfg.drop_last = true; break;
            case 5: cfg.unordered = true; break;
            case 6: cfg.resume = "epoch=1 batch=2"; break;
            case 7: cfg.resume = "pf1 epoch=1 batch=x"; break;
            }
            CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG);
            CHECK(l == NULL);
            CHECK_CONTAINS(pf_error(NULL), cases[i].want);
            t_load_free(&t);
        }
    }
}

/* ---- unordered mode: tokens, stalls, corrupt tokens ---- */

/* The set a token stands for: batches below batch=, plus its done list.
   1 when it equals `got` (delivered[b] for b < nb) exactly. */
static int token_is(const char *tok, const unsigned char *got, uint64_t nb, char *why, size_t wn) {
    unsigned long long low = 0;
    const char *d = strstr(tok, " done="), *b = strstr(tok, " batch=");
    unsigned char *want = (unsigned char *)calloc(nb + 1, 1);
    int ok = 1;
    if (!b || !d || sscanf(b, " batch=%llu", &low) != 1) {
        snprintf(why, wn, "unreadable token \"%s\"", tok);
        free(want);
        return 0;
    }
    for (uint64_t i = 0; i < low && i < nb; i++) want[i] = 1;
    for (d += 6; *d && *d != '-';) {
        char *e;
        unsigned long long x = strtoull(d, &e, 10);
        if (x < nb) want[x] = 1;
        else ok = 0;
        d = *e == ',' ? e + 1 : e;
        if (*e != ',') break;
    }
    for (uint64_t i = 0; ok && i < nb; i++)
        if (want[i] != got[i]) {
            snprintf(why, wn, "token \"%s\" %s batch %llu", tok, got[i] ? "misses delivered" : "claims undelivered",
                     (unsigned long long)i);
            ok = 0;
        }
    free(want);
    return ok;
}

/* A plain loop, default config, consumer slower than the loads, no
   checkpoint taken for resuming: on CUDA the stager runs ahead across the
   epoch end and used to overrun the done set (a stall in epoch 1, tokens
   wrong before it). Every token must name exactly what was delivered, and
   stats.batch count deliveries, not the last index + 1. */
static void test_unordered_plain_loop_tokens_exact(void) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_batch b;
    unsigned char got[64];
    uint64_t in_epoch = 0, epochs_seen = 0;
    char tok[1024], why[1200];
    t_load_init(&t);
    t.max_delay_us = 60;
    t_begin(&c, h_seed);
    cfg = t_config(&t, 96, 3, 3); /* 32 batches an epoch */
    cfg.unordered = true;
    cfg.shuffle = true;
    cfg.seed = 7;
    cfg.timeout_ms = 20000; /* a stall fails in bounded time */
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    memset(got, 0, sizeof got);
    for (int guard = 0; guard < 1000; guard++) {
        pf_stats st;
        pf_result r = t_next(&c, &b);
        if (r == PF_END_OF_DATA) break;
        if (r == PF_END_OF_EPOCH) {
            CHECK_EQ(in_epoch, 32);
            memset(got, 0, sizeof got);
            in_epoch = 0;
            epochs_seen++;
            continue;
        }
        CHECKF(r == PF_OK, "epoch %llu after %llu batches: %s", (unsigned long long)epochs_seen,
               (unsigned long long)in_epoch, pf_error(c.l));
        if (r != PF_OK) break;
        CHECK(b.batch < 32 && !got[b.batch]);
        got[b.batch] = 1;
        in_epoch++;
        t_sleep_us(100 + (unsigned)(h_rand() % 300)); /* the consumer is the slow side */
        t_release(&c, &b);
        CHECK_EQ(pf_checkpoint(c.l, tok, sizeof tok), PF_OK);
        CHECKF(token_is(tok, got, 32, why, sizeof why), "after %llu batches of epoch %llu: %s",
               (unsigned long long)in_epoch, (unsigned long long)epochs_seen, why);
        pf_get_stats(c.l, &st);
        CHECK_EQ(st.batch, in_epoch);
    }
    CHECK_EQ(epochs_seen, 3);
    t_end(&c);
    t_load_free(&t);
}

/* A token written with many slots resumed with one worker and fewer slots
   (and the other way round): nothing lost, nothing repeated, and a done
   list longer than the new host_slots is accepted. */
static void test_unordered_resume_with_fewer_slots(void) {
    static const char *const toks[] = {
        "pf1 epoch=0 batch=1 pos=4 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 drop_last=0 world=1 "
        "rank=0 unordered=1 done=5",
        "pf1 epoch=0 batch=1 pos=4 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 drop_last=0 world=1 "
        "rank=0 unordered=1 done=2,3,5,6,8"};
    static const uint64_t dones[2][6] = {{5}, {2, 3, 5, 6, 8}};
    for (int i = 0; i < 2; i++) {
        unsigned char seen[10] = {0};
        char tok[1024];
        snprintf(tok, sizeof tok, "%s", toks[i]);
        seen[0] = 1;
        for (int j = 0; j < 6 && dones[i][j]; j++) seen[dones[i][j]] = 1;
        for (int hop = 0; hop < 12; hop++) { /* one batch a run, a new run each time */
            tload t;
            tcons c;
            pf_config cfg;
            pf_batch b;
            pf_result r;
            rcfg rc = {40, 4, 1, 0, 1, 0, 0, true, false, true, false};
            t_load_init(&t);
            t_begin(&c, h_seed + (unsigned)hop);
            cfg = make_cfg(&t, &rc);
            cfg.num_workers = 1 + (uint32_t)(hop % 3);
            cfg.host_slots = 1 + (uint32_t)(hop % 2);
            cfg.device_slots = 1 + (uint32_t)(hop % 2);
            cfg.resume = tok;
            CHECKF(t_create(&c, &cfg) == PF_OK, "resume from \"%s\": %s", tok, pf_error(NULL));
            if (!c.l) break;
            r = t_next(&c, &b);
            if (r == PF_OK) {
                CHECKF(b.batch < 10 && !seen[b.batch], "token \"%s\": batch %llu again", tok,
                       (unsigned long long)b.batch);
                if (b.batch < 10) seen[b.batch] = 1;
                t_release(&c, &b);
            }
            CHECK_EQ(pf_checkpoint(c.l, tok, sizeof tok), PF_OK);
            t_end(&c);
            t_load_free(&t);
            if (r == PF_END_OF_EPOCH) break;
            CHECKF(r == PF_OK, "hop %d: %s", hop, pf_result_string(r));
        }
        for (int k = 0; k < 10; k++) CHECKF(seen[k], "case %d: batch %d lost", i, k);
    }
}

/* Every corrupt token is refused before anything starts, naming what is
   wrong; none reaches a worker (a repeat or a batch past the end used to
   retire the epoch early and crash a claim). */
static void test_corrupt_tokens_are_named(void) {
#define TOKA "pf1 epoch=0 batch=1 pos=4 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 drop_last=0 "
    static const struct {
        const char *tok;
        bool unordered;
        const char *want;
    } cases[] = {
        {TOKA "world=1 rank=0 unordered=1 done=3,3", true, "done lists 3 after 3"},
        {TOKA "world=1 rank=0 unordered=1 done=4,3", true, "done lists 3 after 4"},
        {TOKA "world=1 rank=0 unordered=1 done=1", true, "done lists 1 after 1"},
        {TOKA "world=1 rank=0 unordered=1 done=50", true, "but epoch 0 has 10 batches"},
        {TOKA "world=1 rank=0 unordered=1 done=10", true, "but epoch 0 has 10 batches"},
        {TOKA "world=1 rank=0 unordered=1 done=3x", true, "done=3x is not a list"},
        {TOKA "world=1 rank=0 unordered=1 done=", true, "is not a list"},
        {TOKA "world=1 rank=0 unordered=1 done=3,", true, "is not a list"},
        {TOKA "world=1 rank=0 unordered=0 done=3", false, "in an in-order token"},
        {"pf1 epoch=0 batch=4611686018427387904 pos=4 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 "
         "drop_last=0 world=1 rank=0 unordered=0 done=-", false, "pos=4 does not match batch=4611686018427387904"},
        {"pf1 epoch=0 batch=1 pos=99999999999 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 "
         "drop_last=0 world=1 rank=0 unordered=0 done=-", false, "pos=99999999999 does not match batch=1"},
        {"pf1 epoch=0 batch=1x pos=4 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 drop_last=0 world=1 "
         "rank=0 unordered=0 done=-", false, "batch=1x is not a number"},
        {"pf1 epoch=0 batch=1 batch=2 pos=4 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 drop_last=0 "
         "world=1 rank=0 unordered=0 done=-", false, "batch appears twice"},
        {TOKA "world=2 rank=2 unordered=0 done=-", false, "rank=2 must be below world=2"},
        {TOKA "world=0 rank=0 unordered=0 done=-", false, "world=0 must be 1"},
        {"pf1 epoch=18446744073709551616 batch=1 pos=4 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 "
         "drop_last=0 world=1 rank=0 unordered=0 done=-", false, "epoch=18446744073709551616 is not a number"},
        {"pf1 epoch=0 batch=1 pos=4 n=40 seed=99999999999999999999999 batch_size=4 shuffle=1 block=1 window=0 "
         "drop_last=0 world=1 rank=0 unordered=0 done=-", false, "seed=99999999999999999999 is not"},
        /* batch and pos must agree; batch inside the epoch; the origin sane */
        {"pf1 epoch=0 batch=5 pos=28 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 drop_last=0 world=1 "
         "rank=0 unordered=0 done=-", false, "pos=28 does not match batch=5"},
        {"pf1 epoch=0 batch=2 pos=12 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 drop_last=0 world=1 "
         "rank=0 unordered=0 done=-", false, "are at position 8"},
        {"pf1 epoch=0 batch=15 pos=60 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 drop_last=0 world=1 "
         "rank=0 unordered=0 done=-", false, "batch=15 is past the end of epoch 0, which has 10 batches"},
        {"pf1 epoch=0 batch=3 pos=40 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 drop_last=0 world=2 "
         "rank=0 unordered=0 done=- from=9:8", false, "from=9:8 is not where"},
        {"pf1 epoch=0 batch=3 pos=40 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 drop_last=0 world=2 "
         "rank=0 unordered=0 done=- from=2x", false, "from=2x is not batch:pos"},
        {TOKA "world=1 rank=0 unordered=0 done=-\x01", false, "done=-? is neither - (none) nor a list"},
        /* a token with something glued to its end (an outside trial's) */
        {TOKA "world=1 rank=0 unordered=0 done=-XYZ", false, "done=-XYZ is neither - (none) nor a list"},
        {TOKA "world=1 rank=0 unordered=1 done=-XYZ", true, "done=-XYZ is neither - (none) nor a list"},
        {"pf1 epoch=1 batch=2 pos=8 n=40 seed=1234 batch_size=4 shuffle=1 block=1 window=0 drop_last=0 world=1 "
         "rank=0 unordered=0 done=-", false, "inside epoch 1 (batch=2), past the end of data at cfg.epochs = 1"},
        {TOKA "world=1 rank=0 unordered=2 done=-", false, "are 0 or 1"},
        {"pf1 epoch=0 batch=1 pos=4 n=- seed=1234 batch_size=4 shuffle=1 block=1 window=0 drop_last=0 world=1 "
         "rank=0 unordered=0 done=-", false, "n=- (the epoch's size unknown) with batch=1"},
        {"pf1 epoch=0 batch=1 pos=4 n=-5 seed=1234 batch_size=4 shuffle=1 block=1 window=0 drop_last=0 world=1 "
         "rank=0 unordered=0 done=-", false, "n=-5 is not a number"},
    };
#undef TOKA
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tload t;
        pf_loader *l = (pf_loader *)&t; /* must come back NULL */
        rcfg rc = {40, 4, 1, 0, 1, 0, 0, true, false, cases[i].unordered, false};
        pf_config cfg;
        t_load_init(&t);
        cfg = make_cfg(&t, &rc);
        cfg.num_samples_fn = t_num_samples; /* n from the token */
        cfg.num_samples = 0;
        t.sizes[0] = 40;
        cfg.backend = PF_BACKEND_HOST;
        cfg.resume = cases[i].tok;
        CHECKF(pf_create(&cfg, &l) == PF_ERR_INVALID_ARG, "token %zu accepted: %s", i, cases[i].tok);
        CHECK(l == NULL);
        CHECKF(strstr(pf_error(NULL), cases[i].want) != NULL, "token %zu: \"%s\" does not say \"%s\"", i,
               pf_error(NULL), cases[i].want);
        CHECK_EQ(t.loads, 0);
        t_load_free(&t);
    }
    { /* epochs = 0 (until destroyed): an epoch near 2^64 used to wrap the claim's epoch and crash */
        tload t;
        pf_loader *l = NULL;
        rcfg rc = {40, 4, 1, 0, 0, 0, 0, true, false, false, false};
        pf_config cfg;
        t_load_init(&t);
        cfg = make_cfg(&t, &rc);
        cfg.backend = PF_BACKEND_HOST;
        cfg.resume = "pf1 epoch=18446744073709551615 batch=0 pos=0 n=40 seed=1234 batch_size=4 shuffle=1 block=1 "
                     "window=0 drop_last=0 world=1 rank=0 unordered=0 done=-";
        CHECK_EQ(pf_create(&cfg, &l), PF_ERR_INVALID_ARG);
        CHECK_CONTAINS(pf_error(NULL), "epoch=18446744073709551615 must be below 2^62");
        t_load_free(&t);
    }
    { /* a token read back with fgets keeps its newline (or \r\n): still the token */
        static const char *const ends[] = {"\n", "\r\n", " \t\n"};
        for (int k = 0; k < 3; k++) {
            tload t;
            pf_loader *l = NULL;
            rcfg rc = {40, 4, 1, 0, 1, 0, 0, true, false, true, false};
            pf_config cfg;
            char tok[512];
            snprintf(tok, sizeof tok, "pf1 epoch=0 batch=1 pos=4 n=40 seed=1234 batch_size=4 shuffle=1 block=1 "
                     "window=0 drop_last=0 world=1 rank=0 unordered=1 done=3%s", ends[k]);
            t_load_init(&t);
            cfg = make_cfg(&t, &rc);
            cfg.backend = PF_BACKEND_HOST;
            cfg.resume = tok;
            CHECKF(pf_create(&cfg, &l) == PF_OK, "ending %d: %s", k, pf_error(NULL));
            pf_destroy(l);
            t_load_free(&t);
        }
    }
}

/* A dataset that grows while the run goes (every call answers more): a
   token taken right after an epoch ends must keep the next epoch's size
   once it was planned, even when the CUDA stager already staged that whole
   epoch and let its plan go; a resume that asked again would get more. */
static uint64_t growing_per_call(void *user, uint64_t epoch) {
    tload *t = (tload *)user;
    uint64_t n;
    (void)epoch;
    pthread_mutex_lock(&t->mu);
    n = 4 + 3 * (uint64_t)t->size_calls[0]++;
    pthread_mutex_unlock(&t->mu);
    return n;
}

static void test_token_after_epoch_end_keeps_n(void) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_batch b;
    pf_stats st;
    char tok[1024];
    uint64_t n1 = 0;
    int batches = 0;
    t_load_init(&t);
    t_begin(&c, h_seed);
    cfg = t_config(&t, 0, 2, 3);
    cfg.num_samples_fn = growing_per_call;
    cfg.device_slots = 8;
    cfg.host_slots = 8;
    cfg.num_workers = 2;
    CHECK_EQ(t_create(&c, &cfg), PF_OK);
    while (t_next(&c, &b) == PF_OK) t_release(&c, &b); /* epoch 0: 4 samples */
    /* let the pipeline run into epoch 1 (7 samples, 4 batches) as far as it
       will: bounded, and the check below holds however far it got */
    for (int i = 0; i < 2000; i++) {
        pf_get_stats(c.l, &st);
        if (st.copies >= 6 || (st.backend == PF_BACKEND_HOST && st.ready_slots >= 4)) break;
        t_sleep_us(1000);
    }
    t_sleep_us(20000);
    pthread_mutex_lock(&t.mu);
    if (t.size_calls[0] >= 2) n1 = 7; /* epoch 1 was planned before the token: its size is fixed */
    pthread_mutex_unlock(&t.mu);
    CHECK_EQ(pf_checkpoint(c.l, tok, sizeof tok), PF_OK);
    if (n1) CHECKF(strstr(tok, " n=7 ") != NULL, "token \"%s\" lost epoch 1's size (7)", tok);
    t_end(&c);
    t_load_free(&t);
    /* resumed: epoch 1 is the epoch the first run would have had */
    t_load_init(&t);
    t.size_calls[0] = 5; /* the dataset grew meanwhile */
    t_begin(&c, h_seed + 1);
    cfg = t_config(&t, 0, 2, 3);
    cfg.num_samples_fn = growing_per_call;
    cfg.resume = tok;
    CHECKF(t_create(&c, &cfg) == PF_OK, "%s", pf_error(NULL));
    while (t_next(&c, &b) == PF_OK) {
        batches++;
        t_release(&c, &b);
    }
    if (n1) CHECK_EQ(batches, 4);
    t_end(&c);
    t_load_free(&t);
}

/* The unordered promise as a property: a chain of runs, each stopped at a
   random point (across epoch ends, with batches held), resumed with other
   worker and slot counts, with a random consumer speed, delivers every
   batch of every epoch exactly once, and no run stalls. */
static void test_unordered_chain_exactly_once(void) {
    h_rng_state = h_seed * 977 + 3;
    for (int trial = 0; trial < 6; trial++) {
        rcfg r;
        evs ref = {0, 0, 0}, got = {0, 0, 0};
        char tok[4096] = "";
        int done = 0, hops = 0;
        memset(&r, 0, sizeof r);
        r.n = 30 + h_rand() % 90;
        r.bs = 1 + (uint32_t)(h_rand() % 5);
        r.epochs = 2 + (uint32_t)(h_rand() % 2);
        r.shuffle = h_rand() % 2;
        r.drop_last = h_rand() % 2;
        r.unordered = true;
        r.growing = h_rand() % 3 == 0;
        reference(&r, &ref);
        while (!done && hops++ < 200) {
            tload t;
            tcons c;
            pf_config cfg;
            pf_batch held[4];
            int nheld = 0, maxhold = (int)(h_rand() % 3);
            size_t k = 1 + h_rand() % 12;
            unsigned slow = (unsigned)(h_rand() % 300);
            t_load_init(&t);
            t.max_delay_us = (unsigned)(h_rand() % 200);
            t_begin(&c, h_seed + (unsigned)hops * 7919u);
            cfg = make_cfg(&t, &r);
            cfg.num_workers = 1 + (uint32_t)(h_rand() % 4);
            cfg.host_slots = (uint32_t)(h_rand() % 7); /* 0: the default */
            cfg.device_slots = (uint32_t)(h_rand() % 4);
            cfg.timeout_ms = 20000;
            if (tok[0]) cfg.resume = tok;
            CHECKF(t_create(&c, &cfg) == PF_OK, "resume from \"%s\": %s", tok, pf_error(NULL));
            if (!c.l) break;
            for (size_t i = 0; i < k && !done; i++) {
                pf_batch b;
                pf_result x;
                if (nheld && (nheld >= maxhold || (uint32_t)nheld + 1 >= t_consumer_slots(&cfg))) {
                    t_release(&c, &held[0]);
                    memmove(held, held + 1, (size_t)--nheld * sizeof held[0]);
                }
                x = t_next(&c, &b);
                if (x == PF_OK) {
                    ev_push(&got, EV_BATCH, &b);
                    if (slow) t_sleep_us((unsigned)(h_rand() % (slow + 1)));
                    if (nheld < maxhold) held[nheld++] = b;
                    else t_release(&c, &b);
                } else if (x == PF_END_OF_EPOCH) {
                    ev_push(&got, EV_EPOCH, NULL);
                } else if (x == PF_END_OF_DATA) {
                    ev_push(&got, EV_DATA, NULL);
                    done = 1;
                } else {
                    CHECKF(0, "trial %d hop %d: %s (%s)", trial, hops, pf_result_string(x), pf_error(c.l));
                    done = 1;
                }
            }
            CHECK_EQ(pf_checkpoint(c.l, tok, sizeof tok), PF_OK); /* held batches count as delivered */
            t_end(&c); /* destroyed holding them */
            t_load_free(&t);
        }
        CHECK(done);
        {
            int same = got.n == ref.n;
            qsort(ref.v, ref.n, sizeof(ev), cmp_ev);
            qsort(got.v, got.n, sizeof(ev), cmp_ev);
            for (size_t i = 0; same && i < ref.n; i++) same = ev_same(&got.v[i], &ref.v[i]);
            CHECKF(same, "trial %d: n %llu bs %u epochs %u drop %d grow %d: %zu results over %d runs, %zu expected; "
                   "not every batch exactly once", trial, (unsigned long long)r.n, r.bs, r.epochs, r.drop_last,
                   r.growing, got.n, hops, ref.n);
        }
        free(ref.v);
        free(got.v);
    }
}

/* ---- block shuffle ---- */

static void test_block_shuffle_keeps_blocks_within_windows(void) {
    static const struct {
        uint64_t n;
        uint32_t block, window;
    } cases[] = {{1000, 16, 4}, {1000, 7, 3}, {64, 64, 1}, {5, 8, 2}, {100003, 256, 8}, {300, 10, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pf_config c;
        pf__plan p, q;
        uint64_t n = cases[i].n, B = cases[i].block, K = cases[i].window, full = n / B * B;
        unsigned char *seen = (unsigned char *)calloc(n, 1);
        memset(&c, 0, sizeof c);
        c.batch_size = 1;
        c.world_size = 1;
        c.shuffle = true;
        c.shuffle_block = cases[i].block;
        c.shuffle_window = cases[i].window;
        c.seed = 99;
        pf__plan_init(&p, &c, 3, n, 0, 0);
        pf__plan_init(&q, &c, 4, n, 0, 0);
        {
            uint64_t bad = 0, moved = 0, differ = 0;
            for (uint64_t pos = 0; pos < n; pos++) {
                uint64_t x = pf__plan_index(&p, &c, pos);
                if (x >= n || seen[x]++) bad++;
                moved += x != pos;
                differ += x != pf__plan_index(&q, &c, pos);
            }
            CHECKF(bad == 0, "n %llu block %llu window %llu: not a bijection (%llu bad)", (unsigned long long)n,
                   (unsigned long long)B, (unsigned long long)K, (unsigned long long)bad);
            if (n > 2 * B) CHECK(moved > 0 && differ > 0); /* shuffled, and anew each epoch */
        }
        /* every window of K*B positions holds exactly K whole blocks */
        for (uint64_t w0 = 0; w0 < full; w0 += K * B) {
            uint64_t end = w0 + K * B < full ? w0 + K * B : full, blocks_hit = 0, last = UINT64_MAX;
            uint64_t *ids = (uint64_t *)malloc((end - w0) * sizeof(uint64_t));
            for (uint64_t pos = w0; pos < end; pos++) ids[pos - w0] = pf__plan_index(&p, &c, pos) / B;
            qsort(ids, end - w0, sizeof(uint64_t), t_cmp_u64);
            for (uint64_t k = 0; k < end - w0; k++)
                if (ids[k] != last) blocks_hit++, last = ids[k];
            CHECKF(blocks_hit == (end - w0) / B, "window at %llu touches %llu blocks, expected %llu",
                   (unsigned long long)w0, (unsigned long long)blocks_hit, (unsigned long long)((end - w0) / B));
            free(ids);
        }
        free(seen);
    }
}

static void test_block_shuffle_shards_disjoint_and_deterministic(void) {
    const uint64_t n = 997;
    const uint32_t w = 3;
    unsigned *seen = (unsigned *)calloc(n, sizeof(unsigned));
    for (uint32_t rank = 0; rank < w; rank++) {
        tload t;
        tcons c;
        evs a = {0, 0, 0}, b = {0, 0, 0};
        rcfg r = {n, 5, w, rank, 1, 32, 4, true, true, false, false};
        for (int again = 0; again < 2; again++) {
            pf_config cfg;
            t_load_init(&t);
            t_begin(&c, h_seed + (unsigned)again);
            cfg = make_cfg(&t, &r);
            CHECK_EQ(t_create(&c, &cfg), PF_OK);
            CHECK_EQ(run(&c, again ? &b : &a, 100000), PF_END_OF_DATA);
            t_end(&c);
            t_load_free(&t);
        }
        CHECK_EQ(a.n, b.n);
        for (size_t i = 0; i < a.n && i < b.n; i++) CHECK(ev_same(&a.v[i], &b.v[i])); /* the same every run */
        for (size_t i = 0; i < a.n; i++)
            for (uint32_t j = 0; j < a.v[i].count; j++) seen[a.v[i].idx[j]]++;
        free(a.v);
        free(b.v);
    }
    {
        uint64_t twice = 0, missing = 0;
        for (uint64_t i = 0; i < n; i++) twice += seen[i] > 1, missing += seen[i] == 0;
        CHECK_EQ(twice, 0);
        CHECK_EQ(missing, n - w * 5 * ((n / w) / 5)); /* drop_last: the ranks' remainders and short batches */
    }
    free(seen);
}

static const h_test tests[] = {
    {"resume_continues_exactly", test_resume_continues_exactly},
    {"elastic_resume_covers_the_rest_once", test_elastic_resume_covers_the_rest_once},
    {"elastic_chain_through_two_world_sizes", test_elastic_chain_through_two_world_sizes},
    {"token_edge_cases_and_mismatches", test_token_edge_cases_and_mismatches},
    {"unordered_plain_loop_tokens_exact", test_unordered_plain_loop_tokens_exact},
    {"unordered_resume_with_fewer_slots", test_unordered_resume_with_fewer_slots},
    {"corrupt_tokens_are_named", test_corrupt_tokens_are_named},
    {"token_after_epoch_end_keeps_n", test_token_after_epoch_end_keeps_n},
    {"unordered_chain_exactly_once", test_unordered_chain_exactly_once},
    {"block_shuffle_keeps_blocks_within_windows", test_block_shuffle_keeps_blocks_within_windows},
    {"block_shuffle_shards_disjoint_and_deterministic", test_block_shuffle_shards_disjoint_and_deterministic},
};

int main(int argc, char **argv) {
#ifdef TEST_SIM
    const char *suite = "resume and block shuffle (simulated CUDA backend)";
#else
    const char *suite = "resume and block shuffle (host backend)";
#endif
    return h_main(argc, argv, suite, tests, sizeof tests / sizeof tests[0]);
}
