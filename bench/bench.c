/* bench.c - the host backend against the limits of the machine at hand, all
   measured in one run: every figure is a ratio to a limit measured right
   beside it. JSON lines first, then a table. See bench/README.md.

     1. copy-bound throughput vs plain memcpy with as many threads
     2. handoff overhead: ns per (empty) batch, in order and unordered;
        cheap loads (a memcpy from RAM) vs the inline loop, with the floor
        beside: the consumer and a thread splitting the copies, no lock
     3. overlap: sleep-based loads and steps vs the ideal max(step, load/W)
     4. scaling: a load-bound mix with 1..16 workers
     5. memory: peak RSS beyond the dataset vs the slots

   Build: cc -O2 -std=c11 bench/bench.c -o bench -lpthread; ./bench [--quick] */
#define _POSIX_C_SOURCE 200809L
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int quick;
static const char *only; /* --only NAME: one section */
static int want(const char *name) { return !only || !strcmp(only, name); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_us(double us) {
    struct timespec ts;
    ts.tv_sec = (time_t)(us / 1e6);
    ts.tv_nsec = (long)((us - (double)ts.tv_sec * 1e6) * 1e3);
    nanosleep(&ts, NULL);
}

static void die(const char *what, pf_loader *l) {
    fprintf(stderr, "%s: %s\n", what, l ? pf_error(l) : pf_error(NULL));
    exit(1);
}

/* The consumer loop: every batch, `touch` it, release. Returns seconds. */
typedef unsigned (*touch_fn)(const pf_batch *b, void *arg);
/* Seconds from the first pf_next (or from the end of batch `skip`, a
   warm-up left out of the window) to the end of the data. */
static double consume_from(pf_config *cfg, touch_fn touch, void *arg, pf_stats *st, uint64_t skip) {
    pf_loader *l;
    volatile unsigned sink = 0;
    uint64_t n = 0;
    double t0;
    if (pf_create(cfg, &l) != PF_OK) die("pf_create", NULL);
    t0 = now_s();
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r == PF_END_OF_DATA) break;
        if (r != PF_OK) die("pf_next", l);
        if (touch) sink += touch(&b, arg);
        pf_release(l, &b);
        if (++n == skip) t0 = now_s();
    }
    t0 = now_s() - t0;
    if (st) pf_get_stats(l, st);
    pf_destroy(l);
    (void)sink;
    return t0;
}

static double consume(pf_config *cfg, touch_fn touch, void *arg, pf_stats *st) {
    return consume_from(cfg, touch, arg, st, 0);
}

/* ---------------------------------------------------------------------- */
/* 1. copy-bound: a RAM-resident dataset, items copied into the slots     */

typedef struct dataset {
    unsigned char *data;
    size_t item, nitems;
} dataset;

static int copy_load(void *user, pf_job *job) {
    const dataset *d = (const dataset *)user;
    unsigned char *out = (unsigned char *)job->host;
    for (uint32_t i = 0; i < job->count; i++)
        memcpy(out + (size_t)i * d->item, d->data + (job->indices[i] % d->nitems) * d->item, d->item);
    job->bytes = (size_t)job->count * d->item;
    return 0;
}

static unsigned touch_items(const pf_batch *b, void *arg) { /* read a word of every item */
    const dataset *d = (const dataset *)arg;
    unsigned acc = 0;
    for (uint32_t i = 0; i < b->count; i++) acc += ((const unsigned *)((const unsigned char *)b->data + i * d->item))[0];
    return acc;
}

/* The limit: the same item copies by as many threads as the loader has
   workers, no loader. Two of them: each thread into one reused batch
   buffer (the best case for memcpy: that buffer may stay in cache), and
   each into its share of a ring of as many batch buffers as the loader's
   default ring (2W + 1), used in turn: a loader must hand the consumer
   one buffer while it fills the next, so the ring is its floor. On a host
   where a 4 MiB buffer lives in the L3 cache the two part: 64 KiB items,
   2 threads, 32-37 GB/s into one buffer, 26-31 into rings of 3 (2026-11-25,
   the 2-core VM). Buffers are filled first so they are resident. */
typedef struct memcpy_arg {
    const dataset *d;
    size_t batches, batch_items;
    unsigned first, nbufs;
    unsigned char *dst;
} memcpy_arg;

static void *memcpy_thread(void *p) {
    memcpy_arg *a = (memcpy_arg *)p;
    size_t k = a->first, bytes = a->batch_items * a->d->item;
    for (size_t b = 0; b < a->batches; b++) {
        unsigned char *dst = a->dst + (b % a->nbufs) * bytes;
        for (size_t i = 0; i < a->batch_items; i++, k++)
            memcpy(dst + i * a->d->item, a->d->data + (k % a->d->nitems) * a->d->item, a->d->item);
    }
    return NULL;
}

/* `bufs` batch buffers in all (at least one a thread), shared out */
static double memcpy_limit(const dataset *d, unsigned threads, unsigned bufs, size_t batches, size_t batch_items) {
    pthread_t th[16];
    memcpy_arg a[16];
    double t0;
    for (unsigned t = 0; t < threads; t++) {
        a[t].d = d;
        a[t].batches = batches / threads;
        a[t].batch_items = batch_items;
        a[t].first = (unsigned)(t * (d->nitems / threads));
        a[t].nbufs = bufs / threads + (t < bufs % threads);
        a[t].dst = (unsigned char *)malloc(a[t].nbufs * batch_items * d->item);
        memset(a[t].dst, 0xa5, a[t].nbufs * batch_items * d->item); /* non-zero: really resident, see pf_create */
    }
    t0 = now_s();
    for (unsigned t = 0; t < threads; t++) pthread_create(&th[t], NULL, memcpy_thread, &a[t]);
    for (unsigned t = 0; t < threads; t++) pthread_join(th[t], NULL);
    t0 = now_s() - t0;
    for (unsigned t = 0; t < threads; t++) free(a[t].dst);
    return t0;
}

typedef struct row {
    char name[64], value[48], limit[48], ratio[32], target[32], ok[8];
} row;
static row rows[128];
static int nrows;

