#!/usr/bin/env python3
"""Golden 20-iteration training runs of mixture-of-experts models, in PyTorch.

Run by hand with the heavy interpreter after building mc (the values are
committed; tests/tools/train_moe_golden.bats runs mc-train the same way and
compares through tests/golden/check_train_golden.py):

    MC_PYTHON=/tmp/ci/.venv/bin/python /work/venv-torch/bin/python \\
        tests/golden/torch_moe.py BUILDDIR [CASE...]

For each case of CASES (tiny GPT and Llama trunks at T = 32 with MoE layers,
NullTokenizer with 300 ids; a case's own option, such as --lr, replaces
COMMON's: two cases train at 1e-3, where 3e-3 brought a near-tie in the
routing by iteration 13 that one OpenBLAS kernel broke one way and another
the other, so the comparison held on one machine only):

1. The dataset: tests/data/train/docs.txt (torch_train.py's) through
   BUILDDIR's mc-preprocess, and the 80 training samples mc-train reads,
   printed by BUILDDIR/tests/unit/gpt_samples (Megatron Core's GPTDataset
   order, which test_gptdata checks against megatron-core).
2. mc's initial weights and model configuration, from mc-train
   --train-iters 0 --save (torch_train.mc_initial).
3. 20 iterations in plain PyTorch, fp32: the transformer of torch_ref.py with
   each MoE layer's MLP replaced by the block below, written from Megatron
   Core's MoE math (megatron/core/transformer/moe: router.py,
   moe_utils.py's topk_routing_with_score_function, group_limited_topk,
   switch_load_balancing_loss_func, z_loss_func), not from mc's code: the
   pre-MLP norm; the router's logits h Wr^T (+ b); the top-k by the score
   function (softmax of the top-k logits, or with pre-softmax the top-k of
   softmax(logits), or sigmoid normalized over the k), group-limited
   routing, the scaling factor; each expert (SwiGLU or GELU, the global
   [E, ...] weight tensors viewed per expert) on the tokens that chose it,
   its output weighted by the token's probability and added back; the
   balancing losses (aux_loss over the micro-batch or seq_aux_loss per
   sequence: E / (K T^2) sum_e P_e f_e with the scores softmax(logits), or
   sigmoid normalized, and f_e the tokens whose top-k of those scores holds
   e; the z-loss mean(logsumexp(logits)^2)) added to the micro-batch's
   loss with their coefficients (Megatron's MoEAuxLossAutoScaler gives them
   the main loss's 1 / num_microbatches); shared experts (an MLP on every
   token, added); the expert bias of aux-loss-free balancing (added to the
   sigmoid scores for the choice; after each iteration bias += sign(mean -
   tokens) x rate, tokens counted from the routing map after dropping, as
   get_updated_expert_bias); expert capacity as apply_router_token_dropping
   (capacity ceil(N K / E x factor), kept by the top probabilities per
   expert, or with the position policy each expert's first tokens; with
   padding to capacity the map is the capacity mask and the padded tokens
   go through the expert with probability 0). AdamW (betas 0.9/0.95, eps 1e-8,
   weight decay 0.1 except biases and 1-D weights), constant learning rate,
   Megatron's clipping at 1.0, global gradient norm in float64.
4. tests/data/train/golden_moe_<case>.json: the mc-train arguments (bats adds
   the data, --save and --log-json), per iteration the lm loss (the
   cross-entropy alone, as Megatron logs it), load_balancing_loss /
   seq_load_balancing_loss and z_loss as Megatron logs them (each layer's
   loss without its coefficient, summed over the micro-batches / their
   number, averaged over the MoE layers), the gradient norm and the learning
   rate, and per tensor the sum and sum of squares of the initial and final
   weights.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402
from torch_train import checksums, mc_initial  # noqa: E402

ITERS = 20
MBS = 2
GBS = 4
SEQ = 32
VOCAB = 300
SEED = 1234

COMMON = [
    "--seq-length", str(SEQ), "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
    "--seed", str(SEED), "--micro-batch-size", str(MBS), "--global-batch-size", str(GBS),
    "--train-iters", str(ITERS), "--split", "100,0,0", "--eval-iters", "0",
    "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--adam-eps", "1e-8",
    "--weight-decay", "0.1", "--clip-grad", "1.0", "--log-interval", "1",
    "--lr", "3e-3", "--lr-decay-style", "constant",
]
CASES = {
    # Mixtral-like: SwiGLU experts, softmax top-2, aux loss and z-loss
    "llama_softmax_top2": ["--model", "tiny-llama", "--num-experts", "4",
                           "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64",
                           "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3"],
    # GPT (GELU experts with biases, a router bias): pre-softmax top-2 with
    # a scaling factor, seq_aux_loss, the first layer MoE only
    "gpt_presoftmax_seqaux": ["--model", "tiny-gpt", "--num-experts", "4",
                              "--moe-router-topk", "2", "--moe-router-pre-softmax",
                              "--moe-router-topk-scaling-factor", "2.0",
                              "--moe-router-load-balancing-type", "seq_aux_loss",
                              "--moe-aux-loss-coeff", "1e-2", "--moe-layer-freq", "[1]*1+[0]*1",
                              "--lr", "1e-3"],
    # DeepSeek-like routing: sigmoid scores, 8 experts in 4 groups, the best
    # 2 groups, top-2, aux loss on the normalized sigmoid scores, z-loss
    "llama_sigmoid_groups": ["--model", "tiny-llama", "--num-experts", "8",
                             "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
                             "--moe-router-score-function", "sigmoid",
                             "--moe-router-num-groups", "4", "--moe-router-group-topk", "2",
                             "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3",
                             "--lr", "1e-3"],
    # a shared expert of 64 beside 4 routed experts (Qwen/DeepSeek-like)
    "llama_shared_expert": ["--model", "tiny-llama", "--num-experts", "4",
                            "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
                            "--moe-shared-expert-intermediate-size", "64",
                            "--moe-aux-loss-coeff", "1e-2"],
    # aux-loss-free balancing: sigmoid scores plus a per-expert bias moved by
    # the iteration's token counts (a large rate, so that the choice moves)
    "llama_sigmoid_expert_bias": ["--model", "tiny-llama", "--num-experts", "8",
                                  "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
                                  "--moe-router-score-function", "sigmoid",
                                  "--moe-router-enable-expert-bias",
                                  "--moe-router-bias-update-rate", "1e-3",
                                  "--moe-router-load-balancing-type", "none",
                                  "--moe-z-loss-coeff", "1e-3"],
    # expert capacity 1.0 (32 of a micro-batch's 128 choices per expert),
    # the lowest probabilities dropped
    "llama_capacity_probs": ["--model", "tiny-llama", "--num-experts", "4",
                             "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64",
                             "--moe-expert-capacity-factor", "1.25",
                             "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3"],
    # GPT: capacity 0.75, the latest tokens dropped, inputs padded to capacity
    "gpt_capacity_position_pad": ["--model", "tiny-gpt", "--num-experts", "4",
                                  "--moe-router-topk", "2", "--moe-expert-capacity-factor", "0.75",
                                  "--moe-token-drop-policy", "position",
                                  "--moe-pad-expert-input-to-capacity",
                                  "--moe-aux-loss-coeff", "1e-2"],
}


def arg(args, name):
    return args[args.index(name) + 1]


def samples_of(build, tmp):
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    prefix = os.path.join(tmp, "docs")
    subprocess.run([os.path.join(build, "tools", "mc-preprocess", "mc-preprocess"), "--input",
                    os.path.join(top, "tests", "data", "train", "docs.txt"), "--input-format",
                    "text", "--lines", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                    str(VOCAB), "--output-prefix", prefix, "--quiet"], check=True,
                   capture_output=True)
    out = subprocess.run([os.path.join(build, "tests", "unit", "gpt_samples"),
                          prefix + "_text_document", str(SEQ), str(SEED), str(ITERS * GBS),
                          os.path.join(tmp, "cache")], check=True, capture_output=True,
                         text=True).stdout
    return np.array([[int(t) for t in line.split()] for line in out.splitlines()])


class MoE:
    """The MoE blocks of a model; the balancing losses of the last forward
    in .aux and .z (lists over the MoE layers, without coefficients)."""

    def __init__(self, cfg, P):
        self.cfg, self.P, self.m = cfg, P, cfg["moe"]
        self.aux, self.z = [], []
        E = self.m["num_experts"]
        # Megatron's router buffers: expert_bias and local_tokens_per_expert
        self.bias = {l: torch.zeros(E) for l in range(cfg["num_layers"])}
        self.tokens = {l: torch.zeros(E) for l in range(cfg["num_layers"])}
        self.dropped = 0

    def update_expert_bias(self):
        """get_updated_expert_bias, once per iteration (one DP rank)."""
        if not self.m["moe_router_enable_expert_bias"]:
            return
        rate = np.float32(self.m["moe_router_bias_update_rate"])
        for l in self.bias:
            t = self.tokens[l]
            offset = t.sum() / t.shape[-1] - t
            self.bias[l] = self.bias[l] + torch.sign(offset) * float(rate)
            self.tokens[l] = torch.zeros_like(t)

    def is_moe(self, l):
        m = self.m
        if m["moe_layer_pattern"]:
            return m["moe_layer_pattern"][l] == "1"
        return l % m["moe_layer_freq"] == 0

    def __call__(self, l, x):
        cfg, P, m = self.cfg, self.P, self.m
        pre = f"decoder.layers.{l}"
        ln = cfg["normalization"] == "LayerNorm"
        h = torch_ref.norm(cfg, x, P[pre + ".pre_mlp_layernorm.weight"],
                           P.get(pre + ".pre_mlp_layernorm.bias") if ln else None)
        B, T, C = h.shape
        hf = h.reshape(-1, C)
        N = hf.shape[0]
        E, K = m["num_experts"], m["moe_router_topk"]
        logits = hf @ P[pre + ".mlp.router.weight"].t()
        if pre + ".mlp.router.bias" in P:
            logits = logits + P[pre + ".mlp.router.bias"]
        sigmoid = m["moe_router_score_function"] == "sigmoid"
        # routing scores and the choice
        if sigmoid:
            scores = torch.sigmoid(logits)
            rs = scores
            if m["moe_router_enable_expert_bias"]:
                rs = scores + self.bias[l]
        elif m["moe_router_pre_softmax"]:
            scores = torch.softmax(logits, dim=-1)
            rs = scores
        else:
            rs = logits
        G, gk = m["moe_router_num_groups"], m["moe_router_group_topk"]
        if G:
            gs = rs.detach().view(N, G, -1).topk(K // gk, dim=-1)[0].sum(-1)
            gidx = torch.topk(gs, k=gk, dim=-1)[1]
            gmask = torch.zeros_like(gs).scatter(1, gidx, 1)
            smask = gmask.unsqueeze(-1).expand(N, G, E // G).reshape(N, E)
            rs = rs.masked_fill(~smask.bool(), float("-inf"))
        idx = torch.topk(rs.detach(), k=K, dim=1)[1]
        if sigmoid:
            sel = scores.gather(1, idx)
            probs = sel / (sel.sum(-1, keepdim=True) + 1e-20) if K > 1 else sel
        elif m["moe_router_pre_softmax"]:
            probs = scores.gather(1, idx)
        else:
            probs = torch.softmax(logits.gather(1, idx), dim=-1)
        if m["moe_router_topk_scaling_factor"]:
            probs = probs * m["moe_router_topk_scaling_factor"]
        # the dense [N, E] probabilities and map, then Megatron's
        # apply_router_token_dropping
        rprobs = torch.zeros_like(logits).scatter(1, idx, probs)
        rmap = torch.zeros(N, E, dtype=torch.bool).scatter(1, idx, True)
        cf = m["moe_expert_capacity_factor"]
        if cf:
            cap = math.ceil(N * K / E * cf)
            if cap > N:
                cmask = torch.ones(N, E, dtype=torch.bool)
            elif m["moe_token_drop_policy"] == "probs":
                ci = torch.topk(rprobs.detach(), k=cap, dim=0)[1]
                cmask = torch.zeros(N, E, dtype=torch.bool).scatter(0, ci, True)
            else:  # position: each expert's first cap tokens
                cmask = (torch.cumsum(rmap.int(), dim=0) <= cap) & rmap
            self.dropped += int((rmap & ~cmask).sum())
            rmap = cmask if m["moe_pad_expert_input_to_capacity"] else rmap & cmask
            rprobs = rprobs * rmap
        if m["moe_router_enable_expert_bias"]:
            self.tokens[l] = self.tokens[l] + rmap.sum(0).float()
        # the experts, each on its tokens
        F = m["moe_ffn_hidden_size"]
        fc1 = 2 * F if cfg["swiglu"] else F
        ex = pre + ".mlp.experts.experts"
        W1 = P[ex + ".linear_fc1.weight"].view(E, fc1, C)
        W2 = P[ex + ".linear_fc2.weight"].view(E, C, F)
        b1, b2 = P.get(ex + ".linear_fc1.bias"), P.get(ex + ".linear_fc2.bias")
        y = torch.zeros_like(hf)
        for e in range(E):
            tok = rmap[:, e].nonzero(as_tuple=True)[0]
            if len(tok) == 0:
                continue
            u = hf[tok] @ W1[e].t()
            if b1 is not None:
                u = u + b1[e]
            if cfg["swiglu"]:
                gate, up = u.chunk(2, dim=-1)
                a = torch.nn.functional.silu(gate) * up
            else:
                a = torch.nn.functional.gelu(u, approximate="tanh")
            o = a @ W2[e].t()
            if b2 is not None:
                o = o + b2[e]
            y = y.index_add(0, tok, o * rprobs[tok, e].unsqueeze(-1))
        S = m["moe_shared_expert_intermediate_size"]
        if S:  # the shared experts, on every token
            u = hf @ P[pre + ".mlp.shared_experts.linear_fc1.weight"].t()
            if cfg["swiglu"]:
                gate, up = u.chunk(2, dim=-1)
                a = torch.nn.functional.silu(gate) * up
            else:
                a = torch.nn.functional.gelu(u, approximate="tanh")
            y = y + a @ P[pre + ".mlp.shared_experts.linear_fc2.weight"].t()
        # the balancing losses
        lb = m["moe_router_load_balancing_type"]
        if lb != "none" and m["moe_aux_loss_coeff"] > 0:
            if sigmoid:
                s = torch.sigmoid(logits)
                s = s / (s.sum(-1, keepdim=True) + 1e-20)
            else:
                s = torch.softmax(logits, dim=-1)
            ti = torch.topk(s.detach(), k=K, dim=1)[1]
            rmap = torch.zeros_like(s).scatter(1, ti, 1)
            groups = B if lb == "seq_aux_loss" else 1
            Tg = N // groups
            sg, rg = s.view(groups, Tg, E), rmap.view(groups, Tg, E)
            aux = ((sg.sum(1) * rg.sum(1)).sum(-1) * E / (K * Tg * Tg)).mean()
            self.aux.append(aux)
        if m["moe_z_loss_coeff"] > 0:
            self.z.append(torch.logsumexp(logits, dim=-1).square().mean())
        return y.view(B, T, C)


def train(cfg, w, samples, args):
    # the expert biases are buffers (MoE.bias), not trained parameters
    EB = ".mlp.router.expert_bias"
    P = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in w.items()
         if not k.endswith(EB)}
    nodecay = [p for k, p in sorted(P.items()) if k.endswith(".bias") or p.dim() == 1]
    decay = [p for k, p in sorted(P.items()) if not (k.endswith(".bias") or p.dim() == 1)]
    lr = float(arg(args, "--lr"))
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    m = cfg["moe"]
    moe = MoE(cfg, P)
    for k, v in w.items():
        if k.endswith(EB):
            moe.bias[int(k.split(".")[2])] = torch.tensor(v, dtype=torch.float32)
    nmoe = sum(moe.is_moe(l) for l in range(cfg["num_layers"]))
    ac, zc = m["moe_aux_loss_coeff"], m["moe_z_loss_coeff"]
    nmicro = GBS // MBS
    steps = []
    for it in range(ITERS):
        opt.zero_grad(set_to_none=False)
        losses, lbs, zs = [], 0.0, 0.0
        for k in range(nmicro):
            s = torch.tensor(samples[it * GBS + k * MBS: it * GBS + (k + 1) * MBS])
            moe.aux, moe.z = [], []
            loss = torch_ref.forward(cfg, P, s[:, :-1], s[:, 1:],
                                     lambda x, w, b: x @ w.t() + b if b is not None else x @ w.t(),
                                     cfg["position_embedding_type"] == "rope",
                                     cfg["untie_embeddings_and_output_weights"], moe=moe)
            total = loss + ac * sum(moe.aux) + zc * sum(moe.z)
            (total / nmicro).backward()
            losses.append(float(loss.detach()))
            lbs += float(sum(a.detach() for a in moe.aux)) if moe.aux else 0.0
            zs += float(sum(a.detach() for a in moe.z)) if moe.z else 0.0
        moe.update_expert_bias()
        gnorm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in P.values()))
        coeff = 1.0 / (gnorm + 1.0e-6)
        if coeff < 1.0:
            for p in P.values():
                p.grad.mul_(float(np.float32(coeff)))
        opt.step()
        step = {"iteration": it + 1, "lm_loss": sum(losses) / nmicro, "grad_norm": gnorm,
                "lr_used": lr, "learning_rate": lr}
        lbname = ("seq_load_balancing_loss" if m["moe_router_load_balancing_type"] ==
                  "seq_aux_loss" else "load_balancing_loss")
        if m["moe_router_load_balancing_type"] != "none":
            step[lbname] = lbs / nmicro / nmoe
        if zc > 0:
            step["z_loss"] = zs / nmicro / nmoe
        steps.append(step)
        if m["moe_expert_capacity_factor"]:
            step["dropped_choices"] = moe.dropped
            moe.dropped = 0
        print(f"  iteration {it + 1:2d} dropped {step.get('dropped_choices', 0)} lm loss "
              f"{step['lm_loss']:.6f} lb "
              f"{step.get(lbname, 0):.6f} z {step.get('z_loss', 0):.6f} grad norm {gnorm:.4f}",
              file=sys.stderr)
    final = dict(P)
    for k in w:
        if k.endswith(EB):
            final[k] = moe.bias[int(k.split(".")[2])]
    return steps, checksums(final)


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    outdir = os.path.join(top, "tests", "data", "train")
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        samples = samples_of(build, tmp)
        only = sys.argv[2:]  # optional: the cases to (re)make
        for name, cargs in CASES.items():
            if only and name not in only:
                continue
            args = cargs + torch_ref.without(COMMON, cargs)
            ctmp = os.path.join(tmp, name)
            os.makedirs(ctmp)
            cfg, w = mc_initial(build, args, ctmp)
            init = checksums({k: torch.tensor(v) for k, v in w.items()})
            print(name, file=sys.stderr)
            steps, final = train(cfg, w, samples, args)
            out = {"model": name, "precision": "fp32", "tolerance": "fp32_moe",
                   "mc_train_args": args, "config": cfg,
                   "samples_first_last": [samples[0].tolist(), samples[-1].tolist()],
                   "steps": steps, "initial": init, "final": final, "torch": torch.__version__}
            path = os.path.join(outdir, f"golden_moe_{name}.json")
            with open(path, "w") as f:
                json.dump(out, f, indent=1)
                f.write("\n")
            print(path)


if __name__ == "__main__":
    main()
