// The walkthrough of docs/models.md and the README, run as a developer runs
// it: `nbcli up --no-demo --miners 2` (a local chain, an orchestrator and 2
// miner child processes, training nothing), then, from another "terminal",
// `nbcli wallet create`, `nbcli model import DIR --name N` (converted,
// published on up's chain), `nbcli model deploy N --stages 2 --wait` and
// `nbcli api-key create`, each with the --orchestrator URL up printed; the
// official `openai` client on that URL's /v1 gets a streamed chat
// completion identical, token for token, to the in-process reference.
// The one difference from the docs: `--port 0` (the docs' up takes 7070,
// which tests running side by side cannot all have).
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import OpenAI from 'openai';
import type { DeploymentView } from '../../src/api/deployments.ts';
import { chatReference, cutsOf, SAILOR_CHAT, streamChat } from '../helpers/hf-chat-reference.ts';
import { TINY_LLAMA_CONFIG, writeRandomFolder } from '../helpers/hf-folder.ts';
import { Cluster, type Proc } from './helpers.ts';

const cluster = new Cluster();
let up: Proc | null = null;

/** SIGINT (up's Ctrl+C, which stops its miners and chain), then the exit code. */
async function interrupt(p: Proc): Promise<number | null> {
  if (p.child.exitCode !== null || p.child.signalCode !== null) return p.child.exitCode;
  const exited = new Promise<number | null>((r) => p.child.once('exit', (code) => r(code)));
  p.child.kill('SIGINT');
  return Promise.race([exited, new Promise<null>((r) => setTimeout(() => r(null), 20_000).unref())]);
}

after(async () => {
  if (up) {
    if ((await interrupt(up)) === null) up.child.kill('SIGKILL');
  }
  await cluster.stop();
});

test('nbcli up --no-demo, then model import, deploy --stages 2 and an API key as docs/models.md says: the openai client streams the in-process reference', { timeout: 300_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = 'up-models';
  const home = join(cluster.dir, 'home');
  up = cluster.spawnNbcli(['up', '--no-demo', '--miners', '2', '--port', '0'], home);
  const serving = await up.waitFor((v) => v.event === 'serving' || v.event === 'error', 120_000);
  assert.equal(serving.event, 'serving', JSON.stringify(serving));
  assert.equal(serving.miners, 2, 'both miners joined before up says it serves');
  const url = serving.url as string;
  assert.match(url, /^http:\/\/127\.0\.0\.1:\d+$/);
  assert.equal(serving.openaiBaseUrl, `${url}/v1`);
  const nbcli = (...args: string[]) => cluster.nbcli(args, home);

  const created = await nbcli('wallet', 'create', '--wallet.name', 'dev');
  assert.equal(created.code, 0, created.stderr);
  const folder = join(cluster.dir, 'tiny-llama');
  writeRandomFolder(folder, TINY_LLAMA_CONFIG, { dtype: 'BF16', seed: 23, scale: 0.25 });
  const imported = await nbcli('model', 'import', folder, '--name', 'tiny-llama', '--wallet.name', 'dev', '--orchestrator', url);
  assert.equal(imported.code, 0, imported.stderr);
  const file = imported.out.find((o) => o.event === 'imported')!.path as string;
  assert.equal(file, join(home, 'models', 'tiny-llama.safetensors'), 'written into the data dir');
  const published = imported.out.find((o) => o.event === 'published')!;
  assert.match(String(published.tx), /^0x[0-9a-f]{64}$/, "published on up's chain");
  const deployed = await nbcli('model', 'deploy', 'tiny-llama', '--stages', '2', '--wallet.name', 'dev', '--wait', '--orchestrator', url);
  assert.equal(deployed.code, 0, deployed.stderr);
  const d = deployed.out.find((o) => o.event === 'deployed')!.deployment as DeploymentView;
  assert.equal(d.status, 'serving');
  const cuts = cutsOf(d);
  assert.equal(cuts.length, 2);
  assert.equal(new Set(d.stages.flatMap((s) => s.miners.map((m) => m.id))).size, 2, "up's two miners, one stage each");
  const key = await nbcli('api-key', 'create', '--wallet.name', 'dev', '--orchestrator', url);
  assert.equal(key.code, 0, key.stderr);

  // nbcli generate's defaults (temperature 0.8, top_p 1, seed 0), so its text is the reference too
  const sampling = { maxTokens: 24, temperature: 0.8, topP: 1, seed: 0 };
  const ref = await chatReference(file, folder, TINY_LLAMA_CONFIG.vocab_size, cuts, SAILOR_CHAT, sampling);
  assert.ok(ref.expected.length > 0);
  const openai = new OpenAI({ baseURL: serving.openaiBaseUrl as string, apiKey: key.out[0].key as string, maxRetries: 0 });
  const got = await streamChat(openai, 'tiny-llama', SAILOR_CHAT, sampling);
  assert.equal(got.text, ref.expected);
  assert.equal(got.finishReason, ref.finishReason);
  assert.equal(got.usage?.prompt_tokens, ref.prompt.length);
  assert.equal(got.usage?.completion_tokens, ref.completionTokens);
  assert.ok(got.chunks > 2, 'streamed in pieces');
  const generated = await nbcli('generate', '--chat', '--model', 'tiny-llama', '--system', SAILOR_CHAT[0].content, '--prompt', SAILOR_CHAT[1].content, '--max-tokens', '24', '--api-key', key.out[0].key as string, '--orchestrator', url);
  assert.equal(generated.code, 0, generated.stderr);
  assert.equal(generated.out[0].text, ref.expected, 'nbcli generate --chat says the same');

  assert.equal(await interrupt(up), 130, 'Ctrl+C stops up, its miners and its chain');
});

test('up --no-demo refuses the demo run\'s options, --job and a bad --port before starting anything', async () => {
  const home = join(cluster.dir, 'refused');
  const steps = await cluster.nbcli(['up', '--no-demo', '--steps', '5', '--no-chain'], home);
  assert.notEqual(steps.code, 0);
  assert.match(steps.stderr, /--no-demo trains nothing; --steps is for the demo run only/);
  const spec = join(cluster.dir, 'nimble.job.json');
  writeFileSync(spec, JSON.stringify({ name: 'up-micro', model: 'gpt-micro', data: 'moby-dick', training: { steps: 20, batchSize: 8, mergeEvery: 10 } }));
  const job = await cluster.nbcli(['up', '--no-demo', '--job', spec, '--no-chain'], home);
  assert.notEqual(job.code, 0);
  assert.match(job.stderr, /--no-demo trains nothing; --job trains a job/);
  const port = await cluster.nbcli(['up', '--no-demo', '--port', '70000', '--no-chain'], home);
  assert.notEqual(port.code, 0);
  assert.match(port.stderr, /--port must be 0-65535, got '70000'/);
});
