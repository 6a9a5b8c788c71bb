/* test_launch.c - pf_shard_from_env: real processes started with each
   launcher's variables (torchrun, Open MPI, MPICH/PMI, SLURM), world sizes
   1 to 4, with and without drop_last; the union of their batches covers
   the epoch, disjoint, equal counts. Then malformed and contradictory
   values, each rejected with the variable named. */
#define _POSIX_C_SOURCE 200809L
#define PREFETCH_IMPLEMENTATION
#include "../prefetch.h"
#include "util.h"

#include <sys/wait.h>
#include <unistd.h>

static const char *const all_vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
                                       "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE",
                                       "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                       "CUDA_VISIBLE_DEVICES"};

static void clear_env(void) { /* the test itself may run under a launcher */
    for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++) unsetenv(all_vars[i]);
}

#define N_SAMPLES 103
#define BS 4

/* Child: shard from the environment, load one shuffled epoch, print
   "rank world device" then every index, one per line. */
static int child(int drop_last) {
    tload t;
    tcons c;
    pf_config cfg;
    pf_result r;
    t_load_init(&t);
    t_cons_init(&c);
    cfg = t_config(&t, N_SAMPLES, BS, 1);
    cfg.shuffle = true;
    cfg.seed = 11;
    cfg.drop_last = drop_last != 0;
    cfg.cuda_device = 99; /* must be replaced by the local rank */
    if (pf_shard_from_env(&cfg) != PF_OK) {
        printf("error %s\n", pf_error(NULL));
        return 1;
    }
    if (pf_create(&cfg, &c.l) != PF_OK) {
        printf("error %s\n", pf_error(NULL));
        return 1;
    }
    printf("%u %u %d\n", cfg.rank, cfg.world_size, cfg.cuda_device);
    for (;;) {
        pf_batch b;
        r = t_next(&c, &b);
        if (r == PF_END_OF_EPOCH) continue;
        if (r != PF_OK) break;
        for (uint32_t i = 0; i < b.count; i++) printf("%llu\n", (unsigned long long)b.indices[i]);
        printf("-\n"); /* end of a batch */
        pf_release(c.l, &b);
    }
    pf_destroy(c.l);
    return r == PF_END_OF_DATA && c.bad == 0 ? 0 : 1;
}

typedef struct launcher {
    const char *name, *rank, *size, *local; /* local may be NULL */
} launcher;

