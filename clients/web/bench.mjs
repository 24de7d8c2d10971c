#!/usr/bin/env node
// Time language models on onnxruntime-web (WASM) in Node.js, side by side in one process:
//
//   node bench.mjs [--prompt 64] [--decode 32] [--repeats 9] [--threads 1] NAME=MODEL.onnx[:nofold] ...
//
// Every model is loaded first; then each repeat runs every model in turn (so a busy machine
// slows them alike): a prefill (one run over a `--prompt`-token prompt from an empty cache) and
// `--decode` more tokens (one run each through the KV cache, or over the whole sequence again
// for a model without one). Reported: medians over the repeats (after one warm-up) of the
// prefill and of the median decode step, as CPU time of this process (what the work costs,
// however loaded the machine) and as wall time, in ms, as JSON. ":nofold" runs a model
// without session.disable_quant_qdq=1.
import { parseArgs } from 'node:util';
import { loadModel } from './lm.mjs';

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    prompt: { type: 'string', default: '64' },
    decode: { type: 'string', default: '32' },
    repeats: { type: 'string', default: '9' },
    threads: { type: 'string', default: '1' },
  },
});
const promptLength = Number(values.prompt);
const decodeTokens = Number(values.decode);
const repeats = Number(values.repeats);

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

// A fixed pseudo-random prompt (LCG), the same for every model.
function prompt(vocab, n, seed) {
  let x = seed >>> 0;
  return Array.from({ length: n }, () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return x % vocab;
  });
}

const models = [];
for (const spec of positionals) {
  const [name, rest] = spec.split(/=(.*)/s);
  const nofold = rest.endsWith(':nofold');
  const path = nofold ? rest.slice(0, -':nofold'.length) : rest;
  const start = performance.now();
  const model = await loadModel(path, { threads: Number(values.threads), foldQdq: !nofold });
  const loadMs = performance.now() - start;
  const { vocab } = await model.step([0], 0, null);
  models.push({ name, path, nofold, model, vocab, loadMs, runs: [] });
}
for (let r = 0; r <= repeats; r++) {
  for (const m of models) {
    const { times, cpu } = await m.model.generate(prompt(Math.min(m.vocab, 50000), promptLength, 12345 + r), decodeTokens + 1);
    if (r > 0) m.runs.push({ times, cpu }); // the first repeat warms up
  }
}
const results = {};
for (const m of models) {
  const pick = (key, part) => median(m.runs.map((run) => (part === 'prefill' ? run[key][0] : median(run[key].slice(1)))));
  results[m.name] = {
    model: m.path,
    fold_qdq: !m.nofold,
    load_ms: m.loadMs,
    prefill_cpu_ms: pick('cpu', 'prefill'),
    decode_cpu_ms: pick('cpu', 'decode'),
    prefill_wall_ms: pick('times', 'prefill'),
    decode_wall_ms: pick('times', 'decode'),
  };
}
console.log(JSON.stringify({ prompt: promptLength, decode: decodeTokens, repeats, threads: Number(values.threads), results }, null, 1));
