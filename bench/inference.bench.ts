// Inference benchmarks on gpt-tiny (context 64), one process, every core:
// decoding with the KV cache (src/inference/) against the recompute path (the
// whole window through GptStage.forward for every token), for 1 and 8
// sessions; the prefill of a 64-token prompt; the first token of a 64-byte
// prompt; and end-to-end generation (sampling included) through the Generator.
// Decoding is measured on a single-thread engine too: at batch 1 each of the
// ~50 kernel calls per token is small, and waking the worker costs more than
// it saves. Medians of 15 runs (the machine may be shared). The serving path
// through stage processes (chain2, bytes per token, failover) is
// ./inference-serve.bench.ts, in the same group.
import { Engine } from '../src/engine/engine.ts';
import { gptConfig } from '../src/model/config.ts';
import { GptStage } from '../src/model/gpt.ts';
import { partCount } from '../src/model/parts.ts';
import { mulberry32 } from '../src/model/init.ts';
import { Generator } from '../src/inference/generator.ts';
import { inferenceFromStage } from '../src/inference/load.ts';
import type { StageInference } from '../src/inference/stage-inference.ts';
import { median, type Bench, type BenchResult } from './harness.ts';
import { inferenceServeBench } from './inference-serve.bench.ts';

const MODEL = 'gpt-tiny';
/** prompt tokens before the timed decode steps; the steps then run to the end of the context */
const PROMPT = 8;
const REPEATS = 15;

function tokens(n: number, seed: number): Int32Array {
  const rng = mulberry32(seed);
  return Int32Array.from({ length: n }, () => Math.floor(rng() * 256));
}

/** Tokens/s of `batch` sessions decoding from position PROMPT to the end of the context with the cache. */
function decodeRate(inf: StageInference, batch: number): number {
  const T = inf.config.contextLength;
  const rates: number[] = [];
  for (let r = 0; r < REPEATS + 1; r++) {
    const seqs = Array.from({ length: batch }, (_, i) => tokens(T, 100 * r + i));
    const ids = seqs.map((_, i) => `s${i}`);
    ids.forEach((id, i) => {
      inf.join(id);
      inf.prefill(id, seqs[i].subarray(0, PROMPT));
    });
    const t0 = performance.now();
    for (let t = PROMPT; t < T; t++) inf.decode(ids.map((id, i) => ({ session: id, input: seqs[i].subarray(t, t + 1) })));
    const ms = performance.now() - t0;
    for (const id of ids) inf.leave(id);
    if (r > 0) rates.push((batch * (T - PROMPT) * 1000) / ms); // the first run warms up
  }
  return median(rates);
}

/** Tokens/s of the recompute path: for every new token, the whole window of `batch` sequences through forward. */
function recomputeRate(model: GptStage, batch: number): number {
  const T = model.config.contextLength;
  const rates: number[] = [];
  for (let r = 0; r < REPEATS + 1; r++) {
    const seq = tokens(batch * T, r);
    const t0 = performance.now();
    for (let t = PROMPT + 1; t <= T; t++) {
      const window = new Int32Array(batch * t);
      for (let b = 0; b < batch; b++) window.set(seq.subarray(b * T, b * T + t), b * t);
      model.forward(window, batch, t);
    }
    const ms = performance.now() - t0;
    if (r > 0) rates.push((batch * (T - PROMPT) * 1000) / ms);
  }
  return median(rates);
}

/** Median ms to prefill a prompt of the whole context (64 tokens) into a new session. */
function prefillMs(inf: StageInference): number {
  const T = inf.config.contextLength;
  const times: number[] = [];
  for (let r = 0; r < REPEATS * 2 + 1; r++) {
    const prompt = tokens(T, r);
    inf.join('p');
    const t0 = performance.now();
    inf.prefill('p', prompt);
    times.push(performance.now() - t0);
    inf.leave('p');
  }
  return median(times.slice(1));
}

