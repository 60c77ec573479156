/*
 * kd.c - knowledge distillation on the model's LM head: a frozen teacher
 * (another mc_model on the same grid, any size, the same padded
 * vocabulary) whose logits for the micro-batch's rows are made chunk by
 * chunk beside the student's, the forward KL between their softmaxes at a
 * temperature, vocab-parallel like the cross-entropy, and the gradient of
 * the mixed loss written over the student's logits. See doc/ARCHITECTURE.md,
 * "Knowledge distillation".
 */
#include <math.h>
#include <stdlib.h>

#include "model/model_internal.h"

static void layout_kd(mc_model *m, mc_kd *kd, carver *cv)
{
    kd->tlogits = carve(cv, m->chunk_rows * (size_t)m->vl);
    kd->tmax = carve(cv, m->N);
    kd->sums = carve(cv, 3 * m->chunk_rows);
    kd->kl = carve(cv, m->N);
}

void mc_model_kd_free(mc_model *m)
{
    if (!m->kd) return;
    if (m->kd->block) mc_bfree(m->be, m->kd->block);
    free(m->kd);
    m->kd = NULL;
}

mc_status mc_model_set_teacher(mc_model *m, mc_model *teacher, float temperature, float alpha,
                               mc_error *err)
{
    mc_model_kd_free(m);
    if (!teacher) return MC_OK;
    if (!(temperature > 0.0f) || !isfinite(temperature))
        return mc_error_set(err, MC_ERR_USAGE, "distillation: temperature %g is not > 0",
                            (double)temperature);
    if (!(alpha >= 0.0f && alpha <= 1.0f))
        return mc_error_set(err, MC_ERR_USAGE, "distillation: alpha %g is outside [0, 1]",
                            (double)alpha);
    if (m->nchunks != 1 || !m->first_stage || !m->last_stage || teacher->nchunks != 1 ||
        !teacher->first_stage || !teacher->last_stage)
        return mc_error_set(err, MC_ERR_USAGE,
                            "distillation needs the whole model on one pipeline stage");
    if (teacher->cfg.padded_vocab_size != m->cfg.padded_vocab_size || teacher->vl != m->vl)
        return mc_error_set(err, MC_ERR_FORMAT,
                            "distillation: the teacher's padded vocabulary of %lld differs from "
                            "the student's %lld",
                            (long long)teacher->cfg.padded_vocab_size,
                            (long long)m->cfg.padded_vocab_size);
    if (teacher->N != m->N || teacher->B != m->B || teacher->be != m->be)
        return mc_error_set(err, MC_ERR_INTERNAL,
                            "distillation: the teacher runs micro-batches of %zu rows, the "
                            "student %zu",
                            teacher->N, m->N);
    mc_kd *kd = calloc(1, sizeof *kd);
    if (!kd) return mc_error_set(err, MC_ERR_NOMEM, "model: out of memory");
    carver cv = {NULL, 0};
    layout_kd(m, kd, &cv);
    kd->block = mc_balloc(m->be, cv.off, err);
    if (!kd->block) {
        free(kd);
        return err ? err->code : MC_ERR_NOMEM;
    }
    cv = (carver){kd->block, 0};
    layout_kd(m, kd, &cv);
    kd->teacher = teacher;
    kd->tau = temperature;
    kd->inv_tau = 1.0f / temperature;
    kd->alpha = alpha;
    m->kd = kd;
    mc_model_set_doc_resets(teacher, m->docs_on ? &m->docs : NULL);
    return MC_OK;
}

double mc_model_kd_loss(const mc_model *m) { return m->kd ? m->kd->last_kl : 0.0; }

mc_status mc_model_kd_chunk(mc_model *m, size_t r0, size_t R, const int32_t *tgt, int backward,
                            float scale, mc_error *err)
{
    mc_backend *be = m->be;
    mc_kd *kd = m->kd;
    mc_model *t = kd->teacher;
    size_t vl = (size_t)m->vl, Ct = t->C;
    int w = t->out_w >= 0 ? t->out_w : t->wte;
    /* the teacher's logits of the same rows (its head weight prepared by
     * mc_model_final_hidden), their maxima over the whole vocabulary */
    mc_k_linear_fwd(be, t->prec, kd->tlogits, kd->t_lnf + r0 * Ct, param_val(t, w),
                    param_prep(t, w), NULL, R, Ct, vl, 0.0f, 0);
    mc_k_xent_max(be, kd->tmax + r0, kd->tlogits, R, vl);
    mc_status st = mc_allreduce_max(&m->grid, MC_GROUP_TP, be, kd->tmax + r0, R, err);
    if (st) return st;
    /* zs, zt and the cross sum, [3][R], summed over the vocabulary slices */
    mc_k_kd_sums(be, kd->sums, m->logits, kd->tlogits, m->rowmax + r0, kd->tmax + r0, R, vl,
                 kd->inv_tau);
    if ((st = mc_allreduce_sum(&m->grid, MC_GROUP_TP, be, kd->sums, 3 * R, err))) return st;
    mc_k_kd_loss(be, kd->kl + r0, kd->sums, tgt, R);
    if (!backward) return MC_OK;
    /* d/ds of (1 - alpha) CE + alpha tau^2 KL */
    mc_k_kd_bwd(be, m->logits, m->logits, kd->tlogits, m->rowmax + r0, m->sumexp + r0,
                kd->tmax + r0, kd->sums, tgt, m->v0, R, vl, kd->inv_tau, scale * (1.0f - kd->alpha),
                scale * kd->alpha * kd->tau);
    return MC_OK;
}
