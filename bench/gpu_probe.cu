// gpu_probe.cu - where the CUDA backend's per-batch time goes on a real GPU.
//   nvcc -O2 -arch=native bench/gpu_probe.cu -o gpu_probe -lcuda
// 1. host cost of each CUDA call the loader makes per batch;
// 2. the loader's whole per-batch call sequence on one thread (the floor);
// 3. the loader at 64 KiB / 1 MiB with device_slots 3, 8, 32: GPU-timeline
//    and host wall-clock rates;
// 4. 64 MiB: plain loop and loader by host wall clock (no event windows).
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(call)                                                                                     \
    do {                                                                                             \
        cudaError_t ck_ = (call);                                                                    \
        if (ck_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "probe: %s: %s (line %d)\n", #call, cudaGetErrorString(ck_), __LINE__); \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static int load_nothing(void *u, pf_job *j) {
    (void)u;
    j->bytes = j->capacity;
    return 0;
}

static void loader(size_t bytes, int n, uint32_t dslots, uint32_t hslots, cudaStream_t s, int workers) {
    pf_config cfg;
    pf_loader *l;
    cudaEvent_t a, b;
    double t0 = 0, t1;
    int i = 0, skip = 8;
    float ms;
    pf_stats st;
    memset(&cfg, 0, sizeof cfg);
    cfg.load = load_nothing;
    cfg.num_samples = (uint64_t)n;
    cfg.batch_size = 1;
    cfg.batch_bytes = bytes;
    cfg.epochs = 1;
    cfg.num_workers = (uint32_t)workers;
    cfg.device_slots = dslots;
    cfg.host_slots = hslots;
    cfg.backend = PF_BACKEND_CUDA;
    cfg.stream = s;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    if (pf_create(&cfg, &l) != PF_OK) {
        fprintf(stderr, "pf_create: %s\n", pf_error(NULL));
        exit(1);
    }
    for (;;) {
        pf_batch bt;
        pf_result r = pf_next(l, &bt);
        if (r != PF_OK) break;
        if (i == skip) { CK(cudaEventRecord(a, s)); t0 = now(); }
        if (i == n - 1) CK(cudaEventRecord(b, s));
        pf_release(l, &bt);
        i++;
    }
    CK(cudaStreamSynchronize(s));
    t1 = now();
    CK(cudaEventElapsedTime(&ms, a, b));
    pf_get_stats(l, &st);
    printf("{\"probe\":\"loader\",\"bytes\":%zu,\"n\":%d,\"device_slots\":%u,\"host_slots\":%u,\"workers\":%d,"
           "\"gpu_us_per_batch\":%.2f,\"wall_us_per_batch\":%.2f,\"GBps_gpu\":%.2f,\"verdict\":\"%s\"}\n",
           bytes, n, dslots, st.host_slots, workers, ms * 1e3 / (n - 1 - skip), (t1 - t0) * 1e6 / (n - 1 - skip),
           bytes / (ms * 1e-3 / (n - 1 - skip)) / 1e9, st.verdict);
    pf_destroy(l);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
}

int main(void) {
    cudaStream_t s, c;
    cudaEvent_t e_nt, e_t, e_bs, e2;
    unsigned char *h, *h2, *d;
    const int N = 5000;
    size_t big = 64u << 20;
    CUcontext ctx;
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&e_nt, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&e_t, cudaEventDefault));
    CK(cudaEventCreateWithFlags(&e_bs, cudaEventBlockingSync));
    CK(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
    CK(cudaHostAlloc((void **)&h, big, 0));
    CK(cudaHostAlloc((void **)&h2, big, 0));
    CK(cudaMalloc((void **)&d, 2 * big));
    memset(h, 1, big);
    memset(h2, 1, big);
    cuCtxGetCurrent(&ctx);
#define PER_CALL(name, stmt)                                                                   \
    do {                                                                                       \
        double best = 1e9;                                                                     \
        for (int t = 0; t < 5; t++) {                                                          \
            double t0 = now();                                                                 \
            for (int i = 0; i < N; i++) { stmt; }                                              \
            double us = (now() - t0) * 1e6 / N;                                                \
            CK(cudaDeviceSynchronize());                                                       \
            if (us < best) best = us;                                                          \
        }                                                                                      \
        printf("{\"probe\":\"call\",\"what\":\"%s\",\"us\":%.3f}\n", name, best);             \
    } while (0)
    PER_CALL("cudaEventRecord DisableTiming", CK(cudaEventRecord(e_nt, s)));
    PER_CALL("cudaEventRecord timed", CK(cudaEventRecord(e_t, s)));
    PER_CALL("cudaEventRecord BlockingSync timed", CK(cudaEventRecord(e_bs, s)));
    PER_CALL("cudaStreamWaitEvent", CK(cudaStreamWaitEvent(c, e_nt, 0)));
    PER_CALL("cudaEventQuery (complete)", (void)cudaEventQuery(e_nt));
    PER_CALL("cuCtxPushCurrent+Pop", { CUcontext p; cuCtxPushCurrent(ctx); cuCtxPopCurrent(&p); });
    PER_CALL("cudaGetDevice", { int dv; CK(cudaGetDevice(&dv)); });
    PER_CALL("cudaMemcpyAsync 4 KiB", CK(cudaMemcpyAsync(d, h, 4096, cudaMemcpyHostToDevice, s)));
    PER_CALL("cudaMemcpyAsync 64 KiB", CK(cudaMemcpyAsync(d, h, 65536, cudaMemcpyHostToDevice, s)));
    /* the loader's per-batch sequence on one thread, 64 KiB, 3 device slots */
    {
        cudaEvent_t cp[3], rl[3], hd[8], rc[8], fd[8];
        for (int i = 0; i < 3; i++) {
            CK(cudaEventCreateWithFlags(&cp[i], cudaEventDisableTiming));
            CK(cudaEventCreateWithFlags(&rl[i], cudaEventDisableTiming));
        }
        for (int i = 0; i < 8; i++) {
            CK(cudaEventCreateWithFlags(&hd[i], cudaEventBlockingSync));
            CK(cudaEventCreate(&rc[i]));
            CK(cudaEventCreate(&fd[i]));
        }
        for (int i = 0; i < 3; i++) CK(cudaEventRecord(rl[i], c));
        for (size_t bytes = 4096; bytes <= (1u << 20); bytes *= 16) {
            int n = 5000;
            double t0 = now();
            for (int i = 0; i < n; i++) {
                int k = i % 3, m = i % 8;
                CK(cudaStreamWaitEvent(s, rl[k], 0));
                CK(cudaMemcpyAsync(d + k * (1u << 20), h + m * (1u << 20), bytes, cudaMemcpyHostToDevice, s));
                CK(cudaEventRecord(cp[k], s));
                CK(cudaEventRecord(hd[m], s));
                CK(cudaEventRecord(rc[m], c));
                CK(cudaStreamWaitEvent(c, cp[k], 0));
                CK(cudaEventRecord(fd[m], c));
                CK(cudaEventRecord(rl[k], c));
            }
            CK(cudaDeviceSynchronize());
            printf("{\"probe\":\"sequence one thread\",\"bytes\":%zu,\"us_per_batch\":%.2f}\n", bytes,
                   (now() - t0) * 1e6 / n);
            t0 = now();
            for (int i = 0; i < n; i++)
                CK(cudaMemcpyAsync(d + (i % 3) * (1u << 20), h + (i % 8) * (1u << 20), bytes, cudaMemcpyHostToDevice, s));
            CK(cudaDeviceSynchronize());
            printf("{\"probe\":\"plain copies one thread\",\"bytes\":%zu,\"us_per_batch\":%.2f}\n", bytes,
                   (now() - t0) * 1e6 / n);
        }
    }
    /* 64 MiB by wall clock */
    for (int rep = 0; rep < 2; rep++) {
        int n = 48;
        double t0 = now();
        for (int i = 0; i < n; i++) CK(cudaMemcpyAsync(d, h, big, cudaMemcpyHostToDevice, s));
        CK(cudaStreamSynchronize(s));
        printf("{\"probe\":\"plain 64 MiB wall\",\"GBps\":%.2f}\n", n * (double)big / (now() - t0) / 1e9);
        t0 = now();
        for (int i = 0; i < n; i++)
            CK(cudaMemcpyAsync(d + (i & 1) * big, (i & 1) ? h2 : h, big, cudaMemcpyHostToDevice, s));
        CK(cudaStreamSynchronize(s));
        printf("{\"probe\":\"plain 64 MiB two buffers wall\",\"GBps\":%.2f}\n", n * (double)big / (now() - t0) / 1e9);
    }
    for (int w = 1; w <= 2; w++)
        for (uint32_t ds = 3; ds <= 8; ds += 5) {
            loader(4096, 10000, ds, 0, c, w);
            loader(65536, 10000, ds, 0, c, w);
            loader(1u << 20, 2000, ds, 0, c, w);
        }
    loader(65536, 10000, 8, 64, c, 2);
    loader(1u << 20, 2000, 3, 16, c, 2);
    loader(big, 64, 3, 0, c, 2);
    loader(big, 64, 3, 0, c, 2);
    return 0;
}
