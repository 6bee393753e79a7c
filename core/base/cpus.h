/* cpus.h — how many CPUs this process may use, for thread counts that
 * follow the machine or the container instead of a fixed number.
 *
 * The count is the CPU affinity mask's (sched_getaffinity(2): what the
 * scheduler will run the process on, cpusets and `taskset` included),
 * lowered to the cgroup v2 CPU quota when one is set: cpu.max holds
 * "QUOTA PERIOD" in microseconds, or "max PERIOD" for none (Linux
 * Documentation/admin-guide/cgroup-v2.rst, "cpu.max"), and a Kubernetes
 * container's CPU limit is written there (limit x period: 1500m gives
 * "150000 100000"). A fractional quota rounds up: 1.5 CPUs of quota can
 * keep two threads busy part of the time.
 */
#ifndef COZYGPU_BASE_CPUS_H
#define COZYGPU_BASE_CPUS_H

/* The CPUs available, at least 1. `cgroup_root` is where the cgroup v2
 * hierarchy is mounted ("/sys/fs/cgroup"; NULL means that); the process's
 * own cgroup is read from /proc/self/cgroup ("0::/PATH"), and its cpu.max
 * is looked for under the root at PATH, then at the root itself (a
 * container's cgroup namespace shows its own cgroup as "/"). Nothing
 * readable there (cgroup v1, no cpu controller) means no quota. */
int cozy_cpus_available(const char *cgroup_root);

/* The quota of one cpu.max text ("150000 100000"), rounded up to whole
 * CPUs; 0 for "max" (no quota) or text that is not a quota. */
int cozy_cpus_of_quota(const char *cpu_max);

#endif
