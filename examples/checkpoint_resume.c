/* checkpoint_resume.c - a training loop that saves the loader's position
   with its checkpoints and, after a crash, carries on exactly where the
   last checkpoint was taken: the same batches, in the same order, with the
   same per-batch rng, as if it had never stopped.

   Every 25 steps it saves "model + pf_checkpoint token" (here: the step
   count, a running digest standing in for the weights, and the token) to
   a file, atomically (write a temporary file, then rename). Killed at any
   moment, a restart reads that file, sets cfg.resume to the token and goes
   on; the steps since the last checkpoint are simply done again, as with
   any training checkpoint.

   With --check it proves it: one run is never stopped; others "crash" at
   several points (mid-epoch, right after an epoch's end) and restart from
   their checkpoint file; every one must end with the same digest of every
   batch it trained on. This is how `make test` runs it.

   Build: cc -O2 -std=c11 examples/checkpoint_resume.c -o checkpoint_resume -lpthread
   Run:   ./checkpoint_resume [--check] [--dir DIR] */
#define _POSIX_C_SOURCE 200809L
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SAMPLES = 3000, BATCH = 32, EPOCHS = 3, EVERY = 25 };

static int load(void *user, pf_job *job) {
    uint64_t *x = (uint64_t *)job->host;
    (void)user;
    for (uint32_t i = 0; i < job->count; i++) x[i] = job->indices[i] * 2654435761u; /* "decode" */
    job->bytes = job->count * sizeof(uint64_t);
    return 0;
}

/* The "model": a digest of everything it trained on, in order. */
static uint64_t step(uint64_t model, const pf_batch *b) {
    const uint64_t *x = (const uint64_t *)b->data;
    for (uint32_t i = 0; i < b->count; i++) model = (model ^ x[i] ^ b->rng) * 0x100000001b3ull;
    return model;
}

typedef struct ckpt {
    unsigned long long steps, model;
    char token[512];
} ckpt;

static int save(const char *path, const ckpt *c) {
    char tmp[600];
    FILE *f;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!(f = fopen(tmp, "w"))) return -1;
    fprintf(f, "steps %llu\nmodel %llu\nloader %s\n", c->steps, c->model, c->token);
    if (fclose(f) != 0) return -1;
    return rename(tmp, path); /* a crash leaves the old file or the new one, never half of one */
}

static int restore(const char *path, ckpt *c) {
    FILE *f = fopen(path, "r");
    int ok;
    if (!f) return 0;
    ok = fscanf(f, "steps %llu\nmodel %llu\nloader ", &c->steps, &c->model) == 2 &&
         fgets(c->token, sizeof c->token, f) != NULL;
    fclose(f);
    if (ok) c->token[strcspn(c->token, "\n")] = '\0';
    return ok;
}

/* Train from the checkpoint file if there is one; stop ("crash") after
   crash_at steps (0: never). Returns the model digest at the end. */
static unsigned long long train(const char *path, unsigned long long crash_at, int verbose) {
    ckpt c = {0, 1469598103934665603ull, ""};
    pf_config cfg = PF_CONFIG_INIT;
    pf_loader *l;
    int resumed = restore(path, &c);
    cfg.load = load;
    cfg.num_samples = SAMPLES;
    cfg.batch_size = BATCH;
    cfg.batch_bytes = BATCH * sizeof(uint64_t);
    cfg.epochs = EPOCHS;
    cfg.shuffle = true;
    cfg.seed = 42;
    cfg.backend = PF_BACKEND_HOST;
    cfg.resume = resumed ? c.token : NULL;
    if (pf_create(&cfg, &l) != PF_OK) {
        fprintf(stderr, "pf_create: %s\n", pf_error(NULL));
        exit(1);
    }
    if (verbose && resumed) printf("  resumed at step %llu from \"%s\"\n", c.steps, c.token);
    for (;;) {
        pf_batch b;
        pf_result r = pf_next(l, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r == PF_END_OF_DATA) break;
        if (r != PF_OK) {
            fprintf(stderr, "pf_next: %s\n", pf_error(l));
            exit(1);
        }
        c.model = step(c.model, &b);
        pf_release(l, &b);
        c.steps++;
        if (c.steps % EVERY == 0) { /* the model and the loader's position, together */
            if (pf_checkpoint(l, c.token, sizeof c.token) != PF_OK || save(path, &c) != 0) {
                fprintf(stderr, "checkpoint: %s\n", pf_error(l));
                exit(1);
            }
        }
        if (crash_at && c.steps == crash_at) {
            if (verbose) printf("  crash at step %llu (last checkpoint at step %llu)\n", c.steps,
                                c.steps / EVERY * EVERY);
            pf_destroy(l);
            return 0;
        }
    }
    pf_destroy(l);
    return c.model;
}

int main(int argc, char **argv) {
    const char *dir = ".";
    char path[512];
    int check = 0, bad = 0;
    const unsigned long long per_epoch = (SAMPLES + BATCH - 1) / BATCH;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) check = 1;
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--check] [--dir DIR]\n", argv[0]);
            return 2;
        }
    }
    snprintf(path, sizeof path, "%s/checkpoint_resume.ckpt", dir);
    remove(path);
    {
        unsigned long long want = train(path, 0, 0);
        /* crash points: mid-epoch, right at a checkpoint, on an epoch's last
           step, twice in one run */
        const unsigned long long crashes[][2] = {{37, 0}, {50, 0}, {per_epoch, 0}, {per_epoch * 2 + 3, 0}, {60, 160}};
        printf("checkpoint_resume: %u epochs of %llu steps, a checkpoint every %d steps; never stopped: model %016llx\n",
               EPOCHS, per_epoch, EVERY, want);
        for (size_t i = 0; i < (check ? sizeof crashes / sizeof crashes[0] : 1); i++) {
            unsigned long long got;
            remove(path);
            (void)train(path, crashes[i][0], !check || i == 0);
            if (crashes[i][1]) (void)train(path, crashes[i][1], !check);
            got = train(path, 0, !check || i == 0); /* restart from the file */
            printf("  crashed at step %llu%s, restarted: model %016llx %s\n", crashes[i][0],
                   crashes[i][1] ? " and again later" : "", got, got == want ? "(the same)" : "DIFFERENT");
            bad += got != want;
        }
    }
    remove(path);
    if (bad) fprintf(stderr, "checkpoint_resume: %d restarted runs differ from the run never stopped\n", bad);
    return bad ? 1 : 0;
}
