/* kv.c — placeholder */
