/*
 * test_pcg64.c - numpy.random.default_rng in C (lib/data/pcg64.c) against
 * numpy's own values (tests/data/np_random.json, made by
 * tests/golden/np_random.py): SeedSequence's state words, PCG64's raw
 * 64-bit outputs, and Generator.integers(dtype=int32) over ranges with
 * and without rejections, including Megatron Core's mock document lengths
 * (default_rng(0).integers(1, 4096, 100000)), exactly.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/gpt_internal.h"
#include "tap.h"

int main(void)
{
    const char *top = getenv("top_srcdir");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/np_random.json", top ? top : ".");
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je);
    if (!g) {
        printf("Bail out! %s: %s\n", path, je.text);
        return 1;
    }
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(g, "seedseq"), key, v)
    {
        uint64_t seed = strtoull(key, NULL, 10);
        uint32_t w[8];
        mc_seedseq_state(seed, w, 8);
        int same = 1;
        for (int i = 0; i < 8; i++)
            same &= w[i] == (uint32_t)json_integer_value(json_array_get(v, (size_t)i));
        TAP_OK(same, "SeedSequence(%s).generate_state(8)", key);
    }
    json_object_foreach(json_object_get(g, "raw64"), key, v)
    {
        mc_pcg64 r;
        mc_pcg64_seed(&r, strtoull(key, NULL, 10));
        int same = 1;
        for (size_t i = 0; i < json_array_size(v); i++)
            same &= mc_pcg64_next64(&r) ==
                    strtoull(json_string_value(json_array_get(v, i)), NULL, 10);
        TAP_OK(same, "PCG64(default_rng(%s)): the first %zu raw outputs", key, json_array_size(v));
    }
    size_t i;
    json_array_foreach(json_object_get(g, "integers"), i, v)
    {
        int64_t seed = json_integer_value(json_object_get(v, "seed"));
        int32_t low = (int32_t)json_integer_value(json_object_get(v, "low"));
        int32_t high = (int32_t)json_integer_value(json_object_get(v, "high"));
        size_t n = (size_t)json_integer_value(json_object_get(v, "n"));
        int32_t *out = malloc(n * sizeof *out);
        mc_pcg64 r;
        mc_pcg64_seed(&r, (uint64_t)seed);
        mc_pcg64_integers32(&r, low, high, out, n);
        json_t *head = json_object_get(v, "head"), *tail = json_object_get(v, "tail");
        int same = 1;
        for (size_t k = 0; k < json_array_size(head); k++)
            same &= out[k] == json_integer_value(json_array_get(head, k));
        for (size_t k = 0; k < json_array_size(tail); k++)
            same &= out[n - json_array_size(tail) + k] ==
                    json_integer_value(json_array_get(tail, k));
        int64_t sum = 0;
        for (size_t k = 0; k < n; k++) sum += out[k];
        same &= sum == json_integer_value(json_object_get(v, "sum"));
        TAP_OK(same, "default_rng(%lld).integers(%d, %d, %zu, int32): head, tail and sum",
               (long long)seed, low, high, n);
        free(out);
    }
    json_decref(g);
    return tap_done();
}
