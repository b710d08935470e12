// The miner's half of a merge round in process: two replicas of one stage,
// trained differently, go through upload → merge → apply with an in-memory
// transport standing in for the orchestrator, and end with the same weights:
// the outer step of their pseudo-gradients' sample-weighted mean.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { aggregate } from '../../src/merge/aggregate.ts';
import { createOuterState, outerStep } from '../../src/merge/outer.ts';
import { partitionVector, type Partition } from '../../src/merge/partition.ts';
import { MergeRounds, type MergeTransport, type RoundRef } from '../../src/miner/merge-round.ts';
import { StageRunner } from '../../src/miner/stage-runner.ts';
import { gptConfig } from '../../src/model/config.ts';
import { splitEvenly } from '../../src/model/parts.ts';
import { mulberry32 } from '../../src/model/init.ts';
import { decodeSafetensors } from '../../src/model/safetensors.ts';
import { DEFAULT_BLOCK_SIZE } from '../../src/protocol/codec.ts';
import type { MergeTask, StageAssignment } from '../../src/protocol/messages.ts';

const model = 'gpt-micro';
const B = 2;
const LR = 0.7, MU = 0.9;
const A_ID = '0x' + 'a'.repeat(40);
const B_ID = '0x' + 'b'.repeat(40);

let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  await engine.close();
});

function assignment(): StageAssignment {
  const range = splitEvenly(gptConfig(model), 3)[1]; // a middle stage: no corpus
  return { runId: 'run-1', stage: 1, stageCount: 3, from: range.from, to: range.to, model, data: 'moby-dick', batchSize: B, seed: 7, round: 0, stateBlob: null, codec: 'f16', lr: 1e-2 };
}

function randomArray(n: number, seed: number, scale = 1): Float32Array {
  const rand = mulberry32(seed);
  return Float32Array.from({ length: n }, () => (rand() * 2 - 1) * scale);
}

/** `steps` inner steps on random activations and gradients drawn from `seed`. */
async function train(runner: StageRunner, steps: number, seed: number): Promise<void> {
  const width = runner.activationShape[0] * runner.activationShape[1];
  for (let i = 0; i < steps; i++) {
    const id = seed * 100 + i + 1;
    await runner.forwardMiddle(id, randomArray(width, seed * 1000 + 2 * i));
    await runner.backward(id, randomArray(width, seed * 1000 + 2 * i + 1, 1e-2));
  }
}

/** The orchestrator's blob store and round bookkeeping, in memory. */
class MemoryStore {
  readonly blobs = new Map<string, Uint8Array>();
  /** per round/partition: each replica's upload */
  readonly uploads = new Map<string, { minerId: string; blob: string; samples: number }[]>();
  readonly merged = new Map<string, string>();
  readonly states: { at: RoundRef; bytes: Uint8Array }[] = [];
  requests = 0;

  private put(bytes: Uint8Array): string {
    const id = createHash('sha256').update(bytes).digest('hex');
    this.blobs.set(id, bytes.slice());
    return id;
  }

  transport(minerId: string): MergeTransport {
    return {
      putPseudoGradient: async (at, partition, samples, frame) => {
        this.requests++;
        const key = `${at.round}/${partition}`;
        const list = this.uploads.get(key) ?? [];
        this.uploads.set(key, [...list.filter((u) => u.minerId !== minerId), { minerId, blob: this.put(frame), samples }]);
      },
      putMerged: async (at, partition, frame) => {
        this.requests++;
        this.merged.set(`${at.round}/${partition}`, this.put(frame));
      },
      putState: async (at, state) => {
        this.requests++;
        this.states.push({ at, bytes: state });
      },
      getBlob: async (id) => {
        const b = this.blobs.get(id);
        if (!b) throw new Error(`no blob ${id}`);
        return b;
      },
    };
  }
}

function task(round: number, partitions: Partition[], patch: Partial<MergeTask>): MergeTask {
  return { round, partitions, upload: false, merge: [], apply: null, saveState: false, aggregator: 'mean', trim: 0, outerLr: LR, outerMomentum: MU, ...patch };
}

/** One merge round the way the orchestrator drives it: upload, merge (partition p by replica p mod 2), apply, save (by the first). */
async function mergeRound(store: MemoryStore, replicas: { id: string; runner: StageRunner; merges: MergeRounds }[], round: number, partitions: Partition[]): Promise<void> {
  for (const r of replicas) await r.merges.run(r.runner, task(round, partitions, { upload: true }));
  for (const [i, r] of replicas.entries()) {
    const merge = partitions.filter((p) => p.index % replicas.length === i).map((p) => ({ partition: p.index, inputs: store.uploads.get(`${round}/${p.index}`)!, maxNorm: null }));
    await r.merges.run(r.runner, task(round, partitions, { merge }));
  }
  const apply = partitions.map((p) => ({ partition: p.index, blob: store.merged.get(`${round}/${p.index}`)! }));
  for (const [i, r] of replicas.entries()) await r.merges.run(r.runner, task(round, partitions, { apply, saveState: i === 0 }));
}

