/* controller.h — `cozygpu controller` (DESIGN.md §2): the admission webhooks
 * (every replica), the watches that feed the policies' cluster view, policy
 * hot reload from the policies ConfigMap, leader election, and the writers
 * that only the leader runs (today: GPUClass status conditions).
 */
#ifndef COZYGPU_CONTROLLER_H
#define COZYGPU_CONTROLLER_H

/* Runs the controller with command-line arguments (argv[0] is "controller").
 * Returns the process exit status: 0 after a clean shutdown (SIGTERM or
 * SIGINT), 2 on bad flags or when the API server, the certificates or the
 * settings cannot be used at start. */
int controller_main(int argc, char **argv);

#endif
