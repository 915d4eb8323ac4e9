/* Which path of the int4 kernel this CPU runs (README.md): the widest one it has. The checks ask the
 * CPU and the operating system (gcc's __builtin_cpu_supports reads cpuid and whether the OS saves the
 * wide registers), once per process. */
#include "matmul_int4.h"

static int paths = -1;

int es_cpu_paths(void) {
    if (paths < 0) {
        int found = 1 << ES_PATH_REFERENCE;
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) found |= 1 << ES_PATH_AVX2;
        if ((found & (1 << ES_PATH_AVX2)) && __builtin_cpu_supports("avx512f") &&
            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512vnni"))
            found |= 1 << ES_PATH_AVX512;
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
