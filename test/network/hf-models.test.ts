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
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import OpenAI from 'openai';
import { generatePrivateKey } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { ModelClient } from '../../src/api/model-client.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { importFolder } from '../../src/model/hf/convert.ts';
import { decoderConfigFromHf, gptConfigOfDecoder } from '../../src/model/hf/decoder-config.ts';
import { writePeftAdapter } from '../../src/model/hf/peft.ts';
import { loraLayout } from '../../src/model/lora.ts';
import { partCount } from '../../src/model/parts.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { ModelFolder } from '../../src/model/hf/model-folder.ts';
import type { DeploymentView } from '../../src/api/deployments.ts';
import { chatReference, cutsOf, SAILOR_CHAT, streamChat } from '../helpers/hf-chat-reference.ts';
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
  const cuts = cutsOf(d);
  assert.equal(cuts.length, 2);
  assert.equal(new Set(d.stages.flatMap((s) => s.miners.map((m) => m.id))).size, 2, 'two miners, one stage each');
  const key = await nbcli('api-key', 'create', '--name', 'hf-test', '--wallet.name', 'dev');
  assert.equal(key.code, 0, key.stderr);
  const openai = new OpenAI({ baseURL: `${cluster.url}/v1`, apiKey: key.out[0].key as string, maxRetries: 0 });

  // the reference: the model file in this process, cut the same way
  const sampling = { maxTokens: 24, temperature: 0.8, topP: 0.95, seed: 11 };
  const ref = await chatReference(file, folder, TINY_LLAMA_CONFIG.vocab_size, cuts, SAILOR_CHAT, sampling);
  assert.ok(ref.expected.length > 0);
  const got = await streamChat(openai, 'tiny-llama', SAILOR_CHAT, sampling);
  assert.equal(got.text, ref.expected);
  assert.equal(got.finishReason, ref.finishReason);
  assert.equal(got.usage?.prompt_tokens, ref.prompt.length);
  assert.equal(got.usage?.completion_tokens, ref.completionTokens);

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

  // export --merge: a PEFT adapter of the model merged into the weights written (its numerics against PyTorch: test/model/hf/lora-reference.test.ts)
  const config = gptConfigOfDecoder(decoderConfigFromHf(TINY_LLAMA_CONFIG));
  const spec = { rank: 2, alpha: 4, dropout: 0, targets: ['q_proj', 'down_proj'] };
  const layout = loraLayout(config, spec, { from: 0, to: partCount(config) });
  const adapters = Float32Array.from({ length: layout.size }, (_, i) => Math.sin(i) * 0.1);
  const adapterDir = join(cluster.dir, 'adapter');
  writePeftAdapter(adapterDir, config, { spec, adapters, baseModel: 'tiny-llama', overwrite: true });
  const mergedDir = join(cluster.dir, 'merged');
  const merged = await nbcli('model', 'export', 'tiny-llama', '--merge', adapterDir, '--out', mergedDir, '--dtype', 'f32');
  assert.equal(merged.code, 0, merged.stderr);
  const base = ModelFolder.open(folder), m = ModelFolder.open(mergedDir);
  try {
    const q = 'model.layers.1.self_attn.q_proj.weight', k = 'model.layers.1.self_attn.k_proj.weight', down = 'model.layers.0.mlp.down_proj.weight';
    assert.notDeepEqual(m.read(q), base.read(q), 'q_proj changed');
    assert.notDeepEqual(m.read(down), base.read(down), 'down_proj changed');
    assert.deepEqual(m.read(k), base.read(k), 'an untargeted module is the base');
    // PEFT's merge: W' = W + (alpha / r) B A, W stored [out, in]
    const B = adapters.subarray(layout.byName.get('h.1.lora.self_attn.q_proj.B')!.offset), A = adapters.subarray(layout.byName.get('h.1.lora.self_attn.q_proj.A')!.offset);
    const w = base.read(q), w2 = m.read(q), IN = config.channels;
    for (const [o, i] of [[0, 0], [3, 5], [7, IN - 1]]) {
      const d = 2 * (B[o * 2] * A[i] + B[o * 2 + 1] * A[IN + i]);
      assert.ok(Math.abs(w2[o * IN + i] - (w[o * IN + i] + d)) < 1e-6, `q_proj[${o}, ${i}]`);
    }
  } finally {
    base.close();
    m.close();
  }
  // an adapter of another model is refused with one line, and nothing is written
  const wrong = join(cluster.dir, 'adapter-wrong');
  writePeftAdapter(wrong, config, { spec, adapters, baseModel: null, overwrite: true });
  writeFileSync(join(wrong, 'adapter_config.json'), JSON.stringify({ ...JSON.parse(readFileSync(join(wrong, 'adapter_config.json'), 'utf8')), target_modules: ['c_attn'] }));
  const refused = await nbcli('model', 'export', 'tiny-llama', '--merge', wrong, '--out', join(cluster.dir, 'merged-wrong'));
  assert.notEqual(refused.code, 0);
  assert.match(refused.stderr, /c_attn/);
  assert.ok(!existsSync(join(cluster.dir, 'merged-wrong')), 'nothing is written');
});
