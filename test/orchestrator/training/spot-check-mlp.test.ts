// Spot checks of an MLP classifier's run (one stage: the loss): the
// orchestrator recomputes the loss of the shard's spam batch from the weights
// in the bundle, on its own engine (plain SIMD, as another machine would
// compute it), and passes an honest miner's bundle; a loss reported off, or
// weights out of AdamW's reach of the merged state, fail, and a failed check
// is charged to the miner.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { loadSpamDataset } from '../../../src/data/spam.ts';
import { Engine } from '../../../src/engine/engine.ts';
import { StageRunner } from '../../../src/miner/stage-runner.ts';
import { initParams } from '../../../src/model/init.ts';
import { stageLayout } from '../../../src/model/model-ref.ts';
import { FsBlobStore } from '../../../src/orchestrator/blobs/blobs.ts';
import { Offences } from '../../../src/orchestrator/rewards/offences.ts';
import { MLP_LOSS_TOLERANCE, verifyMlpForward, type MlpCheckContext } from '../../../src/orchestrator/training/spot-check-verify.ts';
import { SpotChecks } from '../../../src/orchestrator/training/spot-checks.ts';
import { StageStates } from '../../../src/orchestrator/training/stage-states.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { decodeCheckBundle, encodeCheckBundle, type CheckMeta } from '../../../src/protocol/check-bundle.ts';
import type { StageAssignment } from '../../../src/protocol/messages.ts';

let miner: Engine;
let verifier: Engine;
before(async () => {
  miner = await Engine.create({ threads: 2 });
  verifier = await Engine.create({ threads: 1, simd: 'plain' });
});
after(async () => {
  await miner.close();
  await verifier.close();
});

const model = 'mlp:256-16-2';
const config = { inputs: 256, hidden: [16], classes: 2 };
const B = 16;
const seed = 3;
const lr = 1e-2;
const assignment: StageAssignment = { runId: 'r1', stage: 0, stageCount: 1, from: 0, to: 1, model, data: 'spam-assassin', batchSize: B, seed, round: 0, stateBlob: null, codec: 'f16', lr };

/** An honest miner's forward after `steps` inner steps (on `engine`: WASM, or a GPU): the weights it used, as its spot-check record keeps them, the loss it reported, the shard. */
async function honest(steps: number, shard: number, engine: Engine = miner): Promise<{ weights: Float32Array; loss: number; samples: number; theta: Float32Array }> {
  const runner = new StageRunner(engine, assignment, 2);
  try {
    await runner.ready();
    const theta = await runner.readWeights();
    for (let i = 0; i < steps; i++) await runner.forwardBackwardLast(i + 1, 1000 + i, null);
    const kept = runner.keepWeights();
    const samples = runner.samples;
    const { loss } = await runner.forwardBackwardLast(steps + 1, shard, null);
    const weights = await kept.read();
    kept.release();
    return { weights, loss, samples, theta };
  } finally {
    runner.dispose();
  }
}

function decoded(meta: CheckMeta, weights: Float32Array) {
  return decodeCheckBundle(encodeCheckBundle({ meta, weights, input: null, output: null }), { paramCount: weights.length, activationShape: [B, 256], hasInput: false, hasOutput: false, maxBytes: 1 << 24 });
}

test('an honest MLP bundle passes; a loss reported off, weights out of reach or another shard fail', async () => {
  const shard = 42;
  const h = await honest(30, shard);
  const meta: CheckMeta = { runId: 'r1', microbatch: 31, stage: 0, round: 0, samples: h.samples, shard };
  const ctx: MlpCheckContext = { config, dataset: loadSpamDataset(256), batchSize: B, seed, shard, lr, thetaStart: h.theta, decaySize: stageLayout(model, { from: 0, to: 1 }).decaySize, maxSamples: 464, loss: h.loss };
  const ok = verifyMlpForward(verifier, ctx, decoded(meta, h.weights));
  assert.equal(ok.passed, true, ok.detail);
  assert.match(ok.detail, /loss deviation/);

  const off = verifyMlpForward(verifier, { ...ctx, loss: h.loss * 0.99 }, decoded(meta, h.weights));
  assert.equal(off.passed, false);
  assert.match(off.detail, /reported loss .* vs recomputed/);
  // just within the tolerance still passes: it is about 50 times what honest miners reach
  assert.equal(verifyMlpForward(verifier, { ...ctx, loss: h.loss * (1 + MLP_LOSS_TOLERANCE.relative / 2) }, decoded(meta, h.weights)).passed, true);

  const moved = h.weights.slice();
  moved[5] += 10;
  const far = verifyMlpForward(verifier, ctx, decoded(meta, moved));
  assert.equal(far.passed, false);
  assert.match(far.detail, /weight 5 moved/);
  // weights left at zero (a lazy miner): within reach of the init after 30 steps, but not the loss the miner reported
  const lazy = verifyMlpForward(verifier, ctx, decoded(meta, new Float32Array(h.weights.length)));
  assert.equal(lazy.passed, false);
  assert.match(lazy.detail, /recomputed 0\.693/);
  assert.match(verifyMlpForward(verifier, ctx, decoded({ ...meta, shard: 43 }, h.weights)).detail, /shard 43/);
  assert.match(verifyMlpForward(verifier, ctx, decoded({ ...meta, samples: 465 }, h.weights)).detail, /at most 464/);
  assert.match(verifyMlpForward(verifier, { ...ctx, dataset: null }, decoded(meta, h.weights)).detail, /cannot be loaded/);
  assert.match(verifyMlpForward(verifier, { ...ctx, loss: null }, decoded(meta, h.weights)).detail, /no loss was reported/);
});

