/* log.c — structured logs (see log.h). */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int log_json;
static log_level log_min = LOG_INFO;

static const char *const LEVEL_NAME[] = {"debug", "info", "warn", "error"};
static const char *const LEVEL_TEXT[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};

void log_setup(int json, log_level min)
{
    log_json = json;
    log_min = min;
}

int log_level_parse(const char *name, log_level *out)
{
    for(int i = 0; i < 4; i++)
        if(name && strcmp(name, LEVEL_NAME[i]) == 0) {
            *out = (log_level)i;
            return 0;
        }
    return -1;
}

/* A bounded line buffer; a record longer than it is cut with "...". */
typedef struct line {
    char buf[8192];
    size_t len;
} line;

static void put(line *l, const char *s, size_t n)
{
    if(l->len + n > sizeof(l->buf) - 5)
        n = sizeof(l->buf) - 5 > l->len ? sizeof(l->buf) - 5 - l->len : 0;
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void puts_(line *l, const char *s) { put(l, s, strlen(s)); }

/* JSON string body escaping (RFC 8259 §7). */
static void put_json(line *l, const char *s)
{
    put(l, "\"", 1);
    for(const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        switch(*p) {
        case '"': puts_(l, "\\\""); break;
        case '\\': puts_(l, "\\\\"); break;
        case '\n': puts_(l, "\\n"); break;
        case '\r': puts_(l, "\\r"); break;
        case '\t': puts_(l, "\\t"); break;
        default:
            if(*p < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                puts_(l, esc);
            } else
                put(l, (const char *)p, 1);
        }
    }
    put(l, "\"", 1);
}

/* Whether s is a JSON number (RFC 8259 §6):
 * -? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)? */
static int is_json_number(const char *s)
{
    const char *p = s;
    if(*p == '-')
        p++;
    if(*p == '0')
        p++;
    else if(*p >= '1' && *p <= '9')
        while(*p >= '0' && *p <= '9')
            p++;
    else
        return 0;
    if(*p == '.') {
        p++;
        if(!(*p >= '0' && *p <= '9'))
            return 0;
        while(*p >= '0' && *p <= '9')
            p++;
    }
    if(*p == 'e' || *p == 'E') {
        p++;
        if(*p == '+' || *p == '-')
            p++;
        if(!(*p >= '0' && *p <= '9'))
            return 0;
        while(*p >= '0' && *p <= '9')
            p++;
    }
    return *p == '\0';
}

/* A key marked LOG_NUM: the key without its mark, and *num set. */
static const char *key_name(const char *k, int *num)
{
    *num = k[0] == LOG_NUM[0];
    return *num ? k + 1 : k;
}

/* Text values: bare when plain, else JSON-quoted so they stay one token. */
static void put_text_value(line *l, const char *s)
{
    if(!s) {
        puts_(l, "-");
        return;
    }
    int plain = *s != 0;
    for(const char *p = s; *p; p++)
        if(*p == ' ' || *p == '"' || *p == '=' || (unsigned char)*p < 0x20)
            plain = 0;
    if(plain)
        puts_(l, s);
    else
        put_json(l, s);
}

void log_write(log_level lvl, const char *component, const char *msg, ...)
{
    if(lvl < log_min || lvl > LOG_ERROR)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char stamp[96];
    snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    line l = {.len = 0};
    va_list ap;
    va_start(ap, msg);
    if(log_json) {
        puts_(&l, "{\"ts\":\"");
        puts_(&l, stamp);
        puts_(&l, "\",\"level\":\"");
        puts_(&l, LEVEL_NAME[lvl]);
        puts_(&l, "\",\"component\":");
        put_json(&l, component ? component : "");
        puts_(&l, ",\"msg\":");
        put_json(&l, msg ? msg : "");
        const char *k;
        while((k = va_arg(ap, const char *)) != NULL) {
            const char *v = va_arg(ap, const char *);
            int num;
            k = key_name(k, &num);
            put(&l, ",", 1);
            put_json(&l, k);
            put(&l, ":", 1);
            if(!v)
                puts_(&l, "null");
            else if(num && is_json_number(v))
                puts_(&l, v);
            else
                put_json(&l, v);
        }
        puts_(&l, "}");
    } else {
        puts_(&l, stamp);
        put(&l, " ", 1);
        puts_(&l, LEVEL_TEXT[lvl]);
        put(&l, " ", 1);
        puts_(&l, component ? component : "");
        puts_(&l, ": ");
        puts_(&l, msg ? msg : "");
        const char *k;
        while((k = va_arg(ap, const char *)) != NULL) {
            const char *v = va_arg(ap, const char *);
            int num;
            k = key_name(k, &num);
            put(&l, " ", 1);
            puts_(&l, k);
            put(&l, "=", 1);
            put_text_value(&l, v);
        }
    }
    va_end(ap);
    if(l.len >= sizeof(l.buf) - 5) {
        /* cut: keep the line one record (JSON readers skip it as invalid,
         * which is better than a torn line) */
        memcpy(l.buf + l.len, "...", 3);
        l.len += 3;
    }
    l.buf[l.len++] = '\n';
    /* one write(2): records from different threads never interleave */
    ssize_t w = write(STDERR_FILENO, l.buf, l.len);
    (void)w;
}
