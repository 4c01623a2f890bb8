// Tool calling through the models' own chat templates (Llama 3.1, Qwen2.5,
// Mistral Nemo) on random-weight generated models, with the official OpenAI
// client and LangChain: tool_choice "required" and a named function always
// give calls whose arguments validate against the tool's schema; streamed
// deltas reassemble to the non-streamed answer; tool results go back through
// the template; LangChain's bindTools (two turns), withStructuredOutput (json
// schema and function calling), the SDK's parse() with zod and runTools.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import AjvModule from 'ajv';
import { ChatOpenAI } from '@langchain/openai';
import { HumanMessage, ToolMessage } from '@langchain/core/messages';
import { tool } from '@langchain/core/tools';
import { startServer, BIN, SHARED } from './lib/harness.mjs';

const Ajv = AjvModule.default ?? AjvModule;
const ajv = new Ajv({ strict: false });
const SANITIZED = /asan/.test(BIN);
const REPEAT = SANITIZED ? 1 : 8;

const weather = {
  type: 'object',
  properties: { city: { type: 'string', maxLength: 10 }, unit: { type: 'string', enum: ['c', 'f'] } },
  required: ['city', 'unit'],
  additionalProperties: false,
};
const add = {
  type: 'object',
  properties: { a: { type: 'integer', minimum: 0, maximum: 99 }, b: { type: 'integer', minimum: 0, maximum: 99 } },
  required: ['a', 'b'],
  additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather in a city', parameters: weather } },
  { type: 'function', function: { name: 'add', description: 'Adds two numbers', parameters: add } },
];
const validators = { get_weather: ajv.compile(weather), add: ajv.compile(add) };

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-tools-'));
// Under sanitizers every family gets the small vocabulary: walks of a
// 128k-token trie are what a sanitized build is slowest at.
const small = ['--vocab', '512'];
const families = [
  { name: 'llama3.1', template: 'meta-llama-Llama-3.1-8B-Instruct.jinja', vocab: SANITIZED ? small : ['--vocab-from', path.join(SHARED, 'models/llama3-vocab-tiny-random.gguf')] },
  { name: 'qwen2.5', template: 'Qwen-Qwen2.5-7B-Instruct.jinja', vocab: SANITIZED ? small : ['--vocab-from', path.join(SHARED, 'models/qwen2-vocab-tiny-random.gguf')] },
  { name: 'mistral', template: 'mistralai-Mistral-Nemo-Instruct-2407.jinja', vocab: small },
];

before(async () => {
  for (const f of families) {
    f.file = path.join(tmp, `${f.name}.gguf`);
    execFileSync(BIN, ['gen-model', '--out', f.file, '--dim', '32', '--hidden', '64', '--layers', '1', '--heads', '2',
      '--kv-heads', '1', '--ctx', '4096', '--type', 'q8_0', '--seed', '3', ...f.vocab,
      '--chat-template', path.join(SHARED, 'templates', f.template)]);
    f.srv = await startServer(['--threads', '2', '--parallel', '8', '--ctx', '16384', '--alias', 'x'], { model: f.file });
    f.client = new OpenAI({ baseURL: `${f.srv.url}/v1`, apiKey: 'none', maxRetries: 0 });
  }
});
after(async () => {
  for (const f of families) if (f.srv) await f.srv.stop();
  fs.rmSync(tmp, { recursive: true, force: true });
});

function checkCalls(choice, only) {
  assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice.message));
  const calls = choice.message.tool_calls;
  assert.ok(calls.length >= 1);
  for (const c of calls) {
    assert.equal(c.type, 'function');
    assert.match(c.id, /^[A-Za-z0-9_]+$/);
    if (only) assert.equal(c.function.name, only);
    const validate = validators[c.function.name];
    assert.ok(validate, `unknown function ${c.function.name}`);
    assert.ok(validate(JSON.parse(c.function.arguments)), `${c.function.arguments}: ${ajv.errorsText(validate.errors)}`);
  }
  return calls;
}

