/* cmd_bench.c — placeholder until its module lands (replaced by the module's owner). */
#include "cli.h"

int cmd_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "muser bench: not built in this tree yet\n");
    return 1;
}
