/*
 * recompute.c - the activation recomputation setting (Megatron's
 * --recompute-granularity, --recompute-method, --recompute-num-layers and
 * --recompute-modules): module names, the checks Megatron's
 * TransformerConfig makes, and the check against the pipeline's stages.
 * What a layer keeps under each setting, and the recomputation itself, are
 * model.c's (doc/ARCHITECTURE.md, "Recomputation").
 */
#include <stdio.h>
#include <string.h>

#include "model/model_internal.h"

#define BAD(...) mc_error_set(err, MC_ERR_USAGE, __VA_ARGS__)

static const struct {
    const char *name;
    unsigned bit; /* 0: a Megatron module mc's layers do not have */
    const char *why;
} modules[] = {
    {"core_attn", MC_RECOMPUTE_CORE_ATTN, NULL},
    {"layernorm", MC_RECOMPUTE_LAYERNORM, NULL},
    {"mlp", MC_RECOMPUTE_MLP, NULL},
    /* mc's own: the dense MLP's activation function alone (what moe_act is
     * for the experts; MindSpeed's --recompute-activation-function) */
    {"mlp_act", MC_RECOMPUTE_MLP_ACT, NULL},
    /* mc's own: the residual after attention, remade by the output projection */
    {"attn_proj", MC_RECOMPUTE_ATTN_PROJ, NULL},
    {"moe_act", MC_RECOMPUTE_MOE_ACT, NULL},
    {"moe", MC_RECOMPUTE_MOE, NULL},
    {"shared_experts", MC_RECOMPUTE_SHARED_EXPERTS, NULL},
    {"mla_up_proj", 0, "mc's attention has no multi-latent attention"},
    {"gdn_norm_out", 0, "mc's layers have no gated delta net"},
    {"gdp_in_proj", 0, "mc's layers have no gated delta product"},
    {"gdp_qkv", 0, "mc's layers have no gated delta product"},
    {"mhc", 0, "mc's layers have no hyper-connections"},
};
#define NMODULES (sizeof modules / sizeof modules[0])

mc_status mc_recompute_module(const char *name, unsigned *bit, mc_error *err)
{
    for (size_t i = 0; i < NMODULES; i++) {
        if (strcmp(name, modules[i].name)) continue;
        if (!modules[i].bit)
            return BAD("--recompute-modules %s: %s (mc recomputes core_attn, layernorm, mlp, "
                       "mlp_act, attn_proj, moe, moe_act and shared_experts)",
                       name, modules[i].why);
        *bit = modules[i].bit;
        return MC_OK;
    }
    return BAD("--recompute-modules: unknown module '%s' (choose from core_attn, layernorm, mlp, "
               "mlp_act, attn_proj, moe, moe_act, shared_experts)",
               name);
}

void mc_recompute_describe(const mc_model_config *c, char *buf, size_t n)
{
    if (c->recompute_granularity == MC_RECOMPUTE_FULL) {
        snprintf(buf, n, "full %s %d",
                 c->recompute_method == MC_RECOMPUTE_BLOCK ? "block" : "uniform",
                 c->recompute_num_layers);
    } else if (c->recompute_granularity == MC_RECOMPUTE_SELECTIVE) {
        size_t off = (size_t)snprintf(buf, n, "selective");
        const char *sep = " ";
        for (size_t i = 0; i < NMODULES && off < n; i++)
            if (modules[i].bit && (c->recompute_modules & modules[i].bit)) {
                off += (size_t)snprintf(buf + off, n - off, "%s%s", sep, modules[i].name);
                sep = ",";
            }
    } else {
        snprintf(buf, n, "none");
    }
}

