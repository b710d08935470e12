// A GPT cut into stages on the GPU (SwiftShader) against the same stages on
// the WASM engine: gpt-micro in 3 stages (embedding and a block, a block, the
// head) with 2 activation slots each, two microbatches in flight the way a
// miner runs them (both forwards, then the second's backward before the
// first's). Each backend chains its own stages; the activations sent on, the
// loss, the gradients sent back and every parameter gradient match within
// the tolerance of gpt-step.test.ts. A negative control runs a backward from
// the wrong slot and fails it.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { batchForShard } from '../../../src/data/batches.ts';
import { mobyDickBytes } from '../../../src/data/corpus.ts';
import { createArray } from '../../../src/engine/webgpu/buffers.ts';
import { GpuGptStage } from '../../../src/engine/webgpu/gpt-stage.ts';
import { gptConfig } from '../../../src/model/config.ts';
import { GptStage } from '../../../src/model/gpt.ts';
import { rangeParts, splitEvenly } from '../../../src/model/parts.ts';
import { gpuFixture } from './gpu-fixture.ts';

const fixture = await gpuFixture('gpt stage', () => Promise.resolve({ destroy(): void {} }));
const skip = fixture.skip;
const SEED = 11;
/** max |gpu − wasm| ≤ REL · max |wasm| per tensor (gpt-step.test.ts says why) */
const REL = 1e-5;
const LOSS_REL = 1e-6;

function worst(gpu: Float32Array, wasm: Float32Array): number {
  assert.equal(gpu.length, wasm.length);
  let diff = 0, max = 0;
  for (let i = 0; i < wasm.length; i++) {
    diff = Math.max(diff, Math.abs(gpu[i] - wasm[i]));
    max = Math.max(max, Math.abs(wasm[i]));
  }
  return max === 0 ? diff : diff / max;
}

interface Run {
  outputs: Float32Array[];
  losses: number[];
  dInputs: Float32Array[];
  grads: Float32Array[];
}

/** Two microbatches through the stages: forward 0, forward 1, backward 1, backward 0 (`swap`: backward 0 runs from slot 1). */
async function runBoth(swap = false): Promise<{ wasm: Run; gpu: Run; names: string[][] }> {
  const config = gptConfig('gpt-micro');
  const B = 2, T = config.contextLength;
  const ranges = splitEvenly(config, 3);
  const engine = fixture.engine();
  const device = fixture.gpu().device;
  const wasm = ranges.map((range) => new GptStage(engine, config, range, { batchSize: B, seed: SEED, slots: 2 }));
  const gpu = await Promise.all(wasm.map((s) => GpuGptStage.create(device, config, rangeParts(config, s.range), s.layout, s.params.flat.data.slice(), { batchSize: B, slots: 2 })));
  try {
    const bytes = mobyDickBytes();
    const batches = [0, 1].map((shard) => batchForShard(bytes, SEED, shard, B, T));
    const w: Run = { outputs: [], losses: [], dInputs: [], grads: [] };
    const g: Run = { outputs: [], losses: [], dInputs: [], grads: [] };
    const last = ranges.length - 1;
    // forwards, microbatch m in slot m
    for (let m = 0; m < 2; m++) {
      let wx: Int32Array | Float32Array = batches[m].inputs;
      let gx: Int32Array | Float32Array = batches[m].inputs;
      for (let s = 0; s < last; s++) {
        wx = (wasm[s].forward(wx, B, T, undefined, m) as Float32Array).slice();
        gpu[s].forward(gx, B, T, undefined, m);
        gx = await gpu[s].readOutput(m);
        w.outputs.push(wx);
        g.outputs.push(gx);
      }
      w.losses.push(wasm[last].forward(wx, B, T, batches[m].targets, m) as number);
      gpu[last].forward(gx, B, T, batches[m].targets, m);
      g.losses.push(await gpu[last].readLoss(m));
    }
    // backwards, the second microbatch first
    for (const m of [1, 0]) {
      let wd: Float32Array | null = wasm[last].backward(undefined, m)!.slice();
      gpu[last].backward(undefined, m);
      let gd = await gpu[last].readDInput(m)!;
      w.dInputs.push(wd);
      g.dInputs.push(gd);
      for (let s = last - 1; s >= 0; s--) {
        const slot = swap && m === 0 && s === 0 ? 1 : m;
        wd = wasm[s].backward(wd!, m);
        gpu[s].backward(gd, slot);
        if (wd) {
          wd = wd.slice();
          gd = await gpu[s].readDInput(slot)!;
          w.dInputs.push(wd);
          g.dInputs.push(gd);
        }
      }
    }
    for (let s = 0; s <= last; s++) {
      w.grads.push(wasm[s].grads.flat.data.slice());
      g.grads.push(await gpu[s].readGrads());
    }
    assert.deepEqual(fixture.gpu().takeErrors(), []);
    return { wasm: w, gpu: g, names: wasm.map((s) => s.layout.entries.map((e) => e.name)) };
  } finally {
    for (const s of gpu) s.destroy();
    for (const s of wasm) s.release();
  }
}

