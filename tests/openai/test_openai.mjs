// The official `openai` Node client (pinned in package.json / package-lock.json, installed
// by `npm ci`, which scripts/deps.sh --test runs) against tailbatch-serve (ctest label
// `openai`). Starts the server with --port 0 on 127.0.0.1, drives it through the SDK, and
// kills every server it started. Bounded: the whole run has 100 s (ctest allows 120).
//
//   node test_openai.mjs /path/to/tailbatch-serve
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

// The SDK comes from `npm ci` in this folder; without it the test is skipped (exit 77), not passed.
let OpenAI;
try {
  OpenAI = (await import('openai')).default;
} catch (e) {
  console.log(`SKIP: the openai package is not installed (run npm ci in tests/openai, or scripts/deps.sh --test): ${e.message}`);
  process.exit(77);
}

const SERVE = process.argv[2];
const GEN = 'tailbatch-reference-generator';
const EMB = 'tailbatch-reference-embedder';
const servers = [];
let failed = false;

const watchdog = setTimeout(() => fail('the test ran past 100 s'), 100_000);

function fail(msg) {
  console.log('FAIL: ' + msg);
  for (const s of servers) {
    console.log(`--- stderr of ${s.args.join(' ')}, last 3000 characters:\n${s.err.slice(-3000)}`);
  }
  failed = true;
  cleanup();
  process.exit(1);
}
function check(cond, msg) {
  if (!cond) fail(msg);
  console.log('ok   ' + msg);
}
function cleanup() {
  for (const s of servers) s.proc.kill('SIGKILL');
}

async function start(...flags) {
  const args = ['--port', '0', '--warmup-rounds', '1', ...flags];
  const proc = spawn(SERVE, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const s = { proc, args, err: '' };
  servers.push(s);
  proc.stderr.on('data', (d) => { s.err += d.toString(); });
  const line = await new Promise((resolve) => {
    const rl = createInterface({ input: proc.stdout });
    rl.once('line', resolve);
    setTimeout(() => resolve(null), 20_000);
  });
  const m = /^listening on 127\.0\.0\.1:(\d+)$/.exec(line ?? '');
  if (!m) fail(`first line of ${args.join(' ')} is ${line}`);
  s.base = `http://127.0.0.1:${m[1]}`;
  for (let i = 0; i < 400; ++i) {
    try {
      if ((await fetch(`${s.base}/readyz`)).status === 200) return s;
    } catch {}
    await new Promise((r) => setTimeout(r, 50));
  }
  fail(`${args.join(' ')} never became ready`);
}

const client = (s, apiKey = 'unused') => new OpenAI({ baseURL: `${s.base}/v1`, apiKey, maxRetries: 0, timeout: 30_000 });

async function expectError(promise, status, type, what) {
  try {
    await promise;
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === status && e.type === type && typeof e.message === 'string' &&
              e.error?.message?.length > 0 && e.headers?.get?.('x-request-id')?.length > 0,
          `${what} -> ${status} ${type} (${e.constructor.name}: ${e.message})`);
    return e;
  }
  fail(`${what} succeeded; expected ${status}`);
}