test('a miner training the MLP on the GPU (SwiftShader) passes the check recomputed on WASM', async (t) => {
  let gpu: Engine;
  try {
    gpu = await Engine.create({ threads: 1, backend: 'webgpu' });
  } catch (err) {
    t.skip(`no WebGPU device: ${(err as Error).message}`);
    return;
  }
  try {
    const shard = 42;
    const [h, w] = [await honest(30, shard, gpu), await honest(30, shard)];
    const meta: CheckMeta = { runId: 'r1', microbatch: 31, stage: 0, round: 0, samples: h.samples, shard };
    const ctx: MlpCheckContext = { config, dataset: loadSpamDataset(256), batchSize: B, seed, shard, lr, thetaStart: h.theta, decaySize: stageLayout(model, { from: 0, to: 1 }).decaySize, maxSamples: 464, loss: h.loss };
    const ok = verifyMlpForward(verifier, ctx, decoded(meta, h.weights));
    t.diagnostic(`GPU miner: ${ok.detail}; its loss ${h.loss} against a WASM miner's ${w.loss}`);
    assert.equal(ok.passed, true, ok.detail);
    assert.ok(Math.abs(h.loss - w.loss) <= 1e-5 * w.loss);
    assert.equal(verifyMlpForward(verifier, { ...ctx, loss: h.loss * 0.99 }, decoded(meta, h.weights)).passed, false);
  } finally {
    await gpu.close();
  }
});

test("the orchestrator's spot checks of an MLP run: an honest answer passes, a tampered one fails and is charged", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-mlp-checks-'));
  const db = OrchestratorState.open(join(dir, 'o.sqlite'));
  try {
    const options = { lr, codec: 'f16', aggregator: 'mean', minMiners: 1, outerLr: 0.7, outerMomentum: 0.9, requestedStages: null } as const;
    db.runs.insert({ id: 'r1', owner: '0xdev', model, data: 'spam-assassin', steps: 100, batchSize: B, mergeEvery: 50, seed, options }, 1);
    db.runs.insertStages('r1', [{ from: 0, to: 1 }]);
    const run = db.runs.get('r1')!;
    const blobs = await FsBlobStore.open(join(dir, 'blobs'));
    const checks = new SpotChecks(db, new StageStates(db, blobs), async () => verifier, new Offences(db, { enabled: true, fraction: 0.1 }), { rate: 1, timeoutMs: 60_000 });
    // the merged state the weights are bound to is the seeded init: the miner's start too
    const layout = stageLayout(model, { from: 0, to: 1 });
    const init = new Float32Array(layout.size);
    initParams(layout, init, seed);

    const answer = async (steps: number, shard: number, tamper: (h: Awaited<ReturnType<typeof honest>>) => void) => {
      const h = await honest(steps, shard);
      assert.deepEqual(h.theta, init);
      tamper(h);
      const id = db.microbatches.insert('r1', shard, steps);
      const claim = { microbatch: id, attempt: 1, stage: 0, phase: 'forward' as const, minerId: '0xminer', nextId: null, inputSha: null, outputSha: null, loss: h.loss, round: 0, at: 5, bytes: 0 };
      db.claims.put(claim);
      assert.equal(checks.onForward(run, claim), true);
      const meta: CheckMeta = { runId: 'r1', microbatch: id, stage: 0, round: 0, samples: h.samples, shard };
      return checks.submit('0xminer', 'r1', id, encodeCheckBundle({ meta, weights: h.weights, input: null, output: null }));
    };
    const passed = await answer(20, 7, () => {});
    assert.equal(passed.status, 'passed', passed.detail);
    const failed = await answer(20, 8, (h) => void (h.weights[0] += 10));
    assert.equal(failed.status, 'failed');
    assert.match(failed.detail, /weight 0 moved/);
    assert.deepEqual(db.ledger.workTotals('r1'), [{ minerId: '0xminer', kind: 'failed_check', units: 1 }]);
    // a bundle of the wrong shape is refused before anything is recomputed
    const id = db.microbatches.insert('r1', 9, 1);
    const claim = { microbatch: id, attempt: 1, stage: 0, phase: 'forward' as const, minerId: '0xminer2', nextId: null, inputSha: null, outputSha: null, loss: 0.5, round: 0, at: 5, bytes: 0 };
    db.claims.put(claim);
    checks.onForward(run, claim);
    await assert.rejects(checks.submit('0xminer2', 'r1', id, encodeCheckBundle({ meta: { runId: 'r1', microbatch: id, stage: 0, round: 0, samples: 0, shard: 9 }, weights: new Float32Array(10), input: null, output: null })), /shape|\[10\]/);
    checks.close();
  } finally {
    db.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
