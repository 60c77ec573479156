/*
 * test_model_tp.c - tensor and sequence parallelism of the model, checked
 * against one process, run under mpirun by tests/tools/parallel_model.bats.
 *
 *   test_model_tp run FAMILY GROUPS TP [break]  TP-parallel (PP = 1, DP = ranks / TP)
 *   test_model_tp config                      one process: the SP configuration rules
 *
 * FAMILY is gpt (LayerNorm, GELU, learned positions, biases, tied output
 * layer) or llama (RMSNorm, SwiGLU, RoPE, no biases, untied); GROUPS is the
 * number of query groups of the 8 heads (8: plain multi-head attention).
 *
 * Every rank builds the TP=1 reference model (mc_grid_single, no
 * collectives) and the model on the grid, with sequence parallelism off and
 * on, for micro-batches of 1 and 3 sequences (3: the sequence-parallel
 * gather/scatter must reorder blocks; 1: it need not). All get the same
 * counter-based initialization, plus a perturbation of the biases and norm
 * weights by global index (they start at 0 and 1, where a bias counted
 * twice or a norm weight read from the wrong slice would not show), so
 * every rank's slice of every parameter equals the reference's slice
 * exactly; that is checked first. Then two micro-batches are accumulated
 * (grad_scale 1/2 each, some targets ignored) and compared:
 *   - loss: |loss - loss_ref| <= 1e-6 |loss_ref| (reduction order differs);
 *   - gradients: for each tensor, max |g - g_ref| over this rank's slice
 *     <= 1e-5 max |g_ref| over the slice (a relative bound on the tensor's
 *     scale: elementwise relative error is meaningless near zero);
 *   - SP on against SP off with the same bounds (a forward-only step too).
 * `break` compares every split tensor with the NEXT rank's slice: it must
 * fail, which shows the comparison can.
 *
 * Failures go to stderr; rank 0 prints the largest differences seen and
 * "ok N checks on W ranks" when every rank passed.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc/comm.h"
#include "mc/model.h"
#include "rank_check.h"

typedef struct ctx {
    mc_grid g;
    mc_backend *be;
    int checks, failed;
    int brk;
    double max_loss_rel, max_grad_rel, max_sp_grad_rel, max_sp_loss_rel;
} ctx;

#define LOSS_TOL 1e-6
#define GRAD_TOL 1e-5

static void config_of(mc_model_config *c, const char *family, int groups, int sp)
{
    mc_model_config_init(c);
    c->num_layers = 2;
    c->hidden_size = 32;
    c->num_attention_heads = 8;
    c->num_query_groups = groups;
    c->seq_length = 8;
    c->max_position_embeddings = 8;
    /* 61 pads to 64 at TP 1, 2 and 4 alike (multiples of 16 x TP): the
     * padded vocabulary, which the softmax sees, is the same model. */
    c->vocab_size = 61;
    c->make_vocab_size_divisible_by = 16;
    if (!strcmp(family, "llama")) {
        c->normalization = MC_NORM_RMSNORM;
        c->swiglu = 1;
        c->ffn_hidden_size = 64;
        c->position_embedding_type = MC_POS_ROPE;
        c->untie_embeddings_and_output_weights = 1;
        c->add_bias_linear = 0;
    }
    c->init_method_std = 0.2f; /* large enough that attention is not uniform */
    c->sequence_parallel = sp;
}

/* Global flat index of local element (i, k) of parameter p, whose rows are
 * row_chunks chunks each split on its own (mc_param's layout). shift moves
 * the slice to another rank's (the `break` mode). */
static size_t global_index(const mc_param *p, int64_t i, int64_t k, int shift)
{
    int64_t lrc = p->local_rows / p->row_chunks; /* local rows per chunk */
    int64_t j = i / lrc, r = i % lrc;
    int64_t row0 = p->row0, col0 = p->col0;
    if (shift && p->split_dim == 0) row0 = (row0 + lrc) % (p->rows / p->row_chunks);
    if (shift && p->split_dim == 1) col0 = (col0 + p->local_cols) % p->cols;
    return (size_t)((j * (p->rows / p->row_chunks) + row0 + r) * p->cols + col0 + k);
}

static float *to_host(mc_backend *be, const float *x, size_t n)
{
    float *h = malloc(n * sizeof *h + 1);
    if (!h) abort();
    mc_bcopy_to_host(be, h, x, n * sizeof *h);
    return h;
}

