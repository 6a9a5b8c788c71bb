/* Simulated CUDA runtime: see cuda_runtime_api.h for what it models.

   Happens-before, as CUDA defines it, is tracked with vector clocks over
   "entities": entity 0 is the host (all host threads together, ordered by
   real time: a conservative simplification that can hide a race, never
   invent one) and entity k > 0 is stream k. Edges:
     host -> stream   an operation carries the host's clock at enqueue
     stream -> stream cudaEventRecord then cudaStreamWaitEvent (the record
                      captured when the wait was enqueued)
     stream -> host   cudaEventSynchronize / a successful cudaEventQuery /
                      cudaStreamSynchronize / a host function starting
   A kernel stand-in (cudaSimLaunchKernel) is device work: it creates no
   stream -> host edge. Shadow memory keeps, per 256-byte cell, the last
   write and the latest read per reader; an access not ordered after a
   conflicting one is reported as a violation.

   Beyond ordering it models what the toolkit's headers document for
   faults, contexts and teardown; each rule quotes its sentence where it is
   implemented (grep "DOC:"), and tests/sim/README.md lists the rules with
   the test that proves a violation of each is seen. */
#define _POSIX_C_SOURCE 200809L
#include "cuda_runtime_api.h"

#include <pthread.h>
#include <stdarg.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXE 64   /* entities: host + 63 streams at once */
#define CELL 256  /* shadow granularity: the library's slot alignment */
#define HIST 8    /* remembered records per event */
#define MAXDEV 8
#define NONE 0xff

typedef struct vclock {
    uint64_t c[MAXE];
} vclock;

typedef struct cell {
    uint64_t wclk;
    uint64_t rclk[4];
    uint8_t went, nread, rent[4];
} cell;

typedef struct alloc {
    struct alloc *next;
    unsigned char *base;
    size_t size;
    int device, pinned, pending;
    cell *cells;
} alloc;

enum { OP_COPY, OP_RECORD, OP_WAIT, OP_HOSTFN, OP_KERNEL, OP_FAULT, OP_QUIT };

typedef struct op {
    struct op *next;
    int kind;
    vclock in;
    void *dst;
    const void *src;
    size_t n;
    struct CUevent_st *ev;
    uint64_t gen;
    void (*fn)(void *);
    void *arg;
    alloc *adst, *asrc;
    unsigned delay_us;
    double enq_t;       /* timing model: when the host enqueued it */
    unsigned dur_us;    /* timing model: a kernel's duration      */
    int timed;          /* serial mode: vt_end was fixed at enqueue */
    double vt_end;
} op;

struct CUstream_st {
    int id, device, legacy, destroyed, waiters; /* waiters: host threads syncing it */
    double vt_done; /* timing model: when its last operation ends */
    pthread_t thread;
    op *head, *tail;
    uint64_t enq, done;
    vclock vc;
    pthread_cond_t cv;
};

struct CUevent_st {
    int device, refs, destroyed, waiters; /* waiters: threads blocked on a record of it */
    unsigned flags;
    struct CUevent_st *next_live; /* live events, for cudaSimEventsWithFlags */
    uint64_t gen_enq, gen_done;
    struct {
        uint64_t gen;
        vclock vc;
        double vt;
    } hist[HIST];
};

enum {
    F_GetDeviceCount, F_SetDevice, F_GetDevice, F_DeviceSynchronize, F_HostAlloc, F_FreeHost, F_Malloc, F_Free,
    F_StreamCreateWithFlags, F_StreamDestroy, F_StreamSynchronize, F_StreamWaitEvent, F_EventCreateWithFlags,
    F_EventDestroy, F_EventRecord, F_EventQuery, F_EventSynchronize, F_MemcpyAsync, F_LaunchHostFunc,
    F_GetDriverEntryPoint, F_DriverGetVersion, F_RuntimeGetVersion, F_COUNT
};
/* Calls that need a context: every one but the device queries, the error
   strings and the entry-point lookup. */
static const char needs_ctx[F_COUNT] = {
    [F_DeviceSynchronize] = 1, [F_HostAlloc] = 1, [F_FreeHost] = 1, [F_Malloc] = 1, [F_Free] = 1,
    [F_StreamCreateWithFlags] = 1, [F_StreamDestroy] = 1, [F_StreamSynchronize] = 1, [F_StreamWaitEvent] = 1,
    [F_EventCreateWithFlags] = 1, [F_EventDestroy] = 1, [F_EventRecord] = 1, [F_EventQuery] = 1,
    [F_EventSynchronize] = 1, [F_MemcpyAsync] = 1, [F_LaunchHostFunc] = 1};
static const char *const fn_names[F_COUNT] = {
    "cudaGetDeviceCount", "cudaSetDevice", "cudaGetDevice", "cudaDeviceSynchronize", "cudaHostAlloc",
    "cudaFreeHost", "cudaMalloc", "cudaFree", "cudaStreamCreateWithFlags", "cudaStreamDestroy",
    "cudaStreamSynchronize", "cudaStreamWaitEvent", "cudaEventCreateWithFlags", "cudaEventDestroy",
    "cudaEventRecord", "cudaEventQuery", "cudaEventSynchronize", "cudaMemcpyAsync", "cudaLaunchHostFunc",
    "cudaGetDriverEntryPointByVersion", "cudaDriverGetVersion", "cudaRuntimeGetVersion"};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* any operation completed, any stream exited */
    int ndev;
    cudaError_t global_err;
    uint64_t rng;
    unsigned max_delay_us;
    vclock host;
    uint64_t id_clock[MAXE]; /* clocks stay monotonic when an id is reused */
    struct CUstream_st *by_id[MAXE]; /* live streams */
    char names[MAXE][48];
    struct CUstream_st *legacy[MAXDEV];
    alloc *allocs;
    size_t bytes_live;
    int objects_live, streams_running;
    pthread_t exited[256]; /* stream threads that finished, to join at reset */
    int nexited;
    int violations;
    char last[768];
    int forbid_legacy;
    int calls[F_COUNT], fail_at[F_COUNT], fail_sticky[F_COUNT];
    unsigned flags_seen[F_COUNT]; /* the flags of the latest call */
    cudaError_t fail_err[F_COUNT];
    cudaError_t fault[MAXDEV];    /* a device's sticky error           */
    int ctx[MAXDEV];              /* its primary context exists        */
    int busy[MAXDEV];             /* exclusive-process, held elsewhere */
    int retained[MAXDEV];         /* cuDevicePrimaryCtxRetain count    */
    char lacks[512];              /* driver symbols the lookup denies  */
    int driver_version;           /* cudaDriverGetVersion's answer     */
    char ctx_handle[MAXDEV];      /* addresses that serve as CUcontext */
    unsigned gen;                 /* bumps at each reset               */
    double bw;                    /* timing model: H2D bytes/s, 0 off  */
    int timing_only;              /* copies move no bytes, no shadow   */
    double engine_free, compute_free[MAXDEV];
    double serial_lat;            /* serial mode: seconds per operation; 0 off */
    double serial_free;           /* serial mode: when the one FIFO is free    */
    alloc *zombies;               /* freed while queued work used them */
    struct CUevent_st *events;    /* live (not destroyed) events        */
    struct {
        const unsigned char *p;
        size_t n;
    } freed[64];                  /* host memory freed (tests' allocator) */
    unsigned nfreed;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .ndev = 1, .rng = 1,
       .driver_version = CUDART_VERSION};

/* A thread's CUDA state is two things, kept apart as the runtime keeps them:
   DOC (cudaSetDevice): "Sets device as the current device for the calling
   host thread." -- the runtime's per-thread device choice (tls_dev; -1:
   none made, which acts as device 0); and DOC (the runtime's "Interactions
   with the CUDA Driver API"): "CUDA Runtime API calls operate on the CUDA
   Driver API CUcontext which is current to the calling host thread." -- the
   top of the driver's per-thread context stack (tls_ctx, the device whose
   primary context it is; -1: none), with the contexts pushed beneath it in
   tls_below. Only cudaSetDevice changes the choice; the driver's calls
   change only the stack. */
#define STACK 8
static _Thread_local int tls_dev = -1;
static _Thread_local int tls_ctx = -1;
static _Thread_local int tls_below[STACK], tls_depth;
static _Thread_local cudaError_t tls_last = cudaSuccess;
static _Thread_local int tls_calls[F_COUNT];
static _Thread_local unsigned tls_gen;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_until(double t) {
    struct timespec ts;
    if (t <= now_s()) return;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {}
}

