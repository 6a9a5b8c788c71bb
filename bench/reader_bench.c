/* reader_bench.c - the readers against a plain pread loop of the same bytes.

   For each reader (records in order and shuffled, records with O_DIRECT,
   llm.c token shards, a tar shard) the same reads are made by a plain loop
   with no loader: one thread, then as many threads as the loader has
   workers, each thread preading whole batches into its own buffer (records
   in order: one pread per run of consecutive records in a file, as the
   reader does). The loader's consumer takes each batch and releases it at
   once, so the figure is the reader's own cost. Both sides write into
   SLOTS (16) batch buffers in turn: the loader's host slots, and as many
   buffers for the plain loop, so neither reads into a buffer that stays in
   cache while the other cannot. Each run reads the data 4 times (once in
   --quick and with O_DIRECT), and the loader's clock starts before
   pf_create. GB/s and samples/s, best of five interleaved runs; the ratio
   is reader / plain loop with the same number of threads ("auto":
   autotune, against a plain thread per core). "pf_next": the share of
   the batches pf_next loaded itself, on the caller's thread, which it does
   by default when loads are cheap and the next batch is not ready (the
   loader's threads are then its workers and the caller). Target: records
   (page cache) >= 0.9 of the plain loop.

   Build: cc -O2 -std=c11 bench/reader_bench.c -o reader_bench -lpthread
   Run:   ./reader_bench [--quick] [--dir DIR] [--only records|tokens|tar] */
#define _GNU_SOURCE /* O_DIRECT */
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define RECORD 4096u
#define BATCH 64u
#define FILES 4u
#define SLOTS 16u /* the loader's host slots, and the plain loop's buffers */

/* Each run reads the data this many times (the loader: epochs; the plain
   loop: its plan again), so that a run lasts long enough for autotune's
   first decisions and pf_create's start is a small part of it. O_DIRECT
   runs read it once: they are slow enough. */
static unsigned epochs = 4;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the plain loop: batches of reads, spread over threads ---- */
typedef struct rd {
    int fd;
    uint64_t off;
    size_t len;
} rd;
typedef struct plan {
    rd *v;
    size_t n, cap;
    size_t *batch_start; /* reads of batch b: [batch_start[b], batch_start[b+1]) */
    size_t nbatches, bcap;
    size_t max_batch_bytes;
    uint64_t bytes, samples;
    uint32_t batch_size; /* samples per batch, for the hand-written load */
    bool shuffled;
} plan;

static void plan_batch(plan *p) {
    if (p->nbatches + 2 > p->bcap) {
        p->bcap = p->bcap ? 2 * p->bcap : 1024;
        p->batch_start = (size_t *)realloc(p->batch_start, p->bcap * sizeof(size_t));
    }
    p->batch_start[p->nbatches++] = p->n;
    p->batch_start[p->nbatches] = p->n;
}
static void plan_read(plan *p, int fd, uint64_t off, size_t len) {
    size_t b = p->nbatches - 1, sum = 0;
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 4096;
        p->v = (rd *)realloc(p->v, p->cap * sizeof(rd));
    }
    p->v[p->n].fd = fd;
    p->v[p->n].off = off;
    p->v[p->n++].len = len;
    p->batch_start[b + 1] = p->n;
    for (size_t i = p->batch_start[b]; i < p->n; i++) sum += p->v[i].len;
    if (sum > p->max_batch_bytes) p->max_batch_bytes = sum;
    p->bytes += len;
}

typedef struct plain_run {
    const plan *p;
    size_t next, stride, reps; /* the plan reps times */
    unsigned char *bufs; /* SLOTS batch buffers, batch b into b % SLOTS: the loader's footprint */
    int direct;
    pthread_mutex_t mu;
} plain_run;

static void *plain_thread(void *arg) {
    plain_run *r = (plain_run *)arg;
    for (;;) {
        size_t b, at = 0;
        unsigned char *buf;
        pthread_mutex_lock(&r->mu);
        b = r->next++;
        pthread_mutex_unlock(&r->mu);
        if (b >= r->p->nbatches * r->reps) break;
        b %= r->p->nbatches;
        buf = r->bufs + (b % SLOTS) * r->stride;
        for (size_t i = r->p->batch_start[b]; i < r->p->batch_start[b + 1]; i++) {
            const rd *x = &r->p->v[i];
            if (pread(x->fd, buf + at, x->len, (off_t)x->off) != (ssize_t)x->len) {
                fprintf(stderr, "plain loop: short read\n");
                exit(1);
            }
            at += r->direct ? (x->len + 4095) / 4096 * 4096 : x->len;
        }
    }
    return NULL;
}

