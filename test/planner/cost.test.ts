// The cost model against hand-computed numbers for gpt-tiny (V 256, T 64,
// C 128, 4 layers, 4 heads, H 512) and against a direct count of the kernels
// GptStage runs.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gptConfig, type GptConfig } from '../../src/model/config.ts';
import { headPart, partCount, partParamCount, rangeParamCount } from '../../src/model/parts.ts';
import {
  ELEMENTWISE_FLOPS as E,
  ENGINE_MEMORY,
  activationFloatsPerToken,
  causalKeysPerQuery,
  partFlopsPerToken,
  stageCost,
  stageCostTable,
  totalFlops,
  type MemoryModel,
} from '../../src/planner/cost.ts';
import type { FlopsPerToken } from '../../src/planner/types.ts';

const tiny = gptConfig('gpt-tiny');

test('parameters of gpt-tiny parts', () => {
  // embedding: wte 256·128 + wpe 64·128
  assert.equal(partParamCount(tiny, 0), 32768 + 8192);
  // block: 12·C² + 13·C = 196608 + 1664
  assert.equal(partParamCount(tiny, 1), 198272);
  // head: lnf 2·128 + lm_head 128·256
  assert.equal(partParamCount(tiny, 5), 33024);
  assert.equal(stageCost(tiny, { from: 0, to: 6 }, 1, 1).params, 867072);
  assert.equal(stageCost(tiny, { from: 0, to: 6 }, 1, 1).params, rangeParamCount(tiny, { from: 0, to: 6 }));
});

test('FLOPs per token of gpt-tiny, by hand', () => {
  // k̄ = (64 + 1) / 2 = 32.5 keys per query
  assert.equal(causalKeysPerQuery(tiny), 32.5);
  assert.deepEqual(partFlopsPerToken(tiny, 0), { forward: 128, backward: 256 });
  // block forward: matmuls 8C² + 4CH = 131072 + 262144 = 393216
  //   attention 4·C·k̄ + 5·NH·k̄ = 16640 + 650; element-wise 23C + 10H = 2944 + 5120
  assert.deepEqual(partFlopsPerToken(tiny, 1), {
    forward: 393216 + 16640 + 650 + 2944 + 5120, // 418570
    // backward: 786432 + 8·C·k̄ 33280 + 4·NH·k̄ 520 + 35C 4480 + 17H 8704
    backward: 786432 + 33280 + 520 + 4480 + 8704, // 833416
  });
  // head forward: LN 8C 1024 + logits 2CV 65536 + softmax 5V 1280 + log 1
  // head backward: 2V 512 + 4CV 131072 + LN 14C 1792
  assert.deepEqual(partFlopsPerToken(tiny, 5), { forward: 67841, backward: 133376 });
  const whole = stageCost(tiny, { from: 0, to: 6 }, 1, 1).flopsPerToken;
  assert.deepEqual(whole, { forward: 1742249, backward: 3467296 });
  assert.equal(totalFlops(whole), 5209545);
});

test('gpt-tiny ≈ 6 × matmul parameters + attention per token', () => {
  const total = totalFlops(stageCost(tiny, { from: 0, to: 6 }, 1, 1).flopsPerToken);
  const matmulParams = 4 * (3 * 128 * 128 + 128 * 128 + 2 * 128 * 512) + 128 * 256; // 819200
  const attention = 4 * (12 * 128 * 32.5 + 9 * 4 * 32.5); // 204360
  assert.equal(6 * matmulParams, 4915200);
  assert.equal(attention, 204360);
  // the rest (layer norms, GELU, biases, softmax of the head, embedding) is 89985 FLOPs, 1.7%
  assert.equal(total - 6 * matmulParams - attention, 89985);
  // and the whole is within 0.2% of the familiar 6 × all parameters (5,202,432)
  assert.ok(Math.abs(total / (6 * 867072) - 1) < 0.002);
});

