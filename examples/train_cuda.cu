// train_cuda.cu - a small image classifier fed by prefetch.h.
//
// Workers "decode" 32x32x3 uint8 images (synthetic, ten classes) straight into
// pinned slots; the side stream copies them to the GPU while the previous step
// runs. A kernel normalises uint8 to float on the GPU, so a quarter of the
// float32 bytes cross the bus; the slot is released as soon as that kernel is
// queued (an event, not a sync), and a linear model takes an SGD step. The
// loader's stats and verdict are printed at the end. Without a GPU the loader
// falls back to the host backend and the same model trains on the CPU;
// REQUIRE_GPU=1 makes that fallback a failure. Every CUDA call is checked,
// and the run fails unless the loss went down.
//
// Build: nvcc -O2 -arch=native examples/train_cuda.cu -o train_cuda && ./train_cuda [--quick]
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t ck_ = (call);                                                                            \
        if (ck_ != cudaSuccess) {                                                                            \
            fprintf(stderr, "train_cuda: %s failed: %s (line %d)\n", #call, cudaGetErrorString(ck_), __LINE__); \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

enum { PIX = 32 * 32 * 3, CLASSES = 10, BATCH = 256 };
// slot: BATCH images of PIX bytes, then BATCH labels
static const size_t SLOT_BYTES = (size_t)BATCH * PIX + BATCH;

static uint32_t hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

// The "decoder": sample i has class hash(i) % 10, pixels = class prototype + noise.
static int load(void *user, pf_job *job) {
    unsigned char *img = (unsigned char *)job->host, *labels = img + (size_t)BATCH * PIX;
    (void)user;
    for (uint32_t s = 0; s < job->count; s++) {
        uint32_t i = (uint32_t)job->indices[s], y = hash32(i * 2654435761u) % CLASSES;
        unsigned char *px = img + (size_t)s * PIX;
        for (uint32_t p = 0; p < PIX; p++) {
            int v = (int)(hash32(y * PIX + p) & 0xff) + (int)(hash32(i ^ (p * 0x9e3779b9u)) % 97) - 48;
            px[p] = (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
        labels[s] = (unsigned char)y;
    }
    job->bytes = SLOT_BYTES;
    return 0;
}

// ---- the model on the GPU ----
__global__ void normalise(const unsigned char *slot, uint32_t count, float *x, unsigned char *y) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)count * PIX) x[i] = slot[i] * (1.0f / 255.0f) - 0.5f;
    if (i < count) y[i] = slot[(size_t)BATCH * PIX + i];
}

__global__ void forward(const float *x, const float *w, const float *bias, uint32_t count, float *logits) {
    uint32_t s = blockIdx.x, c = threadIdx.x;
    if (s >= count || c >= CLASSES) return;
    float acc = bias[c];
    for (uint32_t p = 0; p < PIX; p++) acc += x[(size_t)s * PIX + p] * w[(size_t)c * PIX + p];
    logits[s * CLASSES + c] = acc;
}

__global__ void softmax_grad(float *logits, const unsigned char *y, uint32_t count, float *loss, unsigned *correct) {
    uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= count) return;
    float *z = logits + s * CLASSES, m = z[0], sum = 0;
    uint32_t best = 0;
    for (uint32_t c = 1; c < CLASSES; c++)
        if (z[c] > m) m = z[c], best = c;
    for (uint32_t c = 0; c < CLASSES; c++) sum += expf(z[c] - m);
    atomicAdd(loss, -(z[y[s]] - m - logf(sum)));
    if (best == y[s]) atomicAdd(correct, 1u);
    for (uint32_t c = 0; c < CLASSES; c++) z[c] = (expf(z[c] - m) / sum - (c == y[s])) / count; // dL/dz
}

__global__ void update(const float *x, const float *dz, uint32_t count, float lr, float *w, float *bias) {
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)CLASSES * PIX) return;
    uint32_t c = (uint32_t)(k / PIX), p = (uint32_t)(k % PIX);
    float g = 0;
    for (uint32_t s = 0; s < count; s++) g += dz[s * CLASSES + c] * x[(size_t)s * PIX + p];
    w[k] -= lr * g;
    if (p == 0) {
        float gb = 0;
        for (uint32_t s = 0; s < count; s++) gb += dz[s * CLASSES + c];
        bias[c] -= lr * gb;
    }
}

