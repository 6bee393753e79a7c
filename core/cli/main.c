/* main.c — the `cozygpu` command line (DESIGN.md §2).
 *
 *   cozygpu review [options] FILE...     dry-run of the admission webhooks
 *   cozygpu policy test [options] PATH... a hoster's policy test cases
 *   cozygpu controller [options]         webhooks, watches, leader election (controller.h)
 *   cozygpu inventory [options]          the node's NVIDIA PCI functions (inventory.h)
 *   cozygpu agent [options]              the node agent: GPUNode status, vGPU layout (agent.h)
 *   cozygpu simulate SCENARIO [options]  the binder's rules replayed on a scenario (simulate.h)
 *   cozygpu version                      "cozygpu VERSION (revision REV)" (also --version)
 *
 * Exit status of review: 0 when every input was processed; 1 with
 * --fail-on-deny when any was refused; 2 when an input, the snapshot or the
 * settings could not be read (the message names the file and position), or
 * on bad usage. Unreadable inputs do not stop the others.
 *
 * Exit status of inventory: 0 when the scan succeeded (an empty inventory
 * too); 2 on bad usage, an unreadable sysfs root or PCI ID file, a function
 * that could not be read, or when writing the output failed.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "base/duration.h"
#include "format/config.h"
#include "controller/controller.h"
#include "engine/engine.h"
#include "host/inventory.h"
#include "format/manifest.h"
#include "admission/policytest.h"
#include "admission/review.h"
#include "cli/simulate.h"

/* The Makefile passes both from the VERSION file and `git rev-parse`. */
#ifndef COZYGPU_VERSION
#define COZYGPU_VERSION "unknown"
#endif
#ifndef COZYGPU_REVISION
#define COZYGPU_REVISION "unknown"
#endif

static void usage_review(FILE *f)
{
    fputs("usage: cozygpu review [options] FILE|DIR...\n"
          "\n"
          "Answers recorded AdmissionReviews (or plain objects, wrapped as a CREATE)\n"
          "as cozygpu's webhooks would, against a cluster snapshot. A VirtualMachine\n"
          "is judged as the VirtualMachineInstance its spec.template would create.\n"
          "\n"
          "options:\n"
          "  --config FILE       settings file (DESIGN.md §10); unknown keys are an error\n"
          "  --cluster PATH      snapshot file or directory; repeatable. The kinds the\n"
          "                      controller watches for the policies: GPUClasses,\n"
          "                      GPUClaims, Namespaces, ResourceQuotas, Nodes, the\n"
          "                      KubeVirt CR, VirtualMachineInstances (raw-name usage),\n"
          "                      ResourceClaims, ResourceClaimTemplates and DeviceClasses\n"
          "                      (DRA, any resource.k8s.io version); other kinds in a\n"
          "                      snapshot are passed on as they are\n"
          "  --policies DIR      default policy bundle (default: the installed policies/)\n"
          "  --override DIR      hoster policies: same file name replaces, new name adds\n"
          "  --library DIR       policy library (default: the installed lua/)\n"
          "  --output json|table json: one AdmissionReview per line (default);\n"
          "                      table: one readable line per review\n"
          "  --webhook validating|mutating|all   which webhooks to run (default all:\n"
          "                      validating first, mutation only when allowed)\n"
          "  --user NAME         userInfo.username for plain objects (default kubernetes-admin)\n"
          "  --group NAME        userInfo.groups for plain objects; repeatable\n"
          "  --fail-on-deny      exit 1 when any review was refused\n"
          "\n"
          "exit status: 0 all processed, 1 refused (with --fail-on-deny), 2 unreadable input\n",
          f);
}

