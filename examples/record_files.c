/* record_files.c - the seed use case: training on a directory of record
   shards that grows while training runs.

   A producer thread keeps adding shard files of fixed-size records (as if
   samples were streamed in from a remote store) and evicting the oldest.
   Each epoch trains on the shards present when its planning starts: the
   records reader (pf_records_open with a path_fn) lists the directory once
   per epoch and keeps each shard's file descriptor open while a batch may
   need it, so a shard evicted mid-epoch stays readable (unlink keeps open
   files alive). Workers read records with pread, straight into the slots;
   no load callback is written here.

   With --check, every record is verified (header and checksum) and every
   epoch must deliver whole shards listed when it started, each record
   once; this is how `make test` runs it. It prints the raw
   throughput reached from the page cache and the loader's stats line.

   Build: cc -O2 -std=c11 examples/record_files.c -o record_files -lpthread
   Run:   ./record_files [--check] [--quick] [--dir DIR] [--block B]
   --block B reads in a block shuffle (cfg.shuffle_block = B, a window of
   4 blocks): runs of B records stay together, for storage past the page
   cache (see bench/cold_bench.c for what it buys there). */
#define _POSIX_C_SOURCE 200809L
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RECORD 4096            /* bytes per record: a 16-byte header, then the payload */
#define PER_SHARD 256          /* records per shard: 1 MiB files */
#define MAX_SHARDS 64
#define VIEWS 64               /* epochs in flight at most: host_slots + 2 */
#define SEEN_SHARDS 256        /* the ids one epoch lists span fewer than this */
#define MAGIC 0x5245434fu      /* "RECO" */

typedef struct header {
    uint32_t magic, shard, record, sum;
} header;

static uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

static uint32_t checksum(const unsigned char *p, size_t n) {
    uint32_t s = 2166136261u;
    for (size_t i = 0; i < n; i++) s = (s ^ p[i]) * 16777619u;
    return s;
}

/* ---- the producer: shards appear (write, then rename) and old ones go ---- */

typedef struct producer {
    char dir[256];
    int keep;            /* shards kept on disk */
    int interval_ms;
    int stop;
    uint32_t next;       /* next shard id */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
} producer;

static void shard_path(const producer *p, uint32_t id, const char *ext, char *out, size_t n) {
    snprintf(out, n, "%s/shard-%06u.%s", p->dir, id, ext);
}

static int write_shard(producer *p, uint32_t id) {
    char tmp[300], final[300];
    unsigned char rec[RECORD];
    FILE *f;
    shard_path(p, id, "tmp", tmp, sizeof tmp);
    shard_path(p, id, "rec", final, sizeof final);
    f = fopen(tmp, "wb");
    if (!f) return -1;
    for (uint32_t r = 0; r < PER_SHARD; r++) {
        header h;
        for (size_t i = sizeof h; i < RECORD; i++) rec[i] = (unsigned char)mix32(id * 7919u + r * 104729u + (uint32_t)i);
        h.magic = MAGIC;
        h.shard = id;
        h.record = r;
        h.sum = checksum(rec + sizeof h, RECORD - sizeof h);
        memcpy(rec, &h, sizeof h);
        if (fwrite(rec, RECORD, 1, f) != 1) break;
    }
    if (fclose(f) != 0) return -1;
    return rename(tmp, final); /* appears whole, or not at all */
}

