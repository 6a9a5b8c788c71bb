/* images_tar.c - an image classification input pipeline from a tar shard,
   WebDataset style, with no load callback.

   The shard holds KEY.ppm (a binary PPM image of any size) and KEY.cls (its
   label, as text) for each sample, as WebDataset writes them. The tar
   reader (pf_tar_open) indexes the shard once, groups the two files of each
   key into one sample, and hands both parts to a per-sample step on the
   worker threads: it decodes the PPM, resizes it to 32x32 (nearest), flips
   it left-right for half of the samples (from job->rng: the same choice on
   every run, whichever worker runs it) and writes the pixels and the label
   into the slot. A few images are corrupt on purpose: with
   cfg.bad_samples = PF_BAD_SKIP they are skipped and counted (each batch
   lists them), as WebDataset's warn_and_continue does, and the run stops
   only past cfg.bad_limit. Each worker keeps a scratch row buffer made and
   freed on its own thread (cfg.worker_init / cfg.worker_stop).

   With --check every pixel and label is compared with the generator and
   the skipped samples must be exactly the corrupt ones; this is how
   `make test` runs it.

   Build: cc -O2 -std=c11 examples/images_tar.c -o images_tar -lpthread
   Run:   ./images_tar [--check] [--quick] [--dir DIR] */
#define _POSIX_C_SOURCE 200809L
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SIDE 32                           /* the network's input: SIDE x SIDE RGB */
#define PIXELS (SIDE * SIDE * 3)
#define SAMPLE (PIXELS + 4)               /* pixels, then the int32 label */
#define CLASSES 10

/* ---- the data: image k is w x h with a pattern of (k, x, y) ---- */
static unsigned img_w(unsigned k) { return 16 + (k * 37) % 90; }
static unsigned img_h(unsigned k) { return 12 + (k * 53) % 70; }
static void img_px(unsigned k, unsigned x, unsigned y, unsigned char *rgb) {
    rgb[0] = (unsigned char)(x * 7 + k);
    rgb[1] = (unsigned char)(y * 5 + k * 3);
    rgb[2] = (unsigned char)((x ^ y) + k);
}
static int corrupt(unsigned k) { return k % 97 == 41; } /* a truncated or garbled file */

/* ---- a minimal ustar writer ---- */
static void tar_put(FILE *f, const char *name, const void *data, size_t n) {
    static const unsigned char zero[512];
    unsigned char h[512];
    unsigned sum = 0;
    memset(h, 0, sizeof h);
    snprintf((char *)h, 100, "%s", name);
    memcpy(h + 100, "0000644", 7);
    memcpy(h + 108, "0000000", 7);
    memcpy(h + 116, "0000000", 7);
    snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)n);
    memcpy(h + 136, "00000000000", 11);
    memset(h + 148, ' ', 8);
    h[156] = '0';
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    for (int i = 0; i < 512; i++) sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    fwrite(h, 1, 512, f);
    fwrite(data, 1, n, f);
    fwrite(zero, 1, (512 - n % 512) % 512, f);
}

static int write_shard(const char *path, unsigned n) {
    FILE *f = fopen(path, "wb");
    static const unsigned char end[1024];
    unsigned char *buf = (unsigned char *)malloc(64 + 105 * 81 * 3);
    if (!f || !buf) return -1;
    for (unsigned k = 0; k < n; k++) {
        char name[64], cls[16];
        unsigned w = img_w(k), h = img_h(k);
        int len = snprintf((char *)buf, 64, "P6\n%u %u\n255\n", w, h);
        unsigned char *p = buf + len;
        for (unsigned y = 0; y < h; y++)
            for (unsigned x = 0; x < w; x++, p += 3) img_px(k, x, y, p);
        if (corrupt(k)) buf[1] = 'X'; /* not a PPM any more */
        snprintf(name, sizeof name, "train/%06u.ppm", k);
        tar_put(f, name, buf, (size_t)(p - buf) - (corrupt(k) ? 100 : 0));
        snprintf(name, sizeof name, "train/%06u.cls", k);
        snprintf(cls, sizeof cls, "%u", k % CLASSES);
        tar_put(f, name, cls, strlen(cls));
    }
    fwrite(end, 1, sizeof end, f);
    free(buf);
    return fclose(f);
}

