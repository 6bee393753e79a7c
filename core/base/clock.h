/* clock.h — the times the controller's loops and objects use, written once.
 *
 * Monotonic milliseconds for deadlines and gaps (CLOCK_MONOTONIC: never
 * jumps with the wall clock), and RFC 3339 UTC timestamps with whole
 * seconds, the form kube-apiserver writes metadata.creationTimestamp and
 * a condition's lastTransitionTime in (k8s.io/apimachinery metav1.Time
 * marshals as time.RFC3339, "2026-12-01T13:23:52Z").
 */
#ifndef COZYGPU_BASE_CLOCK_H
#define COZYGPU_BASE_CLOCK_H

#include <stddef.h>
#include <time.h>

/* Milliseconds of CLOCK_MONOTONIC. */
long long clock_mono_ms(void);

/* `t` (seconds since the epoch) as "YYYY-MM-DDTHH:MM:SSZ" into buf (n >= 21
 * bytes; cut to fit otherwise). Returns buf. */
char *clock_rfc3339(time_t t, char *buf, size_t n);

/* clock_rfc3339 of now. */
char *clock_rfc3339_now(char *buf, size_t n);

/* Seconds (with fractions, >= 0) from an RFC 3339 UTC timestamp with whole
 * seconds ("...Z", as above) to now by the wall clock; -1 when `ts` is NULL
 * or not of that form. A time in the future gives 0. */
double clock_seconds_since(const char *ts);

#endif
