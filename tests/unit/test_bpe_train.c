/*
 * test_bpe_train.c - the byte-level BPE trainer (lib/data/bpe_train.c).
 *
 * References: merges worked out by hand for tiny corpora (the derivations are
 * in the comments), and for tests/data/bpe_train_corpus.txt the merges that
 * the naive trainer tests/golden/bpe_train_ref.py (every pair recounted
 * before each merge, Hugging Face's ByteLevel pre-tokenizer) printed into
 * tests/golden/bpe_train_merges*.txt. The written tokenizer.json is read back
 * with jansson and checked field by field. Every error path is fed a bad
 * input and its message checked.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mc/bpe_train.h"
#include "mc/file.h"
#include "mc/pretok.h"
#include "tap.h"

static char tmpdir[4096];

static const char *tmp_path(const char *name)
{
    static char buf[8192];
    snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
    return buf;
}

/* Train on texts (NULL-terminated) and write path; returns the status and
 * fills err. */
static mc_status train(const mc_bpe_trainer_config *c, const char *const *texts, const char *path,
                       int64_t *n_merges, mc_error *err)
{
    mc_bpe_trainer *t = NULL;
    mc_status st = mc_bpe_trainer_new(c, &t, err);
    for (size_t i = 0; !st && texts[i]; i++)
        st = mc_bpe_trainer_add(t, texts[i], strlen(texts[i]), err);
    if (!st) st = mc_bpe_trainer_train(t, n_merges, err);
    if (!st) st = mc_bpe_trainer_write_json(t, path, err);
    mc_bpe_trainer_free(t);
    return st;
}

static json_t *load(const char *path)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) TAP_DIAG("%s:%d: %s", path, je.line, je.text);
    return j;
}

/* The merges of a tokenizer.json as "LEFT RIGHT\n" lines (malloc'd). */
static char *merges_text(json_t *root)
{
    json_t *m = json_object_get(json_object_get(root, "model"), "merges");
    size_t cap = 1, len = 0, i;
    json_t *e;
    json_array_foreach(m, i, e) cap += strlen(json_string_value(json_array_get(e, 0))) +
                                       strlen(json_string_value(json_array_get(e, 1))) + 2;
    char *s = malloc(cap);
    s[0] = 0;
    json_array_foreach(m, i, e)
        len += (size_t)sprintf(s + len, "%s %s\n", json_string_value(json_array_get(e, 0)),
                               json_string_value(json_array_get(e, 1)));
    return s;
}

/* For TAP descriptions: merges on one line, "a a|a b|". */
static const char *oneline(const char *s)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s", s ? s : "(null)");
    for (char *p = buf; *p; p++)
        if (*p == '\n') *p = '|';
    return buf;
}