static double plain(const plan *p, unsigned threads, int direct) {
    plain_run r;
    pthread_t t[16];
    double t0;
    void *raw;
    memset(&r, 0, sizeof r);
    r.p = p;
    r.direct = direct;
    r.reps = direct ? 1 : epochs;
    r.stride = (p->max_batch_bytes + 2 * 4096) / 4096 * 4096;
    raw = malloc(SLOTS * r.stride + 4096);
    r.bufs = (unsigned char *)raw + (4096 - (uintptr_t)raw % 4096) % 4096;
    memset(r.bufs, 1, SLOTS * r.stride); /* resident, as the loader's slots are */
    pthread_mutex_init(&r.mu, NULL);
    t0 = now_s();
    for (unsigned i = 0; i < threads; i++) pthread_create(&t[i], NULL, plain_thread, &r);
    for (unsigned i = 0; i < threads; i++) pthread_join(t[i], NULL);
    t0 = now_s() - t0;
    pthread_mutex_destroy(&r.mu);
    free(raw);
    return t0;
}

/* ---- the loader over a reader: take each batch and give it back ---- */
/* The share of the last drain's batches that pf_next loaded itself (it
   does when loads are cheap and the next batch is not ready, unless
   cfg.workers_only): the loader's threads are its workers and, for that
   share, the caller's. */
static double drained_by_next;
static double drain(pf_config *cfg, uint64_t *bytes) {
    pf_loader *l;
    double t0;
    *bytes = 0;
    /* from before pf_create: its workers start loading before it returns,
       and with more workers than cores they may load most of a short run
       before this thread runs again (the plain loop's clock starts before
       its threads do). The loader pays for touching its slots; the plain
       loop touches its buffers before its clock starts. */
    t0 = now_s();
    if (pf_create(cfg, &l) != PF_OK) {
        fprintf(stderr, "pf_create: %s\n", pf_error(NULL));
        exit(1);
    }
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r == PF_END_OF_DATA) break;
        if (r != PF_OK) {
            fprintf(stderr, "pf_next: %s\n", pf_error(l));
            exit(1);
        }
        *bytes += b.bytes;
        pf_release(l, &b);
    }
    t0 = now_s() - t0;
    {
        pf_stats st;
        pf_get_stats(l, &st);
        drained_by_next = st.batches ? (double)st.next_loads / (double)st.batches : 0;
    }
    pf_destroy(l);
    return t0;
}

/* ---- a hand-written load making the plan's reads: the loader without a reader ---- */
static int hand_load(void *user, pf_job *job) {
    const plan *p = (const plan *)user;
    size_t at = 0;
    for (size_t i = p->batch_start[job->batch]; i < p->batch_start[job->batch + 1]; i++) {
        const rd *x = &p->v[i];
        if (pread(x->fd, (unsigned char *)job->host + at, x->len, (off_t)x->off) != (ssize_t)x->len)
            return pf_job_fail(job, "short read");
        at += x->len;
    }
    job->bytes = at;
    return 0;
}

/* every measured loader: one epoch on the host backend, w workers, SLOTS host slots */
static pf_config run_config(uint32_t batch_size, unsigned w) {
    pf_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.batch_size = batch_size;
    cfg.epochs = epochs;
    cfg.num_workers = w; /* 0: autotune, up to its ceiling */
    cfg.autotune = w == 0;
    cfg.host_slots = SLOTS;
    cfg.backend = PF_BACKEND_HOST;
    return cfg;
}

/* a reader's open: on failure, its message and out */
static void opened(pf_result r) {
    if (r != PF_OK) {
        fprintf(stderr, "%s\n", pf_error(NULL));
        exit(1);
    }
}

