// The network side of the decoder family (Llama, Qwen2, GPT-2) on real
// processes, one orchestrator on its local anvil for every case:
//
// - a training run of an inline Llama reference (GQA, RoPE, SwiGLU, untied
//   head) across 2 stages of 2 replicas on 4 miner child processes: the
//   replicas merge, the loss is finite and falls, and the run's whole-model
//   checkpoint exports as a Hugging Face folder whose config.json reads back
//   as the same Llama; a tied Qwen2 run (q/k/v biases) and a GPT-2 run
//   (LayerNorm, learned positions) complete and export beside it;
// - inference spot checks of an imported Llama deployment: an honest miner's
//   windows pass bit for bit, a miner that adds noise to its answers is
//   caught, evicted and slashed on chain;
// - inference failover: concurrent chat streams of an imported Llama served
//   by 2 stages of 2 replicas, one replica of stage 1 killed with SIGKILL
//   mid-stream: every text is the in-process reference's.
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import Database from 'better-sqlite3';
import OpenAI from 'openai';
import { parseEther, type Address } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import type { DeploymentView } from '../../src/api/deployments.ts';
import { signerFor } from '../../src/chain/client.ts';
import { openChain } from '../../src/chain/session.ts';
import { addStake, readStake } from '../../src/chain/staking.ts';
import { ensureGas, faucet } from '../../src/chain/token.ts';
import { Engine } from '../../src/engine/engine.ts';
import { Generator } from '../../src/inference/generator.ts';
import { inferenceFromCheckpoint } from '../../src/inference/load.ts';
import { HfTokenizer } from '../../src/inference/tokenizer.ts';
import { chainRegistryLookup } from '../../src/inference/verify.ts';
import { Miner } from '../../src/miner/miner.ts';
import { TextTokenizer } from '../../src/model/hf/tokenizer.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import type { StageRange } from '../../src/model/parts.ts';
import { checkpointInfo } from '../../src/model/checkpoint.ts';
import { archModelRef } from '../../src/model/arch-ref.ts';
import { decoderConfigFromHf, gptConfigOfDecoder } from '../../src/model/hf/decoder-config.ts';
import { exportModelFile } from '../../src/model/hf/convert.ts';
import { ModelFolder } from '../../src/model/hf/model-folder.ts';
import { decodeSafetensors } from '../../src/model/safetensors.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { TINY_GPT2_CONFIG, TINY_LLAMA_CONFIG, TINY_QWEN2_CONFIG, writeRandomFolder } from '../helpers/hf-folder.ts';
import { slashedEvents } from '../helpers/chain-events.ts';
import { Cluster, type Proc } from './helpers.ts';

const PASSWORD = 'arch-runs-test';
const cluster = new Cluster();
let cheater: Miner | null = null;
after(async () => {
  await cheater?.stop();
  await cluster.stopGracefully();
});
/** the orchestrator's data dir, where the wallets live */
let home = '';
/** the dev wallet's API key for /v1/chat/completions */
let apiKey = '';
/** each serving miner's child process by its address */
const minerProcs = new Map<string, Proc>();

/** The orchestrator's log lines so far. */
const orchestratorLog = (): string => (cluster.orchestrator?.lines ?? []).filter((l) => l.startsWith('stderr: orchestrator: ')).join('\n');

/** The inline reference of a Hugging Face config with a smaller vocabulary and context (the byte corpus fits 256 ids). */
function smallRef(hf: Record<string, unknown>): string {
  return archModelRef(gptConfigOfDecoder(decoderConfigFromHf({ ...hf, vocab_size: 256, max_position_embeddings: 64 })));
}

async function startCluster(): Promise<void> {
  if (home) return;
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  await cluster.startOrchestrator(['--min-stake', '0', '--inference-check-rate', '1', '--slash-fraction', '0.5'], { chain: true });
  home = join(cluster.dir, 'orch');
  saveWallet(home, 'dev', generatePrivateKey(), PASSWORD, 'light');
  const key = await nbcli('api-key', 'create', '--name', 'arch-runs', '--wallet.name', 'dev');
  assert.equal(key.code, 0, key.stderr);
  apiKey = key.out[0].key as string;
}

