/* read.h — how the leader reads cluster objects into the binder's
 * terms (DESIGN.md §3, §6; docs/decisions/0019, 0020 §1, 0022, 0026):
 * a GPUClaim into a claim (restored from its status for a new leader), a
 * VMI's phase and the claims it holds (annotation or template claims), the
 * units a VMI uses on its node that no claim covers, and what a node
 * offers through runtime.binder.node. Pure over the objects given (no
 * cache, no API): shared by the leader's loop (controller/bind.c) and
 * `cozygpu simulate --snapshot` (cli/simulate.c), so a snapshot starts
 * from the state a new leader would build from the same objects.
 */
#ifndef COZYGPU_PLACEMENT_READ_H
#define COZYGPU_PLACEMENT_READ_H

#include <jansson.h>

#include "base/result.h"
#include "binder/binder.h"
#include "engine/engine.h"

#define PLACEMENT_READ_CLAIMS_ANNOTATION "gpu.cozystack.io/claims"
#define PLACEMENT_READ_TEMPLATE_LABEL "gpu.cozystack.io/template-claim"
#define PLACEMENT_READ_CLASS_REFERENCE "gpu.cozystack.io/class-reference"

/* The binder's phase of a VMI object: no status.phase, Pending and
 * Scheduling are Pending; Scheduled; Succeeded; Failed; anything else
 * (Running, Unknown: its node cannot be reached, not final) Running. */
binder_vmi_phase placement_read_vmi_phase(const json_t *vmi);

/* The claim names of annotation value `v` (comma-separated, ASCII blanks
 * trimmed, empty items skipped; decision 0019) into names[] (pointers into
 * buf, n bytes). Returns how many, at most `max`. */
size_t placement_read_claim_names(const char *v, char *buf, size_t n, const char **names, size_t max);

/* The claims VMI `vmi` holds into names[0..max) (strings in buf, n
 * bytes): those its claims annotation names (decision 0019; blank: none),
 * else, for a VMI carrying the class-reference label, its template claims
 * `tmplset` ([{name, class, count}] as runtime.binder.template_claims
 * gives them, i.e. cozygpu.claims.template_names: decision 0027; NULL:
 * none). *tmpl (when not NULL) gets a new array of the template claims
 * taken, NULL otherwise. A name longer than BINDER_MAX_NAME is left out. */
size_t placement_read_vmi_claims(const json_t *vmi, const json_t *tmplset, char *buf, size_t n, const char **names,
                                 size_t max, json_t **tmpl);

/* Whether placement_read_vmi_claims reads a template set for VMI `vmi`
 * (it has no claims annotation and carries the class-reference label), so
 * a caller computes that set only then. */
int placement_read_vmi_uses_classes(const json_t *vmi);

/* GPUClaim `obj` as the binder takes it into *out (strings borrowed from
 * obj): Pending, or with `restore` (a new leader, decision 0020 §1) the
 * phase, node, attachedTo of its status and the reason and message of its
 * Ready condition (a new leader rewrites no claim whose status it would
 * leave as it is); a Bound or Attached status without a node starts over
 * Pending. Unparsable phases and reasons are left as Pending / none, as
 * the leader does. Returns 0, or -1 when it has no usable metadata.name,
 * metadata.namespace, spec.class or spec.count (1..BINDER_MAX_UNITS). */
int placement_read_claim(const json_t *obj, int restore, binder_claim_status *out);

/* Whether claim ns/name of `st` is in use, so that a claim being deleted
 * keeps its hold (the protection finalizer stays, decision 0026):
 * Attached, Lost with a node, or Bound to a set whose VMI exists and is
 * not final (Pending included: its launcher pod may already be pinned and
 * scheduled; kubernetes.io/pvc-protection counts every pod not terminated
 * alike). An unknown claim is not. */
int placement_read_claim_in_use(const binder_state *st, const char *ns, const char *name);

/* The units VMI `vmi` uses on its node that no claim covers: one per
 * gpus[] and hostDevices[] entry, by deviceName, plus the device-plugin
 * names of spec.domain.resources by quantity, while Scheduled, Running
 * or Unknown with a status.nodeName — unless its own set in `st` (the
 * claims placement_read_vmi_claims gives, with `tmplset`) is Bound or Attached on
 * that node, attached to nobody else, with at least as many units as it
 * has entries (decision 0022). A new {resource name:
 * units}, or NULL when none. */