static double hand(const plan *p, unsigned w, uint32_t batch_size) {
    pf_config cfg = run_config(batch_size, w);
    uint64_t bytes;
    cfg.load = hand_load;
    cfg.user = (void *)p;
    cfg.num_samples = p->samples;
    cfg.batch_bytes = p->max_batch_bytes;
    cfg.shuffle = p->shuffled;
    cfg.seed = 3;
    return drain(&cfg, &bytes);
}

/* ---- the data ---- */
static void write_file(const char *path, const void *head, size_t head_n, uint64_t bytes) {
    FILE *f = fopen(path, "wb");
    static unsigned char chunk[1 << 16];
    for (size_t i = 0; i < sizeof chunk; i++) chunk[i] = (unsigned char)(i * 131 + 7);
    if (head_n) fwrite(head, 1, head_n, f);
    while (bytes) {
        size_t n = bytes < sizeof chunk ? (size_t)bytes : sizeof chunk;
        fwrite(chunk, 1, n, f);
        bytes -= n;
    }
    fclose(f);
}

static void warm(const char *path) { /* into the page cache */
    int fd = open(path, O_RDONLY);
    static unsigned char buf[1 << 20];
    while (fd >= 0 && read(fd, buf, sizeof buf) > 0) {}
    if (fd >= 0) close(fd);
}

typedef struct result {
    const char *what;
    unsigned workers;
    double reader_gbs, plain_gbs, plain1_gbs, hand_gbs, samples_s;
    double by_next; /* the share of the reader's batches pf_next loaded (best run) */
} result;

static result results[64];
static int nresults;

static void report(const char *what, unsigned w, uint64_t bytes, uint64_t samples, double reader_s, double plain_s,
                   double plain1_s, double hand_s, double by_next) {
    result *r = &results[nresults++];
    r->what = what;
    r->by_next = by_next;
    r->workers = w;
    r->reader_gbs = (double)bytes / reader_s / 1e9;
    r->plain_gbs = (double)bytes / plain_s / 1e9;
    r->plain1_gbs = (double)bytes / plain1_s / 1e9;
    r->hand_gbs = (double)bytes / hand_s / 1e9;
    r->samples_s = (double)samples / reader_s;
    char hand[96] = "\"hand_load_GBps\":null,\"ratio_to_hand_load\":null"; /* O_DIRECT: no hand load */
    if (r->hand_gbs >= 1e-20)
        snprintf(hand, sizeof hand, "\"hand_load_GBps\":%.3f,\"ratio_to_hand_load\":%.3f", r->hand_gbs,
                 r->reader_gbs / r->hand_gbs);
    printf("{\"bench\":\"readers\",\"reader\":\"%s\",\"workers\":%u,\"reader_GBps\":%.3f,\"plain_GBps\":%.3f,"
           "\"plain_1thread_GBps\":%.3f,\"samples_per_s\":%.0f,\"ratio\":%.3f,%s,\"pf_next_share\":%.3f}\n",
           what, w, r->reader_gbs, r->plain_gbs, r->plain1_gbs, r->samples_s, r->reader_gbs / r->plain_gbs, hand,
           by_next);
    fflush(stdout);
}

/* best of REPS, interleaved: reader, plain with w threads, plain with 1,
   the loader with a hand-written load of the same reads */
#define REPS 5
typedef double (*reader_fn)(void *ctx, unsigned workers, uint64_t *bytes);
static void measure(const char *what, reader_fn fn, void *ctx, const plan *p, unsigned w, int direct) {
    double best_r = 1e30, best_p = 1e30, best_1 = 1e30, best_h = 1e30, by_next = 0;
    uint64_t bytes = 0, want = p->bytes * (direct ? 1 : epochs);
    for (int k = 0; k < REPS; k++) {
        unsigned pw = w ? w : (unsigned)sysconf(_SC_NPROCESSORS_ONLN);
        double a = fn(ctx, w, &bytes), share = drained_by_next, b = plain(p, pw > 16 ? 16 : pw, direct),
               c = plain(p, 1, direct);
        double h = direct ? 1e30 : hand(p, w, p->batch_size);
        if (bytes != want) break; /* checked below, each run */
        if (a < best_r) best_r = a, by_next = share;
        if (b < best_p) best_p = b;
        if (c < best_1) best_1 = c;
        if (h < best_h) best_h = h;
    }
    if (bytes != want) {
        fprintf(stderr, "%s: the reader delivered %llu bytes, the plain loop reads %llu\n", what,
                (unsigned long long)bytes, (unsigned long long)want);
        exit(1);
    }
    report(what, w, bytes, p->samples * (direct ? 1 : epochs), best_r, best_p, best_1, best_h, by_next);
}