const nbcli = (...args: string[]) => cluster.nbcli([...args, '--orchestrator', cluster.url], home);

async function until<T>(what: string, probe: () => Promise<T | null> | T | null, timeoutMs = 60_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== null) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}; orchestrator log:\n${orchestratorLog().split('\n').slice(-30).join('\n')}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** Starts a serving miner child process with a wallet of its own in the data dir; kept by its address. */
async function startServer(name: string, key = generatePrivateKey()): Promise<Proc> {
  saveWallet(home, `w-${name}`, key, PASSWORD, 'light');
  const p = await cluster.startMiner(name, ['--data-dir', home, '--wallet.name', `w-${name}`, '--serve', 'inference']);
  minerProcs.set(((await p.waitFor((v) => v.event === 'started')).address as string).toLowerCase(), p);
  return p;
}

/** Writes a random Llama folder and `nbcli model import`s it (published under `name`, on chain); the model file's path. */
async function importLlama(name: string, seed: number): Promise<{ folder: string; file: string }> {
  const folder = join(cluster.dir, name);
  writeRandomFolder(folder, TINY_LLAMA_CONFIG, { dtype: 'BF16', seed, scale: 0.25 });
  const file = join(cluster.dir, `${name}.safetensors`);
  const imported = await nbcli('model', 'import', folder, '--name', name, '--out', file, '--wallet.name', 'dev');
  assert.equal(imported.code, 0, imported.stderr);
  return { folder, file };
}

/** The deployment's stages once each has `replicas` miners serving. */
async function servingCuts(name: string, replicas: number): Promise<{ deployment: DeploymentView; cuts: StageRange[] }> {
  const deployment = await until(`${name} served by ${replicas} replicas per stage`, async () => {
    const list = (await (await fetch(`${cluster.url}/deployments`)).json()) as DeploymentView[];
    const d = list.find((x) => x.name === name && x.status === 'serving');
    return d && d.stages.every((s) => s.miners.length === replicas && s.miners.every((m) => m.state === 'serving')) ? d : null;
  });
  return { deployment, cuts: deployment.stages.map((s) => ({ from: s.parts[0], to: s.parts[1] })) };
}