/* The thread's current device: DOC ("Primary Contexts"): "From the
   perspective of the CUDA Runtime API, a device and its primary context are
   synonymous." So the current context's device when one is current, else
   the device cudaSetDevice chose, else 0. */
static int cur_dev(void) { return tls_ctx >= 0 ? tls_ctx : tls_dev >= 0 ? tls_dev : 0; }

static void violation(const char *fmt, ...) {
    va_list ap;
    g.violations++;
    va_start(ap, fmt);
    vsnprintf(g.last, sizeof g.last, fmt, ap);
    va_end(ap);
}

static const char *ent_name(int e) { return e == 0 ? "the host" : g.names[e]; }

static void vc_join(vclock *a, const vclock *b) {
    for (int i = 0; i < MAXE; i++)
        if (b->c[i] > a->c[i]) a->c[i] = b->c[i];
}

static uint64_t rnd(void) {
    g.rng ^= g.rng << 13;
    g.rng ^= g.rng >> 7;
    g.rng ^= g.rng << 17;
    return g.rng;
}

static cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess) tls_last = e;
    return e;
}

/* Calls that use the current device need one set on this thread (the
   library's rule: every thread that calls CUDA first calls cudaSetDevice). */
static int need_device(const char *what) {
    if (tls_dev < 0 && tls_ctx < 0) { /* a context pushed through the driver chose one too */
        violation("%s called on a thread that never called cudaSetDevice", what);
        return 0;
    }
    return 1;
}

/* Make the primary context of `dev` exist (lock held). DOC (cudaSetDevice):
   "This function will also immediately initialize the runtime state on the
   primary context, and the context will be current on device immediately.
   This function will return an error if the device is in
   cudaComputeModeExclusiveProcess and is occupied by another process". */
static cudaError_t make_ctx(int dev) {
    if (!g.ctx[dev] && g.busy[dev]) return cudaErrorDevicesUnavailable;
    g.ctx[dev] = 1;
    tls_ctx = dev;
    return cudaSuccess;
}

/* Count the call, apply injected faults, give a call that needs a context
   one, and answer a device's sticky error (lock held). */
static cudaError_t begin(int f) {
    int n = ++g.calls[f];
    if (tls_gen != g.gen) {
        memset(tls_calls, 0, sizeof tls_calls);
        tls_gen = g.gen;
    }
    tls_calls[f]++;
    /* the version queries answer without a driver: see cudaDriverGetVersion */
    if (g.global_err != cudaSuccess && f != F_GetDevice && f != F_DriverGetVersion && f != F_RuntimeGetVersion)
        return g.global_err;
    if (g.fail_at[f] && (n == g.fail_at[f] || (g.fail_sticky[f] && n > g.fail_at[f]))) return g.fail_err[f];
    if (needs_ctx[f] && tls_ctx < 0) {
        /* DOC (the runtime's initialization note): a call that needs a
           context on a thread with none current initialises the primary
           context of the thread's device: device 0 until one is set. */
        cudaError_t e;
        need_device(fn_names[f]);
        e = make_ctx(cur_dev());
        if (e != cudaSuccess) return e;
    }
    /* DOC (driver_types.h, cudaErrorIllegalAddress): "This leaves the
       process in an inconsistent state and any further CUDA work will
       return the same error." The releasing calls (frees, destroys) still
       let go of the object in this model; see release_sticky. */
    if (needs_ctx[f] && f != F_Free && f != F_FreeHost && f != F_EventDestroy && f != F_StreamDestroy &&
        g.fault[cur_dev()] != cudaSuccess)
        return g.fault[cur_dev()];
    return cudaSuccess;
}

/* A free or destroy in a faulted context: the object is let go of (the
   process must be relaunched anyway, so nothing is lost by it) and the
   call answers the sticky error. */
static cudaError_t release_sticky(cudaError_t e) {
    cudaError_t f = g.fault[cur_dev()];
    return e == cudaSuccess && f != cudaSuccess ? f : e;
}

static alloc *find_alloc(const void *p, size_t n) {
    const unsigned char *c = (const unsigned char *)p;
    for (alloc *a = g.allocs; a; a = a->next)
        if (c >= a->base && c + n <= a->base + a->size && c < a->base + a->size + (n == 0)) return a;
    return NULL;
}

/* One access by entity `ent` whose clock is `vc` (lock held). */
static void shadow(alloc *a, const void *p, size_t n, int ent, const vclock *vc, int write, const char *what) {
    size_t off, first, last;
    if (!a || n == 0 || g.timing_only) return;
    off = (size_t)((const unsigned char *)p - a->base);
    first = off / CELL;
    last = (off + n - 1) / CELL;
    for (size_t i = first; i <= last; i++) {
        cell *c = &a->cells[i];
        const char *conflict = NULL;
        int other = 0;
        uint64_t oclk = 0;
        if (c->went != NONE && c->went != ent && c->wclk > vc->c[c->went]) {
            conflict = "write";
            other = c->went;
            oclk = c->wclk;
        }
        if (write && !conflict) {
            for (int r = 0; r < c->nread; r++)
                if (c->rent[r] != ent && c->rclk[r] > vc->c[c->rent[r]]) {
                    conflict = "read";
                    other = c->rent[r];
                    oclk = c->rclk[r];
                    break;
                }
        }
        if (conflict) {
            violation("race: %s by %s on %s memory (byte %zu of a %zu-byte block) is not ordered after the "
                      "%s by %s (its clock %llu, known %llu): a missing cudaStreamWaitEvent, event or sync",
                      what, ent_name(ent), a->pinned ? "pinned host" : "device", i * CELL, a->size, conflict,
                      ent_name(other), (unsigned long long)oclk, (unsigned long long)vc->c[other]);
            return; /* one report per access */
        }
        if (write) {
            c->went = (uint8_t)ent;
            c->wclk = vc->c[ent];
            c->nread = 0;
        } else {
            int r;
            for (r = 0; r < c->nread && c->rent[r] != ent; r++) {}
            if (r == c->nread) {
                if (c->nread == 4) r = 0; /* keep the newest four readers */
                else c->nread++;
            }
            c->rent[r] = (uint8_t)ent;
            c->rclk[r] = vc->c[ent];
        }
    }
    (void)first;
}

/* ---- streams ---- */

static void *stream_main(void *arg);

static struct CUstream_st *new_stream(int device, int legacy, const char *name) {
    int id;
    struct CUstream_st *s;
    for (id = 1; id < MAXE && g.by_id[id]; id++) {}
    if (id == MAXE) return NULL;
    s = (struct CUstream_st *)calloc(1, sizeof *s);
    if (!s) return NULL;
    g.by_id[id] = s;
    s->id = id;
    s->device = device;
    s->legacy = legacy;
    s->vc.c[id] = ++g.id_clock[id];
    snprintf(g.names[id], sizeof g.names[id], "%s", name);
    pthread_cond_init(&s->cv, NULL);
    if (g.timing_only) return s; /* no thread: see run_now */
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        g.by_id[id] = NULL;
        pthread_cond_destroy(&s->cv);
        free(s);
        return NULL;
    }
    g.streams_running++;
    return s;
}

static void event_unref(struct CUevent_st *e) {
    if (--e->refs == 0) free(e);
}

static void sleep_us(unsigned us) {
    struct timespec ts;
    if (!us) return;
    ts.tv_sec = us / 1000000u;
    ts.tv_nsec = (long)(us % 1000000u) * 1000L;
    nanosleep(&ts, NULL);
}

static int in_freed(const void *p) {
    const unsigned char *c = (const unsigned char *)p;
    for (unsigned i = 0; i < g.nfreed && i < 64; i++)
        if (g.freed[i].p && c >= g.freed[i].p && c < g.freed[i].p + g.freed[i].n) return 1;
    return 0;
}

/* What an operation holds, let go of: its blocks' pending counts and its
   event reference. Either it was discarded in a faulted context, or
   timing-only mode has timed it (run_now). (lock held) */
static void let_go(op *o) {
    if (o->asrc) o->asrc->pending--;
    if (o->adst) o->adst->pending--;
    if (o->kind == OP_RECORD || o->kind == OP_WAIT) event_unref(o->ev);
}