/* measure with each worker count, then let the plan go */
/* 0: autotune, against the plain loop with a thread per core */
static const unsigned workers[] = {1, 2, 4, 0};
static void measure_all(const char *what, reader_fn fn, void *ctx, plan *p, int direct) {
    for (size_t w = 0; w < sizeof workers / sizeof workers[0]; w++) measure(what, fn, ctx, p, workers[w], direct);
    free(p->v);
    free(p->batch_start);
}

/* records */
typedef struct rec_ctx {
    const char **paths;
    uint64_t per_file;
    int shuffle, direct;
} rec_ctx;

static double rec_reader(void *ctx, unsigned w, uint64_t *bytes) {
    rec_ctx *c = (rec_ctx *)ctx;
    pf_records_config rc;
    pf_records *r;
    pf_config cfg = run_config(BATCH, w);
    double t;
    memset(&rc, 0, sizeof rc);
    rc.paths = c->paths;
    rc.num_paths = FILES;
    rc.record_bytes = RECORD;
    rc.direct = c->direct != 0;
    if (c->direct) cfg.epochs = 1;
    cfg.shuffle = c->shuffle != 0;
    cfg.seed = 3;
    opened(pf_records_open(&rc, &cfg, &r));
    t = drain(&cfg, bytes);
    pf_records_close(r);
    return t;
}

/* The same reads as the records reader: the loader's own sample order
   (pf's permutation, taken from a one-worker run's batches). */
static int order_load(void *user, pf_job *job) { /* loads nothing: only the order is wanted */
    (void)user;
    job->bytes = 0;
    return 0;
}

static void rec_plan(plan *p, const int *fds, uint64_t per_file, int shuffle) {
    pf_config cfg;
    pf_loader *l;
    memset(p, 0, sizeof *p);
    p->batch_size = BATCH;
    p->shuffled = shuffle != 0;
    if (!shuffle) {
        uint64_t n = per_file * FILES;
        for (uint64_t first = 0; first < n; first += BATCH) {
            uint64_t last = first + BATCH < n ? first + BATCH : n;
            plan_batch(p);
            for (uint64_t x = first; x < last;) {
                uint64_t f = x / per_file, end = (f + 1) * per_file < last ? (f + 1) * per_file : last;
                plan_read(p, fds[f], (x % per_file) * RECORD, (size_t)(end - x) * RECORD);
                x = end;
            }
            p->samples += last - first;
        }
        return;
    }
    /* shuffled: the loader's own order, from a loader that loads nothing */
    memset(&cfg, 0, sizeof cfg);
    cfg.num_samples = per_file * FILES;
    cfg.batch_size = BATCH;
    cfg.batch_bytes = 8;
    cfg.epochs = 1;
    cfg.shuffle = true;
    cfg.seed = 3;
    cfg.num_workers = 1;
    cfg.backend = PF_BACKEND_HOST;
    cfg.load = order_load;
    if (pf_create(&cfg, &l) != PF_OK) exit(1);
    for (;;) {
        pf_batch b;
        if (pf_next(l, &b) != PF_OK) break;
        plan_batch(p);
        for (uint32_t i = 0; i < b.count; i++) {
            uint64_t x = b.indices[i];
            plan_read(p, fds[x / per_file], (x % per_file) * RECORD, RECORD);
        }
        p->samples += b.count;
        pf_release(l, &b);
    }
    pf_destroy(l);
}

/* tokens: llm.c shards */
typedef struct tok_ctx {
    const char **paths;
    uint32_t B, T;
} tok_ctx;
static double tok_reader(void *ctx, unsigned w, uint64_t *bytes) {
    tok_ctx *c = (tok_ctx *)ctx;
    pf_tokens_config tc;
    pf_tokens *t;
    pf_config cfg = run_config(1, w);
    double s;
    memset(&tc, 0, sizeof tc);
    tc.paths = c->paths;
    tc.num_paths = 2;
    tc.B = c->B;
    tc.T = c->T;
    opened(pf_tokens_open(&tc, &cfg, &t));
    s = drain(&cfg, bytes);
    pf_tokens_close(t);
    return s;
}

