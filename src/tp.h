/* tp.h — tensor parallelism: a model split across N ranks that each read 1/N of every matrix.
 *
 * The split (Megatron's): the attention projections q, k, v and gate and the FFN's gate and up by
 * output rows, whole heads per rank (rank r holds query heads [r·H/N, (r+1)·H/N) and the KV heads
 * they read, [r·HKV/N, (r+1)·HKV/N)); attn_output and ffn_down by input columns, so each rank's
 * product is a partial sum of the full output, which the ranks add together (an all-reduce, the
 * forward pass's `reduce` op: after o_proj and after ffn_down). The LM head by vocabulary rows:
 * each rank's logits of its rows are gathered into the whole row on every rank before the scale,
 * the cap and the non-finite check. Everything else — the embedding, the norms, the residual
 * stream — is whole on every rank, so every rank holds the same residual and the same logits.
 * Each rank's KV cache holds its own heads.
 *
 * The sum over ranks runs in rank order on every rank, so a split run is deterministic and every
 * rank ends with the same bytes; it is not bit-identical to one rank (the dot products of
 * attn_output and ffn_down are summed in N pieces), and meets SPEC §4's contract instead.
 *
 * The ranks are devices of a split device (below), each with its shard (muser_tp_shard) and its
 * own device (muser_session_opts.tp, .tp_rank): CPU ranks reduce through muser_tp_comm, CUDA ranks
 * through NCCL (src/cuda/tpcomm.cu) or, sharing one GPU, through muser_tp_comm on the host. */
#ifndef MUSER_TP_H
#define MUSER_TP_H

#include "session.h"

#define MUSER_TP_MAX 8u

/* Whether m splits into n ranks, with the reason when not: n in 1..MUSER_TP_MAX dividing the KV
 * heads and the vocabulary, and the column splits of attn_output (H·D/n) and ffn_down (F/n) whole
 * blocks of their formats. */
int muser_tp_check(const muser_model *m, uint32_t n, muser_error *err);

/* Rank `rank` of n's shard of m: its hyper-parameters (H/n, HKV/n, F/n) and tensors; row splits
 * are views into m's bytes, column splits copies (freed by muser_tp_shard_free). m must outlive
 * the shard. */
int muser_tp_shard(const muser_model *m, uint32_t n, uint32_t rank, muser_model *out, muser_error *err);
void muser_tp_shard_free(muser_model *shard);

/* The ranks' reduce: n threads, each with its rank, call muser_tp_reduce with buffers of the same
 * count; each returns with buf = the sum of all n buffers, added in rank order. A rank that failed
 * before the reduce passes buf NULL: then every rank returns false with buf as it was (none waits
 * for it, none reads it). */
typedef struct muser_tp_comm muser_tp_comm;
int muser_tp_comm_new(muser_tp_comm **out, uint32_t n, size_t max_count, muser_error *err);
void muser_tp_comm_free(muser_tp_comm *c);
uint32_t muser_tp_comm_ranks(const muser_tp_comm *c);
bool muser_tp_reduce(muser_tp_comm *c, uint32_t rank, float *buf, size_t count);
/* The LM head's gather: each of n threads passes its rows × per logits `mine` (its vocabulary
 * rows); each returns with full [rows][n·per] = every rank's in rank order (false, full untouched,
 * where a rank passed mine NULL). */
bool muser_tp_gather(muser_tp_comm *c, uint32_t rank, const float *mine, uint32_t rows, size_t per, float *full);

/* The split device (muser_session_opts.tp_ranks = n > 1; session.c picks this backend): a device
 * whose n ranks each hold their shard on a device of their own (the backend opts.backend names:
 * cpu, or cuda with rank r on GPU r through NCCL, or every rank on one GPU through the host when
 * opts.tp_share_gpu allows it), each of its sessions a session on every rank. A pass (the prefill
 * route, a step) runs on all ranks at once, ranks 1..n−1 on threads started with the device; rank 0
 * writes what the caller asked for (logits, best logits, draws, the tap), the others only their
 * caches. The calls without a pass (checkpoint, rollback, copy, KV rows) run rank by rank. So the
 * engine, the server and every command run on it unchanged. */
const muser_backend *muser_backend_split(void);
/* Rank r's session of a session on a split device (its cache holds its heads); NULL otherwise. */
muser_session *muser_tp_rank_session(const muser_session *s, uint32_t r);

#endif
