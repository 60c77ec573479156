#!/usr/bin/env python3
"""read_tfevents.py - read TensorBoard event files with TensorBoard itself.

    read_tfevents.py DIR
        Print every scalar TensorBoard's EventAccumulator finds under DIR (a
        run directory, e.g. mc-train's --tensorboard-dir) as tab-separated
        "tag<TAB>step<TAB>value" lines, sorted by tag then step. Works on a
        real training run.

    read_tfevents.py --expect EXPECTED DIR
        Check DIR against EXPECTED (lines "tag<TAB>step<TAB>value", value a
        decimal double): the same (tag, step) pairs, and each value equal to
        the expected double rounded to float32 (an event's simple_value is a
        float32; NaN matches NaN). Also checks every event file record by
        record: each passes TensorBoard's CRC checks (the records cover the
        file exactly) and each Event re-serializes, through TensorBoard's own
        protobuf classes, to the very same bytes. Exit 1 on any difference.

Exit status 77 (the harness's "skip") when the tensorboard package is missing.
"""
import glob
import math
import os
import struct
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator, event_file_loader
    from tensorboard.compat.proto import event_pb2
except ImportError as e:
    print(f"SKIP: tensorboard is not installed ({e})")
    sys.exit(77)


def scalars(run_dir):
    # size_guidance 0 keeps every point (the default samples 10000).
    acc = event_accumulator.EventAccumulator(
        run_dir, size_guidance={event_accumulator.SCALARS: 0}
    )
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        for ev in acc.Scalars(tag):
            out[(tag, ev.step)] = ev.value
    return out


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def check_records(run_dir):
    """Every record of every event file: good CRCs, canonical protobuf."""
    problems = []
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    if not files:
        problems.append(f"{run_dir}: no events.out.tfevents.* file")
    for path in files:
        covered = 0
        for i, raw in enumerate(event_file_loader.RawEventFileLoader(path).Load()):
            covered += 8 + 4 + len(raw) + 4
            ev = event_pb2.Event.FromString(raw)
            if ev.SerializeToString() != raw:
                problems.append(f"{path}: record {i}: bytes differ from protobuf's encoding")
            if i == 0 and ev.file_version != "brain.Event:2":
                problems.append(f"{path}: record 0: file_version {ev.file_version!r}")
        size = os.path.getsize(path)
        if covered != size:
            problems.append(f"{path}: records cover {covered} of {size} bytes (bad CRC or torn)")
    return problems


def main(argv):
    if len(argv) == 2 and not argv[1].startswith("-"):
        for (tag, step), v in sorted(scalars(argv[1]).items()):
            print(f"{tag}\t{step}\t{v!r}")
        return 0
    if len(argv) != 4 or argv[1] != "--expect":
        print(__doc__, file=sys.stderr)
        return 2
    want = {}
    with open(argv[2], encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            tag, step, value = line.split("\t")
            want[(tag, int(step))] = float(value)
    got = scalars(argv[3])
    problems = check_records(argv[3])
    for key in sorted(set(want) | set(got)):
        if key not in got:
            problems.append(f"missing: {key[0]!r} at step {key[1]}")
        elif key not in want:
            problems.append(f"unexpected: {key[0]!r} at step {key[1]} = {got[key]!r}")
        else:
            w, g = f32(want[key]), got[key]
            if not (w == g or (math.isnan(w) and math.isnan(g))):
                problems.append(f"{key[0]!r} at step {key[1]}: {g!r}, expected {w!r}")
    for p in problems:
        print(p)
    print(f"{len(got)} scalars read, {len(want)} expected, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