/* A record completes: its clock (what it saw) and its modelled time. */
static void record_done(op *o, const vclock *vc, double vt) {
    o->ev->hist[o->gen % HIST].gen = o->gen;
    o->ev->hist[o->gen % HIST].vc = *vc;
    o->ev->hist[o->gen % HIST].vt = vt;
    if (o->gen > o->ev->gen_done) o->ev->gen_done = o->gen;
}

/* The timing model sleeps until modelled ends tens of microseconds apart:
   the default 50 us timer slack would stretch every one. Once per thread. */
static void tight_timer_slack(void) {
    static _Thread_local int set;
#ifdef __linux__
    if (!set) (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
    set = 1;
}

/* Timing model: when op o starts and ends on the virtual timeline (lock
   held; a wait's start is fixed once its event completed). */
static double op_end(struct CUstream_st *s, op *o) {
    double start = o->enq_t > s->vt_done ? o->enq_t : s->vt_done, end = start;
    if (g.serial_lat > 0) {
        /* serial mode (cudaSimSerialStreams): DOC (driver_types.h):
           cudaDevAttrGpuOverlap "Device can possibly copy memory and execute
           a kernel concurrently" and cudaDevAttrConcurrentKernels "Device can
           possibly execute multiple kernels concurrently": possibly, so a
           device may run every stream's work one after another. One FIFO
           of all streams, in enqueue order (push), each operation paying
           the device's own latency; DOC (cudaEventElapsedTime): "Any number
           of other different stream operations could execute in between the
           two measured events". */
        if (g.serial_free > start) start = g.serial_free;
        if (o->kind == OP_WAIT && o->ev->hist[o->gen % HIST].vt > start) start = o->ev->hist[o->gen % HIST].vt;
        end = start + g.serial_lat;
        if (o->kind == OP_COPY && g.bw > 0) end += (double)o->n / g.bw;
        if (o->kind == OP_KERNEL) end += (double)o->dur_us * 1e-6;
        g.serial_free = end;
        return end;
    }
    if (o->kind == OP_COPY && g.bw > 0) {
        if (g.engine_free > start) start = g.engine_free;
        end = start + (double)o->n / g.bw;
        g.engine_free = end;
    } else if (o->kind == OP_KERNEL) {
        if (g.compute_free[s->device] > start) start = g.compute_free[s->device];
        end = start + (double)o->dur_us * 1e-6;
        g.compute_free[s->device] = end;
    } else if (o->kind == OP_WAIT && o->ev->hist[o->gen % HIST].vt > start) {
        end = o->ev->hist[o->gen % HIST].vt;
    }
    return end;
}

/* Block (lock held) until ev's record `gen` completed or a device faulted.
   Completions broadcast only when someone waits: no thundering herd of
   stream threads on every operation. */
static void ev_wait(struct CUevent_st *ev, uint64_t gen, int dev) {
    ev->waiters++;
    while (ev->gen_done < gen && !g.fault[dev] && !g.fault[ev->device]) pthread_cond_wait(&g.cv, &g.mu);
    ev->waiters--;
}

static void *stream_main(void *arg) {
    struct CUstream_st *s = (struct CUstream_st *)arg;
    int quit = 0;
    tls_dev = tls_ctx = s->device;
    tight_timer_slack();
    pthread_mutex_lock(&g.mu);
    while (!quit) {
        op *o;
        int wake = 0; /* someone waits for what this op completes */
        while (!s->head) pthread_cond_wait(&s->cv, &g.mu);
        o = s->head;
        if (g.fault[s->device] != cudaSuccess && o->kind != OP_QUIT) {
            /* DOC (cudaLaunchHostFunc): "the function will not be called
               in the event of an error in the CUDA context"; and no later
               work runs: copies and kernels do not happen, events recorded
               after the fault never complete */
            let_go(o);
            s->head = o->next;
            if (!s->head) s->tail = NULL;
            s->done++;
            free(o);
            pthread_cond_broadcast(&g.cv);
            continue;
        }
        if (g.bw > 0) {
            double end;
            if (o->kind == OP_WAIT)
                ev_wait(o->ev, o->gen, s->device);
            end = o->timed ? o->vt_end : op_end(s, o);
            s->vt_done = end;
            pthread_mutex_unlock(&g.mu);
            sleep_until(end);
        } else {
            pthread_mutex_unlock(&g.mu);
            sleep_us(o->delay_us);
        }
        pthread_mutex_lock(&g.mu);
        if (g.fault[s->device] != cudaSuccess && o->kind != OP_QUIT) continue; /* discarded above next time */
        vc_join(&s->vc, &o->in);
        s->vc.c[s->id] = ++g.id_clock[s->id];
        switch (o->kind) {
        case OP_COPY:
            shadow(o->asrc, o->src, o->n, s->id, &s->vc, 0, "cudaMemcpyAsync's read");
            shadow(o->adst, o->dst, o->n, s->id, &s->vc, 1, "cudaMemcpyAsync's write");
            pthread_mutex_unlock(&g.mu);
            if (o->n && !g.timing_only) memcpy(o->dst, o->src, o->n);
            pthread_mutex_lock(&g.mu);
            if (o->asrc) o->asrc->pending--;
            if (o->adst) o->adst->pending--;
            break;
        case OP_RECORD:
            record_done(o, &s->vc, s->vt_done);
            wake |= o->ev->waiters > 0;
            event_unref(o->ev);
            break;
        case OP_WAIT:
            ev_wait(o->ev, o->gen, s->device);
            if (g.fault[s->device] != cudaSuccess) {
                /* the context died while it waited */
            } else if (g.fault[o->ev->device] != cudaSuccess) {
                /* another device's fault: the record will never happen */
                violation("sim: %s waits for an event of faulted device %d", g.names[s->id], o->ev->device);
            } else if (o->ev->hist[o->gen % HIST].gen != o->gen)
                violation("sim: event record %llu was overwritten before %s waited for it",
                          (unsigned long long)o->gen, g.names[s->id]);
            else
                vc_join(&s->vc, &o->ev->hist[o->gen % HIST].vc);
            event_unref(o->ev);
            break;
        case OP_HOSTFN:
            if (in_freed(o->arg))
                violation("a host function on %s runs with an argument (%p) that points into memory freed "
                          "before it ran: its owner was torn down with the function still queued",
                          g.names[s->id], o->arg);
            vc_join(&g.host, &s->vc); /* the host function may signal host threads */
            pthread_mutex_unlock(&g.mu);
            o->fn(o->arg);
            pthread_mutex_lock(&g.mu);
            break;
        case OP_KERNEL:
            shadow(o->asrc, o->src, o->n, s->id, &s->vc, 0, "a kernel's read");
            if (o->asrc) o->asrc->pending--; /* its read is in the shadow now */
            pthread_mutex_unlock(&g.mu);
            o->fn(o->arg);
            pthread_mutex_lock(&g.mu);
            break;
        case OP_FAULT:
            /* the device's context takes the sticky error; everyone waiting
               on it is told at once */
            g.fault[s->device] = cudaErrorIllegalAddress;
            wake = 1;
            break;
        case OP_QUIT:
            quit = 1;
            break;
        }
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        s->done++;
        free(o);
        if (wake || s->waiters || quit) pthread_cond_broadcast(&g.cv);
    }
    g.by_id[s->id] = NULL;
    /* a cudaDeviceSynchronize that found it before the end still reads it
       as it wakes (an outside trial's destroy, then synchronize: ASan
       saw the read after this free) */
    while (s->waiters) pthread_cond_wait(&g.cv, &g.mu);
    g.streams_running--;
    if (g.nexited < 256) g.exited[g.nexited++] = s->thread;
    else pthread_detach(s->thread);
    pthread_cond_destroy(&s->cv);
    free(s);
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    return NULL;
}

/* NULL and the special handles mean the device's legacy default stream. */
static struct CUstream_st *resolve(cudaStream_t s, const char *what) {
    if (s && s != cudaStreamLegacy && s != cudaStreamPerThread) return s;
    if (tls_dev < 0 && tls_ctx < 0) return NULL;
    if (g.forbid_legacy) violation("%s on the legacy default stream", what);
    if (!g.legacy[cur_dev()]) g.legacy[cur_dev()] = new_stream(cur_dev(), 1, "the legacy default stream");
    return g.legacy[cur_dev()];
}

static op *new_op(int kind) {
    op *o = (op *)calloc(1, sizeof *o);
    if (!o) return NULL;
    o->kind = kind;
    o->in = g.host;
    g.host.c[0]++; /* host actions after this are not seen by the op */
    o->delay_us = g.max_delay_us ? (unsigned)(rnd() % (g.max_delay_us + 1u)) : 0;
    return o;
}

/* Timing-only mode (cudaSimTimingOnly) runs no stream threads, so the
   simulator takes no host CPU per operation: a GPU's streams take none,
   and on a small machine the threads would compete with the code being
   measured. Every input of an operation's modelled end is known when it is
   enqueued: its stream's previous end, the engine, and for a wait the
   record it captured. DOC (cudaStreamWaitEvent): "Makes all future work
   submitted to stream wait for all work captured in event"; DOC
   (cudaEventRecord): "Captures in event the contents of stream at the time
   of this call". That record was enqueued before the wait, so it is
   already timed. So the end is fixed at once, and the host sees the
   operation done when the clock reaches it (eager_pending, eager_wait_until).
   Copies take the one engine in the order they were enqueued. (lock held) */
static void run_now(struct CUstream_st *s, op *o) {
    if (o->kind == OP_QUIT) { /* the stream's work is timed: nothing is left to run */
        g.by_id[s->id] = NULL;
        pthread_cond_destroy(&s->cv);
        free(s);
        free(o);
        return;
    }
    s->vt_done = op_end(s, o);
    if (o->kind == OP_RECORD) record_done(o, &s->vc, s->vt_done);
    let_go(o); /* a copy or a kernel: no bytes move, nothing is checked */
    s->done++;
    free(o);
}

/* The modelled end of ev's latest record. */
static double latest_vt(const struct CUevent_st *ev) { return ev->hist[ev->gen_enq % HIST].vt; }

/* Timing-only: ev's latest record is timed, but the clock has not reached
   it yet, so the host must not see it complete. */
static int eager_pending(const struct CUevent_st *ev) {
    return g.timing_only && ev->gen_enq && now_s() < latest_vt(ev);
}

/* Timing-only: a host sync sleeps, unlocked, until modelled time t (lock
   held on entry and exit), with the stream threads' tight timer slack: a
   completion wakes its waiter promptly. */
static void eager_wait_until(double t) {
    tight_timer_slack();
    pthread_mutex_unlock(&g.mu);
    sleep_until(t);
    pthread_mutex_lock(&g.mu);
}

static void push(struct CUstream_st *s, op *o) {
    if (s->destroyed && o->kind != OP_QUIT) violation("an operation enqueued on %s after cudaStreamDestroy", g.names[s->id]);
    o->enq_t = now_s();
    if (g.bw > 0) o->delay_us = 0;
    s->enq++;
    if (g.timing_only) {
        run_now(s, o);
        return;
    }
    if (g.serial_lat > 0 && g.bw > 0 && o->kind != OP_QUIT) {
        /* serial mode: one FIFO in enqueue order, as a device takes its work;
           every input of the end is known now (see run_now), the record a
           wait captured included */
        o->vt_end = op_end(s, o);
        o->timed = 1;
        if (o->kind == OP_RECORD) o->ev->hist[o->gen % HIST].vt = o->vt_end;
    }
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    pthread_cond_signal(&s->cv);
}

/* Stream work must run with the stream's device current. */
static int check_stream(struct CUstream_st *s, const char *what) {
    if (!need_device(what)) return 0;
    if (s->device != cur_dev()) {
        violation("%s on a stream of device %d from a thread whose current device is %d", what, s->device, cur_dev());
        return 0;
    }
    return 1;
}

/* ---- the runtime API ---- */

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define N(x) \
    case x:  \
        return #x;
        N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation) N(cudaErrorInitializationError)
        N(cudaErrorStubLibrary) N(cudaErrorInsufficientDriver) N(cudaErrorCallRequiresNewerDriver)
        N(cudaErrorDevicesUnavailable) N(cudaErrorNoDevice) N(cudaErrorInvalidDevice)
        N(cudaErrorInvalidResourceHandle) N(cudaErrorNotReady) N(cudaErrorIllegalAddress)
        N(cudaErrorLaunchFailure) N(cudaErrorSystemNotReady) N(cudaErrorSystemDriverMismatch)
        N(cudaErrorCompatNotSupportedOnDevice) N(cudaErrorUnknown)