static void usage_main(FILE *f)
{
    fputs("usage: cozygpu COMMAND [options]\n"
          "\n"
          "commands:\n"
          "  review        dry-run of the admission webhooks over recorded reviews\n"
          "  policy test   run policy test cases (YAML) against the policies\n"
          "  controller    the admission webhooks, watches and leader-only writers\n"
          "  inventory     list the node's NVIDIA PCI functions (GPUs, VFs, vGPU types)\n"
          "  agent         the node agent: GPUNode inventory and status, vGPU layout\n"
          "  simulate      replay a scenario through the binder's rules (no cluster)\n"
          "  version       print the version and the git revision built\n"
          "\n"
          "Run 'cozygpu COMMAND --help' for the options of a command.\n",
          f);
}

static void table_line(const json_t *review, const char *where, int judged)
{
    const json_t *resp = json_object_get(review, "response");
    int allowed = json_is_true(json_object_get(resp, "allowed"));
    const json_t *st = json_object_get(resp, "status");
    printf("%-7s %s", allowed ? "ALLOWED" : "DENIED", where);
    if(judged)
        printf(" (as its VMI)");
    if(!allowed)
        printf("  %lld %s", (long long)json_integer_value(json_object_get(st, "code")),
               json_string_value(json_object_get(st, "message")) ? json_string_value(json_object_get(st, "message")) : "");
    json_t *ops = review_decode_patch(resp);
    if(ops) {
        printf("  patch:");
        size_t i;
        json_t *op;
        json_array_foreach(ops, i, op) printf("%s %s %s", i ? "," : "", json_string_value(json_object_get(op, "op")),
                                              json_string_value(json_object_get(op, "path")));
        json_decref(ops);
    }
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(resp, "warnings"), i, w) printf("  warning: %s", json_string_value(w));
    putchar('\n');
}