/** Largest magnitude in each int8 block of `x`, per element. */
function blockMax(x: Float32Array): Float64Array {
  const out = new Float64Array(x.length);
  for (let s = 0; s < x.length; s += DEFAULT_BLOCK_SIZE) {
    const e = Math.min(s + DEFAULT_BLOCK_SIZE, x.length);
    let m = 0;
    for (let i = s; i < e; i++) m = Math.max(m, Math.abs(x[i]));
    out.fill(m, s, e);
  }
  return out;
}

test('two replicas end a merge round with the same weights: the outer step of their weighted mean pseudo-gradient', async () => {
  const store = new MemoryStore();
  const stats = { bytesSent: 0, merges: 0 };
  const replicas = [A_ID, B_ID].map((id) => {
    const runner = new StageRunner(engine, assignment(), 2);
    const merges = new MergeRounds({ transport: store.transport(id), stats, log: () => {}, idle: async () => {}, stopped: () => false });
    return { id, runner, merges };
  });
  const [a, b] = replicas;
  const n = a.runner.paramCount;
  const theta0 = (await a.runner.readWeights());
  assert.deepEqual((await b.runner.readWeights()), theta0, 'replicas start from the same weights');
  await train(a.runner, 3, 1);
  await train(b.runner, 2, 2);
  assert.notDeepEqual((await a.runner.readWeights()), (await b.runner.readWeights()));

  // the direct computation: sample-weighted mean of the exact pseudo-gradients, one outer step
  const pgA = (await a.runner.pseudoGradient());
  const pgB = (await b.runner.pseudoGradient());
  const mean = aggregate([pgA, pgB], { method: 'mean', weights: [3, 2] });
  const expected = outerStep(createOuterState(n, { lr: LR, momentum: MU }), theta0, mean);

  const partitions = partitionVector(n, 3);
  await mergeRound(store, replicas, 1, partitions);

  const wA = (await a.runner.readWeights());
  const wB = (await b.runner.readWeights());
  assert.deepEqual(wA, wB, 'both replicas hold bitwise the same weights');
  assert.equal(a.runner.round, 1);
  assert.equal(b.runner.samples, 0);
  assert.deepEqual(a.merges.uploadedRound, 1);
  assert.equal(stats.merges, partitions.length);
  assert.ok(stats.bytesSent > 0);

  // within int8 bounds: each pseudo-gradient quantized (≤ scale/2), then the merged slice (≤ scale/2);
  // the first outer step moves θ by lr·(1 + μ)·Δ
  const maxPg = blockMax(pgA).map((v, i) => Math.max(v, blockMax(pgB)[i]));
  const maxMean = blockMax(mean);
  let worst = 0;
  let moved = 0;
  for (let i = 0; i < n; i++) {
    const e1 = maxPg[i] / 254;
    const e2 = (maxMean[i] + e1) / 254;
    const tol = LR * (1 + MU) * (e1 + e2) * 1.01 + 1e-7 * (1 + Math.abs(expected[i]));
    const err = Math.abs(wA[i] - expected[i]);
    assert.ok(err <= tol, `parameter ${i}: ${wA[i]} vs ${expected[i]} (tolerance ${tol})`);
    worst = Math.max(worst, err);
    moved = Math.max(moved, Math.abs(expected[i] - theta0[i]));
  }
  assert.ok(moved > 10 * worst, `the round moved the weights (${moved}) well beyond the quantization error (${worst})`);

  // the saved state: the merged weights, the outer momentum, round 1; a new replica catches up from it
  assert.equal(store.states.length, 1);
  const { at, bytes } = store.states[0];
  assert.deepEqual(at, { runId: 'run-1', stage: 1, round: 1 });
  assert.equal(decodeSafetensors(bytes).metadata.outerStep, '1');
  const late = new StageRunner(engine, assignment(), 2);
  late.loadState(bytes, 1);
  assert.deepEqual((await late.readWeights()), wA);
  assert.deepEqual((await late.encodeState(1)), bytes, 'the loaded state encodes to the same bytes');
  late.dispose();

  // a repeated task does nothing new
  const requests = store.requests;
  await a.merges.run(a.runner, task(1, partitions, { upload: true, saveState: true }));
  assert.equal(store.requests, requests);
  assert.equal(a.merges.mergedKept, 2, 'a merged partitions 0 and 2 of round 1');

  // a second round (with momentum and error feedback) keeps the replicas in lockstep
  await train(a.runner, 1, 3);
  await train(b.runner, 2, 4);
  await mergeRound(store, replicas, 2, partitions);
  assert.deepEqual((await a.runner.readWeights()), (await b.runner.readWeights()));
  assert.equal(b.runner.round, 2);
  assert.equal(decodeSafetensors(store.states[1].bytes).metadata.outerStep, '2');
  assert.equal(a.merges.mergedKept, 2, "round 2's merges only: what it merged in round 1 is let go");
  for (const r of replicas) r.runner.dispose();
});