/** FLOPs of one token through a part, counted kernel by kernel as GptStage calls them, attention by its loops. */
function directCount(c: GptConfig, part: number): FlopsPerToken {
  const { vocabSize: V, contextLength: T, channels: C, heads: NH } = c;
  const H = C * c.mlpRatio;
  const hs = C / NH;
  let f = 0;
  let b = 0;
  const linear = (i: number, o: number, bias: boolean): void => {
    f += 2 * i * o + (bias ? o : 0);
    b += 2 * i * o /* dinp */ + 2 * i * o /* dW */ + (bias ? o : 0);
  };
  const ln = (): void => {
    f += E.layernorm.forward * C;
    b += E.layernorm.backward * C;
  };
  if (part === 0) return { forward: C, backward: 2 * C };
  if (part === headPart(c)) {
    ln();
    linear(C, V, false);
    f += E.crossEntropy.forward * V + 1;
    b += E.crossEntropy.backward * V;
    return { forward: f, backward: b };
  }
  ln();
  linear(C, 3 * C, true);
  // attention over a whole sequence, divided by T tokens
  let af = 0;
  let ab = 0;
  for (let i = 0; i < T; i++) {
    for (let h = 0; h < NH; h++) {
      const keys = i + 1;
      af += 2 * hs * keys + E.softmax.forward * keys + 2 * hs * keys; // scores, softmax, att·V
      ab += 2 * hs * keys + 2 * hs * keys + E.softmax.backward * keys + 2 * hs * keys + 2 * hs * keys; // datt, dV, softmax, dQ, dK
    }
  }
  f += af / T;
  b += ab / T;
  linear(C, C, true);
  f += C; // residual
  b += C; // dres accumulates through layernormBackward
  ln();
  linear(C, H, true);
  f += E.gelu.forward * H;
  b += E.gelu.backward * H;
  linear(H, C, true);
  f += C;
  b += C;
  return { forward: f, backward: b };
}

test('FLOPs match a direct count of the kernels, on several configs', () => {
  const configs: GptConfig[] = [
    tiny,
    gptConfig('gpt-micro'),
    gptConfig('gpt-small'),
    { vocabSize: 1024, contextLength: 37, channels: 96, layers: 3, heads: 3, mlpRatio: 2 },
  ];
  for (const c of configs) {
    for (let p = 0; p < partCount(c); p++) {
      const want = directCount(c, p);
      const got = partFlopsPerToken(c, p);
      assert.ok(Math.abs(got.forward - want.forward) < 1e-6 * want.forward, `forward of part ${p}`);
      assert.ok(Math.abs(got.backward - want.backward) < 1e-6 * want.backward, `backward of part ${p}`);
    }
  }
});

test('memory of gpt-tiny as one stage, by hand (batch 8, 2 slots)', () => {
  const m = stageCost(tiny, { from: 0, to: 6 }, 8, 2).memoryBytes;
  assert.equal(m.weights, 867072 * 4);
  assert.equal(m.gradients, 867072 * 4);
  // AdamW m, v + DiLoCo start weights, outer momentum
  assert.equal(m.optimizer, 4 * 867072 * 4);
  // per slot and token: input 128, token id 1, target 1,
  //   4 blocks × (8C + 2H + 4 + NH·T = 1024 + 1024 + 4 + 256 = 2308),
  //   head lnf 128 + 2, logits 256, probs 256, loss 1 = 643 → 10005
  // scratch: 6C + H + dlogits V = 768 + 512 + 256 = 1536
  assert.deepEqual(activationFloatsPerToken(tiny, { from: 0, to: 6 }), { perSlot: 10005, scratch: 1536 });
  assert.equal(m.activations, 4 * 8 * 64 * (2 * 10005 + 1536)); // 44,126,208
  assert.equal(m.total, 64935936);
});

test('memory of a middle stage (one block) and of the head', () => {
  // block 1 alone: input 128 + 2308 per slot; scratch 6C + H
  assert.deepEqual(activationFloatsPerToken(tiny, { from: 2, to: 3 }), { perSlot: 2436, scratch: 1280 });
  const m = stageCost(tiny, { from: 2, to: 3 }, 4, 3).memoryBytes;
  assert.equal(m.weights + m.gradients + m.optimizer, 198272 * 24);
  assert.equal(m.activations, 4 * 4 * 64 * (3 * 2436 + 1280));
  // head alone: input 128 + target 1 + 643; scratch 1280 + 256
  assert.deepEqual(activationFloatsPerToken(tiny, { from: 5, to: 6 }), { perSlot: 772, scratch: 1536 });
});

test('activations grow with slots and batch; attention probabilities with the context', () => {
  const a = stageCost(tiny, { from: 1, to: 3 }, 4, 1).memoryBytes.activations;
  const b = stageCost(tiny, { from: 1, to: 3 }, 4, 2).memoryBytes.activations;
  const c = stageCost(tiny, { from: 1, to: 3 }, 8, 1).memoryBytes.activations;
  assert.ok(b > a && c === 2 * a);
  const long = { ...tiny, contextLength: 128 };
  const perTokenShort = activationFloatsPerToken(tiny, { from: 1, to: 2 }).perSlot;
  const perTokenLong = activationFloatsPerToken(long, { from: 1, to: 2 }).perSlot;
  assert.equal(perTokenLong - perTokenShort, 4 * 64); // NH · ΔT
});

