/* metrics.h — the process-wide metrics registry and its Prometheus text
 * exposition (format 0.0.4, the one every Prometheus server scrapes:
 * https://prometheus.io/docs/instrumenting/exposition_formats/).
 *
 * A family (`cozygpu_admission_reviews_total`) has a type, a help line and
 * any number of series, one per label set. Label sets travel preformatted,
 * as they appear between the braces: `webhook="vmi",decision="allowed"`
 * (values escaped with metrics_escape). Series appear in the order they were
 * first touched; families in the order they were declared.
 *
 * Thread safety: every function may be called from any thread at any time;
 * one mutex guards the registry (updates are a lookup and an add). A gauge
 * that changes on every request is better read when scraped
 * (metrics_gauge_read) than set on every change.
 *
 * Histograms are cumulative on render (`_bucket{le=...}` counts include every
 * smaller bucket, then `le="+Inf"`, `_sum`, `_count`), as the format says.
 */
#ifndef COZYGPU_METRICS_H
#define COZYGPU_METRICS_H

#include <stddef.h>

/* Buckets used by metrics_declare(..., "histogram", ...), in seconds:
 * .0005 .001 .002 .005 .01 .025 .05 .1 .25 .5 1 2.5 5 10 — fine enough below
 * the 2 ms target and up to the API server's 10 s webhook timeout. */
extern const double METRICS_DEFAULT_BUCKETS[];
extern const size_t METRICS_DEFAULT_BUCKETS_LEN;

/* Declares a family. `type` is "counter", "gauge" or "histogram"; `help` is
 * one line of text (escaped on render). Declaring an existing family again
 * is a no-op (the first declaration wins), so modules may declare what they
 * use at start without coordinating. Strings are copied. */
void metrics_declare(const char *family, const char *type, const char *help);

/* As metrics_declare(family, "histogram", help) with the given upper bounds
 * (seconds, strictly increasing, `n` of them, +Inf implied). */
void metrics_declare_histogram(const char *family, const char *help, const double *buckets, size_t n);

/* Adds `v` (>= 0; negative values are ignored, counters only go up) to the
 * series `labels` (NULL or "" for none) of counter `family`. A family not
 * declared yet is declared as a counter with an empty help line. */
void metrics_counter_add(const char *family, const char *labels, double v);

/* Sets gauge series `labels` of `family` to `v` (declared on first use, as
 * above). */
void metrics_gauge_set(const char *family, const char *labels, double v);

/* Makes gauge series `labels` of `family` (declared on first use) read its
 * value when it is rendered or asked for (metrics_value): `read(ctx)`,
 * called with the registry's lock held, so it must be quick and must not
 * call into metrics. For a value that changes on a hot path (a queue's
 * length, bytes in flight): nothing to do per change, one lock fewer per
 * change, and the value shown is never stale. metrics_gauge_set is then
 * ignored for the series. A second call replaces the first. */
void metrics_gauge_read(const char *family, const char *labels, double (*read)(void *ctx), void *ctx);
/* Ends metrics_gauge_read for the series if `ctx` is the one it reads: its
 * last value is kept, as a set gauge's is. Once this returns, `read` is not
 * called with `ctx` again, so `ctx` may be freed. */
void metrics_gauge_unread(const char *family, const char *labels, void *ctx);
/* Records one observation of `seconds` in histogram series `labels` of
 * `family` (declared on first use with the default buckets). */
void metrics_histogram_observe(const char *family, const char *labels, double seconds);

/* Current value of a counter or gauge series, or the observation count of a
 * histogram series; 0 when absent. For tests and for readiness logic. */
double metrics_value(const char *family, const char *labels);

/* Escapes a label value for the exposition format (backslash, double quote
 * and newline become \\, \" and \n). Returns a malloc'd string the caller
 * frees, or NULL when out of memory. */
char *metrics_escape(const char *value);

/* Renders every family in the text format 0.0.4. Returns a malloc'd,
 * NUL-terminated string (caller frees), or NULL when out of memory. Serve it
 * as `text/plain; version=0.0.4; charset=utf-8`. */
char *metrics_render(void);

/* Drops every series of `family` (it stays declared and renders its help
 * and type with no sample): for gauges about things that went away, e.g.
 * a deleted GPUClass, or every class once this replica stops leading.
 * Unknown family: no-op. */
void metrics_family_clear(const char *family);

/* Forgets every family and series, freeing the registry (for tests and for a
 * clean exit under LeakSanitizer). */
void metrics_reset(void);

#endif
