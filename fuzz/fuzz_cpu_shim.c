/* fuzz_cpu_shim.c — muser_fuzz_cpu_supports, linked into every harness that builds src/util.c (its
 * row passes ask the CPU what it has) or the CPU engine (scripts/fuzz.sh). */
#include <stdio.h>
#include <string.h>

#ifdef __builtin_cpu_supports
/* clang 14's __builtin_cpu_supports does not know "f16c" (src/quant.c asks for it), so
 * scripts/fuzz.sh builds every source with __builtin_cpu_supports renamed to this: the same
 * answer from the builtin for the names clang knows, from CPUID leaf 1 (ECX bit 29) for f16c. */
#include <cpuid.h>
#undef __builtin_cpu_supports
int muser_fuzz_cpu_supports(const char *feature);
int muser_fuzz_cpu_supports(const char *feature)
{
    if (!strcmp(feature, "avx2"))
        return __builtin_cpu_supports("avx2");
    if (!strcmp(feature, "fma"))
        return __builtin_cpu_supports("fma");
    if (!strcmp(feature, "avx512f"))
        return __builtin_cpu_supports("avx512f");
    if (!strcmp(feature, "f16c")) {
        unsigned a, b, c, d;
        return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    }
    return 0;
}
#endif