/* tar: KEY.bin (SAMPLE_BIN bytes) + KEY.cls (4 bytes) */
#define SAMPLE_BIN (100u * 1024u)
typedef struct tar_ctx {
    const char **paths;
} tar_ctx;
static double tar_reader(void *ctx, unsigned w, uint64_t *bytes) {
    tar_ctx *c = (tar_ctx *)ctx;
    pf_tar_config tc;
    pf_tar *t;
    pf_config cfg = run_config(16, w);
    double s;
    memset(&tc, 0, sizeof tc);
    tc.paths = c->paths;
    tc.num_paths = 1;
    opened(pf_tar_open(&tc, &cfg, &t));
    s = drain(&cfg, bytes);
    pf_tar_close(t);
    return s;
}
static void tar_header(FILE *f, const char *name, uint64_t size) {
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
    h[156] = '0';
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    for (int i = 0; i < 512; i++) sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    fwrite(h, 1, 512, f);
}
/* a file entry: its header, its bytes, zeros to the next 512-byte block */
static void tar_entry(FILE *f, const char *name, const void *p, size_t n) {
    static const unsigned char zero[512];
    tar_header(f, name, n);
    fwrite(p, 1, n, f);
    fwrite(zero, 1, (512 - n % 512) % 512, f);
}

int main(int argc, char **argv) {
    int quick = 0;
    const char *only = ""; /* --only records|tokens|tar: that reader alone */
    char dir[256] = "build", base[300], paths[4][400];
    const char *pp[4] = {paths[0], paths[1], paths[2], paths[3]};
    int fds[4], dfds[4] = {-1, -1, -1, -1};
    uint64_t per_file;
    plan p;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1, epochs = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) snprintf(dir, sizeof dir, "%s", argv[++i]);
    }
    snprintf(base, sizeof base, "%s/reader_bench_XXXXXX", dir);
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        return 1;
    }
    per_file = (quick ? (16u << 20) : (64u << 20)) / RECORD;
    printf("readers against a plain pread loop of the same bytes (%s, %u files of %llu MiB)\n",
           quick ? "quick" : "full", FILES, (unsigned long long)(per_file * RECORD >> 20));

    /* ---- records ---- */
    for (unsigned f = 0; f < FILES && (!*only || !strcmp(only, "records")); f++) {
        snprintf(paths[f], sizeof paths[f], "%s/rec%u.bin", base, f);
        write_file(paths[f], NULL, 0, per_file * RECORD);
        warm(paths[f]);
        fds[f] = open(paths[f], O_RDONLY);
        dfds[f] = open(paths[f], O_RDONLY | O_DIRECT);
    }
    for (int shuffle = 0; shuffle < 2 && (!*only || !strcmp(only, "records")); shuffle++) {
        rec_ctx c = {pp, per_file, shuffle, 0};
        rec_plan(&p, fds, per_file, shuffle);
        measure_all(shuffle ? "records, shuffled (page cache)" : "records, in order (page cache)", rec_reader, &c,
                    &p, 0);
    }
    if (*only && strcmp(only, "records")) {
        /* not measured */
    } else if (dfds[0] >= 0) {
        rec_ctx c = {pp, per_file, 0, 1};
        rec_plan(&p, dfds, per_file, 0);
        measure_all("records, in order, O_DIRECT", rec_reader, &c, &p, 1);
    } else {
        printf("(O_DIRECT refused by the file system at %s: skipped)\n", base);
    }
    for (unsigned f = 0; f < FILES && (!*only || !strcmp(only, "records")); f++) {
        close(fds[f]);
        if (dfds[f] >= 0) close(dfds[f]);
        unlink(paths[f]);
    }

    /* ---- llm.c token shards: 2 shards, B=8, T=1024 ---- */
    if (!*only || !strcmp(only, "tokens")) {
        tok_ctx c = {pp, 8, 1024};
        uint64_t ntok = (quick ? (16u << 20) : (64u << 20)) / 2, bt = 8 * 1024;
        memset(&p, 0, sizeof p);
        p.batch_size = 1;
        for (int s = 0; s < 2; s++) {
            int32_t h[256];
            memset(h, 0, sizeof h);
            h[0] = 20240520;
            h[1] = 1;
            h[2] = (int32_t)ntok;
            snprintf(paths[s], sizeof paths[s], "%s/tok%d.bin", base, s);
            write_file(paths[s], h, sizeof h, ntok * 2);
            warm(paths[s]);
            fds[s] = open(paths[s], O_RDONLY);
            for (uint64_t k = 0; k < (ntok - 1) / bt; k++) {
                plan_batch(&p);
                plan_read(&p, fds[s], 1024 + k * bt * 2, (size_t)(bt + 1) * 2);
                p.samples++;
            }
        }
        measure_all("llm.c tokens, B=8 T=1024 (page cache)", tok_reader, &c, &p, 0);
        for (int s = 0; s < 2; s++) {
            close(fds[s]);
            unlink(paths[s]);
        }
    }

    /* ---- a tar shard of 100 KiB samples with a label ---- */
    if (!*only || !strcmp(only, "tar")) {
        tar_ctx c = {pp};
        uint64_t n = (quick ? (32u << 20) : (128u << 20)) / SAMPLE_BIN, off = 0;
        static unsigned char data[SAMPLE_BIN], zero[1024];
        FILE *f;
        snprintf(paths[0], sizeof paths[0], "%s/shard.tar", base);
        f = fopen(paths[0], "wb");
        for (size_t i = 0; i < SAMPLE_BIN; i++) data[i] = (unsigned char)(i * 7);
        memset(&p, 0, sizeof p);
        p.batch_size = 16;
        fds[0] = open(paths[0], O_RDONLY | O_CREAT, 0644);
        for (uint64_t k = 0; k < n; k++) {
            char name[64];
            uint32_t cls = (uint32_t)k;
            if (k % 16 == 0) plan_batch(&p);
            snprintf(name, sizeof name, "s/%08llu.bin", (unsigned long long)k);
            tar_entry(f, name, data, SAMPLE_BIN);
            plan_read(&p, fds[0], off + 512, SAMPLE_BIN);
            off += 512 + (SAMPLE_BIN + 511) / 512 * 512;
            snprintf(name, sizeof name, "s/%08llu.cls", (unsigned long long)k);
            tar_entry(f, name, &cls, 4);
            plan_read(&p, fds[0], off + 512, 4);
            off += 1024;
            p.samples++;
        }
        fwrite(zero, 1, sizeof zero, f);
        fclose(f);
        warm(paths[0]);
        measure_all("tar, 100 KiB + label (page cache)", tar_reader, &c, &p, 0);
        close(fds[0]);
        unlink(paths[0]);
    }
    rmdir(base);

    printf("\n%-40s %7s %11s %11s %11s %11s %11s %7s %6s %6s\n", "reader", "threads", "reader GB/s", "plain GB/s",
           "plain 1 thr", "hand load", "samples/s", "pf_next", "ratio", "/hand");
    for (int i = 0; i < nresults; i++) {
        const result *r = &results[i];
        int target = !strncmp(r->what, "records, in order (page", 23);
        char w[16];
        if (r->workers) snprintf(w, sizeof w, "%u", r->workers);
        else snprintf(w, sizeof w, "auto");
        char hand[16] = "-", ratio[16] = "-"; /* O_DIRECT: no hand load */
        if (r->hand_gbs >= 1e-20) {
            snprintf(hand, sizeof hand, "%.2f", r->hand_gbs);
            snprintf(ratio, sizeof ratio, "%.2f", r->reader_gbs / r->hand_gbs);
        }
        printf("%-40s %7s %11.2f %11.2f %11.2f %11s %11.0f %6.0f%% %6.2f %6s%s\n", r->what, w, r->reader_gbs,
               r->plain_gbs, r->plain1_gbs, hand, r->samples_s, 100 * r->by_next, r->reader_gbs / r->plain_gbs, ratio,
               !target ? "" : r->workers ? " (target >= 0.90)" : " (plain: a thread per core)");
    }
    return 0;
}