static void add_row(const char *name, const char *value, const char *limit, double ratio, const char *target,
                    int ok) {
    row *r = &rows[nrows++];
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->value, sizeof r->value, "%s", value);
    snprintf(r->limit, sizeof r->limit, "%s", limit);
    if (ratio >= 0) snprintf(r->ratio, sizeof r->ratio, "%.3f", ratio);
    else r->ratio[0] = '\0';
    snprintf(r->target, sizeof r->target, "%s", target);
    snprintf(r->ok, sizeof r->ok, "%s", ok < 0 ? "" : ok ? "yes" : "NO");
}

static void bench_copy(void) {
    const size_t dataset_bytes = (size_t)256 << 20;
    const size_t items[3] = {4096, 65536, 1 << 20};
    const uint32_t batch = 64;
    for (int k = 0; k < 3; k++) {
        dataset d;
        d.item = items[k];
        d.nitems = dataset_bytes / d.item;
        d.data = (unsigned char *)malloc(dataset_bytes);
        for (size_t i = 0; i < dataset_bytes; i += 64) d.data[i] = (unsigned char)i;
        memset(d.data, 7, dataset_bytes); /* resident, not lazily mapped */
        for (unsigned workers = 1; workers <= 2; workers++) {
            size_t total = (size_t)(quick ? 1 : 4) << 30; /* bytes copied per measurement */
            size_t batches = total / (batch * d.item);
            double best_l = 1e9, best_m = 1e9, best_r = 1e9;
            pf_config cfg;
            char name[64], v[48], lim[48];
            if (batches < 8) batches = 8;
            memset(&cfg, 0, sizeof cfg);
            cfg.load = copy_load;
            cfg.user = &d;
            cfg.num_samples = batches * batch;
            cfg.batch_size = batch;
            cfg.batch_bytes = (size_t)batch * d.item;
            cfg.epochs = 1;
            cfg.num_workers = workers;
            cfg.backend = PF_BACKEND_HOST;
            for (int rep = 0; rep < (quick ? 2 : 3); rep++) { /* best of: the machine is shared */
                double m = memcpy_limit(&d, workers, workers, batches, batch);
                double r = memcpy_limit(&d, workers, 2 * workers + 1, batches, batch);
                double t = consume(&cfg, touch_items, &d, NULL);
                if (m < best_m) best_m = m;
                if (r < best_r) best_r = r;
                if (t < best_l) best_l = t;
            }
            {
                double bytes = (double)batches * batch * d.item, gbps = bytes / best_l / 1e9, mgbps = bytes / best_m / 1e9;
                double rgbps = bytes / best_r / 1e9, ratio = gbps / rgbps;
                printf("{\"bench\":\"copy\",\"item_bytes\":%zu,\"batch\":%u,\"workers\":%u,\"items_per_s\":%.0f,"
                       "\"GBps\":%.3f,\"memcpy_GBps\":%.3f,\"memcpy_ring_GBps\":%.3f,\"ratio\":%.3f,"
                       "\"ratio_one_buffer\":%.3f}\n",
                       d.item, batch, workers, (double)batches * batch / best_l, gbps, mgbps, rgbps, ratio, gbps / mgbps);
                snprintf(name, sizeof name, "copy %zu KiB items, %u worker%s", d.item / 1024, workers,
                         workers > 1 ? "s" : "");
                snprintf(v, sizeof v, "%.2f GB/s (%.0f items/s)", gbps, (double)batches * batch / best_l);
                snprintf(lim, sizeof lim, "memcpy %ut, %u bufs %.1f (1 buf %.1f)", workers, 2 * workers + 1, rgbps, mgbps);
                add_row(name, v, lim, ratio, d.item >= 65536 ? ">= 0.85" : "", d.item >= 65536 ? ratio >= 0.85 : -1);
            }
        }
        free(d.data);
    }
}

/* ---------------------------------------------------------------------- */
/* 2. handoff: what a batch costs when loading costs nothing              */

static int empty_load(void *user, pf_job *job) {
    (void)user;
    job->bytes = 0;
    return 0;
}

/* The physical floor: a minimal single-producer ring whose two threads
   spin on each other's index (no lock, no sleep, no bookkeeping). */
typedef struct spsc {
    uint64_t head, tail; /* written by the producer / the consumer */
    uint64_t ring[64];
    uint64_t n;
    uint32_t slots;
} spsc;

