/* test_cuda_toolkit.c - the CUDA backend against the real runtime (gcc or g++ with
   -DPREFETCH_CUDA -lcudart). Without a usable GPU: PF_BACKEND_CUDA fails
   with PF_ERR_NO_DEVICE and the runtime's own words, and DEFAULT falls back
   to the host backend and delivers every batch. With a GPU: every batch is
   copied back from the device and checked. */
#define _POSIX_C_SOURCE 200809L
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"
#include "util.h"

static char logged[1024];
static void t_log(void *user, int level, const char *msg) {
    (void)user;
    (void)level;
    if (strstr(msg, "host backend") && !logged[0]) snprintf(logged, sizeof logged, "%s", msg);
}

static int gpu_count(cudaError_t *err) {
    int n = 0;
    *err = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    return *err == cudaSuccess ? n : 0;
}

static void test_cuda_backend_without_a_gpu_says_why(void) {
    cudaError_t e;
    tload t;
    pf_config cfg;
    pf_loader *l = NULL;
    if (gpu_count(&e) > 0) {
        h_skip("a GPU is present: this is the GPU-less check (real_gpu_batches runs instead)");
        return;
    }
    t_load_init(&t);
    cfg = t_config(&t, 100, 10, 1);
    cfg.backend = PF_BACKEND_CUDA;
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_NO_DEVICE);
    CHECK(l == NULL);
    CHECK_CONTAINS(pf_error(NULL), "no usable CUDA device");
    CHECK_CONTAINS(pf_error(NULL), cudaGetErrorString(e)); /* the runtime's own message */
    CHECK_CONTAINS(pf_error(NULL), cudaGetErrorName(e));
    if (h_verbose) printf("    %s\n", pf_error(NULL));
    t_load_free(&t);
}

static void test_default_backend_falls_back_and_delivers(void) {
    cudaError_t e;
    tload t;
    tcons c;
    trun r;
    pf_config cfg;
    pf_stats s;
    if (gpu_count(&e) > 0) {
        h_skip("a GPU is present: the fallback cannot happen");
        return;
    }
    t_load_init(&t);
    t_cons_init(&c);
    cfg = t_config(&t, 1000, 32, 2);
    cfg.backend = PF_BACKEND_DEFAULT;
    cfg.shuffle = true;
    cfg.log = t_log;
    logged[0] = '\0';
    CHECK_EQ(pf_create(&cfg, &c.l), PF_OK);
    CHECK_CONTAINS(logged, "using the host backend");
    CHECK_CONTAINS(logged, cudaGetErrorString(e));
    pf_get_stats(c.l, &s);
    CHECK_EQ(s.backend, PF_BACKEND_HOST);
    t_run_init(&r);
    CHECK_EQ(t_drain(&c, &r, 100000), PF_END_OF_DATA);
    CHECK_EQ(r.n, 2 * 32);
    CHECK_EQ(c.checked, 64);
    t_end(&c);
    t_run_free(&r);
    t_load_free(&t);
}

/* Without a GPU, a config that sets cfg.stream expects device pointers:
   DEFAULT refuses the host fallback and says what it found. */
static void test_default_backend_with_a_stream_fails_without_a_gpu(void) {
    cudaError_t e;
    tload t;
    pf_config cfg;
    pf_loader *l = NULL;
    if (gpu_count(&e) > 0) {
        h_skip("a GPU is present: the fallback cannot happen");
        return;
    }
    t_load_init(&t);
    cfg = t_config(&t, 100, 10, 1);
    cfg.backend = PF_BACKEND_DEFAULT;
    cfg.stream = (void *)&cfg; /* never used: pf_create refuses first */
    CHECK_EQ(pf_create(&cfg, &l), PF_ERR_NO_DEVICE);
    CHECK(l == NULL);
    CHECK_CONTAINS(pf_error(NULL), "cfg.stream is set");
    CHECK_CONTAINS(pf_error(NULL), cudaGetErrorName(e));
    if (h_verbose) printf("    %s\n", pf_error(NULL));
    t_load_free(&t);
}

/* Only where a GPU exists: every batch copied back to its own host buffer
   on the consumer stream and released right behind that copy, with no sync
   until the end: the next copy into the slot is ordered only by the
   release event, so an overlap bug shows as a wrong batch. */
static void test_real_gpu_batches(void) {
    cudaError_t e;
    tload t;
    tcons c;
    pf_config cfg;
    cudaStream_t stream;
    unsigned char *back;
    enum { MAXB = 2 * 79 };
    static struct {
        uint64_t epoch, batch, rng, idx[64];
        uint32_t count;
        size_t bytes;
    } meta[MAXB];
    const size_t stride = t_batch_bytes(64);
    int n = 0;
    if (gpu_count(&e) == 0) {
        h_skip("needs a GPU (the simulated runtime covers the ordering here)");
        return;
    }
    t_load_init(&t);
    t_cons_init(&c);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaHostAlloc((void **)&back, MAXB * stride, cudaHostAllocDefault) == cudaSuccess);
    cfg = t_config(&t, 5000, 64, 2);
    cfg.backend = PF_BACKEND_CUDA;
    cfg.stream = stream;
    cfg.shuffle = true;
    cfg.device_slots = 2;
    CHECK_EQ(pf_create(&cfg, &c.l), PF_OK);
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(c.l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r != PF_OK) {
            CHECK_EQ(r, PF_END_OF_DATA);
            break;
        }
        if (n >= MAXB) break;
        CHECK(cudaMemcpyAsync(back + (size_t)n * stride, b.data, b.bytes, cudaMemcpyDeviceToHost, stream) ==
              cudaSuccess);
        meta[n].epoch = b.epoch;
        meta[n].batch = b.batch;
        meta[n].rng = b.rng;
        meta[n].count = b.count;
        meta[n].bytes = b.bytes;
        memcpy(meta[n].idx, b.indices, b.count * sizeof(uint64_t));
        CHECK_EQ(pf_release(c.l, &b), PF_OK); /* right behind the read: no sync */
        n++;
    }
    CHECK_EQ(n, MAXB);
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    for (int k = 0; k < n; k++)
        t_verify(&c, (const uint64_t *)(back + (size_t)k * stride), meta[k].bytes, meta[k].epoch, meta[k].batch,
                 meta[k].count, meta[k].rng, meta[k].idx);
    CHECK_EQ(c.checked, n);
    t_end(&c);
    cudaFreeHost(back);
    cudaStreamDestroy(stream);
    t_load_free(&t);
}

static const h_test tests[] = {
    {"cuda_backend_without_a_gpu_says_why", test_cuda_backend_without_a_gpu_says_why},
    {"default_backend_falls_back_and_delivers", test_default_backend_falls_back_and_delivers},
    {"default_backend_with_a_stream_fails_without_a_gpu", test_default_backend_with_a_stream_fails_without_a_gpu},
    {"real_gpu_batches", test_real_gpu_batches},
};

int main(int argc, char **argv) {
    return h_main(argc, argv, "real CUDA runtime suite", tests, sizeof tests / sizeof tests[0]);
}
