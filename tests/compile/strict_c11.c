/* strict_c11.c - the header in a strict ISO C11 file: no POSIX feature
   macros (so no clock_gettime: the C11 timespec_get path), all warnings as
   errors, and it must still load every batch. Also built as C++17. */
#define PREFETCH_IMPLEMENTATION
#include "../../prefetch.h"
#include "../../prefetch.h" /* a second include is harmless */
#include <stdio.h>
#include <string.h>

static int load(void *user, pf_job *job) {
    uint32_t *out = (uint32_t *)job->host;
    (void)user;
    for (uint32_t i = 0; i < job->count; i++) out[i] = (uint32_t)job->indices[i];
    job->bytes = job->count * sizeof(uint32_t);
    return 0;
}

int main(void) {
    pf_config cfg;
    pf_loader *l;
    uint64_t sum = 0, batches = 0;
    int ok = 1;
    memset(&cfg, 0, sizeof cfg);
    cfg.load = load;
    cfg.num_samples = 1000;
    cfg.batch_size = 10;
    cfg.batch_bytes = 10 * sizeof(uint32_t);
    cfg.epochs = 2;
    cfg.backend = PF_BACKEND_HOST;
    cfg.timeout_ms = 60000;
    if (pf_create(&cfg, &l) != PF_OK) {
        printf("create failed: %s\n", pf_error(NULL));
        ok = 0;
    } else {
        for (;;) {
            pf_batch b;
            pf_result r = pf_next(l, &b);
            if (r == PF_END_OF_EPOCH) continue;
            if (r != PF_OK) {
                ok &= r == PF_END_OF_DATA;
                break;
            }
            for (uint32_t i = 0; i < b.count; i++) sum += ((const uint32_t *)b.data)[i];
            batches++;
            pf_release(l, &b);
        }
        pf_destroy(l);
    }
    ok &= batches == 200 && sum == 2 * 999 * 1000 / 2;
    printf("strict C11 build: %s\nRESULT %d %d 0\n", ok ? "ok" : "FAILED", ok, !ok);
    return !ok;
}
