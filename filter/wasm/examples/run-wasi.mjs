// Runs a wasm32-wasip1 command module under Node's WASI (V8, the engine Envoy embeds).
// Usage: node filter/wasm/examples/run-wasi.mjs FILE.wasm
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';

const wasi = new WASI({ version: 'preview1', args: [process.argv[2]], env: {} });
const module = await WebAssembly.compile(await readFile(process.argv[2]));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
wasi.start(instance);
