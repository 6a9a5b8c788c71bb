/* llmc_tokens.cu - llm.c's token shards through prefetch.h.

   llm.c (karpathy/llm.c) reads each batch in its training thread (fseek,
   fread, a CPU loop widening uint16 tokens to int32 inputs and targets)
   and then makes two synchronous, pageable cudaMemcpy calls per step:
   B*T*4 bytes of inputs and B*T*4 of targets. Here the workers pread the
   raw uint16 tokens of each step, (B*T+1)*2 bytes, straight into pinned
   slots; a kernel widens them into inputs and targets on the GPU, and the
   slot is released right after it. A quarter of the bytes cross the bus,
   and the host never waits.

   The data, as llm.c writes it: shard files matching a glob, in sorted
   order (one pass over all of them is an epoch); each a header of 256
   int32 ([0] magic 20240520, [1] version 1, [2] ntok), then ntok uint16
   tokens. With B, T and `world` processes a shard holds
   floor((ntok - 1) / (world*B*T)) batches per process; batch idx of rank r
   reads B*T+1 tokens from token (idx*world + r)*B*T; inputs are tokens
   [0, B*T), targets [1, B*T]. Unshuffled: shard by shard, idx ascending.
   prefetch.h's token reader (pf_tokens_open) does exactly this: every rank
   runs the same sample order and reads its own tokens of the step.

   Built three ways from this one file:
     nvcc -O2 -arch=native examples/llmc_tokens.cu -o llmc_tokens     (GPU)
     cc -O2 -std=c11 -x c examples/llmc_tokens.cu -o llmc_tokens -lpthread   (host)
     and against the simulated runtime for `make test` (widening kernel
     emulated on the consumer stream).
   Run:
     ./llmc_tokens "data/fineweb_train_*.bin" [--B 64] [--T 1024] [--world W --rank R] [--workers N]
     ./llmc_tokens --check     writes small shards and checks the stream against
                               a plain reimplementation of llm.c's loader
     ./llmc_tokens --bench     tokens/s from the page cache: llm.c's in-thread way
                               against the loader with 1, 2 and 4 workers */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* glob, pread */
#endif
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LLMC_MAGIC 20240520
#define LLMC_VERSION 1
#define HEADER_BYTES (256 * 4)
#define MAX_SHARDS 1024

/* The shards of a glob, sorted (llm.c's order), through prefetch.h's
   token reader: it checks every shard at open (a bad one is named in
   pf_error(NULL)) and fills cfg: one sample = one llm.c step of this rank,
   its B*T+1 raw tokens, read straight into the slot. No load callback. */
typedef struct llmc {
    pf_tokens *tokens;
    glob_t g;
} llmc;

static pf_result llmc_open(llmc *d, const char *pattern, uint32_t B, uint32_t T, uint32_t world, uint32_t rank,
                           uint32_t workers, pf_config *cfg) {
    pf_tokens_config tc;
    pf_result r;
    memset(d, 0, sizeof *d);
    {
        pf_config zero = PF_CONFIG_INIT;
        *cfg = zero;
    }
    cfg->batch_size = 1;     /* one step per batch */
    cfg->num_workers = workers;
    cfg->world_size = world; /* the reader shards llm.c's way and resets these */
    cfg->rank = rank;
    if (glob(pattern, 0, NULL, &d->g) != 0 || d->g.gl_pathc == 0) {
        globfree(&d->g);
        fprintf(stderr, "llmc_tokens: no shard matches %s\n", pattern);
        return PF_ERR_INVALID_ARG;
    }
    memset(&tc, 0, sizeof tc);
    tc.paths = (const char *const *)d->g.gl_pathv;
    tc.num_paths = (uint32_t)d->g.gl_pathc;
    tc.B = B;
    tc.T = T;
    r = pf_tokens_open(&tc, cfg, &d->tokens);
    if (r != PF_OK) globfree(&d->g);
    return r;
}

static void llmc_close(llmc *d) { /* after pf_destroy */
    if (!d->tokens) return;
    pf_tokens_close(d->tokens);
    globfree(&d->g);
    d->tokens = NULL;
}