/* TransformerConfig.__post_init__'s checks, with mc's words. */
mc_status mc_model_recompute_finish(mc_model_config *c, mc_error *err)
{
    int g = c->recompute_granularity, meth = c->recompute_method, nl = c->recompute_num_layers;
    if (g != MC_RECOMPUTE_NONE && g != MC_RECOMPUTE_FULL && g != MC_RECOMPUTE_SELECTIVE)
        return mc_error_set(err, MC_ERR_INTERNAL, "model: recompute granularity %d", g);
    if (meth && meth != MC_RECOMPUTE_UNIFORM && meth != MC_RECOMPUTE_BLOCK)
        return mc_error_set(err, MC_ERR_INTERNAL, "model: recompute method %d", meth);
    if (g != MC_RECOMPUTE_FULL && (meth || nl))
        return BAD("--recompute-method and --recompute-num-layers need "
                   "--recompute-granularity full");
    if (g == MC_RECOMPUTE_FULL && !meth)
        return BAD("--recompute-granularity full needs --recompute-method uniform or block");
    if (g == MC_RECOMPUTE_FULL && nl < 1)
        return BAD("--recompute-granularity full needs --recompute-num-layers N >= 1 (got %d)", nl);
    if (g != MC_RECOMPUTE_SELECTIVE && c->recompute_modules)
        return BAD("--recompute-modules needs --recompute-granularity selective");
    if (g == MC_RECOMPUTE_SELECTIVE && !c->recompute_modules)
        c->recompute_modules = MC_RECOMPUTE_CORE_ATTN; /* Megatron's default */
    if (c->recompute_modules &
        ~(unsigned)(MC_RECOMPUTE_CORE_ATTN | MC_RECOMPUTE_LAYERNORM | MC_RECOMPUTE_MLP |
                    MC_RECOMPUTE_MLP_ACT | MC_RECOMPUTE_ATTN_PROJ | MC_RECOMPUTE_MOE |
                    MC_RECOMPUTE_MOE_ACT | MC_RECOMPUTE_SHARED_EXPERTS))
        return mc_error_set(err, MC_ERR_INTERNAL, "model: recompute modules 0x%x",
                            c->recompute_modules);
    return MC_OK;
}

mc_status mc_model_check_recompute(const mc_model_config *c, int pp, mc_error *err)
{
    mc_model_config copy = *c;
    mc_status st = mc_model_recompute_finish(&copy, err);
    if (st) return st;
    if (c->recompute_granularity != MC_RECOMPUTE_FULL) return MC_OK;
    int v;
    st = mc_model_num_chunks_for(c, pp, &v, err);
    if (st) return st;
    for (int r = 0; r < pp; r++)
        for (int k = 0; k < v; k++) {
            int l0, l1;
            if ((st = mc_model_chunk_layers(c, pp, r, k, &l0, &l1, err))) return st;
            if (c->recompute_num_layers <= l1 - l0) continue;
            if (v > 1)
                return BAD("--recompute-num-layers %d is more than the %d layers of model chunk "
                           "%d of pipeline stage %d",
                           c->recompute_num_layers, l1 - l0, k, r);
            return BAD("--recompute-num-layers %d is more than the %d layers of pipeline stage %d",
                       c->recompute_num_layers, l1 - l0, r);
        }
    return MC_OK;
}

unsigned mc_recompute_layer_has(int moe)
{
    return MC_ACT_ALL & ~(moe ? MC_ACT_MLP : MC_ACT_MOE_ALL);
}

unsigned mc_recompute_dropped(unsigned modules, int moe)
{
    return (modules & MC_RECOMPUTE_CORE_ATTN ? MC_ACT_ATT : 0u) |
           (modules & MC_RECOMPUTE_LAYERNORM ? MC_ACT_LN1 | MC_ACT_LN2 : 0u) |
           (!moe && (modules & MC_RECOMPUTE_MLP) ? MC_ACT_LN2 | MC_ACT_MLP : 0u) |
           (!moe && (modules & MC_RECOMPUTE_MLP_ACT) ? MC_ACT_ACT : 0u) |
           (modules & MC_RECOMPUTE_ATTN_PROJ ? MC_ACT_RES2 : 0u) |
           (moe && (modules & MC_RECOMPUTE_MOE) ? MC_ACT_MOE_ALL : 0u) |
           (moe && (modules & MC_RECOMPUTE_MOE_ACT) ? MC_ACT_MOE_ACT : 0u) |
           (moe && (modules & MC_RECOMPUTE_SHARED_EXPERTS) ? MC_ACT_SHARED : 0u);
}