test('a Llama reference trains on 2 stages x 2 replicas of real miners: replicas merge, the loss falls, the checkpoint exports as a Llama folder; Qwen2 and GPT-2 runs complete and export', { timeout: 240_000 }, async () => {
  await startCluster();
  const trainers = await Promise.all(['t-a', 't-b', 't-c', 't-d'].map((n) => cluster.startMiner(n, ['--serve', 'training'])));
  // the corpora are bytes: a vocabulary of 512 is refused before anything is planned
  const wide = archModelRef(gptConfigOfDecoder(decoderConfigFromHf(TINY_LLAMA_CONFIG)));
  await assert.rejects(cluster.createRun({ model: wide, data: 'moby-dick', steps: 8, stages: 2 }), (e: unknown) => e instanceof NimbleError && e.status === 400 && /vocabulary of 256, not 512/.test(e.message));
  const llama = smallRef(TINY_LLAMA_CONFIG);
  assert.match(llama, /^llama:v256\.t64\.c64\.l2\.h4\.k2\.d16\.i160\./);
  const run = await cluster.createRun({ model: llama, data: 'moby-dick', steps: 80, stages: 2, mergeEvery: 10, batchSize: 8, lr: 0.003, minMiners: 4 });
  const losses: number[] = [];
  const done = await cluster.waitRun(run.id, (v) => {
    if (v.loss !== null) losses.push(v.loss);
    return v.status === 'completed' || v.status === 'failed';
  }, 200_000);
  assert.equal(done.status, 'completed', JSON.stringify(done));
  assert.equal(done.microbatchesDone, 80);
  assert.equal(done.stages.length, 2);
  for (const s of done.stages) {
    assert.equal(s.replicas.length, 2, `stage ${s.stage} replicas`);
    assert.ok(s.round >= 2, `stage ${s.stage} merged ${s.round} times`);
  }
  assert.ok(done.mergesDone >= 2, `merges: ${done.mergesDone}`);
  assert.ok(losses.length > 5 && losses.every(Number.isFinite), JSON.stringify(losses));
  const early = losses.slice(0, 3).reduce((a, b) => a + b, 0) / 3;
  const late = losses.slice(-3).reduce((a, b) => a + b, 0) / 3;
  console.log(`llama run: loss ${early.toFixed(3)} -> ${late.toFixed(3)} over ${losses.length} readings, ${done.mergesDone} merges`);
  assert.ok(late < early - 0.5, `loss ${early.toFixed(3)} -> ${late.toFixed(3)}`);

  // the merged model: one whole checkpoint, exported as a Hugging Face Llama folder
  const ckpt = await cluster.api.checkpoint(run.id);
  const trained = decodeSafetensors(ckpt);
  const info = checkpointInfo(trained);
  assert.deepEqual([info.from, info.to], [0, 4]);
  assert.equal(archModelRef(info.config), llama);
  const file = join(cluster.dir, 'llama-run.safetensors');
  writeFileSync(file, ckpt);
  const out = join(cluster.dir, 'llama-run-hf');
  exportModelFile(file, out);
  const config = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')) as Record<string, unknown>;
  assert.equal(config.model_type, 'llama');
  assert.deepEqual(config.architectures, ['LlamaForCausalLM']);
  assert.equal(archModelRef(gptConfigOfDecoder(decoderConfigFromHf(config))), llama, 'config.json reads back as the trained model');
  const folder = ModelFolder.open(out);
  try {
    assert.ok(folder.entries.has('model.layers.1.self_attn.k_proj.weight'));
    assert.deepEqual(folder.entries.get('model.layers.1.self_attn.k_proj.weight')!.shape, [32, 64], 'two key/value heads of 16');
    assert.ok(folder.entries.has('lm_head.weight'), 'an untied head');
    assert.deepEqual(folder.read('model.embed_tokens.weight'), trained.tensors.get('wte')!.data, 'the trained embedding, as it was merged');
  } finally {
    folder.close();
  }

  // a tied Qwen2 (q/k/v biases, one key/value head) and a GPT-2 (LayerNorm, learned positions, GELU) train to the end too, and export as their family
  for (const hf of [TINY_QWEN2_CONFIG, TINY_GPT2_CONFIG]) {
    const ref = smallRef(hf);
    const r = await cluster.createRun({ model: ref, data: 'moby-dick', steps: 24, stages: 2, mergeEvery: 6, batchSize: 8, lr: 0.003, minMiners: 4 });
    const v = await cluster.waitRun(r.id, (x) => x.status === 'completed' || x.status === 'failed', 150_000);
    assert.equal(v.status, 'completed', JSON.stringify(v));
    assert.ok(v.mergesDone >= 1 && v.loss !== null && Number.isFinite(v.loss), JSON.stringify(v));
    const bytes = await cluster.api.checkpoint(r.id);
    assert.equal(archModelRef(checkpointInfo(decodeSafetensors(bytes)).config), ref);
    const f = join(cluster.dir, `${hf.model_type}-run.safetensors`);
    writeFileSync(f, bytes);
    const dir = join(cluster.dir, `${hf.model_type}-run-hf`);
    exportModelFile(f, dir);
    const json = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
    assert.equal(json.model_type, hf.model_type);
    assert.equal(archModelRef(gptConfigOfDecoder(decoderConfigFromHf(json))), ref);
  }

  // the trainers are done: out of the way of the serving cases
  for (const p of trainers) p.child.kill('SIGKILL');
});