/** Median ms from a request of a 64-byte prompt to its first sampled token (join, prefill, sample, leave). */
function firstTokenMs(inf: StageInference): number {
  const T = inf.config.contextLength;
  const times: number[] = [];
  for (let r = 0; r < REPEATS * 2 + 1; r++) {
    const g = new Generator([inf]);
    const prompt = Uint8Array.from(tokens(T, r));
    const t0 = performance.now();
    g.add({ prompt, maxTokens: 1, sampling: { temperature: 0.8, seed: r } });
    g.runToEnd();
    times.push(performance.now() - t0);
  }
  return median(times.slice(1));
}

/** Tokens/s of whole generations (prefill, decode, sampling) of `batch` requests at once: 8-byte prompts, 56 tokens each. */
function generateRate(inf: StageInference, batch: number): number {
  const T = inf.config.contextLength;
  const rates: number[] = [];
  for (let r = 0; r < REPEATS + 1; r++) {
    const g = new Generator([inf]);
    for (let i = 0; i < batch; i++) g.add({ prompt: Uint8Array.from(tokens(PROMPT, 10 * r + i)), maxTokens: T - PROMPT, sampling: { temperature: 0.8, seed: i } });
    const t0 = performance.now();
    const done = g.runToEnd();
    const ms = performance.now() - t0;
    const n = done.reduce((a, d) => a + d.sampledTokens, 0);
    if (r > 0) rates.push((n * 1000) / ms);
  }
  return median(rates);
}

/** Decode rates with the cache on a single-thread engine. */
async function singleThreadDecode(): Promise<{ b1: number; b8: number }> {
  const engine = await Engine.create({ threads: 1 });
  try {
    const config = gptConfig(MODEL);
    const model = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 1, seed: 1 });
    const inf = inferenceFromStage(engine, model, { maxSessions: 8 });
    const rates = { b1: decodeRate(inf, 1), b8: decodeRate(inf, 8) };
    inf.release();
    model.release();
    return rates;
  } finally {
    await engine.close();
  }
}

export const inferenceBenches: Bench[] = [
  {
    group: 'inference',
    async run(o): Promise<BenchResult[]> {
      const out: BenchResult[] = [];
      const engine = await Engine.create();
      try {
        const config = gptConfig(MODEL);
        const model = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 8, seed: 1 });
        const inf = inferenceFromStage(engine, model, { maxSessions: 8 });
        o.log(`${MODEL}, ${engine.threads} threads${engine.relaxedSimd ? ', relaxed SIMD' : ''}: decode from position ${PROMPT} to ${config.contextLength}, KV cache vs recompute`);
        for (const b of [1, 8]) {
          const cached = decodeRate(inf, b);
          const recompute = recomputeRate(model, b);
          o.log(`batch ${b}: ${cached.toFixed(0)} tokens/s cached, ${recompute.toFixed(0)} recomputed (${(cached / recompute).toFixed(1)}×)`);
          out.push(
            { bench: `inference.decode_tokens_per_s.b${b}`, value: Math.round(cached), unit: 'tokens/s' },
            { bench: `inference.recompute_tokens_per_s.b${b}`, value: Math.round(recompute), unit: 'tokens/s' },
          );
        }
        out.push({ bench: 'inference.prefill_ms.t64', value: prefillMs(inf), unit: 'ms' });
        out.push({ bench: 'inference.first_token_ms', value: firstTokenMs(inf), unit: 'ms' });
        for (const b of [1, 8]) out.push({ bench: `inference.local.tokens_per_s.b${b}`, value: Math.round(generateRate(inf, b)), unit: 'tokens/s' });
        inf.release();
        model.release();
      } finally {
        await engine.close();
      }
      o.log('decode with the cache on one thread');
      const t1 = await singleThreadDecode();
      out.push(
        { bench: 'inference.decode_tokens_per_s.b1.t1', value: Math.round(t1.b1), unit: 'tokens/s' },
        { bench: 'inference.decode_tokens_per_s.b8.t1', value: Math.round(t1.b8), unit: 'tokens/s' },
      );
      return out;
    },
  },
  inferenceServeBench,
];
