// A causal language model on onnxruntime-web's WebAssembly backend in Node.js, as a web page runs it: the
// model read from files (its data files too); the generation itself is language_model.mjs's.
import fs from 'node:fs';
import nodePath from 'node:path';
import * as ort from 'onnxruntime-web';
import { LanguageModel } from './language_model.mjs';

export { LanguageModel };

// session.disable_quant_qdq=1 makes onnxruntime fold each DequantizeLinear of a constant
// weight at load (fp32 MatMuls: fp32 speed); without it, WASM fuses DequantizeLinear+MatMul
// into MatMulNBits, ~10x slower.
export const FOLD_QDQ = { session: { disable_quant_qdq: '1' } };

// A model over 2 GB (or saved so) keeps its weights in data files beside it, named after it:
// onnxsmith's `model.onnx.data`, optimum's and transformers.js's `model.onnx_data` (and `_data_1`, ...).
// onnxruntime-web reads no file system: each is handed to it under the name the model gives.
export function externalData(path) {
  const dir = nodePath.dirname(path);
  const base = nodePath.basename(path);
  return fs
    .readdirSync(dir)
    .filter((name) => name !== base && name.startsWith(base) && /^[._]data(_\d+)?$/.test(name.slice(base.length)))
    .sort()
    .map((name) => ({ path: name, data: fs.readFileSync(nodePath.join(dir, name)) }));
}

export async function loadModel(path, { threads = 1, foldQdq = true } = {}) {
  ort.env.wasm.numThreads = threads;
  ort.env.logLevel = 'error';
  const data = externalData(path);
  const session = await ort.InferenceSession.create(fs.readFileSync(path), {
    executionProviders: ['wasm'],
    graphOptimizationLevel: 'all',
    extra: foldQdq ? FOLD_QDQ : {},
    ...(data.length ? { externalData: data } : {}),
  });
  return new LanguageModel(session);
}

