/* peer_bench.c - prefetch.h beside what our users would use instead,
   torch.utils.data.DataLoader, on the same workloads in the same run:
     - items of 4 KiB, 64 KiB and 1 MiB in RAM, no sleeps: items/s;
     - the overlap workload (a per-item load latency and a per-batch step):
       efficiency against the ideal max(step, load / workers);
     - memory: our peak RSS, and DataLoader's main process plus its workers'
       PSS (forked pages shared with the parent count in part).
   Both sides: the same item sizes, batch size, 2 workers, shuffled, every
   batch checked (each item starts with its index), one untimed warm-up
   epoch. DataLoader gets its best settings: persistent_workers=True and
   prefetch_factor at its default (2) and doubled (4); it is the CPU build,
   so pin_memory does not apply (and the GPU path is not in this
   comparison at all).

   The DataLoader side is bench/torch_peer.py, run with the python3 that has
   torch (never required: without it the column is skipped, with a line).
   Build: cc -O2 -std=c11 bench/peer_bench.c -o peer_bench -lpthread
   Run:   ./peer_bench [--quick] */
#define _POSIX_C_SOURCE 200809L
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WORKERS 2u

typedef struct items {
    unsigned char *data;
    size_t item;
    double item_us;
} items;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_us(double us) {
    struct timespec ts = {(time_t)(us / 1e6), (long)((us - (double)(time_t)(us / 1e6) * 1e6) * 1e3)};
    nanosleep(&ts, NULL);
}

/* How long sleep_us(us) really takes here, in seconds. */
static double calibrate(double us) {
    double t0 = now_s();
    for (int i = 0; i < 50; i++) sleep_us(us);
    return (now_s() - t0) / 50;
}

static int load(void *user, pf_job *job) {
    const items *d = (const items *)user;
    unsigned char *out = (unsigned char *)job->host;
    for (uint32_t k = 0; k < job->count; k++) {
        if (d->item_us > 0) sleep_us(d->item_us);
        memcpy(out + (size_t)k * d->item, d->data + (size_t)job->indices[k] * d->item, d->item);
    }
    job->bytes = (size_t)job->count * d->item;
    return 0;
}

static long peak_rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) v = atol(line + 6);
    if (f) fclose(f);
    return v;
}

/* epochs timed after one warm-up epoch; step_us per batch. Items/s, or
   seconds of the timed part when `seconds` is set. */
static double ours(items *d, uint64_t n, uint32_t batch, uint32_t epochs, double step_us, double *seconds) {
    pf_config cfg;
    pf_loader *l;
    double t0 = 0;
    uint32_t ends = 0;
    memset(&cfg, 0, sizeof cfg);
    cfg.load = load;
    cfg.user = d;
    cfg.num_samples = n;
    cfg.batch_size = batch;
    cfg.batch_bytes = (size_t)batch * d->item;
    cfg.epochs = epochs + 1;
    cfg.num_workers = WORKERS;
    cfg.shuffle = true;
    cfg.backend = PF_BACKEND_HOST;
    if (pf_create(&cfg, &l) != PF_OK) {
        fprintf(stderr, "peer_bench: %s\n", pf_error(NULL));
        exit(1);
    }
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) {
            if (ends++ == 0) t0 = now_s(); /* the warm-up epoch is over */
            continue;
        }
        if (r == PF_END_OF_DATA) break;
        if (r != PF_OK) {
            fprintf(stderr, "peer_bench: %s\n", pf_error(l));
            exit(1);
        }
        for (uint32_t k = 0; k < b.count; k++) /* checked, as the peer does */
            if (*(const uint64_t *)((const unsigned char *)b.data + (size_t)k * d->item) != b.indices[k]) {
                fprintf(stderr, "peer_bench: wrong item\n");
                exit(1);
            }
        if (step_us > 0 && ends > 0) sleep_us(step_us);
        pf_release(l, &b);
    }
    t0 = now_s() - t0;
    pf_destroy(l);
    if (seconds) *seconds = t0;
    return (double)n * epochs / t0;
}

static char python[64];

/* Which python3 has torch, if any. */
static int find_torch(void) {
    const char *cands[] = {"python3", "/usr/bin/python3"};
    const char *env = getenv("PEER_PYTHON"); /* a python3 of your choice, e.g. a venv's */
    if (env) cands[0] = cands[1] = env;
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        char cmd[160];
        snprintf(cmd, sizeof cmd, "%s -c 'import torch' >/dev/null 2>&1", cands[i]);
        if (system(cmd) == 0) {
            snprintf(python, sizeof python, "%s", cands[i]);
            return 1;
        }
    }
    return 0;
}