/* ---- per-worker state: a scratch row, made and freed on the worker ---- */
typedef struct scratch {
    unsigned char row[SIDE * 3];
} scratch;
static void *worker_init(void *user, uint32_t worker) {
    (void)user, (void)worker;
    return calloc(1, sizeof(scratch));
}
static void worker_stop(void *user, uint32_t worker, void *state) {
    (void)user, (void)worker;
    free(state);
}

static int flips(uint64_t rng, uint64_t index) { /* the augmentation's coin: the batch's rng and the sample */
    uint64_t z = rng + 0x9e3779b97f4a7c15ull * (index + 1);
    z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
    return (int)((z >> 40) & 1);
}

/* ---- the step: decode, resize, flip; pixels then the label ---- */
static int decode(void *user, pf_sample *s) {
    const pf_part *ppm = NULL, *cls = NULL;
    const unsigned char *px;
    unsigned char *out = (unsigned char *)s->out;
    scratch *sc = (scratch *)s->job->worker_state;
    unsigned w, h, maxv;
    int at = 0;
    char head[32], label[16];
    int32_t y;
    (void)user;
    for (uint32_t p = 0; p < s->num_parts; p++) {
        if (!strcmp(s->parts[p].name, "ppm")) ppm = &s->parts[p];
        if (!strcmp(s->parts[p].name, "cls")) cls = &s->parts[p];
    }
    if (!ppm || !cls || cls->bytes >= sizeof label) return pf_job_skip(s->job, s->i, "%s: a part is missing", s->key);
    memcpy(head, ppm->data, ppm->bytes < sizeof head - 1 ? ppm->bytes : sizeof head - 1);
    head[ppm->bytes < sizeof head - 1 ? ppm->bytes : sizeof head - 1] = '\0';
    if (sscanf(head, "P6 %u %u %u%n", &w, &h, &maxv, &at) != 3 || maxv != 255 || !w || !h ||
        (size_t)at + 1 + (size_t)w * h * 3 > ppm->bytes)
        return pf_job_skip(s->job, s->i, "%s.ppm is not a 8-bit binary PPM, or is truncated", s->key);
    px = (const unsigned char *)ppm->data + at + 1;
    for (unsigned oy = 0; oy < SIDE; oy++) {
        const unsigned char *src = px + (size_t)(oy * h / SIDE) * w * 3;
        for (unsigned ox = 0; ox < SIDE; ox++) memcpy(sc->row + ox * 3, src + (size_t)(ox * w / SIDE) * 3, 3);
        for (unsigned ox = 0; ox < SIDE; ox++) {
            unsigned from = flips(s->job->rng, s->index) ? SIDE - 1 - ox : ox;
            memcpy(out + (oy * SIDE + ox) * 3, sc->row + from * 3, 3);
        }
    }
    memcpy(label, cls->data, cls->bytes);
    label[cls->bytes] = '\0';
    y = (int32_t)atoi(label);
    memcpy(out + PIXELS, &y, 4);
    s->out_bytes = SAMPLE;
    return 0;
}

