/*
 * strmap.c - the byte-string -> int32 hash map the tokenizers use for their
 * vocabularies (token bytes -> id, spelling -> id), and the byte hash shared
 * with the BPE piece cache.
 *
 * Open addressing with linear probing over a power-of-two slot array that
 * holds entry indices; keys live in one pool, so a 200k-token vocabulary is
 * three allocations, not 200k.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* A multiply-xorshift hash over 8-byte words: tokens are short, so what
 * matters is few operations per call, not the quality of a cryptographic
 * hash. */
uint64_t mc_hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, s, n);
        h = (h ^ w) * 0x94d049bb133111ebull;
        h ^= h >> 29;
    }
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

void mc_strmap_free(mc_strmap *m)
{
    free(m->slots);
    free(m->ents);
    mc_buf_free(&m->pool);
    memset(m, 0, sizeof *m);
}

static int32_t find(const mc_strmap *m, const void *key, size_t len, uint64_t h, size_t *slot)
{
    size_t i = h & m->mask;
    for (;;) {
        uint32_t e = m->slots[i];
        if (!e) {
            *slot = i;
            return -1;
        }
        const struct mc_strmap_entry *en = &m->ents[e - 1];
        if (en->hash == h && en->len == len && !memcmp(m->pool.data + en->off, key, len)) {
            *slot = i;
            return (int32_t)(e - 1);
        }
        i = (i + 1) & m->mask;
    }
}

static mc_status grow(mc_strmap *m, mc_error *err)
{
    size_t nslots = m->slots ? (m->mask + 1) * 2 : 64;
    uint32_t *slots = calloc(nslots, sizeof *slots);
    if (!slots) return mc_error_set(err, MC_ERR_NOMEM, "hash map: out of memory");
    free(m->slots);
    m->slots = slots;
    m->mask = nslots - 1;
    for (size_t e = 0; e < m->n; e++) {
        size_t i = m->ents[e].hash & m->mask;
        while (slots[i]) i = (i + 1) & m->mask;
        slots[i] = (uint32_t)(e + 1);
    }
    return MC_OK;
}

mc_status mc_strmap_put(mc_strmap *m, const void *key, size_t len, int32_t val, mc_error *err)
{
    if (!m->slots || (m->n + 1) * 2 > m->mask + 1) {
        mc_status st = grow(m, err);
        if (st != MC_OK) return st;
    }
    uint64_t h = mc_hash_bytes(key, len);
    size_t slot;
    int32_t e = find(m, key, len, h, &slot);
    if (e >= 0) {
        m->ents[e].val = val;
        return MC_OK;
    }
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 256;
        void *p = realloc(m->ents, cap * sizeof *m->ents);
        if (!p) return mc_error_set(err, MC_ERR_NOMEM, "hash map: out of memory");
        m->ents = p;
        m->cap = cap;
    }
    if (m->pool.len + len > UINT32_MAX)
        return mc_error_set(err, MC_ERR_LIMIT, "hash map: keys exceed 4 GiB");
    uint32_t off = (uint32_t)m->pool.len;
    mc_status st = mc_buf_append(&m->pool, key, len, err);
    if (st != MC_OK) return st;
    m->ents[m->n] = (struct mc_strmap_entry){h, off, (uint32_t)len, val};
    m->slots[slot] = (uint32_t)(++m->n);
    return MC_OK;
}

int32_t mc_strmap_get(const mc_strmap *m, const void *key, size_t len)
{
    if (!m->slots) return -1;
    size_t slot;
    int32_t e = find(m, key, len, mc_hash_bytes(key, len), &slot);
    return e < 0 ? -1 : m->ents[e].val;
}
