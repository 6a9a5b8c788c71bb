/* cold_bench.c - 4 KiB records read past the page cache: sequential order,
   the sample-level shuffle, and the block shuffle at a few block sizes,
   with the same loader, workers and batch size, in one run.

   The records live in one file read with O_DIRECT where the filesystem
   allows it (else the file's pages are dropped from the cache before each
   run with posix_fadvise, and the bench says so). The load callback reads a
   batch's records in as few preads as it can: it sorts the batch's
   indices, merges those within GAP records of each other into one run
   (reading the gap too), and scatters the records into the slot in batch
   order. A block shuffle makes those runs long; a sample shuffle makes
   every record a random 4 KiB read.

   Prints JSON lines, then a table with the ratios against the targets:
   block >= 0.8 x sequential, block >= 5 x sample shuffle, and at least
   300 MB/s of 4 KiB records from cold storage.

   Build: cc -O2 -std=c11 bench/cold_bench.c -o cold_bench -lpthread
   Run:   ./cold_bench [--quick] [--dir DIR] */
#define _GNU_SOURCE /* O_DIRECT */
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define RECORD 4096u
#define BATCH 128u
#define GAP 16u      /* records: read through gaps up to this long   */
#define MAXRUN 1024u /* records per pread at most (4 MiB)            */
#define WORKERS 2u

typedef struct store {
    int fd;
    bool direct;
    unsigned char *bufs[WORKERS + 1]; /* per worker and pf_next's (job->worker == WORKERS), aligned for O_DIRECT */
} store;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int load(void *user, pf_job *job) {
    store *st = (store *)user;
    unsigned char *buf = st->bufs[job->worker], *out = (unsigned char *)job->host;
    uint64_t sorted[BATCH];
    uint32_t i = 0;
    memcpy(sorted, job->indices, job->count * sizeof(uint64_t));
    qsort(sorted, job->count, sizeof(uint64_t), cmp_u64);
    while (i < job->count) { /* one run: sorted[i] .. last, gaps of at most GAP */
        uint64_t first = sorted[i], last = first;
        uint32_t j = i + 1;
        while (j < job->count && sorted[j] - last <= GAP && sorted[j] - first < MAXRUN) last = sorted[j++];
        size_t bytes = (size_t)(last - first + 1) * RECORD;
        if (pread(st->fd, buf, bytes, (off_t)(first * RECORD)) != (ssize_t)bytes)
            return pf_job_fail(job, "pread of records %llu..%llu failed", (unsigned long long)first,
                               (unsigned long long)last);
        for (uint32_t k = 0; k < job->count; k++) /* scatter, in batch order */
            if (job->indices[k] >= first && job->indices[k] <= last)
                memcpy(out + (size_t)k * RECORD, buf + (size_t)(job->indices[k] - first) * RECORD, RECORD);
        i = j;
    }
    for (uint32_t k = 0; k < job->count; k++) /* each record starts with its index */
        if (*(const uint64_t *)(out + (size_t)k * RECORD) != job->indices[k])
            return pf_job_fail(job, "record %llu holds the wrong data", (unsigned long long)job->indices[k]);
    job->bytes = (size_t)job->count * RECORD;
    return 0;
}

typedef struct mode {
    const char *name;
    bool shuffle;
    uint32_t block, window;
} mode;

static double run(store *st, const char *path, uint64_t n, const mode *m, pf_stats *out) {
    pf_config cfg;
    pf_loader *l;
    double t0;
    if (!st->direct) { /* no O_DIRECT here: drop the file's cached pages */
        fdatasync(st->fd);
        posix_fadvise(st->fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    (void)path;
    memset(&cfg, 0, sizeof cfg);
    cfg.load = load;
    cfg.user = st;
    cfg.num_samples = n;
    cfg.batch_size = BATCH;
    cfg.batch_bytes = (size_t)BATCH * RECORD;
    cfg.epochs = 1;
    cfg.num_workers = WORKERS;
    cfg.backend = PF_BACKEND_HOST;
    cfg.shuffle = m->shuffle;
    cfg.shuffle_block = m->block;
    cfg.shuffle_window = m->window;
    cfg.seed = 7;
    if (pf_create(&cfg, &l) != PF_OK) {
        fprintf(stderr, "cold_bench: %s\n", pf_error(NULL));
        exit(1);
    }
    t0 = now_s();
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) break;
        if (r != PF_OK) {
            fprintf(stderr, "cold_bench: %s\n", pf_error(l));
            exit(1);
        }
        pf_release(l, &b);
    }
    t0 = now_s() - t0;
    pf_get_stats(l, out);
    pf_destroy(l);
    return (double)n / t0;
}

