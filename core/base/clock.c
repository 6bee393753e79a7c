/* clock.c — monotonic milliseconds and RFC 3339 timestamps (clock.h). */
#include "base/clock.h"

#include <stdio.h>

long long clock_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

char *clock_rfc3339(time_t t, char *buf, size_t n)
{
    struct tm tm;
    if(n == 0)
        return buf;
    if(!gmtime_r(&t, &tm) || strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        buf[0] = 0;
    return buf;
}

char *clock_rfc3339_now(char *buf, size_t n)
{
    return clock_rfc3339(time(NULL), buf, n);
}

double clock_seconds_since(const char *ts)
{
    struct tm tm = {0};
    const char *end = ts ? strptime(ts, "%Y-%m-%dT%H:%M:%SZ", &tm) : NULL;
    if(!end || *end)
        return -1;
    time_t t = timegm(&tm);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    double d = (double)(now.tv_sec - t) + (double)now.tv_nsec / 1e9;
    return d < 0 ? 0 : d;
}