static int64_t vocab_id(json_t *root, const char *tok)
{
    json_t *v = json_object_get(json_object_get(json_object_get(root, "model"), "vocab"), tok);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

static int64_t vocab_count(json_t *root)
{
    return (int64_t)json_object_size(json_object_get(json_object_get(root, "model"), "vocab"));
}

static char *read_all(const char *path)
{
    char *d = NULL;
    size_t n;
    mc_error err;
    if (mc_read_file(path, &d, &n, &err)) TAP_DIAG("%s", err.msg);
    return d;
}

static const char *srcdir(void)
{
    const char *s = getenv("top_srcdir");
    return s ? s : ".";
}

/* "aaabdaaabac" (one GPT-2 piece). Pair counts: aa 4, ab 2, the rest 1.
 *   1. (a,a) -> 256 "aa":   Z a b d Z a b a c   (Z=256)
 *      counts: (256,97) 2, (97,98) 2; tie -> smaller left id: (a,b)
 *   2. (a,b) -> 257 "ab":   Z Y d Z Y a c
 *   3. (256,257) -> 258 "aaab": X d X a c; every pair now occurs once.
 * With min_frequency 2 that is all. With min_frequency 1, ties everywhere:
 *   4. pairs (258,100) (100,258) (258,97) (97,99): smallest (97,99) "ac"
 *   5. X d X W: (100,258) "daaab"   6. X V W: (258,260) "aaabdaaab"
 *   7. (261,259) "aaabdaaabac". */
static void test_hand_checked(void)
{
    mc_bpe_trainer_config c;
    mc_bpe_trainer_config_init(&c);
    c.vocab_size = 1000;
    const char *texts[] = {"aaabdaaabac", NULL};
    mc_error err = {0};
    int64_t nm = -1;
    const char *p = tmp_path("hand.json");
    TAP_OK(train(&c, texts, p, &nm, &err) == MC_OK, "hand-checked corpus trains (%s)", err.msg);
    TAP_OK(nm == 3, "min_frequency 2 stops after 3 merges (got %lld)", (long long)nm);
    json_t *j = load(p);
    char *m = merges_text(j);
    TAP_OK(!strcmp(m, "a a\na b\naa ab\n"), "merges a a, a b, aa ab (got %s)", oneline(m));
    TAP_OK(vocab_id(j, "aa") == 256 && vocab_id(j, "ab") == 257 && vocab_id(j, "aaab") == 258,
           "merged tokens get ids 256, 257, 258");
    TAP_OK(vocab_id(j, "<|endoftext|>") == 259, "the special token follows the merges: 259");
    TAP_OK(vocab_count(j) == 260, "vocabulary has 256 + 3 + 1 entries (%lld)",
           (long long)vocab_count(j));
    free(m);
    json_decref(j);

    c.min_frequency = 1;
    TAP_OK(train(&c, texts, p, &nm, &err) == MC_OK && nm == 7,
           "min_frequency 1 merges down to one token: 7 merges (got %lld)", (long long)nm);
    j = load(p);
    m = merges_text(j);
    TAP_OK(!strcmp(m, "a a\na b\naa ab\na c\nd aaab\naaab daaab\naaabdaaab ac\n"),
           "ties go to the smallest (left, right) ids (got %s)", oneline(m));
    free(m);
    json_decref(j);

    /* vocab_size honoured exactly: 256 bytes + 5 merges + 1 special */
    c.vocab_size = 262;
    TAP_OK(train(&c, texts, p, &nm, &err) == MC_OK && nm == 5, "vocab 262 stops at 5 merges");
    j = load(p);
    TAP_OK(vocab_count(j) == 262 && vocab_id(j, "<|endoftext|>") == 261,
           "vocab has exactly 262 ids, <|endoftext|> = 261");
    TAP_OK(vocab_id(j, "daaab") == 260 && vocab_id(j, "aaabdaaab") == -1,
           "the 5th merge is the last one learned");
    json_decref(j);
}

/* The reference trainer's merges for the committed corpus. */
static void test_golden(void)
{
    char path[8192], want[8192];
    snprintf(path, sizeof path, "%s/tests/data/bpe_train_corpus.txt", srcdir());
    char *text = read_all(path);
    if (!text) {
        TAP_OK(0, "read %s", path);
        return;
    }
    const struct {
        int64_t vocab, minf;
        const char *golden;
    } cases[] = {{400, 2, "bpe_train_merges.txt"}, {1000, 1, "bpe_train_merges_minfreq1.txt"}};
    for (size_t k = 0; k < 2; k++) {
        mc_bpe_trainer_config c;
        mc_bpe_trainer_config_init(&c);
        c.vocab_size = cases[k].vocab;
        c.min_frequency = cases[k].minf;
        const char *texts[] = {text, NULL};
        mc_error err = {0};
        int64_t nm = 0;
        const char *p = tmp_path("golden.json");
        mc_status st = train(&c, texts, p, &nm, &err);
        snprintf(want, sizeof want, "%s/tests/golden/%s", srcdir(), cases[k].golden);
        char *expect = read_all(want);
        json_t *j = st ? NULL : load(p);
        char *got = j ? merges_text(j) : NULL;
        TAP_OK(expect && got && !strcmp(got, expect),
               "corpus, vocab %lld, min_frequency %lld: %lld merges equal to %s",
               (long long)cases[k].vocab, (long long)cases[k].minf, (long long)nm, cases[k].golden);
        free(expect);
        free(got);
        json_decref(j);
    }
    free(text);
}

/* Same input, same file; the order of documents is part of the input but
 * the counts are not, so splitting a text differently gives the same file. */
static void test_determinism(void)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/tests/data/bpe_train_corpus.txt", srcdir());
    char *text = read_all(path);
    if (!text) {
        TAP_OK(0, "read %s", path);
        return;
    }
    mc_bpe_trainer_config c;
    mc_bpe_trainer_config_init(&c);
    c.vocab_size = 500;
    c.min_frequency = 1;
    const char *texts[] = {text, text, NULL};
    mc_error err = {0};
    int64_t n1 = 0, n2 = 0;
    char a[8192], b[8192];
    snprintf(a, sizeof a, "%s", tmp_path("det1.json"));
    snprintf(b, sizeof b, "%s", tmp_path("det2.json"));
    TAP_OK(train(&c, texts, a, &n1, &err) == MC_OK && train(&c, texts, b, &n2, &err) == MC_OK,
           "trained twice (%s)", err.msg);
    char *x = read_all(a), *y = read_all(b);
    TAP_OK(x && y && n1 == 243 && !strcmp(x, y), "two runs give byte-identical files (%lld merges)",
           (long long)n1);
    free(x);
    free(y);
    free(text);
}

