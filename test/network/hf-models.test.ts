// A Hugging Face Llama folder served end to end, as a developer brings one:
// `nbcli model import` converts and publishes it (chain attested), `nbcli
// model deploy --stages 2` puts its 2 stages on 2 real miner processes, and
// the official `openai` client gets a streamed chat completion from
// /v1/chat/completions: the text is the in-process reference's (the model's
// chat template rendered, the same 2 stages with f16 rows between them, the
// tokenizer's eos), token for token. Then `nbcli model export` writes the
// published model back as a folder whose tensors are the original's.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import OpenAI from 'openai';
import { generatePrivateKey } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { ModelClient } from '../../src/api/model-client.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { importFolder } from '../../src/model/hf/convert.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { Engine } from '../../src/engine/engine.ts';
import { Generator } from '../../src/inference/generator.ts';
import { inferenceFromCheckpoint } from '../../src/inference/load.ts';
import { HfTokenizer } from '../../src/inference/tokenizer.ts';
import { ModelFolder } from '../../src/model/hf/model-folder.ts';
import { TextTokenizer } from '../../src/model/hf/tokenizer.ts';
import type { StageRange } from '../../src/model/parts.ts';
import type { DeploymentView } from '../../src/api/deployments.ts';
import { TINY_LLAMA_CONFIG, TINY_QWEN2_CONFIG, writeRandomFolder } from '../helpers/hf-folder.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stopGracefully());

