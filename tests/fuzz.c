/* fuzz.c - libFuzzer harness: the input becomes a config and a script, and
   every delivered batch is checked against a model of DESIGN.md.

   Input: a config (backend host or simulated CUDA, workers, slots, batch
   size, sample counts per epoch including empty epochs, shuffle, seed,
   rank/world, drop_last, unordered, epochs, timeout, a failing or oversized
   batch, load and stream delays), then a script of steps: next, release
   the k-th held batch, or destroy.

   Checked on every step: batches in order (or each exactly once within its
   epoch when unordered), the exact sample indices of the sharding formula,
   counts, content (on CUDA where the stream reads it), END_OF_EPOCH once
   per epoch and END_OF_DATA after the last, errors only where one was
   planted (and sticky), INVALID_STATE only when every slot is held,
   TIMEOUT only with a timeout; and after destroy: no allocation, CUDA
   object or race left.

   make fuzz: clang -fsanitize=fuzzer,address,undefined, bounded time.
   make test: tests/corpus replayed through the same function (gcc, ASan). */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAIL(...)                                                         \
    do {                                                                  \
        fprintf(stderr, "fuzz invariant broken (%s:%d): ", __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                                     \
        fputc('\n', stderr);                                              \
        abort();                                                          \
    } while (0)

typedef struct input {
    const uint8_t *p;
    size_t n;
} input;

static unsigned take(input *in, unsigned range) { /* 0 .. range-1; 0 once exhausted */
    unsigned v = 0;
    if (range <= 1) return 0;
    if (in->n) {
        v = in->p[0];
        if (range > 256 && in->n > 1) {
            v = v | (unsigned)in->p[1] << 8;
            in->p++;
            in->n--;
        }
        in->p++;
        in->n--;
    }
    return v % range;
}

#define HEADER 3 /* words: epoch, batch, count; then one word per sample */
static uint64_t word(uint64_t index) { return index * 0x9e3779b97f4a7c15ull + 1; }

typedef struct model {
    int cuda, unordered, shuffle, drop_last;
    uint32_t bs, world, rank, epochs, timeout, cons_slots;
    uint64_t seed;
    uint64_t sizes[8]; /* samples per epoch (by epoch % 8) */
    long long fail_e, fail_b, big_e, big_b;
    int fail_silent;
    unsigned delay_us;
} model;

static uint64_t m_n(const model *m, uint64_t e) { return m->sizes[e % 8]; }
static uint64_t m_per_rank(const model *m, uint64_t e) {
    uint64_t n = m_n(m, e);
    return m->drop_last ? n / m->world : (n + m->world - 1) / m->world;
}
static uint64_t m_batches(const model *m, uint64_t e) {
    uint64_t p = m_per_rank(m, e);
    return m->drop_last ? p / m->bs : (p + m->bs - 1) / m->bs;
}

static uint64_t fz_num_samples(void *user, uint64_t e) { return m_n((const model *)user, e); }

static int fz_load(void *user, pf_job *job) {
    const model *m = (const model *)user;
    uint64_t *w = (uint64_t *)job->host;
    size_t bytes = (HEADER + (size_t)job->count) * 8;
    if (m->delay_us && job->rng % 3 == 0) {
        struct timespec ts = {0, (long)(job->rng % (m->delay_us + 1)) * 1000L};
        nanosleep(&ts, NULL);
    }
    if ((long long)job->epoch == m->fail_e && (long long)job->batch == m->fail_b)
        return m->fail_silent ? 1 : pf_job_fail(job, "planted failure");
    if (job->capacity < bytes) FAIL("slot of %zu bytes for %u samples", job->capacity, job->count);
    cudaSimHostWrite(job->host, bytes);
    w[0] = job->epoch;
    w[1] = job->batch;
    w[2] = job->count;
    for (uint32_t i = 0; i < job->count; i++) w[HEADER + i] = word(job->indices[i]);
    job->bytes = bytes;
    if ((long long)job->epoch == m->big_e && (long long)job->batch == m->big_b) job->bytes = job->capacity + 1;
    return 0;
}

/* The batch must hold exactly what the model says (host: checked in place;
   CUDA: by a kernel stand-in when the consumer stream runs it). */
typedef struct expect {
    const uint64_t *data;
    uint64_t epoch, batch;
    uint32_t count;
    uint64_t idx[1];
} expect;

static void verify(const expect *x) {
    if (x->data[0] != x->epoch || x->data[1] != x->batch || x->data[2] != x->count)
        FAIL("epoch %llu batch %llu: wrong header in the slot", (unsigned long long)x->epoch,
             (unsigned long long)x->batch);
    for (uint32_t i = 0; i < x->count; i++)
        if (x->data[HEADER + i] != word(x->idx[i]))
            FAIL("epoch %llu batch %llu: sample %u holds the wrong bytes", (unsigned long long)x->epoch,
                 (unsigned long long)x->batch, i);
}

static void kernel(void *arg) {
    verify((const expect *)arg);
    free(arg);
}

typedef struct counting {
    pthread_mutex_t mu;
    long live;
} counting;
static void *c_alloc(size_t n, void *u) {
    counting *c = (counting *)u;
    void *p = malloc(n);
    pthread_mutex_lock(&c->mu);
    c->live += p != NULL;
    pthread_mutex_unlock(&c->mu);
    return p;
}
static void c_free(void *p, void *u) {
    counting *c = (counting *)u;
    pthread_mutex_lock(&c->mu);
    c->live--;
    pthread_mutex_unlock(&c->mu);
    free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    input in = {data, size};
    model m;
    pf_config cfg;
    pf_loader *l = NULL;
    counting alloc;
    cudaStream_t stream = NULL;
    pf_batch held[8];
    uint32_t nheld = 0, steps;
    uint64_t epoch = 0, delivered = 0, seen[64] = {0}; /* seen: bitmap of this epoch's batches (< 4096) */
    int ended = 0, sticky = 0;
    pf_result r;
    memset(&m, 0, sizeof m);
    memset(&cfg, 0, sizeof cfg);
    m.cuda = (int)take(&in, 2);
    cfg.num_workers = 1 + take(&in, 8);
    cfg.host_slots = 1 + take(&in, 8);
    cfg.device_slots = 1 + take(&in, 4);
    m.bs = 1 + take(&in, 9);
    {
        unsigned mode = take(&in, 3); /* fixed size, or a size per epoch */
        for (int e = 0; e < 8; e++) m.sizes[e] = mode == 0 ? 1 + take(&in, 120) : take(&in, mode == 1 ? 60 : 4);
        if (mode == 0)
            for (int e = 1; e < 8; e++) m.sizes[e] = m.sizes[0];
        if (mode == 0) cfg.num_samples = m.sizes[0];
        else cfg.num_samples_fn = fz_num_samples;
    }
    m.shuffle = (int)take(&in, 2);
    m.drop_last = (int)take(&in, 2);
    m.unordered = (int)take(&in, 2);
    m.seed = take(&in, 65536);
    m.world = 1 + take(&in, 4);
    m.rank = take(&in, m.world);
    m.epochs = (take(&in, 4) + 1) % 4; /* 1, 2, 3, or 0: until destroyed */
    m.timeout = take(&in, 4) == 0 ? 1 + take(&in, 3) : 0;
    m.fail_e = m.fail_b = m.big_e = m.big_b = -1;
    if (take(&in, 4) == 0) {
        m.fail_e = take(&in, 3);
        m.fail_b = take(&in, 8);
        m.fail_silent = (int)take(&in, 2);
    }
    if (take(&in, 6) == 0) {
        m.big_e = take(&in, 3);
        m.big_b = take(&in, 8);
    }
    m.delay_us = take(&in, 3) == 0 ? take(&in, 100) : 0;
    cfg.load = fz_load;
    cfg.user = &m;
    cfg.batch_size = m.bs;
    cfg.batch_bytes = (HEADER + m.bs) * 8;
    cfg.epochs = m.epochs;
    cfg.shuffle = m.shuffle;
    cfg.drop_last = m.drop_last;
    cfg.unordered = m.unordered;
    cfg.seed = m.seed;
    cfg.rank = m.rank;
    cfg.world_size = m.world;
    cfg.timeout_ms = m.timeout ? m.timeout : 30000; /* a hang is a finding */
    cfg.backend = m.cuda ? PF_BACKEND_CUDA : PF_BACKEND_HOST;
    pthread_mutex_init(&alloc.mu, NULL);
    alloc.live = 0;
    cfg.allocator.alloc_fn = c_alloc;
    cfg.allocator.free_fn = c_free;
    cfg.allocator.user_data = &alloc;
    m.cons_slots = m.cuda ? cfg.device_slots : cfg.host_slots;
    cudaSimReset(take(&in, 1000), take(&in, 20), 1);
    if (m.cuda) {
        if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
            FAIL("simulated runtime setup");
        cudaSimForbidLegacyStream(1);
        cfg.stream = stream;
    }
    if (pf_create(&cfg, &l) != PF_OK) FAIL("pf_create: %s", pf_error(NULL));

    steps = 1 + take(&in, 400);
    for (uint32_t step = 0; step < steps + 600 && !ended; step++) {
        unsigned op = step < steps ? take(&in, 8) : (nheld ? 1 : 0); /* then drain */
        if (op == 7 && step < steps && take(&in, 4) == 0) break; /* destroy here */
        if (op >= 1 && op <= 3 && nheld) { /* release one held batch, chosen by the input */
            uint32_t k = take(&in, nheld);
            if (pf_release(l, &held[k]) != PF_OK) FAIL("pf_release: %s", pf_error(l));
            if (pf_release(l, &held[k]) != PF_ERR_INVALID_STATE) FAIL("a double release was accepted");
            held[k] = held[--nheld];
            continue;
        }
        {
            pf_batch b;
            r = pf_next(l, &b);
            if (sticky) {
                if (r != sticky) FAIL("error %d not sticky: got %d", sticky, (int)r);
                ended = 1;
                continue;
            }
            if (r == PF_OK) {
                uint64_t nb = m_batches(&m, epoch), first = b.batch * m.bs, per = m_per_rank(&m, epoch);
                pf__perm perm;
                if (b.epoch != epoch) FAIL("batch of epoch %llu during epoch %llu", (unsigned long long)b.epoch,
                                           (unsigned long long)epoch);
                if (b.batch >= nb) FAIL("batch %llu of %llu", (unsigned long long)b.batch, (unsigned long long)nb);
                if (!m.unordered && b.batch != delivered) FAIL("batch %llu, expected %llu in order",
                                                               (unsigned long long)b.batch, (unsigned long long)delivered);
                if (b.batch < 4096) {
                    if (seen[b.batch / 64] >> (b.batch % 64) & 1) FAIL("batch %llu twice", (unsigned long long)b.batch);
                    seen[b.batch / 64] |= 1ull << (b.batch % 64);
                }
                if (b.count != (per - first < m.bs ? per - first : m.bs)) FAIL("wrong count %u", b.count);
                if (b.bytes != (HEADER + (size_t)b.count) * 8) FAIL("wrong bytes");
                pf__perm_init(&perm, m_n(&m, epoch), m.seed, epoch);
                for (uint32_t i = 0; i < b.count; i++) {
                    uint64_t pos = ((first + i) * m.world + m.rank) % m_n(&m, epoch);
                    uint64_t want = m.shuffle ? pf__perm_apply(&perm, pos) : pos;
                    if (b.indices[i] != want) FAIL("epoch %llu batch %llu sample %u: index %llu, expected %llu",
                                                   (unsigned long long)epoch, (unsigned long long)b.batch, i,
                                                   (unsigned long long)b.indices[i], (unsigned long long)want);
                }
                {
                    expect *x = (expect *)malloc(sizeof(expect) + b.count * sizeof(uint64_t));
                    x->data = (const uint64_t *)b.data;
                    x->epoch = b.epoch;
                    x->batch = b.batch;
                    x->count = b.count;
                    memcpy(x->idx, b.indices, b.count * sizeof(uint64_t));
                    if (m.cuda) {
                        if (cudaSimLaunchKernel(stream, kernel, x, b.data, b.bytes) != cudaSuccess) FAIL("launch");
                    } else {
                        kernel(x);
                    }
                }
                delivered++;
                if (nheld == 8) FAIL("more than 8 held");
                held[nheld++] = b;
            } else if (r == PF_END_OF_EPOCH) {
                if (delivered != m_batches(&m, epoch))
                    FAIL("epoch %llu ended after %llu of %llu batches", (unsigned long long)epoch,
                         (unsigned long long)delivered, (unsigned long long)m_batches(&m, epoch));
                epoch++;
                delivered = 0;
                memset(seen, 0, sizeof seen);
            } else if (r == PF_END_OF_DATA) {
                if (!m.epochs || epoch != m.epochs) FAIL("END_OF_DATA at epoch %llu of %u", (unsigned long long)epoch,
                                                         m.epochs);
                if (pf_next(l, &b) != PF_END_OF_DATA) FAIL("END_OF_DATA not for ever");
                ended = 1;
            } else if (r == PF_ERR_LOAD) {
                long long e = (long long)epoch;
                int planted = (e == m.fail_e && (m.unordered || m.fail_b == (long long)delivered)) ||
                              (e == m.big_e && (m.unordered || m.big_b == (long long)delivered));
                if (!planted) FAIL("PF_ERR_LOAD at epoch %llu after %llu batches: %s", (unsigned long long)epoch,
                                   (unsigned long long)delivered, pf_error(l));
                sticky = r;
            } else if (r == PF_TIMEOUT) {
                if (!m.timeout) FAIL("a timeout without cfg.timeout_ms: %s", pf_error(l));
            } else if (r == PF_ERR_INVALID_STATE) {
                if (nheld != m.cons_slots) FAIL("INVALID_STATE holding %u of %u: %s", nheld, m.cons_slots, pf_error(l));
            } else {
                FAIL("pf_next returned %d: %s", (int)r, pf_error(l));
            }
        }
    }
    pf_destroy(l); /* with whatever is still held */
    if (alloc.live != 0) FAIL("%ld allocations leaked", alloc.live);
    if (m.cuda) {
        char msg[768];
        cudaStreamSynchronize(stream);
        cudaStreamDestroy(stream);
        if (cudaSimViolations(msg, sizeof msg)) FAIL("ordering: %s", msg);
        if (cudaSimObjectsLive() || cudaSimBytesLive()) FAIL("CUDA objects or memory leaked");
    }
    pthread_mutex_destroy(&alloc.mu);
    return 0;
}

#ifdef FUZZ_REPLAY
/* Without libFuzzer: run each file named (or each file in a directory). */
#include <dirent.h>
static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    uint8_t buf[1 << 16];
    size_t n;
    if (!f) return 0;
    n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    return 1;
}
int main(int argc, char **argv) {
    int files = 0;
    for (int i = 1; i < argc; i++) {
        DIR *d = opendir(argv[i]);
        if (!d) {
            files += run_file(argv[i]);
            continue;
        }
        for (struct dirent *e; (e = readdir(d));) {
            char path[4096];
            if (e->d_name[0] == '.') continue;
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            files += run_file(path);
        }
        closedir(d);
    }
    printf("fuzz corpus replay: %d inputs, every invariant held\nRESULT %d 0 0\n", files, files);
    return files ? 0 : 1;
}
#endif
