/*
 * test_chat_template.c - the chat template engine (mc/chat.h): Jinja
 * semantics on small templates (whitespace control, trim_blocks and
 * lstrip_blocks, loops, macros, namespaces, filters, errors with their
 * lines), then every golden render of tests/golden/chat_templates.json
 * (published templates rendered by transformers) compared byte for byte.
 */
#include "mc/chat.h"
#include "mc/json.h"
#include "tap.h"

#include <stdlib.h>
#include <string.h>

static const char *top_srcdir(void)
{
    const char *s = getenv("top_srcdir");
    return s && *s ? s : ".";
}

/* Render src over messages (JSON text) with add_generation_prompt gen; the
 * output, or "ERROR: message". */
static char *render(const char *src, const char *messages_json, int gen, const char *extra_json)
{
    mc_error err = {0};
    mc_chat_template *t;
    static char buf[4096];
    if (mc_chat_template_parse("t.jinja", src, strlen(src), &t, &err)) {
        snprintf(buf, sizeof buf, "ERROR: %s", err.msg);
        return strdup(buf);
    }
    json_t *msgs = json_loads(messages_json ? messages_json : "[]", 0, NULL);
    json_t *extra = extra_json ? json_loads(extra_json, 0, NULL) : NULL;
    mc_chat_vars v = {.messages = msgs,
                      .add_generation_prompt = gen,
                      .bos_token = "<s>",
                      .eos_token = "</s>",
                      .extra = extra};
    char *out;
    size_t len;
    if (mc_chat_template_render(t, &v, &out, &len, &err)) {
        snprintf(buf, sizeof buf, "ERROR: %s", err.msg);
        out = strdup(buf);
    }
    json_decref(msgs);
    json_decref(extra);
    mc_chat_template_free(t);
    return out;
}

static void check(const char *src, const char *msgs, const char *extra, const char *want,
                  const char *what)
{
    char *got = render(src, msgs, 0, extra);
    int ok = !strcmp(got, want);
    TAP_OK(ok, "%s", what);
    if (!ok) TAP_DIAG("want [%s]\n# got  [%s]", want, got);
    free(got);
}

/* the error message starts with want */
static void check_err(const char *src, const char *msgs, const char *want, const char *what)
{
    char *got = render(src, msgs, 0, NULL);
    int ok = !strncmp(got, "ERROR: ", 7) && strstr(got + 7, want) == got + 7;
    TAP_OK(ok, "%s", what);
    if (!ok) TAP_DIAG("want [ERROR: %s...]\n# got  [%s]", want, got);
    free(got);
}

static const char *M2 =
    "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]";