// ---- the same model on the CPU (host backend fallback) ----
static void cpu_step(const unsigned char *slot, uint32_t count, float lr, float *w, float *bias, float *x,
                     double *loss, unsigned *correct) {
    const unsigned char *y = slot + (size_t)BATCH * PIX;
    float z[BATCH][CLASSES];
    for (size_t i = 0; i < (size_t)count * PIX; i++) x[i] = slot[i] * (1.0f / 255.0f) - 0.5f;
    for (uint32_t s = 0; s < count; s++) {
        float m, sum = 0;
        uint32_t best = 0;
        for (uint32_t c = 0; c < CLASSES; c++) {
            float acc = bias[c];
            for (uint32_t p = 0; p < PIX; p++) acc += x[(size_t)s * PIX + p] * w[(size_t)c * PIX + p];
            z[s][c] = acc;
        }
        m = z[s][0];
        for (uint32_t c = 1; c < CLASSES; c++)
            if (z[s][c] > m) m = z[s][c], best = c;
        for (uint32_t c = 0; c < CLASSES; c++) sum += expf(z[s][c] - m);
        *loss += -(z[s][y[s]] - m - logf(sum));
        *correct += best == y[s];
        for (uint32_t c = 0; c < CLASSES; c++) z[s][c] = (expf(z[s][c] - m) / sum - (c == y[s])) / count;
    }
    for (uint32_t c = 0; c < CLASSES; c++) {
        float gb = 0;
        for (uint32_t s = 0; s < count; s++) {
            float d = z[s][c];
            gb += d;
            for (uint32_t p = 0; p < PIX; p++) w[(size_t)c * PIX + p] -= lr * d * x[(size_t)s * PIX + p];
        }
        bias[c] -= lr * gb;
    }
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    uint32_t samples = quick ? 2048 : 50000, epochs = quick ? 3 : 5;
    const float lr = 0.05f;
    cudaStream_t stream = 0;
    int gpus = 0;
    bool gpu = cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0;
    float *x = NULL, *w = NULL, *bias = NULL, *logits = NULL, *dloss = NULL;
    unsigned char *y = NULL;
    unsigned *dcorrect = NULL;
    float first_loss = 0, last_loss = 0;
    (void)cudaGetLastError();
    if (gpu) {
        CK(cudaSetDevice(0));
        CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        CK(cudaMalloc((void **)&x, sizeof(float) * BATCH * PIX));
        CK(cudaMalloc((void **)&y, BATCH));
        CK(cudaMalloc((void **)&w, sizeof(float) * CLASSES * PIX));
        CK(cudaMalloc((void **)&bias, sizeof(float) * CLASSES));
        CK(cudaMalloc((void **)&logits, sizeof(float) * BATCH * CLASSES));
        CK(cudaMalloc((void **)&dloss, sizeof(float)));
        CK(cudaMalloc((void **)&dcorrect, sizeof(unsigned)));
        CK(cudaMemsetAsync(w, 0, sizeof(float) * CLASSES * PIX, stream));
        CK(cudaMemsetAsync(bias, 0, sizeof(float) * CLASSES, stream));
    } else {
        if (getenv("REQUIRE_GPU") && !strcmp(getenv("REQUIRE_GPU"), "1")) {
            fprintf(stderr, "train_cuda: REQUIRE_GPU=1 but no usable GPU (no device, or a driver too old for "
                            "this CUDA runtime)\n");
            return 1;
        }
        x = (float *)malloc(sizeof(float) * BATCH * PIX);
        w = (float *)calloc(CLASSES * PIX, sizeof(float));
        bias = (float *)calloc(CLASSES, sizeof(float));
    }

    pf_config cfg = PF_CONFIG_INIT;
    cfg.load = load;
    cfg.num_samples = samples;
    cfg.batch_size = BATCH;
    cfg.batch_bytes = SLOT_BYTES;
    cfg.epochs = epochs;
    cfg.shuffle = true;
    cfg.seed = 1;
    cfg.stream = stream;
    pf_loader *l;
    if (pf_create(&cfg, &l) != PF_OK) {
        fprintf(stderr, "pf_create: %s\n", pf_error(NULL));
        return 1;
    }
    printf("train_cuda: %u images of 32x32x3 uint8, batches of %d, %u epochs, on the %s\n", samples, BATCH, epochs,
           gpu ? "GPU (uint8 over the bus, normalised on the device)" : "CPU (no usable GPU: host backend)");
    {
        pf_stats st0;
        pf_get_stats(l, &st0);
        if (gpu && st0.backend != PF_BACKEND_CUDA) { /* the runtime said yes, the loader no */
            fprintf(stderr, "train_cuda: a GPU is visible but the loader is on the host backend\n");
            return 1;
        }
    }
    double loss = 0;
    unsigned correct = 0, seen = 0, epoch = 0;
    if (gpu) {
        CK(cudaMemsetAsync(dloss, 0, sizeof(float), stream));
        CK(cudaMemsetAsync(dcorrect, 0, sizeof(unsigned), stream));
    }
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) {
            if (gpu) { // one sync per epoch, to print
                float fl;
                CK(cudaMemcpyAsync(&fl, dloss, sizeof fl, cudaMemcpyDeviceToHost, stream));
                CK(cudaMemcpyAsync(&correct, dcorrect, sizeof correct, cudaMemcpyDeviceToHost, stream));
                CK(cudaStreamSynchronize(stream));
                loss = fl;
                CK(cudaMemsetAsync(dloss, 0, sizeof(float), stream));
                CK(cudaMemsetAsync(dcorrect, 0, sizeof(unsigned), stream));
            }
            last_loss = (float)(loss / seen);
            if (first_loss == 0) first_loss = last_loss;
            // b is zeroed on anything but PF_OK: the epoch is our own count
            printf("  epoch %u: loss %.4f, accuracy %.1f%%\n", epoch++, last_loss, 100.0 * correct / seen);
            loss = 0;
            correct = seen = 0;
            continue;
        }
        if (r == PF_END_OF_DATA) break;
        if (r != PF_OK) {
            fprintf(stderr, "pf_next: %s\n", pf_error(l));
            return 1;
        }
        seen += b.count;
        if (gpu) {
            size_t n = (size_t)b.count * PIX;
            uint32_t count = b.count;
            normalise<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>((const unsigned char *)b.data, b.count, x, y);
            CK(cudaGetLastError());
            if (pf_release(l, &b) != PF_OK) { // the slot's bytes are in x now: the next copy may start
                fprintf(stderr, "pf_release: %s\n", pf_error(l));
                return 1;
            }
            forward<<<count, 32, 0, stream>>>(x, w, bias, count, logits);
            CK(cudaGetLastError());
            softmax_grad<<<(count + 127) / 128, 128, 0, stream>>>(logits, y, count, dloss, dcorrect);
            CK(cudaGetLastError());
            update<<<(CLASSES * PIX + 255) / 256, 256, 0, stream>>>(x, logits, count, lr, w, bias);
            CK(cudaGetLastError());
        } else {
            cpu_step((const unsigned char *)b.data, b.count, lr, w, bias, x, &loss, &correct);
            if (pf_release(l, &b) != PF_OK) {
                fprintf(stderr, "pf_release: %s\n", pf_error(l));
                return 1;
            }
        }
    }
    if (gpu) CK(cudaStreamSynchronize(stream));
    pf_stats st;
    pf_get_stats(l, &st);
    printf("loader: %llu batches, %.1f MB delivered%s; consumer waited %.1f%% of %.2f s; %s\n",
           (unsigned long long)st.batches, st.bytes / 1e6, gpu ? " (copied as uint8)" : "",
           st.elapsed_s > 0 ? 100 * st.wait_s / st.elapsed_s : 0.0, st.elapsed_s, st.verdict);
    pf_destroy(l);
    if (gpu) {
        CK(cudaFree(x)); CK(cudaFree(y)); CK(cudaFree(w)); CK(cudaFree(bias)); CK(cudaFree(logits));
        CK(cudaFree(dloss)); CK(cudaFree(dcorrect));
        CK(cudaStreamDestroy(stream));
    } else {
        free(x); free(w); free(bias);
    }
    if (epoch != epochs || st.batches != (unsigned long long)epochs * ((samples + BATCH - 1) / BATCH)) {
        fprintf(stderr, "train_cuda: %u epochs and %llu batches, expected %u and %u\n", epoch,
                (unsigned long long)st.batches, epochs, epochs * ((samples + BATCH - 1) / BATCH));
        return 1;
    }
    if (!(last_loss < first_loss)) {
        fprintf(stderr, "the loss did not go down (%.4f -> %.4f)\n", first_loss, last_loss);
        return 1;
    }
    return 0;
}
