// gpu_bench.cu - the CUDA backend against the copy engine and the step, in
// one run. Built two ways from this one file:
//   nvcc -O2 -arch=native bench/gpu_bench.cu        a real GPU: measured
//   gcc -x c -DTEST_SIM ... tests/sim/cuda_sim.c     the simulator's timing
//                                                    model: "simulated GPU (model)"
// Figures, each the median (and min..max) of TRIALS runs, all timed on the
// GPU timeline with events recorded at the same point of two iterations
// (after the first device_slots batches, and before the last), so neither
// the pipeline's fill nor its drain is counted:
//   1. copy path: the loader's host-to-device bytes/s at 64 KiB..64 MiB
//      batches over a plain cudaMemcpyAsync loop at the same size;
//   2. overlap: a step of 0.5x, 1x and 2x the copy time per batch, the
//      loader's time per batch over max(copy, step), and beside it the naive
//      pattern (copy with non_blocking on the compute stream, then compute);
//   3. the verdict pf_get_stats gives in each overlap regime.
// Warm-ups first: a kernel launch (a PTX JIT would land there), a run of
// copies, one untimed loader epoch. Every CUDA call is checked; a failure
// exits 1. Without a GPU it says so and exits 0, or 1 with REQUIRE_GPU=1.
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TEST_SIM
#define LABEL "simulated GPU (model)"
#define MODEL_BW 25e9 /* one H2D engine at 25 GB/s, as a PCIe 4 x16 link delivers */
#else
#define LABEL "GPU"
#endif

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t ck_ = (call);                                                                  \
        if (ck_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "gpu_bench: %s failed: %s (line %d)\n", #call, cudaGetErrorString(ck_), __LINE__); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int load_nothing(void *user, pf_job *job) { /* the bytes are whatever the slot holds */
    (void)user;
    job->bytes = job->capacity;
    return 0;
}

#ifdef TEST_SIM
static void step(cudaStream_t s, const void *data, size_t n, double us) {
    CK(cudaSimLaunchKernelFor(s, (unsigned)(us + 0.5), NULL, NULL, data, n));
}
#else
static unsigned *g_sink;
__global__ void step_kernel(const unsigned char *data, size_t n, unsigned long long ns, unsigned *sink) {
    unsigned long long start, t;
    unsigned acc = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += data[i];
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - start < ns);
    if (acc == 0xffffffffu) atomicAdd(sink, 1u);
}
static void step(cudaStream_t s, const void *data, size_t n, double us) {
    /* the kernel reads only the first 64 KiB: its time is the step, not a read of the batch */
    step_kernel<<<64, 256, 0, s>>>((const unsigned char *)data, n < 65536 ? n : 65536,
                                   (unsigned long long)(us * 1e3), g_sink);
    CK(cudaGetLastError());
}
#endif

/* Host wall clock, a cross-check of the event windows: seconds per batch of
   the last run from its first issue to its last completion (the fill
   included). */
static double g_wall;
static double wall_now(void) {
    struct timespec t;
    timespec_get(&t, TIME_UTC);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double ms_between(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

/* A plain loop: n copies of `bytes` from one pinned buffer on stream s.
   Seconds per copy between iteration `skip` and iteration n-1. */
static double plain_copy(unsigned char *dev, const unsigned char *host, size_t bytes, int n, int skip,
                         cudaStream_t s, cudaEvent_t a, cudaEvent_t b) {
    double t0 = wall_now(), sec;
    for (int i = 0; i < n; i++) {
        if (i == skip) CK(cudaEventRecord(a, s));
        if (i == n - 1) CK(cudaEventRecord(b, s));
        CK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s));
    }
    sec = ms_between(a, b) / 1e3 / (n - 1 - skip);
    CK(cudaStreamSynchronize(s));
    g_wall = (wall_now() - t0) / n;
    return sec;
}

