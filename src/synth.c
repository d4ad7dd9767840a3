/* synth.c — placeholder */
