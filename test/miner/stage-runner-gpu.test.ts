// A miner's stage on the WebGPU backend (SwiftShader here) against the same
// stage on WASM, through the StageRunner a miner uses: a middle and a first
// stage of gpt-micro, three microbatches with two in flight (so forwards run
// at predicted weights and backwards at stashed ones), each followed by the
// inner AdamW step on the CPU. The activations and input gradients sent on
// match WASM within the tolerance of test/engine/webgpu/gpt-stage.test.ts.
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
import { GpuGptStageModel, GpuMlpStageModel } from '../../src/miner/stage-model-gpu.ts';
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

/** forward 1, forward 2, backward 2, forward 3, backward 1, backward 3: what each sends, and the weights after. */
async function drive(runner: StageRunner, first: boolean): Promise<{ sent: Float32Array[]; weights: Float32Array }> {
  const config = gptConfig('gpt-micro');
  const width = 2 * config.contextLength * config.channels;
  const sent: Float32Array[] = [];
  const fwd = async (id: number): Promise<void> => void sent.push(first ? await runner.forwardFirst(id, 100 + id) : await runner.forwardMiddle(id, random(width, id)));
  const bwd = async (id: number): Promise<void> => {
    const d = await runner.backward(id, random(width, 50 + id, 1e-2));
    if (d) sent.push(d);
  };
  await fwd(1);
  await fwd(2);
  await bwd(2);
  await fwd(3);
  await bwd(1);
  await bwd(3);
  return { sent, weights: runner.stage.params.flat.data.slice() };
}

for (const [name, a, first] of [['a middle stage', assignment(1, 2, 1), false], ['a first stage', assignment(0, 2, 0), true]] as const) {
  test(`${name} on the GPU: what it sends and its weights after three inner steps match WASM`, { get skip() { return skip; } }, async () => {
    const onWasm = new StageRunner(wasm, a, 2);
    const onGpu = new StageRunner(gpu!, a, 2);
    try {
      assert.ok(onGpu.stage instanceof GpuGptStageModel);
      assert.deepEqual(onGpu.stage.params.flat.data, onWasm.stage.params.flat.data, 'the same initial weights');
      const w = await drive(onWasm, first);
      const g = await drive(onGpu, first);
      assert.equal(g.sent.length, first ? 3 : 6);
      const diffs = w.sent.map((x, i) => relDiff(g.sent[i], x));
      process.stderr.write(`${name}: sent within ${Math.max(...diffs).toExponential(2)} of their scale\n`);
      for (const d of diffs) assert.ok(d <= REL, `sent ${d}`);
      const lr = a.lr;
      const C = gptConfig('gpt-micro').channels;
      const keyBias = (i: number): boolean => onWasm.stage.layout.entries.some((e) => e.name.endsWith('attn.qkv.b') && i >= e.offset + C && i < e.offset + 2 * C);
      let flipped = 0, worst = 0;
      for (let i = 0; i < w.weights.length; i++) {
        const d = Math.abs(g.weights[i] - w.weights[i]);
        worst = Math.max(worst, d);
        if (d <= 1e-6) continue;
        flipped++;
        assert.ok(keyBias(i), `weight ${i} (not a key bias) apart by ${d}`);
      }
      process.stderr.write(`${name}: ${flipped} of ${w.weights.length} weights apart by more than 1e-6, at most ${worst.toExponential(2)} (2·lr·steps = ${(6 * lr).toExponential(2)})\n`);
      assert.ok(worst <= 2 * lr * 3, `a weight apart by ${worst}`);

      assert.equal(onGpu.samples, 3);
      assert.equal(onGpu.freeSlotCount, 2);
    } finally {
      onWasm.dispose();
      onGpu.dispose();
    }
  });
}

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

test('the spam MLP on the GPU: 20 inner steps from the same weights, the same losses and weights as on WASM', { get skip() { return skip; } }, async () => {
  const a: StageAssignment = { runId: 'm', stage: 0, stageCount: 1, from: 0, to: 1, model: 'mlp:256-16-2', data: 'spam-assassin', batchSize: 16, seed: 3, round: 0, stateBlob: null, codec: 'f16', lr: 1e-2 };
  const onWasm = new StageRunner(wasm, a, 2);
  const onGpu = new StageRunner(gpu!, a, 2);
  try {
    assert.ok(onGpu.stage instanceof GpuMlpStageModel);
    let worstLoss = 0;
    for (let i = 0; i < 20; i++) {
      const w = await onWasm.forwardBackwardLast(i + 1, i, null);
      const g = await onGpu.forwardBackwardLast(i + 1, i, null);
      assert.equal(g.dInput, null);
      worstLoss = Math.max(worstLoss, Math.abs(g.loss - w.loss) / w.loss);
    }
    const dw = relDiff(onGpu.stage.params.flat.data, onWasm.stage.params.flat.data);
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
