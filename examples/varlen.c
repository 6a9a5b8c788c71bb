/* varlen.c - samples of different sizes in one batch: text lines of 1 to
   200 bytes, packed back to back by pf_job_append; the batch's offsets say
   where each one starts, and on a GPU only the bytes used are copied.

     cc -O2 -std=c11 examples/varlen.c -o varlen -lpthread
     ./varlen [--check]     --check: every line arrives whole, each once */
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINES 10000
#define MAX_LINE 200

/* Line k: its length and its bytes, made up from k. */
static size_t line_bytes(uint64_t k) { return 1 + (size_t)((k * 2654435761u) % MAX_LINE); }
static void line_text(uint64_t k, char *dst) {
    size_t n = line_bytes(k);
    for (size_t j = 0; j < n; j++) dst[j] = (char)('a' + (k + j) % 26);
}

static int load(void *user, pf_job *job) {
    (void)user;
    for (uint32_t i = 0; i < job->count; i++) {
        size_t n = line_bytes(job->indices[i]);
        char *dst = (char *)pf_job_append(job, n); /* right after the previous sample */
        if (!dst) return -1;                       /* it did not fit: the job failed, with a message */
        line_text(job->indices[i], dst);
    }
    return 0;                                      /* job->bytes is the bytes used */
}

int main(int argc, char **argv) {
    int check = argc > 1 && !strcmp(argv[1], "--check");
    unsigned char *seen = (unsigned char *)calloc(LINES, 1);
    uint64_t lines = 0, bytes = 0, bad = 0;
    pf_config cfg = PF_CONFIG_INIT;
    pf_loader *loader;
    cfg.load = load;
    cfg.num_samples = LINES;
    cfg.batch_size = 32;
    cfg.batch_bytes = 32 * MAX_LINE;               /* room for the worst case */
    cfg.shuffle = true;
    cfg.epochs = 1;
    if (pf_create(&cfg, &loader) != PF_OK) {
        fprintf(stderr, "%s\n", pf_error(NULL));
        return 1;
    }
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(loader, &b);
        if (r == PF_END_OF_EPOCH || r == PF_END_OF_DATA) break;
        if (r != PF_OK) {
            fprintf(stderr, "%s\n", pf_error(loader));
            return 1;
        }
        for (uint32_t i = 0; i < b.count; i++) {
            const char *line = (const char *)b.data + b.offsets[i];
            size_t n = b.offsets[i + 1] - b.offsets[i];
            if (check) {
                char want[MAX_LINE];
                line_text(b.indices[i], want);
                bad += n != line_bytes(b.indices[i]) || memcmp(line, want, n) != 0 || seen[b.indices[i]]++;
            }
            bytes += n;
            lines++;
        }
        pf_release(loader, &b);
    }
    pf_destroy(loader);
    printf("%llu lines, %llu bytes (%.0f per line)%s\n", (unsigned long long)lines, (unsigned long long)bytes,
           (double)bytes / (double)(lines ? lines : 1), check ? (bad ? ", WRONG" : ", each whole and once") : "");
    free(seen);
    if (check) printf("RESULT %d %d 0\n", !bad && lines == LINES, bad || lines != LINES);
    return bad || lines != LINES;
}
