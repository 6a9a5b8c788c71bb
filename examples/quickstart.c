/* quickstart.c - the README's Quick start, whole: images and their labels
   in one slot, the backend check, a training loop with evaluation at each
   epoch's end. The dataset is made up in memory so it runs anywhere.

     gcc -O2 -std=c11 examples/quickstart.c -lpthread -o quickstart      (CPU)
     nvcc -O2 -x cu examples/quickstart.c -o quickstart                  (GPU)
     gcc ... -DPREFETCH_CUDA ... -lcudart                  (GPU, plain C)

   Under nvcc the step is a kernel on your stream. Plain C has no kernels
   (yours would come from a .cu file or a library such as cuBLAS): there
   the step copies each batch back to check it, a synchronous copy a real
   loop would not make. Without a usable GPU
   the program says why and goes on with the host backend: pf_create
   refuses a GPU stream it cannot serve (PF_ERR_NO_DEVICE, saying what it
   found), and the library's warnings reach stderr through cfg.log.
   REQUIRE_GPU=1 makes running on the CPU a failure. Every batch's labels
   are checked against its images. */
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __CUDACC__
#include <cuda_runtime.h>
#elif defined(PREFETCH_CUDA)
#include <cuda_runtime_api.h>
#endif

#define IMG_BYTES (32 * 32 * 3)
#define BATCH 64
#define NUM_SAMPLES 5000
#define LABELS_AT ((size_t)BATCH * IMG_BYTES) /* the labels follow the images */

typedef struct dataset {
    const uint8_t *images; /* NUM_SAMPLES images, uint8 */
    const int32_t *labels;
} dataset;

/* Runs on worker threads: write one batch, in the layout the step reads. */
static int load(void *user, pf_job *job) {
    const dataset *d = (const dataset *)user;
    uint8_t *images = (uint8_t *)job->host;
    int32_t *labels = (int32_t *)(images + LABELS_AT);
    for (uint32_t i = 0; i < job->count; i++) {
        memcpy(images + (size_t)i * IMG_BYTES, d->images + job->indices[i] * IMG_BYTES, IMG_BYTES);
        labels[i] = d->labels[job->indices[i]];
    }
    job->bytes = LABELS_AT + BATCH * sizeof(int32_t); /* on CUDA only job->bytes cross the bus */
    return 0;                                          /* or return pf_job_fail(job, "why") */
}

/* The library prints nothing itself: its warnings (a fallback to the CPU,
   a skipped sample) and errors come here. */
static void log_to_stderr(void *user, int level, const char *msg) {
    (void)user;
    if (level <= PF_LOG_WARN) fprintf(stderr, "prefetch.h: %s\n", msg);
}

/* The step checks what a model would read: each image's first byte is its
   label. It counts mismatches into *bad. */
#ifdef __CUDACC__
__global__ void step_kernel(const uint8_t *images, const int32_t *labels, uint32_t n, unsigned *bad) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && images[(size_t)i * IMG_BYTES] != (uint8_t)labels[i]) atomicAdd(bad, 1u);
}
#endif

static void train_step(pf_backend on, const void *data, uint32_t count, void *stream, unsigned *bad) {
    const uint8_t *images = (const uint8_t *)data;
    const int32_t *labels = (const int32_t *)(images + LABELS_AT);
#ifdef __CUDACC__
    if (on == PF_BACKEND_CUDA) { /* device memory: a kernel on the stream the loader was given */
        step_kernel<<<(count + 63) / 64, 64, 0, (cudaStream_t)stream>>>(images, labels, count, bad);
        return;
    }
#endif
#if defined(PREFETCH_CUDA) && !defined(__CUDACC__)
    static uint8_t host[LABELS_AT + BATCH * sizeof(int32_t)];
    if (on == PF_BACKEND_CUDA) { /* device memory: a CPU loop must not read it, so the check copies it back */
        if (cudaMemcpyAsync(host, data, sizeof host, cudaMemcpyDeviceToHost, (cudaStream_t)stream) != cudaSuccess ||
            cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess) {
            *bad += count;
            return;
        }
        images = host;
        labels = (const int32_t *)(host + LABELS_AT);
    }
#endif
    (void)on, (void)stream;
    for (uint32_t i = 0; i < count; i++) *bad += images[(size_t)i * IMG_BYTES] != (uint8_t)labels[i];
}