static int cmd_review(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'}, {"cluster", required_argument, 0, 'C'},
        {"policies", required_argument, 0, 'p'}, {"override", required_argument, 0, 'O'},
        {"library", required_argument, 0, 'L'}, {"output", required_argument, 0, 'o'},
        {"webhook", required_argument, 0, 'w'}, {"user", required_argument, 0, 'u'},
        {"group", required_argument, 0, 'g'}, {"fail-on-deny", no_argument, 0, 'f'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const char *config_path = NULL, *output = "json";
    engine_options eo = {0};
    review_options ro = {.phases = ENGINE_BOTH};
    json_t *clusters = json_array(), *groups = json_array();
    int fail_on_deny = 0, c, status = 0;
    optind = 1;
    while((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch(c) {
        case 'c': config_path = optarg; break;
        case 'C': json_array_append_new(clusters, json_string(optarg)); break;
        case 'p': eo.bundle_dir = optarg; break;
        case 'O': eo.override_dir = optarg; break;
        case 'L': eo.library_dir = optarg; break;
        case 'o': output = optarg; break;
        case 'u': ro.username = optarg; break;
        case 'g': json_array_append_new(groups, json_string(optarg)); break;
        case 'f': fail_on_deny = 1; break;
        case 'w':
            if(strcmp(optarg, "validating") == 0)
                ro.phases = ENGINE_VALIDATE;
            else if(strcmp(optarg, "mutating") == 0)
                ro.phases = ENGINE_MUTATE;
            else if(strcmp(optarg, "all") == 0)
                ro.phases = ENGINE_BOTH;
            else {
                fprintf(stderr, "cozygpu review: --webhook must be validating, mutating or all\n");
                status = 2;
                goto out;
            }
            break;
        case 'h': usage_review(stdout); goto out;
        default: usage_review(stderr); status = 2; goto out;
        }
    }
    if(strcmp(output, "json") && strcmp(output, "table")) {
        fprintf(stderr, "cozygpu review: --output must be json or table\n");
        status = 2;
        goto out;
    }
    if(optind >= argc) {
        fprintf(stderr, "cozygpu review: no input files\n");
        usage_review(stderr);
        status = 2;
        goto out;
    }
    if(json_array_size(groups))
        ro.groups = groups;

    cozy_err err = {{0}};
    json_t *settings = NULL;
    if(config_path ? config_load_file(config_path, &settings, &err) != COZY_OK : !(settings = config_defaults())) {
        fprintf(stderr, "cozygpu review: %s\n", err.msg);
        status = 2;
        goto out;
    }
    json_t *objects = json_array();
    size_t i;
    json_t *cp;
    json_array_foreach(clusters, i, cp) {
        json_t *recs = json_array();
        if(manifest_load_path(json_string_value(cp), recs, &err) != COZY_OK) {
            fprintf(stderr, "cozygpu review: cluster snapshot: %s\n", err.msg);
            json_decref(recs);
            json_decref(objects);
            json_decref(settings);
            status = 2;
            goto out;
        }
        size_t k;
        json_t *r;
        json_array_foreach(recs, k, r) json_array_append(objects, json_object_get(r, "object"));
        json_decref(recs);
    }
    json_t *budget = json_object_get(settings, "policyBudget");
    eo.instructions = json_integer_value(json_object_get(budget, "instructions"));
    eo.memory_bytes = json_integer_value(json_object_get(budget, "memoryBytes"));
    engine *e = NULL;
    if(engine_open(&e, &eo, &err) != COZY_OK || engine_set_cluster(e, objects, settings, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu review: %s\n", err.msg);
        engine_close(e);
        json_decref(objects);
        json_decref(settings);
        status = 2;
        goto out;
    }
    json_decref(objects);
    json_decref(settings);

    int refused = 0;
    unsigned long seq = 0;
    for(int a = optind; a < argc; a++) {
        json_t *files = NULL;
        if(manifest_list_files(argv[a], &files, &err) != COZY_OK) {
            fprintf(stderr, "cozygpu review: %s\n", err.msg);
            status = 2;
            continue;
        }
        size_t fi;
        json_t *fname;
        json_array_foreach(files, fi, fname) {
            const char *path = json_string_value(fname);
            json_t *recs = json_array();
            if(manifest_load_file(path, recs, &err) != COZY_OK) {
                fprintf(stderr, "cozygpu review: %s\n", err.msg);
                status = 2;
                json_decref(recs);
                continue;
            }
            size_t k;
            json_t *r;
            json_array_foreach(recs, k, r) {
                char where[1024];
                if(json_array_size(recs) > 1)
                    snprintf(where, sizeof where, "%s#%lld", path, (long long)json_integer_value(json_object_get(r, "index")) + 1);
                else
                    snprintf(where, sizeof where, "%s", path);
                json_t *out = NULL;
                json_t *doc = json_object_get(r, "object");
                if(review_is_response_only(doc)) {
                    fprintf(stderr, "cozygpu review: note: %s: an AdmissionReview with a response and no request; nothing to review\n", where);
                    continue;
                }
                ro.notes = json_array();
                engine_outcome outcome = ENGINE_ALLOWED;
                cozy_result rrc = review_document(e, doc, where, ++seq, &ro, &out, &outcome, &err);
                size_t ni;
                json_t *note;
                json_array_foreach(ro.notes, ni, note) fprintf(stderr, "cozygpu review: note: %s\n", json_string_value(note));
                json_decref(ro.notes);
                ro.notes = NULL;
                if(rrc != COZY_OK) {
                    fprintf(stderr, "cozygpu review: %s\n", err.msg);
                    status = 2;
                    continue;
                }
                if(outcome != ENGINE_ALLOWED) /* refused, or a policy failed (fail closed) */
                    refused = 1;
                if(strcmp(output, "table") == 0) {
                    int judged = json_object_get(json_object_get(json_object_get(out, "response"), "auditAnnotations"),
                                                 "gpu.cozystack.io/judged-as") != NULL;
                    table_line(out, where, judged);
                } else {
                    char *s = json_dumps(out, JSON_COMPACT | JSON_SORT_KEYS);
                    if(s)
                        puts(s);
                    free(s);
                }
                fflush(stdout);
                json_decref(out);
            }
            json_decref(recs);
        }
        json_decref(files);
    }
    engine_close(e);
    if(fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "cozygpu review: writing the output failed\n");
        status = 2;
    }
    if(status == 0 && refused && fail_on_deny)
        status = 1;
out:
    json_decref(clusters);
    json_decref(groups);
    return status;
}

#define POLICY_TEST_USAGE                                                                                      \
    "usage: cozygpu policy test [--policies DIR] [--override DIR] [--library DIR] [--config FILE]\n"             \
    "                           [--review-timeout DURATION] PATH...\n"

static int cmd_policy(int argc, char **argv)
{
    if(argc < 2 || strcmp(argv[1], "test") != 0) {
        if(argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
            fputs(POLICY_TEST_USAGE, stdout);
            puts("Subcommand: test. `cozygpu policy test --help` describes its options.");
            return 0;
        }
        if(argc < 2)
            fputs("cozygpu policy: no subcommand (valid: test)\n", stderr);
        else
            fprintf(stderr, "cozygpu policy: unknown subcommand \"%s\" (valid: test)\n", argv[1]);
        fputs(POLICY_TEST_USAGE, stderr);
        return 2;
    }
    static const struct option opts[] = {
        {"policies", required_argument, 0, 'p'}, {"override", required_argument, 0, 'O'},
        {"library", required_argument, 0, 'L'},  {"config", required_argument, 0, 'c'},
        {"review-timeout", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    engine_options eo = {0};
    const char *config = NULL;
    long timeout_ms = 0;
    int c;
    optind = 1;
    argc--, argv++;
    while((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch(c) {
        case 'p': eo.bundle_dir = optarg; break;
        case 'O': eo.override_dir = optarg; break;
        case 'L': eo.library_dir = optarg; break;
        case 'c': config = optarg; break;
        case 't':
            if(cozy_parse_duration(optarg, &timeout_ms) != 0 || timeout_ms < 1) {
                fprintf(stderr, "cozygpu policy test: --review-timeout: not a positive duration (like 8s): %s\n",
                        optarg);
                return 2;
            }
            break;
        case 'h':
            fputs(POLICY_TEST_USAGE, stdout);
            puts("Runs every test file (YAML) under PATH; see docs/policy-api.md for the format.\n"
                 "  --policies DIR           the default bundle (default: the installed policies/)\n"
                 "  --override DIR           hoster policies: same file name replaces, new name adds\n"
                 "  --library DIR            the policy library (default: the installed lua/)\n"
                 "  --config FILE            settings (DESIGN.md §10) for the files without config:,\n"
                 "                           as the controller's reload gate uses its own settings\n"
                 "  --review-timeout DURATION  a wall-clock deadline per review, as in the\n"
                 "                           controller (default: none; the instruction budget only)\n"
                 "exit status: 0 all passed, 1 any failed, 2 a test file could not be read");
            return 0;
        default: return 2;
        }
    }
    if(optind >= argc) {
        fprintf(stderr, "cozygpu policy test: no test files\n");
        return 2;
    }
    json_t *settings = NULL;
    if(config) {
        cozy_err err = {{0}};
        if(config_load_file(config, &settings, &err) != COZY_OK) {
            fprintf(stderr, "cozygpu policy test: --config: %s\n", err.msg);
            return 2;
        }
    }
    policytest_counts n =
        policytest_run((const char *const *)argv + optind, argc - optind, &eo, settings, timeout_ms, stdout);
    json_decref(settings);
    printf("%d passed, %d failed%s\n", n.passed, n.failed, n.errors ? " (and unreadable test files)" : "");
    if(n.errors)
        return 2;
    return n.failed ? 1 : 0;
}

static void usage_inventory(FILE *f)
{
    fputs("usage: cozygpu inventory [options]\n"
          "\n"
          "Lists the node's NVIDIA (10de) PCI functions as the agent reports them in\n"
          "GPUNode.status.functions (docs/gpunode.md): identity, driver, IOMMU group,\n"
          "NUMA node, SR-IOV, vGPU type and mediated-device types.\n"
          "\n"
          "options:\n"
          "  --sysfs ROOT        sysfs root to read (default /sys); ROOT/bus/pci/devices\n"
          "                      must exist\n"
          "  --output table|json table: one row per GPU function, VFs and audio/USB\n"
          "                      functions indented under their GPU (default);\n"
          "                      json: {\"functions\": [...]} on one line\n"
          "  --pci-ids FILE      PCI ID database for the names (default: libpci's)\n"
          "  --pci-method NAME   libpci access method (default linux-sysfs)\n"
          "\n"
          "exit status: 0 scanned (also when nothing was found), 2 bad usage or\n"
          "an unreadable root or function\n",
          f);
}

static int cmd_inventory(int argc, char **argv)
{
    static const struct option opts[] = {
        {"sysfs", required_argument, 0, 's'},      {"output", required_argument, 0, 'o'},
        {"pci-ids", required_argument, 0, 'i'},    {"pci-method", required_argument, 0, 'm'},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0},
    };
    inventory_options io = {0};
    const char *output = "table";
    int c;
    optind = 1;
    while((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch(c) {
        case 's': io.sysfs_root = optarg; break;
        case 'o': output = optarg; break;
        case 'i': io.pci_ids = optarg; break;
        case 'm': io.pci_method = optarg; break;
        case 'h': usage_inventory(stdout); return 0;
        default: usage_inventory(stderr); return 2;
        }
    }
    if(optind < argc) {
        fprintf(stderr, "cozygpu inventory: unexpected argument \"%s\"\n", argv[optind]);
        usage_inventory(stderr);
        return 2;
    }
    if(strcmp(output, "json") && strcmp(output, "table")) {
        fprintf(stderr, "cozygpu inventory: --output must be json or table, not \"%s\"\n", output);
        return 2;
    }
    cozy_err err = {{0}};
    json_t *inv = NULL;
    cozy_result rc = inventory_scan(&io, &inv, &err);
    if(rc != COZY_OK) {
        fprintf(stderr, "cozygpu inventory: %s%s\n", rc == COZY_ERR_USAGE && io.pci_method ? "--pci-method: " : "",
                err.msg);
        return 2;
    }
    if(strcmp(output, "json") == 0) {
        if(json_dumpf(inv, stdout, JSON_PRESERVE_ORDER) == 0)
            putchar('\n');
    } else
        inventory_print_table(stdout, inv);
    json_decref(inv);
    if(fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "cozygpu inventory: writing the output failed\n");
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if(argc < 2) {
        usage_main(stderr);
        return 2;
    }
    if(strcmp(argv[1], "review") == 0)
        return cmd_review(argc - 1, argv + 1);
    if(strcmp(argv[1], "policy") == 0)
        return cmd_policy(argc - 1, argv + 1);
    if(strcmp(argv[1], "controller") == 0)
        return controller_main(argc - 1, argv + 1);
    if(strcmp(argv[1], "agent") == 0)
        return agent_main(argc - 1, argv + 1);
    if(strcmp(argv[1], "inventory") == 0)
        return cmd_inventory(argc - 1, argv + 1);
    if(strcmp(argv[1], "simulate") == 0)
        return sim_main(argc - 1, argv + 1);
    if(strcmp(argv[1], "version") == 0 || strcmp(argv[1], "--version") == 0) {
        puts("cozygpu " COZYGPU_VERSION " (revision " COZYGPU_REVISION ")");
        return 0;
    }
    if(strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage_main(stdout);
        return 0;
    }
    fprintf(stderr, "cozygpu: unknown command \"%s\"\n", argv[1]);
    usage_main(stderr);
    return 2;
}
