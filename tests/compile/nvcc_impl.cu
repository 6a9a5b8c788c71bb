// nvcc_impl.cu - the implementation compiled by nvcc (PREFETCH_CUDA is on by
// itself) next to a real kernel. With a GPU the kernel checks each batch on
// the device; without one the DEFAULT backend falls back to the host and the
// batches are checked there. Either way every batch is checked.
#define PREFETCH_IMPLEMENTATION
#include "../../prefetch.h"
#include <stdio.h>
#include <string.h>

#ifndef PREFETCH_CUDA
#error "nvcc must turn PREFETCH_CUDA on by itself"
#endif

static int load(void *user, pf_job *job) {
    uint32_t *out = (uint32_t *)job->host;
    (void)user;
    for (uint32_t i = 0; i < job->count; i++) out[i] = (uint32_t)(job->indices[i] * 3 + 1);
    job->bytes = job->count * sizeof(uint32_t);
    return 0;
}

__global__ void check_kernel(const uint32_t *data, const uint64_t *expect_first, uint32_t count, int *bad) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count && data[i] != (uint32_t)((*expect_first + i) * 3 + 1)) atomicAdd(bad, 1);
}

int main() {
    pf_config cfg;
    pf_loader *l;
    cudaStream_t stream = 0;
    int gpus = 0, batches = 0, bad_host = 0, bad_dev = 0, *bad = NULL;
    uint64_t *first = NULL;
    bool gpu = cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0;
    (void)cudaGetLastError();
    memset(&cfg, 0, sizeof cfg);
    cfg.load = load;
    cfg.num_samples = 4096;
    cfg.batch_size = 256;
    cfg.batch_bytes = 256 * sizeof(uint32_t);
    cfg.epochs = 2;
    cfg.timeout_ms = 60000;
    if (gpu) {
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        cudaMalloc((void **)&bad, sizeof(int));
        cudaMemsetAsync(bad, 0, sizeof(int), stream);
        cudaMalloc((void **)&first, 64 * sizeof(uint64_t));
        cfg.stream = stream;
    }
    if (pf_create(&cfg, &l) != PF_OK) {
        printf("nvcc build: create failed: %s\nRESULT 0 1 0\n", pf_error(NULL));
        return 1;
    }
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r != PF_OK) break;
        if (gpu) { // sequential order: the batch's samples are consecutive
            cudaMemcpyAsync(first + (batches % 64), &b.indices[0], sizeof(uint64_t), cudaMemcpyHostToDevice, stream);
            check_kernel<<<(b.count + 127) / 128, 128, 0, stream>>>((const uint32_t *)b.data, first + (batches % 64),
                                                                   b.count, bad);
            cudaStreamSynchronize(stream); // keeps `first` simple; not the library's habit
        } else {
            for (uint32_t i = 0; i < b.count; i++)
                bad_host += ((const uint32_t *)b.data)[i] != (uint32_t)(b.indices[i] * 3 + 1);
        }
        pf_release(l, &b);
        batches++;
    }
    pf_destroy(l);
    if (gpu) {
        cudaMemcpy(&bad_dev, bad, sizeof(int), cudaMemcpyDeviceToHost);
        cudaFree(bad);
        cudaFree(first);
        cudaStreamDestroy(stream);
    }
    int ok = batches == 32 && bad_host == 0 && bad_dev == 0;
    printf("nvcc build (%s): %d batches checked: %s\nRESULT %d %d 0\n", gpu ? "GPU" : "no GPU, host fallback",
           batches, ok ? "ok" : "FAILED", ok, !ok);
    return !ok;
}
