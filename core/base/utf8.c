/* utf8.c — UTF-8 checks (utf8.h). */
#include "base/utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t cozy_utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0], cp, min;
    size_t len;
    if(c < 0x80)
        return 1;
    if(c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
        min = 0x80;
    } else if(c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
        min = 0x800;
    } else if(c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
        min = 0x10000;
    } else
        return 0;
    if(n < len)
        return 0;
    for(size_t i = 1; i < len; i++) {
        if((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if(cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

int cozy_utf8_valid(const void *data, size_t n)
{
    const unsigned char *s = data;
    for(size_t i = 0; i < n;) {
        if(s[i] < 0x80) {
            i++;
            continue;
        }
        size_t l = cozy_utf8_seq(s + i, n - i);
        if(!l)
            return 0;
        i += l;
    }
    return 1;
}

char *cozy_utf8_sanitize(const void *data, size_t n, int keep_nul, size_t *outlen)
{
    const unsigned char *s = data;
    if(n > (SIZE_MAX - 1) / 3)
        return NULL;
    char *o = malloc(n * 3 + 1);
    if(!o)
        return NULL;
    size_t k = 0;
    for(size_t i = 0; i < n;) {
        size_t l = cozy_utf8_seq(s + i, n - i);
        if(l == 0 || (!keep_nul && s[i] == 0)) {
            memcpy(o + k, "\xef\xbf\xbd", 3); /* U+FFFD */
            k += 3;
            i++;
        } else {
            memcpy(o + k, s + i, l);
            k += l;
            i += l;
        }
    }
    o[k] = 0;
    *outlen = k;
    return o;
}
