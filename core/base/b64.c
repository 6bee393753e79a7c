/* b64.c — base64 encode and decode (b64.h). */
#include "base/b64.h"

#include <stdint.h>
#include <stdlib.h>

static const char b64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *cozy_base64_encode(const void *data, size_t len)
{
    const unsigned char *in = data;
    if(len > (SIZE_MAX - 1) / 4 * 3 - 2)
        return NULL;
    char *out = malloc(4 * ((len + 2) / 3) + 1), *o = out;
    if(!out)
        return NULL;
    for(size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if(i + 1 < len)
            v |= (uint32_t)in[i + 1] << 8;
        if(i + 2 < len)
            v |= (uint32_t)in[i + 2];
        *o++ = b64_alphabet[(v >> 18) & 63];
        *o++ = b64_alphabet[(v >> 12) & 63];
        *o++ = i + 1 < len ? b64_alphabet[(v >> 6) & 63] : '=';
        *o++ = i + 2 < len ? b64_alphabet[v & 63] : '=';
    }
    *o = 0;
    return out;
}

static int b64_value(unsigned char c)
{
    if(c >= 'A' && c <= 'Z')
        return c - 'A';
    if(c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if(c >= '0' && c <= '9')
        return c - '0' + 52;
    if(c == '+')
        return 62;
    if(c == '/')
        return 63;
    return -1;
}

int cozy_base64_decode(const char *s, size_t n, unsigned char **out, size_t *outlen)
{
    if(n == SIZE_MAX)
        return -2;
    unsigned char *t = malloc(n + 1), *o = NULL;
    size_t m = 0, k = 0, pad = 0;
    int rc = -1;
    if(!t)
        return -2;
    for(size_t i = 0; i < n; i++)
        if(s[i] != '\r' && s[i] != '\n')
            t[m++] = (unsigned char)s[i];
    if(m % 4 != 0)
        goto out;
    if(m >= 1 && t[m - 1] == '=')
        pad++;
    if(m >= 2 && t[m - 2] == '=')
        pad++;
    o = malloc(m / 4 * 3 + 1);
    if(!o) {
        rc = -2;
        goto out;
    }
    for(size_t i = 0; i < m; i += 4) {
        int v[4], quads = 4;
        if(i + 4 == m)
            quads = 4 - (int)pad;
        for(int j = 0; j < 4; j++) {
            v[j] = j < quads ? b64_value(t[i + j]) : 0;
            if(v[j] < 0 || (j >= quads && t[i + j] != '='))
                goto out;
        }
        o[k++] = (unsigned char)(v[0] << 2 | v[1] >> 4);
        if(quads > 2)
            o[k++] = (unsigned char)((v[1] & 15) << 4 | v[2] >> 2);
        if(quads > 3)
            o[k++] = (unsigned char)((v[2] & 3) << 6 | v[3]);
    }
    o[k] = 0;
    *out = o;
    *outlen = k;
    o = NULL;
    rc = 0;
out:
    free(o);
    free(t);
    return rc;
}
