/* two_tu_main.c - another file only includes the header and links against
   the implementation in two_tu_impl.c. */
#include "../../prefetch.h"
#include <stdio.h>
#include <string.h>

static int load(void *user, pf_job *job) {
    (void)user;
    memset(job->host, (int)(job->batch & 0xff), job->capacity);
    return 0;
}

int main(void) {
    pf_config cfg;
    pf_loader *l;
    int n = 0, ok;
    memset(&cfg, 0, sizeof cfg);
    cfg.load = load;
    cfg.num_samples = 64;
    cfg.batch_size = 8;
    cfg.batch_bytes = 64;
    cfg.epochs = 1;
    cfg.backend = PF_BACKEND_HOST;
    ok = pf_create(&cfg, &l) == PF_OK;
    if (ok) {
        pf_batch b;
        while (pf_next(l, &b) == PF_OK) {
            ok &= ((unsigned char *)b.data)[63] == (unsigned char)b.batch;
            pf_release(l, &b);
            n++;
        }
        pf_destroy(l);
    }
    ok &= n == 8;
    printf("two translation units: %s\nRESULT %d %d 0\n", ok ? "ok" : "FAILED", ok, !ok);
    return !ok;
}