int main(int argc, char **argv) {
    static uint8_t images[(size_t)NUM_SAMPLES * IMG_BYTES];
    static int32_t labels[NUM_SAMPLES];
    dataset data = {images, labels};
    void *stream = NULL;
    unsigned *bad = NULL, bad_host = 0;
    uint64_t batches = 0;
    int epochs = argc > 1 && !strcmp(argv[1], "--quick") ? 2 : 5;
    for (int i = 0; i < NUM_SAMPLES; i++) { /* a made-up dataset: image i starts with its label */
        labels[i] = i % 10;
        memset(images + (size_t)i * IMG_BYTES, (int)(i % 10), IMG_BYTES);
    }
#ifdef __CUDACC__
    cudaStream_t s;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMallocManaged((void **)&bad, sizeof *bad, cudaMemAttachGlobal);
    if (e == cudaSuccess) {
        stream = s;
        *bad = 0;
    } else { /* no GPU to create a stream on: the loader will say what it finds */
        fprintf(stderr, "no CUDA stream (%s): running on the CPU\n", cudaGetErrorString(e));
        (void)cudaGetLastError();
        bad = NULL;
    }
#endif

    pf_config cfg = PF_CONFIG_INIT;                 /* every field zero: its default */
    cfg.load = load;
    cfg.user = &data;
    cfg.num_samples = NUM_SAMPLES;
    cfg.batch_size = BATCH;
    cfg.batch_bytes = LABELS_AT + BATCH * sizeof(int32_t); /* images, then labels */
    cfg.shuffle = true;
    cfg.epochs = (uint32_t)epochs;
    cfg.stream = stream;                            /* your cudaStream_t; NULL without CUDA */
    cfg.log = log_to_stderr;                        /* warnings and errors, e.g. why not the GPU */
    pf_loader *loader;
    pf_result r = pf_create(&cfg, &loader);
    if (r == PF_ERR_NO_DEVICE) {                    /* a stream was given but no GPU is usable */
        fprintf(stderr, "%s\n", pf_error(NULL));     /* it says why: no driver, too old, no device */
        cfg.stream = NULL;
        cfg.backend = PF_BACKEND_HOST;               /* go on with the CPU, knowingly */
        r = pf_create(&cfg, &loader);
    }
    if (r != PF_OK) {
        fprintf(stderr, "%s\n", pf_error(NULL));
        return 1;
    }
    pf_backend on = pf_get_backend(loader);          /* PF_BACKEND_CUDA: b.data is device memory */
    printf("backend: %s\n", on == PF_BACKEND_CUDA ? "CUDA" : "host");
    if (on != PF_BACKEND_CUDA && getenv("REQUIRE_GPU") && atoi(getenv("REQUIRE_GPU"))) {
        fprintf(stderr, "REQUIRE_GPU=1: no usable GPU\n");
        pf_destroy(loader);
        return 1;
    }
    if (on != PF_BACKEND_CUDA || !bad) bad = &bad_host; /* the step counts on the CPU */

    for (;;) {
        pf_batch b;
        pf_result r = pf_next(loader, &b);
        if (r == PF_END_OF_EPOCH) {                  /* evaluate here, then go on */
            char line[256];
            pf_stats_format(loader, line, sizeof line);
            printf("%s\n", line);
            continue;
        }
        if (r == PF_END_OF_DATA) break;
        if (r != PF_OK) {
            fprintf(stderr, "%s\n", pf_error(loader));
            break;
        }
        train_step(on, b.data, b.count, cfg.stream, bad); /* labels at b.data + LABELS_AT */
        pf_release(loader, &b);                      /* on CUDA an event after your kernel, not a sync */
        batches++;
    }
    pf_destroy(loader);

#ifdef __CUDACC__
    if (on == PF_BACKEND_CUDA) cudaStreamSynchronize((cudaStream_t)stream);
#endif
    printf("%llu batches, %u labels that did not match their images\n", (unsigned long long)batches, *bad);
    int ok = batches == (uint64_t)epochs * ((NUM_SAMPLES + BATCH - 1) / BATCH) && *bad == 0;
#ifdef __CUDACC__
    if (bad != &bad_host && bad) cudaFree(bad);
    if (stream) cudaStreamDestroy((cudaStream_t)stream);
#endif
    return ok ? 0 : 1;
}
