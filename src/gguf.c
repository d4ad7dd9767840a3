/* gguf.c — placeholder */
