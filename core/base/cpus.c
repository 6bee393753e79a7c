/* cpus.c — the CPUs this process may use (cpus.h): the affinity mask,
 * lowered to the cgroup v2 CPU quota. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "base/cpus.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cozy_cpus_of_quota(const char *cpu_max)
{
    char *end;
    if(!cpu_max || strncmp(cpu_max, "max", 3) == 0)
        return 0;
    long long quota = strtoll(cpu_max, &end, 10);
    if(end == cpu_max || *end != ' ' || quota <= 0)
        return 0;
    const char *p = end + 1;
    long long period = strtoll(p, &end, 10);
    if(end == p || period <= 0 || (*end && *end != '\n'))
        return 0;
    long long n = (quota + period - 1) / period;
    return n > 4096 ? 4096 : (int)n;
}

/* cpu.max under `dir`, its quota in CPUs (0: none or unreadable). */
static int quota_at(const char *dir)
{
    char path[4096], text[128];
    if(snprintf(path, sizeof path, "%s/cpu.max", dir) >= (int)sizeof path)
        return 0;
    FILE *f = fopen(path, "r");
    if(!f)
        return 0;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    return cozy_cpus_of_quota(text);
}

int cozy_cpus_available(const char *cgroup_root)
{
    const char *root = cgroup_root ? cgroup_root : "/sys/fs/cgroup";
    int n = 1;
    cpu_set_t set;
    if(sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        n = CPU_COUNT(&set);
    int quota = 0;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if(f) {
        char line[4096];
        while(fgets(line, sizeof line, f))
            if(strncmp(line, "0::", 3) == 0) {
                line[strcspn(line, "\n")] = 0;
                char dir[8192];
                snprintf(dir, sizeof dir, "%s%s", root, line + 3);
                quota = quota_at(dir);
                break;
            }
        fclose(f);
    }
    if(!quota)
        quota = quota_at(root);
    if(quota > 0 && quota < n)
        n = quota;
    return n < 1 ? 1 : n;
}
