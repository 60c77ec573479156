/*
 * bytelevel.c - GPT-2's byte <-> unicode map (HF's ByteLevel, "bytes_to_unicode").
 *
 * Byte-level BPE spells every byte as a printable character so that
 * vocabularies can be stored as JSON strings: the bytes '!'..'~', 0xA1..0xAC
 * and 0xAE..0xFF stand for themselves (as code points), and the other 68
 * bytes, in increasing order, for U+0100, U+0101, ... (so ' ' is 'Ġ' U+0120).
 * The map is computed, not tabled: it is a few comparisons per byte and is
 * used only when loading vocabularies and in tests.
 */
#include "tok_internal.h"

static int stands_for_itself(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

/* The code point that stands for byte b. The 68 bytes that do not stand for
 * themselves are 0x00..0x20 (33), 0x7F..0xA0 (34) and 0xAD, in that order. */
static unsigned byte_to_cp(unsigned b)
{
    if (stands_for_itself(b)) return b;
    if (b <= 0x20) return 256 + b;
    if (b <= 0xA0) return 256 + 33 + (b - 0x7F);
    return 256 + 67; /* 0xAD */
}

size_t mc_bytelevel_encode_byte(unsigned b, char out[2])
{
    unsigned cp = byte_to_cp(b & 0xFF);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* The byte a code point stands for, or -1. */
static int cp_to_byte(unsigned cp)
{
    if (cp < 256) return stands_for_itself(cp) ? (int)cp : -1;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(cp - 256 - 33 + 0x7F);
    if (cp == 256 + 67) return 0xAD;
    return -1;
}

int mc_bytelevel_decode(const char *str, size_t len, mc_buf *out)
{
    /* All mapped code points are below U+0800: one or two UTF-8 bytes. */
    const unsigned char *s = (const unsigned char *)str;
    size_t start = out->len;
    for (size_t i = 0; i < len;) {
        unsigned cp;
        if (s[i] < 0x80) {
            cp = s[i++];
        } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < len && (s[i + 1] & 0xC0) == 0x80) {
            cp = ((s[i] & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
            i += 2;
        } else
            goto fail;
        int b = cp_to_byte(cp);
        if (b < 0) goto fail;
        char c = (char)b;
        if (mc_buf_append(out, &c, 1, NULL) != MC_OK) goto fail;
    }
    return 1;
fail:
    out->len = start;
    return 0;
}
