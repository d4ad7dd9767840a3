/* chat_template.c — the built-in chat templates and their detection from a GGUF's
 * tokenizer.ggml.chat_template (a Jinja text we do not execute: a marker string is enough to
 * tell the three formats apart). */
#include "chat_template.h"

#include <string.h>

static const chat_template templates[] = {
    /* <|im_start|>role\ntext<|im_end|>\n — Qwen and many others. No BOS. */
    {"chatml", false, "<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n",
     "<|im_end|>", "\n"},
    /* Llama 3: <|begin_of_text|> then <|start_header_id|>role<|end_header_id|>\n\ntext<|eot_id|> */
    {"llama3", true, "<|start_header_id|>system<|end_header_id|>\n\n",
     "<|start_header_id|>user<|end_header_id|>\n\n",
     "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", ""},
    /* muse (this project's, docs/chat-templates.md): BOS, then <|role|>\ntext<|end|>\n */
    {"muse", true, "<|system|>\n", "<|user|>\n", "<|assistant|>\n", "<|end|>", "\n"},
};
#define N_TEMPLATES (sizeof templates / sizeof templates[0])

const chat_template *chat_template_by_name(const char *name)
{
    for (size_t i = 0; i < N_TEMPLATES; i++)
        if (!strcmp(templates[i].name, name))
            return &templates[i];
    return NULL;
}

static bool contains(const char *hay, size_t len, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= len; i++)
        if (!memcmp(hay + i, needle, n))
            return true;
    return false;
}

const chat_template *chat_template_detect(const char *text, size_t len)
{
    if (!text || !len)
        return NULL;
    /* llama3 first: its text may mention other markers in comments; its header marker is unique. */
    if (contains(text, len, "<|start_header_id|>"))
        return chat_template_by_name("llama3");
    if (contains(text, len, "<|im_start|>"))
        return chat_template_by_name("chatml");
    if (contains(text, len, "<|assistant|>"))
        return chat_template_by_name("muse");
    return NULL;
}

const char *chat_template_names(void) { return "chatml, llama3, muse"; }
