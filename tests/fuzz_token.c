/* fuzz_token.c - libFuzzer harness for checkpoint tokens: the input is a
   config (first bytes) and a cfg.resume string (the rest), on the host
   backend or the simulated CUDA one.

   Checked: pf_create either refuses the token with PF_ERR_INVALID_ARG, a
   NULL loader and a message that names the token ("cfg.resume" or "resume
   token"), or accepts it; an accepted token's loader then delivers each
   batch of each epoch at most once, ends every epoch, never stalls (bounded
   by timeout_ms) and is destroyed without a leak, a CUDA object or an
   ordering violation left.

   make fuzz-token: clang -fsanitize=fuzzer,address,undefined, bounded time.
   make test: tests/corpus_token replayed through the same function. */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...)                                                                     \
    do {                                                                              \
        fprintf(stderr, "token fuzz invariant broken (%s:%d): ", __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                                                 \
        fputc('\n', stderr);                                                          \
        abort();                                                                      \
    } while (0)

typedef struct tz {
    uint64_t sizes[4]; /* samples per epoch (num_samples_fn), by epoch % 4 */
    pthread_mutex_t mu;
    long live;
} tz;

static uint64_t tz_samples(void *user, uint64_t epoch) { return ((tz *)user)->sizes[epoch % 4]; }

static int tz_load(void *user, pf_job *job) {
    (void)user;
    cudaSimHostWrite(job->host, 8);
    *(uint64_t *)job->host = job->batch;
    job->bytes = 8;
    return 0;
}

static void *tz_alloc(size_t n, void *u) {
    tz *t = (tz *)u;
    void *p = malloc(n);
    pthread_mutex_lock(&t->mu);
    t->live += p != NULL;
    pthread_mutex_unlock(&t->mu);
    return p;
}
static void tz_free(void *p, void *u) {
    tz *t = (tz *)u;
    pthread_mutex_lock(&t->mu);
    t->live--;
    pthread_mutex_unlock(&t->mu);
    free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tz t;
    pf_config cfg;
    pf_loader *l = (pf_loader *)&t; /* pf_create must set it, NULL on failure */
    cudaStream_t stream = NULL;
    char tok[1024];
    uint8_t k[4] = {0, 0, 0, 0};
    size_t i, n;
    int cuda;
    pf_result r;
    for (i = 0; i < 4 && i < size; i++) k[i] = data[i];
    n = size > 4 ? size - 4 : 0;
    if (n >= sizeof tok) n = sizeof tok - 1;
    memcpy(tok, data + (size > 4 ? 4 : size), n);
    tok[n] = '\0';
    memset(&t, 0, sizeof t);
    pthread_mutex_init(&t.mu, NULL);
    memset(&cfg, 0, sizeof cfg);
    /* the config the corpus's tokens were written for, varied by k[] */
    cuda = k[0] & 1;
    cfg.unordered = (k[0] >> 1) & 1;
    cfg.shuffle = !((k[0] >> 2) & 1);
    cfg.drop_last = (k[0] >> 3) & 1;
    cfg.world_size = 1 + ((k[0] >> 4) & 3);
    cfg.rank = (k[0] >> 6) % cfg.world_size;
    cfg.batch_size = 1 + k[1] % 8;
    cfg.num_workers = 1 + (k[2] & 3);
    cfg.host_slots = (k[2] >> 2) & 7; /* 0: the default */
    cfg.device_slots = (k[2] >> 5) & 3;
    cfg.epochs = k[3] & 0x40 ? 0 : 1 + k[3] % 3; /* 0: until destroyed */
    if (k[3] & 0x80) {
        cfg.num_samples_fn = tz_samples;
        for (int e = 0; e < 4; e++) t.sizes[e] = 10 + 7 * (uint64_t)e;
    } else {
        cfg.num_samples = 40;
    }
    cfg.seed = 1234;
    cfg.load = tz_load;
    cfg.user = &t;
    cfg.batch_bytes = 8;
    cfg.timeout_ms = 20000; /* a stall is a finding */
    cfg.resume = tok;
    cfg.backend = cuda ? PF_BACKEND_CUDA : PF_BACKEND_HOST;
    cfg.allocator.alloc_fn = tz_alloc;
    cfg.allocator.free_fn = tz_free;
    cfg.allocator.user_data = &t;
    cudaSimReset(k[1], 0, 1);
    if (cuda) {
        if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
            FAIL("simulated runtime setup");
        cfg.stream = stream;
    }
    r = pf_create(&cfg, &l);
    if (r != PF_OK) {
        const char *why = pf_error(NULL);
        if (r != PF_ERR_INVALID_ARG) FAIL("token refused with %d, not PF_ERR_INVALID_ARG: %s", (int)r, why);
        if (l) FAIL("a refused token left a loader");
        if (!strstr(why, "cfg.resume") && !strstr(why, "resume token"))
            FAIL("the refusal does not name the token: \"%s\" for \"%s\"", why, tok);
    } else {
        uint64_t seen[2] = {0, 0}, epoch = 0; /* bitmap of this epoch's batches (< 128) */
        for (int step = 0; step < 2000; step++) {
            pf_batch b;
            r = pf_next(l, &b);
            if (r == PF_END_OF_DATA) break;
            if (r == PF_END_OF_EPOCH) {
                epoch++;
                seen[0] = seen[1] = 0;
                continue;
            }
            if (r != PF_OK) FAIL("after token \"%s\": pf_next %d: %s", tok, (int)r, pf_error(l));
            if (b.batch < 128) {
                if (seen[b.batch / 64] >> (b.batch % 64) & 1)
                    FAIL("after token \"%s\": epoch %llu batch %llu twice", tok, (unsigned long long)b.epoch,
                         (unsigned long long)b.batch);
                seen[b.batch / 64] |= 1ull << (b.batch % 64);
            }
            if (pf_release(l, &b) != PF_OK) FAIL("pf_release: %s", pf_error(l));
        }
        (void)epoch;
        pf_destroy(l);
    }
    if (t.live != 0) FAIL("%ld allocations leaked", t.live);
    if (cuda) {
        char msg[768];
        cudaStreamSynchronize(stream);
        cudaStreamDestroy(stream);
        if (cudaSimViolations(msg, sizeof msg)) FAIL("ordering: %s", msg);
        if (cudaSimObjectsLive() || cudaSimBytesLive()) FAIL("CUDA objects or memory leaked");
    }
    pthread_mutex_destroy(&t.mu);
    return 0;
}

#ifdef FUZZ_REPLAY
/* Without libFuzzer: run each file in the directories named. */
#include <dirent.h>
int main(int argc, char **argv) {
    int files = 0;
    for (int a = 1; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        if (!d) FAIL("cannot open %s", argv[a]);
        for (struct dirent *e; (e = readdir(d));) {
            char path[4096];
            uint8_t buf[2048];
            size_t got;
            FILE *f;
            if (e->d_name[0] == '.') continue;
            snprintf(path, sizeof path, "%s/%s", argv[a], e->d_name);
            f = fopen(path, "rb");
            if (!f) continue;
            got = fread(buf, 1, sizeof buf, f);
            fclose(f);
            LLVMFuzzerTestOneInput(buf, got);
            files++;
        }
        closedir(d);
    }
    printf("token corpus replay: %d inputs, every invariant held\nRESULT %d 0 0\n", files, files);
    return files ? 0 : 1;
}
#endif
