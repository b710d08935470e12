// A miner's stage on the WebGPU backend (SwiftShader here) against the same
// stage on WASM, through the StageRunner a miner uses: a middle and a first
// stage of gpt-micro, three microbatches with two in flight (so forwards run
// at predicted weights and backwards at stashed ones), each followed by the
// inner AdamW step, on the GPU for the GPU stage (weights, moments and the
// slots' weights never leave it: the test counts the bytes that cross). The
// activations and input gradients sent on match WASM within the tolerance
// of test/engine/webgpu/gpt-stage.test.ts, and so do the weights a spot
// check of a predicted forward gets.
// The weights after the steps: AdamW's first steps move a weight by about lr
// whatever its gradient's size, so a gradient that is noise on both backends
// (0 in exact arithmetic) may move its weight either way: those may differ by
// up to 2·lr per step (gpt-step-check.ts derives this for one step). Such
// gradients are the key biases' (softmax ignores a constant added to every
// score): only those weights may differ, every other must agree to 1e-6.
// The spam MLP (one stage, forward, loss and backward at once) matches WASM
// step for step. Also: the backend choice of Engine.create ('auto' takes no
// software adapter; a bad name is refused).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { mulberry32 } from '../../src/model/init.ts';
import { gptConfig } from '../../src/model/config.ts';
import type { StageAssignment } from '../../src/protocol/messages.ts';
import { recorderOf } from '../../src/engine/webgpu/recorder.ts';
import { GpuGptStageTrainer } from '../../src/miner/stage-trainer-gpu.ts';
import { GpuMlpStageTrainer } from '../../src/miner/stage-trainer-gpu-mlp.ts';
import { StageRunner } from '../../src/miner/stage-runner.ts';

const REL = 1e-5;
let wasm: Engine;
let gpu: Engine | null = null;
let skip: string | false = false;

before(async () => {
  wasm = await Engine.create({ threads: 1 });
  try {
    gpu = await Engine.create({ threads: 1, backend: 'webgpu' });
  } catch (err) {
    skip = (err as Error).message;
    process.stderr.write(`webgpu stage runner tests skipped: ${skip}\n`);
  }
});
after(async () => {
  await wasm.close();
  await gpu?.close();
});

function assignment(from: number, to: number, stage: number): StageAssignment {
  return { runId: 'r', stage, stageCount: 3, from, to, model: 'gpt-micro', data: 'moby-dick', batchSize: 2, seed: 5, round: 0, stateBlob: null, codec: 'f16', lr: 3e-3 };
}

function random(n: number, seed: number, scale = 1): Float32Array {
  const r = mulberry32(seed);
  return Float32Array.from({ length: n }, () => (r() * 2 - 1) * scale);
}

function relDiff(a: Float32Array, b: Float32Array): number {
  let d = 0, m = 0;
  for (let i = 0; i < a.length; i++) {
    d = Math.max(d, Math.abs(a[i] - b[i]));
    m = Math.max(m, Math.abs(b[i]));
  }
  return m === 0 ? d : d / m;
}

interface Drive {
  sent: Float32Array[];
  /** the weights after the three steps */
  weights: Float32Array;
  /** the weights microbatch 3's forward ran with (predicted one step ahead), as a spot check gets them */
  kept: Float32Array;
  /** bytes written to and read from the GPU while the microbatches ran (0 on WASM) */
  bytesWritten: number;
  bytesRead: number;
}

/** forward 1, forward 2, backward 2, forward 3, backward 1, backward 3: what each sends, and the weights after. */
async function drive(runner: StageRunner, first: boolean): Promise<Drive> {
  const config = gptConfig('gpt-micro');
  const width = 2 * config.contextLength * config.channels;
  const sent: Float32Array[] = [];
  const fwd = async (id: number): Promise<void> => void sent.push(first ? await runner.forwardFirst(id, 100 + id) : await runner.forwardMiddle(id, random(width, id)));
  const bwd = async (id: number): Promise<void> => {
    const d = await runner.backward(id, random(width, 50 + id, 1e-2));
    if (d) sent.push(d);
  };
  const counts = runner.trainer instanceof GpuGptStageTrainer ? recorderOf(gpu!.gpu!.device).counts : null;
  const before = { written: counts?.bytesWritten ?? 0, read: counts?.bytesRead ?? 0 };
  await fwd(1);
  await fwd(2);
  await bwd(2);
  await fwd(3);
  const kept = runner.keepForwardWeights(3)!;
  assert.equal(kept.predictedSteps, 1);
  await bwd(1);
  await bwd(3);
  const bytesWritten = (counts?.bytesWritten ?? 0) - before.written, bytesRead = (counts?.bytesRead ?? 0) - before.read;
  const out = { sent, weights: await runner.readWeights(), kept: await kept.weights.read(), bytesWritten, bytesRead };
  kept.weights.release();
  return out;
}