static void semantics(void)
{
    check("a{{ 1 + 2 }}b", NULL, NULL, "a3b", "expression output");
    check("{{ bos_token }}{{ missing }}|{{ eos_token }}", NULL, NULL, "<s>|</s>",
          "undefined prints empty");
    check("a\n{% if true %}\nX\n{% endif %}\nb\n", NULL, NULL, "a\nX\nb",
          "trim_blocks, trailing newline dropped");
    check("<\n    {% if true %}\n    X\n    {% endif %}\n>", NULL, NULL, "<\n    X\n>",
          "lstrip_blocks");
    check("a  {%- if true -%}  b  {%- endif -%}  c", NULL, NULL, "abc", "- strips both sides");
    check("a \n {{- 'x' -}} \n b", NULL, NULL, "axb", "{{- -}}");
    check("  {%+ if true %}x{% endif %}", NULL, NULL, "  x", "{%+ keeps indentation");
    check("{% if true +%}\nx{% endif %}", NULL, NULL, "\nx", "+%} keeps the newline");
    check("a {# note #}\nb", NULL, NULL, "a b", "comments trim their newline");
    check("{% raw %}{{ x }}{% endraw %}", NULL, NULL, "{{ x }}", "raw");
    check("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
          "{{ loop.length }}{{ loop.revindex }}:{{ m.role }};{% endfor %}",
          M2, NULL, "10TrueFalse22:user;21FalseTrue21:assistant;", "loop variables");
    check(
        "{% for m in messages %}{{ (loop.previtem or {}).role }}>{{ (loop.nextitem or {}).role }}|"
        "{% endfor %}",
        M2, NULL, ">assistant|user>|", "previtem/nextitem");
    check(
        "{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}"
        "{% endif %}{{ x }}{% endfor %}",
        NULL, NULL, "13", "break and continue");
    check("{% for x in [] %}a{% else %}empty{% endfor %}", NULL, NULL, "empty", "for else");
    check("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}", NULL, NULL,
          "2242", "for with a filter");
    check("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}", NULL, NULL,
          "a=1,b=2,", "dict items unpacked");
    check("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", NULL, NULL, "1",
          "a loop's set does not leak");
    check("{% set ns = namespace(x=1) %}{% for i in [1] %}{% set ns.x = 2 %}{% endfor %}{{ ns.x }}",
          NULL, NULL, "2", "namespace carries values out");
    check("{% if true %}{% set x = 3 %}{% endif %}{{ x }}", NULL, NULL, "3",
          "an if's set does leak");
    check("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(a=3, "
          "b=4) }}",
          NULL, NULL, "[1B][12][34]", "macros with defaults");
    check("{% set s %}x{{ 1 }}{% endset %}{{ s }}{{ s|length }}", NULL, NULL, "x12", "block set");
    check("{{ '  a b  '|trim }}|{{ 'abc'[::-1] }}|{{ 'abc'[1:] }}|{{ [1,2,3][-1] }}|{{ "
          "'a,b'.split(',') }}",
          NULL, NULL, "a b|cba|bc|3|['a', 'b']", "strings, slices, lists");
    check("{{ 'Hello World'.lower() }} {{ 'ab'.upper() }} {{ 'hello world'.title() }} {{ "
          "'aXb'.capitalize() }}",
          NULL, NULL, "hello world AB Hello World Axb", "case methods");
    check("{{ '\\n\\nx\\n'.strip('\\n') }}{{ 'xxay'.lstrip('x') }}{{ 'ab'.startswith('a') }}"
          "{{ 'ab'.endswith(('x', 'b')) }}{{ 'a-b-c'.replace('-', '+') }}",
          NULL, NULL, "xayTrueTruea+b+c", "strip and friends");
    check("{{ {'a': [1, 2.5, none, true], 'b': 'é\"'}|tojson }}", NULL, NULL,
          "{\"a\": [1, 2.5, null, true], \"b\": \"é\\\"\"}", "tojson like json.dumps");
    check("{{ {'a': [1]}|tojson(indent=2) }}", NULL, NULL, "{\n  \"a\": [\n    1\n  ]\n}",
          "tojson indent");
    check("{{ 'x' in 'xyz' }}{{ 3 not in [1, 2] }}{{ 'a' ~ 1 ~ none }}{{ 7 // 2 }}{{ 7 / 2 }}{{ -7 "
          "% 3 }}{{ 2 ** 10 }}",
          NULL, NULL, "TrueTruea1None33.521024", "operators");
    check("{{ messages|selectattr('role', 'equalto', 'user')|list|length }}"
          "{{ messages|map(attribute='role')|join(',') }}{{ messages|rejectattr('role', 'eq', "
          "'user')|first }}",
          M2, NULL, "1user,assistant{'role': 'assistant', 'content': 'yo'}",
          "selectattr, map, join, first");
    check("{{ x is defined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ 1 is "
          "number }}"
          "{{ [1] is iterable }}{{ false is false }}{{ x is undefined }}{{ 3 is divisibleby 3 }}",
          NULL, NULL, "FalseTrueTrueTrueTrueTrueTrueTrueTrue", "tests");
    check("{{ x|default('d') }}{{ ''|default('e', true) }}{{ 'a\\nb'|indent(2) }}{{ 2.5|round }}{{ "
          "'7'|int + 1 }}",
          NULL, NULL, "dea\n  b2.08", "default, indent, round, int");
    check("{{ messages[0].get('content') }}{{ messages[0].get('nope', 'z') }}{{ "
          "messages[0]['role'] }}",
          M2, NULL, "hizuser", "dict get and items");
    check("{{ 'yes' if enable_thinking else 'no' }}{{ 'a' if false }}", NULL,
          "{\"enable_thinking\": true}", "yes", "conditional expression and extra variables");
    check("{{ 1 < 2 < 3 }}{{ 1 < 3 < 2 }}{{ not 1 == 2 }}{{ none or 'x' }}{{ 0 and 1 }}", NULL,
          NULL, "TrueFalseTruex0", "chained comparisons, and/or");
    check("{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
          M2, NULL, "hiyo", "generation blocks render their content");
    check("{{ messages[0].reasoning_content }}|{{ messages[0].thinking }}",
          "[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning\":\"r\",\"x\":null}]", NULL,
          "r|r", "reasoning fields aliased as transformers does");

    /* errors: name, line, construct */
    check_err("a\n{{ raise_exception('bad role') }}", NULL, "t.jinja:2: template raised: bad role",
              "raise_exception");
    check_err("x\n\n{% include 'other.jinja' %}", NULL, "t.jinja:3: unsupported tag: include",
              "unsupported tag");
    check_err("{{ x\n|wordwrap }}", NULL, "t.jinja:2: unsupported filter: wordwrap",
              "unsupported filter");
    check_err("{{ x is escaped }}", NULL, "t.jinja:1: unsupported test: escaped",
              "unsupported test");
    check_err("{% for x in y %}\n{{ x }}", NULL,
              "t.jinja:2: syntax error: unexpected end of template", "unclosed for");
    check_err("{% if %}", NULL, "t.jinja:1: syntax error", "if without a condition");
    check_err("{{ 'abc'.zfill(5) }}", NULL, "t.jinja:1: unsupported string method: zfill",
              "unsupported method");
    check_err("\n{{ messages[5].content }}", M2, "t.jinja:2: undefined value",
              "attribute of undefined");
    check_err("{{ 'a' + 1 }}", NULL,
              "t.jinja:1: unsupported operand type(s) for +: 'str' and 'int'", "type error");
    check_err("{{ [1].append(2) }}", NULL, "t.jinja:1: unsupported: list.append",
              "templates cannot mutate");
    check_err("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", NULL,
              "t.jinja:1: macro calls nested too deeply", "runaway recursion");
}

