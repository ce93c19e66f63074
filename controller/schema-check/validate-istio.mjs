// Validates rendered Istio objects (WasmPlugin, EnvoyFilter) with the validators that
// @kubernetes-models/istio generates from Istio's own CRD schemas (types, enums, patterns,
// required fields). Usage: node validate-istio.mjs RENDERED.json NODE_MODULES_DIR
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
let checked = 0, failed = 0;
for (const obj of objects) {
  const mod = kinds[obj.kind];
  if (!mod) continue;
  const Model = (await import(pathToFileURL(join(modules, mod)).href))[obj.kind];
  const id = `${obj.kind} ${obj.metadata.namespace}/${obj.metadata.name}`;
  try {
    new Model(obj).validate();
    console.log(`ok ${id}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${id}: ${e.message}`);
  }
  checked++;
}
console.log(`${checked} Istio object(s) checked, ${failed} failed`);
process.exit(failed > 0 || checked === 0 ? 1 : 0);
