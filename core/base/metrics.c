/* metrics.c — process-wide registry, Prometheus text format 0.0.4
 * (metrics.h). Few families, few series each: linear lookups under one mutex
 * cost less than the hashing they would save. */
#include "base/metrics.h"

#include "base/buf.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double METRICS_DEFAULT_BUCKETS[] = {
    .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10,
};
const size_t METRICS_DEFAULT_BUCKETS_LEN = sizeof METRICS_DEFAULT_BUCKETS / sizeof METRICS_DEFAULT_BUCKETS[0];

typedef enum metrics_type { METRICS_COUNTER, METRICS_GAUGE, METRICS_HISTOGRAM } metrics_type;

typedef struct metrics_series {
    char *labels;             /* "" for none */
    double value;             /* counter, gauge; histogram: sum */
    unsigned long long count; /* histogram: observations */
    unsigned long long *bins; /* histogram: per bucket (not cumulative), n_buckets */
    double (*read)(void *);   /* gauge: its value is read(read_ctx) when rendered (metrics_gauge_read) */
    void *read_ctx;
} metrics_series;

typedef struct metrics_family {
    char *name, *help;
    metrics_type type;
    double *buckets;
    size_t n_buckets;
    metrics_series *series;
    size_t n_series, cap_series;
} metrics_family;

static pthread_mutex_t metrics_lock = PTHREAD_MUTEX_INITIALIZER;
static metrics_family *metrics_families;
static size_t metrics_n, metrics_cap;

static const char *const metrics_type_names[] = { "counter", "gauge", "histogram" };

/* --- registry (callers hold metrics_lock) ------------------------------- */

static metrics_family *metrics_find(const char *name)
{
    for(size_t i = 0; i < metrics_n; i++)
        if(strcmp(metrics_families[i].name, name) == 0)
            return &metrics_families[i];
    return NULL;
}

static metrics_family *metrics_add_family(const char *name, metrics_type type, const char *help,
                                          const double *buckets, size_t n_buckets)
{
    metrics_family *f = metrics_find(name);
    if(f)
        return f;
    metrics_family *nf = cozy_grow(metrics_families, &metrics_cap, metrics_n + 1, sizeof *nf);
    if(!nf)
        return NULL;
    metrics_families = nf;
    f = &metrics_families[metrics_n];
    memset(f, 0, sizeof *f);
    f->name = strdup(name);
    f->help = strdup(help ? help : "");
    f->type = type;
    if(type == METRICS_HISTOGRAM) {
        f->buckets = malloc((n_buckets ? n_buckets : 1) * sizeof *f->buckets);
        if(f->buckets) {
            memcpy(f->buckets, buckets, n_buckets * sizeof *f->buckets);
            f->n_buckets = n_buckets;
        }
    }
    if(!f->name || !f->help || (type == METRICS_HISTOGRAM && !f->buckets)) {
        free(f->name);
        free(f->help);
        free(f->buckets);
        return NULL;
    }
    metrics_n++;
    return f;
}

static metrics_series *metrics_series_get(metrics_family *f, const char *labels)
{
    if(!labels)
        labels = "";
    for(size_t i = 0; i < f->n_series; i++)
        if(strcmp(f->series[i].labels, labels) == 0)
            return &f->series[i];
    metrics_series *ns = cozy_grow(f->series, &f->cap_series, f->n_series + 1, sizeof *ns);
    if(!ns)
        return NULL;
    f->series = ns;
    metrics_series *s = &f->series[f->n_series];
    memset(s, 0, sizeof *s);
    s->labels = strdup(labels);
    if(!s->labels)
        return NULL;
    if(f->type == METRICS_HISTOGRAM) {
        s->bins = calloc(f->n_buckets ? f->n_buckets : 1, sizeof *s->bins);
        if(!s->bins) {
            free(s->labels);
            return NULL;
        }
    }
    f->n_series++;
    return s;
}

static metrics_type metrics_type_parse(const char *type)
{
    if(type && strcmp(type, "gauge") == 0)
        return METRICS_GAUGE;
    if(type && strcmp(type, "histogram") == 0)
        return METRICS_HISTOGRAM;
    return METRICS_COUNTER;
}

/* --- public updates ------------------------------------------------------ */

void metrics_declare(const char *family, const char *type, const char *help)
{
    pthread_mutex_lock(&metrics_lock);
    metrics_add_family(family, metrics_type_parse(type), help, METRICS_DEFAULT_BUCKETS, METRICS_DEFAULT_BUCKETS_LEN);
    pthread_mutex_unlock(&metrics_lock);
}

