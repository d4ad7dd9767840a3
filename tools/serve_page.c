/* serve_page.c — see serve_page.h. */
#include "serve_page.h"

#include <string.h>

const web_file *web_file_find(const char *url)
{
    for (size_t i = 0; i < web_n_files; i++)
        if (!strcmp(url, web_files[i].url)) return &web_files[i];
    return NULL;
}
