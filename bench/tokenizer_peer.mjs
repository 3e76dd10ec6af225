// tokenizer_peer.mjs — the peer for bench/tokenizer_bench.sh: gpt-tokenizer (npm, as installed by
// scripts/fetch_assets.sh) encoding the same text file on Node.js, best of several runs after a warm-up, printing
// tokens/s and the same id hash as tokenizer_bench.cpp.
//
//   node bench/tokenizer_peer.mjs ASSETS_DIR ENCODING TEXT_FILE RUNS
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

const [assets, encoding, textPath, runsArg] = process.argv.slice(2);
const runs = Number(runsArg ?? 5);
const module = await import(pathToFileURL(`${assets}/npm/gpt-tokenizer/esm/encoding/${encoding}.js`).href);
const text = readFileSync(textPath, 'utf8');

let ids = module.encode(text);  // warm-up (JIT, merge cache), and the output to compare
let best = Infinity;
for (let r = 0; r < runs; r++) {
  const start = process.hrtime.bigint();
  ids = module.encode(text);
  best = Math.min(best, Number(process.hrtime.bigint() - start) / 1e9);
}
let hash = 0;
for (const id of ids) hash = (Math.imul(hash, 31) + id) >>> 0;
console.log(`gpt-tokenizer encoding=${encoding} tokens=${ids.length} hash=${hash.toString(16).padStart(8, '0')} ` +
            `1-thread=${Math.round(ids.length / best)} tokens/s`);
