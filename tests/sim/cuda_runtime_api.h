/* Simulated CUDA runtime for prefetch.h's tests: the subset of the runtime
   API the library calls, with the real names, values and signatures, plus a
   few cudaSim* calls for the tests. Streams are threads that run their
   operations in FIFO order after a seeded random delay. Every stream (and
   the host) carries a vector clock; event records, cudaStreamWaitEvent,
   synchronisation and host functions pass clocks along exactly the edges
   CUDA guarantees, and every byte of pinned and device memory remembers
   its last writer and readers. An access not ordered after a conflicting
   one is a race, reported whatever the timing happened to be. */
#ifndef PF_CUDA_SIM_H
#define PF_CUDA_SIM_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDART_CB
#define CUDA_SIM 1
/* The runtime this models: CUDA 13.0's (the driver entry points through
   cudaGetDriverEntryPointByVersion, as prefetch.h calls them from 12.5 on). */
#ifndef CUDART_VERSION
#define CUDART_VERSION 13000
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorStubLibrary = 34,
    cudaErrorInsufficientDriver = 35,
    cudaErrorCallRequiresNewerDriver = 36,
    cudaErrorDevicesUnavailable = 46,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchFailure = 719,
    cudaErrorSystemNotReady = 802,
    cudaErrorSystemDriverMismatch = 803,
    cudaErrorCompatNotSupportedOnDevice = 804,
    cudaErrorUnknown = 999
} cudaError_t;

enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess = 0,
    cudaDriverEntryPointSymbolNotFound = 1,
    cudaDriverEntryPointVersionNotSufficent = 2
};
#define cudaEnableDefault 0x0

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef void(CUDART_CB *cudaHostFn_t)(void *userData);

#define cudaHostAllocDefault 0x00
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaDriverGetVersion(int *driverVersion);
cudaError_t cudaRuntimeGetVersion(int *runtimeVersion);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventCreate(cudaEvent_t *event);
/* On the timing model: the modelled time between two completed records of
   timing-enabled events. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData);
/* Known: cuCtxGetCurrent, cuCtxSetCurrent, cuCtxPushCurrent,
   cuCtxPopCurrent, cuDeviceGet, cuDevicePrimaryCtxRetain and
   cuDevicePrimaryCtxRelease; others (and those cudaSimDriverLacks names)
   give NULL and cudaDriverEntryPointSymbolNotFound, as the runtime does. */
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus);

/* ---- test controls (not CUDA) ---- */

/* Start afresh: every object of the previous run must be gone. seed drives
   the delays; each stream operation waits 0..max_delay_us first. */
void cudaSimReset(unsigned long long seed, unsigned max_delay_us, int device_count);
/* Make every call answer `err` (e.g. cudaErrorInsufficientDriver: no driver,
   or one too old), but the version queries. */
void cudaSimSetGlobalError(cudaError_t err);
/* The nth call (1-based, counted from now) of function `fn` fails with err;
   sticky: that call and every later one fail. */
void cudaSimFailNth(const char *fn, int nth, cudaError_t err, int sticky);
void cudaSimClearFaults(void);
/* What cudaDriverGetVersion answers (0: no driver installed); reset to
   CUDART_VERSION by cudaSimReset. */
void cudaSimSetDriverVersion(int version);
/* Calls of fn since the last reset. */
int cudaSimCalls(const char *fn);
/* The flags argument of fn's latest call. */
unsigned cudaSimLastFlags(const char *fn);
/* Ordering violations since the last reset; *last gets the latest message. */
int cudaSimViolations(char *last, size_t size);
/* Flag any operation on the legacy default stream (NULL). */
void cudaSimForbidLegacyStream(int on);
/* Live allocations and objects, for leak checks. */
size_t cudaSimBytesLive(void);
int cudaSimObjectsLive(void);
/* The host is about to write [p, p+n) of pinned memory. */
void cudaSimHostWrite(const void *p, size_t n);
/* The host is about to read [p, p+n) (pinned, or device memory that a
   host-visible mapping exposes). */
