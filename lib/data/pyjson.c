/*
 * pyjson.c - JSON text exactly as CPython's json.dumps(obj, indent=4) writes
 * it, and numpy's float64 sum. Megatron names its cached dataset indices by
 * the MD5 of such a text (the dataset's "unique description"), so mc must
 * produce the same bytes to share a cache directory with Megatron: the same
 * indentation, ", " never (indent mode puts one item per line), ": " after
 * keys, ASCII-only strings (ensure_ascii), and floats in repr() form
 * (shortest digits that round-trip; exponent form below 1e-4 or from 1e16).
 */
#include "gpt_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mc_py_float_repr(double x, char out[32])
{
    if (isnan(x)) {
        strcpy(out, "NaN");
        return;
    }
    if (isinf(x)) {
        strcpy(out, x > 0 ? "Infinity" : "-Infinity");
        return;
    }
    if (x == 0) {
        strcpy(out, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    char e[40], digits[24];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e = [-]D[.DDD]e[+-]XX */
    const char *p = e;
    int neg = 0, nd = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp10 = atoi(p + 1);
    char *o = out;
    if (neg) *o++ = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 >= 0) {
            for (int i = 0; i <= exp10; i++) *o++ = i < nd ? digits[i] : '0';
            *o++ = '.';
            if (nd > exp10 + 1)
                for (int i = exp10 + 1; i < nd; i++) *o++ = digits[i];
            else
                *o++ = '0';
        } else {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -exp10 - 1; i++) *o++ = '0';
            for (int i = 0; i < nd; i++) *o++ = digits[i];
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++) *o++ = digits[i];
        }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    }
}

static mc_status dump_string(mc_buf *out, const char *s, size_t n, mc_error *err)
{
    mc_status st = mc_buf_append(out, "\"", 1, err);
    for (size_t i = 0; i < n && st == MC_OK;) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp;
        size_t k;
        if (c < 0x80) {
            cp = c;
            k = 1;
        } else if ((c & 0xe0) == 0xc0) {
            cp = c & 0x1f;
            k = 2;
        } else if ((c & 0xf0) == 0xe0) {
            cp = c & 0x0f;
            k = 3;
        } else {
            cp = c & 0x07;
            k = 4;
        }
        for (size_t j = 1; j < k && i + j < n; j++) cp = cp << 6 | ((unsigned char)s[i + j] & 0x3f);
        i += k;
        switch (cp) {
        case '"': st = mc_buf_append(out, "\\\"", 2, err); continue;
        case '\\': st = mc_buf_append(out, "\\\\", 2, err); continue;
        case '\n': st = mc_buf_append(out, "\\n", 2, err); continue;
        case '\r': st = mc_buf_append(out, "\\r", 2, err); continue;
        case '\t': st = mc_buf_append(out, "\\t", 2, err); continue;
        case '\b': st = mc_buf_append(out, "\\b", 2, err); continue;
        case '\f': st = mc_buf_append(out, "\\f", 2, err); continue;
        default: break;
        }
        if (cp >= 0x20 && cp < 0x7f) {
            char ch = (char)cp;
            st = mc_buf_append(out, &ch, 1, err);
        } else if (cp < 0x10000) {
            st = mc_buf_printf(out, err, "\\u%04x", cp);
        } else {
            /* a UTF-16 surrogate pair, as ensure_ascii writes it */
            cp -= 0x10000;
            st = mc_buf_printf(out, err, "\\u%04x\\u%04x", 0xd800 + (cp >> 10),
                               0xdc00 + (cp & 0x3ff));
        }
    }
    if (st == MC_OK) st = mc_buf_append(out, "\"", 1, err);
    return st;
}

static mc_status newline_indent(mc_buf *out, int depth, mc_error *err)
{
    mc_status st = mc_buf_append(out, "\n", 1, err);
    for (int i = 0; i < depth && st == MC_OK; i++) st = mc_buf_append(out, "    ", 4, err);
    return st;
}

mc_status mc_pyjson_dump(mc_buf *out, const json_t *v, int depth, mc_error *err)
{
    mc_status st = MC_OK;
    char num[32];
    switch (json_typeof(v)) {
    case JSON_NULL: return mc_buf_append(out, "null", 4, err);
    case JSON_TRUE: return mc_buf_append(out, "true", 4, err);
    case JSON_FALSE: return mc_buf_append(out, "false", 5, err);
    case JSON_INTEGER: return mc_buf_printf(out, err, "%lld", (long long)json_integer_value(v));
    case JSON_REAL:
        mc_py_float_repr(json_real_value(v), num);
        return mc_buf_append(out, num, strlen(num), err);
    case JSON_STRING: return dump_string(out, json_string_value(v), json_string_length(v), err);
    case JSON_ARRAY: {
        size_t n = json_array_size(v);
        if (n == 0) return mc_buf_append(out, "[]", 2, err);
        st = mc_buf_append(out, "[", 1, err);
        for (size_t i = 0; i < n && st == MC_OK; i++) {
            if (i) st = mc_buf_append(out, ",", 1, err);
            if (st == MC_OK) st = newline_indent(out, depth + 1, err);
            if (st == MC_OK) st = mc_pyjson_dump(out, json_array_get(v, i), depth + 1, err);
        }
        if (st == MC_OK) st = newline_indent(out, depth, err);
        return st == MC_OK ? mc_buf_append(out, "]", 1, err) : st;
    }
    case JSON_OBJECT: {
        if (json_object_size(v) == 0) return mc_buf_append(out, "{}", 2, err);
        st = mc_buf_append(out, "{", 1, err);
        int first = 1;
        /* jansson keeps insertion order, as Python's dict and OrderedDict do */
        for (void *it = json_object_iter((json_t *)v); it && st == MC_OK;
             it = json_object_iter_next((json_t *)v, it)) {
            const char *key = json_object_iter_key(it);
            if (!first) st = mc_buf_append(out, ",", 1, err);
            first = 0;
            if (st == MC_OK) st = newline_indent(out, depth + 1, err);
            if (st == MC_OK) st = dump_string(out, key, strlen(key), err);
            if (st == MC_OK) st = mc_buf_append(out, ": ", 2, err);
            if (st == MC_OK) st = mc_pyjson_dump(out, json_object_iter_value(it), depth + 1, err);
        }
        if (st == MC_OK) st = newline_indent(out, depth, err);
        return st == MC_OK ? mc_buf_append(out, "}", 1, err) : st;
    }
    }
    return mc_error_set(err, MC_ERR_INTERNAL, "pyjson: unknown JSON type");
}

/* numpy's pairwise_sum for float64 (numpy/_core/src/umath/loops_utils.h):
 * under 8 elements a plain loop; up to 128, eight interleaved accumulators
 * combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) plus the tail; above,
 * split at a multiple of 8 near the middle. Bit-exact with numpy.sum. */
double mc_np_sum(const double *a, size_t n)
{
    if (n < 8) {
        double res = 0.;
        for (size_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8], res;
        size_t i;
        for (int k = 0; k < 8; k++) r[k] = a[k];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int k = 0; k < 8; k++) r[k] += a[i + k];
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    size_t n2 = n / 2;
    n2 -= n2 % 8;
    return mc_np_sum(a, n2) + mc_np_sum(a + n2, n - n2);
}
