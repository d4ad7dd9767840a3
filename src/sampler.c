/* sampler.c — placeholder */