test('bad arguments are refused', () => {
  assert.throws(() => stageCost(tiny, { from: 3, to: 3 }, 1, 1), RangeError);
  assert.throws(() => stageCost(tiny, { from: 0, to: 7 }, 1, 1), RangeError);
  assert.throws(() => stageCost(tiny, { from: 0, to: 1 }, 0, 1), /batchSize/);
  assert.throws(() => stageCost(tiny, { from: 0, to: 1 }, 1, 1.5), /slots/);
  assert.throws(() => partFlopsPerToken(tiny, 6), RangeError);
});

test('stageCostTable gives the numbers of stageCost for every range', () => {
  for (const c of [tiny, gptConfig('gpt-small'), gptConfig('gpt-micro')]) {
    const table = stageCostTable(c, 3, 2);
    const P = partCount(c);
    for (let from = 0; from < P; from++) {
      for (let to = from + 1; to <= P; to++) assert.deepEqual(table({ from, to }), stageCost(c, { from, to }, 3, 2));
    }
  }
});

test('another memory model: its bytes per parameter and activation, without the attention probabilities when they are recomputed; the table agrees', () => {
  const lean: MemoryModel = { weightBytes: 2, gradientBytes: 2, optimizerBytes: 0, activationBytes: 2, keepsAttentionProbs: false };
  const m = stageCost(tiny, { from: 2, to: 3 }, 4, 3, lean).memoryBytes;
  assert.equal(m.weights, 198272 * 2);
  assert.equal(m.gradients, 198272 * 2);
  assert.equal(m.optimizer, 0);
  // block 1 alone without NH·T = 256 per slot and token: 2436 − 256
  assert.deepEqual(activationFloatsPerToken(tiny, { from: 2, to: 3 }, false), { perSlot: 2180, scratch: 1280 });
  assert.equal(m.activations, 2 * 4 * 64 * (3 * 2180 + 1280));
  assert.equal(m.total, m.weights + m.gradients + m.optimizer + m.activations);
  assert.deepEqual(stageCost(tiny, { from: 0, to: 6 }, 8, 2, ENGINE_MEMORY), stageCost(tiny, { from: 0, to: 6 }, 8, 2));
  const table = stageCostTable(tiny, 4, 3, lean);
  for (let from = 0; from < 6; from++) for (let to = from + 1; to <= 6; to++) assert.deepEqual(table({ from, to }), stageCost(tiny, { from, to }, 4, 3, lean));
});

test('recomputing activations: a microbatch in flight keeps only its input, one block is scratch, and the backward costs a forward more; the table agrees', () => {
  const lean: MemoryModel = { weightBytes: 2, gradientBytes: 2, optimizerBytes: 0, activationBytes: 2, keepsAttentionProbs: false };
  const recompute: MemoryModel = { ...lean, recomputesActivations: true };
  // gpt-tiny: C = 128, H = 512; block 1 alone keeps 2180 floats per token (above): its input 128 and the block's 2052
  assert.deepEqual(activationFloatsPerToken(tiny, { from: 2, to: 3 }, false, true), { perSlot: 128, scratch: 1280 + 2052 });
  // two blocks: still one block's worth of scratch
  assert.deepEqual(activationFloatsPerToken(tiny, { from: 2, to: 4 }, false, true), { perSlot: 128, scratch: 1280 + 2052 });
  const kept = stageCost(tiny, { from: 2, to: 4 }, 4, 8, lean);
  const redone = stageCost(tiny, { from: 2, to: 4 }, 4, 8, recompute);
  assert.equal(redone.flopsPerToken.forward, kept.flopsPerToken.forward);
  assert.equal(redone.flopsPerToken.backward, kept.flopsPerToken.backward + kept.flopsPerToken.forward);
  assert.equal(redone.memoryBytes.activations, 2 * 4 * 64 * (8 * 128 + 1280 + 2052));
  assert.ok(redone.memoryBytes.activations < kept.memoryBytes.activations / 4);
  const table = stageCostTable(tiny, 4, 8, recompute);
  for (let from = 0; from < 6; from++) for (let to = from + 1; to <= 6; to++) assert.deepEqual(table({ from, to }), stageCost(tiny, { from, to }, 4, 8, recompute));
});