/* Run the peer; the value of `key` in its JSON line (or -1). */
static double peer(const char *args, const char *key, double *second, const char *key2) {
    char cmd[512], line[2048];
    double v = -1;
    FILE *p;
    snprintf(cmd, sizeof cmd, "%s bench/torch_peer.py %s", python, args);
    p = popen(cmd, "r");
    while (p && fgets(line, sizeof line, p)) {
        char *at = strstr(line, key);
        if (!at) continue;
        printf("%s", line);
        v = atof(strchr(at, ':') + 1); /* json.dumps writes "key": value */
        if (second && key2 && (at = strstr(line, key2))) *second = atof(strchr(at, ':') + 1);
    }
    if (p && pclose(p) != 0) v = -1;
    return v;
}

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick"), have = find_torch();
    static const struct {
        size_t item;
        uint64_t n;
        uint32_t batch, epochs;
    } w[] = {{4096, 16384, 64, 2}, {65536, 2048, 64, 3}, {1u << 20, 256, 16, 3}};
    double mine[3], theirs[3][2], mem_main = -1, mem_workers = -1, ov_ours, ov_theirs[2] = {-1, -1};
    long rss_ours;
    const double item_us = 100, step_us = 2000;
    const uint64_t ov_n = quick ? 1024 : 2048;
    const uint32_t ov_batch = 32;
    for (int i = 0; i < 3; i++) {
        items d;
        uint32_t epochs = quick ? 1 : w[i].epochs;
        d.item = w[i].item;
        d.item_us = 0;
        d.data = (unsigned char *)malloc(w[i].n * w[i].item);
        memset(d.data, 0xa5, w[i].n * w[i].item); /* resident, as the peer's dataset */
        for (uint64_t k = 0; k < w[i].n; k++) memcpy(d.data + k * d.item, &k, sizeof k);
        mine[i] = ours(&d, w[i].n, w[i].batch, epochs, 0, NULL);
        printf("{\"peer\":\"prefetch.h\",\"bench\":\"copy\",\"item_bytes\":%zu,\"batch\":%u,\"workers\":%u,"
               "\"items_per_s\":%.0f}\n", d.item, w[i].batch, WORKERS, mine[i]);
        for (int pf = 0; pf < 2; pf++) {
            char args[160];
            theirs[i][pf] = -1;
            if (!have) continue;
            snprintf(args, sizeof args, "copy %zu %llu %u %u %d %u", d.item, (unsigned long long)w[i].n, w[i].batch,
                     WORKERS, pf ? 4 : 2, epochs);
            theirs[i][pf] = peer(args, "\"items_per_s\"", NULL, NULL);
        }
        free(d.data);
    }
    rss_ours = peak_rss_kib();
    { /* overlap */
        items d;
        /* the ideal from sleeps as this machine really sleeps them (a
           100 us nanosleep overshoots), the same for both sides */
        double it = calibrate(item_us), st = calibrate(step_us), secs = 0;
        double ideal_per = st > ov_batch * it / WORKERS ? st : ov_batch * it / WORKERS;
        double ideal = (double)(ov_n / ov_batch) * ideal_per;
        d.item = 4096;
        d.item_us = item_us;
        d.data = (unsigned char *)calloc(ov_n, d.item);
        for (uint64_t k = 0; k < ov_n; k++) memcpy(d.data + k * d.item, &k, sizeof k);
        (void)ours(&d, ov_n, ov_batch, 1, step_us, &secs);
        ov_ours = ideal / secs;
        printf("{\"peer\":\"prefetch.h\",\"bench\":\"overlap\",\"workers\":%u,\"seconds\":%.3f,\"ideal\":%.3f,"
               "\"efficiency\":%.3f}\n", WORKERS, secs, ideal, ov_ours);
        for (int pf = 0; pf < 2 && have; pf++) {
            char args[160];
            double t;
            snprintf(args, sizeof args, "overlap %llu %u %u %d %.0f %.0f", (unsigned long long)ov_n, ov_batch, WORKERS,
                     pf ? 4 : 2, item_us, step_us);
            t = peer(args, "\"seconds\"", NULL, NULL);
            ov_theirs[pf] = t > 0 ? ideal / t : -1;
        }
        free(d.data);
    }
    if (have) { /* memory, on the 1 MiB workload: main RSS and the workers' PSS */
        char args[160];
        snprintf(args, sizeof args, "copy %zu %llu %u %u 2 1", (size_t)(1u << 20), (unsigned long long)w[2].n,
                 w[2].batch, WORKERS);
        mem_workers = peer(args, "\"workers_pss_MiB\"", &mem_main, "\"peak_rss_main_MiB\"");
    }

    printf("\nprefetch.h vs torch.utils.data.DataLoader, %u workers each, shuffled, every batch checked\n", WORKERS);
    if (!have) {
        printf("  (peer column skipped: no python3 with torch here; `apt-get install python3-torch` adds it)\n");
        for (int i = 0; i < 3; i++) printf("  %7zu KiB items: prefetch.h %.0f items/s\n", w[i].item >> 10, mine[i]);
        printf("  overlap efficiency: prefetch.h %.3f\n", ov_ours);
        return 0;
    }
    printf("  %-26s %14s %16s %16s %10s\n", "workload", "prefetch.h", "DataLoader pf=2", "DataLoader pf=4", "ratio");
    for (int i = 0; i < 3; i++) {
        double best = theirs[i][0] > theirs[i][1] ? theirs[i][0] : theirs[i][1];
        printf("  %4zu KiB items, items/s    %14.0f %16.0f %16.0f %9.1fx\n", w[i].item >> 10, mine[i], theirs[i][0],
               theirs[i][1], best > 0 ? mine[i] / best : 0);
    }
    printf("  overlap, efficiency        %14.3f %16.3f %16.3f %9.2fx\n", ov_ours, ov_theirs[0], ov_theirs[1],
           ov_theirs[0] > 0 ? ov_ours / (ov_theirs[0] > ov_theirs[1] ? ov_theirs[0] : ov_theirs[1]) : 0);
    printf("  memory, MiB (1 MiB items)  %14.1f %16.1f %16s %9.1fx\n", rss_ours / 1024.0, mem_main + mem_workers, "",
           (mem_main + mem_workers) / (rss_ours / 1024.0));
    printf("    (ours: peak RSS of the process, dataset included; DataLoader: peak RSS of the main process %.1f MiB\n"
           "     + its workers' PSS %.1f MiB. ratio > 1: prefetch.h is faster, or uses less)\n", mem_main, mem_workers);
    return 0;
}
