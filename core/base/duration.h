/* duration.h — parsing the durations operators write in flags.
 */
#ifndef COZYGPU_DURATION_H
#define COZYGPU_DURATION_H

/* Parses a duration the way Go's time.ParseDuration does for the units
 * kubectl users type ("300ms", "15s", "2m", "1h", "1m30s"; a bare number
 * is seconds; no sign, exponent or other unit). Returns 0 and milliseconds
 * (rounded) in *ms, or -1 and leaves *ms untouched. Source: Go's
 * time.ParseDuration, which kubectl's --timeout/--request-timeout use. */
int cozy_parse_duration(const char *s, long *ms);

#endif