/* Two special tokens take the last two ids; their text is never learned. */
static void test_special_tokens(void)
{
    mc_bpe_trainer_config c;
    mc_bpe_trainer_config_init(&c);
    const char *sp[] = {"<|endoftext|>", "<pad>"};
    c.special_tokens = sp;
    c.n_special_tokens = 2;
    c.vocab_size = 256 + 2 + 2;
    c.min_frequency = 1;
    /* pieces: "ab" x3 (the special tokens cut "ab<pad>ab" into "ab", "ab");
     * pairs (a,b) 3 -> 256; then nothing is left to merge: the letters of
     * the special tokens must not have been counted */
    const char *texts[] = {"ab<|endoftext|>", "ab<pad>ab", NULL};
    mc_error err = {0};
    int64_t nm = -1;
    const char *p = tmp_path("special.json");
    TAP_OK(train(&c, texts, p, &nm, &err) == MC_OK && nm == 1,
           "special tokens are cut out of the text: one merge (got %lld)", (long long)nm);
    json_t *j = load(p);
    TAP_OK(vocab_id(j, "<|endoftext|>") == 257 && vocab_id(j, "<pad>") == 258,
           "special tokens follow the merges in the order given (257, 258)");
    json_t *added = json_object_get(j, "added_tokens");
    json_t *a1 = json_array_get(added, 1);
    TAP_OK(json_array_size(added) == 2 && json_integer_value(json_object_get(a1, "id")) == 258 &&
               !strcmp(json_string_value(json_object_get(a1, "content")), "<pad>") &&
               json_is_true(json_object_get(a1, "special")) &&
               json_is_false(json_object_get(a1, "normalized")),
           "added_tokens lists both, special, not normalized");
    json_decref(j);

    /* A full vocabulary: the specials take its last ids. */
    c.vocab_size = 300;
    c.min_frequency = 1;
    char path[8192];
    snprintf(path, sizeof path, "%s/tests/data/bpe_train_corpus.txt", srcdir());
    char *text = read_all(path);
    const char *t2[] = {text ? text : "", NULL};
    TAP_OK(train(&c, t2, p, &nm, &err) == MC_OK && nm == 42, "vocab 300, 2 specials: 42 merges");
    j = load(p);
    TAP_OK(vocab_count(j) == 300 && vocab_id(j, "<|endoftext|>") == 298 &&
               vocab_id(j, "<pad>") == 299,
           "specials at vocab_size-2 and vocab_size-1");
    json_decref(j);
    free(text);

    /* " ab ab ab ab": pieces " ab" x4, pairs (32,97) 4 and (97,98) 4; the tie
     * goes to (32,97) " a", spelled "Ġa", which is also a special token's
     * text: that merge is set aside and (a,b) is learned, then (Ġ,ab). */
    const char *sp2[] = {"\xc4\xa0"
                         "a"};
    c.special_tokens = sp2;
    c.n_special_tokens = 1;
    c.vocab_size = 1000;
    c.min_frequency = 2;
    const char *t3[] = {" ab ab ab ab", NULL};
    TAP_OK(train(&c, t3, p, &nm, &err) == MC_OK, "trains with special token \"Ġa\"");
    j = load(p);
    char *m = merges_text(j);
    TAP_OK(!strcmp(m, "a b\n\xc4\xa0 ab\n") && vocab_id(j, "\xc4\xa0"
                                                           "a") == 258,
           "no learned token is spelled like a special token (got %s)", oneline(m));
    free(m);
    json_decref(j);
    c.special_tokens = NULL;
    c.n_special_tokens = 0;
    TAP_OK(train(&c, t3, p, &nm, &err) == MC_OK, "trains with no special token");
    j = load(p);
    m = merges_text(j);
    TAP_OK(!strcmp(m, "\xc4\xa0 a\n\xc4\xa0"
                      "a b\n") &&
               vocab_count(j) == 258 && json_array_size(json_object_get(j, "added_tokens")) == 0,
           "without it, (Ġ,a) wins the tie (got %s)", oneline(m));
    free(m);
    json_decref(j);
}

