/* demo.c - what prefetch.h buys: one synthetic training job, run naively
   (load a batch, then train on it) and prefetched (workers load ahead while
   the step runs), side by side with wall times, the speed-up and the
   loader's own verdict.

   Each batch is 64 samples of 4 KiB read from an in-memory dataset and
   "decoded", after a simulated storage wait; the training step is a fixed
   time on the GPU (a kernel, when built with nvcc and a GPU is present) or
   on the host (sleeping, as a host does while its GPU works).

   Build and run (or just `make demo`):
     cc -O2 -std=c11 examples/demo.c -o demo -lpthread && ./demo
     nvcc -O2 -x cu examples/demo.c -o demo && ./demo      (GPU if present)
   Options: --batches N --load-ms X --step-ms Y --workers W (default: cfg.autotune) --quick */
#define _POSIX_C_SOURCE 200809L
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SAMPLE_BYTES 4096
#define BATCH 64
#define DATASET 2048 /* samples held in memory */

typedef struct job_cfg {
    const unsigned char *dataset;
    double load_ms; /* storage wait per batch, before decoding */
} job_cfg;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(double ms) {
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1000) * 1e6);
    nanosleep(&ts, NULL);
}

/* Wait for "storage", then copy and decode every sample into the slot. */
static void load_batch(const job_cfg *c, const uint64_t *indices, uint32_t count, unsigned char *out) {
    sleep_ms(c->load_ms);
    for (uint32_t i = 0; i < count; i++) {
        const unsigned char *src = c->dataset + (indices[i] % DATASET) * SAMPLE_BYTES;
        unsigned char *dst = out + (size_t)i * SAMPLE_BYTES;
        for (size_t k = 0; k < SAMPLE_BYTES; k++) dst[k] = (unsigned char)(src[k] ^ 0x5a); /* "decode" */
    }
}

static int load(void *user, pf_job *job) {
    load_batch((const job_cfg *)user, job->indices, job->count, (unsigned char *)job->host);
    job->bytes = (size_t)job->count * SAMPLE_BYTES;
    return 0;
}

#ifdef __CUDACC__
/* Every CUDA call checked: a failure ends the demo with its message. */
#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t ck_ = (call);                                                                            \
        if (ck_ != cudaSuccess) {                                                                            \
            fprintf(stderr, "demo: %s failed: %s\n", #call, cudaGetErrorString(ck_));                         \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

/* The training step on the GPU: read the batch, then hold the GPU for
   step_ns, as a fixed-size model would. */
__global__ void step_kernel(const unsigned char *data, size_t n, unsigned long long step_ns, unsigned *sink) {
    unsigned long long start, t;
    unsigned acc = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) acc += data[i];
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - start < step_ns);
    atomicAdd(sink, acc);
}
#endif

/* The step on the host: touch the batch, then wait as the host does while
   its GPU computes. */
static unsigned host_step(const unsigned char *data, size_t n, double step_ms) {
    unsigned acc = 0;
    for (size_t i = 0; i < n; i += 64) acc += data[i];
    sleep_ms(step_ms);
    return acc;
}

typedef struct opts {
    uint32_t batches, workers;
    double load_ms, step_ms;
} opts;

static double naive_loop(const opts *o, const job_cfg *jc, bool gpu, void *stream, void *dev, unsigned *sink) {
    size_t bytes = (size_t)BATCH * SAMPLE_BYTES;
    unsigned char *host;
    uint64_t indices[BATCH];
    volatile unsigned acc = 0;
    double t0;
#ifdef __CUDACC__
    if (gpu) CK(cudaHostAlloc((void **)&host, bytes, cudaHostAllocDefault));
    else
#endif
        host = (unsigned char *)malloc(bytes);
    t0 = now_s();
    for (uint32_t b = 0; b < o->batches; b++) {
        for (uint32_t i = 0; i < BATCH; i++) indices[i] = (uint64_t)b * BATCH + i;
        load_batch(jc, indices, BATCH, host);
#ifdef __CUDACC__
        if (gpu) {
            cudaStream_t s = (cudaStream_t)stream;
            CK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s));
            step_kernel<<<1, 256, 0, s>>>((const unsigned char *)dev, bytes,
                                          (unsigned long long)(o->step_ms * 1e6), sink);
            CK(cudaGetLastError());
            CK(cudaStreamSynchronize(s)); /* the naive loop reuses its one buffer */
            continue;
        }
