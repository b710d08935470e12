// Serving a completion through the stage miners, end to end: a real
// orchestrator on its local anvil, 4 real miner processes serving the 2 stages
// of a published gpt-micro (2 replicas each), and the OpenAI HTTP API called
// by the official `openai` client (its `baseURL` pointed at the orchestrator)
// and by plain fetch (POST /v1/completions with and without `stream`, GET
// /v1/models). The text equals generateCached on the same checkpoint, seed and
// sampling options in this process, cut into the deployment's stages with the
// activations rounded to f16 between them as the frames round them, byte for
// byte, whichever replicas serve it: the miners and this process run the same
// kernel build (build/, the one the worktree links). Bad requests get 4xx
// answers in OpenAI's error shape. Then several concurrent streams, one
// replica of stage 1 killed with SIGKILL while every stream is under way: the
// sessions on it are replayed on the other replica and every text is still
// the reference's. Last, the dashboard's playground in a headless Chromium
// streams a completion with the API key typed into it, and its Wallets page
// shows the data dir's wallets with their balances.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import chromium from '@sparticuz/chromium';
import { chromiumExecutablePath } from '../../src/engine/webgpu/chromium-unpack.ts';
import OpenAI from 'openai';
import pw from 'playwright-core';
import { generatePrivateKey } from 'viem/accounts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { Engine } from '../../src/engine/engine.ts';
import { generateCached } from '../../src/inference/generate.ts';
import type { StageRange } from '../../src/model/parts.ts';
import type { DeploymentView } from '../../src/api/deployments.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';
import { Cluster, type Proc } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stopGracefully());
const MINERS = ['a', 'b', 'c', 'd'];
/** each miner's process by its address */
const minerProcs = new Map<string, Proc>();
let bytes: Uint8Array = new Uint8Array(0);
/** the dev wallet's API key for /v1/completions */
let apiKey = '';
/** the deployment's cut, once placed */
let cuts: StageRange[] = [];