#undef N
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    default: return "simulated CUDA error";
    }
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = tls_last, f;
    pthread_mutex_lock(&g.mu);
    f = tls_ctx >= 0 ? g.fault[tls_ctx] : cudaSuccess;
    pthread_mutex_unlock(&g.mu);
    if (f != cudaSuccess) return f; /* sticky: never reset */
    tls_last = cudaSuccess;
    return e;
}

/* DOC (cudaPeekAtLastError): "Returns the last error that has been produced
   by any of the runtime calls in the same instance of the CUDA Runtime
   library in the host thread. This call does not reset the error to
   cudaSuccess like cudaGetLastError()." */
cudaError_t cudaPeekAtLastError(void) {
    cudaError_t f;
    pthread_mutex_lock(&g.mu);
    f = tls_ctx >= 0 ? g.fault[tls_ctx] : cudaSuccess;
    pthread_mutex_unlock(&g.mu);
    return f != cudaSuccess ? f : tls_last;
}

#define BEGIN(f)                      \
    cudaError_t e_;                   \
    pthread_mutex_lock(&g.mu);        \
    e_ = begin(f);                    \
    if (e_ != cudaSuccess) {          \
        pthread_mutex_unlock(&g.mu);  \
        return ret(e_);               \
    }
#define END(e)                        \
    do {                              \
        cudaError_t r_ = (e);         \
        pthread_mutex_unlock(&g.mu);  \
        return ret(r_);               \
    } while (0)

