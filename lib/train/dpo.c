/*
 * dpo.c - direct preference optimization's objective (see dpo.h and
 * mc/train.h): per pair the log-ratios against the reference, the loss of
 * TRL's sigmoid, IPO and hinge types, its derivative with respect to every
 * answer token's log-probability, and TRL's reward metrics.
 */
#include <math.h>
#include <string.h>

#include "train/dpo.h"

/* One sequence's logp: the sum over its counted targets, in position
 * order, in double (the same bits whatever the thread count). */
static double seq_logp(const float *logp, const int32_t *targets, size_t T)
{
    double sum = 0;
    for (size_t t = 0; t < T; t++)
        if (targets[t] >= 0) sum += (double)logp[t];
    return sum;
}

void mc_dpo_sequence_logps(const float *logp, const int32_t *targets, size_t B, size_t T,
                           double *seq)
{
    for (size_t b = 0; b < B; b++) {
        seq[2 * b] = seq_logp(logp + b * T, targets + b * T, T);
        seq[2 * b + 1] = seq_logp(logp + (B + b) * T, targets + (B + b) * T, T);
    }
}

/* log sigmoid(x), without overflow either way */
static double log_sigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }
static double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }

static int64_t counted(const int32_t *targets, size_t T)
{
    int64_t n = 0;
    for (size_t t = 0; t < T; t++) n += targets[t] >= 0;
    return n;
}

mc_status mc_dpo_objective(const mc_dpo_config *c, const float *logp, const int32_t *targets,
                           size_t B, size_t T, const double *ref, float *dlogp, double *loss,
                           mc_dpo_sums *sums, mc_error *err)
{
    (void)err;
    double total = 0, beta = c->beta, ls = c->label_smoothing;
    for (size_t b = 0; b < B; b++) {
        const int32_t *tc = targets + b * T, *tr = targets + (B + b) * T;
        double lc = seq_logp(logp + b * T, tc, T) - ref[2 * b];
        double lr = seq_logp(logp + (B + b) * T, tr, T) - ref[2 * b + 1];
        double delta = lc - lr, z = beta * delta, l, dc, dr; /* d loss / d logp_c, _r */
        switch (c->loss_type) {
        case MC_DPO_IPO: {
            double nc = (double)counted(tc, T), nr = (double)counted(tr, T);
            if (nc < 1) nc = 1; /* TRL's clamp(min=1) */
            if (nr < 1) nr = 1;
            double d = lc / nc - lr / nr - 1.0 / (2.0 * beta);
            l = d * d;
            dc = 2.0 * d / nc;
            dr = -2.0 * d / nr;
            break;
        }
        case MC_DPO_HINGE:
            l = 1.0 - z > 0 ? 1.0 - z : 0.0;
            dc = 1.0 - z > 0 ? -beta : 0.0; /* relu'(0) = 0, as torch */
            dr = -dc;
            break;
        default: /* sigmoid, with conservative DPO's label smoothing */
            l = -(1.0 - ls) * log_sigmoid(z) - ls * log_sigmoid(-z);
            dc = beta * (-(1.0 - ls) * sigmoid(-z) + ls * sigmoid(z));
            dr = -dc;
            break;
        }
        total += l;
        for (size_t t = 0; t < T; t++) {
            if (tc[t] >= 0) dlogp[b * T + t] = (float)(dc / (double)B);
            if (tr[t] >= 0) dlogp[(B + b) * T + t] = (float)(dr / (double)B);
        }
        if (sums) {
            double rc = beta * lc, rr = beta * lr;
            sums->loss += l;
            sums->chosen += rc;
            sums->rejected += rr;
            sums->accuracies += rc > rr ? 1.0 : 0.0;
            sums->margins += rc - rr;
            sums->pairs += 1;
        }
    }
    *loss = total / (double)B;
    return MC_OK;
}
