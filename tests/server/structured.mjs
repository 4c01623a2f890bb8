// Structured output, enforced: response_format json_schema / json_object and
// GBNF `grammar` on random-weight models (a generated 512-token vocabulary,
// and the Llama 3 and Qwen2 vocabularies), through the official OpenAI
// client. For each of the schemas below, which together use every supported
// keyword, every answer must validate with ajv (a standard validator), in
// streaming and non-streaming modes, with varied sampler settings, while
// unconstrained requests run in the same batches. Unsupported keywords and
// bad grammars are 400s naming the keyword and path, or line and column.
//
// The count per schema is 200 on the small vocabulary (20 per schema on the
// large ones); a sanitizer build runs a tenth of it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import AjvModule from 'ajv';
import addFormatsModule from 'ajv-formats';
import { startServer, postJSON, BIN, SHARED } from './lib/harness.mjs';

const Ajv = AjvModule.default ?? AjvModule;
const addFormats = addFormatsModule.default ?? addFormatsModule;
const SANITIZED = /asan/.test(BIN);
const SCALE = SANITIZED ? 0.1 : 1;

// Schemas, and for strings the model may draw out (unbounded keys and values)
// a push towards the closing quote, with logit_bias, so answers end in time.
const schemas = {
  person: {
    type: 'object',
    properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 120 } },
    required: ['name', 'age'],
    additionalProperties: false,
  },
  color: { enum: ['red', 'green', 'blue'] },
  point: {
    type: 'object',
    properties: { kind: { const: 'point' }, x: { type: 'number', minimum: -5, maximum: 5 }, y: { type: 'integer' } },
    required: ['kind', 'x', 'y'],
  },
  int_list: { type: 'array', items: { type: 'integer', minimum: -50, maximum: 50 }, minItems: 2, maxItems: 5 },
  code: {
    type: 'object',
    properties: { code: { type: 'string', pattern: '^[A-Z]{3}-[0-9]{2,4}$' } },
    required: ['code'],
  },
  formats: {
    type: 'object',
    properties: {
      d: { type: 'string', format: 'date' },
      t: { type: 'string', format: 'time' },
      dt: { type: 'string', format: 'date-time' },
      id: { type: 'string', format: 'uuid' },
      mail: { type: 'string', format: 'email' },
      ip: { type: 'string', format: 'ipv4' },
      url: { type: 'string', format: 'uri' },
    },
    required: ['d', 't', 'dt', 'id', 'mail', 'ip', 'url'],
  },
  bounds: {
    type: 'object',
    properties: {
      p: { type: 'number', minimum: 0, maximum: 1 },
      t: { type: 'number', exclusiveMinimum: -10, exclusiveMaximum: 10.5 },
      big: { type: 'integer', minimum: 1000, maximum: 99999 },
      neg: { type: 'integer', minimum: -1234, maximum: -7 },
    },
    required: ['p', 't', 'big', 'neg'],
  },
  exclusive_int: { type: 'integer', exclusiveMinimum: 5, exclusiveMaximum: 17 },
  nested: {
    type: 'object',
    properties: {
      street: { type: 'string', maxLength: 10 },
      geo: {
        type: 'object',
        properties: { lat: { type: 'number', minimum: -90, maximum: 90 }, lon: { type: 'number', minimum: -180, maximum: 180 } },
        required: ['lat', 'lon'],
        additionalProperties: false,
      },
    },
    required: ['street', 'geo'],
    additionalProperties: false,
  },
  defs: {
    $defs: {
      item: {
        type: 'object',
        properties: { id: { type: 'integer', minimum: 1, maximum: 999 }, label: { type: 'string', maxLength: 6 } },
        required: ['id'],
        additionalProperties: false,
      },
    },
    type: 'array',
    items: { $ref: '#/$defs/item' },
    maxItems: 3,
  },
  tree: {
    $defs: {
      node: {
        type: 'object',
        properties: { v: { type: 'integer', minimum: 0, maximum: 9 }, kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 1 } },
        required: ['v'],
        additionalProperties: false,
      },
    },
    $ref: '#/$defs/node',
  },
  any_of: { anyOf: [{ type: 'string', maxLength: 5 }, { type: 'integer', minimum: 0, maximum: 9 }, { type: 'null' }] },
  one_of: {
    oneOf: [
      {
        type: 'object',
        properties: { shape: { const: 'circle' }, r: { type: 'number', minimum: 0, maximum: 10 } },
        required: ['shape', 'r'],
        additionalProperties: false,
      },
      {
        type: 'object',
        properties: { shape: { const: 'square' }, side: { type: 'integer', minimum: 1, maximum: 9 } },
        required: ['shape', 'side'],
        additionalProperties: false,
      },
    ],
  },
  nullable: {
    type: 'object',
    properties: { note: { type: ['string', 'null'], maxLength: 4 }, n: { type: ['integer', 'null'], minimum: 0, maximum: 3 } },
    required: ['note', 'n'],
    additionalProperties: false,
  },
  extra_typed: {
    type: 'object',
    properties: { id: { type: 'integer', minimum: 0, maximum: 9 } },
    required: ['id'],
    additionalProperties: { type: 'boolean' },
    maxLength: 3, // a string keyword on an object schema: ignored, as JSON Schema says
  },
  extra_any: {
    type: 'object',
    properties: { a: { type: 'boolean' } },
    required: ['a'],
    additionalProperties: true,
  },
  all_of: { allOf: [{ type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false }] },
  tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, minItems: 1, maxItems: 4, uniqueItems: false },
  word: { type: 'string', minLength: 3, maxLength: 8 },
  mixed: {
    type: 'object',
    properties: { flag: { type: 'boolean' }, nothing: { type: 'null' }, maybe: { enum: [1, 'two', null, true] } },
    required: ['flag', 'nothing', 'maybe'],
    additionalProperties: false,
  },
  answer: { type: 'string', pattern: '^(yes|no|maybe)( [a-z]{1,5})?$' },
  optional_only: {
    type: 'object',
    properties: { a: { type: 'integer', minimum: 0, maximum: 5 }, b: { type: 'string', maxLength: 3 }, c: { type: 'boolean' } },
    additionalProperties: false,
  },
  search_pattern: { type: 'string', pattern: '^[a-z]{0,4}\\d{3}' }, // open at the end: any tail
  floats: { type: 'number' },
  strict_openai: {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 8 }, temp: { type: 'number', minimum: -40, maximum: 50 }, unit: { type: 'string', enum: ['c', 'f'] } },
    required: ['city', 'temp', 'unit'],
    additionalProperties: false,
    title: 'Weather',
    description: 'annotations are ignored',
  },
};
// A random model need not end what a grammar lets run on (a free-form key,
// a recursive tree): there, logit_bias favours the character that ends it.
const closers = { extra_typed: '"}', extra_any: '"}]', search_pattern: '"', json_object: '"}]', tree: '}' };

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-structured-'));
const models = [
  { name: 'small', args: ['--vocab', '512'], count: 200 },
  { name: 'llama3', args: ['--vocab-from', path.join(SHARED, 'models/llama3-vocab-tiny-random.gguf')], count: 20 },
  { name: 'qwen2', args: ['--vocab-from', path.join(SHARED, 'models/qwen2-vocab-tiny-random.gguf')], count: 20 },
];
const servers = {};

