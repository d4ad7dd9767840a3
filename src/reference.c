/* reference.c — placeholder */