void metrics_declare_histogram(const char *family, const char *help, const double *buckets, size_t n)
{
    pthread_mutex_lock(&metrics_lock);
    metrics_add_family(family, METRICS_HISTOGRAM, help, buckets, n);
    pthread_mutex_unlock(&metrics_lock);
}

void metrics_counter_add(const char *family, const char *labels, double v)
{
    if(!(v >= 0))
        return;
    pthread_mutex_lock(&metrics_lock);
    metrics_family *f = metrics_add_family(family, METRICS_COUNTER, "", NULL, 0);
    metrics_series *s = f && f->type != METRICS_HISTOGRAM ? metrics_series_get(f, labels) : NULL;
    if(s)
        s->value += v;
    pthread_mutex_unlock(&metrics_lock);
}

void metrics_gauge_set(const char *family, const char *labels, double v)
{
    pthread_mutex_lock(&metrics_lock);
    metrics_family *f = metrics_add_family(family, METRICS_GAUGE, "", NULL, 0);
    metrics_series *s = f && f->type != METRICS_HISTOGRAM ? metrics_series_get(f, labels) : NULL;
    if(s && !s->read)
        s->value = v;
    pthread_mutex_unlock(&metrics_lock);
}

void metrics_histogram_observe(const char *family, const char *labels, double seconds)
{
    pthread_mutex_lock(&metrics_lock);
    metrics_family *f = metrics_add_family(family, METRICS_HISTOGRAM, "", METRICS_DEFAULT_BUCKETS,
                                           METRICS_DEFAULT_BUCKETS_LEN);
    metrics_series *s = f && f->type == METRICS_HISTOGRAM ? metrics_series_get(f, labels) : NULL;
    if(s) {
        size_t i = 0;
        while(i < f->n_buckets && seconds > f->buckets[i]) /* le: value <= bound */
            i++;
        if(i < f->n_buckets)
            s->bins[i]++;
        s->count++;
        s->value += seconds;
    }
    pthread_mutex_unlock(&metrics_lock);
}

void metrics_gauge_read(const char *family, const char *labels, double (*read)(void *ctx), void *ctx)
{
    pthread_mutex_lock(&metrics_lock);
    metrics_family *f = metrics_add_family(family, METRICS_GAUGE, "", NULL, 0);
    metrics_series *s = f && f->type == METRICS_GAUGE ? metrics_series_get(f, labels) : NULL;
    if(s) {
        s->read = read;
        s->read_ctx = ctx;
    }
    pthread_mutex_unlock(&metrics_lock);
}

void metrics_gauge_unread(const char *family, const char *labels, void *ctx)
{
    if(!labels)
        labels = "";
    pthread_mutex_lock(&metrics_lock);
    metrics_family *f = metrics_find(family);
    for(size_t i = 0; f && i < f->n_series; i++) {
        metrics_series *s = &f->series[i];
        if(strcmp(s->labels, labels) == 0 && s->read && s->read_ctx == ctx) {
            s->value = s->read(ctx); /* the last value stays, as a set gauge's does */
            s->read = NULL;
            s->read_ctx = NULL;
        }
    }
    pthread_mutex_unlock(&metrics_lock);
}

/* A counter's or gauge's value (callers hold metrics_lock). */
static double metrics_series_value(const metrics_series *s)
{
    return s->read ? s->read(s->read_ctx) : s->value;
}

double metrics_value(const char *family, const char *labels)
{
    double v = 0;
    if(!labels)
        labels = "";
    pthread_mutex_lock(&metrics_lock);
    metrics_family *f = metrics_find(family);
    for(size_t i = 0; f && i < f->n_series; i++)
        if(strcmp(f->series[i].labels, labels) == 0) {
            v = f->type == METRICS_HISTOGRAM ? (double)f->series[i].count : metrics_series_value(&f->series[i]);
            break;
        }
    pthread_mutex_unlock(&metrics_lock);
    return v;
}

void metrics_family_clear(const char *family)
{
    pthread_mutex_lock(&metrics_lock);
    metrics_family *f = metrics_find(family);
    if(f) {
        for(size_t j = 0; j < f->n_series; j++) {
            free(f->series[j].labels);
            free(f->series[j].bins);
        }
        f->n_series = 0;
    }
    pthread_mutex_unlock(&metrics_lock);
}

