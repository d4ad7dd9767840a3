/* cmd_chat.c — placeholder until its module lands (replaced by the module's owner). */
#include "cli.h"

int cmd_chat(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "muser chat: not built in this tree yet\n");
    return 1;
}
