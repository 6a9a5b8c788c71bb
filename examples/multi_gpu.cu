// multi_gpu.cu - one loader per GPU in one process: each loader binds its
// threads to its own cuda_device, copies on its own stream, and shards the
// dataset so every GPU sees a disjoint part of each epoch (rank = device
// here; across nodes, combine with pf_shard_from_env). A training thread
// per GPU drives its loader; the loaders share nothing.
//
// Build: nvcc -O2 -arch=native examples/multi_gpu.cu -o multi_gpu && ./multi_gpu
// Without a GPU the loaders fall back to the host backend (two of them),
// so the structure still runs; REQUIRE_GPU=1 makes that a failure. It
// checks what it prints: the values summed on each GPU equal what the
// batches' indices say they hold, and every epoch covers the dataset.
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SAMPLE = 1024, BATCH = 128, N = 100000, EPOCHS = 2 };

#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t ck_ = (call);                                                                            \
        if (ck_ != cudaSuccess) {                                                                            \
            fprintf(stderr, "multi_gpu: %s failed: %s (line %d)\n", #call, cudaGetErrorString(ck_), __LINE__); \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

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
    bool cuda, ok;
    double sum;            /* every value of every batch, summed where it was read */
    double index_sum;      /* what that must be: sum of the batches' indices       */
    unsigned long long batches, samples;
    unsigned char *seen;   /* per epoch, per sample: delivered on this loader      */
    char line[256];
} gpu;

static void *train(void *arg) {
    gpu *g = (gpu *)arg;
    cudaStream_t stream = 0;
    double *dsum = NULL;
    pf_config cfg = PF_CONFIG_INIT;
    pf_loader *l;
    if (g->cuda) {
        CK(cudaSetDevice(g->device));
        CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        CK(cudaMalloc((void **)&dsum, sizeof(double)));
        CK(cudaMemsetAsync(dsum, 0, sizeof(double), stream));
    }
    cfg.load = load;
    cfg.num_samples = N;
    cfg.batch_size = BATCH;
    cfg.batch_bytes = (size_t)BATCH * SAMPLE;
    cfg.epochs = EPOCHS;
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
        if (r != PF_OK) {
            if (r != PF_END_OF_DATA) fprintf(stderr, "GPU %d: %s\n", g->device, pf_error(l));
            g->ok = r == PF_END_OF_DATA;
            break;
        }
        for (uint32_t s = 0; s < b.count; s++) {
            g->index_sum += (double)b.indices[s];
            g->seen[b.epoch * N + b.indices[s]] = 1;
        }
        g->samples += b.count;
        if (g->cuda) {
            sum_kernel<<<1, 256, 0, stream>>>((const float *)b.data, b.bytes / sizeof(float), dsum);
            CK(cudaGetLastError());
        } else {
            for (size_t i = 0; i < b.bytes / sizeof(float); i++) g->sum += ((const float *)b.data)[i];
        }
        if (pf_release(l, &b) != PF_OK) {
            fprintf(stderr, "GPU %d: pf_release: %s\n", g->device, pf_error(l));
            g->ok = false;
            break;
        }
        g->batches++;
    }
    if (g->cuda) {
        CK(cudaMemcpyAsync(&g->sum, dsum, sizeof(double), cudaMemcpyDeviceToHost, stream));
        CK(cudaStreamSynchronize(stream));
    }
    pf_stats_format(l, g->line, sizeof g->line);
    pf_destroy(l);
    if (g->cuda) {
        CK(cudaFree(dsum));
        CK(cudaStreamDestroy(stream));
    }
    return NULL;
}

int main() {
    int n = 0, bad = 0;
    bool cuda = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    (void)cudaGetLastError();
    if (!cuda && getenv("REQUIRE_GPU") && !strcmp(getenv("REQUIRE_GPU"), "1")) {
        fprintf(stderr, "multi_gpu: REQUIRE_GPU=1 but no usable GPU (no device, or a driver too old for this "
                        "CUDA runtime)\n");
        return 1;
    }
    if (!cuda) n = 2; // two host loaders show the same structure
    if (n > 16) n = 16;
    gpu g[16];
    pthread_t th[16];
    for (int d = 0; d < n; d++) {
        memset(&g[d], 0, sizeof g[d]);
        g[d].device = d;
        g[d].devices = n;
        g[d].cuda = cuda;
        g[d].seen = (unsigned char *)calloc((size_t)EPOCHS * N, 1);
        pthread_create(&th[d], NULL, train, &g[d]);
    }
    double total = 0, expect = 0;
    unsigned long long samples = 0, per_rank = (N + (unsigned long long)n - 1) / (unsigned long long)n;
    for (int d = 0; d < n; d++) {
        pthread_join(th[d], NULL);
        printf("%s %d: %llu batches; %s\n", cuda ? "GPU" : "host loader", d, g[d].batches, g[d].line);
        total += g[d].sum;
        expect += g[d].index_sum * (SAMPLE / sizeof(float));
        samples += g[d].samples;
        bad += !g[d].ok;
    }
    // every sample of every epoch reached some loader (padding repeats a few when n does not divide N)
    for (size_t i = 0; i < (size_t)EPOCHS * N; i++) {
        unsigned char any = 0;
        for (int d = 0; d < n; d++) any |= g[d].seen[i];
        if (!any) {
            fprintf(stderr, "multi_gpu: epoch %zu sample %zu was never delivered\n", i / N, i % N);
            bad++;
            break;
        }
    }
    for (int d = 0; d < n; d++) free(g[d].seen);
    printf("sum of every value seen: %.0f; the batches' indices say %.0f; %llu samples (expected %llu)\n", total,
           expect, samples, (unsigned long long)EPOCHS * per_rank * (unsigned long long)n);
    if (total != expect || samples != (unsigned long long)EPOCHS * per_rank * (unsigned long long)n) bad++;
    if (bad) fprintf(stderr, "multi_gpu: FAILED\n");
    return bad ? 1 : 0;
}