/* ---- widening: uint16 tokens -> int32 inputs and targets ---- */
#ifdef __CUDACC__
__global__ void widen(const uint16_t *tok, int *inputs, int *targets, size_t bt) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < bt) {
        inputs[i] = tok[i];
        targets[i] = tok[i + 1];
    }
}
#endif

static void widen_cpu(const uint16_t *tok, int *inputs, int *targets, size_t bt) {
    for (size_t i = 0; i < bt; i++) {
        inputs[i] = tok[i];
        targets[i] = tok[i + 1];
    }
}

#ifdef TEST_SIM
typedef struct widen_job {
    const uint16_t *tok;
    int *inputs, *targets;
    size_t bt;
} widen_job;
static void widen_on_stream(void *arg) { /* runs when the consumer stream gets to it, like the kernel */
    widen_job *w = (widen_job *)arg;
    widen_cpu(w->tok, w->inputs, w->targets, w->bt);
}
#endif

/* The consumer's side of one step: widen the batch where the model reads
   it, then release the slot at once (CUDA: an event after the kernel). */
typedef struct steps {
    pf_loader *l;
    void *stream;
    bool gpu;
    int *inputs, *targets; /* device arrays on a GPU, host arrays otherwise */
    size_t bt;
} steps;

static pf_result step(steps *s, pf_batch *b) {
#if defined(__CUDACC__)
    if (s->gpu) {
        widen<<<(unsigned)((s->bt + 255) / 256), 256, 0, (cudaStream_t)s->stream>>>((const uint16_t *)b->data,
                                                                                  s->inputs, s->targets, s->bt);
        if (cudaGetLastError() != cudaSuccess) return PF_ERR_CUDA;
        return pf_release(s->l, b);
    }
#elif defined(TEST_SIM)
    if (s->gpu) {
        static widen_job w; /* one in flight at a time: the stream runs them in order */
        w.tok = (const uint16_t *)b->data;
        w.inputs = s->inputs;
        w.targets = s->targets;
        w.bt = s->bt;
        if (cudaSimLaunchKernel((cudaStream_t)s->stream, widen_on_stream, &w, b->data, b->bytes) != cudaSuccess)
            return PF_ERR_CUDA;
        if (pf_release(s->l, b) != PF_OK) return PF_ERR_CUDA;
        /* the check reads inputs on the host: wait for the stream (a real
           training loop would not; the model's kernels read them) */
        return cudaStreamSynchronize((cudaStream_t)s->stream) == cudaSuccess ? PF_OK : PF_ERR_CUDA;
    }
#endif
    widen_cpu((const uint16_t *)b->data, s->inputs, s->targets, s->bt);
    return pf_release(s->l, b);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- --check: small shards of uneven sizes, against a plain loader ---- */

static uint16_t token_at(int shard, uint64_t pos) {
    uint64_t z = (uint64_t)shard * 1000003u + pos * 2654435761u;
    z ^= z >> 29;
    return (uint16_t)(z * 0x9e3779b97f4a7c15ull >> 48);
}

static int write_shard(const char *path, int id, uint64_t ntok, int32_t magic, int32_t version, int64_t extra) {
    FILE *f = fopen(path, "wb");
    int32_t h[256] = {0};
    if (!f) return -1;
    h[0] = magic;
    h[1] = version;
    h[2] = (int32_t)ntok;
    fwrite(h, sizeof h, 1, f);
    for (uint64_t i = 0; i < ntok + (uint64_t)(extra > 0 ? extra : 0); i++) {
        uint16_t t = token_at(id, i);
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
    if (extra < 0) return truncate(path, (off_t)(HEADER_BYTES + 2 * ntok + extra));
    return 0;
}

/* The reference: llm.c's semantics written plainly (fopen/fseek/fread),
   independent of the loader: the inputs and targets of step k of epoch e. */
typedef struct ref {
    char paths[8][512];
    int n;
} ref;

static uint64_t ref_steps(const ref *r, uint32_t B, uint32_t T, uint32_t world) {
    uint64_t total = 0;
    for (int i = 0; i < r->n; i++) {
        FILE *f = fopen(r->paths[i], "rb");
        int32_t h[256];
        if (!f || fread(h, sizeof h, 1, f) != 1) exit(2);
        fclose(f);
        total += ((uint64_t)h[2] - 1) / ((uint64_t)world * B * T);
    }
    return total;
}

static void ref_step(const ref *r, uint32_t B, uint32_t T, uint32_t world, uint32_t rank, uint64_t k, int *in,
                     int *tg) {
    uint64_t bt = (uint64_t)B * T;
    for (int i = 0; i < r->n; i++) {
        FILE *f = fopen(r->paths[i], "rb");
        int32_t h[256];
        uint64_t nb;
        if (!f || fread(h, sizeof h, 1, f) != 1) exit(2);
        nb = ((uint64_t)h[2] - 1) / ((uint64_t)world * bt);
        if (k < nb) {
            uint16_t *tok = (uint16_t *)malloc((bt + 1) * 2);
            fseek(f, (long)(HEADER_BYTES + (k * world + rank) * bt * 2), SEEK_SET);
            if (fread(tok, 2, bt + 1, f) != bt + 1) exit(2);
            for (uint64_t j = 0; j < bt; j++) in[j] = tok[j], tg[j] = tok[j + 1];
            free(tok);
            fclose(f);
            return;
        }
        k -= nb;
        fclose(f);
    }
    exit(2);
}

static int check_one(const char *dir, const ref *r, uint32_t B, uint32_t T, uint32_t world, uint32_t rank) {
    llmc d;
    char pattern[600];
    pf_config cfg = PF_CONFIG_INIT;
    steps s;
    uint64_t want = ref_steps(r, B, T, world), got = 0;
    size_t bt = (size_t)B * T;
    int *in = (int *)malloc(bt * sizeof(int)), *tg = (int *)malloc(bt * sizeof(int)), bad = 0, ends = 0;
    snprintf(pattern, sizeof pattern, "%s/shard_*.bin", dir);
    if (llmc_open(&d, pattern, B, T, world, rank, 3, &cfg) != PF_OK) {
        fprintf(stderr, "%s\n", pf_error(NULL));
        return 1;
    }
    cfg.epochs = 2;
    memset(&s, 0, sizeof s);
    s.bt = bt;
    s.inputs = (int *)malloc(bt * sizeof(int));
    s.targets = (int *)malloc(bt * sizeof(int));
#ifdef TEST_SIM
    cudaStream_t st;
    cudaSimReset(rank + 1, 40, 1);
    cudaSetDevice(0);
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    s.stream = st;
    s.gpu = true;
    cfg.backend = PF_BACKEND_CUDA;
    cfg.stream = st;
#else
    cfg.backend = PF_BACKEND_HOST;
#endif
    if (pf_create(&cfg, &s.l) != PF_OK) {
        fprintf(stderr, "pf_create: %s\n", pf_error(NULL));
        return 1;
    }
    for (;;) {
        pf_batch b;
        pf_result x = pf_next(s.l, &b);
        if (x == PF_END_OF_EPOCH) {
            if (got != (uint64_t)(ends + 1) * want) bad++;
            ends++;
            continue;
        }
        if (x == PF_END_OF_DATA) break;
        if (x != PF_OK || step(&s, &b) != PF_OK) {
            fprintf(stderr, "step: %s\n", pf_error(s.l));
            bad++;
            break;
        }
        ref_step(r, B, T, world, rank, got % want, in, tg);
        if (memcmp(in, s.inputs, bt * sizeof(int)) || memcmp(tg, s.targets, bt * sizeof(int))) bad++;
        got++;
    }
    pf_destroy(s.l);
#ifdef TEST_SIM
    {
        char m[256];
        cudaStreamDestroy(st);
        if (cudaSimViolations(m, sizeof m)) {
            fprintf(stderr, "simulated runtime: %s\n", m);
            bad++;
        }
    }
#endif
    if (ends != 2 || got != 2 * want) bad++;
    printf("  B=%u T=%u world=%u rank=%u: %llu steps over 2 epochs, %s\n", B, T, world, rank,
           (unsigned long long)got, bad ? "WRONG" : "each equal to the reference");
    llmc_close(&d);
    free(in);
    free(tg);
    free(s.inputs);
    free(s.targets);
    return bad;
}

/* A bad shard is PF_ERR_INVALID_ARG at open, naming the file and what is
   wrong with it, never an exit() or a crash later. */
static int check_bad(const char *dir, int32_t magic, int32_t version, int64_t extra, const char *want) {
    char path[600], pattern[600];
    llmc d;
    pf_config cfg = PF_CONFIG_INIT;
    pf_result x;
    int bad;
    snprintf(path, sizeof path, "%s/bad_000.bin", dir);
    write_shard(path, 9, 200, magic, version, extra);
    snprintf(pattern, sizeof pattern, "%s/bad_*.bin", dir);
    x = llmc_open(&d, pattern, 2, 8, 1, 0, 2, &cfg);
    bad = x != PF_ERR_INVALID_ARG || !strstr(pf_error(NULL), path) || !strstr(pf_error(NULL), want);
    printf("  %-40s %s: \"%s\"\n", want, bad ? "WRONG" : "PF_ERR_INVALID_ARG", pf_error(NULL));
    llmc_close(&d);
    unlink(path);
    return bad;
}

static int run_check(void) {
    char dir[] = "/tmp/llmc_check_XXXXXX";
    ref r;
    int bad = 0;
    static const struct {
        uint32_t B, T, world;
    } cfgs[] = {{2, 8, 1}, {4, 16, 2}, {3, 5, 3}, {1, 64, 4}};
    if (!mkdtemp(dir)) return 1;
    printf("llmc_tokens --check: shards of uneven sizes against a plain reimplementation of llm.c's loader\n");
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        uint64_t step = (uint64_t)cfgs[c].world * cfgs[c].B * cfgs[c].T;
        /* 3 batches and some, exactly one per process, 2 and a little */
        const uint64_t sizes[3] = {3 * step + 1 + 5, step + 1, 2 * step + 7};
        r.n = 3;
        for (int i = 0; i < 3; i++) {
            snprintf(r.paths[i], sizeof r.paths[i], "%s/shard_%03d.bin", dir, i);
            write_shard(r.paths[i], i, sizes[i], LLMC_MAGIC, LLMC_VERSION, 0);
        }
        for (uint32_t rank = 0; rank < cfgs[c].world; rank++)
            bad += check_one(dir, &r, cfgs[c].B, cfgs[c].T, cfgs[c].world, rank);
        for (int i = 0; i < 3; i++) unlink(r.paths[i]);
    }
    bad += check_bad(dir, 12345, LLMC_VERSION, 0, "bad magic 12345");
    bad += check_bad(dir, LLMC_MAGIC, 7, 0, "bad version 7");
    bad += check_bad(dir, LLMC_MAGIC, LLMC_VERSION, -10, "but its header says 200 tokens");
    bad += check_bad(dir, LLMC_MAGIC, LLMC_VERSION, 3, "but its header says 200 tokens");
    rmdir(dir);
    printf("%s\n", bad ? "FAILED" : "every step matched; every bad shard failed cleanly");
    return bad ? 1 : 0;
}

/* ---- --bench: tokens/s from the page cache ---- */

static double bench_llmc_way(const char *pattern, uint32_t B, uint32_t T, uint64_t steps_max, int *in, int *tg) {
    /* llm.c's dataloader, plainly: per step an fseek and an fread in the
       training thread, then the widening loop on the CPU */
    glob_t g;
    uint64_t bt = (uint64_t)B * T, steps = 0;
    uint16_t *tok = (uint16_t *)malloc((bt + 1) * 2);
    double t0 = now_s();
    if (glob(pattern, 0, NULL, &g) != 0) return 0;
    for (size_t i = 0; i < g.gl_pathc && steps < steps_max; i++) {
        FILE *f = fopen(g.gl_pathv[i], "rb");
        int32_t h[256];
        if (!f || fread(h, sizeof h, 1, f) != 1) return 0;
        for (uint64_t k = 0; k < ((uint64_t)h[2] - 1) / bt && steps < steps_max; k++, steps++) {
            fseek(f, (long)(HEADER_BYTES + k * bt * 2), SEEK_SET);
            if (fread(tok, 2, bt + 1, f) != bt + 1) return 0;
            widen_cpu(tok, in, tg, bt);
        }
        fclose(f);
    }
    globfree(&g);
    free(tok);
    return (double)(steps * bt) / (now_s() - t0);
}

static double bench_loader(const char *pattern, uint32_t B, uint32_t T, uint32_t workers, int *in, int *tg) {
    llmc d;
    pf_config cfg = PF_CONFIG_INIT;
    steps s;
    uint64_t n = 0;
    double t0;
    if (llmc_open(&d, pattern, B, T, 1, 0, workers, &cfg) != PF_OK) return 0;
    cfg.epochs = 1;
    cfg.backend = PF_BACKEND_HOST;
    memset(&s, 0, sizeof s);
    s.bt = (size_t)B * T;
    s.inputs = in;
    s.targets = tg;
    if (pf_create(&cfg, &s.l) != PF_OK) return 0;
    t0 = now_s();
    for (;;) {
        pf_batch b;
        pf_result x = pf_next(s.l, &b);
        if (x != PF_OK) break;
        step(&s, &b); /* widened on the CPU here, as llm.c's way does */
        n++;
    }
    t0 = now_s() - t0;
    pf_destroy(s.l);
    llmc_close(&d);
    return (double)(n * B * T) / t0;
}

static int run_bench(int quick) {
    char dir[] = "/tmp/llmc_bench_XXXXXX", pattern[600];
    const uint64_t ntok = quick ? (8u << 20) : (32u << 20); /* tokens per shard: 16 or 64 MiB */
    static const uint32_t Bs[] = {8, 64};
    const uint32_t T = 1024;
    int *in = (int *)malloc((size_t)64 * T * sizeof(int)), *tg = (int *)malloc((size_t)64 * T * sizeof(int));
    if (!mkdtemp(dir)) return 1;
    for (int i = 0; i < 2; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/shard_%03d.bin", dir, i);
        write_shard(path, i, ntok, LLMC_MAGIC, LLMC_VERSION, 0);
    }
    snprintf(pattern, sizeof pattern, "%s/shard_*.bin", dir);
    (void)bench_llmc_way(pattern, 8, T, UINT64_MAX, in, tg); /* warm the page cache */
    printf("\nllm.c's token shards from the page cache (%llu M tokens), T = %u; widening on the CPU both ways\n",
           (unsigned long long)(2 * ntok >> 20), T);
    for (size_t b = 0; b < sizeof Bs / sizeof Bs[0]; b++) {
        uint32_t B = Bs[b];
        double base = 0, best[3] = {0, 0, 0};
        /* best of 5, the ways interleaved: a shared machine's slow spell
           would otherwise fall on one way and not the other (a single
           run each read B=64 at 0.78x in one `make bench`, 1.32x in the
           one before) */
        for (int rep = 0; rep < 5; rep++) { /* a run is 10-40 ms */
            double r = bench_llmc_way(pattern, B, T, UINT64_MAX, in, tg);
            if (r > base) base = r;
            for (uint32_t w = 1, k = 0; w <= 4; w *= 2, k++) {
                r = bench_loader(pattern, B, T, w, in, tg);
                if (r > best[k]) best[k] = r;
            }
        }
        printf("{\"bench\":\"llmc\",\"B\":%u,\"T\":%u,\"way\":\"llm.c in-thread\",\"tokens_per_s\":%.0f,"
               "\"bytes_per_step_to_gpu\":%llu}\n", B, T, base, (unsigned long long)2 * B * T * 4);
        printf("  B=%-3u llm.c in-thread (fseek/fread + widen): %6.0f M tokens/s\n", B, base / 1e6);
        for (uint32_t w = 1, k = 0; w <= 4; w *= 2, k++) {
            double r = best[k];
            printf("{\"bench\":\"llmc\",\"B\":%u,\"T\":%u,\"way\":\"prefetch.h\",\"workers\":%u,\"tokens_per_s\":%.0f,"
                   "\"bytes_per_step_to_gpu\":%llu}\n", B, T, w, r, (unsigned long long)((uint64_t)B * T + 1) * 2);
            printf("  B=%-3u prefetch.h, %u worker%s:                %6.0f M tokens/s  %.2fx\n", B, w, w > 1 ? "s" : " ",
                   r / 1e6, r / base);
        }
        printf("  bytes to the GPU per step: llm.c %llu (two int32 copies), prefetch.h %llu (raw uint16): %.2fx less\n",
               (unsigned long long)2 * B * T * 4, (unsigned long long)((uint64_t)B * T + 1) * 2,
               (double)(2.0 * B * T * 4) / ((double)((uint64_t)B * T + 1) * 2));
    }
    for (int i = 0; i < 2; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/shard_%03d.bin", dir, i);
        unlink(path);
    }
    rmdir(dir);
    free(in);
    free(tg);
    return 0;
}

int main(int argc, char **argv) {
    const char *pattern = NULL;
    uint32_t B = 64, T = 1024, world = 1, rank = 0, workers = 4;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) return run_check();
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--bench")) return run_bench(quick || (i + 1 < argc && !strcmp(argv[i + 1], "--quick")));
        else if (!strcmp(argv[i], "--B") && i + 1 < argc) B = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--T") && i + 1 < argc) T = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--world") && i + 1 < argc) world = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) rank = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--workers") && i + 1 < argc) workers = (uint32_t)atoi(argv[++i]);
        else pattern = argv[i];
    }
    if (!pattern) {
        fprintf(stderr, "usage: %s SHARD_GLOB [--B 64] [--T 1024] [--world W --rank R] [--workers N] | --check | "
                        "--bench [--quick]\n", argv[0]);
        return 2;
    }
    {
        llmc d;
        pf_config cfg = PF_CONFIG_INIT;
        steps s;
        uint64_t n = 0;
        double t0;
        char line[256];
        if (llmc_open(&d, pattern, B, T, world, rank, workers, &cfg) != PF_OK) {
            fprintf(stderr, "llmc_tokens: %s\n", pf_error(NULL));
            return 1;
        }
        cfg.epochs = 1;
        memset(&s, 0, sizeof s);
        s.bt = (size_t)B * T;
#ifdef __CUDACC__
        {
            int count = 0;
            if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
                cudaStream_t st;
                s.gpu = cudaSetDevice(0) == cudaSuccess && cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess &&
                        cudaMalloc((void **)&s.inputs, s.bt * sizeof(int)) == cudaSuccess &&
                        cudaMalloc((void **)&s.targets, s.bt * sizeof(int)) == cudaSuccess;
                s.stream = st;
                cfg.stream = st;
            }
            (void)cudaGetLastError();
        }