/* mc_chat_template_load on a tokenizer_config.json with a list of templates */
static void load_config(void)
{
    char path[] = "/tmp/mc_chat_cfg_XXXXXX.json";
    int fd = mkstemps(path, 5);
    const char *cfg =
        "{\"bos_token\": \"<s>\", \"chat_template\": [{\"name\": \"tool_use\", \"template\": "
        "\"T\"}, {\"name\": \"default\", \"template\": \"{{ messages|length }}\\n{{ x.y }}\"}]}";
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f) {
        fputs(cfg, f);
        fclose(f);
    }
    mc_chat_template *t = NULL;
    mc_error err = {0};
    mc_status st = mc_chat_template_load(path, &t, &err);
    TAP_OK(st == MC_OK, "tokenizer_config.json: the \"default\" template is loaded");
    json_t *msgs = json_loads(M2, 0, NULL);
    mc_chat_vars v = {.messages = msgs};
    char *out = NULL;
    size_t len;
    st = t ? mc_chat_template_render(t, &v, &out, &len, &err) : MC_ERR_FORMAT;
    char want[600];
    snprintf(want, sizeof want, "%s[chat_template]:2: undefined value x has no attribute 'y'",
             path);
    TAP_OK(st && !strcmp(err.msg, want), "errors name the config and the template's line: %s",
           err.msg);
    free(out);
    json_decref(msgs);
    mc_chat_template_free(t);
    remove(path);
}

/* Truncations and nesting of a real template: never a crash. */
static void robustness(void)
{
    const char *src =
        "{%- for m in messages %}{{- '<|' + m['role'] + '|>' + (m.content|trim) }}"
        "{%- if loop.last and add_generation_prompt %}{{ ns.x|default(1) }}{% endif %}"
        "{# c #}{%- endfor %}{{ [1, {'a': (2, 3)}][1]['a'][0] }}";
    size_t n = strlen(src);
    int fine = 1;
    for (size_t k = 0; k <= n; k++) {
        char *cut = strndup(src, k);
        char *out = render(cut, M2, 1, NULL);
        fine &= out != NULL;
        free(out);
        free(cut);
    }
    TAP_OK(fine, "every truncation of a template renders or fails cleanly");
    char deep[8000];
    size_t o = 0;
    for (int i = 0; i < 1000; i++) deep[o++] = '(';
    deep[o] = 0;
    static char src2[8100];
    snprintf(src2, sizeof src2, "{{ %s1 }}", deep);
    char *out = render(src2, NULL, 0, NULL);
    TAP_OK(!strncmp(out, "ERROR: t.jinja:1:", 17), "deep nesting is refused: %.60s", out);
    free(out);
    o = 0;
    for (int i = 0; i < 500; i++) o += (size_t)sprintf(deep + o, "{%% if 1 %%}");
    out = render(deep, NULL, 0, NULL);
    TAP_OK(!strncmp(out, "ERROR: t.jinja:1:", 17), "deeply nested tags are refused: %.60s", out);
    free(out);
}

