/* promise 4: autotune ring growth, 1 MiB batches, loads sleep 4 ms */
#include "common.h"
#define MB (1u << 20)

static int load_io(void *user, pf_job *job) {
    ds_t *d = user; atomic_fetch_add(&d->loads, 1);
    sleep_ns(4000000);
    uint64_t *o = job->host; o[0] = patt(job->indices[0], 0); o[MB / 8 - 1] = patt(job->indices[0], 1);
    job->bytes = MB; return 0;
}

static void run(int autotune, uint32_t nw, uint64_t nb, uint64_t destroy_at, double consumer_ns) {
    ds_t d = {0};
    pf_config c = PF_CONFIG_INIT; c.load = load_io; c.user = &d; c.num_samples = 100000; c.batch_size = 1; c.batch_bytes = MB;
    c.epochs = 0; c.autotune = autotune; c.num_workers = nw; c.backend = PF_BACKEND_HOST; c.log = mylog;
    pf_loader *l; if (pf_create(&c, &l) != PF_OK) { FAILF("create %s", pf_error(NULL)); return; }
    pf_stats st; pf_get_stats(l, &st); uint32_t s0 = st.host_slots, peak = s0, peakw = 0;
    double t0 = now_s(), tm = 0; uint64_t n = 0;
    while (n < nb) {
        pf_batch b; pf_result r = pf_next(l, &b);
        if (r != PF_OK) { FAILF("next %d %s", r, pf_error(l)); break; }
        const uint64_t *o = b.data; if (b.batch != n || o[0] != patt(b.indices[0], 0) || o[MB / 8 - 1] != patt(b.indices[0], 1)) FAILF("bad batch %llu", (unsigned long long)n);
        if (consumer_ns) sleep_ns(consumer_ns);
        pf_release(l, &b); n++;
        if (n == nb / 2) tm = now_s();
        pf_get_stats(l, &st); if (st.host_slots > peak) peak = st.host_slots; if (st.workers_active > peakw) peakw = st.workers_active;
        if (st.host_slots > (c.host_slots ? c.host_slots : 4096)) FAILF("host_slots %u", st.host_slots);
        if (destroy_at && n == destroy_at) break;
    }
    double t1 = now_s();
    pf_get_stats(l, &st); char line[512]; pf_stats_format(l, line, sizeof line);
    if (!destroy_at)
        printf("%s nw=%u cons=%.1fms: %llu batches, 2nd-half rate %.0f/s, host_slots start %u peak %u end %u (peak %.0f MiB), workers_active peak %u end %u\n   %s\n",
               autotune ? "autotune" : "fixed   ", nw, consumer_ns / 1e6, (unsigned long long)n, (nb - nb / 2) / (t1 - tm), s0, peak, st.host_slots, peak * 1.0, peakw, st.workers_active, line);
    else printf("destroy at %llu: host_slots %u workers %u\n", (unsigned long long)n, st.host_slots, st.workers_active);
    pf_destroy(l);
}

int main(int argc, char **argv) {
    alarm(280);
    const char *w = argc > 1 ? argv[1] : "gd";
    if (strchr(w, 'g')) {
        for (int cn = 0; cn < 2; cn++) {
            double cns = cn ? 1000000 : 0;
            run(1, 0, 1500, 0, cns);
            uint32_t fixed[] = {2, 4, 8, 16};
            for (int i = 0; i < 4; i++) run(0, fixed[i], 800, 0, cns);
        }
    }
    if (strchr(w, 'd')) for (uint64_t k = 1; k < 300; k += 17) run(1, 0, 100000, k, 0);
    printf("RESULT %s (%d failures)\n", g_fail ? "FAIL" : "PASS", g_fail);
    return g_fail != 0;
}