cudaError_t cudaGetDeviceCount(int *count) {
    BEGIN(F_GetDeviceCount)
    if (!count) END(cudaErrorInvalidValue);
    *count = g.ndev;
    END(g.ndev ? cudaSuccess : cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
    cudaError_t e;
    BEGIN(F_SetDevice)
    if (g.ndev == 0) END(cudaErrorNoDevice);
    if (device < 0 || device >= g.ndev) END(cudaErrorInvalidDevice);
    e = make_ctx(device); /* DOC quoted at make_ctx; DOC ("Initialization and
       Tear-Down"): "The function cudaSetDevice() initializes the primary
       context for the specified device and makes it current to the calling
       thread by calling cuCtxSetCurrent()": it replaces the stack's top */
    if (e != cudaSuccess) END(e);
    tls_dev = device;
    END(g.fault[device]); /* a faulted context is current, and says so */
}

/* DOC (cudaGetDevice): "Returns in *device the current device for the
   calling host thread." (cur_dev: the current context's, else the choice
   cudaSetDevice made, else 0). It creates no context (needs_ctx is 0). */
cudaError_t cudaGetDevice(int *device) {
    BEGIN(F_GetDevice)
    if (!device) END(cudaErrorInvalidValue);
    *device = cur_dev();
    END(cudaSuccess);
}

/* DOC (cudaDriverGetVersion): "Returns in *driverVersion the latest version
   of CUDA supported by the driver. ... If no driver is installed, then 0 is
   returned as the driver version." (cudaSimSetDriverVersion; the version
   queries answer even under cudaSimSetGlobalError, as they do without a
   driver.) */
cudaError_t cudaDriverGetVersion(int *v) {
    BEGIN(F_DriverGetVersion)
    if (!v) END(cudaErrorInvalidValue);
    *v = g.driver_version;
    END(cudaSuccess);
}

/* DOC (cudaRuntimeGetVersion): "Returns in *runtimeVersion the version
   number of the current CUDA Runtime instance." */
cudaError_t cudaRuntimeGetVersion(int *v) {
    BEGIN(F_RuntimeGetVersion)
    if (!v) END(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    END(cudaSuccess);
}

void cudaSimSetDriverVersion(int version) {
    pthread_mutex_lock(&g.mu);
    g.driver_version = version;
    pthread_mutex_unlock(&g.mu);
}

/* DOC (cuCtxGetCurrent, cuda.h): "If no context is bound to the calling
   CPU thread then *pctx is set to NULL and CUDA_SUCCESS is returned." */
static int sim_ctx_get_current(void **pctx) {
    pthread_mutex_lock(&g.mu);
    *pctx = tls_ctx >= 0 ? (void *)&g.ctx_handle[tls_ctx] : NULL;
    pthread_mutex_unlock(&g.mu);
    return 0;
}

/* The driver's context calls (cuda.h). CUresult codes: 0 success, 101
   CUDA_ERROR_INVALID_DEVICE, 201 CUDA_ERROR_INVALID_CONTEXT, 999 unknown. */
static int ctx_of(void *ctx) {
    int d = ctx ? (int)((char *)ctx - g.ctx_handle) : -1;
    return d >= 0 && d < MAXDEV && g.ctx[d] ? d : -1;
}

/* DOC (cuCtxSetCurrent): "If there exists a CUDA context stack on the
   calling CPU thread, this will replace the top of that stack with ctx. If
   ctx is NULL then this will be equivalent to popping the top of the
   calling CPU thread's CUDA context stack (or a no-op if the calling CPU
   thread's CUDA context stack is empty)." The runtime's device choice is
   not the driver's to change. */
static int sim_ctx_set_current(void *ctx) {
    int d;
    pthread_mutex_lock(&g.mu);
    d = ctx_of(ctx);
    if (ctx && d < 0) {
        pthread_mutex_unlock(&g.mu);
        return 201;
    }
    if (ctx) tls_ctx = d;
    else tls_ctx = tls_depth ? tls_below[--tls_depth] : -1;
    pthread_mutex_unlock(&g.mu);
    return 0;
}

/* DOC (cuCtxPushCurrent): "Pushes the given context ctx onto the CPU
   thread's stack of current contexts. The specified context becomes the CPU
   thread's current context". */
static int sim_ctx_push(void *ctx) {
    int d;
    pthread_mutex_lock(&g.mu);
    d = ctx_of(ctx);
    if (d < 0 || tls_depth == STACK) {
        pthread_mutex_unlock(&g.mu);
        return 201;
    }
    tls_below[tls_depth++] = tls_ctx;
    tls_ctx = d;
    pthread_mutex_unlock(&g.mu);
    return 0;
}

/* DOC (cuCtxPopCurrent): "Pops the current CUDA context from the CPU thread
   and passes back the old context handle in *pctx. ... If a context was
   current to the CPU thread before cuCtxCreate() or cuCtxPushCurrent() was
   called, this function makes that context current to the CPU thread
   again." */
static int sim_ctx_pop(void **pctx) {
    pthread_mutex_lock(&g.mu);
    if (tls_ctx < 0) {
        pthread_mutex_unlock(&g.mu);
        return 201;
    }
    if (pctx) *pctx = &g.ctx_handle[tls_ctx];
    tls_ctx = tls_depth ? tls_below[--tls_depth] : -1;
    pthread_mutex_unlock(&g.mu);
    return 0;
}

/* DOC (cuDeviceGet): "Returns in *device a device handle given an ordinal
   in the range [0, cuDeviceGetCount()-1]." */
static int sim_device_get(int *dev, int ordinal) {
    int r = 0;
    pthread_mutex_lock(&g.mu);
    if (!dev || ordinal < 0 || ordinal >= g.ndev) r = 101;
    else *dev = ordinal;
    pthread_mutex_unlock(&g.mu);
    return r;
}

/* DOC (cuDevicePrimaryCtxRetain): "Once the user successfully retains the
   primary context, the primary context will be active and available to the
   user until the user releases it ... Unlike cuCtxCreate() the newly
   retained context is not pushed onto the stack." A device in
   exclusive-process mode that another process holds cannot give this
   process a context: the header names no code for it, so 999 (unknown). */
static int sim_primary_retain(void **pctx, int dev) {
    pthread_mutex_lock(&g.mu);
    if (!pctx || dev < 0 || dev >= g.ndev) {
        pthread_mutex_unlock(&g.mu);
        return 101;
    }
    if (!g.ctx[dev] && g.busy[dev]) {
        pthread_mutex_unlock(&g.mu);
        return 999;
    }
    g.ctx[dev] = 1;
    g.retained[dev]++;
    *pctx = &g.ctx_handle[dev];
    pthread_mutex_unlock(&g.mu);
    return 0;
}

/* DOC (cuDevicePrimaryCtxRelease): "Releasing a primary context that has
   not been previously retained will fail with CUDA_ERROR_INVALID_CONTEXT.
   Please note that unlike cuCtxDestroy() this method does not pop the
   context from stack in any circumstances." */
static int sim_primary_release(int dev) {
    int r = 0;
    pthread_mutex_lock(&g.mu);
    if (dev < 0 || dev >= g.ndev) r = 101;
    else if (g.retained[dev] == 0) r = 201;
    else g.retained[dev]--;
    pthread_mutex_unlock(&g.mu);
    return r;
}

static const struct {
    const char *name;
    void *fn;
} driver_fns[] = {
    /* function pointers through void *: what the real API hands out */
    {"cuCtxGetCurrent", (void *)(uintptr_t)sim_ctx_get_current},
    {"cuCtxSetCurrent", (void *)(uintptr_t)sim_ctx_set_current},
    {"cuCtxPushCurrent", (void *)(uintptr_t)sim_ctx_push},
    {"cuCtxPopCurrent", (void *)(uintptr_t)sim_ctx_pop},
    {"cuDeviceGet", (void *)(uintptr_t)sim_device_get},
    {"cuDevicePrimaryCtxRetain", (void *)(uintptr_t)sim_primary_retain},
    {"cuDevicePrimaryCtxRelease", (void *)(uintptr_t)sim_primary_release},
};

/* symbol is a whole word of g.lacks (lock held) */
static int lacks(const char *symbol) {
    size_t n = strlen(symbol);
    for (const char *p = strstr(g.lacks, symbol); p; p = strstr(p + 1, symbol))
        if ((p == g.lacks || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return 1;
    return 0;
}

/* DOC (cudaGetDriverEntryPointByVersion): "The API will return cudaSuccess
   and set the returned funcPtr to NULL if the requested driver function is
   not supported on the platform, no ABI compatible driver function exists
   for the CUDA runtime version or if the driver symbol is invalid." The
   symbols a test marked missing (cudaSimDriverLacks) answer so too. */
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status) {
    void *fn = NULL;
    BEGIN(F_GetDriverEntryPoint)
    (void)cudaVersion;
    (void)flags;
    if (!symbol || !funcPtr) END(cudaErrorInvalidValue);
    for (size_t i = 0; i < sizeof driver_fns / sizeof driver_fns[0]; i++)
        if (strcmp(symbol, driver_fns[i].name) == 0 && !lacks(symbol)) fn = driver_fns[i].fn;
    *funcPtr = fn;
    if (status) *status = fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    END(cudaSuccess);
}

static cudaError_t new_alloc(void **p, size_t size, int pinned) {
    alloc *a;
    if (!p) return cudaErrorInvalidValue;
    *p = NULL;
    a = (alloc *)calloc(1, sizeof *a);
    if (!a) return cudaErrorMemoryAllocation;
    if (posix_memalign((void **)&a->base, CELL, size ? size : 1) != 0) {
        free(a);
        return cudaErrorMemoryAllocation;
    }
    a->cells = (cell *)calloc(size / CELL + 1, sizeof(cell));
    if (!a->cells) {
        free(a->base);
        free(a);
        return cudaErrorMemoryAllocation;
    }
    for (size_t i = 0; i < size / CELL + 1; i++) a->cells[i].went = NONE;
    if (!pinned) memset(a->base, 0xcd, size); /* device memory starts as garbage */
    a->size = size;
    a->device = cur_dev();
    a->pinned = pinned;
    a->next = g.allocs;
    g.allocs = a;
    g.bytes_live += size;
    g.objects_live++;
    *p = a->base;
    return cudaSuccess;
}

static void drop_alloc(alloc *a) {
    free(a->cells);
    free(a->base);
    free(a);
}

/* Free a block. DOC (cudaFree): "For all other pointers, this API may
   perform implicit synchronization." May, not must; and cudaFreeHost
   documents none. So the model does not synchronise: a free must be
   ordered (by a stream or event sync) after every access queued to the
   block, or it is reported. A block that queued work still uses lives on
   as a zombie until that work is done, so the report is all that happens.
   In a faulted context queued work never runs, so nothing is reported. */
static cudaError_t free_alloc(void *p, int pinned) {
    alloc **pp, *a;
    const char *what = pinned ? "cudaFreeHost" : "cudaFree";
    if (!p) return cudaSuccess;
    for (pp = &g.allocs; *pp && (*pp)->base != p; pp = &(*pp)->next) {}
    a = *pp;
    if (!a || a->pinned != pinned) return cudaErrorInvalidValue;
    *pp = a->next;
    g.bytes_live -= a->size;
    g.objects_live--;
    if (g.fault[a->device] == cudaSuccess) {
        if (a->pending)
            violation("%s of a %zu-byte block while %d queued operation(s) still use it: it may not "
                      "synchronise, so sync the streams that use it first", what, a->size, a->pending);
        else
            shadow(a, a->base, a->size, 0, &g.host, 1, what); /* ordered after every access that ran? */
    }
    if (a->pending) {
        a->next = g.zombies;
        g.zombies = a;
    } else {
        drop_alloc(a);
    }
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
    BEGIN(F_HostAlloc)
    g.flags_seen[F_HostAlloc] = flags;
    END(new_alloc(p, size, 1));
}
cudaError_t cudaMalloc(void **p, size_t size) {
    BEGIN(F_Malloc)
    END(new_alloc(p, size, 0));
}
cudaError_t cudaFreeHost(void *p) {
    BEGIN(F_FreeHost)
    END(release_sticky(free_alloc(p, 1)));
}
cudaError_t cudaFree(void *p) {
    BEGIN(F_Free)
    END(release_sticky(free_alloc(p, 0)));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned int flags) {
    char name[48];
    BEGIN(F_StreamCreateWithFlags)
    g.flags_seen[F_StreamCreateWithFlags] = flags;
    if (!ps) END(cudaErrorInvalidValue);
    snprintf(name, sizeof name, "stream(%s, device %d)", flags & cudaStreamNonBlocking ? "non-blocking" : "blocking",
             cur_dev());
    *ps = new_stream(cur_dev(), 0, name);
    if (!*ps) END(cudaErrorMemoryAllocation);
    g.objects_live++;
    END(cudaSuccess);
}

/* DOC (cudaStreamDestroy): "In case the device is still doing work in the
   stream stream when cudaStreamDestroy() is called, the function will
   return immediately and the resources associated with stream will be
   released automatically once the device has completed all work in
   stream." Host functions queued on it still run later: whoever queued
   them must keep their arguments alive (see OP_HOSTFN's check). */
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    op *o;
    BEGIN(F_StreamDestroy)
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) END(cudaErrorInvalidResourceHandle);
    if (s->destroyed) {
        violation("cudaStreamDestroy of a stream already destroyed");
        END(cudaErrorInvalidResourceHandle);
    }
    o = new_op(OP_QUIT);
    if (!o) END(cudaErrorMemoryAllocation);
    o->delay_us = 0;
    s->destroyed = 1;
    push(s, o); /* the stream finishes its work, then frees itself */
    g.objects_live--;
    END(release_sticky(cudaSuccess));
}

/* Wait for everything queued on s; a fault ends the wait at once. DOC
   (driver_types.h): synchronising calls return "the same error". */
static cudaError_t wait_stream(struct CUstream_st *s) {
    uint64_t target = s->enq;
    if (g.timing_only) {
        eager_wait_until(s->vt_done);
        return cudaSuccess;
    }
    s->waiters++;
    while (s->done < target && g.fault[s->device] == cudaSuccess) pthread_cond_wait(&g.cv, &g.mu);
    if (--s->waiters == 0 && s->destroyed) pthread_cond_broadcast(&g.cv); /* its thread may free it now */
    if (g.fault[s->device] != cudaSuccess) return g.fault[s->device];
    vc_join(&g.host, &s->vc);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st) {
    struct CUstream_st *s;
    BEGIN(F_StreamSynchronize)
    s = resolve(st, "cudaStreamSynchronize");
    if (!s) END(cudaErrorInvalidResourceHandle);
    END(wait_stream(s));
}

cudaError_t cudaDeviceSynchronize(void) {
    cudaError_t e = cudaSuccess;
    BEGIN(F_DeviceSynchronize)
    for (int id = 1; id < MAXE && e == cudaSuccess; id++) {
        struct CUstream_st *s = g.by_id[id];
        if (s && s->device == cur_dev()) e = wait_stream(s); /* may sleep: the stream stays live while it has work */
    }
    END(e);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t ev, unsigned int flags) {
    struct CUstream_st *s;
    op *o;
    BEGIN(F_StreamWaitEvent)
    (void)flags;
    s = resolve(st, "cudaStreamWaitEvent");
    if (!s || !ev || ev->destroyed) END(cudaErrorInvalidResourceHandle);
    if (!check_stream(s, "cudaStreamWaitEvent")) END(cudaErrorInvalidValue);
    if (ev->gen_enq == 0) END(cudaSuccess); /* never recorded: nothing to wait for */
    o = new_op(OP_WAIT);
    if (!o) END(cudaErrorMemoryAllocation);
    o->ev = ev;
    o->gen = ev->gen_enq; /* the record captured now, not a later one */
    ev->refs++;
    push(s, o);
    END(cudaSuccess);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pe, unsigned int flags) {
    BEGIN(F_EventCreateWithFlags)
    g.flags_seen[F_EventCreateWithFlags] = flags;
    if (!pe) END(cudaErrorInvalidValue);
    *pe = (cudaEvent_t)calloc(1, sizeof **pe);
    if (!*pe) END(cudaErrorMemoryAllocation);
    (*pe)->device = cur_dev();
    (*pe)->refs = 2; /* one for the live list */
    (*pe)->flags = flags;
    (*pe)->next_live = g.events;
    g.events = *pe;
    g.objects_live++;
    END(cudaSuccess);
}

cudaError_t cudaEventCreate(cudaEvent_t *pe) { return cudaEventCreateWithFlags(pe, cudaEventDefault); }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    pthread_mutex_lock(&g.mu);
    if (!ms || !a || !b || a->destroyed || b->destroyed || (a->flags & cudaEventDisableTiming) ||
        (b->flags & cudaEventDisableTiming)) {
        pthread_mutex_unlock(&g.mu);
        return ret(cudaErrorInvalidResourceHandle);
    }
    if (!a->gen_enq || !b->gen_enq || a->gen_done < a->gen_enq || b->gen_done < b->gen_enq || eager_pending(a) ||
        eager_pending(b)) {
        pthread_mutex_unlock(&g.mu);
        return ret(cudaErrorNotReady);
    }
    *ms = (float)((latest_vt(b) - latest_vt(a)) * 1e3);
    pthread_mutex_unlock(&g.mu);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    BEGIN(F_EventDestroy)
    if (!ev || ev->destroyed) END(cudaErrorInvalidResourceHandle);
    ev->destroyed = 1;
    g.objects_live--;
    for (struct CUevent_st **pp = &g.events; *pp; pp = &(*pp)->next_live)
        if (*pp == ev) {
            *pp = ev->next_live;
            ev->refs--; /* the live list's reference; the caller's goes below */
            break;
        }
    event_unref(ev);
    END(release_sticky(cudaSuccess));
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st) {
    struct CUstream_st *s;
    op *o;
    BEGIN(F_EventRecord)
    s = resolve(st, "cudaEventRecord");
    if (!s || !ev || ev->destroyed) END(cudaErrorInvalidResourceHandle);
    if (!check_stream(s, "cudaEventRecord")) END(cudaErrorInvalidValue);
    if (ev->device != s->device) {
        violation("cudaEventRecord: an event of device %d recorded on a stream of device %d", ev->device, s->device);
        END(cudaErrorInvalidResourceHandle);
    }
    o = new_op(OP_RECORD);
    if (!o) END(cudaErrorMemoryAllocation);
    o->ev = ev;
    o->gen = ++ev->gen_enq;
    ev->refs++;
    push(s, o);
    END(cudaSuccess);
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
    BEGIN(F_EventQuery)
    if (!ev || ev->destroyed) END(cudaErrorInvalidResourceHandle);
    if (g.fault[ev->device] != cudaSuccess) END(g.fault[ev->device]);
    if (ev->gen_done < ev->gen_enq) END(cudaErrorNotReady);
    if (eager_pending(ev)) END(cudaErrorNotReady);
    if (ev->gen_enq) vc_join(&g.host, &ev->hist[ev->gen_enq % HIST].vc);
    END(cudaSuccess);
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    uint64_t target;
    BEGIN(F_EventSynchronize)
    if (!ev || ev->destroyed) END(cudaErrorInvalidResourceHandle);
    target = ev->gen_enq;
    ev->refs++;
    /* a fault while waiting answers at once: the record will never complete */
    if (g.timing_only) {
        if (target) eager_wait_until(ev->hist[target % HIST].vt);
    } else {
        ev_wait(ev, target, ev->device);
    }
    if (g.fault[ev->device] != cudaSuccess) {
        cudaError_t f = g.fault[ev->device];
        event_unref(ev);
        END(f);
    }
    if (target) vc_join(&g.host, &ev->hist[target % HIST].vc);
    event_unref(ev);
    END(cudaSuccess);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t st) {
    struct CUstream_st *s;
    alloc *ad, *as;
    op *o;
    BEGIN(F_MemcpyAsync)
    s = resolve(st, "cudaMemcpyAsync");
    if (!s) END(cudaErrorInvalidResourceHandle);
    if (!check_stream(s, "cudaMemcpyAsync")) END(cudaErrorInvalidValue);
    /* the library copies to the device; a caller's check of a batch (the
       Quick start's plain-C build) copies one back */
    if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost) END(cudaErrorInvalidValue);
    ad = find_alloc(dst, n);
    as = find_alloc(src, n);
    if (kind == cudaMemcpyDeviceToHost) {
        if (!as || as->pinned || as->device != s->device) {
            violation("cudaMemcpyAsync: source %p (+%zu) is not device memory of device %d", src, n, s->device);
            END(cudaErrorInvalidValue);
        }
        if (ad && !ad->pinned) {
            violation("cudaMemcpyAsync: cudaMemcpyDeviceToHost into device memory %p", dst);
            END(cudaErrorInvalidValue);
        }
    } else {
        if (!ad || ad->pinned || ad->device != s->device) {
            violation("cudaMemcpyAsync: destination %p (+%zu) is not device memory of device %d", dst, n, s->device);
            END(cudaErrorInvalidValue);
        }
        if (!as || !as->pinned) {
            violation("cudaMemcpyAsync: source %p (+%zu) is not pinned (cudaHostAlloc) memory: the copy would not "
                      "be asynchronous", src, n);
            END(cudaErrorInvalidValue);
        }
    }
    o = new_op(OP_COPY);
    if (!o) END(cudaErrorMemoryAllocation);
    o->dst = dst;
    o->src = src;
    o->n = n;
    o->adst = ad; /* NULL: pageable host memory, not watched */
    o->asrc = as;
    if (ad) ad->pending++;
    as->pending++;
    push(s, o);
    /* DOC (API synchronization behavior, Asynchronous): "For transfers from
       device memory to pageable host memory, the function will return only
       once the copy has completed." */
    END(kind == cudaMemcpyDeviceToHost && !ad ? wait_stream(s) : cudaSuccess);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t st, cudaHostFn_t fn, void *arg) {
    struct CUstream_st *s;
    op *o;
    BEGIN(F_LaunchHostFunc)
    s = resolve(st, "cudaLaunchHostFunc");
    if (!s || !fn) END(cudaErrorInvalidValue);
    if (!check_stream(s, "cudaLaunchHostFunc")) END(cudaErrorInvalidValue);
    if (g.timing_only) {
        violation("cudaLaunchHostFunc under cudaSimTimingOnly, which runs no host functions");
        END(cudaErrorInvalidValue);
    }
    o = new_op(OP_HOSTFN);
    if (!o) END(cudaErrorMemoryAllocation);
    o->fn = fn;
    o->arg = arg;
    push(s, o);
    END(cudaSuccess);
}

