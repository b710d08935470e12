// Merge benches: aggregator throughput (elements/s of one merged slice) for
// R = 2, 4, 8, pseudo-gradient partition frames, the outer step, and the
// `network.merge_compression` figure for gpt-tiny (867,072 parameters).
// One thread; each throughput is the median of several timed repetitions.

import { DEFAULT_MERGE_EVERY } from '../src/orchestrator/training/run-planner.ts';
import { median as medianOf, type Bench, type BenchOptions, type BenchResult } from './harness.ts';
import { ErrorFeedback } from '../src/protocol/error-feedback.ts';
import { AGGREGATORS, aggregate } from '../src/merge/aggregate.ts';
import { mergeTrafficRatio } from '../src/merge/traffic.ts';
import { createOuterState, outerStep } from '../src/merge/outer.ts';
import { partitionVector } from '../src/merge/partition.ts';
import { decodePartitionFrames, encodeMergedPartition, encodePseudoGradientPartitions, framesByteLength } from '../src/merge/pseudo-gradient.ts';
import { gptConfig } from '../src/model/config.ts';
import { partCount, rangeParamCount } from '../src/model/parts.ts';

const GPT_TINY = gptConfig('gpt-tiny');
/** Parameters of gpt-tiny (vocab 256, context 64, width 128, 4 layers): 867,072. */
export const GPT_TINY_PARAMS = rangeParamCount(GPT_TINY, { from: 0, to: partCount(GPT_TINY) });
const N = 1 << 20;
const REPS = 7;
const BLOCK = 256;

/** Median of REPS runs (after one warm-up) of `elements / seconds`. */
function rate(elements: number, fn: () => void): number {
  fn();
  const rates: number[] = [];
  for (let r = 0; r < REPS; r++) {
    const t = performance.now();
    fn();
    rates.push(elements / ((performance.now() - t) / 1000));
  }
  return medianOf(rates);
}

function vector(n: number, seed: number, scale: number): Float32Array {
  const x = new Float32Array(n);
  let s = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    x[i] = (s / 2 ** 32 - 0.5) * 2 * scale;
  }
  return x;
}

async function aggregators(options: BenchOptions): Promise<BenchResult[]> {
  const out: BenchResult[] = [];
  const dst = new Float32Array(N);
  for (const R of [2, 4, 8]) {
    const slices = Array.from({ length: R }, (_, r) => vector(N, r + 1, 1e-3));
    for (const method of AGGREGATORS) {
      const value = rate(N, () => aggregate(slices, { method }, dst));
      out.push({ bench: `merge.${method}_r${R}.elements_per_s`, value: Math.round(value), unit: 'elements/s' });
      options.log(`${method} R=${R}: ${(value / 1e6).toFixed(1)} M elements/s`);
    }
  }
  return out;
}

async function framesAndOuter(options: BenchOptions): Promise<BenchResult[]> {
  const n = GPT_TINY_PARAMS;
  const out: BenchResult[] = [];
  const pg = vector(n, 7, 1e-3);
  const parts = partitionVector(n, 8, BLOCK);
  const ef = new ErrorFeedback(n, BLOCK);
  const meta = { run: 'run-0001', stage: 0, round: 17, replica: `0x${'ab'.repeat(20)}` };
  let frames: Uint8Array[] = [];
  const enc = rate(n, () => (frames = encodePseudoGradientPartitions(pg, parts, ef, meta)));
  const dec = rate(n, () => decodePartitionFrames(frames, parts));
  const state = createOuterState(n);
  const theta = vector(n, 9, 1);
  const next = new Float32Array(n);
  const step = rate(n, () => outerStep(state, theta, pg, next));
  for (const [bench, value] of [
    ['merge.pseudo_gradient_encode.elements_per_s', enc],
    ['merge.pseudo_gradient_decode.elements_per_s', dec],
    ['merge.outer_step.elements_per_s', step],
  ] as const) {
    out.push({ bench, value: Math.round(value), unit: 'elements/s' });
    options.log(`${bench}: ${(value / 1e6).toFixed(1)} M elements/s`);
  }
  return out;
}

/** Frame bytes of one round for gpt-tiny with R replicas and 2R partitions. */
export function gptTinyRoundBytes(R: number): { pseudoGradientBytes: number; mergedBytes: number } {
  const n = GPT_TINY_PARAMS;
  const pg = vector(n, 3, 1e-3);
  const parts = partitionVector(n, 2 * R, BLOCK);
  const meta = { run: 'run-0001', stage: 0, round: 17 };
  const pseudoGradientBytes = framesByteLength(encodePseudoGradientPartitions(pg, parts, new ErrorFeedback(n, BLOCK), { ...meta, replica: `0x${'ab'.repeat(20)}` }));
  const mergedBytes = framesByteLength(parts.map((p) => encodeMergedPartition(pg.subarray(p.start, p.end), p, meta)));
  return { pseudoGradientBytes, mergedBytes };
}

async function trafficRatios(options: BenchOptions): Promise<BenchResult[]> {
  const out: BenchResult[] = [];
  for (const R of [2, 4, 8]) {
    const bytes = gptTinyRoundBytes(R);
    for (const H of [50, 100]) {
      const c = mergeTrafficRatio({ params: GPT_TINY_PARAMS, innerSteps: H, replicas: R, redundancy: 2, ...bytes });
      // the network's default: 2 replicas per stage (nbcli up), H = DEFAULT_MERGE_EVERY
      const name = R === 2 && H === DEFAULT_MERGE_EVERY ? 'network.merge_compression' : `network.merge_compression_r${R}_h${H}`;
      out.push({ bench: name, value: Number(c.ratio.toFixed(1)), unit: 'x' });
      options.log(`R=${R} H=${H}: ${c.ratio.toFixed(1)}x, ${(c.traffic.total / GPT_TINY_PARAMS).toFixed(3)} bytes/param/round, pg ${c.pseudoGradientBytesPerParam.toFixed(4)} bytes/param`);
    }
    if (R === 4) out.push({ bench: 'merge.pseudo_gradient.bytes_per_param', value: Number((bytes.pseudoGradientBytes / GPT_TINY_PARAMS).toFixed(4)), unit: 'bytes/param' });
  }
  return out;
}

export const mergeBenches: Bench[] = [
  {
    group: 'merge',
    async run(options: BenchOptions): Promise<BenchResult[]> {
      return [...(await trafficRatios(options)), ...(await framesAndOuter(options)), ...(await aggregators(options))];
    },
  },
];
