// Validates rendered Istio (EnvoyFilter) and Envoy Gateway (EnvoyExtensionPolicy,
// BackendTrafficPolicy, EnvoyPatchPolicy) objects with the validators that @kubernetes-models/istio
// and @kubernetes-models/envoy-gateway generate from the projects' own CRD schemas (types, enums,
// patterns, required fields, CEL-free structural rules). Those validators accept unknown fields
// (CRD schemas prune rather than refuse them), so field names are also checked against the
// property names of the packages' generated TypeScript declarations, outside the free-form
// subtrees (wasm `config`, patch `value`, labels, annotations): a misspelled field fails.
// Usage: node validate-models.mjs RENDERED.json NODE_MODULES_DIR
// Exit status 1 when an object fails or when nothing was validated.
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";

const [file, modules] = process.argv.slice(2);
if (!file || !modules) {
  console.error("usage: node validate-models.mjs RENDERED.json NODE_MODULES_DIR");
  process.exit(2);
}
const EG = "@kubernetes-models/envoy-gateway/gateway.envoyproxy.io/v1alpha1";
const kinds = {
  "networking.istio.io/v1alpha3/EnvoyFilter": "@kubernetes-models/istio/networking.istio.io/v1alpha3/EnvoyFilter.js",
  "gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy": `${EG}/EnvoyExtensionPolicy.js`,
  "gateway.envoyproxy.io/v1alpha1/BackendTrafficPolicy": `${EG}/BackendTrafficPolicy.js`,
  "gateway.envoyproxy.io/v1alpha1/EnvoyPatchPolicy": `${EG}/EnvoyPatchPolicy.js`,
};
const objects = JSON.parse(readFileSync(file, "utf8"));
const FREE_FORM = new Set(["config", "value", "labels", "annotations"]);
const BASE = ["apiVersion", "kind", "metadata", "name", "namespace", "uid", "ownerReferences",
  "blockOwnerDeletion", "controller", "labels", "annotations"];
// Istio declares a kind's nested types in the kind's own .d.ts; Envoy Gateway's package puts each
// type in its own file, so its names come from every declaration of the API version.
function knownNames(mod) {
  const files = mod.startsWith(EG)
    ? readdirSync(join(modules, EG)).filter((f) => f.endsWith(".d.ts")).map((f) => join(modules, EG, f))
    : [join(modules, mod.replace(/\.js$/, ".d.ts"))];
  const names = new Set(BASE);
  for (const f of files) {
    for (const m of readFileSync(f, "utf8").matchAll(/^\s*"?([A-Za-z_][A-Za-z0-9_]*)"?\??:/gm)) names.add(m[1]);
  }
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
  const mod = kinds[`${obj.apiVersion}/${obj.kind}`];
  if (!mod) continue;
  const Model = (await import(pathToFileURL(join(modules, mod)).href))[obj.kind];
  const id = `${obj.kind} ${obj.metadata.namespace}/${obj.metadata.name}`;
  try {
    new Model(obj).validate();
    const unknown = unknownFields(obj, knownNames(mod), "", []);
    if (unknown.length) throw new Error(`unknown field(s) ${unknown.join(", ")}`);
    console.log(`ok ${id}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${id}: ${e.message}`);
  }
  checked++;
}
console.log(`${checked} object(s) checked, ${failed} failed`);
process.exit(failed > 0 || checked === 0 ? 1 : 0);