static void *spsc_producer(void *p) {
    spsc *q = (spsc *)p;
    for (uint64_t i = 0; i < q->n; i++) {
        while (i - __atomic_load_n(&q->tail, __ATOMIC_ACQUIRE) >= q->slots) {
        }
        q->ring[i % q->slots] = i;
        __atomic_store_n(&q->head, i + 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static double spsc_floor(uint64_t n, uint32_t slots) {
    spsc q;
    pthread_t th;
    uint64_t sum = 0;
    double t0;
    memset(&q, 0, sizeof q);
    q.n = n;
    q.slots = slots;
    t0 = now_s();
    pthread_create(&th, NULL, spsc_producer, &q);
    for (uint64_t i = 0; i < n; i++) {
        while (__atomic_load_n(&q.head, __ATOMIC_ACQUIRE) <= i) {
        }
        sum += q.ring[i % slots];
        __atomic_store_n(&q.tail, i + 1, __ATOMIC_RELEASE);
    }
    pthread_join(th, NULL);
    t0 = now_s() - t0;
    if (sum != n * (n - 1) / 2) die("spsc ring", NULL);
    return t0;
}

/* One cache line from one core to the other: two threads take turns
   writing a counter on a line of its own, each waiting to see the other's
   write. Seconds for n one-way moves. What every handoff pays at least
   once (the batch's ready flag), and a cheap 4 KiB load costs about one
   of them: the scale against which the cheap table's gaps read. */
typedef struct pingpong {
    _Alignas(64) uint64_t turn;
    char pad[56];
    uint64_t n;
} pingpong;
/* the turns from `first` on, every other one: wait for it, pass it on */
static void pingpong_turns(pingpong *q, uint64_t first) {
    for (uint64_t i = first; i < q->n; i += 2) {
        while (__atomic_load_n(&q->turn, __ATOMIC_ACQUIRE) != i) {
        }
        __atomic_store_n(&q->turn, i + 1, __ATOMIC_RELEASE);
    }
}
static void *pingpong_other(void *p) {
    pingpong_turns((pingpong *)p, 1);
    return NULL;
}
static double line_move(uint64_t n) {
    pingpong q;
    pthread_t th;
    double t0;
    memset(&q, 0, sizeof q);
    q.n = n;
    pthread_create(&th, NULL, pingpong_other, &q);
    t0 = now_s();
    pingpong_turns(&q, 0);
    pthread_join(th, NULL);
    return now_s() - t0;
}

static void handoff_row(const char *name, double best, uint64_t n, const char *target, int ok) {
    char v[48];
    snprintf(v, sizeof v, "%.0f ns/batch (%.2fM/s)", best / n * 1e9, n / best / 1e6);
    add_row(name, v, "", -1, target, ok);
}

static void bench_handoff(void) {
    const uint64_t n = quick ? 300000 : 2000000;
    /* the default ring for 1 worker, and the smallest (2W+1) one: each a
       sleep and a wake per batch unless the handoff avoids them */
    {
        static const uint32_t slots[3] = {0, 3, 64};
        double best[3] = {1e9, 1e9, 1e9}, floor_best = 1e9;
        pf_config cfg, full;
        char name[64];
        memset(&cfg, 0, sizeof cfg);
        cfg.load = empty_load;
        cfg.num_samples = n;
        cfg.batch_size = 1;
        cfg.batch_bytes = 8;
        cfg.epochs = 1;
        cfg.num_workers = 1;
        cfg.backend = PF_BACKEND_HOST;
        full = pf_config_defaults(&cfg);
        for (int rep = 0; rep < 3; rep++) { /* interleaved: the ratios share the machine's mood */
            double f = spsc_floor(n, 64);
            if (f < floor_best) floor_best = f;
            for (int k = 0; k < 3; k++) {
                double t;
                cfg.host_slots = slots[k];
                t = consume(&cfg, NULL, NULL, NULL);
                if (t < best[k]) best[k] = t;
            }
        }
        for (int k = 0; k < 3; k++) {
            uint32_t s = slots[k] ? slots[k] : full.host_slots;
            printf("{\"bench\":\"handoff_ring\",\"slots\":%u,\"default\":%d,\"workers\":1,\"ns_per_batch\":%.1f}\n", s,
                   !slots[k], best[k] / n * 1e9);
            snprintf(name, sizeof name, "handoff, %u slots%s, 1 worker", s, slots[k] ? "" : " (default)");
            handoff_row(name, best[k], n, k < 2 ? "<= 2000 ns" : "", k < 2 ? best[k] / n * 1e9 <= 2000 : -1);
        }
        printf("{\"bench\":\"handoff_floor\",\"slots\":64,\"ns_per_batch\":%.1f}\n", floor_best / n * 1e9);
        handoff_row("floor: spinning SPSC ring, 64 slots", floor_best, n, "", -1);
        {
            uint64_t moves = quick ? 200000 : 1000000;
            double best_move = 1e9;
            char v[48];
            for (int rep = 0; rep < 3; rep++) {
                double t = line_move(moves);
                if (t < best_move) best_move = t;
            }
            printf("{\"bench\":\"line_move\",\"ns\":%.1f}\n", best_move / moves * 1e9);
            snprintf(v, sizeof v, "%.0f ns", best_move / moves * 1e9);
            add_row("floor: a cache line, core to core", v, "the least a handoff pays", -1, "", -1);
        }
    }
    for (int unordered = 0; unordered <= 1; unordered++)
        for (unsigned workers = 1; workers <= 2; workers++) {
            pf_config cfg;
            double best = 1e9;
            char name[64], v[48];
            memset(&cfg, 0, sizeof cfg);
            cfg.load = empty_load;
            cfg.num_samples = n;
            cfg.batch_size = 1;
            cfg.batch_bytes = 8;
            cfg.epochs = 1;
            cfg.num_workers = workers;
            cfg.host_slots = 64;
            cfg.unordered = unordered;
            cfg.backend = PF_BACKEND_HOST;
            for (int rep = 0; rep < 3; rep++) {
                double t = consume(&cfg, NULL, NULL, NULL);
                if (t < best) best = t;
            }
            printf("{\"bench\":\"handoff\",\"order\":\"%s\",\"workers\":%u,\"batches\":%llu,\"batches_per_s\":%.0f,"
                   "\"ns_per_batch\":%.1f}\n",
                   unordered ? "unordered" : "in order", workers, (unsigned long long)n, n / best, best / n * 1e9);
            snprintf(name, sizeof name, "handoff, %s, %u worker%s", unordered ? "unordered" : "in order", workers,
                     workers > 1 ? "s" : "");
            snprintf(v, sizeof v, "%.0f ns/batch (%.2fM/s)", best / n * 1e9, n / best / 1e6);
            add_row(name, v, "", -1, workers == 1 ? "<= 1000 ns" : "", workers == 1 ? best / n * 1e9 <= 1000 : -1);
        }
}

/* ---------------------------------------------------------------------- */
/* 2b. cheap loads: one memcpy per batch from RAM, against the same loop
   done inline by the consumer (the honest alternative for data in RAM) */

typedef struct cheap {
    unsigned char *data;
    size_t item, nitems; /* nitems: a power of two */
    bool shuffle;
} cheap;

static unsigned touch_pages(const unsigned char *p, size_t bytes) { /* a word of every 4 KiB */
    unsigned acc = 0;
    for (size_t i = 0; i < bytes; i += 4096) acc += *(const unsigned *)(p + i);
    return acc;
}

static int cheap_load(void *user, pf_job *job) {
    const cheap *c = (const cheap *)user;
    memcpy(job->host, c->data + (job->indices[0] & (c->nitems - 1)) * c->item, c->item);
    job->bytes = c->item;
    return 0;
}

static unsigned cheap_touch(const pf_batch *b, void *arg) {
    (void)arg;
    return touch_pages((const unsigned char *)b->data, b->bytes);
}

/* Batch i's item where the inline loop and the floor copy it from:
   shuffled, an odd-multiplier order (a bijection on a power of two), as
   cheap as an index can be. */
static const unsigned char *cheap_item(const cheap *c, uint64_t i) {
    uint64_t k = c->shuffle ? (i * UINT64_C(0x9e3779b97f4a7c15)) & (c->nitems - 1) : i & (c->nitems - 1);
    return c->data + k * c->item;
}

/* The inline loop: the consumer copies each batch into one buffer itself.
   Timed over the batches after `skip`, the window the loader is timed
   over. */
static double cheap_inline(const cheap *c, uint64_t batches, unsigned char *buf, uint64_t skip) {
    volatile unsigned sink = 0;
    double t0 = now_s();
    for (uint64_t i = 0; i < batches; i++) {
        memcpy(buf, cheap_item(c, i), c->item);
        sink += touch_pages(buf, c->item);
        if (i + 1 == skip) t0 = now_s();
    }
    (void)sink;
    return now_s() - t0;
}

/* The floor for cheap loads: the consumer and one thread share the
   copying with no lock and no bookkeeping, in runs of SPLIT_RUN batches
   (the thread the even runs, the consumer the odd ones), each run
   published with one release store and each thread writing only its own
   slots: what two cores can do at best with the copies split between
   them. Timed like cheap_inline, from batch `skip`. */
#define SPLIT_RUN 16u
#define SPLIT_SLOTS 64u /* a multiple of 2 runs: slot i % 64 always belongs to one thread */
typedef struct split_ring {
    const cheap *c;
    unsigned char *slots;
    uint64_t n, head, tail; /* head: batches the thread published; tail: the consumer's */
} split_ring;
static void *split_producer(void *p) {
    split_ring *q = (split_ring *)p;
    const cheap *c = q->c;
    for (uint64_t i = 0; i < q->n; i++) {
        if ((i / SPLIT_RUN) % 2) continue; /* the consumer's run */
        while (i - __atomic_load_n(&q->tail, __ATOMIC_ACQUIRE) >= SPLIT_SLOTS) {
        }
        memcpy(q->slots + (i % SPLIT_SLOTS) * c->item, cheap_item(c, i), c->item);
        if ((i + 1) % SPLIT_RUN == 0 || i + 1 == q->n) __atomic_store_n(&q->head, i + 1, __ATOMIC_RELEASE);
    }
    return NULL;
}
static double cheap_split_floor(const cheap *c, uint64_t batches, uint64_t skip) {
    split_ring q;
    pthread_t th;
    volatile unsigned sink = 0;
    double t0;
    memset(&q, 0, sizeof q);
    q.c = c;
    q.n = batches;
    q.slots = (unsigned char *)malloc(SPLIT_SLOTS * c->item);
    if (!q.slots) die("split ring: out of memory", NULL);
    memset(q.slots, 0, SPLIT_SLOTS * c->item);
    t0 = now_s();
    pthread_create(&th, NULL, split_producer, &q);
    for (uint64_t i = 0; i < batches; i++) {
        unsigned char *slot = q.slots + (i % SPLIT_SLOTS) * c->item;
        if ((i / SPLIT_RUN) % 2) {
            memcpy(slot, cheap_item(c, i), c->item);
        } else {
            while (__atomic_load_n(&q.head, __ATOMIC_ACQUIRE) <= i) {
            }
        }
        sink += touch_pages(slot, c->item);
        __atomic_store_n(&q.tail, i + 1, __ATOMIC_RELEASE);
        if (i + 1 == skip) t0 = now_s();
    }
    t0 = now_s() - t0;
    pthread_join(th, NULL);
    free(q.slots);
    (void)sink;
    return t0;
}

static void bench_cheap(void) {
    const size_t dataset_bytes = (size_t)256 << 20;
    static const size_t sizes[5] = {4096, 16384, 65536, 262144, 1 << 20};
    static const char *const setting[3] = {"1 worker", "2 workers", "autotune"};
    cheap c;
    unsigned char *buf = (unsigned char *)malloc((size_t)1 << 20);
    c.data = (unsigned char *)malloc(dataset_bytes);
    memset(c.data, 7, dataset_bytes); /* resident */
    memset(buf, 7, (size_t)1 << 20);
    for (int k = 0; k < 5; k++)
        for (int sh = 0; sh <= 1; sh++) {
            /* 8 GiB a run, at most 1.6 million batches (1/4 in quick
               mode): a few tenths of a second. The first fifth is left
               out of every setting's window (thread start, settling).
               Autotune's trials take its first 40-80 ms once per loader
               (a training run lasts far longer); with 2 GiB runs (80-130
               ms windows) they were half the window at 16 and 64 KiB, and
               read 0.87-0.89 of the best where longer runs read 0.95-1.1 */
            uint64_t batches = ((size_t)8 << 30) / sizes[k], skip;
            double best_inline = 1e9, best[3] = {1e9, 1e9, 1e9}, top = 0, best_split = 1e9;
            pf_config cfg;
            int top_k = 0;
            char name[64], v[96], lim[48];
            if (batches > 1600000) batches = 1600000;
            if (quick) batches /= 4;
            skip = batches / 5;
            c.item = sizes[k];
            c.nitems = dataset_bytes / c.item;
            c.shuffle = sh;
            memset(&cfg, 0, sizeof cfg);
            cfg.load = cheap_load;
            cfg.user = &c;
            cfg.num_samples = batches;
            cfg.batch_size = 1;
            cfg.batch_bytes = c.item;
            cfg.epochs = 1;
            cfg.shuffle = sh;
            cfg.backend = PF_BACKEND_HOST;
            for (int rep = 0; rep < (quick ? 2 : 3); rep++) { /* interleaved, best of */
                double t = cheap_inline(&c, batches, buf, skip);
                if (t < best_inline) best_inline = t;
                t = cheap_split_floor(&c, batches, skip);
                if (t < best_split) best_split = t;
                for (int w = 0; w < 3; w++) {
                    cfg.num_workers = w < 2 ? (uint32_t)w + 1 : 0;
                    cfg.autotune = w == 2;
                    t = consume_from(&cfg, cheap_touch, NULL, NULL, skip);
                    if (t < best[w]) best[w] = t;
                }
            }
            for (int w = 0; w < 3; w++)
                if (best_inline / best[w] > top) top = best_inline / best[w], top_k = w;
            printf("{\"bench\":\"cheap\",\"batch_bytes\":%zu,\"order\":\"%s\",\"inline_us\":%.3f,\"w1_us\":%.3f,"
                   "\"w2_us\":%.3f,\"auto_us\":%.3f,\"best_vs_inline\":%.3f,\"auto_vs_best\":%.3f,"
                   "\"split_floor_us\":%.3f,\"split_floor_vs_inline\":%.3f}\n",
                   c.item, sh ? "shuffled" : "in order", best_inline / (batches - skip) * 1e6, best[0] / (batches - skip) * 1e6,
                   best[1] / (batches - skip) * 1e6, best[2] / (batches - skip) * 1e6, top, best_inline / best[2] / top,
                   best_split / (batches - skip) * 1e6, best_inline / best_split);
            snprintf(name, sizeof name, "cheap %zu KiB, %s: best", c.item / 1024, sh ? "shuffled" : "in order");
            snprintf(v, sizeof v, "%.2f us/batch (%s)", best[top_k] / (batches - skip) * 1e6, setting[top_k]);
            snprintf(lim, sizeof lim, "inline %.2f, floor %.2f (%.2fx)", best_inline / (batches - skip) * 1e6,
                     best_split / (batches - skip) * 1e6, best_inline / best_split);
            add_row(name, v, lim, top, ">= 1.0 x inline", top >= 1.0);
            snprintf(name, sizeof name, "cheap %zu KiB, %s: autotune", c.item / 1024, sh ? "shuffled" : "in order");
            snprintf(v, sizeof v, "%.2f us/batch (1w %.2f, 2w %.2f)", best[2] / (batches - skip) * 1e6, best[0] / (batches - skip) * 1e6,
                     best[1] / (batches - skip) * 1e6);
            snprintf(lim, sizeof lim, "best: %.2f us/batch", best[top_k] / (batches - skip) * 1e6);
            add_row(name, v, lim, best[top_k] / best[2], ">= 0.9 x best", best[top_k] / best[2] >= 0.9);
        }
    free(c.data);
    free(buf);
}

/* ---------------------------------------------------------------------- */
/* 3 and 4. overlap and scaling: sleeps stand for I/O and for a GPU step   */

typedef struct sleepy {
    uint32_t items;
    double item_us; /* asked-for sleep per item */
} sleepy;

static int sleepy_load(void *user, pf_job *job) {
    const sleepy *s = (const sleepy *)user;
    for (uint32_t i = 0; i < job->count; i++) sleep_us(s->item_us);
    job->bytes = 64;
    return 0;
}

/* The step sleeps, and adds up how long its sleeps really took. */
typedef struct step_cfg {
    double us, spent_s;
} step_cfg;

static unsigned sleepy_step(const pf_batch *b, void *arg) {
    step_cfg *st = (step_cfg *)arg;
    double t0 = now_s();
    sleep_us(st->us);
    st->spent_s += now_s() - t0;
    return (unsigned)b->count;
}

/* What a sleep of `us` really takes here (timer slack, wakeup latency). */
static double calibrate(double us) {
    int n = quick ? 50 : 200;
    double t0 = now_s();
    for (int i = 0; i < n; i++) sleep_us(us);
    return (now_s() - t0) / n * 1e6;
}

static double naive_sleepy(const sleepy *s, double step_us, uint64_t batches) {
    double t0 = now_s();
    for (uint64_t b = 0; b < batches; b++) {
        for (uint32_t i = 0; i < s->items; i++) sleep_us(s->item_us);
        sleep_us(step_us);
    }
    return now_s() - t0;
}

static double run_sleepy(sleepy *s, step_cfg *step, unsigned workers, uint64_t batches, pf_stats *st,
                         bool workers_only) {
    pf_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.workers_only = workers_only;
    cfg.load = sleepy_load;
    cfg.user = s;
    cfg.num_samples = batches * s->items;
    cfg.batch_size = s->items;
    cfg.batch_bytes = 64;
    cfg.epochs = 1;
    cfg.num_workers = workers;
    cfg.backend = PF_BACKEND_HOST;
    return consume(&cfg, sleepy_step, step, st);
}

/* Efficiency = ideal / measured, where the ideal max(step total, load
   total / workers) comes from the run itself: the summed time the workers
   really spent in load (pf_stats.load_s) and the consumer in its steps. A
   sleep lasts longer than asked, by an amount that depends on how busy the
   machine is, so times measured beforehand would not do. */
static void bench_overlap(void) {
    sleepy s = {8, 200};
    const double item_eff = calibrate(s.item_us), load_eff = item_eff * s.items;
    const char *mix[3] = {"load-bound", "balanced", "compute-bound"};
    const double step_factor[3] = {0.5, 1.0, 2.0}; /* step vs load/workers */
    printf("{\"bench\":\"calibration\",\"asked_us\":%.0f,\"measured_us\":%.1f}\n", s.item_us, item_eff);
    for (unsigned workers = 2; workers <= 4; workers += 2)
        for (int m = 0; m < 3; m++) {
            uint64_t batches = (quick ? 50 : 150) * workers;
            double want = load_eff / workers * step_factor[m], t, naive, ideal, eff, load_s;
            step_cfg step = {want, 0};
            pf_stats st;
            char name[64], v[48], lim[48];
            step.us = want - (calibrate(want) - want); /* aim for a step that lasts `want` */
            if (step.us < 1) step.us = 1;
            t = run_sleepy(&s, &step, workers, batches, &st, false);
            load_s = st.load_s;
            ideal = step.spent_s > load_s / workers ? step.spent_s : load_s / workers;
            eff = ideal / t;
            naive = naive_sleepy(&s, step.us, batches / 4) * 4; /* a quarter of the batches, scaled */
            printf("{\"bench\":\"overlap\",\"mix\":\"%s\",\"workers\":%u,\"batches\":%llu,\"load_ms\":%.3f,"
                   "\"step_ms\":%.3f,\"wall_s\":%.4f,\"ideal_s\":%.4f,\"efficiency\":%.3f,\"naive_s\":%.4f,"
                   "\"speedup\":%.2f,\"verdict\":\"%s\"}\n",
                   mix[m], workers, (unsigned long long)batches, load_s / batches * 1e3, step.spent_s / batches * 1e3,
                   t, ideal, eff, naive, naive / t, st.verdict);
            snprintf(name, sizeof name, "overlap %s, %u workers", mix[m], workers);
            snprintf(v, sizeof v, "%.3f s (naive %.3f s, %.2fx)", t, naive, naive / t);
            snprintf(lim, sizeof lim, "ideal %.3f s", ideal);
            add_row(name, v, lim, eff, ">= 0.97", eff >= 0.97);
        }
}

/* Throughput against one worker, and against this worker count's own ideal
   (workers / measured load time): sleeps overshoot less on a busier
   machine, so loads get shorter as workers are added and the first ratio
   alone can pass 1x per worker. The workers alone (cfg.workers_only): by
   default pf_next loads a batch its worker has only just begun, so "one
   worker" would be two loaders (1.5x one in a run of 2026-11-23). */
static void bench_scaling(void) {
    sleepy s = {8, 200};
    step_cfg step = {20, 0};
    double base = 0;
    for (unsigned workers = 1; workers <= 16; workers *= 2) {
        uint64_t batches = 80 * (uint64_t)workers; /* quick or not: shorter runs read 12-15x */
        pf_stats st;
        double t = run_sleepy(&s, &step, workers, batches, &st, true), thr = batches / t;
        double ideal = workers / (st.load_s / batches);
        char name[64], v[64], lim[48];
        if (workers == 1) base = thr;
        printf("{\"bench\":\"scaling\",\"workers\":%u,\"batches\":%llu,\"batches_per_s\":%.1f,\"vs_1_worker\":%.2f,"
               "\"ideal_batches_per_s\":%.1f,\"efficiency\":%.3f}\n",
               workers, (unsigned long long)batches, thr, thr / base, ideal, thr / ideal);
        snprintf(name, sizeof name, "scaling, %u worker%s", workers, workers > 1 ? "s" : "");
        snprintf(v, sizeof v, "%.0f batches/s = %.2fx one worker", thr, thr / base);
        snprintf(lim, sizeof lim, "ideal %.0f/s (W / load time)", ideal);
        add_row(name, v, lim, thr / ideal, workers == 16 ? ">= 14x one" : "", workers == 16 ? thr / base >= 14 : -1);
    }
}

/* ---------------------------------------------------------------------- */
/* 4b. autotune against every fixed worker count, on four load profiles   */

typedef struct profile {
    const char *name;
    double io_us, cpu_us, step_us; /* per batch: a sleep and CPU work in load; the step */
    uint32_t stall_every;          /* not 0: every this-many-th load sleeps io_us, the others only compute */
    uint64_t batches;              /* a run's (0: 600, 400 quick); the first quarter is left out */
} profile;

static double cpu_now(void) { /* this process's CPU time, all threads, to the ns (not rusage's ticks) */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void spin_cpu(double us) { /* real CPU work: the thread's own CPU clock must advance */
    struct timespec a, b;
    volatile uint64_t x = 1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    do {
        for (int i = 0; i < 2000; i++) x = x * 6364136223846793005u + 1442695040888963407u;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    } while ((double)(b.tv_sec - a.tv_sec) * 1e6 + (double)(b.tv_nsec - a.tv_nsec) * 1e-3 < us);
}

static int profile_load(void *user, pf_job *job) {
    const profile *p = (const profile *)user;
    if (p->io_us > 0 && (!p->stall_every || job->batch % p->stall_every == p->stall_every - 1)) sleep_us(p->io_us);
    if (p->cpu_us > 0) spin_cpu(p->cpu_us);
    job->bytes = 64;
    return 0;
}

static void at_log(void *user, int level, const char *msg) {
    (void)user;
    if (level == PF_LOG_DEBUG) fprintf(stderr, "    %s\n", msg);
}

typedef struct at_result {
    double thr, cpu;
    uint64_t settled; /* batch of autotune's last change */
    uint32_t active;
    uint32_t slots;   /* the most host slots with memory at once (autotune's ring grows and shrinks) */
    double rss_mib;   /* peak RSS of the run (VmHWM, reset before it) */
} at_result;

#define AT_BATCH_BYTES ((size_t)1 << 20) /* big enough that slots are memory */

static long vm_kib(const char *key);
static void reset_peak_rss(void) { /* Linux: "5" resets VmHWM to the current RSS */
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

/* batches in all; throughput and CPU time over the batches after `skip`,
   the same window for every setting */
static at_result run_profile(profile *p, unsigned workers, bool autotune, uint64_t batches, uint64_t skip) {
    pf_config cfg;
    pf_loader *l;
    at_result r = {0, 0, 0, 0, 0, 0};
    double t0 = 0, c0 = 0;
    uint64_t n = 0;
    pf_stats st;
    memset(&cfg, 0, sizeof cfg);
    cfg.load = profile_load;
    cfg.user = p;
    cfg.num_samples = batches;
    cfg.batch_size = 1;
    cfg.batch_bytes = AT_BATCH_BYTES;
    cfg.epochs = 1;
    cfg.num_workers = workers; /* the default ring for each: 2W+1, or what autotune grows */
    cfg.autotune = autotune;
    reset_peak_rss();
    if (getenv("AT_LOG")) cfg.log = at_log;
    if (pf_create(&cfg, &l) != PF_OK) die("pf_create", NULL);
    for (;;) {
        pf_batch b;
        pf_result x = pf_next(l, &b);
        if (x == PF_END_OF_EPOCH) break;
        if (x != PF_OK) die("pf_next", l);
        if (p->step_us > 0) sleep_us(p->step_us);
        pf_release(l, &b);
        if (++n == skip) t0 = now_s(), c0 = cpu_now();
        if (n % 8 == 0) { /* a block goes back only after 4 periods at a count: none is missed */
            pf_get_stats(l, &st);
            if (st.host_slots > r.slots) r.slots = st.host_slots;
        }
    }
    r.thr = (double)(batches - skip) / (now_s() - t0);
    r.cpu = cpu_now() - c0;
    r.settled = l->at.last_change_batch;
    r.active = l->at.active;
    pf_get_stats(l, &st);
    if (st.host_slots > r.slots) r.slots = st.host_slots;
    r.rss_mib = vm_kib("VmHWM:") / 1024.0;
    pf_destroy(l);
    return r;
}

/* Runs' figures as one: the median throughput and CPU time (a CPU time
   of some 20 ms moves by 15% between runs here), the latest settling and
   the most memory */
static double median_of(double *v, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: n is 5 at most */
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static at_result combine(at_result *r, int n) {
    double thr[8], cpu[8];
    at_result c = r[0];
    for (int i = 0; i < n; i++) {
        thr[i] = r[i].thr;
        cpu[i] = r[i].cpu;
        if (r[i].settled > c.settled) c.settled = r[i].settled;
        if (r[i].slots > c.slots) c.slots = r[i].slots;
        if (r[i].rss_mib > c.rss_mib) c.rss_mib = r[i].rss_mib;
    }
    c.thr = median_of(thr, n);
    c.cpu = median_of(cpu, n);
    return c;
}

/* three runs (one in quick mode) */
static at_result best_of(profile *p, unsigned workers, bool autotune, uint64_t batches, uint64_t skip) {
    at_result r[3];
    int n = quick ? 1 : 3;
    for (int i = 0; i < n; i++) r[i] = run_profile(p, workers, autotune, batches, skip);
    return combine(r, n);
}

static void bench_autotune(void) {
    profile profiles[] = {
        {"I/O-like", 4000, 0, 250, 0, 0},     /* a 4 ms read per batch, a short step */
        {"CPU-bound decode", 0, 1000, 100, 0, 0}, /* 1 ms of CPU per batch, 2 cores */
        {"compute-bound", 200, 0, 3000, 0, 0},    /* the step is far longer than the load */
        /* in order, a load in 8 misses the page cache: the ring, not the
           workers, bounds how far they get past each stall. 1 worker
           makes 1.5k batches/s here, and autotune's way to 16 (trials of
           2-3 periods of 20 ms) took most of a 600-batch run: 0.64 of 16
           fixed over batches 150-600 in one make bench, 0.99 in the next */
        {"stalls", 5000, 40, 0, 8, 2400},
    };
    for (size_t i = 0; i < sizeof profiles / sizeof profiles[0]; i++) {
        const uint64_t batches = profiles[i].batches ? profiles[i].batches : quick ? 400 : 600;
        const uint64_t skip = profiles[i].batches ? batches / 4 : 150;
        at_result fixed[5], a;
        unsigned counts[5] = {1, 2, 4, 8, 16};
        double best = 0, cpu_ref = 0;
        int mref = 4, cref = 4;
        char name[64], v[96], lim[64];
        for (int k = 0; k < 5; k++) {
            fixed[k] = best_of(&profiles[i], counts[k], false, batches, skip);
            if (fixed[k].thr > best) best = fixed[k].thr;
            printf("{\"bench\":\"autotune\",\"profile\":\"%s\",\"workers\":%u,\"batches_per_s\":%.1f,\"cpu_s\":%.3f,"
                   "\"slots\":%u,\"slot_MiB\":%.1f,\"peak_rss_MiB\":%.1f}\n",
                   profiles[i].name, counts[k], fixed[k].thr, fixed[k].cpu, fixed[k].slots,
                   fixed[k].slots * (AT_BATCH_BYTES / 1048576.0), fixed[k].rss_mib);
        }
        for (int k = 0; k < 5; k++) /* the smallest setting within 5% of the best */
            if (fixed[k].thr >= 0.95 * best) {
                cref = k;
                break;
            }
        /* autotune, and the CPU time's reference again, alternated, five
           of each, the least CPU time of each compared: a CPU time of
           17-29 ms (the compute-bound profile: the step's and the load's
           nanosleeps cost 15-22 us of CPU each in this VM, the loader 2-4
           us a batch) reads 18 or 29 ms by the run whatever runs, and
           drifts between the fixed runs early in the section and
           autotune's after them. Six alternated triples, 2026-11-25: 1
           fixed worker 17.3-29.2 ms, autotune 17.7-29.3; medians of five
           alternated still read 1.23 once, as three of one side's five
           came high. Noise only adds: the least is each one's own cost. */
        {
            at_result ra[5], rf[5];
            int n = quick ? 1 : 5;
            double least_a = 1e9, least_f = 1e9;
            for (int rep = 0; rep < n; rep++) {
                rf[rep] = run_profile(&profiles[i], counts[cref], false, batches, skip);
                ra[rep] = run_profile(&profiles[i], 16, true, batches, skip);
                if (rf[rep].cpu < least_f) least_f = rf[rep].cpu;
                if (ra[rep].cpu < least_a) least_a = ra[rep].cpu;
            }
            a = combine(ra, n);
            a.cpu = least_a;
            cpu_ref = least_f;
        }
        /* memory at equal throughput: the smallest fixed count within 5% of
           autotune's throughput (of the best, if autotune beat them all) */
        for (int k = 0; k < 5; k++)
            if (fixed[k].thr >= 0.95 * (a.thr < best ? a.thr : best)) {
                mref = k;
                break;
            }
        printf("{\"bench\":\"autotune\",\"profile\":\"%s\",\"workers\":\"auto\",\"settled_on\":%u,"
               "\"settled_at_batch\":%llu,\"batches_per_s\":%.1f,\"cpu_s\":%.3f,\"vs_best\":%.3f,\"cpu_vs_ref\":%.3f,"
               "\"slots\":%u,\"slot_MiB\":%.1f,\"peak_rss_MiB\":%.1f,\"slots_vs_ref\":%.3f}\n",
               profiles[i].name, a.active, (unsigned long long)a.settled, a.thr, a.cpu, a.thr / best, a.cpu / cpu_ref,
               a.slots, a.slots * (AT_BATCH_BYTES / 1048576.0), a.rss_mib, (double)a.slots / fixed[mref].slots);
        snprintf(name, sizeof name, "autotune %s: throughput", profiles[i].name);
        snprintf(v, sizeof v, "%.0f batches/s, %u workers (auto)", a.thr, a.active);
        snprintf(lim, sizeof lim, "best fixed: %.0f/s", best);
        add_row(name, v, lim, a.thr / best, ">= 0.95", a.thr / best >= 0.95);
        snprintf(name, sizeof name, "autotune %s: CPU time", profiles[i].name);
        snprintf(v, sizeof v, "%.3f s", a.cpu);
        snprintf(lim, sizeof lim, "smallest fixed within 5%%: %.3f s", cpu_ref); /* the least of five each */
        add_row(name, v, lim, a.cpu / cpu_ref, "<= 1.1", a.cpu / cpu_ref <= 1.1);
        snprintf(name, sizeof name, "autotune %s: slot memory", profiles[i].name);
        snprintf(v, sizeof v, "%u slots = %.0f MiB, peak RSS %.0f MiB", a.slots, a.slots * (AT_BATCH_BYTES / 1048576.0),
                 a.rss_mib);
        snprintf(lim, sizeof lim, "%u fixed: %u slots, RSS %.0f MiB", counts[mref], fixed[mref].slots,
                 fixed[mref].rss_mib);
        add_row(name, v, lim, (double)a.slots / fixed[mref].slots, "<= 1.25", a.slots <= 1.25 * fixed[mref].slots);
        /* loads that sleep: a failed trial is tried again after 8, 16, ...
           periods, so the count never settles for good there */
        if (profiles[i].stall_every) continue;
        snprintf(name, sizeof name, "autotune %s: settled", profiles[i].name);
        snprintf(v, sizeof v, "after batch %llu", (unsigned long long)a.settled);
        add_row(name, v, "", -1, "<= 300", a.settled <= 300);
    }
}

/* ---------------------------------------------------------------------- */
/* 5. memory: in a fresh child, peak RSS minus the dataset vs the slots    */

static long vm_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) v = atol(line + strlen(key));
    fclose(f);
    return v;
}

static unsigned touch_all(const pf_batch *b, void *arg) {
    unsigned acc = 0;
    (void)arg;
    for (size_t i = 0; i < b->bytes; i += 4096) acc += ((const unsigned char *)b->data)[i];
    return acc;
}

#define MEM_DATASET ((size_t)64 << 20)
#define MEM_ITEM 65536
/* Runs in a fresh process (bench --memory-child FD): loads two epochs of a
   64 MiB dataset through 4 workers, touching every byte, and reports its
   baseline and peak RSS and the slot bytes. */
static int memory_child(int fd) {
    const size_t dataset_bytes = MEM_DATASET, item = MEM_ITEM;
    const uint32_t batch = 64, workers = 4;
    {
        {
        dataset d;
        pf_config cfg, full;
        long base, peak;
        base = vm_kib("VmRSS:");
        d.item = item;
        d.nitems = dataset_bytes / item;
        d.data = (unsigned char *)malloc(dataset_bytes);
        memset(d.data, 3, dataset_bytes);
        memset(&cfg, 0, sizeof cfg);
        cfg.load = copy_load;
        cfg.user = &d;
        cfg.num_samples = d.nitems * 4;
        cfg.batch_size = batch;
        cfg.batch_bytes = batch * item;
        cfg.epochs = 2;
        cfg.num_workers = workers;
        cfg.backend = PF_BACKEND_HOST;
        full = pf_config_defaults(&cfg);
        consume(&cfg, touch_all, NULL, NULL);
        peak = vm_kib("VmHWM:");
        {
            char buf[256];
            int n = snprintf(buf, sizeof buf, "%ld %ld %llu\n", base, peak,
                             (unsigned long long)full.host_slots * full.batch_bytes);
            if (write(fd, buf, (size_t)n) != n) return 1;
        }
        return 0;
        }
    }
}

static void bench_memory(const char *self) {
    int fds[2];
    pid_t pid;
    const size_t dataset_bytes = MEM_DATASET;
    if (pipe(fds) != 0) return;
    pid = fork();
    if (pid == 0) {
        char fd[16];
        close(fds[0]);
        snprintf(fd, sizeof fd, "%d", fds[1]);
        execl(self, self, "--memory-child", fd, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    {
        char buf[256] = "";
        long base = 0, peak = 0;
        unsigned long long slots = 0;
        ssize_t n = read(fds[0], buf, sizeof buf - 1);
        close(fds[0]);
        waitpid(pid, NULL, 0);
        if (n > 0 && sscanf(buf, "%ld %ld %llu", &base, &peak, &slots) == 3) {
            double over = (peak * 1024.0 - (double)dataset_bytes - (double)slots) / (1 << 20);
            char v[48], lim[48];
            printf("{\"bench\":\"memory\",\"dataset_MiB\":%zu,\"slots_MiB\":%.1f,\"peak_rss_MiB\":%.1f,"
                   "\"process_baseline_MiB\":%.1f,\"overhead_MiB\":%.2f}\n",
                   dataset_bytes >> 20, slots / 1048576.0, peak / 1024.0, base / 1024.0, over);
            snprintf(v, sizeof v, "%.2f MiB beyond the slots", over);
            snprintf(lim, sizeof lim, "slots %.0f MiB, peak %.0f MiB", slots / 1048576.0, peak / 1024.0);
            add_row("memory: peak RSS - dataset - slots", v, lim, -1, "<= 8 MiB", over <= 8);
        }
    }
}

int main(int argc, char **argv) {
    char host[512] = "";
    FILE *f;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        if (!strcmp(argv[i], "--memory-child") && i + 1 < argc) return memory_child(atoi(argv[i + 1]));
        if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    }
    f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                snprintf(host, sizeof host, "%s", c ? c + 2 : line);
                host[strcspn(host, "\n")] = '\0';
                break;
            }
        fclose(f);
    }
    printf("{\"bench\":\"machine\",\"cpu\":\"%s\",\"cores\":%ld,\"quick\":%d}\n", host, sysconf(_SC_NPROCESSORS_ONLN),
           quick);
    if (want("copy")) bench_copy();
    if (want("handoff")) bench_handoff();
    if (want("cheap")) bench_cheap();
    if (want("overlap")) bench_overlap();
    if (want("scaling")) bench_scaling();
    if (want("autotune")) bench_autotune();
    if (want("memory")) bench_memory(argv[0]);
    printf("\nprefetch.h host backend on %s, %ld cores%s\n", host, sysconf(_SC_NPROCESSORS_ONLN),
           quick ? " (QUICK: shorter runs, noisier)" : "");
    printf("%-38s %-36s %-30s %-7s %-15s %s\n", "figure", "measured", "limit", "ratio", "target", "met");
    for (int i = 0; i < nrows; i++)
        printf("%-38s %-36s %-30s %-7s %-15s %s\n", rows[i].name, rows[i].value, rows[i].limit, rows[i].ratio,
               rows[i].target, rows[i].ok);
    return 0;
}
