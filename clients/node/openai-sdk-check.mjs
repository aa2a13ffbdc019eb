// Runs the official openai npm SDK against a running `rpac serve` and
// asserts what it answers; exits non-zero on the first mismatch.
// Usage: node openai-sdk-check.mjs BASE_URL MODEL (a model whose tokenizer
// spells the ids 0..15 as the letters a..p, EOS 15).
import OpenAI, { BadRequestError, NotFoundError } from 'openai';
import assert from 'node:assert/strict';

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 30000 });
const noEOS = { '15': -100 }; // the model's EOS never ends these completions early
const checks = [];
const check = (name, fn) => checks.push([name, fn]);

check('models.list', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, [model]);
  const one = await client.models.retrieve(model);
  assert.equal(one.object, 'model');
});

let plain;
check('completions', async () => {
  const r = await client.completions.create({ model, prompt: 'abc', max_tokens: 8, temperature: 0, logit_bias: noEOS });
  plain = r.choices[0].text;
  assert.equal(r.object, 'text_completion');
  assert.equal(plain.length, 8);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 8);
  assert.equal(r.usage.prompt_tokens, 3);
});

check('completions stream', async () => {
  const s = await client.completions.create({ model, prompt: 'abc', max_tokens: 8, temperature: 0, logit_bias: noEOS, stream: true });
  let text = '';
  let finish = null;
  for await (const c of s) {
    text += c.choices[0].text;
    finish = c.choices[0].finish_reason ?? finish;
  }
  assert.equal(text, plain);
  assert.equal(finish, 'length');
});

check('logprobs', async () => {
  const r = await client.completions.create({ model, prompt: 'abc', max_tokens: 8, temperature: 0, logit_bias: noEOS, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.join(''), plain);
  assert.equal(lp.token_logprobs.length, 8);
  for (let i = 0; i < 8; i++) {
    assert.ok(lp.token_logprobs[i] <= 0, `token_logprobs[${i}] ${lp.token_logprobs[i]}`);
    assert.equal(Object.keys(lp.top_logprobs[i]).length, 2);
    assert.equal(lp.text_offset[i], i);
    for (const v of Object.values(lp.top_logprobs[i])) assert.ok(v <= 0);
  }
});

check('stop', async () => {
  const c = plain[3];
  const r = await client.completions.create({ model, prompt: 'abc', max_tokens: 8, temperature: 0, logit_bias: noEOS, stop: [c] });
  assert.equal(r.choices[0].text, plain.slice(0, plain.indexOf(c)));
  assert.equal(r.choices[0].finish_reason, 'stop');
});

let chat;
check('chat', async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'abc' }], max_tokens: 6, temperature: 0, logit_bias: noEOS });
  assert.equal(r.object, 'chat.completion');
  chat = r.choices[0].message.content;
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(chat.length, 6);
});

check('chat stream', async () => {
  const s = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'abc' }], max_tokens: 6, temperature: 0, logit_bias: noEOS, stream: true });
  let text = '';
  let first = true;
  for await (const c of s) {
    const d = c.choices[0].delta;
    if (first) assert.equal(d.role, 'assistant');
    first = false;
    text += d.content ?? '';
  }
  assert.equal(text, chat);
});

async function rejects(promise, type, param) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof type, `${e?.constructor?.name}: ${e?.message}, want ${type.name}`);
    assert.equal(e.param, param);
    assert.equal(typeof e.code, 'string');
    return true;
  });
}

check('typed errors', async () => {
  await rejects(client.completions.create({ model, prompt: 'abc', best_of: 2 }), BadRequestError, 'best_of');
  await rejects(client.completions.create({ model, prompt: 'abc', logit_bias: { '1': 101 } }), BadRequestError, 'logit_bias');
  await rejects(client.completions.create({ model: 'no-such-model', prompt: 'abc' }), NotFoundError, 'model');
  await rejects(client.chat.completions.create({ model, messages: [{ role: 'user', content: 'a' }], logprobs: true }), BadRequestError, 'logprobs');
  await rejects(client.models.retrieve('no-such-model'), NotFoundError, 'model');
});

for (const [name, fn] of checks) {
  try {
    await fn();
    console.log(`ok ${name}`);
  } catch (e) {
    console.error(`FAIL ${name}: ${e?.stack ?? e}`);
    process.exit(1);
  }
}