before(async () => {
  for (const m of models) {
    m.file = path.join(tmp, `${m.name}.gguf`);
    execFileSync(BIN, ['gen-model', '--out', m.file, '--dim', '32', '--hidden', '64', '--layers', '1', '--heads', '2',
      '--kv-heads', '1', '--ctx', '1024', '--type', 'q8_0', '--seed', '7', ...m.args]);
    m.bias = {};
    for (const c of ['"', '}', ']']) {
      const ids = JSON.parse(execFileSync(BIN, ['tokenize', '-m', m.file, '--no-bos', '--pieces', c]).toString());
      m.bias[c] = { [ids.find(([, p]) => p === c)?.[0] ?? ids.at(-1)[0]]: c === '"' ? 100 : 10 };
    }
  }
});
after(async () => {
  for (const s of Object.values(servers)) await s.stop();
  fs.rmSync(tmp, { recursive: true, force: true });
});

async function serverFor(m) {
  if (!servers[m.name]) servers[m.name] = await startServer(['--threads', '2', '--parallel', '16', '--ctx', '8192', '--max-queue', '4096', '--alias', 'x'], { model: m.file });
  return servers[m.name];
}

// Sampler settings cycle through requests: constraints must hold under all of them.
const samplers = [
  {},
  { temperature: 0 },
  { temperature: 1.5, top_p: 0.9 },
  { temperature: 0.7, top_k: 5, frequency_penalty: 1.0 },
  { temperature: 1, min_p: 0.05, presence_penalty: 1.5, seed: 42 },
];

