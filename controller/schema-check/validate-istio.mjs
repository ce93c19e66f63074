// Validates rendered Istio objects (WasmPlugin, EnvoyFilter) with the validators that
// @kubernetes-models/istio generates from Istio's own CRD schemas (types, enums, patterns,
// required fields). Those validators accept unknown fields (CRD schemas prune rather than refuse
// them), so field names are also checked against the property names of the package's generated
// TypeScript declarations, outside the free-form subtrees (pluginConfig, patch.value, labels,
// annotations): a misspelled field fails.
// Usage: node validate-istio.mjs RENDERED.json NODE_MODULES_DIR
// Exit status 1 when an object fails or when nothing was validated.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [file, modules] = process.argv.slice(2);
if (!file || !modules) {
  console.error("usage: node validate-istio.mjs RENDERED.json NODE_MODULES_DIR");
  process.exit(2);
}
const kinds = {
  WasmPlugin: "@kubernetes-models/istio/extensions.istio.io/v1alpha1/WasmPlugin.js",
  EnvoyFilter: "@kubernetes-models/istio/networking.istio.io/v1alpha3/EnvoyFilter.js",
};
const objects = JSON.parse(readFileSync(file, "utf8"));
const FREE_FORM = new Set(["pluginConfig", "value", "labels", "annotations"]);
function knownNames(kind) {
  const dts = readFileSync(join(modules, kinds[kind].replace(/\.js$/, ".d.ts")), "utf8");
  const names = new Set(["apiVersion", "kind", "metadata", "name", "namespace", "uid", "ownerReferences",
    "blockOwnerDeletion", "controller", "labels", "annotations"]);
  for (const m of dts.matchAll(/^\s*"?([A-Za-z_][A-Za-z0-9_]*)"?\??:/gm)) names.add(m[1]);
  return names;
}
function unknownFields(value, names, path, out) {
  if (Array.isArray(value)) value.forEach((v, i) => unknownFields(v, names, `${path}[${i}]`, out));
  else if (value && typeof value === "object") {
    for (const [k, v] of Object.entries(value)) {
      if (!names.has(k)) out.push(`${path}.${k}`);
      else if (!FREE_FORM.has(k)) unknownFields(v, names, `${path}.${k}`, out);
    }
  }
  return out;
}
let checked = 0, failed = 0;
for (const obj of objects) {
  const mod = kinds[obj.kind];
  if (!mod) continue;
  const Model = (await import(pathToFileURL(join(modules, mod)).href))[obj.kind];
  const id = `${obj.kind} ${obj.metadata.namespace}/${obj.metadata.name}`;
  try {
    new Model(obj).validate();
    const unknown = unknownFields(obj, knownNames(obj.kind), "", []);
    if (unknown.length) throw new Error(`unknown field(s) ${unknown.join(", ")}`);
    console.log(`ok ${id}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${id}: ${e.message}`);
  }
  checked++;
}
console.log(`${checked} Istio object(s) checked, ${failed} failed`);
process.exit(failed > 0 || checked === 0 ? 1 : 0);
