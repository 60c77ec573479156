/*
 * test_tokenizer.c - every tokenizer against the ids the reference libraries
 * give (tests/data/tokenizer/expected.json, made by
 * tests/golden/make_tokenizer_golden.py with Hugging Face tokenizers and
 * tiktoken): exact id equality on every corpus text, invalid UTF-8 included,
 * decoding back to the original bytes, and each loading/encoding/decoding
 * error path on a bad file written here.
 *
 * Fixtures are found under $top_srcdir (else $srcdir, else .)/tests/data/tokenizer.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mc/tokenizer.h"
#include "tap.h"

static char datadir[2048];
static char tmpdir[] = "/tmp/mc-test-tokenizer-XXXXXX";

static const char *data_path(const char *name)
{
    static char p[8][4096];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", datadir, name);
    return p[k];
}

static const char *tmp_path(const char *name)
{
    static char p[8][4096];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
    return p[k];
}

static void write_file(const char *path, const char *s)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(99);
    }
    fputs(s, f);
    fclose(f);
}

static int hexval(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

typedef struct doc {
    char *data;
    size_t len;
} doc;

static doc *load_docs(json_t *corpus, size_t *n_texts, size_t *n_invalid)
{
    json_t *texts = json_object_get(corpus, "texts"), *bad = json_object_get(corpus, "invalid_hex");
    *n_texts = json_array_size(texts);
    *n_invalid = json_array_size(bad);
    doc *d = calloc(*n_texts + *n_invalid, sizeof *d);
    for (size_t i = 0; i < *n_texts; i++) {
        json_t *s = json_array_get(texts, i);
        d[i].len = json_string_length(s);
        d[i].data = malloc(d[i].len + 1);
        memcpy(d[i].data, json_string_value(s), d[i].len);
    }
    for (size_t i = 0; i < *n_invalid; i++) {
        const char *h = json_string_value(json_array_get(bad, i));
        doc *x = &d[*n_texts + i];
        x->len = strlen(h) / 2;
        x->data = malloc(x->len + 1);
        for (size_t k = 0; k < x->len; k++)
            x->data[k] = (char)(hexval(h[2 * k]) * 16 + hexval(h[2 * k + 1]));
    }
    return d;
}

/* Encode every document; compare with the expected ids; decode back. */
static void check_fixture(const char *name, const mc_tokenizer_spec *spec, int round_trips,
                          json_t *expected, doc *docs, size_t n_texts, size_t n_invalid)
{
    mc_error err;
    mc_tokenizer *t = NULL;
    mc_encoder *e = NULL;
    if (mc_tokenizer_load(spec, &t, &err) != MC_OK || mc_encoder_new(t, &e, &err) != MC_OK) {
        TAP_OK(0, "%s: load: %s", name, err.msg);
        return;
    }
    json_t *exp = json_object_get(expected, name);
    size_t mismatched = 0, bad_decode = 0, ntok = 0;
    for (size_t i = 0; i < n_texts + n_invalid; i++) {
        json_t *want = i < n_texts ? json_array_get(json_object_get(exp, "texts"), i)
                                   : json_array_get(json_object_get(exp, "invalid"), i - n_texts);
        mc_ids ids = MC_IDS_INIT;
        mc_status st = mc_encode(e, docs[i].data, docs[i].len, &ids, &err);
        size_t nw = json_array_size(want), pos = 0;
        while (st == MC_OK && pos < ids.n && pos < nw &&
               ids.v[pos] == json_integer_value(json_array_get(want, pos)))
            pos++;
        if (st != MC_OK || pos != nw || pos != ids.n) {
            if (!mismatched++)
                TAP_DIAG("%s: %s %zu: %s; first difference at token %zu: mc %" PRId32
                         ", reference %" JSON_INTEGER_FORMAT " (mc %zu ids, reference %zu)",
                         name, i < n_texts ? "text" : "invalid-UTF-8 case",
                         i < n_texts ? i : i - n_texts, st == MC_OK ? "ids differ" : err.msg, pos,
                         pos < ids.n ? ids.v[pos] : -1,
                         pos < nw ? json_integer_value(json_array_get(want, pos)) : -1, ids.n, nw);
        }
        ntok += ids.n;
        mc_buf out = MC_BUF_INIT;
        st = mc_decode(t, ids.v, ids.n, &out, &err);
        if (st != MC_OK ||
            (round_trips && (out.len != docs[i].len ||
                             (out.len && memcmp(out.data, docs[i].data, out.len))))) {
            if (!bad_decode++)
                TAP_DIAG("%s: document %zu does not decode to its bytes (%s)", name, i,
                         st == MC_OK ? "bytes differ" : err.msg);
        }
        mc_buf_free(&out);
        mc_ids_free(&ids);
    }
    TAP_OK(mismatched == 0,
           "%s: ids equal the reference on %zu texts and %zu invalid-UTF-8 cases "
           "(%zu tokens; %zu differ)",
           name, n_texts, n_invalid, ntok, mismatched);
    TAP_OK(bad_decode == 0, "%s: every document decodes%s", name,
           round_trips ? " back to its bytes" : " (a normalizer and prefix space change the text)");
    mc_encoder_free(e);
    mc_tokenizer_free(t);
}