test('inference spot checks of an imported Llama on 2 stages pass an honest miner bit for bit and slash one that answers with noise', { timeout: 150_000 }, async () => {
  await startCluster();
  const honestKey = generatePrivateKey();
  const cheatKey = generatePrivateKey();
  const honest = privateKeyToAccount(honestKey).address;
  const cheat = privateKeyToAccount(cheatKey).address;
  const session = await openChain({ dataDir: home });
  try {
    for (const [key, address] of [[honestKey, honest], [cheatKey, cheat]] as const) {
      await faucet(session.client, address, parseEther('100'));
      await ensureGas(session.client, address);
      await addStake(session.client, signerFor(session.client, privateKeyToAccount(key)), parseEther('40'));
    }
    await startServer('honest', honestKey);
    cheater = await Miner.start({
      orchestrator: cluster.url,
      dataDir: join(cluster.dir, 'cheat'),
      name: 'cheat',
      threads: 1,
      privateKey: cheatKey,
      serve: 'inference',
      registryLookup: chainRegistryLookup(home),
      // noise of about 5% on every value it answers with
      tamper: { inference: (out) => out.forEach((v, i) => (out[i] = v * (1 + 0.05 * Math.sin(i * 12.9898)) + 0.01 * Math.cos(i))) },
    });
    await importLlama('checked-llama', 31);
    const deployed = await nbcli('model', 'deploy', 'checked-llama', '--stages', '2', '--wallet.name', 'dev', '--wait', '--timeout', '60');
    assert.equal(deployed.code, 0, deployed.stderr);
    const { deployment } = await servingCuts('checked-llama', 1);
    assert.deepEqual(new Set(deployment.stages.flatMap((s) => s.miners.map((m) => m.id.toLowerCase()))), new Set([honest.toLowerCase(), cheat.toLowerCase()]));

    // chat traffic until the cheat is out: every window is checked (--inference-check-rate 1)
    const openai = new OpenAI({ baseURL: `${cluster.url}/v1`, apiKey, maxRetries: 0 });
    const evicted = async (): Promise<boolean> => (await cluster.api.miners()).find((m) => m.id.toLowerCase() === cheat.toLowerCase())?.alive === false;
    for (let i = 0; i < 40 && !(await evicted()); i++) {
      await openai.chat.completions.create({ model: 'checked-llama', messages: [{ role: 'user', content: `Call me Ishmael, ${i} times.` }], max_tokens: 12, seed: i }).catch(() => null);
    }
    await until('the cheat to be evicted', async () => ((await evicted()) ? true : null));
    const log = await until('an honest window checked', () => (new RegExp(`inference check of miner ${honest}[^\\n]*: passed, \\d+ steps, each bitwise equal`, 'i').test(orchestratorLog()) ? orchestratorLog() : null));
    assert.match(log, new RegExp(`inference check of miner ${cheat}[^\\n]*session [^\\n]*: FAILED, step \\d+ of \\d+`, 'i'));
    assert.doesNotMatch(log, new RegExp(`inference check of miner ${honest}[^\\n]*FAILED`, 'i'));

    // slashed on chain, once per failed window; the honest miner never
    const slashes = await until('the slashes to be sent', async () => {
      const all = (await cluster.epochs()).flatMap((e) => e.slashes);
      return all.length > 0 && all.every((x) => x.status !== 'pending') ? all : null;
    });
    assert.ok(slashes.every((x) => x.miner.toLowerCase() === cheat.toLowerCase()), JSON.stringify(slashes));
    const sent = slashes.filter((x) => x.status === 'slashed');
    assert.ok(sent.length >= 1, JSON.stringify(slashes));
    const events = await slashedEvents(session.client);
    assert.equal(events.length, sent.length, 'one Slashed event per slashed row, none twice');
    const slashed = sent.reduce((a, x) => a + BigInt(x.amountWei!), 0n);
    const cheatStake = await readStake(session.client, cheat as Address);
    assert.equal(cheatStake.staked + cheatStake.unstaking, parseEther('40') - slashed);
    assert.ok(slashed >= parseEther('20'), 'the first slash took half of the stake');
    const honestStake = await readStake(session.client, honest as Address);
    assert.equal(honestStake.staked + honestStake.unstaking, parseEther('40'));
    const db = new Database(join(home, 'orchestrator', 'orchestrator.sqlite'), { readonly: true });
    try {
      const charged = db.prepare("SELECT DISTINCT miner_id AS miner FROM work_log WHERE kind = 'failed_check'").all() as { miner: string }[];
      assert.deepEqual(charged.map((c) => c.miner.toLowerCase()), [cheat.toLowerCase()]);
    } finally {
      db.close();
    }
  } finally {
    await session.close();
  }
  // out of the way of the failover case: the honest miner is free again
  await cheater.stop();
  cheater = null;
  const undeployed = await nbcli('model', 'undeploy', 'checked-llama', '--wallet.name', 'dev');
  assert.equal(undeployed.code, 0, undeployed.stderr);
});

