/*
 * fuzz_chat_template.c - chat templates (mc/chat.h): the input is a Jinja
 * template, parsed and rendered over a fixed conversation (system, user,
 * assistant with a tool call, tool) with and without tools and the
 * generation prompt, as mc-preprocess --chat-template and mc-serve do.
 */
#include "fuzz.h"
#include "mc/chat.h"

static const char MESSAGES[] =
    "[{\"role\":\"system\",\"content\":\"You are terse.\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi <b>\"}]},"
    "{\"role\":\"assistant\",\"content\":\"Hello!\",\"reasoning_content\":\"greet\","
    "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1}}}]"
    "},"
    "{\"role\":\"tool\",\"content\":\"42\"},"
    "{\"role\":\"user\",\"content\":\"Thanks\"}]";
static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}}}]";

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    static json_t *messages, *tools, *extra;
    if (!messages) {
        messages = json_loads(MESSAGES, 0, NULL);
        tools = json_loads(TOOLS, 0, NULL);
        extra = json_pack("{s:b, s:s}", "enable_thinking", 1, "date_string", "26 Jul 2024");
        if (!messages || !tools || !extra) abort();
    }
    mc_chat_template *t = NULL;
    mc_error err = {0};
    if (mc_chat_template_parse("fuzz.jinja", (const char *)d, n, &t, &err) != MC_OK) return 0;
    for (int k = 0; k < 2; k++) {
        mc_chat_vars v = {messages, k ? tools : NULL,  k,
                          "<s>",    k ? "</s>" : NULL, k ? extra : NULL};
        char *out = NULL;
        size_t len = 0;
        mc_chat_span *spans = NULL;
        size_t ns = 0;
        if (mc_chat_template_render_spans(t, &v, &out, &len, &spans, &ns, &err) == MC_OK) {
            free(out);
            free(spans);
        }
    }
    mc_chat_template_free(t);
    return 0;
}
