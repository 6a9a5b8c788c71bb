/* test_real_gpu.cu - the overlap the simulator proves, on a real GPU (nvcc).
   Skipped, with a line saying so, where there is no GPU.
   - device_slots 1 and 2: a kernel checksums each batch into its own cell
     of a device array and the batch is released straight after the launch,
     so the next copy into that slot is ordered only by the release event.
     Any overlap bug (a copy overwriting a slot the kernel still reads, a
     kernel reading before the copy landed) shows as a wrong checksum.
   - pf_batch_wait, then a read on another (non-blocking) stream: only the
     library's wait orders that read after the copy.
   - packed batches: a kernel finds each sample through b.dev_offsets and
     sums it; the batch is released straight after the launch. */
#define _POSIX_C_SOURCE 200809L
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"
#include "util.h"

static int gpus(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    (void)cudaGetLastError();
    return n;
}

/* 64-bit sum of the batch's words, one thread block per batch. */
__global__ void checksum(const uint64_t *w, size_t words, unsigned long long *out) {
    __shared__ unsigned long long part[256];
    unsigned long long acc = 0;
    for (size_t i = threadIdx.x; i < words; i += blockDim.x) acc += w[i];
    part[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int t = 1; t < (int)blockDim.x; t++) acc += part[t];
        *out = acc;
    }
}

/* What t_load wrote for this batch, summed the same way. */
static unsigned long long expected_sum(uint64_t epoch, uint64_t batch, uint32_t count, uint64_t rng,
                                       const uint64_t *indices) {
    unsigned long long s = (T_MAGIC ^ epoch) + batch + count + rng;
    for (uint32_t i = 0; i < count; i++) s += t_word(indices[i]);
    return s;
}

static void run_overlap(uint32_t device_slots) {
    enum { N = 6000, BS = 64, EPOCHS = 2 };
    const uint32_t per_epoch = (N + BS - 1) / BS, total = EPOCHS * per_epoch;
    tload t;
    pf_config cfg;
    pf_loader *l = NULL;
    cudaStream_t s;
    unsigned long long *dsums, *sums;
    unsigned long long *want;
    uint32_t n = 0;
    t_load_init(&t);
    t.max_delay_us = 200; /* loads of uneven length: copies and kernels interleave differently */
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaMalloc((void **)&dsums, total * sizeof *dsums) == cudaSuccess);
    sums = (unsigned long long *)calloc(total, sizeof *sums);
    want = (unsigned long long *)calloc(total, sizeof *want);
    cfg = t_config(&t, N, BS, EPOCHS);
    cfg.backend = PF_BACKEND_CUDA;
    cfg.stream = s;
    cfg.shuffle = true;
    cfg.device_slots = device_slots;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r != PF_OK) {
            CHECK_EQ(r, PF_END_OF_DATA);
            break;
        }
        uint32_t k = (uint32_t)(b.epoch * per_epoch + b.batch);
        want[k] = expected_sum(b.epoch, b.batch, b.count, b.rng, b.indices);
        checksum<<<1, 256, 0, s>>>((const uint64_t *)b.data, b.bytes / 8, dsums + k);
        CHECK(cudaGetLastError() == cudaSuccess);
        CHECK_EQ(pf_release(l, &b), PF_OK); /* straight after the launch: no sync */
        n++;
    }
    CHECK_EQ(n, total);
    CHECK(cudaMemcpyAsync(sums, dsums, total * sizeof *sums, cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    for (uint32_t k = 0; k < total; k++) CHECKF(sums[k] == want[k], "device_slots %u, batch %u: checksum wrong", device_slots, k);
    pf_destroy(l);
    CHECK(cudaFree(dsums) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    free(sums);
    free(want);
    t_load_free(&t);
}

static void test_overlap_checksums_one_device_slot(void) {
    if (!gpus()) return h_skip("needs a GPU (the simulated runtime proves the ordering here)");
    run_overlap(1);
}

static void test_overlap_checksums_two_device_slots(void) {
    if (!gpus()) return h_skip("needs a GPU (the simulated runtime proves the ordering here)");
    run_overlap(2);
}

static void test_batch_wait_then_read_elsewhere(void) {
    tload t;
    tcons c;
    pf_config cfg;
    cudaStream_t s, other;
    void *back;
    int n = 0;
    if (!gpus()) return h_skip("needs a GPU (the simulated runtime proves the ordering here)");
    t_load_init(&t);
    t_cons_init(&c);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaHostAlloc(&back, t_batch_bytes(64), cudaHostAllocDefault) == cudaSuccess);
    cfg = t_config(&t, 3000, 64, 1);
    cfg.backend = PF_BACKEND_CUDA;
    cfg.stream = s;
    CHECK_EQ(pf_create(&cfg, &c.l), PF_OK);
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(c.l, &b);
        if (r != PF_OK) break;
        CHECK_EQ(pf_batch_wait(c.l, &b), PF_OK);
        /* `other` is ordered after nothing of the library's: only the wait makes this read safe */
        CHECK(cudaMemcpyAsync(back, b.data, b.bytes, cudaMemcpyDeviceToHost, other) == cudaSuccess);
        CHECK(cudaStreamSynchronize(other) == cudaSuccess);
        t_verify(&c, (const uint64_t *)back, b.bytes, b.epoch, b.batch, b.count, b.rng, b.indices);
        CHECK_EQ(pf_release(c.l, &b), PF_OK);
        n++;
    }
    CHECK_EQ(n, 47);
    CHECK_EQ(c.checked, n);
    t_end(&c);
    CHECK(cudaFreeHost(back) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    CHECK(cudaStreamDestroy(other) == cudaSuccess);
    t_load_free(&t);
}

/* Packed: sample x is x % 7 + 1 words of t_word(x), appended. */
static int packed_load(void *user, pf_job *job) {
    (void)user;
    for (uint32_t i = 0; i < job->count; i++) {
        uint64_t x = job->indices[i], *w = (uint64_t *)pf_job_append(job, 8 * (size_t)(x % 7 + 1));
        if (!w) return -1;
        for (uint64_t k = 0; k <= x % 7; k++) w[k] = t_word(x);
    }
    return 0;
}

/* Thread i sums sample i's words, found through the device offsets. */
__global__ void packed_sum(const unsigned char *data, const uint64_t *offsets, uint32_t count,
                           unsigned long long *out) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long acc = 0;
    if (i >= count) return;
    for (uint64_t at = offsets[i]; at < offsets[i + 1]; at += 8) acc += *(const unsigned long long *)(data + at);
    atomicAdd(out, acc);
}

