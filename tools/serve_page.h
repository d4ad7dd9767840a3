/* serve_page.h — the chat page of `muser serve` (web/: index.html, chat.css, chat.js), embedded
 * into the binary at build time by cmake/embed_web.cmake, and the response that carries it: its
 * Content-Type and a Content-Security-Policy that lets the page load only itself and talk only to
 * this server. docs/serve.md ("The chat page") says what the page does. */
#ifndef MUSER_TOOLS_SERVE_PAGE_H
#define MUSER_TOOLS_SERVE_PAGE_H

#include <stddef.h>

typedef struct web_file {
    const char *url;          /* "/" for index.html, else "/<name>" */
    const char *content_type;
    const unsigned char *data;
    size_t size;
} web_file;

/* The generated table (web_files.c in the build directory). */
extern const web_file web_files[];
extern const size_t web_n_files;

/* The file served at url (the path alone, no query), or NULL. */
const web_file *web_file_find(const char *url);

#endif
