/*
 * test_optim.c - the optimizer (lib/train/optim.c): AdamW against a float64
 * reference written here from the formula in kern.h, the two weight-decay
 * groups, the global gradient norm and Megatron's clipping, loss-scale
 * unscaling, the skipped step on NaN/Inf gradients, and the dynamic and
 * constant loss scalers step by step against hand-worked sequences.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mc/train.h"
#include "tap.h"

#define NUMEL 24

/* Three parameters with a gap between the second and the third, so the span
 * builder must not merge across it: w1 [0,10) decays, b1 [10,14) does not,
 * w2 [16,24) decays. */
static void make_params(mc_param ps[3])
{
    memset(ps, 0, 3 * sizeof *ps);
    snprintf(ps[0].name, sizeof ps[0].name, "w1");
    ps[0].offset = 0, ps[0].numel = 10, ps[0].split_dim = 0;
    snprintf(ps[1].name, sizeof ps[1].name, "b1");
    ps[1].offset = 10, ps[1].numel = 4, ps[1].split_dim = -1, ps[1].no_weight_decay = 1;
    snprintf(ps[2].name, sizeof ps[2].name, "w2");
    ps[2].offset = 16, ps[2].numel = 8, ps[2].split_dim = 1;
}

static uint64_t rng_state = 42;
static double urand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* Reference AdamW in float64 over the covered elements (kern.h formula). */
typedef struct ref {
    double p[NUMEL], m[NUMEL], v[NUMEL];
    int64_t step;
} ref;

static void ref_step(ref *r, const float *g, const mc_param ps[3], double lr, double b1, double b2,
                     double eps, double wd, double gscale)
{
    /* The kernel takes its hyperparameters as floats: round them the same
     * way, so the comparison measures the arithmetic alone (float(0.999)
     * alone moves 1 - beta2 by 1.3e-5 relative). */
    r->step++;
    double bc1 = (float)(1 - pow(b1, (double)r->step)), bc2 = (float)(1 - pow(b2, (double)r->step));
    b1 = (float)b1, b2 = (float)b2, eps = (float)eps, wd = (float)wd, lr = (float)lr;
    gscale = (float)gscale;
    for (int k = 0; k < 3; k++)
        for (size_t i = ps[k].offset; i < ps[k].offset + ps[k].numel; i++) {
            double gi = g[i] * gscale;
            r->m[i] = b1 * r->m[i] + (1 - b1) * gi;
            r->v[i] = b2 * r->v[i] + (1 - b2) * gi * gi;
            double w = ps[k].no_weight_decay ? 0 : wd;
            r->p[i] -= lr * (r->m[i] / bc1 / (sqrt(r->v[i] / bc2) + eps) + w * r->p[i]);
        }
}

static double max_rel(const double *a, const float *b, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]) / (fabs(a[i]) + 1e-6);
        if (d > worst) worst = d;
    }
    return worst;
}