static void *produce(void *arg) {
    producer *p = (producer *)arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        struct timespec dl;
        uint32_t id = p->next++;
        pthread_mutex_unlock(&p->mu);
        write_shard(p, id);
        if ((int)id >= p->keep) { /* evict the oldest */
            char old[300];
            shard_path(p, id - (uint32_t)p->keep, "rec", old, sizeof old);
            unlink(old);
        }
        pthread_mutex_lock(&p->mu);
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += (long)p->interval_ms * 1000000L;
        dl.tv_sec += dl.tv_nsec / 1000000000L;
        dl.tv_nsec %= 1000000000L;
        while (!p->stop && pthread_cond_timedwait(&p->cv, &p->mu, &dl) == 0) {}
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- the dataset: pf_records over the directory, listed once per epoch ---- */

typedef struct listing {
    int n;
    uint32_t id[MAX_SHARDS];
} listing;

typedef struct dataset {
    const char *dir;
    listing lists[VIEWS]; /* what epoch e listed, in lists[e % VIEWS] (for --check) */
    char path[300];       /* path_fn's answer: the reader opens it at once */
} dataset;

static int by_id(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The reader asks for epoch e's files once, as its planning starts (k = 0,
   1, ... until NULL): the shards present now, oldest first. A shard evicted
   between this listing and the reader's open is left out (and logged). */
static const char *shard_path_fn(void *user, uint64_t epoch, uint32_t k) {
    dataset *d = (dataset *)user;
    listing *v = &d->lists[epoch % VIEWS];
    if (k == 0) {
        DIR *dir = opendir(d->dir);
        uint32_t ids[MAX_SHARDS * 2];
        int n = 0;
        for (struct dirent *e; dir && (e = readdir(dir));) {
            unsigned id;
            char ext[8];
            if (sscanf(e->d_name, "shard-%6u.%3s", &id, ext) == 2 && !strcmp(ext, "rec") && n < MAX_SHARDS * 2)
                ids[n++] = id;
        }
        if (dir) closedir(dir);
        qsort(ids, (size_t)n, sizeof ids[0], by_id);
        v->n = n < MAX_SHARDS ? n : MAX_SHARDS;
        memcpy(v->id, ids, (size_t)v->n * sizeof ids[0]);
    }
    if ((int)k >= v->n) return NULL;
    snprintf(d->path, sizeof d->path, "%s/shard-%06u.rec", d->dir, v->id[k]);
    return d->path;
}

static int listed(const listing *v, uint32_t id) {
    for (int i = 0; i < v->n; i++)
        if (v->id[i] == id) return 1;
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int check = 0, quick = 0, bad = 0;
    uint32_t epochs, batch = 64, block = 0;
    char dir[256] = "";
    producer prod;
    dataset data;
    pf_config cfg = PF_CONFIG_INIT;
    pf_records_config rc;
    pf_records *records;
    pf_loader *l;
    unsigned char *seen = NULL, shard_seen[SEEN_SHARDS / 8] = {0};
    uint64_t nrec = 0, epoch_records = 0, epoch_n = 0, shards_seen = 0;
    double t0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) check = 1;
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) snprintf(dir, sizeof dir, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--block") && i + 1 < argc) block = (uint32_t)atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--check] [--quick] [--dir DIR] [--block B]\n", argv[0]);
            return 2;
        }
    }
    epochs = quick ? 6 : 40;
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/prefetch-records-XXXXXX");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            return 1;
        }
    }
    memset(&prod, 0, sizeof prod);
    snprintf(prod.dir, sizeof prod.dir, "%s", dir);
    prod.keep = 8;
    prod.interval_ms = 20;
    pthread_mutex_init(&prod.mu, NULL);
    pthread_cond_init(&prod.cv, NULL);
    for (int i = 0; i < 4; i++) write_shard(&prod, prod.next++); /* a head start */
    pthread_create(&prod.thread, NULL, produce, &prod);

    memset(&data, 0, sizeof data);
    data.dir = dir;
    memset(&rc, 0, sizeof rc);
    rc.path_fn = shard_path_fn; /* a list that grows (and shrinks) each epoch */
    rc.user = &data;
    rc.record_bytes = RECORD;
    cfg.batch_size = batch;     /* batch_bytes: the reader's default, batch * RECORD */
    cfg.epochs = epochs;
    cfg.shuffle = true;
    cfg.shuffle_block = block; /* 0: the sample shuffle */
    cfg.shuffle_window = 4;
    cfg.num_workers = 4;
    cfg.backend = PF_BACKEND_HOST;
    if (pf_records_open(&rc, &cfg, &records) != PF_OK || pf_create(&cfg, &l) != PF_OK) {
        fprintf(stderr, "%s\n", pf_error(NULL));
        return 1;
    }
    seen = (unsigned char *)calloc((size_t)SEEN_SHARDS * PER_SHARD, 1); /* by (shard id, record) */
    t0 = now_s();
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) {
            const listing *v = &data.lists[epoch_n % VIEWS];
            char line[256];
            /* every record of the shards it opened, once: whole shards */
            if (check && (epoch_records != shards_seen * PER_SHARD || shards_seen == 0 ||
                          (int)shards_seen > v->n)) {
                fprintf(stderr, "epoch %llu: %llu records delivered from %llu shards, %d listed at its start\n",
                        (unsigned long long)epoch_n, (unsigned long long)epoch_records,
                        (unsigned long long)shards_seen, v->n);
                bad++;
            }
            pf_stats_format(l, line, sizeof line);
            printf("epoch %llu: %d shards (ids %u..%u) present at its start, %llu records; %s\n",
                   (unsigned long long)epoch_n, v->n, v->n ? v->id[0] : 0, v->n ? v->id[v->n - 1] : 0,
                   (unsigned long long)epoch_records, line);
            epoch_n++;
            epoch_records = shards_seen = 0;
            memset(seen, 0, (size_t)SEEN_SHARDS * PER_SHARD);
            memset(shard_seen, 0, sizeof shard_seen);
            continue;
        }
        if (r == PF_END_OF_DATA) break;
        if (r != PF_OK) {
            fprintf(stderr, "pf_next: %s\n", pf_error(l));
            bad++;
            break;
        }
        if (check) { /* every record intact, from a shard listed for this epoch, once */
            const listing *v = &data.lists[b.epoch % VIEWS];
            for (uint32_t i = 0; i < b.count; i++) {
                const unsigned char *rec = (const unsigned char *)b.data + b.offsets[i];
                header h;
                uint64_t x = b.indices[i];
                size_t at;
                memcpy(&h, rec, sizeof h);
                at = (size_t)(h.shard % SEEN_SHARDS) * PER_SHARD + h.record % PER_SHARD;
                if (h.magic != MAGIC || !listed(v, h.shard) ||
                    h.record != x % PER_SHARD || h.sum != checksum(rec + sizeof h, RECORD - sizeof h) || seen[at]) {
                    fprintf(stderr, "epoch %llu: record %llu is wrong (shard %u record %u)\n",
                            (unsigned long long)b.epoch, (unsigned long long)x, h.shard, h.record);
                    bad++;
                    continue;
                }
                seen[at] = 1;
                if (!(shard_seen[h.shard % SEEN_SHARDS / 8] & (1u << (h.shard % 8)))) {
                    shard_seen[h.shard % SEEN_SHARDS / 8] |= (unsigned char)(1u << (h.shard % 8));
                    shards_seen++;
                }
            }
        }
        nrec += b.count;
        epoch_records += b.count;
        pf_release(l, &b);
    }
    t0 = now_s() - t0;
    pf_destroy(l);
    pf_records_close(records);
    pthread_mutex_lock(&prod.mu);
    prod.stop = 1;
    pthread_cond_signal(&prod.cv);
    pthread_mutex_unlock(&prod.mu);
    pthread_join(prod.thread, NULL);
    printf("%llu records (%.1f MB) in %.3f s: %.2f GB/s from the page cache with pread, 4 workers%s\n",
           (unsigned long long)nrec, nrec * (double)RECORD / 1e6, t0, nrec * (double)RECORD / t0 / 1e9,
           check ? (bad ? "; CHECK FAILED" : "; every record checked") : "");
    for (uint32_t id = 0; id < prod.next; id++) { /* clean up */
        char path[300];
        shard_path(&prod, id, "rec", path, sizeof path);
        unlink(path);
    }
    rmdir(dir);
    free(seen);
    return bad ? 1 : 0;
}