const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

function check(validate, name, text, finish) {
  assert.equal(finish, 'stop', `${name}: finished by ${finish}: ${JSON.stringify(text)}`);
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    assert.fail(`${name}: not JSON: ${JSON.stringify(text)}`);
  }
  if (!validate(value)) assert.fail(`${name}: ${JSON.stringify(text)} fails the schema: ${ajv.errorsText(validate.errors)}`);
}

async function runSchema(client, m, name, schema, count) {
  const validate = ajv.compile(name === 'json_object' ? { type: 'object' } : schema);
  const response_format =
    name === 'json_object' ? { type: 'json_object' } : { type: 'json_schema', json_schema: { name, schema, strict: true } };
  const n = Math.min(10, count);
  const jobs = [];
  for (let r = 0; r < Math.ceil(count / n); r++) {
    const body = {
      model: 'x',
      messages: [{ role: 'user', content: `Give me ${name} number ${r}.` }],
      response_format,
      n,
      max_tokens: 400,
      ...samplers[r % samplers.length],
      ...(closers[name] ? { logit_bias: Object.assign({}, ...[...closers[name]].map((c) => m.bias[c])) } : {}),
    };
    if (r % 2 === 0) {
      jobs.push(client.chat.completions.create(body).then((c) => {
        assert.equal(c.choices.length, n);
        for (const ch of c.choices) check(validate, name, ch.message.content, ch.finish_reason);
      }));
    } else {
      jobs.push((async () => {
        const texts = Array(n).fill(''), finish = Array(n).fill(null);
        for await (const chunk of await client.chat.completions.create({ ...body, stream: true }))
          for (const ch of chunk.choices) {
            texts[ch.index] += ch.delta?.content ?? '';
            finish[ch.index] = ch.finish_reason ?? finish[ch.index];
          }
        for (let i = 0; i < n; i++) check(validate, name, texts[i], finish[i]);
      })());
    }
  }
  await Promise.all(jobs);
}

// Under sanitizers the sweep keeps to the small vocabulary (large ones: the GBNF and logit_bias tests).
for (const m of SANITIZED ? models.slice(0, 1) : models) {
  test(`every answer validates against its schema (${m.name} vocabulary)`, async () => {
    const srv = await serverFor(m);
    const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'none', maxRetries: 0 });
    const count = Math.max(2, Math.round(m.count * SCALE));
    // Unconstrained requests share the batches all along.
    let stop = false, free = 0;
    const background = (async () => {
      while (!stop) {
        const c = await client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 24 });
        assert.equal(c.choices[0].finish_reason === 'length' || c.choices[0].finish_reason === 'stop', true);
        free++;
      }
    })();
    const names = [...Object.keys(schemas), 'json_object'];
    for (let i = 0; i < names.length; i += 2)
      await Promise.all(names.slice(i, i + 2).map((name) => runSchema(client, m, name, schemas[name], count)));
    stop = true;
    await background;
    assert.ok(free > 0);
  });
}

