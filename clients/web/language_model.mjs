// A causal language model in an onnxruntime-web session, the same code in Node.js and in a web page (where an
// import map names the onnxruntime-web bundle: webgpu.html).
//
// Inputs onnxsmith models take: input_ids, optionally attention_mask, position_ids and a
// KV cache (past_key_values.N.key|value, returned as present.N.key|value). A model whose
// logits are [batch, 1, vocab] computes the last position only; either way the last row
// is the next-token distribution.
import * as ort from 'onnxruntime-web';

const inNode = typeof process !== 'undefined' && typeof process.cpuUsage === 'function';

export class LanguageModel {
  constructor(session) {
    this.session = session;
    const inputs = new Map(session.inputNames.map((name, i) => [name, session.inputMetadata[i]]));
    if (!inputs.has('input_ids')) throw new Error(`not a language model: no input_ids (inputs: ${session.inputNames})`);
    this.hasMask = inputs.has('attention_mask');
    this.hasPositions = inputs.has('position_ids');
    this.past = session.inputNames.filter((name) => !['input_ids', 'attention_mask', 'position_ids'].includes(name));
    this.pastShape = new Map(this.past.map((name) => [name, inputs.get(name).shape]));
    this.logitsName = session.outputNames.includes('logits') ? 'logits' : session.outputNames[0];
  }

  // Feeds for `ids` after `done` tokens whose cache is `past` (null: an empty cache).
  feeds(ids, done, past) {
    const n = ids.length;
    const int64 = (values, dims) => new ort.Tensor('int64', BigInt64Array.from(values, (v) => BigInt(v)), dims);
    const feeds = { input_ids: int64(ids, [1, n]) };
    if (this.hasMask) feeds.attention_mask = int64(new Array(done + n).fill(1), [1, done + n]);
    if (this.hasPositions) feeds.position_ids = int64(Array.from({ length: n }, (_, i) => done + i), [1, n]);
    for (const name of this.past) {
      if (past) {
        feeds[name] = past[name];
        continue;
      }
      const dims = this.pastShape.get(name).map((d) => (typeof d === 'number' ? d : /past/.test(d) ? 0 : 1));
      feeds[name] = new ort.Tensor('float32', new Float32Array(0), dims);
    }
    return feeds;
  }

  // One forward pass: the next-token argmax and the cache to continue from.
  async step(ids, done, past) {
    const out = await this.session.run(this.feeds(ids, done, past));
    const logits = out[this.logitsName];
    const vocab = logits.dims[logits.dims.length - 1];
    const rows = logits.dims[1];
    const last = logits.data.subarray((rows - 1) * vocab, rows * vocab);
    let best = 0;
    for (let i = 1; i < vocab; i++) if (last[i] > last[best]) best = i;
    let next = null;
    if (this.past.length) {
      next = {};
      for (const name of this.past) next[name] = out[name.replace('past_key_values', 'present')];
    }
    return { token: best, past: next, vocab };
  }

  // Greedy decoding: the prompt in one run, then one token per run (through the cache, or the
  // whole sequence again for a model without one). Returns the new ids and, per run, the wall
  // time and, in Node.js, the process's CPU time (ms; CPU time does not count waiting for a busy machine).
  async generate(prompt, newTokens) {
    const ids = [...prompt];
    const generated = [];
    const times = [];
    const cpu = [];
    let past = null;
    let done = 0;
    let input = [...prompt]; // not `ids`, which grows by each new token: the prompt's length is what it added
    for (let t = 0; t < newTokens; t++) {
      const start = performance.now();
      const cpuStart = inNode ? process.cpuUsage() : null;
      const r = await this.step(input, done, past);
      times.push(performance.now() - start);
      if (inNode) {
        const used = process.cpuUsage(cpuStart);
        cpu.push((used.user + used.system) / 1000);
      }
      generated.push(r.token);
      ids.push(r.token);
      if (this.past.length) {
        done += input.length;
        past = r.past;
        input = [r.token];
      } else {
        input = ids;
      }
    }
    return { ids: generated, times, cpu };
  }
}