test('concurrent chat streams of an imported Llama on 2 stages x 2 replicas, one replica of stage 1 killed with SIGKILL mid-stream: every text is the in-process reference\'s', { timeout: 180_000 }, async () => {
  await startCluster();
  const { folder, file } = await importLlama('chat-llama', 21);
  await Promise.all(['s-a', 's-b', 's-c', 's-d'].map((n) => startServer(n)));
  const deployed = await nbcli('model', 'deploy', 'chat-llama', '--stages', '2', '--replicas', '2', '--wallet.name', 'dev', '--wait', '--timeout', '90');
  assert.equal(deployed.code, 0, deployed.stderr);
  const { deployment, cuts } = await servingCuts('chat-llama', 2);

  // the references: the model file in this process, cut the same way, one generator per stream
  const bytes = new Uint8Array(readFileSync(file));
  const tokenizer = new HfTokenizer(TextTokenizer.fromFolder(folder, 512), 512);
  const cases = [
    { content: 'Call me Ishmael.', temperature: 0.9, top_p: 0.95, seed: 7 },
    { content: 'The whale', temperature: 0, seed: 1 },
    { content: 'Ahab, on shore.', temperature: 1, seed: 3 },
    { content: 'Queequeg', temperature: 1.2, top_p: 0.8, seed: 5 },
  ];
  const MAX_TOKENS = 64;
  const engine = await Engine.create({ threads: 1 });
  const expected = cases.map((c) => {
    const stages = cuts.map((range) => inferenceFromCheckpoint(engine, bytes, range, { maxSessions: 1 }));
    const g = new Generator(stages, { activations: 'f16' });
    g.add({ prompt: tokenizer.chatPrompt([{ role: 'user', content: c.content }]), maxTokens: MAX_TOKENS, sampling: { temperature: c.temperature, topP: c.top_p ?? 1, seed: c.seed } });
    const tokens = g.runToEnd()[0].tokens;
    for (const s of stages) s.release();
    const eos = tokens.findIndex((t) => tokenizer.eosTokenIds.includes(t));
    return { text: tokenizer.text.decode(eos < 0 ? tokens : tokens.slice(0, eos), true), tokens: eos < 0 ? tokens.length : eos };
  });
  await engine.close();
  assert.ok(expected.every((e) => e.tokens >= 24), `every reference runs long enough to be cut: ${expected.map((e) => e.tokens)}`);

  const openai = new OpenAI({ baseURL: `${cluster.url}/v1`, apiKey, maxRetries: 0 });
  const victim = deployment.stages[1].miners[0].id.toLowerCase();
  const proc = minerProcs.get(victim);
  assert.ok(proc, `miner ${victim} is one of ours`);
  const texts = cases.map(() => '');
  const arrivals: number[][] = cases.map(() => []);
  let killedAt = 0;
  const kill = (): void => {
    if (killedAt || !arrivals.every((a) => a.length >= 6)) return;
    killedAt = performance.now();
    proc.child.kill('SIGKILL');
  };
  await Promise.all(cases.map(async (c, i) => {
    const stream = await openai.chat.completions.create({ model: 'chat-llama', messages: [{ role: 'user', content: c.content }], max_tokens: MAX_TOKENS, temperature: c.temperature, top_p: c.top_p, seed: c.seed, stream: true });
    for await (const chunk of stream) {
      texts[i] += chunk.choices[0]?.delta.content ?? '';
      arrivals[i].push(performance.now());
      kill();
    }
  }));
  assert.ok(killedAt > 0, 'the miner was killed while every stream was under way');
  assert.ok(arrivals.every((a) => a.some((at) => at > killedAt)), 'every stream went on after the kill');
  texts.forEach((t, i) => assert.equal(t, expected[i].text, `stream ${i}: ${JSON.stringify(cases[i])}`));
  const replays = cluster.orchestrator!.lines.filter((l) => l.toLowerCase().includes(`(miner ${victim}) failed`) && l.includes('replaying its'));
  assert.ok(replays.length >= 1, `replays logged: ${replays.length}`);
  const gap = Math.max(...arrivals.map((a) => a.find((at) => at > killedAt)! - killedAt));
  console.log(`llama failover: every stream had its next token ${gap.toFixed(0)} ms after the kill`);
});
