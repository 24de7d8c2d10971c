#!/usr/bin/env node
// A released model folder in transformers.js (Node.js, local files only, remote models off): the folder's own
// chat template applied to one user message, then greedy generation.
//
//   node chat.mjs FOLDER --message "Hello" [--dtype q4] [--new-tokens 8]
//
// prints {"text": "...the prompt the template made...", "prompt": [...ids...], "ids": [...generated...]} as JSON.
// The model runs with session.disable_quant_qdq=1, the setting the card names for the web format.
import path from 'node:path';
import { parseArgs } from 'node:util';
import { AutoModelForCausalLM, AutoTokenizer, env } from '@huggingface/transformers';

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    message: { type: 'string' },
    dtype: { type: 'string', default: 'q4' },
    'new-tokens': { type: 'string', default: '8' },
  },
});
if (positionals.length !== 1 || values.message === undefined) {
  console.error('usage: node chat.mjs FOLDER --message TEXT [--dtype q4] [--new-tokens N]');
  process.exit(2);
}
const folder = path.resolve(positionals[0]);
env.allowRemoteModels = false;
env.localModelPath = path.dirname(folder) + path.sep;
const name = path.basename(folder);

const tokenizer = await AutoTokenizer.from_pretrained(name);
const text = tokenizer.apply_chat_template([{ role: 'user', content: values.message }], {
  tokenize: false,
  add_generation_prompt: true,
});
const inputs = tokenizer(text);
const model = await AutoModelForCausalLM.from_pretrained(name, {
  dtype: values.dtype,
  device: 'cpu',
  session_options: { extra: { session: { disable_quant_qdq: '1' } } },
});
const output = await model.generate({ ...inputs, max_new_tokens: Number(values['new-tokens']), do_sample: false });
const prompt = Array.from(inputs.input_ids.data, Number);
const ids = Array.from(output.data, Number).slice(prompt.length);
console.log(JSON.stringify({ text, prompt, ids }));
await model.dispose();