async function streamed(client, body) {
  const calls = [];
  let content = '', finish = null;
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
    const d = chunk.choices[0]?.delta ?? {};
    content += d.content ?? '';
    for (const t of d.tool_calls ?? []) {
      calls[t.index] ??= { name: '', arguments: '' };
      if (t.id) calls[t.index].id = t.id;
      calls[t.index].name += t.function?.name ?? '';
      calls[t.index].arguments += t.function?.arguments ?? '';
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  return { content, calls, finish };
}

for (const f of families) {
  test(`${f.name}: required and named calls validate; streams reassemble to the same answer`, async () => {
    const messages = [{ role: 'user', content: 'What is the weather in Paris, and what is 2+3?' }];
    for (let i = 0; i < REPEAT; i++) {
      for (const tool_choice of ['required', { type: 'function', function: { name: 'add' } }]) {
        const only = typeof tool_choice === 'object' ? 'add' : null;
        const body = { model: 'x', messages, tools, tool_choice, max_tokens: 1000, seed: i, temperature: i % 2 ? 1 : 0.7,
          parallel_tool_calls: i % 3 !== 0 };
        const whole = await f.client.chat.completions.create(body);
        const calls = checkCalls(whole.choices[0], only);
        const s = await streamed(f.client, body);
        assert.equal(s.finish, 'tool_calls');
        assert.deepEqual(s.calls.map((c) => [c.name, c.arguments]), calls.map((c) => [c.function.name, c.function.arguments]));
        for (const c of s.calls) assert.ok(c.id);
      }
    }
  });

  test(`${f.name}: tool results go back through the template`, async () => {
    const first = await f.client.chat.completions.create({
      model: 'x', messages: [{ role: 'user', content: 'Add 2 and 3.' }], tools,
      tool_choice: { type: 'function', function: { name: 'add' } }, parallel_tool_calls: false, max_tokens: 200,
    });
    const call = checkCalls(first.choices[0], 'add')[0];
    const { a, b } = JSON.parse(call.function.arguments);
    const second = await f.client.chat.completions.create({
      model: 'x', tools, max_tokens: 16,
      messages: [
        { role: 'user', content: 'Add 2 and 3.' },
        first.choices[0].message,
        { role: 'tool', tool_call_id: call.id, content: String(a + b) },
      ],
    });
    assert.ok(['stop', 'length', 'tool_calls'].includes(second.choices[0].finish_reason));
    // tool_choice none: no calls, the tools are not even shown to the model.
    const none = await f.client.chat.completions.create({
      model: 'x', messages: [{ role: 'user', content: 'hi' }], tools, tool_choice: 'none', max_tokens: 8,
    });
    assert.equal(none.choices[0].message.tool_calls, undefined);
  });

  test(`${f.name}: LangChain bindTools, withStructuredOutput; SDK parse() and runTools`, async () => {
    const llm = new ChatOpenAI({ model: 'x', apiKey: 'none', configuration: { baseURL: `${f.srv.url}/v1` }, maxRetries: 0,
      maxTokens: 300, temperature: 0.8 });
    const addTool = tool(async ({ a, b }) => String(a + b), {
      name: 'add', description: 'Adds two numbers',
      schema: z.object({ a: z.number().int().min(0).max(99), b: z.number().int().min(0).max(99) }),
    });
    const bound = llm.bindTools([addTool], { tool_choice: 'add' });
    const ai = await bound.invoke([new HumanMessage('Add 2 and 3.')]);
    assert.equal(ai.tool_calls.length >= 1, true);
    assert.equal(ai.tool_calls[0].name, 'add');
    assert.ok(validators.add(ai.tool_calls[0].args), JSON.stringify(ai.tool_calls[0].args));
    const result = await addTool.invoke(ai.tool_calls[0]);
    const answer = await llm.bindTools([addTool]).invoke([new HumanMessage('Add 2 and 3.'), ai, result]);
    assert.ok(answer);

    // Bounded by enum and range: a random model ends such an answer in a few tokens.
    const Person = z.object({ name: z.enum(['ann', 'bob', 'cy']), age: z.number().int().min(0).max(120) });
    for (const method of ['jsonSchema', 'functionCalling']) {
      const structured = llm.withStructuredOutput(Person, { method, name: 'person' });
      const p = await structured.invoke('Make up a person.');
      assert.ok(['ann', 'bob', 'cy'].includes(p.name), JSON.stringify(p));
      assert.ok(Number.isInteger(p.age) && p.age >= 0 && p.age <= 120, JSON.stringify(p));
    }

    const parsed = await f.client.chat.completions.parse({
      model: 'x', messages: [{ role: 'user', content: 'A person.' }], max_tokens: 300, seed: 11,
      response_format: zodResponseFormat(Person, 'person'),
    }).catch((e) => assert.fail(`${e.message}: ${JSON.stringify(e.completion?.choices?.[0]?.message)}`));
    const person = parsed.choices[0].message.parsed;
    assert.ok(person && typeof person.name === 'string' && Number.isInteger(person.age), JSON.stringify(parsed.choices[0].message));

    let ran = 0;
    const runner = f.client.chat.completions.runTools({
      model: 'x', max_tokens: 100, messages: [{ role: 'user', content: 'Add 2 and 3.' }],
      tool_choice: { type: 'function', function: { name: 'add' } },
      tools: [{ type: 'function', function: { name: 'add', parameters: add, parse: JSON.parse,
        function: ({ a, b }) => { ran++; return String(a + b); } } }],
    });
    await runner.finalChatCompletion();
    assert.equal(ran, 1);
  });
}