json_t *placement_read_raw_units(const binder_state *st, const json_t *vmi, const json_t *tmplset);

/* Whether placement_read_raw_units can find any use for `vmi` at all (Scheduled,
 * Running or Unknown, with a status.nodeName): a cheap test before the
 * classes are listed. */
int placement_read_vmi_on_node(const json_t *vmi);

/* Whether GPUClaim object `c` is template claim `t` ({name, class,
 * count}, as placement_read_vmi_claims gives it) of the VMI of uid `uid`:
 * labelled a template claim (PLACEMENT_READ_TEMPLATE_LABEL "true"), its
 * controller ownerReference naming that uid, of that class and count
 * (decision 0027). A claim that is not is never taken over by the VMI's
 * set, nor deleted when the VMI is final. */
int placement_read_template_claim_is(const json_t *c, const json_t *t, const char *uid);

/* The node name placement_read_volume_nodes gives when a VM's volumes allow no
 * node in common (no Node has it, so the set waits). */
#define PLACEMENT_READ_NO_NODE "(no node: its volumes allow none in common)"

/* The PersistentVolume bound to PVC `pvc` (in the VM's namespace, known
 * to the caller), as a new reference, or NULL when it is unknown or not
 * bound (placement_read_volume_nodes' lookup). */
typedef json_t *(*placement_read_bound_pv_fn)(void *ud, const char *pvc);

/* The node names a PersistentVolume's required node affinity allows, when
 * it is a list of names: matchExpressions kubernetes.io/hostname In, or
 * matchFields metadata.name In (local volumes, as the local static
 * provisioner and OpenEBS/TopoLVM write them; the hostname label is taken
 * as the node's name, which kubelet sets by default). Added to `out` (an
 * object used as a set of names). Returns 1 when the PV limits nodes this
 * way, 0 when it has no such affinity (zone or other labels are not read:
 * those volumes do not limit the set, decision 0026). */
int placement_read_pv_nodes(const json_t *pv, json_t *out);

/* DESIGN.md §6: "a set placed after a WaitForFirstConsumer volume bound is
 * limited to the nodes the volume's node affinity allows" (decision 0026
 * item 9). For each volume of `spec` (a VMI's spec, or a stopped VM's
 * template's) that is a persistentVolumeClaim or a dataVolume (a PVC of
 * the same name, CDI), pv_of(ud, pvc) gives the PVC's bound PV; the nodes
 * the set may use are those every such PV allows (placement_read_pv_nodes).
 * Into nodes[] (at most `max`, in the order the PVs name them; the
 * strings live in *keep, a new object the caller frees, NULL when none):
 * 0 names when nothing limits the set (binder_state_set_nodes lifts the
 * limit), PLACEMENT_READ_NO_NODE alone when the volumes allow no node in
 * common. */
size_t placement_read_volume_nodes(const json_t *spec, placement_read_bound_pv_fn pv_of, void *ud, const char **nodes, size_t max,
                             json_t **keep);

/* What one node offers and whether it takes new sets, read by
 * runtime.binder.node (cozygpu.capacity's rules, decision 0022) into the
 * binder's node spec. Strings are borrowed from `view`. */
#define PLACEMENT_READ_MAX_OFFERS 64
#define PLACEMENT_READ_MAX_TAINTS 64
typedef struct placement_read_node_view {
    json_t *view; /* runtime.binder.node's answer (owned; NULL when it failed) */
    binder_offer offers[PLACEMENT_READ_MAX_OFFERS];
    binder_taint taints[PLACEMENT_READ_MAX_TAINTS];
    binder_node_spec spec; /* offers with units > 0, the gpu.cozystack.io/ taints, flags */
} placement_read_node_view;

/* Calls runtime.binder.node(node, gpunode, kubevirt, classes, raw_used) on
 * `e` (an engine_open_runtime(..., "binder") engine) and fills *out.
 * gpunode, kubevirt and raw_used may be NULL. On failure (the Lua side
 * cannot read the node) out->spec offers nothing, no flags, and the
 * error is in err (COZY_ERR_POLICY or COZY_ERR_INTERNAL). Free with
 * placement_read_node_view_free. */
cozy_result placement_read_node(engine *e, const json_t *node, const json_t *gpunode, const json_t *kubevirt,
                          const json_t *classes, const json_t *raw_used, placement_read_node_view *out, cozy_err *err);

/* Frees what placement_read_node put into *v. */
void placement_read_node_view_free(placement_read_node_view *v);

#endif