static mc_tokenizer *load_or_diag(const mc_tokenizer_spec *spec)
{
    mc_tokenizer *t = NULL;
    mc_error err;
    if (mc_tokenizer_load(spec, &t, &err) != MC_OK) TAP_DIAG("load failed: %s", err.msg);
    return t;
}

static void test_properties(void)
{
    mc_tokenizer_spec s;
    mc_tokenizer_spec_init(&s, MC_TOKENIZER_HUGGINGFACE);
    s.model = data_path("hf_bytelevel.json");
    mc_tokenizer *t = load_or_diag(&s);
    if (t) {
        TAP_OK(mc_tokenizer_vocab_size(t) == 2002, "hf_bytelevel: 2000 + 2 added ids (%" PRId64 ")",
               mc_tokenizer_vocab_size(t));
        TAP_OK(mc_tokenizer_eod(t) == 0, "hf_bytelevel: EOD is <|endoftext|> = 0");
        TAP_OK(mc_tokenizer_token_to_id(t, "<|fim|>") == 2000 &&
                   mc_tokenizer_token_to_id(t, "Ġ") >= 0 &&
                   mc_tokenizer_token_to_id(t, "no such token") == -1,
               "token_to_id finds added tokens and vocabulary spellings");
        /* A piece of 1 MB of one letter takes the heap path; it must stay
         * fast (not timed as a test) and decode back. */
        size_t n = 1 << 20;
        char *big = malloc(n);
        memset(big, 'a', n);
        mc_encoder *e = NULL;
        mc_ids ids = MC_IDS_INIT;
        mc_buf out = MC_BUF_INIT;
        mc_error err;
        clock_t c0 = clock();
        int ok = mc_encoder_new(t, &e, &err) == MC_OK &&
                 mc_encode(e, big, n, &ids, &err) == MC_OK &&
                 mc_decode(t, ids.v, ids.n, &out, &err) == MC_OK && out.len == n &&
                 !memcmp(out.data, big, n);
        TAP_OK(ok, "1 MB run of one letter: %zu ids, round trip (%.2f s)", ids.n,
               (double)(clock() - c0) / CLOCKS_PER_SEC);
        int32_t bad[] = {5, (int32_t)mc_tokenizer_vocab_size(t)};
        mc_status st = mc_decode(t, bad, 2, &out, &err);
        TAP_OK(st == MC_ERR_FORMAT &&
                   strstr(err.msg, "token id 2002 at position 1 is out of range"),
               "decode of an out-of-range id: %s", err.msg);
        int32_t neg = -1;
        st = mc_decode(t, &neg, 1, &out, &err);
        TAP_OK(st == MC_ERR_FORMAT, "decode of a negative id: %s", err.msg);
        free(big);
        mc_ids_free(&ids);
        mc_buf_free(&out);
        mc_encoder_free(e);
        mc_tokenizer_free(t);
    }

    mc_tokenizer_spec_init(&s, MC_TOKENIZER_HUGGINGFACE);
    s.model = data_path("hf_llama3.json");
    t = load_or_diag(&s);
    TAP_OK(t && mc_tokenizer_eod(t) == 0, "hf_llama3: EOD is <|endoftext|>, first in the list");
    mc_tokenizer_free(t);

    mc_tokenizer_spec_init(&s, MC_TOKENIZER_TIKTOKEN);
    s.model = data_path("tiktoken.ranks");
    t = load_or_diag(&s);
    TAP_OK(t && mc_tokenizer_eod(t) == 2 && mc_tokenizer_vocab_size(t) == 1000 + 1999 &&
               mc_tokenizer_token_to_id(t, "<SPECIAL_999>") == 999 &&
               mc_tokenizer_token_to_id(t, "<s>") == 1,
           "tiktoken: EOD </s> = 2, 1000 special ids then 1999 ranks, <SPECIAL_i> filler");
    mc_tokenizer_free(t);

    /* Megatron's JSON rank list form. "AA==" is byte 0 ... only the 256
     * single bytes, so every byte is its own token. */
    mc_buf js = MC_BUF_INIT;
    mc_buf_printf(&js, NULL, "[");
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 256; i++)
        mc_buf_printf(&js, NULL,
                      "%s{\"rank\": %d, \"token_bytes\": \"%c%c==\", \"token_str\": \"\"}",
                      i ? "," : "", i, b64[i >> 2], b64[(i & 3) << 4]);
    mc_buf_printf(&js, NULL, "]");
    mc_buf_append(&js, "", 1, NULL);
    write_file(tmp_path("ranks.json"), js.data);
    mc_buf_free(&js);
    mc_tokenizer_spec_init(&s, MC_TOKENIZER_TIKTOKEN);
    s.model = tmp_path("ranks.json");
    s.tiktoken_num_special_tokens = 3;
    t = load_or_diag(&s);
    mc_encoder *e = NULL;
    mc_ids ids = MC_IDS_INIT;
    mc_error err;
    int ok = t && mc_encoder_new(t, &e, &err) == MC_OK &&
             mc_encode(e, "Hi", 2, &ids, &err) == MC_OK && ids.n == 2 && ids.v[0] == 'H' + 3 &&
             ids.v[1] == 'i' + 3;
    TAP_OK(ok, "tiktoken JSON rank list (Megatron's form): bytes are ids rank + 3");
    mc_ids_free(&ids);
    mc_encoder_free(e);
    mc_tokenizer_free(t);

    mc_tokenizer_spec_init(&s, MC_TOKENIZER_NULL);
    s.vocab_size = 100;
    t = load_or_diag(&s);
    e = NULL;
    ok = t && mc_encoder_new(t, &e, &err) == MC_OK &&
         mc_encode(e, " 1 22\t\n 99  100", 15, &ids, &err) == MC_OK && ids.n == 4 &&
         ids.v[0] == 1 && ids.v[1] == 22 && ids.v[2] == 99 && ids.v[3] == 100;
    TAP_OK(ok && mc_tokenizer_eod(t) == 100 && mc_tokenizer_vocab_size(t) == 101,
           "NullTokenizer: ids from the text, EOD = vocab size, size counts EOD");
    mc_buf out = MC_BUF_INIT;
    ok = t && mc_decode(t, ids.v, ids.n, &out, &err) == MC_OK && out.len == 11 &&
         !memcmp(out.data, "1 22 99 100", 11);
    TAP_OK(ok, "NullTokenizer: decode writes the ids back");
    mc_status st = t ? mc_encode(e, "1 2 3x4 5", 9, &ids, &err) : MC_ERR_INTERNAL;
    TAP_OK(st == MC_ERR_FORMAT && strstr(err.msg, "byte 4: '3x4'"),
           "NullTokenizer: a bad word is an error at its byte offset: %s", err.msg);
    st = t ? mc_encode(e, "7 101", 5, &ids, &err) : MC_ERR_INTERNAL;
    TAP_OK(st == MC_ERR_FORMAT && strstr(err.msg, "byte 2: '101'"),
           "NullTokenizer: an id above the vocabulary is an error: %s", err.msg);
    mc_buf_free(&out);
    mc_ids_free(&ids);
    mc_encoder_free(e);
    mc_tokenizer_free(t);

    mc_tokenizer_kind k;
    TAP_OK(mc_tokenizer_kind_parse("TikTokenizer", &k, &err) == MC_OK &&
               k == MC_TOKENIZER_TIKTOKEN &&
               mc_tokenizer_kind_parse("SentencePieceTokenizer", &k, &err) == MC_ERR_USAGE,
           "kind names: Megatron's, others refused: %s", err.msg);
}