/* ---- test controls ---- */

static void noop(void *arg) { (void)arg; }

/* A kernel stand-in; kind OP_FAULT makes the device fault when it runs. */
static cudaError_t launch(cudaStream_t st, int kind, unsigned dur_us, void (*fn)(void *), void *arg,
                          const void *reads, size_t n) {
    struct CUstream_st *s;
    alloc *a;
    op *o;
    pthread_mutex_lock(&g.mu);
    s = resolve(st, "a kernel launch");
    if (!s || !fn || !check_stream(s, "a kernel launch")) {
        pthread_mutex_unlock(&g.mu);
        return cudaErrorInvalidValue;
    }
    if (g.timing_only && (kind == OP_FAULT || fn != noop)) {
        violation("%s under cudaSimTimingOnly, which runs no kernel bodies and models no faults",
                  kind == OP_FAULT ? "cudaSimLaunchFault" : "a kernel with a body");
        pthread_mutex_unlock(&g.mu);
        return cudaErrorInvalidValue;
    }
    if (g.fault[s->device] != cudaSuccess) { /* a launch in a dead context fails */
        cudaError_t f = g.fault[s->device];
        pthread_mutex_unlock(&g.mu);
        return f;
    }
    a = find_alloc(reads, n);
    if (n && (!a || a->pinned)) {
        violation("a kernel reads %p (+%zu), which is not device memory", reads, n);
        pthread_mutex_unlock(&g.mu);
        return cudaErrorIllegalAddress;
    }
    o = new_op(kind);
    if (!o) {
        pthread_mutex_unlock(&g.mu);
        return cudaErrorMemoryAllocation;
    }
    o->dur_us = dur_us;
    o->fn = fn;
    o->arg = arg;
    o->src = reads;
    o->n = n;
    o->asrc = a;
    if (a) a->pending++;
    push(s, o);
    pthread_mutex_unlock(&g.mu);
    return cudaSuccess;
}