/* What sample k should decode to, for --check. */
static int expected(unsigned k, int flip, const unsigned char *got) {
    unsigned w = img_w(k), h = img_h(k);
    int32_t y;
    for (unsigned oy = 0; oy < SIDE; oy++)
        for (unsigned ox = 0; ox < SIDE; ox++) {
            unsigned sx = flip ? SIDE - 1 - ox : ox;
            unsigned char rgb[3];
            img_px(k, sx * w / SIDE, oy * h / SIDE, rgb);
            if (memcmp(rgb, got + (oy * SIDE + ox) * 3, 3)) return 0;
        }
    memcpy(&y, got + PIXELS, 4);
    return y == (int32_t)(k % CLASSES);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int check = 0, quick = 0, bad = 0;
    char dir[256] = "", path[300];
    const char *paths[1] = {path};
    unsigned n, ncorrupt = 0, epochs = 2;
    pf_tar_config tc;
    pf_tar *tar;
    pf_config cfg = PF_CONFIG_INIT;
    pf_loader *l;
    pf_stats st;
    uint64_t samples = 0, skipped = 0, wrong = 0;
    double t0, sum = 0;
    char line[256];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) check = 1;
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) snprintf(dir, sizeof dir, "%s", argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--check] [--quick] [--dir DIR]\n", argv[0]);
            return 2;
        }
    }
    n = quick ? 1000 : 20000;
    for (unsigned k = 0; k < n; k++) ncorrupt += (unsigned)corrupt(k);
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/prefetch-images-XXXXXX");
        if (!mkdtemp(dir)) return 1;
    }
    snprintf(path, sizeof path, "%s/shard-000000.tar", dir);
    if (write_shard(path, n) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        return 1;
    }
    cfg.batch_size = 64;
    cfg.epochs = epochs;
    cfg.shuffle = true;
    cfg.seed = 1234;
    cfg.num_workers = 4;
    cfg.backend = PF_BACKEND_HOST;      /* a GPU build would copy only the bytes used */
    cfg.worker_init = worker_init;      /* the reader runs these for us, on each worker */
    cfg.worker_stop = worker_stop;
    cfg.bad_samples = PF_BAD_SKIP;      /* skip and count a corrupt image ... */
    cfg.bad_limit = n / 50;             /* ... but stop past 2% of the shard */
    memset(&tc, 0, sizeof tc);
    tc.paths = paths;
    tc.num_paths = 1;
    tc.step = decode;
    tc.sample_bytes = SAMPLE;           /* slots: batch_size * SAMPLE */
    if (pf_tar_open(&tc, &cfg, &tar) != PF_OK || pf_create(&cfg, &l) != PF_OK) {
        fprintf(stderr, "%s\n", pf_error(NULL));
        return 1;
    }
    printf("images_tar: %llu samples (KEY.ppm + KEY.cls) indexed in %s, %u of them corrupt\n",
           (unsigned long long)pf_tar_samples(tar), path, ncorrupt);
    t0 = now_s();
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r == PF_END_OF_DATA) break;
        if (r != PF_OK) {
            fprintf(stderr, "pf_next: %s\n", pf_error(l));
            bad++;
            break;
        }
        for (uint32_t i = 0; i < b.count; i++) { /* "train": a stand-in that reads every byte */
            const unsigned char *p = (const unsigned char *)b.data + b.offsets[i];
            for (int k = 0; k < PIXELS; k++) sum += p[k];
            if (check && (b.offsets[i + 1] - b.offsets[i] != SAMPLE ||
                          !expected((unsigned)b.indices[i], flips(b.rng, b.indices[i]), p)))
                wrong++;
        }
        for (uint32_t i = 0; i < b.skipped; i++)
            if (!corrupt((unsigned)b.skipped_indices[i])) wrong++;
        samples += b.count;
        skipped += b.skipped;
        pf_release(l, &b);
    }
    t0 = now_s() - t0;
    pf_get_stats(l, &st);
    pf_stats_format(l, line, sizeof line);
    pf_destroy(l);
    pf_tar_close(tar);
    unlink(path);
    rmdir(dir);
    printf("%llu images decoded in %.3f s (%.0f images/s, 4 workers), %llu corrupt ones skipped (stats: %llu)\n%s\n",
           (unsigned long long)samples, t0, samples / t0, (unsigned long long)skipped,
           (unsigned long long)st.skipped, line);
    if (check) {
        if (wrong || samples != (uint64_t)epochs * (n - ncorrupt) || skipped != (uint64_t)epochs * ncorrupt ||
            st.skipped != skipped)
            bad++;
        printf("%s (mean pixel %.1f)\n", bad ? "CHECK FAILED" : "every pixel, label and skip checked",
               sum / ((double)samples * PIXELS));
    }
    return bad ? 1 : 0;
}