/* Biases and norm weights (constant init) get value + 0.1 u, u in [-1, 1)
 * from (name, global index), so every grid sees the same tensors. */
static void perturb(mc_model *m, mc_backend *be)
{
    for (size_t i = 0; i < mc_model_num_params(m); i++) {
        const mc_param *p = mc_model_param(m, i);
        if (p->init_std > 0) continue;
        float *x = to_host(be, mc_model_params(m) + p->offset, p->numel);
        uint64_t key = mc_k_name_key(p->name);
        for (int64_t r = 0; r < p->local_rows; r++)
            for (int64_t k = 0; k < p->local_cols; k++) {
                uint64_t h = (key ^ (global_index(p, r, k, 0) + 1) * 0x9E3779B97F4A7C15ull);
                h ^= h >> 31, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 29;
                x[r * p->local_cols + k] += 0.1f *
                                            (float)((double)(h >> 11) / 4503599627370496.0 - 1.0);
            }
        mc_bcopy_from_host(be, mc_model_params(m) + p->offset, x, p->numel * sizeof *x);
        free(x);
    }
}

static mc_model *build(ctx *c, const mc_model_config *cfg, const mc_grid *g, int B)
{
    mc_error err;
    mc_error_clear(&err);
    mc_model *m = NULL;
    if (mc_model_new(cfg, g, c->be, B, MC_PREC_FP32, &m, &err)) {
        fprintf(stderr, "rank %d: FAILED mc_model_new: %s\n", c->g.rank, err.msg);
        return NULL;
    }
    mc_model_init_weights(m, 1234);
    perturb(m, c->be);
    mc_model_zero_grads(m);
    return m;
}

/* Two accumulated micro-batches; returns the mean of their losses. */
static double steps(ctx *c, mc_model *m, int B, int T, int backward)
{
    size_t N = (size_t)B * T;
    int32_t *tok = malloc(N * sizeof *tok), *tgt = malloc(N * sizeof *tgt);
    double total = 0;
    for (int s = 0; s < 2; s++) {
        for (size_t i = 0; i < N; i++) {
            tok[i] = (int32_t)((i * 7 + 3 + s * 13) % 61);
            tgt[i] = (i % 5 == 3) ? -1 : (int32_t)((i * 11 + 5 + s * 17) % 61);
        }
        mc_error err;
        mc_error_clear(&err);
        double loss = 0;
        int64_t ntok = 0;
        if (mc_model_step(m, tok, tgt, backward, 0.5f, &loss, &ntok, &err)) {
            fprintf(stderr, "rank %d: FAILED mc_model_step: %s\n", c->g.rank, err.msg);
            c->failed++;
        }
        total += loss / 2;
    }
    free(tok);
    free(tgt);
    return total;
}

/* Compare m's slices with the reference ref (TP=1): parameters exactly when
 * grads == 0, else gradients within GRAD_TOL of the slice's scale. */
static void compare(ctx *c, mc_model *m, mc_model *ref, int grads, const char *what, double *maxrel)
{
    int shift = c->brk && c->g.tp > 1;
    for (size_t i = 0; i < mc_model_num_params(m); i++) {
        const mc_param *p = mc_model_param(m, i);
        const mc_param *q = mc_model_param_by_name(ref, p->name);
        CHECK(c, q && q->rows == p->rows && q->cols == p->cols, "%s: %s missing or reshaped", what,
              p->name);
        if (!q) continue;
        float *a = to_host(c->be, (grads ? mc_model_grads(m) : mc_model_params(m)) + p->offset,
                           p->numel);
        float *b = to_host(c->be, (grads ? mc_model_grads(ref) : mc_model_params(ref)) + q->offset,
                           q->numel);
        double maxd = 0, scale = 0;
        size_t worst = 0;
        for (int64_t r = 0; r < p->local_rows; r++)
            for (int64_t k = 0; k < p->local_cols; k++) {
                size_t li = (size_t)(r * p->local_cols + k);
                double ref_v = b[global_index(p, r, k, shift)];
                double d = fabs((double)a[li] - ref_v);
                if (d > maxd || d != d) maxd = d, worst = li;
                if (fabs(ref_v) > scale) scale = fabs(ref_v);
            }
        if (grads) {
            double rel = scale > 0 ? maxd / scale : maxd;
            if (rel > *maxrel) *maxrel = rel;
            CHECK(c, rel <= GRAD_TOL && scale > 0,
                  "%s: gradient of %s: max |diff| %.3g at local %zu, scale %.3g (rel %.3g > %g)",
                  what, p->name, maxd, worst, scale, rel, GRAD_TOL);
        } else {
            CHECK(c, maxd == 0, "%s: parameter %s differs from the TP=1 slice by %.3g at local %zu",
                  what, p->name, maxd, worst);
        }
        free(a);
        free(b);
    }
}