cudaError_t cudaSimLaunchKernel(cudaStream_t st, void (*fn)(void *), void *arg, const void *reads, size_t n) {
    return launch(st, OP_KERNEL, 0, fn, arg, reads, n);
}

cudaError_t cudaSimLaunchKernelFor(cudaStream_t st, unsigned dur_us, void (*fn)(void *), void *arg,
                                   const void *reads, size_t n) {
    return launch(st, OP_KERNEL, dur_us, fn ? fn : noop, arg, reads, n);
}

cudaError_t cudaSimLaunchFault(cudaStream_t st) { return launch(st, OP_FAULT, 0, noop, NULL, NULL, 0); }

cudaError_t cudaSimDeviceError(int device) {
    cudaError_t e;
    pthread_mutex_lock(&g.mu);
    e = device >= 0 && device < MAXDEV ? g.fault[device] : cudaErrorInvalidDevice;
    pthread_mutex_unlock(&g.mu);
    return e;
}

int cudaSimContextCreated(int device) {
    int n;
    pthread_mutex_lock(&g.mu);
    n = device >= 0 && device < MAXDEV ? g.ctx[device] : 0;
    pthread_mutex_unlock(&g.mu);
    return n;
}

int cudaSimThreadHasContext(void) { return tls_ctx >= 0; }

int cudaSimThreadContextDepth(void) { return tls_ctx < 0 ? 0 : tls_depth + 1; }

int cudaSimPrimaryRetained(int device) {
    int n;
    pthread_mutex_lock(&g.mu);
    n = device >= 0 && device < MAXDEV ? g.retained[device] : 0;
    pthread_mutex_unlock(&g.mu);
    return n;
}

void cudaSimDriverLacks(const char *symbols) {
    pthread_mutex_lock(&g.mu);
    snprintf(g.lacks, sizeof g.lacks, "%s", symbols ? symbols : "");
    pthread_mutex_unlock(&g.mu);
}

int cudaSimEventsWithFlags(unsigned flags) {
    int n = 0;
    pthread_mutex_lock(&g.mu);
    for (struct CUevent_st *e = g.events; e; e = e->next_live) n += e->flags == flags;
    pthread_mutex_unlock(&g.mu);
    return n;
}

void cudaSimSerialStreams(unsigned op_latency_us) {
    pthread_mutex_lock(&g.mu);
    g.serial_lat = (double)op_latency_us * 1e-6;
    g.serial_free = 0;
    pthread_mutex_unlock(&g.mu);
}