async function streamText(stream, chat) {
  let text = '', finish = null, usage = null, first = null, chunks = 0;
  for await (const c of stream) {
    ++chunks;
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    const ch = c.choices[0];
    if (chat && first === null) first = ch.delta;
    text += chat ? (ch.delta.content ?? '') : ch.text;
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { text, finish, usage, first, chunks };
}

async function stats(s) {
  return (await fetch(`${s.base}/v1/stats`)).json();
}

async function main() {
  const a = await start('--gen-max-active', '64', '--decode-delay-ms', '2');
  const oa = client(a);

  // Models.
  const models = [];
  for await (const m of oa.models.list()) models.push(m);
  check(models.length === 2 && models.map((m) => m.id).sort().join() === [EMB, GEN].sort().join() &&
            models.every((m) => m.object === 'model' && m.owned_by && Number.isInteger(m.created)),
        'models.list() lists the generator and the embedder');

  // Completions, streamed and not, at one seed.
  const params = { model: GEN, prompt: 'the river runs by the old town', max_tokens: 12, temperature: 0.8, seed: 42 };
  const c1 = await oa.completions.create(params);
  check(c1.object === 'text_completion' && c1.id.startsWith('cmpl-') && c1.choices.length === 1 &&
            c1.choices[0].finish_reason === 'length' && c1.choices[0].text.length > 0,
        `completions.create -> text, finish_reason length (${JSON.stringify(c1.choices[0].text)})`);
  check(c1.usage.prompt_tokens === 7 && c1.usage.completion_tokens === 12 && c1.usage.total_tokens === 19,
        'completion usage counts the vocabulary tokens (7 + 12)');
  const again = await oa.completions.create(params);
  check(again.choices[0].text === c1.choices[0].text, 'the same seed gives the same text');
  const s1 = await streamText(await oa.completions.create({ ...params, stream: true, stream_options: { include_usage: true } }), false);
  check(s1.text === c1.choices[0].text && s1.finish === 'length', 'streamed text equals the non-streamed text at the same seed');
  check(s1.usage?.completion_tokens === 12 && s1.usage?.prompt_tokens === 7, 'stream_options.include_usage adds the usage chunk');
  const other = await oa.completions.create({ ...params, seed: 43 });
  check(other.choices[0].text !== c1.choices[0].text, 'another seed gives another text');

  // Stop strings: stop at the third word of the free text.
  const words = c1.choices[0].text.trim().split(/[ .,]+/);
  const stopped = await oa.completions.create({ ...params, stop: [' ' + words[2]] });
  const cut = c1.choices[0].text.slice(0, c1.choices[0].text.indexOf(' ' + words[2]));
  check(stopped.choices[0].finish_reason === 'stop' && stopped.choices[0].text === cut,
        `stop cuts the text before the stop string, finish_reason stop (${JSON.stringify(stopped.choices[0].text)})`);

  // Chat, streamed and not.
  const chatParams = { model: GEN, messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello there' }],
                       max_completion_tokens: 10, seed: 5, temperature: 0.7 };
  const ch = await oa.chat.completions.create(chatParams);
  check(ch.object === 'chat.completion' && ch.id.startsWith('chatcmpl-') && ch.choices[0].message.role === 'assistant' &&
            ch.choices[0].message.content.length > 0 && ch.choices[0].finish_reason === 'length' &&
            ch.usage.completion_tokens === 10,
        'chat.completions.create -> an assistant message, usage');
  const cs = await streamText(await oa.chat.completions.create({ ...chatParams, stream: true }), true);
  check(cs.text === ch.choices[0].message.content && cs.first?.role === 'assistant' && cs.finish === 'length' && cs.usage === null,
        "streamed chat: the first delta carries the role, the text equals the non-streamed one, no usage unasked");

  // Embeddings: float and base64 (the SDK's default, decoded by it).
  const ef = await oa.embeddings.create({ model: EMB, input: ['a great film', 'an awful film'], encoding_format: 'float' });
  const v = ef.data[0].embedding;
  const norm = Math.sqrt(v.reduce((s, x) => s + x * x, 0));
  check(ef.object === 'list' && ef.data.length === 2 && v.length === 512 && Math.abs(norm - 1) < 1e-4 && ef.usage.prompt_tokens === 6,
        `embeddings (float): 512 dimensions, L2-normalised (norm ${norm.toFixed(6)}), usage`);
  const eb = await oa.embeddings.create({ model: EMB, input: ['a great film', 'an awful film'] });
  check(eb.data[1].embedding.length === 512 && eb.data.every((d, i) => d.embedding.every((x, k) => Math.abs(x - ef.data[i].embedding[k]) < 1e-7)),
        'embeddings (base64, the SDK default) decode to the float vectors');
  const es = await oa.embeddings.create({ model: EMB, input: 'one string', encoding_format: 'float' });
  check(es.data.length === 1 && es.data[0].index === 0, 'embeddings: a string input is one vector');

  // Errors as the SDK surfaces them.
  await expectError(oa.completions.create({ ...params, model: 'gpt-4o' }), 404, 'not_found_error', 'an unknown model');
  const nErr = await expectError(oa.completions.create({ ...params, n: 2 }), 400, 'invalid_request_error', 'n = 2');
  check(nErr.param === 'n' && /not supported/.test(nErr.message), "n's error names the field");
  await expectError(oa.chat.completions.create({ ...chatParams, logprobs: true }), 400, 'invalid_request_error', 'logprobs');
  await expectError(oa.chat.completions.create({ ...chatParams, tools: [{ type: 'function', function: { name: 'f', parameters: {} } }] }),
                    400, 'invalid_request_error', 'tools');
  await expectError(oa.completions.create({ ...params, max_tokens: 0 }), 400, 'invalid_request_error', 'max_tokens 0');
  await expectError(oa.completions.create({ ...params, stop: ['a', 'b', 'c', 'd', 'e'] }), 400, 'invalid_request_error', 'five stop strings');
  await expectError(oa.embeddings.create({ model: EMB, input: Array(257).fill('x') }), 400, 'invalid_request_error', '257 embedding inputs');
  await expectError(oa.embeddings.create({ model: GEN, input: 'x' }), 404, 'not_found_error', 'embeddings from the generator');
  const unknown = await oa.completions.create({ ...params, max_tokens: 2, some_future_field: { x: 1 } });
  check(unknown.choices[0].text.length > 0, 'unknown fields are ignored');

  // A generation whose X-Request-Timeout-Ms passes mid-decode ends in band.
  const slow = await start('--decode-delay-ms', '20');
  const os = client(slow);
  let got = '', err = null;
  try {
    const st = await os.completions.create({ model: GEN, prompt: 'x', max_tokens: 200, stream: true },
                                           { headers: { 'X-Request-Timeout-Ms': '300' } });
    for await (const c of st) got += c.choices[0]?.text ?? '';
  } catch (e) {
    err = e;
  }
  check(err instanceof OpenAI.APIError && /completion_deadline|deadline/.test(err.message) && got.length > 0,
        `a timeout mid-decode: tokens, then an in-band error the SDK throws (${err?.message})`);

  // Aborting a stream cancels its sequence.
  const before = (await stats(slow)).generate.requests.cancelled;
  const ac = new AbortController();
  const st = await os.completions.create({ model: GEN, prompt: 'abort me', max_tokens: 500, stream: true }, { signal: ac.signal });
  let n = 0;
  try {
    for await (const c of st) {
      if (++n === 3) ac.abort();
    }
  } catch {}
  let cancelled = before;
  for (let i = 0; i < 100 && cancelled === before; ++i) {
    await new Promise((r) => setTimeout(r, 50));
    cancelled = (await stats(slow)).generate.requests.cancelled;
  }
  check(cancelled === before + 1, 'aborting a stream cancels its sequence (seen in /v1/stats)');

  // 64 concurrent completions all succeed, decoded in batches larger than 1.
  const all = await Promise.all(Array.from({ length: 64 }, (_, i) =>
      oa.completions.create({ model: GEN, prompt: `request ${i} of many`, max_tokens: 16, seed: i, temperature: 0.5 })));
  check(all.every((r) => r.choices[0].finish_reason === 'length' && r.usage.completion_tokens === 16), '64 concurrent completions succeed');
  const sizes = (await stats(a)).generate.decode_batch_sizes;
  const largest = Math.max(...Object.keys(sizes).map(Number));
  check(largest > 1, `decode batches larger than 1 (largest ${largest})`);

  // The API key.
  const k = await start('--api-key', 'sekret');
  await expectError(client(k, 'wrong').models.list(), 401, 'authentication_error', 'a wrong key');
  try {
    await client(k, 'wrong').models.list();
  } catch (e) {
    check(e instanceof OpenAI.AuthenticationError, 'a wrong key is an AuthenticationError');
  }
  const listed = await client(k, 'sekret').models.list();
  check(listed.data.length === 2, 'the right key is served');
  check((await fetch(`${k.base}/healthz`)).status === 200 && (await fetch(`${k.base}/metrics`)).status === 200,
        '/healthz and /metrics stay open with a key');
}

main().then(() => {
  cleanup();
  clearTimeout(watchdog);
  if (!failed) console.log('all openai client checks passed');
}, (e) => fail(`unexpected exception: ${e.stack ?? e}`));
