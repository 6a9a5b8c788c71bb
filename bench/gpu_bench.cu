// gpu_bench.cu - what the CUDA backend achieves against the hardware, all
// measured in one run on the GPU at hand:
//   1. peak pinned host-to-device bandwidth (a cudaMemcpyAsync loop)
//   2. the loader's host-to-device bandwidth (trivial loads, nothing else)
//   3. a fixed-length training step: synchronous copy then compute, vs the
//      prefetched loop, vs compute alone; the copy should vanish behind it.
// Prints JSON lines, then a table of ratios. Without a GPU it says so and
// exits 0 (no GPU figure is ever invented).
// Build: nvcc -O2 bench/gpu_bench.cu -o gpu_bench && ./gpu_bench [--quick]
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <stdio.h>
#include <string.h>

static int load_nothing(void *user, pf_job *job) { // the bytes are whatever the slot holds
    (void)user;
    job->bytes = job->capacity;
    return 0;
}

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

static float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return ms;
}

// One loader run: n batches of `bytes`, each followed by a step of `step_ns`
// (0: no kernel). Returns seconds, timed on the consumer stream.
static double loader_run(size_t bytes, int n, unsigned long long step_ns, cudaStream_t s, unsigned *sink,
                         pf_stats *st) {
    pf_config cfg;
    pf_loader *l;
    cudaEvent_t a, b;
    memset(&cfg, 0, sizeof cfg);
    cfg.load = load_nothing;
    cfg.num_samples = (uint64_t)n;
    cfg.batch_size = 1;
    cfg.batch_bytes = bytes;
    cfg.epochs = 1;
    cfg.num_workers = 2;
    cfg.backend = PF_BACKEND_CUDA;
    cfg.stream = s;
    if (pf_create(&cfg, &l) != PF_OK) {
        fprintf(stderr, "pf_create: %s\n", pf_error(NULL));
        return -1;
    }
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a, s);
    for (;;) {
        pf_batch bt;
        pf_result r = pf_next(l, &bt);
        if (r != PF_OK) break;
        if (step_ns) step_kernel<<<64, 256, 0, s>>>((const unsigned char *)bt.data, bt.bytes, step_ns, sink);
        pf_release(l, &bt);
    }
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    pf_get_stats(l, st);
    pf_destroy(l);
    double sec = elapsed_ms(a, b) / 1e3;
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return sec;
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    int gpus = 0;
    cudaError_t e = cudaGetDeviceCount(&gpus);
    if (e != cudaSuccess || gpus == 0) {
        printf("gpu_bench: no GPU here (%s); nothing to measure. Run it on a machine with one.\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 0;
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    const size_t bytes = (size_t)(quick ? 16 : 64) << 20;
    const int iters = quick ? 10 : 40;
    cudaStream_t s;
    cudaEvent_t a, b;
    unsigned char *host, *dev;
    unsigned *sink;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaHostAlloc((void **)&host, bytes, cudaHostAllocDefault);
    cudaMalloc((void **)&dev, bytes);
    cudaMalloc((void **)&sink, sizeof(unsigned));
    memset(host, 1, bytes);

    // 1. peak pinned H2D
    cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s); // warm up
    cudaEventRecord(a, s);
    for (int i = 0; i < iters; i++) cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    double peak = (double)bytes * iters / (elapsed_ms(a, b) / 1e3) / 1e9;
    double copy_ms = (double)bytes / (peak * 1e9) * 1e3; // one batch's copy at peak
    printf("{\"bench\":\"gpu_peak_h2d\",\"device\":\"%s\",\"bytes\":%zu,\"GBps\":%.2f}\n", prop.name, bytes, peak);

    // 2. the loader's H2D, nothing else
    pf_stats st;
    double t = loader_run(bytes, iters, 0, s, sink, &st);
    double loader_bw = (double)bytes * iters / t / 1e9;
    printf("{\"bench\":\"gpu_loader_h2d\",\"bytes\":%zu,\"GBps\":%.2f,\"ratio_to_peak\":%.3f}\n", bytes, loader_bw,
           loader_bw / peak);

    // 3. a step as long as the copy: sync copy+step, prefetched, step alone
    unsigned long long step_ns = (unsigned long long)(copy_ms * 1e6);
    cudaEventRecord(a, s);
    for (int i = 0; i < iters; i++) {
        cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s);
        step_kernel<<<64, 256, 0, s>>>(dev, bytes, step_ns, sink);
    }
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    double sync_ms = elapsed_ms(a, b) / iters;
    cudaEventRecord(a, s);
    for (int i = 0; i < iters; i++) step_kernel<<<64, 256, 0, s>>>(dev, bytes, step_ns, sink);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    double compute_ms = elapsed_ms(a, b) / iters;
    double pref_ms = loader_run(bytes, iters, step_ns, s, sink, &st) * 1e3 / iters;
    printf("{\"bench\":\"gpu_step\",\"bytes\":%zu,\"step_ms\":%.3f,\"sync_copy_ms\":%.3f,\"prefetched_ms\":%.3f,"
           "\"compute_only_ms\":%.3f}\n",
           bytes, step_ns / 1e6, sync_ms, pref_ms, compute_ms);
    printf("\n%-44s %10s\n", "GPU: " , prop.name);
    printf("%-44s %8.2f GB/s\n", "peak pinned H2D (cudaMemcpyAsync loop)", peak);
    printf("%-44s %8.2f GB/s  = %.2f of peak\n", "loader H2D (trivial loads)", loader_bw, loader_bw / peak);
    printf("%-44s %8.3f ms  = %.2fx compute only\n", "step, synchronous copy then compute", sync_ms,
           sync_ms / compute_ms);
    printf("%-44s %8.3f ms  = %.2fx compute only\n", "step, prefetched", pref_ms, pref_ms / compute_ms);
    printf("%-44s %8.3f ms\n", "step, compute only", compute_ms);
    cudaFree(dev);
    cudaFree(sink);
    cudaFreeHost(host);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(s);
    return 0;
}