/* The naive pattern: copy then step, both on the compute stream. */
static double naive_step(unsigned char *dev, const unsigned char *host, size_t bytes, int n, int skip, double us,
                         cudaStream_t s, cudaEvent_t a, cudaEvent_t b) {
    for (int i = 0; i < n; i++) {
        if (i == skip) CK(cudaEventRecord(a, s));
        if (i == n - 1) CK(cudaEventRecord(b, s));
        CK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s));
        step(s, dev, bytes, us);
    }
    return ms_between(a, b) / 1e3 / (n - 1 - skip);
}

/* The loader: n batches of `bytes`, a step of `us` after each (0: none).
   Seconds per batch on the consumer stream, from after the first
   device_slots batches. */
static double loader_run(size_t bytes, int n, double us, cudaStream_t s, cudaEvent_t a, cudaEvent_t b,
                         pf_stats *st) {
    pf_config cfg;
    pf_loader *l;
    int i = 0, skip;
    double t0;
    memset(&cfg, 0, sizeof cfg);
    cfg.load = load_nothing;
    cfg.num_samples = (uint64_t)n;
    cfg.batch_size = 1;
    cfg.batch_bytes = bytes;
    cfg.epochs = 1;
    cfg.num_workers = 2;
    cfg.backend = PF_BACKEND_CUDA;
    cfg.stream = s;
    cfg.timeout_ms = 120000;
    if (pf_create(&cfg, &l) != PF_OK) {
        fprintf(stderr, "gpu_bench: pf_create: %s\n", pf_error(NULL));
        exit(1);
    }
    skip = (int)pf_config_defaults(&cfg).device_slots;
    t0 = wall_now();
    for (;;) {
        pf_batch bt;
        pf_result r = pf_next(l, &bt);
        if (r == PF_END_OF_EPOCH || r == PF_END_OF_DATA) break;
        if (r != PF_OK) {
            fprintf(stderr, "gpu_bench: pf_next: %s\n", pf_error(l));
            exit(1);
        }
        if (i == skip) CK(cudaEventRecord(a, s));
        if (i == n - 1) CK(cudaEventRecord(b, s));
        if (us > 0) step(s, bt.data, bt.bytes, us);
        if (pf_release(l, &bt) != PF_OK) {
            fprintf(stderr, "gpu_bench: pf_release: %s\n", pf_error(l));
            exit(1);
        }
        i++;
    }
    if (i != n) {
        fprintf(stderr, "gpu_bench: %d batches delivered, expected %d\n", i, n);
        exit(1);
    }
    {
        double sec = ms_between(a, b) / 1e3 / (n - 1 - skip);
        CK(cudaStreamSynchronize(s));
        g_wall = (wall_now() - t0) / n;
        if (st) pf_get_stats(l, st);
        pf_destroy(l);
        return sec;
    }
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

typedef struct trials {
    double v[16];
    int n;
} trials;

static double median(trials *t) {
    qsort(t->v, (size_t)t->n, sizeof t->v[0], cmp_double);
    return t->n % 2 ? t->v[t->n / 2] : 0.5 * (t->v[t->n / 2 - 1] + t->v[t->n / 2]);
}

static void describe_device(int dev) {
#ifdef TEST_SIM
    (void)dev;
    printf("{\"device\":\"%s\",\"h2d_engine_GBps\":%.1f,\"note\":\"modelled, not measured on a GPU\"}\n", LABEL,
           MODEL_BW / 1e9);
#else
    struct cudaDeviceProp p;
    int drv = 0, rt = 0;
    char bus[32] = "", path[128], speed[64] = "unknown", width[16] = "?";
    FILE *f;
    CK(cudaGetDeviceProperties(&p, dev));
    CK(cudaDriverGetVersion(&drv));
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDeviceGetPCIBusId(bus, sizeof bus, dev));
    for (char *c = bus; *c; c++) *c = (char)(*c >= 'A' && *c <= 'F' ? *c - 'A' + 'a' : *c);
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/current_link_speed", bus);
    if ((f = fopen(path, "r"))) {
        if (fgets(speed, sizeof speed, f)) speed[strcspn(speed, "\n")] = 0;
        fclose(f);
    }
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/current_link_width", bus);
    if ((f = fopen(path, "r"))) {
        if (fgets(width, sizeof width, f)) width[strcspn(width, "\n")] = 0;
        fclose(f);
    }
    printf("{\"device\":\"%s\",\"sm\":\"%d.%d\",\"driver\":%d,\"runtime\":%d,\"pci\":\"%s\",\"pcie_link\":\"%s x%s\"}\n",
           p.name, p.major, p.minor, drv, rt, bus, speed, width);
#endif
}

