/* quant.c — placeholder */