static void test_packed_offsets_on_the_device(void) {
    enum { N = 5000, BS = 64, EPOCHS = 2 };
    const uint32_t per_epoch = (N + BS - 1) / BS, total = EPOCHS * per_epoch;
    pf_config cfg = PF_CONFIG_INIT;
    pf_loader *l = NULL;
    cudaStream_t s;
    unsigned long long *dsums, *sums, *want;
    uint32_t n = 0;
    if (!gpus()) return h_skip("needs a GPU (the simulated runtime proves the ordering here)");
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaMalloc((void **)&dsums, total * sizeof *dsums) == cudaSuccess);
    CHECK(cudaMemsetAsync(dsums, 0, total * sizeof *dsums, s) == cudaSuccess);
    sums = (unsigned long long *)calloc(total, sizeof *sums);
    want = (unsigned long long *)calloc(total, sizeof *want);
    cfg.load = packed_load;
    cfg.num_samples = N;
    cfg.batch_size = BS;
    cfg.batch_bytes = (size_t)BS * 7 * 8;
    cfg.epochs = EPOCHS;
    cfg.shuffle = true;
    cfg.device_slots = 2;
    cfg.backend = PF_BACKEND_CUDA;
    cfg.stream = s;
    cfg.timeout_ms = T_WAIT_MS;
    CHECK_EQ(pf_create(&cfg, &l), PF_OK);
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        uint32_t k;
        if (r == PF_END_OF_EPOCH) continue;
        if (r != PF_OK) {
            CHECK_EQ(r, PF_END_OF_DATA);
            break;
        }
        CHECK(b.offsets != NULL && b.dev_offsets != NULL);
        k = (uint32_t)(b.epoch * per_epoch + b.batch);
        for (uint32_t i = 0; i < b.count; i++) want[k] += (b.indices[i] % 7 + 1) * t_word(b.indices[i]);
        packed_sum<<<(b.count + 127) / 128, 128, 0, s>>>((const unsigned char *)b.data, b.dev_offsets, b.count,
                                                        dsums + k);
        CHECK(cudaGetLastError() == cudaSuccess);
        CHECK_EQ(pf_release(l, &b), PF_OK); /* straight after the launch: no sync */
        n++;
    }
    CHECK_EQ(n, total);
    CHECK(cudaMemcpyAsync(sums, dsums, total * sizeof *sums, cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    for (uint32_t k = 0; k < total; k++) CHECKF(sums[k] == want[k], "batch %u: the sum through dev_offsets is wrong", k);
    pf_destroy(l);
    CHECK(cudaFree(dsums) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    free(sums);
    free(want);
}

static const h_test tests[] = {
    {"overlap_checksums_one_device_slot", test_overlap_checksums_one_device_slot},
    {"overlap_checksums_two_device_slots", test_overlap_checksums_two_device_slots},
    {"batch_wait_then_read_elsewhere", test_batch_wait_then_read_elsewhere},
    {"packed_offsets_on_the_device", test_packed_offsets_on_the_device},
};

int main(int argc, char **argv) {
    return h_main(argc, argv, "real GPU suite (nvcc)", tests, sizeof tests / sizeof tests[0]);
}