void metrics_reset(void)
{
    pthread_mutex_lock(&metrics_lock);
    for(size_t i = 0; i < metrics_n; i++) {
        metrics_family *f = &metrics_families[i];
        for(size_t j = 0; j < f->n_series; j++) {
            free(f->series[j].labels);
            free(f->series[j].bins);
        }
        free(f->series);
        free(f->name);
        free(f->help);
        free(f->buckets);
    }
    free(metrics_families);
    metrics_families = NULL;
    metrics_n = metrics_cap = 0;
    pthread_mutex_unlock(&metrics_lock);
}

/* --- rendering ------------------------------------------------------------ */

typedef struct metrics_buf {
    cozy_buf b; /* no ceiling: the exposition grows with the series */
    int failed;
} metrics_buf;

static void metrics_putf(metrics_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void metrics_putf(metrics_buf *b, const char *fmt, ...)
{
    if(b->failed)
        return;
    va_list ap;
    va_start(ap, fmt);
    if(cozy_buf_vprintf(&b->b, fmt, ap) != 0)
        b->failed = 1;
    va_end(ap);
}

/* Shortest text that reads back as the same double; Prometheus spells the
   special values +Inf, -Inf and NaN. */
static const char *metrics_num(char out[40], double v)
{
    if(isnan(v))
        return "NaN";
    if(isinf(v))
        return v > 0 ? "+Inf" : "-Inf";
    snprintf(out, 40, "%.15g", v);
    if(strtod(out, NULL) != v)
        snprintf(out, 40, "%.17g", v);
    return out;
}

static void metrics_put_help(metrics_buf *b, const char *help)
{
    for(const char *c = help; *c; c++) {
        if(*c == '\\')
            metrics_putf(b, "\\\\");
        else if(*c == '\n')
            metrics_putf(b, "\\n");
        else
            metrics_putf(b, "%c", *c);
    }
}

char *metrics_render(void)
{
    metrics_buf b = { 0 };
    if(cozy_buf_add(&b.b, "", 0) != 0) /* "" when nothing is declared */
        return NULL;
    char n1[40], n2[40];
    pthread_mutex_lock(&metrics_lock);
    for(size_t i = 0; i < metrics_n; i++) {
        const metrics_family *f = &metrics_families[i];
        metrics_putf(&b, "# HELP %s ", f->name);
        metrics_put_help(&b, f->help);
        metrics_putf(&b, "\n# TYPE %s %s\n", f->name, metrics_type_names[f->type]);
        for(size_t j = 0; j < f->n_series; j++) {
            const metrics_series *s = &f->series[j];
            const char *l = s->labels;
            if(f->type != METRICS_HISTOGRAM) {
                double v = metrics_series_value(s);
                if(*l)
                    metrics_putf(&b, "%s{%s} %s\n", f->name, l, metrics_num(n1, v));
                else
                    metrics_putf(&b, "%s %s\n", f->name, metrics_num(n1, v));
                continue;
            }
            const char *sep = *l ? "," : "";
            unsigned long long cum = 0;
            for(size_t k = 0; k < f->n_buckets; k++) {
                cum += s->bins[k];
                metrics_putf(&b, "%s_bucket{%s%sle=\"%s\"} %llu\n", f->name, l, sep, metrics_num(n1, f->buckets[k]), cum);
            }
            metrics_putf(&b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", f->name, l, sep, s->count);
            if(*l) {
                metrics_putf(&b, "%s_sum{%s} %s\n", f->name, l, metrics_num(n2, s->value));
                metrics_putf(&b, "%s_count{%s} %llu\n", f->name, l, s->count);
            } else {
                metrics_putf(&b, "%s_sum %s\n", f->name, metrics_num(n2, s->value));
                metrics_putf(&b, "%s_count %llu\n", f->name, s->count);
            }
        }
    }
    pthread_mutex_unlock(&metrics_lock);
    if(b.failed) {
        cozy_buf_free(&b.b);
        return NULL;
    }
    return b.b.p;
}

char *metrics_escape(const char *value)
{
    size_t n = 0;
    for(const char *c = value; *c; c++)
        n += (*c == '\\' || *c == '"' || *c == '\n') ? 2 : 1;
    char *out = malloc(n + 1), *o = out;
    if(!out)
        return NULL;
    for(const char *c = value; *c; c++) {
        if(*c == '\\' || *c == '"') {
            *o++ = '\\';
            *o++ = *c;
        } else if(*c == '\n') {
            *o++ = '\\';
            *o++ = 'n';
        } else {
            *o++ = *c;
        }
    }
    *o = '\0';
    return out;
}