/* Invalid UTF-8: "ab\xff\xfe\xff\xfe ab\xff\xfe\xff\xfe" gives pieces "ab",
 * "\xff\xfe\xff\xfe", " ab", "\xff\xfe\xff\xfe". Pairs: (255,254) 4,
 * (254,255) 2, (a,b) 2, ...  1. (255,254) "ÿþ" -> 256; then (97,98) 2 and
 * (256,256) 2 tie: 2. "ab" -> 257, 3. "ÿþÿþ" -> 258. */
static void test_invalid_utf8(void)
{
    mc_bpe_trainer_config c;
    mc_bpe_trainer_config_init(&c);
    c.vocab_size = 1000;
    const char *texts[] = {"ab\xff\xfe\xff\xfe ab\xff\xfe\xff\xfe", NULL};
    mc_error err = {0};
    int64_t nm = -1;
    const char *p = tmp_path("bytes.json");
    TAP_OK(train(&c, texts, p, &nm, &err) == MC_OK && nm == 3,
           "invalid UTF-8 trains: 3 merges (got %lld; %s)", (long long)nm, err.msg);
    json_t *j = load(p);
    char *m = merges_text(j);
    TAP_OK(!strcmp(m, "\xc3\xbf \xc3\xbe\na b\n\xc3\xbf\xc3\xbe \xc3\xbf\xc3\xbe\n"),
           "bytes of an invalid run are merged byte-level (got %s)", oneline(m));
    free(m);
    json_decref(j);
}

