// Evaluates webhook matchConditions with @bufbuild/cel (a conformance-tested
// CEL evaluator; not the API server's cel-go, see docs/decisions/0006).
// Input on stdin: JSON {cases: [{expression, object, oldObject, request,
// variables}]} (oldObject and variables optional: a ValidatingAdmission-
// Policy's old object and its variables, already evaluated). Output: one
// JSON line per case: {"value": true|false|"a string"} or {"error": "..."}.
// Kubernetes hands CEL an unstructured object: JSON objects are maps,
// integers int64; `object` and `oldObject` are dynamically typed, so no
// type checking happens, as here.
// Run: node spec/deploy/cel-eval.js (NODE_PATH pointing at a node_modules
// that holds @bufbuild/cel).
"use strict";
const { run } = require("@bufbuild/cel");

function toCel(v) {
  if (Array.isArray(v)) return v.map(toCel);
  if (v !== null && typeof v === "object") {
    const m = new Map();
    for (const [k, x] of Object.entries(v)) m.set(k, toCel(x));
    return m;
  }
  if (typeof v === "number" && Number.isInteger(v)) return BigInt(v);
  return v;
}

let input = "";
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", () => {
  const { cases } = JSON.parse(input);
  for (const c of cases) {
    let out;
    try {
      const bindings = { object: toCel(c.object), request: toCel(c.request || {}) };
      if ("oldObject" in c) bindings.oldObject = toCel(c.oldObject);
      if (c.variables) bindings.variables = toCel(c.variables);
      const value = run(c.expression, bindings);
      out = typeof value === "boolean" || typeof value === "string" ? { value } : { error: "not a bool: " + String(value) };
    } catch (e) {
      out = { error: String(e && e.message ? e.message : e) };
    }
    process.stdout.write(JSON.stringify(out) + "\n");
  }
});
