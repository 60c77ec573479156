# bench/longctx/chart.gp - the long-context chart of bench/RESULTS.md (issue
# 14, section 6): peak memory per rank and step time against the sequence
# length T for a GPT-2 124M-shaped model on 2 threads.
#   cd bench/longctx && gnuplot chart.gp      (writes longctx.png)
# plan.dat: bench/longctx/plan.sh's output (mc-train --dry-run per rank);
# measured.dat: "T CP setting peak_MiB cpu_s step_s" of the runs recorded in
# bench/RESULTS.md (run.sh; no 12-layer CP run was measured).
set terminal pngcairo size 1400,560 font ",11"
set output "longctx.png"
set multiplot layout 1,2 title "GPT-2 124M shape, 12 layers, micro-batch 1, 2 threads (lines: --dry-run plan; points: measured)"
set logscale x 2
set xtics ("4k" 4096, "8k" 8192, "16k" 16384, "32k" 32768)
set xrange [3500:38000]
set grid
set key top left reverse Left
# one setting's rows (a row outside it would break the line)
rows(f, cp, s) = sprintf("< awk '$2 == %d && $3 == \"%s\"' %s", cp, s, f)
set title "peak memory per rank"
set xlabel "sequence length T"
set ylabel "MiB"
plot rows("plan.dat", 1, "none") using 1:5 with linespoints pt 1 lw 2 lc 1 title "CP=1 none", \
     rows("plan.dat", 1, "selective-cheap") using 1:5 with linespoints pt 1 lw 2 lc 2 title "CP=1 selective layernorm,mlp\\_act,attn\\_proj", \
     rows("plan.dat", 1, "selective-mlp") using 1:5 with linespoints pt 1 lw 2 lc 3 title "CP=1 selective mlp", \
     rows("plan.dat", 1, "full") using 1:5 with linespoints pt 1 lw 2 lc 4 title "CP=1 full uniform 1", \
     rows("plan.dat", 2, "none") using 1:5 with linespoints pt 1 lw 2 dt 2 lc 6 title "CP=2 none", \
     rows("plan.dat", 4, "none") using 1:5 with linespoints pt 1 lw 2 dt 2 lc 7 title "CP=4 none", \
     rows("measured.dat", 1, "none") using 1:4 with points pt 7 ps 1.5 lc 1 notitle, \
     rows("measured.dat", 1, "selective-cheap") using 1:4 with points pt 7 ps 1.5 lc 2 notitle, \
     rows("measured.dat", 1, "selective-mlp") using 1:4 with points pt 7 ps 1.5 lc 3 notitle, \
     rows("measured.dat", 1, "full") using 1:4 with points pt 7 ps 1.5 lc 4 notitle
set title "CPU time of one step (user + system, all ranks; measured only)"
set ylabel "CPU seconds"
set key top left reverse Left
plot rows("measured.dat", 1, "none") using 1:5 with linespoints pt 7 ps 1.5 lw 2 lc 1 title "CP=1 none", \
     rows("measured.dat", 1, "selective-cheap") using 1:5 with linespoints pt 7 ps 1.5 lw 2 lc 2 title "CP=1 selective layernorm,mlp\\_act,attn\\_proj", \
     rows("measured.dat", 1, "selective-mlp") using 1:5 with linespoints pt 7 ps 1.5 lw 2 lc 3 title "CP=1 selective mlp", \
     rows("measured.dat", 1, "full") using 1:5 with linespoints pt 7 ps 1.5 lw 2 lc 4 title "CP=1 full uniform 1"
unset multiplot