test('an imported Llama folder, deployed on 2 stages of 2 miners, streams a chat completion to the openai client identical to the in-process reference; its export is the folder', { timeout: 180_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = 'hf-test';
  await cluster.startOrchestrator(['--min-stake', '0'], { chain: true });
  const home = join(cluster.dir, 'orch');
  const devKey = generatePrivateKey();
  saveWallet(home, 'dev', devKey, 'hf-test', 'light');
  for (const n of ['a', 'b']) saveWallet(home, `w-${n}`, generatePrivateKey(), 'hf-test', 'light');
  await Promise.all(['a', 'b'].map((n) => cluster.startMiner(n, ['--data-dir', home, '--wallet.name', `w-${n}`, '--serve', 'inference'])));
  const nbcli = (...args: string[]) => cluster.nbcli([...args, '--orchestrator', cluster.url], home);

  const folder = join(cluster.dir, 'tiny-llama');
  writeRandomFolder(folder, TINY_LLAMA_CONFIG, { dtype: 'BF16', seed: 21, scale: 0.25 });
  const file = join(cluster.dir, 'tiny-llama.safetensors');
  const imported = await nbcli('model', 'import', folder, '--name', 'tiny-llama', '--out', file, '--wallet.name', 'dev');
  assert.equal(imported.code, 0, imported.stderr);
  const published = imported.out.find((o) => o.event === 'published')!;
  assert.match(String(published.model), /^llama:v512\.t128\.c64\.l2\.h4\.k2\.d16\.i160\./);
  const deployed = await nbcli('model', 'deploy', 'tiny-llama', '--stages', '2', '--wallet.name', 'dev', '--wait', '--timeout', '90');
  assert.equal(deployed.code, 0, deployed.stderr);
  const d = (deployed.out.find((o) => o.event === 'deployed')!.deployment as DeploymentView);
  const cuts: StageRange[] = d.stages.map((s) => ({ from: s.parts[0], to: s.parts[1] }));
  assert.equal(cuts.length, 2);
  assert.equal(new Set(d.stages.flatMap((s) => s.miners.map((m) => m.id))).size, 2, 'two miners, one stage each');
  const key = await nbcli('api-key', 'create', '--name', 'hf-test', '--wallet.name', 'dev');
  assert.equal(key.code, 0, key.stderr);
  const openai = new OpenAI({ baseURL: `${cluster.url}/v1`, apiKey: key.out[0].key as string, maxRetries: 0 });

  // the reference: the model file in this process, cut the same way
  const bytes = new Uint8Array(readFileSync(file));
  const tokenizer = new HfTokenizer(TextTokenizer.fromFolder(folder, 512), 512);
  const messages = [
    { role: 'system' as const, content: 'You are a sailor.' },
    { role: 'user' as const, content: 'Call me Ishmael.' },
  ];
  const prompt = tokenizer.chatPrompt(messages);
  const engine = await Engine.create({ threads: 1 });
  const stages = cuts.map((range) => inferenceFromCheckpoint(engine, bytes, range, { maxSessions: 1 }));
  const g = new Generator(stages, { activations: 'f16' });
  g.add({ prompt, maxTokens: 24, sampling: { temperature: 0.8, topP: 0.95, seed: 11 } });
  const tokens = g.runToEnd()[0].tokens;
  for (const s of stages) s.release();
  await engine.close();
  const eos = tokens.findIndex((t) => tokenizer.eosTokenIds.includes(t));
  const expected = tokenizer.text.decode(eos < 0 ? tokens : tokens.slice(0, eos), true);
  assert.ok(expected.length > 0);

  let text = '';
  let finish: string | null = null;
  let usage: { completion_tokens: number; prompt_tokens: number } | null = null;
  const stream = await openai.chat.completions.create({ model: 'tiny-llama', messages, max_tokens: 24, temperature: 0.8, top_p: 0.95, seed: 11, stream: true, stream_options: { include_usage: true } });
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, expected);
  assert.equal(finish, eos < 0 ? 'length' : 'stop');
  assert.equal(usage?.prompt_tokens, prompt.length);
  assert.equal(usage?.completion_tokens, eos < 0 ? tokens.length : eos + 1);

  // a large file goes up in chunks (what publish does past 256 MiB): resumable, its opener's alone, checked whole before it is stored
  const qwenFolder = join(cluster.dir, 'tiny-qwen');
  writeRandomFolder(qwenFolder, TINY_QWEN2_CONFIG, { seed: 22 });
  const qwenFile = join(cluster.dir, 'tiny-qwen.safetensors');
  importFolder(qwenFolder, qwenFile);
  const qwenBytes = new Uint8Array(readFileSync(qwenFile));
  const qwenSha = createHash('sha256').update(qwenBytes).digest('hex');
  const mine = new ModelClient(new OrchestratorClient(cluster.url, { wallet: devKey }));
  const ticket = await mine.storeLargeFile(qwenFile, qwenSha, { name: 'tiny-qwen', pricePer1kTokens: 0n });
  assert.equal(ticket.model.sha256, qwenSha);
  assert.match(ticket.model.model, /^qwen2:/);
  const stored = await (await mine.openFile(qwenSha)).arrayBuffer();
  assert.deepEqual(new Uint8Array(stored), qwenBytes);
  const stranger = (await new OrchestratorClient(cluster.url, { wallet: generatePrivateKey() }).signed());
  const api = await new OrchestratorClient(cluster.url, { wallet: devKey }).signed();
  const open = JSON.parse(new TextDecoder().decode(await api.request('POST', '/models/uploads', new TextEncoder().encode(JSON.stringify({ bytes: qwenBytes.length, sha256: 'ab'.repeat(32) })), 'application/json'))) as { id: string };
  await assert.rejects(stranger.request('PUT', `/models/uploads/${open.id}?offset=0`, qwenBytes.subarray(0, 10)), (e: unknown) => e instanceof NimbleError && e.status === 404);
  await assert.rejects(api.request('PUT', `/models/uploads/${open.id}?offset=5`, qwenBytes.subarray(0, 10)), (e: unknown) => e instanceof NimbleError && e.status === 409 && /at byte 0, not 5/.test(e.message));
  await api.request('PUT', `/models/uploads/${open.id}?offset=0`, qwenBytes);
  await assert.rejects(api.request('POST', `/models/uploads/${open.id}/store?name=liar&pricePer1kTokens=0`, new Uint8Array(0)), (e: unknown) => e instanceof NimbleError && e.status === 400 && /not the declared/.test(e.message));
  assert.equal((await fetch(`${cluster.url}/models/${'ab'.repeat(32)}`)).status, 404, 'nothing stored under the false sha256');

  // export: the published model, downloaded and checked against the chain, as a folder of the original tensors
  const out = join(cluster.dir, 'exported');
  const exported = await nbcli('model', 'export', 'tiny-llama', '--out', out);
  assert.equal(exported.code, 0, exported.stderr);
  const a = ModelFolder.open(folder), b = ModelFolder.open(out);
  try {
    for (const name of a.entries.keys()) assert.deepEqual(b.read(name), a.read(name), name);
  } finally {
    a.close();
    b.close();
  }
});
