/* simulate.h — `cozygpu simulate SCENARIO.yaml [--output table|json]
 * [--config FILE] [--policies DIR] [--override DIR] [--library DIR]
 * [--snapshot PATH]`: replays a scenario, optionally starting from a
 * snapshot of a live cluster's objects, through the binder's state machine
 * (binder/binder.h) with no cluster (decision 0041), its chooser the
 * bundle's binder.lua and its budget check at bind cozygpu.budget
 * (engine.h "the binder's Lua", decision 0024). simulate.c's header
 * describes the scenario format.
 */
#ifndef COZYGPU_CLI_SIMULATE_H
#define COZYGPU_CLI_SIMULATE_H

/* The subcommand (argv[0] is "simulate"). Exit status: 0 every expect line
 * held, 1 one failed, 2 bad usage or bad input (the message on stderr names
 * the file, the object and the field; nothing is printed on stdout then). */
int sim_main(int argc, char **argv);

#endif