/* The file itself: every field Hugging Face tokenizers reads. */
static void test_json_fields(void)
{
    mc_bpe_trainer_config c;
    mc_bpe_trainer_config_init(&c);
    c.vocab_size = 300;
    const char *texts[] = {
        "\"quoted\" \\back\\slash\\ \"quoted\" \\back\\slash\\ tab\there\ttab\there", NULL};
    mc_error err = {0};
    int64_t nm = -1;
    const char *p = tmp_path("fields.json");
    TAP_OK(train(&c, texts, p, &nm, &err) == MC_OK && nm > 0, "trains (%lld merges)",
           (long long)nm);
    json_t *j = load(p);
    TAP_OK(j != NULL, "tokenizer.json is valid JSON (quotes, backslashes escaped)");
    if (!j) return;
    TAP_OK(!strcmp(json_string_value(json_object_get(j, "version")), "1.0") &&
               json_is_null(json_object_get(j, "truncation")) &&
               json_is_null(json_object_get(j, "padding")) &&
               json_is_null(json_object_get(j, "normalizer")),
           "version 1.0; truncation, padding, normalizer null");
    json_t *pre = json_object_get(j, "pre_tokenizer");
    TAP_OK(!strcmp(json_string_value(json_object_get(pre, "type")), "ByteLevel") &&
               json_is_true(json_object_get(pre, "use_regex")) &&
               json_is_false(json_object_get(pre, "add_prefix_space")),
           "GPT-2 pattern: pre_tokenizer ByteLevel, use_regex true, no prefix space");
    json_t *post = json_object_get(j, "post_processor"), *dec = json_object_get(j, "decoder");
    TAP_OK(!strcmp(json_string_value(json_object_get(post, "type")), "ByteLevel") &&
               !strcmp(json_string_value(json_object_get(dec, "type")), "ByteLevel") &&
               json_is_true(json_object_get(post, "trim_offsets")),
           "post_processor and decoder ByteLevel");
    json_t *model = json_object_get(j, "model");
    TAP_OK(!strcmp(json_string_value(json_object_get(model, "type")), "BPE") &&
               json_is_null(json_object_get(model, "dropout")) &&
               json_is_null(json_object_get(model, "unk_token")) &&
               json_is_false(json_object_get(model, "byte_fallback")) &&
               json_is_false(json_object_get(model, "ignore_merges")),
           "model BPE, no dropout, no unk, no byte fallback");
    /* GPT-2's bytes_to_unicode */
    TAP_OK(vocab_id(j, "\xc4\x80") == 0 && vocab_id(j, "\xc4\xa0") == 32 &&
               vocab_id(j, "!") == 33 && vocab_id(j, "\"") == 34 && vocab_id(j, "\\") == 92 &&
               vocab_id(j, "\xc4\xa1") == 127 && vocab_id(j, "\xc5\x82") == 160 &&
               vocab_id(j, "\xc2\xa1") == 161 && vocab_id(j, "\xc5\x83") == 173 &&
               vocab_id(j, "\xc3\xbf") == 255,
           "byte tokens: byte b has id b, spelled as GPT-2's bytes_to_unicode");
    /* every id once, 0..N-1, every merge a pair of tokens whose concatenation is a token */
    json_t *vocab = json_object_get(model, "vocab");
    size_t n = json_object_size(vocab);
    char *seen = calloc(n, 1);
    int ids_ok = 1;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v)
    {
        json_int_t id = json_integer_value(v);
        if (id < 0 || (size_t)id >= n || seen[id])
            ids_ok = 0;
        else
            seen[id] = 1;
    }
    free(seen);
    TAP_OK(ids_ok && n == (size_t)(256 + nm + 1), "vocab ids are 0..%zu, each once", n - 1);
    json_t *merges = json_object_get(model, "merges"), *e;
    size_t i;
    int merges_ok = json_array_size(merges) == (size_t)nm;
    json_array_foreach(merges, i, e)
    {
        const char *l = json_string_value(json_array_get(e, 0)),
                   *r = json_string_value(json_array_get(e, 1));
        char cat[1024];
        if (!json_is_array(e) || json_array_size(e) != 2 || !l || !r ||
            strlen(l) + strlen(r) >= sizeof cat) {
            merges_ok = 0;
            break;
        }
        memcpy(cat, l, strlen(l));
        memcpy(cat + strlen(l), r, strlen(r) + 1);
        if (vocab_id(j, cat) != 256 + (int64_t)i) merges_ok = 0;
    }
    TAP_OK(merges_ok, "merge k is [left, right] and left+right is token 256+k");
    json_decref(j);

    /* another pattern: Split(Regex) then ByteLevel without its own regex */
    c.pattern = MC_PATTERN_LLAMA3;
    TAP_OK(train(&c, texts, p, &nm, &err) == MC_OK, "trains with the Llama-3 pattern");
    j = load(p);
    pre = json_object_get(j, "pre_tokenizer");
    json_t *seq = json_object_get(pre, "pretokenizers");
    json_t *split = json_array_get(seq, 0), *bl = json_array_get(seq, 1);
    TAP_OK(
        !strcmp(json_string_value(json_object_get(pre, "type")), "Sequence") &&
            !strcmp(json_string_value(json_object_get(split, "type")), "Split") &&
            !strcmp(json_string_value(json_object_get(json_object_get(split, "pattern"), "Regex")),
                    MC_PATTERN_LLAMA3) &&
            !strcmp(json_string_value(json_object_get(split, "behavior")), "Isolated") &&
            json_is_false(json_object_get(split, "invert")) &&
            !strcmp(json_string_value(json_object_get(bl, "type")), "ByteLevel") &&
            json_is_false(json_object_get(bl, "use_regex")),
        "other patterns: Sequence [Split(Regex, Isolated), ByteLevel(use_regex false)]");
    json_decref(j);
}

static int has(const mc_error *err, const char *s)
{
    if (strstr(err->msg, s)) return 1;
    TAP_DIAG("message: %s", err->msg);
    return 0;
}

