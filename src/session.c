/* session.c — placeholder */
