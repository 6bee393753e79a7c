/* duration.c — durations as kubectl users type them (duration.h). */
#include "base/duration.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

int cozy_parse_duration(const char *s, long *ms)
{
    if(!s || !*s)
        return -1;
    char *end;
    double total = 0;
    const char *p = s;
    int any = 0;
    while(*p) {
        /* digits and a point only: no sign, hex, exponent, inf or nan */
        if(!((*p >= '0' && *p <= '9') || *p == '.'))
            return -1;
        errno = 0;
        double v = strtod(p, &end);
        for(const char *q = p; q < end; q++)
            if(!((*q >= '0' && *q <= '9') || *q == '.'))
                return -1;
        if(end == p || errno || v < 0)
            return -1;
        p = end;
        double unit;
        if(strncmp(p, "ms", 2) == 0)
            unit = 1, p += 2;
        else if(*p == 's')
            unit = 1000, p++;
        else if(*p == 'm')
            unit = 60000, p++;
        else if(*p == 'h')
            unit = 3600000, p++;
        else if(*p == 0 && !any)
            unit = 1000; /* a bare number: seconds */
        else
            return -1;
        total += v * unit;
        any = 1;
    }
    if(total > (double)LONG_MAX / 2)
        return -1;
    *ms = (long)(total + 0.5);
    return 0;
}
