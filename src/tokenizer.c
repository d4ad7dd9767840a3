/* tokenizer.c — placeholder */