int main(int argc, char **argv) {
    static const size_t sizes[] = {64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20};
    static const double factors[] = {0.5, 1.0, 2.0};
    const int nsizes = (int)(sizeof sizes / sizeof sizes[0]), ntrials = 5;
    int quick = argc > 1 && !strcmp(argv[1], "--quick"), count = 0, dev = 0;
    const char *req = getenv("REQUIRE_GPU");
    double copy_s[6], ratio_copy[6], spread_lo[6], spread_hi[6];
    double ov[2][3], ov_lo[2][3], ov_hi[2][3], nv[2][3];
    const char *verdict[2][3];
    int agree[2][3];
    const size_t ov_sizes[2] = {1u << 20, quick ? (4u << 20) : (16u << 20)};
    cudaStream_t s;
    cudaEvent_t a, b;
    unsigned char *host, *devbuf;
    cudaError_t e;
#ifdef TEST_SIM
    cudaSimReset(1, 0, 1);
    cudaSimSetTiming(MODEL_BW);
    cudaSimTimingOnly(1);
#endif
    e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        printf("gpu_bench: no GPU here (%s); nothing to measure.\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return req && *req == '1' ? 1 : 0;
    }
    CK(cudaSetDevice(dev));
    describe_device(dev);
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaHostAlloc((void **)&host, sizes[nsizes - 1], cudaHostAllocDefault));
    CK(cudaMalloc((void **)&devbuf, sizes[nsizes - 1]));
    memset(host, 1, sizes[nsizes - 1]);
#ifndef TEST_SIM
    CK(cudaMalloc((void **)&g_sink, sizeof(unsigned)));