for (const [name, a, first] of [['a middle stage', assignment(1, 2, 1), false], ['a first stage', assignment(0, 2, 0), true]] as const) {
  test(`${name} on the GPU: what it sends and its weights after three inner steps match WASM`, { get skip() { return skip; } }, async () => {
    const onWasm = new StageRunner(wasm, a, 2);
    const heapBefore = gpu!.heap.stats().inUse;
    const onGpu = new StageRunner(gpu!, a, 2);
    try {
      assert.ok(onGpu.trainer instanceof GpuGptStageTrainer);
      await onGpu.ready();
      // nothing of a GPU stage lives in the WASM memory (so it is not held to its 4 GiB)
      assert.equal(gpu!.heap.stats().inUse, heapBefore, "the GPU stage took none of the engine's WASM memory");
      assert.deepEqual(await onGpu.readWeights(), await onWasm.readWeights(), 'the same initial weights');
      const w = await drive(onWasm, first);
      const g = await drive(onGpu, first);
      assert.equal(g.sent.length, first ? 3 : 6);
      // what crossed: the inputs going in (token ids or activations, and the gradients received), the activations
      // and gradients sent on and each step's 16-byte status coming back; never the weights or the gradients
      const { contextLength: T, channels: C, vocabSize: V } = gptConfig('gpt-micro');
      const B = 2, width = B * T * C;
      // a first stage's forward writes the token ids and, for the embedding's backward, their rows grouped by token (V + 1 starts, B·T rows)
      const forwardIn = first ? 2 * B * T + V + 1 : width;
      assert.equal(g.bytesWritten, 3 * forwardIn * 4 + 3 * width * 4, 'bytes written to the GPU');
      assert.equal(g.bytesRead, g.sent.reduce((n, x) => n + x.byteLength, 0) + 3 * 16, 'bytes read back');
      const diffs = w.sent.map((x, i) => relDiff(g.sent[i], x));
      process.stderr.write(`${name}: sent within ${Math.max(...diffs).toExponential(2)} of their scale\n`);
      for (const d of diffs) assert.ok(d <= REL, `sent ${d}`);
      const lr = a.lr;
      const keyBias = (i: number): boolean => onWasm.trainer.layout.entries.some((e) => e.name.endsWith('attn.qkv.b') && i >= e.offset + C && i < e.offset + 2 * C);
      for (const [what, gw, ww, steps] of [['weights after three steps', g.weights, w.weights, 3], ["microbatch 3's predicted weights, as a check gets them", g.kept, w.kept, 2]] as const) {
        let flipped = 0, worst = 0;
        for (let i = 0; i < ww.length; i++) {
          const d = Math.abs(gw[i] - ww[i]);
          worst = Math.max(worst, d);
          if (d <= 1e-6) continue;
          flipped++;
          assert.ok(keyBias(i), `${what}: weight ${i} (not a key bias) apart by ${d}`);
        }
        process.stderr.write(`${name}, ${what}: ${flipped} of ${ww.length} apart by more than 1e-6, at most ${worst.toExponential(2)} (2·lr·steps = ${(2 * lr * steps).toExponential(2)})\n`);
        assert.ok(worst <= 2 * lr * steps, `${what}: a weight apart by ${worst}`);
      }

      assert.equal(onGpu.samples, 3);
      assert.equal(onGpu.freeSlotCount, 2);
    } finally {
      onWasm.dispose();
      onGpu.dispose();
    }
  });
}

test('a GPU stage merges, saves and loads its state as a WASM stage does; a non-finite gradient skips the step and says so', { get skip() { return skip; } }, async () => {
  const a = assignment(1, 2, 1);
  const onGpu = new StageRunner(gpu!, a, 2);
  const onWasm = new StageRunner(wasm, a, 2);
  const late = new StageRunner(gpu!, a, 2);
  try {
    await Promise.all([onGpu.ready(), late.ready()]);
    const config = gptConfig('gpt-micro');
    const width = 2 * config.contextLength * config.channels;
    const start = await onGpu.readWeights();
    await onGpu.forwardMiddle(1, random(width, 1));
    await onGpu.backward(1, random(width, 2, 1e-2));
    const now = await onGpu.readWeights();
    const delta = await onGpu.pseudoGradient();
    assert.deepEqual(delta, start.map((x, i) => x - now[i]), 'the pseudo-gradient: start minus now, read from the GPU');

    // the same outer step and state as a WASM replica from the same start, given the same current weights and delta
    onWasm.trainer.writeWeights(now);
    await onGpu.applyOuterStep(delta.map((x) => x * 0.5), 1, 0.7, 0.9);
    await onWasm.applyOuterStep(delta.map((x) => x * 0.5), 1, 0.7, 0.9);
    assert.deepEqual(await onGpu.readWeights(), await onWasm.readWeights(), 'the outer step on the host, written to the GPU');
    assert.ok((await onGpu.pseudoGradient()).every((x) => x === 0), 'the next interval starts at the merged weights');
    const state = await onGpu.encodeState(1);
    assert.deepEqual(state, await onWasm.encodeState(1), 'the same state, byte for byte');
    late.loadState(state, 1);
    assert.deepEqual(await late.readWeights(), await onGpu.readWeights(), 'a late GPU replica loads the state onto its GPU');

    // a gradient whose norm overflows float32: the GPU skips the step (weights unchanged) and the backward fails
    const before = await onGpu.readWeights();
    await onGpu.forwardMiddle(2, random(width, 3));
    await assert.rejects(onGpu.backward(2, new Float32Array(width).fill(1e30)), /gradient norm is not finite/);
    assert.deepEqual(await onGpu.readWeights(), before, 'the skipped step left the weights as they were');
    await onGpu.forwardMiddle(3, random(width, 4));
    await onGpu.backward(3, random(width, 5, 1e-2));
    const after = await onGpu.readWeights();
    assert.ok(after.every((x) => Number.isFinite(x)) && after.some((x, i) => x !== before[i]), 'the next step runs');

    // fault injection: a lazy GPU stage holds zero weights
    onGpu.lazy = true;
    await onGpu.forwardMiddle(4, random(width, 6));
    await onGpu.backward(4, random(width, 7, 1e-2));
    assert.ok((await onGpu.readWeights()).every((x) => x === 0));
  } finally {
    for (const r of [onGpu, onWasm, late]) r.dispose();
  }
});

