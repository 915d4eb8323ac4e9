/* Which paths of the kernels this CPU runs (README.md): the widest one is the default. The checks ask the
 * CPU and the operating system (gcc's __builtin_cpu_supports reads cpuid and whether the OS saves the
 * wide registers), once per process. */
#define _GNU_SOURCE /* syscall(), which -std=c11 hides: an implicit declaration is an error from gcc 14 */
#include "dispatch.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

static int paths = -1;

/* AMX: the CPU has the tiles and their int8 products (cpuid 7.0 EDX bits 24 and 25), the OS saves tile
 * state (XCR0 bits 17 and 18), and Linux lets this process use them (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XTILEDATA: a process must ask before its first tile instruction, or it is killed). */
static int amx_usable(void) {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return 0;
    if (!(edx & (1u << 24)) || !(edx & (1u << 25))) return 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
#if defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return 0;
#endif
}

int es_cpu_paths(void) {
    if (paths < 0) {
        int found = 1 << ES_PATH_REFERENCE;
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) found |= 1 << ES_PATH_AVX2;
        if ((found & (1 << ES_PATH_AVX2)) && __builtin_cpu_supports("avx512f") &&
            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512vnni"))
            found |= 1 << ES_PATH_AVX512;
        if ((found & (1 << ES_PATH_AVX512)) && amx_usable()) found |= 1 << ES_PATH_AMX;
        paths = found;
    }
    return paths;
}

int es_best_path(void) {
    int found = es_cpu_paths();
    for (int path = ES_PATH_COUNT - 1; path > 0; path--)
        if (found & (1 << path)) return path;
    return ES_PATH_REFERENCE;
}

/* ---------------------------------------------------------------------------------------------------
 * Threads: a pool whose calling thread works too and never waits for a worker that has not started.
 *
 * es_run(threads, items, fn, ctx) runs fn(ctx, i) for every i < items on the caller and up to threads - 1
 * workers. Items are claimed one at a time from a shared counter, so a worker that the OS has not
 * scheduled (a loaded machine, torch's own threads spinning beside ours) claims nothing and delays
 * nothing: the caller takes its items. The caller waits only for items already claimed. Who runs an item
 * never changes what it computes.
 *
 * The job's fields are published like a seqlock: `state` holds (generation << 32 | next item); the
 * caller makes the generation odd while it writes the fields, even when they are ready; a worker reads
 * the fields between reading an even generation and claiming an item with a compare-and-swap that
 * expects that generation, so it never runs an item with another job's fields. Idle workers spin for
 * ES_SPIN_NS, then sleep on a condition variable.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <immintrin.h>

#define ES_MAX_WORKERS 255
#define ES_SPIN_NS 100000 /* 0.1 ms: longer than the gap between two matmuls of a layer */

static struct {
    _Atomic uint64_t state;
    _Atomic int64_t done;
    _Atomic(es_task_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int64_t items;
    _Atomic int helpers; /* workers 0 .. helpers - 1 take part in this job */
    _Atomic int sleepers;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_mutex_t callers; /* one job at a time */
    int workers;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER,
          .callers = PTHREAD_MUTEX_INITIALIZER};

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Claim and run items of the job of generation `generation` until none is left or a new job starts. */
static void work(uint64_t generation, int is_caller, int index) {
    if (!is_caller && index >= atomic_load(&pool.helpers)) return;
    es_task_fn fn = atomic_load_explicit(&pool.fn, memory_order_relaxed);
    void *ctx = atomic_load_explicit(&pool.ctx, memory_order_relaxed);
    int64_t items = atomic_load_explicit(&pool.items, memory_order_relaxed);
    uint64_t state = atomic_load(&pool.state);
    for (;;) {
        if ((state >> 32) != generation || (int64_t)(state & 0xffffffffu) >= items) return;
        if (atomic_compare_exchange_weak(&pool.state, &state, state + 1)) {
            fn(ctx, (int64_t)(state & 0xffffffffu));
            atomic_fetch_add(&pool.done, 1);
            state = atomic_load(&pool.state);
        }
    }
}

static void *worker(void *arg) {
    int index = (int)(intptr_t)arg;
    uint64_t seen = atomic_load(&pool.state) >> 32;
    for (;;) {
        uint64_t generation = atomic_load(&pool.state) >> 32;
        if (generation == seen || (generation & 1)) {
            int64_t since = now_ns();
            while (((generation = atomic_load(&pool.state) >> 32) == seen || (generation & 1)) &&
                   now_ns() - since < ES_SPIN_NS)
                _mm_pause();
            if (generation == seen || (generation & 1)) {
                pthread_mutex_lock(&pool.lock);
                atomic_fetch_add(&pool.sleepers, 1);
                while ((generation = atomic_load(&pool.state) >> 32) == seen || (generation & 1))
                    pthread_cond_wait(&pool.wake, &pool.lock);
                atomic_fetch_sub(&pool.sleepers, 1);
                pthread_mutex_unlock(&pool.lock);
            }
        }
        seen = generation;
        work(generation, 0, index);
    }
    return NULL;
}

/* A forked child has only the thread that forked: no workers, and no other caller holding the pool. */
static void forget_workers(void) {
    pool.workers = 0;
    atomic_store(&pool.sleepers, 0);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_mutex_init(&pool.callers, NULL);
}

void es_run(int threads, int64_t items, es_task_fn fn, void *ctx) {
    if (items <= 0) return;
    if (threads <= 1 || items == 1) {
        for (int64_t i = 0; i < items; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&pool.callers);
    static int atfork;
    if (!atfork) atfork = pthread_atfork(NULL, NULL, forget_workers) == 0;
    int helpers = threads - 1 < ES_MAX_WORKERS ? threads - 1 : ES_MAX_WORKERS;
    while (pool.workers < helpers) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, worker, (void *)(intptr_t)pool.workers) != 0) break;
        pthread_detach(thread);
        pool.workers++;
    }
    uint64_t generation = (atomic_load(&pool.state) >> 32) + 1; /* odd: the fields are being written */
    atomic_store(&pool.state, generation << 32);
    atomic_thread_fence(memory_order_release); /* the marker before the fields */
    atomic_store(&pool.done, 0);
    atomic_store_explicit(&pool.fn, fn, memory_order_relaxed);
    atomic_store_explicit(&pool.ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&pool.items, items, memory_order_relaxed);
    atomic_store(&pool.helpers, helpers);
    generation++; /* even: ready */
    atomic_store(&pool.state, generation << 32);
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    work(generation, 1, 0);
    while (atomic_load(&pool.done) < items) _mm_pause();
    pthread_mutex_unlock(&pool.callers);
}