/* Every golden case of tests/golden/chat_templates.json, byte for byte. */
static void golden(void)
{
    char path[4096];
    mc_error err = {0};
    json_t *templates, *convs, *gold;
    snprintf(path, sizeof path, "%s/tests/data/chat_templates/templates.json", top_srcdir());
    if (mc_json_load_file(path, &templates, &err)) {
        TAP_OK(0, "load %s: %s", path, err.msg);
        return;
    }
    snprintf(path, sizeof path, "%s/tests/data/chat_templates/conversations.json", top_srcdir());
    if (mc_json_load_file(path, &convs, &err)) {
        TAP_OK(0, "load %s: %s", path, err.msg);
        return;
    }
    snprintf(path, sizeof path, "%s/tests/golden/chat_templates.json", top_srcdir());
    if (mc_json_load_file(path, &gold, &err)) {
        TAP_OK(0, "load %s: %s", path, err.msg);
        return;
    }
    const json_t *cases = json_object_get(gold, "cases");
    const char *date = json_string_value(json_object_get(gold, "date_string"));
    size_t nt = json_array_size(templates);
    for (size_t ti = 0; ti < nt; ti++) {
        const json_t *tj = json_array_get(templates, ti);
        const char *file = json_string_value(json_object_get(tj, "file"));
        snprintf(path, sizeof path, "%s/tests/data/chat_templates/%s", top_srcdir(), file);
        mc_chat_template *t = NULL;
        mc_status st = mc_chat_template_load(path, &t, &err);
        TAP_OK(st == MC_OK, "parse %s%s%s", file, st ? ": " : "", st ? err.msg : "");
        if (st) continue;
        size_t n_ok = 0, n_cases = 0;
        for (size_t ci = 0; ci < json_array_size(cases); ci++) {
            const json_t *c = json_array_get(cases, ci);
            if (strcmp(json_string_value(json_object_get(c, "template")), file)) continue;
            const char *cname = json_string_value(json_object_get(c, "conversation"));
            const json_t *conv = NULL;
            for (size_t k = 0; k < json_array_size(convs); k++)
                if (!strcmp(json_string_value(json_object_get(json_array_get(convs, k), "name")),
                            cname))
                    conv = json_array_get(convs, k);
            json_t *extra = json_object();
            json_object_set_new(extra, "date_string", json_string(date));
            if (json_object_get(conv, "extra"))
                json_object_update(extra, json_object_get(conv, "extra"));
            mc_chat_vars v = {
                .messages = json_object_get(conv, "messages"),
                .tools = json_object_get(conv, "tools"),
                .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
                .bos_token = json_string_value(json_object_get(tj, "bos_token")),
                .eos_token = json_string_value(json_object_get(tj, "eos_token")),
                .extra = extra};
            char *out = NULL;
            size_t len = 0;
            st = mc_chat_template_render(t, &v, &out, &len, &err);
            const json_t *want = json_object_get(c, "output"),
                         *raised = json_object_get(c, "error");
            int ok;
            char why[600] = "";
            if (want) {
                ok = st == MC_OK && len == json_string_length(want) &&
                     !memcmp(out, json_string_value(want), len);
                if (!ok && st) snprintf(why, sizeof why, "error: %.500s", err.msg);
                if (!ok && !st) {
                    size_t at = 0, wl = json_string_length(want);
                    while (at < len && at < wl && out[at] == json_string_value(want)[at]) at++;
                    snprintf(why, sizeof why, "differs at byte %zu: got [%.60s] want [%.60s]", at,
                             out + at, json_string_value(want) + at);
                }
            } else if (raised) {
                const char *msg = json_string_value(raised),
                           *at = st ? strstr(err.msg, "template raised: ") : NULL;
                ok = at && !strcmp(at + 17, msg);
                if (!ok)
                    snprintf(why, sizeof why, "want raise \"%.200s\", got %.300s", msg,
                             st ? err.msg : "output");
            } else {
                ok = st != MC_OK && !strstr(err.msg, "template raised");
                if (!ok)
                    snprintf(why, sizeof why, "want a failure (%.200s), got %.300s",
                             json_string_value(json_object_get(c, "failure")),
                             st ? err.msg : "output");
            }
            n_cases++;
            n_ok += ok;
            if (!ok) TAP_DIAG("%s / %s / gen=%d: %s", file, cname, v.add_generation_prompt, why);
            free(out);
            json_decref(extra);
        }
        TAP_OK(n_cases && n_ok == n_cases, "%s: %zu/%zu golden cases byte for byte", file, n_ok,
               n_cases);
        mc_chat_template_free(t);
    }
    json_decref(templates);
    json_decref(convs);
    json_decref(gold);
}

int main(void)
{
    semantics();
    robustness();
    load_config();
    golden();
    return tap_done();
}
