// Spot-check thresholds, measured: how close an honest miner's sent
// activation is to the orchestrator's recomputation. The "miner" runs the
// default engine (relaxed SIMD when available, 2 threads), the "orchestrator"
// the plain-SIMD build on 1 thread, as two different machines would; the
// activation crosses the wire as fp16 or int8-row. Also what two cheats look
// like (weights left at the merged state, 1% noise), and the cost of one check
// (on CHECK_ROWS sequences, as for a stage before the last, and on the whole batch).
// And the MLP classifier's loss (its run has one stage), miner against
// orchestrator as above, along a training run: MLP_LOSS_TOLERANCE.
// And a miner on the WebGPU backend (a GPU, else SwiftShader) against the
// same WASM recomputation: the same weights and batches through GpuGptStage.
import { loadCorpus } from '../src/data/corpus.ts';
import { loadSpamDataset, spamBatch } from '../src/data/spam.ts';
import { batchForShard } from '../src/data/batches.ts';
import { Engine } from '../src/engine/engine.ts';
import { openGpu } from '../src/engine/webgpu/device.ts';
import { GpuGptStage } from '../src/engine/webgpu/gpt-stage.ts';
import { AdamW, ADAMW_DEFAULTS } from '../src/model/adamw.ts';
import { gptConfig } from '../src/model/config.ts';
import { GptStage } from '../src/model/gpt.ts';
import { rangeParts, splitEvenly, type StageRange } from '../src/model/parts.ts';
import type { GptConfig } from '../src/model/config.ts';
import type { ByteCorpus } from '../src/data/corpus.ts';
import { mulberry32 } from '../src/model/init.ts';
import { Mlp } from '../src/model/mlp.ts';
import { decodeCheckBundle, encodeCheckBundle } from '../src/protocol/check-bundle.ts';
import type { Codec } from '../src/protocol/codec.ts';
import { decodeFrame, encodeFrame, readFrameHeader } from '../src/protocol/frame.ts';
import { CHECK_ROWS, compare, verifyForward } from '../src/orchestrator/training/spot-check-verify.ts';
import { median, type Bench, type BenchResult } from './harness.ts';

const B = 12;
const CHECKS = 40;
const TRAIN_STEPS = 60;

/**
 * The spam classifier (4096→64→2, batch 64, lr 0.01) trained on the miner's
 * engine; at each of MLP_AT steps, MLP_CHECKS batches' loss on the miner's
 * engine and on the verifier's from the same weights: the largest relative
 * and absolute deviations, and the smallest loss seen.
 */
const MLP_AT = [0, 20, 200, 1000, 2000];
const MLP_CHECKS = 200;
function mlpLossDeviation(miner: Engine, verifier: Engine, log: (line: string) => void): { relative: number; absolute: number; minLoss: number } {
  const dataset = loadSpamDataset();
  const config = { inputs: dataset.features, hidden: [64], classes: 2 };
  const Bm = 64;
  const m = new Mlp(miner, config, Bm, 1);
  const r = new Mlp(verifier, config, Bm, 1);
  const opt = new AdamW(miner, m.params, m.grads, { ...ADAMW_DEFAULTS, lr: 0.01 });
  let relative = 0, absolute = 0, minLoss = Infinity;
  let step = 0;
  for (const at of MLP_AT) {
    for (; step < at; step++) {
      const b = spamBatch(dataset, 1, step, Bm);
      m.zeroGrad();
      m.forward(b.x, Bm, b.y);
      m.backward();
      opt.update();
    }
    r.params.flat.data.set(m.params.flat.data);
    let rel = 0, abs = 0;
    for (let i = 0; i < MLP_CHECKS; i++) {
      const b = spamBatch(dataset, 1, 100_000 + i, Bm);
      const honest = m.forward(b.x, Bm, b.y) as number;
      const recomputed = r.forward(b.x, Bm, b.y) as number;
      abs = Math.max(abs, Math.abs(honest - recomputed));
      rel = Math.max(rel, Math.abs(honest - recomputed) / recomputed);
      minLoss = Math.min(minLoss, recomputed);
    }
    log(`mlp after ${at} steps: max relative loss deviation ${rel.toExponential(3)}, max absolute ${abs.toExponential(3)}`);
    relative = Math.max(relative, rel);
    absolute = Math.max(absolute, abs);
  }
  opt.release();
  m.release();
  r.release();
  return { relative, absolute, minLoss };
}

/**
 * The honest deviation of a miner on the WebGPU backend: the two stages'
 * weights on GpuGptStage, the same CHECKS batches as the WASM miner's, the
 * activation sent as fp16, compared with the verifier's WASM recomputation
 * (`refs`); and the last stage's loss on the GPU against the verifier's from
 * the same sent activation. Nothing when no adapter opens (software allowed).
 */