int main(int argc, char **argv) {
    const char *dir = "build";
    char path[512];
    int quick = 0;
    uint64_t n;
    store st;
    const mode modes[] = {
        {"sequential", false, 0, 0},
        {"sample shuffle", true, 0, 0},
        /* windows of block x window = one batch: each batch reads whole blocks */
        {"block 16 x window 8", true, 16, 8},
        {"block 32 x window 4", true, 32, 4},
        {"block 64 x window 2", true, 64, 2},
        {"block 128 x window 1", true, 128, 1},
    };
    const int nm = (int)(sizeof modes / sizeof modes[0]);
    double rate[8];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    }
    n = quick ? 16384 : 65536; /* 64 MiB or 256 MiB of records */
    snprintf(path, sizeof path, "%s/cold_records.bin", dir);
    { /* write the records: each starts with its own index */
        int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
        unsigned char *rec = (unsigned char *)calloc(1024, RECORD);
        if (fd < 0 || !rec) {
            fprintf(stderr, "cold_bench: cannot write %s\n", path);
            return 1;
        }
        for (uint64_t i = 0; i < n; i += 1024) {
            for (uint64_t k = 0; k < 1024; k++) *(uint64_t *)(rec + k * RECORD) = i + k;
            if (write(fd, rec, (size_t)1024 * RECORD) != (ssize_t)(1024 * RECORD)) return 1;
        }
        fsync(fd);
        close(fd);
        free(rec);
    }
    st.fd = open(path, O_RDONLY | O_DIRECT);
    st.direct = st.fd >= 0;
    if (!st.direct) st.fd = open(path, O_RDONLY);
    for (unsigned w = 0; w <= WORKERS; w++)
        if (posix_memalign((void **)&st.bufs[w], 4096, (size_t)MAXRUN * RECORD) != 0) return 1;
    printf("{\"bench\":\"cold_storage\",\"records\":%llu,\"record_bytes\":%u,\"batch\":%u,\"workers\":%u,"
           "\"read\":\"%s\"}\n",
           (unsigned long long)n, RECORD, BATCH, WORKERS,
           st.direct ? "O_DIRECT" : "page cache dropped with posix_fadvise before each run");
    for (int i = 0; i < nm; i++) {
        pf_stats s;
        rate[i] = run(&st, path, n, &modes[i], &s);
        printf("{\"bench\":\"cold_storage\",\"order\":\"%s\",\"records_per_s\":%.0f,\"MBps\":%.1f,\"waited\":%.3f}\n",
               modes[i].name, rate[i], rate[i] * RECORD / 1e6, s.elapsed_s > 0 ? s.wait_s / s.elapsed_s : 0);
    }
    {
        double best_block = 0;
        for (int i = 2; i < nm; i++)
            if (rate[i] > best_block) best_block = rate[i];
        printf("\ncold storage, 4 KiB records, %u workers, batches of %u, %s:\n", WORKERS, BATCH,
               st.direct ? "O_DIRECT" : "page cache dropped before each run");
        for (int i = 0; i < nm; i++)
            printf("  %-22s %9.0f records/s  %7.1f MB/s  %5.2f x sequential\n", modes[i].name, rate[i],
                   rate[i] * RECORD / 1e6, rate[i] / rate[0]);
        printf("  best block / sequential       %.2f   (target >= 0.8)\n", best_block / rate[0]);
        printf("  best block / sample shuffle   %.1f    (target >= 5)\n", best_block / rate[1]);
        printf("  best block, MB/s              %.0f    (target >= 300)\n", best_block * RECORD / 1e6);
    }
    close(st.fd);
    unlink(path);
    for (unsigned w = 0; w <= WORKERS; w++) free(st.bufs[w]);
    return 0;
}