/* Like compare, for two models on the same grid (SP on vs off). */
static void compare_same(ctx *c, mc_model *m, mc_model *o, const char *what, double *maxrel)
{
    float *a = to_host(c->be, mc_model_grads(m), mc_model_numel(m));
    float *b = to_host(c->be, mc_model_grads(o), mc_model_numel(o));
    for (size_t i = 0; i < mc_model_num_params(m); i++) {
        const mc_param *p = mc_model_param(m, i);
        double maxd = 0, scale = 0;
        for (size_t k = 0; k < p->numel; k++) {
            double d = fabs((double)a[p->offset + k] - b[p->offset + k]);
            if (d > maxd || d != d) maxd = d;
            if (fabs(b[p->offset + k]) > scale) scale = fabs(b[p->offset + k]);
        }
        double rel = scale > 0 ? maxd / scale : maxd;
        if (rel > *maxrel) *maxrel = rel;
        CHECK(c, rel <= GRAD_TOL && scale > 0,
              "%s: gradient of %s: max |diff| %.3g, scale %.3g (rel %.3g > %g)", what, p->name,
              maxd, scale, rel, GRAD_TOL);
    }
    free(a);
    free(b);
}

static void check_loss(ctx *c, double got, double want, const char *what, double *maxrel)
{
    double rel = fabs(got - want) / fabs(want);
    if (rel > *maxrel) *maxrel = rel;
    CHECK(c, rel <= LOSS_TOL && want > 0, "%s: loss %.9g, want %.9g (rel %.3g > %g)", what, got,
          want, rel, LOSS_TOL);
}

static void run_case(ctx *c, const char *family, int groups, int B)
{
    mc_model_config cfg;
    mc_grid single;
    mc_grid_single(&single);
    char what[96];
    int T = 8;

    config_of(&cfg, family, groups, 0);
    mc_model *ref = build(c, &cfg, &single, B);
    mc_model *tp = build(c, &cfg, &c->g, B);
    config_of(&cfg, family, groups, 1);
    mc_model *sp = build(c, &cfg, &c->g, B);
    CHECK(c, ref && tp && sp, "%s: models built", family);
    if (!ref || !tp || !sp) goto out;

    snprintf(what, sizeof what, "%s G=%d TP=%d B=%d", family, groups, c->g.tp, B);
    compare(c, tp, ref, 0, what, NULL);
    compare(c, sp, ref, 0, what, NULL);

    double lref = steps(c, ref, B, T, 1);
    double ltp = steps(c, tp, B, T, 1);
    double lsp = steps(c, sp, B, T, 1);
    check_loss(c, ltp, lref, what, &c->max_loss_rel);
    compare(c, tp, ref, 1, what, &c->max_grad_rel);
    snprintf(what, sizeof what, "%s G=%d TP=%d B=%d SP", family, groups, c->g.tp, B);
    check_loss(c, lsp, ltp, what, &c->max_sp_loss_rel);
    check_loss(c, lsp, lref, what, &c->max_loss_rel);
    compare_same(c, sp, tp, what, &c->max_sp_grad_rel);
    compare(c, sp, ref, 1, what, &c->max_grad_rel);
    /* forward only: the same loss, the gradients untouched */
    double lf = steps(c, sp, B, T, 0);
    check_loss(c, lf, lsp, what, &c->max_sp_loss_rel);
    compare_same(c, sp, tp, what, &c->max_sp_grad_rel);
out:
    mc_model_free(ref);
    mc_model_free(tp);
    mc_model_free(sp);
}

