/* cuda_shape.c - the CUDA backend built against a toolkit header surface
   shaped like an older CUDA (tests/cuda_shapes.sh makes them: 11.8, 12.4,
   12.8), with gcc, g++ and nvcc; `make test` runs what it builds.
   SHAPE_VERSION is the CUDART_VERSION the shaped header must report.
   The build is the test: the entry-point lookup and every other CUDA call
   must compile against that version's declarations. Run, it says which
   lookup was compiled in, and where the shaped header's ABI is the
   installed libcudart's (12.0 on: the four-argument lookup), it also runs
   a loader: without a GPU, PF_BACKEND_CUDA says why and DEFAULT delivers
   on the host; with one, every batch comes from the device. An 11.x build
   links the three-argument lookup against a newer libcudart whose
   function takes four, so it is only built, as a user on 11.8 would build
   it, and not run. */
#define PREFETCH_CUDA
#define PREFETCH_IMPLEMENTATION
#include "../../prefetch.h"

#ifndef SHAPE_VERSION
#error "build with -DSHAPE_VERSION=<the CUDART_VERSION of the shaped header>"
#endif
#if CUDART_VERSION != SHAPE_VERSION
#error "the shaped header was not the one included"
#endif

static int load(void *user, pf_job *job) {
    (void)user;
    memset(job->host, (int)(job->batch & 0xff), job->capacity);
    return 0;
}

int main(void) {
    printf("built against CUDART_VERSION %d: driver entry points through %s\n", CUDART_VERSION,
           CUDART_VERSION >= 12050   ? "cudaGetDriverEntryPointByVersion"
           : CUDART_VERSION >= 12000 ? "cudaGetDriverEntryPoint (four arguments)"
                                     : "cudaGetDriverEntryPoint (three arguments)");
#if CUDART_VERSION < 12000
    (void)load;
    printf("an 11.x ABI: built only (the installed libcudart is newer)\n");
    printf("RESULT 1 0 0\n");
    return 0;
#else
    pf_config cfg;
    pf_loader *l = NULL;
    pf_result r;
    int n = 0;
    memset(&cfg, 0, sizeof cfg);
    cfg.load = load;
    cfg.num_samples = 64;
    cfg.batch_size = 8;
    cfg.batch_bytes = 4096;
    cfg.epochs = 1;
    cfg.num_workers = 2;
    cfg.backend = PF_BACKEND_DEFAULT;
    r = pf_create(&cfg, &l);
    if (r != PF_OK) {
        printf("pf_create: %s\nRESULT 0 1 0\n", pf_error(NULL));
        return 1;
    }
    for (;;) {
        pf_batch b;
        r = pf_next(l, &b);
        if (r != PF_OK) break;
        n++;
        if (pf_release(l, &b) != PF_OK) break;
    }
    printf("%s backend: %d batches, then %s\n", pf_get_backend(l) == PF_BACKEND_CUDA ? "CUDA" : "host", n,
           pf_result_string(r));
    pf_destroy(l);
    printf("RESULT %d %d 0\n", n == 8 ? 1 : 0, n == 8 ? 0 : 1);
    return n == 8 ? 0 : 1;
#endif
}