#endif
    /* warm-ups: the first launch (JIT, module load), copies, a loader epoch */
    step(s, devbuf, 256, 10);
    CK(cudaStreamSynchronize(s));
    (void)plain_copy(devbuf, host, 1u << 20, 8, 1, s, a, b);
    (void)loader_run(1u << 20, 8, 0, s, a, b, NULL);

    /* 1. the copy path against a plain loop */
    for (int i = 0; i < nsizes; i++) {
        /* long enough to be steady: a fresh loader's first few hundred
           small batches run at half speed or less on an H100 (cold pinned
           pages, threads still waking up), which 256 batches measured */
        size_t total = quick ? (256u << 20) : (1024u << 20);
        int n = (int)(total / sizes[i]);
        trials tp = {{0}, 0}, tl = {{0}, 0}, twp = {{0}, 0}, twl = {{0}, 0};
        if (n < 64) n = 64; /* the fill is a 64th at most of the wall-clock figures */
        if (n > 4096) n = 4096;
        for (int t = 0; t < ntrials; t++) {
            tp.v[tp.n++] = plain_copy(devbuf, host, sizes[i], n, 3, s, a, b);
            twp.v[twp.n++] = g_wall;
            tl.v[tl.n++] = loader_run(sizes[i], n, 0, s, a, b, NULL);
            twl.v[twl.n++] = g_wall;
        }
        copy_s[i] = median(&tp);
        ratio_copy[i] = copy_s[i] / median(&tl);
        spread_lo[i] = copy_s[i] / tl.v[tl.n - 1];
        spread_hi[i] = copy_s[i] / tl.v[0];
        printf("{\"bench\":\"copy_path\",\"on\":\"%s\",\"batch_bytes\":%zu,\"batches\":%d,\"trials\":%d,"
               "\"plain_GBps\":%.2f,\"loader_GBps\":%.2f,\"ratio\":%.3f,\"ratio_min\":%.3f,\"ratio_max\":%.3f,"
               "\"wall_plain_GBps\":%.2f,\"wall_loader_GBps\":%.2f}\n",
               LABEL, sizes[i], n, ntrials, (double)sizes[i] / copy_s[i] / 1e9,
               (double)sizes[i] / median(&tl) / 1e9, ratio_copy[i], spread_lo[i], spread_hi[i],
               (double)sizes[i] / median(&twp) / 1e9, (double)sizes[i] / median(&twl) / 1e9);
    }

    /* 2. overlap: steps around the copy time of one batch, at two sizes */
    for (int z = 0; z < 2; z++) {
        int n = quick ? 64 : 128, k = 0; /* long enough that the fill is not the verdict */
        size_t ov_bytes = ov_sizes[z];
        double copy1;
        trials tp = {{0}, 0};
        for (int t = 0; t < ntrials; t++) tp.v[tp.n++] = plain_copy(devbuf, host, ov_bytes, n, 3, s, a, b);
        copy1 = median(&tp);
        for (k = 0; k < 3; k++) {
            double us = copy1 * factors[k] * 1e6, ideal = copy1 > copy1 * factors[k] ? copy1 : copy1 * factors[k];
            trials tl = {{0}, 0}, tn = {{0}, 0};
            pf_stats st;
            int votes[PF_BOUND_COMPUTE + 1] = {0}, best = 0;
            for (int t = 0; t < ntrials; t++) {
                tl.v[tl.n++] = loader_run(ov_bytes, n, us, s, a, b, &st);
                tn.v[tn.n++] = naive_step(devbuf, host, ov_bytes, n, 3, us, s, a, b);
                votes[st.bound]++;
                if (votes[st.bound] > votes[best]) best = (int)st.bound, verdict[z][k] = st.verdict;
            }
            agree[z][k] = votes[best]; /* the most frequent verdict, and in how many trials */
            ov[z][k] = median(&tl) / ideal;
            ov_lo[z][k] = tl.v[0] / ideal;
            ov_hi[z][k] = tl.v[tl.n - 1] / ideal;
            nv[z][k] = median(&tn) / ideal;
            printf("{\"bench\":\"overlap\",\"on\":\"%s\",\"batch_bytes\":%zu,\"copy_ms\":%.3f,\"step_ms\":%.3f,"
                   "\"loader_over_max\":%.3f,\"min\":%.3f,\"max\":%.3f,\"naive_over_max\":%.3f,\"verdict\":\"%s\","
                   "\"verdict_trials\":%d}\n",
                   LABEL, ov_bytes, copy1 * 1e3, us / 1e3, ov[z][k], ov_lo[z][k], ov_hi[z][k], nv[z][k], verdict[z][k],
                   agree[z][k]);
        }
    }

    printf("\n%s: the CUDA backend, median of %d trials (min..max)\n", LABEL, ntrials);
    printf("  %-44s %s\n", "copy path: loader / plain cudaMemcpyAsync", "(target >= 0.98 at 1 MiB and up)");
    for (int i = 0; i < nsizes; i++)
        printf("    %6zu KiB batches %33.3f  (%.3f..%.3f)\n", sizes[i] >> 10, ratio_copy[i], spread_lo[i], spread_hi[i]);
    printf("  %-44s %s\n", "step time / max(copy, step)", "(target <= 1.02; naive = copy + step)");
    for (int z = 0; z < 2; z++)
        for (int k = 0; k < 3; k++)
            printf("    %5zu KiB, step = %.1fx copy: loader %.3f (%.3f..%.3f), naive %.3f\n"
                   "      verdict (%d of %d trials): %s\n",
                   ov_sizes[z] >> 10, factors[k], ov[z][k], ov_lo[z][k], ov_hi[z][k], nv[z][k], agree[z][k], ntrials,
                   verdict[z][k]);
#ifdef TEST_SIM
    printf("  (modelled: one 25 GB/s copy engine and exact kernel times; not a GPU measurement)\n");
#endif
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaStreamDestroy(s));
    CK(cudaFree(devbuf));
    CK(cudaFreeHost(host));
#ifndef TEST_SIM
    CK(cudaFree(g_sink));
#endif
    return 0;
}