void cudaSimHostRead(const void *p, size_t n);
/* A GPU kernel stand-in: when `stream` reaches it, it reads [reads, reads+n)
   of device memory (checked against the clocks) and then runs fn(arg) on the
   stream's thread. Unlike cudaLaunchHostFunc it orders nothing on the host. */
cudaError_t cudaSimLaunchKernel(cudaStream_t stream, void (*fn)(void *), void *arg, const void *reads, size_t n);
/* A name for a stream in violation messages. */
void cudaSimNameStream(cudaStream_t stream, const char *name);

/* A kernel stand-in that runs for duration_us on the timing model (see
   cudaSimSetTiming); without the model it is cudaSimLaunchKernel. */
cudaError_t cudaSimLaunchKernelFor(cudaStream_t stream, unsigned duration_us, void (*fn)(void *), void *arg,
                                   const void *reads, size_t n);
/* A kernel that reads an illegal address: when `stream` reaches it, the
   device's context takes the sticky cudaErrorIllegalAddress. */
cudaError_t cudaSimLaunchFault(cudaStream_t stream);
/* The sticky error of a device (cudaSuccess when healthy). */
cudaError_t cudaSimDeviceError(int device);
/* 1 when a primary context was created on `device` since the reset. */
int cudaSimContextCreated(int device);
/* Live events created with exactly these flags. */
int cudaSimEventsWithFlags(unsigned flags);
/* 1 when a context is current on the calling thread. */
int cudaSimThreadHasContext(void);
/* The depth of the calling thread's context stack (0: none current). */
int cudaSimThreadContextDepth(void);
/* Outstanding cuDevicePrimaryCtxRetain references on a device. */
int cudaSimPrimaryRetained(int device);
/* An older driver: the entry-point lookup answers "symbol not found" for
   every driver function named in `symbols` (space-separated); NULL or ""
   offers them all again. Reset by cudaSimReset. */
void cudaSimDriverLacks(const char *symbols);
/* Calls of fn made by the calling thread since the last reset. */
int cudaSimThreadCalls(const char *fn);
/* The timing model: one host-to-device copy engine of this many bytes/s
   shared by every stream, one compute engine per device running kernels
   for their durations; operations run on a virtual timeline anchored at
   the real times they were enqueued, and the stream threads sleep until
   it. 0 turns it off (random delays again). */
void cudaSimSetTiming(double h2d_bytes_per_s);
/* On the timing model: a GPU that runs the work of all streams one after
   another (no copy/compute overlap, no concurrent kernels: allowed, since
   the runtime promises only that a device "can possibly" overlap), as one
   FIFO in the order operations are enqueued, each taking op_latency_us more
   than its work (records and waits included). 0 turns it off. */
void cudaSimSerialStreams(unsigned op_latency_us);
/* For benchmarks on the timing model; call it right after cudaSimReset,
   before any stream exists. Copies move no bytes, no access is
   race-checked, and no stream runs a thread: each operation's modelled end
   is fixed when it is enqueued (its stream, the engines and the record a
   wait captured are all known then) and the host sees it complete once
   the clock reaches it. So the simulator takes no host CPU per operation,
   as a GPU takes none; copies hold the engine in the order they were
   enqueued. Host functions, kernel bodies and injected faults are refused
   (an error and a violation), not silently skipped. */
void cudaSimTimingOnly(int on);
/* The device is in cudaComputeModeExclusiveProcess and another process
   holds it: cudaSetDevice fails, cudaGetDeviceCount still counts it. */
void cudaSimSetExclusiveBusy(int device, int busy);
/* Host memory lifetime, from the tests' allocator: a host function whose
   argument points into freed memory is a violation. */
void cudaSimHostAllocated(const void *p, size_t n);
void cudaSimHostFreed(const void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