test('unsupported keywords are refused by name and path', async () => {
  const srv = await serverFor(models[0]);
  const cases = [
    [{ type: 'array', uniqueItems: true }, 'uniqueItems', '#/uniqueItems'],
    [{ type: 'object', patternProperties: { '^a': {} } }, 'patternProperties', '#/patternProperties'],
    [{ type: 'object', properties: { a: { type: 'object', minProperties: 1 } } }, 'minProperties', '#/properties/a/minProperties'],
    [{ not: { type: 'string' } }, "'not'", '#/not'],
    [{ type: 'array', items: { type: 'string', format: 'hostname' } }, 'hostname', '#/items/format'],
    [{ type: 'number', multipleOf: 3 }, 'multipleOf', '#/multipleOf'],
    [{ $ref: 'https://example.com/s.json' }, '$ref', '#/$ref'],
    [{ oneOf: [{ type: 'string' }, { type: 'string', maxLength: 3 }] }, 'oneOf', '#/oneOf'],
    [{ type: 'string', pattern: '^(?=a)b$' }, 'pattern', '#/pattern'],
    [{ type: 'array', prefixItems: [{ type: 'string' }] }, 'prefixItems', '#/prefixItems'],
    [{ if: { type: 'string' }, then: { maxLength: 2 } }, "'if'", '#/if'],
    [{ type: 'object', properties: { a: { type: 'string', contentMediaType: 'x' } } }, 'contentMediaType', '#/properties/a/contentMediaType'],
  ];
  for (const [schema, keyword, where] of cases) {
    const r = await postJSON(`${srv.url}/v1/chat/completions`, {
      model: 'x',
      messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'json_schema', json_schema: { name: 's', schema } },
    });
    assert.equal(r.status, 400, JSON.stringify(schema));
    assert.equal(r.json.error.param, 'response_format.json_schema.schema');
    assert.ok(r.json.error.message.includes(keyword), `${r.json.error.message} names ${keyword}`);
    assert.ok(r.json.error.message.includes(`(at ${where})`), `${r.json.error.message} names ${where}`);
  }
  // A malformed schema, a bad response_format type, a grammar beside a JSON format.
  let r = await postJSON(`${srv.url}/v1/chat/completions`, {
    model: 'x', messages: [{ role: 'user', content: 'x' }],
    response_format: { type: 'json_schema', json_schema: { schema: { type: 'object', required: 'a' } } },
  });
  assert.equal(r.status, 400);
  assert.match(r.json.error.message, /'required' must be an array/);
  r = await postJSON(`${srv.url}/v1/chat/completions`, { model: 'x', messages: [{ role: 'user', content: 'x' }], response_format: { type: 'xml' } });
  assert.equal(r.status, 400);
  r = await postJSON(`${srv.url}/v1/chat/completions`, {
    model: 'x', messages: [{ role: 'user', content: 'x' }], grammar: 'root ::= "a"', response_format: { type: 'json_object' },
  });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'grammar');
});

test('GBNF grammars: constrain completions and chat, and a bad one is a 400 with line and column', async () => {
  const srv = await serverFor(models[1]);
  const grammar = 'root ::= "- " item ("\\n- " item){1,3}\nitem ::= [a-z]{1,6}\n';
  for (const kind of ['completions', 'chat/completions']) {
    const body = kind === 'completions' ? { prompt: 'List:' } : { messages: [{ role: 'user', content: 'List' }] };
    for (let i = 0; i < 6; i++) {
      const r = await postJSON(`${srv.url}/v1/${kind}`, { model: 'x', ...body, grammar, max_tokens: 200, seed: i });
      assert.equal(r.status, 200, r.text);
      const ch = r.json.choices[0];
      assert.match(kind === 'completions' ? ch.text : ch.message.content, /^- [a-z]{1,6}(\n- [a-z]{1,6}){1,3}$/);
      assert.equal(ch.finish_reason, 'stop');
    }
  }
  const r = await postJSON(`${srv.url}/v1/completions`, { model: 'x', prompt: 'x', grammar: 'root ::= item\n\nitem ::= "a" [b-\n' });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'grammar');
  assert.match(r.json.error.message, /line 3, column 15: the range's end is below its start/);
});

test('logit_bias: -100 bans a token, +100 forces it; bad entries are 400s', async () => {
  const m = models[1]; // byte-level BPE: a piece tokenizes back to its token
  const srv = await serverFor(m);
  const body = { model: 'x', prompt: 'Once', max_tokens: 8, temperature: 0 };
  const plain = (await postJSON(`${srv.url}/v1/completions`, { ...body, logprobs: 1 })).json;
  const first = plain.choices[0].logprobs.tokens[0];
  const ids = JSON.parse(execFileSync(BIN, ['tokenize', '-m', m.file, '--no-bos', first]).toString());
  const banned = (await postJSON(`${srv.url}/v1/completions`, { ...body, logprobs: 1, logit_bias: { [ids[0]]: -100 } })).json;
  assert.notEqual(banned.choices[0].logprobs.tokens[0], first);
  const forced = (await postJSON(`${srv.url}/v1/completions`, { ...body, temperature: 1, logprobs: 1, logit_bias: { 300: 100 } })).json;
  const toks = forced.choices[0].logprobs.tokens;
  assert.equal(toks.length, 8);
  assert.ok(toks.every((t) => t === toks[0]), JSON.stringify(toks));
  for (const bad of [{ abc: 1 }, { 999999: 1 }, { 5: 101 }, { 5: 'x' }, [1]]) {
    const r = await postJSON(`${srv.url}/v1/completions`, { ...body, logit_bias: bad });
    assert.equal(r.status, 400, JSON.stringify(bad));
    assert.equal(r.json.error.param, 'logit_bias');
  }
});