/* Load a spec expected to fail; check the code and that msg holds `want`. */
static void expect_error(const mc_tokenizer_spec *s, mc_status code, const char *want,
                         const char *what)
{
    mc_tokenizer *t = NULL;
    mc_error err = {0};
    mc_status st = mc_tokenizer_load(s, &t, &err);
    TAP_OK(st == code && t == NULL && strstr(err.msg, want), "%s: %s", what, err.msg);
    if (st != code || !strstr(err.msg, want)) TAP_DIAG("wanted '%s'", want);
    mc_tokenizer_free(t);
}

static void test_errors(void)
{
    mc_tokenizer_spec s;
    mc_tokenizer_spec_init(&s, MC_TOKENIZER_HUGGINGFACE);
    const char *bl = "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}";
    char buf[4096];

    write_file(tmp_path("notjson.json"), "{\"model\": {\n  \"vocab\": [1, 2,,]}}");
    s.model = tmp_path("notjson.json");
    expect_error(&s, MC_ERR_FORMAT, "notjson.json:2:", "not JSON: PATH:LINE:COL");

    snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"BPE\", \"merges\": []}, %s}", bl);
    write_file(tmp_path("novocab.json"), buf);
    s.model = tmp_path("novocab.json");
    expect_error(&s, MC_ERR_FORMAT, "novocab.json: missing model.vocab", "lacks model.vocab");

    snprintf(buf, sizeof buf,
             "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"x\": 3},"
             " \"merges\": [\"a b\", \"x y\"]}, %s}",
             bl);
    write_file(tmp_path("badmerge.json"), buf);
    s.model = tmp_path("badmerge.json");
    expect_error(&s, MC_ERR_FORMAT, "badmerge.json: model.merges[1]: unknown token 'y'",
                 "merge naming an unknown token");

    snprintf(buf, sizeof buf,
             "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"x\": 2},"
             " \"merges\": [[\"a\", \"b\"]]}, %s}",
             bl);
    write_file(tmp_path("badmerge2.json"), buf);
    s.model = tmp_path("badmerge2.json");
    expect_error(&s, MC_ERR_FORMAT, "model.merges[0]: unknown token 'ab'",
                 "merge whose result is not in the vocabulary ([a, b] form)");

    snprintf(
        buf, sizeof buf,
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}, %s}",
        bl);
    write_file(tmp_path("dup.json"), buf);
    s.model = tmp_path("dup.json");
    expect_error(&s, MC_ERR_FORMAT, "id 0 is used twice", "duplicate vocabulary id");

    snprintf(
        buf, sizeof buf,
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 5}, \"merges\": []}, %s}",
        bl);
    write_file(tmp_path("sparse.json"), buf);
    s.model = tmp_path("sparse.json");
    expect_error(&s, MC_ERR_FORMAT, "has id 5, but ids must be 0..1", "ids not dense");

    write_file(tmp_path("wordpiece.json"),
               "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}");
    s.model = tmp_path("wordpiece.json");
    expect_error(&s, MC_ERR_FORMAT, "wordpiece.json: model.type: unsupported 'WordPiece'",
                 "another model type");

    snprintf(buf, sizeof buf,
             "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, %s, "
             "\"normalizer\": {\"type\": \"Replace\"}}",
             bl);
    write_file(tmp_path("norm.json"), buf);
    s.model = tmp_path("norm.json");
    expect_error(&s, MC_ERR_FORMAT, "norm.json: normalizer: unsupported type 'Replace'",
                 "unsupported normalizer");

    write_file(tmp_path("metaspace.json"),
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
               "\"pre_tokenizer\": {\"type\": \"Metaspace\"}}");
    s.model = tmp_path("metaspace.json");
    expect_error(&s, MC_ERR_FORMAT, "metaspace.json: pre_tokenizer: unsupported type 'Metaspace'",
                 "unsupported pre-tokenizer");

    s.model = tmp_path("does-not-exist.json");
    expect_error(&s, MC_ERR_IO, "does-not-exist.json", "missing file");

    /* GPT2BPETokenizer: merges.txt naming an unknown token, with its line. */
    mc_tokenizer_spec_init(&s, MC_TOKENIZER_GPT2BPE);
    write_file(tmp_path("vocab.json"), "{\"a\": 0, \"b\": 1, \"ab\": 2, \"<|endoftext|>\": 3}");
    write_file(tmp_path("merges.txt"), "#version: 0.2\na b\n\nq b\n");
    s.vocab_file = tmp_path("vocab.json");
    s.merge_file = tmp_path("merges.txt");
    expect_error(&s, MC_ERR_FORMAT, "merges.txt:4: unknown token 'q'", "merges.txt: unknown token");
    write_file(tmp_path("merges2.txt"), "a b c\n");
    s.merge_file = tmp_path("merges2.txt");
    expect_error(&s, MC_ERR_FORMAT, "merges2.txt:1: expected two tokens", "merges.txt: bad line");

    /* TikTokenizer: a bad line and a missing byte. */
    mc_tokenizer_spec_init(&s, MC_TOKENIZER_TIKTOKEN);
    write_file(tmp_path("bad.ranks"), "AA== 0\nAQ== 1\nAg==\n");
    s.model = tmp_path("bad.ranks");
    expect_error(&s, MC_ERR_FORMAT, "bad.ranks:3: expected \"BASE64 RANK\"", "tiktoken: bad line");
    write_file(tmp_path("bad2.ranks"), "AA== 0\nA!== 1\n");
    s.model = tmp_path("bad2.ranks");
    expect_error(&s, MC_ERR_FORMAT, "bad2.ranks:2: invalid base64", "tiktoken: bad base64");
    write_file(tmp_path("short.ranks"), "AA== 0\nAQ== 1\n");
    s.model = tmp_path("short.ranks");
    expect_error(&s, MC_ERR_FORMAT, "no rank for the single byte 0x02", "tiktoken: missing byte");
    s.model = data_path("tiktoken.ranks");
    s.tiktoken_pattern = "v3";
    expect_error(&s, MC_ERR_USAGE, "--tiktoken-pattern must be v1 or v2", "tiktoken: bad pattern");

    mc_tokenizer_spec_init(&s, MC_TOKENIZER_NULL);
    expect_error(&s, MC_ERR_USAGE, "NullTokenizer needs --vocab-size",
                 "NullTokenizer without size");
}