/** The deployment of moby-micro once every replica serves. */
async function servingDeployment(timeoutMs = 60_000): Promise<DeploymentView> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const list = (await (await fetch(`${cluster.url}/deployments`)).json()) as DeploymentView[];
    const d = list.find((x) => x.name === 'moby-micro' && x.status === 'serving');
    if (d && d.stages.every((s) => s.miners.length === 2 && s.miners.every((m) => m.state === 'serving'))) return d;
    if (Date.now() > end) throw new Error(`moby-micro is not served by 2 replicas per stage: ${JSON.stringify(d ?? list)}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** The text of a server-sent-events completion stream, its chunks and finish reason. */
async function readStream(res: Response): Promise<{ text: string; chunks: number; finish: string | null; done: boolean }> {
  const raw = await res.text();
  let text = '';
  let chunks = 0;
  let finish: string | null = null;
  let done = false;
  for (const event of raw.split('\n\n')) {
    if (!event.startsWith('data: ')) continue;
    const data = event.slice(6);
    if (data === '[DONE]') {
      done = true;
      continue;
    }
    const v = JSON.parse(data) as { choices: { text: string; finish_reason: string | null }[]; error?: unknown };
    assert.equal(v.error, undefined, data);
    chunks++;
    text += v.choices[0].text;
    finish = v.choices[0].finish_reason ?? finish;
  }
  return { text, chunks, finish, done };
}

test('a completion generated through 2 stages of 2 replicas, streamed and not, equals generateCached cut the same way with f16 activations; bad requests get OpenAI-shaped 4xx', { timeout: 150_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = 'serve-test';
  await cluster.startOrchestrator(['--min-stake', '0'], { chain: true });
  const home = join(cluster.dir, 'orch');
  saveWallet(home, 'dev', generatePrivateKey(), 'serve-test', 'light');
  for (const n of MINERS) saveWallet(home, `w-${n}`, generatePrivateKey(), 'serve-test', 'light');
  const procs = await Promise.all(MINERS.map((name) => cluster.startMiner(name, ['--data-dir', home, '--wallet.name', `w-${name}`, '--serve', 'inference'])));
  for (const p of procs) minerProcs.set(((await p.waitFor((v) => v.event === 'started')).address as string).toLowerCase(), p);
  const nbcli = (...args: string[]) => cluster.nbcli([...args, '--orchestrator', cluster.url], home);

  bytes = wholeModelBytes(41, 500);
  const file = join(cluster.dir, 'micro.safetensors');
  writeFileSync(file, bytes);
  assert.equal((await nbcli('model', 'publish', '--file', file, '--name', 'moby-micro', '--wallet.name', 'dev')).code, 0);
  const other = join(cluster.dir, 'other.safetensors');
  writeFileSync(other, wholeModelBytes(42, 500));
  assert.equal((await nbcli('model', 'publish', '--file', other, '--name', 'kept-micro', '--wallet.name', 'dev')).code, 0);
  const deployed = await nbcli('model', 'deploy', 'moby-micro', '--stages', '2', '--replicas', '2', '--wallet.name', 'dev', '--wait', '--timeout', '60');
  assert.equal(deployed.code, 0, deployed.stderr);
  cuts = (await servingDeployment()).stages.map((s) => ({ from: s.parts[0], to: s.parts[1] }));
  assert.equal(cuts.length, 2);
  // completions take an API key (the model is free: published without a price)
  const created = await nbcli('api-key', 'create', '--name', 'serve-test', '--wallet.name', 'dev');
  assert.equal(created.code, 0, created.stderr);
  apiKey = created.out[0].key as string;

  const base = `${cluster.url}/v1`;
  const openai = new OpenAI({ baseURL: base, apiKey, maxRetries: 0 });
  const headers = { 'content-type': 'application/json', authorization: `Bearer ${apiKey}` };
  const post = (body: unknown): Promise<Response> => fetch(`${base}/completions`, { method: 'POST', headers, body: JSON.stringify(body) });

  const models = (await (await fetch(`${base}/models`)).json()) as { object: string; data: { id: string; sha256: string }[] };
  assert.equal(models.object, 'list');
  assert.deepEqual(models.data.map((m) => [m.id, m.sha256]), [['moby-micro', createHash('sha256').update(bytes).digest('hex')]]);

  const engine = await Engine.create({ threads: 1 });
  const cases = [
    { prompt: 'Call me Ishmael. ', max_tokens: 40, temperature: 0.9, top_p: 0.95, seed: 7 },
    { prompt: 'The whale', max_tokens: 30, temperature: 0, seed: 1 },
    { prompt: 'Ahab ', max_tokens: 60, temperature: 1, seed: 3, stop: ['e'] },
  ];
  for (const c of cases) {
    const local = generateCached(engine, bytes, c.prompt, { maxTokens: c.max_tokens, temperature: c.temperature, topP: c.top_p, seed: c.seed, stop: c.stop, stages: cuts, activations: 'f16' });
    const res = await post({ model: 'moby-micro', ...c, stream: true });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /text\/event-stream/);
    const streamed = await readStream(res);
    assert.ok(streamed.done, 'the stream ends with [DONE]');
    assert.equal(streamed.text, local.text, `streamed text of ${JSON.stringify(c)}`);
    assert.ok(streamed.chunks > 1, `streamed in ${streamed.chunks} chunks`);
    assert.ok(local.text.length > 0);
    assert.equal(streamed.finish, local.finishReason);
    const whole = (await (await post({ model: 'moby-micro', ...c })).json()) as { object: string; choices: { text: string; finish_reason: string }[]; usage: { prompt_tokens: number; completion_tokens: number } };
    assert.equal(whole.object, 'text_completion');
    assert.equal(whole.choices[0].text, local.text);
    assert.equal(whole.choices[0].finish_reason, local.finishReason);
    assert.deepEqual([whole.usage.prompt_tokens, whole.usage.completion_tokens], [local.promptTokens, local.completionTokens]);

    // the official client, whole and streamed
    const request = { model: 'moby-micro', prompt: c.prompt, max_tokens: c.max_tokens, temperature: c.temperature, top_p: c.top_p, seed: c.seed, stop: c.stop };
    const viaClient = await openai.completions.create(request);
    assert.equal(viaClient.choices[0].text, local.text, `openai client, ${JSON.stringify(c)}`);
    assert.equal(viaClient.choices[0].finish_reason, local.finishReason);
    let streamedByClient = '';
    for await (const chunk of await openai.completions.create({ ...request, stream: true })) streamedByClient += chunk.choices[0]?.text ?? '';
    assert.equal(streamedByClient, local.text, `openai client stream, ${JSON.stringify(c)}`);
    if (c === cases[0]) {
      // and nbcli generate, from the terminal; without a key it is refused with the orchestrator's words
      const flags = ['--model', 'moby-micro', '--prompt', c.prompt, '--max-tokens', String(c.max_tokens), '--temperature', String(c.temperature), '--top-p', String(c.top_p), '--seed', String(c.seed)];
      const generated = await nbcli('generate', ...flags, '--api-key', apiKey);
      assert.equal(generated.code, 0, generated.stderr);
      assert.equal(generated.out[0].text, local.text, 'nbcli generate');
      const keyless = await nbcli('generate', ...flags);
      assert.equal(keyless.code, 1);
      assert.match(keyless.stderr, /no API key/);
    }
  }
  const listed = await openai.models.list();
  assert.deepEqual(listed.data.map((m) => m.id), ['moby-micro']);
  await assert.rejects(openai.completions.create({ model: 'no-such-model', prompt: 'hi' }), (e: unknown) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(openai.completions.create({ model: 'moby-micro', prompt: 'hi', max_tokens: 5000 }), (e: unknown) => e instanceof OpenAI.BadRequestError);


  await engine.close();

  // bad input: a clear 4xx in OpenAI's error shape
  const refused = async (body: unknown, status: number, code: RegExp | string): Promise<void> => {
    const res = await post(body);
    const v = (await res.json()) as { error: { message: string; type: string; code: string } };
    assert.equal(res.status, status, JSON.stringify(v));
    assert.equal(typeof v.error.message, 'string');
    assert.match(v.error.code, typeof code === 'string' ? new RegExp(`^${code}$`) : code);
  };
  await refused({ model: 'moby-micro', prompt: 'x'.repeat(20_000) }, 400, 'prompt_too_long');
  await refused({ model: 'moby-micro', prompt: 'hi', max_tokens: 0 }, 400, 'invalid_value');
  await refused({ model: 'moby-micro', prompt: 'hi', max_tokens: 5000 }, 400, 'invalid_value');
  await refused({ model: 'moby-micro', prompt: 'hi', temperature: 3 }, 400, 'invalid_value');
  await refused({ model: 'moby-micro', prompt: 'hi', top_p: 0 }, 400, 'invalid_value');
  await refused({ model: 'moby-micro', prompt: [1, 300] }, 400, 'invalid_value');
  await refused({ model: 'moby-micro', prompt: '\ud800' }, 400, 'invalid_value');
  await refused({ model: 'no-such-model', prompt: 'hi' }, 404, 'model_not_found');
  await refused({ model: 'kept-micro', prompt: 'hi' }, 409, 'model_not_deployed');
  const notJson = await fetch(`${base}/completions`, { method: 'POST', headers, body: '{' });
  assert.equal(notJson.status, 400);
  assert.equal(typeof ((await notJson.json()) as { error: { message: string } }).error.message, 'string');
});

test('concurrent streams through the openai client, one replica of stage 1 killed with SIGKILL mid-stream: every text is the one without the failure', { timeout: 120_000 }, async () => {
  const deployment = await servingDeployment();
  const engine = await Engine.create({ threads: 1 });
  const cases = [
    { prompt: 'Call me Ishmael. ', max_tokens: 400, temperature: 0.9, top_p: 0.95, seed: 7 },
    { prompt: 'The whale', max_tokens: 400, temperature: 0, seed: 1 },
    { prompt: 'Ahab ', max_tokens: 400, temperature: 1, seed: 3 },
    { prompt: 'Queequeg', max_tokens: 400, temperature: 1.2, top_p: 0.8, seed: 5 },
  ];
  const expected = cases.map((c) => generateCached(engine, bytes, c.prompt, { maxTokens: c.max_tokens, temperature: c.temperature, topP: c.top_p, seed: c.seed, stages: cuts, activations: 'f16' }).text);
  await engine.close();
  const openai = new OpenAI({ baseURL: `${cluster.url}/v1`, apiKey, maxRetries: 0 });
  const victim = deployment.stages[1].miners[0].id.toLowerCase();
  const proc = minerProcs.get(victim);
  assert.ok(proc, `miner ${victim} is one of ours`);
  const texts = cases.map(() => '');
  const arrivals: number[][] = cases.map(() => []);
  let killedAt = 0;
  const kill = (): void => {
    if (killedAt || !texts.every((t) => t.length >= 8)) return;
    killedAt = performance.now();
    proc.child.kill('SIGKILL');
  };
  await Promise.all(cases.map(async (c, i) => {
    const stream = await openai.completions.create({ model: 'moby-micro', ...c, stream: true });
    for await (const chunk of stream) {
      texts[i] += chunk.choices[0]?.text ?? '';
      arrivals[i].push(performance.now());
      kill();
    }
  }));
  assert.ok(killedAt > 0, 'the miner was killed while every stream was under way');
  assert.ok(arrivals.every((a) => a.some((at) => at > killedAt)), 'every stream went on after the kill');
  texts.forEach((t, i) => assert.equal(t, expected[i], `stream ${i}: ${JSON.stringify(cases[i])}`));
  // the sessions on the killed replica were replayed (the orchestrator logs each replay)
  const replays = cluster.orchestrator!.lines.filter((l) => l.toLowerCase().includes(`(miner ${victim}) failed`) && l.includes('replaying its'));
  assert.ok(replays.length >= 1, `replays logged: ${replays.length}`);
  // from the kill to the next token of every stream (those on the killed replica waited for their replay)
  const gap = Math.max(...arrivals.map((a) => a.find((at) => at > killedAt)! - killedAt));
  console.log(`failover: every stream had its next token ${gap.toFixed(0)} ms after the kill`);
  assert.ok(gap < 5_000, `${gap} ms from the kill to the next token`);
});

test('the dashboard playground streams the deployed model\'s completion with the API key typed in, byte for byte; no key or a wrong one is refused in the page, and the key is in no URL; the Wallets page shows the data dir\'s wallets with their balances', { timeout: 120_000 }, async () => {
  const engine = await Engine.create({ threads: 1 });
  const c = { prompt: 'Call me Ishmael. ', max_tokens: 48, temperature: 0.9, seed: 11 };
  const local = generateCached(engine, bytes, c.prompt, { maxTokens: c.max_tokens, temperature: c.temperature, seed: c.seed, stages: cuts, activations: 'f16' });
  await engine.close();
  const browser = await pw.chromium.launch({ executablePath: await chromiumExecutablePath(chromium), args: chromium.args, headless: true });
  try {
    const page = await (await browser.newContext({ locale: 'en-US' })).newPage();
    const urls: string[] = [];
    page.on('request', (r) => urls.push(r.url()));
    await page.goto(`${cluster.url}/#/playground`);
    await page.waitForFunction(() => [...document.querySelectorAll('#pg-model option')].some((o) => o.textContent === 'moby-micro'), null, { timeout: 30_000 });
    await page.fill('#pg-prompt', c.prompt);
    await page.fill('#pg-max-tokens', String(c.max_tokens));
    await page.fill('#pg-temperature', String(c.temperature));
    await page.fill('#pg-seed', String(c.seed));
    const message = (): Promise<string> => page.evaluate(() => document.querySelector('#message')?.textContent ?? '');
    await page.click('#pg-generate');
    await page.waitForFunction(() => /API key is needed/.test(document.querySelector('#message')?.textContent ?? ''));
    await page.fill('#pg-key', `nk-${'0'.repeat(48)}`);
    await page.click('#pg-generate');
    await page.waitForFunction(() => document.querySelector('#pg-output')?.getAttribute('data-state') === 'error');
    assert.match(await message(), /^401: /);
    await page.fill('#pg-key', apiKey);
    await page.click('#pg-generate');
    await page.waitForFunction(() => document.querySelector('#pg-output')?.getAttribute('data-state') === 'done', null, { timeout: 60_000 });
    assert.equal(await page.textContent('#pg-output'), local.text);
    assert.match((await page.textContent('#pg-status')) ?? '', /ended at 48 tokens/);
    assert.ok(urls.length > 0 && urls.every((u) => !u.includes(apiKey) && !u.includes('nk-')), 'no key in any URL');
    // the README's pictures, when asked (as test/web/dashboard.test.ts does for the other pages)
    const images = new URL('../../docs/images', import.meta.url).pathname;
    if (process.env.NIMBLE_SCREENSHOTS === '1') {
      await page.fill('#pg-key', '');
      await page.screenshot({ fullPage: true, path: join(images, 'dashboard-playground.png') });
    }

    // the Wallets page: the data dir's wallets with their balances on the chain, as nbcli wallet balance reads them
    const home = join(cluster.dir, 'orch');
    const minted = await cluster.nbcli(['wallet', 'faucet', '--wallet.name', 'dev', '--amount', '12.345678901234567891'], home);
    assert.equal(minted.code, 0, minted.stderr);
    await page.goto(`${cluster.url}/#/wallets`);
    await page.waitForSelector('[data-wallet="dev"]', { timeout: 15_000 });
    for (const name of ['dev', 'w-a']) {
      const balance = await cluster.nbcli(['wallet', 'balance', '--wallet.name', name], home);
      assert.equal(balance.code, 0, balance.stderr);
      const v = balance.out[0] as { address: string; free: string; staked: string };
      const row = await page.$$eval(`[data-wallet="${name}"]`, (els) => [...(els[0].closest('tr')?.querySelectorAll('td') ?? [])].map((td) => [td.textContent ?? '', td.querySelector('span')?.getAttribute('title') ?? '']));
      assert.equal(row[1][0], v.address, name);
      assert.equal(row[2][1], `${v.free} NIM`, `${name}: the exact free amount in the tooltip`);
      assert.equal(row[3][1], `${v.staked} NIM`, `${name}: staked`);
    }
    // shown rounded for people, exact in the tooltip
    const dev = await page.$eval('[data-wallet="dev"]', (el) => el.closest('tr')?.querySelectorAll('td')[2]?.textContent);
    assert.equal(dev, '12.3457');
    assert.match((await page.textContent('#wallets-summary')) ?? '', /5 wallets in .*wallets · balances on chain \d+/);
    if (process.env.NIMBLE_SCREENSHOTS === '1') await page.screenshot({ fullPage: true, path: join(images, 'dashboard-wallets.png') });
  } finally {
    await browser.close();
  }
});