#endif
        acc += host_step(host, bytes, o->step_ms);
    }
    t0 = now_s() - t0;
#ifdef __CUDACC__
    if (gpu) CK(cudaFreeHost(host));
    else
#endif
        free(host);
    (void)gpu;
    (void)stream;
    (void)dev;
    (void)sink;
    (void)acc;
    return t0;
}

static char line[256]; /* pf_stats_format at the end of the prefetched loop */
static char backend_why[256]; /* why the host backend, as the library said it */

/* The library prints nothing itself: its warnings and errors come here,
   and the line that says why it chose the host is kept for the report. */
static void demo_log(void *user, int level, const char *msg) {
    (void)user;
    if (!strncmp(msg, "backend: ", 9)) {
        char *tail;
        snprintf(backend_why, sizeof backend_why, "%s", msg + 9);
        if ((tail = strstr(backend_why, "; using the host backend")) != NULL) *tail = '\0';
    }
    else if (level <= PF_LOG_WARN) fprintf(stderr, "prefetch.h: %s\n", msg);
}

static double prefetched_loop(const opts *o, job_cfg *jc, void *stream, unsigned *sink, pf_stats *stats,
                              bool *gpu) {
    pf_config cfg = PF_CONFIG_INIT;
    pf_loader *l;
    volatile unsigned acc = 0;
    double t0;
    cfg.load = load;
    cfg.user = jc;
    cfg.num_samples = (uint64_t)o->batches * BATCH;
    cfg.batch_size = BATCH;
    cfg.batch_bytes = (size_t)BATCH * SAMPLE_BYTES;
    cfg.epochs = 1;
    cfg.num_workers = o->workers; /* 0: autotune picks the count (up to 16) */
    cfg.autotune = o->workers == 0;
    cfg.stream = stream;
    cfg.log = demo_log;
    if (pf_create(&cfg, &l) != PF_OK) {
        fprintf(stderr, "pf_create: %s\n", pf_error(NULL));
        exit(1);
    }
    pf_get_stats(l, stats);
    *gpu = stats->backend == PF_BACKEND_CUDA;
    t0 = now_s();
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r == PF_END_OF_DATA) break;
        if (r != PF_OK) {
            fprintf(stderr, "pf_next: %s\n", pf_error(l));
            exit(1);
        }
#ifdef __CUDACC__
        if (*gpu) {
            step_kernel<<<1, 256, 0, (cudaStream_t)stream>>>((const unsigned char *)b.data, b.bytes,
                                                             (unsigned long long)(o->step_ms * 1e6), sink);
            CK(cudaGetLastError());
        } else
#endif
            acc += host_step((const unsigned char *)b.data, b.bytes, o->step_ms);
        if (pf_release(l, &b) != PF_OK) { /* CUDA: an event, no host wait */
            fprintf(stderr, "pf_release: %s\n", pf_error(l));
            exit(1);
        }
    }
#ifdef __CUDACC__
    if (*gpu) CK(cudaStreamSynchronize((cudaStream_t)stream));
#endif
    t0 = now_s() - t0;
    pf_get_stats(l, stats);
    pf_stats_format(l, line, sizeof line);
    pf_destroy(l);
    (void)sink;
    (void)acc;
    return t0;
}

