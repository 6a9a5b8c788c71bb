// multi_gpu.cu - one loader per GPU in one process: each loader binds its
// threads to its own cuda_device, copies on its own stream, and shards the
// dataset so every GPU sees a disjoint part of each epoch (rank = device
// here; across nodes, combine with pf_shard_from_env). A training thread
// per GPU drives its loader; the loaders share nothing.
//
// Build: nvcc -O2 examples/multi_gpu.cu -o multi_gpu && ./multi_gpu
// Without a GPU the loaders fall back to the host backend (two of them),
// so the structure still runs.
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

enum { SAMPLE = 1024, BATCH = 128 };

static int load(void *user, pf_job *job) {
    float *x = (float *)job->host;
    (void)user;
    for (uint32_t s = 0; s < job->count; s++)
        for (uint32_t k = 0; k < SAMPLE / sizeof(float); k++) x[s * (SAMPLE / sizeof(float)) + k] = (float)job->indices[s];
    job->bytes = (size_t)job->count * SAMPLE;
    return 0;
}

__global__ void sum_kernel(const float *x, size_t n, double *out) {
    double acc = 0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
    atomicAdd(out, acc); // sm_60+
}

typedef struct gpu {
    int device, devices;
    bool cuda;
    double sum;
    unsigned long long batches;
    char line[256];
} gpu;

static void *train(void *arg) {
    gpu *g = (gpu *)arg;
    cudaStream_t stream = 0;
    double *dsum = NULL;
    pf_config cfg;
    pf_loader *l;
    if (g->cuda) {
        cudaSetDevice(g->device);
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        cudaMalloc((void **)&dsum, sizeof(double));
        cudaMemsetAsync(dsum, 0, sizeof(double), stream);
    }
    memset(&cfg, 0, sizeof cfg);
    cfg.load = load;
    cfg.num_samples = 100000;
    cfg.batch_size = BATCH;
    cfg.batch_bytes = (size_t)BATCH * SAMPLE;
    cfg.epochs = 2;
    cfg.shuffle = true;
    cfg.rank = (uint32_t)g->device; // a disjoint share per GPU
    cfg.world_size = (uint32_t)g->devices;
    cfg.cuda_device = g->cuda ? g->device : 0;
    cfg.stream = stream;
    if (pf_create(&cfg, &l) != PF_OK) {
        fprintf(stderr, "GPU %d: %s\n", g->device, pf_error(NULL));
        return NULL;
    }
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r != PF_OK) break;
        if (g->cuda)
            sum_kernel<<<1, 256, 0, stream>>>((const float *)b.data, b.bytes / sizeof(float), dsum);
        else
            for (size_t i = 0; i < b.bytes / sizeof(float); i++) g->sum += ((const float *)b.data)[i];
        pf_release(l, &b);
        g->batches++;
    }
    if (g->cuda) {
        cudaMemcpyAsync(&g->sum, dsum, sizeof(double), cudaMemcpyDeviceToHost, stream);
        cudaStreamSynchronize(stream);
    }
    pf_stats_format(l, g->line, sizeof g->line);
    pf_destroy(l);
    if (g->cuda) {
        cudaFree(dsum);
        cudaStreamDestroy(stream);
    }
    return NULL;
}

int main() {
    int n = 0;
    bool cuda = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    (void)cudaGetLastError();
    if (!cuda) n = 2; // two host loaders show the same structure
    if (n > 16) n = 16;
    gpu g[16];
    pthread_t th[16];
    for (int d = 0; d < n; d++) {
        memset(&g[d], 0, sizeof g[d]);
        g[d].device = d;
        g[d].devices = n;
        g[d].cuda = cuda;
        pthread_create(&th[d], NULL, train, &g[d]);
    }
    double total = 0;
    for (int d = 0; d < n; d++) {
        pthread_join(th[d], NULL);
        printf("%s %d: %llu batches; %s\n", cuda ? "GPU" : "host loader", d, g[d].batches, g[d].line);
        total += g[d].sum;
    }
    // each epoch visits every sample once across the loaders (with padding when n does not divide it)
    printf("sum of every value seen: %.0f (one epoch of 0..99999, twice, is %.0f)\n", total,
           2.0 * (SAMPLE / sizeof(float)) * (99999.0 * 100000.0 / 2));
    return 0;
}