static int run(int argc, char **argv)
{
    ctx c;
    memset(&c, 0, sizeof c);
    mc_error err;
    mc_error_clear(&err);
    const char *family = argv[2];
    int groups = atoi(argv[3]), tpsize = atoi(argv[4]);
    c.brk = argc > 5 && !strcmp(argv[5], "break");
    if (mc_grid_init_mpi(&argc, &argv, tpsize, 1, 1, 1, &c.g, &err)) {
        if (c.g.rank == 0) fprintf(stderr, "test_model_tp: error: %s\n", err.msg);
        return mc_grid_fail(&c.g, 1);
    }
    if (mc_backend_cpu_new(1, &c.be, &err)) {
        fprintf(stderr, "rank %d: %s\n", c.g.rank, err.msg);
        return mc_grid_fail(&c.g, 0);
    }
    for (int B = 1; B <= 3; B += 2) run_case(&c, family, groups, B);

    double tot[2] = {c.failed, c.checks};
    if (mc_allreduce_sum_f64(&c.g, MC_GROUP_WORLD, tot, 2, &err)) {
        fprintf(stderr, "rank %d: %s\n", c.g.rank, err.msg);
        return mc_grid_fail(&c.g, 0);
    }
    double mx[4] = {c.max_loss_rel, c.max_grad_rel, c.max_sp_loss_rel, c.max_sp_grad_rel};
    mc_backend *be = c.be;
    for (int i = 0; i < 4; i++) { /* max over ranks, on backend memory */
        float *x = mc_balloc(be, sizeof(float), &err);
        float v = (float)mx[i];
        mc_bcopy_from_host(be, x, &v, sizeof v);
        mc_allreduce_max(&c.g, MC_GROUP_WORLD, be, x, 1, &err);
        mc_bcopy_to_host(be, &v, x, sizeof v);
        mx[i] = v;
        mc_bfree(be, x);
    }
    if (c.g.rank == 0) {
        printf("# %s G=%d TP=%d against TP=1: max loss rel %.3g, max grad rel %.3g\n", family,
               groups, c.g.tp, mx[0], mx[1]);
        printf("# %s G=%d TP=%d SP against no SP: max loss rel %.3g, max grad rel %.3g\n", family,
               groups, c.g.tp, mx[2], mx[3]);
        if (tot[0] == 0)
            printf("ok %.0f checks on %d ranks\n", tot[1], c.g.world);
        else
            printf("FAILED %.0f of %.0f checks on %d ranks\n", tot[0], tot[1], c.g.world);
    }
    int rc = tot[0] == 0 ? 0 : 1;
    mc_grid_finalize(&c.g); /* its staging memory is the backend's */
    mc_backend_free(be);
    return rc;
}

/* One process: the configuration rules of sequence parallelism. */
static int run_config(void)
{
    ctx c;
    memset(&c, 0, sizeof c);
    mc_grid_single(&c.g);
    mc_model_config cfg;
    mc_error err;

    config_of(&cfg, "gpt", 8, 1);
    cfg.seq_length = 6;
    cfg.max_position_embeddings = 6;
    mc_error_clear(&err);
    mc_status st = mc_model_config_finish(&cfg, 4, &err);
    CHECK(&c,
          st == MC_ERR_USAGE && strstr(err.msg, "--seq-length (6)") &&
              strstr(err.msg, "--sequence-parallel") &&
              strstr(err.msg, "--tensor-model-parallel-size (4)"),
          "seq 6 at TP=4 with SP: status %d, '%s'", (int)st, err.msg);
    printf("# %s\n", err.msg);

    config_of(&cfg, "gpt", 8, 1); /* seq 6 without SP is fine */
    cfg.seq_length = 6;
    cfg.max_position_embeddings = 6;
    cfg.sequence_parallel = 0;
    mc_error_clear(&err);
    CHECK(&c, mc_model_config_finish(&cfg, 4, &err) == MC_OK, "seq 6 at TP=4 without SP: %s",
          err.msg);

    config_of(&cfg, "gpt", 8, 1); /* SP at TP=1 is a no-op (Megatron turns it off) */
    cfg.seq_length = 7;
    cfg.max_position_embeddings = 7;
    mc_error_clear(&err);
    CHECK(&c, mc_model_config_finish(&cfg, 1, &err) == MC_OK, "seq 7 at TP=1 with SP: %s", err.msg);

    config_of(&cfg, "gpt", 8, 0); /* mc_model_config_init leaves SP off */
    CHECK(&c, cfg.sequence_parallel == 0, "sequence_parallel defaults to 0");
    mc_model_config_init(&cfg);
    CHECK(&c, cfg.sequence_parallel == 0, "sequence_parallel defaults to 0");

    if (c.failed) {
        printf("FAILED %d of %d checks\n", c.failed, c.checks);
        return 1;
    }
    printf("ok %d checks on 1 rank\n", c.checks);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "run") && argc >= 5) return run(argc, argv);
    if (!strcmp(mode, "config")) return run_config();
    fprintf(stderr, "usage: test_model_tp run gpt|llama GROUPS TP [break] | config\n");
    return 2;
}