test("Engine.create: 'auto' takes no software adapter, an unknown backend is refused", async () => {
  const auto = await Engine.create({ threads: 1, backend: 'auto' });
  try {
    if (auto.gpu) assert.equal(auto.gpu.isSoftware, false, 'auto took a hardware adapter');
    else assert.match(auto.backendNote ?? '', /running on WASM/);
    assert.equal(auto.backend, auto.gpu ? 'webgpu' : 'wasm');
  } finally {
    await auto.close();
  }
  await assert.rejects(Engine.create({ backend: 'cuda' as never }), /backend must be one of wasm, webgpu, auto/);
  assert.equal(wasm.backend, 'wasm');
  assert.equal(wasm.gpu, null);
});

test('the spam MLP on the GPU, AdamW included: 20 inner steps from the same weights, the same losses and weights as on WASM; only the batch and the loss cross', { get skip() { return skip; } }, async () => {
  const a: StageAssignment = { runId: 'm', stage: 0, stageCount: 1, from: 0, to: 1, model: 'mlp:256-16-2', data: 'spam-assassin', batchSize: 16, seed: 3, round: 0, stateBlob: null, codec: 'f16', lr: 1e-2 };
  const onWasm = new StageRunner(wasm, a, 2);
  const onGpu = new StageRunner(gpu!, a, 2);
  try {
    assert.ok(onGpu.trainer instanceof GpuMlpStageTrainer);
    await onGpu.ready();
    assert.deepEqual(await onGpu.readWeights(), await onWasm.readWeights(), 'the same initial weights');
    const counts = recorderOf(gpu!.gpu!.device).counts;
    const before = { written: counts.bytesWritten, read: counts.bytesRead };
    let worstLoss = 0;
    for (let i = 0; i < 20; i++) {
      const w = await onWasm.forwardBackwardLast(i + 1, i, null);
      const g = await onGpu.forwardBackwardLast(i + 1, i, null);
      assert.equal(g.dInput, null);
      worstLoss = Math.max(worstLoss, Math.abs(g.loss - w.loss) / w.loss);
    }
    // per step: 16 rows of 256 features and their 16 classes in; 16 row losses and the step's status out
    assert.equal(counts.bytesWritten - before.written, 20 * (16 * 256 + 16) * 4, 'bytes written to the GPU');
    assert.equal(counts.bytesRead - before.read, 20 * (16 * 4 + 16), 'bytes read back');
    const dw = relDiff(await onGpu.readWeights(), await onWasm.readWeights());
    process.stderr.write(`mlp: losses within ${worstLoss.toExponential(2)} relative, weights after 20 steps within ${dw.toExponential(2)} of their scale\n`);
    assert.ok(worstLoss <= 1e-5, `loss ${worstLoss}`);
    assert.ok(dw <= 1e-5, `weights ${dw}`);
  } finally {
    onWasm.dispose();
    onGpu.dispose();
  }
});

test('a stage the GPU cannot hold is refused when it is taken, with the reason', { get skip() { return skip; } }, async () => {
  // a vocabulary of 65,536: the logits of B × 16 rows take B × 4 MiB, past the adapter's largest binding (1 GiB on SwiftShader) while every other buffer is small
  const limit = Math.min(gpu!.gpu!.limits.maxBufferSize, gpu!.gpu!.limits.maxStorageBufferBindingSize);
  const B = Math.floor(limit / (16 * 65536 * 4)) + 1;
  const runner = new StageRunner(gpu!, { ...assignment(0, 3, 0), stageCount: 1, model: 'gpt:v65536.t16.c16.l1.h2.r4', batchSize: B }, 1);
  try {
    await assert.rejects(runner.ready(), /logits needs \d+ bytes; this adapter binds at most \d+ bytes in one buffer/);
  } finally {
    runner.dispose();
  }
});
