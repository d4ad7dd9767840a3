/* chat_template.h — the built-in chat templates (chatml, llama3, muse) and how a model's
 * chat template picks one. docs/chat-templates.md shows each template's text.
 *
 * A template is a handful of fixed strings around the messages. Template strings are tokenized
 * with special tokens parsed; message text is tokenized as plain text, so a user cannot type a
 * control token into the conversation. */
#ifndef MUSER_TOOLS_CHAT_TEMPLATE_H
#define MUSER_TOOLS_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct chat_template {
    const char *name;
    bool add_bos;               /* prepend BOS to the conversation (when the vocab has one) */
    const char *system_prefix;  /* then the system text, then end_of_turn + after_end */
    const char *user_prefix;    /* then the user text, then end_of_turn + after_end */
    const char *assistant_prefix;
    const char *end_of_turn;    /* the special token closing every message */
    const char *after_end;      /* text following end_of_turn */
} chat_template;

/* The built-in template of that name, or NULL. */
const chat_template *chat_template_by_name(const char *name);
/* Pick from a model's Jinja template text (may be NULL or empty): "<|start_header_id|>" -> llama3,
 * "<|im_start|>" -> chatml, "<|assistant|>" -> muse. Returns NULL when nothing matches. */
const chat_template *chat_template_detect(const char *template_text, size_t len);
/* Comma-separated names, for help and errors. */
const char *chat_template_names(void);

#endif