async function webgpuDeviation(
  o: { config: GptConfig; corpus: ByteCorpus; stages: StageRange[]; weights: Float32Array[]; refs: GptStage[] },
  log: (line: string) => void,
): Promise<BenchResult[]> {
  const opened = await openGpu({ software: 'allow' });
  if (!opened.gpu) {
    log(`webgpu: no adapter (${opened.reason}): cross-backend deviation not measured`);
    return [];
  }
  const { config } = o;
  const T = config.contextLength, C = config.channels;
  const gpu = opened.gpu;
  const stages = await Promise.all(o.stages.map((range, i) => GpuGptStage.create(gpu.device, config, rangeParts(config, range), o.refs[i].layout, o.weights[i], { batchSize: B })));
  try {
    let minCos = 1, maxDev = 0, maxLossDev = 0;
    for (let i = 0; i < CHECKS; i++) {
      const b = batchForShard(o.corpus.train, 1, 10_000 + i, B, T);
      stages[0].forward(b.inputs, B, T, undefined, 0);
      const sent = decodeFrame(encodeFrame(await stages[0].readOutput(0), [B * T, C], 'f16')).data;
      const { cosine, normRatio } = compare(o.refs[0].forward(b.inputs, B, T) as Float32Array, sent);
      minCos = Math.min(minCos, cosine);
      maxDev = Math.max(maxDev, Math.abs(normRatio - 1));
      stages[1].forward(sent, B, T, b.targets, 0);
      const lossGpu = await stages[1].readLoss(0);
      const lossRef = o.refs[1].forward(sent, B, T, b.targets) as number;
      maxLossDev = Math.max(maxLossDev, Math.abs(lossGpu - lossRef) / lossRef);
    }
    log(`webgpu (${gpu.adapterName}) miner against the WASM verifier, f16: honest min cosine ${minCos}, max |norm ratio - 1| ${maxDev.toExponential(3)}, max loss deviation ${maxLossDev.toExponential(3)}`);
    return [
      { bench: 'spot_check.webgpu.f16.honest_cosine_gap', value: 1 - minCos, unit: '1 - min cosine' },
      { bench: 'spot_check.webgpu.f16.honest_max_norm_dev', value: maxDev, unit: 'ratio' },
      { bench: 'spot_check.webgpu.honest_max_loss_dev', value: maxLossDev, unit: 'ratio' },
    ];
  } finally {
    for (const s of stages) s.destroy();
    await gpu.close();
  }
}