#endif
        if (!s.gpu) {
            s.inputs = (int *)malloc(s.bt * sizeof(int));
            s.targets = (int *)malloc(s.bt * sizeof(int));
        }
        if (pf_create(&cfg, &s.l) != PF_OK) {
            fprintf(stderr, "pf_create: %s\n", pf_error(NULL));
            return 1;
        }
        t0 = now_s();
        for (;;) {
            pf_batch b;
            pf_result x = pf_next(s.l, &b);
            if (x == PF_END_OF_EPOCH || x == PF_END_OF_DATA) break;
            if (x != PF_OK || step(&s, &b) != PF_OK) {
                fprintf(stderr, "llmc_tokens: %s\n", pf_error(s.l));
                return 1;
            }
            n++;
        }
#ifdef __CUDACC__
        if (s.gpu && cudaStreamSynchronize((cudaStream_t)s.stream) != cudaSuccess) return 1;
#endif
        t0 = now_s() - t0;
        pf_stats_format(s.l, line, sizeof line);
        printf("%llu steps of B=%u T=%u: %.1f M tokens/s on the %s\n%s\n", (unsigned long long)n, B, T,
               (double)n * B * T / t0 / 1e6, s.gpu ? "GPU" : "CPU (no GPU: host backend)", line);
        printf("bytes to the GPU per step: llm.c %llu, prefetch.h %llu\n", (unsigned long long)2 * B * T * 4,
               (unsigned long long)(((uint64_t)B * T + 1) * 2));
        pf_destroy(s.l);
        llmc_close(&d);
    }
    return 0;
}
