/* model.c — placeholder */
