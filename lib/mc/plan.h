/*
 * plan.h - what a training run will need, computed from its configuration
 * alone (mc-train --dry-run): per kind of rank (pipeline stage; ranks of one
 * stage differ only in their slices), the bytes of parameters, gradients,
 * Adam state and activations, and the bytes each parallel group moves per
 * iteration. Nothing is allocated: the figures repeat the arithmetic of
 * lib/model/params.c (the parameter registry), lib/model/model.c (the
 * activation block), lib/train/optim.c and distopt.c (moments) and
 * lib/train/pipeline.c (slots in flight), so they change with them.
 */
#ifndef MC_PLAN_H
#define MC_PLAN_H

#include <stdint.h>
#include "mc/kern.h"
#include "mc/model.h"
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MC_PLAN_RECOMPUTE_SETTINGS 4

typedef struct mc_plan_stage {
    int first_layer, last_layer; /* global layers [first, last) */
    int64_t params;              /* local parameter elements (unpadded) */
    int64_t numel;               /* elements of the parameter buffer (64-byte aligned) */
    double param_bytes, grad_bytes, optim_bytes, act_bytes;
    /* act_bytes = slots x act_kept + act_workspace + act_scratch + act_pipe:
     * what each micro-batch in flight keeps, recomputation's workspace and
     * the scratch (mc_model_act_bytes), and the pipeline's gradient buffer */
    double act_kept, act_workspace, act_scratch, act_pipe;
    /* act_bytes under other recomputation settings: none, selective
     * core_attn, selective core_attn,layernorm,mlp, full uniform 1 */
    double act_by[MC_PLAN_RECOMPUTE_SETTINGS];
    int slots; /* micro-batches whose activations are held */
    /* Bytes per iteration this rank sends into collectives of each group
     * (tensor sizes, not the wire), and the calls. */
    double tp_bytes, dp_bytes, pp_bytes, embd_bytes;
    int64_t tp_calls, dp_calls, pp_calls, embd_calls;
    /* Context parallelism's point to point (sends and receives counted
     * alike, as mc/comm_stats.h counts them; the loss's host scalar left
     * out); cp_wire: the bytes sent. Its scratch is in act_bytes. */
    double cp_bytes, cp_wire;
    int64_t cp_calls;
    /* The same in wire bytes per rank of a ring algorithm: all-reduce
     * 2(n-1)/n x size, all-gather / reduce-scatter (n-1)/n x full size,
     * point to point x 1. */
    double tp_wire, dp_wire, pp_wire, embd_wire;
    /* Expert parallelism: the experts' share of numel (their gradients
     * reduced over the expert-data-parallel group, the rest over the
     * data-parallel one); the MoE dispatch over the EP group per
     * iteration (alltoall: the rows sent, its own included, with balanced
     * routing, which is each rank's figure with padding to the capacity and
     * the group's mean otherwise; allgather: the gathers and
     * reduce-scatters), and the experts' gradient reduction. */
    int64_t numel_expert;
    double ep_bytes, ep_wire, edp_bytes, edp_wire;
    int64_t ep_calls, edp_calls;
    /* Expert tensor parallelism smaller than TP: the experts' sums,
     * gathers and scatters over the ETP group (moe.c), and with sequence
     * parallelism the experts' gradients summed over its replicas. */
    double etp_bytes, etp_wire, etprep_bytes, etprep_wire;
    int64_t etp_calls, etprep_calls;
} mc_plan_stage;

typedef struct mc_plan {
    int world, tp, pp, cp, dp;
    int ep;            /* expert parallelism: divides dp */
    int moe_allgather; /* the allgather dispatcher */
    int etp;           /* --expert-tensor-parallel-size: 1, or a divisor of tp (the experts
                        * split over ETP groups of etp TP ranks) */
    int cp_comm_type;  /* MC_CP_P2P or MC_CP_A2A */
    int sequence_parallel, distributed_optimizer;
    int64_t micro_batch, global_batch, num_micro;
    int64_t global_params; /* the model's parameters (unpadded) */
    int64_t active_params; /* of them, those one token uses (MoE: top-k of the experts) */
    char recompute[96];    /* the run's recomputation, mc_recompute_describe */
    int nstages;           /* = pp */
    mc_plan_stage *stage;  /* [pp] */
} mc_plan;

/* The plan of a run on `world` ranks of tp x pp (cp = 1) with data-parallel
 * size world / (tp pp). c: the model's configuration (vocab_size set;
 * finished here for tp, so divisibility errors come back as
 * MC_ERR_USAGE with the numbers); global_batch 0: micro_batch x dp. */
mc_status mc_plan_compute(const mc_model_config *c, int world, int tp, int pp, int64_t micro_batch,
                          int64_t global_batch, int distributed_optimizer, mc_plan *out,
                          mc_error *err);
/* The same on tp x pp x cp ranks (data-parallel size world / (tp pp cp)):
 * activations and the tensor- and pipeline-parallel traffic of this rank's
 * seq_length / cp rows, the context-parallel traffic of
 * c->cp_comm_type, the gradients reduced over data x context. The
 * sequence is checked as mc_model_check_cp does. */
mc_status mc_plan_compute_cp(const mc_model_config *c, int world, int tp, int pp, int cp,
                             int64_t micro_batch, int64_t global_batch, int distributed_optimizer,
                             mc_plan *out, mc_error *err);
/* The same with expert parallelism ep (a divisor of the data-parallel
 * size and of the experts): each rank's E / ep experts, their activations
 * sized for every EP rank's rows, the EP group's dispatch traffic and the
 * experts' gradients reduced over the expert-data-parallel group. */
mc_status mc_plan_compute_grid(const mc_model_config *c, int world, int tp, int pp, int cp, int ep,
                               int64_t micro_batch, int64_t global_batch, int distributed_optimizer,
                               mc_plan *out, mc_error *err);
void mc_plan_free(mc_plan *p);
/* Whether pipeline stage `stage` of the plan fits in what backend be can
 * still allocate (mc_backend_mem_available): training counts parameters,
 * gradients, optimizer state and activations; inference (training 0)
 * parameters and activations. MC_OK, or MC_ERR_NOMEM with one line naming
 * both byte counts ("the model does not fit: pipeline stage S needs ...
 * and GPU 0 (...) has ..."); MC_OK too where the memory is unknown. */
mc_status mc_plan_check_fit(const mc_plan *p, int stage, int training, const mc_backend *be,
                            mc_error *err);
/* The plan as text lines, one call of print per line. */
void mc_plan_print(const mc_plan *p, void (*print)(void *ctx, const char *line), void *ctx);

#ifdef __cplusplus
}
#endif

#endif