int main(int argc, char **argv) {
    opts o = {200, 0, 3.0, 3.0}; /* workers 0: autotune */
    job_cfg jc;
    unsigned char *dataset;
    void *stream = NULL, *dev = NULL;
    unsigned *sink = NULL;
    bool gpu = false, cuda_ok = false;
    pf_stats st;
    double naive, fast;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) o.batches = 30;
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) o.batches = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--workers") && i + 1 < argc) o.workers = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--load-ms") && i + 1 < argc) o.load_ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--step-ms") && i + 1 < argc) o.step_ms = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--quick] [--batches N] [--workers W] [--load-ms X] [--step-ms Y]\n", argv[0]);
            return 2;
        }
    }
    dataset = (unsigned char *)malloc((size_t)DATASET * SAMPLE_BYTES);
    for (size_t i = 0; i < (size_t)DATASET * SAMPLE_BYTES; i++) dataset[i] = (unsigned char)(i * 2654435761u >> 13);
    jc.dataset = dataset;
    jc.load_ms = o.load_ms;
#ifdef __CUDACC__
    {
        int n = 0;
        cuda_ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
        (void)cudaGetLastError();
        if (cuda_ok) {
            cudaStream_t s;
            CK(cudaSetDevice(0));
            CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            stream = s;
            CK(cudaMalloc(&dev, (size_t)BATCH * SAMPLE_BYTES));
            CK(cudaMalloc((void **)&sink, sizeof(unsigned)));
            /* warm-up, untimed: the first launch loads the module (and JIT-
               compiles PTX on a GPU newer than the build's architectures) */
            step_kernel<<<1, 256, 0, s>>>((const unsigned char *)dev, 0, 0, sink);
            CK(cudaGetLastError());
            CK(cudaStreamSynchronize(s));
        }
    }
#endif
    printf("prefetch.h demo: %u batches of %d x %d KiB samples; load %.1f ms of storage wait + decode per batch, "
           "training step %.1f ms per batch\n",
           (unsigned)o.batches, BATCH, SAMPLE_BYTES / 1024, o.load_ms, o.step_ms);
    fast = prefetched_loop(&o, &jc, stream, sink, &st, &gpu);
    if (!gpu && getenv("REQUIRE_GPU") && !strcmp(getenv("REQUIRE_GPU"), "1")) {
        fprintf(stderr, "demo: REQUIRE_GPU=1 but the loader fell back to the host backend (no usable GPU, or a "
                        "driver too old for this CUDA runtime)\n");
        return 1;
    }
    naive = naive_loop(&o, &jc, gpu && cuda_ok, stream, dev, sink);
    if (gpu)
        printf("backend: CUDA (the step is a GPU kernel; copies run on a side stream)\n");
    else
        printf("backend: host, because %s (the step stands in for a GPU: the host waits its time)\n",
               backend_why[0] ? backend_why : "no GPU is usable");
    printf("  naive loop      (load, then step)        %7.3f s   %7.1f batches/s\n", naive, o.batches / naive);
    if (!o.workers) printf("  autotune settled on %u of up to %u workers\n", (unsigned)st.workers_active,
                           (unsigned)st.num_workers);
    {
        unsigned w = (unsigned)(o.workers ? st.num_workers : st.workers_active);
        printf("  prefetched loop (%u worker%s, %u slots)    %7.3f s   %7.1f batches/s\n", w, w == 1 ? "" : "s",
               (unsigned)st.host_slots, fast, o.batches / fast);
    }
    printf("  speed-up %.2fx   (naive time / prefetched time)\n", naive / fast);
    printf("  loader: waited %.1f%% of the loop in pf_next, workers loaded %.2f s in all; %s\n",
           st.elapsed_s > 0 ? 100 * st.wait_s / st.elapsed_s : 0.0, st.load_s, st.verdict);
    printf("  at the end of the prefetched loop: %s\n", line);
#ifdef __CUDACC__
    if (cuda_ok) {
        CK(cudaFree(dev));
        CK(cudaFree(sink));
        CK(cudaStreamDestroy((cudaStream_t)stream));
    }
#endif
    free(dataset);
    return 0;
}
