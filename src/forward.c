/* forward.c — the muse / llama / qwen3 op sequence, written once against forward.h.
 *
 * Reads like SPEC §1 with the tails fused: each sublayer ends in `tail`, which adds the
 * (post-normed) sublayer output into the residual and immediately produces the next pre-norm
 * (ffn_norm after attention, the next layer's attn_norm after the FFN, output_norm after the last
 * layer), so the only standalone norm is the first layer's attn_norm. */
#include "forward.h"

int fwd_run(const fwd_ops *ops, void *be, const muser_model *m, const fwd_rows *r,
            int want_logits, muser_error *err)
{
    return fwd_run_layers(ops, be, m, r, 0, m->hp.n_layer, want_logits, err);
}

int fwd_run_layers(const fwd_ops *ops, void *be, const muser_model *m, const fwd_rows *r, uint32_t l0,
                   uint32_t l1, int want_logits, muser_error *err)
{
    const muser_hparams *hp = &m->hp;
    const float eps = hp->rms_eps, post_eps = hp->post_norm_eps;
    const bool neox = hp->arch == MUSER_ARCH_QWEN3;

    if (l0 == 0) {
        ops->embed(be, r, hp->entry_norm, eps);
        ops->rmsnorm(be, r, FWD_H, &m->layers[0].attn_norm, eps, FWD_X);
    }
    for (uint32_t l = l0; l < l1; l++) {
        const muser_layer *L = &m->layers[l];
        const bool swa = muser_layer_is_swa(hp, l);

        /* attention: the projection group shares one normed input */
        fwd_matmul proj[FWD_MAX_GROUP] = {
            {&L->attn_q, FWD_Q}, {&L->attn_k, FWD_K}, {&L->attn_v, FWD_V}, {&L->attn_gate, FWD_G}};
        ops->matmul(be, r, FWD_X, proj, hp->attn_gate ? 4 : 3);
        ops->attn_stage(be, r, l, hp->qk_norm ? &L->attn_q_norm : NULL,
                        hp->qk_norm ? &L->attn_k_norm : NULL, eps, muser_layer_has_rope(hp, l),
                        neox);
        ops->attention(be, r, l, swa ? hp->swa_window : 0, hp->attn_scale);
        if (hp->attn_gate)
            ops->gate(be, r);
        const fwd_matmul o_proj = {&L->attn_output, FWD_SUB};
        ops->matmul(be, r, FWD_O, &o_proj, 1);
        if (ops->reduce)
            ops->reduce(be, r, FWD_SUB);
        ops->tail(be, r, hp->sandwich ? &L->post_attention_norm : NULL, post_eps, &L->ffn_norm,
                  eps, FWD_X);

        /* FFN: silu(gate) * up, down */
        const fwd_matmul up[2] = {{&L->ffn_gate, FWD_FG}, {&L->ffn_up, FWD_FU}};
        ops->matmul(be, r, FWD_X, up, 2);
        ops->swiglu(be, r);
        const fwd_matmul down = {&L->ffn_down, FWD_SUB};
        ops->matmul(be, r, FWD_FG, &down, 1);
        if (ops->reduce)
            ops->reduce(be, r, FWD_SUB);
        const muser_tensor *next =
            l + 1 < hp->n_layer ? &m->layers[l + 1].attn_norm : &m->output_norm;
        ops->tail(be, r, hp->sandwich ? &L->post_ffw_norm : NULL, post_eps, next, eps, FWD_X);
        if (r->tap) /* the residual after layer l, where it is tapped */
            for (uint32_t k = 0; k < r->tap->n_layers; k++)
                if (r->tap->layers[k] == l)
                    ops->tap(be, r, k);
    }
    if (l1 < hp->n_layer)
        return MUSER_OK;
    /* The last row's logits are computed even when nobody reads them (want_logits 0): they are
     * the NaN/Inf check, so a prefill pass with a poisoned row fails closed like any other. */
    int rc = ops->lm_head(be, r, FWD_X, &m->output, hp->logit_scale, hp->final_softcap,
                          want_logits == 2, err);
    if (rc)
        return rc;
    return ops->kv_append_staged(be, r, err);
}