export const spotCheckBenches: Bench[] = [
  {
    group: 'spot-check',
    async run(o): Promise<BenchResult[]> {
      const config = gptConfig('gpt-tiny');
      const T = config.contextLength;
      const C = config.channels;
      const corpus = loadCorpus('moby-dick');
      const [first, second] = splitEvenly(config, 2);
      const miner = await Engine.create({ threads: 2 });
      const verifier = await Engine.create({ threads: 1, simd: 'plain' });
      o.log(`miner engine: ${miner.relaxedSimd ? 'relaxed' : 'plain'} SIMD, ${miner.threads} threads; verifier: plain SIMD, 1 thread`);
      const s0 = new GptStage(miner, config, first, { batchSize: B, seed: 1 });
      const s1 = new GptStage(miner, config, second, { batchSize: B, seed: 1 });
      const theta0 = s0.params.flat.data.slice();
      const o0 = new AdamW(miner, s0.params, s0.grads, { ...ADAMW_DEFAULTS, lr: 3e-3 });
      const o1 = new AdamW(miner, s1.params, s1.grads, { ...ADAMW_DEFAULTS, lr: 3e-3 });
      o.log(`training both stages ${TRAIN_STEPS} steps so the weights are not the initial ones`);
      for (let step = 0; step < TRAIN_STEPS; step++) {
        const b = batchForShard(corpus.train, 1, step, B, T);
        s0.zeroGrad();
        s1.zeroGrad();
        const act = (s0.forward(b.inputs, B, T) as Float32Array).slice();
        s1.forward(act, B, T, b.targets);
        s0.backward(s1.backward() as Float32Array);
        o0.update();
        o1.update();
      }
      const results: BenchResult[] = [];
      const w0 = s0.params.flat.data.slice();
      const w1 = s1.params.flat.data.slice();
      const ref0 = new GptStage(verifier, config, first, { batchSize: B, seed: 1 });
      const ref1 = new GptStage(verifier, config, second, { batchSize: B, seed: 1 });
      ref0.params.flat.data.set(w0);
      ref1.params.flat.data.set(w1);
      const stale = new GptStage(verifier, config, first, { batchSize: B, seed: 1 });
      stale.params.flat.data.set(theta0);
      for (const codec of ['f16', 'int8-row'] as Codec[]) {
        let minCos = 1;
        let maxDev = 0;
        let maxLossDev = 0;
        for (let i = 0; i < CHECKS; i++) {
          const b = batchForShard(corpus.train, 1, 10_000 + i, B, T);
          const sent = decodeFrame(encodeFrame((s0.forward(b.inputs, B, T) as Float32Array).slice(), [B * T, C], codec)).data;
          const { cosine, normRatio } = compare(ref0.forward(b.inputs, B, T) as Float32Array, sent);
          minCos = Math.min(minCos, cosine);
          maxDev = Math.max(maxDev, Math.abs(normRatio - 1));
          const lossMiner = s1.forward(sent, B, T, b.targets) as number;
          const lossRef = ref1.forward(sent, B, T, b.targets) as number;
          maxLossDev = Math.max(maxLossDev, Math.abs(lossMiner - lossRef) / lossRef);
        }
        const key = codec.replace('-', '_');
        o.log(`${codec}: honest min cosine ${minCos}, max |norm ratio - 1| ${maxDev.toExponential(3)}, max loss deviation ${maxLossDev.toExponential(3)}`);
        results.push(
          { bench: `spot_check.${key}.honest_cosine_gap`, value: 1 - minCos, unit: '1 - min cosine' },
          { bench: `spot_check.${key}.honest_max_norm_dev`, value: maxDev, unit: 'ratio' },
        );
        if (codec === 'f16') results.push({ bench: 'spot_check.honest_max_loss_dev', value: maxLossDev, unit: 'ratio' });
      }
      // two cheats, against the fp32 recomputation
      const b = batchForShard(corpus.train, 1, 20_000, B, T);
      const honest = (ref0.forward(b.inputs, B, T) as Float32Array).slice();
      const lazy = (stale.forward(b.inputs, B, T) as Float32Array).slice();
      const rand = mulberry32(3);
      const noisy = honest.map((x) => x + 0.01 * Math.abs(x) * (rand() * 2 - 1) * Math.sqrt(3));
      const cStale = compare(honest, lazy);
      const cNoise = compare(honest, noisy);
      o.log(`cheats: weights left at the merged state (${TRAIN_STEPS} inner steps skipped): cosine ${cStale.cosine.toFixed(6)}, norm ratio ${cStale.normRatio.toFixed(4)}; 1% noise: cosine ${cNoise.cosine.toFixed(6)}`);
      results.push(
        { bench: 'spot_check.cheat_stale_weights.cosine_gap', value: 1 - cStale.cosine, unit: '1 - cosine' },
        { bench: 'spot_check.cheat_noise_1pct.cosine_gap', value: 1 - cNoise.cosine, unit: '1 - cosine' },
      );
      // one whole check on the orchestrator: decode the bundle, bound the weights, recompute, compare
      const frame = encodeFrame(honest, [B * T, C], 'f16');
      const bundle = encodeCheckBundle({ meta: { runId: 'r', microbatch: 1, stage: 0, round: 0, samples: TRAIN_STEPS, shard: 20_000 }, weights: w0, input: null, output: frame });
      const timeCheck = (rows: number[] | null): number => {
        const scratch = new GptStage(verifier, config, first, { batchSize: rows?.length ?? B, seed: 1 });
        const times: number[] = [];
        for (let i = 0; i < 7; i++) {
          const t0 = performance.now();
          const d = decodeCheckBundle(bundle, { paramCount: w0.length, activationShape: [B * T, C], hasInput: false, hasOutput: true, maxBytes: 1 << 28 });
          const r = verifyForward(verifier, {
            config, range: first, batchSize: B, seed: 1, corpus, shard: 20_000, codec: 'f16', lr: 3e-3, thetaStart: theta0, decaySize: scratch.layout.decaySize, maxSamples: 1000,
            outputSha: readFrameHeader(frame).header.sha256, inputSha: null, loss: null, upstreamShas: null, rows,
          }, d, scratch);
          if (!r.passed) throw new Error(`an honest check failed: ${r.detail}`);
          times.push(performance.now() - t0);
        }
        scratch.release();
        return Number(median(times).toFixed(1));
      };
      results.push(
        { bench: 'spot_check.verify_ms', value: timeCheck([3, 7].slice(0, CHECK_ROWS)), unit: 'ms' },
        { bench: 'spot_check.verify_full_batch_ms', value: timeCheck(null), unit: 'ms' },
        { bench: 'spot_check.bundle_bytes', value: bundle.length, unit: 'bytes' },
      );
      results.push(...(await webgpuDeviation({ config, corpus, stages: [first, second], weights: [w0, w1], refs: [ref0, ref1] }, o.log)));
      const mlp = mlpLossDeviation(miner, verifier, o.log);
      o.log(`mlp: honest loss deviation at most ${mlp.relative.toExponential(3)} relative, ${mlp.absolute.toExponential(3)} absolute (smallest loss ${mlp.minLoss.toExponential(3)})`);
      results.push(
        { bench: 'spot_check.mlp.honest_max_loss_rel_dev', value: mlp.relative, unit: 'ratio' },
        { bench: 'spot_check.mlp.honest_max_loss_abs_dev', value: mlp.absolute, unit: 'nats' },
      );
      for (const s of [s0, s1, ref0, ref1, stale]) s.release();
      o0.release();
      o1.release();
      await miner.close();
      await verifier.close();
      return results;
    },
  },
];