static const launcher launchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"MPICH/PMI", "PMI_RANK", "PMI_SIZE", NULL},
    {"SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

static void test_processes_of_every_launcher_share_an_epoch(void) {
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(len > 0);
    if (len <= 0) return;
    self[len] = '\0';
    for (size_t li = 0; li < sizeof launchers / sizeof launchers[0]; li++)
        for (unsigned world = 1; world <= 4; world++)
            for (int drop = 0; drop <= 1; drop++) {
                const launcher *L = &launchers[li];
                FILE *out[4];
                pid_t pid[4];
                unsigned hits[N_SAMPLES] = {0};
                uint64_t total = 0, batches[4] = {0};
                for (unsigned r = 0; r < world; r++) { /* all ranks run at once, as launched */
                    int fds[2];
                    char e0[64], e1[64], e2[64], *envp[4] = {e0, e1, NULL, NULL};
                    char *argv[] = {self, (char *)"--child", (char *)(drop ? "1" : "0"), NULL};
                    snprintf(e0, sizeof e0, "%s=%u", L->rank, r);
                    snprintf(e1, sizeof e1, "%s=%u", L->size, world);
                    if (L->local) {
                        snprintf(e2, sizeof e2, "%s=%u", L->local, r % 2); /* two processes per node */
                        envp[2] = e2;
                    }
                    CHECK(pipe(fds) == 0);
                    pid[r] = fork();
                    if (pid[r] == 0) {
                        dup2(fds[1], 1);
                        close(fds[0]);
                        close(fds[1]);
                        execve(self, argv, envp);
                        _exit(127);
                    }
                    close(fds[1]);
                    out[r] = fdopen(fds[0], "r");
                }
                for (unsigned r = 0; r < world; r++) {
                    char line[256];
                    unsigned rank = 99, size = 99;
                    int dev = -9, status = 0;
                    if (fgets(line, sizeof line, out[r]) && sscanf(line, "%u %u %d", &rank, &size, &dev) == 3) {
                        CHECK_EQ(rank, r);
                        CHECK_EQ(size, world);
                        CHECK_EQ(dev, L->local ? (int)(r % 2) : 99); /* no local rank: left alone */
                    } else {
                        CHECKF(0, "%s rank %u: %s", L->name, r, line);
                    }
                    while (fgets(line, sizeof line, out[r])) {
                        if (line[0] == '-') {
                            batches[r]++;
                            continue;
                        }
                        {
                            unsigned long long x = strtoull(line, NULL, 10);
                            CHECK(x < N_SAMPLES);
                            if (x < N_SAMPLES) hits[x]++;
                            total++;
                        }
                    }
                    fclose(out[r]);
                    waitpid(pid[r], &status, 0);
                    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s rank %u of %u failed", L->name, r, world);
                }
                for (unsigned r = 1; r < world; r++)
                    CHECKF(batches[r] == batches[0], "%s world %u: rank %u has %llu batches, rank 0 %llu", L->name,
                           world, r, (unsigned long long)batches[r], (unsigned long long)batches[0]);
                if (drop) {
                    for (unsigned i = 0; i < N_SAMPLES; i++) CHECK(hits[i] <= 1); /* disjoint */
                    CHECK_EQ(total, (N_SAMPLES / world) / BS * BS * world);
                } else {
                    for (unsigned i = 0; i < N_SAMPLES; i++) CHECK(hits[i] >= 1); /* covered */
                    CHECK_EQ(total, (N_SAMPLES + world - 1) / world * world);
                }
            }
}

typedef struct env_case {
    const char *vars[4]; /* NAME=value */
    pf_result want;
    const char *says;
} env_case;

static void test_malformed_and_contradictory_values_are_named(void) {
    static const env_case cases[] = {
        {{"RANK=abc", "WORLD_SIZE=2"}, PF_ERR_INVALID_ARG, "RANK=\"abc\" (torchrun) is not a rank"},
        {{"RANK=2000000", "WORLD_SIZE=4"}, PF_ERR_INVALID_ARG,
         "RANK=\"2000000\" (torchrun) is not a rank: expected a number from 0 to 65535"},
        {{"RANK=2", "WORLD_SIZE=2"}, PF_ERR_INVALID_ARG, "RANK=2 is not below WORLD_SIZE=2"},
        {{"RANK=0"}, PF_ERR_INVALID_ARG, "RANK is set (torchrun) but WORLD_SIZE is not"},
        {{"WORLD_SIZE=4"}, PF_ERR_INVALID_ARG, "WORLD_SIZE is set (torchrun) but RANK is not"},
        {{"RANK=0", "WORLD_SIZE=0"}, PF_ERR_INVALID_ARG, "WORLD_SIZE=\"0\""},
        {{"RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=5"}, PF_ERR_INVALID_ARG, "LOCAL_RANK=5 is not below WORLD_SIZE=4"},
        {{"RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=x"}, PF_ERR_INVALID_ARG, "LOCAL_RANK=\"x\""},
        {{"SLURM_PROCID=-1", "SLURM_NTASKS=2"}, PF_ERR_INVALID_ARG, "SLURM_PROCID=\"-1\""},
        {{"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=7x"}, PF_ERR_INVALID_ARG, "OMPI_COMM_WORLD_SIZE=\"7x\""},
        {{"PMI_RANK= 3", "PMI_SIZE=4"}, PF_ERR_INVALID_ARG, "PMI_RANK=\" 3\""},
        {{"PMI_RANK=1", "PMI_SIZE=99999999999999999999"}, PF_ERR_INVALID_ARG, "PMI_SIZE=\"99999999999999999999\""},
        {{"SLURM_PROCID=0", "SLURM_NTASKS=100000"}, PF_ERR_INVALID_ARG, "SLURM_NTASKS=100000 (SLURM): at most 65536"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pf_config cfg;
        memset(&cfg, 0, sizeof cfg);
        clear_env();
        for (int v = 0; v < 4 && cases[i].vars[v]; v++) {
            char name[64];
            const char *eq = strchr(cases[i].vars[v], '=');
            snprintf(name, sizeof name, "%.*s", (int)(eq - cases[i].vars[v]), cases[i].vars[v]);
            setenv(name, eq + 1, 1);
        }
        CHECK_EQ(pf_shard_from_env(&cfg), cases[i].want);
        CHECK_CONTAINS(pf_error(NULL), cases[i].says);
        CHECK(cfg.rank == 0 && cfg.world_size == 0); /* untouched on failure */
    }
    clear_env();
}

static void test_devices_precedence_and_no_launcher(void) {
    pf_config cfg;
    memset(&cfg, 0, sizeof cfg);
    clear_env();
    cfg.cuda_device = 5;
    CHECK_EQ(pf_shard_from_env(&cfg), PF_OK); /* no launcher: a single process, untouched */
    CHECK(cfg.rank == 0 && cfg.world_size == 0 && cfg.cuda_device == 5);
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "5", 1);
    setenv("SLURM_PROCID", "1", 1); /* torchrun inside srun: torchrun's numbers win */
    setenv("SLURM_NTASKS", "2", 1);
    CHECK_EQ(pf_shard_from_env(&cfg), PF_OK);
    CHECK(cfg.rank == 5 && cfg.world_size == 8 && cfg.cuda_device == 5);
    setenv("CUDA_VISIBLE_DEVICES", "3", 1); /* one GPU per process: device 0 */
    CHECK_EQ(pf_shard_from_env(&cfg), PF_OK);
    CHECK_EQ(cfg.cuda_device, 0);
    setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3", 1); /* four per node: local rank modulo 4 */
    CHECK_EQ(pf_shard_from_env(&cfg), PF_OK);
    CHECK_EQ(cfg.cuda_device, 1);
    { /* read as the CUDA runtime reads it: up to the first entry that is not a device */
        static const struct {
            const char *vis, *local;
            int device;
        } cases[] = {
            {"0,1,", "2", 0},        /* a trailing comma: two devices, not three */
            {"0,,1", "1", 0},        /* an empty entry ends the list: one device */
            {"2, 3", "1", 1},        /* spaces around entries are fine */
            {"GPU-8a1b,GPU-77c0", "3", 1}, /* UUIDs count */
            {"MIG-1f2e", "2", 0},
            {"1,x,2", "1", 0},       /* garbage ends the list */
            {"-1", "3", 3},          /* no visible device: the local rank is left as it is */
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            setenv("CUDA_VISIBLE_DEVICES", cases[i].vis, 1);
            setenv("LOCAL_RANK", cases[i].local, 1);
            CHECK_EQ(pf_shard_from_env(&cfg), PF_OK);
            CHECKF(cfg.cuda_device == cases[i].device, "CUDA_VISIBLE_DEVICES=\"%s\" LOCAL_RANK=%s: device %d, expected %d",
                   cases[i].vis, cases[i].local, cfg.cuda_device, cases[i].device);
        }
    }
    clear_env();
    setenv("PMI_RANK", "2", 1); /* no local rank: the device is left alone */
    setenv("PMI_SIZE", "3", 1);
    cfg.cuda_device = 7;
    CHECK_EQ(pf_shard_from_env(&cfg), PF_OK);
    CHECK(cfg.rank == 2 && cfg.world_size == 3 && cfg.cuda_device == 7);
    clear_env();
    CHECK_EQ(pf_shard_from_env(NULL), PF_ERR_INVALID_ARG);
}

static const h_test tests[] = {
    {"processes_of_every_launcher_share_an_epoch", test_processes_of_every_launcher_share_an_epoch},
    {"malformed_and_contradictory_values_are_named", test_malformed_and_contradictory_values_are_named},
    {"devices_precedence_and_no_launcher", test_devices_precedence_and_no_launcher},
};

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) return child(atoi(argv[2]));
    return h_main(argc, argv, "launcher sharding (pf_shard_from_env)", tests, sizeof tests / sizeof tests[0]);
}