int main(void)
{
    const char *top = getenv("top_srcdir");
    if (!top || !*top) top = getenv("srcdir");
    if (!top || !*top) top = ".";
    snprintf(datadir, sizeof datadir, "%s/tests/data/tokenizer", top);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 99;
    }

    json_error_t je;
    json_t *corpus = json_load_file(data_path("corpus.json"), JSON_ALLOW_NUL, &je);
    json_t *expected = json_load_file(data_path("expected.json"), 0, &je);
    if (!corpus || !expected) {
        printf("Bail out! cannot read %s: %s\n", datadir, je.text);
        return 99;
    }
    size_t n_texts, n_invalid;
    doc *docs = load_docs(corpus, &n_texts, &n_invalid);

    static const struct {
        const char *name;
        mc_tokenizer_kind kind;
        const char *file, *file2, *pattern;
        int round_trips;
    } fx[] = {
        {"hf_bytelevel", MC_TOKENIZER_HUGGINGFACE, "hf_bytelevel.json", NULL, NULL, 1},
        {"hf_llama3", MC_TOKENIZER_HUGGINGFACE, "hf_llama3.json", NULL, NULL, 1},
        {"hf_prefix_nfkc", MC_TOKENIZER_HUGGINGFACE, "hf_prefix_nfkc.json", NULL, NULL, 0},
        {"gpt2", MC_TOKENIZER_GPT2BPE, "gpt2_vocab.json", "gpt2_merges.txt", NULL, 1},
        {"tiktoken_v1", MC_TOKENIZER_TIKTOKEN, "tiktoken.ranks", NULL, "v1", 1},
        {"tiktoken_v2", MC_TOKENIZER_TIKTOKEN, "tiktoken.ranks", NULL, "v2", 1},
    };
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        mc_tokenizer_spec s;
        mc_tokenizer_spec_init(&s, fx[i].kind);
        if (fx[i].kind == MC_TOKENIZER_GPT2BPE) {
            s.vocab_file = data_path(fx[i].file);
            s.merge_file = data_path(fx[i].file2);
        } else
            s.model = data_path(fx[i].file);
        if (fx[i].pattern) s.tiktoken_pattern = fx[i].pattern;
        check_fixture(fx[i].name, &s, fx[i].round_trips, expected, docs, n_texts, n_invalid);
    }
    test_properties();
    test_errors();

    for (size_t i = 0; i < n_texts + n_invalid; i++) free(docs[i].data);
    free(docs);
    json_decref(corpus);
    json_decref(expected);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) TAP_DIAG("could not remove %s", tmpdir);
    return tap_done();
}