void cudaSimSetTiming(double bw) {
    pthread_mutex_lock(&g.mu);
    g.bw = bw;
    pthread_mutex_unlock(&g.mu);
}

void cudaSimTimingOnly(int on) {
    pthread_mutex_lock(&g.mu);
    for (int id = 1; id < MAXE; id++)
        if (g.by_id[id]) { /* their threads (or their absence) are already chosen: refused */
            violation("cudaSimTimingOnly(%d) with streams alive: call it right after cudaSimReset", on);
            pthread_mutex_unlock(&g.mu);
            return;
        }
    g.timing_only = on;
    pthread_mutex_unlock(&g.mu);
}

void cudaSimSetExclusiveBusy(int device, int busy) {
    pthread_mutex_lock(&g.mu);
    if (device >= 0 && device < MAXDEV) g.busy[device] = busy;
    pthread_mutex_unlock(&g.mu);
}

void cudaSimHostAllocated(const void *p, size_t n) {
    const unsigned char *c = (const unsigned char *)p;
    pthread_mutex_lock(&g.mu);
    for (unsigned i = 0; i < 64; i++) /* the range is live again */
        if (g.freed[i].p && g.freed[i].p < c + n && c < g.freed[i].p + g.freed[i].n) g.freed[i].p = NULL;
    pthread_mutex_unlock(&g.mu);
}

void cudaSimHostFreed(const void *p, size_t n) {
    pthread_mutex_lock(&g.mu);
    g.freed[g.nfreed % 64].p = (const unsigned char *)p;
    g.freed[g.nfreed % 64].n = n;
    g.nfreed++;
    pthread_mutex_unlock(&g.mu);
}

static int fn_index(const char *fn) {
    for (int i = 0; i < F_COUNT; i++)
        if (strcmp(fn_names[i], fn) == 0) return i;
    fprintf(stderr, "cuda_sim: unknown function %s\n", fn);
    abort();
}

int cudaSimThreadCalls(const char *fn) {
    int f = fn_index(fn);
    pthread_mutex_lock(&g.mu);
    f = tls_gen == g.gen ? tls_calls[f] : 0;
    pthread_mutex_unlock(&g.mu);
    return f;
}

void cudaSimHostWrite(const void *p, size_t n) {
    pthread_mutex_lock(&g.mu);
    shadow(find_alloc(p, n), p, n, 0, &g.host, 1, "a host write");
    pthread_mutex_unlock(&g.mu);
}

void cudaSimHostRead(const void *p, size_t n) {
    pthread_mutex_lock(&g.mu);
    shadow(find_alloc(p, n), p, n, 0, &g.host, 0, "a host read");
    pthread_mutex_unlock(&g.mu);
}

void cudaSimNameStream(cudaStream_t s, const char *name) {
    pthread_mutex_lock(&g.mu);
    if (s && s != cudaStreamLegacy && s != cudaStreamPerThread)
        snprintf(g.names[s->id], sizeof g.names[s->id], "%s", name);
    pthread_mutex_unlock(&g.mu);
}

/* Stop the legacy streams, wait for every stream thread and join it
   (lock held). Used by reset and at exit, so no thread is left unjoined. */
static void quiesce(void) {
    struct timespec dl;
    for (int d = 0; d < MAXDEV; d++) {
        if (!g.legacy[d]) continue;
        op *o = (op *)calloc(1, sizeof *o);
        if (o) {
            o->kind = OP_QUIT;
            push(g.legacy[d], o);
        }
        g.legacy[d] = NULL;
    }
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 30;
    while (g.streams_running > 0)
        if (pthread_cond_timedwait(&g.cv, &g.mu, &dl) != 0) {
            fprintf(stderr, "cuda_sim: %d streams still running\n", g.streams_running);
            abort();
        }
    while (g.nexited) { /* joined, so a thread count right after a reset is exact */
        pthread_t t = g.exited[--g.nexited];
        pthread_mutex_unlock(&g.mu);
        pthread_join(t, NULL);
        pthread_mutex_lock(&g.mu);
    }
}

static void quiesce_at_exit(void) {
    pthread_mutex_lock(&g.mu);
    quiesce();
    pthread_mutex_unlock(&g.mu);
}

void cudaSimReset(unsigned long long seed, unsigned max_delay_us, int device_count) {
    static int registered;
    pthread_mutex_lock(&g.mu);
    if (!registered) registered = atexit(quiesce_at_exit) == 0;
    quiesce();
    while (g.allocs) { /* leaked by the previous run; its test reported it */
        alloc *a = g.allocs;
        g.allocs = a->next;
        drop_alloc(a);
    }
    while (g.zombies) { /* the streams are gone: nothing uses them now */
        alloc *a = g.zombies;
        g.zombies = a->next;
        drop_alloc(a);
    }
    while (g.events) { /* leaked by the previous run */
        struct CUevent_st *e = g.events;
        g.events = e->next_live;
        event_unref(e);
    }
    memset(g.fault, 0, sizeof g.fault);
    memset(g.ctx, 0, sizeof g.ctx);
    memset(g.busy, 0, sizeof g.busy);
    memset(g.retained, 0, sizeof g.retained);
    g.driver_version = CUDART_VERSION;
    g.lacks[0] = '\0';
    memset(g.freed, 0, sizeof g.freed);
    g.nfreed = 0;
    g.gen++;
    g.bw = 0;
    g.timing_only = 0;
    g.engine_free = 0;
    g.serial_lat = g.serial_free = 0;
    memset(g.compute_free, 0, sizeof g.compute_free);
    tls_ctx = tls_dev = -1;
    tls_depth = 0;
    memset(&g.host, 0, sizeof g.host);
    memset(g.id_clock, 0, sizeof g.id_clock);
    memset(g.calls, 0, sizeof g.calls);
    memset(g.fail_at, 0, sizeof g.fail_at);
    g.bytes_live = 0;
    g.objects_live = 0;
    g.violations = 0;
    g.last[0] = '\0';
    g.forbid_legacy = 0;
    g.global_err = cudaSuccess;
    g.rng = seed * 2654435761u + 0x9e3779b97f4a7c15ull;
    if (!g.rng) g.rng = 1;
    g.max_delay_us = max_delay_us;
    g.ndev = device_count;
    pthread_mutex_unlock(&g.mu);
}

void cudaSimSetGlobalError(cudaError_t err) {
    pthread_mutex_lock(&g.mu);
    g.global_err = err;
    pthread_mutex_unlock(&g.mu);
}

void cudaSimFailNth(const char *fn, int nth, cudaError_t err, int sticky) {
    int f = fn_index(fn);
    pthread_mutex_lock(&g.mu);
    g.fail_at[f] = g.calls[f] + nth;
    g.fail_err[f] = err;
    g.fail_sticky[f] = sticky;
    pthread_mutex_unlock(&g.mu);
}

void cudaSimClearFaults(void) {
    pthread_mutex_lock(&g.mu);
    memset(g.fail_at, 0, sizeof g.fail_at);
    pthread_mutex_unlock(&g.mu);
}

int cudaSimCalls(const char *fn) {
    int f = fn_index(fn), n;
    pthread_mutex_lock(&g.mu);
    n = g.calls[f];
    pthread_mutex_unlock(&g.mu);
    return n;
}

unsigned cudaSimLastFlags(const char *fn) {
    int f = fn_index(fn);
    unsigned v;
    pthread_mutex_lock(&g.mu);
    v = g.flags_seen[f];
    pthread_mutex_unlock(&g.mu);
    return v;
}

int cudaSimViolations(char *last, size_t size) {
    int n;
    pthread_mutex_lock(&g.mu);
    n = g.violations;
    if (last && size) snprintf(last, size, "%s", g.last);
    pthread_mutex_unlock(&g.mu);
    return n;
}

void cudaSimForbidLegacyStream(int on) {
    pthread_mutex_lock(&g.mu);
    g.forbid_legacy = on;
    pthread_mutex_unlock(&g.mu);
}

size_t cudaSimBytesLive(void) {
    size_t n;
    pthread_mutex_lock(&g.mu);
    n = g.bytes_live;
    pthread_mutex_unlock(&g.mu);
    return n;
}

int cudaSimObjectsLive(void) {
    int n;
    pthread_mutex_lock(&g.mu);
    n = g.objects_live;
    pthread_mutex_unlock(&g.mu);
    return n;
}
