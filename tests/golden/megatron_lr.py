#!/usr/bin/env python3
"""megatron_lr.py - golden learning rates and weight decays from megatron-core.

Run by hand with a python that has megatron-core (and torch):
    /opt/mcheavy/bin/python tests/golden/megatron_lr.py > tests/data/megatron_lr.txt

For each configuration below (Megatron's options, spelled as mc_lr_config's
fields), it converts the options to the scheduler's sample counts as
megatron/training/training.py's get_optimizer_param_scheduler does, builds
megatron.core's own OptimizerParamScheduler, and records the learning rate
and weight decay it sets before training (iteration 0) and after each
iteration (scheduler.step(global_batch_size)), a few iterations past the end.
Output, read by tests/unit/test_schedule.c:
    config key=value ...
    ITERATION LR WD          (doubles as %.17g)
"""
import sys

try:
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    import megatron.core
except ImportError as e:
    print(f"SKIP: megatron-core is not installed ({e})")
    sys.exit(77)

DEFAULTS = dict(lr=None, min_lr=0.0, lr_warmup_init=0.0, decay_style="linear",
                wsd_decay_style="exponential", gbs=None, train_iters=None,
                train_samples=None, lr_decay_iters=None, lr_decay_samples=None,
                lr_warmup_iters=0, lr_warmup_samples=0, lr_warmup_fraction=None,
                lr_wsd_decay_iters=None, lr_wsd_decay_samples=None, weight_decay=0.01,
                start_weight_decay=None, end_weight_decay=None, wd_incr_style="constant")

CONFIGS = [
    dict(name="linear", lr=3e-4, min_lr=3e-5, gbs=8, train_iters=100, lr_warmup_iters=10),
    dict(name="linear-nowarmup", lr=1e-3, gbs=3, train_iters=50),
    dict(name="cosine-fraction", lr=6e-4, min_lr=6e-5, lr_warmup_init=1e-5, gbs=4,
         train_iters=100, lr_decay_iters=80, lr_warmup_fraction=0.07),
    dict(name="constant", lr=2e-4, gbs=16, train_iters=40, lr_warmup_iters=5),
    dict(name="inverse-square-root", decay_style="inverse-square-root", lr=1e-3,
         min_lr=1e-5, gbs=2, train_iters=120, lr_decay_iters=90, lr_warmup_iters=7),
    dict(name="wsd-exponential", decay_style="WSD", lr=3e-4, min_lr=3e-6, gbs=8,
         train_iters=100, lr_warmup_iters=10, lr_wsd_decay_iters=20),
    dict(name="wsd-linear", decay_style="WSD", wsd_decay_style="linear", lr=3e-4, gbs=5,
         train_iters=60, lr_warmup_iters=6, lr_wsd_decay_iters=15),
    dict(name="wsd-cosine", decay_style="WSD", wsd_decay_style="cosine", lr=1e-3,
         min_lr=1e-4, gbs=4, train_iters=60, lr_decay_iters=50, lr_wsd_decay_iters=12),
    dict(name="wsd-minus-sqrt", decay_style="WSD", wsd_decay_style="minus_sqrt", lr=1e-3,
         min_lr=1e-4, gbs=4, train_iters=60, lr_warmup_fraction=0.1, lr_wsd_decay_iters=25),
    dict(name="cosine-samples", decay_style="cosine", lr=6e-4, min_lr=6e-5, gbs=8,
         train_samples=1000, lr_decay_samples=900, lr_warmup_samples=50),
    dict(name="wsd-samples", decay_style="WSD", wsd_decay_style="cosine", lr=3e-4,
         gbs=6, train_samples=600, lr_warmup_fraction=0.05, lr_wsd_decay_samples=130),
    dict(name="wd-linear", decay_style="cosine", lr=3e-4, gbs=8, train_iters=50,
         lr_warmup_iters=5, wd_incr_style="linear", start_weight_decay=0.01,
         end_weight_decay=0.1),
    dict(name="wd-cosine", lr=3e-4, gbs=7, train_samples=300, wd_incr_style="cosine",
         start_weight_decay=0.0, end_weight_decay=0.05, weight_decay=0.1),
]


class FakeOptimizer:
    def __init__(self):
        self.param_groups = [{}]


def scheduler(a):
    """get_optimizer_param_scheduler's conversion to sample counts."""
    gbs = a["gbs"]
    if a["train_iters"]:
        decay_iters = a["lr_decay_iters"] if a["lr_decay_iters"] is not None else a["train_iters"]
        decay = decay_iters * gbs
        wd_incr = a["train_iters"] * gbs
        wsd = a["lr_wsd_decay_iters"] * gbs if a["lr_wsd_decay_iters"] is not None else None
        if a["lr_warmup_fraction"] is not None:
            warmup = a["lr_warmup_fraction"] * decay
        else:
            warmup = a["lr_warmup_iters"] * gbs
    else:
        decay = a["lr_decay_samples"] if a["lr_decay_samples"] is not None else a["train_samples"]
        wd_incr = a["train_samples"]
        wsd = a["lr_wsd_decay_samples"]
        if a["lr_warmup_fraction"] is not None:
            warmup = a["lr_warmup_fraction"] * decay
        else:
            warmup = a["lr_warmup_samples"]
    start_wd, end_wd = a["start_weight_decay"], a["end_weight_decay"]
    if a["wd_incr_style"] == "constant":  # arguments.py
        start_wd = end_wd = a["weight_decay"]
    return OptimizerParamScheduler(
        FakeOptimizer(), init_lr=a["lr_warmup_init"], max_lr=a["lr"], min_lr=a["min_lr"],
        lr_warmup_steps=warmup, lr_decay_steps=decay, lr_decay_style=a["decay_style"],
        start_wd=start_wd, end_wd=end_wd, wd_incr_steps=wd_incr,
        wd_incr_style=a["wd_incr_style"], wsd_decay_steps=wsd,
        lr_wsd_decay_style=a["wsd_decay_style"])


def main():
    version = getattr(megatron.core, "__version__", "unknown")
    print(f"# megatron-core {version} OptimizerParamScheduler; made by tests/golden/megatron_lr.py")
    for c in CONFIGS:
        a = dict(DEFAULTS)
        a.update(c)
        s = scheduler(a)
        iters = a["train_iters"] or a["train_samples"] // a["gbs"]
        print("config " + " ".join(f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in c.items()))
        g = s.optimizer.param_groups[0]
        for it in range(iters + 6):
            if it > 0:
                s.step(a["gbs"])
            print(f"{it} {g['lr']!r} {g['weight_decay']!r}")


if __name__ == "__main__":
    main()