/** The worst tensor of each stage's gradients, as a share of its tolerance. */
function gradRatios(r: { wasm: Run; gpu: Run }): number[] {
  return r.wasm.grads.map((wg, s) => worst(r.gpu.grads[s], wg) / REL);
}

test('gpt-micro in 3 stages with 2 slots: activations, loss, input gradients and parameter gradients match WASM', { skip }, async () => {
  const r = await runBoth();
  const outs = r.wasm.outputs.map((o, i) => worst(r.gpu.outputs[i], o));
  const dIns = r.wasm.dInputs.map((d, i) => worst(r.gpu.dInputs[i], d));
  const grads = gradRatios(r);
  process.stderr.write(`stages: activations ${outs.map((x) => x.toExponential(1)).join(' ')}, input gradients ${dIns.map((x) => x.toExponential(1)).join(' ')}, `
    + `parameter gradients at ${grads.map((x) => x.toFixed(3)).join(' ')} of the tolerance\n`);
  assert.equal(r.gpu.outputs.length, 4);
  assert.equal(r.gpu.dInputs.length, 4);
  for (const x of [...outs, ...dIns]) assert.ok(x <= REL, `relative difference ${x}`);
  r.wasm.losses.forEach((l, i) => assert.ok(Math.abs(r.gpu.losses[i] - l) <= LOSS_REL * l, `loss ${r.gpu.losses[i]} vs ${l}`));
  for (const x of grads) assert.ok(x <= 1, `gradients at ${x}× the tolerance`);
});

test('negative control: the first stage\'s backward of microbatch 0 run from slot 1 fails the gradient bound', { skip }, async () => {
  const ratios = gradRatios(await runBoth(true));
  process.stderr.write(`wrong slot: parameter gradients at ${ratios.map((x) => x.toFixed(1)).join(' ')} of the tolerance\n`);
  assert.ok(ratios[0] > 100, `the first stage's gradients are ${ratios[0]}× the tolerance`);
});

test('a stage refuses what it cannot run: a bad layout, batch, input or slot', { skip }, async () => {
  const config = gptConfig('gpt-micro');
  const device = fixture.gpu().device;
  const stage = new GptStage(fixture.engine(), config, { from: 1, to: 2 }, { batchSize: 2, seed: 1 });
  try {
    await assert.rejects(GpuGptStage.create(device, config, rangeParts(config, { from: 0, to: 2 }), stage.layout, stage.params.flat.data, { batchSize: 2 }), /the layout has no wte/);
    const gpu = await GpuGptStage.create(device, config, rangeParts(config, stage.range), stage.layout, stage.params.flat.data, { batchSize: 2 });
    try {
      const N = 2 * config.contextLength * config.channels;
      assert.throws(() => gpu.forward(new Float32Array(N), 3, config.contextLength, undefined, 0), /batch 3/);
      assert.throws(() => gpu.forward(new Float32Array(N - 1), 2, config.contextLength, undefined, 0), /activation of/);
      assert.throws(() => gpu.forward(new Float32Array(N), 2, config.contextLength, undefined, 1), /slot 1 outside/);
      assert.throws(() => gpu.readOutput(0), /holds no forward/);
      assert.throws(() => gpu.writeParams(new Float32Array(3)), /3 parameters/);
      // a buffer past the adapter's limit is refused by name, before anything is allocated
      const limits = device.limits;
      const tooMany = Math.floor(Math.min(limits.maxBufferSize, limits.maxStorageBufferBindingSize) / 4) + 1;
      assert.throws(() => createArray(device, tooMany, 'logits'), /logits needs \d+ bytes; this adapter binds at most \d+ bytes in one buffer/);
    } finally {
      gpu.destroy();
    }
  } finally {
    stage.release();
  }
});
