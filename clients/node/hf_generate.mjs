// Loads an rpac export in the Hugging Face layout (rpac export --format hf)
// with transformers.js, offline, and checks it against rpac's own figures:
// for every case, the tokenizer gives rpac's prompt ids, greedy generate
// with the KV cache gives rpac's tokens, and the logits, computed in one
// call over the whole sequence and the Hugging Face way (the prompt, then
// one token a call with past_key_values and a growing attention_mask),
// equal rpac's within the tolerance. Exits non-zero on any difference.
//
// usage: node hf_generate.mjs HF_DIR CASES_JSON
//
// CASES_JSON: {"tolerance": 1e-4, "vocab": V, "cases": [{"text": prompt,
// "ids": rpac's prompt ids, "generated": rpac's greedy tokens, "logits":
// path of rpac's logits after every token of ids+generated, float32
// little-endian [tokens, V]}]}
import { readFileSync } from "node:fs";
import path from "node:path";
import { env, AutoTokenizer, AutoModelForCausalLM, Tensor } from "@huggingface/transformers";

const [dir, casesFile] = process.argv.slice(2);
if (!casesFile) {
  console.error("usage: node hf_generate.mjs HF_DIR CASES_JSON");
  process.exit(2);
}
env.allowRemoteModels = false;
env.allowLocalModels = true;
env.localModelPath = path.dirname(path.resolve(dir)) + path.sep;
const name = path.basename(path.resolve(dir));

const tok = await AutoTokenizer.from_pretrained(name, { local_files_only: true });
const model = await AutoModelForCausalLM.from_pretrained(name, { local_files_only: true, dtype: "fp32", device: "cpu" });
const { tolerance, vocab: V, cases } = JSON.parse(readFileSync(casesFile, "utf8"));

let failed = false;
const fail = (msg) => {
  console.error(msg);
  failed = true;
};
const ids64 = (ids) => new Tensor("int64", BigInt64Array.from(ids, BigInt), [1, ids.length]);
const ones = (n) => new Tensor("int64", new BigInt64Array(n).fill(1n), [1, n]);
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const readF32 = (file) => {
  const b = readFileSync(file);
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
};

// compare checks rows [from, from+rows) of want against got (rows of V
// logits) and returns the largest difference.
function compare(what, got, want, from) {
  const rows = got.length / V;
  let worst = 0;
  for (let i = 0; i < rows * V; i++) {
    const d = Math.abs(got[i] - want[from * V + i]);
    if (!(d <= tolerance)) {
      fail(`${what}: logit ${i % V} after token ${from + Math.floor(i / V)}: ${got[i]} against rpac's ${want[from * V + i]}`);
      return d;
    }
    worst = Math.max(worst, d);
  }
  return worst;
}

// pastOf maps a call's present.{i}.* outputs to the next call's
// past_key_values.{i}.* inputs.
function pastOf(out) {
  const past = {};
  for (const [k, v] of Object.entries(out)) {
    if (k.startsWith("present.")) past[k.replace("present.", "past_key_values.")] = v;
  }
  return past;
}

for (const [n, c] of cases.entries()) {
  const label = `case ${n} (${JSON.stringify(c.text)})`;
  const enc = tok(c.text);
  const ids = Array.from(enc.input_ids.data, Number);
  if (!same(ids, c.ids)) {
    fail(`${label}: tokenizer ids ${JSON.stringify(ids)} against rpac's ${JSON.stringify(c.ids)}`);
    continue;
  }
  const out = await model.generate({ ...enc, max_new_tokens: c.generated.length, do_sample: false });
  const gen = Array.from(out.data, Number).slice(ids.length);
  if (!same(gen, c.generated)) {
    fail(`${label}: generate gave ${JSON.stringify(gen)}, rpac ${JSON.stringify(c.generated)}`);
  }
  const seq = ids.concat(c.generated);
  const want = readF32(c.logits);
  if (want.length !== seq.length * V) {
    fail(`${label}: ${want.length} reference logits for ${seq.length} tokens of ${V}`);
    continue;
  }
  const whole = await model({ input_ids: ids64(seq), attention_mask: ones(seq.length) });
  const dWhole = compare(`${label} one call`, whole.logits.data, want, 0);
  let step = await model({ input_ids: ids64(ids), attention_mask: ones(ids.length) });
  let dSteps = compare(`${label} prompt`, step.logits.data, want, 0);
  for (let t = ids.length; t < seq.length; t++) {
    step = await model({ input_ids: ids64([seq[t]]), attention_mask: ones(t + 1), past_key_values: pastOf(step) });
    const pk = step["present.0.key"].dims;
    if (pk[2] !== t + 1) fail(`${label}: present.0.key holds ${pk[2]} positions after token ${t}, want ${t + 1}`);
    dSteps = Math.max(dSteps, compare(`${label} step ${t}`, step.logits.data, want, t));
  }
  console.log(`${label}: ${ids.length} prompt ids, ${gen.length} generated tokens as rpac's; max |Δlogit| ${dWhole.toExponential(2)} in one call, ${dSteps.toExponential(2)} stepped`);
}
// A batch of two prompts, the shorter left-padded (attention_mask 0 and an
// EOS id there): each row's logits at its real tokens, and after one more
// token a row fed with the past, are its own sequence's.
if (cases.length >= 2) {
  const [a, b] = cases;
  const P = Math.max(a.ids.length, b.ids.length);
  const pad = (ids) => new Array(P - ids.length).fill(model.config.eos_token_id).concat(ids);
  const mask = (ids, extra) => new Array(P - ids.length).fill(0).concat(new Array(ids.length + extra).fill(1));
  const batch = (rows) => new Tensor("int64", BigInt64Array.from(rows.flat(), BigInt), [rows.length, rows[0].length]);
  let out = await model({ input_ids: batch([pad(a.ids), pad(b.ids)]), attention_mask: batch([mask(a.ids, 0), mask(b.ids, 0)]) });
  let worst = 0;
  for (const [r, c] of [a, b].entries()) {
    const want = readF32(c.logits);
    const row = out.logits.data.subarray((r * P + P - c.ids.length) * V, (r + 1) * P * V);
    worst = Math.max(worst, compare(`padded batch row ${r}`, row, want, 0));
  }
  out = await model({ input_ids: batch([[a.generated[0]], [b.generated[0]]]), attention_mask: batch([mask(a.ids, 1), mask(b.ids, 1)]), past_key_values: pastOf(out) });
  for (const [r, c] of [a, b].entries()) {
    worst = Math.max(worst, compare(`padded batch row ${r} step`, out.logits.data.subarray(r * V, (r + 1) * V), readF32(c.logits), c.ids.length));
  }
  console.log(`a left-padded batch of two prompts and a step: each row's logits as its own sequence's, max |Δlogit| ${worst.toExponential(2)}`);
}

// A sequence longer than the export's length L is refused by the decoder.
const L = model.config.max_position_embeddings;
const quiet = console.error; // transformers.js prints the failed run's inputs
console.error = () => {};
try {
  await model({ input_ids: ids64(new Array(L + 1).fill(0)), attention_mask: ones(L + 1) });
  console.error = quiet;
  fail(`a sequence of ${L + 1} tokens ran; the export's length is ${L}`);
} catch (e) {
  console.error = quiet;
  console.log(`a sequence of ${L + 1} tokens is refused: ${String(e.message ?? e).split("\n")[0]}`);
}
process.exit(failed ? 1 : 0);
