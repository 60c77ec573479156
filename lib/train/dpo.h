/*
 * dpo.h - private to lib/train: direct preference optimization's objective
 * (mc-train --dpo, lib/train/dpo.c) on the model's per-token
 * log-probabilities (mc_model_set_logp_loss), and the reference model's
 * log-probabilities, computed once per pair before training. TRL's
 * DPOTrainer semantics; see doc/ARCHITECTURE.md, "Training".
 */
#ifndef MC_TRAIN_DPO_H
#define MC_TRAIN_DPO_H

#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"
#include "mc/train.h"

/* The sums over a set of pairs of what TRL logs (each divided by pairs is
 * TRL's metric): the loss, rewards/chosen = beta (logp_c - ref_c),
 * rewards/rejected, rewards/accuracies (chosen > rejected), rewards/margins. */
typedef struct mc_dpo_sums {
    double loss, chosen, rejected, accuracies, margins, pairs;
} mc_dpo_sums;

/* One micro-batch of B pairs: sequences [0, B) are the chosen answers and
 * [B, 2B) the rejected ones (TRL's concatenated batch), T positions each;
 * logp[n = 2 B T] the log-probabilities of the targets (0 where targets < 0).
 * Each sequence's logp is the sum over its counted targets, in position
 * order, in double. ref[2 B]: the reference's (ref_c of pair b at 2 b,
 * ref_r at 2 b + 1). Fills dlogp[i] = d loss / d logp[i] of the mean loss
 * over the B pairs, *loss that mean, and adds to *sums (may be NULL). */
mc_status mc_dpo_objective(const mc_dpo_config *c, const float *logp, const int32_t *targets,
                           size_t B, size_t T, const double *ref, float *dlogp, double *loss,
                           mc_dpo_sums *sums, mc_error *err);

/* Each sequence's summed logp (2 B of them, as mc_dpo_objective orders
 * the sequences) into seq[2 B] in the ref layout: pair b's chosen at 2 b,
 * rejected at 2 b + 1. */
void mc_dpo_sequence_logps(const float *logp, const int32_t *targets, size_t B, size_t T,
                           double *seq);

#endif