static void test_errors(void)
{
    mc_bpe_trainer_config c;
    mc_bpe_trainer *t = NULL;
    mc_error err = {0};

    mc_bpe_trainer_config_init(&c);
    c.vocab_size = 256;
    TAP_OK(mc_bpe_trainer_new(&c, &t, &err) == MC_ERR_USAGE && !t &&
               has(&err, "vocabulary size 256 must be between 257"),
           "vocab size below 256 + specials: usage error");
    mc_bpe_trainer_config_init(&c);
    c.min_frequency = -1;
    TAP_OK(mc_bpe_trainer_new(&c, &t, &err) == MC_ERR_USAGE && has(&err, "minimum frequency -1"),
           "negative min_frequency: usage error");
    const char *empty[] = {""};
    mc_bpe_trainer_config_init(&c);
    c.special_tokens = empty;
    TAP_OK(mc_bpe_trainer_new(&c, &t, &err) == MC_ERR_USAGE &&
               has(&err, "special token 0 is empty"),
           "empty special token: usage error");
    const char *twice[] = {"<s>", "<s>"};
    c.special_tokens = twice;
    c.n_special_tokens = 2;
    TAP_OK(mc_bpe_trainer_new(&c, &t, &err) == MC_ERR_USAGE && has(&err, "'<s>' given twice"),
           "duplicate special token: usage error");
    const char *byte[] = {"\xc4\xa0"};
    c.special_tokens = byte;
    c.n_special_tokens = 1;
    TAP_OK(mc_bpe_trainer_new(&c, &t, &err) == MC_ERR_USAGE && has(&err, "is the byte token 32"),
           "special token spelled like a byte token: usage error");
    const char *bad[] = {"\xff"};
    c.special_tokens = bad;
    TAP_OK(mc_bpe_trainer_new(&c, &t, &err) == MC_ERR_USAGE && has(&err, "not valid UTF-8"),
           "special token that is not UTF-8: usage error");
    mc_bpe_trainer_config_init(&c);
    c.pattern = "(unclosed";
    TAP_OK(mc_bpe_trainer_new(&c, &t, &err) == MC_ERR_FORMAT && has(&err, "pattern"),
           "bad pattern: format error from the pre-tokenizer");

    mc_bpe_trainer_config_init(&c);
    c.vocab_size = 300;
    TAP_OK(mc_bpe_trainer_new(&c, &t, &err) == MC_OK, "trainer made");
    TAP_OK(mc_bpe_trainer_write_json(t, tmp_path("early.json"), &err) == MC_ERR_USAGE &&
               has(&err, "no trained vocabulary") && access(tmp_path("early.json"), F_OK) != 0,
           "write before train: usage error, no file");
    TAP_OK(mc_bpe_trainer_add(t, "hello hello", 11, &err) == MC_OK &&
               mc_bpe_trainer_train(t, NULL, &err) == MC_OK,
           "train with a NULL merge count");
    TAP_OK(mc_bpe_trainer_add(t, "more", 4, &err) == MC_ERR_USAGE &&
               has(&err, "text added after training"),
           "add after train: usage error");
    TAP_OK(mc_bpe_trainer_train(t, NULL, &err) == MC_ERR_USAGE && has(&err, "trained twice"),
           "train twice: usage error");
    const char *nodir = tmp_path("no/such/dir/t.json");
    TAP_OK(mc_bpe_trainer_write_json(t, nodir, &err) == MC_ERR_IO && has(&err, "does not exist") &&
               has(&err, "t.json"),
           "write into a missing directory: io error naming it");
    mc_bpe_trainer_free(t);
    mc_bpe_trainer_free(NULL);

    /* nothing added: the 256 bytes and the special token */
    mc_bpe_trainer_config_init(&c);
    int64_t nm = -1;
    TAP_OK(mc_bpe_trainer_new(&c, &t, &err) == MC_OK &&
               mc_bpe_trainer_train(t, &nm, &err) == MC_OK && nm == 0 &&
               mc_bpe_trainer_write_json(t, tmp_path("empty.json"), &err) == MC_OK,
           "no text: no merges, still a valid file");
    json_t *j = load(tmp_path("empty.json"));
    TAP_OK(j && vocab_count(j) == 257 && vocab_id(j, "<|endoftext|>") == 256 &&
               json_array_size(json_object_get(json_object_get(j, "model"), "merges")) == 0,
           "empty training: 257 tokens, <|endoftext|> = 256");
    json_decref(j);
    mc_bpe_trainer_free(t);
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/test_bpe_train.XXXXXX", base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    mc_bpe_trainer_config c;
    mc_bpe_trainer_config_init(&c);
    TAP_OK(c.vocab_size > 256 && c.pattern == MC_PATTERN_GPT2 && c.n_special_tokens == 1 &&
               !strcmp(c.special_tokens[0], "<|endoftext|>") && c.min_frequency == 2,
           "config defaults: GPT-2 pattern, <|endoftext|>, min_frequency 2");
    test_hand_checked();
    test_golden();
    test_determinism();
    test_special_tokens();
    test_invalid_utf8();
    test_json_fields();
    test_errors();
    char cmd[8300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) TAP_DIAG("could not remove %s", tmpdir);
    return tap_done();
}