int main(void)
{
    mc_error err;
    mc_backend *be;
    if (mc_backend_cpu_new(1, &be, &err)) {
        printf("Bail out! %s\n", err.msg);
        return 1;
    }
    mc_grid grid;
    mc_grid_single(&grid);
    mc_param ps[3];
    make_params(ps);

    float hp[NUMEL], hg[NUMEL], out[NUMEL];
    for (int i = 0; i < NUMEL; i++) hp[i] = (float)urand(), hg[i] = (float)(0.3 * urand());
    float *p = mc_balloc(be, sizeof hp, &err), *g = mc_balloc(be, sizeof hg, &err);
    mc_bcopy_from_host(be, p, hp, sizeof hp);
    mc_bcopy_from_host(be, g, hg, sizeof hg);

    mc_optim_config cfg;
    mc_optim_config_init(&cfg);
    TAP_OK(cfg.weight_decay == 0.01 && cfg.beta1 == 0.9 && cfg.beta2 == 0.999 && cfg.eps == 1e-8 &&
               cfg.clip_grad == 1.0,
           "defaults are Megatron's (wd 0.01, betas 0.9/0.999, eps 1e-8, clip 1.0)");
    cfg.weight_decay = 0.1;
    cfg.clip_grad = 0; /* no clipping for the first checks */
    mc_optim *o;
    TAP_OK(mc_optim_new(be, &grid, &cfg, p, g, NUMEL, ps, 3, &o, &err) == MC_OK,
           "optimizer created");

    /* Three steps with the same gradients, against the float64 reference. */
    ref r = {{0}, {0}, {0}, 0};
    for (int i = 0; i < NUMEL; i++) r.p[i] = hp[i];
    double norm_ref = 0;
    for (int k = 0; k < 3; k++)
        for (size_t i = ps[k].offset; i < ps[k].offset + ps[k].numel; i++)
            norm_ref += (double)hg[i] * hg[i];
    norm_ref = sqrt(norm_ref);
    mc_optim_result res;
    int ok = 1;
    for (int s = 0; s < 3; s++) {
        ok &= mc_optim_step(o, 1e-2, cfg.weight_decay, 1.0, &res, &err) == MC_OK;
        ref_step(&r, hg, ps, 1e-2, 0.9, 0.999, 1e-8, 0.1, 1.0);
    }
    TAP_OK(ok && !res.found_inf && res.clip_coeff == 1.0, "three steps, none skipped, no clipping");
    TAP_OK(fabs(res.grad_norm - norm_ref) <= 1e-12 * norm_ref,
           "grad norm %.15g equals the float64 norm %.15g", res.grad_norm, norm_ref);
    mc_bcopy_to_host(be, out, p, sizeof out);
    double rel = max_rel(r.p, out, NUMEL);
    TAP_OK(rel < 1e-6, "parameters match the float64 AdamW within 1e-6 relative (worst %.2g)", rel);
    TAP_OK(out[14] == hp[14] && out[15] == hp[15], "elements in the gap between params untouched");
    mc_bcopy_to_host(be, out, mc_optim_exp_avg(o), sizeof out);
    TAP_OK(max_rel(r.m, out, NUMEL) < 1e-6, "exp_avg matches the reference");
    mc_bcopy_to_host(be, out, mc_optim_exp_avg_sq(o), sizeof out);
    TAP_OK(max_rel(r.v, out, NUMEL) < 1e-6, "exp_avg_sq matches the reference");
    TAP_OK(mc_optim_steps(o) == 3, "step count is 3");

    /* The two decay groups: with zero gradients Adam's update is 0, so a
     * decayed parameter shrinks by exactly lr * wd * p and a bias stays. */
    float zeros[NUMEL] = {0}, before[NUMEL];
    mc_bcopy_from_host(be, g, zeros, sizeof zeros);
    mc_optim_free(o);
    TAP_OK(mc_optim_new(be, &grid, &cfg, p, g, NUMEL, ps, 3, &o, &err) == MC_OK, "fresh optimizer");
    mc_bcopy_to_host(be, before, p, sizeof before);
    mc_optim_step(o, 0.5, cfg.weight_decay, 1.0, &res, &err);
    mc_bcopy_to_host(be, out, p, sizeof out);
    double worst = 0;
    for (int i = 0; i < 10; i++) {
        double want = before[i] - 0.5 * 0.1 * before[i];
        double d = fabs(out[i] - want) / fabs(want);
        if (d > worst) worst = d;
    }
    TAP_OK(worst < 1e-6, "weights decay by lr*wd*p (worst rel %.2g)", worst);
    TAP_OK(!memcmp(out + 10, before + 10, 4 * sizeof(float)),
           "biases (no_weight_decay) do not decay");
    TAP_OK(res.grad_norm == 0.0, "zero gradients: norm 0");

    /* Loss scale: gradients 1024x with loss_scale 1024 give bit-identical
     * results to unscaled gradients (powers of two scale exactly). */
    float scaled[NUMEL];
    for (int i = 0; i < NUMEL; i++) scaled[i] = hg[i] * 1024.0f;
    float pa[NUMEL], pb[NUMEL];
    mc_bcopy_from_host(be, p, hp, sizeof hp);
    mc_bcopy_from_host(be, g, hg, sizeof hg);
    mc_optim_free(o);
    mc_optim_new(be, &grid, &cfg, p, g, NUMEL, ps, 3, &o, &err);
    mc_optim_step(o, 1e-3, cfg.weight_decay, 1.0, &res, &err);
    double n1 = res.grad_norm;
    mc_bcopy_to_host(be, pa, p, sizeof pa);
    mc_bcopy_from_host(be, p, hp, sizeof hp);
    mc_bcopy_from_host(be, g, scaled, sizeof scaled);
    mc_optim_free(o);
    mc_optim_new(be, &grid, &cfg, p, g, NUMEL, ps, 3, &o, &err);
    mc_optim_step(o, 1e-3, cfg.weight_decay, 1024.0, &res, &err);
    mc_bcopy_to_host(be, pb, p, sizeof pb);
    TAP_OK(!memcmp(pa, pb, sizeof pa), "loss-scaled gradients unscale exactly");
    TAP_OK(fabs(res.grad_norm - n1) <= 1e-12 * n1, "the norm is of the unscaled gradients");

    /* Clipping: clip 0.1 below the norm -> coeff = 0.1 / (norm + 1e-6), and
     * the update equals AdamW on the clipped gradients. */
    cfg.clip_grad = 0.1;
    mc_bcopy_from_host(be, p, hp, sizeof hp);
    mc_bcopy_from_host(be, g, hg, sizeof hg);
    mc_optim_free(o);
    mc_optim_new(be, &grid, &cfg, p, g, NUMEL, ps, 3, &o, &err);
    for (int i = 0; i < NUMEL; i++) r.p[i] = hp[i], r.m[i] = r.v[i] = 0;
    r.step = 0;
    ok = 1;
    for (int s = 0; s < 2; s++) {
        ok &= mc_optim_step(o, 1e-2, cfg.weight_decay, 1.0, &res, &err) == MC_OK;
        ref_step(&r, hg, ps, 1e-2, 0.9, 0.999, 1e-8, 0.1, 0.1 / (norm_ref + 1e-6));
    }
    TAP_OK(ok && fabs(res.clip_coeff - 0.1 / (norm_ref + 1e-6)) < 1e-12,
           "clip_coeff = clip / (norm + 1e-6) = %.9g", res.clip_coeff);
    mc_bcopy_to_host(be, out, p, sizeof out);
    rel = max_rel(r.p, out, NUMEL);
    TAP_OK(rel < 1e-6, "clipped update matches the reference (worst %.2g)", rel);
    cfg.clip_grad = 100.0;
    mc_optim_free(o);
    mc_optim_new(be, &grid, &cfg, p, g, NUMEL, ps, 3, &o, &err);
    mc_optim_step(o, 1e-2, cfg.weight_decay, 1.0, &res, &err);
    TAP_OK(res.clip_coeff == 1.0, "a clip above the norm leaves the gradients alone");

    /* A NaN or Inf gradient: nothing moves, the step count stays. */
    int64_t steps = mc_optim_steps(o);
    float m_before[NUMEL], m_after[NUMEL];
    mc_bcopy_to_host(be, before, p, sizeof before);
    mc_bcopy_to_host(be, m_before, mc_optim_exp_avg(o), sizeof m_before);
    float bad[NUMEL];
    memcpy(bad, hg, sizeof bad);
    bad[12] = NAN; /* in the bias span */
    mc_bcopy_from_host(be, g, bad, sizeof bad);
    TAP_OK(mc_optim_step(o, 1e-2, cfg.weight_decay, 1.0, &res, &err) == MC_OK && res.found_inf,
           "a NaN gradient is found");
    mc_bcopy_to_host(be, out, p, sizeof out);
    mc_bcopy_to_host(be, m_after, mc_optim_exp_avg(o), sizeof m_after);
    TAP_OK(!memcmp(out, before, sizeof out) && !memcmp(m_after, m_before, sizeof m_after) &&
               mc_optim_steps(o) == steps,
           "NaN: parameters, moments and step count untouched");
    bad[12] = hg[12];
    bad[3] = INFINITY;
    mc_bcopy_from_host(be, g, bad, sizeof bad);
    mc_optim_step(o, 1e-2, cfg.weight_decay, 1.0, &res, &err);
    TAP_OK(res.found_inf && isinf(res.grad_norm), "an Inf gradient is found; the norm is Inf");
    mc_bcopy_to_host(be, out, p, sizeof out);
    TAP_OK(!memcmp(out, before, sizeof out), "Inf: parameters untouched");
    /* 1e30 is finite in float but its square is not: found only by a
     * double accumulation, and it must not count as an overflow. */
    bad[3] = 1e30f;
    mc_bcopy_from_host(be, g, bad, sizeof bad);
    mc_optim_step(o, 1e-2, cfg.weight_decay, 1.0, &res, &err);
    TAP_OK(!res.found_inf && fabs(res.grad_norm - 1e30) < 1e24,
           "a huge finite gradient is not an overflow (norm %.6g)", res.grad_norm);
    mc_optim_set_steps(o, 41);
    TAP_OK(mc_optim_steps(o) == 41, "set_steps restores the step count");
    mc_optim_free(o);

    /* Bad arguments. */
    cfg.beta1 = 1.0;
    TAP_OK(mc_optim_new(be, &grid, &cfg, p, g, NUMEL, ps, 3, &o, &err) == MC_ERR_USAGE &&
               strstr(err.msg, "betas"),
           "beta1 = 1 refused: %s", err.msg);
    cfg.beta1 = 0.9;
    ps[2].offset = 12; /* overlaps b1 */
    TAP_OK(mc_optim_new(be, &grid, &cfg, p, g, NUMEL, ps, 3, &o, &err) == MC_ERR_INTERNAL &&
               strstr(err.msg, "w2"),
           "overlapping parameters refused, naming one: %s", err.msg);
    ps[2].offset = 20; /* past the end */
    TAP_OK(mc_optim_new(be, &grid, &cfg, p, g, NUMEL, ps, 3, &o, &err) == MC_ERR_INTERNAL &&
               strstr(err.msg, "outside"),
           "a parameter past the buffer refused: %s", err.msg);

    /* Dynamic loss scaler, Megatron's DynamicGradScaler: window 3,
     * hysteresis 2, from 8 with minimum 1. */
    mc_loss_scaler s;
    mc_loss_scaler_dynamic(&s, 8, 1, 3, 2);
    mc_loss_scaler_update(&s, 1);
    TAP_OK(s.scale == 8 && s.hysteresis_tracker == 1, "first overflow spends hysteresis, scale 8");
    mc_loss_scaler_update(&s, 1);
    TAP_OK(s.scale == 4, "second overflow in a row backs off to 4");
    mc_loss_scaler_update(&s, 1);
    TAP_OK(s.scale == 2, "with no hysteresis left every overflow backs off: 2");
    mc_loss_scaler_update(&s, 0);
    mc_loss_scaler_update(&s, 0);
    TAP_OK(s.scale == 2 && s.growth_tracker == 2, "two clean steps: no growth yet");
    mc_loss_scaler_update(&s, 0);
    TAP_OK(s.scale == 4 && s.growth_tracker == 0 && s.hysteresis_tracker == 2,
           "a full clean window doubles to 4 and restores the hysteresis");
    mc_loss_scaler_update(&s, 0);
    mc_loss_scaler_update(&s, 1);
    TAP_OK(s.scale == 4 && s.growth_tracker == 0, "an overflow resets the growth count");
    mc_loss_scaler_update(&s, 1);
    mc_loss_scaler_update(&s, 1);
    mc_loss_scaler_update(&s, 1);
    TAP_OK(s.scale == 1, "backs off to the minimum 1");
    mc_loss_scaler_update(&s, 1);
    TAP_OK(s.scale == 1, "never below the minimum");
    mc_loss_scaler_dynamic(&s, 4294967296.0, 1, 1000, 2);
    TAP_OK(s.scale == 4294967296.0 && s.window == 1000 && s.hysteresis_tracker == 2,
           "Megatron's defaults: 2^32, window 1000, hysteresis 2");
    mc_loss_scaler_fixed(&s, 128);
    mc_loss_scaler_update(&s, 1);
    mc_loss_scaler_update(&s, 0);
    TAP_OK(s.scale == 128, "a constant scaler never changes");

    mc_bfree(be, p);
    mc_bfree(be, g);
    mc_backend_free(be);
    return tap_done();
}
