/* fuzz_cpu_shim.h — forced into every source of the harnesses (scripts/fuzz.sh -include), which
 * are built with __builtin_cpu_supports renamed to muser_fuzz_cpu_supports because clang 14's
 * builtin does not know "f16c"; fuzz_cpu_shim.c defines the function. */
int muser_fuzz_cpu_supports(const char *feature);
