/*
 * bench/train/llmc_main.c - a driver for llm.c's CPU trainer (train_gpt2.c,
 * fetched by run.sh, never committed). llm.c's own main() hard-codes B=4,
 * T=64 and 40 steps with periodic validation and text generation; this
 * driver, like llm.c's test_gpt2.c, compiles train_gpt2.c with TESTING
 * defined (which drops its main) and runs only training steps, timed exactly
 * as llm.c's main times them (data loading, forward, zero_grad, backward and
 * the AdamW update, with llm.c's hyperparameters), and prints llm.c's line
 * "step N: train loss X (took Y ms)".
 * Usage: llmc-train CHECKPOINT TOKENS.bin B T STEPS
 */
#define TESTING
#include "train_gpt2.c"

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s CHECKPOINT TOKENS.bin B T STEPS\n", argv[0]);
        return 2;
    }
    int B = atoi(argv[3]), T = atoi(argv[4]), steps = atoi(argv[5]);
    GPT2 model;
    gpt2_build_from_checkpoint(&model, argv[1]);
    DataLoader loader;
    dataloader_init(&loader, argv[2], B, T, 0, 1, 1);
    for (int step = 0; step < steps; step++) {
        struct timespec start, end;
        clock_gettime(CLOCK_MONOTONIC, &start);
        dataloader_next_batch(&loader);
        gpt2_forward(&model, loader.inputs, loader.targets, B, T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model);
        gpt2_update(&model, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, step + 1);
        clock_gettime(CLOCK_MONOTONIC, &end);
        double s = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
        printf("step %d: train loss %f (took %f ms)\n", step, model.mean_loss, s * 1000);
        fflush(stdout);
    }
    dataloader_free(&loader);
    gpt2_free(&model);
    return 0;
}
