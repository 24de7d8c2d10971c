#!/usr/bin/env node
// Greedy generation with onnxruntime-web (WASM) in Node.js:
//
//   node generate.mjs MODEL.onnx --ids 12,345,6 [--new-tokens 20] [--threads 1] [--no-fold-qdq]
//
// prints {"ids": [...generated...], "ms": [...per run...]} as JSON on stdout.
import { parseArgs } from 'node:util';
import { loadModel } from './lm.mjs';

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    ids: { type: 'string' },
    'new-tokens': { type: 'string', default: '20' },
    threads: { type: 'string', default: '1' },
    'no-fold-qdq': { type: 'boolean', default: false },
  },
});
if (positionals.length !== 1 || !values.ids) {
  console.error('usage: node generate.mjs MODEL.onnx --ids 1,2,3 [--new-tokens N] [--threads N] [--no-fold-qdq]');
  process.exit(2);
}
const prompt = values.ids.split(',').map((s) => Number.parseInt(s, 10));
const model = await loadModel(positionals[0], {
  threads: Number(values.threads),
  foldQdq: !values['no-fold-qdq'],
});
const { ids, times } = await model.generate(prompt, Number(values['new-tokens']));
console.log(JSON.stringify({ ids, ms: times.map((t) => Math.round(t * 1000) / 1000) }));
